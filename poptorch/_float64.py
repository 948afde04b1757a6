"""64-bit floating point inside a wrapped model: demoted to 32 bits, as in PopTorch.

IPUs have no 64-bit floating point. PopTorch runs a model that asks for
float64 (complex128) in float32 (complex64): its 64-bit inputs (see
``_executor_inputs._flatten``), its casts (``x.double()``, ``x.to(torch.float64)``,
``x.type(torch.float64)``), the tensors it makes in ``forward`` with
``dtype=torch.float64`` or from float64 data (``torch.tensor(numpy_array)``) and
the float64 host tensors it reads (upstream's ``type_support_test``). While a
step of a ``trainingModel``/``inferenceModel`` is captured, a
``TorchFunctionMode`` rewrites those requests, and ``HostConstants`` uploads
host tensors with ``ipu_dtype``. Used directly, the ``ipu`` device keeps PyTorch's
semantics and refuses float64 with a ``TypeError`` that says how to convert.
"""
from __future__ import annotations

from typing import Any, Dict

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from ._logging import logger

DEMOTED: Dict[torch.dtype, torch.dtype] = {torch.float64: torch.float32,
                                           torch.complex128: torch.complex64}

# Tensor methods that name a 64-bit dtype, and their 32-bit twins.
_METHODS = {torch.Tensor.double: torch.Tensor.float, torch.Tensor.cdouble: torch.Tensor.cfloat}


# Functions that make a tensor of their data's dtype when given none.
_FROM_DATA = frozenset((torch.tensor, torch.as_tensor, torch.asarray))


def ipu_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an IPU holds a value of ``dtype`` in."""
    return DEMOTED.get(dtype, dtype)


class Float64Demotion(TorchFunctionMode):
    """While a step is captured: every 64-bit floating point dtype a function
    is asked for is the 32-bit one (a warning says so once)."""

    def __init__(self) -> None:
        super().__init__()
        self._warned = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _FROM_DATA and kwargs.get("dtype") is None:
            host = func(*args, **{**kwargs, "device": "cpu"})
            if host.dtype in DEMOTED:
                self._warn(func)
                return host.to(kwargs.get("device") or torch.get_default_device(),
                               DEMOTED[host.dtype])
        asks = any(isinstance(leaf, torch.dtype) and leaf in DEMOTED
                   for leaf in pytree.tree_leaves((args, kwargs)))
        demoted = _METHODS.get(func, func)
        if asks or demoted is not func:
            self._warn(func)
            args, kwargs = pytree.tree_map_only(torch.dtype, ipu_dtype, (args, kwargs))
        return demoted(*args, **kwargs)

    def _warn(self, func: Any) -> None:
        if not self._warned:
            logger.warning("the model asks for a 64-bit floating point dtype (%s): IPUs have "
                           "none, so it runs in 32 bits, as in PopTorch",
                           getattr(func, "__name__", func))
            self._warned = True
