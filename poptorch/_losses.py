"""Finding the loss of a training step: ``identity_loss`` marks it, torch loss
modules are found on their own; ``isRunningOnIpu`` tells a model it is being
captured for the IPU."""
from __future__ import annotations

import threading
from typing import List, Optional

import torch

from ._errors import Error

_REDUCTIONS = ("sum", "mean", "none")
_local = threading.local()


class LossRecorder:
    """Active while a step is captured: records marked losses and the outputs
    of torch loss modules."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.marked: List[torch.Tensor] = []
        self.module_losses: List[torch.Tensor] = []
        self._hooks = [m.register_forward_hook(self._record) for m in model.modules()
                       if isinstance(m, torch.nn.modules.loss._Loss)]

    def _record(self, module, inputs, output) -> None:
        if isinstance(output, torch.Tensor):
            self.module_losses.append(output)

    def __enter__(self) -> "LossRecorder":
        self._previous = getattr(_local, "recorder", None)
        _local.recorder = self
        return self

    def __exit__(self, *exc) -> None:
        _local.recorder = self._previous
        for hook in self._hooks:
            hook.remove()

    def loss(self) -> torch.Tensor:
        """The loss to differentiate, or a clear error."""
        if self.marked:
            return self.marked[-1]
        if len(self.module_losses) == 1:
            return self.module_losses[0]
        if len(self.module_losses) > 1:
            raise Error("the model computes several losses: combine them and mark the result "
                        "with poptorch.identity_loss(total, reduction='none')")
        raise Error("trainingModel needs a loss: compute it in forward() with a torch loss "
                    "module (e.g. torch.nn.CrossEntropyLoss) or mark it with "
                    "poptorch.identity_loss(loss, reduction='mean')")


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Marks ``x`` as the loss of the training step, reduced with ``reduction``
    (``"sum"``, ``"mean"`` or ``"none"``). The gradient of ones flows back from it."""
    if reduction not in _REDUCTIONS:
        raise Error(f"identity_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    loss = x.sum() if reduction == "sum" else x.mean() if reduction == "mean" else x
    recorder: Optional[LossRecorder] = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.marked.append(loss)
    return loss


def isRunningOnIpu() -> bool:
    """True while PopTorch captures a model for the IPU, False elsewhere."""
    return getattr(_local, "running_on_ipu", False)


class RunningOnIpu:
    """Makes ``isRunningOnIpu()`` true while a model is captured for the IPU."""

    def __enter__(self) -> None:
        _local.running_on_ipu = True

    def __exit__(self, *exc) -> None:
        _local.running_on_ipu = False
