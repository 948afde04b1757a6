"""Checkpoints of ipu tensors: ``torch.save``/``torch.load``, ``pickle`` and
``copy.deepcopy``, through PyTorch's own machinery.

* ``torch.serialization.register_package`` tags ipu storages ``"ipu:N"`` when
  they are saved and moves storages tagged (or mapped) to an ipu back there when
  they are loaded. Tensors are saved by ``Tensor.__reduce_ex__`` as on the CPU
  (``_rebuild_tensor_v2`` over a storage), so views of one storage load as views
  of one storage, and a checkpoint loads without poptorch with
  ``map_location="cpu"``.
* PyTorch calls a storage with no bytes "invalid" and refuses to save or copy
  it; a lazy ipu storage has none until a graph that writes it runs. There is no
  hook between a tensor and the Python object of its storage, so
  ``Tensor.untyped_storage`` (and ``Tensor.data_ptr``, which is 0 without
  bytes, so that distinct pending tensors would look like one) is wrapped: for
  ipu tensors it first gives the storage host memory (nothing runs; reading the
  bytes still syncs what is pending, through the ipu's copy kernel).
* ``Tensor.__deepcopy__`` clones ipu tensors one by one (PyTorch lists the ipu
  with XLA and MPS there), which loses storage sharing and strides. Plain ipu
  tensors are deep-copied as CPU tensors are instead: each storage is copied
  once (lazily, on the device) and every tensor over it becomes the same view of
  the copy.
"""
from __future__ import annotations

import copy
import re
from typing import Any, Dict, Optional

import torch

from . import _C

_LOCATION = re.compile(r"ipu(?::(\d+))?")
_PRIORITY = 30  # after PyTorch's own devices (10-26); only "ipu" locations match

_untyped_storage = torch.Tensor.untyped_storage  # PyTorch's own (C methods)
_data_ptr = torch.Tensor.data_ptr
_torch_deepcopy = torch.Tensor.__deepcopy__


def _ipu_tag(storage: Any) -> Optional[str]:
    if storage.device.type == "ipu":
        return f"ipu:{storage.device.index}"
    return None


def _device_for(location: str) -> Optional[torch.device]:
    """The ipu a location tag names, or None if it names another device."""
    match = _LOCATION.fullmatch(location)
    if match is None:
        return None
    index = _C.current_device() if match.group(1) is None else int(match.group(1))
    if index >= _C.device_count():
        raise RuntimeError(
            f"Attempting to deserialize object on ipu:{index} but this machine has "
            f"{_C.device_count()} IPUs (torch.ipu.device_count()). Use torch.load with "
            f"map_location to map the storages to an existing device (or set "
            f"POPTORCH_NUM_IPUS).")
    return torch.device("ipu", index)


def _ipu_deserialize(storage: Any, location: str) -> Optional[torch.UntypedStorage]:
    device = _device_for(location)
    if device is None:
        return None
    if storage.device == device:
        return storage
    # torch.UntypedStorage(n, device="ipu") is refused by PyTorch (its list of
    # storage devices is closed), so the storage comes from an ipu tensor.
    target = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device).untyped_storage()
    target.copy_(storage)
    return target


def _untyped_storage_backed(self: torch.Tensor) -> torch.UntypedStorage:
    if self.is_ipu:
        _C.back_storage(self)
    return _untyped_storage(self)


def _data_ptr_backed(self: torch.Tensor) -> int:
    if self.is_ipu:
        _C.back_storage(self)  # else every pending tensor's pointer is 0
    return _data_ptr(self)


_untyped_storage_backed.__doc__ = _untyped_storage.__doc__
_data_ptr_backed.__doc__ = _data_ptr.__doc__


def _copy_storage(tensor: torch.Tensor, memo: Dict[Any, Any]) -> torch.UntypedStorage:
    """A copy of ``tensor``'s whole storage, made once per deepcopy (like
    ``UntypedStorage.__deepcopy__``, under the same memo key)."""
    storage = _untyped_storage(tensor)
    copies = memo.setdefault("torch", {})
    if storage._cdata not in copies:
        with torch.no_grad():
            whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
            copies[storage._cdata] = _untyped_storage(whole.clone())
    return copies[storage._cdata]


def _deepcopy(self: torch.Tensor, memo: Dict[Any, Any]) -> torch.Tensor:
    if type(self) is not torch.Tensor or not self.is_ipu or not self.is_leaf:
        return _torch_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        new = torch.empty(0, dtype=self.dtype, device=self.device)
        new.set_(_copy_storage(self, memo), self.storage_offset(), self.size(), self.stride())
        if self.is_conj():  # as PyTorch does for CPU tensors
            new = new.conj_physical()
        if self.is_neg():
            new = new.neg()
    if self.requires_grad:
        new.requires_grad_()
    if self.grad is not None:
        new.grad = self.grad.__deepcopy__(memo)
    self._clear_non_serializable_cached_data()
    new.__dict__ = copy.deepcopy(self.__dict__, memo)
    memo[id(self)] = new
    return new


def install() -> None:
    """Registers the ipu with torch.serialization and wraps the Tensor
    methods above (once)."""
    if torch.Tensor.untyped_storage is _untyped_storage_backed:
        return
    torch.serialization.register_package(_PRIORITY, _ipu_tag, _ipu_deserialize)
    torch.Tensor.untyped_storage = _untyped_storage_backed
    torch.Tensor.data_ptr = _data_ptr_backed
    torch.Tensor.__deepcopy__ = _deepcopy
