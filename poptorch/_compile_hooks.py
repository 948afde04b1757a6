"""``poptorch.registerPreCompileHook`` / ``registerPostCompileHook``: callables
run before and after each compilation of a wrapped model (its first call or
``compile()``), the post-compile ones even when the compilation fails."""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Callable, Iterator

from torch.utils.hooks import RemovableHandle

from ._errors import Error

Hook = Callable[[], None]
# Registered from any thread (and removed through their handles): the lock
# keeps each registration, and each snapshot taken to run them, whole.
_LOCK = threading.Lock()
_PRE_COMPILE: "OrderedDict[int, Hook]" = OrderedDict()
_POST_COMPILE: "OrderedDict[int, Hook]" = OrderedDict()


def _register(hooks: "OrderedDict[int, Hook]", hook: Hook, kind: str) -> RemovableHandle:
    if not callable(hook):
        raise Error(f"a {kind} hook must be callable, got {type(hook).__name__}")
    with _LOCK:
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
    return handle


def registerPreCompileHook(hook: Hook) -> RemovableHandle:
    """Runs ``hook()`` before each compilation of a wrapped model. Returns a
    handle whose ``remove()`` unregisters it."""
    return _register(_PRE_COMPILE, hook, "pre-compile")


def registerPostCompileHook(hook: Hook) -> RemovableHandle:
    """Runs ``hook()`` after each compilation of a wrapped model, whether it
    succeeded or not. Returns a handle whose ``remove()`` unregisters it."""
    return _register(_POST_COMPILE, hook, "post-compile")


def _run(hooks: "OrderedDict[int, Hook]") -> None:
    with _LOCK:
        snapshot = list(hooks.values())
    for hook in snapshot:
        hook()


@contextlib.contextmanager
def compile_hooks() -> Iterator[None]:
    """Runs the pre-compile hooks, the body (a compilation), then the post-compile hooks."""
    _run(_PRE_COMPILE)
    try:
        yield
    finally:
        _run(_POST_COMPILE)
