"""PyTorch's own mixed precision on the ipu: torch.autocast("ipu") and GradScaler("ipu").

The ipu casts with PyTorch's op lists (the ones CUDA uses): each op's result
dtype must follow its list, and its value must be the CPU's for the same casts.
"""
import pytest
import torch
import torch.nn.functional as F

import poptorch  # noqa: F401  (registers the ipu)

LOWER = (torch.float16, torch.bfloat16)
TOLERANCE = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def test_autocast_is_available_on_the_ipu_with_float16_by_default():
    assert torch.amp.is_autocast_available("ipu")
    assert torch.get_autocast_dtype("ipu") == torch.float16
    assert not torch.is_autocast_enabled("ipu")
    with torch.autocast("ipu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("ipu")
        assert torch.get_autocast_dtype("ipu") == torch.bfloat16
    assert not torch.is_autocast_enabled("ipu")


# op -> (function of float32 inputs, the dtype it runs in under autocast: None = the
# lower precision dtype, float32, or "widest" of its inputs)
def _ops():
    torch.manual_seed(0)
    a, b, v = torch.randn(4, 5), torch.randn(5, 3), torch.randn(5)
    img, kernel = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    return {
        "mm": ((a, b), torch.mm, None),
        "matmul": ((a, b), torch.matmul, None),
        "linear": ((a, b.t(), torch.randn(3)), F.linear, None),
        "conv2d": ((img, kernel), F.conv2d, None),
        "bmm": ((a[None], b[None]), torch.bmm, None),
        "softmax": ((a,), lambda x: torch.softmax(x, 1), torch.float32),
        "log_softmax": ((a,), lambda x: torch.log_softmax(x, 1), torch.float32),
        "layer_norm": ((a,), lambda x: F.layer_norm(x, (5,)), torch.float32),
        "exp": ((a,), torch.exp, torch.float32),
        "sum": ((a,), torch.sum, torch.float32),
        "nll_loss": ((torch.log_softmax(a, 1), torch.tensor([0, 1, 2, 0])), F.nll_loss,
                     torch.float32),
        "norm": ((a,), torch.norm, torch.float32),
        "addcmul": ((v, v, v), torch.addcmul, "widest"),
    }


@pytest.mark.parametrize("dtype", LOWER)
@pytest.mark.parametrize("name", list(_ops()))
def test_each_op_runs_in_the_dtype_of_its_list_with_the_cpu_value(name, dtype):
    inputs, fn, runs_in = _ops()[name]
    # A lower precision input makes "widest" ops promote; float32 ops take it too.
    ipu_inputs = [x.to("ipu") for x in inputs]
    if runs_in == "widest":
        ipu_inputs[0] = ipu_inputs[0].to(dtype)
    with torch.autocast("ipu", dtype=dtype):
        result = fn(*ipu_inputs)
    expected_dtype = dtype if runs_in is None else torch.float32
    assert result.dtype == expected_dtype
    # The CPU computes the same casts written out.
    cpu_inputs = [x.to(expected_dtype) if x.is_floating_point() else x for x in inputs]
    expected = fn(*cpu_inputs)
    torch.testing.assert_close(result.cpu(), expected, **TOLERANCE[dtype])


def test_ops_outside_the_lists_keep_their_inputs_dtype():
    x = torch.randn(4, 4, device="ipu")
    with torch.autocast("ipu", dtype=torch.float16):
        h = x @ x
        assert h.dtype == torch.float16
        assert torch.relu(h).dtype == torch.float16
        assert (x + 1).dtype == torch.float32
        assert (h + x).dtype == torch.float32  # PyTorch's type promotion


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4, device="ipu")
    with torch.autocast("ipu"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, torch.ones(4, device="ipu"))


def test_disabled_regions_and_the_backward_follow_the_forward_casts():
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(4, 5)
    wi = w.detach().to("ipu").requires_grad_()
    with torch.autocast("ipu", dtype=torch.float16):
        h = x.to("ipu") @ wi
        with torch.autocast("ipu", enabled=False):
            assert (x.to("ipu") @ wi).dtype == torch.float32
        loss = h.float().square().sum()
    loss.backward()
    assert wi.grad.dtype == torch.float32
    expected = (x.half() @ w.half()).float().square().sum()
    expected.backward()
    torch.testing.assert_close(wi.grad.cpu(), w.grad, atol=2e-2, rtol=2e-3)


