"""Gradient checkpointing (``torch.utils.checkpoint``) under poptorch's state.

A checkpointed part of the forward runs again in backward. PyTorch restores
its own state of the first run there (autocast, the RNG, a device context),
not poptorch's: the half/float casting rule and ``poptorch.autocast``
regions, the blocks (``poptorch.Block``, ``BeginBlock``) and a wrapped
model's capture modes (host constants, float64 demotion). Without them a
float16 model recomputes with float32 inputs (an error, or other values than
those its backward saved), and a recomputed block seems to run after later
pipeline stages.

Both of PyTorch's implementations are wrapped where ``checkpoint`` looks them
up when it is called, however it was imported (``use_reentrant=True``:
``CheckpointFunction``; ``False``: ``_checkpoint_without_reentrant_generator``):
the function they recompute runs again under poptorch's state of the call.
Where poptorch has no state (plain PyTorch code), they do what PyTorch does.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch.utils.checkpoint as _checkpoint

from . import _annotations, autocasting

Again = Callable[[], ContextManager[None]]

_local = threading.local()


@contextlib.contextmanager
def capture_modes(again: Again) -> Iterator[None]:
    """While a wrapped model's forward is captured on this thread: ``again``
    enters its capture modes for a recomputation."""
    previous = getattr(_local, "capture_modes", None)
    _local.capture_modes = again
    try:
        yield
    finally:
        _local.capture_modes = previous


def _state_now() -> Optional[Again]:
    """Poptorch's state now, to enter again; None if there is none."""
    parts = [autocasting.recompute_state(), _annotations.recompute_state(),
             getattr(_local, "capture_modes", None)]
    parts = [part for part in parts if part is not None]
    if not parts:
        return None

    @contextlib.contextmanager
    def again() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for part in parts:  # the order of the forward: casts outermost
                stack.enter_context(part())
            yield

    return again


def _recomputed(function: Callable[..., Any], again: Again,
                first_is_forward: bool) -> Callable[..., Any]:
    """``function``, run under ``again`` (but its first call if that is the forward)."""
    calls = [0]

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if first_is_forward and calls[0] == 1:
            return function(*args, **kwargs)
        with again():
            return function(*args, **kwargs)

    return run


class _CheckpointFunction(_checkpoint.CheckpointFunction):
    """use_reentrant=True: runs its function in forward, and again in backward."""

    @classmethod
    def apply(cls, function: Callable[..., Any], preserve_rng_state: bool,  # type: ignore[override]
              *args: Any) -> Any:
        again = _state_now()
        if again is not None:
            function = _recomputed(function, again, first_is_forward=True)
        return super().apply(function, preserve_rng_state, *args)


_without_reentrant = _checkpoint._checkpoint_without_reentrant_generator


def _checkpoint_without_reentrant_generator(function: Callable[..., Any], *args: Any,
                                            **kwargs: Any) -> Any:
    """use_reentrant=False: ``checkpoint`` runs the function in forward itself;
    the generator runs it only to recompute."""
    again = _state_now()
    if again is not None:
        function = _recomputed(function, again, first_is_forward=False)
    return _without_reentrant(function, *args, **kwargs)


def install() -> None:
    """Puts the wrappers where ``torch.utils.checkpoint.checkpoint`` finds them."""
    _checkpoint.CheckpointFunction = _CheckpointFunction  # type: ignore[misc]
    _checkpoint._checkpoint_without_reentrant_generator = (  # type: ignore[assignment]
        _checkpoint_without_reentrant_generator)
