"""``poptorch.CPU``: a Python function the IPU program calls back on the host.

A call of the wrapper on ipu tensors is a ``poptorch::host_call`` node of the
program, whose CPU kernel calls the function with that run's values: a wrapped
model calls it for every micro-batch it replays, a lazy graph when it runs.
The node's output shapes come from calling the function once on zeros when it
is captured, as PopTorch does.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from .._errors import Error

# Wrapper id -> wrapper. The program refers to a wrapper by id (a constant of
# its structure); a wrapper that is gone is an error when the program runs.
_WRAPPERS: "weakref.WeakValueDictionary[int, CPU]" = weakref.WeakValueDictionary()
_next_id = itertools.count(1)
_ids_lock = threading.Lock()


@torch.library.custom_op("poptorch::host_call", mutates_args=(), device_types="cpu")
def _host_call(inputs: List[torch.Tensor], callback: int) -> List[torch.Tensor]:
    wrapper = _WRAPPERS.get(callback)
    if wrapper is None:
        raise Error("a poptorch.CPU op of this program no longer exists: keep the "
                    "poptorch.CPU object alive while the model uses it")
    return wrapper._execute(inputs)


@_host_call.register_fake
def _host_call_fake(inputs: List[torch.Tensor], callback: int) -> List[torch.Tensor]:
    wrapper = _WRAPPERS[callback]
    device = inputs[0].device
    return [torch.empty(shape, dtype=dtype, device=device)
            for shape, dtype in wrapper._output_specs[wrapper._key(inputs)]]


class CPU:
    """Runs a function on the host in the middle of an IPU program (inference
    only, as in PopTorch):

    >>> class Model(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.cpu = poptorch.CPU(self.myCpuOp, "MyCPUOp")
    ...
    ...     def myCpuOp(self, x):
    ...         return x * 2.0
    ...
    ...     def forward(self, x):
    ...         return self.cpu(x)

    The function receives host copies of the arguments of each run (every
    micro-batch of a wrapped model's call) and returns a tensor or a list or
    tuple of tensors, always of the shapes and dtypes it returned when it was
    first called (on zeros, when the model was captured). On the CPU the
    wrapper simply calls the function.
    """

    def __init__(self, layer_to_call: Callable[..., Any], ID: str) -> None:
        if not callable(layer_to_call):
            raise Error(f"poptorch.CPU needs a callable, got {type(layer_to_call).__name__}")
        self._layer_to_call = layer_to_call
        if isinstance(layer_to_call, torch.nn.Module):
            layer_to_call.requires_grad_(False)
        self._ID = ID
        with _ids_lock:
            self._callback = next(_next_id)
        _WRAPPERS[self._callback] = self
        # Input signature -> (shape, dtype) of each output.
        self._output_specs: Dict[Tuple, List[Tuple[torch.Size, torch.dtype]]] = {}
        self._single: Dict[Tuple, bool] = {}

    @staticmethod
    def _key(inputs: Sequence[torch.Tensor]) -> Tuple:
        return tuple((tuple(t.shape), t.dtype) for t in inputs)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if not all(isinstance(t, torch.Tensor) for t in inputs):
            raise Error(f"poptorch.CPU {self._ID!r}: arguments must be tensors")
        if not any(t.device.type == "ipu" for t in inputs):
            return self._layer_to_call(*inputs)
        if not inputs:
            raise Error(f"poptorch.CPU {self._ID!r}: needs at least one tensor argument")
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            raise Error(f"poptorch.CPU {self._ID!r}: CPU ops are only supported in inference "
                        "graphs (as in PopTorch): their outputs have no gradient. Detach the "
                        "arguments or use an inferenceModel")
        key = self._key(inputs)
        if key not in self._output_specs:
            with torch.no_grad():
                outputs = self._layer_to_call(
                    *[torch.zeros(s, dtype=d, device="cpu") for s, d in key])
            self._single[key] = isinstance(outputs, torch.Tensor)
            self._output_specs[key] = [(o.shape, o.dtype) for o in self._as_list(outputs)]
        results = torch.ops.poptorch.host_call(list(inputs), self._callback)
        return results[0] if self._single[key] else results

    def _as_list(self, outputs: Any) -> List[torch.Tensor]:
        values = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        if not values or not all(isinstance(o, torch.Tensor) for o in values):
            raise Error(f"poptorch.CPU {self._ID!r}: the function must return a tensor or a "
                        "list or tuple of tensors")
        return values

    def _execute(self, inputs: List[torch.Tensor]) -> List[torch.Tensor]:
        """The kernel: the function on host copies of this run's values."""
        with torch.no_grad():
            outputs = self._as_list(self._layer_to_call(*[t.clone() for t in inputs]))
        expected = self._output_specs[self._key(inputs)]
        if [(o.shape, o.dtype) for o in outputs] != expected:
            raise Error(f"poptorch.CPU {self._ID!r}: the function returned "
                        f"{[(list(o.shape), o.dtype) for o in outputs]} where it returned "
                        f"{[(list(s), d) for s, d in expected]} when the model was captured: "
                        "its outputs must keep their shapes and dtypes")
        return [o.detach().cpu().clone() for o in outputs]
