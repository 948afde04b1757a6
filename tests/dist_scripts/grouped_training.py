"""Replica-grouped weights across processes: this process runs REPLICAS of
the 2 x REPLICAS replicas of test_replica_grouping.Grouped, on its replicas'
micro-batches; each process saves its weights and outputs."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import poptorch
from poptorch import CommGroupType, VariableRetrievalMode

# The tests' directory, found from this file: the test imports this module too,
# where sys.argv is pytest's.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_replica_grouping import (ACCUMULATION, ITERATIONS, REPLICAS, Grouped,  # noqa: E402
                                   batch)

LOCAL = REPLICAS // 2
# Orthogonal groups of 2 ({0, 2}, {1, 3}) span both processes; consecutive ones
# ({0, 1}, {2, 3}) stay in one; AllReplicas rows are the 4 replicas' own.
GROUPINGS = {  # of W and b, and their rows
    "orthogonal": ((CommGroupType.Orthogonal, 2, VariableRetrievalMode.OnePerGroup), 2),
    "consecutive": ((CommGroupType.Consecutive, 2, VariableRetrievalMode.OnePerGroup), 2),
    "all_replicas": ((CommGroupType.Orthogonal, 2, VariableRetrievalMode.AllReplicas), 4),
}
STEPS = 2


def wrap(model, replicas, grouping):
    opts = poptorch.Options().replicationFactor(replicas).deviceIterations(ITERATIONS)
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    training.per_replica_params.update(W=grouping[0], b=grouping[0])
    return training


def model_for(grouping):
    (_, _, mode), rows = grouping
    model = Grouped(rows)
    if mode == VariableRetrievalMode.AllReplicas:  # {0, 2} and {1, 3} share their rows
        with torch.no_grad():
            model.W.data = model.W.data[[0, 1, 0, 1]].clone()
            model.b.data = model.b.data[[0, 1, 0, 1]].clone()
    return model


def mine(x, rank):
    """Process `rank`'s replicas' rows (micro-batches, or losses) of a batch for all replicas."""
    shaped = x.reshape(ITERATIONS, ACCUMULATION, REPLICAS, -1, *x.shape[1:])
    return shaped[:, :, rank * LOCAL:(rank + 1) * LOCAL].reshape(-1, *x.shape[1:])


if __name__ == "__main__":
    rank = poptorch.Options().Distributed.processId
    results = {}
    for key, grouping in GROUPINGS.items():
        model = model_for(grouping)
        training = wrap(model, LOCAL, grouping)
        outputs = [training(*(mine(t, rank) for t in batch(step))) for step in range(STEPS)]
        training.destroy()
        results[key] = ({k: v.clone() for k, v in model.state_dict().items()}, outputs)
    torch.save(results, f"{sys.argv[1]}.{rank}")  # each process its own file: launch.per_process
    dist.destroy_process_group()
