"""PopTorch: an ``ipu`` device for PyTorch and the PopTorch programming model.

Importing ``poptorch`` registers the ``ipu`` device: ``tensor.to("ipu")`` and
``model.to("ipu")`` capture operations lazily into graphs that are compiled,
cached by structure and run on the emulated IPU when values are needed.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from . import _C
from . import _device_module
from ._logging import logger, setLogLevel

torch._register_device_module("ipu", _device_module)


def synchronize() -> None:
    """Runs every pending ipu operation now."""
    _C.synchronize()


def metrics() -> Dict[str, Any]:
    """Counters of what the ipu backend did since start (or ``reset_metrics``):
    ``ops_captured``, ``graphs_compiled``, ``cache_hits``, ``executions``,
    ``host_fallbacks``, ``fallback_ops`` (op name -> count),
    ``compile_seconds``, ``execute_seconds``, ``bytes_to_ipu``, ``bytes_from_ipu``.
    """
    return _C.metrics()


def reset_metrics() -> None:
    """Sets every counter of :func:`metrics` back to zero."""
    _C.reset_metrics()


__all__ = ["logger", "metrics", "reset_metrics", "setLogLevel", "synchronize"]
