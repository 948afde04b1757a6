"""Which ipu a ``torch.ipu`` function's ``device`` argument names."""
from __future__ import annotations

from typing import Union

import torch

from . import _C

DeviceLike = Union[torch.device, str, int, None]


def index_of(device: DeviceLike) -> int:
    """The index of the ipu ``device`` names (None: the current one). A device of
    another type is a ValueError, an index with no IPU an IndexError naming the
    IPUs there are."""
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "ipu":
            raise ValueError(f"expected an ipu device, got {device}")
        index = _C.current_device() if device.index is None else device.index
    _C.check_device(index)
    return index
