"""``torch.ipu.Stream`` and ``torch.ipu.Event``, shaped like CUDA's.

They are PyTorch's generic ``torch.Stream`` and ``torch.Event`` of the ipu, whose
work the ipu's device guard does (csrc/device/guard.cpp), so ``torch.Stream("ipu")``
and ``torch.Event("ipu")`` behave the same. The emulated IPUs have one queue:
captured ops run in order when a value is needed (or at a synchronize), so every
stream of an IPU names that queue and nothing runs concurrently to wait for.
Recording an event runs the work queued before it and notes the host time, so
``elapsed_time`` measures that work.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from . import _C
from ._device_index import DeviceLike as _DeviceLike, index_of

# c10::DeviceType::IPU, which torch.Stream takes as a number.
_IPU_DEVICE_TYPE: int = _C.IPU_DEVICE_TYPE


class Stream(torch.Stream):
    """The queue of an IPU. Every stream of an IPU is its one queue: ops run in
    the order they were captured, whichever stream is current, so ``wait_stream``
    and ``wait_event`` have nothing to wait for. A ``torch.Stream`` (as CUDA's
    streams are), so ``tensor.record_stream(s)`` takes it: that does nothing, since
    a pending graph holds the tensors it reads."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0) -> "Stream":
        return super().__new__(cls, stream_id=0, device_index=index_of(device),
                               device_type=_IPU_DEVICE_TYPE)

    def __init__(self, device: _DeviceLike = None, priority: int = 0) -> None:
        self.priority = priority  # accepted; one queue has no priorities

    def wait_event(self, event: torch.Event) -> None:
        """Does nothing: all work is in one queue, already in order."""
        _check(event, torch.Event, "wait_event")
        super().wait_event(event)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Does nothing: all work is in one queue, already in order."""
        _check(stream, torch.Stream, "wait_stream")
        super().wait_stream(stream)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)

    def __repr__(self) -> str:
        return f"torch.ipu.Stream(device={self.device})"


class _EventType(type):
    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, torch.Event) and instance.device.type == "ipu"


class Event(metaclass=_EventType):
    """A point in the IPU's queue: ``torch.ipu.Event(...)`` is ``torch.Event("ipu",
    ...)`` (PyTorch's methods take no subclass of it). ``record`` runs the work queued
    before it and notes the host time, so two events created with
    ``enable_timing=True`` time that work (``elapsed_time``); ``blocking`` and
    ``interprocess`` are accepted."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False) -> torch.Event:  # type: ignore[misc]
        return torch.Event(torch.device("ipu"), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def _check(value: object, kind: type, method: str) -> None:
    # torch.Stream's methods read any object as a stream or an event.
    if not isinstance(value, kind):
        raise TypeError(f"{method}() takes a {kind.__module__}.{kind.__name__}, got "
                        f"{type(value).__name__}")


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
