"""Shared fixtures: every comparison test runs the same code on cpu and ipu."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
import contextlib
import copy
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set,
                    Tuple)

import pytest
import torch

import poptorch
from poptorch.testing import assert_same  # noqa: F401 - the suite imports it from here

# The `device` parametrisation over cpu and ipu (also a pytest11 entry point once
# poptorch is installed; named the same, so it is registered once).
pytest_plugins = ["poptorch.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_metrics():
    poptorch.synchronize()
    poptorch.reset_metrics()
    yield


@pytest.fixture
def fresh_dynamo():
    """Dynamo forgets what it compiled before and after the test (a module uses
    it with ``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``)."""
    import torch._dynamo
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def results_of_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> List[Any]:
    """The results of each call of ``module.name`` from now on, in call order."""
    results: List[Any] = []
    function = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        results.append(function(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(module, name, recording)
    return results


@contextlib.contextmanager
def flush_denormals(on: bool) -> Iterator[None]:
    """torch.set_flush_denormal(on) while it lives."""
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def run_python(code: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for settings read at start-up)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=300)


def train_beside_the_cpu(model: torch.nn.Module, batches: Iterable[Sequence[Any]],
                         loss_of: Callable[[Any], torch.Tensor] = lambda out: out,
                         lr: float = 0.1,
                         prepare: Callable[[torch.nn.Module], Any] = lambda m: None,
                         **tolerances: Any) -> Any:
    """Trains `model` with trainingModel (SGD) and a copy of it on the CPU, one
    call and one CPU step per batch of inputs; asserts that every call's loss
    (`loss_of` picks it from the outputs) and the final weights and buffers
    equal the CPU's. `prepare` is called on both models first (for what a deep
    copy leaves out, such as hooks on tensors). Returns the wrapped model."""
    reference = copy.deepcopy(model)
    prepare(model)
    prepare(reference)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=lr))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    for inputs in batches:
        loss = loss_of(ipu(*inputs))
        optimizer.zero_grad()
        ref_loss = loss_of(reference(*inputs))
        ref_loss.backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss.detach(), **tolerances)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name, **tolerances)
    return ipu


def train_micro_batches_beside_the_cpu(model: torch.nn.Module, x: torch.Tensor,
                                       y: torch.Tensor, device_iterations: int = 4,
                                       calls: int = 2, lr: float = 0.1) -> torch.nn.Module:
    """Trains `model` (forward(x, y) returns (output, loss)) with trainingModel,
    `device_iterations` micro-batches of (x, y) per call, and a copy of it on the
    CPU, one SGD step per micro-batch; asserts the final weights equal the CPU's.
    Returns the trained CPU copy."""
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(device_iterations)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=lr))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    micro_batch = x.shape[0] // device_iterations
    for _ in range(calls):
        training(x, y)
        for xb, yb in zip(x.split(micro_batch), y.split(micro_batch)):
            optimizer.zero_grad()
            reference(xb, yb)[1].backward()
            optimizer.step()
    training.copyWeightsToHost()
    for (name, a), b in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(b, a, msg=name)
    return reference


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer
                  ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One classification training step of `model`, as a user writes it for
    torch.compile: zero_grad, forward, cross entropy, backward, step."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def sgd_training_step(model: torch.nn.Module,
                      **sgd_options: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`training_step` with torch.optim.SGD (lr 0.05)."""
    return training_step(model, torch.optim.SGD(model.parameters(), lr=0.05, **sgd_options))


def compiled_steps_beside_the_cpu(cpu: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                                  steps: int = 3) -> Set[str]:
    """Trains `cpu` and a copy of it on the ipu under torch.compile(backend="ipu")
    `steps` SGD steps (lr 0.1) of `training_step` on (x, y), asserts the losses
    and final weights equal the CPU's, and returns the names of the ops the
    last step ran (from the third, the steady step's replay)."""
    ipu = copy.deepcopy(cpu).to("ipu")
    step_cpu = training_step(cpu, torch.optim.SGD(cpu.parameters(), lr=0.1))
    step_ipu = torch.compile(training_step(ipu, torch.optim.SGD(ipu.parameters(), lr=0.1)),
                             backend="ipu")
    ran: Set[str] = set()
    for _ in range(steps):
        want = step_cpu(x, y).item()
        with torch.profiler.profile() as prof:
            got = step_ipu(x.to("ipu"), y.to("ipu")).item()
        ran = {e.name for e in prof.events()}
        torch.testing.assert_close(got, want)
    for a, b in zip(cpu.parameters(), ipu.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach())
    return ran


def compiled_training_beside_the_cpu(make_optimizer: Callable[[Any], torch.optim.Optimizer],
                                     steps: int) -> Tuple[torch.optim.Optimizer,
                                                          torch.optim.Optimizer]:
    """Trains a small classifier `steps` steps with torch.compile(backend="ipu")
    beside a CPU copy, asserts the losses and weights against the CPU's, and
    returns the two optimisers (ipu, CPU)."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 5))
    model = copy.deepcopy(reference).to("ipu")
    optimizers = make_optimizer(model.parameters()), make_optimizer(reference.parameters())
    ipu_step = torch.compile(training_step(model, optimizers[0]), backend="ipu")
    cpu_step = training_step(reference, optimizers[1])
    for _ in range(steps):
        x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
        loss = ipu_step(x.to("ipu"), y.to("ipu"))
        torch.testing.assert_close(loss.cpu(), cpu_step(x, y).detach(), rtol=1e-5, atol=1e-6)
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-6, msg=key)
    return optimizers
