"""Python-side logging, governed like the C++ core by ``POPTORCH_LOG_LEVEL``."""
from __future__ import annotations

import logging
import os

from . import _C

_LEVELS = {
    "OFF": logging.CRITICAL + 10,
    "ERR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": logging.DEBUG - 5,
    "TRACE_ALL": logging.DEBUG - 5,
}

logger = logging.getLogger("poptorch")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[poptorch:%(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False


def setLogLevel(level: str) -> None:
    """Sets the log level of PopTorch (Python and C++): OFF, ERR, WARN, INFO,
    DEBUG, TRACE or TRACE_ALL."""
    name = str(level).upper()
    if name not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(_LEVELS)}")
    _C.set_log_level(name)
    logger.setLevel(_LEVELS[name])


setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "INFO"))
