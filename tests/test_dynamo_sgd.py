"""torch.optim.SGD's momentum update in graphs of torch.compile(backend="ipu"):
fused into one pass per parameter (poptorch/_dynamo_sgd.py) where it computes
the same rule, left as traced where it does not; against the CPU."""
from __future__ import annotations

from typing import List

import pytest
import torch
import torch._dynamo

import poptorch
from poptorch import _dynamo_backend
from conftest import compiled_training_beside_the_cpu, results_of_calls


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def fused(monkeypatch) -> List[int]:
    """How many updates each optimiser graph fused, in compile order."""
    return results_of_calls(monkeypatch, _dynamo_backend, "fuse_sgd_momentum")


# (optimiser options, updates fused in the steady step's graph: 4 parameters)
RULES = {
    "momentum": ({"momentum": 0.9}, 4),
    "weight_decay": ({"momentum": 0.9, "weight_decay": 0.01}, 4),
    "maximize": ({"momentum": 0.9, "maximize": True}, 4),
    "dampening": ({"momentum": 0.9, "dampening": 0.1}, 0),  # buf += (1 - d) grad
    "nesterov": ({"momentum": 0.9, "nesterov": True}, 0),  # steps with grad + m buf
    "plain": ({}, 0),
    # torch.optim.SGD's list form, which ipu parameters get when asked for.
    "foreach": ({"momentum": 0.9, "foreach": True}, 4),
    "foreach_weight_decay": ({"momentum": 0.9, "weight_decay": 0.01, "foreach": True}, 4),
    "foreach_maximize": ({"momentum": 0.9, "maximize": True, "foreach": True}, 4),
    "foreach_nesterov": ({"momentum": 0.9, "nesterov": True, "foreach": True}, 0),
}


@pytest.mark.parametrize("rule", RULES)
def test_a_compiled_sgd_step_matches_the_cpu(rule, fused):
    options, steady_fused = RULES[rule]
    compiled_training_beside_the_cpu(
        lambda parameters: torch.optim.SGD(parameters, lr=0.05, **options), steps=5)
    # The first step's graph (momentum buffers made by cloning) fuses nothing;
    # the steady step's graph fuses every parameter's update when the rule allows.
    assert fused[-1] == steady_fused, fused
    assert poptorch.metrics()["dynamo_recompiles"] <= 1


def test_the_fused_update_computes_the_rule_on_the_cpu():
    torch.manual_seed(0)
    param, buf, grad = torch.randn(70000), torch.randn(70000), torch.randn(70000)
    expected_param, expected_buf = param.clone(), buf.clone()
    expected_buf.mul_(0.9).add_(grad)
    expected_param.add_(expected_buf, alpha=-0.05)
    torch.ops.poptorch.torch_sgd_momentum_(param, buf, grad, 0.05, 0.9)
    torch.testing.assert_close(buf, expected_buf)
    torch.testing.assert_close(param, expected_param)


def test_the_fused_update_refuses_tensors_it_cannot_update():
    param = torch.zeros(4)
    with pytest.raises(RuntimeError, match="float32 tensors of one shape"):
        torch.ops.poptorch.torch_sgd_momentum_(param, torch.zeros(5), torch.zeros(4), 0.1, 0.9)
    with pytest.raises(RuntimeError, match="float32 tensors of one shape"):
        torch.ops.poptorch.torch_sgd_momentum_(param.double(), param.double(), param.double(),
                                               0.1, 0.9)
