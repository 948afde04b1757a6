"""The main job: the seed tutorial (shared/seeds/004) ported the PopTorch way —
Options, poptorch.DataLoader, trainingModel with poptorch.optim.SGD, then
inferenceModel for evaluation — on scikit-learn's handwritten digits.
``--half`` trains in float16 (``model.half()``, float16 images) with loss scaling,
a fixed one or, with ``--automatic-loss-scaling``, one that adapts from 1."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Tuple

import torch
from torch import nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import poptorch  # noqa: E402
from classification_model import ClassificationModel  # noqa: E402
from digits_data import digits_datasets  # noqa: E402


class ModelwithLoss(nn.Module):
    def __init__(self, model, criterion):
        super().__init__()
        self.model = model
        self.criterion = criterion

    def forward(self, x, labels=None):
        output = self.model(x)
        if labels is not None:
            loss = self.criterion(output, labels)
            return output, loss
        return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device-iterations", type=int, default=4)
    parser.add_argument("--half", action="store_true",
                        help="train in float16 with loss scaling (1024)")
    parser.add_argument("--automatic-loss-scaling", action="store_true",
                        help="with --half: let the loss scaling adapt, starting from 1")
    args = parser.parse_args()
    _, accuracy = train_and_evaluate(args.epochs, args.batch_size, args.device_iterations,
                                     args.half, args.automatic_loss_scaling)
    print(f"Eval accuracy: {accuracy:.2f}%")


def train_and_evaluate(epochs: int, batch_size: int, device_iterations: int,
                       half: bool = False, automatic_loss_scaling: bool = False
                       ) -> Tuple[List[float], float]:
    """Trains the model; returns the mean loss of each epoch and the eval accuracy (%)."""
    torch.manual_seed(0)
    train_dataset, test_dataset = digits_datasets()

    dtype = torch.float16 if half else torch.float32
    opts = poptorch.Options().deviceIterations(device_iterations).randomSeed(0)
    opts.Training.setAutomaticLossScaling(automatic_loss_scaling)
    train_dataloader = poptorch.DataLoader(opts, train_dataset, batch_size=batch_size,
                                           shuffle=True, drop_last=True)

    model = ClassificationModel().to(dtype)
    model.train()
    model = ModelwithLoss(model, nn.CrossEntropyLoss())
    # Loss scaling keeps float16 gradients from underflowing; the update unscales them.
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                                   loss_scaling=1024.0 if half and not automatic_loss_scaling
                                   else 1.0)
    training_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)

    epoch_losses = []
    for epoch in range(1, epochs + 1):
        bar = tqdm(train_dataloader, desc=f"[Epoch {epoch:02d}]")
        losses = []
        for data, labels in bar:
            output, loss = training_model(data.to(dtype), labels)
            losses.append(float(loss))
            bar.set_postfix({"Loss": f"{losses[-1]:.3f}"})
        epoch_losses.append(sum(losses) / len(losses))
    training_model.detachFromDevice()

    eval_opts = poptorch.Options().deviceIterations(device_iterations)
    test_dataloader = poptorch.DataLoader(eval_opts, test_dataset, batch_size=batch_size,
                                          drop_last=True)
    model.eval()
    inference_model = poptorch.inferenceModel(model, options=eval_opts)
    correct = total = 0
    for data, labels in tqdm(test_dataloader, desc="Evaluation"):
        predictions = inference_model(data.to(dtype)).argmax(dim=1)
        correct += (predictions == labels).sum().item()
        total += len(labels)
    inference_model.detachFromDevice()
    return epoch_losses, 100.0 * correct / total


if __name__ == "__main__":
    main()
