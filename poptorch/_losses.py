"""Finding the loss of a training step: ``identity_loss`` marks it, torch loss
modules are found on their own; ``isRunningOnIpu`` tells a model it is being
captured for the IPU."""
from __future__ import annotations

import threading
from typing import Any, List, Optional

import torch
import torch.utils._pytree as pytree

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

    def loss(self, outputs: Any) -> torch.Tensor:
        """The loss to differentiate, or a clear error. PopTorch's rule: the model
        returns its loss — a scalar, or what identity_loss marked; several
        returned losses must be combined into one."""
        if self.marked:
            return self.marked[-1]
        returned: List[torch.Tensor] = []
        for leaf in pytree.tree_leaves(outputs):
            if (isinstance(leaf, torch.Tensor) and leaf.dim() == 0 and leaf.requires_grad
                    and leaf.is_floating_point() and all(leaf is not r for r in returned)):
                returned.append(leaf)
        if len(returned) == 1:
            return returned[0]
        if len(returned) > 1:
            raise Error(f"the model returns {len(returned)} scalar losses: combine them into one "
                        "and mark it with poptorch.identity_loss(total, reduction='none'), "
                        "e.g. return out, poptorch.identity_loss(loss1 + loss2, "
                        "reduction='none')")
        if len(self.module_losses) == 1:
            return self.module_losses[0]
        if len(self.module_losses) > 1:
            raise Error("the model computes several losses: combine them and mark the result "
                        "with poptorch.identity_loss(total, reduction='none')")
        scalars: List[torch.Tensor] = []
        for leaf in pytree.tree_leaves(outputs):
            if (isinstance(leaf, torch.Tensor) and leaf.dim() == 0 and leaf.is_floating_point()
                    and all(leaf is not s for s in scalars)):
                scalars.append(leaf)
        if len(scalars) == 1:
            # A loss that reaches no parameter that requires grad (a frozen
            # model): the step runs its forward pass and updates nothing, as
            # for a loss module or an identity_loss (see StepCapture).
            return scalars[0]
        if scalars:
            raise Error(f"the model returns {len(scalars)} scalars and none requires a "
                        "gradient, so none is the loss: mark the loss with "
                        "poptorch.identity_loss(loss, reduction='none')")
        # PopTorch's words first
        raise Error("Couldn't find a loss in graph: trainingModel needs a loss: return it "
                    "from forward() (a scalar tensor computed from the outputs, e.g. with "
                    "torch.nn.functional.cross_entropy or a torch loss module) or mark it "
                    "with poptorch.identity_loss(loss, reduction='mean')")


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Marks ``x`` as the loss of the training step, reduced with ``reduction``
    (``"sum"``, ``"mean"`` or ``"none"``). The gradient of ones flows back from it."""
    if reduction not in _REDUCTIONS:
        raise Error(f"identity_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not isinstance(x, torch.Tensor):
        raise Error(f"identity_loss takes the loss as a tensor computed from the model's "
                    f"outputs, got {type(x).__name__} {x!r}: a number has no gradient to "
                    "train with")
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
