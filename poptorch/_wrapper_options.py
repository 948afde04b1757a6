"""The options a wrapped model runs with, and how its mean reduction divides.

A ``trainingModel``/``inferenceModel`` runs with the user's options with
PopTorch's implicit choices made, on a copy (the user's object keeps its
values, as upstream's ``test_preserving_options_intact`` checks):

* ``OutputMode.Default`` becomes ``Final`` for training and ``All`` for
  inference;
* an optimiser whose gradient accumulators are float16 (``accum_type``) makes
  the mean reduction ``Running``: a sum of many float16 gradients overflows
  where their running mean does not. SGD's combined variant
  (``use_combined_accum``) supports only ``Post``, as in PopTorch.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ._errors import ValueCompatibleError
from .enums import MeanReductionStrategy, OutputMode, ReductionType
from .options import Options


def needs_running_mean(optimizer: Optional[torch.optim.Optimizer]) -> bool:
    """PopTorch's rule: float16 accumulators keep the running mean."""
    return (getattr(optimizer, "accum_type", None) == torch.float16
            and not getattr(optimizer, "use_combined_accum", False))


def wrapper_options(options: Options, training: bool,
                    optimizer: Optional[torch.optim.Optimizer]) -> Options:
    """``options`` (frozen), or a frozen copy with the implicit choices made."""
    options._freeze()  # pylint: disable=protected-access
    default_mode = options.defaultOutputMode()
    running = (training and needs_running_mean(optimizer)
               and options.Training.mean_reduction_strategy != MeanReductionStrategy.Running)
    if not (default_mode or running):
        return options
    resolved = options.clone()
    # The same strategy object: changes to it before the first call count.
    resolved._values["execution_strategy"] = options.execution_strategy  # pylint: disable=protected-access
    if default_mode:
        resolved.outputMode(OutputMode.Final if training else OutputMode.All)
    if running:
        resolved.Training.setMeanAccumulationAndReplicationReductionStrategy(
            MeanReductionStrategy.Running)
    resolved._freeze()  # pylint: disable=protected-access
    return resolved


def check_compiled_strategy(options: Options, optimizer: torch.optim.Optimizer) -> None:
    """setOptimizer after compiling: the compiled step's accumulators keep
    their strategy, so an optimiser that needs another one is refused."""
    strategy = options.Training.mean_reduction_strategy
    if needs_running_mean(optimizer) and strategy != MeanReductionStrategy.Running:
        # PopTorch's words first ("... is already compiled"), as a ValueError.
        raise ValueCompatibleError(
            "setOptimizer: the model is already compiled with "
            f"Training.meanAccumulationAndReplicationReductionStrategy "
            f"MeanReductionStrategy.{strategy.name}, but the new optimiser's float16 "
            "accumulators (accum_type) need MeanReductionStrategy.Running: wrap the model "
            "again with the new optimiser")


class MeanFactors(NamedTuple):
    """Where a training step divides by the number of gradients it reduces."""
    loss: float  # times the loss before the backward pass (PostAndLoss)
    update: float  # times the accumulated gradients at the update
    running: bool  # whether the accumulators hold the running mean


def mean_factors(options: Options, accumulation: int, replicas: int,
                 processes: int) -> MeanFactors:
    """The factors of ``Training.accumulationAndReplicationReductionType`` and
    its mean strategy, for ``accumulation`` micro-batches on each of
    ``replicas`` replicas in each of ``processes`` processes. Replicas of one
    process accumulate into the same accumulators; processes sum theirs
    before the update."""
    training = options.Training
    if training.accumulation_and_replication_reduction_type != ReductionType.Mean:
        return MeanFactors(1.0, 1.0, False)
    strategy = training.mean_reduction_strategy
    if strategy == MeanReductionStrategy.Running:
        return MeanFactors(1.0, 1.0 / processes, True)
    if strategy == MeanReductionStrategy.PostAndLoss:
        return MeanFactors(1.0 / (replicas * processes), 1.0 / accumulation, False)
    return MeanFactors(1.0, 1.0 / (accumulation * replicas * processes), False)
