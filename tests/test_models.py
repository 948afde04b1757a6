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
