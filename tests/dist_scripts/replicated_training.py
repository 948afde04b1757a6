"""PopDist-style replication: this process runs REPLICAS replicas of a
trainingModel (then an inferenceModel) on its replicas' rows of each global
batch; each process saves what it computed."""
import sys

import torch
import torch.distributed as dist

import poptorch
from poptorch.enums import OutputMode, ReductionType

REPLICAS, ITERATIONS, ACCUMULATION, MICRO, STEPS = 2, 2, 2, 3, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)

    def forward(self, x, y=None):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out if y is None else (out, ((out - y) ** 2).mean())


def options(replicas, reduction=ReductionType.Mean):
    opts = poptorch.Options().replicationFactor(replicas).deviceIterations(ITERATIONS)
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.Training.accumulationAndReplicationReductionType(reduction)
    return opts.outputMode(OutputMode.All)


def mine(batch, rank, processes, accumulation=ACCUMULATION):
    """Process `rank`'s replicas' rows of a batch for the replicas of all
    processes (ordered by iteration, accumulation step, replica)."""
    shaped = batch.reshape(ITERATIONS, accumulation, REPLICAS * processes, -1, *batch.shape[1:])
    return shaped[:, :, rank * REPLICAS:(rank + 1) * REPLICAS].reshape(-1, *batch.shape[1:])


if __name__ == "__main__":
    out_path = sys.argv[1]
    opts = options(REPLICAS)
    rank, processes = opts.Distributed.processId, opts.Distributed.numProcesses
    results = {}
    for reduction in (ReductionType.Mean, ReductionType.Sum):
        torch.manual_seed(100 + rank)  # other weights in each process: process 0's win
        model = Net()
        training = poptorch.trainingModel(model, options(REPLICAS, reduction),
                                          torch.optim.SGD(model.parameters(), lr=0.05))
        data = torch.Generator().manual_seed(3)
        outputs = []
        for _ in range(STEPS):
            rows = ITERATIONS * ACCUMULATION * REPLICAS * processes * MICRO
            x, y = torch.randn(rows, 5, generator=data), torch.randn(rows, 2, generator=data)
            out, loss = training(mine(x, rank, processes), mine(y, rank, processes))
            outputs.append((out, loss))
        training.destroy()
        results[reduction.name] = ({k: v.clone() for k, v in model.state_dict().items()},
                                   outputs)
    torch.manual_seed(100 + rank)
    inference = poptorch.inferenceModel(
        Net(), poptorch.Options().replicationFactor(REPLICAS).deviceIterations(ITERATIONS))
    x = torch.randn(ITERATIONS * REPLICAS * processes * MICRO, 5,
                    generator=torch.Generator().manual_seed(4))
    results["inference"] = inference(mine(x, rank, processes, accumulation=1))
    # Input groups of 2 consecutive replicas: one group per process, which feeds
    # it its own micro-batches.
    torch.manual_seed(100 + rank)
    grouped = poptorch.inferenceModel(Net(), poptorch.Options().replicationFactor(
        REPLICAS).deviceIterations(ITERATIONS).inputReplicaGrouping(REPLICAS))
    x = torch.randn(ITERATIONS * processes * MICRO, 5, generator=torch.Generator().manual_seed(5))
    rows = x.reshape(ITERATIONS, processes, MICRO, 5)[:, rank].reshape(-1, 5)
    results["grouped"] = grouped(rows)
    torch.save(results, f"{out_path}.{rank}")  # each process its own file: launch.per_process
    dist.destroy_process_group()
