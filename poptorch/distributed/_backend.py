"""The ``ipu`` process-group backend of ``torch.distributed``.

``torch.distributed`` calls every collective through a ``c10d::`` operator
dispatched on the device of its tensors; the CPU and CUDA keys have kernels
that call the group's backend for that device. The ipu's kernels (registered
here on the ``IPU`` key) make the collective a graph boundary: they run what is
pending, copy the ipu buffers to host tensors, call the same operator on those
(the group's CPU backend, gloo, carries them), wait for it and copy the written
buffers back. So ``init_process_group()`` with its default arguments (gloo for
the CPU), ``init_process_group("ipu")`` and ``"cpu:gloo,ipu:ipu"`` all work with
ipu tensors, and ``DistributedDataParallel`` reduces ipu gradients.

A collective reads its inputs when it is called (they are copied to the host
then); the host backend carries them on its own threads, and the ``Work`` it
returns completes once the results are written back, so ``async_op=True``
overlaps the exchange with the caller's work until ``wait()``.
"""
from __future__ import annotations

import datetime
import functools
from typing import Any, Callable, List, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo, _create_work_from_future

from .. import _C
from .._errors import Error
from . import BACKEND

# The c10d operators, and whether the collective writes its first argument
# (the outputs, or the tensors reduced or broadcast in place).
_OPERATORS = {
    "allreduce_": True, "allreduce_coalesced_": True, "broadcast_": True, "reduce_": True,
    "allgather_": True, "_allgather_base_": True, "allgather_coalesced_": True,
    "allgather_into_tensor_coalesced_": True, "reduce_scatter_": True,
    "_reduce_scatter_base_": True, "reduce_scatter_tensor_coalesced_": True,
    "alltoall_": True, "alltoall_base_": True, "gather_": True, "scatter_": True,
    "recv_": True, "recv_any_source_": True, "send": False, "barrier": False,
    "monitored_barrier_": False,
}

def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to each tensor (in lists and tuples too)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return value

def _is_work(value: Any) -> bool:
    return isinstance(value, torch.ScriptObject) and "Work" in str(value._type())

def _host_collective(name: str, writes_first: bool, *args: Any) -> Any:
    """The ipu kernel of ``c10d::<name>``: the collective on host copies.

    The inputs are copied to the host before it returns; the host backend
    then runs the collective on its own threads while the caller goes on, and
    the returned ``Work`` completes once the results are in the ipu tensors.
    ``async_op=False`` waits for it at once; ``async_op=True`` overlaps it
    with whatever the caller does before ``wait()``, as on CUDA (reading or
    writing the tensors before then is undefined there too)."""
    if _C.capturing_step():
        raise Error(f"torch.distributed.{name.strip('_')} on ipu tensors inside a "
                    "trainingModel/inferenceModel is not captured into the step: reduce "
                    "across processes with Options.Distributed (the step then reduces its "
                    "gradients over every replica of every process), or call the collective "
                    "outside the model")
    _C.synchronize()  # a graph boundary: what the collective reads has run
    staged: List[Tuple[torch.Tensor, torch.Tensor]] = []

    def to_host(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type != "ipu":
            return tensor
        host = tensor.detach().cpu()  # same strides: gloo checks layouts as on the CPU
        staged.append((tensor, host))
        return host

    host_args = [_map_tensors(a, to_host) for a in args]
    result = getattr(torch.ops.c10d, name).default(*host_args)
    work = result[-1] if isinstance(result, tuple) else result
    if not _is_work(work):
        return result
    # Where the results go, taken now: the callback runs on the backend's thread.
    written = {id(host) for host in _flat_tensors(host_args[0])} if writes_first else set()
    targets = []
    for tensor, host in staged:
        if id(host) in written:
            _C.back_storage(tensor)
            targets.append((_C.host_alias(tensor), host))
    device_of = {id(host): tensor for tensor, host in staged}
    value = (_map_tensors(result[0], lambda t: device_of.get(id(t), t))
             if isinstance(result, tuple) else args[0])

    def copy_back(done: torch.futures.Future) -> Any:
        done.value()  # raises the collective's error
        for alias, host in targets:
            alias.copy_(host)
        return value

    unboxed = dist.Work.unbox(work)
    try:
        future = unboxed.get_future()
    except RuntimeError:  # gloo's send and recv have no future: wait for them here
        unboxed.wait()
        future = torch.futures.Future()
        future.set_result(None)
    work_out = _create_work_from_future(future.then(copy_back)).boxed()
    return (value, work_out) if isinstance(result, tuple) else work_out

def _flat_tensors(value: Any) -> List[torch.Tensor]:
    found: List[torch.Tensor] = []
    _map_tensors(value, found.append)
    return found

def _create_backend(store: Any, rank: int, size: int,
                    timeout: datetime.timedelta) -> ProcessGroupGloo:
    """``init_process_group("ipu")``: gloo carries the host copies."""
    return ProcessGroupGloo(store, rank, size, timeout)

def _register() -> torch.library.Library:
    library = torch.library.Library("c10d", "IMPL")
    for name, writes_first in _OPERATORS.items():
        library.impl(name, functools.partial(_host_collective, name, writes_first), "IPU")
    # The backend carries host tensors too: the ipu kernels call the group's
    # CPU backend, so a group made with backend="ipu" must have one.
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu", "ipu"])
    return library

_LIBRARY = _register() if dist.is_available() else None
