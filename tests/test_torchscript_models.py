"""TorchScript modules (``torch.jit.script`` / ``torch.jit.trace``) under inferenceModel and
trainingModel, as the whole model or as a submodule: the CPU's results, their plain attributes
guarded like a Python module's (a changed ``scale`` captures the step again), and the
annotations that need Python hooks refused with an error that says what to do."""
import pytest
import torch

import poptorch

# torch.jit is deprecated in favour of torch.compile, and still what these users have
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.scale = 2.0
        self.use_relu = True

    def forward(self, x):
        y = self.norm(self.lin(x)) * self.scale
        return y.relu() if self.use_relu else y


class WithLoss(torch.nn.Module):
    """A Python model calling a TorchScript submodule."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x, target):
        out = self.body(x)
        return out, torch.nn.functional.mse_loss(out, target)


class ScriptedLoss(torch.nn.Module):
    """A whole training model in TorchScript, returning its loss."""

    def __init__(self):
        super().__init__()
        self.body = Scaled()

    def forward(self, x, target):
        out = self.body(x)
        return out, torch.nn.functional.mse_loss(out, target)


def twins(make):
    """Two TorchScript modules with the same weights (deepcopy of a ScriptModule gives
    parameters that are not leaves)."""
    first = torch.jit.script(make())
    second = torch.jit.script(make())
    second.load_state_dict(first.state_dict())
    return first, second


def test_inference_of_a_scripted_model_and_its_changed_attributes():
    torch.manual_seed(0)
    model, reference = twins(Scaled)
    model.eval()
    reference.eval()
    ipu = poptorch.inferenceModel(model)
    x = torch.randn(5, 6)
    torch.testing.assert_close(ipu(x), reference(x))
    torch.testing.assert_close(ipu(x + 1), reference(x + 1))  # the same step, new values
    for name, value in (("scale", 3.0), ("use_relu", False)):
        setattr(model, name, value)
        setattr(reference, name, value)
        torch.testing.assert_close(ipu(x), reference(x), msg=name)
    model.scale = 2.0  # back to the first value: its specialisation again
    reference.scale = 2.0
    torch.testing.assert_close(ipu(x), reference(x))


def test_inference_of_a_traced_model():
    torch.manual_seed(0)
    body = Scaled().eval()
    x = torch.randn(5, 6)
    traced = torch.jit.trace(body, x)
    ipu = poptorch.inferenceModel(traced)
    for inputs in (x, x * 2):
        torch.testing.assert_close(ipu(inputs), body(inputs))


@pytest.mark.parametrize("whole", [False, True], ids=["submodule", "whole-model"])
def test_training_a_scripted_model(whole):
    torch.manual_seed(0)
    if whole:
        model, reference = twins(ScriptedLoss)
    else:
        bodies = twins(Scaled)
        model, reference = WithLoss(bodies[0]), WithLoss(bodies[1])
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(),
                                                                       lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x, target = torch.randn(8, 6), torch.randn(8, 4)
        _, loss = training(x, target)
        optimizer.zero_grad()
        _, ref_loss = reference(x, target)
        ref_loss.backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss.detach(), msg=f"step {step}")
    training.copyWeightsToHost()
    for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)  # weights and running statistics


def test_begin_block_on_a_scripted_module_is_refused():
    scripted = torch.jit.script(Scaled())
    with pytest.raises(poptorch.Error, match="TorchScript module.*poptorch.Block"):
        poptorch.BeginBlock(scripted, ipu_id=1)
