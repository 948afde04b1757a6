"""PopTorch's rules for models split over IPUs: each broken rule is a
poptorch.Error that says what to change, and the fix it names runs."""
import pytest
import torch

import poptorch


class Chain(torch.nn.Module):
    """Linear layers, each in a block on the IPU given (None: no annotation)."""

    def __init__(self, ipus, scoped=True, stray_op=False):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in ipus)
        self.ipus = ipus
        self.scoped = scoped
        self.stray_op = stray_op

    def forward(self, x):
        poptorch.Block.useAutoId()
        if not self.scoped:
            for layer, ipu in zip(self.layers, self.ipus):
                poptorch.Block.start(ipu_id=ipu)
                x = layer(x)
            return x.sum()
        for layer, ipu in zip(self.layers, self.ipus):
            with poptorch.Block(ipu_id=ipu):
                x = layer(x)
        if self.stray_op:
            x = x * 2  # outside every block
        with poptorch.Block(str(len(self.ipus) - 1), ipu_id=self.ipus[-1]):  # the last block
            return x.sum()


def _options(strategy=None, iterations=1, accumulation=1, auto_round=False):
    opts = poptorch.Options().deviceIterations(iterations).autoRoundNumIPUs(auto_round)
    opts.Training.gradientAccumulation(accumulation)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    return opts


def _train(model, opts):
    training = poptorch.trainingModel(model, opts)
    n = opts.device_iterations * opts.Training.gradient_accumulation * 2
    return training(torch.randn(n, 4))


def _infer(model, opts):
    return poptorch.inferenceModel(model, opts)(torch.randn(opts.device_iterations * 2, 4))


def test_pipelined_training_needs_2_stages_minus_1_accumulation():
    with pytest.raises(poptorch.Error, match=r"gradientAccumulation must be greater than or "
                       r"equal to the number of pipeline stages \(7\).*a model with 4 pipeline "
                       r"stages.*Got 6.*gradientAccumulation\(7\)"):
        _train(Chain([0, 1, 2, 3]), _options(accumulation=6))
    _train(Chain([0, 1, 2, 3]), _options(accumulation=7))
    # Sharded execution runs one stage at a time: no such need.
    _train(Chain([0, 1, 2, 3]), _options(poptorch.ShardedExecution(), accumulation=1))


def test_pipelined_inference_needs_a_batch_per_stage():
    with pytest.raises(poptorch.Error, match=r"deviceIterations must be greater than or equal "
                       r"to the number of pipeline stages \(2\).*Got 1"):
        _infer(Chain([0, 1]), _options())
    _infer(Chain([0, 1]), _options(iterations=2))


@pytest.mark.parametrize("strategy", [None, poptorch.ShardedExecution()])
def test_inference_refuses_gradient_accumulation(strategy):
    opts = _options(strategy, accumulation=2)
    assert isinstance(opts._execution_strategy,  # pylint: disable=protected-access
                      type(strategy or poptorch.PipelinedExecution()))
    with pytest.raises(poptorch.Error, match=r"gradientAccumulation to 1 or leave it as its "
                       r"default value \(1\) when running a poptorch\.inferenceModel\(\)\.") as info:
        poptorch.inferenceModel(Chain([0, 1]), opts)
    assert ("deviceIterations to process" in str(info.value)) == (strategy is None)


def test_ipus_in_powers_of_two():
    with pytest.raises(poptorch.Error, match=r"uses 3 IPUs.*powers of 2.*autoRoundNumIPUs"):
        _infer(Chain([0, 1, 2]), _options(iterations=3))
    _infer(Chain([0, 1, 2]), _options(iterations=3, auto_round=True))


def test_stages_must_ascend_in_a_pipeline():
    # The user guide's example: blocks on IPUs 0, 1, 0 with AutoStage.SameAsIpu.
    with pytest.raises(poptorch.Error, match=r"block '2' is pipeline stage 0 but runs after "
                       r"stage 1.*AutoIncrement"):
        _infer(Chain([0, 1, 0]), _options(iterations=4))
    _infer(Chain([0, 1, 0]), _options(
        poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), iterations=4))
    _infer(Chain([0, 1, 0]), _options(poptorch.ShardedExecution(), iterations=4))


def test_every_op_of_a_block_scoped_model_is_in_a_block():
    with pytest.raises(poptorch.Error, match=r"aten::mul.*after a poptorch.Block scope ended.*"
                       r"BeginBlock"):
        _infer(Chain([0, 1], stray_op=True), _options(iterations=2))
    # Blocks that last until the next one (BeginBlock, Block.start) take what follows.
    _infer(Chain([0, 1], scoped=False), _options(iterations=2))


