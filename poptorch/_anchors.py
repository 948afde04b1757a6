"""``Options.anchorTensor``: tensors of the step that a call returns besides
the model's outputs, read with ``PoplarExecutor.getAnchoredTensor``.

The names (``PoplarExecutor.getTensorNames()``): every parameter and buffer
under its name in the model, its value after each micro-batch's step; and for
a ``trainingModel`` each trainable parameter's ``Gradient___<name>`` (the
gradient of the micro-batch's loss, unscaled) and ``UpdatedVar___<name>`` (its
value after the optimiser update, which needs an update per micro-batch:
``gradientAccumulation`` and ``replicationFactor`` of 1). PopTorch's names
carry a ``model.`` prefix (``Gradient___model.fc.bias``): it is accepted.
A ``trainingModel`` also has PopTorch's ``finalLossScale``: the loss scale
the micro-batch's loss was multiplied by (the optimiser's ``loss_scaling``,
or with automatic loss scaling its current value, before this step adapts it).

An anchored tensor is an output of the captured step, gathered over the
micro-batches of a call with its own output mode (the model's by default).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ._device_state import DeviceState
from ._errors import Error
from ._logging import logger
from .enums import OutputMode
from .options import Options

_GRADIENT, _UPDATED = "Gradient___", "UpdatedVar___"
FINAL_LOSS_SCALE = "finalLossScale"
_MODEL_PREFIX = "model."


def tensor_names(model: torch.nn.Module, training: bool) -> List[str]:
    """The names a model's tensors may be anchored by."""
    names = [name for name, _ in model.named_parameters()]
    names += [name for name, _ in model.named_buffers()]
    if training:
        trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        names += [_GRADIENT + name for name in trainable] + [_UPDATED + name for name in trainable]
        names.append(FINAL_LOSS_SCALE)
    return names


def _resolve(long_name: str, names: List[str]) -> str:
    """``long_name`` as one of ``names`` (PopTorch's ``model.`` prefix dropped)."""
    if long_name in names:
        return long_name
    for kind in (_GRADIENT, _UPDATED, ""):
        if long_name.startswith(kind + _MODEL_PREFIX):
            unprefixed = kind + long_name[len(kind + _MODEL_PREFIX):]
            if unprefixed in names:
                return unprefixed
    raise Error(f"anchorTensor: the model has no tensor {long_name!r}; getTensorNames() lists "
                f"the names that may be anchored: {', '.join(names)}")


# PopART's names of the output modes, which PopTorch logs its anchors with
_MODE_NAMES = {OutputMode.All: "ALL", OutputMode.EveryN: "EVERYN", OutputMode.Final: "FINAL",
               OutputMode.Sum: "Sum"}


def _log_anchor(long_name: str, options: Options, mode: Optional[OutputMode],
                period: Optional[int]) -> None:
    """Logs (DEBUG) how an anchored tensor is returned, in PopTorch's words:
    ``<name> <MODE>/<period>`` (the model's mode when it has none of its own)."""
    if mode in (None, OutputMode.Default):
        mode, period = options.output_mode, options.output_return_period
    period = period if mode == OutputMode.EveryN else 1
    logger.debug("anchored tensor %s %s/%d", long_name, _MODE_NAMES.get(mode, mode.name),
                 period)


class Anchors:
    """The anchored tensors of one wrapped model, as its step captures them."""

    def __init__(self, options: Options, model: torch.nn.Module, state: DeviceState,
                 training: bool, update_per_micro_batch: bool) -> None:
        names = tensor_names(model, training)
        self._state = state
        # short name -> (tensor name, its gather mode or None for the model's, period)
        self._anchors: Dict[str, Tuple[str, Optional[OutputMode], int]] = {}
        for short, long_name, mode, period in options.anchored_tensors:
            name = _resolve(long_name, names)
            if name.startswith(_UPDATED) and not update_per_micro_batch:
                raise Error(f"anchorTensor({short!r}, {long_name!r}): the emulator can only "
                            "return updated weights when each micro-batch is followed by its "
                            "update (gradientAccumulation and replicationFactor of 1); anchor "
                            "the parameter itself after the call instead")
            if mode == OutputMode.EveryN and options.device_iterations % period:
                raise Error(f"anchorTensor({short!r}, ..., OutputMode.EveryN, {period}): "
                            f"deviceIterations ({options.device_iterations}) must be a "
                            "multiple of the output return period")
            self._anchors[short] = (name, mode, period or 1)
            _log_anchor(long_name, options, mode, period)
        self._gradients: Dict[str, torch.Tensor] = {}
        self._scale: Any = 1.0

    def take_gradients(self, gradients: Dict[int, torch.Tensor], scale: Any) -> None:
        """Keeps the anchored gradients of this micro-batch (of the loss times
        ``scale``) before the update uses them as scratch, and the scale
        before an automatic loss scaling update changes it."""
        self._scale = scale.detach().clone() if isinstance(scale, torch.Tensor) else scale
        self._gradients = {}
        for name, _, _ in self._anchors.values():
            if name.startswith(_GRADIENT):
                param = name[len(_GRADIENT):]
                gradient = gradients.get(id(self._state.tensors[param]))
                if gradient is None:
                    raise Error(f"anchorTensor: {param} has no gradient: the loss does not "
                                "depend on it")
                self._gradients[name] = (gradient / scale).detach()

    def values(self) -> Dict[str, torch.Tensor]:
        """The anchored tensors, at the end of the micro-batch's step."""
        values = {}
        for short, (name, _, _) in self._anchors.items():
            if name.startswith(_GRADIENT):
                values[short] = self._gradients[name]
            elif name == FINAL_LOSS_SCALE:
                values[short] = (self._scale if isinstance(self._scale, torch.Tensor) else
                                 torch.tensor(float(self._scale), device=self._state.device))
            else:
                tensor = self._state.tensors[name.removeprefix(_UPDATED)]
                values[short] = tensor.detach().clone()
        return values

    def gathers(self, model_gather: Tuple[OutputMode, int],
                outputs: int) -> List[Tuple[OutputMode, int]]:
        """(mode, period) of each of the step's ``outputs`` outputs: the model's
        outputs, then the anchors (the model's mode unless they have their own)."""
        own = [model_gather if mode in (None, OutputMode.Default) else (mode, period)
               for _, mode, period in self._anchors.values()]
        return [model_gather] * (outputs - len(own)) + own
