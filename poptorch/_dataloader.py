"""``poptorch.DataLoader`` and ``poptorch.AsynchronousDataAccessor``.

A PopTorch model consumes, per call, ``batch_size * deviceIterations *
replicationFactor * gradientAccumulation`` samples (the combined batch size).
:class:`DataLoader` is a ``torch.utils.data.DataLoader`` that yields host
batches of exactly that size, partitions the dataset between processes and,
in the asynchronous modes, loads batches ahead on a background thread with an
:class:`AsynchronousDataAccessor`.

The accessor uses a thread, not worker processes (a torch ``DataLoader`` with
``num_workers`` may still load in processes underneath it): batches reach the
consumer without copies, so every ``SharingStrategy`` behaves the same.
"""
from __future__ import annotations

import atexit
import enum
import queue
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

import torch
import torch.utils.data
from torch.utils import _pytree as pytree

from ._errors import Error
from ._logging import logger
from .options import Options

__all__ = ["AsynchronousDataAccessor", "DataLoader", "DataLoaderMode", "SharingStrategy"]


class DataLoaderMode(enum.IntEnum):
    """How :class:`DataLoader` loads batches."""
    Sync = 0  #: on demand, in the consumer's thread
    Async = 1  #: ahead of the consumer, through an AsynchronousDataAccessor
    AsyncRebatched = 2  #: as Async, loading ``rebatched_worker_size`` samples at a time


