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
and why are listed in one table, ``_NOT_HONOURED`` (in ``_options/not_honoured.py``).
Defaults describe what the emulator does, which differs from PopTorch for
``use_ipu_model`` (True: there is no hardware) and ``Jit.trace_model`` (False:
capture is at the dispatcher).

The option groups live in ``poptorch/_options/``, one module each; their classes
are importable from here, as in PopTorch.
"""
from __future__ import annotations

import collections.abc
import copy
import os
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple, Union

import torch

from ._errors import AssertionCompatibleError
from ._execution_strategy import PipelinedExecution, _ExecutionStrategy
from ._logging import logger, set_max_repeat_logs
from ._options.compilation import _JitOptions, _PopartOptions
from ._options.distributed import _DistributedOptions
from ._options.not_honoured import (_DEFAULT_LOCATION_EXCLUDES, _NOT_HONOURED,
                                    _log_if_not_honoured, note_what_the_emulator_does)
from ._options.precision import _PrecisionOptions
from ._options.settings import _Settings, _Value
from ._options.tensor_locations import TensorLocationSettings, _TensorLocationOptions
from ._options.training import _TrainingOptions
from ._options.values import _bool, _enum, _int, _show, _str
from ._options_config import ConfigFileError, load_config_file, load_default_options
# The enums were always importable from here, as in PopTorch's poptorch.options.
from .enums import (CommGroupType, ConnectionType, HalfFloatCastingBehavior,  # noqa: F401
                    MeanReductionStrategy, OutputMode, ReductionType, SyncPattern)

__all__ = ["ConfigFileError", "Options", "TensorLocationSettings"]


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
                raise AssertionCompatibleError(f"replicationFactor({replicas}, {ways}): the input replication "
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
            raise AssertionCompatibleError(f"inputReplicaGrouping takes CommGroupType.Consecutive or "
                        f"CommGroupType.Orthogonal, got {_show(kind)}")
        self._set("input_group_type", kind)
        return self._set("input_group_size", size)

    @property
    def input_group_count(self) -> int:
        """Replicas with inputs of their own: replication factor / input group size."""
        size, replicas = self.input_group_size, self.replication_factor
        if replicas % size:
            raise AssertionCompatibleError(f"inputReplicaGrouping({size}) needs a replicationFactor that is a "
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
                raise AssertionCompatibleError("outputMode(OutputMode.EveryN) needs output_return_period: pass "
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
                raise AssertionCompatibleError("anchorTensor with OutputMode.EveryN needs output_return_period")
            entry = entry[:3] + (_int("anchorTensor", output_return_period, 1,
                                      "output_return_period"),)
        kept = tuple(e for e in self.anchored_tensors if e[0] != short)
        return self._set("anchored_tensors", kept + (entry,))

    def randomSeed(self, random_seed: int) -> Options:
        """Seeds the device's random generator, and, as PopTorch does, the host's
        (``torch.manual_seed``)."""
        seed = _int("randomSeed", random_seed, 0, "the seed")
        if seed >= 2**64:
            raise AssertionCompatibleError(f"randomSeed({seed}) is too large: the seed must be below 2**64")
        torch.manual_seed(seed)
        return self._set("random_seed", seed)

    # -- buffers, optimiser, compilation
    def updatableNamedBuffers(self, buffers: List[str]) -> Options:
        """Names of the model's buffers that
        :meth:`~poptorch.PoplarExecutor.copyNamedBuffersToDevice` copies to the
        device (the others keep their device values)."""
        if isinstance(buffers, str) or not all(isinstance(b, str) and b for b in buffers):
            raise AssertionCompatibleError(f"updatableNamedBuffers takes a list of buffer names, got {buffers!r}")
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
            raise AssertionCompatibleError(f"sourceLocationExcludes takes a list of strings, got {excludes!r}")
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
            raise AssertionCompatibleError(f"useOfflineIpuTarget({version}) is invalid: the IPU version is 1, 2 "
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
            raise AssertionCompatibleError("setExecutionStrategy takes poptorch.PipelinedExecution, "
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
        if not isinstance(available_memory_proportion, collections.abc.Mapping):
            raise AssertionCompatibleError(
                "setAvailableMemoryProportion takes a dict of a proportion per IPU, such as "
                f"{{'IPU0': {available_memory_proportion!r}}}, got {available_memory_proportion!r}")
        proportions = {}
        for key, value in available_memory_proportion.items():
            if not isinstance(key, str) or not key.startswith("IPU") or not key[3:].isdigit():
                raise AssertionCompatibleError(f"setAvailableMemoryProportion takes keys such as 'IPU0', got {key!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 < value <= 1:
                raise AssertionCompatibleError(f"setAvailableMemoryProportion: {key} must map to a proportion "
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


note_what_the_emulator_does({
    "": Options, "Training": _TrainingOptions, "Precision": _PrecisionOptions,
    "TensorLocations": _TensorLocationOptions, "Jit": _JitOptions,
    "Distributed": _DistributedOptions, "_Popart": _PopartOptions})
