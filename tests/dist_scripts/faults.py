"""Two processes train; process 1 dies ('die') or stops answering ('hang')
before the third step. Process 0 must fail with poptorch.Error."""
import os
import sys
import time

import torch

import poptorch

mode, timeout = sys.argv[1], float(sys.argv[2])
opts = poptorch.Options()
opts.Distributed.setTimeout(timeout)
rank = opts.Distributed.processId


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return torch.nn.functional.l1_loss(self.fc(x), y)


model = Net()
training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(5):
    if rank == 1 and step == 2:
        if mode == "die":
            os._exit(3)
        time.sleep(600)  # the test kills it
    start = time.monotonic()
    try:
        training(torch.randn(2, 4), torch.randn(2, 1))
    except poptorch.Error as error:
        print(f"rank {rank} step {step} after {time.monotonic() - start:.1f} s: {error}",
              flush=True)
        sys.exit(1)
print(f"rank {rank}: no error", flush=True)
