"""Zero-element tensors across op families (issue 9: an outside fuzzer feeds them),
in lazy mode and inside a wrapped model, against the CPU: values, shapes, dtypes,
and the CPU's error where it raises one (max/argmax of an empty tensor without a dim;
sum and prod return their identity)."""
import pytest
import torch
import torch.nn.functional as F

import poptorch
from conftest import assert_same

# Host values, moved to the device under test by each case.
EMPTY = torch.randn(0, 3)
FULL = torch.randn(4, 3)
NO_INDEX = torch.zeros(0, dtype=torch.long)


def e(device):
    return EMPTY.to(device)


def full(device):
    return FULL.to(device)


def idx(device, *shape):
    return torch.zeros(shape or (0,), dtype=torch.long, device=device)


CASES = {
    # Pointwise, with broadcasting.
    "exp": lambda d: e(d).exp(),
    "sigmoid of int": lambda d: torch.zeros(0, dtype=torch.int32, device=d).sigmoid(),
    "add broadcast": lambda d: e(d) + FULL[:1].to(d),
    "add 3d broadcast": lambda d: torch.ones(2, 0, 3, device=d) + torch.ones(3, device=d),
    "add mismatch": lambda d: e(d) + full(d),
    "where": lambda d: torch.where(e(d) > 0, e(d), 1.0),
    "add_ in place": lambda d: e(d).add_(1),
    "clamp": lambda d: e(d).clamp(0, 1),
    # Reductions: identities, nan means, and the CPU's errors without a dim.
    "sum": lambda d: e(d).sum(),
    "sum dim 0": lambda d: e(d).sum(0),
    "sum dim 1": lambda d: e(d).sum(1),
    "prod": lambda d: e(d).prod(),
    "prod dim 0": lambda d: e(d).prod(0),
    "mean": lambda d: e(d).mean(),
    "mean dim 0": lambda d: e(d).mean(0),
    "var": lambda d: e(d).var(),
    "std_mean dim 0": lambda d: torch.std_mean(e(d), 0),
    "nansum": lambda d: e(d).nansum(),
    "nanmean": lambda d: e(d).nanmean(),
    "max": lambda d: e(d).max(),
    "min": lambda d: e(d).min(),
    "amax": lambda d: e(d).amax(),
    "argmax": lambda d: e(d).argmax(),
    "aminmax": lambda d: torch.aminmax(e(d)),
    "max dim 0": lambda d: e(d).max(0),
    "max dim 1": lambda d: e(d).max(1),
    "argmin dim 1": lambda d: e(d).argmin(1),
    "amax dim 1": lambda d: e(d).amax(1),
    "all": lambda d: e(d).bool().all(),
    "any dim 0": lambda d: e(d).bool().any(0),
    "logsumexp dim 0": lambda d: e(d).logsumexp(0),
    "softmax": lambda d: e(d).softmax(1),
    "vector_norm": lambda d: torch.linalg.vector_norm(e(d)),
    "vector_norm inf": lambda d: torch.linalg.vector_norm(e(d), ord=float("inf")),
    "median": lambda d: e(d).median(),
    "kthvalue dim 0": lambda d: e(d).kthvalue(1, 0),
    "count_nonzero": lambda d: e(d).count_nonzero(),
    # Products with a zero batch or a zero inner size.
    "matmul": lambda d: e(d) @ torch.ones(3, 5, device=d),
    "mm inner 0": lambda d: torch.mm(torch.ones(4, 0, device=d), torch.ones(0, 5, device=d)),
    "addmm inner 0": lambda d: torch.addmm(torch.ones(4, 5, device=d), torch.ones(4, 0, device=d),
                                           torch.ones(0, 5, device=d)),
    "bmm batch 0": lambda d: torch.bmm(torch.ones(0, 2, 3, device=d), torch.ones(0, 3, 4, device=d)),
    "bmm inner 0": lambda d: torch.bmm(torch.ones(2, 2, 0, device=d), torch.ones(2, 0, 4, device=d)),
    "linear": lambda d: F.linear(e(d), torch.ones(5, 3, device=d), torch.ones(5, device=d)),
    "conv2d": lambda d: F.conv2d(torch.ones(0, 2, 5, 5, device=d), torch.ones(4, 2, 3, 3, device=d)),
    "conv_transpose1d": lambda d: F.conv_transpose1d(torch.ones(0, 2, 5, device=d),
                                                     torch.ones(2, 4, 3, device=d)),
    "max_pool2d": lambda d: F.max_pool2d(torch.ones(0, 2, 4, 4, device=d), 2),
    "sdpa": lambda d: F.scaled_dot_product_attention(*(torch.ones(1, 2, 0, 8, device=d),) * 3),
    # Norms.
    "batch_norm": lambda d: F.batch_norm(torch.ones(0, 3, device=d), torch.zeros(3, device=d),
                                         torch.ones(3, device=d)),
    "batch_norm affine": lambda d: F.batch_norm(torch.ones(0, 3, 2, device=d), None, None,
                                                torch.full((3,), 2.0, device=d),
                                                torch.ones(3, device=d), training=True),
    # An empty 1-d input has no feature dimension (the OpInfo's sample of shape (0,)).
    "batch_norm 1-d": lambda d: F.batch_norm(torch.ones(0, device=d), torch.zeros(0, device=d),
                                             torch.ones(0, device=d), training=True),
    "layer_norm": lambda d: F.layer_norm(e(d), (3,)),
    "group_norm": lambda d: F.group_norm(torch.ones(0, 4, 2, device=d), 2),
    # Indexing, scatter and gather.
    "embedding": lambda d: F.embedding(idx(d), full(d)),
    "index_select": lambda d: full(d).index_select(0, idx(d)),
    "index by empty": lambda d: full(d)[idx(d)],
    "mask of empty": lambda d: e(d)[e(d) > 0],
    "index_put": lambda d: full(d).index_put((idx(d),), e(d)),
    "index_add": lambda d: full(d).index_add(0, idx(d), e(d)),
    "gather": lambda d: torch.gather(full(d), 1, idx(d, 4, 0)),
    "gather of empty": lambda d: torch.gather(e(d), 0, idx(d, 0, 3)),
    "scatter_add": lambda d: full(d).scatter_add(0, idx(d, 0, 3), e(d)),
    "scatter_reduce amax": lambda d: full(d).scatter_reduce(0, idx(d, 0, 3), e(d), "amax"),
    "masked_select": lambda d: full(d).masked_select(full(d) > 100),
    "nonzero": lambda d: e(d).nonzero(),
    # Joining and splitting.
    "cat with empty pieces": lambda d: torch.cat([e(d), full(d), e(d)]),
    "cat with a legacy 1-d empty": lambda d: torch.cat([torch.zeros(0, device=d), full(d)]),
    "cat promotes past an empty int": lambda d: torch.cat([idx(d).int(), torch.ones(2, device=d)]),
    "stack": lambda d: torch.stack([e(d), e(d)]),
    "split": lambda d: torch.split(e(d), 2, 1),
    # Sorting and scans.
    "sort": lambda d: e(d).sort(1),
    "topk 0": lambda d: e(d).topk(0, 0),
    "topk too many": lambda d: e(d).topk(1, 0),
    "unique": lambda d: torch.unique(e(d)),
    "cumsum": lambda d: e(d).cumsum(0),
    "cummax": lambda d: e(d).cummax(0),
    "logcumsumexp": lambda d: e(d).logcumsumexp(0),
    "searchsorted into empty": lambda d: torch.searchsorted(torch.zeros(0, device=d),
                                                            torch.ones(3, device=d)),
    "bincount minlength": lambda d: torch.bincount(idx(d), minlength=3),
    "histc": lambda d: torch.histc(e(d), 4),
    # Losses: mean over nothing is nan, sum is 0.
    "mse mean": lambda d: F.mse_loss(e(d), e(d)),
    "mse sum": lambda d: F.mse_loss(e(d), e(d), reduction="sum"),
    "cross_entropy mean": lambda d: F.cross_entropy(e(d), idx(d)),
    "cross_entropy sum": lambda d: F.cross_entropy(e(d), idx(d), reduction="sum"),
    "binary_cross_entropy": lambda d: F.binary_cross_entropy(e(d).sigmoid(), e(d).sigmoid()),
    "kl_div batchmean": lambda d: F.kl_div(e(d), e(d), reduction="batchmean"),
    # Factories and shape ops.
    "arange 0": lambda d: torch.arange(0, device=d),
    "randperm 0": lambda d: torch.randperm(0, device=d),
    "expand to 0": lambda d: FULL[:1].to(d).expand(0, 3).contiguous(),
    "repeat": lambda d: e(d).repeat(2, 2),
    "pad": lambda d: F.pad(e(d), (1, 1)),
    "unfold": lambda d: e(d).unfold(1, 2, 1),
    "dot": lambda d: torch.dot(torch.zeros(0, device=d), torch.zeros(0, device=d)),
    "item": lambda d: e(d).item(),
}


