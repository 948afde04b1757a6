"""The fused optimiser kernels (csrc/kernels/): one pass per parameter that
computes what the update rules of poptorch/_update_rules.py compute with
separate ATen ops, on the CPU and captured on the ipu."""
import copy

import pytest
import torch

import poptorch
from poptorch import _C
from poptorch import _update_rules as rules

SHAPE = (37, 1001)  # not a multiple of any vector width; several threads' grains


def sgd_state(seed):
    g = torch.Generator().manual_seed(seed)
    p, buf, grad = (torch.randn(SHAPE, generator=g) for _ in range(3))
    return p, {"momentum_buffer": buf, "step": torch.tensor(3.0)}, grad


def hyper(weight_decay, nesterov, variable, device="cpu"):
    values = {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "weight_decay": weight_decay,
              "nesterov": nesterov}
    for name in variable:
        values[name] = torch.tensor(values[name], device=device)
    return values


CASES = [(weight_decay, nesterov, velocity_scaling, variable)
         for weight_decay in (0.0, 0.01) for nesterov in (False, True)
         for velocity_scaling in (1.0, 4.0)
         for variable in ((), ("lr", "momentum", "weight_decay"))]


@pytest.mark.parametrize("weight_decay, nesterov, velocity_scaling, variable", CASES)
def test_sgd_momentum_computes_the_rule(device, weight_decay, nesterov, velocity_scaling,
                                        variable):
    p, state, grad = sgd_state(0)
    expected_p, expected_state, expected_grad = copy.deepcopy((p, state, grad))
    expected_state["step"].add_(1)
    rules._sgd(expected_p, expected_grad, expected_state,
               hyper(weight_decay, nesterov, variable), velocity_scaling)

    p, grad = p.to(device), grad.to(device)
    state = {name: t.to(device) for name, t in state.items()}
    h = hyper(weight_decay, nesterov, variable, device)
    assert rules._sgd_momentum_fuses(p, grad, state, h, velocity_scaling)
    rules._sgd_momentum_fused(p, grad, state, h, velocity_scaling)
    torch.testing.assert_close(p.cpu(), expected_p, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state["momentum_buffer"].cpu(), expected_state["momentum_buffer"],
                               rtol=1e-6, atol=1e-6)
    assert float(state["step"]) == 4.0


def test_the_device_update_is_one_node_per_parameter_without_host_fallback():
    """As trainingModel captures it: the state lives on the device."""
    model = torch.nn.Linear(6, 3).to("ipu")
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = list(model.parameters())
    states = {id(p): rules.initial_state("sgd", p, optimizer, optimizer.param_groups[0])
              for p in params}
    grads = {id(p): torch.randn(p.shape, device="ipu") for p in params}
    h = hyper(0.0, False, ("lr",), "ipu")
    poptorch.synchronize()
    before = poptorch.metrics()["host_fallbacks"]
    rules.apply_update("sgd", optimizer, [(params, h)], grads, states, None)
    graph = _C.pending_graph()
    assert graph.count("poptorch::sgd_momentum_") == 2 and "aten::mul_" not in graph
    poptorch.synchronize()
    assert poptorch.metrics()["host_fallbacks"] == before
    assert [float(states[id(p)]["step"]) for p in params] == [1.0, 1.0]


@pytest.mark.parametrize("kwargs", [dict(nesterov=True), dict(weight_decay=0.01),
                                    dict(nesterov=True, weight_decay=0.01)])
def test_training_with_the_fused_update_matches_torch_sgd_on_the_cpu(kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    reference = copy.deepcopy(model)

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            out = self.inner(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    training = poptorch.trainingModel(
        WithLoss(model), None, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                               **kwargs))
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
        training(x, y)
        cpu_optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        cpu_optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_sgd_momentum_refuses_what_it_cannot_update():
    p, state, grad = sgd_state(0)
    one = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="float32 tensors of one shape, the first two contig"):
        torch.ops.poptorch.sgd_momentum_(p.half(), state["momentum_buffer"], state["step"],
                                         grad, one, one, None, 1.0, False)
    with pytest.raises(RuntimeError, match="lr must be a float32 tensor of one element"):
        torch.ops.poptorch.sgd_momentum_(p, state["momentum_buffer"], state["step"], grad,
                                         torch.ones(2), one, None, 1.0, False)


def test_sgd_momentum_reads_a_gradient_in_another_layout():
    """The runtime may hand a convolution's weight gradient over channels-last."""
    p, state, grad = sgd_state(0)
    p, grad = p.reshape(37, 7, 11, 13), grad.reshape(37, 7, 11, 13)
    state["momentum_buffer"] = state["momentum_buffer"].reshape(37, 7, 11, 13)
    expected_p, expected_state = p.clone(), copy.deepcopy(state)
    h = hyper(0.0, False, ())
    rules._sgd(expected_p, grad.clone(), expected_state, h, 1.0)
    rules._sgd_momentum_fused(p, grad.contiguous(memory_format=torch.channels_last), state, h, 1.0)
    torch.testing.assert_close(p, expected_p, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change", ["dampening", "half_buffer", "transposed_grad",
                                    "variable_velocity_scaling"])
def test_what_the_kernel_does_not_compute_takes_the_rule(change):
    p, state, grad = sgd_state(0)
    h = hyper(0.0, False, ())
    velocity_scaling = 1.0
    if change == "variable_velocity_scaling":  # a group's, changed by setOptimizer
        velocity_scaling = torch.tensor(2.0)
    elif change == "dampening":
        h["dampening"] = 0.1
    elif change == "half_buffer":
        state["momentum_buffer"] = state["momentum_buffer"].half()
    else:
        grad = grad.t().contiguous().t()
    assert not rules._sgd_momentum_fuses(p, grad, state, h, velocity_scaling)
