"""``poptorch.DataLoader``: a ``torch.utils.data.DataLoader`` of combined batches.

A model call consumes ``batch_size x deviceIterations x (replicationFactor /
input group size) x gradientAccumulation`` samples, one *combined batch*.
:class:`DataLoader` takes every argument ``torch.utils.data.DataLoader``
takes and yields what that loader yields with ``batch_size`` set to the
combined batch size; in the asynchronous modes it loads ahead on a thread
(:mod:`poptorch._data_accessor`).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Iterator, Optional

import torch
import torch.utils.data

from ._combined_batches import CombinedBatchSampler, rebatched
from ._data_accessor import AsynchronousDataAccessor
from ._errors import Error
from ._logging import logger
from .distributed._sharding import ProcessShard
from .enums import DataLoaderMode
from .options import Options

__all__ = ["DataLoader"]


def micro_batches_per_call(options: Options) -> int:
    """Micro-batches in one combined batch (replicas in one input group share theirs)."""
    return (options.device_iterations * options.input_group_count
            * options.Training.gradient_accumulation)


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` whose batches are combined batches.

    ``batch_size`` is the micro-batch, the batch one operation of the model
    sees; each batch yielded holds :attr:`combinedBatchSize` samples, in the
    order the torch loader with that batch size yields them (``shuffle``,
    ``sampler``, ``generator``, ``collate_fn``, workers... are torch's).

    * ``drop_last`` (True by default, as in PopTorch): without it the last
      batch holds the samples left (a warning says how many); a model
      compiled for whole combined batches cannot take it.
    * ``batch_sampler`` yields micro-batches: each combined batch is the
      samples of that many consecutive ones (``drop_last`` drops a last group
      of fewer). ``combinedBatchSize`` is then None.
    * ``batch_size=None``: the dataset's items are combined batches already.
    * An ``IterableDataset`` read by several workers gives each worker's
      last batch short (``drop_last=False``) or drops it, as in torch and
      PopTorch; ``AsyncRebatched`` regroups them instead.
    * ``mode=DataLoaderMode.Async`` loads ahead on a thread
      (``async_options`` go to the :class:`~poptorch.AsynchronousDataAccessor`);
      ``AsyncRebatched`` also loads batches of ``rebatched_worker_size``
      samples and regroups them into combined batches, so that the workers
      of an ``IterableDataset`` drop nothing but the end of the epoch.
    * ``persistent_workers`` defaults to ``num_workers > 0``.
    * ``pin_memory`` and ``pin_memory_device`` are accepted and do nothing:
      the emulated IPU's memory is host memory.
    * ``auto_distributed_partitioning`` gives each process of
      ``options.Distributed`` its share of a map-style dataset: the shares are
      disjoint and cover it; with ``shuffle`` every process draws the same
      permutation per epoch (from ``options.randomSeed``, else 0) and takes its
      share of it (see :class:`~poptorch.distributed._sharding.ProcessShard`).
    """

    def __init__(self, options: Options, dataset: torch.utils.data.Dataset,
                 batch_size: Optional[int] = 1, shuffle: bool = False, num_workers: int = 0,
                 drop_last: bool = True, persistent_workers: Optional[bool] = None,
                 auto_distributed_partitioning: bool = True,
                 mode: DataLoaderMode = DataLoaderMode.Sync,
                 async_options: Optional[Dict[str, Any]] = None,
                 rebatched_worker_size: Optional[int] = None, **kwargs: Any) -> None:
        if not isinstance(options, Options):
            raise Error(f"DataLoader takes a poptorch.Options first, got {type(options).__name__}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, int) or batch_size < 1):
            raise Error(f"DataLoader batch_size must be a positive integer or None, "
                        f"got {batch_size!r}")
        if not isinstance(mode, DataLoaderMode):
            raise Error(f"DataLoader mode must be a poptorch.DataLoaderMode, got {mode!r}")
        self._options = options
        options._freeze()  # pylint: disable=protected-access
        self._user_batch_size = batch_size
        micro_batches = micro_batches_per_call(options)
        batch_sampler = kwargs.pop("batch_sampler", None)
        for ignored in ("pin_memory", "pin_memory_device"):
            if kwargs.pop(ignored, None):
                logger.debug("DataLoader: %s has no effect: the emulated IPU's memory is host "
                             "memory", ignored)
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or kwargs.get("sampler") is not None:
                raise Error("DataLoader: batch_sampler yields the micro-batches, so it cannot "
                            "be combined with batch_size, shuffle or sampler (as in torch)")
            batch_size = None
            batch_sampler = CombinedBatchSampler(batch_sampler, micro_batches, drop_last)
        self._combined_batch_size = None if batch_size is None else batch_size * micro_batches
        combined = self._combined_batch_size
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)

        distributed = options.Distributed
        if distributed.num_processes > 1 and auto_distributed_partitioning:
            if batch_sampler is not None or kwargs.get("sampler") is not None:
                raise Error("auto_distributed_partitioning cannot split a dataset read through "
                            "your sampler: pass auto_distributed_partitioning=False and a "
                            "sampler that yields only this process's samples")
            # Every process draws the same permutation per epoch: one seed for all.
            seed = options.random_seed if options.random_seed is not None else 0
            # Shares of whole combined batches: what drop_last would drop of
            # one process's share is not lost to the others.
            step = combined if combined is not None and drop_last else 1
            kwargs["sampler"] = ProcessShard(dataset, distributed.process_id,
                                             distributed.num_processes, shuffle, seed, step)
            shuffle = False
        if iterable and num_workers > 1 and kwargs.get("worker_init_fn") is None:
            logger.warning("DataLoader: an IterableDataset read by %d workers without a "
                           "worker_init_fn: unless the dataset splits itself by "
                           "torch.utils.data.get_worker_info(), each sample is loaded %d times",
                           num_workers, num_workers)

        # Rebatching: the torch loader keeps every sample and the batches it
        # gives are regrouped into combined batches (see the class doc).
        rebatch_size = None
        loader_batch = combined
        if mode == DataLoaderMode.AsyncRebatched:
            if combined is None:
                raise Error("DataLoaderMode.AsyncRebatched needs a batch_size: it builds "
                            "batches of batch_size x the micro-batches of one call")
            rebatch_size = combined
            if rebatched_worker_size is not None:
                if (isinstance(rebatched_worker_size, bool)
                        or not isinstance(rebatched_worker_size, int)
                        or not 1 <= rebatched_worker_size <= combined):
                    raise Error(f"rebatched_worker_size must be an integer from 1 to the "
                                f"combined batch size {combined}, got {rebatched_worker_size!r}")
                loader_batch = rebatched_worker_size
        self._rebatch_size = rebatch_size
        self.rebatched_drop_last = drop_last  # read by the AsynchronousDataAccessor

        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if batch_sampler is not None:
            kwargs["batch_sampler"] = batch_sampler
        else:
            # Without a batch size the items are the batches: nothing to drop.
            kwargs.update(batch_size=loader_batch, shuffle=shuffle,
                          drop_last=drop_last and rebatch_size is None and combined is not None)
        super().__init__(dataset, num_workers=num_workers, persistent_workers=persistent_workers,
                         **kwargs)
        self._check_size(drop_last)
        self._accessor: Optional[AsynchronousDataAccessor] = None
        if mode != DataLoaderMode.Sync:
            async_options = dict(async_options or {})
            if "rebatched_size" in async_options:
                raise Error("async_options cannot set rebatched_size: use "
                            "mode=DataLoaderMode.AsyncRebatched and rebatched_worker_size")
            self._accessor = AsynchronousDataAccessor(_SyncView(self), rebatched_size=rebatch_size,
                                                      **async_options)

    @property
    def combinedBatchSize(self) -> Optional[int]:
        """Samples per batch: batch_size x device iterations x replicas (per input
        group) x gradient accumulation; None with a batch_sampler or batch_size=None."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        """The options the loader was created with."""
        return self._options

    def _check_size(self, drop_last: bool) -> None:
        combined = self._combined_batch_size
        samples = _samples(self)
        if combined is None or samples is None or samples % combined == 0:
            return
        opts = self._options
        if samples < combined and drop_last:
            raise Error(
                f"the dataset has {samples} samples but one combined batch needs {combined} "
                f"(batch_size {self._user_batch_size} x deviceIterations "
                f"{opts.device_iterations} x replicationFactor {opts.replication_factor}"
                + (f" / input group size {opts.input_group_size}"
                   if opts.input_group_size > 1 else "")
                + f" x Training.gradientAccumulation {opts.Training.gradient_accumulation}): "
                f"use a larger dataset, reduce these, or pass drop_last=False")
        if not drop_last:
            logger.warning("DataLoader(drop_last=False): the dataset has %d samples, not a "
                           "multiple of the combined batch size %d: the last batch will hold "
                           "%d samples, and a model compiled for whole batches cannot take it; "
                           "pass drop_last=True to drop them", samples, combined,
                           samples % combined)

    def __len__(self) -> int:
        """The number of batches per epoch."""
        if self._rebatch_size is None:
            return super().__len__()
        samples = _samples(self)
        if samples is None:
            raise TypeError("this DataLoader's IterableDataset has no len()")
        whole, rest = divmod(samples, self._rebatch_size)
        return whole + (1 if rest and not self.rebatched_drop_last else 0)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._accessor is not None:
            return iter(self._accessor)
        return self._loaded_batches()

    def _loaded_batches(self) -> Iterator[Any]:
        """The batches, loaded in this thread (rebatched if need be)."""
        batches = torch.utils.data.DataLoader.__iter__(self)
        if self._rebatch_size is None:
            return batches
        return rebatched(batches, self._rebatch_size, self.rebatched_drop_last)

    def terminate(self) -> None:
        """Stops the background loading of the asynchronous modes (no-op in Sync mode)."""
        if self._accessor is not None:
            self._accessor.terminate()


class _SyncView:
    """What the accessor's thread loads: the loader's torch batches. It holds
    the loader weakly so that the thread does not keep the loader (and its
    accessor) alive."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = weakref.ref(loader)
        self.rebatched_drop_last = loader.rebatched_drop_last

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        return iter(()) if loader is None else torch.utils.data.DataLoader.__iter__(loader)


def _samples(loader: DataLoader) -> Optional[int]:
    """Samples in the loader's dataset (as sampled), None if unknown."""
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        try:
            return len(loader.dataset)  # type: ignore[arg-type]
        except TypeError:  # no __len__, or one that says it has none
            return None
    if loader.batch_sampler is not None and loader.batch_size is None:
        return None  # a user's batch_sampler: its batches decide
    return len(loader.sampler)  # type: ignore[arg-type]
