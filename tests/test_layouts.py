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
