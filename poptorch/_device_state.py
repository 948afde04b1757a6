"""The IPU copies of a model's parameters and buffers.

The host model's tensors are made to *alias* the device copies (the emulated
IPU keeps its memory on the host), so the wrapped and the original model stay
in sync as PopTorch promises, and every executor wrapping the same model shares
one set of device weights (training updates are seen by inference at once).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Set

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _C

# host tensor -> its device copy, shared by every executor using that tensor.
_DEVICE_COPIES = WeakIdKeyDictionary()
_USERS = WeakIdKeyDictionary()  # host tensor -> ids of the executors using its device copy


def _aliases(host: torch.Tensor, device: torch.Tensor) -> bool:
    return host.data_ptr() == device.data_ptr() and host.shape == device.shape


def _alias(host: torch.Tensor, device: torch.Tensor) -> None:
    """Makes ``host`` read and write the device copy's bytes: through a CPU
    view of them for a host tensor, or as the device tensor itself for a
    tensor already on an ipu (``model.to("ipu")``), which stays on the ipu."""
    host.data = device if host.is_ipu else _C.host_alias(device)


def _host_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Parameters and buffers by name; a tensor tied under two names appears twice."""
    state: Dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        state[name] = p
    for name, b in model.named_buffers(remove_duplicate=False):
        if b is not None:
            state[name] = b
    return state


class DeviceState:
    """The device tensors behind one model, for one executor."""

    def __init__(self, model: torch.nn.Module, owner: int, device: torch.device) -> None:
        self.owner = owner
        self.device = device
        self.host = _host_state(model)
        self.tensors: Dict[str, torch.Tensor] = {}
        self.attach()

    def attach(self) -> None:
        """Gives every host tensor a device copy (shared if one exists) and
        makes the host tensor alias it."""
        for name, host in self.host.items():
            device = _DEVICE_COPIES.get(host)
            if device is None or not _aliases(host, device):
                device = host.detach().to(self.device)
                _C.synchronize()
                _DEVICE_COPIES[host] = device
                _alias(host, device)
            _USERS.setdefault(host, set()).add(self.owner)
            self.tensors[name] = device

    def detach(self) -> None:
        """Gives host tensors back their own memory where no other executor
        still uses the device copy."""
        _C.synchronize()
        for host in self.host.values():
            users = _USERS.get(host, set())
            users.discard(self.owner)
            if not users and host in _DEVICE_COPIES:
                if not host.is_ipu:  # an ipu host tensor owns its memory already
                    host.data = host.data.clone()
                del _DEVICE_COPIES[host]
        self.tensors = {}

    def copy_to_device(self, hosts: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """Re-syncs device copies with host tensors that were replaced
        (``param.data = ...``) since wrapping; ``hosts`` (name -> tensor) may
        name new host tensors, which then alias the device copy."""
        for name, host in (self.host if hosts is None else hosts).items():
            device = self.tensors[name]
            if host is not self.host[name]:  # a new tensor object under that name
                old = self.host[name]
                _USERS.get(old, set()).discard(self.owner)
                self.host[name] = host
                _DEVICE_COPIES[host] = device
                _USERS.setdefault(host, set()).add(self.owner)
            if not _aliases(host, device):
                with torch.no_grad():
                    device.copy_(host.detach())
                _C.synchronize()
                _alias(host, device)

    def copy_to_host(self) -> None:
        _C.synchronize()
        for name, host in self.host.items():
            device = self.tensors[name]
            if not _aliases(host, device):
                host.data.copy_(device.cpu())

    def parameters(self, model: torch.nn.Module) -> List[torch.Tensor]:
        """Device copies of the trainable parameters, in model order, without duplicates."""
        seen: Set[int] = set()
        params = []
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(self.tensors[name])
        return params
