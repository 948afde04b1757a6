"""Memory per IPU of a wrapped model, modelled at compile time.

Each IPU has its own memory (``POPTORCH_IPU_MEMORY_MB``). A model's weights,
their optimiser state and gradient accumulators live on the IPU of the block
that first uses the weight; the activations of a step are temporaries whose
peak the compiler plans per IPU (``compiler/memory_plan.cpp``, by the IPU of
the block that makes them). Weights are allocated before the model's split is
known, so the capacity check is deferred until they are placed, and each IPU
is then checked whole: a model that does not fit fails at compile time with
every IPU's need against its capacity.

In phased execution the weights, optimiser state and accumulators live in the
streaming memory attached to their IPU and take its memory only during the
phases that use them; activations stay or leave between phases as the
strategy's ``poptorch.Liveness`` says (``compiler/strategy_memory.cpp``).
"""
from __future__ import annotations

import contextlib
from typing import Dict, Iterable, Iterator, List

import torch

from . import _C
from ._errors import Error
from ._execution_strategy import _ExecutionStrategy

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
                  optimizer_state: Dict[int, Dict[str, torch.Tensor]], *,
                  streamed: bool) -> None:
    """Counts each weight, with its gradient accumulator and optimiser state
    (by ``id`` of the weight), on the IPU of the first node of ``program``
    that uses it, or in the streaming memory attached to it (``streamed``)."""
    for weight in weights:
        ipu = program.ipu_of_first_use(weight)
        if ipu < 0:
            continue  # unused by the step: it stays where it is
        tensors = [weight, *optimizer_state.get(id(weight), {}).values()]
        if id(weight) in accumulators:
            tensors.append(accumulators[id(weight)])
        for tensor in tensors:
            _C.account_on(tensor, ipu, streamed)


def peaks(program: "_C.Program", strategy: _ExecutionStrategy,
          available_memory: Dict[int, float]) -> List[int]:
    """The modelled peak per IPU of a run of ``program`` beyond what each IPU
    holds: its temporaries (with the activations of every micro-batch in
    flight in a pipeline), the working memory of its matmuls (bounded by
    ``available_memory``, Options.setAvailableMemoryProportion by IPU, or by
    poptorch.set_available_memory), and in phased execution the streamed
    weights of each phase."""
    proportions = [available_memory.get(ipu, 0.0) for ipu in range(_C.device_count())]
    if strategy.streaming is not None:
        return program.phased_peaks(int(strategy.streaming), proportions)
    if strategy.pipelined:
        return program.pipelined_peaks(proportions)
    return program.sequential_peaks(proportions)


def check_fits(program_peaks: Iterable[List[int]], strategy: _ExecutionStrategy) -> None:
    """Raises if an IPU's memory cannot hold what it holds plus the largest
    of the programs' peaks on it (:func:`peaks`)."""
    largest: List[int] = [0] * _C.device_count()
    for program in program_peaks:
        for ipu, peak in enumerate(program):
            largest[ipu] = max(largest[ipu], peak)
    needs = [(ipu, _C.memory_allocated(ipu), largest[ipu], _C.memory_capacity(ipu))
             for ipu in range(len(largest))]
    if all(held + peak <= capacity for _, held, peak, capacity in needs):
        return
    if strategy.streaming is None:
        held_what = "weights, optimiser state and other tensors"
        peak_what = "activations and matmul working memory at the peak"
        advice = ("Split the model over more IPUs with poptorch.BeginBlock / poptorch.Block "
                  "(each block's weights and activations live on its IPU), use phased "
                  "execution (poptorch.SerialPhasedExecution: weights in streaming memory, "
                  "brought in per phase), use a smaller micro-batch, or raise "
                  "POPTORCH_IPU_MEMORY_MB.")
    else:
        held_what = "tensors kept on the IPU"
        peak_what = ("weights streamed in, activations and matmul working memory at the peak "
                     "of a phase")
        advice = ("Split the model into more phases (each brings in only its blocks' "
                  "weights), send activations off the chip between phases "
                  "(setTensorsLiveness(poptorch.Liveness.OffChipAfterFwd or "
                  "OffChipAfterEachPhase)), use a smaller micro-batch, or raise "
                  "POPTORCH_IPU_MEMORY_MB.")
    lines = "\n".join(
        f"  ipu:{ipu}: {(held + peak) / _MIB:.1f} MiB needed ({held / _MIB:.1f} MiB of "
        f"{held_what}, {peak / _MIB:.1f} MiB of {peak_what}) of {capacity / _MIB:.1f} MiB"
        f"{'  <- does not fit' if held + peak > capacity else ''}"
        for ipu, held, peak, capacity in needs if held + peak > 0)
    raise Error("IPU out of memory: the model does not fit its IPUs.\n" + lines + "\n" + advice +
                " A large matmul needs less working memory computed in parts "
                "(poptorch.serializedMatMul) or with a lower available memory proportion "
                "(poptorch.set_available_memory, Options.setAvailableMemoryProportion).")
