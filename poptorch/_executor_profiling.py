"""What PopTorch's ``PoplarExecutor`` tells of its runs: its profile report
(``Options.enableProfiling``), the performance counters of its last call
(``getPerfCounters`` and the latencies computed from them), the time its
compilation took and the IPU cycles of its last call (modelled).

The counters come from ``_C.StepTimeline``: when each micro-batch's inputs
were copied to the device, its micro-step ran, and its outputs were copied
back, stamped by the runtime's replay loop.
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

from . import _C
from . import _profiling
from ._errors import Error
from ._logging import logger
from ._profiling import recorder

# The clock of the IPU the emulation models (Mk2, ipuHardwareVersion() == 2).
IPU_CLOCK_HZ = 1.33e9

_NOTHING = contextlib.nullcontext()

_EMPTY_COUNTERS = {"input": [[]], "input_complete": [[]], "output": [[]],
                   "output_complete": [[]]}


class ExecutorProfiling:
    """Methods of PoplarExecutor (which provides ``_options``, ``_training``,
    ``_compiled``, ``_lock`` and ``_step``)."""

    def _start_profiling(self) -> None:
        self._profile_session = recorder.new_session()
        self._timeline: Optional[Any] = None  # of the last call
        self._compile_seconds: Optional[float] = None
        self._profile: Optional[recorder.Report] = None
        directory = self._options.profile_dir
        if directory is not None:
            name = self._options.model_name or ("training" if self._training else "inference")
            self._profile = _profiling.model_report(directory, name, self._profile_session)
            # Written when the model is destroyed or collected, or at exit.
            weakref.finalize(self, recorder.close_report, self._profile)

    def _close_profile(self) -> None:
        if self._profile is not None:
            recorder.close_report(self._profile)

    def _profiled(self, capture: Optional[str] = None) -> ContextManager[None]:
        """The block's events belong to this model's profile; ``capture``
        names it as a capture in the profile and times the compilation.
        A call's replay while nothing records pays nothing."""
        if capture is None and not recorder.recording():
            return _NOTHING
        return self._profiled_block(capture)

    @contextlib.contextmanager
    def _profiled_block(self, capture: Optional[str]) -> Iterator[None]:
        start = recorder.now()
        wall = time.perf_counter()
        with recorder.session(self._profile_session):
            yield
        if capture is not None:
            self._compile_seconds = time.perf_counter() - wall
            recorder.add(recorder.Event(recorder.CAPTURE, capture, -1, start, recorder.now(),
                                        self._profile_session))

    def _after_call(self, timeline: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Keeps the call's timeline; its transfers join the profile."""
        self._timeline = timeline
        if recorder.recording():
            for kind, stamps, ends, tensors, label in (
                    ("to_ipu", timeline.input, timeline.input_complete, inputs, "input"),
                    ("from_ipu", timeline.output, timeline.output_complete, outputs, "output")):
                for index, (starts, completes) in enumerate(zip(stamps, ends)):
                    for start, end in zip(starts, completes):
                        if start:
                            recorder.add(recorder.Event(
                                kind, f"{label} {index}", tensors[index].device.index or 0,
                                start, end, self._profile_session,
                                bytes=tensors[index].nbytes))
        if self._options.log_cycle_count:
            logger.info("Total number of IPU cycles: %d (modelled)", self._cycles())

    # --- PopTorch's API -------------------------------------------------------

    def getPerfCounters(self) -> Dict[str, List[List[float]]]:
        """The performance counters of the last call, in fractional seconds on
        a clock whose origin is undefined (differences are meaningful):
        ``'input'`` and ``'input_complete'`` (each input's copy to the IPU
        started and completed), ``'output'`` and ``'output_complete'`` (each
        returned output's copy to the host), each a list per tensor of a value
        per micro-batch (per returned micro-batch for outputs)."""
        timeline = self._timeline
        if not self._compiled or timeline is None:
            return {k: [list(v) for v in vs] for k, vs in _EMPTY_COUNTERS.items()}

        def seconds(stamps: List[List[int]]) -> List[List[float]]:
            return [[ns / 1e9 for ns in per_tensor] for per_tensor in stamps] or [[]]
        return {"input": seconds(timeline.input),
                "input_complete": seconds(timeline.input_complete),
                "output": seconds(timeline.output),
                "output_complete": seconds(timeline.output_complete)}

    def _latency(self, from_event: str, from_reduce: Callable[[Sequence[float]], float],
                 to_event: str, to_reduce: Callable[[Sequence[float]], float]
                 ) -> Tuple[float, float, float]:
        """(min, max, mean) over the micro-batches of the last call of the time
        from ``from_event`` (reduced over tensors) to ``to_event``; several
        micro-batches that return one output count from their first start."""
        counters = self.getPerfCounters()
        starts = [from_reduce(step) for step in zip(*counters[from_event])]
        ends = [to_reduce(step) for step in zip(*counters[to_event])]
        if not starts or not ends or len(starts) % len(ends):
            return (0.0, 0.0, 0.0)
        factor = len(starts) // len(ends)
        durations = [end - min(starts[i * factor:(i + 1) * factor])
                     for i, end in enumerate(ends)]
        return (min(durations), max(durations), sum(durations) / len(durations))

    def getHostIpuLatency(self) -> Tuple[float, float, float]:
        """(min, max, mean) seconds from the first input copy starting to the
        last completing, over the micro-batches of the last call."""
        return self._latency("input", min, "input_complete", max)

    def getComputeLatency(self) -> Tuple[float, float, float]:
        """(min, max, mean) seconds from the last input reaching the IPU to
        the last output being ready, over the micro-batches of the last call."""
        return self._latency("input_complete", max, "output", max)

    def getIpuHostLatency(self) -> Tuple[float, float, float]:
        """(min, max, mean) seconds from the first output copy starting to the
        last completing, over the micro-batches of the last call."""
        return self._latency("output", min, "output_complete", max)

    def getLatency(self) -> Tuple[float, float, float]:
        """(min, max, mean) round-trip seconds, from the first input copy
        starting to the last output copy completing."""
        return self._latency("input", min, "output_complete", max)

    def compilationTime(self) -> float:
        """The seconds the last compilation took (capturing the step and
        compiling its programs)."""
        if self._compile_seconds is None:
            raise Error("compilationTime: the model is not compiled yet: call it (or compile()) "
                        "first")
        return self._compile_seconds

    def cycleCount(self) -> int:
        """The IPU cycles of the last call, for the first replica only:
        modelled as the host's time running its micro-steps at the clock of
        the IPU the emulation models (1.33 GHz). Needs
        ``Options.logCycleCount(True)``."""
        if not self._options.log_cycle_count:
            raise Error("Cycle count logging is disabled. Please set option logCycleCount to "
                        "True to enable.")
        if not self._compiled or self._timeline is None:
            raise Error("Please run the model at least once before obtaining cycle count.")
        return self._cycles()

    def _cycles(self) -> int:
        timeline = self._timeline
        replicas = self._options.replication_factor
        nanoseconds = sum(end - start for k, (start, end) in enumerate(
            zip(timeline.launch, timeline.launch_complete)) if k % replicas == 0)
        return int(nanoseconds * IPU_CLOCK_HZ / 1e9)
