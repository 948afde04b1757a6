"""poptorch.optim: PopTorch's attributes against hand-written CPU references of
PopTorch's documented rules, for the host step() and for trainingModel."""
import copy
import logging
import pickle

import pytest
import torch

import poptorch
from poptorch._logging import logger


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(4, 3)
        self.l2 = torch.nn.Linear(3, 2)

    def forward(self, x, y):
        out = self.l2(torch.tanh(self.l1(x)))
        return out, ((out - y) ** 2).mean()


def batch(step, rows=4):
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)


STEPS = range(4)


def net():
    torch.manual_seed(0)
    return Net()


def host_training(make_optimizer):
    """The weights after STEPS steps of optimizer.step() on the CPU."""
    model = net()
    optimizer = make_optimizer(model.parameters())
    for step in STEPS:
        optimizer.zero_grad()
        model(*batch(step))[1].backward()
        optimizer.step()
    return model


def ipu_training(make_optimizer, options=None):
    """The weights after STEPS calls of a trainingModel."""
    model = net()
    training = poptorch.trainingModel(model, options, make_optimizer(model.parameters()))
    for step in STEPS:
        training(*batch(step))
    return model


def reference_training(update):
    """The weights after STEPS steps of a hand-written rule:
    update(params, grads, state) changes params in place."""
    model = net()
    state = {}
    for step in STEPS:
        model.zero_grad()
        model(*batch(step))[1].backward()
        with torch.no_grad():
            update(list(model.parameters()), [p.grad.clone() for p in model.parameters()], state)
    return model


def assert_same_weights(model, reference, rtol=1e-5, atol=1e-6):
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{name}: {m}")


def adamw_without_bias_correction(lr, betas, eps, weight_decay):
    """PopTorch's AdamW(bias_correction=False):
    p -= lr * (m / (sqrt(v) + eps) + weight_decay * p)."""
    def update(params, grads, state):
        for i, (p, g) in enumerate(zip(params, grads)):
            m, v = state.setdefault(i, (torch.zeros_like(p), torch.zeros_like(p)))
            m.mul_(betas[0]).add_((1 - betas[0]) * g)
            v.mul_(betas[1]).add_((1 - betas[1]) * g * g)
            p.sub_(lr * (m / (v.sqrt() + eps) + weight_decay * p))
    return update


def rmsprop_tf(lr, alpha, eps, weight_decay, momentum, centered):
    """TensorFlow's RMSprop as PopTorch documents it: squares start at one, eps
    under the square root, lr accumulated in the momentum buffer."""
    def update(params, grads, state):
        for i, (p, g) in enumerate(zip(params, grads)):
            v, mean, buf = state.setdefault(
                i, (torch.ones_like(p), torch.zeros_like(p), torch.zeros_like(p)))
            g = g + weight_decay * p
            v.mul_(alpha).add_((1 - alpha) * g * g)
            if centered:
                mean.mul_(alpha).add_((1 - alpha) * g)
                d = torch.sqrt(v - mean * mean + eps)
            else:
                d = torch.sqrt(v + eps)
            if momentum:
                buf.mul_(momentum).add_(lr * g / d)
                p.sub_(buf)
            else:
                p.sub_(lr * g / d)
    return update


def lamb(lr, betas, eps, weight_decay, max_weight_norm, bias_correction=True):
    """PopTorch's LAMB: u = m / (sqrt(v) + eps) + wd * p (bias-corrected moments),
    p -= lr * min(||p||, max_weight_norm) / ||u|| * u (1 if ||p|| or ||u|| is 0)."""
    def update(params, grads, state):
        for i, (p, g) in enumerate(zip(params, grads)):
            m, v, step = state.setdefault(i, [torch.zeros_like(p), torch.zeros_like(p), 0])
            step += 1
            state[i][2] = step
            m.mul_(betas[0]).add_((1 - betas[0]) * g)
            v.mul_(betas[1]).add_((1 - betas[1]) * g * g)
            c1 = 1 - betas[0] ** step if bias_correction else 1
            c2 = 1 - betas[1] ** step if bias_correction else 1
            u = (m / c1) / ((v / c2).sqrt() + eps) + weight_decay * p
            r1, r2 = p.norm(), u.norm()
            trust = r1.clamp(max=max_weight_norm) / r2 if r1 > 0 and r2 > 0 else 1.0
            p.sub_(lr * trust * u)
    return update


