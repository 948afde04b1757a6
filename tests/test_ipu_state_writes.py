"""load_state_dict writes the ``ipu_state`` and ``ipu_param`` entries of a
PopTorch state dict to the device (PopTorch's "read/write optimizer state
to/from the IPU"): training goes on from the written values as torch's
optimiser does on the CPU from the same state."""
import copy

import pytest
import torch

import poptorch

from test_optim import batch, net


def trained(make_optimizer, steps=2):
    model = net()
    optimizer = make_optimizer(model.parameters())
    training = poptorch.trainingModel(model, optimizer=optimizer)
    for step in range(steps):
        training(*batch(step))
    return model, optimizer, training


def cpu_step(model, state, lr, step):
    """One step of torch's Adam on a copy of ``model`` from ``state``."""
    cpu_model = copy.deepcopy(model)
    cpu = torch.optim.Adam(cpu_model.parameters(), lr=lr)
    cpu.load_state_dict(state)
    cpu.zero_grad()
    cpu_model(*batch(step))[1].backward()
    cpu.step()
    return cpu_model


def test_written_state_and_hyper_parameters_are_what_the_next_step_uses():
    model, optimizer, training = trained(lambda p: poptorch.optim.Adam(p, lr=0.01))
    state = copy.deepcopy(optimizer.state_dict())
    state["ipu_state"]["exp_avg___0"] = torch.full_like(state["ipu_state"]["exp_avg___0"], 0.5)
    state["ipu_param"]["lr___group0"] = torch.tensor(0.03)
    optimizer.load_state_dict(state)
    read = optimizer.state_dict()
    assert torch.equal(read["ipu_state"]["exp_avg___0"], state["ipu_state"]["exp_avg___0"])
    assert float(read["ipu_param"]["lr___group0"]) == pytest.approx(0.03)
    # The CPU's reference: the same state, with the written moment, and lr 0.03.
    reference_state = copy.deepcopy(optimizer.state_dict())
    reference_state["param_groups"][0]["lr"] = 0.03
    expected = cpu_step(model, reference_state, 0.03, 2)
    training(*batch(2))
    for ours, theirs in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)  # writes move it by ~lr


def test_some_entries_may_be_written():
    _, optimizer, _ = trained(lambda p: poptorch.optim.SGD(p, lr=0.01, momentum=0.9))
    state = copy.deepcopy(optimizer.state_dict())
    before = optimizer.state_dict()["ipu_state"]
    written = {"momentum_buffer___1": torch.ones_like(state["ipu_state"]["momentum_buffer___1"])}
    optimizer.load_state_dict({**state, "ipu_state": written, "ipu_param": None})
    after = optimizer.state_dict()["ipu_state"]
    assert torch.equal(after["momentum_buffer___1"], written["momentum_buffer___1"])
    assert torch.equal(after["momentum_buffer___0"], before["momentum_buffer___0"])


def test_entries_loaded_before_a_model_uses_the_optimiser_go_to_its_device():
    _, optimizer, _ = trained(lambda p: poptorch.optim.Adam(p, lr=0.01))
    state = copy.deepcopy(optimizer.state_dict())
    state["ipu_state"]["exp_avg_sq___3"] = torch.full_like(state["ipu_state"]["exp_avg_sq___3"],
                                                           2.0)
    model = net()
    fresh = poptorch.optim.Adam(model.parameters(), lr=0.01)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.state_dict()["ipu_state"]["exp_avg_sq___3"],
                       state["ipu_state"]["exp_avg_sq___3"]), "kept until then"
    training = poptorch.trainingModel(model, optimizer=fresh)
    training.compile(*batch(0))
    assert torch.equal(fresh.state_dict()["ipu_state"]["exp_avg_sq___3"],
                       state["ipu_state"]["exp_avg_sq___3"])


@pytest.mark.parametrize("kind, key, value, match", [
    ("ipu_state", "Accl1___model.lin.weight", torch.zeros(3), "has 'Accl1___model.lin.weight'"),
    ("ipu_param", "momentum___group0", torch.tensor(0.5), "constant hyper-parameters"),
    ("ipu_state", "exp_avg___0", torch.zeros(2), "has shape \\[2\\]"),
])
def test_an_entry_the_device_has_not_is_an_error(kind, key, value, match):
    _, optimizer, _ = trained(lambda p: poptorch.optim.Adam(p, lr=0.01))
    state = copy.deepcopy(optimizer.state_dict())
    state[kind] = {key: value}
    with pytest.raises(poptorch.Error, match=match):
        optimizer.load_state_dict(state)