def test_phase_stages_and_ipus_must_match():
    strategy = poptorch.SerialPhasedExecution(poptorch.Phase(poptorch.Stage("0"),
                                                             poptorch.Stage("1")))
    with pytest.raises(poptorch.Error, match=r"2 stage\(s\).*1 IPU\(s\).*one IPU per stage"):
        strategy.phase(0).ipus(0)
    parallel = poptorch.ParallelPhasedExecution(
        poptorch.Phase(poptorch.Stage("0")), poptorch.Phase(poptorch.Stage("1")))
    parallel.phase(0).ipus(0)
    parallel.phase(1).ipus(2)
    with pytest.raises(poptorch.Error, match=r"block '1' is in phase 1 but on IPU 2: odd "
                       r"phases run on odd IPUs"):
        _infer(Chain([None, None]), _options(parallel))
    parallel.phase(1).ipus(1)
    _infer(Chain([None, None]), _options(parallel))


def test_each_phase_may_be_one_stage_or_one_block_id():
    """A phase given as one Stage or one block id (of any length) is a phase of
    that one stage, as in PopTorch: block ids of several characters were split
    into one block per character and a Stage raised a TypeError."""
    by_stage = poptorch.SerialPhasedExecution(poptorch.Stage("layer1"), poptorch.Stage("layer2"))
    by_id = poptorch.SerialPhasedExecution("layer1", "layer2")
    for strategy in (by_stage, by_id):
        assert [[s.blocks for s in phase.stages] for phase in strategy.phases] == \
            [[("layer1",)], [("layer2",)]]
    parallel = poptorch.ParallelPhasedExecution("0", "1")
    parallel.phase(0).ipus(0)
    parallel.phase(1).ipus(1)
    model = Chain([None, None])
    x = torch.randn(2, 4)
    torch.testing.assert_close(poptorch.inferenceModel(model, _options(parallel))(x), model(x))


def test_cloned_options_keep_their_strategy():
    """opts.clone() copies the strategy with its stages (its maps of the
    stages followed the originals)."""
    parallel = poptorch.ParallelPhasedExecution(
        poptorch.Phase(poptorch.Stage("0")), poptorch.Phase(poptorch.Stage("1")))
    parallel.phase(0).ipus(0)
    parallel.phase(1).ipus(1)
    _infer(Chain([None, None]), _options(parallel).clone())


def test_ipu_beyond_those_available():
    with pytest.raises(poptorch.Error, match=r"block '1' is on IPU 7, but there are 4 IPUs"):
        _infer(Chain([0, 7]), _options(iterations=2))


def test_blocks_need_an_ipu_or_a_stage():
    with pytest.raises(poptorch.Error, match=r"block '0' has no ipu_id.*SameAsIpu"):
        _infer(Chain([None, None]), _options(iterations=2))
    with pytest.raises(poptorch.Error, match=r"block '1' that none of the strategy's stages "
                       r"names"):
        _infer(Chain([None, None]), _options(poptorch.PipelinedExecution("0"), iterations=2))
    phased = poptorch.SerialPhasedExecution(["0"], ["1"])
    with pytest.raises(poptorch.Error, match=r"block '0' of phase 0 has no IPU"):
        _infer(Chain([None, None]), _options(phased))


def test_bad_arguments():
    with pytest.raises(poptorch.Error, match="setExecutionStrategy takes"):
        poptorch.Options().setExecutionStrategy("pipelined")
    with pytest.raises(poptorch.Error, match="block ids"):
        poptorch.Stage(0)
    with pytest.raises(poptorch.Error, match="two stages"):
        poptorch.PipelinedExecution("a", poptorch.Stage("a", "b"))
    with pytest.raises(poptorch.Error, match="ipu_id is an integer"):
        poptorch.Block("a", ipu_id=-1)
    with pytest.raises(poptorch.Error, match="needs its phases"):
        poptorch.SerialPhasedExecution()
    with pytest.raises(poptorch.Error, match="Liveness"):
        poptorch.SerialPhasedExecution(["a"]).setTensorsLiveness(1)
    strategy = poptorch.ParallelPhasedExecution(["a"]).sendTensorsOffChipAfterFwd()
    assert strategy.liveness == poptorch.Liveness.OffChipAfterFwd
    assert strategy.useSeparateBackwardPhase() is strategy
    assert strategy.separate_backward_phase
