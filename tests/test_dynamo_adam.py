"""torch.optim.Adam's and AdamW's update in graphs of torch.compile(backend="ipu"):
every parameter's traced chain runs as one call of PyTorch's fused kernel
(poptorch/_dynamo_adam.py) where it computes the same rule, and is left as
traced where it does not; trained against the CPU's optimiser."""
from __future__ import annotations

import copy
from typing import List

import pytest
import torch
import torch._dynamo
from torch import nn

import poptorch
from poptorch import _dynamo_adam, _dynamo_backend
from conftest import compiled_training_beside_the_cpu, results_of_calls, training_step


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def fused(monkeypatch) -> List[int]:
    """How many updates each optimiser graph fused, in compile order."""
    return results_of_calls(monkeypatch, _dynamo_backend, "fuse_adam")


# (optimiser, options, parameters fused in the step's graph: 4 parameters)
RULES = {
    "adam": (torch.optim.Adam, {}, 4),
    "adam_lr_betas_eps": (torch.optim.Adam, {"lr": 0.003, "betas": (0.8, 0.99), "eps": 1e-6}, 4),
    "adam_l2": (torch.optim.Adam, {"weight_decay": 0.01}, 4),
    "adam_maximize": (torch.optim.Adam, {"maximize": True}, 4),
    "adam_l2_maximize": (torch.optim.Adam, {"weight_decay": 0.01, "maximize": True}, 4),
    "adamw_maximize": (torch.optim.AdamW, {"weight_decay": 0.1, "maximize": True}, 4),
    "adamw": (torch.optim.AdamW, {}, 4),
    "adamw_decay": (torch.optim.AdamW, {"weight_decay": 0.1}, 4),
    "adam_amsgrad": (torch.optim.Adam, {"amsgrad": True}, 0),  # keeps a maximum
}


@pytest.mark.parametrize("rule", RULES)
def test_a_compiled_adam_step_matches_the_cpu(rule, fused):
    optimizer_type, options, steady_fused = RULES[rule]
    ipu_optimizer, cpu_optimizer = compiled_training_beside_the_cpu(
        lambda parameters: optimizer_type(parameters, **options), steps=6)
    ipu_state, cpu_state = ipu_optimizer.state_dict()["state"], cpu_optimizer.state_dict()["state"]
    for index, state in cpu_state.items():
        for name, value in state.items():
            torch.testing.assert_close(ipu_state[index][name].cpu(), value, rtol=1e-5, atol=1e-6,
                                       msg=f"{index} {name}")
    assert fused and fused[-1] == steady_fused, fused


@pytest.mark.parametrize("steps_on", ["cpu", "ipu"])
def test_adam_replays_the_fused_update(steps_on, fused):
    """The optimiser's graph is captured once, then replayed, with its steps
    where torch.optim keeps them (the CPU: counted on the host and uploaded as
    an input at each call) or on the parameters' device (a state loaded so, or
    capturable)."""
    torch.manual_seed(0)
    reference = nn.Linear(6, 3)
    model = copy.deepcopy(reference).to("ipu")
    ipu_optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    cpu_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    ipu_step = torch.compile(training_step(model, ipu_optimizer), backend="ipu")
    cpu_step = training_step(reference, cpu_optimizer)
    for step in range(5):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        if step == 1 and steps_on == "ipu":  # as dynamo moves them when it compiles again
            for state in ipu_optimizer.state.values():
                state["step"] = state["step"].to("ipu")
        ipu_step(x.to("ipu"), y.to("ipu")).item()
        cpu_step(x, y)
        if step == 3:
            warm = poptorch.metrics()
    # The last step replays its graphs; loss.backward()'s ones_like (a graph
    # break) is the one op captured.
    after = poptorch.metrics()
    assert after["ops_captured"] - warm["ops_captured"] == 1
    assert after["graphs_compiled"] == warm["graphs_compiled"]
    for state, cpu_state in zip(ipu_optimizer.state.values(), cpu_optimizer.state.values()):
        assert state["step"].device.type == steps_on
        torch.testing.assert_close(state["step"].cpu(), cpu_state["step"])
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    assert fused[-1] == 2, fused


def _fused_updates(monkeypatch, make_optimizer) -> List[torch.fx.Node]:
    """The ``adam_update`` nodes of the optimiser graphs of a compiled training
    run beside the CPU's (which checks the values)."""
    graphs = []
    fuse = _dynamo_backend.fuse_adam

    def fuse_and_keep(gm: torch.fx.GraphModule) -> int:
        graphs.append(gm)
        return fuse(gm)

    monkeypatch.setattr(_dynamo_backend, "fuse_adam", fuse_and_keep)
    compiled_training_beside_the_cpu(make_optimizer, steps=5)
    updates = [n for gm in graphs for n in gm.graph.nodes if n.target is _dynamo_adam.adam_update]
    assert updates, "no optimiser graph was fused"
    return updates


def test_adamw_decays_the_parameters_in_the_fused_kernel(monkeypatch):
    """AdamW's ``param.mul_(1 - lr * weight_decay)`` runs in the fused kernel's
    AdamW form (no pass of its own), with the CPU's values."""
    updates = _fused_updates(
        monkeypatch, lambda parameters: torch.optim.AdamW(parameters, lr=0.02, weight_decay=0.1))
    for update in updates:
        assert update.kwargs["weight_decay"] == pytest.approx(0.1), update.kwargs
        graph = update.graph
        assert not [n for n in graph.nodes if n.op == "call_method" and n.target == "mul_"
                    and n.args[0] in update.args[0]], graph


def test_adam_l2_and_maximize_change_the_gradient_in_the_fused_kernel(monkeypatch):
    """Adam's ``-grad`` (``maximize``) and L2 term ``grad.add(param, alpha=wd)``
    run in the fused kernel (no pass of their own), with the CPU's values:
    the update reads the gradients dynamo's graph was given."""
    updates = _fused_updates(
        monkeypatch,
        lambda parameters: torch.optim.Adam(parameters, lr=0.02, weight_decay=0.1, maximize=True))
    for update in updates:
        assert update.kwargs["l2_weight_decay"] == pytest.approx(0.1), update.kwargs
        assert update.kwargs["maximize"] is True, update.kwargs
        assert "weight_decay" not in update.kwargs, update.kwargs
        assert all(g.op == "placeholder" for g in update.args[1]), update.graph
