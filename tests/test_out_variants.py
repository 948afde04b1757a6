"""Results written through out= kernels: the compiler's own choice (structured kernels, handed
an empty out tensor as the functional form starts) and the user's out= arguments, which a
kernel may resize. Values and strides compared with the CPU."""
import copy

import pytest
import torch

import poptorch
from conftest import assert_same

LOSSES = {
    "MSELoss": torch.nn.MSELoss,
    "HuberLoss": torch.nn.HuberLoss,
    "SmoothL1Loss": torch.nn.SmoothL1Loss,
    "BCELoss": torch.nn.BCELoss,
}


def loss_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.rand(3, 4, generator=g), torch.rand(3, 4, generator=g)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", LOSSES)
def test_losses_and_their_gradients_match_the_cpu(name, reduction):
    loss = LOSSES[name](reduction=reduction)
    x, y = loss_inputs()
    results = {}
    for device in ("cpu", "ipu"):
        xd = x.to(device, copy=True).requires_grad_()
        value = loss(xd, y.to(device))
        value.backward(torch.ones_like(value))
        results[device] = (value, xd.grad)
    assert_same(results["cpu"][0], results["ipu"][0])
    assert_same(results["cpu"][1], results["ipu"][1])


class Regressor(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.loss = loss

    def forward(self, x, y):
        out = torch.sigmoid(self.linear(x))
        return out, self.loss(out, y)


@pytest.mark.parametrize("name", LOSSES)
def test_losses_train_under_training_model_like_the_cpu(name):
    torch.manual_seed(0)
    model = Regressor(LOSSES[name]())
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(),
                                                                        lr=0.1))
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = loss_inputs()
    for _ in range(3):
        _, loss = training(x, y)
        cpu_optimizer.zero_grad()
        expected = reference(x, y)[1]
        expected.backward()
        cpu_optimizer.step()
        torch.testing.assert_close(loss, expected.detach())
    training.detachFromDevice()
    torch.testing.assert_close(model.linear.weight.detach().cpu(), reference.linear.weight.detach())


def test_a_user_out_tensor_the_kernel_resizes_gets_the_cpu_value_and_shape():
    """binary_cross_entropy.out resizes its out tensor to the input's shape and back (and gives
    a value that differs from the functional form's): the ipu does as the CPU does."""
    x, y = loss_inputs()
    results = {}
    for device in ("cpu", "ipu"):
        out = torch.empty((), device=device)
        torch.ops.aten.binary_cross_entropy.out(x.to(device), y.to(device), None, 1, out=out)
        results[device] = out.cpu()
    torch.testing.assert_close(results["ipu"], results["cpu"])


def test_a_user_out_tensor_that_grows_keeps_its_value_on_the_ipu():
    x = torch.randn(4, 5)
    cpu_out, ipu_out = torch.empty(0), torch.empty(0, device="ipu")
    torch.mm(x, x.t(), out=cpu_out)
    torch.mm(x.to("ipu"), x.t().to("ipu"), out=ipu_out)
    assert ipu_out.shape == cpu_out.shape and ipu_out.stride() == cpu_out.stride()
    assert_same(cpu_out, ipu_out)


# Factories writing into a view of a larger tensor: only the view's elements change.
FACTORIES_INTO_VIEWS = {
    "arange": lambda out: torch.arange(0, 4, out=out),
    "linspace": lambda out: torch.linspace(0, 1, 4, out=out),
    "logspace": lambda out: torch.logspace(0, 1, 4, out=out),
    # Into an out= of its size: resize_ leaves the view's strides alone.
    "full": lambda out: torch.full(out.shape, 2.5, out=out),
}


# (base shape, view of it): the 2-d views hold the result's 4 elements in another shape, which
# the CPU kernels keep (their Python Meta kernels resize the view to 1-d).
OUT_VIEWS = {
    "narrowed": ((10,), lambda base: base.narrow(0, 3, 4)),
    "strided": ((10,), lambda base: base[1::2][:4]),
    "narrowed-2d": ((2, 3), lambda base: base.narrow(1, 1, 2)),
    "transposed-2d": ((2, 2), lambda base: base.t()),
}


@pytest.mark.parametrize("view", OUT_VIEWS)
@pytest.mark.parametrize("factory", FACTORIES_INTO_VIEWS)
def test_a_factory_writes_only_the_elements_of_its_out_view(factory, view):
    shape, make_view = OUT_VIEWS[view]
    results = {}
    for device in ("cpu", "ipu"):
        base = torch.zeros(shape, device=device)
        out = make_view(base)
        returned = FACTORIES_INTO_VIEWS[factory](out)
        assert returned is out
        results[device] = (base, out.shape, out.stride(), out.storage_offset())
    assert results["cpu"][1:] == results["ipu"][1:]
    assert_same(results["cpu"][0], results["ipu"][0])


def test_mode_writes_its_out_tensors_as_on_the_cpu():
    x = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 1.0]])
    results = {}
    for device in ("cpu", "ipu"):
        values = torch.empty(0, device=device)
        indices = torch.empty(0, dtype=torch.int64, device=device)
        returned = torch.mode(x.to(device), 1, out=(values, indices))
        assert returned[0] is values and returned[1] is indices
        results[device] = (values, indices)
    assert_same(results["cpu"][0], results["ipu"][0])
    assert_same(results["cpu"][1], results["ipu"][1])


@pytest.mark.parametrize("op", [torch.softmax, torch.log_softmax])
def test_softmax_into_a_strided_out_keeps_its_strides(op):
    """softmax.int_out computes into a contiguous temporary, then resize_s its out= tensor to
    its own size and copies: resize_ must leave a strided out= tensor's layout alone."""
    x = torch.randn(3, 5)
    results = {}
    for device in ("cpu", "ipu"):
        base = torch.zeros(3, 10, device=device)
        out = base[:, ::2]
        assert op(x.to(device), 1, out=out) is out
        results[device] = (base, out.stride())
    assert results["ipu"][1] == results["cpu"][1]
    assert_same(results["cpu"][0], results["ipu"][0])



# geqrf runs on the host (its Meta kernel cannot infer its outputs). The CPU's geqrf restrides
# an empty out= tensor of the right size column-major, and keeps the strides of any other
# (a strided view stays one): each out= tensor of the ipu comes back as the CPU's.
GEQRF_OUTS = {
    "right size, row-major": lambda shape, device: torch.zeros(shape, device=device),
    "right size, strided view": lambda shape, device: torch.zeros(
        *shape[:-1], 2 * shape[-1], device=device)[..., ::2],
    "no elements": lambda shape, device: torch.empty(0, device=device),
}


@pytest.mark.parametrize("shape", [(5, 0), (0, 3), (2, 0, 4), (4, 3), (2, 3, 4)])
@pytest.mark.parametrize("out", GEQRF_OUTS)
def test_geqrf_restrides_its_out_tensors_as_on_the_cpu(out, shape):
    a = torch.randn(shape)
    tau_shape = (*shape[:-2], min(shape[-2:]))
    results = {}
    for device in ("cpu", "ipu"):
        qr, tau = GEQRF_OUTS[out](shape, device), GEQRF_OUTS[out](tau_shape, device)
        returned = torch.geqrf(a.to(device), out=(qr, tau))
        assert returned[0] is qr and returned[1] is tau
        results[device] = [(t, t.shape, t.stride()) for t in (qr, tau)]
    for (cpu, *cpu_layout), (ipu, *ipu_layout) in zip(results["cpu"], results["ipu"]):
        assert ipu_layout == cpu_layout
        assert_same(cpu, ipu)
