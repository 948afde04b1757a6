"""The state of each call of a torch.compile(backend="ipu") function decides how
its graphs compute, as it does on the CPU, when the state changes between
calls: torch.use_deterministic_algorithms (dynamo guards it: each setting is a
graph of its own, captured under it) and torch.set_flush_denormal (not
guarded: a replay computes in the mode of its call). Training graphs join the
pending lazy graph and run at the read, after the state was changed back."""
from __future__ import annotations

import contextlib
import re
from typing import Iterator, Tuple

import pytest
import torch
import torch._dynamo

import poptorch
from conftest import flush_denormals


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@contextlib.contextmanager
def _deterministic(on: bool, warn_only: bool = False) -> Iterator[None]:
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _copy_rows(target: torch.Tensor, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    # Which of the repeated indices' rows wins depends on the setting.
    return target.index_copy(0, indices, rows) * 2


def _rows(device: str, requires_grad: bool) -> Tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(2000, 4, 3)
    indices = torch.randint(0, 2000, (40000,), generator=g)
    rows = torch.randn(40000, 4, 3, generator=g)
    return (target.to(device).requires_grad_(requires_grad), rows.to(device), indices.to(device))


@pytest.mark.parametrize("training", [False, True], ids=["inference", "joined"])
def test_deterministic_algorithms_toggled_between_calls(training):
    compiled = torch.compile(_copy_rows, backend="ipu")
    graphs_before = poptorch.metrics()["dynamo_graphs"]
    for on in (False, True, False, True):
        with _deterministic(on):
            expected = _copy_rows(*_rows("cpu", False))
            target, rows, indices = _rows("ipu", training)
            grad_mode = contextlib.nullcontext() if training else torch.no_grad()
            with grad_mode:
                out = compiled(target, rows, indices)
            if training:
                out.sum().backward()  # the forward, ones and backward: one pending graph
        # Read after the setting changed back: the nodes keep their call's.
        result = out.detach().cpu()
        if on:
            torch.testing.assert_close(result, expected, rtol=0, atol=0)
        else:  # which repeated index wins is unspecified, element by element (the
            # CPU's threads may write one row's elements from different duplicates):
            # each element is twice that of a row copied to its index, or 0 if none was
            _, cpu_rows, cpu_indices = _rows("cpu", False)
            written = torch.zeros(2000, dtype=torch.bool)
            written[cpu_indices] = True
            assert torch.equal(result[~written], torch.zeros_like(result[~written]))
            possible = (cpu_rows * 2 == result[cpu_indices])  # per duplicate, per element
            matched = torch.zeros(2000, 4, 3, dtype=torch.bool).index_put_(
                (cpu_indices,), possible, accumulate=True)
            assert bool(matched[written].all())
        if training:
            # Each row of the target that was copied over gets no gradient.
            kept = torch.ones(2000, 4, 3)
            kept[_rows("cpu", False)[2]] = 0
            torch.testing.assert_close(target.grad.cpu(), kept * 2, rtol=0, atol=0)
    # One graph (forward and backward) for each setting, none for a repeated one.
    assert poptorch.metrics()["dynamo_graphs"] - graphs_before == 2


def _put(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return x.clone().put_(indices, x[:3])


def test_an_op_the_setting_refuses_is_refused_at_the_call_that_sets_it():
    compiled = torch.compile(_put, backend="ipu")
    x, indices = torch.arange(5.0), torch.tensor([0, 3, 0])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.to("ipu"), indices.to("ipu")).cpu(),
                                   _put(x, indices))
        with _deterministic(True), pytest.raises(RuntimeError) as on_the_cpu:
            _put(x, indices)
        with _deterministic(True), pytest.raises(RuntimeError,
                                                 match=re.escape(str(on_the_cpu.value))):
            compiled(x.to("ipu"), indices.to("ipu"))
        with _deterministic(True, warn_only=True), pytest.warns(UserWarning):
            out = compiled(x.to("ipu"), indices.to("ipu"))
        torch.testing.assert_close(out.cpu(), _put(x, indices))
        torch.testing.assert_close(compiled(x.to("ipu"), indices.to("ipu")).cpu(),
                                   _put(x, indices))


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU has no denormal mode")
def test_denormal_mode_toggled_between_joined_calls():
    def f(w, x):
        return x * w * 1.5 + x

    compiled = torch.compile(f, backend="ipu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(257, generator=g) * 1e-38  # subnormal float32s, of both signs
    weight = torch.rand(257, generator=g) + 0.5
    for on in (True, False, True, False):
        with flush_denormals(on):
            w = weight.clone().requires_grad_()
            expected = f(w, x)
            expected.backward(torch.ones_like(expected))  # x * 1.5: subnormal
            w_ipu = weight.to("ipu").requires_grad_()
            out = compiled(w_ipu, x.to("ipu"))
            out.backward(torch.ones_like(out))  # joins: nothing runs yet
        torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=0, atol=0)
        torch.testing.assert_close(w_ipu.grad.cpu(), w.grad, rtol=0, atol=0)
