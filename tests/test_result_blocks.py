"""Kernels' own results (convolution, batch norm, relu: no out= variant) reuse
the memory an earlier run's results freed (runtime/result_blocks.h): values are
the CPU's at every run, and torch.ipu.empty_cache() frees the kept blocks."""
import copy

import torch
from torch import nn

import poptorch


def _block() -> nn.Module:
    torch.manual_seed(0)
    # 8 x 16 x 32 x 32 floats: 512 KiB results, large enough to be recycled.
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                         nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())


def _train(model: nn.Module, device: str, steps: int) -> list:
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 3, 32, 32).to(device)
        optimizer.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_recycled_results_train_like_the_cpu():
    model = _block()
    cpu_model = copy.deepcopy(model)
    losses = _train(model, "ipu", 4)
    expected = _train(cpu_model, "cpu", 4)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4,
                               atol=1e-5)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


def test_empty_cache_frees_the_recycled_results():
    model = _block().eval()
    options = poptorch.Options()
    inference = poptorch.inferenceModel(model, options)
    x = torch.randn(8, 3, 32, 32)
    first = inference(x)
    assert torch.ipu.memory_stats()["host_cached_bytes"] >= 8 * 16 * 32 * 32 * 4
    torch.ipu.empty_cache()
    assert torch.ipu.memory_stats()["host_cached_bytes"] == 0
    torch.testing.assert_close(inference(x), first, rtol=0, atol=0)
    torch.testing.assert_close(first, model(x), rtol=1e-4, atol=1e-5)
