"""Differences from the CPU the fuzzer has found and that are not fixed yet.

Each entry keeps the generator from emitting the lines that hit it (never silently: the
skips are counted in the statistics), says why, and names the regression test in
``tests/test_fuzz_regressions.py`` that reproduces it as a strict expected failure: when the
bug is fixed that test fails (XPASS), and the entry goes.

An entry matches a line before it runs (`hits`, on the CPU tensors it would meet), or after
the CPU refused it (the line is then undone), by the CPU's message (`cpu_raises`, a regular
expression).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from .ops import Line


@dataclass(frozen=True)
class KnownIssue:
    reason: str  # what differs, and who is fixing it
    test: str  # a regression test reproducing it
    ops: Tuple[str, ...] = ("",)  # prefixes of the op variants it concerns
    cpu_raises: Optional[str] = None
    hits: Optional[Callable[[Line, Dict[str, Any]], bool]] = None


# The losses whose CPU kernel reduces into a result it made the size of the unreduced loss.
_LOSSES_REDUCED_IN_PLACE = ("loss:mse_loss", "loss:smooth_l1_loss", "loss:binary_cross_entropy")

KNOWN_ISSUES: Dict[str, KnownIssue] = {
    "reduced_loss_storage_size": KnownIssue(
        reason="mse_loss, smooth_l1_loss and binary_cross_entropy with reduction 'mean' or "
        "'sum': the CPU's 0-dim result sits in a storage of the unreduced loss's size (its "
        "kernel makes the result like the input, then reduces into it); the ipu's storage "
        "holds the one element. Values, shapes and strides agree. Capture gives a fresh "
        "result the storage its layout needs; the CPU's storage size would have to come from "
        "the call-time check",
        test="test_a_reduced_loss_has_the_cpus_storage_size",
        ops=("loss:",),
        hits=lambda line, ns: line.op in _LOSSES_REDUCED_IN_PLACE and
        "reduction='none'" not in line.code),
}


class Exclusions:
    """The known issues, as the generator consults them."""

    def __init__(self, issues: Dict[str, KnownIssue]) -> None:
        self._issues = issues

    def before(self, line: Line, ns: Dict[str, Any]) -> Optional[str]:
        for name, issue in self._issues.items():
            if issue.hits is not None and line.op.startswith(issue.ops) and \
                    issue.hits(line, ns):
                return name
        return None

    def raised(self, line: Line, ns: Dict[str, Any],
               error: Optional[BaseException]) -> Optional[str]:
        if error is None:
            return None
        for name, issue in self._issues.items():
            if not line.op.startswith(issue.ops):
                continue
            if issue.cpu_raises is not None and re.search(issue.cpu_raises, str(error)):
                return name
        return None


EXCLUSIONS = Exclusions(KNOWN_ISSUES)
