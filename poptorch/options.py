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
is no hardware) and ``Jit.trace_model`` (False: capture is at the dispatcher).
"""
from __future__ import annotations

import copy
import enum
import inspect
import os
from typing import (Any, Callable, ClassVar, Dict, Generic, Iterator, List, Optional, Tuple,
                    TypeVar, Union, overload)

import torch

from . import autocasting
from ._options_config import ConfigFileError, load_config_file, load_default_options
from ._errors import Error
from ._execution_strategy import PipelinedExecution, _ExecutionStrategy
from ._logging import logger, set_max_repeat_logs
from .enums import (CommGroupType, ConnectionType, HalfFloatCastingBehavior,
                    MeanReductionStrategy, OutputMode, ReductionType, SyncPattern)

__all__ = ["ConfigFileError", "Options", "TensorLocationSettings"]


# Path fragments of the frames skipped when naming where an op came from.
_DEFAULT_LOCATION_EXCLUDES = ("/torch/", "/poptorch/")


def _never(_: Any) -> bool:
    return False


def _only(*honoured: Any) -> Callable[[Any], bool]:
    return lambda value: value in honoured


# Every option the emulated IPU Model does not act on: option -> (does the
# emulator behave as asked for this value?, why not otherwise).
_NOT_HONOURED: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "useIpuModel": (_only(True), "there is no IPU hardware, the IPU Model is always used"),
    "useIpuId": (_never, "there is a single emulated IPU"),
    "connectionType": (_only(ConnectionType.Always, ConnectionType.Never),
                       "the emulated IPU is always attached"),
    "syncPattern": (_only(SyncPattern.Full), "there are no IPUs to synchronise"),
    "enableSyntheticData": (_only(False), "inputs always come from the host"),
    "logDir": (_never, "PopTorch writes no log files (profiles go where enableProfiling says)"),
    "sourceLocationExcludes": (
        lambda excludes: tuple(excludes) == _DEFAULT_LOCATION_EXCLUDES,
        "errors name the first frame outside torch and poptorch"),
    "enableStableNorm": (_only(True), "the host's norm kernels are the stable ones"),
    "Training.setConvolutionDithering": (_only(False), "the emulator has no tiles"),
    "Precision.enableStochasticRounding": (_only(False), "rounding is to nearest"),
    "Precision.enableFloatingPointExceptions": (
        _only(False), "the host computes IEEE 754 results (inf, NaN) without raising"),
    "Precision.setPartialsType": (
        _only(torch.float32), "float16 matmuls and convolutions accumulate their partials in "
        "float32 on the host, so results are at least as precise as with float16 partials"),
    "TensorLocations.setActivationLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setWeightLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setOptimizerLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.setAccumulatorLocation": (_never, "all tensors live in host memory"),
    "TensorLocations.numIOTiles": (_never, "the emulator has no tiles"),
    "Jit.traceModel": (_only(False), "models are captured at the dispatcher, not traced"),
    "_Popart.set": (_never, "there is no PopART: graphs are compiled by the emulator's passes"),
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

    # Set on the options a model or DataLoader uses (Options._freeze): they read
    # them when they run, so a later change would not be what they compiled for.
    _frozen = False

    def _set(self: S, key: str, value: Any) -> S:
        if self._frozen:
            name = f"{self._NAME}.{key}" if self._NAME else key
            raise Error(f"these options can no longer change ({name}): a model or a "
                        "DataLoader uses them, as in PopTorch; change a copy "
                        "(opts.clone() or copy.deepcopy(opts)) and wrap the model with it")
        self._values[key] = value
        return self

    def __getstate__(self) -> Dict[str, Any]:
        # Copies (copy.deepcopy, clone) and pickles are not frozen.
        state = dict(self.__dict__)
        state.pop("_frozen", None)
        return state

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
    """Where a class of tensors lives on a real IPU system (``opts.TensorLocations``).
    Stored and validated; the emulator keeps every tensor in host memory."""

    on_chip = _Value(True, "Keep the tensors in on-chip memory.")
    replicated_tensor_sharding = _Value(False, "Shard the tensors across replicas.")
    min_elements_for_off_chip = _Value(0, "Smallest tensor that may live off-chip.")
    min_elements_for_replicated_tensor_sharding = _Value(
        0, "Smallest tensor that may be sharded across replicas.")
    io_tiles_to_load = _Value(False, "Load the tensors through the I/O tiles.")
    io_tiles_to_store = _Value(False, "Store the tensors through the I/O tiles.")

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        """Keep the tensors in on-chip memory (True) or in streaming memory (False)."""
        return self._set("on_chip", _bool("useOnChipStorage", use))

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        """Shard the tensors (weights, optimiser state) across replicas."""
        return self._set("replicated_tensor_sharding", _bool("useReplicatedTensorSharding", use))

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        """Tensors with fewer elements stay on chip."""
        return self._set("min_elements_for_off_chip", _int(
            "minElementsForOffChip", min_elements, 0, "the number of elements"))

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        """Tensors with fewer elements are not sharded across replicas."""
        return self._set("min_elements_for_replicated_tensor_sharding", _int(
            "minElementsForReplicatedTensorSharding", min_elements, 0, "the number of elements"))

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        """Load the tensors through the I/O tiles."""
        return self._set("io_tiles_to_load", _bool("useIOTilesToLoad", use))

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        """Store the tensors (replicated tensor sharded ones) through the I/O tiles."""
        return self._set("io_tiles_to_store", _bool("useIOTilesToStore", use))


class _TrainingOptions(_Settings):
    """``opts.Training``: gradient accumulation and reduction."""

    _NAME = "Training"
    gradient_accumulation = _Value(1, "Micro-batches whose gradients are accumulated "
                                      "before each weight update.")
    accumulation_and_replication_reduction_type = _Value(
        ReductionType.Mean, "How accumulated and replicated gradients are reduced.")
    mean_reduction_strategy = _Value(
        MeanReductionStrategy.Post, "When a mean reduction divides by the count.")
    automatic_loss_scaling = _Value(False, "Whether the loss scaling factor adapts itself.")
    convolution_dithering = _Value(False, "Lay convolutions out from different tiles.")

    @property
    def meanAccumulationAndReplicationReductionStrategy(self) -> MeanReductionStrategy:
        """PopTorch's name of ``mean_reduction_strategy``."""
        return self.mean_reduction_strategy

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Micro-batches whose gradients are accumulated before each weight
        update (one micro-batch is ``batch_size`` samples of the DataLoader)."""
        return self._set("gradient_accumulation", _int(
            "Training.gradientAccumulation", gradient_accumulation, 1,
            "the number of micro-batches accumulated per weight update"))

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType
                                                ) -> _TrainingOptions:
        """How the gradients of the accumulated micro-batches and of the replicas
        are combined: ``ReductionType.Mean`` (default) or ``ReductionType.Sum``."""
        if reduction_type is ReductionType.NoReduction:
            raise Error("Training.accumulationAndReplicationReductionType takes "
                        "ReductionType.Mean or ReductionType.Sum, got ReductionType.NoReduction")
        return self._set("accumulation_and_replication_reduction_type", _enum(
            "Training.accumulationAndReplicationReductionType", ReductionType, reduction_type))

    def setMeanAccumulationAndReplicationReductionStrategy(
            self, mean_reduction_strategy: MeanReductionStrategy) -> _TrainingOptions:
        """When a ``Mean`` reduction divides by the number of micro-batches:
        ``Running`` keeps the accumulator as the running mean, ``Post`` divides
        once after accumulating, ``PostAndLoss`` divides by the replicas before
        the backward pass. A model whose optimiser has float16 accumulators
        (``accum_type``) uses ``Running``, as in PopTorch."""
        return self._set(
            "mean_reduction_strategy",
            _enum("Training.setMeanAccumulationAndReplicationReductionStrategy",
                  MeanReductionStrategy, mean_reduction_strategy))

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        """Let the loss scaling factor adapt itself during training, starting from
        the optimiser's ``loss_scaling`` (the rule: ``poptorch._loss_scaling``)."""
        return self._set("automatic_loss_scaling",
                         _bool("Training.setAutomaticLossScaling", enabled))

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        """Lay out convolutions with different parameters from different tiles."""
        return self._set_not_honoured("setConvolutionDithering", "convolution_dithering",
                                      _bool("Training.setConvolutionDithering", enabled))


