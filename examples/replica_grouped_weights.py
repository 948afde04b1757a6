"""Replica-grouped weights: a weight split in column shards across replicas.

The problem of PopTorch's user-guide example on grouping weights: ``Z = X @ W``
with ``X`` of 24 x 40 and ``W`` of 40 x 56 trained on the mean of ``Z**2``,
over 8 replicas. ``W`` is cut into 4 shards of 14 columns; the parameter holds
them as ``[4, 40, 14]`` and replica ``r`` uses shard ``r % 4``
(``CommGroupType.Orthogonal`` groups of 2 replicas: {0, 4}, {1, 5}, ...). The
batch is cut in 2 (``replicationFactor(8, 2)``: replicas 0-3 read the first
12 rows, 4-7 the last 12). Each shard's gradient is summed over its group's
replicas and, as every gradient, averaged over all 8, as PopTorch does: the
shards train exactly as the whole ``W`` does on the CPU.

    python examples/replica_grouped_weights.py

prints each step's loss (the mean of ``Z**2`` over the whole of ``Z``) and
checks the trained shards, and the losses, against the CPU training ``W``.
"""
from __future__ import annotations

import argparse
from typing import List, Tuple

import torch

import poptorch
from poptorch import CommGroupType, VariableRetrievalMode

SHARDS = 4  # column shards of W, one per replica of a data group
DATA_GROUPS = 2  # ways the batch is split


class ShardedProduct(torch.nn.Module):
    def __init__(self, shards: torch.Tensor) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(shards)  # [SHARDS, 40, 14]; a replica sees [40, 14]

    def forward(self, x: torch.Tensor):
        z = x @ self.W
        return z, poptorch.identity_loss(z**2, reduction="mean")


def problem(seed: int = 100):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(24, 40, generator=generator)
    w = torch.randn(40, 56, generator=generator) / (40**0.5)
    return x, w


def shard(w: torch.Tensor) -> torch.Tensor:
    """[40, 56] -> [SHARDS, 40, 56 / SHARDS]: shard s is columns s*14 .. s*14+13."""
    return w.reshape(w.shape[0], SHARDS, -1).permute(1, 0, 2).contiguous()


def train_on_ipu(x: torch.Tensor, w: torch.Tensor, steps: int, lr: float):
    model = ShardedProduct(shard(w))
    opts = poptorch.Options().replicationFactor(SHARDS * DATA_GROUPS, DATA_GROUPS)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=lr))
    training.W.replicaGrouping(CommGroupType.Orthogonal, DATA_GROUPS,
                               VariableRetrievalMode.OnePerGroup)
    batch = x.reshape(DATA_GROUPS, -1, x.shape[1])  # one micro-batch of 12 rows per data group
    losses = []
    for _ in range(steps):
        _, loss = training(batch)  # one loss per replica, over its 12 x 14 part of Z
        losses.append(float(loss.sum()) / (SHARDS * DATA_GROUPS))
    return losses, model.W.detach().clone()


def train_on_cpu(x: torch.Tensor, w: torch.Tensor, steps: int,
                 lr: float) -> Tuple[List[float], torch.Tensor]:
    """The whole problem on the CPU: its losses, and ``W`` trained, in shards."""
    w = w.clone().requires_grad_()
    optimizer = torch.optim.SGD([w], lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((x @ w)**2).mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, shard(w.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    x, w = problem()
    losses, trained = train_on_ipu(x, w, args.steps, args.lr)
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.6f}")
    cpu_losses, cpu_trained = train_on_cpu(x, w, args.steps, args.lr)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(trained, cpu_trained, rtol=1e-5, atol=1e-6)
    print("trained shards equal the CPU's:", list(trained.shape))


if __name__ == "__main__":
    main()
