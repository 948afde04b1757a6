"""Writing reports: a profile (``trace.json``, ``memory.json``,
``summary.json`` and ``report.html``) or a system trace (PVTI's:
``poptorch_<pid>.pvti.json``, without per-node detail)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from .. import _C
from . import recorder
from .analysis import chrome_trace, program_memory, summarise
from .html_report import render
from .recorder import Event, Report


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def _capacities() -> List[int]:
    return [_C.memory_capacity(i) for i in range(_C.device_count())]


def write_profile(report: Report, events: List[Event]) -> None:
    memory = program_memory(events, _C.profiling_programs())
    capacity = _capacities()
    summary = summarise(events, memory, recorder.dropped())
    _write_json(os.path.join(report.directory, "trace.json"),
                chrome_trace(events, memory, len(capacity)))
    _write_json(os.path.join(report.directory, "memory.json"), {
        "capacity": capacity,
        "programs": {f"{key:016x}": {"nodes": info.node_names, "runs": info.runs,
                                     "baseline_bytes": info.baseline,
                                     "temporary_bytes": info.temporary_bytes,
                                     "peak_temporary_bytes": info.peak_temporary_bytes}
                     for key, info in memory.items()}})
    metrics: Optional[Dict[str, Any]] = _C.metrics() if report.session is None else None
    _write_json(os.path.join(report.directory, "summary.json"),
                {"title": report.title, "summary": summary.as_dict(), "metrics": metrics})
    with open(os.path.join(report.directory, "report.html"), "w", encoding="utf-8") as f:
        f.write(render(report.title, summary, events, memory, capacity, metrics))


def write_system_trace(report: Report, events: List[Event]) -> None:
    _write_json(os.path.join(report.directory, f"poptorch_{os.getpid()}.pvti.json"),
                chrome_trace(events, {}, len(_capacities()), nodes=False))
