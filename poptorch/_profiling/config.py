"""The environment that asks for profiles, as Poplar and libpvti read it:

* ``POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true", "autoReport.directory":"dir"}'``
  (or any ``autoReport.output*`` set to true): a report of the whole process,
  written in ``autoReport.directory`` (the current directory by default) at exit.
* ``PVTI_OPTIONS='{"enable":"true", "directory":"dir"}'``: a system trace (the
  phases of each call, host transfers and ``poptorch.profiling.Channel``
  tracepoints, without per-node detail), written at exit.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional

from .._errors import Error


def _options(variable: str) -> Dict[str, str]:
    text = os.environ.get(variable, "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise Error(f"{variable} must be a JSON object such as "
                    f"'{{\"autoReport.all\":\"true\"}}': {error}") from None
    if not isinstance(options, dict):
        raise Error(f"{variable} must be a JSON object, got {text!r}")
    return {str(k): str(v) for k, v in options.items()}


def _true(value: Optional[str]) -> bool:
    return value is not None and value.strip().lower() in ("true", "1", "yes", "on")


@dataclass(frozen=True)
class Requested:
    report_directory: Optional[str]  # the process report (POPLAR_ENGINE_OPTIONS)
    pvti_directory: Optional[str]    # the system trace (PVTI_OPTIONS)


def requested() -> Requested:
    """What the environment asks for (read at import)."""
    engine = _options("POPLAR_ENGINE_OPTIONS")
    wanted = _true(engine.get("autoReport.all")) or any(
        _true(v) for k, v in engine.items() if k.startswith("autoReport.output"))
    report = engine.get("autoReport.directory", os.getcwd()) if wanted else None
    pvti = _options("PVTI_OPTIONS")
    trace = pvti.get("directory", os.getcwd()) if _true(pvti.get("enable")) else None
    return Requested(report, trace)