RULES = {
    "AdamW-no-bias-correction": (
        lambda p: poptorch.optim.AdamW(p, lr=0.05, betas=(0.8, 0.95), eps=1e-6,
                                       weight_decay=0.1, bias_correction=False),
        adamw_without_bias_correction(0.05, (0.8, 0.95), 1e-6, 0.1)),
    "RMSprop-tf": (
        lambda p: poptorch.optim.RMSprop(p, lr=0.02, alpha=0.9, eps=1e-3, use_tf_variant=True),
        rmsprop_tf(0.02, 0.9, 1e-3, 0.0, 0.0, False)),
    "RMSprop-tf-momentum-centered-decay": (
        lambda p: poptorch.optim.RMSprop(p, lr=0.02, alpha=0.9, eps=1e-3, weight_decay=0.05,
                                         momentum=0.7, centered=True, use_tf_variant=True),
        rmsprop_tf(0.02, 0.9, 1e-3, 0.05, 0.7, True)),
    "LAMB": (lambda p: poptorch.optim.LAMB(p, lr=0.02, weight_decay=0.01),
             lamb(0.02, (0.9, 0.999), 1e-8, 0.01, 65500.0)),
    "LAMB-no-bias-correction-max-weight-norm": (
        lambda p: poptorch.optim.LAMB(p, lr=0.02, bias_correction=False, max_weight_norm=0.5),
        lamb(0.02, (0.9, 0.999), 1e-8, 0.01, 0.5, bias_correction=False)),
    "LAMB-max-weight-norm-0": (  # a trust ratio of 0: the weights do not move
        lambda p: poptorch.optim.LAMB(p, lr=0.02, max_weight_norm=0.0),
        lamb(0.02, (0.9, 0.999), 1e-8, 0.01, 0.0)),
}


