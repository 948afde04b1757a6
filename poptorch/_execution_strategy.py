"""How the blocks of a model split over several IPUs are grouped into stages
and phases: ``poptorch.Stage``, ``poptorch.Phase`` and the four execution
strategies of ``Options.setExecutionStrategy`` (the user guide's
"Multi-IPU execution strategies").

A strategy answers one question while a wrapped model's step is captured:
for a block (its ``user_id`` and the ``ipu_id`` it was given), which stage,
phase and IPU it belongs to (:meth:`_ExecutionStrategy.place`). The blocks
themselves are in ``_annotations.py``.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

from ._errors import Error
from .enums import AutoStage, Liveness

__all__ = ["ParallelPhasedExecution", "Phase", "PipelinedExecution", "SerialPhasedExecution",
           "ShardedExecution", "Stage"]


def _ipu_index(what: str, value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Error(f"{what}: an IPU is an integer >= 0, got {value!r}")
    return value


class Placement(NamedTuple):
    """Where a block runs."""
    stage: int
    phase: int
    ipu: int


class Stage:
    """The blocks (by ``user_id``) that run together on one IPU.

    >>> poptorch.Stage("encoder", "decoder").ipu(1)
    """

    def __init__(self, *block_ids: str) -> None:
        for block in block_ids:
            if not isinstance(block, str):
                raise Error(f"poptorch.Stage takes block ids (strings), got {block!r}: use the "
                            "user_id given to poptorch.Block / BeginBlock, e.g. Stage(\"0\")")
        self._blocks = tuple(block_ids)
        self._ipu: Optional[int] = None

    @property
    def blocks(self) -> Sequence[str]:
        """The ids of the blocks this stage is made of."""
        return self._blocks

    def ipu(self, ipu: int) -> "Stage":
        """Runs this stage on IPU ``ipu``; returns the stage."""
        self._ipu = _ipu_index(f"Stage{self._blocks}.ipu", ipu)
        return self

    def __repr__(self) -> str:
        ipu = f".ipu({self._ipu})" if self._ipu is not None else ""
        return f"Stage({', '.join(map(repr, self._blocks))}){ipu}"


class Phase:
    """Stages that run at the same time, each on its own IPU, in phased
    execution. Takes stages, or block ids (which then form one stage).

    >>> poptorch.Phase(poptorch.Stage("A").ipu(0), poptorch.Stage("B").ipu(1))
    >>> poptorch.Phase("A", "B")  # one stage of two blocks
    """

    def __init__(self, *stages: Union[Stage, str, Sequence[Union[Stage, str]]]) -> None:
        if len(stages) == 1 and isinstance(stages[0], (list, tuple)):
            stages = tuple(stages[0])
        if stages and all(isinstance(s, Stage) for s in stages):
            self.stages: List[Stage] = list(stages)
        elif stages and all(isinstance(s, str) for s in stages):
            self.stages = [Stage(*stages)]  # type: ignore[arg-type]
        else:
            raise Error(f"poptorch.Phase takes Stages, or block ids (strings), not a mix or "
                        f"nothing: got {stages!r}")

    def stage(self, index: int) -> Stage:
        """The ``index``-th stage of the phase."""
        return self.stages[index]

    def ipus(self, *ipus: int) -> "Phase":
        """Runs the phase's stages on these IPUs, one IPU per stage in order."""
        if len(ipus) != len(self.stages):
            raise Error(f"Phase.ipus: the phase has {len(self.stages)} stage(s) "
                        f"({self.stages}) but {len(ipus)} IPU(s) were given {ipus}: give one "
                        "IPU per stage")
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self


