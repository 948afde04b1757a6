"""Python-side logging, governed like the C++ core by ``POPTORCH_LOG_LEVEL``."""
from __future__ import annotations

import logging
import os
from typing import Union

from . import _C

_LEVELS = {
    "OFF": logging.CRITICAL + 10,
    "ERR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "DEBUG_IR": logging.DEBUG,
    "TRACE": logging.DEBUG - 5,
    "TRACE_ALL": logging.DEBUG - 5,
}

logger = logging.getLogger("poptorch")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[poptorch:%(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False


# PopTorch's legacy integer levels.
_NUMBERED = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}


def setLogLevel(level: Union[str, int]) -> None:
    """Sets the log level of PopTorch (Python and C++): OFF, ERR, WARN, INFO,
    DEBUG (or DEBUG_IR), TRACE or TRACE_ALL; or PopTorch's integers 0 (TRACE),
    1 (DEBUG), 2 (INFO), 3 (WARN), 4 (ERR) and 6 (OFF)."""
    if isinstance(level, int) and not isinstance(level, bool):
        if level not in _NUMBERED:
            raise ValueError(f"unknown log level {level}: use one of "
                             f"{', '.join(f'{n} ({name})' for n, name in _NUMBERED.items())}")
        level = _NUMBERED[level]
    name = str(level).upper()
    if name not in _LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(_LEVELS)}")
    _C.set_log_level("DEBUG" if name == "DEBUG_IR" else name)
    logger.setLevel(_LEVELS[name])


setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "INFO"))
