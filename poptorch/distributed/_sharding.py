"""Each process's share of a dataset (``poptorch.DataLoader`` with
``Options.Distributed`` describing several processes)."""
from __future__ import annotations

from typing import Iterator

import torch
import torch.utils.data

from .._errors import Error
from .._logging import logger


class ProcessShard(torch.utils.data.Sampler[int]):
    """The indices of this process's share of a map-style dataset, one epoch
    per iteration: the whole dataset's indices, in order or (``shuffle``) in a
    permutation drawn from ``seed`` and the epoch — the same in every process —
    are cut into ``num_processes`` equal contiguous shares of a multiple of
    ``step`` indices (the combined batch, so that no process drops samples
    another would have used, as in PopTorch). The shares of one epoch are
    disjoint and cover the dataset but for fewer than ``step x num_processes``
    last indices, which go unused."""

    def __init__(self, dataset: torch.utils.data.Dataset, process_id: int,
                 num_processes: int, shuffle: bool, seed: int, step: int = 1) -> None:
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise Error("auto_distributed_partitioning cannot split an IterableDataset: pass "
                        "auto_distributed_partitioning=False and yield only this process's "
                        "samples (options.Distributed.processId of numProcesses)")
        super().__init__()
        self._size = len(dataset)  # type: ignore[arg-type]
        self._share = step * (self._size // (step * num_processes))
        self._start = process_id * self._share
        self._shuffle = shuffle
        self._seed = seed
        self.epoch = 0  # the next epoch
        unused = self._size - self._share * num_processes
        if unused:
            logger.info("DataLoader: %d samples of each epoch are unused so that each of the %d "
                        "processes gets %d", unused, num_processes, self._share)

    def __len__(self) -> int:
        return self._share

    def __iter__(self) -> Iterator[int]:
        if self._shuffle:
            order = torch.randperm(self._size,
                                   generator=torch.Generator().manual_seed(self._seed + self.epoch))
        else:
            order = torch.arange(self._size)
        self.epoch += 1
        return iter(order[self._start:self._start + self._share].tolist())
