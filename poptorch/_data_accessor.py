"""``poptorch.AsynchronousDataAccessor``: batches loaded ahead of the consumer.

PopTorch loads in a worker process through shared memory; the emulator
loads on a thread of this process (a torch ``DataLoader`` with
``num_workers`` may still load in processes underneath it): batches reach the
consumer without copies, so every ``SharingStrategy`` behaves the same.
"""
from __future__ import annotations

import atexit
import copy
import queue
import threading
import traceback
import weakref
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.utils.data

from ._combined_batches import rebatched, samples_per_epoch
from ._errors import Error
from ._logging import logger
from .enums import SharingStrategy

__all__ = ["AsynchronousDataAccessor"]

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


class _Startup:
    """What the loading thread tells its accessor of the first batch: loaded
    (or the epoch was empty), or the exception that stopped it; and, unless
    ``early_preload``, the gate it waits at after the first batch."""

    def __init__(self, early_preload: bool) -> None:
        self.done = threading.Event()
        self.failure: Optional[BaseException] = None
        self.gate = threading.Event()
        if early_preload:
            self.gate.set()


def _load(source: Iterable[Any], rebatched_size: Optional[int], drop_last: bool,
          out: "queue.Queue[Any]", stop: threading.Event, load_indefinitely: bool,
          startup: _Startup) -> None:
    """The loading thread: epochs of batches, each followed by _EndOfEpoch.
    It holds no reference to its accessor, so the accessor can be collected."""
    try:
        while not stop.is_set():
            for batch in rebatched(source, rebatched_size, drop_last):
                if not _put(out, stop, batch):
                    return
                startup.done.set()
                while not startup.gate.wait(_POLL_SECONDS):
                    if stop.is_set():
                        return
            startup.done.set()
            if not _put(out, stop, _EndOfEpoch()) or not load_indefinitely:
                return
    except BaseException as exception:  # pylint: disable=broad-except
        if not startup.done.is_set():
            startup.failure = exception
            startup.done.set()
        _put(out, stop, _Failure(exception))


def _own_loader(source: Iterable[Any]) -> Iterable[Any]:
    """A torch DataLoader is loaded through a copy with iterators (and
    persistent workers) of its own, as PopTorch's worker process has its own
    copy: iterating the loader directly meanwhile would reset the iterator
    the loading thread is in (torch: "Invalid iterator state")."""
    if not isinstance(source, torch.utils.data.DataLoader):
        return source
    own = copy.copy(source)
    own._iterator = None  # pylint: disable=protected-access
    return own


class AsynchronousDataAccessor:
    """Loads the batches of ``dataset`` (any iterable, usually a
    DataLoader) ahead of the consumer on a background thread, up to
    ``buffer_size`` of them, and yields them in order.

    The first batch is loaded when the accessor is created (up to
    ``buffer_size`` with ``early_preload``), so a dataset that cannot load
    fails at once with a ``poptorch.Error``. Each ``iter()`` is one epoch;
    with ``load_indefinitely`` the thread goes on to preload the next epoch.
    An exception raised while loading later is re-raised in the consumer. ``rebatched_size`` regroups the loaded tensors into
    batches of that many samples; the samples short of a last whole batch are
    dropped unless the source has ``rebatched_drop_last = False`` (as a
    ``poptorch.DataLoader(drop_last=False)`` in ``AsyncRebatched`` mode has).
    Call :meth:`terminate` to stop loading (also done when the accessor is
    collected). Only one iterator at a time may be in use.

    ``miss_sleep_time_in_ms`` (PopTorch's polling period) is accepted and
    unused: the consumer wakes as soon as a batch is queued.
    """

    def __init__(self, dataset: Iterable[Any], buffer_size: int = 3,
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
        if getattr(dataset, "_accessor", None) is not None:
            raise Error("this poptorch.DataLoader loads asynchronously already (its mode is "
                        "Async or AsyncRebatched): iterate it directly, or create it with "
                        "mode=poptorch.DataLoaderMode.Sync to wrap it in an "
                        "AsynchronousDataAccessor")
        self._source = _own_loader(dataset)
        self._buffer_size = buffer_size
        del miss_sleep_time_in_ms  # _POLL_SECONDS only paces the liveness check of the thread
        self._load_indefinitely = load_indefinitely
        self._sharing_strategy = sharing_strategy
        self._rebatched_size = rebatched_size
        self._drop_last = bool(getattr(dataset, "rebatched_drop_last", True))
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=buffer_size)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._epoch_queued = False  # is the thread loading a whole epoch not yet started?
        # As PopTorch's, the accessor loads the first batch when it is created
        # (all buffer_size of them with early_preload): a dataset that cannot
        # load fails here.
        self._startup = self._start(early_preload)
        self._check_started()

    def _start(self, early_preload: bool = True) -> _Startup:
        self._queue = queue.Queue(maxsize=self._buffer_size)
        self._stop = threading.Event()
        startup = _Startup(early_preload)
        self._thread = threading.Thread(
            target=_load, name="poptorch-data-loader", daemon=True,
            args=(self._source, self._rebatched_size, self._drop_last, self._queue, self._stop,
                  self._load_indefinitely, startup))
        _RUNNING[self._thread] = self._stop
        self._thread.start()
        self._epoch_queued = True
        return startup

    def _check_started(self) -> None:
        startup = self._startup
        while not startup.done.wait(_POLL_SECONDS):
            if self._thread is None or not self._thread.is_alive():
                break
        if startup.failure is not None:
            self.terminate()
            failure = startup.failure
            logger.error("AsynchronousDataAccessor: loading the first batch raised:\n%s",
                         "".join(traceback.format_exception(failure)))
            raise Error(f"AsynchronousDataAccessor: the worker thread failed to start: loading "
                        f"the first batch raised {type(failure).__name__}: {failure}") from failure

    def __len__(self) -> int:
        """Batches per epoch (with ``rebatched_size``, of a torch DataLoader source)."""
        if self._rebatched_size is None:
            return len(self._source)  # type: ignore[arg-type]
        loader = self._source
        samples = (samples_per_epoch(loader) if isinstance(loader, torch.utils.data.DataLoader)
                   else None)
        if samples is None:
            raise TypeError("len() of a rebatching AsynchronousDataAccessor needs a "
                            "DataLoader with a batch_size and a sized dataset")
        whole, rest = divmod(samples, self._rebatched_size)
        return whole + (1 if rest and not self._drop_last else 0)

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_queued:  # none, or what is queued is from an abandoned epoch
            self.terminate()
            self._startup = self._start()
        self._startup.gate.set()  # loading goes on past the first batch
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
