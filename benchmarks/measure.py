"""Timing one measurement in this process: a warm-up phase (compile and first
steps), then repeated timed windows whose median is the steady-state rate;
and the lazy mode's capture cost per op."""
from __future__ import annotations

import math
import os
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch

from models import build_model, make_data
from modes import DEVICE_ITERATIONS, IPU_MODES, MODES, Runner


@dataclass(frozen=True)
class Settings:
    warmup_steps: int      # at least this many steps in the warm-up phase...
    warmup_min_s: float    # ...lasting at least this long after the first call...
    warmup_max_s: float    # ...unless the steps after the first call take longer than this
    window_s: float        # each timed window lasts about this long...
    repeats: int           # ...and there are this many
    steps: Optional[int] = None  # fixed steps per window (and warm-up), for smoke runs


FULL = Settings(warmup_steps=300, warmup_min_s=3.0, warmup_max_s=30.0, window_s=1.5, repeats=7)
QUICK = Settings(warmup_steps=100, warmup_min_s=0.75, warmup_max_s=6.0, window_s=0.25, repeats=5)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def graphs_compiled(mode: str) -> Optional[int]:
    if mode not in IPU_MODES:
        return None
    import poptorch
    return int(poptorch.metrics()["graphs_compiled"])


def _cpu_busy_s() -> float:
    """CPU seconds all processes on the machine have used (from /proc/stat)."""
    try:
        fields = [float(v) for v in open("/proc/stat").readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """How many cores other processes kept busy, on average, while it was open:
    a measurement taken while something else ran is not a clean one."""

    def __enter__(self) -> "OtherLoad":
        self._start = (time.perf_counter(), _cpu_busy_s(), time.process_time())
        return self

    def __exit__(self, *exc: Any) -> None:
        wall, busy, own = (b - a for a, b in zip(self._start, (
            time.perf_counter(), _cpu_busy_s(), time.process_time())))
        self.cores = max(0.0, busy - own) / wall if wall > 0 else 0.0


def _calls(runner: Runner, count: int) -> float:
    """Seconds ``count`` calls take."""
    start = time.perf_counter()
    for _ in range(count):
        runner.step()
    return time.perf_counter() - start


def _warm_up(runner: Runner, settings: Settings) -> Dict[str, Any]:
    """The warm-up phase (the first call, with any compilation, then steps until
    ``warmup_steps`` and ``warmup_min_s``, or ``warmup_max_s``), then a short
    calibration that gives the steady time of one call. All of it is ``warmup_s``."""
    start = time.perf_counter()
    first = _calls(runner, 1)
    min_calls = max(3, math.ceil(settings.warmup_steps / runner.steps_per_call))
    calls, since_first = 0, 0.0
    while calls < 3 or since_first < settings.warmup_min_s or (
            calls < min_calls and since_first < settings.warmup_max_s):
        since_first += _calls(runner, 1)
        calls += 1
    calibration_calls, calibration_s = 0, 0.0
    while calibration_calls < 2 or calibration_s < settings.window_s / 2:
        calibration_s += _calls(runner, 1)
        calibration_calls += 1
    return {"first_step_s": first, "warmup_s": time.perf_counter() - start,
            "warmup_steps": (1 + calls + calibration_calls) * runner.steps_per_call,
            "call_s": calibration_s / calibration_calls}


def _timed_windows(runner: Runner, calls: int, repeats: int) -> List[float]:
    """Steps per second of each of ``repeats`` windows of ``calls`` calls."""
    return [calls * runner.steps_per_call / _calls(runner, calls) for _ in range(repeats)]


def measure_one(model_name: str, mode: str, task: str, settings: Settings) -> Dict[str, Any]:
    """Builds, warms up and times one (model, mode, task) in this process."""
    data = make_data(model_name, DEVICE_ITERATIONS)
    runner = MODES[mode](build_model(model_name), data, task == "train")
    if settings.steps is not None:
        settings = Settings(settings.steps, 0.0, 0.0, 0.0, settings.repeats, settings.steps)
    with OtherLoad() as warmup_load:
        warm = _warm_up(runner, settings)
    if settings.steps is not None:
        calls = math.ceil(settings.steps / runner.steps_per_call)
    else:
        calls = max(1, round(settings.window_s / warm["call_s"]))
    del warm["call_s"]
    compiled_before = graphs_compiled(mode)
    with OtherLoad() as other:
        rates = _timed_windows(runner, calls, settings.repeats)
    compiled_after = graphs_compiled(mode)
    result: Dict[str, Any] = {
        "model": model_name, "mode": mode, "task": task,
        "steps_per_s": statistics.median(rates), **warm,
        "peak_rss_mb": peak_rss_mb(),
        "window_steps": calls * runner.steps_per_call,
        "window_steps_per_s": rates,
        "other_load_cores": other.cores,
        "other_load_warmup_cores": warmup_load.cores,
    }
    if compiled_before is not None and compiled_after is not None:
        result["graphs_compiled_after_warmup"] = compiled_after - compiled_before
    return result


# --- capture cost -------------------------------------------------------------

CHAIN_LENGTH = 500  # x * a + b, twice an iteration: 1,000 ops
MIN_CHAINS = 30  # a chain takes a few ms: enough of them for a steady median


def _chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN_LENGTH):
        x = x * 1.0001 + 0.5
    return x