class _ExecutionStrategy:
    """What the strategies share: a map from block id to its stage."""

    def __init__(self) -> None:
        self._stages: Dict[str, Stage] = {}       # block id -> its stage (explicit stages)
        self._stage_ids: Dict[int, int] = {}      # id(stage) -> its stage index
        self._phase_ids: Dict[int, int] = {}      # id(stage) -> its phase index

    def __deepcopy__(self, memo: Dict[int, Any]) -> "_ExecutionStrategy":
        # opts.clone() copies the strategy: the maps keyed by id(stage) must
        # follow the copies of the stages.
        copied = copy.copy(self)
        memo[id(self)] = copied
        for name, value in self.__dict__.items():
            setattr(copied, name, copy.deepcopy(value, memo))
        for name in ("_stage_ids", "_phase_ids"):
            setattr(copied, name, {id(memo[key]): value
                                   for key, value in getattr(self, name).items() if key in memo})
        return copied

    def stage(self, block_id: str) -> Stage:
        """The :class:`Stage` block ``block_id`` belongs to."""
        if block_id not in self._stages:
            raise Error(f"no stage of this execution strategy has block {block_id!r}; blocks: "
                        f"{sorted(self._stages)}")
        return self._stages[block_id]

    def _add(self, stage: Stage, index: int, phase: int) -> None:
        for block in stage.blocks:
            if block in self._stages:
                raise Error(f"block {block!r} is in two stages of the execution strategy: "
                            "a block runs in one stage")
            self._stages[block] = stage
        self._stage_ids[id(stage)] = index
        self._phase_ids[id(stage)] = phase

    def place(self, block_id: str, ipu_id: Optional[int], order: int) -> Placement:
        """Where block ``block_id`` runs: given ``ipu_id`` by its annotation,
        and the ``order``-th block (from 0) the capture met."""
        if block_id not in self._stages:
            raise Error(f"{type(self).__name__}: the model has a block {block_id!r} that none "
                        f"of the strategy's stages names (their blocks: {sorted(self._stages)}); "
                        "add it to a poptorch.Stage of the strategy")
        stage = self._stages[block_id]
        index = self._stage_ids[id(stage)]
        ipu = stage._ipu if stage._ipu is not None else ipu_id  # pylint: disable=protected-access
        return Placement(index, self._phase_ids[id(stage)], index if ipu is None else ipu)

    @property
    def pipelined(self) -> bool:
        """True if stages run at the same time on successive micro-batches."""
        return False

    @property
    def stage_schedule(self) -> int:
        """How the runtime runs the stages (runtime::StageSchedule): 0 the
        whole step in program order, 1 one IPU at a time, 2 pipelined."""
        return 0

    @property
    def streaming(self) -> Optional[Liveness]:
        """For phased execution (weights in streaming memory, brought onto
        an IPU for the phases that use them), where activations live between
        phases; None when weights stay on their IPUs."""
        return None


class PipelinedExecution(_ExecutionStrategy):
    """Runs the stages as a pipeline: stage k of micro-batch i runs while
    stage k+1 runs micro-batch i-1, each stage on its IPU. The default.

    Takes the stages in order (:class:`Stage`, block ids, or lists of block
    ids forming one stage), or a :class:`~poptorch.AutoStage` rule for models
    whose blocks name their IPUs: ``SameAsIpu`` (default: a block's stage is
    its IPU) or ``AutoIncrement`` (each new block is a new stage).

    >>> opts.setExecutionStrategy(poptorch.PipelinedExecution("A", "B", "C"))
    >>> opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    """

    def __init__(self, *args: Union[AutoStage, Stage, str, Sequence[str]]) -> None:
        super().__init__()
        self._auto: Optional[AutoStage] = None
        if not args or (len(args) == 1 and isinstance(args[0], AutoStage)):
            self._auto = args[0] if args else AutoStage.SameAsIpu
        else:
            for index, arg in enumerate(args):
                if isinstance(arg, Stage):
                    stage = arg
                elif isinstance(arg, str):
                    stage = Stage(arg)
                elif isinstance(arg, (list, tuple)):
                    stage = Stage(*arg)
                else:
                    raise Error(f"{type(self).__name__} takes an AutoStage, or stages (Stage, "
                                f"block ids or lists of block ids), got {arg!r}")
                self._add(stage, index, 0)

    def place(self, block_id: str, ipu_id: Optional[int], order: int) -> Placement:
        if self._auto is None:
            return super().place(block_id, ipu_id, order)
        if self._auto == AutoStage.SameAsIpu:
            if ipu_id is None:
                raise Error(f"block {block_id!r} has no ipu_id, and the strategy's stages are "
                            "AutoStage.SameAsIpu (a block's stage is its IPU): give the block an "
                            "ipu_id, use AutoStage.AutoIncrement, or list the stages "
                            f"(poptorch.{type(self).__name__}(poptorch.Stage(...).ipu(n), ...))")
            return Placement(ipu_id, 0, ipu_id)
        # AutoIncrement: each new block a new stage, after the layers before
        # the first block (stage 0).
        stage = order + 1
        return Placement(stage, 0, stage if ipu_id is None else ipu_id)

    @property
    def pipelined(self) -> bool:
        return True

    @property
    def stage_schedule(self) -> int:
        return 2


