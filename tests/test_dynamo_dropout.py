"""AOTAutograd's native_dropout as a float bernoulli_ (the counter-based fill on the
ipu): the output is the CPU kernel's for the mask drawn, the mask boolean."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from poptorch._dynamo_dropout import use_counter_based_dropout


def _dropout_graph(p: float, train=True) -> torch.fx.GraphModule:
    return make_fx(lambda x: torch.ops.aten.native_dropout.default(x, p, train))(
        torch.randn(64, 64))


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_the_output_is_the_cpu_kernels_for_the_mask_drawn(p):
    gm = _dropout_graph(p)
    assert use_counter_based_dropout(gm) == 1
    assert torch.ops.aten.native_dropout.default not in [n.target for n in gm.graph.nodes]
    x = torch.randn(64, 64)
    torch.manual_seed(0)
    output, mask = gm(x)
    assert mask.dtype == torch.bool and mask.shape == x.shape
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    torch.testing.assert_close(output, x.mul(mask).mul_(scale), rtol=0, atol=0)
    kept = mask.float().mean().item()
    assert abs(kept - (1.0 - p)) < 0.05, kept
    torch.manual_seed(0)
    again, _ = gm(x)
    torch.testing.assert_close(again, output, rtol=0, atol=0)


@pytest.mark.parametrize("train", [False, None])
def test_only_training_dropout_is_replaced(train):
    gm = _dropout_graph(0.5, train)
    assert use_counter_based_dropout(gm) == (1 if train is None else 0)


def test_an_empty_input_keeps_the_cpu_kernel():
    gm = make_fx(lambda x: torch.ops.aten.native_dropout.default(x, 0.5, True))(
        torch.randn(0, 3))
    assert use_counter_based_dropout(gm) == 0
