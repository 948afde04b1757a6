"""``torch.ipu.amp``, as ``torch.cuda.amp``: ``autocast`` and ``GradScaler`` of the ipu.

Both are PyTorch's own (``torch.autocast("ipu")`` casts with PyTorch's op lists,
see ``csrc/capture/autocast.cpp``; ``torch.amp.GradScaler("ipu")``, see
``poptorch/_grad_scaler.py``), with the device filled in.
"""
from __future__ import annotations

import sys
import types
from typing import Optional

import torch


class autocast(torch.amp.autocast_mode.autocast):  # pylint: disable=invalid-name
    """``torch.autocast("ipu", ...)`` (float16 unless ``dtype`` says otherwise)."""

    def __init__(self, enabled: bool = True, dtype: Optional[torch.dtype] = None,
                 cache_enabled: bool = True) -> None:
        super().__init__("ipu", dtype=dtype if dtype is not None else torch.float16,
                         enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("ipu", ...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("ipu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


amp = types.ModuleType("torch.ipu.amp", __doc__)
amp.autocast = autocast  # type: ignore[attr-defined]
amp.GradScaler = GradScaler  # type: ignore[attr-defined]
# `import torch.ipu.amp` and `from torch.ipu.amp import autocast` find it.
sys.modules["torch.ipu.amp"] = amp
