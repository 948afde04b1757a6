"""scikit-learn's handwritten digits (shipped inside the package), as 28x28
images so that the seed tutorial's ClassificationModel runs unchanged."""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset


def digits_datasets(test_fraction: float = 0.2, seed: int = 0) -> Tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - 0.5) / 0.5
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(labels) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])
