"""poptorch::tanh_gelu (csrc/kernels/tanh_gelu.cpp), which compiled programs run
in place of GELU's tanh approximation written as ops, as GPT-2's
NewGELUActivation writes it (passes::fuseTanhGelu). Each op of the chain rounds
as the CPU's kernel does and tanh is poptorch::tanh, so the fused result equals
the CPU's chain run with poptorch::tanh bit for bit, and the CPU's own chain
within float32's tolerance. The scalars are runtime arguments: other values in
a graph of the same structure give their own results. In training the chain's
gradient, as autograd records it, runs as poptorch::tanh_gelu_backward, which
rounds each of autograd's ops as the CPU does (bit for bit again)."""
import copy
import math

import pytest
import torch
from torch import nn

import poptorch
from conftest import compiled_steps_beside_the_cpu, train_micro_batches_beside_the_cpu

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


def chain_backward(grad, x, half=0.5, kappa=0.044715, beta=C, one=1.0, exponent=3.0):
    """The gradient of fast_new_gelu as autograd records it, op by op."""
    t = torch.ops.poptorch.tanh(beta * (x + kappa * torch.pow(x, exponent)))
    grad_plus_one = grad * (half * x)
    grad_scaled = grad * (t + one)
    result = torch.ops.aten.tanh_backward(grad_plus_one, t) * beta
    grad_power = result * kappa
    result.add_(grad_power * (torch.pow(x, exponent - 1) * exponent))
    return result.add_(grad_scaled * half)


def backward_op(grad, x, half=0.5, exponent=3.0, kappa=0.044715, beta=C, one=1.0):
    def s(v):
        return torch.tensor(v, dtype=torch.float64)
    return torch.ops.poptorch.tanh_gelu_backward(
        grad, x, s(half), exponent, s(kappa), 1, s(beta), s(one), 1,
        s(beta), s(kappa), exponent - 1, s(exponent), 1, s(half), 1)


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


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (37, 29), (8, 128, 1024)])
def test_backward_op_equals_autograds_ops_bitwise(shape):
    x, grad = _x(*shape), torch.randn(shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(backward_op(grad, x), chain_backward(grad, x))
    # and it is the gradient of the CPU's own chain, within float32's tolerance
    xr = x.clone().requires_grad_()
    new_gelu(xr).backward(grad)
    torch.testing.assert_close(backward_op(grad, x), xr.grad)


def test_backward_op_with_other_values_layouts_and_dtypes():
    x, grad = _x(6, 10, 5), torch.randn(6, 10, 5)
    values = dict(exponent=2.0, half=0.25, kappa=0.1, one=-1.0)
    assert torch.equal(backward_op(grad, x, **values), chain_backward(grad, x, **values))
    # Values and layouts off the fast path run autograd's ops.
    assert torch.equal(backward_op(grad, x, exponent=4.0), chain_backward(grad, x, exponent=4.0))
    t, gt = x.transpose(0, 2), grad.transpose(0, 2)
    assert torch.equal(backward_op(gt, t), chain_backward(gt, t))
    d, gd = x.double(), grad.double()
    assert torch.equal(backward_op(gd, d), chain_backward(gd, d))


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


def _lazy_gradient(x, grad, gelu=new_gelu):
    """x's gradient, and the result it kept alive (as a model's next layer does)."""
    xi = x.to("ipu").requires_grad_()
    y = gelu(xi)
    y.backward(grad.to("ipu"))
    return xi.grad.cpu(), y.detach().cpu()


def test_a_lazy_chains_gradient_runs_fused_and_matches_the_cpu():
    x, grad = _x(16, 48), torch.randn(16, 48)
    (got, y), ran = _ran(_lazy_gradient, x, grad)
    # (aten ops run at capture too; the unfused program would run poptorch::tanh)
    assert "poptorch::tanh_gelu_backward" in ran and "poptorch::tanh" not in ran
    assert torch.equal(got, chain_backward(grad, x))
    assert torch.equal(y, fast_new_gelu(x))
    xr = x.clone().requires_grad_()
    new_gelu(xr).backward(grad)
    torch.testing.assert_close(got, xr.grad)


def test_a_training_chain_whose_saved_tanh_is_read_elsewhere_is_left_alone():
    x, grad = _x(16, 48), torch.randn(16, 48)

    def gelu_plus_its_tanh(t, tanh=torch.tanh):
        inner = tanh(C * (t + 0.044715 * torch.pow(t, 3.0)))
        return 0.5 * t * (1.0 + inner) + inner * 0.25

    (got, _), ran = _ran(_lazy_gradient, x, grad, gelu_plus_its_tanh)
    assert "poptorch::tanh_gelu_backward" not in ran and "poptorch::tanh_gelu" not in ran
    assert "poptorch::tanh" in ran
    xr = x.clone().requires_grad_()
    gelu_plus_its_tanh(xr).backward(grad)
    torch.testing.assert_close(got, xr.grad)


def test_a_hook_on_the_inputs_gradient_gets_the_fused_gradient():
    x, grad = _x(16, 48), torch.randn(16, 48)

    def hooked(t):
        t.register_hook(lambda g: g * 3)  # runs on the chain's gradient
        return new_gelu(t)

    (got, _), ran = _ran(_lazy_gradient, x, grad, hooked)
    assert "poptorch::tanh_gelu_backward" in ran
    assert torch.equal(got, chain_backward(grad, x) * 3)


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
    _, ran = _ran(train_micro_batches_beside_the_cpu, cpu, x, y)
    assert "poptorch::tanh_gelu_backward" in ran


def test_a_compiled_training_step_runs_the_fused_gradient_and_matches_the_cpu():
    """torch.compile(backend="ipu"): AOTAutograd's graphs add the gradient's
    contributions as fresh results, not in place; the step is fused all the same."""
    pytest.importorskip("transformers")
    from transformers.activations import NewGELUActivation
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(12, 48), NewGELUActivation(), nn.Linear(48, 3))
    x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
    assert "poptorch::tanh_gelu_backward" in compiled_steps_beside_the_cpu(cpu, x, y)
