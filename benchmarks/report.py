"""Speed-up ratios, and the JSON, Markdown and PNG outputs of a run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

Result = Dict[str, Any]


def add_speedups(results: List[Result]) -> None:
    """Adds ``speedup_vs_eager`` and ``speedup_vs_compile`` (steps/s over the
    baseline's steps/s, same model and task) to every result; None where
    either side has no figure."""
    rate = {(r["model"], r["task"], r["mode"]): r.get("steps_per_s") for r in results}
    for r in results:
        for baseline in ("eager", "compile"):
            mine, theirs = r.get("steps_per_s"), rate.get((r["model"], r["task"], baseline))
            r[f"speedup_vs_{baseline}"] = mine / theirs if mine and theirs else None


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(data: Dict[str, Any]) -> str:
    lines = ["| model | task | mode | steps/s | processes' steps/s (min-max) | warm-up s "
             "| peak RSS MB | vs eager | vs compile | graphs compiled after warm-up "
             "| other load (cores) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data["results"]:
        if "error" in r:
            reason = (r["error"].strip().splitlines() or ["?"])[-1][:120].replace("|", "/")
            lines.append(f"| {r['model']} | {r['task']} | {r['mode']} | FAILED: {reason} "
                         "| | | | | | | |")
            continue
        graphs = r.get("graphs_compiled_after_warmup")
        lines.append(
            f"| {r['model']} | {r['task']} | {r['mode']} | {_fmt(r['steps_per_s'], 1)} "
            f"| {_spread(r.get('process_steps_per_s'))} | {_fmt(r['warmup_s'])} | {_fmt(r['peak_rss_mb'], 0)} "
            f"| {_fmt(r['speedup_vs_eager'])} | {_fmt(r['speedup_vs_compile'])} "
            f"| {'—' if graphs is None else graphs} | {_fmt(r['other_load_cores'])} |")
    lines += ["", capture_line(data.get("capture_cost", {})),
              first_compile_line(data.get("first_compile_s")), machine_line(data["machine"])]
    return "\n".join(lines) + "\n"


def _spread(rates: Optional[List[float]]) -> str:
    """The range of the processes' steps/s (``--processes``), or — for one process."""
    if not rates or len(rates) < 2:
        return "—"
    return f"{min(rates):.1f}-{max(rates):.1f}"


def capture_line(cost: Dict[str, Any]) -> str:
    if "lazy_capture_us_per_op" not in cost:
        return f"Capture cost per op: FAILED: {cost.get('error', 'not measured')}"
    wall = ""
    if "lazy_capture_wall_us_per_op" in cost:
        wall = (f" Wall clock: {cost['lazy_capture_wall_us_per_op']:.2f} and "
                f"{cost['eager_wall_us_per_op']:.2f} µs, other load "
                f"{cost['other_load_cores']:.2f} cores.")
    return (f"Capture cost per op (lazy, chain of {cost['ops']} elementwise ops on a 16-element "
            f"tensor, not synced; the thread's CPU time): {cost['lazy_capture_us_per_op']:.2f} µs; "
            f"eager on the CPU: {cost['eager_us_per_op']:.2f} µs per op "
            f"({cost['lazy_over_eager']:.2f}x).{wall}")


FIRST_COMPILE = ("cnn", "poptorch", "train")


def first_compile(results: List[Result]) -> Optional[float]:
    """The seed CNN's first trainingModel call (its compilation and 16 steps), in s."""
    for r in results:
        if (r["model"], r["mode"], r["task"]) == FIRST_COMPILE and "error" not in r:
            return r["first_step_s"]
    return None


def first_compile_line(seconds: Optional[float]) -> str:
    if seconds is None:
        return "First compile of the seed CNN's training step: not measured."
    return (f"First compile of the seed CNN's training step (poptorch, first call incl. "
            f"its 16 steps): {seconds:.2f} s.")


def machine_line(machine: Dict[str, Any]) -> str:
    return (f"Machine: {machine['cores']} cores, torch {machine['torch']}, "
            f"{machine['torch_threads']} threads, load average {machine['load_average_start']} "
            f"at start, {machine['date']}, run took {machine.get('run_s', 0):.0f} s"
            f"{' (--quick)' if machine.get('quick') else ''}.")


def bar_chart(results: List[Result], path: Path) -> None:
    """Speed-up vs eager, one panel per task, a group of bars per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in results))
    modes = list(dict.fromkeys(r["mode"] for r in results))
    tasks = list(dict.fromkeys(r["task"] for r in results))
    speedup = {(r["model"], r["mode"], r["task"]): r.get("speedup_vs_eager") for r in results}
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, task in zip(axes[0], tasks):
        for i, mode in enumerate(modes):
            xs = [m + (i - (len(modes) - 1) / 2) * width for m in range(len(models))]
            values = [speedup.get((model, mode, task)) for model in models]
            bars = ax.bar(xs, [v or 0.0 for v in values], width, label=mode)
            for bar, v in zip(bars, values):
                ax.annotate("fail" if v is None else f"{v:.2f}", (bar.get_x() + width / 2,
                            bar.get_height()), ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(models)), models)
        ax.set_title(f"{task}: speed-up vs eager (steps/s ratio)")
        ax.set_ylabel("× eager")
        ax.legend(fontsize=8)
    fig.suptitle("steady-state steps/s over eager's, same model and task (missing bar: failed)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(data: Dict[str, Any], out_dir: Path) -> str:
    """Writes latest.json, latest.md and latest.png; returns the Markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(data, indent=2) + "\n")
    table = markdown(data)
    (out_dir / "latest.md").write_text("# Benchmark results\n\n" + table)
    bar_chart(data["results"], out_dir / "latest.png")
    return table