class ShardedExecution(PipelinedExecution):
    """Runs the stages (shards) one after another, one IPU at a time. Takes
    the same arguments as :class:`PipelinedExecution`."""

    @property
    def pipelined(self) -> bool:
        return False

    @property
    def stage_schedule(self) -> int:
        return 1


class _PhasedExecution(_ExecutionStrategy):
    """Phases run one after another; the stages of a phase run at the same
    time, each on its IPU. Takes :class:`Phase` objects, or lists of stages
    or block ids (each list a phase)."""

    def __init__(self, *phases: Union[Phase, Sequence[Union[Stage, str]]]) -> None:
        super().__init__()
        if not phases:
            raise Error(f"{type(self).__name__} needs its phases: e.g. "
                        f"poptorch.{type(self).__name__}(poptorch.Phase(\"A\"), "
                        "poptorch.Phase(\"B\"))")
        self._phases = [p if isinstance(p, Phase) else Phase(p) for p in phases]
        self._separate_backward_phase = False
        self._liveness = Liveness.AlwaysLive
        index = 0
        for phase_id, phase in enumerate(self._phases):
            for stage in phase.stages:
                self._add(stage, index, phase_id)
                index += 1

    def phase(self, phase: int) -> Phase:
        """The ``phase``-th :class:`Phase`."""
        if isinstance(phase, bool) or not isinstance(phase, int) or \
                not 0 <= phase < len(self._phases):
            raise Error(f"phase({phase!r}): the strategy has phases 0 to {len(self._phases) - 1}")
        return self._phases[phase]

    @property
    def phases(self) -> List[Phase]:
        return list(self._phases)

    def useSeparateBackwardPhase(self, use: bool = True) -> "_PhasedExecution":
        """Gives the backward pass phases of its own (the last forward phase
        is then not shared with the first backward phase)."""
        if not isinstance(use, bool):
            raise Error(f"useSeparateBackwardPhase takes a bool, got {use!r}")
        self._separate_backward_phase = use
        return self

    def setTensorsLiveness(self, liveness: Liveness) -> "_PhasedExecution":
        """Where tensors live between phases (:class:`~poptorch.Liveness`)."""
        if not isinstance(liveness, Liveness):
            raise Error(f"setTensorsLiveness takes a poptorch.Liveness, got {liveness!r}")
        self._liveness = liveness
        return self

    @property
    def separate_backward_phase(self) -> bool:
        return self._separate_backward_phase

    @property
    def liveness(self) -> Liveness:
        return self._liveness

    @property
    def streaming(self) -> Optional[Liveness]:
        return self._liveness

    def place(self, block_id: str, ipu_id: Optional[int], order: int) -> Placement:
        placement = super().place(block_id, ipu_id, order)
        stage = self._stages[block_id]
        if stage._ipu is None and ipu_id is None:  # pylint: disable=protected-access
            raise Error(f"block {block_id!r} of phase {placement.phase} has no IPU: set it with "
                        f"strategy.phase({placement.phase}).ipus(...), Stage(...).ipu(n) or "
                        "the block's ipu_id")
        return placement


