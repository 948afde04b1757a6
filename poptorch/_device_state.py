"""The IPU copies of a model's parameters and buffers.

The host model's tensors are made to *alias* the device copies (the emulated
IPU keeps its memory on the host), so the wrapped and the original model stay
in sync as PopTorch promises, and every executor wrapping the same model shares
one set of device weights (training updates are seen by inference at once).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _C
from ._errors import Error
from ._python_reads import stateless

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


def _slot(slots: Any, key: str) -> Callable[[], Optional[torch.Tensor]]:
    """What a module holds under ``key`` of its parameters or buffers, read at each call."""
    if type(slots) is dict:  # pylint: disable=unidiomatic-typecheck
        return functools.partial(dict.get, slots, key)
    # a TorchScript module's (torch.jit's view of its C++ attributes)
    return lambda: slots[key] if key in slots else None


class DeviceState:
    """The device tensors behind one model, for one executor."""

    def __init__(self, model: torch.nn.Module, owner: int, device: torch.device) -> None:
        self.owner = owner
        self.device = device
        self.host = _host_state(model)
        self.tensors: Dict[str, torch.Tensor] = {}
        # names, host tensors and device tensors in one order, for the check of
        # every call (changed_on_the_host); None after either dict changed
        self._pairs: Optional[Tuple[List[str], List[torch.Tensor], List[torch.Tensor]]] = None
        # (name, what its module holds under it now): where the user may put
        # another tensor under that name
        self._slots: List[Tuple[str, Callable[[], Optional[torch.Tensor]]]] = []
        # (name, the dict a module keeps its submodules in, a copy of it): the
        # compiled step runs the submodules it was compiled with
        self._children: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = []
        self.buffer_names: Set[str] = set()
        for prefix, module in model.named_modules(remove_duplicate=False):
            dot = f"{prefix}." if prefix else ""
            for slots in (module._parameters, module._buffers):  # pylint: disable=protected-access
                self._slots += [(dot + key, _slot(slots, key)) for key in slots.keys()
                                if dot + key in self.host]
            self.buffer_names.update(dot + key for key in module._buffers.keys())  # pylint: disable=protected-access
            children = module._modules  # pylint: disable=protected-access
            # TorchScript refuses to replace a module's submodules
            if children and not isinstance(module, torch.jit.ScriptModule):
                self._children.append((prefix, children, dict(children)))
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
        self._pairs = None

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
        self._pairs = None

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
                self._pairs = None
            if not _aliases(host, device):
                with torch.no_grad():
                    device.copy_(host.detach())
                _C.synchronize()
                _alias(host, device)

    def changed_on_the_host(self, training: bool) -> Dict[str, torch.Tensor]:
        """Host tensors the user gave new data (``param.data = t``) or replaced
        (``module.weight = Parameter(t)``, a buffer assigned anew) since the
        last run, by name; the caller copies them to the device. What the
        compiled step cannot take is an error saying what to do."""
        self._check_submodules()
        changed: Dict[str, torch.Tensor] = {}
        replaced = set()
        for name, slot in self._slots:
            current = slot()
            if current is not self.host[name]:
                if current is None:
                    raise Error(f"the model's {name!r} was removed (set to None) after the "
                                "model was compiled: call destroy() to compile it again")
                changed[name] = current
                replaced.add(name)
        if self._pairs is None:
            names = list(self.host)
            self._pairs = (names, [self.host[n] for n in names], [self.tensors[n] for n in names])
        names, hosts, devices = self._pairs
        for index in _C.unaliased(hosts, devices):
            changed.setdefault(names[index], hosts[index])
        for name, host in changed.items():
            device = self.tensors[name]
            if host.shape != device.shape or host.dtype != device.dtype:
                raise Error(f"the model's {name!r} became a {host.dtype} tensor of shape "
                            f"{list(host.shape)} after the model was compiled for a "
                            f"{device.dtype} tensor of shape {list(device.shape)} (model.half(), "
                            "or a tensor assigned to it): call destroy() to compile it again")
            if training and name in replaced and isinstance(self.host[name], torch.nn.Parameter):
                raise Error(f"the model's parameter {name!r} was replaced by another tensor after "
                            "the model was wrapped, and the optimizer updates the old one: "
                            "copy the new values into it (with torch.no_grad(): "
                            "param.copy_(new)), or wrap the model again with an optimizer of "
                            "its new parameters")
        return changed

    def _check_submodules(self) -> None:
        """A submodule replaced, added or removed after compiling (``model.fc = Linear(...)``)
        is not in the compiled step, which would go on running the old one. One without
        parameters or buffers replaced by another (``self.act = nn.GELU()``) is not an
        error: the step's guards on what forward reads capture it again (_python_reads.py)."""
        for prefix, children, compiled in self._children:
            if children == compiled:  # Module compares by identity
                continue
            keys = sorted(k for k in children.keys() | compiled.keys()
                          if children.get(k) is not compiled.get(k)
                          and not (stateless(children.get(k)) and stateless(compiled.get(k))))
            if not keys:
                continue
            key = keys[0]
            name = f"{prefix}.{key}" if prefix else key
            what = ("added" if key not in compiled else "removed" if key not in children
                    else "replaced by another module")
            raise Error(f"the model's submodule {name!r} was {what} after the model was "
                        "compiled, and the compiled step runs the modules it was compiled "
                        "with: call destroy() to compile it again (to give the same modules "
                        "new weights, load them in place: model.load_state_dict(...))")

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
