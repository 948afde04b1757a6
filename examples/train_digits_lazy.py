"""Lazy mode: the seed tutorial's ClassificationModel trained on the ipu
with `model.to("ipu")` and a plain PyTorch loop, on scikit-learn's digits."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import poptorch  # noqa: E402  (registers the ipu device)
from classification_model import ClassificationModel  # noqa: E402
from digits_data import digits_datasets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="ipu")
    args = parser.parse_args()

    torch.manual_seed(0)
    train_set, test_set = digits_datasets()
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=64)

    device = torch.device(args.device)
    model = ClassificationModel().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    model.train()
    for epoch in range(1, args.epochs + 1):
        bar = tqdm(train_loader, desc=f"[Epoch {epoch:02d}]")
        for data, labels in bar:
            data, labels = data.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(data), labels)
            loss.backward()
            optimizer.step()
            bar.set_postfix(Loss=f"{loss.item():.3f}")

    model.eval()
    correct = 0
    with torch.no_grad():
        for data, labels in tqdm(test_loader, desc="Evaluation"):
            predictions = model(data.to(device)).argmax(dim=1)
            correct += (predictions.cpu() == labels).sum().item()
    print(f"Eval accuracy: {100.0 * correct / len(test_set):.2f}%")
    if device.type == "ipu":
        m = poptorch.metrics()
        print(f"ipu: {m['graphs_compiled']} graphs compiled, {m['cache_hits']} cache hits, "
              f"{m['host_fallbacks']} host fallbacks")


if __name__ == "__main__":
    main()
