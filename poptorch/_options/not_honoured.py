"""The options the emulated IPU Model does not act on, why, and the INFO
message that says so when one is set to a value the emulator does not honour."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Tuple

import torch

from .._logging import logger
from ..enums import ConnectionType, SyncPattern
from .values import _show

# Path fragments of the frames skipped when naming where an op came from.
_DEFAULT_LOCATION_EXCLUDES = ("/torch/", "/poptorch/")


def _never(_: Any) -> bool:
    return False


def _only(*honoured: Any) -> Callable[[Any], bool]:
    return lambda value: value in honoured


# Every option the emulated IPU Model does not act on: option -> (does the
# emulator behave as asked for this value?, why not otherwise).
_NOT_HONOURED: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "useIpuModel": (_only(True), "there is no IPU hardware, the IPU Model is always used"),
    "useIpuId": (_never, "there is a single emulated IPU"),
    "connectionType": (_only(ConnectionType.Always, ConnectionType.Never),
                       "the emulated IPU is always attached"),
    "syncPattern": (_only(SyncPattern.Full), "there are no IPUs to synchronise"),
    "enableSyntheticData": (_only(False), "inputs always come from the host"),
    "logDir": (_never, "PopTorch writes no log files (profiles go where enableProfiling says)"),
    "sourceLocationExcludes": (
        lambda excludes: tuple(excludes) == _DEFAULT_LOCATION_EXCLUDES,
        "errors name the first frame outside torch and poptorch"),
    "enableStableNorm": (_only(True), "the host's norm kernels are the stable ones"),
    "Training.setConvolutionDithering": (_only(False), "the emulator has no tiles"),
    "Precision.enableStochasticRounding": (_only(False), "rounding is to nearest"),
    "Precision.enableFloatingPointExceptions": (
        _only(False), "the host computes IEEE 754 results (inf, NaN) without raising"),
    "Precision.setPartialsType": (
        _only(torch.float32), "float16 matmuls and convolutions accumulate their partials in "
        "float32 on the host, so results are at least as precise as with float16 partials"),
    "TensorLocations.setActivationLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setWeightLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setOptimizerLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setAccumulatorLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.numIOTiles": (_never, "the emulator has no tiles"),
    "Jit.traceModel": (_only(False), "models are captured at the dispatcher, not traced"),
    "_Popart.set": (_never, "there is no PopART: graphs are compiled by the emulator's passes"),
}


def _log_if_not_honoured(option: str, value: Any) -> None:
    """Logs that ``option(value)`` is stored but ignored, unless the emulator behaves so."""
    honours, why = _NOT_HONOURED[option]
    if not honours(value):
        shown = ", ".join(map(_show, value)) if isinstance(value, tuple) else _show(value)
        logger.info("%s(%s) is accepted but the emulated IPU Model ignores it: %s",
                    option, shown, why)


def note_what_the_emulator_does(classes: Dict[str, type]) -> None:
    """Ends the docstring of each setter of _NOT_HONOURED with what the emulator
    does; ``classes`` maps each option group's name ("" for Options) to its class."""
    for option, (_, why) in _NOT_HONOURED.items():
        group, _, name = option.rpartition(".")
        setter = vars(classes[group])[name]
        setter.__doc__ = (f"{inspect.cleandoc(setter.__doc__ or '')}\n\nOn the emulated IPU "
                          f"Model: {why}. A value it does not act on is stored and logged at "
                          f"INFO.")
