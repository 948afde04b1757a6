"""The main job: the seed tutorial (shared/seeds/004) ported the PopTorch way —
Options, poptorch.DataLoader, trainingModel with poptorch.optim.SGD, then
inferenceModel for evaluation — on scikit-learn's handwritten digits."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    args = parser.parse_args()

    torch.manual_seed(0)
    train_dataset, test_dataset = digits_datasets()

    opts = poptorch.Options().deviceIterations(args.device_iterations).randomSeed(0)
    train_dataloader = poptorch.DataLoader(opts, train_dataset, batch_size=args.batch_size,
                                           shuffle=True, drop_last=True)

    model = ClassificationModel()
    model.train()
    model = ModelwithLoss(model, nn.CrossEntropyLoss())
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    training_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)

    for epoch in range(1, args.epochs + 1):
        bar = tqdm(train_dataloader, desc=f"[Epoch {epoch:02d}]")
        for data, labels in bar:
            output, loss = training_model(data, labels)
            bar.set_postfix({"Loss": f"{float(loss):.3f}"})
    training_model.detachFromDevice()

    eval_opts = poptorch.Options().deviceIterations(args.device_iterations)
    test_dataloader = poptorch.DataLoader(eval_opts, test_dataset, batch_size=args.batch_size,
                                          drop_last=True)
    model.eval()
    inference_model = poptorch.inferenceModel(model, options=eval_opts)
    correct = total = 0
    for data, labels in tqdm(test_dataloader, desc="Evaluation"):
        predictions = inference_model(data).argmax(dim=1)
        correct += (predictions == labels).sum().item()
        total += len(labels)
    inference_model.detachFromDevice()
    print(f"Eval accuracy: {100.0 * correct / total:.2f}%")


if __name__ == "__main__":
    main()