class SharingStrategy(enum.IntEnum):
    """How PopTorch's worker processes share batches; all alike for the thread used here."""
    SharedMemory = 0
    FileSystem = 1
    ForkServer = 2
    Thread = 3


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` whose batches hold one combined batch.

    ``batch_size`` is the size of one micro-batch as seen by the model; each
    yielded batch holds :attr:`combinedBatchSize` samples. Only whole combined
    batches are yielded. Extra keyword arguments (``generator``,
    ``collate_fn``, ``worker_init_fn``...) go to ``torch.utils.data.DataLoader``.
    """

    def __init__(self, options: Options, dataset: torch.utils.data.Dataset,
                 batch_size: int = 1, shuffle: bool = False, num_workers: int = 0,
                 drop_last: bool = True, persistent_workers: Optional[bool] = None,
                 auto_distributed_partitioning: bool = True,
                 mode: DataLoaderMode = DataLoaderMode.Sync,
                 async_options: Optional[Dict[str, Any]] = None,
                 rebatched_worker_size: Optional[int] = None, **kwargs: Any) -> None:
        if not isinstance(options, Options):
            raise Error(f"DataLoader takes a poptorch.Options first, got {type(options).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise Error(f"DataLoader batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(mode, DataLoaderMode):
            raise Error(f"DataLoader mode must be a poptorch.DataLoaderMode, got {mode!r}")
        self._options = options
        self._user_batch_size = batch_size
        self._combined_batch_size = (batch_size * options.device_iterations
                                     * options.replication_factor
                                     * options.Training.gradient_accumulation)
        worker_batch = combined = self._combined_batch_size
        if mode == DataLoaderMode.AsyncRebatched and rebatched_worker_size is not None:
            worker_batch = rebatched_worker_size
            if (isinstance(worker_batch, bool) or not isinstance(worker_batch, int)
                    or not 1 <= worker_batch <= combined):
                raise Error(f"rebatched_worker_size must be an integer from 1 to the combined "
                            f"batch size {combined}, got {worker_batch!r}")
        self._rebatching = worker_batch != combined

        distributed = options.Distributed
        if distributed.num_processes > 1 and auto_distributed_partitioning:
            dataset = _partition(dataset, distributed.process_id, distributed.num_processes)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        # The rebatcher drops the incomplete combined batch at the end, so the
        # workers must deliver every sample (or the count could fall short).
        super().__init__(dataset, batch_size=worker_batch, shuffle=shuffle,
                         num_workers=num_workers, drop_last=not self._rebatching,
                         persistent_workers=persistent_workers, **kwargs)
        self._check_size(drop_last)
        self._accessor: Optional[AsynchronousDataAccessor] = None
        if mode != DataLoaderMode.Sync:
            self._accessor = AsynchronousDataAccessor(
                _SyncView(self), rebatched_size=combined if self._rebatching else None,
                **(async_options or {}))

    @property
    def combinedBatchSize(self) -> int:
        """Samples per yielded batch: batch_size x device iterations x replicas x accumulation."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        return self._options

    def _check_size(self, drop_last: bool) -> None:
        samples, combined = _samples(self), self._combined_batch_size
        if samples is not None and samples < combined:
            opts = self._options
            raise Error(
                f"the dataset has {samples} samples but one combined batch needs {combined} "
                f"(batch_size {self._user_batch_size} x deviceIterations "
                f"{opts.device_iterations} x replicationFactor "
                f"{opts.replication_factor} x Training.gradientAccumulation "
                f"{opts.Training.gradient_accumulation}): use a larger dataset or reduce these")
        if drop_last or (samples is not None and samples % combined == 0):
            return
        left = ("the last incomplete batch" if samples is None
                else f"the last {samples % combined} samples")
        logger.warning("DataLoader(drop_last=False): %s will be dropped: the model takes whole "
                       "combined batches of %d samples", left, combined)

    def __len__(self) -> int:
        """The number of combined batches per epoch."""
        samples = _samples(self)
        if samples is None:
            raise TypeError("this DataLoader's IterableDataset has no len()")
        return samples // self._combined_batch_size

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._accessor is None:
            return super().__iter__()
        return iter(self._accessor)

    def terminate(self) -> None:
        """Stops the background loading of the asynchronous modes (no-op in Sync mode)."""
        if self._accessor is not None:
            self._accessor.terminate()


class _SyncView:
    """Iterates a DataLoader synchronously, holding it weakly so that the
    loading thread does not keep the loader (and its accessor) alive."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        return iter(()) if loader is None else torch.utils.data.DataLoader.__iter__(loader)

    def __len__(self) -> int:
        loader = self._loader()
        return 0 if loader is None else len(loader)


def _samples(loader: torch.utils.data.DataLoader) -> Optional[int]:
    """Samples per epoch of the dataset of `loader` (None if unknown)."""
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
    return len(loader.sampler)  # type: ignore[arg-type]


def _partition(dataset: torch.utils.data.Dataset, process_id: int,
               num_processes: int) -> torch.utils.data.Dataset:
    """This process's contiguous share of a map-style dataset; all shares are equal."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise Error("auto_distributed_partitioning cannot split an IterableDataset: pass "
                    "auto_distributed_partitioning=False and yield only this process's samples "
                    "(options.Distributed.process_id of options.Distributed.num_processes)")
    total = len(dataset)  # type: ignore[arg-type]
    share = total // num_processes
    if total % num_processes:
        logger.info("DataLoader: %d samples at the end of the dataset are unused so that each "
                    "of the %d processes gets %d", total % num_processes, num_processes, share)
    start = process_id * share
    return torch.utils.data.Subset(dataset, range(start, start + share))


# --- background loading -----------------------------------------------------

_POLL_SECONDS = 0.05

# Loading threads still running -> their stop events. They are stopped at
# exit: a daemon thread frozen inside a torch kernel at shutdown aborts Python.
_RUNNING: "weakref.WeakKeyDictionary[threading.Thread, threading.Event]" = \
    weakref.WeakKeyDictionary()


@atexit.register
def _stop_all_loading() -> None:
    for thread, stop in list(_RUNNING.items()):
        stop.set()
        thread.join(1.0)


class _EndOfEpoch:
    pass


class _Failure:
    def __init__(self, exception: BaseException) -> None:
        self.exception = exception


def _put(out: "queue.Queue[Any]", stop: threading.Event, item: Any) -> bool:
    """Puts `item`, waiting for room; False if asked to stop meanwhile."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            pass
    return False


def _load(source: Iterable[Any], rebatched_size: Optional[int], out: "queue.Queue[Any]",
          stop: threading.Event, load_indefinitely: bool) -> None:
    """The loading thread: epochs of batches, each followed by _EndOfEpoch.
    It holds no reference to its accessor, so the accessor can be collected."""
    try:
        while not stop.is_set():
            for batch in _rebatched(source, rebatched_size):
                if not _put(out, stop, batch):
                    return
            if not _put(out, stop, _EndOfEpoch()) or not load_indefinitely:
                return
    except BaseException as exception:  # pylint: disable=broad-except
        _put(out, stop, _Failure(exception))


class AsynchronousDataAccessor:
    """Loads the batches of ``dataset_or_loader`` (any iterable, usually a
    DataLoader) ahead of the consumer on a background thread, up to
    ``buffer_size`` of them, and yields them in order.

    Each ``iter()`` is one epoch; with ``load_indefinitely`` the thread goes on
    to preload the next epoch. An exception raised while loading is re-raised
    in the consumer. ``rebatched_size`` regroups the loaded tensors into
    batches of that many samples (dropping an incomplete last one). Call
    :meth:`terminate` to stop loading (also done when the accessor is collected).
    Only one iterator at a time may be in use.
    """

    def __init__(self, dataset_or_loader: Iterable[Any], buffer_size: int = 3,
                 miss_sleep_time_in_ms: float = 0.1, load_indefinitely: bool = True,
                 early_preload: bool = False,
                 sharing_strategy: SharingStrategy = SharingStrategy.FileSystem,
                 rebatched_size: Optional[int] = None) -> None:
        for name, value in (("buffer_size", buffer_size), ("rebatched_size", rebatched_size or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise Error(f"AsynchronousDataAccessor {name} must be a positive integer, "
                            f"got {value!r}")
        if not isinstance(sharing_strategy, SharingStrategy):
            raise Error(f"sharing_strategy must be a poptorch.SharingStrategy, "
                        f"got {sharing_strategy!r}")
        self._source = dataset_or_loader
        self._buffer_size = buffer_size
        # The consumer wakes as soon as a batch is queued, so miss_sleep_time_in_ms
        # (PopTorch's polling period) is accepted but unused; _POLL_SECONDS
        # only paces the check that the loading thread is still alive.
        del miss_sleep_time_in_ms
        self._load_indefinitely = load_indefinitely
        self._sharing_strategy = sharing_strategy
        self._rebatched_size = rebatched_size
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=buffer_size)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._epoch_queued = False  # is the thread loading a whole epoch not yet started?
        if early_preload:
            self._start()

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self._buffer_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_load, name="poptorch-data-loader", daemon=True,
            args=(self._source, self._rebatched_size, self._queue, self._stop,
                  self._load_indefinitely))
        _RUNNING[self._thread] = self._stop
        self._thread.start()
        self._epoch_queued = True

    def __len__(self) -> int:
        """Batches per epoch (with ``rebatched_size``, of a torch DataLoader source)."""
        if self._rebatched_size is None:
            return len(self._source)  # type: ignore[arg-type]
        loader = self._source
        samples = _samples(loader) if isinstance(loader, torch.utils.data.DataLoader) else None
        if samples is None or loader.batch_size is None:
            raise TypeError("len() of a rebatching AsynchronousDataAccessor needs a "
                            "DataLoader with a batch_size and a sized dataset")
        if loader.drop_last:
            samples -= samples % loader.batch_size
        return samples // self._rebatched_size

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_queued:  # none, or what is queued is from an abandoned epoch
            self.terminate()
            self._start()
        self._epoch_queued = False
        assert self._thread is not None
        return self._epoch(self._queue, self._stop, self._thread)

    def _epoch(self, batches: "queue.Queue[Any]", stop: threading.Event,
               thread: threading.Thread) -> Iterator[Any]:
        while not stop.is_set():  # else terminated: the epoch just ends
            try:
                item = batches.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not thread.is_alive() and batches.empty() and not stop.is_set():
                    raise Error("the data loading thread stopped unexpectedly") from None
                continue
            if isinstance(item, _EndOfEpoch):
                self._epoch_queued = self._load_indefinitely  # the thread goes on, or ends
                return
            if isinstance(item, _Failure):
                raise item.exception
            yield item

    def terminate(self, timeout: float = 10.0) -> None:
        """Stops the loading thread and drops what it had loaded."""
        self._stop.set()
        thread, self._thread = self._thread, None
        self._epoch_queued = False
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("AsynchronousDataAccessor: the loading thread is still busy "
                               "with a batch after %.0f s; it will stop after it", timeout)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()  # no join: collection must not wait for a slow batch


# --- rebatching -------------------------------------------------------------

def _zip_structure(fn: Callable[[List[torch.Tensor]], torch.Tensor], batches: List[Any]) -> Any:
    """Applies `fn` to the lists of matching tensors of batches of the same structure."""
    flat = [pytree.tree_flatten(batch) for batch in batches]
    columns = list(zip(*(leaves for leaves, _ in flat)))
    for column in columns:
        if not isinstance(column[0], torch.Tensor):
            raise Error(f"cannot rebatch a batch holding a {type(column[0]).__name__}: batches "
                        "must be tensors, or tuples, lists or dicts of tensors")
    return pytree.tree_unflatten([fn(list(column)) for column in columns], flat[0][1])


def _rebatched(batches: Iterable[Any], size: Optional[int]) -> Iterator[Any]:
    """`batches` regrouped into batches of `size` samples (as is if size is None)."""
    if size is None:
        yield from batches
        return
    pending: List[Any] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += len(pytree.tree_leaves(batch)[0])
        while count >= size:
            whole = _zip_structure(torch.cat, pending) if len(pending) > 1 else pending[0]
            yield _zip_structure(lambda ts: ts[0][:size], [whole])
            count -= size
            pending = [_zip_structure(lambda ts: ts[0][size:], [whole])] if count else []
    if count:
        logger.debug("AsynchronousDataAccessor: dropped %d samples short of a batch of %d",
                     count, size)
