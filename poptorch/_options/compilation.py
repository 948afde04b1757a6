"""``opts.Jit`` and ``opts._Popart``: how the model is captured, and the
compiler options of PopTorch's PopART backend."""
from __future__ import annotations

from typing import Any, Dict

from .not_honoured import _log_if_not_honoured
from .settings import _Settings, _Value
from .values import _bool, _int, _str


class _JitOptions(_Settings):
    """``opts.Jit``: how the model is captured."""

    _NAME = "Jit"
    trace_model = _Value(False, "Capture with torch.jit.trace instead of the dispatcher.")

    def traceModel(self, trace_model: bool) -> _JitOptions:
        """Capture with ``torch.jit.trace`` (True) or at PyTorch's dispatcher (False)."""
        return self._set_not_honoured("traceModel", "trace_model",
                                      _bool("Jit.traceModel", trace_model))


class _PopartOptions(_Settings):
    """``opts._Popart``: PopART's session options, for PopTorch's advanced
    users. There is no PopART here: options are validated, stored and logged."""

    _NAME = "_Popart"
    options = _Value[Dict[str, Any]]({}, "PopART option name -> value.")

    def set(self, key: str, value: Any) -> _PopartOptions:
        """Sets the PopART session option ``key`` to ``value``."""
        _log_if_not_honoured("_Popart.set", (_str("_Popart.set", key), value))
        return self._set("options", {**self.options, key: value})

    def setEngineOptions(self, engine_options: Dict[str, str]) -> _PopartOptions:
        """Sets Poplar's engine options (``engineOptions``)."""
        return self.set("engineOptions", dict(engine_options))

    def setPatterns(self, patterns: Dict[str, bool], level: int = 2) -> _PopartOptions:
        """Enables or disables PopART's graph patterns (``patterns``), from the
        patterns of ``level``."""
        self.set("patterns_level", _int("_Popart.setPatterns", level, 0, "the patterns level"))
        return self.set("patterns", dict(patterns))
