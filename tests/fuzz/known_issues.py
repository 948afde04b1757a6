"""Differences from the CPU the fuzzer has found and that are not fixed yet.

Each entry keeps the generator from emitting the lines that hit it (never silently: the
skips are counted in the statistics), says why, and names the regression test in
``tests/test_fuzz_regressions.py`` that reproduces it as a strict expected failure: when the
bug is fixed that test fails (XPASS), and the entry goes.

An entry matches a line before it runs (`hits`, on the CPU tensors it would meet), or after
the CPU refused it (the line is then undone), by the CPU's message (`cpu_raises`, a regular
expression). An entry of a wrapped path (`paths`, see ``wrapped.py``) matches the lines of
its ops, which that path's model leaves out.
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
    paths: Tuple[str, ...] = ("lazy",)  # "lazy", or the wrapped paths (wrapped.PATHS)


KNOWN_ISSUES: Dict[str, KnownIssue] = {
    "manual_seed_in_compiled_graphs": KnownIssue(
        reason="torch.manual_seed inside a torch.compile'd function: a graph replayed from "
               "its program and one run in lazy mode (a graph with a tensor constant on the "
               "CPU, such as torch.tensor([0], device='ipu')) draw different numbers after "
               "the same seed; each alone repeats its draws",
        test="test_draws_after_one_seed_in_a_compiled_function_are_equal",
        ops=("reseed",), paths=("torch.compile",)),
    "inference_mode_in_compiled_graphs": KnownIssue(
        reason="torch.inference_mode inside a torch.compile'd function: AOTAutograd fails "
               "('Cannot set version_counter for inference tensor'), with PyTorch's own "
               "aot_eager on the CPU too, and the failed compilation leaves inference mode "
               "on in the process (PyTorch's)",
        test="test_a_failed_compilation_of_an_inference_mode_region_leaves_the_mode_off",
        ops=("grad_mode:inference_mode",), paths=("torch.compile",)),
}


class Exclusions:
    """The known issues, as the generator consults them."""

    def __init__(self, issues: Dict[str, KnownIssue]) -> None:
        self._issues = issues

    def before(self, line: Line, ns: Dict[str, Any]) -> Optional[str]:
        for name, issue in self._issues.items():
            if issue.hits is not None and "lazy" in issue.paths and \
                    line.op.startswith(issue.ops) and issue.hits(line, ns):
                return name
        return None

    def in_path(self, line: Line, path: str) -> Optional[str]:
        """The issue of a wrapped `path` that `line` hits."""
        for name, issue in self._issues.items():
            if path in issue.paths and line.op.startswith(issue.ops):
                return name
        return None

    def raised(self, line: Line, ns: Dict[str, Any],
               error: Optional[BaseException]) -> Optional[str]:
        if error is None:
            return None
        for name, issue in self._issues.items():
            if "lazy" not in issue.paths or not line.op.startswith(issue.ops):
                continue
            if issue.cpu_raises is not None and re.search(issue.cpu_raises, str(error)):
                return name
        return None


EXCLUSIONS = Exclusions(KNOWN_ISSUES)
