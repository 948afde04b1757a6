"""``torch.ipu``: the device module of the ipu, shaped like ``torch.cuda``."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Union

import torch

from . import _C

_DeviceLike = Union[torch.device, str, int, None]


def _index(device: _DeviceLike) -> int:
    if device is None:
        return _C.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "ipu":
        raise ValueError(f"expected an ipu device, got {device}")
    return _C.current_device() if device.index is None else device.index


def is_available() -> bool:
    """True: the ipu device (emulated on the host) is always there."""
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True


def device_count() -> int:
    """The number of virtual IPUs (``POPTORCH_NUM_IPUS``, 4 by default)."""
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: _DeviceLike) -> None:
    _C.set_device(_index(device))


@contextlib.contextmanager
def device(device: _DeviceLike) -> Iterator[None]:
    """Context manager that makes ``device`` the current ipu."""
    previous = _C.current_device()
    _C.set_device(_index(device))
    try:
        yield
    finally:
        _C.set_device(previous)


def synchronize(device: _DeviceLike = None) -> None:
    """Runs every pending ipu operation (all IPUs share one queue)."""
    _C.synchronize()


def memory_allocated(device: _DeviceLike = None) -> int:
    """Bytes held by ipu tensors on ``device``."""
    return _C.memory_allocated(_index(device))


def max_memory_allocated(device: _DeviceLike = None) -> int:
    return _C.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def get_device_name(device: _DeviceLike = None) -> str:
    return f"IPU Model (emulated on the host), ipu:{_index(device)}"


def get_device_properties(device: _DeviceLike = None) -> dict:
    index = _index(device)
    return {"name": get_device_name(index), "total_memory": _C.memory_capacity(index)}


def manual_seed(seed: int) -> None:
    """Seeds the ipu's random numbers (drawn on the host)."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def _is_in_bad_fork() -> bool:
    return False

