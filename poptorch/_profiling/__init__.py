"""Profile reports of what the emulated IPU did (the user guide's "Profiling").

``Options.enableProfiling(dir)`` reports one wrapped model, and
``POPLAR_ENGINE_OPTIONS`` (autoReport) the whole process: each is a
Chrome/Perfetto trace, the memory of each IPU over each program and an HTML
page of both (``report.py``). ``PVTI_OPTIONS`` asks for a system trace.
The events come from the C++ profiler (``csrc/profiling``) and from Python
(``recorder.py``).
"""
from __future__ import annotations

import os

from . import config, recorder
from .recorder import Report
from .report import write_profile, write_system_trace


def start_from_environment() -> None:
    """Opens the reports the environment asks for (at import)."""
    wanted = config.requested()
    if wanted.report_directory is not None:
        recorder.open_report(Report(wanted.report_directory, f"process {os.getpid()}", None,
                                    write_profile))
    if wanted.pvti_directory is not None:
        recorder.open_report(Report(wanted.pvti_directory, "system trace", None,
                                    write_system_trace))


def model_report(directory: str, name: str, session: int) -> Report:
    """Opens the report of one wrapped model (``Options.enableProfiling``)."""
    return recorder.open_report(Report(os.path.join(directory, name), name, session,
                                       write_profile))
