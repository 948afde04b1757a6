"""The wrapped model's own methods reached through its wrapper (``wrapped.generate``).

As in PopTorch, the wrapper hands out the model's attributes, so ``wrapped.generate(...)``
is the model's Hugging Face generation loop. That loop calls the model itself at every
step, and that call is the host model's ``forward`` on the CPU, beside a wrapper whose
whole point is to run ``forward`` on the IPU: it ran, silently, on the host. It cannot run
in the wrapper either: the wrapper runs one compiled step for one input structure (the
seeds: the inputs "cannot vary the control flow of the model or the shapes/sizes of
results"), and generation calls the model with a new length at every step. So a method
reached through the wrapper that runs the model, or any of its submodules, raises a
``poptorch.Error`` saying how to run it on the IPU (lazy mode, where generation runs as on
the CPU) or, deliberately, on the host (``wrapped.model``). Methods that run no module
(``get_input_embeddings()``, ``num_parameters()``) work as before.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List

import torch

from ._errors import Error

# torch.nn.Module's own methods (train, eval, parameters, state_dict, to, ...) manage
# the model and run none of it; forward is the one that runs it.
_MODULE_METHODS = frozenset(name for name in dir(torch.nn.Module) if name != "forward")


def reached_through_wrapper(model: torch.nn.Module, name: str, value: Any,
                            wrapper_kind: str) -> Any:
    """``value``, the model's attribute ``name``, as the wrapper hands it out: a
    method of the model's own that runs the model raises instead."""
    if (not inspect.ismethod(value) or value.__self__ is not model
            or name in _MODULE_METHODS):
        return value

    @functools.wraps(value)
    def refusing_host_runs(*args: Any, **kwargs: Any) -> Any:
        if name == "forward":
            raise _host_run(model, name, "the model", wrapper_kind)
        handles: List[Any] = []
        try:
            for module_name, module in model.named_modules():
                if isinstance(module, torch.jit.ScriptModule):  # takes no Python hooks
                    continue
                where = f"its submodule {module_name!r}" if module_name else "the model"
                handles.append(module.register_forward_pre_hook(
                    _refusal(model, name, where, wrapper_kind), prepend=True))
            return value(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    return refusing_host_runs


def _refusal(model: torch.nn.Module, name: str, where: str,
             wrapper_kind: str) -> Callable[..., None]:
    def refuse(*_: Any) -> None:
        raise _host_run(model, name, where, wrapper_kind)

    return refuse


def _host_run(model: torch.nn.Module, name: str, where: str, wrapper_kind: str) -> Error:
    cls = getattr(type(model), "_poptorch_original", type(model)).__name__
    return Error(
        f"{cls}.{name}(), called through the {wrapper_kind} wrapper, runs {where} on the "
        f"host, not on the IPU: the wrapper runs the model's forward on the IPU only when "
        f"the wrapper itself is called, compiled for one input structure (a generation "
        f"loop calls the model with a new sequence length at every step). To run "
        f"{name}() on the IPU, move a model to the ipu device and call it there, its "
        f"inputs on the ipu too (lazy mode: model.to('ipu'), then model.{name}(...)); to run "
        f"it on the CPU, call it on the model itself: wrapped.model.{name}(...)")
