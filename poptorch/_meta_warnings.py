"""The warnings of PyTorch's Python Meta kernels stay out of the user's way.

Capture infers each ipu op's results by running its Meta kernel, and many of those are Python
decompositions that call ``warnings.warn`` for what they see: a resized non-empty ``out=``
tensor (with a message that differs from the CPU's), a deterministic-algorithms alert meant
for another device. The user gets the CPU kernel's own warnings at the call instead (see
``csrc/capture/cpu_checks.h``). ``warnings.catch_warnings`` would silence them for every
thread, and a filter cannot (the user's filters come first), so the modules that hold those
kernels see a ``warnings`` module of their own, which drops a warning while the calling thread
infers shapes (``_C.inferring_shapes()``) and passes every other one on unchanged.

The C++ warnings of the ops such a kernel calls (``torch.empty_strided`` of a complex32 Meta
tensor warns "ComplexHalf support is experimental") reach Python through the binding of that
op, which gives them to ``warnings`` itself, past any module's name: ``warnings._showwarnmsg``,
which shows every warning that its filters let through, drops them likewise.
"""
from __future__ import annotations

import importlib
import types
import warnings
from typing import Any, Optional

from . import _C

# The modules whose Meta kernels' helpers, references and out= wrappers call warnings.warn.
_MODULES = ("torch._prims_common", "torch._prims_common.wrappers", "torch._refs")


class _QuietWhileInferring(types.ModuleType):
    """``warnings``, with ``warn`` silent while this thread infers shapes."""

    def __init__(self) -> None:
        super().__init__("warnings", warnings.__doc__)

    def __getattr__(self, name: str) -> Any:
        return getattr(warnings, name)

    @staticmethod
    def warn(message: Any, category: Optional[type] = None, stacklevel: int = 1,
             source: Any = None) -> None:
        if _C.inferring_shapes():
            return
        # One frame more: the warning names the caller's caller, as it would have.
        warnings.warn(message, category, stacklevel + 1, source)


def _show_unless_inferring(show: Any) -> Any:
    def show_warning(message: warnings.WarningMessage) -> None:
        if not _C.inferring_shapes():
            show(message)

    return show_warning


def install() -> None:
    warnings._showwarnmsg = _show_unless_inferring(warnings._showwarnmsg)  # type: ignore[attr-defined]
    quiet = _QuietWhileInferring()
    for name in _MODULES:
        module = importlib.import_module(name)
        if getattr(module, "warnings", None) is warnings:
            module.warnings = quiet
