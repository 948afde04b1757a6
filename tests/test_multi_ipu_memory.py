"""Memory per IPU of models split over IPUs, against hand-computed figures.

A Linear(256, 256) holds 256 x 256 + 256 float32 = 263168 bytes. Its block's
IPU holds it, with its optimiser state (SGD momentum: as much again, and a
float32 step count per parameter) and its gradient accumulator (as much
again)."""
import re

import torch

import poptorch
from conftest import run_python

WIDTH = 256
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # 263168


class Chain(torch.nn.Module):
    def __init__(self, loss=False, width=WIDTH):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))
        self.loss = loss

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.sum() if self.loss else x


def _split(model):
    for ipu in (1, 2, 3):
        poptorch.BeginBlock(model.layers[ipu], ipu_id=ipu)
    return model


def _allocated():
    return [torch.ipu.memory_allocated(i) for i in range(4)]


def _growth(compile_model):
    """What compiling a model adds to each IPU's memory (the model stays alive:
    its device weights are kept while its host tensors live)."""
    before = _allocated()
    compile_model()
    return [after - b for after, b in zip(_allocated(), before)]


def test_weights_live_on_their_blocks_ipu():
    x = torch.randn(8, WIDTH)
    opts = poptorch.Options().deviceIterations(4)
    plain_model = poptorch.inferenceModel(Chain(), opts)
    plain = _growth(lambda: plain_model.compile(x))
    split_model = poptorch.inferenceModel(_split(Chain()), opts)
    split = _growth(lambda: split_model.compile(x))
    io = 2 * (2 * WIDTH * 4)  # the micro-batch's input and output (2 rows), on ipu:0
    assert plain == [4 * LAYER_BYTES + io, 0, 0, 0]
    assert split == [LAYER_BYTES + io, LAYER_BYTES, LAYER_BYTES, LAYER_BYTES]
    torch.testing.assert_close(split_model(x), Chain()(x))


def test_optimiser_state_and_accumulators_live_with_their_weights():
    opts = poptorch.Options().deviceIterations(1)
    opts.Training.gradientAccumulation(7)  # 4 stages: at least 2 x 4 - 1
    model = _split(Chain(loss=True))
    training = poptorch.trainingModel(model, opts,
                                      torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    growth = _growth(lambda: training(torch.randn(14, WIDTH)))
    # Weight, momentum (and two float32 step counts) and accumulator of each
    # layer on its IPU.
    assert growth[1:] == [3 * LAYER_BYTES + 8] * 3
    assert growth[0] >= 3 * LAYER_BYTES + 8


def test_activations_peak_on_the_ipu_of_their_block():
    # Each layer's output (32 rows x 256 float32 = 32768 bytes) is a temporary
    # on the IPU of the layer that makes it, alive until the next layer has
    # read it; the last layer writes the model's output (not a temporary).
    # (tests/cpp/strategy_memory_test.cpp checks a trained pipeline's stashes.)
    x = torch.randn(4 * 32, WIDTH)
    opts = poptorch.Options().deviceIterations(4)
    plain = poptorch.inferenceModel(Chain(), opts)
    plain.compile(x)
    split = poptorch.inferenceModel(_split(Chain()), opts)
    split.compile(x)
    out = 32 * WIDTH * 4
    assert plain._step.temporary_peaks == [2 * out]
    assert split._step.temporary_peaks == [out, out, out]
    # Pipelined, a layer's output is alive for two micro-batches at once: its
    # stage makes the next micro-batch's while the next stage reads it. Each
    # layer's matmul needs working memory while it runs (its operands
    # rearranged, float32 partials of its result; see test_matmul_memory.py).
    matmul = (32 * WIDTH + WIDTH * WIDTH + 32 * WIDTH) * 4
    assert plain._peaks["step"] == [2 * out + matmul]
    assert split._peaks["step"] == [2 * out + matmul] * 3 + [matmul]


OOM = """
import torch, poptorch
WIDTH = 1024
class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(4))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.sum()
def train(model):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(8)
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    training(torch.randn(16, WIDTH))
    return training
try:
    train(Chain())
except poptorch.Error as e:
    print("ERROR:", e)
print("ALLOCATED AFTER:", torch.ipu.memory_allocated(0))
model = Chain()
for ipu in (1, 2, 3):
    poptorch.BeginBlock(model.layers[ipu], ipu_id=ipu)
training = train(model)
print("SPLIT:", [torch.ipu.memory_allocated(i) for i in range(4)])
"""


def test_a_model_too_big_for_one_ipu_fails_at_compile_and_runs_split():
    # Per layer: (1024 x 1024 + 1024) x 4 bytes = 4198400 bytes (4.0 MiB), three
    # times (weight, momentum, accumulator). The step's gradients are
    # temporaries of the weights' size, and the backward keeps all four alive
    # together. On one 24 MiB IPU: 4 x 3 x 4198400 = 48.05 MiB held (plus the
    # micro-batch and the learning rate), 4 x 4198400 = 16.02 MiB of
    # activations, and while a layer's matmul runs its working memory
    # (test_matmul_memory.py: the weight rearranged, 4.0 MiB): 20.0 MiB.
    # Split over four: each IPU holds 3 x 4198400 (12.0 MiB) and needs its
    # gradient and a matmul's working memory beside it.
    result = run_python(OOM, env={"POPTORCH_IPU_MEMORY_MB": "24"})
    out = result.stdout
    assert "ERROR: IPU out of memory: the model does not fit its IPUs." in out, result.stderr
    line = next(l for l in out.splitlines() if l.strip().startswith("ipu:0:"))
    needed, held, peak, capacity = map(float, re.findall(r"(\d+\.\d) MiB", line))
    assert 48.0 <= held <= 48.2 and peak == 20.0 and capacity == 24.0, line
    assert "<- does not fit" in line and "ipu:1" not in out
    assert "poptorch.BeginBlock" in out
    assert "ALLOCATED AFTER: 0" in out  # the failed compile released the device weights
    split = eval(out.split("SPLIT:")[1])
    layer = (1024 * 1024 + 1024) * 4
    assert split[1:] == [3 * layer + 8] * 3, out  # + a float32 step count per parameter
    assert split[0] >= 3 * layer


def test_recomputation_checkpoint_keeps_values():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            x = poptorch.recomputationCheckpoint(self.a(x))
            y, z = poptorch.recomputationCheckpoint(x * 2, x + 1)
            (w,) = poptorch.recomputationCheckpoint([self.b(y + z)])
            return w.sum()

    model = Model()
    reference = Model()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 4)
    training = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    loss = training(x)
    ref_loss = reference(x)
    ref_loss.backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    torch.testing.assert_close(loss, ref_loss.detach())
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value)
