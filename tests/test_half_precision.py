"""Half precision and PopTorch's automatic casting in trainingModel/inferenceModel.

Each case runs against a CPU reference: the float32 model (within float16
tolerance) and, where the seeds state which precision an operation runs in,
the same casts written out on the CPU (so a wrong precision shows).
"""
import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

HALF_TOL = dict(atol=1e-2, rtol=1e-2)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


def _dtypes_of_layers(model):
    """Records the output dtype of each layer while the model is captured."""
    seen = {}
    for name, layer in model.named_modules():
        if name:
            layer.register_forward_hook(
                lambda m, i, o, name=name: seen.__setitem__(name, o.dtype))
    return seen


def _x():
    return torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(1))


def _opts():
    return poptorch.Options().showCompilationProgressBar(False)


def test_a_half_model_with_half_inputs_runs_in_half_like_the_float_model():
    model = Net().eval()
    expected = model(_x())
    model.half()
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, _opts())(_x().half())
    assert out.dtype == torch.float16
    assert set(seen.values()) == {torch.float16}
    torch.testing.assert_close(out.float(), expected, **HALF_TOL)


def test_float_weights_fed_half_inputs_run_in_half_by_default():
    """The seeds: PopTorch casts an op's mixed float16/float32 inputs to float16."""
    model = Net().eval()
    expected_float = model(_x())
    half_copy = Net().eval().half()
    half_copy.load_state_dict(model.state_dict())
    half_copy.norm.float()  # what the ipu does: float32 statistics normalise float16 inputs
    expected_half = half_copy(_x().half())
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, _opts())(_x().half())
    assert out.dtype == torch.float16 and set(seen.values()) == {torch.float16}
    assert model.fc.weight.dtype == torch.float32  # the weights keep their dtype
    torch.testing.assert_close(out, expected_half, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out.float(), expected_float, **HALF_TOL)


def test_half_upcast_to_float_follows_pytorch():
    model = Net().eval()
    expected = model(_x().half().float())
    opts = _opts()
    opts.Precision.halfFloatCasting(poptorch.HalfFloatCastingBehavior.HalfUpcastToFloat)
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, opts)(_x().half())
    assert out.dtype == torch.float32 and set(seen.values()) == {torch.float32}
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


