"""The long run: ``python -m tests.fuzz --minutes 30`` (from the repository root).

Runs batches of random programs, each batch under its own hypothesis seed, until the time
is up; with ``--wrapped`` each program also runs through poptorch.inferenceModel,
trainingModel and torch.compile(backend="ipu") (``wrapped.py``). Every mismatch is shrunk to a small program, printed, and written to the report
directory (one file per kind of mismatch); the run goes on with the next seed. The program
being checked is always in ``<reports>/current-program.txt``, for a crash.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Dict

from hypothesis import HealthCheck, given, note, seed, settings

from .check import Stats, check_program
from .compare import Mismatch
from .ops import OP_NAMES
from .program import Program, programs


def _batch(batch_seed: int, examples: int, chunks: int, stats: Stats, current: Path,
           wrapped: bool) -> None:
    @seed(batch_seed)
    @settings(database=None, deadline=None, max_examples=examples, derandomize=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    @given(programs(OP_NAMES, chunks))
    def fuzz(program: Program) -> None:
        current.write_text(repr(program))
        check_program(program, stats, note, wrapped=wrapped)
    fuzz()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=None, help="first batch seed (random)")
    parser.add_argument("--examples", type=int, default=300, help="programs per batch")
    parser.add_argument("--chunks", type=int, default=4, help="runs of up to 10 steps")
    parser.add_argument("--reports", type=Path, default=Path("fuzz-reports"))
    parser.add_argument("--wrapped", action="store_true",
                        help="each program through the wrapped paths too (slower)")
    args = parser.parse_args()
    args.reports.mkdir(parents=True, exist_ok=True)
    current = args.reports / "current-program.txt"
    batch_seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    deadline = time.monotonic() + 60 * args.minutes
    stats = Stats()
    found: Dict[str, int] = {}
    while time.monotonic() < deadline:
        print(f"batch seed {batch_seed}", flush=True)
        try:
            _batch(batch_seed, args.examples, args.chunks, stats, current, args.wrapped)
        except Mismatch as e:
            kind = f"{e.label}-{e.op}".replace(":", "_").replace(" ", "_")
            found[kind] = found.get(kind, 0) + 1
            report = args.reports / f"{kind}.txt"
            report.write_text(f"batch seed {batch_seed}\n{e}\n")
            print(f"MISMATCH ({report}):\n{e}\n", flush=True)
        except Exception as e:  # pylint: disable=broad-except
            # A failure of the fuzzer itself, or an ipu error it did not expect.
            # After shrinking, `current` holds the smallest program that raised.
            kind = f"error-{type(e).__name__}"
            found[kind] = found.get(kind, 0) + 1
            report = (f"batch seed {batch_seed}\n{traceback.format_exc()}\n"
                      f"the program:\n{current.read_text() if current.exists() else '?'}\n")
            (args.reports / f"{kind}.txt").write_text(report)
            print(f"ERROR: {e!r}\n{report}", flush=True)
        batch_seed += 1
    current.unlink(missing_ok=True)
    print(stats.summary())
    print(f"mismatches: {found or 'none'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
