"""One function per mode: each builds what the mode needs for a model and
returns a ``Runner`` whose ``step()`` does one call (one training or inference
step, or for ``poptorch`` one call of ``deviceIterations`` steps), ending in a
sync point (``loss.item()`` / ``out.cpu()``) so every mode does the same work."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
from torch import nn

from models import ModelWithLoss

DEVICE_ITERATIONS = 16
LR = 0.01
MOMENTUM = 0.9

Batch = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class Runner:
    step: Callable[[], None]
    steps_per_call: int = 1


def _plain_loop(model: nn.Module, data: Batch, train: bool, device: str,
                wrap: Callable[[Callable], Callable]) -> Runner:
    """The plain PyTorch loop of eager, compile and lazy modes: each step moves a
    host batch to ``device``, runs ``wrap(body)`` and reads the result back."""
    model.to(device).train(train)
    x_all, y_all = data
    batch = len(x_all) // DEVICE_ITERATIONS
    batches = itertools.cycle(list(zip(x_all.split(batch), y_all.split(batch))))
    if train:
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

        def train_body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            return loss

        body = wrap(train_body)

        def train_step() -> None:
            x, y = next(batches)
            body(x.to(device), y.to(device)).item()

        return Runner(train_step)

    forward = wrap(model)

    def infer_step() -> None:
        x, _ = next(batches)
        with torch.no_grad():
            forward(x.to(device)).cpu()

    return Runner(infer_step)


def eager(model: nn.Module, data: Batch, train: bool) -> Runner:
    """Plain PyTorch on the CPU."""
    return _plain_loop(model, data, train, "cpu", lambda f: f)


def compile(model: nn.Module, data: Batch, train: bool) -> Runner:  # noqa: A001
    """``torch.compile`` (inductor) of the whole training step, or of the model
    for inference, on the CPU."""
    return _plain_loop(model, data, train, "cpu",
                       lambda f: torch.compile(f, backend="inductor"))


def lazy(model: nn.Module, data: Batch, train: bool) -> Runner:
    """``model.to("ipu")`` with the plain PyTorch loop."""
    import poptorch  # noqa: F401  (registers the ipu device)
    return _plain_loop(model, data, train, "ipu", lambda f: f)


def compile_ipu(model: nn.Module, data: Batch, train: bool) -> Runner:
    """``torch.compile(backend="ipu")`` of the same step as ``compile``, on the ipu."""
    import poptorch  # noqa: F401  (registers the ipu device and backend)
    return _plain_loop(model, data, train, "ipu", lambda f: torch.compile(f, backend="ipu"))


def poptorch_mode(model: nn.Module, data: Batch, train: bool) -> Runner:
    """``poptorch.trainingModel`` / ``inferenceModel`` with deviceIterations(16):
    each call consumes the 16 batches of ``data`` at once."""
    import poptorch
    options = poptorch.Options().deviceIterations(DEVICE_ITERATIONS)
    x, y = data
    if train:
        model.train()
        with_loss = ModelWithLoss(model)
        optimizer = poptorch.optim.SGD(with_loss.parameters(), lr=LR, momentum=MOMENTUM)
        training = poptorch.trainingModel(with_loss, options, optimizer)

        def train_step() -> None:
            _, loss = training(x, y)
            loss.cpu()

        return Runner(train_step, DEVICE_ITERATIONS)

    model.eval()
    inference = poptorch.inferenceModel(model, options)

    def infer_step() -> None:
        inference(x).cpu()

    return Runner(infer_step, DEVICE_ITERATIONS)


MODES: Dict[str, Callable[[nn.Module, Batch, bool], Runner]] = {
    "eager": eager, "compile": compile, "lazy": lazy, "poptorch": poptorch_mode,
    "compile_ipu": compile_ipu,
}
IPU_MODES = ("lazy", "poptorch", "compile_ipu")
