"""DLPack export of ipu tensors (``np.from_dlpack``, ``torch.from_dlpack``, ``__dlpack__``).

DLPack hands a consumer the tensor's memory to share. An ipu tensor's bytes are written when
its queued graph runs, not when the op is called, and the graph reads its inputs then too: a
shared view would see neither the pending writes nor keep its own writes out of the pending
reads, so results would silently differ from the CPU's. Export is refused with a clear error
(also a ``BufferError``, the protocol's "cannot export" error); a consumer that asks for a
host copy (``dl_device`` the CPU and ``copy=True``, as ``np.from_dlpack(t, device="cpu",
copy=True)`` does) gets one, after the pending ops ran.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.dlpack import DLDeviceType

from ._errors import Error


class DLPackError(Error, BufferError):
    """An ipu tensor cannot be shared through DLPack: export a host copy."""


_tensor_dlpack = torch.Tensor.__dlpack__
_tensor_dlpack_device = torch.Tensor.__dlpack_device__
_to_dlpack = torch.utils.dlpack.to_dlpack


def _dlpack(self: torch.Tensor, *, stream: Any = -1, max_version: Any = None,
            dl_device: Any = None, copy: Any = None) -> Any:
    if self.device.type != "ipu":
        return _tensor_dlpack(self, stream=stream, max_version=max_version,
                              dl_device=dl_device, copy=copy)
    if copy is True and dl_device is not None and dl_device[0] == DLDeviceType.kDLCPU:
        return _tensor_dlpack(self.cpu(), max_version=max_version, dl_device=dl_device,
                              copy=False)
    raise _refusal()


def _refusal() -> DLPackError:
    return DLPackError(
        "an ipu tensor cannot be shared through DLPack: its bytes are written when its queued "
        "ops run, so a shared view would not see them. Export a host copy instead: "
        "torch.from_dlpack(t.cpu()) or np.from_dlpack(t.cpu()) (t.cpu() runs the pending "
        "ops and copies; np.from_dlpack(t, device='cpu', copy=True) does the same).")


def _to_dlpack_checked(tensor: torch.Tensor) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "ipu":
        raise _refusal()
    return _to_dlpack(tensor)


def _dlpack_device(self: torch.Tensor) -> Any:
    if self.device.type != "ipu":
        return _tensor_dlpack_device(self)
    # DLPack knows no ipu: it is an extension device, whose memory no consumer shares.
    return (DLDeviceType.kDLExtDev, self.device.index or 0)


def install() -> None:
    """Wraps Tensor.__dlpack__, __dlpack_device__ and torch.utils.dlpack.to_dlpack (once)."""
    if torch.Tensor.__dlpack__ is _dlpack:
        return
    torch.utils.dlpack.to_dlpack = _to_dlpack_checked
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
