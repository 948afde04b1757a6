"""The benchmark models and their data: random tensors (token ids for the
Hugging Face models) made once with a fixed seed, integer class labels, no
downloads (the Hugging Face models are built from configs, with random weights)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from classification_model import ClassificationModel  # noqa: E402

NUM_CLASSES = 10
DATA_SEED = 0
MODEL_SEED = 0


class TransformerClassifier(nn.Module):
    """A 2-layer ``nn.TransformerEncoder`` (d_model 128, 4 heads, feed-forward 256),
    mean-pooled over the sequence, then a linear head."""

    def __init__(self, d_model: int = 128, heads: int = 4, layers: int = 2,
                 feedforward: int = 256) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=feedforward,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, and a 1x1
    projection on the shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet8() -> nn.Module:
    """ResNet-8 for 32x32x3 images: a stem, 3 stages of one BasicBlock each
    (16/32/64 channels), global average pooling, a linear classifier."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, NUM_CLASSES))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, NUM_CLASSES))


class HuggingFaceClassifier(nn.Module):
    """A Hugging Face sequence classifier, returning its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


# Issue 13's size for both: hidden 256, 4 layers, 4 heads, sequence 128 (batch 8);
# vocabularies and everything else are the models' defaults.
HF_SEQUENCE = 128


def bert() -> nn.Module:
    import transformers
    config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, intermediate_size=1024,
                                     num_labels=NUM_CLASSES)
    return HuggingFaceClassifier(transformers.BertForSequenceClassification(config))


def gpt2() -> nn.Module:
    import transformers
    # Classification reads the last token before padding: the pad id is the
    # last of the vocabulary, which the data never uses.
    config = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=HF_SEQUENCE,
                                     num_labels=NUM_CLASSES)
    config.pad_token_id = config.vocab_size - 1
    return HuggingFaceClassifier(transformers.GPT2ForSequenceClassification(config))


def _vocabulary(name: str) -> int:
    import transformers
    config = transformers.BertConfig() if name == "bert" else transformers.GPT2Config()
    return config.vocab_size - 1  # ids below it: never GPT-2's pad id above


@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[], nn.Module]
    batch: int
    input_shape: Tuple[int, ...]  # one sample, without the batch dimension
    token_ids: bool = False  # inputs are token ids of the model's vocabulary


MODELS: Dict[str, ModelSpec] = {
    "mlp": ModelSpec(mlp, 32, (784,)),
    "cnn": ModelSpec(ClassificationModel, 16, (1, 28, 28)),
    "transformer": ModelSpec(TransformerClassifier, 8, (64, 128)),
    "resnet8": ModelSpec(resnet8, 32, (3, 32, 32)),
    "bert": ModelSpec(bert, 8, (HF_SEQUENCE,), token_ids=True),
    "gpt2": ModelSpec(gpt2, 8, (HF_SEQUENCE,), token_ids=True),
}


def build_model(name: str) -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return MODELS[name].build()


def make_data(name: str, batches: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``batches`` batches of inputs and labels, stacked along dimension 0."""
    spec = MODELS[name]
    generator = torch.Generator().manual_seed(DATA_SEED)
    rows = batches * spec.batch
    if spec.token_ids:
        x = torch.randint(0, _vocabulary(name), (rows, *spec.input_shape), generator=generator)
    else:
        x = torch.randn((rows, *spec.input_shape), generator=generator)
    y = torch.randint(0, NUM_CLASSES, (rows,), generator=generator)
    return x, y


class ModelWithLoss(nn.Module):
    """What ``poptorch.trainingModel`` wants: the model returning (output, loss)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        output = self.model(x)
        return output, self.criterion(output, labels)
