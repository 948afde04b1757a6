"""The hottest ops are captured by unboxed kernels that borrow their tensor
arguments (csrc/capture/unboxed.*): they must return what the boxed fallback
returned (in-place ops their very argument, tuples of fresh results), leave
every reference count as it was, and still take the boxed path where capture
needs it (a step captured whole, an op the host must run)."""
import sys

import pytest
import torch
import torch.nn.functional as F

import poptorch


def _pair(*shape):
    cpu = torch.randn(*shape)
    return cpu, cpu.to("ipu")


def test_in_place_ops_return_their_argument_with_the_cpus_values():
    cpu, ipu = _pair(4, 3)
    other_cpu, other_ipu = _pair(4, 3)
    version = ipu._version
    for tensor, other in ((cpu, other_cpu), (ipu, other_ipu)):
        assert tensor.add_(other, alpha=2) is tensor
        assert tensor.mul_(other) is tensor
        assert tensor.div_(other.abs() + 1) is tensor
        assert tensor.addcmul_(other, other, value=0.5) is tensor
    assert ipu._version == version + 4
    torch.testing.assert_close(ipu.cpu(), cpu)
    assert ipu.zero_() is ipu and ipu.fill_(3.0) is ipu
    assert torch.equal(ipu.cpu(), torch.full((4, 3), 3.0))


def test_borrowed_arguments_leave_reference_counts_alone():
    _, x = _pair(8)
    _, y = _pair(8)
    weight = torch.randn(8, 8, device="ipu")
    counts = [(sys.getrefcount(t), t._use_count()) for t in (x, y, weight)]
    for _ in range(20):
        x + y
        x * 2.0
        x.add_(y)
        torch.mm(weight, weight)
        torch.addmm(y, weight, weight)
        F.layer_norm(weight, (8,))
        torch.where(x > 0, x, y)
    poptorch.synchronize()
    assert [(sys.getrefcount(t), t._use_count()) for t in (x, y, weight)] == counts


def test_tuple_results_and_gradients_match_the_cpu():
    cpu, ipu = _pair(2, 3, 8, 8)
    results = []
    for x in (cpu.clone().requires_grad_(), ipu.clone().detach().requires_grad_()):
        pooled, indices = F.max_pool2d(x, 2, return_indices=True)
        normed = F.layer_norm(pooled, (4, 4))
        loss = F.cross_entropy(normed.flatten(1), torch.zeros(2, dtype=torch.long,
                                                              device=x.device))
        loss.backward()
        results.append((pooled, indices, normed, loss, x.grad))
    for cpu_value, ipu_value in zip(*results):
        torch.testing.assert_close(ipu_value.cpu(), cpu_value)


def test_an_op_meta_cannot_infer_raises_the_cpus_error():
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.ones(3, device="ipu") + torch.ones(4, device="ipu")


def test_a_host_scalar_argument_is_captured_as_on_the_cpu():
    cpu, ipu = _pair(5)
    scalar = torch.tensor(2.5)
    torch.testing.assert_close((ipu * scalar).cpu(), cpu * scalar)
    torch.testing.assert_close(ipu.add_(scalar).cpu(), cpu.add_(scalar))


def test_ops_inside_a_step_captured_whole_take_the_boxed_path():
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.LayerNorm(4))
    x = torch.randn(3, 6)
    expected = model(x)
    inference = poptorch.inferenceModel(model)
    torch.testing.assert_close(inference(x), expected)