class Mixed(torch.nn.Module):
    """The seeds' third way: float16 and float32 parameters side by side."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16).half()
        self.fc2 = torch.nn.Linear(16, 4)
        self.cpu_casts = None  # on the CPU: the casts of the rule, written out

    def forward(self, x, y):
        h = torch.relu(self.fc1(x))
        if self.cpu_casts == torch.float16:
            out = F.linear(h, self.fc2.weight.half(), self.fc2.bias.half())
        elif self.cpu_casts == torch.float32:
            out = self.fc2(h.float())
        else:  # the ipu: the rule decides
            out = self.fc2(h)
        return out, F.cross_entropy(out.float(), y)


@pytest.mark.parametrize("rule, computes_in", [
    (poptorch.HalfFloatCastingBehavior.Default, torch.float16),
    (poptorch.HalfFloatCastingBehavior.FloatDowncastToHalf, torch.float16),
    (poptorch.HalfFloatCastingBehavior.HalfUpcastToFloat, torch.float32)])
def test_mixed_float16_and_float32_parameters_train_with_the_casts_of_the_rule(rule,
                                                                              computes_in):
    """fc2's float32 weights meet fc1's float16 output: the rule's casts, written out on
    the CPU, give the same losses and updates; each parameter keeps its dtype."""
    model = Mixed()
    reference = copy.deepcopy(model)
    reference.cpu_casts = computes_in
    opts = _opts()
    opts.Precision.halfFloatCasting(rule)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.5))
    optimiser = torch.optim.SGD(reference.parameters(), lr=0.5)
    x, y = torch.randn(16, 8).half(), torch.randint(0, 4, (16,))
    for _ in range(4):
        out, loss = training(x, y)
        optimiser.zero_grad()
        expected_out, expected = reference(x, y)
        expected.backward()
        optimiser.step()
        assert out.dtype == computes_in
        # Tighter than the two rules' difference (their losses differ by ~4e-5).
        torch.testing.assert_close(out, expected_out.detach(), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(loss, expected.detach(), atol=1e-6, rtol=1e-6)
    training.destroy()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, atol=1e-6, rtol=1e-6,
                                   msg=name)


@pytest.mark.parametrize("partials", [torch.float32, torch.float16])
def test_matmul_and_convolution_partials_accumulate_in_float32_whatever_the_partials_type(
        partials):
    """setPartialsType is logged as not acted on (tests/test_options.py) because the
    host accumulates float16 products in float32: 4096 ones sum to 4096 as on the CPU,
    where float16 partials summed in order would stop at 2048."""
    ones = torch.ones(4096, dtype=torch.float16)
    in_order = torch.zeros((), dtype=torch.float16)
    for value in ones[:2050]:
        in_order += value
    assert in_order == 2048  # what float16 accumulation loses

    class Products(torch.nn.Module):
        def forward(self, a, b, image, kernel):
            return a @ b, F.conv2d(image, kernel)

    opts = _opts()
    opts.Precision.setPartialsType(partials)
    image = ones.reshape(1, 256, 4, 4)
    mm, conv = poptorch.inferenceModel(Products(), opts)(ones[None], ones[:, None], image,
                                                        image)
    assert mm.dtype == conv.dtype == torch.float16
    assert mm.item() == conv.item() == 4096 == F.conv2d(image, image).item()


def test_the_seeds_snippets_half_model_and_block_on_cpu_tensors():
    """The seeds' inference_half example, and their autocast block run on CPU tensors
    outside a model, where it casts nothing."""
    model = torch.nn.Linear(1, 10).half()
    t1 = torch.tensor([1.]).half()
    out = poptorch.inferenceModel(model, _opts())(t1)
    assert out.dtype == torch.half
    torch.testing.assert_close(out, model(t1), atol=0, rtol=0)
    x, y = torch.randn(1, 10, 10), torch.randn(1, 10, 10)
    with poptorch.autocast():
        z = torch.bmm(x, y)
    assert z.dtype == torch.float32 and torch.equal(z, torch.bmm(x, y))


def test_in_place_ops_keep_their_output_dtype():
    class Accumulate(torch.nn.Module):
        def forward(self, x):
            total = torch.zeros(x.shape, dtype=torch.float32)
            total += x  # float32 += float16 stays float32
            total[0] = x[0] * 2
            return total, x + total  # mixed: float16

    x = torch.randn(3, 4).half()
    total, mixed = poptorch.inferenceModel(Accumulate(), _opts())(x)
    assert total.dtype == torch.float32 and mixed.dtype == torch.float16
    expected = x.float().clone()
    expected[0] *= 2
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(mixed, (x.float() + expected).half())


def _train(model, opts, x, y, steps, lr=0.05, **optim_kwargs):
    optimizer = poptorch.optim.SGD(model.parameters(), lr=lr, **optim_kwargs)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            out = self.model(x)
            return out, F.cross_entropy(out.float(), y)

    training = poptorch.trainingModel(WithLoss(), opts, optimizer)
    losses = [float(training(x, y)[1]) for _ in range(steps)]
    training.destroy()
    return losses


def test_running_statistics_always_float_keeps_batch_norm_statistics_in_float32():
    y = torch.tensor([0, 1, 2, 3])
    reference = Net().train()
    expected = _train(reference, _opts(), _x(), y, steps=3)

    for always_float in (False, True):
        model = Net().train().half()
        opts = _opts()
        opts.Precision.runningStatisticsAlwaysFloat(always_float)
        losses = _train(model, opts, _x().half(), y, steps=3)
        stats_dtype = torch.float32 if always_float else torch.float16
        assert model.norm.running_mean.dtype == stats_dtype
        assert model.norm.running_var.dtype == stats_dtype
        torch.testing.assert_close(model.norm.running_mean.float(),
                                   reference.norm.running_mean, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(model.norm.running_var.float(),
                                   reference.norm.running_var, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(losses, expected, atol=2e-2, rtol=2e-2)


def test_running_statistics_always_float_normalises_like_a_float32_norm_in_a_half_model():
    """The CPU's own mixed kernel is the exact reference: a float16 model whose norm is
    float32 (statistics, weight and bias) normalises float16 inputs and returns float16.
    Without the option, the CPU's all-float16 model is."""
    statistics = {}
    for always_float in (False, True):
        reference = Net().train().half()
        if always_float:
            reference.norm.float()
        model = Net().train().half()
        opts = _opts()
        opts.Precision.runningStatisticsAlwaysFloat(always_float)
        inference = poptorch.inferenceModel(model, opts)
        for seed in range(3):  # train mode: each call updates the statistics
            x = torch.randn(4, 2, 6, 6, generator=torch.Generator().manual_seed(seed)).half()
            out = inference(x)
            assert out.dtype == torch.float16
            torch.testing.assert_close(out, reference(x).detach(), atol=1e-6, rtol=1e-6)
        for name in ("running_mean", "running_var"):
            assert getattr(model.norm, name).dtype == getattr(reference.norm, name).dtype
            torch.testing.assert_close(getattr(model.norm, name), getattr(reference.norm, name),
                                       atol=1e-6, rtol=1e-6)
        statistics[always_float] = model.norm.running_var.detach().clone()
        inference.destroy()
        model.eval()
        reference.eval()
        x = _x().half()
        torch.testing.assert_close(poptorch.inferenceModel(model, opts)(x),
                                   reference(x).detach(), atol=1e-6, rtol=1e-6)
    # float32 statistics are not float16 ones: the comparisons above tell them apart
    assert (statistics[True] - statistics[False].float()).abs().max() > 1e-5


