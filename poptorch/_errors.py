"""PopTorch's error classes (see the user guide, "Error handling")."""
from __future__ import annotations

import inspect
from typing import Optional


def _caller_location() -> str:
    """file:line of the first frame outside poptorch."""
    for frame in inspect.stack()[2:]:
        if "/poptorch/" not in frame.filename.replace("\\", "/"):
            return f"{frame.filename}:{frame.lineno}"
    return ""


class Error(RuntimeError):
    """An error in the program or a misuse of the API.

    Attributes: ``message`` (the message without context), ``type`` (the part of
    the stack that raised it and its category) and ``location`` (where it was raised).
    """

    def __init__(self, message: str, type: str = "poptorch", location: Optional[str] = None):
        self.message = message
        self.type = type
        self.location = location if location is not None else _caller_location()
        super().__init__(message)


class AssertionCompatibleError(Error, AssertionError):
    """Bad input that PopTorch checks with a Python ``assert`` (the values given
    to ``poptorch.Options`` setters, running a model compiled for an offline
    IPU, asking a model that never ran for its tensor names): a
    ``poptorch.Error`` that is also an ``AssertionError``, so code
    written for PopTorch that catches ``AssertionError`` still catches it."""


class ValueCompatibleError(Error, ValueError):
    """Bad input that PopTorch reports with a ``ValueError`` (an optimiser
    ``setOptimizer`` cannot apply to the compiled model, a bad
    ``set_executable_cache_size``), or a bad value of a ``POPTORCH_*``
    environment variable: a ``poptorch.Error`` that is also a
    ``ValueError``, so code written for PopTorch that catches ``ValueError``
    still catches it."""


class AttributeCompatibleError(Error, AttributeError):
    """An assignment to an attribute of ``poptorch.Options`` (options are set
    with their setter methods): a ``poptorch.Error`` that is also the
    ``AttributeError`` Python raises for a read-only attribute."""


class TypeCompatibleError(Error, TypeError):
    """A call of a wrapped model whose arguments do not fit its ``forward``:
    PopTorch raises ``poptorch.Error``, the CPU model Python's ``TypeError``;
    this is both, so code written for either catches it."""


class UnsupportedError(Error, NotImplementedError):
    """What the ipu cannot hold or run (quantized, sparse and strided nested
    tensors, an op with no host kernel), refused at the call with what to do
    instead: a ``poptorch.Error`` that is also the ``NotImplementedError``
    PyTorch raises for a kernel it lacks, so code written for either catches it."""


class RecoverableError(Error):
    """A transient runtime error; ``recovery_action`` says how to recover:
    ``IPU_RESET``, ``PARTITION_RESET`` or ``FULL_RESET``."""

    def __init__(self, message: str, recovery_action: str, type: str = "poplar_recoverable",
                 location: Optional[str] = None):
        super().__init__(message, type, location)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """A runtime error that will persist: take the system out of operation."""

    def __init__(self, message: str, type: str = "poplar_unrecoverable",
                 location: Optional[str] = None):
        super().__init__(message, type, location)
