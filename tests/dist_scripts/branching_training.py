"""Gradient accumulation over variants of the step in two processes: each
process trains test_accumulation_skips_unused's Branching model on its own
micro-batches, whose flags say which parameters they train; each process saves
its weights."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import poptorch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_accumulation_skips_unused import OPTIMIZERS, Branching  # noqa: E402 pylint: disable=wrong-import-position

ACCUMULATION, MICRO = 2, 2
# Per step, each process's `use` flag per micro-batch: in the second step no
# micro-batch of any process trains `sometimes`, in the others one process does.
FLAGS = [((0, 0), (1, 0)), ((0, 0), (0, 0)), ((1, 1), (0, 0))]


def batches(step):
    """The step's inputs for all processes (process-major rows)."""
    data = torch.Generator().manual_seed(step)
    x, y = torch.randn(2 * ACCUMULATION * MICRO, 4, generator=data), torch.randn(
        2 * ACCUMULATION * MICRO, 4, generator=data)
    use = torch.tensor(FLAGS[step]).flatten().repeat_interleave(MICRO)
    return x, y, use


if __name__ == "__main__":
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ACCUMULATION)
    rank = opts.Distributed.processId
    torch.manual_seed(0)
    model = Branching()
    training = poptorch.trainingModel(model, opts, OPTIMIZERS["sgd"](model.parameters()))
    for step in range(len(FLAGS)):
        rows = slice(rank * ACCUMULATION * MICRO, (rank + 1) * ACCUMULATION * MICRO)
        training(*(t[rows] for t in batches(step)))
    training.copyWeightsToHost()
    # Each process its own file (see launch.per_process).
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, f"{sys.argv[1]}.{rank}")
    dist.destroy_process_group()
