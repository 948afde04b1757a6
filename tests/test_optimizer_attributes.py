"""The optimiser's attributes as PopTorch's user guide describes them: the
DEBUG description of the compiled update (which attributes are constants),
the warning for attributes added after compiling, and SGD's per-group velocity
scaling (combined variant), against torch's SGD on the CPU."""
import logging

import pytest
import torch

import poptorch
from poptorch._logging import logger

from test_optim import batch, net


@pytest.fixture
def log(caplog, monkeypatch):
    monkeypatch.setattr(logger, "propagate", True)
    caplog.set_level(logging.DEBUG, logger="poptorch")
    return caplog


def lines(log, text):
    found = [r.getMessage() for r in log.records if text in r.getMessage()]
    log.clear()
    return found


def groups_of(model):
    return [{"params": model.l1.parameters()}, {"params": model.l2.parameters()}]


def test_the_compiled_update_is_described_with_its_constants(log):
    model = net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                   accum_type=torch.float16)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    training(*batch(0))
    [default] = lines(log, "Updating graph optimizer with")
    assert default.startswith("Updating graph optimizer with SGD2, defaultDampening=0 (const), "
                              "defaultLearningRate=0.05, defaultMomentum=0.9, ")
    assert "lossScaling=1 (const)" in default and "accumType=float16" in default
    # Values the device has already: nothing is updated, nothing said.
    training.setOptimizer(optimizer)
    training(*batch(1))
    assert not lines(log, "optimizer with")
    optimizer.param_groups[0]["lr"] = 0.01
    training.setOptimizer(optimizer)
    [group] = lines(log, "Updating group 0 optimizer with")
    assert "learningRate=0.01," in group and "momentum=0.9," in group
    assert "weightDecay=0 (const)" in group


def test_torch_optimizers_hold_their_default_values_as_constants(log):
    model = net()
    training = poptorch.trainingModel(model, optimizer=torch.optim.Adam(
        model.parameters(), lr=0.01, eps=1e-6))
    training(*batch(0))
    [group] = lines(log, "Updating group 0 optimizer with ADAM")
    assert "learningRate=0.01," in group and "eps=1e-06," in group  # differs: variable
    assert "beta1=0.9 (const)" in group and "weightDecay=0 (const)" in group


@pytest.mark.parametrize("relax, level", [(False, logging.WARNING), (True, logging.DEBUG)])
def test_attributes_added_after_compiling_are_reported_once(log, relax, level):
    model = net()
    optimizer = poptorch.optim.SGD(groups_of(model), lr=0.05)
    training = poptorch.trainingModel(
        model, poptorch.Options().relaxOptimizerAttributesChecks(relax), optimizer)
    training(*batch(0))
    optimizer.lr = 0.5  # a mistake: the learning rate is param_groups[i]["lr"]
    optimizer.param_groups[1]["loss_scaling"] = 4.0  # not a group attribute
    for _ in range(2):
        training.setOptimizer(optimizer)
    reports = [r for r in log.records if "Ignoring unexpected" in r.getMessage()]
    assert sorted(r.getMessage().split(":")[0] for r in reports) == [
        "Ignoring unexpected group 1 attribute in SGD2 optimizer",
        "Ignoring unexpected optimizer attribute in SGD2 optimizer"]
    assert all(r.levelno == level for r in reports)
    assert "['lr']" in reports[0].getMessage() + reports[1].getMessage()


def test_attributes_present_when_compiling_are_not_reported(log):
    model = net()
    optimizer = poptorch.optim.SGD(groups_of(model), lr=0.05)
    optimizer.step_count = 0
    for group in optimizer.param_groups:
        group["initial_lr"] = 0.05
    training = poptorch.trainingModel(model, optimizer=optimizer)
    training(*batch(0))
    training.setOptimizer(optimizer)
    assert not lines(log, "Ignoring unexpected")


def test_an_lr_scheduler_made_after_compiling_is_not_reported(log):
    # It wraps optimizer.step (an attribute of the optimiser) and its step()
    # changes the learning rate, which the next call takes.
    model = net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    training(*batch(0))
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.5)
    scheduler.step()
    training(*batch(1))
    training.setOptimizer(optimizer)
    assert not lines(log, "unexpected optimizer attribute")


