"""Collectives on ipu tensors that the process exits without waiting for:
gloo's worker threads let go of their tensors while the interpreter
finalises, which must not abort the process. Before that, synchronous ones:
poptorch keeps what it lends to gloo only until gloo lets it go."""
import sys

import torch
import torch.distributed as dist

from poptorch import _C

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
for _ in range(20):
    x = torch.ones(100, device="ipu")
    dist.all_reduce(x)
    assert x.cpu().eq(size).all()
print(f"kept after 20 synchronous collectives: {_C.lent_to_collectives()}", flush=True)
for _ in range(int(sys.argv[1])):
    mine = torch.full((1000,), float(rank), device="ipu")
    gathered = [torch.empty(1000, device="ipu") for _ in range(size)]
    dist.all_gather(gathered, mine, async_op=True)  # never waited for
print("exiting with collectives in flight", flush=True)
