"""Plain PyTorch training loops give the CPU's losses, step for step."""
import sys
from pathlib import Path

import pytest
import torch

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from classification_model import ClassificationModel  # noqa: E402

OPTIMISERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
}


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def train(make_model, make_optimiser, device, batches, steps):
    model = make_model().to(device)
    optimiser = make_optimiser(model.parameters())
    losses, compiled = [], []
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        compiled.append(poptorch.metrics()["graphs_compiled"])
    weights = {k: v.cpu() for k, v in model.state_dict().items()}
    return losses, compiled, weights


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_mlp_losses_match_the_cpu(name):
    torch.manual_seed(1)
    batches = [(torch.randn(16, 8), torch.randint(0, 4, (16,))) for _ in range(3)]
    cpu_losses, _, cpu_weights = train(mlp, OPTIMISERS[name], "cpu", batches, 8)
    ipu_losses, compiled, ipu_weights = train(mlp, OPTIMISERS[name], "ipu", batches, 8)
    torch.testing.assert_close(ipu_losses, cpu_losses, rtol=1e-4, atol=0)
    torch.testing.assert_close(ipu_weights, cpu_weights, rtol=1e-4, atol=1e-6)
    # After the first two steps (optimiser state is created in step one), nothing compiles.
    assert compiled[2:] == [compiled[1]] * (len(compiled) - 2), compiled


def test_seed_cnn_trains_like_the_cpu():
    torch.manual_seed(2)
    batches = [(torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))) for _ in range(2)]
    make = lambda: (torch.manual_seed(0), ClassificationModel())[1]  # noqa: E731
    sgd = OPTIMISERS["sgd_momentum"]
    cpu_losses, _, cpu_weights = train(make, sgd, "cpu", batches, 5)
    ipu_losses, compiled, ipu_weights = train(make, sgd, "ipu", batches, 5)
    torch.testing.assert_close(ipu_losses, cpu_losses, rtol=1e-4, atol=0)
    torch.testing.assert_close(ipu_weights, cpu_weights, rtol=1e-4, atol=1e-5)
    assert compiled[2:] == [compiled[1]] * 3
    assert poptorch.metrics()["host_fallbacks"] == 0


def test_gradients_match_the_cpu():
    torch.manual_seed(3)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 5, requires_grad=True)
    xi = x.detach().to("ipu").requires_grad_()
    wi = w.detach().to("ipu").requires_grad_()
    (x @ w).tanh().pow(2).mean().backward()
    (xi @ wi).tanh().pow(2).mean().backward()
    torch.testing.assert_close(xi.grad.cpu(), x.grad)
    torch.testing.assert_close(wi.grad.cpu(), w.grad)


def test_backward_works_when_poptorch_is_imported_after_a_cpu_backward():
    from conftest import run_python
    result = run_python(
        "import torch\n"
        "x = torch.ones(2, requires_grad=True); (x * 2).sum().backward()\n"
        "import poptorch\n"
        "y = torch.ones(2, device='ipu', requires_grad=True); (y * 3).sum().backward()\n"
        "print(y.grad.tolist())\n")
    assert result.stdout.strip() == "[3.0, 3.0]", result.stderr
