"""What a fuzzed program is, and the hypothesis strategies that generate it.

A program is pure data, independent of shapes: a few inputs and a list of steps. A step is
two draws: an op, and an integer that seeds the stream of choices the op makes for the
tensors it meets (which live tensors it takes, counted back from the newest, and its
arguments, see ``ops.Chooser``). Choices 0 means "every first choice": the newest tensor,
the first dim, the smallest size. Hypothesis shrinks a failure by deleting steps and moving
the integers to 0, and two draws a step keep that fast: a failure shrinks to a few ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
from hypothesis import strategies as st

# Sizes a dim can take; the first is what shrinking goes to, 0 (an empty tensor) is rare.
_SIZES = (1, 2, 3, 4, 2, 3, 5, 1, 4, 3, 2, 6, 3, 4, 2, 0)
# float32 first (what shrinking goes to) and most often; float64 is not an input dtype: the
# ipu refuses it (ops.py checks the refusal).
INPUT_DTYPES = (torch.float32, torch.float32, torch.int64, torch.float16, torch.bfloat16,
                torch.int32, torch.bool, torch.float32, torch.int8, torch.uint8)


@dataclass(frozen=True)
class InputSpec:
    shape: Tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool  # only honoured for floating dtypes
    special: bool  # sprinkle nan, inf and signed zeros among the values


@dataclass(frozen=True)
class Step:
    op: str
    choices: int  # seeds the op's choices; 0: every first choice


@dataclass(frozen=True)
class Program:
    inputs: Tuple[InputSpec, ...]
    steps: Tuple[Step, ...]
    seed: int  # torch.manual_seed at the start of every run (random ops)


def input_specs() -> st.SearchStrategy[InputSpec]:
    shapes = st.lists(st.sampled_from(_SIZES), min_size=0, max_size=4).map(tuple)
    return st.builds(InputSpec, shape=shapes, dtype=st.sampled_from(INPUT_DTYPES),
                     requires_grad=st.booleans(), special=st.booleans())


def steps(op_names: Tuple[str, ...]) -> st.SearchStrategy[Step]:
    return st.builds(Step, op=st.sampled_from(op_names), choices=st.integers(0, 2**31 - 1))


def programs(op_names: Tuple[str, ...], chunks: int = 4) -> st.SearchStrategy[Program]:
    """Programs of up to `chunks` runs of up to 10 steps (about 15 steps on average: a flat
    list would average 6, hypothesis keeps lists short). Shrinking deletes steps and runs."""
    runs = st.lists(st.lists(steps(op_names), max_size=10), min_size=1, max_size=chunks)
    return st.builds(
        Program,
        inputs=st.lists(input_specs(), min_size=1, max_size=3).map(tuple),
        steps=runs.map(lambda rs: tuple(step for run in rs for step in run)),
        seed=st.integers(0, 2**16),
    )
