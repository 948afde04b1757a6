"""torch.compile(backend="ipu") replays that join the pending lazy graph: a training
step's forward, backward and optimiser graphs run as one program at the sync point,
with the CPU's values."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import poptorch
from conftest import sgd_training_step


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _executions() -> int:
    return poptorch.metrics()["executions"]


def test_steps_never_synchronised_run_one_program_each():
    # A pending graph holds one replay of each graph at most: the next step's
    # forward runs the step before it, so the structure of every program is
    # the same and nothing is compiled once warm.
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model = copy.deepcopy(reference).to("ipu")
    ipu_step = torch.compile(sgd_training_step(model, momentum=0.9), backend="ipu")
    cpu_step = sgd_training_step(reference, momentum=0.9)
    batches = [(torch.randn(5, 6), torch.randint(0, 3, (5,))) for _ in range(8)]
    compiles, programs, losses = [], [], []
    for x, y in batches:
        x, y, before = x.to("ipu"), y.to("ipu"), _executions()
        losses.append(ipu_step(x, y))
        programs.append(_executions() - before)
        compiles.append(poptorch.metrics()["graphs_compiled"])
    for loss, (x, y) in zip(losses, batches):
        torch.testing.assert_close(loss.cpu(), cpu_step(x, y).detach(), rtol=1e-4, atol=1e-5)
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=key)
    assert len(set(compiles[3:])) == 1, compiles
    assert programs[4:] == [1] * 4, programs  # the step before, as one program


@pytest.mark.parametrize("start", [0, 3, 7])
def test_inputs_at_an_offset_of_their_storage_join(start):
    def f(x, w):
        return (torch.relu(x @ w) + 1).sum()

    compiled = torch.compile(f, backend="ipu")
    data, weight = torch.randn(20, 6), torch.randn(6, 6)
    data_ipu = data.to("ipu")
    for call in range(3):
        w = weight.clone().requires_grad_()
        w_ipu = weight.to("ipu").requires_grad_()
        x, x_ipu = data[start + call:start + call + 4], data_ipu[start + call:start + call + 4]
        f(x, w).backward()
        before = _executions()
        out = compiled(x_ipu, w_ipu)
        out.backward()
        torch.testing.assert_close(out.detach().cpu(), f(x, weight))
        torch.testing.assert_close(w_ipu.grad.cpu(), w.grad)
        if call > 0:  # captured at the first call, then joined: forward and backward as one
            assert _executions() - before == 1


def test_dropout_in_a_joined_graph_draws_new_masks_that_follow_the_seed():
    def f(x):
        return nn.functional.dropout(x, 0.5, training=True) * 3

    compiled = torch.compile(f, backend="ipu")
    x = torch.ones(1000).to("ipu").requires_grad_()

    def call():
        out = compiled(x)
        out.sum().backward()
        grad, x.grad = x.grad.cpu(), None
        return out.detach().cpu(), grad

    call()  # captured
    torch.manual_seed(1)
    first, second = call(), call()
    torch.manual_seed(1)
    again = call()
    assert not torch.equal(first[0], second[0])
    torch.testing.assert_close(again[0], first[0], rtol=0, atol=0)
    for out, grad in (first, second):
        kept = out != 0
        assert 300 < int(kept.sum()) < 700
        # The backward reads the forward's mask: gradients where it kept.
        torch.testing.assert_close(grad, kept.float() * 6, rtol=0, atol=0)


def test_a_graph_break_in_the_forward_joins_the_step():
    def f(x, w):
        y = torch.tanh(x @ w)
        torch._dynamo.graph_break()
        return (y * y.mean()).sum()

    compiled = torch.compile(f, backend="ipu")
    weight = torch.randn(4, 4)
    for _ in range(3):
        x = torch.randn(3, 4)
        w, w_ipu = weight.clone().requires_grad_(), weight.to("ipu").requires_grad_()
        before = _executions()
        out = compiled(x.to("ipu"), w_ipu)
        out.backward()
        ref = f(x, w)
        ref.backward()
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(w_ipu.grad.cpu(), w.grad, rtol=1e-5, atol=1e-5)
    assert _executions() - before == 1  # both graphs' forward and backward


def test_inference_graphs_run_at_once_when_nothing_is_pending():
    compiled = torch.compile(lambda x: torch.relu(x) * 2, backend="ipu")
    x = torch.randn(8).to("ipu")
    with torch.no_grad():
        compiled(x)  # captured
        before = _executions()
        out = compiled(x)
        assert _executions() - before == 1  # no lookup, no pending graph
        torch.testing.assert_close(out.cpu(), torch.relu(x.cpu()) * 2)
        before = _executions()
        out = compiled(x + 1)  # joins the pending add
        assert _executions() - before == 0
        torch.testing.assert_close(out.cpu(), torch.relu(x.cpu() + 1) * 2)


def test_an_error_in_a_joined_graph_is_the_cpus_at_the_read():
    def f(w, i):
        return (w[i] * 2).sum()

    compiled = torch.compile(f, backend="ipu")
    weight = torch.randn(5, 3)
    w = weight.to("ipu").requires_grad_()
    compiled(w, torch.tensor([0, 1]).to("ipu")).backward()  # captured
    w.grad = None
    with pytest.raises(IndexError) as on_the_cpu:
        f(weight, torch.tensor([0, 7]))
    out = compiled(w, torch.tensor([0, 7]).to("ipu"))  # joined: nothing runs yet
    with pytest.raises(IndexError, match=str(on_the_cpu.value)):
        out.item()
    out = compiled(w, torch.tensor([1, 2]).to("ipu"))
    out.backward()
    torch.testing.assert_close(out.detach().cpu(), f(weight, torch.tensor([1, 2])))
    torch.testing.assert_close(w.grad.cpu(), torch.tensor([[0.0] * 3, [2.0] * 3, [2.0] * 3,
                                                           [0.0] * 3, [0.0] * 3]))
