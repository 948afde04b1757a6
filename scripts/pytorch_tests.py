"""Runs PyTorch's device-generic test files on the ipu and measures their pass rates.

    python scripts/pytorch_tests.py DIR [test_view_ops.py ...]

DIR holds PyTorch's test files (every DIR/test_*.py when none is named; see
docs/pytorch_tests.md for how to get them). Each file runs in its own pytest process,
with the ipu's test base (TORCH_TEST_DEVICES) and `-k ipu` (narrowed by
--select), under a time limit (--timeout seconds); its verbose log goes to DIR/logs/FILE.log
(FILE.TAG.log with --tag TAG). Only tests of the ipu classes are counted. Then the tests
that failed on the ipu run again on the CPU: one that fails there too does not
match the installed torch (the file comes from another PyTorch version), and is
counted apart. A table of pass rates is printed, and written to DIR/logs/summary.md.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parent.parent
# A verbose line: "file.py::test[param] PASSED  [ 50%]"; a parametrised id may hold
# spaces, so the id runs to the first outcome word after it.
OUTCOME = re.compile(r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.MULTILINE)
INTERRUPT_GRACE_SECONDS = 120


def run_pytest(directory: Path, args: List[str], log: Path, timeout: int) -> bool:
    """Runs pytest in `directory`, its output to `log`; False if the time limit cut it."""
    env = dict(os.environ)
    env["TORCH_TEST_DEVICES"] = str(ROOT / "poptorch" / "testing" / "ipu_test_base.py")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    # -p no:cacheprovider: DIR may be read-only.
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--tb=short",
               *args]
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=directory, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGINT, not SIGKILL: pytest then prints the failures of the tests that ran
            # (with their tracebacks), so a partial run can still be classified.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=INTERRUPT_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return False
    return True


def outcomes(log: Path) -> Dict[str, str]:
    return {m.group(1): m.group(2) for m in OUTCOME.finditer(log.read_text(errors="replace"))}


def _is_dtype_suffix(suffix: str) -> bool:
    """True for "", "_float32", "_float32_int64"...: the dtypes PyTorch appends to a name."""
    return all(isinstance(getattr(torch, token, None), torch.dtype)
               for token in suffix.split("_")[1:])


def cpu_twin(test_id: str) -> str:
    """TestFooIPU::test_bar_ipu_float32 -> TestFooCPU::test_bar_cpu_float32.

    PyTorch names an instantiated test name + "_ipu" + dtype suffixes; only that
    device suffix changes (a test may have "_ipu" in its own name)."""
    path, cls, name = test_id.split("::")
    at = name.rfind("_ipu")
    while at >= 0 and not _is_dtype_suffix(name[at + len("_ipu"):]):
        at = name.rfind("_ipu", 0, at)
    if at >= 0:
        name = name[:at] + "_cpu" + name[at + len("_ipu"):]
    return "::".join([path, re.sub(r"IPU$", "CPU", cls), name])


def is_ipu_test(test_id: str) -> bool:
    """True for a test of an instantiated ipu class (TestFooIPU::...).

    `-k ipu` matches case-insensitively anywhere in a test's id, so it also runs
    CPU tests of ops such as `flipud`; those are not counted."""
    parts = test_id.split("::")
    return len(parts) == 3 and parts[1].endswith("IPU")


def measure(directory: Path, name: str, timeout: int, select: str,
            tag: str = "") -> Tuple[Counter, bool]:
    logs = directory / "logs"
    stem = f"{name}.{tag}" if tag else name
    log = logs / f"{stem}.log"
    keyword = f"ipu and ({select})" if select else "ipu"
    finished = run_pytest(directory, [name, "-k", keyword], log, timeout)
    results = {t: r for t, r in outcomes(log).items() if is_ipu_test(t)}
    failed = [t for t, r in results.items() if r in ("FAILED", "ERROR", "XPASS")]
    counts = Counter({"PASSED": 0, "FAILED": 0, "SKIPPED": 0, "CPU_TOO": 0})
    cpu_failures = set()
    if failed:
        cpu_log = logs / f"{stem}.cpu.log"
        run_pytest(directory, [cpu_twin(t) for t in failed], cpu_log, timeout)
        cpu_results = outcomes(cpu_log)
        # XFAIL: the test is marked an expected failure on the CPU (an OpInfo's
        # DecorateInfo), so it fails there too.
        cpu_failures = {t for t in failed if cpu_results.get(cpu_twin(t)) in
                        ("FAILED", "ERROR", "XPASS", "XFAIL")}
        (logs / f"{stem}.cpu-too.txt").write_text("".join(f"{t}\n" for t in sorted(cpu_failures)))
    for test, result in results.items():
        if test in cpu_failures:
            counts["CPU_TOO"] += 1
        elif result in ("PASSED", "XFAIL"):
            counts["PASSED"] += 1
        elif result == "SKIPPED":
            counts["SKIPPED"] += 1
        else:
            counts["FAILED"] += 1
    return counts, finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("files", nargs="*")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per file")
    parser.add_argument("--select", default="",
                        help="a pytest -k expression that narrows each file's ipu tests "
                             "(e.g. 'not _refs' for the OpInfo-heavy files)")
    parser.add_argument("--tag", default="",
                        help="names this run's logs FILE.TAG.log and its table summary.TAG.md, "
                             "so that runs of subsets of one file keep their own logs")
    args = parser.parse_args()
    directory = args.directory.resolve()
    files = args.files or sorted(p.name for p in directory.glob("test_*.py"))
    (directory / "logs").mkdir(exist_ok=True)
    rows = ["| file | passed | failed | skipped | fail on the CPU too | pass rate |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in files:
        counts, finished = measure(directory, name, args.timeout, args.select, args.tag)
        ran = counts["PASSED"] + counts["FAILED"]
        rate = f"{100.0 * counts['PASSED'] / ran:.1f}%" if ran else "-"
        label = f"{name} ({args.tag})" if args.tag else name
        label = label if finished else f"{label} (time limit: partial)"
        rows.append(f"| {label} | {counts['PASSED']} | {counts['FAILED']} | "
                    f"{counts['SKIPPED']} | {counts['CPU_TOO']} | {rate} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    summary = f"summary.{args.tag}.md" if args.tag else "summary.md"
    (directory / "logs" / summary).write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
