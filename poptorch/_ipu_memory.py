"""Memory per IPU of a wrapped model, modelled at compile time.

Each IPU has its own memory (``POPTORCH_IPU_MEMORY_MB``). A model's weights,
their optimiser state and gradient accumulators live on the IPU of the block
that first uses the weight; the activations of a step are temporaries whose
peak the compiler plans per IPU (``compiler/memory_plan.cpp``, by the IPU of
the block that makes them). Weights are allocated before the model's split is
known, so the capacity check is deferred until they are placed, and each IPU
is then checked whole: a model that does not fit fails at compile time with
every IPU's need against its capacity.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterable, Iterator, List, Optional

import torch

from . import _C
from ._errors import Error

_MIB = 1 << 20


@contextlib.contextmanager
def deferred_capacity_check() -> Iterator[None]:
    """This thread's ipu allocations may exceed an IPU's capacity meanwhile."""
    previous = _C.defer_capacity_check(True)
    try:
        yield
    finally:
        _C.defer_capacity_check(previous)


def place_weights(program: "_C.Program", weights: Iterable[torch.Tensor],
                  accumulators: Dict[int, torch.Tensor],
                  optimizer_state: Dict[int, Dict[str, torch.Tensor]]) -> None:
    """Counts each weight, with its gradient accumulator and optimiser state
    (by ``id`` of the weight), on the IPU of the first node of ``program``
    that uses it."""
    for weight in weights:
        ipu = program.ipu_of_first_use(weight)
        if ipu < 0:
            continue  # unused by the step: it stays where it is
        tensors = [weight, *optimizer_state.get(id(weight), {}).values()]
        if id(weight) in accumulators:
            tensors.append(accumulators[id(weight)])
        for tensor in tensors:
            _C.account_on(tensor, ipu)


def check_fits(programs: Iterable[Optional["_C.Program"]]) -> None:
    """Raises if an IPU's memory cannot hold what it holds plus the peak of
    the temporaries of the largest of ``programs`` on it."""
    peaks: List[int] = [0] * _C.device_count()
    for program in programs:
        if program is not None:
            for ipu, peak in enumerate(program.temporary_peaks()):
                peaks[ipu] = max(peaks[ipu], peak)
    needs = [(ipu, _C.memory_allocated(ipu), peaks[ipu], _C.memory_capacity(ipu))
             for ipu in range(len(peaks))]
    if all(held + peak <= capacity for _, held, peak, capacity in needs):
        return
    lines = "\n".join(
        f"  ipu:{ipu}: {(held + peak) / _MIB:.1f} MiB needed ({held / _MIB:.1f} MiB of weights, "
        f"optimiser state and other tensors, {peak / _MIB:.1f} MiB of activations at the peak) "
        f"of {capacity / _MIB:.1f} MiB{'  <- does not fit' if held + peak > capacity else ''}"
        for ipu, held, peak, capacity in needs if held + peak > 0)
    raise Error("IPU out of memory: the model does not fit its IPUs.\n" + lines + "\n"
                "Split the model over more IPUs with poptorch.BeginBlock / poptorch.Block "
                "(each block's weights and activations live on its IPU), use a smaller "
                "micro-batch, or raise POPTORCH_IPU_MEMORY_MB.")
