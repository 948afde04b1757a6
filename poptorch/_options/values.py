"""Validation of option values: each raises ``poptorch.Error`` naming the
option, the value and what it takes."""
from __future__ import annotations

import enum
import os
from typing import Any, TypeVar

from .._errors import AssertionCompatibleError


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _int(option: str, value: Any, minimum: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AssertionCompatibleError(f"{option} takes an integer ({meaning}), got {_show(value)} "
                    f"of type {type(value).__name__}")
    if value < minimum:
        raise AssertionCompatibleError(f"{option}({value}) is invalid: {meaning} must be at least {minimum}; "
                    f"pass {option}({minimum}) or more")
    return value


def _bool(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise AssertionCompatibleError(f"{option} takes True or False, got {_show(value)}")
    return value


E = TypeVar("E", bound=enum.Enum)


def _enum(option: str, cls: type[E], value: Any) -> E:
    if not isinstance(value, cls):
        names = ", ".join(f"{cls.__name__}.{m.name}" for m in cls)
        raise AssertionCompatibleError(f"{option} takes one of {names}, got {_show(value)}")
    return value


def _str(option: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise AssertionCompatibleError(f"{option} takes a non-empty string or path, got {_show(value)}")
    return value
