"""``opts.Precision``: half precision, automatic casting and floating point
behaviour."""
from __future__ import annotations

import torch

from .. import autocasting
from .._errors import AssertionCompatibleError
from ..enums import HalfFloatCastingBehavior
from .settings import _Settings, _Value
from .values import _bool, _enum, _show


class _PrecisionOptions(_Settings):
    """``opts.Precision``: half precision and floating point behaviour."""

    _NAME = "Precision"
    half_float_casting = _Value(HalfFloatCastingBehavior.Default,
                                "What mixed float16/float32 operations compute in.")
    running_statistics_always_float = _Value(False, "Keep norm running statistics in float32.")
    autocast_policy = _Value(autocasting.default, "The automatic casting policy.")
    stochastic_rounding = _Value(False, "Round stochastically.")
    floating_point_exceptions = _Value(False, "Raise on invalid floating point operations.")
    partials_type = _Value(torch.float32, "The dtype of matmul and convolution partials.")
    autocast_enabled = _Value(True, "Whether autocast regions and layers cast automatically.")

    def halfFloatCasting(self, half_float_casting: HalfFloatCastingBehavior
                         ) -> _PrecisionOptions:
        """What an op mixing float16 and float32 inputs computes in:
        ``FloatDowncastToHalf`` (and ``Default``, PopTorch's rule) casts its
        inputs to float16, ``HalfUpcastToFloat`` to float32 (PyTorch's rule).
        In-place ops keep their output's dtype."""
        return self._set("half_float_casting", _enum(
            "Precision.halfFloatCasting", HalfFloatCastingBehavior, half_float_casting))

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        """Keep the running mean and variance of norm layers in float32 even in a
        float16 model (the host model's buffers become float32 too: they are the
        device's). The layers then normalise in float32 and return float16."""
        return self._set("running_statistics_always_float",
                         _bool("Precision.runningStatisticsAlwaysFloat", value))

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        """Round float16 results stochastically on the IPU."""
        return self._set_not_honoured("enableStochasticRounding", "stochastic_rounding",
                                      _bool("Precision.enableStochasticRounding", enabled))

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        """Raise an error when the IPU meets an invalid operation (inf - inf,
        division by zero, 0 x inf, a comparison with NaN...)."""
        return self._set_not_honoured("enableFloatingPointExceptions",
                                      "floating_point_exceptions",
                                      _bool("Precision.enableFloatingPointExceptions", enabled))

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        """The dtype of the partial results of matmuls and convolutions
        (``torch.float32`` or ``torch.float16``)."""
        if dtype not in (torch.float32, torch.float16):
            raise AssertionCompatibleError(f"Precision.setPartialsType takes torch.float32 or torch.float16, "
                        f"got {_show(dtype)}")
        return self._set_not_honoured("setPartialsType", "partials_type", dtype)

    def autocastEnabled(self, autocast_enabled: bool) -> _PrecisionOptions:
        """Turn automatic casting (``model.autocast()``, ``poptorch.autocast``
        regions) on (default) or off for the whole model."""
        return self._set("autocast_enabled", _bool("Precision.autocastEnabled", autocast_enabled))

    def autocastPolicy(self, autocast_policy: autocasting.Policy) -> _PrecisionOptions:
        """The automatic casting policy (default: ``poptorch.autocasting.default``)."""
        if not isinstance(autocast_policy, autocasting.Policy):
            raise AssertionCompatibleError("Precision.autocastPolicy takes a poptorch.autocasting.Policy, got "
                        f"{type(autocast_policy).__name__}")
        return self._set("autocast_policy", autocast_policy)
