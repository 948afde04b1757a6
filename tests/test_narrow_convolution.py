"""poptorch::convolution and its backward (csrc/kernels/narrow_convolution.cpp),
which compiled programs run for float32 NCHW convolutions with fewer than 16
channels in and out, unit stride and dilation, any padding
(passes::useOwnKernels): an im2col per image and MKL's GEMM. They sum in
another order than the CPU's oneDNN kernels, so values are compared with the
CPU's within float32 tolerance widened by the CPU's own rounding error (its
distance from the same convolution in float64); other convolutions, which the
pass leaves to oneDNN, give the CPU's values bit for bit when the op is called
with them. Trained models (trainingModel and torch.compile) match the CPU."""
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import poptorch
from conftest import compiled_steps_beside_the_cpu, train_micro_batches_beside_the_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from classification_model import ClassificationModel  # noqa: E402

ops = torch.ops.poptorch
aten = torch.ops.aten

# (batch, in channels, height, width, out channels, kernel (h, w), padding):
# the seed CNN's two convolutions, padding, rectangular kernels and images,
# kernels wider than the padded image's edge, the channel limits, one image.
NARROW = [
    (16, 1, 28, 28, 5, (3, 3), 0),
    (16, 5, 13, 13, 12, (5, 5), 0),
    (3, 3, 10, 12, 8, (3, 3), 1),
    (5, 2, 7, 9, 3, (3, 2), 2),
    (2, 3, 5, 5, 4, (5, 5), 3),
    (1, 15, 6, 4, 15, (3, 3), 1),
    (2, 4, 3, 20, 6, (1, 7), 0),
    (2, 2, 1, 1, 3, (1, 1), 0),
]


def _tensors(n, c, h, w, out, kernel, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, c, h, w, generator=g), torch.randn(out, c, *kernel, generator=g),
            torch.randn(out, generator=g))


def _args(padding, stride=1, dilation=1, transposed=False, groups=1):
    return ([stride, stride], [padding, padding], [dilation, dilation], transposed, [0, 0], groups)


def _assert_close_to_the_cpu(got, cpu, cpu64):
    """Within float32 tolerance of the CPU's value, widened by twice the CPU's
    own error against float64 (sums of thousands of products round apart)."""
    slack = 2 * (cpu.double() - cpu64).abs().max().item() if cpu.numel() else 0.0
    torch.testing.assert_close(got, cpu, atol=1e-5 + slack, rtol=1.3e-6)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", NARROW)
@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_are_the_cpus(case, bias, threads):
    *shape, padding = case
    x, w, b = _tensors(*shape)
    b = b if bias else None
    args = _args(padding)
    got = ops.convolution(x, w, b, *args)
    want = aten.convolution(x, w, b, *args)
    b64 = b.double() if bias else None
    _assert_close_to_the_cpu(got, want, aten.convolution(x.double(), w.double(), b64, *args))
    assert got.shape == want.shape and got.stride() == want.stride()
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    bias_sizes = [w.shape[0]] if bias else None
    mask = [True, True, True]
    got = ops.convolution_backward(grad, x, w, bias_sizes, *args, mask)
    want = aten.convolution_backward(grad, x, w, bias_sizes, *args, mask)
    want64 = aten.convolution_backward(grad.double(), x.double(), w.double(), bias_sizes, *args,
                                       mask)
    for g, c, c64 in zip(got, want, want64):
        assert g.shape == c.shape and g.stride() == c.stride()
        _assert_close_to_the_cpu(g, c, c64)


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, False], [False, False, True],
                                  [True, False, True], [False, True, True]])
def test_the_gradients_the_mask_asks_for_are_the_cpus(mask):
    x, w, _ = _tensors(4, 5, 13, 13, 12, (5, 5))
    grad = torch.randn(4, 12, 9, 9, generator=torch.Generator().manual_seed(1))
    args = _args(0)
    got = ops.convolution_backward(grad, x, w, [12], *args, mask)
    want = aten.convolution_backward(grad, x, w, [12], *args, mask)
    # oneDNN gives the weight's gradient with the bias's even when not asked: so does poptorch.
    assert [t is None for t in got] == [t is None for t in want]
    full = aten.convolution_backward(grad.double(), x.double(), w.double(), [12], *args,
                                     [True, True, True])
    for g, c, c64 in zip(got, want, full):
        if c is not None:
            _assert_close_to_the_cpu(g, c, c64)


