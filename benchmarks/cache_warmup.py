"""Time to the first step with the executable cache on disk cold or warm, and
from a file written by compileAndExport.

Each measurement is a fresh process (imports excluded from the timing) that
builds a benchmark model and times its first step, up to the loss or output
read on the host:

* ``none``: no cache (``POPTORCH_CACHE_DIR`` unset);
* ``cold``: an empty cache directory (everything is compiled and written);
* ``warm``: the directory the ``cold`` run filled (nothing is compiled);
* ``load`` (poptorch mode only): ``poptorch.load`` of a file the model was
  exported to, then its first call (nothing is compiled).

Then what one graph costs, in a lazy process running 40 graph structures:
compiling it (``compile_seconds`` over the graphs), reading and decoding its
entry (``_C.ExecutableSet.add`` of each file a cold process wrote), and its
first step (the median graph's) without a cache, with a cold one and a warm one.

    python benchmarks/cache_warmup.py                  # cnn and transformer
    python benchmarks/cache_warmup.py --repeats 5 --models cnn
    python benchmarks/cache_warmup.py --models ""      # per graph only

Speed is reported, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# One measurement: argv = model, mode (lazy | poptorch), state, file to load or
# export ("" for none). Prints the first step's seconds and the metrics as JSON.
CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[5])
    import torch, poptorch
    from models import ModelWithLoss, build_model, make_data
    from modes import DEVICE_ITERATIONS, LR, MOMENTUM, lazy

    name, mode, state, path = sys.argv[1:5]
    data = make_data(name, DEVICE_ITERATIONS)
    poptorch.reset_metrics()
    start = time.perf_counter()
    if mode == "lazy":
        lazy(build_model(name), data, True).step()
    elif state == "load":
        training = poptorch.load(path)
        training(*data)[1].cpu()
    else:
        model = ModelWithLoss(build_model(name))
        options = poptorch.Options().deviceIterations(DEVICE_ITERATIONS)
        options.showCompilationProgressBar(False)
        training = poptorch.trainingModel(
            model, options, poptorch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM))
        training(*data)[1].cpu()
    seconds = time.perf_counter() - start
    if path and state != "load":
        training.save(path)
    print(json.dumps({"seconds": seconds, **poptorch.metrics()}))
""")


# 40 graph structures in lazy mode: a 3-layer step at 40 batch sizes.
MANY_GRAPHS = textwrap.dedent("""
    import json, time
    import torch, poptorch
    torch.manual_seed(0)
    w = [torch.randn(64, 64).to("ipu") for _ in range(3)]
    xs = [torch.randn(b, 64) for b in range(1, 41)]
    poptorch.synchronize()
    poptorch.reset_metrics()
    seconds = []
    for x in xs:
        start = time.perf_counter()
        h = x.to("ipu")
        for m in w:
            h = torch.nn.functional.gelu(h @ m).softmax(-1)
        h.sum().cpu()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, **poptorch.metrics()}))
""")

DECODE = textwrap.dedent("""
    import glob, json, sys, time
    from poptorch import _C
    files = sorted(glob.glob(sys.argv[1] + "/*.poptorch_exe"))
    start = time.perf_counter()
    executables = _C.ExecutableSet()
    for name in files:
        with open(name, "rb") as f:
            executables.add(f.read())
    print(json.dumps({"seconds": time.perf_counter() - start, "entries": len(files)}))
""")


def _child(code: str, cache: str, *argv: str) -> Dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POPTORCH_CACHE_DIR": cache}
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                            env=env, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.splitlines()[-1])


def per_graph(repeats: int) -> str:
    """Milliseconds per graph: compiling, writing and reading an entry."""
    compile_ms, read_ms, none_ms, cold_ms, warm_ms = [], [], [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            none = _child(MANY_GRAPHS, "")
            cold = _child(MANY_GRAPHS, cache)
            warm = _child(MANY_GRAPHS, cache)
            decode = _child(DECODE, "", cache)
        graphs = cold["graphs_compiled"]
        assert warm["graphs_compiled"] == 0 and decode["entries"] == graphs
        compile_ms.append(1e3 * cold["compile_seconds"] / graphs)
        read_ms.append(1e3 * decode["seconds"] / graphs)
        # The median graph's first step (capture, compile or load, run), robust
        # to the bursts of other processes' load.
        none_ms.append(1e3 * statistics.median(none["seconds"]))
        cold_ms.append(1e3 * statistics.median(cold["seconds"]))
        warm_ms.append(1e3 * statistics.median(warm["seconds"]))

    def fmt(values: List[float]) -> str:
        return (f"{statistics.median(values):.3f} "
                f"({', '.join(f'{v:.3f}' for v in values)})")

    return "\n".join([
        "ms per graph, median (each run), 40 graph structures in lazy mode:",
        f"* compile: {fmt(compile_ms)}",
        f"* read and decode an entry: {fmt(read_ms)}",
        "* a graph's first step (capture, compile or read, run), the median graph's: "
        f"no cache {fmt(none_ms)}; cold cache (compile and write) {fmt(cold_ms)}; "
        f"warm cache (read) {fmt(warm_ms)}",
    ])


def measure(model: str, mode: str, state: str, cache: str, path: str) -> Dict[str, Any]:
    return _child(CHILD, cache, model, mode, state, path, str(HERE))


def run(models: List[str], repeats: int) -> List[Dict[str, Any]]:
    rows = []
    for model in models:
        for mode in ("poptorch", "lazy"):
            samples: Dict[str, List[Dict[str, Any]]] = {}
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    cache = os.path.join(tmp, "cache")
                    exported = os.path.join(tmp, "model.poptorch") if mode == "poptorch" else ""
                    plan = [("none", "", ""), ("cold", cache, exported), ("warm", cache, "")]
                    if exported:
                        plan.append(("load", "", exported))
                    for state, directory, path in plan:
                        samples.setdefault(state, []).append(
                            measure(model, mode, state, directory, path))
            for state, runs in samples.items():
                rows.append({
                    "model": model, "mode": mode, "state": state,
                    "first_step_s": statistics.median(r["seconds"] for r in runs),
                    "all_s": [round(r["seconds"], 3) for r in runs],
                    "graphs_compiled": runs[0]["graphs_compiled"],
                    "executables_loaded": runs[0]["executables_loaded"],
                    "compile_s": statistics.median(r["compile_seconds"] for r in runs),
                })
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| model | mode | cache | first step s (median) | runs s | graphs compiled | "
             "executables loaded | compile s |",
             "| --- | --- | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['mode']} | {r['state']} | {r['first_step_s']:.3f} | "
                     f"{', '.join(map(str, r['all_s']))} | {r['graphs_compiled']} | "
                     f"{r['executables_loaded']} | {r['compile_s']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="cnn,transformer", help="comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    rows = run([m for m in args.models.split(",") if m], args.repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if rows:
        print(table(rows))
    print(per_graph(args.repeats))
    print(f"\nload average (1 min) {load_before:.2f} at start, {os.getloadavg()[0]:.2f} at end; "
          f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
