"""poptorch::max_pool2d_with_indices and its backward (csrc/kernels/max_pool.cpp),
which compiled programs run for float32 aten::max_pool2d_with_indices and its
backward (passes::useOwnKernels): 2x2 windows with stride 2 over NCHW tensors,
eight windows per AVX2 pass. Values, indices and gradients bit for bit the
CPU's, for every width (the last eight windows of a row may overlap the ones
before), odd sizes, ties, signed zeros, infinities and NaNs; other poolings,
dtypes and layouts run the CPU's kernels; graphs and a trained model with
pooling match the CPU."""
import pytest
import torch
from torch import nn

import poptorch
from conftest import train_micro_batches_beside_the_cpu

ops = torch.ops.poptorch
aten = torch.ops.aten

# Widths with fewer than eight windows, exactly eight, a multiple, and tails.
SHAPES = [(16, 5, 26, 26), (2, 3, 9, 9), (1, 1, 2, 2), (3, 2, 6, 40), (4, 7, 17), (1, 2, 5, 16),
          (2, 1, 4, 34), (1, 1, 3, 3)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _assert_bitwise(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(_bits(got), _bits(want))


def _special(shape, seed: int = 0) -> torch.Tensor:
    """Values from a small set, so that windows hold ties, signed zeros,
    infinities and NaNs."""
    values = torch.tensor([float("-inf"), -1.0, -0.0, 0.0, 1.0, float("inf"), float("nan")])
    pick = torch.randint(0, len(values), shape, generator=torch.Generator().manual_seed(seed))
    return values[pick]


def _inputs(shape):
    return [torch.randn(shape, generator=torch.Generator().manual_seed(1)), _special(shape),
            torch.full(shape, float("-inf")), torch.zeros(shape).neg()]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_values_and_indices_are_the_cpus(shape, ceil_mode):
    for x in _inputs(shape):
        got = ops.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode)
        want = aten.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode)
        _assert_bitwise(got[0], want[0])
        assert torch.equal(got[1], want[1])


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_are_the_cpus(shape):
    for x in _inputs(shape):
        _, indices = aten.max_pool2d_with_indices(x, [2], [], [0], [1], False)
        for grad in (torch.randn(indices.shape), _special(indices.shape, seed=3)):
            got = ops.max_pool2d_with_indices_backward(grad, x, [2], [], [0], [1], False, indices)
            want = aten.max_pool2d_with_indices_backward(grad, x, [2], [], [0], [1], False,
                                                         indices)
            _assert_bitwise(got, want)


def test_gradient_out_tensors():
    x = torch.randn(2, 3, 10, 18)
    _, indices = aten.max_pool2d_with_indices(x, [2, 2])
    grad = torch.randn(indices.shape)
    want = aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                 indices)
    # Resized from empty, written over, and a transposed one (the CPU's kernel).
    for out in (torch.empty(0), torch.full(x.shape, 7.0),
                torch.empty(2, 3, 18, 10).transpose(2, 3)):
        got = ops.max_pool2d_with_indices_backward.grad_input(grad, x, [2, 2], [2, 2], [0, 0],
                                                              [1, 1], False, indices,
                                                              grad_input=out)
        assert got is out
        torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_indices_the_forward_did_not_make_take_the_cpus_kernel():
    x = torch.randn(2, 3, 8, 20)
    _, indices = aten.max_pool2d_with_indices(x, [2, 2])
    grad = torch.randn(indices.shape)
    for other in (torch.zeros_like(indices), indices.flip(-1)):
        got = ops.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                   other)
        want = aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1],
                                                     False, other)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# (kernel, stride, padding, dilation, ceil_mode): none of them 2x2 windows with stride 2.
OTHER_POOLINGS = [([3, 3], [2, 2], [0, 0], [1, 1], False), ([2, 2], [1, 1], [0, 0], [1, 1], False),
                  ([2, 2], [2, 2], [1, 1], [1, 1], False), ([2, 2], [2, 2], [0, 0], [2, 2], False),
                  ([2, 2], [2, 2], [0, 0], [1, 1], True), ([2, 3], [2, 2], [0, 0], [1, 1], False)]


@pytest.mark.parametrize("args", OTHER_POOLINGS)
def test_other_poolings_are_the_cpus(args):
    x = _special((2, 3, 11, 13))
    got = ops.max_pool2d_with_indices(x, *args)
    want = aten.max_pool2d_with_indices(x, *args)
    _assert_bitwise(got[0], want[0])
    assert torch.equal(got[1], want[1])
    grad = torch.randn(want[0].shape)
    torch.testing.assert_close(ops.max_pool2d_with_indices_backward(grad, x, *args, want[1]),
                               aten.max_pool2d_with_indices_backward(grad, x, *args, want[1]),
                               rtol=0, atol=0)


def test_other_layouts_and_dtypes_are_the_cpus():
    x = torch.randn(2, 3, 12, 20)
    for view in (x.to(memory_format=torch.channels_last), x[:, :, :, 2:], x.double(), x.half(),
                 x.bfloat16()):
        got = ops.max_pool2d_with_indices(view, [2, 2])
        want = aten.max_pool2d_with_indices(view, [2, 2])
        assert got[0].dtype == want[0].dtype and got[0].stride() == want[0].stride()
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        assert torch.equal(got[1], want[1])


def test_errors_are_the_cpus():
    for x, kernel in ((torch.randn(2, 3, 1, 8), [2, 2]), (torch.randn(2, 8), [2, 2]),
                      (torch.randn(2, 3, 8, 8), [2, 2, 2])):
        with pytest.raises(RuntimeError) as want:
            aten.max_pool2d_with_indices(x, kernel)
        with pytest.raises(RuntimeError) as got:
            ops.max_pool2d_with_indices(x, kernel)
        assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]


def _ran(fn, *args):
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, {e.name for e in prof.events() if e.name.startswith("poptorch::max_pool")}


def test_a_lazy_graph_runs_it_forward_and_backward_and_matches_the_cpu():
    x = _special((4, 5, 14, 22), seed=5)
    grad = torch.randn(4, 5, 7, 11)

    def pool_and_gradient(t, g):
        t = t.clone().requires_grad_()
        out = nn.functional.max_pool2d(t, 2)
        out.backward(g)
        return out.detach().cpu(), t.grad.cpu()

    (out, grad_in), ran = _ran(pool_and_gradient, x.to("ipu"), grad.to("ipu"))
    want_out, want_grad = pool_and_gradient(x, grad)
    _assert_bitwise(out, want_out)
    _assert_bitwise(grad_in, want_grad)
    assert ran == {"poptorch::max_pool2d_with_indices",
                   "poptorch::max_pool2d_with_indices_backward"}


class _PoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 9 * 9, 3)

    def forward(self, x, y):
        out = self.fc(torch.flatten(nn.functional.max_pool2d(torch.relu(self.conv(x)), 2), 1))
        return out, nn.functional.cross_entropy(out, y)


def test_training_and_inference_models_with_pooling_match_the_cpu():
    torch.manual_seed(0)
    x, y = torch.randn(4 * 6, 1, 20, 20), torch.randint(0, 3, (4 * 6,))
    ipu = _PoolNet()
    cpu = train_micro_batches_beside_the_cpu(ipu, x, y)
    inference = poptorch.inferenceModel(ipu.eval(), poptorch.Options().deviceIterations(4))
    torch.testing.assert_close(inference(x, y)[0], cpu(x, y)[0].detach())
