"""``poptorch.for_loop`` and ``poptorch.cond``: control flow that runs on the
device, as PopTorch's does.

* ``for_loop(count, body, inputs)`` calls the Python ``body`` once (PopTorch
  traces it once) and runs its operations ``count`` times: the first call is
  recorded with ``torch.fx``'s ``make_fx`` as it is captured, and the recorded
  operations are replayed ``count - 1`` times on the outputs of the previous
  iteration. Everything the body does to tensors happens every iteration
  (in-place updates of buffers included, printing too); Python side effects
  happen once.
* ``cond(condition, then_body, then_inps, else_body, else_inps)`` traces both
  branches and selects each output on the device with ``torch.where``: the
  condition is never read on the host, so a compiled step takes either branch
  on every run without being specialised on it.

On the CPU (no ipu tensor involved) both are plain Python: a loop, an ``if``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from .._errors import Error
from .._losses import isRunningOnIpu


def _as_list(outputs: Any, what: str) -> List[torch.Tensor]:
    values = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for index, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            raise Error(f"{what} must return tensors; output {index} is "
                        f"{type(value).__name__}")
    return values


def _check_tensor_list(inputs: Any, what: str, name: str) -> None:
    # PopTorch's errors, word for word (ValueError).
    if not isinstance(inputs, list):
        raise ValueError(f"poptorch.{what} expects {name} tensors to be a list of tensors. "
                         "(Object is not list)")
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"poptorch.{what} expects {name} tensors to be a list of tensors. "
                             f"(Object contained in list at index {index} is not torch.tensor)")


def _on_ipu(tensors: Sequence[torch.Tensor]) -> bool:
    return isRunningOnIpu() or any(t.device.type == "ipu" for t in tensors)


_HOST_READS = ("aten::_local_scalar_dense", "aten::item")
_HOST_READ = ("poptorch.for_loop: the body reads a tensor's value on the host ({}.item(), "
              ".cpu(), `if tensor:`...), which would be the value of the first iteration in "
              "every iteration. The loop runs on the device: compute with tensors "
              "(torch.where instead of a Python `if`)")


def _check_no_host_reads(graph: torch.fx.Graph) -> None:
    for node in graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "name"):
            continue
        name = node.target.name()
        to_host = (name in ("aten::_to_copy", "aten::to") and
                   str(node.kwargs.get("device", "")).startswith("cpu"))
        if name in _HOST_READS or to_host:
            raise Error(_HOST_READ.format(f"{name}: "))


def for_loop(count: int, body: Callable[..., Any],
             inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    """Runs ``body`` on the device ``count`` times: each iteration takes the
    previous one's outputs (as many as ``inputs``, with the same shapes and
    dtypes) and the first takes ``inputs``. Returns the last outputs, as a list.

    ``body`` is called once, as PopTorch traces it once; what it does to
    tensors (including in-place updates of buffers and prints) happens every
    iteration. It must not read tensor values on the host.
    """
    _check_tensor_list(inputs, "for_loop", "input")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise Error(f"poptorch.for_loop: count must be an integer >= 0, got {count!r}")
    if not _on_ipu(inputs):
        values = list(inputs)
        for _ in range(count):
            values = _check_carried(_as_list(body(*values), "poptorch.for_loop's body"), values)
        return values
    # The body's inputs are passed by value, as in PopTorch.
    values = [t.clone() for t in inputs]
    if count == 0:
        return values
    first: List[List[torch.Tensor]] = []

    def traced(*args: torch.Tensor) -> List[torch.Tensor]:
        outputs = _check_carried(_as_list(body(*args), "poptorch.for_loop's body"), args)
        first.append(outputs)
        return outputs
    # The trace runs on the real (lazy) tensors: it is the first iteration.
    try:
        recorded = make_fx(traced, tracing_mode="real")(*values)
    except RuntimeError as error:
        if "value out of a tracing tensor" not in str(error):
            raise
        raise Error(_HOST_READ.format("")) from None
    _check_no_host_reads(recorded.graph)
    values = first[0]
    for _ in range(count - 1):
        values = list(recorded(*values))
    return values


def _check_carried(outputs: List[torch.Tensor],
                   inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    if len(outputs) != len(inputs):
        raise Error(f"poptorch.for_loop: the body returns {len(outputs)} tensors for "
                    f"{len(inputs)} inputs: it must return one per input (the next "
                    "iteration's inputs)")
    for index, (out, inp) in enumerate(zip(outputs, inputs)):
        if out.shape != inp.shape or out.dtype != inp.dtype:
            raise Error(f"poptorch.for_loop: output {index} of the body is {out.dtype} of shape "
                        f"{list(out.shape)} where its input is {inp.dtype} of shape "
                        f"{list(inp.shape)}: each iteration's outputs feed the next one")
    return outputs


class _BranchChecks(TorchDispatchMode):
    """While a branch of ``cond`` is traced: both branches run on the device,
    so a branch must not change tensors made outside it (PopTorch passes them
    by copy) nor act on the host (print, call back)."""

    def __init__(self, branch: str) -> None:
        super().__init__()
        self.branch = branch
        # Tensors made inside the branch (views of them included), by id; held
        # while the branch is traced so that ids stay unique.
        self.inner: Dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        if not name.startswith(("aten::", "prims::")):
            raise Error(f"poptorch.cond: the {self.branch} branch calls {name}, which acts on "
                        "the host: both branches run on the device and each output is "
                        "selected, so it would act whatever the condition. Call it outside "
                        "the branch")
        schema = func._schema
        for argument, value in zip(schema.arguments, list(args) + [
                kwargs.get(a.name) for a in schema.arguments[len(args):]]):
            written = argument.alias_info is not None and argument.alias_info.is_write
            if written and isinstance(value, torch.Tensor) and id(value) not in self.inner:
                raise Error(f"poptorch.cond: the {self.branch} branch changes in place "
                            f"({name}) a tensor made outside it. Tensors are passed to a "
                            "branch by copy, as in PopTorch: return the new value instead")
        result = func(*args, **kwargs)
        views = any(r.alias_info is not None and not r.alias_info.is_write
                    for r in schema.returns)
        first_input = next((a for a in args if isinstance(a, torch.Tensor)), None)
        inner = not views or first_input is None or id(first_input) in self.inner
        for out in (result if isinstance(result, (list, tuple)) else [result]):
            if isinstance(out, torch.Tensor) and inner:
                self.inner[id(out)] = out
        return result


def cond(condition: torch.Tensor, then_body: Callable[..., Any],
         then_inps: List[torch.Tensor], else_body: Callable[..., Any],
         else_inps: List[torch.Tensor]) -> List[torch.Tensor]:
    """``then_body(*then_inps)`` if ``condition`` (a one-element tensor) is
    true, else ``else_body(*else_inps)``, decided on the device: both branches
    are traced, return as many outputs of equal shapes and dtypes, and each
    output is selected with ``torch.where``. A branch must not change tensors
    made outside it in place (return the new value) nor print or call the host.
    """
    _check_tensor_list(then_inps, "cond", "then_inps and else_inps")
    _check_tensor_list(else_inps, "cond", "then_inps and else_inps")
    if not isinstance(condition, torch.Tensor) or condition.numel() != 1:
        raise Error("poptorch.cond: the condition must be a tensor of one element, got "
                    + (f"shape {list(condition.shape)}" if isinstance(condition, torch.Tensor)
                       else type(condition).__name__))
    if not _on_ipu([condition, *then_inps, *else_inps]):
        if condition:
            return _as_list(then_body(*then_inps), "poptorch.cond's then branch")
        return _as_list(else_body(*else_inps), "poptorch.cond's else branch")
    with _BranchChecks("then"):
        then_out = _as_list(then_body(*then_inps), "poptorch.cond's then branch")
    with _BranchChecks("else"):
        else_out = _as_list(else_body(*else_inps), "poptorch.cond's else branch")
    if len(then_out) != len(else_out):
        raise Error(f"poptorch.cond: the then branch returns {len(then_out)} tensors and the "
                    f"else branch {len(else_out)}: they must return as many")
    for index, (a, b) in enumerate(zip(then_out, else_out)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise Error(f"poptorch.cond: output {index} is {a.dtype} of shape {list(a.shape)} in "
                        f"the then branch and {b.dtype} of shape {list(b.shape)} in the else "
                        "branch: they must match")
    selector = condition.reshape(()).to(torch.bool)
    return [torch.where(selector, a, b) for a, b in zip(then_out, else_out)]