def test_adam_takes_amsgrad_as_an_attribute_passed():
    model = net()
    assert not poptorch.optim.Adam(model.parameters(), amsgrad=False).variable_attrs.isConstant(
        "amsgrad")
    assert poptorch.optim.Adam(model.parameters()).variable_attrs.isConstant("amsgrad")


def sgd_steps(model, make_optimizer, change_at=None):
    """Weights after 4 steps; at step ``change_at`` group 1's velocity scaling
    becomes 16 (on the ipu: setOptimizer)."""
    optimizer = make_optimizer(groups_of(model))
    training = poptorch.trainingModel(model, optimizer=optimizer) if isinstance(
        optimizer, poptorch.optim.SGD) else None
    for step in range(4):
        if step == change_at and training is not None:
            optimizer.param_groups[1]["velocity_scaling"] = 16.0
            training.setOptimizer(optimizer)
        if training is not None:
            training(*batch(step))
        else:
            optimizer.zero_grad()
            model(*batch(step))[1].backward()
            optimizer.step()
    return model


@pytest.mark.parametrize("change_at", [None, 2])
def test_combined_sgd_velocity_scaling_per_group_trains_as_torch_sgd(change_at):
    cpu = sgd_steps(net(), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))

    def combined(groups):
        groups[0]["velocity_scaling"] = 4.0
        return poptorch.optim.SGD(groups, lr=0.05, momentum=0.9, use_combined_accum=True,
                                  velocity_scaling=0.5)

    optimizer_model = net()
    sgd_steps(optimizer_model, combined, change_at)
    for ours, theirs in zip(optimizer_model.parameters(), cpu.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_combined_sgd_puts_velocity_scaling_in_its_groups():
    model = net()
    combined = poptorch.optim.SGD(groups_of(model), lr=0.1, use_combined_accum=True,
                                  velocity_scaling=2.0)
    assert [g["velocity_scaling"] for g in combined.param_groups] == [2.0, 2.0]
    separate = poptorch.optim.SGD(model.parameters(), lr=0.1)
    assert "velocity_scaling" not in separate.param_groups[0]


def test_a_constant_velocity_scaling_cannot_change():
    model = net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                   use_combined_accum=True)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    training(*batch(0))
    optimizer.param_groups[0]["velocity_scaling"] = 8.0
    with pytest.raises(poptorch.Error, match="'velocity_scaling' is a constant"):
        training.setOptimizer(optimizer)


def test_the_separate_sgd_ignores_velocity_scaling_in_poptorch_s_words(log):
    # The user guide gives velocity scaling to the combined variant only:
    # PopTorch's separate variant ignores it and says so when it is given. A
    # change after compiling was silently ignored; it is said once, while the
    # learning rate changed beside it is taken. Training and the state dict
    # are torch's SGD's (the velocity is not held scaled).
    ignored = "velocity_scaling value ignored when using the separate variant"
    model, cpu = net(), net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                   velocity_scaling=4.0)
    assert len(lines(log, ignored)) == 1
    cpu_optimizer = torch.optim.SGD(cpu.parameters(), lr=0.05, momentum=0.9)
    training = poptorch.trainingModel(model, optimizer=optimizer)
    for step in range(5):
        if step in (2, 3):
            optimizer.velocity_scaling = 16.0 * step
            for o in (optimizer, cpu_optimizer):
                o.param_groups[0]["lr"] = 0.02 * step
        training(*batch(step))
        cpu_optimizer.zero_grad()
        cpu(*batch(step))[1].backward()
        cpu_optimizer.step()
    assert len(lines(log, ignored)) == 1
    for ours, theirs in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    state, cpu_state = optimizer.state_dict()["state"], cpu_optimizer.state_dict()["state"]
    for index, entry in cpu_state.items():
        torch.testing.assert_close(state[index]["momentum_buffer"], entry["momentum_buffer"],
                                   rtol=1e-5, atol=1e-6)


def test_a_separate_sgd_without_velocity_scaling_says_nothing(log):
    model = net()
    training = poptorch.trainingModel(model, optimizer=poptorch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9))
    training(*batch(0))
    assert not lines(log, "velocity_scaling")
