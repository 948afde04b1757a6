"""``poptorch.enums``: every enumeration of PopTorch's API, with PopTorch's values.

``from poptorch.enums import *`` (and ``import poptorch``) gives them all. The
features some of them select belong to chapters the emulator may not have yet;
the option or class taking them says what the emulator does with each value.
"""
from __future__ import annotations

import enum

__all__ = ["AutoStage", "CommGroupType", "ConnectionType", "DataLoaderMode",
           "HalfFloatCastingBehavior", "Liveness", "MatMulSerializationMode",
           "MeanReductionStrategy", "MultiConvPlanType", "OutputMode", "OverlapMode",
           "ReductionType", "SharingStrategy", "SyncPattern", "VariableRetrievalMode"]


class OutputMode(enum.IntEnum):
    """Which results of the device iterations of one call are returned to the host."""
    Final = 0  #: the result of the last device iteration
    EveryN = 1  #: every N-th result, N being ``output_return_period``
    All = 2  #: one result per device iteration
    Sum = 3  #: the sum of the results of all device iterations
    Default = 4  #: ``Final`` for training models, ``All`` for inference models


class ReductionType(enum.IntEnum):
    """How gradients are reduced across accumulation steps and replicas."""
    Sum = 0
    Mean = 1
    NoReduction = 2


class MeanReductionStrategy(enum.IntEnum):
    """When the mean of accumulated and replicated gradients is divided by their count.

    ``Running`` keeps the accumulator as the running mean, ``Post`` divides once
    after accumulating, ``PostAndLoss`` (deprecated in PopTorch) divides by the
    replicas before the backward pass and by the accumulation after it. They
    are equal up to rounding; see ``Training.setMeanAccumulationAndReplicationReductionStrategy``.
    """
    Running = 0
    Post = 1
    PostAndLoss = 2


class DataLoaderMode(enum.IntEnum):
    """How :class:`poptorch.DataLoader` loads batches."""
    Sync = 0  #: on demand, in the consumer's thread
    Async = 1  #: ahead of the consumer, through an AsynchronousDataAccessor
    #: as Async, the loader's batches (of ``rebatched_worker_size`` samples)
    #: regrouped into combined batches
    AsyncRebatched = 2


class SharingStrategy(enum.IntEnum):
    """How PopTorch's loading process receives the dataset. The emulator loads
    on a thread of this process, which needs no sharing: all behave alike."""
    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class ConnectionType(enum.IntEnum):
    """When to attach to the IPU: ``Always`` (from the start), ``OnDemand``
    (when the model first runs), ``Never`` (offline compilation only)."""
    Always = 0
    OnDemand = 1
    Never = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    """What an operation mixing float16 and float32 inputs computes in."""
    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class SyncPattern(enum.IntEnum):
    """How IPUs synchronise with the host and with each other."""
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class MatMulSerializationMode(enum.Enum):
    """Which dimension of a matrix multiplication ``serializedMatMul`` splits."""
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class Liveness(enum.IntEnum):
    """Where the tensors of a phased execution live between phases."""
    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class OverlapMode(enum.Enum):
    """How far ahead the host streams an input to (or an output from) the IPU."""
    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class AutoStage(enum.IntEnum):
    """How blocks without an explicit stage get one: ``SameAsIpu`` (the stage
    is the block's IPU) or ``AutoIncrement`` (each new block a new stage)."""
    SameAsIpu = 0
    AutoIncrement = 1


class MultiConvPlanType(enum.IntEnum):
    """How a ``poptorch.MultiConv`` runs its convolutions."""
    Parallel = 0
    Serial = 1


class CommGroupType(enum.IntEnum):
    """How replicas are grouped (for inputs and per-replica variables).

    With ``N`` replicas in groups of ``k``: ``Consecutive`` makes the groups
    ``{0..k-1}, {k..2k-1}, ...``; ``Orthogonal`` makes them ``{0, m, 2m, ...},
    {1, m+1, ...}, ...`` with ``m = N / k``; ``All`` is one group of every
    replica; ``NoGrouping`` gives each replica a group of its own.
    """
    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    """What is read back from grouped replicas: one value per group (from its
    first replica) or one per replica."""
    OnePerGroup = 0
    AllReplicas = 2
