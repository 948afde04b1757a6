"""One fuzzed program, checked: the CPU against the ipu in lazy mode, a replay with new
values (which must hit the executable cache), and the ipu against itself under one random
seed; and through the wrapped paths (``wrapped.py``)."""
from __future__ import annotations

from collections import Counter
from typing import Callable, List, Optional

import poptorch

from .compare import Mismatch, compare
from .interpreter import Resolved, render, replay, resolve
from .known_issues import EXCLUSIONS
from .program import Program
from .wrapped import check_wrapped


class Stats:
    """What the generated programs did, per op variant (for tuning and coverage)."""

    def __init__(self) -> None:
        self.ran: Counter = Counter()  # ran on the CPU without error
        self.raised: Counter = Counter()  # the CPU raised (the ipu had to as well)
        self.skipped: Counter = Counter()  # did not apply, or a known issue
        self.wrapped: Counter = Counter()  # programs run through each wrapped path
        self.programs = 0

    def entries_ran(self) -> set:
        return {variant.split(":")[0] for variant in self.ran}

    def summary(self) -> str:
        lines = [f"{self.programs} programs"]
        for variant in sorted(set(self.ran) | set(self.raised)):
            lines.append(f"  {variant:40} ran {self.ran[variant]:5}  raised "
                         f"{self.raised[variant]:5}")
        lines += [f"  skipped {name}: {count}" for name, count in self.skipped.most_common()]
        lines += [f"  wrapped {path}: {count}" for path, count in sorted(self.wrapped.items())]
        return "\n".join(lines)


def drain() -> None:
    """Runs what is pending on the ipu, ignoring its error: what a failed program left
    behind must not be blamed on the next one, nor change its graphs."""
    try:
        poptorch.synchronize()
    except Exception:  # pylint: disable=broad-except
        pass


def check_program(program: Program, stats: Optional[Stats] = None,
                  note: Callable[[str], None] = lambda text: None, lazy: bool = True,
                  wrapped: bool = False) -> None:
    """Checks the program in lazy mode, and (`wrapped`) through the wrapped paths."""
    try:
        resolved = resolve(program, program.seed, EXCLUSIONS)
        note(render(resolved.lines, program, program.seed))
        if stats is not None:
            stats.programs += 1
            stats.skipped.update(resolved.skipped)
            for line, record in zip(resolved.lines, resolved.cpu.records):
                (stats.raised if record.error is not None else stats.ran)[line.op] += 1
        if lazy:
            _check_lazy(program, resolved)
        if wrapped:
            skipped: List[str] = []
            check_wrapped(program, resolved, (program.seed, program.seed + 1),
                          stats.wrapped if stats is not None else Counter(), skipped)
            if stats is not None:
                stats.skipped.update(skipped)
    finally:
        drain()


def _check_lazy(program: Program, resolved: Resolved) -> None:
    seed_a, seed_b = program.seed, program.seed + 1
    lines = resolved.lines
    source = render(lines, program, seed_a)
    ipu_a = replay(lines, resolved.leaves, "ipu", seed_a, program.seed)
    compare(resolved.cpu, ipu_a, lines, "cpu vs ipu", source)

    cpu_b = replay(lines, resolved.leaves, "cpu", seed_b, program.seed)
    # What the first run left pending (a tensor a refused line wrote, kept alive by the
    # error's traceback) would join the replay's first graph and change its structure.
    drain()
    compiled = poptorch.metrics()["graphs_compiled"]
    ipu_b = replay(lines, resolved.leaves, "ipu", seed_b, program.seed)
    compiled = poptorch.metrics()["graphs_compiled"] - compiled
    # New values can change what a program does: a value-dependent shape makes a literal
    # index go out of range, an error only the values show (the ipu raises it at the read).
    # From the first line the CPU's two runs disagree about, the replay is another program.
    diverged = next((i for i, (a, b) in enumerate(zip(resolved.cpu.records, cpu_b.records))
                     if (a.error is None) != (b.error is None)), None)
    compare(cpu_b, ipu_b, lines, f"replayed with new values (rnd seed {seed_b})",
            render(lines, program, seed_b), upto=diverged)
    same_structure = diverged is None and not any(line.value_dependent for line in lines)
    if same_structure and compiled:
        raise Mismatch("replayed with new values", lines, None,
                       f"{compiled} graph(s) compiled again: a replay of the same ops on "
                       "new values must run from the executable cache", source)

    if any(line.random for line in lines):
        ipu_c = replay(lines, resolved.leaves, "ipu", seed_a, program.seed)
        compare(ipu_a, ipu_c, lines, "ipu vs ipu under one torch.manual_seed", source,
                exact=True)
