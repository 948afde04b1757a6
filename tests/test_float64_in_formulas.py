"""float64 that PyTorch's own derivative formulas make for float32 inputs.

renorm's backward takes its norms in at::toAccumulateType(float32, device), float64 on
every device but CUDA and MPS, and linalg.lstsq's backward calls linalg.pinv, whose
default tolerances are float64. Those tensors are internal to the formula (the autograd
engine casts the gradients to the inputs' dtypes), so the ipu computes them as the CPU
does; float64 the user asks for, in a custom Function's backward too, stays refused.
"""
import pytest
import torch

import poptorch
from conftest import train_beside_the_cpu


def _grads(fn, inputs, device, create_graph=False):
    leaves = [t.detach().to(device).requires_grad_() for t in inputs]
    out = fn(*leaves)
    grads = torch.autograd.grad(out.square().sum(), leaves, create_graph=create_graph)
    if create_graph:  # the gradient of the gradient: double backward through the formula
        grads = torch.autograd.grad(sum(g.sum() for g in grads), leaves)
    return [g.cpu() for g in grads]


RENORMS = [(p, dim, maxnorm) for p in (1, 2, 3, float("inf")) for dim in (0, 1, -1)
           for maxnorm in (0.5, 100.0)]


@pytest.mark.parametrize("p,dim,maxnorm", RENORMS)
def test_renorm_backward_is_the_cpus(p, dim, maxnorm):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    fn = lambda t: torch.renorm(t, p, dim, maxnorm)  # noqa: E731
    for create_graph in (False, True):
        for got, want in zip(_grads(fn, [x], "ipu", create_graph),
                             _grads(fn, [x], "cpu", create_graph)):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want)


def test_lstsq_backward_is_the_cpus():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 5, 3, generator=gen), torch.randn(2, 5, 2, generator=gen)
    fn = lambda a, b: torch.linalg.lstsq(a, b).solution  # noqa: E731
    for got, want in zip(_grads(fn, [a, b], "ipu"), _grads(fn, [a, b], "cpu")):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _Renormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(torch.renorm(self.fc(x), 2, 0, 1.0), y)


def test_a_trained_renorm_is_the_cpus():
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 6, generator=gen) * 3, torch.randn(4, 6, generator=gen))
               for _ in range(3)]
    train_beside_the_cpu(_Renormed(), batches)


class _AsksForFloat64(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad.double().float() * 2


def test_float64_a_custom_backward_asks_for_stays_refused():
    x = torch.ones(3, device="ipu", requires_grad=True)
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        _AsksForFloat64.apply(x).sum().backward()
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        torch.ones(3, device="ipu").double()
    poptorch.synchronize()
