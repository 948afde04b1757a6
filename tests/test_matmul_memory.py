"""A matrix multiplication's working memory in the memory model, against
hand-computed figures: serializedMatMul's modes and factor, and the available
memory proportion (poptorch.set_available_memory, then
Options.setAvailableMemoryProportion, then PopLibs' 0.6) bound it, and leave
the values as they are.

x [M=32, K=64] @ w [K, N=128] in float32: its IPU needs the operands
rearranged and float32 partials of the result, (M K + K N + M N) x 4 bytes;
the product is the model's output, so nothing else is a temporary."""
import pytest
import torch

import poptorch

M, K, N = 32, 64, 128
CAPACITY = 900 << 20  # POPTORCH_IPU_MEMORY_MB's default
Mode = poptorch.MatMulSerializationMode


class Product(torch.nn.Module):
    def __init__(self, mode=None, factor=0, proportion=None):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(K, N))
        self.mode, self.factor, self.proportion = mode, factor, proportion

    def forward(self, x):
        if self.mode is None:
            y = x @ self.w
        else:
            y = poptorch.serializedMatMul(x, self.w, self.mode, self.factor)
        if self.proportion is not None:
            y = poptorch.set_available_memory(y, self.proportion)
        return y


def _peak(model, opts=None):
    x = torch.randn(M, K)
    wrapped = poptorch.inferenceModel(model, opts)
    torch.testing.assert_close(wrapped(x), x @ model.w.detach(), rtol=1e-5, atol=1e-5)
    return wrapped._peaks["step"]


@pytest.mark.parametrize("mode, factor, elements", [
    (None, 0, M * K + K * N + M * N),
    (Mode.Disabled, 0, M * K + K * N + M * N),
    (Mode.InputChannels, 4, M // 4 * K + K * N + M // 4 * N),  # one part of the rows
    (Mode.ReducingDim, 4, M * K // 4 + K // 4 * N + M * N),  # full partials of the result
    (Mode.OutputChannels, 4, M * K + K * N // 4 + M * N // 4),
])
def test_serialisation_splits_the_working_memory(mode, factor, elements):
    assert _peak(Product(mode, factor)) == [4 * elements]


def test_available_memory_proportion_bounds_the_working_memory():
    # 2**-16 of 900 MiB is 14400 bytes, below the 57344 the product needs.
    assert _peak(Product(proportion=2**-16)) == [14400]
    opts = poptorch.Options().setAvailableMemoryProportion({"IPU0": 2**-16})
    assert _peak(Product(), opts) == [14400]
    # The tensor's own proportion comes first; another IPU's does not apply.
    opts = poptorch.Options().setAvailableMemoryProportion({"IPU0": 2**-16})
    assert _peak(Product(proportion=2**-15), opts) == [28800]
    opts = poptorch.Options().setAvailableMemoryProportion({"IPU1": 2**-16})
    assert _peak(Product(), opts) == [4 * (M * K + K * N + M * N)]
    # Bounded after serialisation: 20480 bytes in parts, above the bound.
    assert _peak(Product(Mode.OutputChannels, 4, proportion=2**-16)) == [14400]
    assert _peak(Product(Mode.OutputChannels, 4, proportion=2**-15)) == [20480]
