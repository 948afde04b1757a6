"""``trainingModel`` / ``inferenceModel``: the whole step on the IPU.

The first call (or ``compile``) captures one micro-batch's step on the ipu
device — forward, loss and backward into gradient accumulators — and, for
training, the optimiser update, as two compiled programs. Every call then
hands the host batch to the C++ runtime, which replays those programs for
each of the ``deviceIterations x gradientAccumulation x replicationFactor``
micro-batches without running the Python model again.
"""
from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import torch
import torch.utils._pytree as pytree
from tqdm import tqdm

from . import _C
from . import _buffers
from . import _compile_hooks
from . import _inputs
from . import _model_methods
from . import _ipu_memory
from . import _precision
from . import _precompilation
from . import _replica_grouping
from . import _wrapped_model
from ._anchors import Anchors
from ._compiled_with import CompiledWith
from ._device_optimizer import DeviceOptimizer
from ._device_state import DeviceState
from ._errors import AssertionCompatibleError, Error
from ._execution_strategy import PipelinedExecution, _ExecutionStrategy, check_split
from ._executor_inputs import ExecutorInputs
from ._executor_profiling import ExecutorProfiling
from ._logging import logger
from ._printing import module_repr
from ._step_capture import StepCapture, module_modes
from ._wrapper_options import check_compiled_strategy, mean_factors, wrapper_options
from ._wrapper_state import WrapperState
from .distributed._replication import ProcessReplicas
from .options import ConnectionType, Options, OutputMode

_DEVICE = torch.device("ipu:0")


