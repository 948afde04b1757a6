"""torch.set_flush_denormal on the ipu: each op computes in the denormal mode of
its call, as the CPU does, although the captured graph runs later, maybe on
another thread; a wrapped or compiled model computes each call in the mode of
that call, as the CPU model does. The mode is the calling thread's (MXCSR)."""
import copy
import threading
from typing import List

import pytest
import torch
import torch._dynamo
from torch import nn

import poptorch
from conftest import flush_denormals

if not torch.set_flush_denormal(False):
    pytest.skip("this CPU has no denormal mode", allow_module_level=True)


def _denormals() -> torch.Tensor:
    """Subnormal float32s (and a few normal ones), of both signs."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(257, generator=g) * 1e-38


def _ops(x: torch.Tensor) -> List[torch.Tensor]:
    """Float ops whose results differ under flush-to-zero or denormals-are-zero."""
    return [x * 1.5, x + x, x * 1e30, (x * 0.25).sum().reshape(1), x.to(torch.bfloat16) * 3,
            (x.half() * 1e4).float(), torch.where(x > 0, x * 0.5, x)]


def _assert_bitwise(expected: List[torch.Tensor], actual: List[torch.Tensor]) -> None:
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a.cpu(), e, rtol=0, atol=0)


@pytest.mark.parametrize("at_call", [True, False])
def test_a_lazy_graph_computes_in_the_mode_of_its_call(at_call):
    """Captured in one mode, synced in the other: the CPU's values of the call."""
    x = _denormals()
    with flush_denormals(at_call):
        expected = _ops(x)
        pending = _ops(x.to("ipu"))
    with flush_denormals(not at_call):
        other = _ops(x)
        assert any(not torch.equal(e, o) for e, o in zip(expected, other)), \
            "the mode changes nothing on this CPU: the test would prove nothing"
        _assert_bitwise(expected, pending)


def test_a_graph_synced_on_another_thread_computes_in_the_mode_of_the_call():
    x = _denormals()
    with flush_denormals(True):
        expected = _ops(x)
        pending = _ops(x.to("ipu"))
    results = {}
    thread = threading.Thread(target=lambda: results.update(ipu=[t.cpu() for t in pending]))
    thread.start()
    thread.join()
    _assert_bitwise(expected, results["ipu"])


def test_ops_of_both_modes_in_one_graph():
    """Equal ops of the two modes are not merged into one."""
    x = _denormals()
    on_ipu = x.to("ipu")
    with flush_denormals(True):
        flushed = on_ipu * 1.5
        expected_flushed = x * 1.5
    kept = on_ipu * 1.5
    both = torch.stack([flushed, kept])
    _assert_bitwise([expected_flushed, x * 1.5], [both[0], both[1]])


class _Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.full((257,), 0.75))

    def forward(self, x):
        return x * self.weight + x * 1e30


@pytest.mark.parametrize("iterations", [1, 4], ids=["one_lane", "two_lanes"])
def test_an_inference_model_computes_each_call_in_the_mode_of_that_call(iterations):
    """Compiled under one mode, called under both in turn, as the CPU model is."""
    options = poptorch.Options().deviceIterations(iterations)
    model = poptorch.inferenceModel(_Scale(), options)
    x = _denormals().repeat(iterations, 1)
    for on in (False, True, False, True):
        with flush_denormals(on):
            expected = _Scale()(x)
            actual = model(x)
        _assert_bitwise([expected], [actual])


def test_a_training_model_computes_each_call_in_the_mode_of_that_call():
    cpu_model = _ScaleLoss(_Scale())
    ipu_model = copy.deepcopy(cpu_model)
    model = poptorch.trainingModel(ipu_model,
                                   optimizer=torch.optim.SGD(ipu_model.parameters(), lr=1e-3))
    cpu_optimizer = torch.optim.SGD(cpu_model.parameters(), lr=1e-3)
    x = _denormals().reshape(1, 257)
    for on in (True, False, True):
        with flush_denormals(on):
            cpu_optimizer.zero_grad()
            expected = cpu_model(x)
            expected.backward()
            cpu_optimizer.step()
            actual = model(x)
        _assert_bitwise([expected.detach()], [actual])
    model.copyWeightsToHost()
    _assert_bitwise([cpu_model.scale.weight.detach()], [ipu_model.scale.weight.detach()])


class _ScaleLoss(nn.Module):
    def __init__(self, scale: nn.Module):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return (self.scale(x) * 1e-8).sum()


def test_a_compiled_function_computes_each_call_in_the_mode_of_that_call():
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda t: t * 1.5 + t, backend="ipu")
        x = _denormals()
        for on in (True, False, True):
            with flush_denormals(on):
                expected = x * 1.5 + x
                actual = compiled(x.to("ipu"))
            _assert_bitwise([expected], [actual])
    finally:
        torch._dynamo.reset()
