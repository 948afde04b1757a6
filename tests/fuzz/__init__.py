"""A differential fuzzer: random programs of tensor ops, run on the CPU and the ipu.

See docs/testing.md ("The differential fuzzer"). ``python -m tests.fuzz --minutes 30`` is
the long run.
"""
from .check import Stats, check_program
from .compare import Mismatch
from .known_issues import KNOWN_ISSUES
from .ops import OP_NAMES
from .program import Program, programs

__all__ = ["KNOWN_ISSUES", "Mismatch", "OP_NAMES", "Program", "Stats", "check_program",
           "programs"]
