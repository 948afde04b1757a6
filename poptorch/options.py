"""``poptorch.Options``: how a model is compiled and run (see the user guide, "Options").

The API mirrors PopTorch: setters are methods named as in PopTorch that
validate their argument, store it and return ``self`` so calls chain::

    opts = Options().deviceIterations(4).replicationFactor(2)
    opts.Training.gradientAccumulation(8)

The values are read back through read-only snake_case properties
(``opts.device_iterations``, ``opts.Training.gradient_accumulation``...).

The emulated device is always the IPU Model on the host, so some options have
nothing to act on (which IPU to attach to, tensor locations, stochastic
rounding...). Such an option is still validated and stored, and setting it to a
value the emulator does not honour logs one INFO message; the options concerned
and why are listed in one table, ``_NOT_HONOURED``. Defaults describe what the
emulator does, which differs from PopTorch for ``use_ipu_model`` (True: there
is no hardware), ``Jit.trace_model`` (False: capture is at the dispatcher),
``Precision.autocast_enabled`` and ``Precision.running_statistics_always_float``
(False: PyTorch's own type rules apply).
"""
from __future__ import annotations

import ast
import enum
import inspect
import os
from typing import (Any, Callable, ClassVar, Dict, Generic, Iterator, List, Optional, Tuple,
                    TypeVar, Union, overload)

import torch

from ._errors import Error
from ._logging import logger

__all__ = ["ConnectionType", "HalfFloatCastingBehavior", "Options", "OutputMode",
           "ReductionType", "SyncPattern", "TensorLocationSettings"]


class OutputMode(enum.IntEnum):
    """Which results of the device iterations of one call are returned to the host."""
    All = 0  #: one result per device iteration
    Final = 1  #: the result of the last device iteration
    EveryN = 2  #: every N-th result, N being ``output_return_period``
    Sum = 3  #: the sum of the results of all device iterations
    Default = 4  #: ``Final`` for training models, ``All`` for inference models


class ReductionType(enum.IntEnum):
    """How gradients are reduced across accumulation steps and replicas."""
    Sum = 0
    Mean = 1
    NoReduction = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    """What an operation mixing float16 and float32 inputs computes in."""
    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class ConnectionType(enum.IntEnum):
    """When to attach to the device (there is nothing to attach to here)."""
    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    """How IPUs synchronise with the host (there is a single emulated IPU here)."""
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


# Enums a config file line may name (as ``OutputMode.All`` or ``poptorch.OutputMode.All``).
_CONFIG_ENUMS = {cls.__name__: cls for cls in
                 (OutputMode, ReductionType, HalfFloatCastingBehavior, ConnectionType, SyncPattern)}


def _never(_: Any) -> bool:
    return False


def _only(*honoured: Any) -> Callable[[Any], bool]:
    return lambda value: value in honoured