def test_loss_scaling_keeps_float16_gradients_from_underflowing():
    """A loss this small has float16 gradients below float16's range: without loss
    scaling nothing trains; with it, training follows the float32 model."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x, y):
            out = self.fc(x)
            return out, F.cross_entropy(out.float(), y) * 1e-8

    def train(half, loss_scaling):
        model = Tiny().half() if half else Tiny()
        optimizer = poptorch.optim.SGD(model.parameters(), lr=2e7, loss_scaling=loss_scaling)
        training = poptorch.trainingModel(model, _opts(), optimizer)
        losses = [float(training(x.half() if half else x, y)[1]) for _ in range(4)]
        training.destroy()
        return losses, model.fc.weight.detach().float()

    start = Tiny().fc.weight.detach()
    float_losses, float_weight = train(False, 1.0)
    assert float_losses[-1] < 0.9 * float_losses[0]
    _, unscaled_weight = train(True, 1.0)
    assert torch.equal(unscaled_weight, start.half().float())  # every gradient was 0
    scaled_losses, scaled_weight = train(True, 2.0**20)
    torch.testing.assert_close(scaled_weight, float_weight, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(scaled_losses, float_losses, atol=1e-10, rtol=2e-2)


# --- automatic casting --------------------------------------------------------

class Layers(torch.nn.Module):
    """conv -> relu -> conv -> relu, as in the seeds' autocast example."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(2, 3, 3)
        self.relu1 = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(3, 4, 3)
        self.relu2 = torch.nn.ReLU()

    def forward(self, x):
        return self.relu2(self.conv2(self.relu1(self.conv1(x))))


def _reference(model, x, half_layers):
    """The model on the CPU with the named layers (and their inputs) in float16."""
    out = x
    for name in ("conv1", "relu1", "conv2", "relu2"):
        layer = getattr(model, name)
        if name in half_layers:
            out = layer.half()(out.half())
            layer.float()
        else:
            out = layer(out.float())
    return out


def test_model_autocast_runs_the_policy_ops_in_half_and_keeps_float_weights():
    model = Layers()
    model.autocast()
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, _opts())(_x())
    assert seen == {"conv1": torch.float16, "relu1": torch.float16, "conv2": torch.float16,
                    "relu2": torch.float16}
    assert model.conv1.weight.dtype == torch.float32
    expected = _reference(Layers(), _x(), {"conv1", "relu1", "conv2", "relu2"})
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


