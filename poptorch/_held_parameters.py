"""Parameters a model reaches outside its registered attributes.

``torch.func.functional_call`` hands ``forward`` the device tensors through
the model's registered parameters; a model that also keeps its parameters
in a plain list (``self.weights = [...]``, as PopTorch's phased-execution
example does) would read the host tensors through it, which the step treats
as constants: no gradient would reach them. While such a model's step is
captured, a ``TorchFunctionMode`` hands torch functions the device tensor
in place of each host parameter, as PopTorch's tracing sees the parameter.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode


def _holds_parameters(value: Any) -> bool:
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(
        isinstance(v, torch.nn.Parameter) for v in value)


class _DeviceParameters(TorchFunctionMode):
    def __init__(self, by_host: Dict[int, torch.Tensor]) -> None:
        super().__init__()
        self._by_host = by_host

    def __torch_function__(self, func, types, args=(), kwargs=None):
        swap = lambda t: self._by_host.get(id(t), t)  # noqa: E731
        args, kwargs = pytree.tree_map_only(torch.Tensor, swap, (args, kwargs or {}))
        return func(*args, **kwargs)


def device_parameters(model: torch.nn.Module, host: Dict[str, torch.Tensor],
                      device: Dict[str, torch.Tensor]) -> ContextManager[None]:
    """While the step of ``model`` is captured: its host tensors (``host``, by
    name) read outside its registered attributes read their device tensors
    (``device``, by name). Nothing is added for models that hold none."""
    if not any(_holds_parameters(v) for m in model.modules() for v in vars(m).values()):
        return contextlib.nullcontext()
    return _DeviceParameters({id(host[name]): device[name] for name in host})
