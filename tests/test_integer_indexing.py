"""Indexing with integer index tensors (aten::index.Tensor) is captured like any op: its result's
shape follows from the shapes of the indices, not their values, so it neither runs on the host
nor breaks the graph. Boolean and uint8 masks still do (tests/test_views_inplace.py), and an
index out of range is the CPU's error at the first read (tests/test_errors.py)."""
from typing import Callable, Dict

import pytest
import torch

import poptorch
from conftest import assert_same


def _index(values, device: str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


CASES: Dict[str, Callable[[torch.Tensor, str], torch.Tensor]] = {
    "rows, repeated": lambda x, d: x[_index([2, 0, 2], d)],
    "columns, 2-d and negative": lambda x, d: x[:, _index([[5, 0], [1, -1]], d)],
    "two broadcast indices": lambda x, d: x[_index([[0], [3]], d), _index([1, 4, -6], d)],
    "indices around a slice": lambda x, d: x.view(2, 2, 6)[_index([1, 0], d), :, _index([3], d)],
    "int32 indices": lambda x, d: x[_index([3, 1], d, torch.int32)],
    "an index tensor on the host": lambda x, d: x[_index([1, 3], "cpu")],
    "an empty index": lambda x, d: x[_index([], d)],
    "with a new axis": lambda x, d: x[None, _index([1], d)],
    "after a transpose": lambda x, d: x.t()[_index([0, 5, 2], d)],
    "the aten op": lambda x, d: torch.ops.aten.index.Tensor(x, [None, _index([0, 5], d)]),
    # GPT-2's classifier: the logits of each sequence's last token.
    "one element per row": lambda x, d: x[torch.arange(4, device=d), _index([5, 0, 3, 3], d)],
}


@pytest.mark.parametrize("case", CASES)
def test_integer_indexing_is_captured_with_the_cpus_results(case):
    f = CASES[case]
    base = torch.arange(24.0).reshape(4, 6)
    expected = f(base, "cpu")
    x = base.to("ipu")
    poptorch.synchronize()
    result = f(x, "ipu")
    assert poptorch._C.pending_nodes() >= 1  # captured, not run
    assert result.shape == expected.shape and result.stride() == expected.stride()
    assert_same(expected, result)
    assert poptorch.metrics()["host_fallbacks"] == 0


def test_integer_indexing_trains_like_the_cpu():
    # The gradient of a repeated index accumulates (index_put_ with accumulate=True).
    def loss(weight: torch.Tensor, device: str) -> torch.Tensor:
        rows = weight[_index([[0, 2], [2, 2]], device)]
        return (rows * torch.arange(1.0, 4.0, device=device)).sum()

    weight = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    cpu = weight.clone().requires_grad_()
    ipu = weight.to("ipu").requires_grad_()
    loss(cpu, "cpu").backward()
    loss(ipu, "ipu").backward()
    assert_same(cpu.grad, ipu.grad)
    assert poptorch.metrics()["host_fallbacks"] == 0


class LastTokenLogits(torch.nn.Module):
    """Picks each sequence's logits at an index the input carries, as GPT-2's classifier does."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        logits = self.linear(x)
        return logits[torch.arange(x.shape[0], device=x.device), last]


def test_a_wrapped_model_follows_each_micro_batchs_indices():
    torch.manual_seed(0)
    model = LastTokenLogits()
    x = torch.randn(4 * 2, 5, 4)
    last = torch.tensor([4, 0, 2, 2, 1, 3, 0, 4])  # another index in every micro-batch
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    for _ in range(2):
        torch.testing.assert_close(ipu(x, last), model(x, last))
    assert poptorch.metrics()["host_fallbacks"] == 0 and poptorch.metrics()["guard_failures"] == 0


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_a_mask_among_integer_indices_still_runs_on_the_host(mask_dtype):
    base = torch.arange(24.0).reshape(4, 6)

    def f(x: torch.Tensor, d: str) -> torch.Tensor:
        return x[_index([1, 0, 0, 1], d, mask_dtype), _index([2, 5], d)]

    assert_same(f(base, "cpu"), f(base.to("ipu"), "ipu"))
    assert poptorch.metrics()["fallback_ops"] == {"aten::index.Tensor": 1}
