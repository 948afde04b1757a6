"""Benchmarks: every model in every mode (eager, torch.compile, lazy ipu,
poptorch, torch.compile(backend="ipu")) for training and inference, each measured in a fresh subprocess;
writes benchmarks/results/latest.{json,md,png} and prints the table.

    python benchmarks/run.py                 # full run
    python benchmarks/run.py --quick         # a few minutes
    python benchmarks/run.py --quick --models mlp --steps 5   # smoke run

Speed is reported, never asserted.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODEL_NAMES = ["mlp", "cnn", "transformer", "resnet8", "bert", "gpt2"]
MODE_NAMES = ["eager", "compile", "lazy", "poptorch", "compile_ipu"]
TASK_NAMES = ["train", "infer"]
BUSY_CORES = 0.3  # other processes' load (in cores) above which a measurement is retried


def _names(allowed: List[str]):
    def parse(text: str) -> List[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {allowed}")
        return names
    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter warm-up and timed windows")
    p.add_argument("--models", type=_names(MODEL_NAMES), default=MODEL_NAMES,
                   help="comma-separated subset of " + ",".join(MODEL_NAMES))
    p.add_argument("--modes", type=_names(MODE_NAMES), default=MODE_NAMES)
    p.add_argument("--tasks", type=_names(TASK_NAMES), default=TASK_NAMES)
    p.add_argument("--steps", type=int, help="fixed steps per warm-up and per timed window "
                   "(a smoke run; figures are not steady-state)")
    p.add_argument("--repeats", type=int, help="timed windows per measurement")
    p.add_argument("--timeout", type=float, help="seconds for one measurement's subprocess "
                   "(default 900 with --quick, 1800 otherwise)")
    p.add_argument("--retries", type=int, default=2, help="measure again, up to this many "
                   f"times, when other processes kept more than {BUSY_CORES} cores busy")
    p.add_argument("--quiet-wait", type=float, default=120.0, help="seconds to wait, before "
                   "each measurement, for other processes to leave the cores idle")
    p.add_argument("--processes", type=int, default=1, help="measure each (model, mode, "
                   "task) in this many processes, in rounds over the whole plan, and keep the "
                   "median: one process's speed depends on where its memory and threads land "
                   "(the same build's MLP step varies by 1.5x between processes)")
    p.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "MODE", "TASK"),
                   help="measure one (model, mode, task) in this process")
    p.add_argument("--capture-cost", action="store_true",
                   help="measure the lazy capture cost per op in this process")
    p.add_argument("--json", action="store_true", help="with --one/--capture-cost: print "
                   "the result as one JSON line")
    return p.parse_args(argv)


def settings_of(args: argparse.Namespace):
    from dataclasses import replace
    from measure import FULL, QUICK
    settings = QUICK if args.quick else FULL
    if args.repeats:
        settings = replace(settings, repeats=args.repeats)
    if args.steps:
        settings = replace(settings, steps=args.steps)
    return settings


# --- in the subprocess ----------------------------------------------------------

def child(args: argparse.Namespace) -> None:
    import measure
    if args.one:
        model, mode, task = args.one
        result = measure.measure_one(model, mode, task, settings_of(args))
    else:
        result = measure.capture_cost(settings_of(args).repeats)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


# --- in the driver --------------------------------------------------------------

def _child_command(args: argparse.Namespace, what: List[str]) -> List[str]:
    command = [sys.executable, str(Path(__file__).resolve()), *what, "--json"]
    if args.quick:
        command.append("--quick")
    for flag in ("steps", "repeats"):
        if getattr(args, flag):
            command += [f"--{flag}", str(getattr(args, flag))]
    return command


def run_child(args: argparse.Namespace, what: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    """Runs one measurement in a fresh interpreter; a failure becomes ``error``."""
    timeout = args.timeout or (900.0 if args.quick else 1800.0)
    try:
        done = subprocess.run(_child_command(args, what), capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        return {"error": f"exit code {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def wait_for_quiet(max_wait_s: float) -> float:
    """Waits (up to ``max_wait_s``) until other processes leave the cores idle;
    returns the seconds waited."""
    from measure import OtherLoad
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait_s:
        with OtherLoad() as load:
            time.sleep(0.5)
        if load.cores <= BUSY_CORES:
            break
    return time.perf_counter() - start


def _other_load(result: Dict[str, Any]) -> float:
    """Other processes' load while the timed windows ran. (The warm-up's is only
    reported: inductor compiles in worker processes, which count as others.)"""
    return result.get("other_load_cores", 0.0)


def measure_quietly(args: argparse.Namespace, what: List[str]) -> Dict[str, Any]:
    """``run_child`` on a quiet machine, each attempt with a fresh inductor cache
    (so compile's warm-up is a cold compile), retried while other processes
    loaded the machine; keeps the attempt with the least other load."""
    attempts = []
    for _ in range(1 + max(0, args.retries)):
        waited = wait_for_quiet(args.quiet_wait)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bench-inductor-") as cache:
            result = run_child(args, what, {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
        attempts.append({**result, "wall_s": time.perf_counter() - start,
                         "waited_for_quiet_s": waited})
        if _other_load(result) <= BUSY_CORES:
            break
    best = min(attempts, key=lambda r: ("error" in r, _other_load(r)))
    return {**best, "attempts": len(attempts)}


def median_process(processes: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The measurement of the median process by steps/s (a failed one if any failed),
    with every process's steps/s in ``process_steps_per_s``."""
    failed = [r for r in processes if "error" in r]
    if failed:
        return failed[0]
    ranked = sorted(processes, key=lambda r: r["steps_per_s"])
    median = ranked[(len(ranked) - 1) // 2]
    return {**median, "process_steps_per_s": [r["steps_per_s"] for r in processes]}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info(args: argparse.Namespace) -> Dict[str, Any]:
    import torch
    return {
        "cores": os.cpu_count(), "cpu": _cpu_model(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
        "platform": platform.platform(), "commit": _git_commit(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_average_start": round(os.getloadavg()[0], 2), "quick": args.quick,
        "steps_override": args.steps,
    }


def _summary(result: Dict[str, Any]) -> str:
    if "error" in result:
        return "FAILED: " + result["error"].splitlines()[-1][:200]
    return (f"{result['steps_per_s']:.1f} steps/s, warm-up {result['warmup_s']:.2f} s, "
            f"peak RSS {result['peak_rss_mb']:.0f} MB, "
            f"other processes' load {result['other_load_cores']:.2f} cores")


def driver(args: argparse.Namespace) -> None:
    from report import add_speedups, first_compile, write_all
    start = time.perf_counter()
    machine = machine_info(args)
    plan = [(m, mode, t) for m in args.models for t in args.tasks for mode in args.modes]
    rounds = max(1, args.processes)
    # rounds over the whole plan, so a drift of the machine's speed meets every mode alike
    measured: Dict[Any, List[Dict[str, Any]]] = {key: [] for key in plan}
    for round_index in range(rounds):
        for index, (model, mode, task) in enumerate(plan, 1):
            result = {"model": model, "mode": mode, "task": task,
                      **measure_quietly(args, ["--one", model, mode, task])}
            where = f"{index}/{len(plan)}" + (f", round {round_index + 1}/{rounds}"
                                             if rounds > 1 else "")
            print(f"[{where}] {model} {mode} {task}: {_summary(result)}",
                  file=sys.stderr, flush=True)
            measured[(model, mode, task)].append(result)
    results = [median_process(measured[key]) for key in plan]
    capture = measure_quietly(args, ["--capture-cost"])
    print(f"capture cost: {capture}", file=sys.stderr, flush=True)
    add_speedups(results)
    machine["load_average_end"] = round(os.getloadavg()[0], 2)
    machine["run_s"] = time.perf_counter() - start
    table = write_all({"results": results, "machine": machine, "capture_cost": capture,
                       "first_compile_s": first_compile(results)}, args.out)
    print(table)
    print(f"wrote {args.out}/latest.json, latest.md, latest.png in {machine['run_s']:.0f} s")


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.one or args.capture_cost:
        child(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
