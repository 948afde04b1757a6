"""Automatic loss scaling (``Options.Training.setAutomaticLossScaling(True)``).

PopTorch leaves the rule to its backend; the emulator's is the histogram rule
PopART describes, made safe against overflow as ``torch.amp.GradScaler`` is:
at every weight update, over all the (still loss-scaled) gradients,

* if any gradient is infinite or NaN, the update is skipped (weights and
  optimiser state keep their values) and the scale is halved;
* otherwise, if more than ``UPPER_PROPORTION`` of the gradient elements lie in
  the top bin, at or above ``BIN_EDGE`` of float16's largest value (they would
  overflow soon), the scale is halved; else it is doubled.

The scale stays within [``MIN_SCALE``, ``MAX_SCALE``]. It starts from the
optimiser's ``loss_scaling`` and lives on the device: ``setOptimizer`` (and
``load_state_dict``) sets it again.
"""
from __future__ import annotations

from typing import Callable, Iterable, List

import torch

BIN_EDGE = 1.0 / 8
UPPER_PROPORTION = 1e-7
MIN_SCALE, MAX_SCALE = 1.0, 2.0**32
_EDGE = BIN_EDGE * torch.finfo(torch.float16).max


class Statistics:
    """What the rule reads from the loss-scaled gradients (device tensors)."""

    def __init__(self, gradients: Iterable[torch.Tensor]) -> None:
        grads = list(gradients)
        self.total = sum(g.numel() for g in grads)
        # ~(|g| < edge) also counts NaN.
        self.upper = torch.stack([(~(g.abs() < _EDGE)).sum() for g in grads]).sum()
        self.finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()


def update_with_automatic_scale(scale: torch.Tensor, statistics: Statistics,
                                protected: List[torch.Tensor],
                                update: Callable[[], None]) -> None:
    """Runs ``update`` (which changes ``protected``: weights and optimiser state)
    unless a gradient overflowed, then adapts ``scale`` in place. Captured into
    the update program: every decision is a device tensor."""
    before = [t.clone() for t in protected]
    update()
    with torch.no_grad():
        for t, old in zip(protected, before):
            t.copy_(torch.where(statistics.finite, t, old))
        too_high = statistics.upper > UPPER_PROPORTION * statistics.total
        scale.mul_(torch.where(too_high, 0.5, 2.0)).clamp_(MIN_SCALE, MAX_SCALE)