# Every option the emulated IPU Model does not act on: option -> (does the
# emulator behave as asked for this value?, why not otherwise).
_NOT_HONOURED: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "useIpuModel": (_only(True), "there is no IPU hardware, the IPU Model is always used"),
    "autoRoundNumIPUs": (_only(False), "the emulator does not allocate IPUs"),
    "ipuId": (_never, "there is a single emulated IPU"),
    "connectionType": (_only(ConnectionType.Always), "the emulated IPU is always attached"),
    "syncPattern": (_only(SyncPattern.Full), "there are no IPUs to synchronise"),
    "enableSyntheticData": (_only(False), "inputs always come from the host"),
    "enableExecutableCaching": (
        _only(None), "executables are cached in memory, by structure, for the life of the "
        "process (compiling one takes milliseconds here); nothing is written to disk"),
    "enableProfiling": (_never, "no PopVision reports are produced"),
    "logDir": (_never, "the emulator writes no report files"),
    "logCycleCount": (_only(False), "the emulator counts no IPU cycles"),
    "broadcastBuffers": (_only(True), "replicas share the host's buffers"),
    "anchorTensor": (_never, "named tensors cannot be anchored"),
    "setExecutionStrategy": (_never, "the whole graph runs as one stage on one emulated IPU"),
    "Training.setAutomaticLossScaling": (_only(False), "losses are not rescaled"),
    "Precision.halfFloatCasting": (
        _only(HalfFloatCastingBehavior.Default, HalfFloatCastingBehavior.HalfUpcastToFloat),
        "PyTorch's type promotion (upcast to float) applies"),
    "Precision.runningStatisticsAlwaysFloat": (
        _only(False), "running statistics keep the dtype of the module's buffers"),
    "Precision.enableStochasticRounding": (_only(False), "rounding is to nearest"),
    "Precision.setPartialsType": (_only(torch.float32), "host kernels choose their partials"),
    "Precision.autocastEnabled": (_only(False), "no automatic casting is applied"),
    "TensorLocations.setActivationLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setWeightLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setOptimizerLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setAccumulatorLocation": (_never, "all tensors live in host memory"),
    "Jit.traceModel": (_only(False), "models are captured at the dispatcher, not traced"),
    "Distributed.configureProcessId": (
        lambda ids: ids[1] == 1, "each process runs its own emulated IPU: replicas in other "
        "processes are not synchronised"),
}


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _log_if_not_honoured(option: str, value: Any) -> None:
    """Logs that ``option(value)`` is stored but ignored, unless the emulator behaves so."""
    honours, why = _NOT_HONOURED[option]
    if not honours(value):
        shown = ", ".join(map(_show, value)) if isinstance(value, tuple) else _show(value)
        logger.info("%s(%s) is accepted but the emulated IPU Model ignores it: %s",
                    option, shown, why)


# --- validation -------------------------------------------------------------

