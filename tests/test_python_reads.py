"""Python values a wrapped model's forward reads (``self.scale``, ``if self.flag:``, a
global): the step is specialised on them and guarded, as torch.compile guards them, so a
changed value gives the CPU's result, never the first call's (poptorch/_python_reads.py)."""
import copy
import logging
from typing import List

import pytest
import torch

import poptorch

SCALE = 2.0  # read by ReadsAGlobal.forward


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: List[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def logged():
    records = Records()
    poptorch.logger.addHandler(records)
    yield records.messages
    poptorch.logger.removeHandler(records)


class Scales(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.use_relu = True

    def forward(self, x):
        out = self.lin(x)
        return torch.relu(out) if self.use_relu else out - 1


class Reshapes(torch.nn.Module):
    """An int attribute in a shape: the output's shape follows it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.rows = 3

    def forward(self, x):
        return self.lin(x).reshape(self.rows, -1)


class Permutes(torch.nn.Module):
    """A tuple attribute (replaced) and a list attribute (changed in place)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.dims = (0, 1)
        self.weights = [1.0, 2.0]

    def forward(self, x):
        out = self.lin(x).reshape(2, 2, 6).permute(*self.dims, 2)
        return out * self.weights[0] + self.weights[1]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.p = 0.5

    def forward(self, x):
        return self.lin(x).clamp(min=-self.p, max=self.p)


class ReadsASubmodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x) + 1


class ReadsAGlobal(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return _shifted(self.lin(x) * SCALE)


def _shifted(x):
    return x + SCALE  # a helper forward calls reads the global too


class Config:
    """A Hugging Face-like config object that forward reads through."""

    def __init__(self):
        self.mult = 3.0


class ReadsAConfig(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.config = Config()

    def forward(self, x):
        return self.lin(x) * self.config.mult


class NestedConfig:
    """A research code's nested configuration (cfg.model.head.mult)."""

    def __init__(self):
        self.model = Config()
        self.model.head = Config()


class ReadsANestedConfig(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.cfg = NestedConfig()

    def forward(self, x):
        return self.lin(x) * self.cfg.model.head.mult


class ClassScale(torch.nn.Module):
    scale = 2.0  # a default in the class body, which an instance attribute may shadow

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return self.lin(x) * self.scale


class ClassScaleChanged(ClassScale):
    """Its own class, as the test changes the class attribute."""


def _set_global(value):
    global SCALE  # pylint: disable=global-statement
    SCALE = value


CHANGES = {  # model, a change that makes forward compute something else, the change undone
    "float attribute": (Scales, lambda m: setattr(m, "scale", 3.0),
                        lambda m: setattr(m, "scale", 2.0)),
    "bool branch": (Branches, lambda m: setattr(m, "use_relu", False),
                    lambda m: setattr(m, "use_relu", True)),
    "int in a shape": (Reshapes, lambda m: setattr(m, "rows", 6),
                       lambda m: setattr(m, "rows", 3)),
    "tuple attribute": (Permutes, lambda m: setattr(m, "dims", (1, 0)),
                        lambda m: setattr(m, "dims", (0, 1))),
    "list changed in place": (Permutes, lambda m: m.weights.__setitem__(0, -1.0),
                              lambda m: m.weights.__setitem__(0, 1.0)),
    "submodule attribute": (ReadsASubmodule, lambda m: setattr(m.block, "p", 0.1),
                            lambda m: setattr(m.block, "p", 0.5)),
    "global": (ReadsAGlobal, lambda m: _set_global(-1.0), lambda m: _set_global(2.0)),
    "nested config attribute": (ReadsANestedConfig,
                                lambda m: setattr(m.cfg.model.head, "mult", -2.0),
                                lambda m: setattr(m.cfg.model.head, "mult", 3.0)),
    "class attribute shadowed": (ClassScale, lambda m: setattr(m, "scale", 3.0),
                                 lambda m: delattr(m, "scale")),
    "class attribute changed": (ClassScaleChanged,
                                lambda m: setattr(ClassScaleChanged, "scale", 3.0),
                                lambda m: setattr(ClassScaleChanged, "scale", 2.0)),
    "config attribute": (ReadsAConfig, lambda m: setattr(m.config, "mult", -2.0),
                         lambda m: setattr(m.config, "mult", 3.0)),
}


@pytest.fixture(autouse=True)
def _global_restored():
    yield
    _set_global(2.0)


@pytest.mark.parametrize("case", CHANGES)
def test_inference_follows_a_changed_python_value(case, logged):
    make, change, undo = CHANGES[case]
    torch.manual_seed(0)
    model = make().eval()
    wrapped = poptorch.inferenceModel(model)
    x = torch.randn(4, 6)
    torch.testing.assert_close(wrapped(x), model(x))
    change(model)
    expected = model(x)
    torch.testing.assert_close(wrapped(x), expected)  # the first value's result before
    assert any("capturing the step again (variant 2)" in m and "changed" in m
               for m in logged), logged
    torch.testing.assert_close(wrapped(x), expected)
    # Each value's specialisation is kept: going back (and forth) captures nothing.
    compiled = poptorch.metrics()["graphs_compiled"]
    undo(model)
    torch.testing.assert_close(wrapped(x), model(x))
    change(model)
    torch.testing.assert_close(wrapped(x), expected)
    assert poptorch.metrics()["graphs_compiled"] == compiled
    assert sum("capturing the step again" in m for m in logged) == 1


def test_the_log_names_the_attribute_and_its_values(logged):
    model = Scales()
    wrapped = poptorch.inferenceModel(model)
    wrapped(torch.randn(4, 6))
    wrapped.model.scale = 3.0  # through the wrapper: the same model
    wrapped(torch.randn(4, 6))
    line = Scales.forward.__code__.co_firstlineno + 1
    assert ("capturing the step again (variant 2): the model's attribute 'scale' changed "
            f"from 2.0 to 3.0, read at {__file__}:{line} (in forward)") in logged


def test_a_submodule_attribute_is_named_by_its_path(logged):
    model = ReadsASubmodule()
    wrapped = poptorch.inferenceModel(model)
    wrapped(torch.randn(4, 6))
    model.block.p = 0.25
    wrapped(torch.randn(4, 6))
    assert any("the model's attribute 'block.p' changed from 0.5 to 0.25" in m for m in logged)


class CountsEpochs(Scales):
    """An attribute forward never reads: changing it is free."""

    def __init__(self):
        super().__init__()
        self.epoch = 0


def test_a_value_forward_does_not_read_is_not_guarded(monkeypatch):
    monkeypatch.setenv("POPTORCH_MAX_STEP_VARIANTS", "1")
    model = CountsEpochs()
    wrapped = poptorch.inferenceModel(model)
    x = torch.randn(4, 6)
    wrapped(x)
    compiled = poptorch.metrics()["graphs_compiled"]
    for epoch in range(1, 12):
        model.epoch = epoch
        torch.testing.assert_close(wrapped(x), model(x))
    assert poptorch.metrics()["graphs_compiled"] == compiled


@pytest.mark.parametrize("accumulation", [1, 2])
def test_training_follows_a_changed_python_value_like_the_cpu(accumulation):
    torch.manual_seed(0)
    model = Branches()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.weight = 1.0

        def forward(self, x, y):
            out = self.inner(x)
            return out, torch.nn.functional.mse_loss(out, y) * self.weight

    ipu = poptorch.trainingModel(WithLoss(model), opts,
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    cpu = WithLoss(reference)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(8):
        # Both values change, at their own pace, and come back.
        for wrapper in (ipu.model, cpu):
            wrapper.inner.use_relu = step % 4 < 2
            wrapper.weight = 0.5 if step % 3 == 2 else 1.0
        xs = torch.randn(4 * accumulation, 6, generator=g)
        ys = torch.randn(4 * accumulation, 6, generator=g)
        _, loss = ipu(xs, ys)
        optimizer.zero_grad()
        for x, y in zip(xs.split(4), ys.split(4)):
            _, ref_loss = cpu(x, y)
            (ref_loss / accumulation).backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("limit", [1, 2])
def test_the_variant_limit_holds_from_the_first_extra_variant(monkeypatch, limit):
    monkeypatch.setenv("POPTORCH_MAX_STEP_VARIANTS", str(limit))
    model = Scales()
    wrapped = poptorch.inferenceModel(model)
    x = torch.randn(4, 6)
    wrapped(x)
    for extra in range(1, limit):
        model.scale = 2.0 + extra
        torch.testing.assert_close(wrapped(x), model(x))
    model.scale = -1.0
    with pytest.raises(poptorch.Error, match=r"the model's attribute 'scale' changed from "
                       r".* to -1\.0, read at .*test_python_reads.py:\d+ \(in forward\).*"
                       r"POPTORCH_MAX_STEP_VARIANTS=" + str(limit)) as info:
        wrapped(x)
    assert "test_python_reads.py" in info.value.location  # the line of forward that read it
    model.scale = 2.0  # the variants kept still serve their values
    torch.testing.assert_close(wrapped(x), model(x))


class ReadsAnItem(torch.nn.Module):
    def forward(self, x):
        return x * x[0, 0].item()


def test_the_variant_limit_of_host_reads_holds_from_the_first_extra_variant(monkeypatch):
    monkeypatch.setenv("POPTORCH_MAX_STEP_VARIANTS", "1")
    wrapped = poptorch.inferenceModel(ReadsAnItem())
    wrapped(torch.ones(1, 2))
    with pytest.raises(poptorch.Error, match="POPTORCH_MAX_STEP_VARIANTS=1"):
        wrapped(torch.full((1, 2), 2.0))


def test_train_and_eval_switches_capture_nothing_and_keep_the_steps_modes(logged):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5))
    wrapped = poptorch.inferenceModel(model.eval())
    x = torch.randn(4, 6)
    expected = model(x)
    wrapped(x)
    model.train()
    torch.testing.assert_close(wrapped(x), expected)  # the step keeps its eval mode
    model.eval()
    torch.testing.assert_close(wrapped(x), expected)
    assert not any("capturing the step again" in m for m in logged)


class Activates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def test_an_activation_swapped_after_compiling_is_followed(logged):
    model = Activates()
    wrapped = poptorch.inferenceModel(model)
    x = torch.randn(4, 6)
    torch.testing.assert_close(wrapped(x), model(x))
    model.act = torch.nn.GELU()
    torch.testing.assert_close(wrapped(x), model(x))
    assert any("the model's submodule 'act' changed from ReLU() to GELU" in m for m in logged)
    model.act = torch.nn.Tanh()
    torch.testing.assert_close(wrapped(x), model(x))


def test_a_module_with_weights_swapped_after_compiling_is_an_error_naming_it():
    model = Activates()
    wrapped = poptorch.inferenceModel(model)
    wrapped(torch.randn(4, 6))
    model.act = torch.nn.Linear(6, 6)  # its weights are not the step's
    with pytest.raises(poptorch.Error, match="submodule 'act' was replaced.*destroy"):
        wrapped(torch.randn(4, 6))


def test_a_closure_variable_forward_reads_is_guarded():
    offset = 1.0

    class Shifts(torch.nn.Module):
        def forward(self, x):
            return x + offset

    wrapped = poptorch.inferenceModel(Shifts())
    x = torch.randn(4, 6)
    torch.testing.assert_close(wrapped(x), x + 1.0)
    offset = 5.0
    torch.testing.assert_close(wrapped(x), x + 5.0)


def test_the_model_classes_are_restored_after_the_capture():
    model = ReadsASubmodule()
    classes = [type(m) for m in model.modules()]
    poptorch.inferenceModel(model)(torch.randn(4, 6))
    assert [type(m) for m in model.modules()] == classes
