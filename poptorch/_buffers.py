"""PyTorch buffers in a wrapped model (the user guide's "PyTorch buffers").

Buffers keep their values from one run to the next when the model changes
them in place (``self.count += 1``, ``self.buf.copy_(...)``): the step writes
the device tensor the host buffer aliases. Replacing the buffer object inside
``forward`` (``self.count = self.count + 1``) would change nothing on the
device, so it is an error, as in PopTorch. With replicas, PopTorch cannot
broadcast buffers the step changes: ``Options.broadcastBuffers(False)`` gives
each replica buffers of its own (``_C.ReplicaBuffers``).
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional, Set

import torch

from . import _C
from ._errors import Error

_BROADCAST_ERROR = ("PopTorch does not support broadcasting buffers. If your model is able to "
                    "tolerate buffers becoming out of sync between replicas, you can disable "
                    "buffer broadcasting using poptorch.Options.broadcastBuffers(False).")

_MISSING = object()


def _check_kept(model: torch.nn.Module, expected: Dict[str, torch.Tensor],
                buffers: Set[str]) -> None:
    for kind in ("Buffer", "Parameter"):
        for name, tensor in expected.items():
            if (name in buffers) != (kind == "Buffer"):
                continue
            prefix, _, leaf = name.rpartition(".")
            owner = functools.reduce(getattr, prefix.split("."), model) if prefix else model
            value = getattr(owner, leaf, _MISSING)
            if value is _MISSING or value is None:
                raise Error(f"{kind} {name} is removed from the model when calling the "
                            "forward method.")
            if value is not tensor:
                raise Error(f"{kind} {name} is reassigned within the model when calling the "
                            "forward method. This is not supported. Consider using "
                            f"self.{name}.copy_(src) to copy data from a source tensor, where "
                            "src is the name of the source tensor.")


def kept_check(model: torch.nn.Module, tensors: Dict[str, torch.Tensor]) -> Callable[[], None]:
    """The check that, at the end of ``forward``, the model still holds the device
    tensors it was called with (``tensors``, by name)."""
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    return functools.partial(_check_kept, model, tensors, buffers)


def replica_buffers(model: torch.nn.Module, tensors: Dict[str, torch.Tensor], step: "_C.StepVariants",
                    replicas: int, broadcast: bool) -> Optional["_C.ReplicaBuffers"]:
    """Each replica's own copies of the buffers ``step`` changes in place, or
    None when there are no such buffers or a single replica."""
    if replicas == 1:
        return None
    written: List[torch.Tensor] = []
    for name, _ in model.named_buffers():
        device = tensors[name]
        if step.writes(device) and all(device is not w for w in written):
            written.append(device)
    if not written:
        return None
    if broadcast:
        raise Error(_BROADCAST_ERROR)
    return _C.ReplicaBuffers(written, replicas)
