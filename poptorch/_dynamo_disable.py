"""PyTorch's reference kernels import torch._dynamo at their first call; shape inference
calls them without it.

Many of PyTorch's Python Meta kernels (torch._refs, and the type promotion wrapper of
torch._prims_common) are wrapped by torch._disable_dynamo, which imports torch._dynamo the
first time the kernel runs, to mark it as never traced by dynamo. That import takes sympy and
parts of torch._inductor with it: 2-3 s and ~80 MB before a lazy program's first op, in a
process that may never compile anything. Until something imports torch._dynamo, no frame is
traced, so "do not trace this" means nothing: each wrapped kernel runs as it is, and the first
call after torch._dynamo is loaded installs dynamo's real wrapper, as torch._disable_dynamo
would have at the first call.
"""
from __future__ import annotations

import functools
import sys
import types
from typing import Any, Callable, List

import torch._compile

# The modules whose functions are Meta kernels or what they call.
_KERNEL_MODULES = ("torch._refs", "torch._prims", "torch._prims_common", "torch._decomp",
                   "torch._meta_registrations")
_CACHE = "__dynamo_disable"  # the attribute torch._disable_dynamo caches its wrapper in


class UntilDynamoIsLoaded:
    """A wrapped kernel's stand-in for dynamo's wrapper: runs the kernel as it is until
    torch._dynamo is loaded, then installs and calls dynamo's wrapper.

    Its own frame must be skipped as dynamo's wrapper's frames are (``skip_in_dynamo``):
    the first call after the import may come inside a frame dynamo runs with its hook on
    (code of a graph break), where dynamo would otherwise trace this poptorch code as the
    user's, breaking its graph at the import, the wrapper and the attribute it sets."""

    def __init__(self, fn: Callable, recursive: bool) -> None:
        self._fn = fn
        self._recursive = recursive

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:  # no frame hook: nothing to disable
            return self._fn(*args, **kwargs)
        import torch._dynamo

        disabled = torch._dynamo.disable(self._fn, self._recursive, wrapping=False)
        setattr(self._fn, _CACHE, disabled)
        return disabled(*args, **kwargs)


def skip_in_dynamo(eval_frame: types.ModuleType) -> None:
    """Tells dynamo (its module ``torch._dynamo.eval_frame``) to run the stand-ins' frames
    as they are; what they call is dynamo's to decide (dynamo's wrapper disables the
    kernel, or only its own frame when not recursive)."""
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    eval_frame.set_code_exec_strategy(UntilDynamoIsLoaded.__call__.__code__,
                                      FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT))


def _wrappers() -> List[types.FunctionType]:
    """torch._disable_dynamo's wrappers among the kernel modules' functions, their closures and
    what they wrap (and the decomposition tables', which register the Meta kernels)."""
    from torch._decomp import global_decomposition_table

    inner = torch._compile._disable_dynamo(lambda: None).__code__
    pending: List[Any] = []
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith(_KERNEL_MODULES):
            pending.extend(v for v in vars(module).values() if callable(v))
    for table in global_decomposition_table.values():
        pending.extend(table.values())
    seen = set()
    found = []
    while pending:
        f = pending.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, functools.partial):
            pending.append(f.func)
        if not isinstance(f, types.FunctionType):
            continue
        if f.__code__ is inner:
            found.append(f)
        if hasattr(f, "__wrapped__"):
            pending.append(f.__wrapped__)
        for cell in f.__closure__ or ():
            try:
                pending.append(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                pass
    return found


def install() -> None:
    if "torch._dynamo" in sys.modules:
        return  # the wrappers install dynamo's at their first call
    for wrapper in _wrappers():
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
        fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
        if getattr(fn, _CACHE, None) is None:
            setattr(fn, _CACHE, UntilDynamoIsLoaded(fn, recursive))
