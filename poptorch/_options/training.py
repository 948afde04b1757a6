"""``opts.Training``: gradient accumulation, reduction and loss scaling."""
from __future__ import annotations

from .._errors import AssertionCompatibleError
from ..enums import MeanReductionStrategy, ReductionType
from .settings import _Settings, _Value
from .values import _bool, _enum, _int


class _TrainingOptions(_Settings):
    """``opts.Training``: gradient accumulation and reduction."""

    _NAME = "Training"
    gradient_accumulation = _Value(1, "Micro-batches whose gradients are accumulated "
                                      "before each weight update.")
    accumulation_and_replication_reduction_type = _Value(
        ReductionType.Mean, "How accumulated and replicated gradients are reduced.")
    mean_reduction_strategy = _Value(
        MeanReductionStrategy.Post, "When a mean reduction divides by the count.")
    automatic_loss_scaling = _Value(False, "Whether the loss scaling factor adapts itself.")
    convolution_dithering = _Value(False, "Lay convolutions out from different tiles.")

    @property
    def meanAccumulationAndReplicationReductionStrategy(self) -> MeanReductionStrategy:
        """PopTorch's name of ``mean_reduction_strategy``."""
        return self.mean_reduction_strategy

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Micro-batches whose gradients are accumulated before each weight
        update (one micro-batch is ``batch_size`` samples of the DataLoader)."""
        return self._set("gradient_accumulation", _int(
            "Training.gradientAccumulation", gradient_accumulation, 1,
            "the number of micro-batches accumulated per weight update"))

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType
                                                ) -> _TrainingOptions:
        """How the gradients of the accumulated micro-batches and of the replicas
        are combined: ``ReductionType.Mean`` (default) or ``ReductionType.Sum``."""
        if reduction_type is ReductionType.NoReduction:
            raise AssertionCompatibleError("Training.accumulationAndReplicationReductionType takes "
                        "ReductionType.Mean or ReductionType.Sum, got ReductionType.NoReduction")
        return self._set("accumulation_and_replication_reduction_type", _enum(
            "Training.accumulationAndReplicationReductionType", ReductionType, reduction_type))

    def setMeanAccumulationAndReplicationReductionStrategy(
            self, mean_reduction_strategy: MeanReductionStrategy) -> _TrainingOptions:
        """When a ``Mean`` reduction divides by the number of micro-batches:
        ``Running`` keeps the accumulator as the running mean, ``Post`` divides
        once after accumulating, ``PostAndLoss`` divides by the replicas before
        the backward pass. A model whose optimiser has float16 accumulators
        (``accum_type``) uses ``Running``, as in PopTorch."""
        return self._set(
            "mean_reduction_strategy",
            _enum("Training.setMeanAccumulationAndReplicationReductionStrategy",
                  MeanReductionStrategy, mean_reduction_strategy))

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        """Let the loss scaling factor adapt itself during training, starting from
        the optimiser's ``loss_scaling`` (the rule: ``poptorch._loss_scaling``)."""
        return self._set("automatic_loss_scaling",
                         _bool("Training.setAutomaticLossScaling", enabled))

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        """Lay out convolutions with different parameters from different tiles."""
        return self._set_not_honoured("setConvolutionDithering", "convolution_dithering",
                                      _bool("Training.setConvolutionDithering", enabled))
