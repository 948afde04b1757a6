"""Two processes x 2 replicas train STEPS steps, saving a checkpoint after
each; process 1 fails in step 2 of the first attempt. Run by torchrun with
--max-restarts, the restarted processes resume from the checkpoint. Process 0
saves the final weights."""
import os
import sys

import torch

import poptorch

REPLICAS, MICRO = 2, 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)

    def forward(self, x, y):
        return ((self.fc2(torch.tanh(self.fc1(x))) - y) ** 2).mean()


def whole(step, processes):
    """Step `step`'s batch for the replicas of all processes."""
    data = torch.Generator().manual_seed(step)
    rows = REPLICAS * processes * MICRO
    return torch.randn(rows, 4, generator=data), torch.randn(rows, 1, generator=data)


def batch(step, rank, processes):
    """Process `rank`'s replicas' rows of step `step`'s batch."""
    mine = slice(rank * REPLICAS * MICRO, (rank + 1) * REPLICAS * MICRO)
    return tuple(t[mine] for t in whole(step, processes))


if __name__ == "__main__":
    checkpoint, out_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    opts = poptorch.Options().replicationFactor(REPLICAS)
    opts.Distributed.setTimeout(30)
    rank, processes = opts.Distributed.processId, opts.Distributed.numProcesses
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        print(f"rank {rank}: resuming at step {first}", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer)
    for step in range(first, steps):
        if rank == 1 and step == 2 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            raise RuntimeError("process 1 fails in step 2 of the first attempt")
        training(*batch(step, rank, processes))
        if rank == 0:  # written whole or not at all: a kill may come at any time
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
    if rank == 0:
        torch.save(model.state_dict(), out_path)