def test_layer_autocast_false_turns_it_off_for_that_layer():
    model = Layers()
    model.autocast()
    model.relu1.autocast(False)
    model.conv2.autocast(False)
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, _opts())(_x())
    # conv2 is out of the region: its float32 weights meet relu1's float16 output,
    # and the casting rule makes that mixed op float16.
    assert seen["conv1"] == torch.float16 and seen["conv2"] == torch.float16
    opts = _opts()
    opts.Precision.halfFloatCasting(poptorch.HalfFloatCastingBehavior.HalfUpcastToFloat)
    model2 = Layers()
    model2.autocast()
    model2.relu1.autocast(False)
    model2.conv2.autocast(False)
    seen2 = _dtypes_of_layers(model2)
    out2 = poptorch.inferenceModel(model2, opts)(_x())
    assert seen2 == {"conv1": torch.float16, "relu1": torch.float16, "conv2": torch.float32,
                     "relu2": torch.float32}
    expected2 = _reference(Layers(), _x(), {"conv1", "relu1"})
    torch.testing.assert_close(out2, expected2, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out.float(), expected2, **HALF_TOL)


def test_autocast_enabled_false_turns_autocasting_off():
    model = Layers()
    model.autocast()
    opts = _opts()
    opts.Precision.autocastEnabled(False)
    out = poptorch.inferenceModel(model, opts)(_x())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, Layers()(_x()))


def test_the_decorator_and_the_block_cast_their_body():
    class Decorated(torch.nn.Module):
        @poptorch.autocast()
        def forward(self, x, y):
            return torch.bmm(x, y)

    class Block(torch.nn.Module):
        def forward(self, x, y):
            with poptorch.autocast():
                z = torch.bmm(x, y)
            with poptorch.autocast(enabled=False):
                w = torch.bmm(x, y)
            return z, w

    x, y = torch.randn(1, 10, 10), torch.randn(1, 10, 10)
    expected_half = torch.bmm(x.half(), y.half())
    out = poptorch.inferenceModel(Decorated(), _opts())(x, y)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, expected_half, atol=1e-2, rtol=2e-3)
    z, w = poptorch.inferenceModel(Block(), _opts())(x, y)
    assert z.dtype == torch.float16 and w.dtype == torch.float32
    torch.testing.assert_close(z, expected_half, atol=1e-2, rtol=2e-3)
    torch.testing.assert_close(w, torch.bmm(x, y))


def test_a_custom_policy_as_in_the_seeds():
    """fp16: Conv2d layers and relu; fp32: bmm; promote: dot (mixed inputs -> float32)."""
    policy = poptorch.autocasting.Policy([torch.nn.Conv2d, torch.relu], [torch.bmm],
                                         [torch.dot], [])

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = Layers()

        def forward(self, x, a, b, v):
            return (self.layers(x), torch.bmm(a.half(), b.half()), torch.dot(v.half(), v),
                    torch.mm(a[0], b[0]))

    opts = _opts()
    opts.Precision.autocastPolicy(policy)
    model = Mixed()
    model.autocast()
    a, b, v = torch.randn(1, 3, 3), torch.randn(1, 3, 3), torch.randn(5)
    conv_out, bmm_out, dot_out, mm_out = poptorch.inferenceModel(model, opts)(_x(), a, b, v)
    assert bmm_out.dtype == torch.float32 and dot_out.dtype == torch.float32
    assert mm_out.dtype == torch.float32  # not in this policy
    assert conv_out.dtype == torch.float16
    torch.testing.assert_close(bmm_out, torch.bmm(a.half().float(), b.half().float()))
    torch.testing.assert_close(dot_out, torch.dot(v.half().float(), v))
    torch.testing.assert_close(conv_out, _reference(Layers(), _x(), {"conv1", "relu1", "conv2",
                                                                     "relu2"}),
                               atol=2e-3, rtol=2e-3)


def test_autocast_training_keeps_float32_master_weights_and_trains_like_float32():
    y = torch.tensor([0, 1, 2, 3])
    expected = _train(Net().train(), _opts(), _x(), y, steps=4)
    model = Net().train()
    model.autocast()
    losses = _train(model, _opts(), _x(), y, steps=4)
    assert model.conv.weight.dtype == torch.float32
    torch.testing.assert_close(losses, expected, atol=2e-2, rtol=2e-2)
    assert losses[-1] < losses[0]


