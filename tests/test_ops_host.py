"""Ops that run host code inside an IPU program: poptorch.CPU (called back
with each run's data) and custom ops registered with torch.library (in lazy
mode, inferenceModel and trainingModel, called directly or with
poptorch.custom_op), each against the CPU."""
import pytest
import torch

import poptorch


class WithCallback(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = []
        self.cpu = poptorch.CPU(self.on_host, "OnHost")

    def on_host(self, x):
        self.calls.append(x.clone())
        return x * 2.0, x.sum(dim=-1)

    def forward(self, x):
        doubled, total = self.cpu(x + 1)
        return doubled - 1, total


def test_cpu_op_is_called_with_every_micro_batch():
    model = WithCallback()
    x = torch.arange(12.).reshape(4, 3)
    expected = [model(micro) for micro in x.split(1)]
    cpu_calls = model.calls
    model.calls = []
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    doubled, total = wrapped(x)
    torch.testing.assert_close(doubled, torch.cat([e[0] for e in expected]))
    torch.testing.assert_close(total, torch.cat([e[1] for e in expected]))
    # Once on zeros when the model is captured (for the output shapes, as in
    # PopTorch), then with each micro-batch's data.
    assert torch.equal(model.calls[0], torch.zeros(1, 3))
    assert len(model.calls) == 5
    for got, want in zip(model.calls[1:], cpu_calls):
        torch.testing.assert_close(got, want)
    model.calls = []
    wrapped(x + 10)  # replayed from C++: called again, with the new data
    assert len(model.calls) == 4
    torch.testing.assert_close(torch.cat(model.calls), x + 11)


def test_cpu_op_in_lazy_mode_runs_when_the_graph_runs():
    model = WithCallback()
    x = torch.tensor([[1.0, 2.0]])
    doubled, total = model.to("ipu")(x.to("ipu"))
    calls = len(model.calls)  # the capture call on zeros
    assert doubled.cpu().tolist() == [[3.0, 5.0]] and total.cpu().tolist() == [5.0]
    assert len(model.calls) == calls + 1


def test_cpu_op_errors():
    changing = poptorch.CPU(lambda x: x.sum() if x[0, 0] > 0 else x, "Changing")
    with pytest.raises(poptorch.Error, match="keep their shapes"):
        changing(torch.ones(1, 2).to("ipu")).cpu()
    need_grad = poptorch.CPU(lambda x: x * 2, "Grad")
    with pytest.raises(poptorch.Error, match="only supported in inference"):
        need_grad(torch.ones(2, requires_grad=True).to("ipu"))


class Raising(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cpu = poptorch.CPU(self.check, "Check")

    def check(self, x):
        if x.sum() > 5:
            raise ValueError("too large for the host op")
        return x

    def forward(self, x):
        return self.cpu(x)


def test_an_error_in_the_callback_is_raised_at_the_call():
    wrapped = poptorch.inferenceModel(Raising(), poptorch.Options().deviceIterations(2))
    torch.testing.assert_close(wrapped(torch.ones(2, 1)), torch.ones(2, 1))
    with pytest.raises(ValueError, match="too large for the host op"):
        wrapped(torch.full((2, 1), 10.0))


@torch.library.custom_op("poptorch_test::scaled_leaky_relu", mutates_args=(), device_types="cpu")
def scaled_leaky_relu(x: torch.Tensor, alpha: float, scale: float) -> torch.Tensor:
    return torch.where(x > 0, x, x * alpha) * scale


@scaled_leaky_relu.register_fake
def _(x, alpha, scale):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.alpha, ctx.scale = inputs[1], inputs[2]


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.where(x > 0, 1.0, ctx.alpha) * ctx.scale, None, None


scaled_leaky_relu.register_autograd(_backward, setup_context=_setup)


def test_custom_op_in_lazy_mode_is_one_node():
    x = torch.randn(5)
    out = torch.ops.poptorch_test.scaled_leaky_relu(x.to("ipu"), 0.1, 2.0)
    assert "poptorch_test::scaled_leaky_relu" in poptorch._C.pending_graph()
    torch.testing.assert_close(out.cpu(), scaled_leaky_relu(x, 0.1, 2.0))


class CustomModel(torch.nn.Module):
    def __init__(self, the_poptorch_way):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.the_poptorch_way = the_poptorch_way

    def forward(self, x, target):
        h = self.linear(x)
        if self.the_poptorch_way:
            (h,) = poptorch.custom_op([h], "scaled_leaky_relu", "poptorch_test", 1,
                                      example_outputs=[h],
                                      attributes={"alpha": 0.1, "scale": 2.0})
        else:
            h = scaled_leaky_relu(h, 0.1, 2.0)
        return h, ((h - target) ** 2).mean()


@pytest.mark.parametrize("the_poptorch_way", [False, True])
def test_custom_op_in_inference_and_training_models(the_poptorch_way):
    torch.manual_seed(0)
    model, reference = CustomModel(the_poptorch_way), CustomModel(False)
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(2 * 3, 4), torch.randn(2 * 3, 4)
    opts = poptorch.Options().deviceIterations(3)
    inference = poptorch.inferenceModel(model, opts)
    out, _ = inference(x, target)
    torch.testing.assert_close(out, torch.cat([reference(a, t)[0]
                                               for a, t in zip(x.split(2), target.split(2))]))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for a, t in zip(x.split(2), target.split(2)):
        optimizer.zero_grad()
        reference(a, t)[1].backward()
        optimizer.step()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(x, target)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach())


def test_custom_op_errors():
    x = torch.ones(2).to("ipu")
    with pytest.raises(poptorch.Error, match="no operator no_such::op is registered"):
        poptorch.custom_op([x], "op", "no.such", 1, [x])
    with pytest.raises(poptorch.Error, match="example_outputs"):
        poptorch.custom_op([x], "scaled_leaky_relu", "poptorch_test", 1, [x, x],
                           {"alpha": 0.1, "scale": 1.0})
    with pytest.raises(ValueError, match="keys must be strings"):
        poptorch.custom_op([x], "scaled_leaky_relu", "poptorch_test", 1, [x], {1: 0.1})
    with pytest.raises(ValueError, match="must all be the same"):
        poptorch.custom_op([x], "scaled_leaky_relu", "poptorch_test", 1, [x], {"a": [1, "b"]})
    with pytest.raises(ValueError, match="non-ASCII"):
        poptorch.custom_op([x], "scaled_leaky_relu", "poptorch_test", 1, [x], {"a": "é"})
