"""Pipelined execution over several IPUs against the same model on one IPU
(issue 11 item 5): a training step of `--accumulation` micro-batches of a
stack of equal linear layers, unannotated on one IPU, then split into 2 and
4 balanced pipeline stages (``poptorch.BeginBlock``, one IPU each), every
kernel on one thread (``torch.set_num_threads(1)``: each IPU's thread runs
its kernels on one core, and the one-IPU run gets one core too).

Configurations are interleaved within each repeat, so that load from other
processes falls on all of them alike; the figure is the median of the
repeats' seconds per step (one call = one step). ``cores used`` is the
process's CPU time over the wall time: on a machine shared with other
processes (Linux's autogroup shares the cores between sessions, not threads)
it says how much of the machine the run got.

    python benchmarks/pipeline.py                 # 7 repeats
    python benchmarks/pipeline.py --repeats 3 --accumulation 8

Speed is reported, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from typing import Dict, List

import torch

import poptorch


class Stack(torch.nn.Module):
    """`layers` Linear(width, width) + tanh, then a mean squared error."""

    def __init__(self, layers: int, width: int, stages: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        per_stage = layers // stages
        for stage in range(1, stages):
            poptorch.BeginBlock(self.layers[stage * per_stage], ipu_id=stage)

    def forward(self, x: torch.Tensor, target: torch.Tensor):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, ((x - target) ** 2).mean()


def build(stages: int, args: argparse.Namespace):
    model = Stack(args.layers, args.width, stages)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(args.accumulation)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1)
    rows = args.rows * args.accumulation
    data = (torch.randn(rows, args.width, generator=g), torch.randn(rows, args.width, generator=g))
    training(*data)  # compiles
    return training, data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--rows", type=int, default=32, help="rows of a micro-batch")
    p.add_argument("--accumulation", type=int, default=16, help="micro-batches of a step")
    p.add_argument("--steps", type=int, default=3, help="steps timed per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args()
    torch.set_num_threads(1)
    configs = {f"{n} IPU{'s' if n > 1 else ''}": build(n, args) for n in (1, 2, 4)}
    seconds: Dict[str, List[float]] = {name: [] for name in configs}
    cores: Dict[str, List[float]] = {name: [] for name in configs}  # CPU time / wall time
    for _ in range(args.repeats):
        for name, (training, data) in configs.items():
            cpu = _cpu_seconds()
            start = time.perf_counter()
            for _ in range(args.steps):
                training(*data)
            wall = time.perf_counter() - start
            seconds[name].append(wall / args.steps)
            cores[name].append((_cpu_seconds() - cpu) / wall)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    result = {"settings": vars(args), "load_average": os.getloadavg(),
              "seconds_per_step": seconds, "median": median,
              "speedup": {name: median["1 IPU"] / m for name, m in median.items()},
              "cores_used": {name: statistics.median(c) for name, c in cores.items()}}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.layers} x Linear({args.width}, {args.width}), micro-batches of {args.rows} "
          f"rows, {args.accumulation} per step; one kernel thread per IPU; "
          f"load average {result['load_average'][0]:.1f}")
    print("| configuration | s/step (median) | speed-up vs 1 IPU | cores used | repeats |")
    print("| --- | --- | --- | --- | --- |")
    for name, m in median.items():
        print(f"| {name} | {m:.3f} | {result['speedup'][name]:.2f}x | "
              f"{result['cores_used'][name]:.2f} | "
              f"{', '.join(f'{s:.3f}' for s in seconds[name])} |")


def _cpu_seconds() -> float:
    """CPU time of this process (every thread), user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