def test_lazy_mode_blocks_cast_with_the_default_policy():
    x = torch.randn(4, 4, device="ipu")
    with poptorch.autocast():
        h = x @ x
        with poptorch.autocast(enabled=False):
            f = x @ x
        s = h + x  # not in the policy: PyTorch's promotion
    assert h.dtype == torch.float16 and f.dtype == torch.float32 and s.dtype == torch.float32
    assert (x @ x).dtype == torch.float32
    torch.testing.assert_close(h.cpu(), x.cpu().half() @ x.cpu().half(), atol=1e-2, rtol=2e-3)


def test_bad_policies_and_arguments_are_clear_errors():
    with pytest.raises(poptorch.Error, match="fp16 must be a list of torch functions"):
        poptorch.autocasting.Policy(fp16=[3])
    with pytest.raises(poptorch.Error, match="fp32 must be a list"):
        poptorch.autocasting.Policy(fp32="bmm")
    with pytest.raises(poptorch.Error, match="autocastPolicy takes a poptorch.autocasting.Policy"):
        poptorch.Options().Precision.autocastPolicy([torch.bmm])
    with pytest.raises(poptorch.Error, match="takes a bool"):
        poptorch.autocast(enabled="yes")
    with pytest.raises(poptorch.Error, match="takes a bool"):
        torch.nn.Linear(2, 2).autocast(1)


@pytest.mark.slow
@pytest.mark.parametrize("automatic", [False, True], ids=["loss_scaling", "automatic"])
def test_the_digits_example_trains_in_float16_with_loss_scaling_like_float32(automatic):
    """A fixed loss scaling (1024), or automatic loss scaling starting from 1."""
    from train_digits import train_and_evaluate  # examples/
    float_losses, float_accuracy = train_and_evaluate(2, 16, 4, half=False)
    half_losses, half_accuracy = train_and_evaluate(2, 16, 4, half=True,
                                                    automatic_loss_scaling=automatic)
    assert half_losses[-1] < 0.6 * half_losses[0] or half_losses[-1] < 0.5
    assert abs(half_losses[-1] - float_losses[-1]) < 0.1 + 0.15 * float_losses[-1]
    assert half_accuracy > float_accuracy - 5.0


def test_layer_autocast_acts_in_lazy_mode_too():
    model = Layers().to("ipu")
    model.autocast()
    model.conv2.autocast(False)
    seen = _dtypes_of_layers(model)
    # conv2 is off: PyTorch's rule there (lazy mode), so relu1's float16 output meets
    # float32 weights, which PyTorch refuses for a convolution.
    with pytest.raises(RuntimeError, match="should be the same"):
        model(_x().to("ipu"))
    assert seen["conv1"] == torch.float16
    assert poptorch.autocasting._regions() == []  # the regions closed on the error
    model.conv2.autocast(True)
    out = model(_x().to("ipu"))
    assert out.dtype == torch.float16
    expected = _reference(Layers(), _x(), {"conv1", "relu1", "conv2", "relu2"})
    torch.testing.assert_close(out.cpu(), expected, atol=2e-3, rtol=2e-3)
    model.autocast(False)
    model.conv2.autocast(False)
    assert model(_x().to("ipu")).dtype == torch.float32


def test_a_half_model_trains_in_lazy_mode_like_the_cpu_half_model():
    """The same float16 kernels run on the host: losses and weights follow the CPU's."""
    y = torch.tensor([0, 1, 2, 3])

    def train(device):
        model = Net().train().half().to(device)
        optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for _ in range(3):
            optimiser.zero_grad()
            loss = F.cross_entropy(model(_x().half().to(device)).float(), y.to(device))
            loss.backward()
            optimiser.step()
            losses.append(float(loss))
        return losses, {k: v.cpu() for k, v in model.state_dict().items()}

    losses, weights = train("ipu")
    expected_losses, expected_weights = train("cpu")
    torch.testing.assert_close(losses, expected_losses, atol=1e-3, rtol=1e-3)
    for name, value in expected_weights.items():
        torch.testing.assert_close(weights[name], value, atol=1e-3, rtol=1e-3)


