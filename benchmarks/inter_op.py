"""Independent nodes on two cores (inter-op parallelism) against program order:
``poptorch.trainingModel``/``inferenceModel`` of each model built three times in
one process, with ``POPTORCH_INTER_OP=0`` (every node in program order, its
kernel on every core), ``1`` (two threads where the estimate of the kernels'
times says it pays) and ``2`` (every segment of independent nodes on two
threads), plus eager PyTorch; the calls alternate within each repeat, so the
machine's drift and load fall on all of them alike. Prints the median time per
step of each, and the load average.

    python benchmarks/inter_op.py --models mlp,cnn --tasks train --repeats 21
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import build_model, make_data  # noqa: E402
from modes import DEVICE_ITERATIONS, eager, poptorch_mode  # noqa: E402


def _poptorch_runner(name: str, train: bool, inter_op: str) -> Callable[[], None]:
    # The setting is read when a program is made: at the first call.
    os.environ["POPTORCH_INTER_OP"] = inter_op
    torch.manual_seed(0)
    runner = poptorch_mode(build_model(name), make_data(name, DEVICE_ITERATIONS), train)
    runner.step()
    return runner.step


def _eager_runner(name: str, train: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    runner = eager(build_model(name), make_data(name, DEVICE_ITERATIONS), train)

    def sixteen() -> None:
        for _ in range(DEVICE_ITERATIONS):
            runner.step()
    sixteen()
    return sixteen


def measure(name: str, train: bool, repeats: int) -> Dict[str, float]:
    runners = {"program order": _poptorch_runner(name, train, "0"),
               "estimate": _poptorch_runner(name, train, "1"),
               "every segment": _poptorch_runner(name, train, "2"),
               "eager": _eager_runner(name, train)}
    times: Dict[str, List[float]] = {k: [] for k in runners}
    cpu: Dict[str, List[float]] = {k: [] for k in runners}
    for _ in range(repeats):
        for key, step in runners.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            times[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    result = {}
    for key in runners:
        result[key] = statistics.median(times[key]) / DEVICE_ITERATIONS * 1e6
        result[key + " cores"] = sum(cpu[key]) / sum(times[key])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,cnn,transformer,resnet8")
    p.add_argument("--tasks", default="train,infer")
    p.add_argument("--repeats", type=int, default=21)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print("| model | task | program order us/step | estimate | every segment | eager "
          "| estimate vs program order | every segment vs program order | estimate vs eager "
          "| cores used (order / estimate / every) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in args.models.split(","):
        for task in args.tasks.split(","):
            r = measure(name, task == "train", args.repeats)
            order, chosen, every, ref = (r["program order"], r["estimate"], r["every segment"],
                                         r["eager"])
            print(f"| {name} | {task} | {order:.0f} | {chosen:.0f} | {every:.0f} | {ref:.0f} | "
                  f"{order / chosen:.2f}x | {order / every:.2f}x | {ref / chosen:.2f}x | "
                  f"{r['program order cores']:.2f} / {r['estimate cores']:.2f} / "
                  f"{r['every segment cores']:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