@dataclass
class ChainTimes:
    wall_s: List[float]
    thread_s: List[float]  # the calling thread's CPU time


def _time_chain(x: torch.Tensor, sync: Callable[[], None], repeats: int) -> ChainTimes:
    """Seconds to issue the chain, ``repeats`` times, by wall clock and by this
    thread's CPU time; ``sync`` runs after each, outside the timed region."""
    times = ChainTimes([], [])
    for _ in range(repeats):
        wall, thread = time.perf_counter(), time.thread_time()
        _chain(x)
        times.thread_s.append(time.thread_time() - thread)
        times.wall_s.append(time.perf_counter() - wall)
        sync()
    return times


def capture_cost(repeats: int) -> Dict[str, Any]:
    """Microseconds per op to capture 1,000 small elementwise ops on the ipu
    (without running them), next to eager's time per op for the same chain.

    The figures are the calling thread's CPU time: capture runs on that thread
    alone (no other thread of the process runs while it captures), and its CPU
    time leaves out the time other processes (or the hypervisor) take the core
    away, which the wall clock counts (``*_wall_us_per_op``, next to the other
    load while the chains ran)."""
    import poptorch
    ops = 2 * CHAIN_LENGTH
    repeats = max(repeats, MIN_CHAINS)
    lazy_x, eager_x = torch.ones(16, device="ipu"), torch.ones(16)
    poptorch.synchronize()  # so the chains below capture no factory op
    _time_chain(lazy_x, poptorch.synchronize, 1)  # warm-up: the graph is compiled here
    _time_chain(eager_x, lambda: None, 1)
    before = poptorch.metrics()
    with OtherLoad() as other:
        lazy = _time_chain(lazy_x, poptorch.synchronize, repeats)
        after = poptorch.metrics()
        eager = _time_chain(eager_x, lambda: None, repeats)

    def us_per_op(seconds: List[float]) -> float:
        return statistics.median(seconds) / ops * 1e6

    lazy_us, eager_us = us_per_op(lazy.thread_s), us_per_op(eager.thread_s)
    return {
        "ops": ops, "repeats": repeats,
        "lazy_capture_us_per_op": lazy_us,
        "eager_us_per_op": eager_us,
        "lazy_over_eager": lazy_us / eager_us,
        "lazy_capture_wall_us_per_op": us_per_op(lazy.wall_s),
        "eager_wall_us_per_op": us_per_op(eager.wall_s),
        "other_load_cores": other.cores,
        "ops_captured_per_chain": (after["ops_captured"] - before["ops_captured"]) / repeats,
        "graphs_compiled_while_timing": after["graphs_compiled"] - before["graphs_compiled"],
        "lazy_run_s_per_chain": (after["execute_seconds"] - before["execute_seconds"]) / repeats,
    }
