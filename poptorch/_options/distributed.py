"""``opts.Distributed``: this process among several (PopDist's model)."""
from __future__ import annotations

import os

from .._errors import AssertionCompatibleError, Error
from .settings import _Settings, _Value
from .values import _int, _show, _str


class _DistributedOptions(_Settings):
    """``opts.Distributed``: this process among several, each with its own
    ``replicationFactor`` replicas (PopDist's model). The defaults come from
    the environment: OpenMPI's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``,
    else torchrun's ``RANK``/``WORLD_SIZE``."""

    _NAME = "Distributed"
    process_id = _Value(0, "The index of this process.")
    num_processes = _Value(1, "The number of processes.")
    timeout = _Value(1800.0, "Seconds a collective waits for the other processes.")

    def __init__(self) -> None:
        super().__init__()
        for size, rank in (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
                           ("WORLD_SIZE", "RANK")):
            if size in os.environ or rank in os.environ:
                self.setEnvVarNames(size, rank)
                break

    @property
    def distributed_process_id(self) -> int:
        """PopTorch's name of ``process_id``."""
        return self.process_id

    @property
    def num_distributed_processes(self) -> int:
        """PopTorch's name of ``num_processes``."""
        return self.num_processes

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        """This process's index among ``num_processes``: the DataLoader gives it
        its share of the dataset, and a trainingModel reduces its gradients with
        those of the replicas of every process."""
        num = _int("Distributed.configureProcessId", num_processes, 1, "the number of processes")
        pid = _int("Distributed.configureProcessId", process_id, 0, "the process id")
        if pid >= num:
            raise AssertionCompatibleError(f"Distributed.configureProcessId({pid}, {num}): the process id must be "
                        f"less than the number of processes ({num})")
        self._set("num_processes", num)
        return self._set("process_id", pid)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:
        """Reads the number of processes and this process's id from these
        environment variables (1 and 0 when they are not set)."""
        values = {}
        for var, default in ((var_num_processes, "1"), (var_process_id, "0")):
            text = os.environ.get(_str("Distributed.setEnvVarNames", var), default)
            try:
                values[var] = int(text)
            except ValueError:
                raise Error(f"the environment variable {var}={text!r} must be an "
                            "integer") from None
        return self.configureProcessId(values[var_process_id], values[var_num_processes])

    def disable(self) -> _DistributedOptions:
        """Runs as a single process, whatever the environment says."""
        return self.configureProcessId(0, 1)

    def setTimeout(self, seconds: float) -> _DistributedOptions:
        """How long a collective (the weight broadcast, each gradient reduction)
        waits for the other processes before failing with an error, when
        poptorch creates the process group (otherwise the group's own timeout
        applies). A process that dies is noticed sooner: its connections close."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise AssertionCompatibleError(f"Distributed.setTimeout takes a positive number of seconds, "
                        f"got {_show(seconds)}")
        return self._set("timeout", float(seconds))

    # Properties, as in PopTorch (``opts.Distributed.processId * per_process``).
    @property
    def processId(self) -> int:
        """The index of this process."""
        return self.process_id

    @property
    def numProcesses(self) -> int:
        """The number of processes."""
        return self.num_processes
