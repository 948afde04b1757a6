"""The options a wrapped model runs with: PopTorch's implicit output mode and
mean reduction strategy, and what each strategy computes (against the CPU)."""
import pytest
import torch

import poptorch
from poptorch.enums import MeanReductionStrategy, OutputMode


class _Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x, y):
        out = self.lin(x)
        return out, torch.nn.functional.mse_loss(out, y)


def test_output_mode_default_resolved_on_the_wrappers_copy():
    opts = poptorch.Options()
    model = _Regression()
    training = poptorch.trainingModel(model, opts)
    inference = poptorch.inferenceModel(model, opts)
    assert opts.defaultOutputMode()  # the user's object keeps its value
    assert training.options.output_mode == OutputMode.Final
    assert inference.options.output_mode == OutputMode.All
    explicit = poptorch.Options().outputMode(OutputMode.Sum)
    assert poptorch.inferenceModel(model, explicit).options is explicit


@pytest.mark.parametrize("accum_type, training, combined, expected", [
    (torch.float32, True, False, MeanReductionStrategy.Post),
    (torch.float16, True, False, MeanReductionStrategy.Running),
    (torch.float16, True, True, MeanReductionStrategy.Post),  # combined: Post only
    (None, True, False, MeanReductionStrategy.Post),
    (torch.float16, False, False, MeanReductionStrategy.Post),  # inference: unused
])
def test_mean_strategy_chosen_by_the_accumulator_type(accum_type, training, combined,
                                                      expected):
    model = _Regression()
    opts = poptorch.Options()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, accum_type=accum_type,
                                   use_combined_accum=combined)
    wrapped = (poptorch.trainingModel(model, opts, optimizer) if training
               else poptorch.inferenceModel(model, opts))
    assert wrapped.options.Training.meanAccumulationAndReplicationReductionStrategy == expected
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == (
        MeanReductionStrategy.Post)


def _one_update(strategy, replicas):
    """Weights after one update of 4 accumulated micro-batches (of 2 samples)
    per replica, and the CPU's: one SGD step on the mean gradient."""
    model = _Regression()
    x = torch.randn(8 * replicas, 4)
    y = torch.randn(8 * replicas, 2)
    reference = _Regression()
    loss = torch.nn.functional.mse_loss(reference.lin(x), y)
    loss.backward()
    with torch.no_grad():
        expected = reference.lin.weight - 0.1 * reference.lin.weight.grad
    opts = poptorch.Options().replicationFactor(replicas)
    opts.Training.gradientAccumulation(4)
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped(x, y)
    return model.lin.weight.detach(), expected


@pytest.mark.parametrize("strategy", list(MeanReductionStrategy))
@pytest.mark.parametrize("replicas", [1, 2])
def test_mean_strategies_give_the_mean_gradient(strategy, replicas):
    actual, expected = _one_update(strategy, replicas)
    torch.testing.assert_close(actual, expected)


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return (self.w * x).sum(dim=-1).mean()


def test_running_mean_keeps_float16_accumulators_finite():
    # A gradient of 3e4 per micro-batch: the float16 sum of 4 overflows
    # (65504), their running mean does not.
    x = torch.full((8, 2), 3e4)
    reference = _Linear()
    reference(x).backward()
    with torch.no_grad():
        expected = reference.w - 1e-4 * reference.w.grad
    model = _Linear()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=1e-4, accum_type=torch.float16)
    wrapped = poptorch.trainingModel(model, opts, optimizer)
    wrapped(x)
    assert (wrapped.options.Training.meanAccumulationAndReplicationReductionStrategy
            == MeanReductionStrategy.Running)
    torch.testing.assert_close(model.w.detach(), expected)


def test_set_optimizer_and_the_strategy():
    model = _Regression()
    wrapped = poptorch.trainingModel(model, poptorch.Options(),
                                     poptorch.optim.SGD(model.parameters(), lr=0.1))
    half = poptorch.optim.SGD(model.parameters(), lr=0.1, accum_type=torch.float16)
    wrapped.setOptimizer(half)  # not compiled yet: the strategy follows
    assert (wrapped.options.Training.meanAccumulationAndReplicationReductionStrategy
            == MeanReductionStrategy.Running)

    compiled = poptorch.trainingModel(_Regression(), poptorch.Options())
    compiled(torch.randn(2, 4), torch.randn(2, 2))
    # A poptorch.Error that is also the ValueError PopTorch raises, in its words first.
    with pytest.raises(ValueError, match="is already compiled .* need MeanReductionStrategy.Running"
                       ) as raised:
        compiled.setOptimizer(poptorch.optim.SGD(compiled.model.parameters(), lr=0.1,
                                                 accum_type=torch.float16))
    assert isinstance(raised.value, poptorch.Error)
