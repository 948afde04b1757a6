"""Collectives on ipu tensors, checked against the values each rank knows."""
import sys

import torch
import torch.distributed as dist

import poptorch  # noqa: F401  (registers the ipu backend)

backend = sys.argv[1] if len(sys.argv) > 1 else None
assert dist.Backend.default_device_backend_map["ipu"] == "ipu"
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
ipu = torch.device("ipu")


def check(name, got, expected):
    torch.testing.assert_close(got.cpu(), expected, msg=f"{name} on rank {rank}")


# all_reduce of a tensor still pending (a graph boundary: it runs first).
x = torch.arange(6, dtype=torch.float32, device=ipu) * (rank + 1)
dist.all_reduce(x)
check("all_reduce", x, torch.arange(6.) * sum(range(1, size + 1)))
y = torch.full((4,), float(rank), device=ipu)
dist.all_reduce(y, op=dist.ReduceOp.MAX)
check("all_reduce max", y, torch.full((4,), float(size - 1)))

# A view: only its elements change, and the base sees them.
base = torch.zeros(3, 4, device=ipu)
row = base[1]
row.add_(rank + 1)
dist.all_reduce(row)
expected = torch.zeros(3, 4)
expected[1] = sum(range(1, size + 1))
check("all_reduce of a view", base, expected)

# async_op gives a Work to wait for, and the values after it.
z = torch.ones(2, device=ipu)
work = dist.all_reduce(z, async_op=True)
work.wait()
check("async all_reduce", z, torch.full((2,), float(size)))

# async_op overlaps: the last rank joins only once rank 0 has seen its Work
# pending and run ipu work meanwhile; then both wait, and the results equal the
# same collectives on CPU tensors.
store = dist.distributed_c10d._get_default_store()
values = [torch.arange(6.).reshape(2, 3) * (rank + 1), torch.full((4,), float(rank))]
on_ipu = [v.to(ipu) for v in values]
if rank == size - 1 and rank != 0:
    store.wait(["rank 0 saw its work pending"])
works = [dist.all_reduce(on_ipu[0], async_op=True),
         dist.all_reduce(on_ipu[1], op=dist.ReduceOp.MAX, async_op=True)]
if rank == 0:
    assert not any(w.is_completed() for w in works), "completed before the last rank joined"
    meanwhile = (torch.arange(4., device=ipu) * 2).sum()
    check("ipu work while the collective is pending", meanwhile, torch.tensor(12.))
    assert not works[0].is_completed()
    store.set("rank 0 saw its work pending", "1")
for w in works:
    w.wait()
    assert w.is_completed()
on_cpu = [v.clone() for v in values]
cpu_works = [dist.all_reduce(on_cpu[0], async_op=True),
             dist.all_reduce(on_cpu[1], op=dist.ReduceOp.MAX, async_op=True)]
for w in cpu_works:
    w.wait()
for got, expected in zip(on_ipu, on_cpu):
    check("async all_reduce against the CPU", got, expected)

b = torch.full((5,), float(rank + 10), device=ipu)
dist.broadcast(b, src=size - 1)
check("broadcast", b, torch.full((5,), float(size - 1 + 10)))

parts = [torch.empty(2, device=ipu) for _ in range(size)]
dist.all_gather(parts, torch.tensor([rank, -rank], dtype=torch.float32, device=ipu))
for r, part in enumerate(parts):
    check(f"all_gather[{r}]", part, torch.tensor([r, -r], dtype=torch.float32))

whole = torch.empty(2 * size, device=ipu)
dist.all_gather_into_tensor(whole, torch.full((2,), float(rank), device=ipu))
check("all_gather_into_tensor", whole, torch.arange(size).float().repeat_interleave(2))

out = torch.empty(3, device=ipu)
inputs = [torch.full((3,), float(rank * 100 + r), device=ipu) for r in range(size)]
dist.reduce_scatter(out, inputs)
check("reduce_scatter", out, torch.full((3,), float(sum(p * 100 + rank for p in range(size)))))

out = torch.empty(2, device=ipu)
dist.reduce_scatter_tensor(out, torch.arange(2 * size, dtype=torch.float32, device=ipu))
check("reduce_scatter_tensor", out, (torch.arange(2.) + 2 * rank) * size)

dist.barrier()

# Point to point, blocking and not.
got = torch.zeros(3, device=ipu)
if rank == 0:
    dist.send(torch.full((3,), 5.0, device=ipu), size - 1)
    dist.isend(torch.full((3,), 7.0, device=ipu), size - 1).wait()
elif rank == size - 1:
    dist.recv(got, 0)
    check("recv", got, torch.full((3,), 5.0))
    work = dist.irecv(got, 0)
    work.wait()
    assert work.is_completed()
    check("irecv", got, torch.full((3,), 7.0))

# An integer tensor, and the CPU tensors of the same group keep working.
n = torch.tensor([rank + 1], device=ipu)
dist.all_reduce(n)
assert n.item() == sum(range(1, size + 1)), n
c = torch.ones(2)
dist.all_reduce(c)
assert c.tolist() == [size, size], c

# Inside a wrapped model a collective is not part of the step: a clear error.
class Reduces(torch.nn.Module):
    def forward(self, x):
        dist.all_reduce(x)
        return x


try:
    poptorch.inferenceModel(Reduces())(torch.ones(2))
except poptorch.Error as error:
    assert "Options.Distributed" in str(error), error
else:
    raise AssertionError("a collective inside inferenceModel was not refused")

dist.destroy_process_group()
print(f"rank {rank}: collectives ok")