def test_lamb_max_weight_norm_is_a_variable():
    """Passed to the constructor, it changes with setOptimizer, as in PopTorch."""
    model = net()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = poptorch.optim.LAMB(model.parameters(), lr=0.02, max_weight_norm=0.0)
    training = poptorch.trainingModel(model, None, optimizer)
    training(*batch(0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    optimizer.max_weight_norm = 100.0
    training.setOptimizer(optimizer)
    training(*batch(1))
    assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_host_step_follows_poptorch_rule(name):
    optimizer, rule = RULES[name]
    assert_same_weights(host_training(optimizer), reference_training(rule))


@pytest.mark.parametrize("name", sorted(RULES))
def test_the_ipu_update_follows_poptorch_rule(name):
    optimizer, rule = RULES[name]
    assert_same_weights(ipu_training(optimizer), reference_training(rule))


def clipped(make_torch_optimizer, max_norm):
    """torch's step after torch.nn.utils.clip_grad_norm_."""
    def update(params, grads, state):
        if "optimizer" not in state:
            state["optimizer"] = make_torch_optimizer(params)
        for p, g in zip(params, grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        state["optimizer"].step()
    return update


@pytest.mark.parametrize("poptorch_class, torch_class, kwargs", [
    (poptorch.optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (poptorch.optim.Adam, torch.optim.Adam, dict(lr=0.05)),
    (poptorch.optim.RMSprop, torch.optim.RMSprop, dict(lr=0.01)),
])
def test_max_grad_norm_clips_on_the_host_and_on_the_ipu(poptorch_class, torch_class, kwargs):
    reference = reference_training(clipped(lambda p: torch_class(p, **kwargs), 0.05))
    make = lambda p: poptorch_class(p, max_grad_norm=0.05, **kwargs)  # noqa: E731
    assert_same_weights(host_training(make), reference)
    assert_same_weights(ipu_training(make), reference)


def test_sgd_accumulates_gradients_in_its_accum_type():
    """gradientAccumulation(2) with accum_type=float16: each micro-batch's gradient
    is added in float16, the mean then drives a plain SGD step."""
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)

    def accumulated_reference(dtype):
        model = net()
        for step in STEPS:
            x, y = batch(step, rows=8)
            sums = [torch.zeros_like(p, dtype=dtype) for p in model.parameters()]
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                model.zero_grad()
                model(xs, ys)[1].backward()
                for total, p in zip(sums, model.parameters()):
                    total.add_(p.grad.to(dtype))
            with torch.no_grad():
                for total, p in zip(sums, model.parameters()):
                    p.sub_(0.5 * (total.float() * 0.5))
        return model

    model = net()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.5, accum_type=torch.float16)
    assert optimizer.accum_type is torch.float16
    training = poptorch.trainingModel(model, opts, optimizer)
    for step in STEPS:
        training(*batch(step, rows=8))
    assert_same_weights(model, accumulated_reference(torch.float16), rtol=0, atol=1e-6)
    differences = [float((a - b).abs().max()) for a, b in zip(
        model.parameters(), accumulated_reference(torch.float32).parameters())]
    assert max(differences) > 1e-5, "float32 accumulation would give other weights"


def test_accum_types_are_validated_and_default_to_float32():
    params = net().parameters()
    assert poptorch.optim.Adam(params).first_order_momentum_accum_type is torch.float32
    with pytest.raises(poptorch.Error, match="velocity_accum_type must be torch.float16"):
        poptorch.optim.SGD(net().parameters(), lr=0.1, velocity_accum_type=torch.int32)


def test_torch_adam_with_decoupled_weight_decay_trains_as_on_the_cpu():
    make = lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.2,  # noqa: E731
                                      decoupled_weight_decay=True)
    assert_same_weights(ipu_training(make), host_training(make))


def test_torch_implementation_flags_are_accepted():
    model = net()
    for optimizer in (poptorch.optim.SGD(model.parameters(), lr=0.1, foreach=True),
                      poptorch.optim.Adam(model.parameters(), foreach=False, fused=True),
                      poptorch.optim.AdamW(model.parameters(), capturable=False),
                      poptorch.optim.RMSprop(model.parameters(), foreach=True)):
        model(*batch(0))[1].backward()
        optimizer.step()  # torch's implementation it chose


# --- state dicts ----------------------------------------------------------------

def test_state_dict_has_torch_layout_and_poptorch_ipu_keys():
    model = net()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.01, loss_scaling=2.0)
    state = optimizer.state_dict()
    assert state["ipu_state"] is None and state["ipu_param"] is None, "not on an IPU yet"
    training = poptorch.trainingModel(model, None, optimizer)
    for step in STEPS:
        training(*batch(step))
    state = optimizer.state_dict()
    assert sorted(state["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert set(state["ipu_state"]) == {f"{name}___{index}" for index in range(4)
                                       for name in ("exp_avg", "exp_avg_sq", "step")}
    assert all(isinstance(t, torch.Tensor) for t in state["ipu_state"].values())
    torch.testing.assert_close(state["ipu_state"]["exp_avg___2"], state["state"][2]["exp_avg"])
    assert set(state["ipu_param"]) == {"lr___group0", "loss_scaling"}, "the variables"
    assert float(state["ipu_param"]["loss_scaling"]) == 2.0
    # The torch part loads into torch's Adam, on the CPU, and back.
    cpu_model = net()
    cpu = torch.optim.Adam(cpu_model.parameters(), lr=0.01)
    cpu.load_state_dict(copy.deepcopy(state))
    torch.testing.assert_close(cpu.state[next(cpu_model.parameters())]["exp_avg"],
                               state["state"][0]["exp_avg"])
    again = poptorch.optim.Adam(net().parameters(), lr=0.01)
    again.load_state_dict(copy.deepcopy(state))
    # Kept until a model uses the optimiser (tests/test_ipu_state_writes.py).
    assert set(again.state_dict()["ipu_state"]) == set(state["ipu_state"])


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_state_has_the_keys_of_torch_rmsprop(centered):
    # torch keeps the average gradient only when centred (the momentum
    # buffer, which torch makes only for a momentum, is ours always: it may be
    # a variable).
    make = lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=centered)  # noqa
    cpu_model = net()
    cpu = make(cpu_model.parameters())
    cpu_model(*batch(0))[1].backward()
    cpu.step()
    model = net()
    optimizer = make(model.parameters())
    poptorch.trainingModel(model, None, optimizer)(*batch(0))
    assert sorted(optimizer.state_dict()["state"][0]) == sorted(cpu.state_dict()["state"][0])