def test_gradients_do_not_read_the_memory_they_are_written_to():
    """The results are allocated uninitialised: memory that held NaN just before
    (freed, and reused by the allocator for a result of the same size) must not
    leak into a sum."""
    x, w, _ = _tensors(4, 5, 13, 13, 12, (5, 5))
    grad = torch.randn(4, 12, 9, 9, generator=torch.Generator().manual_seed(1))
    args = _args(0)
    want = aten.convolution_backward(grad, x, w, [12], *args, [True, True, True])
    for _ in range(20):
        for shape in (x.shape, w.shape, (12,)):
            torch.full(shape, float("nan"))
        got = ops.convolution_backward(grad, x, w, [12], *args, [True, True, True])
        for g, c in zip(got, want):
            torch.testing.assert_close(g, c, atol=1e-3, rtol=1e-4)


# Convolutions the narrow kernels do not take: they run the CPU's.
REFUSED = {
    "stride": ((2, 3, 9, 9, 4, (3, 3)), _args(0, stride=2)),
    "dilation": ((2, 3, 9, 9, 4, (3, 3)), _args(0, dilation=2)),
    "groups": ((2, 4, 9, 9, 4, (3, 3)), _args(0, groups=2)),
    "transposed": ((2, 3, 9, 9, 4, (3, 3)), _args(0, transposed=True)),
    "16 in": ((2, 16, 9, 9, 4, (3, 3)), _args(0)),
    "16 out": ((2, 3, 9, 9, 16, (3, 3)), _args(0)),
}


@pytest.mark.parametrize("name", REFUSED)
def test_other_convolutions_give_the_cpus_values_bitwise(name):
    shape, args = REFUSED[name]
    x, w, b = _tensors(*shape)
    if args[5] > 1:
        w = w[:, : shape[1] // args[5]].contiguous()
    if args[3]:
        w = w.transpose(0, 1).contiguous()
        b = torch.randn(w.shape[1])
    want = aten.convolution(x, w, b, *args)
    assert torch.equal(ops.convolution(x, w, b, *args), want)
    grad = torch.randn(want.shape)
    got = ops.convolution_backward(grad, x, w, [b.shape[0]], *args, [True, True, True])
    for g, c in zip(got, aten.convolution_backward(grad, x, w, [b.shape[0]], *args,
                                                   [True, True, True])):
        assert torch.equal(g, c)


def test_other_dtypes_and_layouts_give_the_cpus_values_bitwise():
    x, w, b = _tensors(2, 3, 9, 9, 4, (3, 3))
    args = _args(1)
    for xs, ws, bs in [(x.double(), w.double(), b.double()),
                       (x.to(memory_format=torch.channels_last), w, b)]:
        want = aten.convolution(xs, ws, bs, *args)
        got = ops.convolution(xs, ws, bs, *args)
        assert torch.equal(got, want) and got.stride() == want.stride()


def _ran(fn, *args):
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, {e.name for e in prof.events()}


class _Convolutions(nn.Module):
    def __init__(self, conv: nn.Module, classes: int = 3):
        super().__init__()
        self.conv, self.head = conv, nn.LazyLinear(classes)

    def forward(self, x, y):
        out = self.head(torch.flatten(torch.relu(self.conv(x)), 1))
        return out, nn.functional.cross_entropy(out, y)


def test_the_seed_cnn_trains_with_narrow_convolutions_and_matches_the_cpu():
    torch.manual_seed(0)

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = ClassificationModel()

        def forward(self, x, y):
            out = self.model(x)
            return out, nn.functional.nll_loss(out, y)

    x, y = torch.randn(4 * 8, 1, 28, 28), torch.randint(0, 10, (4 * 8,))
    _, ran = _ran(train_micro_batches_beside_the_cpu, WithLoss(), x, y)
    assert {"poptorch::convolution", "poptorch::convolution_backward"} <= ran


@pytest.mark.parametrize("conv", [nn.Conv2d(3, 16, 3), nn.Conv2d(16, 4, 3),
                                  nn.Conv2d(3, 4, 3, stride=2), nn.Conv2d(3, 4, 3, dilation=2),
                                  nn.Conv2d(4, 4, 3, groups=2)],
                         ids=["16 out", "16 in", "stride", "dilation", "groups"])
def test_a_training_model_leaves_other_convolutions_to_onednn(conv):
    torch.manual_seed(0)
    x, y = torch.randn(4 * 2, conv.in_channels, 11, 11), torch.randint(0, 3, (4 * 2,))
    model = _Convolutions(conv)
    model(x, y)  # sizes the lazy head
    _, ran = _ran(train_micro_batches_beside_the_cpu, model, x, y)
    assert "poptorch::convolution" not in ran and "poptorch::convolution_backward" not in ran


def test_a_compiled_training_step_runs_narrow_convolutions_and_matches_the_cpu():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(6 * 8 * 8, 3))
    x, y = torch.randn(8, 2, 8, 8), torch.randint(0, 3, (8,))
    ran = compiled_steps_beside_the_cpu(cpu, x, y)
    assert {"poptorch::convolution", "poptorch::convolution_backward"} <= ran
