"""``Options.Precision`` applied to a wrapped model: the casting rule and
autocast policy during the forward, float32 running statistics."""
from __future__ import annotations

from typing import Any, ContextManager

import torch

from . import autocasting
from .enums import HalfFloatCastingBehavior


def forward_casting(precision: Any, model: torch.nn.Module) -> ContextManager[None]:
    """The casts of ``model``'s forward: the policy in its autocast regions and,
    for operations mixing float16 and float32, ``halfFloatCasting`` (``Default``
    is PopTorch's ``FloatDowncastToHalf``)."""
    rule = precision.half_float_casting
    if rule == HalfFloatCastingBehavior.Default:
        rule = HalfFloatCastingBehavior.FloatDowncastToHalf
    return autocasting.casting(precision.autocast_policy, rule, precision.autocast_enabled,
                               model)


def keep_running_statistics_float(precision: Any, model: torch.nn.Module) -> None:
    """``runningStatisticsAlwaysFloat``: float16 running statistics of norm
    layers become float32 (in the host model too: it shares the device's)."""
    if not precision.running_statistics_always_float:
        return
    for layer in model.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._NormBase):
            for name in ("running_mean", "running_var"):
                stat = getattr(layer, name)
                if stat is not None and stat.dtype == torch.float16:
                    setattr(layer, name, stat.float())


