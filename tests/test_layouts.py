"""Convolution layouts: the compiler runs 2-D convolutions on channels-last
activations and keeps the temporaries that follow in that layout. Results,
gradients and the strides users see must be the CPU's."""
import copy

import pytest
import torch
from torch import nn

import poptorch
from conftest import assert_same


class Block(nn.Module):
    """A ResNet basic block with a projection shortcut, then pooling and a
    head: convolutions, batch norm, ReLU, a residual add and a flatten view."""

    def __init__(self, norm=nn.BatchNorm2d):
        super().__init__()
        # 16 channels: fewer stay NCHW (see passes::planLayouts)
        self.conv1 = nn.Conv2d(3, 16, 3, 2, 1, bias=False)
        self.bn1 = norm(16)
        self.conv2 = nn.Conv2d(16, 16, 3, 1, 1, bias=False)
        self.bn2 = norm(16)
        self.shortcut = nn.Sequential(nn.Conv2d(3, 16, 1, 2, bias=False), norm(16))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(16 * 4 * 4, 5)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))
        return self.head(torch.flatten(self.pool(out), 1))


def group_norm(channels):
    return nn.GroupNorm(2, channels)


def batches(count=3, rows=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, 3, 16, 16, generator=g), torch.randint(0, 5, (rows,), generator=g))
            for _ in range(count)]


def train(model, device, data, steps=4):
    model = model.to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


# Group norm's backward kernel assumes its gradient and input share a layout.
@pytest.mark.parametrize("norm", [nn.BatchNorm2d, group_norm], ids=["batch_norm", "group_norm"])
def test_a_resnet_block_trains_like_the_cpu(norm):
    torch.manual_seed(0)
    model = Block(norm)
    data = batches()
    cpu_losses, cpu_state = train(copy.deepcopy(model), "cpu", data)
    ipu_losses, ipu_state = train(model, "ipu", data)
    torch.testing.assert_close(ipu_losses, cpu_losses, rtol=1e-4, atol=0)
    torch.testing.assert_close(ipu_state, cpu_state, rtol=1e-4, atol=1e-5)


def test_a_resnet_block_in_training_and_inference_models():
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    (x, y), = batches(count=1, rows=8)

    class WithLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.loss = nn.CrossEntropyLoss()

        def forward(self, x, y):
            out = self.inner(x)
            return out, self.loss(out, y)

    options = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(WithLoss(model), options,
                                      poptorch.optim.SGD(model.parameters(), lr=0.05))
    cpu_optimiser = torch.optim.SGD(reference.parameters(), lr=0.05)
    cpu_losses = []
    for xs, ys in zip(x.split(4), y.split(4)):
        cpu_optimiser.zero_grad()
        loss = nn.functional.cross_entropy(reference(xs), ys)
        loss.backward()
        cpu_optimiser.step()
        cpu_losses.append(loss.detach())
    _, losses = training(x, y)
    torch.testing.assert_close(losses, torch.stack(cpu_losses), rtol=1e-4, atol=0)
    training.detachFromDevice()

    reference.eval()
    inference = poptorch.inferenceModel(model.eval(), options)
    torch.testing.assert_close(inference(x), reference(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels", [6, 16], ids=["nchw", "channels_last"])
def test_users_see_the_strides_the_cpu_gives(channels):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, channels, 3)
    x = torch.randn(2, 3, 9, 9)
    expected = torch.relu(conv(x))
    ipu_conv = copy.deepcopy(conv).to("ipu")
    got = torch.relu(ipu_conv(x.to("ipu")))
    assert got.stride() == expected.stride()
    assert_same(expected, got, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: nn.ConvTranspose2d(4, 3, 3, stride=2),
    lambda: nn.Conv2d(4, 8, 3, groups=2, dilation=2),
    lambda: nn.Conv2d(4, 1, 1),
    lambda: nn.Conv1d(4, 3, 3),
    lambda: nn.Conv3d(4, 3, 3),
], ids=["transposed", "grouped_dilated", "one_channel", "conv1d", "conv3d"])
def test_other_convolutions_keep_their_results_and_gradients(make):
    torch.manual_seed(0)
    conv = make()
    spatial = {nn.Conv1d: (10,), nn.Conv3d: (6, 6, 6)}.get(type(conv), (10, 10))
    x = torch.randn(2, 4, *spatial, requires_grad=True)
    ipu_conv = copy.deepcopy(conv).to("ipu")
    ipu_x = x.detach().to("ipu").requires_grad_()
    expected = torch.relu(conv(x))
    got = torch.relu(ipu_conv(ipu_x))
    expected.sum().backward()
    got.sum().backward()
    assert_same(expected.detach(), got.detach(), rtol=1e-5, atol=1e-5)
    assert_same(x.grad, ipu_x.grad, rtol=1e-5, atol=1e-5)
    assert_same(conv.weight.grad, ipu_conv.weight.grad, rtol=1e-5, atol=1e-5)


def _group_norm_gradients(device, x, grad, norm, create_graph):
    layer = copy.deepcopy(norm).to(device)
    inp = x.to(device).detach().requires_grad_()
    out = layer(inp)
    grads = torch.autograd.grad(out, (inp, layer.weight, layer.bias), grad.to(device),
                                create_graph=create_graph)
    if create_graph:  # and grad of grad, through PyTorch's differentiable formula
        (grads[0].pow(2).sum() + grads[1].pow(2).sum()).backward()
        return (out, *grads, inp.grad, layer.weight.grad)
    return (out, *grads)


# PyTorch's derivative of group norm hands its backward kernel contiguous operands on every
# device but the CPU (and XPU), which made a channels-last input's gradient contiguous on the
# ipu (test_modules.py's test_memory_format); the ipu runs the CPU's kernels, so it takes the
# CPU's branch: the CPU's layouts, and its values bit for bit.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("memory_format,shape", [(torch.channels_last, (2, 6, 5, 4)),
                                                 (torch.channels_last_3d, (2, 6, 3, 4, 2))],
                         ids=["channels_last", "channels_last_3d"])
@pytest.mark.parametrize("create_graph", [False, True], ids=["backward", "double_backward"])
def test_group_norm_gradients_of_channels_last_inputs_are_the_cpus(dtype, memory_format, shape,
                                                                   create_graph):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype=dtype, memory_format=memory_format)
    grad = torch.randn(shape).to(dtype)
    norm = nn.GroupNorm(3, shape[1]).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    expected = _group_norm_gradients("cpu", x, grad, norm, create_graph)
    got = _group_norm_gradients("ipu", x, grad, norm, create_graph)
    assert [t.stride() for t in got] == [t.stride() for t in expected]
    assert_same(expected, got, rtol=0, atol=0)


# The ipu's autograd kernel for group norm keeps PyTorch's forward-mode formula, whose views
# of a channels-last tangent fail on the CPU too.
def test_forward_mode_group_norm_of_a_channels_last_input_fails_as_on_the_cpu():
    import torch.autograd.forward_ad as fwad
    x = torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last)
    for device in ("cpu", "ipu"):
        dual = (x.to(device), torch.randn_like(x).to(device))
        with fwad.dual_level(), pytest.raises(RuntimeError, match="view size is not compatible"):
            nn.functional.group_norm(fwad.make_dual(*dual), 3)