def _run(case, device):
    """The case's result, or the type of the error it raised."""
    try:
        return CASES[case](device)
    except (RuntimeError, IndexError, ValueError) as error:
        return type(error)


@pytest.mark.parametrize("case", CASES)
def test_lazy_mode_matches_the_cpu(case):
    expected = _run(case, "cpu")
    actual = _run(case, "ipu")
    if isinstance(expected, type):
        assert actual is expected
    else:
        assert_same(expected, actual, equal_nan=True)


def _as_popart_output(value):
    # A wrapped model returns 64-bit integers as int32, as PopTorch does.
    return torch.utils._pytree.tree_map(
        lambda t: t.int() if torch.is_tensor(t) and t.dtype == torch.long else t, value)


class _Case(torch.nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case

    def forward(self, x):
        return CASES[self.case](x.device)


@pytest.mark.parametrize("case", [c for c in CASES if c != "item"])
def test_a_wrapped_model_matches_the_cpu(case):
    expected = _run(case, "cpu")
    model = poptorch.inferenceModel(_Case(case))
    if isinstance(expected, type):
        with pytest.raises(expected):
            model(torch.ones(1))
        return
    actual = model(torch.ones(1))
    torch.testing.assert_close(actual, _as_popart_output(expected), equal_nan=True)
