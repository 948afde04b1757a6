"""``trainingModel`` / ``inferenceModel``: the whole step on the IPU.

The first call (or ``compile``) captures one micro-batch's step on the ipu
device — forward, loss and backward into gradient accumulators — and, for
training, the optimiser update, as two compiled programs. Every call then
hands the host batch to the C++ runtime, which replays those programs for
each of the ``deviceIterations x gradientAccumulation x replicationFactor``
micro-batches without running the Python model again.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree
from tqdm import tqdm

from . import _C
from ._device_optimizer import DeviceOptimizer
from ._device_state import DeviceState
from ._errors import Error
from ._logging import logger
from ._losses import LossRecorder, RunningOnIpu
from .options import Options, OutputMode, ReductionType

_DEVICE = torch.device("ipu:0")


@contextlib.contextmanager
def _whole_step_capture():
    """The step is captured whole: a sync point inside it is a poptorch.Error."""
    _C.set_whole_step_capture(True)
    try:
        yield
    except BaseException as error:
        _C.discard_pending_graph()  # half a step must never run
        if "while it is being compiled" in str(error) and not isinstance(error, Error):
            raise Error(str(error).split("\n")[0]) from None
        raise
    finally:
        _C.set_whole_step_capture(False)


@contextlib.contextmanager
def _mode(model: torch.nn.Module, training: bool):
    """The model in train or eval mode for the capture, then as it was."""
    modes = {m: m.training for m in model.modules()}
    model.train(training)
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


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


class PoplarExecutor:
    """The wrapped model. Do not create it directly: use
    :func:`trainingModel` or :func:`inferenceModel`."""

    def __init__(self, model: torch.nn.Module, options: Optional[Options], training: bool,
                 optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise Error(f"expected a torch.nn.Module to wrap, got {type(model).__name__}")
        self._model = model
        self._options = options if options is not None else Options()
        self._training = training
        if training and self._options.Training.gradient_accumulation < 1:
            raise Error("gradientAccumulation must be at least 1")
        if not training and self._options.Training.gradient_accumulation != 1:
            raise Error("inferenceModel: gradientAccumulation must be 1 for inference; "
                        "use another Options object for the inference model")
        if training and optimizer is None:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self._optimizer = optimizer
        self._state: Optional[DeviceState] = None
        self._device_optimizer: Optional[DeviceOptimizer] = None
        self._micro_step: Optional[Any] = None
        self._update: Optional[Any] = None
        self._compiled = False
        self._attached = False
        self._destroyed = False
        seed = self._options.random_seed
        self._rng = torch.Generator()
        self._rng.manual_seed(seed if seed is not None else torch.initial_seed())

    # --- the public interface ---------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check_usable()
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if not self._compiled:
            self._compile(leaves, spec)
        else:
            self._check_inputs(leaves, spec)
            if not self._attached:
                logger.info("attaching the model to the IPU again")
                self.attachToDevice()
        return self._run(leaves)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compiles the step for inputs like these, without running it."""
        self._check_usable()
        if self._compiled:
            raise Error("the model is already compiled")
        leaves, spec = pytree.tree_flatten((args, kwargs))
        self._compile(leaves, spec)

    def isCompiled(self) -> bool:
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        return self._attached

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Uses ``optimizer``'s hyper-parameters from now on. Variable attributes
        (``lr`` always) change without recompiling; changing a constant is an error."""
        self._check_usable()
        if not self._training:
            raise Error("setOptimizer: an inference model has no optimiser")
        if self._device_optimizer is not None:
            self._device_optimizer.set_values(optimizer)
        self._optimizer = optimizer

    def copyWeightsToHost(self) -> None:
        """Makes the host model hold the device weights (they are kept in sync
        implicitly; this also repairs host tensors that were replaced)."""
        self._check_attached("copyWeightsToHost")
        self._state.copy_to_host()

    def copyWeightsToDevice(self) -> None:
        """Copies the host model's weights to the device, e.g. after the host
        model was trained on the CPU or had its tensors replaced."""
        self._check_attached("copyWeightsToDevice")
        self._state.copy_to_device()

    def detachFromDevice(self) -> None:
        """Frees the IPU: weights and optimiser state move to the host."""
        self._check_attached("detachFromDevice")
        if self._device_optimizer is not None:
            self._device_optimizer.release()  # the host optimiser keeps the state
        self._state.detach()
        self._device_optimizer = None
        self._micro_step = self._update = None
        self._device_inputs = self._device_outputs = []
        self._attached = False

    def attachToDevice(self) -> None:
        """Loads the model back on the IPU after :meth:`detachFromDevice`."""
        self._check_usable()
        if not self._compiled:
            raise Error("attachToDevice: the model is not compiled yet")
        if self._attached:
            raise Error("attachToDevice: the model is already attached")
        examples = [torch.zeros(s, dtype=d) if s is not None else v
                    for (s, d, v) in self._input_specs]
        self._capture(examples, self._spec, progress=None)

    def destroy(self) -> None:
        """Frees everything the model holds on the IPU; the wrapper is unusable after."""
        if self._attached:
            self.detachFromDevice()
        self._destroyed = True

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def options(self) -> Options:
        return self._options

    def __getattr__(self, name: str) -> Any:
        # Attributes of the wrapped model (PopTorch's wrapper is a shallow copy of it).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._model, name)

    def __reduce_ex__(self, protocol: int) -> Any:
        # pickle, torch.save and copy.deepcopy: the compiled programs and the
        # device state belong to this process's IPU.
        raise Error("a trainingModel/inferenceModel cannot be saved or copied: save "
                    "model.state_dict() and optimizer.state_dict() (or the model itself) "
                    "and wrap the model again after loading")

    def __repr__(self) -> str:
        kind = "trainingModel" if self._training else "inferenceModel"
        return f"PoplarExecutor({kind}, compiled={self._compiled}, model={self._model!r})"

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

    def _compile(self, leaves: List[Any], spec: Any) -> None:
        n = self._micro_batches
        specs = []
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                if leaf.dim() == 0 or leaf.shape[0] % n != 0:
                    raise Error(self._batch_message(index, leaf))
                specs.append((tuple(leaf.shape), leaf.dtype, None))
            else:
                specs.append((None, None, leaf))
        if self._options.output_mode == OutputMode.EveryN and (
                self._options.device_iterations % self._options.output_return_period):
            raise Error("OutputMode.EveryN: deviceIterations "
                        f"({self._options.device_iterations}) must be a multiple of the "
                        f"output return period ({self._options.output_return_period})")
        self._input_specs, self._spec = specs, spec
        progress = _Progress()
        try:
            self._capture(leaves, spec, progress)
        finally:
            progress.close()
        self._compiled = True

    def _batch_message(self, index: int, leaf: torch.Tensor) -> str:
        o = self._options
        n = self._micro_batches
        rows = leaf.shape[0] if leaf.dim() else "no batch dimension"
        return (f"input {index} has {rows} rows: a host batch must be a multiple of "
                f"deviceIterations ({o.device_iterations}) x replicationFactor "
                f"({o.replication_factor})" +
                (f" x gradientAccumulation ({self._accumulation})" if self._training else "") +
                f" = {n} micro-batches. Use poptorch.DataLoader(options, ...), which makes "
                f"batches of batch_size x {n}.")

    def _capture(self, leaves: List[Any], spec: Any, progress: Optional[_Progress]) -> None:
        """Captures and compiles the micro-step (and update) programs."""
        _C.synchronize()
        n = self._micro_batches
        self._state = DeviceState(self._model, id(self), _DEVICE)
        device_params = {id(host): self._state.tensors[name]
                         for name, host in self._state.host.items()}
        trainable = self._state.parameters(self._model) if self._training else []
        for p in trainable:
            p.requires_grad_(True)
        # With one micro-batch per iteration, the update applies the gradients
        # directly in the same program; otherwise they are accumulated first.
        accumulate = self._training and self._micro_batches_per_iteration > 1
        if self._training:
            self._device_optimizer = DeviceOptimizer(self._optimizer, device_params, _DEVICE)
            accumulators = {id(p): torch.zeros_like(p) for p in trainable} if accumulate else {}
        self._device_inputs = []
        device_leaves = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                micro = leaf[: leaf.shape[0] // n].to(_DEVICE)
                self._device_inputs.append(micro)
                device_leaves.append(micro)
            else:
                device_leaves.append(leaf)
        _C.synchronize()
        if progress:
            progress.to(10)

        args, kwargs = pytree.tree_unflatten(device_leaves, spec)
        recorder = LossRecorder(self._model)
        with _whole_step_capture(), _mode(self._model, self._training), recorder, RunningOnIpu():
            with torch.enable_grad() if self._training else torch.no_grad():
                outputs = torch.func.functional_call(self._model, self._state.tensors,
                                                     tuple(args), kwargs, strict=False)
            if progress:
                progress.to(40)
            if self._training:
                loss = recorder.loss()
                if loss.dim() != 0:
                    loss = loss.sum()
                scaled = loss * self._device_optimizer.grad_scale
                grads = torch.autograd.grad(scaled, trainable, allow_unused=True)
                if all(g is None for g in grads):
                    raise Error("the loss does not depend on any trainable parameter")
                gradients = {id(p): g for p, g in zip(trainable, grads) if g is not None}
                if accumulate:
                    with torch.no_grad():
                        for key, g in gradients.items():
                            accumulators[key].add_(g.to(accumulators[key].dtype))
                else:
                    self._device_optimizer.capture_update(gradients, 1.0, accumulated=False)
                del loss, scaled, grads, gradients
            out_leaves, self._out_spec = pytree.tree_flatten(outputs)
            self._out_leaves = [o.detach() if isinstance(o, torch.Tensor) else o
                                for o in out_leaves]
            self._device_outputs = [o for o in self._out_leaves if isinstance(o, torch.Tensor)]
            for o in self._device_outputs:
                if o.device.type != "ipu":
                    raise Error(f"the model returned a tensor on {o.device}: outputs must be "
                                f"computed from the inputs and weights")
            del outputs, out_leaves
            self._micro_step = _C.prepare_program()
        if progress:
            progress.to(70)

        self._update = None
        if accumulate:
            reduction = self._options.Training.accumulation_and_replication_reduction_type
            scale = 1.0 / self._micro_batches_per_iteration if reduction == ReductionType.Mean else 1.0
            with _whole_step_capture():
                self._device_optimizer.capture_update(accumulators, scale, accumulated=True)
                self._update = _C.prepare_program()
        self._attached = True
        logger.debug("captured the %s step: %d nodes%s", "training" if self._training else
                     "inference", self._micro_step.num_nodes if self._micro_step else 0,
                     f" + {self._update.num_nodes} in the update" if self._update else "")

    # --- running --------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._destroyed:
            raise Error("this model was destroyed: wrap the model again to use it")

    def _check_attached(self, what: str) -> None:
        self._check_usable()
        if not self._attached:
            raise Error(f"{what}: the model is not attached to the IPU (compile it by calling "
                        f"it, or call attachToDevice())")

    def _check_inputs(self, leaves: List[Any], spec: Any) -> None:
        if spec != self._spec:
            raise Error("the model was compiled for inputs with another structure "
                        f"({self._spec}); got {spec}. PopTorch compiles a static graph: "
                        "wrap the model again for new kinds of input.")
        for index, (leaf, (shape, dtype, value)) in enumerate(zip(leaves, self._input_specs)):
            if shape is None:
                if isinstance(leaf, torch.Tensor) or leaf != value:
                    raise Error(f"input {index} was {value!r} at compilation and is now "
                                f"{leaf!r}: only tensor inputs may change between calls")
            elif not isinstance(leaf, torch.Tensor):
                raise Error(f"input {index} was a tensor at compilation, now {type(leaf).__name__}")
            elif tuple(leaf.shape) != shape or leaf.dtype != dtype:
                raise Error(f"input {index} changed from {list(shape)} {dtype} at compilation "
                            f"to {list(leaf.shape)} {leaf.dtype}: PopTorch compiles a static "
                            f"graph, so shapes and dtypes must stay the same (use "
                            f"drop_last=True in the DataLoader, or wrap the model again)")

    def _run(self, leaves: List[Any]) -> Any:
        host_inputs = [leaf.detach().cpu().contiguous() for leaf in leaves
                       if isinstance(leaf, torch.Tensor)]
        o = self._options
        mode = o.output_mode
        if mode == OutputMode.Default:
            mode = OutputMode.Final if self._training else OutputMode.All
        native_mode = {OutputMode.All: 0, OutputMode.Final: 1, OutputMode.EveryN: 2,
                       OutputMode.Sum: 3}[mode]
        seed = int(torch.randint(1, 2**62, (1,), generator=self._rng))
        results = iter(_C.run_steps(self._micro_step, self._update, self._device_inputs,
                                    host_inputs, self._device_outputs, o.device_iterations,
                                    self._accumulation, o.replication_factor, native_mode,
                                    o.output_return_period, seed))
        leaves_out = [next(results) if isinstance(x, torch.Tensor) else x
                      for x in self._out_leaves]
        return pytree.tree_unflatten(leaves_out, self._out_spec)


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
