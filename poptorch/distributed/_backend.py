"""The ``ipu`` process-group backend of ``torch.distributed``.

``torch.distributed`` calls every collective through a ``c10d::`` operator
dispatched on the device of its tensors; the CPU and CUDA keys have kernels
that call the group's backend for that device. The ipu's kernels (registered
here on the ``IPU`` key) make the collective a graph boundary: they run what is
pending, then call the same operator on host views of the ipu tensors' memory
(the emulated IPU keeps its memory on the host), which the group's CPU backend,
gloo, reads and writes. So ``init_process_group()`` with its default arguments
(gloo for the CPU), ``init_process_group("ipu")`` and ``"cpu:gloo,ipu:ipu"``
all work with ipu tensors, and ``DistributedDataParallel`` reduces ipu
gradients.

gloo runs the collective on its own threads and its ``Work`` is returned as it
is: ``async_op=True`` overlaps the exchange with the caller's work until
``wait()``, ``is_completed()`` is gloo's, and so are errors and timeouts.
"""
from __future__ import annotations

import datetime
import functools
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from .. import _C
from .._errors import Error
from . import BACKEND

# The c10d operators that take ipu tensors.
_OPERATORS = (
    "allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_", "allgather_",
    "_allgather_base_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
    "reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "alltoall_",
    "alltoall_base_", "gather_", "scatter_", "recv_", "recv_any_source_", "send", "barrier",
    "monitored_barrier_",
)

def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to each tensor (in lists and tuples too)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value

def _host_collective(name: str, *args: Any) -> Any:
    """The ipu kernel of ``c10d::<name>``: the collective on host views of the
    ipu tensors' memory (the emulated IPU's memory is host memory).

    The host backend reads and writes that memory on its own threads and its
    ``Work`` is returned as it is: ``async_op=False`` waits for it at once,
    ``async_op=True`` overlaps the exchange with whatever the caller does
    before ``wait()``, as on CUDA (using the tensors before then is undefined
    there too); errors and timeouts are the backend's."""
    if _C.capturing_step():
        raise Error(f"torch.distributed.{name.strip('_')} on ipu tensors inside a "
                    "trainingModel/inferenceModel is not captured into the step: reduce "
                    "across processes with Options.Distributed (the step then reduces its "
                    "gradients over every replica of every process), or call the collective "
                    "outside the model")
    _C.synchronize()  # a graph boundary: what the collective reads has run
    device_of: Dict[int, torch.Tensor] = {}
    hosts: List[torch.Tensor] = []

    def host_view(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "ipu":
            return tensor
        _C.back_storage(tensor)  # an output never written has no memory yet
        host = _C.host_alias(tensor)  # same strides: gloo checks layouts as on the CPU
        device_of[id(host)] = tensor
        hosts.append(host)
        return host

    host_args = [_map_tensors(a, host_view) for a in args]
    _C.lend_to_collective(hosts)  # gloo's threads may hold them past the collective
    result = getattr(torch.ops.c10d, name).default(*host_args)
    if isinstance(result, tuple):  # (outputs, work): the outputs are the ipu tensors
        return _map_tensors(result[0], lambda t: device_of.get(id(t), t)), result[1]
    return result

def _create_backend(store: Any, rank: int, size: int,
                    timeout: datetime.timedelta) -> ProcessGroupGloo:
    """``init_process_group("ipu")``: gloo carries the ipu tensors' host views."""
    return ProcessGroupGloo(store, rank, size, timeout)

def _register() -> torch.library.Library:
    library = torch.library.Library("c10d", "IMPL")
    for name in _OPERATORS:
        library.impl(name, functools.partial(_host_collective, name), "IPU")
    # The backend carries host tensors too: the ipu kernels call the group's
    # CPU backend, so a group made with backend="ipu" must have one.
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu", "ipu"])
    return library

_LIBRARY = _register() if dist.is_available() else None
