"""Host tensors a captured step reads: constants of the step, as in PopTorch.

The dispatcher uploads a host tensor an op reads next to ipu tensors (see
``uploadHostConstants`` in csrc/capture/fallback.cpp). That is too late for a
composite op whose C++ body first computes on the host tensors alone and then
writes an ipu value into the host result: ``binary_cross_entropy_with_logits``
with a ``weight`` or ``pos_weight`` held by the model outside its buffers
computes ``(1 - target).mul_(input)``. While a step is captured, a
``TorchFunctionMode`` uploads such tensors when the function is called from
Python, so the whole op runs on the ipu. Tensors a function writes (in-place
functions, ``out=``) and 0-dim ones (host scalars mix with any device) stay.
A float64 (complex128) tensor is uploaded in 32 bits, as PopTorch makes it a
float32 (complex64) constant (see ``_float64``). ``torch.normal(mean, std, size)``
without a device, a factory that PyTorch's default-device mode leaves out, is
made on the step's device as the other factories are.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ._float64 import ipu_dtype


def _ipu_device(tree: Any) -> Optional[torch.device]:
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.device.type == "ipu":
            return leaf.device
    return None


def _is_host_factory_call(args: Any, kwargs: Any) -> bool:
    """Whether a call makes a tensor from Python values alone, without a device."""
    return "device" not in kwargs and "out" not in kwargs and not any(
        isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves((args, kwargs)))


# Functions whose tensor argument says where the result goes.
_MOVES = frozenset(("to", "type_as"))


class HostConstants(TorchFunctionMode):
    """While a step is captured: host tensors read with ipu tensors are uploaded."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.normal and _is_host_factory_call(args, kwargs):
            # The step's default device (PyTorch's device mode leaves torch.normal out:
            # its other overloads take tensors), as for the other factories: on the
            # host, an in-place op with the step's tensors would refuse it.
            kwargs = {**kwargs, "device": torch.get_default_device()}
        name = getattr(func, "__name__", "")
        writes = name.endswith("_") or "out" in kwargs
        device = None if writes or name in _MOVES else _ipu_device((args, kwargs))
        if device is not None:
            def upload(t: torch.Tensor) -> torch.Tensor:
                if t.device.type == "cpu" and t.dim() > 0:
                    return t.to(device, ipu_dtype(t.dtype))
                return t
            args, kwargs = pytree.tree_map_only(torch.Tensor, upload, (args, kwargs))
        return func(*args, **kwargs)
