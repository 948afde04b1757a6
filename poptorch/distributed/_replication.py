"""PopDist-style replication: each process runs ``replicationFactor`` replicas
of a wrapped model, and the replicas of all processes train as one.

``Options.Distributed`` says which process this is among how many (set by
hand, by ``setEnvVarNames``, or from OpenMPI's or torchrun's environment). The
processes meet in the default ``torch.distributed`` process group: the one the
program made, or one made here from torchrun's rendezvous variables
(``MASTER_ADDR``, ``MASTER_PORT``). When the model is put on the device,
process 0's weights and buffers are broadcast to the others; in training, the
gradients each process accumulated over its micro-batches are summed across
processes before every weight update, which divides them by every replica of
every process for ``ReductionType.Mean``. The reductions run on host views of
the device buffers (the emulated IPU's memory is host memory), over the group's
CPU backend.
"""
from __future__ import annotations

import datetime
import os
from typing import Callable, Dict, Iterable, List

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import _C
from .._errors import Error
from .._logging import logger
from ..enums import CommGroupType
from ..options import Options


class ProcessReplicas:
    """This process's part in a model replicated across ``num_processes``."""

    def __init__(self, options: Options) -> None:
        distributed = options.Distributed
        self.process_id: int = distributed.process_id
        self.num_processes: int = distributed.num_processes
        self._timeout: float = distributed.timeout
        if options.input_group_size > 1 and options.input_group_type != CommGroupType.Consecutive:
            # Consecutive groups of a size dividing replicationFactor stay in one
            # process; orthogonal ones would take replicas of other processes.
            raise Error(f"inputReplicaGrouping({options.input_group_size}, "
                        f"CommGroupType.{options.input_group_type.name}) with {self.num_processes} "
                        "processes: its groups would span processes, whose replicas read their own "
                        "inputs; use CommGroupType.Consecutive")
        _join(self.process_id, self.num_processes, self._timeout)

    def broadcast_from_first(self, tensors: Iterable[torch.Tensor]) -> None:
        """Every process takes process 0's values of these ipu tensors."""
        self._on_host(list(tensors), lambda flat: dist.broadcast(flat, 0),
                      "broadcasting process 0's weights")

    def gradient_reduction(self, accumulators: Iterable[torch.Tensor]) -> Callable[[], None]:
        """What the runtime calls before each update: sums the accumulated
        gradients of all processes, in place."""
        tensors = list(accumulators)
        return lambda: self._on_host(
            tensors, dist.all_reduce,
            "summing the gradients of all processes")

    def any_of(self, flags: torch.Tensor) -> torch.Tensor:
        """Per element of ``flags`` (host bools, the same length in every
        process): whether it is set in some process."""
        counts = flags.to(torch.int32)
        _C.lend_to_collective([counts])  # gloo's threads may hold it past the collective
        try:
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        except RuntimeError as error:
            raise self._failed("agreeing on the parameters to update", error) from error
        return counts > 0

    def _on_host(self, tensors: List[torch.Tensor], collective: Callable[[torch.Tensor], object],
                 what: str) -> None:
        """Runs ``collective`` on one flat host tensor per dtype holding the
        values of ``tensors`` (ipu tensors), and writes the results back."""
        _C.synchronize()
        views = [_C.host_alias(t) for t in tensors]
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for view in views:
            by_dtype.setdefault(view.dtype, []).append(view)
        for group in by_dtype.values():
            flat = _flatten_dense_tensors(group)
            _C.lend_to_collective([flat])  # gloo's threads may hold it past the collective
            try:
                collective(flat)
            except RuntimeError as error:
                raise self._failed(what, error) from error
            for view, value in zip(group, _unflatten_dense_tensors(flat, group)):
                view.copy_(value)

    def _failed(self, what: str, error: RuntimeError) -> Error:
        return Error(
            f"process {self.process_id} of {self.num_processes}: {what} failed: {error}. "
            "Another process has probably stopped (look at its error) or did not reach "
            "the same step within the timeout (Options.Distributed.setTimeout, "
            f"{self._timeout:g} s when poptorch creates the process group)")


def _join(process_id: int, num_processes: int, timeout: float) -> None:
    """Makes the default process group from the environment if there is none;
    checks that it is the one ``Options.Distributed`` describes."""
    if not dist.is_available():
        raise Error("Options.Distributed describes several processes, but this PyTorch has "
                    "no torch.distributed")
    if not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise Error(
                f"process {process_id} of {num_processes}: the processes cannot meet: "
                f"{' and '.join(missing)} not set. Launch with torchrun (which sets them), "
                "set them to the address and a free port of process 0's host, or call "
                "torch.distributed.init_process_group() before wrapping the model")
        logger.info("process %d of %d: joining the others at %s:%s", process_id, num_processes,
                    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        wait = datetime.timedelta(seconds=timeout)
        store, _, _ = next(dist.rendezvous("env://", process_id, num_processes, timeout=wait))
        # torchrun keeps one store across restarts (--max-restarts): without a
        # prefix per attempt, gloo could read the addresses of the processes of
        # the attempt that failed, and refuse to connect.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group("gloo", store=dist.PrefixStore(f"poptorch/attempt_{attempt}",
                                                               store),
                                rank=process_id, world_size=num_processes, timeout=wait)
    rank, size = dist.get_rank(), dist.get_world_size()
    if (rank, size) != (process_id, num_processes):
        raise Error(f"Options.Distributed says process {process_id} of {num_processes}, but "
                    f"the torch.distributed process group has this process as rank {rank} of "
                    f"{size}: configure both alike (or use Options.Distributed's defaults, "
                    "which read torchrun's RANK and WORLD_SIZE)")