def test_a_model_compiled_for_an_offline_ipu_has_no_ipu_state():
    # Its state is on no device (it cannot run), as PopTorch's state dict says;
    # the same model compiled for the emulated IPU has it.
    for offline, expected_none in ((True, True), (False, False)):
        model = net()
        optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        options = poptorch.Options()
        if offline:
            options.useOfflineIpuTarget()
        training = poptorch.trainingModel(model, options, optimizer)
        training.compile(*batch(0))
        state = optimizer.state_dict()  # while the wrapper uses the optimiser
        assert (state["ipu_state"] is None) is expected_none
        assert (state["ipu_param"] is None) is expected_none


@pytest.mark.parametrize("round_trip", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))])
def test_copies_keep_poptorch_attributes(round_trip):
    optimizer = poptorch.optim.RMSprop(net().parameters(), lr=0.1, loss_scaling=8.0,
                                       use_tf_variant=True, accum_type=torch.float16)
    optimizer.variable_attrs.markAsVariable("alpha")
    clone = round_trip(optimizer)
    assert (clone.loss_scaling, clone.use_tf_variant, clone.accum_type) == (
        8.0, True, torch.float16)
    assert not clone.variable_attrs.isConstant("alpha")


def test_variable_attributes_take_betas_for_both_betas():
    optimizer = poptorch.optim.Adam(net().parameters())
    assert optimizer.variable_attrs.isConstant("betas")
    optimizer.variable_attrs.markAsVariable("betas")
    assert not optimizer.variable_attrs.isConstant("beta1")
    assert not optimizer.variable_attrs.isConstant("beta2")
    with pytest.raises(poptorch.Error, match="unknown optimiser attribute 'gamma'"):
        optimizer.variable_attrs.markAsConstant("gamma")


def test_poptorch_optimizers_derive_from_poptorch_optim_optimizer():
    for cls in (poptorch.optim.SGD, poptorch.optim.Adam, poptorch.optim.AdamW,
                poptorch.optim.RMSprop, poptorch.optim.LAMB):
        assert issubclass(cls, poptorch.optim.Optimizer)
        assert issubclass(cls, torch.optim.Optimizer)


# --- attributes the IPU's update ignores ----------------------------------------

@pytest.fixture
def log(caplog, monkeypatch):
    monkeypatch.setattr(logger, "propagate", True)
    caplog.set_level(logging.DEBUG, logger="poptorch")
    return caplog


@pytest.mark.parametrize("relax, level", [(False, logging.WARNING), (True, logging.DEBUG)])
def test_an_ignored_group_attribute_is_reported_once(log, relax, level):
    model = net()
    optimizer = torch.optim.SGD([{"params": model.l1.parameters(), "tag": "encoder"},
                                 {"params": model.l2.parameters(), "tag": "head"}],
                                lr=0.1, foreach=True)
    opts = poptorch.Options().relaxOptimizerAttributesChecks(relax)
    training = poptorch.trainingModel(model, opts, optimizer)
    training(*batch(0))
    training.setOptimizer(optimizer)
    reports = [r for r in log.records if "optimiser attribute" in r.getMessage()]
    assert len(reports) == 1 and reports[0].levelno == level
    assert "'tag' ('encoder', param group 0) is ignored" in reports[0].getMessage()
