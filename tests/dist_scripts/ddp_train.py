"""DistributedDataParallel on an ipu model: each rank trains on its half of
each batch; each rank saves its weights and losses."""
import sys

import torch
import torch.distributed as dist

import poptorch  # noqa: F401  (registers the ipu backend)

out_path, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()

torch.manual_seed(1234 + rank)  # different initial weights: DDP broadcasts rank 0's
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
model.to("ipu")
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
data = torch.Generator().manual_seed(7)
losses = []
for _ in range(steps):
    x, y = torch.randn(8 * size, 6, generator=data), torch.randn(8 * size, 3, generator=data)
    mine = slice(8 * rank, 8 * (rank + 1))
    optimizer.zero_grad()
    loss = ((ddp(x[mine].to("ipu")) - y[mine].to("ipu")) ** 2).mean()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
weights = {k: v.cpu() for k, v in model.state_dict().items()}
torch.save((weights, losses), f"{out_path}.{rank}")  # each its own file: launch.per_process
dist.destroy_process_group()
