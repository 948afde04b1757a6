"""Runs upstream PopTorch's tests and user guide examples against this poptorch.

    python scripts/upstream_tests.py DIR [options_test.py api.py ...] [--poptorch ROOT]

DIR holds copies of Graphcore's files (see docs/upstream_tests.md): DIR/tests/*_test.py
with their conftest.py and helpers.py, DIR/docs/user_guide/*.py, DIR/examples/*.py,
and our shim DIR/conftest.py. Each test file runs in its own pytest process in
DIR/tests (a time limit per file, --timeout), each example as a script in
DIR/run_ug (which holds tmp/poptorch.conf, where the user guide's examples look
for it), with ROOT (this worktree by default) first on PYTHONPATH. Logs go to DIR/logs/ (--logs); a
table of counts is printed and written to summary.md there, and each failed
test with its error to FILE.failures.txt, to classify.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytorch_tests import outcomes  # noqa: E402  (the same verbose-log parsing)

ROOT = Path(__file__).resolve().parent.parent
# pytest's short summary: "FAILED file.py::test[param] - error". A parametrised
# id may hold spaces ("[expected_str:Unknown .* option .*]"): the id is the name
# and its brackets, up to the " - " or the line's end that follows them.
SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+::[^\s\[]+(?:\[.*?\])?)(?: - (.*))?$",
                     re.MULTILINE)
# pytest's closing line: "=== 8 failed, 36 passed, 26 skipped, 5 warnings in 136.53s ==="
CLOSING = re.compile(r"^=+ (.*) in [\d.]+s", re.MULTILINE)
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
KIND = {"passed": "PASSED", "xfailed": "PASSED", "failed": "FAILED", "error": "FAILED",
        "errors": "FAILED", "xpassed": "FAILED", "skipped": "SKIPPED"}


def _env(poptorch_root: Path, directory: Path) -> Dict[str, str]:
    env = dict(os.environ)
    # DIR/pydeps: scratch installs of packages some tests import (torchvision)
    # that the machine cannot give in working order; see docs/upstream_tests.md.
    pydeps = directory / "pydeps"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [
        str(poptorch_root), str(pydeps) if pydeps.is_dir() else None, env.get("PYTHONPATH")]))
    env["COLUMNS"] = "1000"  # pytest's short summary keeps the whole error line
    return env


def failures(log_text: str) -> List[Tuple[str, str]]:
    """(test id, error line) of each failure in pytest's short summary."""
    return [(m.group(1), m.group(2) or "") for m in SUMMARY.finditer(log_text)]


def run_test_file(directory: Path, logs: Path, name: str, poptorch_root: Path,
                  timeout: int, extended: bool = False) -> Tuple[Counter, bool]:
    log = logs / f"{name}.log"
    command = [sys.executable, "-m", "pytest", "-v", "-rfE", "--tb=line", "-p",
               "no:cacheprovider", name] + (["--extended-tests"] if extended else [])
    finished = True
    with log.open("w") as out:
        try:
            subprocess.run(command, cwd=directory / "tests", env=_env(poptorch_root, directory),
                           stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            finished = False
    text = log.read_text(errors="replace")
    counts = Counter({"PASSED": 0, "FAILED": 0, "SKIPPED": 0})
    closing = CLOSING.findall(text)
    if closing:  # tests' own output may split the verbose lines: trust the totals
        for number, kind in COUNT.findall(closing[-1]):
            counts[KIND[kind]] += int(number)
    else:  # cut by the time limit: what the verbose lines say
        for result in outcomes(log).values():
            counts["PASSED" if result in ("PASSED", "XFAIL") else
                   "SKIPPED" if result == "SKIPPED" else "FAILED"] += 1
    (logs / f"{name}.failures.txt").write_text(
        "".join(f"{test}\t{error}\n" for test, error in failures(text)))
    return counts, finished


def run_example(directory: Path, logs: Path, script: Path, poptorch_root: Path,
                timeout: int) -> bool:
    work = directory / "run_ug"
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    conf = directory / "docs" / "user_guide" / "poptorch.conf"
    if conf.exists():
        shutil.copy(conf, work / "tmp" / "poptorch.conf")
    log = logs / f"{script.parent.name}_{script.name}.log"  # user_guide_ or examples_
    with log.open("w") as out:
        try:
            done = subprocess.run([sys.executable, str(script)],
                                  cwd=work, env=_env(poptorch_root, directory), stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("files", nargs="*", help="test files or examples")
    parser.add_argument("--poptorch", type=Path, default=ROOT,
                        help="the poptorch tree to test (put first on PYTHONPATH)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file")
    parser.add_argument("--logs", default="logs", help="the log directory, in DIR")
    parser.add_argument("--extended", action="store_true",
                        help="also upstream's extendedTestingOnly tests (--extended-tests)")
    args = parser.parse_intermixed_args()
    directory = args.directory.resolve()
    tests = sorted(p.name for p in (directory / "tests").glob("*_test.py"))
    examples = sorted((directory / "docs" / "user_guide").glob("*.py")) + sorted(
        (directory / "examples").glob("*.py"))
    if args.files:
        tests = [f for f in tests if f in args.files]
        examples = [e for e in examples if e.name in args.files]
    logs = directory / args.logs
    logs.mkdir(exist_ok=True)
    rows: List[str] = ["| file | passed | failed | skipped |", "| --- | ---: | ---: | ---: |"]
    for name in tests:
        counts, finished = run_test_file(directory, logs, name, args.poptorch.resolve(),
                                         args.timeout, args.extended)
        label = name if finished else f"{name} (time limit: partial)"
        rows.append(f"| {label} | {counts['PASSED']} | {counts['FAILED']} | "
                    f"{counts['SKIPPED']} |")
        print(rows[-1], flush=True)
    for script in examples:
        ok = run_example(directory, logs, script, args.poptorch.resolve(), args.timeout)
        rows.append(f"| {script.parent.name}/{script.name} | {int(ok)} | {int(not ok)} | 0 |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    (logs / "summary.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
