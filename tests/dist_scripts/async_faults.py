"""async_op collectives on ipu tensors when a process dies ('die') or stops
answering ('hang') after the first: process 0's wait() must raise, at once or
after the process group's timeout, never hang."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import poptorch  # noqa: F401  (registers the ipu backend)

mode, timeout = sys.argv[1], float(sys.argv[2])
dist.init_process_group(timeout=datetime.timedelta(seconds=timeout))
rank = dist.get_rank()
x = torch.ones(3, device="ipu")
dist.all_reduce(x, async_op=True).wait()
if rank == 1:
    if mode == "die":
        os._exit(3)
    time.sleep(600)  # the test kills it
start = time.monotonic()
work = dist.all_reduce(x, async_op=True)
try:
    work.wait()
except RuntimeError as error:
    print(f"rank 0 failed after {time.monotonic() - start:.1f} s: {error}", flush=True)
    sys.exit(1)
print("rank 0: no error", flush=True)