class _Progress:
    """The 'Graph compilation' progress bar."""

    def __init__(self) -> None:
        self._bar = tqdm(total=100, desc="Graph compilation", leave=True,
                         bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]")

    def to(self, percent: int) -> None:
        self._bar.update(percent - self._bar.n)

    def close(self) -> None:
        self.to(100)
        self._bar.close()


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Runs the method under the executor's lock: calls from several threads
    take turns, as they share the step's device inputs and outputs."""
    @functools.wraps(method)
    def wrapper(self: "PoplarExecutor", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


# The code of every locked method: what dynamo is told to run as it is
# (poptorch._dynamo_backend), as these methods compile and run a whole step.
LOCKED_CODE = _locked(lambda self: None).__code__


class PoplarExecutor(WrapperState, ExecutorProfiling, ExecutorInputs):
    """The wrapped model. Do not create it directly: use
    :func:`trainingModel` or :func:`inferenceModel`."""

    def __init__(self, model: torch.nn.Module, options: Optional[Options], training: bool,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        if isinstance(model, PoplarExecutor):
            model = model.model  # PopTorch's way to wrap one model twice
        if not isinstance(model, torch.nn.Module):
            raise Error(f"expected a torch.nn.Module to wrap, got {type(model).__name__}")
        self._model = model
        _check_wrapper_arguments(options, optimizer, training)
        # The user's options, and the resolved copy the model runs with.
        self._user_options = options if options is not None else Options()
        self._options = wrapper_options(self._user_options, training, optimizer)
        self._training = training
        if training and self._options.Training.gradient_accumulation < 1:
            raise Error("gradientAccumulation must be at least 1")
        if not training and self._options.Training.gradient_accumulation != 1:
            raise Error(  # PopTorch's words
                "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it "
                "as its default value (1) when running a poptorch.inferenceModel()."
                + (" Use poptorch.Options().deviceIterations to process a sufficient number of "
                   "batches each run for pipelined execution instead."
                   if self._options._execution_strategy.pipelined else "")  # pylint: disable=protected-access
                + " (Use another Options object for the inference model.)")
        if training and optimizer is None:
            if next(model.parameters(), None) is None:
                raise Error(f"trainingModel: the model ({type(model).__name__}) has no "
                            "parameters, so there is nothing to train: run it with "
                            "poptorch.inferenceModel instead")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self._optimizer = optimizer
        self._state: Optional[DeviceState] = None
        self._device_optimizer: Optional[DeviceOptimizer] = None
        self._step: Optional[StepCapture] = None
        # The forward hooks and trainable parameters the step was compiled with.
        self._compiled_with: Optional[CompiledWith] = None
        self._micro_step: Optional[Any] = None
        # (StepVariants, UpdateVariants) of each Specialisation of the step
        self._specialised: Dict[Any, Tuple[Any, Any]] = {}
        self._replica_buffers: Optional[Any] = None  # broadcastBuffers(False)
        self._update: Optional[Any] = None  # the first update program
        self._updates: Optional[Any] = None  # the update per set of variants (UpdateVariants)
        # The modelled peak of the step and update programs on each IPU
        self._peaks: Dict[str, List[int]] = {}
        # Replica-grouped weights, as PopTorch names them: parameter name ->
        # (CommGroupType, replicas per group, VariableRetrievalMode). Read
        # when the model is compiled (see _replica_grouping.py).
        self.per_replica_params: Dict[str, Any] = {}
        self._grouped: Optional[_replica_grouping.GroupedWeights] = None
        self._grouped_as: Dict[str, Any] = {}  # per_replica_params when compiled
        # With replicas in other processes: sums their gradients before each update.
        self._before_update: Optional[Callable[[], None]] = None
        self._processes: Optional[ProcessReplicas] = None
        self._compiled = False
        self._modes: List[Tuple[torch.nn.Module, bool]] = []  # set by each compilation
        self._default_dtype = torch.get_default_dtype()  # the one of the last capture
        self._deterministic = _deterministic_setting()  # the one of the last capture
        self._attached = False
        self._destroyed = False
        self._lock = threading.RLock()
        self._warned_float64 = False
        self._warned_grad = False  # an input with requires_grad=True was logged
        seed = self._options.random_seed
        self._rng = torch.Generator()
        self._rng.manual_seed(seed if seed is not None else torch.initial_seed())
        self._anchored: Dict[str, torch.Tensor] = {}  # of the last call (anchorTensor)
        # The executables this model's captures used (and those loaded from a
        # file): what compileAndExport writes.
        self._executables = _C.ExecutableSet()
        self._start_profiling()
        if training:
            _wrapped_model.wrap(model, self)  # model.destroy(), as in PopTorch

    # --- the public interface ---------------------------------------------

    @_locked
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the step on every micro-batch of the inputs (compiling it first
        on the first call) and returns the outputs per the output mode."""
        if _C.capturing_step():
            # Its step would run inside the other's capture, on values that do
            # not exist yet: a confusing host-read error, or "already captured".
            raise Error("a poptorch model was called inside the forward of another that is "
                        "being compiled (trainingModel/inferenceModel), and one step cannot "
                        "run another: call the module it wraps (its .model) there instead, "
                        "and wrap only the outer model")
        if self._options.connection_type == ConnectionType.Never:
            raise AssertionCompatibleError(
                "Trying to run a model on an offline device: the model is compiled for an "
                "offline IPU (Options.useOfflineIpuTarget, or connectionType("
                "ConnectionType.Never)), so it cannot run: compile it with compile() or "
                "compileAndExport(), and run the exported file where it is loaded with "
                "poptorch.load()")
        leaves, spec = self._flatten(args, kwargs)
        if not self._compiled:
            self._compile(leaves, spec)
        else:
            self._check_not_inference_mode()  # _compile checks it on a first call
            self._check_grouping()
            _inputs.check_default_dtype(self._default_dtype)
            self._check_inputs(leaves, spec)
            if self._compiled_with is not None:
                self._compiled_with.check()
            if self._attached and self._deterministic != _deterministic_setting():
                # CPU kernels read it at each call (put_ refuses under it,
                # index_put_ keeps the order of repeated indices): the step is
                # captured again under the call's, as torch.compile guards it.
                logger.info("torch.use_deterministic_algorithms changed since the model was "
                            "compiled: capturing the step again under the new setting")
                self._release_device()
            if not self._attached:
                logger.info("attaching the model to the IPU again")
                self.attachToDevice()
            else:
                self._copy_host_changes()
                if self._step.hooks is not None:
                    self._step.hooks.check()
                if self._device_optimizer is not None:
                    self._device_optimizer.follow_host_changes()
                if self._step.warnings is not None:  # the capturing call gave them
                    self._step.warnings.give()
        return self._run(leaves)

    @_locked
    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compiles the step for inputs like these, without running it."""
        if self._compiled:
            raise Error("the model is already compiled")
        leaves, spec = self._flatten(args, kwargs)
        self._compile(leaves, spec)

    @_locked
    def compileAndExport(self, filename: str, *args: Any, export_model: bool = True,
                         **kwargs: Any) -> None:
        """Compiles the step for inputs like ``args`` and ``kwargs`` (unless
        it is compiled already) and writes it to ``filename`` (see :meth:`save`)."""
        if self._compiled:
            logger.warning("compileAndExport: the model is compiled already; exporting it as "
                           "it is")
        else:
            leaves, spec = self._flatten(args, kwargs)
            self._compile(leaves, spec)
        self.save(filename, export_model)

    @_locked
    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Writes the compiled model to ``filename``: its executables, the
        options and the inputs it was compiled for, and, with ``export_model``,
        the model (which must be picklable) with its weights and the optimiser
        with its state, so that :func:`poptorch.load` restores everything and
        training goes on from there. Without ``export_model``, wrap the model
        again and call :meth:`loadExecutable`. ``save_rng_state`` saves the
        state of the random generator too. Loading compiles nothing."""
        if not self._compiled:
            raise Error("save: the model is not compiled yet: call it, compile() or "
                        "compileAndExport() first")
        _precompilation.write(os.fspath(filename), _precompilation.payload(
            self, export_model, save_rng_state))

    @_locked
    def loadExecutable(self, filename: str) -> None:
        """Compiles this model with the executables of ``filename`` (written
        by :meth:`compileAndExport` or :meth:`save`, maybe without the model):
        nothing is compiled. The model's own weights are used."""
        if self._compiled:
            raise Error("loadExecutable: the model is compiled already: wrap the model again "
                        "to load an executable into it")
        filename = os.fspath(filename)
        self._load(filename, _precompilation.read(filename))

    def isCompiled(self) -> bool:
        """True once the step is compiled (by the first call or ``compile``)."""
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        """True while the model's weights and step are on the IPU."""
        return self._attached

    @_locked
    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Uses ``optimizer``'s hyper-parameters from now on. Variable attributes
        (``lr`` always) change without recompiling; changing a constant is an error."""
        if not self._training:
            raise Error("setOptimizer: an inference model has no optimiser")
        _check_optimizer("setOptimizer", optimizer)
        if self._device_optimizer is not None:
            check_compiled_strategy(self._options, optimizer)
            self._device_optimizer.set_values(optimizer)
        else:  # not compiled yet: the new optimiser may choose the mean strategy
            self._options = wrapper_options(self._user_options, True, optimizer)
        self._optimizer = optimizer

    @_locked
    def copyWeightsToHost(self) -> None:
        """Makes the host model hold the device weights (they are kept in sync
        implicitly; this also repairs host tensors that were replaced). Before
        the model is compiled the host model holds them already: nothing to do."""
        if not self._compiled:
            return
        self._check_attached("copyWeightsToHost")
        self._state.copy_to_host()

    @_locked
    def copyWeightsToDevice(self) -> None:
        """Copies the host model's weights to the device, e.g. after the host
        model was trained on the CPU or had its tensors replaced. Before the
        model is compiled there is nothing to do: compiling copies them."""
        if not self._compiled:
            return
        self._check_attached("copyWeightsToDevice")
        self._state.copy_to_device()

    @_locked
    def detachFromDevice(self) -> None:
        """Frees the IPU: weights and optimiser state move to the host."""
        self._check_attached("detachFromDevice")
        self._release_device()

    def _release_device(self) -> None:
        if self._device_optimizer is not None:
            self._device_optimizer.release()  # the host optimiser keeps the state
        self._state.detach()
        self._device_optimizer = None
        self._micro_step = self._update = self._updates = self._step = None
        self._specialised = {}
        self._compiled_with = None
        self._replica_buffers = None
        self._before_update = self._grouped = self._processes = None
        self._attached = False

    @_locked
    def attachToDevice(self) -> None:
        """Loads the model back on the IPU after :meth:`detachFromDevice`."""
        if not self._compiled:
            raise Error("attachToDevice: the model is not compiled yet")
        if self._attached:
            raise Error("attachToDevice: the model is already attached")
        self._check_grouping()
        with self._profiled("capture the step again"):
            self._capture(progress=None)

    @_locked
    def destroy(self) -> None:
        """Releases the IPU and the compiled step, as PopTorch does: the weights
        and optimiser state go back to the host model and optimiser, and the
        next call compiles the model again (for inputs of any shape)."""
        if self._attached:
            self.detachFromDevice()
        self._compiled = False
        self._destroyed = True
        _wrapped_model.unwrap(self._model, self)
        self._close_profile()

    @property
    def model(self) -> torch.nn.Module:
        """The wrapped model (it shares its weights with the device)."""
        return self._model

    @property
    def options(self) -> Options:
        """The options the model was wrapped with."""
        return self._options

    def __getattr__(self, name: str) -> Any:
        # Attributes of the wrapped model (PopTorch's wrapper is a shallow copy of it).
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._model, name)
        if isinstance(value, torch.nn.Parameter):
            _replica_grouping.offer_grouping(value, self, name)  # W.replicaGrouping(...)
        # A method that runs the model (wrapped.generate) would run it on the host.
        return _model_methods.reached_through_wrapper(
            self._model, name, value, "trainingModel" if self._training else "inferenceModel")

    def __reduce_ex__(self, protocol: int) -> Any:
        # pickle, torch.save and copy save what PopTorch's wrapper holds before
        # it compiles: the model (whose weights are the device's), the options
        # and the optimiser; loading wraps them again. The compiled programs and
        # the device state belong to this process's IPU: the copy compiles
        # again on its first call.
        return (_rewrap, (self._model, self._user_options, self._training, self._optimizer))

    def __repr__(self) -> str:
        return module_repr(self._model)

    # --- compilation --------------------------------------------------------

    @property
    def _accumulation(self) -> int:
        """Micro-batches whose gradients one update accumulates (1 for inference)."""
        return self._options.Training.gradient_accumulation if self._training else 1

    @property
    def _micro_batches_per_iteration(self) -> int:
        return self._accumulation * self._options.replication_factor

    @property
    def _micro_batches(self) -> int:
        return self._options.device_iterations * self._micro_batches_per_iteration

    def _revive(self) -> None:
        """After destroy(): the model is wrapped and profiled again."""
        if self._destroyed:
            self._destroyed = False
            if self._training:
                _wrapped_model.wrap(self._model, self)
            self._start_profiling()

    def _check_not_inference_mode(self) -> None:
        """A training step under torch.inference_mode() is refused, as the CPU's
        backward is: tensors made in that mode never take gradients (its first
        call trained wrongly). torch.no_grad() is no obstacle: PopTorch
        differentiates the step itself."""
        if self._training and torch.is_inference_mode_enabled():
            raise Error("a trainingModel was called under torch.inference_mode(), where "
                        "nothing can be differentiated, so its step cannot train: call it "
                        "outside inference_mode (torch.no_grad() is allowed), or evaluate "
                        "with poptorch.inferenceModel(model)")

    def _compile(self, leaves: List[Any], spec: Any) -> None:
        self._check_not_inference_mode()
        self._revive()
        n = self._micro_batches
        specs = []
        examples = []  # the micro-batch the step is captured from (again)
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                # A 0-dim tensor has no batch: every micro-batch sees it whole.
                if leaf.dim() > 0 and leaf.shape[0] % n != 0:
                    raise Error(self._batch_message(index, leaf))
                specs.append((tuple(leaf.shape), leaf.dtype, None))
                micro = leaf if leaf.dim() == 0 else leaf[: leaf.shape[0] // n]
                examples.append(micro.detach().to("cpu", copy=True))
            else:
                specs.append((None, None, leaf))
                examples.append(leaf)
        if self._options.output_mode == OutputMode.EveryN and (
                self._options.device_iterations % self._options.output_return_period):
            raise Error("OutputMode.EveryN: deviceIterations "
                        f"({self._options.device_iterations}) must be a multiple of the "
                        f"output return period ({self._options.output_return_period})")
        self._input_specs, self._spec, self._examples = specs, spec, examples
        self._modes = module_modes(self._model)  # every capture of the step uses them
        # Random ops follow Options.randomSeed, as in PopTorch (every model
        # wrapped with one seed draws the same numbers), else the host
        # generator's state when the model is compiled.
        seed = self._options.random_seed
        self._capture_seed = seed if seed is not None else int(torch.randint(0, 2**62, (1,)))
        progress = _Progress() if self._options.show_compilation_progress_bar else None
        what = "training" if self._training else "inference"
        try:
            with _compile_hooks.compile_hooks(), self._profiled(f"capture the {what} step"):
                self._capture(progress)
        finally:
            if progress:
                progress.close()
        self._compiled = True

    def _load(self, filename: str, saved: Dict[str, Any]) -> None:
        """Compiles the model from a file's payload: its step is captured from
        the saved inputs and finds its executables in the file."""
        if saved["training"] != self._training:
            kinds = {True: "trainingModel", False: "inferenceModel"}
            raise Error(f"{filename} holds a {kinds[saved['training']]}; this is a "
                        f"{kinds[self._training]}")
        self._revive()
        _precompilation.add_executables(self._executables, filename, saved)
        self._spec, self._examples, self._input_objects = _precompilation.inputs(saved)
        self._capture_seed = saved["capture_seed"]
        self._modes = module_modes(self._model)
        # Host batches hold a micro-batch per device iteration (and so on) of
        # the options here, which may differ from the exporting process's.
        n = self._micro_batches
        self._input_specs = [
            ((leaf.shape[0] * n, *leaf.shape[1:]) if leaf.dim() > 0 else (), leaf.dtype, None)
            if isinstance(leaf, torch.Tensor) else (None, None, leaf) for leaf in self._examples]
        compiled = _C.metrics()["graphs_compiled"]
        self._capture(progress=None)
        self._compiled = True
        compiled = _C.metrics()["graphs_compiled"] - compiled
        if compiled:
            logger.info("loadExecutable: %d graphs were compiled: %s holds the executables of "
                        "another model, or of other options", compiled, filename)

    def _lookup_scope(self) -> Any:
        """While active, graphs find executables among this model's (and record
        those they use there) and in the model's disk cache."""
        return _C.LookupScope(self._executables, self._options.executable_cache_dir or "")

    def _capture(self, progress: Optional[_Progress]) -> None:
        """Captures and compiles the micro-step (and update) programs from the
        example micro-batch. Each IPU's memory is checked once the weights are
        on their blocks' IPUs."""
        self._default_dtype = torch.get_default_dtype()
        self._deterministic = _deterministic_setting()
        with self._lookup_scope(), _ipu_memory.deferred_capacity_check():
            first = self._capture_programs(progress)
        strategy = self._strategy()
        self._peaks = {name: _ipu_memory.peaks(program, strategy,
                                               self._options.available_memory_proportion)
                       for name, program in (("step", first), ("update", self._update))
                       if program is not None}
        try:
            _ipu_memory.check_fits(self._peaks.values(), strategy)
        except Error:
            self._release_device()
            raise

    def _strategy(self) -> _ExecutionStrategy:
        return self._options.execution_strategy or PipelinedExecution()

    def _capture_programs(self, progress: Optional[_Progress]) -> Any:
        """Returns the first variant of the micro-step's program."""
        _C.synchronize()
        _precision.keep_running_statistics_float(self._options.Precision, self._model)
        self._state = DeviceState(self._model, id(self), _DEVICE)
        distributed = self._options.Distributed
        processes = ProcessReplicas(self._options) if distributed.num_processes > 1 else None
        if processes is not None:
            processes.broadcast_from_first(self._state.tensors.values())
        device_params = {id(host): self._state.tensors[name]
                         for name, host in self._state.host.items()}
        if self._training:
            self._device_optimizer = DeviceOptimizer(
                self._optimizer, device_params, _DEVICE,
                relax_checks=self._options.relax_optimizer_attributes_checks,
                automatic_loss_scaling=self._options.Training.automatic_loss_scaling,
                offline=self._options.connection_type == ConnectionType.Never)
        self._grouped = _replica_grouping.grouped_weights(
            self.per_replica_params, self._model, self._options, self._device_optimizer, _DEVICE)
        self._grouped_as = dict(self.per_replica_params)
        device_inputs = []
        device_leaves = []
        for leaf in self._examples:
            if isinstance(leaf, torch.Tensor):
                # contiguous: each run fills it with a micro-batch's rows of the host batch
                micro = leaf.to(_DEVICE, memory_format=torch.contiguous_format)
                device_inputs.append(micro)
                device_leaves.append(micro)
            else:
                device_leaves.append(leaf)
        if self._grouped is not None:
            device_inputs.append(self._grouped.replica_index)  # read by the step, not forward
        _C.synchronize()
        if progress:
            progress.to(10)

        # With one micro-batch per iteration in one process, the update applies
        # the gradients directly in the same program; otherwise they are
        # accumulated first (and summed across processes before the update).
        accumulate = self._training and (self._micro_batches_per_iteration > 1
                                          or processes is not None)
        args, kwargs = _inputs.unflatten(device_leaves, self._spec, self._input_objects)
        anchors = (Anchors(self._options, self._model, self._state, self._training,
                           not accumulate) if self._options.anchored_tensors else None)
        strategy = self._strategy()
        mean = mean_factors(self._options, self._accumulation, self._options.replication_factor,
                            distributed.num_processes)
        step = StepCapture(self._model, self._state, self._training, self._device_optimizer,
                           accumulate, device_inputs, args, kwargs, self._options.Precision,
                           strategy, anchors, self._capture_seed,
                           self._options.module_namescope, self._grouped,
                           mean if accumulate else None, self._modes)
        self._step = step
        first = step.micro_step()
        self._compiled_with = CompiledWith(self._model, self._training)
        # The weights go to their blocks' IPUs before the update is captured:
        # each update op runs on the IPU of the weight it updates.
        _ipu_memory.place_weights(
            first, self._state.tensors.values(), step.accumulators,
            self._device_optimizer.state if self._device_optimizer else {},
            streamed=strategy.streaming is not None)
        o = self._options
        check_split(strategy, step.split.stages, step.split.num_ipus, training=self._training,
                    device_iterations=o.device_iterations,
                    gradient_accumulation=self._accumulation,
                    auto_round_num_ipus=o.auto_round_num_ipus, ipus_available=_C.device_count())
        self._processes = processes
        self._bind_variants(first)
        if progress:
            progress.to(70)
        self._replica_buffers = _buffers.replica_buffers(
            self._model, self._state.tensors, self._micro_step, self._options.replication_factor,
            self._options.broadcast_buffers)
        self._update = None
        self._before_update = None
        if accumulate:
            self._update = step.update(step.received[0], mean.update)
            if processes is not None:
                self._before_update = processes.gradient_reduction(step.accumulators.values())
        self._attached = True
        logger.debug("captured the %s step%s", "training" if self._training else "inference",
                     f" and its update ({self._update.num_nodes} nodes)" if self._update else "")
        return first

    def _bind_variants(self, first: Any) -> None:
        """Runs the current specialisation of the step from now on, made of its first
        program and the variants captured later for other values read on the host.
        They are kept here, not in the step: they call it back (a cycle through C++
        that the garbage collector cannot see, which would keep the device tensors)."""
        step = self._step
        if step.current not in self._specialised:
            micro_step = _C.StepVariants(first, step.recapture)
            updates = (step.update_variants(step.mean.update, self._processes)
                       if step.accumulate else None)
            self._specialised[step.current] = (micro_step, updates)
        self._micro_step, self._updates = self._specialised[step.current]

    def _follow_python_values(self, host_inputs: List[torch.Tensor]) -> None:
        """Chooses the specialisation of the step for the Python values forward reads
        now (``self.scale``, a global), or captures one from the first micro-batch."""
        step = self._step
        if step.follows_python_values():
            if self._specialised[step.current][0] is not self._micro_step:
                self._bind_variants(None)
            return
        with torch.no_grad():
            for device, host in zip(step.device_inputs, host_inputs):
                device.copy_(host[: device.shape[0]] if device.dim() else host[0])
        self._bind_variants(step.specialise())

    # --- running --------------------------------------------------------------

    def _check_attached(self, what: str) -> None:
        if not self._attached:
            raise Error(f"Device is not attached: {what} needs the model on the IPU "  # PopTorch's words first
                        "(compile it by calling it, or call attachToDevice())")

    def _check_grouping(self) -> None:
        if self.per_replica_params != self._grouped_as:
            raise Error("per_replica_params changed after the model was compiled (it was "
                        f"{self._grouped_as}, it is {self.per_replica_params}): group the "
                        "weights before the first call, or wrap the model again")

    def _run(self, leaves: List[Any]) -> Any:
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        n = self._micro_batches
        # A 0-dim input feeds every micro-batch whole; the runtime writes
        # micro-batches the step changes in place back into these rows.
        host_inputs = [t.detach().reshape(1).expand(n).contiguous() if t.dim() == 0
                       else t.detach().cpu().contiguous() for t in tensors]
        if self._grouped is not None:
            host_inputs.append(self._grouped.host_replica_index(n))
        o = self._options
        mode = o.output_mode  # never Default: the wrapper's options resolve it
        native = {OutputMode.All: 0, OutputMode.Final: 1, OutputMode.EveryN: 2, OutputMode.Sum: 3}
        seed = int(torch.randint(1, 2**62, (1,), generator=self._rng))
        step = self._step
        timeline = _C.StepTimeline()
        with self._lookup_scope(), self._profiled():  # a failed guard captures the step again
            self._follow_python_values(host_inputs)
            gathers = [] if step.anchors is None else [  # anchored tensors: modes of their own
                (native[m], period) for m, period in step.anchors.gathers(
                    (mode, o.output_return_period), len(step.device_outputs))]
            results = iter(_C.run_steps(self._micro_step, self._updates, step.device_inputs,
                                        host_inputs, step.device_outputs, o.device_iterations,
                                        self._accumulation, o.replication_factor, native[mode],
                                        o.output_return_period, seed, gathers,
                                        self._replica_buffers, self._before_update,
                                        timeline, step.strategy.stage_schedule))
        self._after_call(timeline, step.device_inputs, step.device_outputs)
        self._write_back(self._given, host_inputs)
        if self._training:
            # The optimiser stepped, on the device: an LR scheduler stepped
            # after this call must not warn that it came first (PyTorch's
            # scheduler looks for this mark of optimizer.step()).
            self._optimizer._opt_called = True
        # IPUs have no 64-bit integers: PopTorch returns int32, and so do we.
        leaves_out = [_int32_if_int64(next(results)) if isinstance(x, torch.Tensor) else x
                      for x in step.out_leaves]
        outputs, self._anchored = pytree.tree_unflatten(leaves_out, step.out_spec)
        return outputs


def _check_wrapper_arguments(options: Any, optimizer: Any, training: bool) -> None:
    """The options and optimiser given to trainingModel / inferenceModel are
    what their names say (an optimiser passed second lands in ``options``)."""
    wrapper = "trainingModel" if training else "inferenceModel"
    if isinstance(options, torch.optim.Optimizer):
        raise Error(f"{wrapper}(model, options, optimizer): the second argument is a "
                    f"{type(options).__name__}, where a poptorch.Options goes: pass the "
                    "optimiser by name, optimizer=..." if training else
                    "inferenceModel takes no optimiser: use trainingModel(model, "
                    "optimizer=...) to train")
    if options is not None and not isinstance(options, Options):
        raise Error(f"{wrapper}: options must be a poptorch.Options (or None), got "
                    f"{type(options).__name__}: make one with poptorch.Options() and its "
                    "setters (e.g. poptorch.Options().deviceIterations(4))")
    if optimizer is not None:
        _check_optimizer("trainingModel", optimizer)


def _check_optimizer(caller: str, optimizer: Any) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise Error(f"{caller}: optimizer must be a torch.optim.Optimizer (a "
                    f"poptorch.optim or torch.optim one), got {type(optimizer).__name__}")


def _deterministic_setting() -> Tuple[bool, bool]:
    """torch.use_deterministic_algorithms(mode, warn_only)."""
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


def _int32_if_int64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32) if t.dtype == torch.int64 else t


def _rewrap(model: torch.nn.Module, options: Options, training: bool,
            optimizer: Optional[torch.optim.Optimizer]) -> PoplarExecutor:
    """A saved or copied wrapper, loaded (see ``PoplarExecutor.__reduce_ex__``)."""
    return PoplarExecutor(model, options, training, optimizer)


def trainingModel(model: torch.nn.Module, options: Optional[Options] = None,
                  optimizer: Optional[torch.optim.Optimizer] = None) -> PoplarExecutor:
    """Wraps ``model`` for training on the IPU: each call runs forward, loss,
    backward and the optimiser update for every micro-batch of the host batch.
    The model must compute its loss in ``forward`` (a torch loss module, or
    :func:`identity_loss`). Without an optimiser, SGD with lr=0.01 is used."""
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def inferenceModel(model: torch.nn.Module, options: Optional[Options] = None) -> PoplarExecutor:
    """Wraps ``model`` for inference on the IPU."""
    return PoplarExecutor(model, options, training=False)
