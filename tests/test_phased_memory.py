"""Memory per IPU of phased execution, against hand-computed figures.

Weights, optimiser state and accumulators live in the streaming memory
attached to their IPU and take the IPU's memory only in the phases that use
them (compiler/strategy_memory.cpp; the liveness rules are checked on a
hand-built program in tests/cpp/strategy_memory_test.cpp)."""
import gc

import torch

import poptorch
from conftest import run_python
from test_multi_ipu_memory import LAYER_BYTES, WIDTH, Chain


def _memory():
    # Tensors of earlier tests held only by reference cycles (test_wrapper_options leaves
    # 172 bytes on ipu 0) would otherwise be freed by a collection during compile
    gc.collect()
    return [(torch.ipu.memory_allocated(i), poptorch._C.streaming_memory_allocated(i))
            for i in range(4)]


def test_phases_bring_in_their_weights_one_phase_at_a_time():
    # Four phases on ipu 0, one layer each. Each layer's output (32 rows x
    # 256 float32 = 32768 bytes) is a temporary until the next layer has
    # read it: the peak is one layer's weights, two outputs and the working
    # memory of the layer's matmul.
    model = Chain()
    for i, layer in enumerate(model.layers):
        poptorch.BeginBlock(layer, user_id=str(i), ipu_id=0)
    strategy = poptorch.SerialPhasedExecution(*(poptorch.Phase(str(i)) for i in range(4)))
    for i in range(4):
        strategy.phase(i).ipus(0)
    opts = poptorch.Options().deviceIterations(4).setExecutionStrategy(strategy)
    phased = poptorch.inferenceModel(model, opts)
    x = torch.randn(4 * 32, WIDTH)
    before = _memory()
    phased.compile(x)
    after = _memory()
    out = 32 * WIDTH * 4
    io = 2 * out  # the micro-batch's input and output, held on ipu:0
    assert after[0][0] - before[0][0] == io
    assert after[0][1] - before[0][1] == 4 * LAYER_BYTES  # streamed, not on the chip
    matmul = (32 * WIDTH + WIDTH * WIDTH + 32 * WIDTH) * 4  # see test_matmul_memory.py
    assert phased._peaks["step"] == [LAYER_BYTES + 2 * out + matmul]
    assert phased._step.temporary_peaks == [2 * out]
    torch.testing.assert_close(phased(x), Chain()(x))


TRAIN = """
import torch, poptorch
WIDTH = 1024
class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(4))
    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x.sum()
def train(strategy, blocks):
    model = Chain()
    for i, layer in enumerate(model.layers):
        poptorch.BeginBlock(layer, user_id=str(i), ipu_id=blocks[i])
    opts = poptorch.Options().setExecutionStrategy(strategy)
    opts.Training.gradientAccumulation(8)
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    torch.manual_seed(1)
    loss = training(torch.randn(16, WIDTH))
    return training, model, loss
try:
    train(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), [0, 0, 1, 1])
except poptorch.Error as e:
    print("PIPELINED:", e)
strategy = poptorch.ParallelPhasedExecution(*(poptorch.Phase(str(i)) for i in range(4)))
strategy.sendTensorsOffChipAfterFwd()
for i in range(4):
    strategy.phase(i).ipus(i % 2)
training, model, loss = train(strategy, [0, 1, 0, 1])
print("ON CHIP:", [torch.ipu.memory_allocated(i) for i in range(2)])
print("STREAMED:", [poptorch._C.streaming_memory_allocated(i) for i in range(2)])
torch.save({"loss": loss, "state": model.state_dict()}, OUT)
"""


def test_a_model_too_big_to_pipeline_fits_phased(tmp_path):
    # Per layer: (1024 x 1024 + 1024) x 4 bytes = 4198400 (4.0 MiB), three
    # times with SGD momentum and gradient accumulation. Pipelined over 2
    # 20 MiB IPUs, each holds two layers: 24.0 MiB. Phased over the same 2
    # IPUs (phases 0 and 2 on ipu 0, 1 and 3 on ipu 1), each IPU brings in
    # one layer's weight, momentum and accumulator at a time.
    out = tmp_path / "phased.pt"
    result = run_python(f"OUT = {str(out)!r}\n" + TRAIN, env={"POPTORCH_IPU_MEMORY_MB": "20"})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "PIPELINED: IPU out of memory" in text, text
    layer = (1024 * 1024 + 1024) * 4
    streamed = eval(text.split("STREAMED:")[1].splitlines()[0])
    assert streamed == [2 * (3 * layer + 8)] * 2, text  # + a float32 step count per parameter
    on_chip = eval(text.split("ON CHIP:")[1].splitlines()[0])
    assert on_chip[1] == 0 and on_chip[0] < layer, text

    # The same numbers as the unannotated model on one IPU.
    phased = torch.load(out)
    model = Chain(loss=True, width=1024)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(8)
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    torch.manual_seed(1)
    loss = training(torch.randn(16, 1024))
    torch.testing.assert_close(phased["loss"], loss, rtol=1e-5, atol=0)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(phased["state"][name], value, rtol=1e-5, atol=1e-6)
