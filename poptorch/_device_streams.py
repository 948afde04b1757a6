"""``torch.ipu.Stream`` and ``torch.ipu.Event``, shaped like CUDA's.

The emulated IPUs have one queue: captured ops run in order when a value is
needed (or at ``synchronize()``), so there is one stream per IPU and nothing
runs concurrently to wait for. An event records the host time once the work
queued before it has run, so ``elapsed_time`` measures that work.
"""
from __future__ import annotations

import contextlib
import time
from typing import Optional

import torch

from . import _C

from ._device_index import DeviceLike as _DeviceLike, index_of

# c10::DeviceType::IPU, which torch.Stream takes as a number.
_IPU_DEVICE_TYPE: int = _C.IPU_DEVICE_TYPE


class Stream(torch.Stream):
    """The queue of an IPU. Every stream of an IPU is its one queue: ops run in
    the order they were captured, whichever stream is current. A ``torch.Stream``
    (as CUDA's streams are), so ``tensor.record_stream(s)`` takes it: that does
    nothing, since a pending graph holds the tensors it reads."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0) -> "Stream":
        return super().__new__(cls, stream_id=0, device_index=index_of(device),
                               device_type=_IPU_DEVICE_TYPE)

    def __init__(self, device: _DeviceLike = None, priority: int = 0) -> None:
        self.priority = priority  # accepted; one queue has no priorities

    def synchronize(self) -> None:
        """Runs every pending ipu operation."""
        _C.synchronize()

    def query(self) -> bool:
        """True when no captured op waits to run."""
        return _C.pending_nodes() == 0

    def wait_stream(self, stream: "Stream") -> None:
        """Does nothing: all work is in one queue, already in order."""

    def wait_event(self, event: "Event") -> None:
        """Does nothing: all work is in one queue, already in order."""

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        """Records ``event`` (a new one if None) on this stream and returns it."""
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)

    def __repr__(self) -> str:
        return f"torch.ipu.Stream(device={self.device})"


class Event:
    """A point in the IPU's queue. ``record`` runs the work queued before it and
    notes the host time, so two events time that work (``elapsed_time``);
    ``enable_timing``, ``blocking`` and ``interprocess`` are accepted."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._recorded_at: Optional[float] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        _C.synchronize()
        self._recorded_at = time.perf_counter()

    def query(self) -> bool:
        """True once recorded: the work before it has run."""
        return self._recorded_at is not None

    def synchronize(self) -> None:
        """Does nothing more: the work before the event ran when it was recorded."""

    def wait(self, stream: Optional[Stream] = None) -> None:
        """Does nothing: all work is in one queue, already in order."""

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event``."""
        if not isinstance(end_event, Event):
            raise TypeError(f"elapsed_time() takes a torch.ipu.Event, got "
                            f"{type(end_event).__name__}")
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("both events must be recorded before elapsed_time(): call "
                               "record() on each")
        return (end_event._recorded_at - self._recorded_at) * 1000.0


def current_stream(device: _DeviceLike = None) -> Stream:
    """The IPU's one stream."""
    return Stream(device)


def default_stream(device: _DeviceLike = None) -> Stream:
    """The IPU's one stream."""
    return Stream(device)


def set_stream(stream: Stream) -> None:
    """Does nothing: every stream of an IPU is its one queue."""


class StreamContext(contextlib.AbstractContextManager):
    """``with torch.ipu.stream(s):`` runs the block's ops on the IPU's one queue."""

    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream = stream

    def __exit__(self, *exc_info: object) -> None:
        return None


def stream(stream: Optional[Stream]) -> StreamContext:
    """A context manager for ``stream`` (see :class:`StreamContext`)."""
    return StreamContext(stream)