class _PrecisionOptions(_Settings):
    """``opts.Precision``: half precision and floating point behaviour."""

    _NAME = "Precision"
    half_float_casting = _Value(HalfFloatCastingBehavior.Default,
                                "What mixed float16/float32 operations compute in.")
    running_statistics_always_float = _Value(False, "Keep norm running statistics in float32.")
    autocast_policy = _Value(autocasting.default, "The automatic casting policy.")
    stochastic_rounding = _Value(False, "Round stochastically.")
    floating_point_exceptions = _Value(False, "Raise on invalid floating point operations.")
    partials_type = _Value(torch.float32, "The dtype of matmul and convolution partials.")
    autocast_enabled = _Value(True, "Whether autocast regions and layers cast automatically.")

    def halfFloatCasting(self, half_float_casting: HalfFloatCastingBehavior
                         ) -> _PrecisionOptions:
        """What an op mixing float16 and float32 inputs computes in:
        ``FloatDowncastToHalf`` (and ``Default``, PopTorch's rule) casts its
        inputs to float16, ``HalfUpcastToFloat`` to float32 (PyTorch's rule).
        In-place ops keep their output's dtype."""
        return self._set("half_float_casting", _enum(
            "Precision.halfFloatCasting", HalfFloatCastingBehavior, half_float_casting))

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        """Keep the running mean and variance of norm layers in float32 even in a
        float16 model (the host model's buffers become float32 too: they are the
        device's). The layers then normalise in float32 and return float16."""
        return self._set("running_statistics_always_float",
                         _bool("Precision.runningStatisticsAlwaysFloat", value))

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        """Round float16 results stochastically on the IPU."""
        return self._set_not_honoured("enableStochasticRounding", "stochastic_rounding",
                                      _bool("Precision.enableStochasticRounding", enabled))

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        """Raise an error when the IPU meets an invalid operation (inf - inf,
        division by zero, 0 x inf, a comparison with NaN...)."""
        return self._set_not_honoured("enableFloatingPointExceptions",
                                      "floating_point_exceptions",
                                      _bool("Precision.enableFloatingPointExceptions", enabled))

    def setPartialsType(self, dtype: torch.dtype) -> _PrecisionOptions:
        """The dtype of the partial results of matmuls and convolutions
        (``torch.float32`` or ``torch.float16``)."""
        if dtype not in (torch.float32, torch.float16):
            raise Error(f"Precision.setPartialsType takes torch.float32 or torch.float16, "
                        f"got {_show(dtype)}")
        return self._set_not_honoured("setPartialsType", "partials_type", dtype)

    def autocastEnabled(self, autocast_enabled: bool) -> _PrecisionOptions:
        """Turn automatic casting (``model.autocast()``, ``poptorch.autocast``
        regions) on (default) or off for the whole model."""
        return self._set("autocast_enabled", _bool("Precision.autocastEnabled", autocast_enabled))

    def autocastPolicy(self, autocast_policy: autocasting.Policy) -> _PrecisionOptions:
        """The automatic casting policy (default: ``poptorch.autocasting.default``)."""
        if not isinstance(autocast_policy, autocasting.Policy):
            raise Error("Precision.autocastPolicy takes a poptorch.autocasting.Policy, got "
                        f"{type(autocast_policy).__name__}")
        return self._set("autocast_policy", autocast_policy)


