"""The profile being recorded: the events drained from the C++ profiler (and
those Python adds: a wrapped model's capture, its per-micro-batch transfers),
the reports that want them, and when they are written.

The C++ profiler records only while a report is open, so without one the
runtime pays nothing beyond a flag read per program run. Reports are written
when their model is destroyed or detached, and at interpreter exit.
"""
from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional

from .. import _C
from .._logging import logger

# The order of profiling::Kind in csrc/profiling/profiler.h.
KINDS = ("node", "program", "compile", "to_ipu", "from_ipu", "user", "stage")
# Kinds Python records itself.
CAPTURE = "capture"

_MAX_EVENTS = 1_000_000  # as kMaxEvents in csrc/profiling/profiler.h


@dataclass
class Event:
    kind: str
    name: str
    ipu: int  # -1: the host
    start: int  # ns on the profiler's clock
    end: int
    session: int = 0  # the wrapped model's session, 0: none
    track: int = 0  # the lane of a call that ran micro-batches at once (0: the caller's)
    program: int = 0
    node: int = -1  # a node's position in its program; a stage's pipeline stage
    bytes: int = 0
    ipu_bytes: List[int] = field(default_factory=list)
    micro_batch: int = -1  # a pipeline stage's micro-batch of its call


@dataclass
class Report:
    """A report to write: the events of one session (None: all) in ``directory``."""
    directory: str
    title: str
    session: Optional[int]
    write: Callable[["Report", List[Event]], None]
    written: bool = False


_lock = threading.RLock()
_events: List[Event] = []
_dropped = 0
_open: List[Report] = []
_sessions = itertools.count(1)


def new_session() -> int:
    """An id for a wrapped model's events."""
    return next(_sessions)


@contextlib.contextmanager
def session(session_id: int) -> Iterator[None]:
    """This thread's events belong to ``session_id`` inside the block."""
    outer = _C.profiling_set_session(session_id)
    try:
        yield
    finally:
        _C.profiling_set_session(outer)


def now() -> int:
    return _C.profiling_now()


def recording() -> bool:
    return bool(_open)


def add(event: Event) -> None:
    """An event made in Python (only kept while recording)."""
    global _dropped
    with _lock:
        if not _open:
            return
        if len(_events) >= _MAX_EVENTS:
            _dropped += 1
            return
        _events.append(event)


def _drain() -> None:
    global _dropped
    for raw in _C.profiling_take():
        kind, name, ipu, start, end, sess, track, program, node, nbytes, ipu_bytes, micro = raw
        if len(_events) >= _MAX_EVENTS:
            _dropped += 1
            continue
        _events.append(Event(KINDS[kind], name, ipu, start, end, sess, track, program, node,
                             nbytes, list(ipu_bytes), micro))


def dropped() -> int:
    """Events not kept (past the limits of the C++ and Python stores)."""
    return _dropped + _C.profiling_dropped()


def open_report(report: Report) -> Report:
    with _lock:
        _open.append(report)
        _C.profiling_set_enabled(True)
    return report


def close_report(report: Report) -> None:
    """Writes ``report`` (once) and stops recording if it was the last one."""
    with _lock:
        if report.written or report not in _open:
            return
        _drain()
        events = [e for e in _events if report.session is None or e.session == report.session]
        report.written = True
        _open.remove(report)
        if not _open:
            _C.profiling_set_enabled(False)
            _drain()
            _events.clear()
    try:
        os.makedirs(report.directory, exist_ok=True)
        report.write(report, events)
        logger.info("wrote the profile '%s' in %s", report.title, report.directory)
    except OSError as error:
        logger.error("could not write the profile '%s' in %s: %s", report.title,
                     report.directory, error)


@atexit.register
def _close_all() -> None:
    for report in list(_open):
        close_report(report)
