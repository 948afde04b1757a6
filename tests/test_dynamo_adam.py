"""torch.optim.Adam's and AdamW's update in graphs of torch.compile(backend="ipu"):
every parameter's traced chain runs as one call of PyTorch's fused kernel
(poptorch/_dynamo_adam.py) where it computes the same rule, and is left as
traced where it does not; trained against the CPU's optimiser."""
from __future__ import annotations

import copy
from typing import Any, Callable, List

import pytest
import torch
import torch._dynamo
from torch import nn

from poptorch import _dynamo_backend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fused(monkeypatch) -> List[int]:
    """How many updates each optimiser graph fused, in compile order."""
    counts: List[int] = []
    fuse = _dynamo_backend.fuse_adam

    def counting(gm: torch.fx.GraphModule) -> int:
        counts.append(fuse(gm))
        return counts[-1]

    monkeypatch.setattr(_dynamo_backend, "fuse_adam", counting)
    return counts


def _training_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


# (optimiser, options, parameters fused in the step's graph: 4 parameters)
RULES = {
    "adam": (torch.optim.Adam, {}, 4),
    "adam_lr_betas_eps": (torch.optim.Adam, {"lr": 0.003, "betas": (0.8, 0.99), "eps": 1e-6}, 4),
    "adam_l2": (torch.optim.Adam, {"weight_decay": 0.01}, 4),
    "adam_maximize": (torch.optim.Adam, {"maximize": True}, 4),
    "adamw": (torch.optim.AdamW, {}, 4),
    "adamw_decay": (torch.optim.AdamW, {"weight_decay": 0.1}, 4),
    "adam_amsgrad": (torch.optim.Adam, {"amsgrad": True}, 0),  # keeps a maximum
}


@pytest.mark.parametrize("rule", RULES)
def test_a_compiled_adam_step_matches_the_cpu(rule, fused):
    optimizer_type, options, steady_fused = RULES[rule]
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    model = copy.deepcopy(reference).to("ipu")
    ipu_optimizer = optimizer_type(model.parameters(), **options)
    cpu_optimizer = optimizer_type(reference.parameters(), **options)
    ipu_step = torch.compile(_training_step(model, ipu_optimizer), backend="ipu")
    cpu_step = _training_step(reference, cpu_optimizer)
    for _ in range(6):
        x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
        loss = ipu_step(x.to("ipu"), y.to("ipu"))
        torch.testing.assert_close(loss.cpu(), cpu_step(x, y).detach(), rtol=1e-5, atol=1e-6)
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=key)
    ipu_state, cpu_state = ipu_optimizer.state_dict()["state"], cpu_optimizer.state_dict()["state"]
    for index, state in cpu_state.items():
        for name, value in state.items():
            torch.testing.assert_close(ipu_state[index][name].cpu(), value, rtol=1e-5, atol=1e-6,
                                       msg=f"{index} {name}")
    assert fused and fused[-1] == steady_fused, fused


def test_adam_with_its_steps_on_the_ipu_replays_the_fused_update(fused):
    """Steps on the parameters' device (a state loaded so, or capturable) make
    the optimiser's graph replayable: captured once, then replayed."""
    import poptorch
    torch.manual_seed(0)
    reference = nn.Linear(6, 3)
    model = copy.deepcopy(reference).to("ipu")
    ipu_optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    cpu_optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    ipu_step = torch.compile(_training_step(model, ipu_optimizer), backend="ipu")
    cpu_step = _training_step(reference, cpu_optimizer)
    for step in range(5):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        if step == 1:  # as dynamo moves them when it compiles the step again
            for state in ipu_optimizer.state.values():
                state["step"] = state["step"].to("ipu")
        ipu_step(x.to("ipu"), y.to("ipu")).item()
        cpu_step(x, y)
        if step == 3:
            captured = poptorch.metrics()["ops_captured"]
    # The last step replays its graphs; loss.backward()'s ones_like (a graph
    # break) is the one op captured.
    assert poptorch.metrics()["ops_captured"] - captured == 1
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    assert fused[-1] == 2, fused
