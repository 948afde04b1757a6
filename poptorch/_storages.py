"""ipu storages made by PyTorch's storage constructors.

``torch.UntypedStorage(nbytes, device="ipu")`` is refused by PyTorch ("Storage
device not recognized"): its C constructor knows a closed list of devices. So
are what is built on it: ``torch.TypedStorage(..., device="ipu")``,
``storage.clone()`` of an ipu storage and so ``copy.deepcopy`` of one. An ipu
storage is the storage of an ipu byte tensor, so the constructor makes one that
way for the ipu; every other device, and any argument it does not take, goes to
PyTorch's own constructor (which keeps its checks and errors).
"""
from __future__ import annotations

from typing import Any

import torch

from . import _serialization

_torch_new = torch.UntypedStorage.__new__  # PyTorch's own (the C constructor)


def _ipu_device(device: Any) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "ipu"
    return isinstance(device, torch.device) and device.type == "ipu"


def _new(cls: type, *args: Any, **kwargs: Any) -> torch.UntypedStorage:
    device = kwargs.get("device")
    if (cls is not torch.UntypedStorage or not _ipu_device(device) or len(args) > 1 or
            set(kwargs) != {"device"}):
        return _torch_new(cls, *args, **kwargs)
    source = args[0] if args else 0
    if isinstance(source, int):
        host = None
        nbytes = source
    else:  # a sequence of byte values: PyTorch's constructor checks them on the host
        host = _torch_new(cls, source)
        nbytes = host.nbytes()
    tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
    # A storage with no bytes yet is "invalid" to PyTorch: back it (nothing runs).
    storage = _serialization._untyped_storage_backed(tensor)  # pylint: disable=protected-access
    if host is not None:
        storage.copy_(host)
    return storage


def install() -> None:
    """Makes ``torch.UntypedStorage(..., device="ipu")`` work (once)."""
    if torch.UntypedStorage.__dict__.get("__new__") is None:
        torch.UntypedStorage.__new__ = staticmethod(_new)