def _int(option: str, value: Any, minimum: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Error(f"{option} takes an integer ({meaning}), got {_show(value)} "
                    f"of type {type(value).__name__}")
    if value < minimum:
        raise Error(f"{option}({value}) is invalid: {meaning} must be at least {minimum}; "
                    f"pass {option}({minimum}) or more")
    return value


def _bool(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise Error(f"{option} takes True or False, got {_show(value)}")
    return value


E = TypeVar("E", bound=enum.Enum)


def _enum(option: str, cls: type[E], value: Any) -> E:
    if not isinstance(value, cls):
        names = ", ".join(f"{cls.__name__}.{m.name}" for m in cls)
        raise Error(f"{option} takes one of {names}, got {_show(value)}")
    return value


def _str(option: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise Error(f"{option} takes a non-empty string or path, got {_show(value)}")
    return value


# --- storage ----------------------------------------------------------------

T = TypeVar("T")
S = TypeVar("S", bound="_Settings")


class _Value(Generic[T]):
    """A read-only property backed by ``_values[name]``, with its default."""

    def __init__(self, default: T, doc: str) -> None:
        self.default = default
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "_Value[T]": ...

    @overload
    def __get__(self, obj: "_Settings", objtype: Optional[type] = None) -> T: ...

    def __get__(self, obj: Optional["_Settings"], objtype: Optional[type] = None) -> Any:
        return self if obj is None else obj._values[self.name]

    def __set__(self, obj: "_Settings", value: Any) -> None:
        raise AttributeError(f"{self.name} is read-only: set it with the option's setter method")


class _Settings:
    """Stored values with defaults; ``toDict`` and ``repr`` for every option group."""

    _NAME: ClassVar[str] = ""  # how config files and log messages name the group
    _FIELDS: ClassVar[Dict[str, _Value[Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._FIELDS = {name: attr for klass in reversed(cls.__mro__)
                       for name, attr in vars(klass).items() if isinstance(attr, _Value)}

    def __init__(self) -> None:
        self._values: Dict[str, Any] = {name: f.default for name, f in self._FIELDS.items()}

    def _set(self: S, key: str, value: Any) -> S:
        self._values[key] = value
        return self

    def _set_not_honoured(self: S, method: str, key: str, value: Any) -> S:
        _log_if_not_honoured(f"{self._NAME}.{method}" if self._NAME else method, value)
        return self._set(key, value)

    def _items(self) -> Iterator[Tuple[str, Any, Any]]:
        """(name, value, default) of every stored value."""
        for name, field in self._FIELDS.items():
            yield name, self._values[name], field.default

    def toDict(self) -> Dict[str, Any]:
        """All values as a plain dict (nested settings become dicts too)."""
        return {name: value.toDict() if isinstance(value, _Settings) else value
                for name, value, _ in self._items()}

    def __repr__(self) -> str:
        changed = ", ".join(f"{name}={_show(value)}"
                            for name, value, default in self._items() if value != default)
        return f"{type(self).__name__}({changed})"


class TensorLocationSettings(_Settings):
    """Where a class of tensors lives on a real IPU system; stored, not honoured."""

    on_chip = _Value(True, "Keep the tensors in on-chip memory.")
    replicated_tensor_sharding = _Value(False, "Shard the tensors across replicas.")
    min_elements_for_off_chip = _Value(0, "Smallest tensor that may live off-chip.")
    min_elements_for_replicated_tensor_sharding = _Value(
        0, "Smallest tensor that may be sharded across replicas.")
    io_tiles_to_load = _Value(False, "Load the tensors through the I/O tiles.")

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        return self._set("on_chip", _bool("useOnChipStorage", use))

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        return self._set("replicated_tensor_sharding", _bool("useReplicatedTensorSharding", use))

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        return self._set("min_elements_for_off_chip", _int(
            "minElementsForOffChip", min_elements, 0, "the number of elements"))

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        return self._set("min_elements_for_replicated_tensor_sharding", _int(
            "minElementsForReplicatedTensorSharding", min_elements, 0, "the number of elements"))

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        return self._set("io_tiles_to_load", _bool("useIOTilesToLoad", use))


class _TrainingOptions(_Settings):
    """``opts.Training``: gradient accumulation and reduction."""

    _NAME = "Training"
    gradient_accumulation = _Value(1, "Micro-batches whose gradients are accumulated "
                                      "before each weight update.")
    accumulation_and_replication_reduction_type = _Value(
        ReductionType.Mean, "How accumulated and replicated gradients are reduced.")
    automatic_loss_scaling = _Value(False, "Whether the loss scaling factor adapts itself.")

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        return self._set("gradient_accumulation", _int(
            "Training.gradientAccumulation", gradient_accumulation, 1,
            "the number of micro-batches accumulated per weight update"))

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType
                                                ) -> _TrainingOptions:
        return self._set("accumulation_and_replication_reduction_type", _enum(
            "Training.accumulationAndReplicationReductionType", ReductionType, reduction_type))

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        return self._set_not_honoured("setAutomaticLossScaling", "automatic_loss_scaling",
                                      _bool("Training.setAutomaticLossScaling", enabled))


class _PrecisionOptions(_Settings):
    """``opts.Precision``: half precision behaviour."""

    _NAME = "Precision"
    half_float_casting = _Value(HalfFloatCastingBehavior.Default,
                                "What mixed float16/float32 operations compute in.")
    running_statistics_always_float = _Value(False, "Keep norm running statistics in float32.")
    stochastic_rounding = _Value(False, "Round stochastically.")
    partials_type = _Value(torch.float32, "The dtype of matmul and convolution partials.")
    autocast_enabled = _Value(False, "Cast operations to half automatically.")

    def halfFloatCasting(self, behavior: HalfFloatCastingBehavior) -> _PrecisionOptions:
        return self._set_not_honoured("halfFloatCasting", "half_float_casting", _enum(
            "Precision.halfFloatCasting", HalfFloatCastingBehavior, behavior))

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        return self._set_not_honoured(
            "runningStatisticsAlwaysFloat", "running_statistics_always_float",
            _bool("Precision.runningStatisticsAlwaysFloat", value))

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        return self._set_not_honoured("enableStochasticRounding", "stochastic_rounding",
                                      _bool("Precision.enableStochasticRounding", enabled))

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        if dtype not in (torch.float32, torch.float16):
            raise Error(f"Precision.setPartialsType takes torch.float32 or torch.float16, "
                        f"got {_show(dtype)}")
        return self._set_not_honoured("setPartialsType", "partials_type", dtype)

    def autocastEnabled(self, enabled: bool) -> _PrecisionOptions:
        return self._set_not_honoured("autocastEnabled", "autocast_enabled",
                                      _bool("Precision.autocastEnabled", enabled))


class _TensorLocationOptions(_Settings):
    """``opts.TensorLocations``: where activations, weights... live; stored, not honoured."""

    _NAME = "TensorLocations"
    activation_location = _Value(None, "Settings for activations.")
    weight_location = _Value(None, "Settings for weights.")
    optimizer_location = _Value(None, "Settings for optimizer state.")
    accumulator_location = _Value(None, "Settings for gradient accumulators.")

    def _location(self, method: str, key: str, settings: Any) -> _TensorLocationOptions:
        if not isinstance(settings, TensorLocationSettings):
            raise Error(f"TensorLocations.{method} takes a poptorch.TensorLocationSettings, "
                        f"got {_show(settings)}")
        return self._set_not_honoured(method, key, settings)

    def setActivationLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        return self._location("setActivationLocation", "activation_location", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        return self._location("setWeightLocation", "weight_location", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        return self._location("setOptimizerLocation", "optimizer_location", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        return self._location("setAccumulatorLocation", "accumulator_location", location)


class _JitOptions(_Settings):
    """``opts.Jit``: how the model is captured."""

    _NAME = "Jit"
    trace_model = _Value(False, "Capture with torch.jit.trace instead of the dispatcher.")

    def traceModel(self, trace_model: bool) -> _JitOptions:
        return self._set_not_honoured("traceModel", "trace_model",
                                      _bool("Jit.traceModel", trace_model))


class _DistributedOptions(_Settings):
    """``opts.Distributed``: this process among several (defaults from ``OMPI_COMM_WORLD_*``)."""

    _NAME = "Distributed"
    process_id = _Value(0, "The index of this process.")
    num_processes = _Value(1, "The number of processes.")

    def __init__(self) -> None:
        super().__init__()
        rank, size = os.environ.get("OMPI_COMM_WORLD_RANK"), os.environ.get("OMPI_COMM_WORLD_SIZE")
        if rank is not None or size is not None:
            try:
                ids = int(rank or 0), int(size or 1)
            except ValueError:
                raise Error(f"OMPI_COMM_WORLD_RANK={rank!r} and OMPI_COMM_WORLD_SIZE={size!r} "
                            "must be integers") from None
            self.configureProcessId(*ids)

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        num = _int("Distributed.configureProcessId", num_processes, 1, "the number of processes")
        pid = _int("Distributed.configureProcessId", process_id, 0, "the process id")
        if pid >= num:
            raise Error(f"Distributed.configureProcessId({pid}, {num}): the process id must be "
                        f"less than the number of processes ({num})")
        _log_if_not_honoured("Distributed.configureProcessId", (pid, num))
        self._set("num_processes", num)
        return self._set("process_id", pid)


class Options(_Settings):
    """How a model is compiled and run: ``poptorch.Options`` (see the module doc)."""

    _GROUPS: ClassVar[Tuple[str, ...]] = ("Training", "Precision", "TensorLocations", "Jit",
                                          "Distributed")

    device_iterations = _Value(1, "Batches the device runs per call of the model.")
    replication_factor = _Value(1, "Replicas of the model running in data parallel.")
    output_mode = _Value(OutputMode.Default, "Which results are returned to the host.")
    output_return_period = _Value(1, "N of OutputMode.EveryN (1 for the other modes).")
    random_seed = _Value[Optional[int]](None, "Seed of the device's random generator.")
    use_ipu_model = _Value(True, "Run on the IPU Model (always, on this emulator).")
    auto_round_num_ipus = _Value(False, "Round the number of IPUs up to a power of 2.")
    executable_cache_dir = _Value[Optional[str]](None, "Where compiled executables are cached.")
    execution_strategy = _Value[Any](None, "The execution strategy object (None: default).")
    ipu_id = _Value[Optional[int]](None, "The id of the IPU to run on.")
    connection_type = _Value(ConnectionType.Always, "When to attach to the device.")
    sync_pattern = _Value(SyncPattern.Full, "How IPUs synchronise with the host.")
    synthetic_data = _Value(False, "Generate inputs on the device.")
    profile_dir = _Value[Optional[str]](None, "Where profiling reports go (None: off).")
    log_dir = _Value[Optional[str]](None, "Where report files go.")
    log_cycle_count = _Value(False, "Log IPU cycles per run.")
    broadcast_buffers = _Value(True, "Broadcast buffers to replicas every run.")
    anchored_tensors = _Value[Tuple[Tuple[Any, ...], ...]](
        (), "(name, tensor name, output mode, period) of each anchored tensor.")

    def __init__(self) -> None:
        super().__init__()
        self.Training = _TrainingOptions()
        self.Precision = _PrecisionOptions()
        self.TensorLocations = _TensorLocationOptions()
        self.Jit = _JitOptions()
        self.Distributed = _DistributedOptions()
        cache_dir = os.environ.get("POPTORCH_CACHE_DIR")
        if cache_dir:
            self.enableExecutableCaching(cache_dir)

    # -- honoured options
    def deviceIterations(self, device_iterations: int) -> Options:
        return self._set("device_iterations", _int(
            "deviceIterations", device_iterations, 1, "the number of batches per call"))

    def replicationFactor(self, replication_factor: int) -> Options:
        return self._set("replication_factor", _int(
            "replicationFactor", replication_factor, 1, "the number of replicas"))

    def outputMode(self, output_mode: OutputMode,
                   output_return_period: Optional[int] = None) -> Options:
        mode = _enum("outputMode", OutputMode, output_mode)
        if mode == OutputMode.EveryN:
            if output_return_period is None:
                raise Error("outputMode(OutputMode.EveryN) needs output_return_period: pass "
                            "outputMode(OutputMode.EveryN, N) with N >= 1")
            period = _int("outputMode", output_return_period, 1, "output_return_period")
        elif output_return_period is not None:
            raise Error(f"outputMode({_show(mode)}) takes no output_return_period (got "
                        f"{output_return_period!r}): it is only used with OutputMode.EveryN")
        else:
            period = 1
        self._set("output_mode", mode)
        return self._set("output_return_period", period)

    def randomSeed(self, random_seed: int) -> Options:
        seed = _int("randomSeed", random_seed, 0, "the seed")
        if seed >= 2**64:
            raise Error(f"randomSeed({seed}) is too large: the seed must be below 2**64")
        return self._set("random_seed", seed)

    def enableExecutableCaching(self, path: Optional[Union[str, os.PathLike[str]]]) -> Options:
        """PopTorch caches executables in ``path``; here the in-memory cache
        always serves, and the path is stored and logged (see _NOT_HONOURED)."""
        return self._set_not_honoured(
            "enableExecutableCaching", "executable_cache_dir",
            None if path is None else _str("enableExecutableCaching", path))

    # -- options the emulator stores but does not act on (see _NOT_HONOURED)
    def useIpuModel(self, use_model: bool) -> Options:
        return self._set_not_honoured("useIpuModel", "use_ipu_model",
                                      _bool("useIpuModel", use_model))

    def autoRoundNumIPUs(self, auto_round: bool) -> Options:
        return self._set_not_honoured("autoRoundNumIPUs", "auto_round_num_ipus",
                                      _bool("autoRoundNumIPUs", auto_round))

    def setExecutionStrategy(self, strategy: Any) -> Options:
        return self._set_not_honoured("setExecutionStrategy", "execution_strategy", strategy)

    def ipuId(self, ipu_id: int) -> Options:
        return self._set_not_honoured("ipuId", "ipu_id", _int("ipuId", ipu_id, 0, "the IPU id"))

    def connectionType(self, connection_type: ConnectionType) -> Options:
        return self._set_not_honoured("connectionType", "connection_type", _enum(
            "connectionType", ConnectionType, connection_type))

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:
        return self._set_not_honoured("syncPattern", "sync_pattern",
                                      _enum("syncPattern", SyncPattern, sync_pattern))

    def enableSyntheticData(self, enabled: bool) -> Options:
        return self._set_not_honoured("enableSyntheticData", "synthetic_data",
                                      _bool("enableSyntheticData", enabled))

    def enableProfiling(self, profile_dir: Union[str, os.PathLike[str]] = "profile") -> Options:
        return self._set_not_honoured("enableProfiling", "profile_dir",
                                      _str("enableProfiling", profile_dir))

    def logDir(self, log_dir: Union[str, os.PathLike[str]]) -> Options:
        return self._set_not_honoured("logDir", "log_dir", _str("logDir", log_dir))

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        return self._set_not_honoured("logCycleCount", "log_cycle_count",
                                      _bool("logCycleCount", log_cycle_count))

    def broadcastBuffers(self, broadcast_buffers: bool) -> Options:
        return self._set_not_honoured("broadcastBuffers", "broadcast_buffers",
                                      _bool("broadcastBuffers", broadcast_buffers))

    def anchorTensor(self, short_name: str, long_name: str,
                     output_mode: Optional[OutputMode] = None,
                     output_return_period: Optional[int] = None) -> Options:
        entry = (_str("anchorTensor", short_name), _str("anchorTensor", long_name),
                 None if output_mode is None else _enum("anchorTensor", OutputMode, output_mode),
                 output_return_period)
        _log_if_not_honoured("anchorTensor", entry)
        return self._set("anchored_tensors", self.anchored_tensors + (entry,))

    # -- whole object
    def _items(self) -> Iterator[Tuple[str, Any, Any]]:
        yield from super()._items()
        for group in self._GROUPS:
            for name, value, default in getattr(self, group)._items():
                yield f"{group}.{name}", value, default

    def loadFromFile(self, filepath: Union[str, os.PathLike[str]]) -> Options:
        """Applies each line of a config file: ``deviceIterations(4)``,
        ``Training.gradientAccumulation(2)``, ``outputMode(OutputMode.All)``...

        Lines are parsed, never evaluated: a line must be a call of one setter
        with literal arguments or enum members; empty lines and ``#`` comments
        are skipped. A bad line raises :class:`Error` naming the file and line.
        """
        path = os.fspath(filepath)
        with open(path, encoding="utf-8") as config:
            lines = config.read().splitlines()
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if line and not line.startswith("#"):
                try:
                    _apply_config_line(self, line)
                except Error as error:
                    raise Error(f"{path}:{number}: {line!r}: {error}") from None
        return self


# --- config files -----------------------------------------------------------

def _dotted(node: ast.expr) -> Optional[List[str]]:
    """``a.b.c`` -> ["a", "b", "c"]; None if the node is not a dotted name."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else head + [node.attr]
    return None


def _config_value(node: ast.expr) -> Any:
    """A literal, an enum member of this module or a torch dtype."""
    name = _dotted(node)
    if name is None:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, RecursionError):
            raise Error(f"{ast.unparse(node)!r} is not a literal") from None
    if name[:2] == ["poptorch", "options"]:
        name = name[2:]
    elif name[:1] == ["poptorch"]:
        name = name[1:]
    enum_class = _CONFIG_ENUMS.get(name[0]) if len(name) == 2 else None
    if enum_class is not None and name[1] in enum_class.__members__:
        return enum_class[name[1]]
    if len(name) == 2 and name[0] == "torch" and isinstance(getattr(torch, name[1], None),
                                                            torch.dtype):
        return getattr(torch, name[1])
    raise Error(f"{'.'.join(name)!r} is not a literal or a member of "
                f"{', '.join(_CONFIG_ENUMS)}")


def _apply_config_line(options: Options, line: str) -> None:
    try:
        tree = ast.parse(line, mode="eval").body
    except SyntaxError as error:
        raise Error(f"not a Python expression ({error.msg})") from None
    path = _dotted(tree.func) if isinstance(tree, ast.Call) else None
    if path is None or not (len(path) == 1 or (len(path) == 2 and path[0] in Options._GROUPS)):
        raise Error("expected one option setter call such as deviceIterations(4) or "
                    "Training.gradientAccumulation(2)")
    target: _Settings = getattr(options, path[0]) if len(path) == 2 else options
    method = inspect.getattr_static(type(target), path[-1], None)
    if (not inspect.isfunction(method) or path[-1].startswith("_")
            or path[-1] in ("loadFromFile", "toDict")):
        raise Error(f"{'.'.join(path)} is not an option setter")
    if any(kw.arg is None for kw in tree.keywords):
        raise Error("** arguments are not supported")
    args = [_config_value(arg) for arg in tree.args]
    kwargs = {kw.arg: _config_value(kw.value) for kw in tree.keywords if kw.arg is not None}
    try:
        inspect.signature(method).bind(target, *args, **kwargs)
    except TypeError as error:
        raise Error(f"wrong arguments for {'.'.join(path)}: {error}") from None
    method(target, *args, **kwargs)
