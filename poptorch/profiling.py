"""User tracepoints in PopTorch's profiles (``poptorch.profiling.Channel``).

A tracepoint is a span of the host timeline, named ``<channel>.<name>``. It is
recorded while a profile or system trace is being made (``PVTI_OPTIONS``,
``POPLAR_ENGINE_OPTIONS``, ``Options.enableProfiling``) and costs nothing
otherwise, as PopTorch's are no-ops without libpvti.

>>> channel = poptorch.profiling.Channel("MyApp")
>>> with channel.tracepoint("TimeThis"):
...     functionToTime()
>>> channel.instrument(myobj, "methodName", "otherMethod")
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

from . import _C
from ._errors import Error
from ._profiling import recorder

__all__ = ["Channel"]


class Channel:
    """A named channel of tracepoints."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise Error(f"poptorch.profiling.Channel needs a name, got {name!r}")
        self._name = name

    @contextlib.contextmanager
    def tracepoint(self, name: str) -> Iterator[None]:
        """A span named ``<channel>.<name>`` around the block:

        >>> with channel.tracepoint("DoingSomething"):
        ...     expensiveCall()
        """
        if not recorder.recording():
            yield
            return
        start = _C.profiling_now()
        try:
            yield
        finally:
            _C.profiling_record(f"{self._name}.{name}", start, _C.profiling_now())

    def instrument(self, obj: Any, *methods: str) -> Any:
        """Wraps each named method of ``obj`` in a tracepoint of its name;
        returns ``obj``."""
        for method in methods:
            original = getattr(obj, method, None)
            if not callable(original):
                raise Error(f"Channel.instrument: {type(obj).__name__} has no method {method!r}")
            setattr(obj, method, self._traced(original, method))
        return obj

    def _traced(self, original: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with self.tracepoint(name):
                return original(*args, **kwargs)
        return traced