class _TensorLocationOptions(_Settings):
    """``opts.TensorLocations``: where activations, weights... live. Stored and
    validated; the emulator keeps every tensor in host memory."""

    _NAME = "TensorLocations"
    activation_location = _Value(None, "Settings for activations.")
    weight_location = _Value(None, "Settings for weights.")
    optimizer_location = _Value(None, "Settings for optimizer state.")
    accumulator_location = _Value(None, "Settings for gradient accumulators.")
    num_io_tiles = _Value(0, "Tiles of each IPU given to I/O rather than compute.")

    def _location(self, method: str, key: str, settings: Any) -> _TensorLocationOptions:
        if not isinstance(settings, TensorLocationSettings):
            raise Error(f"TensorLocations.{method} takes a poptorch.TensorLocationSettings, "
                        f"got {_show(settings)}")
        return self._set_not_honoured(method, key, settings)

    def setActivationLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where activations live."""
        return self._location("setActivationLocation", "activation_location", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where weights live."""
        return self._location("setWeightLocation", "weight_location", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where the optimiser state lives."""
        return self._location("setOptimizerLocation", "optimizer_location", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Where the gradient accumulators live."""
        return self._location("setAccumulatorLocation", "accumulator_location", location)

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        """Tiles of each IPU given to I/O: an even number from 32 to 192."""
        tiles = _int("TensorLocations.numIOTiles", num_tiles, 32, "the number of I/O tiles")
        if tiles > 192 or tiles % 2:
            raise Error(f"TensorLocations.numIOTiles({tiles}) is invalid: the number of I/O "
                        "tiles must be an even number from 32 to 192")
        return self._set_not_honoured("numIOTiles", "num_io_tiles", tiles)


class _JitOptions(_Settings):
    """``opts.Jit``: how the model is captured."""

    _NAME = "Jit"
    trace_model = _Value(False, "Capture with torch.jit.trace instead of the dispatcher.")

    def traceModel(self, trace_model: bool) -> _JitOptions:
        """Capture with ``torch.jit.trace`` (True) or at PyTorch's dispatcher (False)."""
        return self._set_not_honoured("traceModel", "trace_model",
                                      _bool("Jit.traceModel", trace_model))


class _DistributedOptions(_Settings):
    """``opts.Distributed``: this process among several, each with its own
    ``replicationFactor`` replicas (PopDist's model). The defaults come from
    the environment: OpenMPI's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``,
    else torchrun's ``RANK``/``WORLD_SIZE``."""

    _NAME = "Distributed"
    process_id = _Value(0, "The index of this process.")
    num_processes = _Value(1, "The number of processes.")
    timeout = _Value(1800.0, "Seconds a collective waits for the other processes.")

    def __init__(self) -> None:
        super().__init__()
        for size, rank in (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
                           ("WORLD_SIZE", "RANK")):
            if size in os.environ or rank in os.environ:
                self.setEnvVarNames(size, rank)
                break

    @property
    def distributed_process_id(self) -> int:
        """PopTorch's name of ``process_id``."""
        return self.process_id

    @property
    def num_distributed_processes(self) -> int:
        """PopTorch's name of ``num_processes``."""
        return self.num_processes

    def configureProcessId(self, process_id: int, num_processes: int) -> _DistributedOptions:
        """This process's index among ``num_processes``: the DataLoader gives it
        its share of the dataset, and a trainingModel reduces its gradients with
        those of the replicas of every process."""
        num = _int("Distributed.configureProcessId", num_processes, 1, "the number of processes")
        pid = _int("Distributed.configureProcessId", process_id, 0, "the process id")
        if pid >= num:
            raise Error(f"Distributed.configureProcessId({pid}, {num}): the process id must be "
                        f"less than the number of processes ({num})")
        self._set("num_processes", num)
        return self._set("process_id", pid)

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> _DistributedOptions:
        """Reads the number of processes and this process's id from these
        environment variables (1 and 0 when they are not set)."""
        values = {}
        for var, default in ((var_num_processes, "1"), (var_process_id, "0")):
            text = os.environ.get(_str("Distributed.setEnvVarNames", var), default)
            try:
                values[var] = int(text)
            except ValueError:
                raise Error(f"the environment variable {var}={text!r} must be an "
                            "integer") from None
        return self.configureProcessId(values[var_process_id], values[var_num_processes])

    def disable(self) -> _DistributedOptions:
        """Runs as a single process, whatever the environment says."""
        return self.configureProcessId(0, 1)

    def setTimeout(self, seconds: float) -> _DistributedOptions:
        """How long a collective (the weight broadcast, each gradient reduction)
        waits for the other processes before failing with an error, when
        poptorch creates the process group (otherwise the group's own timeout
        applies). A process that dies is noticed sooner: its connections close."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise Error(f"Distributed.setTimeout takes a positive number of seconds, "
                        f"got {_show(seconds)}")
        return self._set("timeout", float(seconds))

    def processId(self) -> int:
        """The index of this process."""
        return self.process_id

    def numProcesses(self) -> int:
        """The number of processes."""
        return self.num_processes


class _PopartOptions(_Settings):
    """``opts._Popart``: PopART's session options, for PopTorch's advanced
    users. There is no PopART here: options are validated, stored and logged."""

    _NAME = "_Popart"
    options = _Value[Dict[str, Any]]({}, "PopART option name -> value.")

    def set(self, key: str, value: Any) -> _PopartOptions:
        """Sets the PopART session option ``key`` to ``value``."""
        _log_if_not_honoured("_Popart.set", (_str("_Popart.set", key), value))
        return self._set("options", {**self.options, key: value})

    def setEngineOptions(self, engine_options: Dict[str, str]) -> _PopartOptions:
        """Sets Poplar's engine options (``engineOptions``)."""
        return self.set("engineOptions", dict(engine_options))

    def setPatterns(self, patterns: Dict[str, bool], level: int = 2) -> _PopartOptions:
        """Enables or disables PopART's graph patterns (``patterns``), from the
        patterns of ``level``."""
        self.set("patterns_level", _int("_Popart.setPatterns", level, 0, "the patterns level"))
        return self.set("patterns", dict(patterns))


class Options(_Settings):
    """How a model is compiled and run: ``poptorch.Options`` (see the module doc)."""

    _GROUPS: ClassVar[Tuple[str, ...]] = ("Training", "Precision", "TensorLocations", "Jit",
                                          "Distributed", "_Popart")

    device_iterations = _Value(1, "Batches the device runs per call of the model.")
    replication_factor = _Value(1, "Replicas of the model running in data parallel.")
    input_group_size = _Value(1, "Replicas of an input group, which share their inputs.")
    input_group_type = _Value(CommGroupType.Consecutive, "How replicas form input groups.")
    output_mode = _Value(OutputMode.Default, "Which results are returned to the host.")
    output_return_period = _Value(1, "N of OutputMode.EveryN (1 for the other modes).")
    random_seed = _Value[Optional[int]](None, "Seed of the device's random generator.")
    use_ipu_model = _Value(True, "Run on the IPU Model (always, on this emulator).")
    auto_round_num_ipus = _Value(False, "Round the number of IPUs up to a power of 2.")
    executable_cache_dir = _Value[Optional[str]](None, "Where compiled executables are cached.")
    execution_strategy = _Value[Any](None, "The execution strategy object (None: default).")
    ipu_id = _Value[Optional[int]](None, "The id of the IPU to run on.")
    ipu_version = _Value[Optional[int]](None, "The IPU version of an offline target.")
    connection_type = _Value(ConnectionType.Always, "When to attach to the device.")
    sync_pattern = _Value(SyncPattern.Full, "How IPUs synchronise with the host.")
    synthetic_data = _Value(False, "Generate inputs on the device.")
    profile_dir = _Value[Optional[str]](None, "Where profiling reports go (None: off).")
    log_dir = _Value[Optional[str]](None, "Where report files go.")
    log_cycle_count = _Value(False, "Log IPU cycles per run.")
    max_repeat_logs = _Value[Optional[int]](None, "Times each message may be logged.")
    model_name = _Value[Optional[str]](None, "The model's name in reports.")
    broadcast_buffers = _Value(True, "Broadcast buffers to replicas every run.")
    stable_norm = _Value(False, "Use the stable (slower) form of norm operators.")
    available_memory_proportion = _Value[Dict[int, float]](
        {}, "IPU index -> proportion of tile memory for temporaries.")
    anchored_tensors = _Value[Tuple[Tuple[Any, ...], ...]](
        (), "(name, tensor name, output mode or None, period) of each anchored tensor.")
    updatable_named_buffers = _Value[Tuple[str, ...]](
        (), "Buffers that copyNamedBuffersToDevice() copies.")
    relax_optimizer_attributes_checks = _Value(
        False, "Log ignored optimiser attributes at DEBUG instead of WARN.")
    show_compilation_progress_bar = _Value(True, "Show a progress bar while compiling.")
    source_location_excludes = _Value[Tuple[str, ...]](
        _DEFAULT_LOCATION_EXCLUDES, "Frames skipped when naming where an op came from.")
    module_namescope = _Value(True, "Name ops after the modules that run them.")

    def __init__(self) -> None:
        super().__init__()
        self.Training = _TrainingOptions()
        self.Precision = _PrecisionOptions()
        self.TensorLocations = _TensorLocationOptions()
        self.Jit = _JitOptions()
        self.Distributed = _DistributedOptions()
        self._Popart = _PopartOptions()
        cache_dir = os.environ.get("POPTORCH_CACHE_DIR")
        if cache_dir:
            self.enableExecutableCaching(cache_dir)
        load_default_options(self)  # POPTORCH_DEFAULT_OPTIONS, as in PopTorch

    # -- batching and outputs
    def deviceIterations(self, device_iterations: int) -> Options:
        """Batches the device runs per call of the model (each call takes
        ``device_iterations`` times more data)."""
        return self._set("device_iterations", _int(
            "deviceIterations", device_iterations, 1, "the number of batches per call"))

    def replicationFactor(self, replication_factor: int,
                          input_replication_factor: Optional[int] = None) -> Options:
        """Replicas of the model running in data parallel. The emulator runs
        them one after another on one set of weights (one per group for
        replica-grouped weights). ``input_replication_factor`` (PopTorch's
        earlier form of :meth:`inputReplicaGrouping`) splits the inputs that
        many ways: consecutive groups of ``replication_factor /
        input_replication_factor`` replicas share their inputs."""
        replicas = _int("replicationFactor", replication_factor, 1, "the number of replicas")
        if input_replication_factor is not None:
            ways = _int("replicationFactor", input_replication_factor, 1,
                        "the input replication factor")
            if replicas % ways:
                raise Error(f"replicationFactor({replicas}, {ways}): the input replication "
                            f"factor must divide the replication factor")
            self.inputReplicaGrouping(replicas // ways, CommGroupType.Consecutive)
        return self._set("replication_factor", replicas)

    def inputReplicaGrouping(self, input_group_size: int,
                             input_group_type: CommGroupType = CommGroupType.Consecutive
                             ) -> Options:
        """Replicas in one input group receive the same input: a call takes
        ``replicationFactor / input_group_size`` micro-batches per accumulation
        step instead of ``replicationFactor``. ``input_group_size`` must divide
        the replication factor; ``input_group_type`` is ``Consecutive`` (groups
        of neighbouring replicas) or ``Orthogonal`` (see
        :class:`~poptorch.CommGroupType`)."""
        size = _int("inputReplicaGrouping", input_group_size, 1, "the input group size")
        kind = _enum("inputReplicaGrouping", CommGroupType, input_group_type)
        if kind not in (CommGroupType.Consecutive, CommGroupType.Orthogonal):
            raise Error(f"inputReplicaGrouping takes CommGroupType.Consecutive or "
                        f"CommGroupType.Orthogonal, got {_show(kind)}")
        self._set("input_group_type", kind)
        return self._set("input_group_size", size)

    @property
    def input_group_count(self) -> int:
        """Replicas with inputs of their own: replication factor / input group size."""
        size, replicas = self.input_group_size, self.replication_factor
        if replicas % size:
            raise Error(f"inputReplicaGrouping({size}) needs a replicationFactor that is a "
                        f"multiple of {size}, got replicationFactor({replicas})")
        return replicas // size

    def outputMode(self, output_mode: OutputMode,
                   output_return_period: Optional[int] = None) -> Options:
        """Which results of a call's device iterations are returned:
        ``All``, ``Final``, ``EveryN`` (every ``output_return_period``-th),
        ``Sum``, or ``Default`` (``Final`` for training, ``All`` for inference).
        A period given with another mode than ``EveryN`` is ignored (logged)."""
        mode = _enum("outputMode", OutputMode, output_mode)
        if mode == OutputMode.EveryN:
            if output_return_period is None:
                raise Error("outputMode(OutputMode.EveryN) needs output_return_period: pass "
                            "outputMode(OutputMode.EveryN, N) with N >= 1")
            period = _int("outputMode", output_return_period, 1, "output_return_period")
        else:
            if output_return_period is not None:
                logger.info("outputMode(%s, %r): the output return period is only used "
                            "with OutputMode.EveryN and is ignored", _show(mode),
                            output_return_period)
            period = 1
        self._set("output_mode", mode)
        return self._set("output_return_period", period)

    def defaultOutputMode(self) -> bool:
        """True while ``outputMode`` is ``OutputMode.Default``."""
        return self.output_mode == OutputMode.Default

    def anchorTensor(self, short_name: str, long_name: str,
                     output_mode: Optional[OutputMode] = None,
                     output_return_period: Optional[int] = None) -> Options:
        """Returns the tensor ``long_name`` (one of the wrapped model's
        ``getTensorNames()``) from every call, read with
        ``getAnchoredTensor(short_name)``. ``output_mode`` and
        ``output_return_period`` work as in :meth:`outputMode`; by default the
        model's output mode applies. Anchoring a name again replaces it."""
        short = _str("anchorTensor", short_name)
        entry = (short, _str("anchorTensor", long_name),
                 None if output_mode is None else _enum("anchorTensor", OutputMode, output_mode),
                 None)
        if output_mode == OutputMode.EveryN:
            if output_return_period is None:
                raise Error("anchorTensor with OutputMode.EveryN needs output_return_period")
            entry = entry[:3] + (_int("anchorTensor", output_return_period, 1,
                                      "output_return_period"),)
        kept = tuple(e for e in self.anchored_tensors if e[0] != short)
        return self._set("anchored_tensors", kept + (entry,))

    def randomSeed(self, random_seed: int) -> Options:
        """Seeds the device's random generator, and, as PopTorch does, the host's
        (``torch.manual_seed``)."""
        seed = _int("randomSeed", random_seed, 0, "the seed")
        if seed >= 2**64:
            raise Error(f"randomSeed({seed}) is too large: the seed must be below 2**64")
        torch.manual_seed(seed)
        return self._set("random_seed", seed)

    # -- buffers, optimiser, compilation
    def updatableNamedBuffers(self, buffers: List[str]) -> Options:
        """Names of the model's buffers that
        :meth:`~poptorch.PoplarExecutor.copyNamedBuffersToDevice` copies to the
        device (the others keep their device values)."""
        if isinstance(buffers, str) or not all(isinstance(b, str) and b for b in buffers):
            raise Error(f"updatableNamedBuffers takes a list of buffer names, got {buffers!r}")
        return self._set("updatable_named_buffers", tuple(buffers))

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> Options:
        """Log the optimiser attributes that the IPU's update ignores at DEBUG
        (True) instead of WARN (False, the default)."""
        return self._set("relax_optimizer_attributes_checks",
                         _bool("relaxOptimizerAttributesChecks", relax))

    def showCompilationProgressBar(self, show: bool = True) -> Options:
        """Show (default) or hide the progress bar of the first compilation."""
        return self._set("show_compilation_progress_bar",
                         _bool("showCompilationProgressBar", show))

    def enableExecutableCaching(self, path: Optional[Union[str, os.PathLike[str]]]) -> Options:
        """Caches the model's compiled executables in the directory ``path``
        (None: off), so that another process compiles nothing this one
        compiled. The default is ``POPTORCH_CACHE_DIR``. Old entries are never
        deleted: delete the directory when it grows too large."""
        return self._set("executable_cache_dir",
                         None if path is None else _str("enableExecutableCaching", path))

    def sourceLocationExcludes(self, excludes: List[str]) -> Options:
        """Replaces the path fragments of the frames skipped when PopTorch names
        the source line of an op."""
        if isinstance(excludes, str) or not all(isinstance(e, str) for e in excludes):
            raise Error(f"sourceLocationExcludes takes a list of strings, got {excludes!r}")
        _log_if_not_honoured("sourceLocationExcludes", list(excludes))
        return self._set("source_location_excludes", tuple(excludes))

    def appendToLocationExcludes(self, *excludes: str) -> Options:
        """Adds path fragments to :meth:`sourceLocationExcludes`."""
        return self.sourceLocationExcludes(list(self.source_location_excludes) + list(excludes))

    # -- what the IPU hardware does, which the emulator does not (see _NOT_HONOURED)
    def useIpuModel(self, use_model: bool) -> Options:
        """Run on the IPU Model (True) or on IPU hardware."""
        return self._set_not_honoured("useIpuModel", "use_ipu_model",
                                      _bool("useIpuModel", use_model))

    def useIpuId(self, ipu_id: int) -> Options:
        """The id (from ``gc-info``) of the IPU device to run on."""
        return self._set_not_honoured("useIpuId", "ipu_id",
                                      _int("useIpuId", ipu_id, 0, "the IPU id"))

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        """Compile for an IPU of ``ipu_version`` (1, 2 or 21) that is not
        attached (``ConnectionType.Never``): the model can be compiled and
        exported (``compileAndExport``) but not run; ``poptorch.load`` runs the
        exported file. The emulator's executables are the same for every
        version."""
        version = _int("useOfflineIpuTarget", ipu_version, 1, "the IPU version")
        if version not in (1, 2, 21):
            raise Error(f"useOfflineIpuTarget({version}) is invalid: the IPU version is 1, 2 "
                        "or 21")
        self._set("connection_type", ConnectionType.Never)
        return self._set("ipu_version", version)

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> Options:
        """Round the number of IPUs a model uses up to a power of 2 (the extra
        IPUs reserved but idle). Without it, a model annotated to use a number
        of IPUs that is not a power of 2 is an error."""
        return self._set("auto_round_num_ipus", _bool("autoRoundNumIPUs", auto_round_num_ipus))

    @property
    def _execution_strategy(self) -> Any:
        """PopTorch's name of the strategy a model runs with (its tests read
        it): the one set, else a default :class:`~poptorch.PipelinedExecution`."""
        return self.execution_strategy or PipelinedExecution()

    def setExecutionStrategy(self, strategy: Any) -> Options:
        """How a model annotated with blocks is split over IPUs:
        :class:`~poptorch.PipelinedExecution` (the default),
        :class:`~poptorch.ShardedExecution`, :class:`~poptorch.SerialPhasedExecution`
        or :class:`~poptorch.ParallelPhasedExecution`."""
        if not isinstance(strategy, _ExecutionStrategy):
            raise Error("setExecutionStrategy takes poptorch.PipelinedExecution, "
                        "ShardedExecution, SerialPhasedExecution or ParallelPhasedExecution, "
                        f"got {strategy!r}")
        return self._set("execution_strategy", strategy)

    def connectionType(self, connection_type: ConnectionType) -> Options:
        """When to attach to the IPU: ``Always``, ``OnDemand`` or ``Never`` (the
        model is compiled, never run: see :meth:`useOfflineIpuTarget`)."""
        return self._set_not_honoured("connectionType", "connection_type", _enum(
            "connectionType", ConnectionType, connection_type))

    def syncPattern(self, sync_pattern: SyncPattern) -> Options:
        """How IPUs synchronise with the host and each other."""
        return self._set_not_honoured("syncPattern", "sync_pattern",
                                      _enum("syncPattern", SyncPattern, sync_pattern))

    def setAvailableMemoryProportion(self, available_memory_proportion: Dict[str, float]
                                     ) -> Options:
        """Proportion of each IPU's tile memory that convolutions and matmuls
        may use for temporaries, as ``{"IPU0": 0.5}``: a value above 0 and at
        most 1 per IPU (PopLibs' default: 0.6). The memory model bounds the
        working memory of each matmul by it (see the user guide's "Memory per
        IPU"); convolutions are not modelled."""
        proportions = {}
        for key, value in dict(available_memory_proportion).items():
            if not isinstance(key, str) or not key.startswith("IPU") or not key[3:].isdigit():
                raise Error(f"setAvailableMemoryProportion takes keys such as 'IPU0', got {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 < value <= 1:
                raise Error(f"setAvailableMemoryProportion: {key} must map to a proportion "
                            f"above 0 and at most 1, got {value!r}")
            proportions[int(key[3:])] = float(value)
        return self._set("available_memory_proportion", proportions)

    def enableStableNorm(self, enabled: bool) -> Options:
        """Use the stable, slower form of norm operators."""
        return self._set_not_honoured("enableStableNorm", "stable_norm",
                                      _bool("enableStableNorm", enabled))

    def enableSyntheticData(self, enabled: bool) -> Options:
        """Generate inputs on the device instead of reading the host's."""
        return self._set_not_honoured("enableSyntheticData", "synthetic_data",
                                      _bool("enableSyntheticData", enabled))

    def enableProfiling(self, profile_dir: Optional[Union[str, os.PathLike[str]]] = None
                        ) -> Options:
        """Write a profile report of the model to ``profile_dir`` (None: the
        current directory), in a folder named after ``modelName`` (else
        ``training`` or ``inference``): a Chrome/Perfetto trace
        (``trace.json``), the memory of each IPU over each program
        (``memory.json``), a summary and an HTML page of both
        (``report.html``). It is written when the model is destroyed or
        garbage-collected, or when Python exits."""
        return self._set("profile_dir", _str("enableProfiling", profile_dir or "."))

    def modelName(self, name: str) -> Options:
        """The model's name, which names its profile report's folder."""
        return self._set("model_name", _str("modelName", name))

    def logDir(self, log_dir: Union[str, os.PathLike[str]]) -> Options:
        """Where PopTorch writes its log files."""
        return self._set_not_honoured("logDir", "log_dir", _str("logDir", log_dir))

    def maxRepeatLogs(self, number: Optional[int]) -> Options:
        """Log each often-repeated message of PopTorch (its Python side) at
        most ``number`` times from now on, in this process; None (the
        default) for no limit."""
        if number is not None:
            _int("maxRepeatLogs", number, 1, "the times each message may be logged")
        self._set("max_repeat_logs", number)
        set_max_repeat_logs(number)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> Options:
        """Count (model) the IPU cycles of each call, log them, and let
        ``cycleCount()`` return them."""
        return self._set("log_cycle_count", _bool("logCycleCount", log_cycle_count))

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        """With replicas, buffers the model changes in place cannot be
        broadcast (True, the default, is then an error, as in PopTorch); with
        False each replica keeps buffers of its own, starting from the host's
        values. The host model sees replica 0's."""
        return self._set("broadcast_buffers", _bool("broadcastBuffers", broadcast_buffers))

    def disableModuleNamescope(self) -> Options:
        """Stop naming ops after the modules that run them (in profile reports)."""
        return self._set("module_namescope", False)

    # -- whole object
    def _items(self) -> Iterator[Tuple[str, Any, Any]]:
        yield from super()._items()
        for group in self._GROUPS:
            for name, value, default in getattr(self, group)._items():
                yield f"{group}.{name}", value, default

    def _freeze(self) -> None:
        """Called by the models and DataLoaders that use these options."""
        self._frozen = True
        for group in self._GROUPS:
            getattr(self, group)._frozen = True

    def clone(self) -> Options:
        """A deep copy of these options (not frozen)."""
        return copy.deepcopy(self)

    def loadFromFile(self, filepath: Union[str, os.PathLike[str]]) -> Options:
        """Applies each line of a config file: ``deviceIterations(4)``,
        ``Training.gradientAccumulation(2)``, ``outputMode(OutputMode.All)``...

        Lines are parsed, never evaluated: a line must be a call of one setter
        with literal arguments or enum members; empty lines and ``#`` comments
        are skipped. A bad line raises :class:`Error` naming the file and line.
        """
        load_config_file(self, filepath)
        return self


def _note_what_the_emulator_does() -> None:
    """Ends the docstring of each setter of _NOT_HONOURED with what the emulator does."""
    classes = {"": Options, "Training": _TrainingOptions, "Precision": _PrecisionOptions,
               "TensorLocations": _TensorLocationOptions, "Jit": _JitOptions,
               "Distributed": _DistributedOptions, "_Popart": _PopartOptions}
    for option, (_, why) in _NOT_HONOURED.items():
        group, _, name = option.rpartition(".")
        setter = vars(classes[group])[name]
        setter.__doc__ = (f"{inspect.cleandoc(setter.__doc__ or '')}\n\nOn the emulated IPU "
                          f"Model: {why}. A value it does not act on is stored and logged at "
                          f"INFO.")


_note_what_the_emulator_does()
