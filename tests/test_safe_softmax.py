"""poptorch::_safe_softmax (csrc/kernels/safe_softmax.cpp), which compiled
programs run for float32 aten::_safe_softmax (captured whole, then
passes::useOwnKernels): the softmax of attention's math path (attention with
dropout), whose rows of -inf alone give zeros. Its values are the CPU's bit for
bit, in every layout and dtype (other than a contiguous float32 reduced along
its last dimension: the CPU's kernel), and a lazy graph and a trained model
with attention and dropout run it and match the CPU."""
import pytest
import torch
from torch import nn

import poptorch
from conftest import train_micro_batches_beside_the_cpu

ops = torch.ops.poptorch
INF = float("inf")


def _assert_bitwise(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    assert torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))


def _masked(shape, seed: int = 0) -> torch.Tensor:
    """Random rows, some of -inf alone, some partly -inf, one with a NaN and
    one with +inf."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 3
    rows = x.view(-1, shape[-1])
    if rows.shape[0] >= 5:
        rows[0] = -INF
        rows[1, ::2] = -INF
        rows[2, 1:] = -INF
        rows[3, -1] = float("nan")
        rows[4, 0] = INF
        rows[-1] = -INF
    return x


@pytest.mark.parametrize("shape", [(1,), (7,), (5, 1), (6, 9), (2, 3, 4, 33), (8, 4, 128, 128)])
def test_values_are_the_cpus(shape):
    x = _masked(shape)
    _assert_bitwise(ops._safe_softmax(x, -1), torch.ops.aten._safe_softmax(x, -1))


def test_rows_of_minus_infinity_alone_are_zero():
    x = torch.tensor([[-INF, -INF, -INF], [0.0, -INF, 1.0]])
    got = ops._safe_softmax(x, 1)
    assert torch.equal(got[0], torch.zeros(3))
    assert torch.equal(got[1], torch.softmax(x[1], 0))


@pytest.mark.parametrize("case", ["other dim", "transposed", "float64", "half", "dtype"])
def test_other_layouts_and_dtypes_are_the_cpus(case):
    x = _masked((6, 7, 9))
    args = {"other dim": (x, 1), "transposed": (x.transpose(0, 2), -1),
            "float64": (x.double(), -1), "half": (x.half(), 2),
            "dtype": (x, -1, torch.float64)}[case]
    _assert_bitwise(ops._safe_softmax(*args), torch.ops.aten._safe_softmax(*args))


def test_empty_tensors_are_the_cpus():
    for shape in [(0, 5), (3, 0)]:
        x = torch.randn(shape)
        _assert_bitwise(ops._safe_softmax(x, -1), torch.ops.aten._safe_softmax(x, -1))


def _ran(fn, *args):
    with torch.profiler.profile() as prof:
        out = fn(*args)
    names = {e.name for e in prof.events()}
    # aten::_safe_softmax itself is the call on ipu tensors (capture).
    return out, {n for n in names
                 if n in ("poptorch::_safe_softmax", "aten::isneginf", "aten::all", "aten::where")}


def test_a_lazy_graph_runs_it_forward_and_backward_and_matches_the_cpu():
    x = _masked((2, 3, 8, 8), seed=1)
    grad = torch.randn(2, 3, 8, 8)

    def softmax_and_gradient(t, g):
        t = t.clone().requires_grad_()
        out = torch.ops.aten._safe_softmax(t, -1)
        out.backward(g)
        return out.detach().cpu(), t.grad.cpu()

    (out, grad_in), ran = _ran(softmax_and_gradient, x.to("ipu"), grad.to("ipu"))
    want_out, want_grad = softmax_and_gradient(x, grad)
    _assert_bitwise(out, want_out)
    torch.testing.assert_close(grad_in, want_grad, rtol=0, atol=0, equal_nan=True)
    # poptorch's kernel ran, not aten's decomposition.
    assert ran == {"poptorch::_safe_softmax"}


class _Attention(nn.Module):
    """Attention as its math path computes it, with a query row that sees no key."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, y):
        q = self.proj(x)
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        mask[0] = False
        scores = (q @ q.transpose(-2, -1)).masked_fill(~mask, -INF)
        out = torch.ops.aten._safe_softmax(scores, -1) @ q
        return out, nn.functional.mse_loss(out, y)


def test_a_model_with_it_trains_and_infers_like_the_cpu():
    torch.manual_seed(0)
    x, y = torch.randn(4 * 2, 2, 6, 8), torch.randn(4 * 2, 2, 6, 8)
    ipu = _Attention()
    cpu = train_micro_batches_beside_the_cpu(ipu, x, y)
    inference = poptorch.inferenceModel(ipu.eval(), poptorch.Options().deviceIterations(4))
    torch.testing.assert_close(inference(x, y)[0], cpu(x, y)[0].detach())


def test_attention_with_dropout_runs_it():
    # The CPU's flash kernel takes no dropout: the math path's safe softmax.
    q = torch.randn(2, 3, 16, 8, device="ipu")
    out, ran = _ran(lambda: nn.functional.scaled_dot_product_attention(
        q, q, q, dropout_p=0.5).cpu())
    assert out.isfinite().all()
    assert ran == {"poptorch::_safe_softmax"}