def _scaled_training(device, init_scale, steps=10):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=2)
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    losses, scales = [], []
    for _ in range(steps):
        optimiser.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(optimiser)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return losses, scales, {k: v.cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("init_scale", [2.0**10, 2.0**24])
def test_grad_scaler_trains_like_the_cpu_and_skips_steps_whose_gradients_overflow(init_scale):
    """2**24 makes the float16 gradients overflow: the scaler must skip those steps and
    halve the scale, on the ipu as on the CPU (whose autocast casts linear the same way)."""
    ipu = _scaled_training("ipu", init_scale)
    cpu = _scaled_training("cpu", init_scale)
    assert ipu[1] == cpu[1]  # the same steps skipped, the same scales
    torch.testing.assert_close(ipu[0], cpu[0], atol=2e-3, rtol=2e-3)
    for name in cpu[2]:
        torch.testing.assert_close(ipu[2][name], cpu[2][name], atol=2e-3, rtol=2e-3)
    if init_scale > 2.0**16:  # the first steps overflowed: skipped, the scale halved
        assert ipu[1][:4] == [init_scale / 2, init_scale / 4, init_scale / 8, init_scale / 16]
    assert ipu[0][-1] < ipu[0][0]


def _unscaled_training(device, poisoned_step, steps=8):
    """Adam with unscale_ and gradient clipping between backward and step, as
    PyTorch's AMP recipe writes it; one batch holds an infinity."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    record = []
    for step in range(steps):
        optimiser.zero_grad()
        batch = x.clone()
        if step == poisoned_step:
            batch[0, 0] = float("inf")
        with torch.autocast(device, dtype=torch.float16):
            loss = F.cross_entropy(model(batch.to(device)), y.to(device))
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.unscale_(optimiser)
        grads = [p.grad.cpu().clone() for p in model.parameters()]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimiser)
        scaler.update()
        record.append(dict(loss=loss.item(), scaled=scaled.item(), grads=grads,
                           norm=norm.item(), scale=scaler.get_scale(),
                           weights=[p.detach().cpu().clone() for p in model.parameters()]))
    return record, scaler.state_dict()


def test_grad_scaler_unscale_and_clipping_match_the_cpu_and_an_infinity_skips_its_step():
    ipu, ipu_state = _unscaled_training("ipu", poisoned_step=3)
    cpu, cpu_state = _unscaled_training("cpu", poisoned_step=3)
    assert ipu_state == cpu_state
    assert [r["scale"] for r in ipu] == [r["scale"] for r in cpu]
    assert [r["scale"] for r in ipu][2:5] == [2.0**9, 2.0**8, 2.0**8]  # halved at the infinity
    scales = [2.0**8] + [r["scale"] for r in ipu]  # the scale each step used
    for step, (got, expected) in enumerate(zip(ipu, cpu)):
        if step == 3:  # the unscaled gradients hold the infinity: the step is skipped
            assert not all(torch.isfinite(g).all() for g in got["grads"])
            for before, after in zip(ipu[2]["weights"], got["weights"]):
                assert torch.equal(before, after)
            continue
        assert got["scaled"] == got["loss"] * scales[step]
        torch.testing.assert_close(got["scaled"], expected["scaled"], atol=0, rtol=2e-4)
        torch.testing.assert_close(got["norm"], expected["norm"], atol=0, rtol=2e-3)
        for g, e in zip(got["grads"], expected["grads"]):  # unscaled: the CPU's gradients
            torch.testing.assert_close(g, e, atol=2e-4, rtol=2e-3)
        for w, e in zip(got["weights"], expected["weights"]):
            torch.testing.assert_close(w, e, atol=5e-4, rtol=2e-3)


def test_grad_scaler_refuses_float16_gradients_as_on_the_cpu():
    """PyTorch's own check: float16 parameters cannot be unscaled."""
    for device in ("cpu", "ipu"):
        model = torch.nn.Linear(4, 2).half().to(device)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device)
        scaler.scale(model(torch.randn(3, 4).half().to(device)).float().sum()).backward()
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            scaler.unscale_(optimiser)


def test_float64_stays_refused_outside_the_grad_scaler():
    with pytest.raises(TypeError, match="no 64-bit floating point"):
        torch.tensor(1.0, device="ipu").double()


def test_torch_autocast_inside_a_training_model_trains_like_the_cpu():
    """The step is captured at the dispatcher, so an autocast block in forward is
    captured with its casts; the CPU's autocast casts linear the same way."""
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))

    class Model(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(8, 4)
            self.device = device

        def forward(self, x, y):
            with torch.autocast(self.device, dtype=torch.bfloat16):
                out = self.fc(x)
            return out, F.cross_entropy(out.float(), y)

    model = Model("ipu")
    opts = poptorch.Options().showCompilationProgressBar(False)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    reference = Model("cpu")
    optimiser = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(3):
        out, loss = training(x, y)
        assert out.dtype == torch.bfloat16
        expected_out, expected = reference(x, y)
        optimiser.zero_grad()
        expected.backward()
        optimiser.step()
        torch.testing.assert_close(out, expected_out.detach(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(float(loss), float(expected), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight, atol=1e-3, rtol=1e-3)