def test_a_float32_norm_policy_in_a_half_model_updates_its_float16_statistics():
    """Policy(fp32=[BatchNorm2d]): the norm computes in float32 while its running
    statistics stay the model's float16 buffers, updated in place."""
    policy = poptorch.autocasting.Policy(fp32=[torch.nn.BatchNorm2d])
    reference = Net().train()
    expected = reference(_x())
    model = Net().train().half()
    model.autocast()
    opts = _opts()
    opts.Precision.autocastPolicy(policy)
    seen = _dtypes_of_layers(model)
    out = poptorch.inferenceModel(model, opts)(_x().half())
    assert seen["norm"] == torch.float32 and seen["fc"] == torch.float16
    assert model.norm.running_mean.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected.detach(), **HALF_TOL)
    torch.testing.assert_close(model.norm.running_mean.float(), reference.norm.running_mean,
                               atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(model.norm.running_var.float(), reference.norm.running_var,
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("mode", ["half", "autocast"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "vit"])
def test_hugging_face_models_in_float16_match_the_float32_cpu_model(name, mode):
    """BERT, GPT-2 and ViT (attention masks built with float16 limits, layer norms,
    GELU, softmax): model.half() and model.autocast() in an inferenceModel."""
    pytest.importorskip("transformers")
    from test_hf_models import MODELS, WithLoss, batch
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    inputs, labels = batch(name, 0, padded=True)
    expected_loss, expected_logits = WithLoss(model)(inputs, labels)
    if mode == "half":
        model.half()
        inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    else:
        model.autocast()
    loss, logits = poptorch.inferenceModel(WithLoss(model), _opts())(inputs, labels)
    assert logits.dtype == torch.float16
    torch.testing.assert_close(logits.float(), expected_logits.detach(), **HALF_TOL)
    torch.testing.assert_close(float(loss), float(expected_loss), atol=5e-3, rtol=5e-3)


class _Tiny(torch.nn.Module):
    def __init__(self, loss_factor):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)
        self.loss_factor = loss_factor

    def forward(self, x, y):
        out = self.fc(x)
        return out, F.cross_entropy(out.float(), y) * self.loss_factor


def _train_automatic(loss_factor, lr, loss_scaling, steps, dtype=torch.float16,
                     optimizer_class=poptorch.optim.SGD, cpu_optimizer_class=None):
    """Trains _Tiny with automatic loss scaling; with ``cpu_optimizer_class``, a CPU
    copy without loss scaling beside it, whose weights are returned too."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 8).to(dtype), torch.randint(0, 4, (16,))
    model = _Tiny(loss_factor).to(dtype)
    reference = copy.deepcopy(model)
    optimizer = optimizer_class(model.parameters(), lr=lr, loss_scaling=loss_scaling)
    cpu_optimizer = cpu_optimizer_class and cpu_optimizer_class(reference.parameters(), lr=lr)
    opts = _opts()
    opts.Training.setAutomaticLossScaling(True)
    training = poptorch.trainingModel(model, opts, optimizer)
    losses, scales, weights, cpu_weights = [], [], [], []
    for _ in range(steps):
        losses.append(float(training(x, y)[1]))
        scales.append(float(optimizer.state_dict()["ipu_param"]["loss_scaling"]))
        weights.append(model.fc.weight.detach().clone())
        if cpu_optimizer:
            cpu_optimizer.zero_grad()
            reference(x, y)[1].backward()
            cpu_optimizer.step()
            cpu_weights.append(reference.fc.weight.detach().clone())
    training.destroy()
    if cpu_optimizer:
        return losses, scales, weights, cpu_weights
    return losses, scales, weights


def test_automatic_loss_scaling_grows_the_scale_until_float16_gradients_train():
    """The underflowing loss of the test above, with loss_scaling left at 1."""
    losses, scales, weights = _train_automatic(1e-8, 2e7, 1.0, steps=30)
    assert scales[:3] == [2.0, 4.0, 8.0]  # no gradient near float16's top: doubled
    assert torch.equal(weights[0], weights[1])  # at first every gradient is 0
    assert scales[-1] >= 2.0**20
    assert losses[-1] < 0.9 * losses[0]
    assert all(torch.isfinite(w).all() for w in weights)


def test_automatic_loss_scaling_skips_overflowing_steps_and_lowers_the_scale():
    losses, scales, weights = _train_automatic(1.0, 0.5, 2.0**30, steps=40)
    start = _Tiny(1.0).half().fc.weight.detach()
    overflowed = [i for i in range(len(scales)) if torch.equal(weights[i], start)]
    assert overflowed and overflowed == list(range(len(overflowed)))  # the first steps
    assert scales[0] == 2.0**29 and scales[len(overflowed) - 1] < 2.0**20
    assert max(scales[-10:]) <= 4 * min(scales[-10:])  # then it settles below overflow
    assert all(torch.isfinite(w).all() for w in weights)
    assert losses[-1] < losses[len(overflowed)]  # then it trains


def test_automatic_loss_scaling_changes_nothing_when_nothing_overflows():
    """float32 gradients scaled by 2^30 overflow nothing: the scale halves toward
    float16's range (a power of two: unscaling is exact) and Adam trains as the
    CPU's Adam without loss scaling."""
    _, scales, weights, cpu_weights = _train_automatic(
        1.0, 0.01, 2.0**30, steps=8, dtype=torch.float32,
        optimizer_class=poptorch.optim.Adam, cpu_optimizer_class=torch.optim.Adam)
    assert scales == [2.0**i for i in range(29, 21, -1)]
    for got, expected in zip(weights, cpu_weights):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_automatic_loss_scaling_skipped_steps_leave_adam_state_unchanged():
    torch.manual_seed(0)
    x, y = torch.randn(16, 8).half(), torch.randint(0, 4, (16,))
    model = _Tiny(1.0).half()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.01, loss_scaling=2.0**30)
    opts = _opts()
    opts.Training.setAutomaticLossScaling(True)
    training = poptorch.trainingModel(model, opts, optimizer)
    start = model.fc.weight.detach().clone()
    skipped = 0
    for _ in range(20):
        training(x, y)
        state = optimizer.state_dict()["state"]
        if torch.equal(model.fc.weight, start):  # skipped: Adam has not started, as in torch
            skipped += 1
            assert state == {}
    training.destroy()
    assert 0 < skipped < 20
    assert float(state[0]["step"]) == 20 - skipped


