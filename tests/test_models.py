"""Whole models on the ipu, in lazy mode, against the CPU: forward, gradients, and a
second run of the same (cached) graphs, whose temporaries reuse the arena of the first."""
from __future__ import annotations

import copy
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch import nn

from conftest import assert_same

Inputs = Tuple[torch.Tensor, ...]


def _decoder() -> nn.Module:
    layer = nn.TransformerDecoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    return nn.TransformerDecoder(layer, 2)


MODELS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Inputs]]] = {
    "lstm": (lambda: nn.LSTM(16, 32, num_layers=2, batch_first=True),
             lambda: (torch.randn(4, 10, 16),)),
    "gru": (lambda: nn.GRU(16, 32, batch_first=True), lambda: (torch.randn(4, 10, 16),)),
    "embedding_bag": (lambda: nn.EmbeddingBag(50, 8, mode="mean"),
                      lambda: (torch.randint(0, 50, (6, 5)),)),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(3, 8, 5, padding=2), nn.GELU(),
                                     nn.AdaptiveAvgPool1d(4)),
               lambda: (torch.randn(2, 3, 20),)),
    "transposed_conv": (lambda: nn.Sequential(nn.ConvTranspose2d(4, 3, 3, stride=2),
                                              nn.BatchNorm2d(3), nn.Hardswish()),
                        lambda: (torch.randn(2, 4, 6, 6),)),
    "transformer_decoder": (_decoder, lambda: (torch.randn(2, 7, 32), torch.randn(2, 9, 32))),
    "pool_upsample": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.MaxPool2d(2),
                                            nn.Upsample(scale_factor=2, mode="bilinear"),
                                            nn.GroupNorm(2, 6), nn.SiLU()),
                      lambda: (torch.randn(2, 3, 12, 12),)),
    "mlp": (lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                  nn.Linear(64, 5), nn.LogSoftmax(-1)),
            lambda: (torch.randn(16, 20),)),
}


def _first(output):
    return output[0] if isinstance(output, tuple) else output


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_model_matches_the_cpu(name: str, train: bool) -> None:
    build, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().train(train)
    inputs = make_inputs()
    on_ipu = copy.deepcopy(model).to("ipu")

    expected = _first(model(*inputs))
    result = _first(on_ipu(*[x.to("ipu") for x in inputs]))
    assert_same(expected, result, atol=1e-4, rtol=1e-4)

    if train:
        expected.pow(2).mean().backward()
        result.pow(2).mean().backward()
        for (param_name, cpu_param), ipu_param in zip(model.named_parameters(),
                                                      on_ipu.parameters()):
            assert_same(cpu_param.grad, ipu_param.grad, atol=1e-4, rtol=1e-3,
                        msg=f"gradient of {param_name}")
    else:
        # The same graph again, from the cache: the arena holds the first run's bytes.
        again = _first(on_ipu(*[x.to("ipu") for x in inputs]))
        assert_same(expected, again, atol=1e-4, rtol=1e-4)


class _SequenceClassifier(nn.Module):
    """A recurrent or attention encoder, mean-pooled, then a linear head and its loss."""

    def __init__(self, encoder: nn.Module, width: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(width, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(_first(self.encoder(x)).mean(1))
        return logits, self.loss(logits, y)


@pytest.mark.parametrize("encoder", ["lstm", "transformer"])
def test_sequence_model_trains_under_training_model_like_the_cpu(encoder: str) -> None:
    import poptorch
    torch.manual_seed(0)
    if encoder == "lstm":
        layers: nn.Module = nn.LSTM(16, 32, batch_first=True)
    else:
        layers = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0), 2,
            enable_nested_tensor=False)
    model = _SequenceClassifier(layers, 32)
    reference = copy.deepcopy(model)
    iterations, batch = 4, 8
    x = torch.randn(iterations * batch, 10, 16 if encoder == "lstm" else 32)
    y = torch.randint(0, 3, (iterations * batch,))

    options = poptorch.Options().deviceIterations(iterations)
    training = poptorch.trainingModel(model, options,
                                      poptorch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        _, loss = training(x, y)
        for k in range(iterations):
            optimizer.zero_grad()
            _, expected = reference(x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch])
            expected.backward()
            optimizer.step()
        # The default output mode returns the last iteration's loss.
        torch.testing.assert_close(loss, expected.detach(), atol=1e-5, rtol=1e-4)
    training.copyWeightsToHost()
    for (name, trained), (_, wanted) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(trained, wanted, atol=1e-4, rtol=1e-4, msg=name)
