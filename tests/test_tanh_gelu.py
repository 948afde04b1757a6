"""poptorch::tanh_gelu (csrc/kernels/tanh_gelu.cpp), which compiled programs run
in place of GELU's tanh approximation written as ops, as GPT-2's
NewGELUActivation writes it (passes::fuseTanhGelu). Each op of the chain rounds
as the CPU's kernel does and tanh is poptorch::tanh, so the fused result equals
the CPU's chain run with poptorch::tanh bit for bit, and the CPU's own chain
within float32's tolerance. The scalars are runtime arguments: other values in
a graph of the same structure give their own results."""
import copy
import math

import pytest
import torch
from torch import nn

import poptorch
from conftest import train_micro_batches_beside_the_cpu

C = math.sqrt(2.0 / math.pi)


def new_gelu(x, half=0.5, kappa=0.044715, beta=C, one=1.0, exponent=3.0, tanh=torch.tanh):
    # transformers.activations.NewGELUActivation.forward, with its constants as arguments
    return half * x * (one + tanh(beta * (x + kappa * torch.pow(x, exponent))))


def fast_new_gelu(x, **kwargs):
    """The chain with poptorch::tanh, as the unfused program computes it."""
    return new_gelu(x, tanh=torch.ops.poptorch.tanh, **kwargs)


def op(x, half=0.5, exponent=3.0, kappa=0.044715, alpha=1, beta=C, one=1.0, one_alpha=1,
       out=None):
    def s(v):
        return torch.tensor(v, dtype=torch.float64)
    args = (x, s(half), exponent, s(kappa), alpha, s(beta), s(one), one_alpha)
    if out is None:
        return torch.ops.poptorch.tanh_gelu(*args)
    return torch.ops.poptorch.tanh_gelu.out(*args, out=out)


def _x(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (37, 29), (8, 128, 1024)])
def test_op_equals_the_cpus_chain_bitwise(shape):
    x = _x(*shape)
    got = op(x)
    assert torch.equal(got, fast_new_gelu(x))
    torch.testing.assert_close(got, new_gelu(x))


def test_op_with_other_values_layouts_and_dtypes():
    x = _x(6, 10, 5)
    assert torch.equal(op(x, exponent=2, half=0.25, kappa=0.1), fast_new_gelu(
        x, exponent=2, half=0.25, kappa=0.1))
    # Values and layouts off the fast path run the chain's own ops.
    assert torch.equal(op(x, exponent=4.0), fast_new_gelu(x, exponent=4.0))
    want = 0.5 * x * (torch.ops.poptorch.tanh(C * torch.add(x, 0.044715 * x ** 3, alpha=2)) + 1)
    assert torch.equal(op(x, alpha=2), want)
    t = x.transpose(0, 2)
    assert torch.equal(op(t), fast_new_gelu(t))
    d = x.double()
    assert torch.equal(op(d), new_gelu(d))


def test_out_overload_resizes_and_runs_in_place():
    x = _x(5, 33)
    out = torch.empty(0)
    op(x, out=out)
    assert torch.equal(out, fast_new_gelu(x))
    y = x.clone()
    op(y, out=y)
    assert torch.equal(y, fast_new_gelu(x))


def _ran(fn, *args):
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, {e.name for e in prof.events()}


def test_a_lazy_chain_runs_fused_and_matches_the_cpu():
    x = _x(16, 48)
    out, ran = _ran(lambda t: new_gelu(t).cpu(), x.to("ipu"))
    # (aten ops run at capture too; the unfused program would run poptorch::tanh)
    assert "poptorch::tanh_gelu" in ran and "poptorch::tanh" not in ran
    assert torch.equal(out, fast_new_gelu(x))
    torch.testing.assert_close(out, new_gelu(x))


def test_other_scalars_in_a_graph_of_the_same_structure_give_their_own_values():
    x = _x(16, 48)
    for half, kappa, one in ((0.5, 0.044715, 1.0), (0.25, 0.5, -2.0), (2.0, 0.0, 0.0)):
        out, ran = _ran(lambda t: new_gelu(t, half=half, kappa=kappa, one=one).cpu(),
                        x.to("ipu"))
        assert "poptorch::tanh_gelu" in ran
        assert torch.equal(out, fast_new_gelu(x, half=half, kappa=kappa, one=one))


def test_a_chain_whose_intermediate_is_read_elsewhere_is_left_alone():
    x = _x(16, 48)

    def both(t):
        inner = C * (t + 0.044715 * torch.pow(t, 3.0))
        return (0.5 * t * (1.0 + torch.tanh(inner))).cpu(), inner.cpu()

    (out, inner), ran = _ran(both, x.to("ipu"))
    assert "poptorch::tanh_gelu" not in ran and "poptorch::tanh" in ran
    assert torch.equal(out, fast_new_gelu(x))
    torch.testing.assert_close(inner, C * (x + 0.044715 * torch.pow(x, 3.0)))


def test_an_input_changed_in_place_within_the_chain_is_left_alone():
    x = _x(16, 48)

    def changed(t):
        scaled = 0.5 * t
        inner = C * (t + 0.044715 * torch.pow(t, 3.0))
        t.mul_(2)  # after the chain read t, before its last op
        return (scaled * (1.0 + torch.tanh(inner))).cpu(), t.cpu()

    (out, t), ran = _ran(changed, x.to("ipu"))
    assert "poptorch::tanh_gelu" not in ran
    assert torch.equal(out, fast_new_gelu(x))
    assert torch.equal(t, x * 2)


class _Mlp(nn.Module):
    """GPT-2's MLP block: Linear, NewGELUActivation, Linear."""

    def __init__(self):
        super().__init__()
        from transformers.activations import NewGELUActivation
        self.fc, self.act, self.proj = nn.Linear(12, 48), NewGELUActivation(), nn.Linear(48, 3)

    def forward(self, x, y):
        out = self.proj(self.act(self.fc(x)))
        return out, nn.functional.cross_entropy(out, y)


def test_inference_and_training_models_with_new_gelu_match_the_cpu():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    x, y = torch.randn(4 * 8, 12), torch.randint(0, 3, (4 * 8,))
    cpu = _Mlp()
    model = copy.deepcopy(cpu)
    inference = poptorch.inferenceModel(model.eval(), poptorch.Options().deviceIterations(4))
    torch.testing.assert_close(inference(x, y)[0], cpu(x, y)[0].detach())
    train_micro_batches_beside_the_cpu(cpu, x, y)