def test_set_optimizer_sets_the_automatic_scale_again():
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    model = _Tiny(1.0)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=2.0**30)
    opts = _opts()
    opts.Training.setAutomaticLossScaling(True)
    training = poptorch.trainingModel(model, opts, optimizer)

    def scale():
        return float(optimizer.state_dict()["ipu_param"]["loss_scaling"])

    training(x, y)
    training(x, y)
    assert scale() == 2.0**28
    optimizer.loss_scaling = 2.0**10
    training.setOptimizer(optimizer)
    assert scale() == 2.0**10
    training(x, y)
    assert scale() == 2.0**11  # gradients far below float16's top: doubled
    training.destroy()


def test_automatic_loss_scaling_over_accumulated_and_replicated_gradients():
    """The rule reads the gradients summed over micro-batches and replicas: float32
    ones overflow nothing, so training equals the CPU's on the whole batch."""
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    model = _Tiny(1.0)
    reference = copy.deepcopy(model)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                   loss_scaling=2.0**20)
    opts = _opts().replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    opts.Training.setAutomaticLossScaling(True)
    training = poptorch.trainingModel(model, opts, optimizer)
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    scales = []
    for _ in range(4):
        training(x, y)
        scales.append(float(optimizer.state_dict()["ipu_param"]["loss_scaling"]))
        cpu_optimizer.zero_grad()
        reference(x, y)[1].backward()
        cpu_optimizer.step()
        torch.testing.assert_close(model.fc.weight, reference.fc.weight, atol=1e-6, rtol=1e-6)
    training.destroy()
    assert scales == [2.0**19, 2.0**18, 2.0**17, 2.0**16]  # one update per call
