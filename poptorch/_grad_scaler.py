"""``torch.amp.GradScaler("ipu")``.

PyTorch's scaler is device-generic but computes its inverse scale in float64
(``scale.double().reciprocal().float()``, for a correctly rounded reciprocal),
and IPUs have no 64-bit floating point: ipu tensors refuse float64. While a
scaler of the ipu unscales, its thread may make 0-dim float64 ipu tensors,
which holds only that scalar; everything else is PyTorch's own scaler.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from . import _C


def install() -> None:
    """Lets ``GradScaler("ipu").unscale_`` (also called by ``step``) compute in float64."""
    unscale = torch.amp.GradScaler.unscale_
    if getattr(unscale, "_poptorch", False):
        return

    @functools.wraps(unscale)
    def unscale_(self: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> Any:
        if self._device != "ipu":
            return unscale(self, optimizer)
        previous = _C.set_float64_scalars_allowed(True)
        try:
            return unscale(self, optimizer)
        finally:
            _C.set_float64_scalars_allowed(previous)

    unscale_._poptorch = True  # type: ignore[attr-defined]
    torch.amp.GradScaler.unscale_ = unscale_  # type: ignore[method-assign]
