"""The user guide's multi-IPU examples (PopTorch's pipeline_simple.py and
phased_execution.py), written the way they use the API, run and give the
CPU's numbers; examples/train_bert_pipelined.py runs to the end."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import poptorch
from conftest import ROOT, run_python


def test_bert_split_with_begin_block():
    """pipeline_simple.py: BeginBlock on encoder layers 0, 2 and 4 of a BERT
    for question answering puts the model on 4 IPUs (random weights here: a
    small config stands in for the pretrained model)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=6,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32)
    torch.manual_seed(0)

    class WrappedModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wrapped = transformers.BertForQuestionAnswering(config).eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.wrapped.forward(input_ids, attention_mask, token_type_ids,
                                        return_dict=False)

        def __getattr__(self, attr):
            try:
                return torch.nn.Module.__getattr__(self, attr)
            except AttributeError:
                return getattr(self.wrapped, attr)

    model = WrappedModel()
    model.bert.encoder.layer[0] = poptorch.BeginBlock(model.bert.encoder.layer[0], ipu_id=1)
    model.bert.encoder.layer[2] = poptorch.BeginBlock(model.bert.encoder.layer[2], ipu_id=2)
    model.bert.encoder.layer[4] = poptorch.BeginBlock(model.bert.encoder.layer[4], ipu_id=3)
    opts = poptorch.Options()
    opts.deviceIterations(4)
    inference_model = poptorch.inferenceModel(model, opts)

    ids = torch.randint(1, 100, (4, 12))
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[2:, 9:] = 0
    types = torch.zeros(4, 12, dtype=torch.long)
    types[:, 6:] = 1
    start, end = inference_model(ids, mask, types)
    with torch.no_grad():
        expected = model(ids, mask, types)
    torch.testing.assert_close(start, expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(end, expected[1], rtol=1e-4, atol=1e-5)
    assert inference_model._step.split.stages == [0, 1, 2, 3]


class Network(torch.nn.Module):
    """pipeline_simple.py's small network, annotated inline or with BlockFunction."""

    def __init__(self, style):
        super().__init__()
        self.layer1 = torch.nn.Linear(5, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = torch.nn.Linear(5, 5)
        self.act = torch.nn.ReLU()
        self.softmax = torch.nn.Softmax(dim=1)
        self.style = style

    def forward(self, x):
        poptorch.Block.useAutoId()
        if self.style == "decorator":
            x = self.block_one(x)
            x = self.block_two(x)
            return self.final_activation(x)
        with poptorch.Block(ipu_id=0):
            x = self.act(self.layer1(x))
        with poptorch.Block(ipu_id=1):
            x = self.act(self.layer2(x))
        with poptorch.Block(ipu_id=2):
            x = self.act(self.layer3(x))
            x = self.act(self.layer4(x))
        with poptorch.Block(ipu_id=3):
            x = self.softmax(x)
        return x

    @poptorch.BlockFunction(ipu_id=0)
    def block_one(self, x):
        return self.act(self.layer2(self.act(self.layer1(x))))

    @poptorch.BlockFunction(ipu_id=1)
    def block_two(self, x):
        return self.act(self.layer4(self.act(self.layer3(x))))

    @poptorch.BlockFunction(ipu_id=1)
    def final_activation(self, x):
        return self.softmax(x)


@pytest.mark.parametrize("style", ["inline", "decorator"])
def test_small_network_annotated(style):
    model = Network(style)
    opts = poptorch.Options()
    opts.deviceIterations(4)
    poptorch_model = poptorch.inferenceModel(model, options=opts)
    x = torch.rand((4, 5))
    torch.testing.assert_close(poptorch_model(x), model(x))
    stages = {"inline": [0, 1, 2, 3], "decorator": [0, 1]}[style]
    assert poptorch_model._step.split.stages == stages


N = 3
SIZE = 10


class PhasedModel(torch.nn.Module):
    """phased_execution.py's model: 2 matmuls per phase, alternating between
    two IPUs, with f-string block ids."""

    def __init__(self):
        super().__init__()
        self.weights = []
        for n in range(N * 6):
            weight = torch.nn.Parameter(torch.rand(SIZE, SIZE), requires_grad=True)
            self.register_parameter(f"w{n}", weight)
            self.weights.append(weight)

    def forward(self, in0, target=None):
        phase = 0
        weight = iter(self.weights)
        with poptorch.Block("phase0_ipu0"):
            ins = torch.split(in0, SIZE)
        for n in range(N * 3):
            out = []
            for ipu in range(2):
                x = ins[ipu]
                with poptorch.Block(f"phase{phase}_ipu{ipu}"):
                    x = torch.matmul(next(weight), x)
                    out.append(F.relu(x))
            ins = out[1], out[0]
            if n % 3 != 1:
                phase += 1
        with poptorch.Block(f"phase{N * 2 - 1}_ipu1"):
            res = ins[0] + ins[1]
            if target is None:
                return res
            return res, torch.nn.L1Loss(reduction="mean")(res, target)


def test_parallel_phased_training_with_fstring_ids():
    torch.manual_seed(0)
    model = PhasedModel()
    reference = PhasedModel()
    reference.load_state_dict(model.state_dict())
    opts = poptorch.Options()
    phases = []
    for n in range(N):
        phases.append([poptorch.Stage(f"phase{2 * n}_ipu0").ipu(0),
                       poptorch.Stage(f"phase{2 * n}_ipu1").ipu(2)])
        phases.append([poptorch.Stage(f"phase{2 * n + 1}_ipu0").ipu(1),
                       poptorch.Stage(f"phase{2 * n + 1}_ipu1").ipu(3)])
    opts.setExecutionStrategy(poptorch.ParallelPhasedExecution(*phases))
    poptorch_model = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    data, target = torch.rand(SIZE * 2, 1), torch.rand(SIZE, 1)
    poptorch_model.compile(data, target)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    for _ in range(3):
        _, loss = poptorch_model(data, target)
        optimizer.zero_grad()
        _, ref_loss = reference(data, target)
        ref_loss.backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-5, atol=1e-6)
    phases_run = {(phase, ipu) for op, _, _, phase, ipu in poptorch_model._step.placements
                  if op == "aten::mm"}
    assert phases_run == {(p, ipu) for p in range(6) for ipu in ((0, 2) if p % 2 == 0
                                                                 else (1, 3))}


class ThreeBlocks(torch.nn.Module):
    def forward(self, x, y):
        with poptorch.Block("A"):
            c = x + x
        with poptorch.Block("B"):
            d = y + y
        with poptorch.Block("C"):
            e = x * 3
        return c, d, e


class SixBlocks(torch.nn.Module):
    def __init__(self, auto_id):
        super().__init__()
        self.auto_id = auto_id

    def forward(self, x, y):
        if self.auto_id:
            poptorch.Block.useAutoId()
        ids = iter([None] * 6 if self.auto_id else ["A", "A2", "B", "B2", "C", "C2"])
        with poptorch.Block(next(ids)):
            c = x + x
        with poptorch.Block(next(ids)):
            d = y + y
        with poptorch.Block(next(ids)):
            e = c + d
        with poptorch.Block(next(ids)):
            f = y + d
        with poptorch.Block(next(ids)):
            g = e + f
        with poptorch.Block(next(ids)):
            h = f + y
        return g, h


def _run(model, strategy, auto_round=False):
    opts = poptorch.Options()
    opts.autoRoundNumIPUs(auto_round)
    opts.setExecutionStrategy(strategy)
    x, y = torch.rand(SIZE * 2, 1), torch.rand(SIZE * 2, 1)
    m = poptorch.inferenceModel(model, opts)
    m.compile(x, y)
    for got, expected in zip(m(x, y), model(x, y)):
        torch.testing.assert_close(got, expected)
    placements = {(op, phase, ipu) for op, _, _, phase, ipu in m._step.placements}
    m.destroy()
    return placements


def test_stages_of_a_phase():
    first = poptorch.Phase(poptorch.Stage("A").ipu(0))
    second = poptorch.Phase(poptorch.Stage("B").ipu(1), poptorch.Stage("C").ipu(3))
    placements = _run(ThreeBlocks(), poptorch.ParallelPhasedExecution(first, second),
                      auto_round=True)
    assert placements == {("aten::add.Tensor", 0, 0), ("aten::add.Tensor", 1, 1),
                          ("aten::mul.Tensor", 1, 3)}


def test_serial_phased_execution():
    strategy = poptorch.SerialPhasedExecution(
        poptorch.Phase(poptorch.Stage("A"), poptorch.Stage("A2")),
        poptorch.Phase(poptorch.Stage("B"), poptorch.Stage("B2")),
        poptorch.Phase(poptorch.Stage("C"), poptorch.Stage("C2")))
    strategy.phase(0).ipus(0, 1)
    strategy.phase(1).ipus(0, 1)
    strategy.phase(2).ipus(0, 1)
    placements = _run(SixBlocks(auto_id=False), strategy)
    assert {(phase, ipu) for _, phase, ipu in placements} == {
        (p, ipu) for p in range(3) for ipu in (0, 1)}


def test_parallel_phased_execution_with_auto_ids():
    strategy = poptorch.ParallelPhasedExecution(
        poptorch.Phase(poptorch.Stage("0"), poptorch.Stage("1")),
        poptorch.Phase(poptorch.Stage("2"), poptorch.Stage("3")),
        poptorch.Phase(poptorch.Stage("4"), poptorch.Stage("5")))
    strategy.phase(0).ipus(0, 2)
    strategy.phase(1).ipus(1, 3)
    strategy.phase(2).ipus(0, 2)
    placements = _run(SixBlocks(auto_id=True), strategy)
    assert {(phase, ipu) for _, phase, ipu in placements} == {
        (0, 0), (0, 2), (1, 1), (1, 3), (2, 0), (2, 2)}


@pytest.mark.slow
def test_train_bert_pipelined_example():
    """examples/train_bert_pipelined.py trains a BERT pipelined over 4 IPUs to the
    end, with a progress bar, a finite loss and each IPU holding its share."""
    pytest.importorskip("transformers")
    example = ROOT / "examples" / "train_bert_pipelined.py"
    result = run_python(f"import runpy, sys; sys.argv = [{str(example)!r}]; "
                        f"runpy.run_path({str(example)!r}, run_name='__main__')",
                        env={"POPTORCH_NUM_IPUS": "4"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training: 100%" in result.stderr  # tqdm writes its bar to stderr
    loss = re.search(r"^Final loss: (\S+)$", result.stdout, re.M)
    assert loss is not None, result.stdout
    assert math.isfinite(float(loss.group(1)))
    memory = {int(i): int(b) for i, b in
              re.findall(r"^IPU (\d) memory: .* \((\d+) bytes\)$", result.stdout, re.M)}
    assert sorted(memory) == [0, 1, 2, 3], result.stdout
    assert all(b > 0 for b in memory.values()), memory
    # Layers 1 and 2 are alike; IPU 0 also holds the embeddings.
    assert memory[1] == memory[2] < memory[0], memory
