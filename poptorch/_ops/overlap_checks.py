"""PopTorch's rules for ``set_overlap_for_input`` / ``set_overlap_for_output``
in a wrapped model: the first marks tensors the model takes as inputs, the
second tensors it returns (PopTorch's compiler refuses the others). The step
capture opens a ``Checks`` for the model's inputs, the ops mark what they are
given, and the capture checks the marked outputs against what forward
returned."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional

import torch
import torch.utils._pytree as pytree

from .._errors import Error

_local = threading.local()


class Checks:
    """The overlap marks of one captured forward."""

    def __init__(self, inputs: Any) -> None:
        self._inputs = {id(t) for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)}
        self._outputs: List[torch.Tensor] = []

    def mark_input(self, tensor: torch.Tensor) -> None:
        if id(tensor) not in self._inputs:
            raise Error("poptorch.set_overlap_for_input applied on a node which is not a tensor "
                        "input to the model. Apply it to an argument of forward as given, "
                        "before any other op: x = poptorch.set_overlap_for_input(x, mode)")

    def mark_output(self, tensor: torch.Tensor) -> None:
        self._outputs.append(tensor)

    def check_outputs(self, outputs: Any) -> None:
        """Every tensor marked for output overlap must be one forward returns."""
        returned = {id(t) for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)}
        if any(id(t) not in returned for t in self._outputs):
            raise Error("poptorch.set_overlap_for_output applied on a node which is not a tensor "
                        "output to the model. Apply it to tensors forward returns, as the last "
                        "op before returning them")


def current() -> Optional[Checks]:
    """The checks of the forward being captured on this thread, if any."""
    return getattr(_local, "checks", None)


@contextlib.contextmanager
def checking(inputs: Any) -> Iterator[Checks]:
    """Checks the overlap marks of a forward that takes ``inputs``."""
    previous, _local.checks = current(), Checks(inputs)
    try:
        yield _local.checks
    finally:
        _local.checks = previous