class SerialPhasedExecution(_PhasedExecution):
    """Phases run one after another on one group of IPUs.

    >>> strategy = poptorch.SerialPhasedExecution(
    ...     poptorch.Phase(poptorch.Stage("A"), poptorch.Stage("A2")),
    ...     poptorch.Phase(poptorch.Stage("B"), poptorch.Stage("B2")))
    >>> strategy.phase(0).ipus(0, 1)
    >>> strategy.phase(1).ipus(0, 1)
    """


class ParallelPhasedExecution(_PhasedExecution):
    """Phases alternate between two groups of IPUs: even phases run on even
    IPUs and odd phases on odd IPUs, so one group computes while the other
    loads the next phase's weights.

    >>> strategy = poptorch.ParallelPhasedExecution(
    ...     poptorch.Phase(poptorch.Stage("0"), poptorch.Stage("1")),
    ...     poptorch.Phase(poptorch.Stage("2"), poptorch.Stage("3")))
    >>> strategy.phase(0).ipus(0, 2)
    >>> strategy.phase(1).ipus(1, 3)
    """

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True) -> "ParallelPhasedExecution":
        """Sends tensors to streaming memory after the forward pass
        (``Liveness.OffChipAfterFwd``), or keeps them (``AlwaysLive``)."""
        if not isinstance(off_chip, bool):
            raise Error(f"sendTensorsOffChipAfterFwd takes a bool, got {off_chip!r}")
        self._liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self

    def place(self, block_id: str, ipu_id: Optional[int], order: int) -> Placement:
        placement = super().place(block_id, ipu_id, order)
        if placement.ipu % 2 != placement.phase % 2:
            parity = "even" if placement.phase % 2 == 0 else "odd"
            raise Error(f"ParallelPhasedExecution: block {block_id!r} is in phase "
                        f"{placement.phase} but on IPU {placement.ipu}: {parity} phases run on "
                        f"{parity} IPUs (e.g. strategy.phase(0).ipus(0, 2), "
                        "strategy.phase(1).ipus(1, 3))")
        return placement


def check_split(strategy: _ExecutionStrategy, stages: Sequence[int], num_ipus: int, *,
                training: bool, device_iterations: int, gradient_accumulation: int,
                auto_round_num_ipus: bool, ipus_available: int) -> None:
    """PopTorch's rules on a model split into ``stages`` over ``num_ipus`` IPUs."""
    if num_ipus & (num_ipus - 1):
        rounded = 1 << (num_ipus - 1).bit_length()
        if not auto_round_num_ipus:
            raise Error(f"the model uses {num_ipus} IPUs: PopTorch reserves IPUs in powers of 2. "
                        f"Annotate the model to use {rounded // 2} or {rounded} IPUs, or set "
                        f"Options().autoRoundNumIPUs(True) to reserve {rounded} (the extra ones "
                        "idle)")
        if rounded > ipus_available:
            raise Error(f"the model uses {num_ipus} IPUs, rounded up to {rounded} by "
                        f"autoRoundNumIPUs, but there are {ipus_available} IPUs "
                        "(POPTORCH_NUM_IPUS)")
    if not strategy.pipelined or len(stages) < 2:
        return
    n = len(stages)
    # The first sentences are PopTorch's words.
    if training and gradient_accumulation < 2 * n - 1:
        raise Error(f"poptorch.Options().Training.gradientAccumulation must be greater than or "
                    f"equal to the number of pipeline stages ({2 * n - 1}) when using "
                    f"poptorch.PipelinedExecution. Please note that a model with {n} pipeline "
                    f"stages in PopTorch will have an additional {n - 1} stages when training "
                    f"(the backward stages: each forward and backward stage holds a "
                    f"micro-batch). Got {gradient_accumulation}: set "
                    f"options.Training.gradientAccumulation({2 * n - 1}) or more, or use "
                    "poptorch.ShardedExecution()")
    if not training and device_iterations < n:
        raise Error(f"poptorch.Options().deviceIterations must be greater than or equal to the "
                    f"number of pipeline stages ({n}) when using poptorch.PipelinedExecution in "
                    f"inference (one micro-batch per stage). Got {device_iterations}: set "
                    f"options.deviceIterations({n}) or more, or use poptorch.ShardedExecution()")
