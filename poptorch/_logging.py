"""Python-side logging, governed like the C++ core by ``POPTORCH_LOG_LEVEL``."""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Optional, Tuple, Union

from . import _C
from ._errors import ValueCompatibleError

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


class _RepeatLimit(logging.Filter):
    """``Options.maxRepeatLogs``: each logging site's message is logged at most
    ``limit`` times (None: no limit); the last one says that repeats follow."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.limit: Optional[int] = None
        self._logged: "Counter[Tuple[str, int]]" = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if self.limit is None:
                return True
            site = (record.pathname, record.lineno)
            self._logged[site] += 1
            count = self._logged[site]
        if count == self.limit:
            record.msg = f"{record.msg} (repeated; its further repeats are not shown)"
        return count <= self.limit


_repeat_limit = _RepeatLimit()
logger.addFilter(_repeat_limit)


def set_max_repeat_logs(limit: Optional[int]) -> None:
    """How many times each message may be logged (None: no limit)."""
    _repeat_limit.limit = limit


# PopTorch's legacy integer levels.
_NUMBERED = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}


def setLogLevel(level: Union[str, int]) -> None:
    """Sets the log level of PopTorch (Python and C++): OFF, ERR, WARN, INFO,
    DEBUG (or DEBUG_IR), TRACE or TRACE_ALL; or PopTorch's integers 0 (TRACE),
    1 (DEBUG), 2 (INFO), 3 (WARN), 4 (ERR) and 6 (OFF)."""
    if isinstance(level, int) and not isinstance(level, bool):
        if level not in _NUMBERED:
            raise ValueCompatibleError(
                f"unknown log level {level}: use one of "
                f"{', '.join(f'{n} ({name})' for n, name in _NUMBERED.items())}, or a name: "
                f"{', '.join(_LEVELS)}")
        level = _NUMBERED[level]
    name = str(level).upper()
    if name not in _LEVELS:
        raise ValueCompatibleError(f"unknown log level {level!r}: use one of "
                                   f"{', '.join(_LEVELS)} (or PopTorch's integers "
                                   f"{', '.join(map(str, _NUMBERED))})")
    _C.set_log_level("DEBUG" if name == "DEBUG_IR" else name)
    logger.setLevel(_LEVELS[name])


def _level_from_environment() -> None:
    """POPTORCH_LOG_LEVEL's level; a value that is none is said, and INFO used, so that
    a typo in the environment does not stop ``import poptorch`` (PopTorch ignored it)."""
    value = os.environ.get("POPTORCH_LOG_LEVEL", "INFO")
    try:
        setLogLevel(value)
    except ValueError as error:
        setLogLevel("INFO")
        logger.warning("POPTORCH_LOG_LEVEL=%s is not a log level (%s); logging at INFO",
                       value, error)


_level_from_environment()
