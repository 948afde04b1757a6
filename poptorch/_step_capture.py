"""Capturing the step of a ``trainingModel`` / ``inferenceModel``.

One micro-batch's step — forward, loss, backward into gradient accumulators
(or straight into the optimiser update) — is captured on the ipu device as one
program, and the update from the accumulators as another. The runtime replays
them for every micro-batch without running Python.

A value the model reads on the host while it is captured (``.item()``,
``.cpu()``, ``if tensor:``, an op whose output shape depends on the data) is
computed on the side and the program is *specialised* on it: a guard checks on
every replay that the value recurs. When it does not, the step is captured
again for that micro-batch, as ``torch.compile`` recompiles on a failed guard,
and kept as another variant; the values seen most often cost nothing after
their first capture. A value that keeps changing (a loss read with ``.item()``
inside ``forward``) is an error that names the line, after
``POPTORCH_MAX_STEP_VARIANTS`` (8) variants.

The plain Python values forward reads (``self.scale``, a global) specialise the step too:
each set of them has a :class:`Specialisation` of its own, with its variants, chosen
before each call by guards on those values (``_python_reads.py``); the limit counts the
captures of all of them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree

from . import _C
from . import _buffers
from . import _precision
from . import _recompute
from ._held_parameters import device_parameters
from ._host_constants import HostConstants
from ._annotations import Split, capturing_blocks, outside_blocks
from ._anchors import Anchors
from ._device_optimizer import DeviceOptimizer
from ._device_state import DeviceState
from ._errors import Error, ValueCompatibleError
from ._float64 import Float64Demotion
from ._replica_grouping import GroupedWeights
from ._wrapper_options import MeanFactors
from ._logging import logger
from ._losses import LossRecorder, RunningOnIpu
from ._parameter_hooks import ParameterHooks
from ._ops import overlap_checks
from ._ops.name_scope import module_name_scopes
from ._python_reads import PythonReads, recording

_DEFAULT_MAX_VARIANTS = 8



def max_step_variants() -> int:
    value = os.environ.get("POPTORCH_MAX_STEP_VARIANTS", "").strip()
    if not value:
        return _DEFAULT_MAX_VARIANTS
    # The words of the variables the C++ side reads (common/environment.cpp).
    if not value.isdecimal() or int(value) < 1:
        raise ValueCompatibleError(f"POPTORCH_MAX_STEP_VARIANTS must be an integer of at "
                                   f"least 1, got {value!r}")
    return int(value)


def module_modes(model: torch.nn.Module) -> List[Tuple[torch.nn.Module, bool]]:
    """Each submodule's ``training`` flag. A step keeps those of its first
    capture: capturing it again (after detachFromDevice, or for another value
    read on the host) after ``model.eval()`` must not make a training step
    that stops updating its batch norm statistics."""
    return [(module, module.training) for module in model.modules()]


@contextlib.contextmanager
def _in_modes(modes: List[Tuple[torch.nn.Module, bool]]) -> Iterator[None]:
    current = [(module, module.training) for module, _ in modes]
    try:
        for module, training in modes:
            module.training = training
        yield
    finally:
        for module, training in current:
            module.training = training


@contextlib.contextmanager
def _capture_modes() -> Iterator[None]:
    """The forward's capture modes, for a checkpointed part run again in
    backward (see _recompute.py)."""
    with HostConstants(), Float64Demotion():
        yield


@contextlib.contextmanager
def _whole_step_capture() -> Iterator[None]:
    """This thread's ops are captured into one program; nothing runs until it
    is replayed, and half a step is never run: an error discards it."""
    _C.begin_step_capture()
    try:
        yield
    finally:
        _C.end_step_capture()


def _call_with(model: torch.nn.Module, tensors: Dict[str, torch.Tensor], args: Any,
               kwargs: Dict[str, Any], check_kept: Callable[[], None]) -> Any:
    """``model(*args, **kwargs)`` with ``tensors`` (by name) in place of its own, as
    ``torch.func.functional_call`` does (which refuses TorchScript modules);
    ``check_kept`` runs at the end of forward, before the model's own are back."""
    with torch.nn.utils.stateless._reparametrize_module(  # pylint: disable=protected-access
            model, tensors, tie_weights=False, strict=False):
        outputs = model(*args, **kwargs)
        check_kept()
        return outputs


@dataclasses.dataclass(eq=False)
class Specialisation:
    """The step specialised on the Python values ``forward`` read when it was captured
    (``self.scale``, a global): its variants (one per set of values read on the host from
    tensors), its outputs, and the accumulators each variant gives gradients to, by
    capture index. Each call runs one, chosen by its guards (see ``_python_reads.py``)."""
    reads: PythonReads = dataclasses.field(default_factory=PythonReads)
    out_leaves: List[Any] = dataclasses.field(default_factory=list)
    out_spec: Any = None
    device_outputs: List[torch.Tensor] = dataclasses.field(default_factory=list)
    received: List[FrozenSet[int]] = dataclasses.field(default_factory=list)


class StepCapture:
    """What a captured step reads and writes on the device, kept across the
    captures of its variants so that every variant uses the same tensors."""

    def __init__(self, model: torch.nn.Module, state: DeviceState, training: bool,
                 optimizer: Optional[DeviceOptimizer], accumulate: bool,
                 device_inputs: List[torch.Tensor], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any], precision: Any, strategy: Any,
                 anchors: Optional[Anchors] = None, seed: int = 0,
                 module_namescope: bool = True, grouped: Optional[GroupedWeights] = None,
                 mean: Optional[MeanFactors] = None,
                 modes: Optional[List[Tuple[torch.nn.Module, bool]]] = None) -> None:
        self.model = model
        self.modes = modes if modes is not None else module_modes(model)
        self.strategy = strategy  # Options.setExecutionStrategy: places the model's blocks
        self.split: Optional[Split] = None  # how the blocks split the model (set by a capture)
        self.module_namescope = module_namescope  # ops named after modules in profiles
        self.grouped = grouped  # replica-grouped weights: forward sees its replica's row
        self.precision = precision  # Options.Precision: the casts of the forward
        # Random ops draw their seeds from the default generator seeded with
        # this while captured, so that capturing again (after
        # detachFromDevice, or in a process that loads the model) gives them
        # the same seeds, and the same random numbers for the same rng_state.
        self.seed = seed
        self.training = training
        self.optimizer = optimizer
        self.anchors = anchors  # Options.anchorTensor: more outputs of the step
        self.device_inputs = device_inputs
        self._state = state
        self._args = args  # the model's arguments, over the device inputs
        self._kwargs = kwargs
        self.trainable = state.parameters(model) if training else []
        self.hooks = ParameterHooks(state.host) if training else None  # param.register_hook
        for p in self.trainable:
            p.requires_grad_(True)
        self.accumulators: Dict[int, torch.Tensor] = (
            {id(p): optimizer.new_accumulator(p) for p in self.trainable} if accumulate else {})
        # Training.accumulationAndReplicationReductionType and its mean strategy
        self.mean = mean if mean is not None else MeanFactors(1.0, 1.0, False)
        # Running means: gradients each accumulator took since the update. One
        # count per accumulator, updated where it is, so that the stages of a
        # pipeline (each accumulating its own weights) never share one.
        self.counts: Dict[int, torch.Tensor] = (
            {key: torch.zeros((), device=acc.device) for key, acc in self.accumulators.items()}
            if self.mean.running else {})
        _C.synchronize()  # the zeros exist before the step: it must not zero them again
        # What the model returns, with its device tensors, is set by a specialisation's
        # first capture; its later variants write their results into the same tensors.
        self.specialisations = [Specialisation()]
        self.current = self.specialisations[0]  # the one calls run
        self.accumulate = accumulate
        self.variants = 0  # captures, of every specialisation
        # The kernel warnings the first capture gave (TORCH_WARN's, not
        # TORCH_WARN_ONCE's): each later call of the model gives them, as each
        # call on the CPU does. None when there are none.
        self.warnings: Optional[Any] = None
        # The update captured for each set of accumulators that variants gave a gradient
        # to: torch.optim skips a parameter whose .grad is None, so an iteration
        # updates only those its micro-batches' variants trained (no weight decay, no
        # momentum for the others; see UpdateVariants).
        self._updates: Dict[FrozenSet[int], Any] = {}

    @property
    def out_leaves(self) -> List[Any]:
        return self.current.out_leaves

    @property
    def out_spec(self) -> Any:
        return self.current.out_spec

    @property
    def device_outputs(self) -> List[torch.Tensor]:
        return self.current.device_outputs

    @property
    def received(self) -> List[FrozenSet[int]]:
        return self.current.received

    def _swapped_tensors(self) -> Dict[str, torch.Tensor]:
        """The device tensors by name, each module attribute under one name: a module
        registered under two names would otherwise be swapped twice by functional_call,
        which then restores the second name to the device tensor it saved. Tied tensors
        of distinct modules keep a name each (so tie_weights is not needed)."""
        names = []
        for prefix, module in self.model.named_modules():  # each module once
            dot = f"{prefix}." if prefix else ""
            names += [dot + n for n, p in module._parameters.items() if p is not None]
            names += [dot + n for n, b in module._buffers.items() if b is not None]
        return {name: self._state.tensors[name] for name in names}

    def micro_step(self) -> Any:
        """Captures one micro-batch's step from the data in the device inputs;
        returns its program."""
        recorder = LossRecorder(self.model)
        reads = self.current.reads  # what forward reads from Python guards the specialisation
        # Tensors made in forward without a device are constants of the step
        # on the IPU, as in PopTorch (random ones are drawn there on every run).
        scopes = (module_name_scopes(self.model) if self.module_namescope
                  else contextlib.nullcontext())
        # Autograd on for a training step whatever the caller's grad mode, as
        # PopTorch differentiates the step itself: its backward failed under
        # torch.no_grad() (the loss's scaling did not require grad).
        grad_mode = torch.enable_grad() if self.training else torch.no_grad()
        with grad_mode, self._seeded(), _in_modes(self.modes), _whole_step_capture(), \
                capturing_blocks(self.strategy) as blocks, recorder, RunningOnIpu(), \
                self._state.device, scopes:
            # A grouped weight's forward sees its replica's row.
            rows = self.grouped.views(self._state.tensors) if self.grouped else {}
            tensors = {**self._swapped_tensors(), **rows}
            # HostConstants first: the modes entered later see a call first
            # (Float64Demotion's 32-bit dtypes reach HostConstants).
            with _precision.forward_casting(self.precision, self.model), HostConstants(), \
                    Float64Demotion(), _recompute.capture_modes(_capture_modes), \
                    overlap_checks.checking((self._args, self._kwargs)) as overlaps, \
                    device_parameters(self.model, self._state.host, self._state.tensors):
                kept = _buffers.kept_check(self.model, {**self._state.tensors, **rows})
                with recording(self.model, reads):
                    outputs = _call_with(self.model, tensors, self._args, self._kwargs, kept)
                overlaps.check_outputs(outputs)
            try:
                self.split = blocks.end_forward()
            except Error as error:
                if self.grouped is None:
                    raise
                raise Error(f"{error}. Here they are the lookups of the replica-grouped weights "
                            "(per_replica_params), which run before forward: with grouped "
                            "weights, annotate the model with poptorch.BeginBlock instead of "
                            "`with poptorch.Block(...)` scopes") from None
            if self.training:
                # Gradient checkpointing (torch.utils.checkpoint) runs parts of forward
                # again in backward: they must read the device tensors, as forward did,
                # not the host's (stale once the device has trained them).
                with torch.nn.utils.stateless._reparametrize_module(
                        self.model, tensors, tie_weights=False, strict=False), \
                        device_parameters(self.model, self._state.host, self._state.tensors), \
                        self.hooks.on_device(self._state.tensors), \
                        recording(self.model, reads):
                    received = self._backward(recorder.loss(outputs))
            else:
                received = frozenset()
            self._bind_outputs((outputs, self.anchors.values() if self.anchors else {}))
            del outputs
            program = _C.prepare_program()
            warnings = _C.take_step_warnings()
        if self.variants == 0:
            self.warnings = warnings if len(warnings) else None
        # (op, block, stage, phase, ipu) of each node of the compiled step, and
        # the modelled peak of its temporaries on each IPU
        self.placements = program.placements()
        self.temporary_peaks = program.temporary_peaks()
        self.current.received.append(received)
        self.variants += 1
        return program

    def update(self, received: FrozenSet[int], scale: float) -> Any:
        """The program of the optimiser update of the accumulators in
        ``received`` (captured the first time)."""
        program = self._updates.get(received)
        if program is not None:
            return program
        accumulators = {key: acc for key, acc in self.accumulators.items() if key in received}
        with self._seeded(), _whole_step_capture(), outside_blocks():
            self.optimizer.capture_update(accumulators, scale, accumulated=True)
            with torch.no_grad():
                for count in self.counts.values():
                    count.zero_()
            program = _C.prepare_program()
        self._updates[received] = program
        return program

    def update_variants(self, scale: float, processes: Any = None) -> Any:
        """The updates to run after an iteration, chosen by the variants that
        ran in it. With replicas in other processes (a ProcessReplicas), a
        parameter trained in any process is updated in all of them."""
        variants = self.current.received

        def choose(ran: Sequence[int]) -> Any:
            received = frozenset().union(*(variants[i] for i in ran))
            if processes is not None:
                flags = torch.tensor([id(p) in received for p in self.trainable])
                flags = processes.any_of(flags)
                received = frozenset(id(p) for p, f in zip(self.trainable, flags) if f)
            return self.update(received, scale)

        return _C.UpdateVariants(self.update(variants[0], scale), choose,
                                 processes is not None)

    @contextlib.contextmanager
    def _seeded(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            yield

    def recapture(self, site: str, reason: str) -> Any:
        """Called by the runtime when no variant's guards hold for a micro-batch."""
        limit = max_step_variants()
        if self.variants >= limit:
            raise Error(
                f"the model reads a value on the host at {site}, and it changes from call to "
                f"call ({reason}). The step was captured {self.variants} times, once for each "
                f"value read, which is the limit (POPTORCH_MAX_STEP_VARIANTS={limit}). PopTorch "
                "compiles a static graph: compute that value outside the model and pass it as "
                "an input, or keep it on the device (e.g. torch.where instead of a Python `if` "
                "or a boolean mask).", location=site)
        logger.info("capturing the step again (variant %d): %s, read at %s",
                    self.variants + 1, reason, site)
        return self.micro_step()

    def follows_python_values(self) -> bool:
        """Makes current the specialisation whose guards on the Python values forward read
        hold (the current one first); False when none does."""
        if self.current.reads.hold():
            return True
        for specialisation in self.specialisations:
            if specialisation is not self.current and specialisation.reads.hold():
                logger.debug("the step runs its specialisation for: %s",
                             "; ".join(text for text, _ in self.current.reads.changes()))
                self.current = specialisation
                return True
        return False

    def specialise(self) -> Any:
        """Captures the step for the Python values forward reads now, which no
        specialisation was captured for (from the data in the device inputs); returns
        its first program. The limit of variants counts every capture."""
        changes = self.current.reads.changes()
        changed = "; ".join(text + (f", read at {site}" if site else "")
                            for text, site in changes)
        limit = max_step_variants()
        if self.variants >= limit:
            raise Error(
                f"the model's forward reads Python values that change from call to call "
                f"({changed}), and the step was captured {self.variants} times, once for each "
                f"set of values, which is the limit (POPTORCH_MAX_STEP_VARIANTS={limit}). "
                "PopTorch compiles a static graph: pass a value that changes as an input "
                "tensor, or raise the limit", location=next((site for _, site in changes
                                                             if site), None))
        logger.info("capturing the step again (variant %d): %s", self.variants + 1, changed)
        previous = self.current
        self.current = Specialisation()
        try:
            program = self.micro_step()
        except BaseException:
            self.current = previous
            raise
        self.specialisations.append(self.current)
        return program

    def _backward(self, loss: torch.Tensor) -> FrozenSet[int]:
        """Captures the backward pass and the accumulation (or update) of the
        gradients; returns the accumulators that take one."""
        grads = []
        if self.trainable and loss.requires_grad:
            if loss.dim() != 0:
                loss = loss.sum()
            if self.mean.loss != 1.0:  # MeanReductionStrategy.PostAndLoss
                loss = loss * self.mean.loss
            # backward(), as on the CPU, not autograd.grad: reentrant gradient
            # checkpointing (use_reentrant=True) refuses the latter.
            for p in self.trainable:
                p.grad = None
            (loss * self.optimizer.grad_scale).backward()
            grads = [p.grad for p in self.trainable]
            for p in self.trainable:
                p.grad = None
        gradients = {id(p): g for p, g in zip(self.trainable, grads) if g is not None}
        if self.anchors is not None:  # an anchored gradient that is missing is an error
            self.anchors.take_gradients(gradients, self.optimizer.grad_scale)
        if not gradients:
            # As in PopTorch, a training model whose loss no parameter that
            # requires grad reaches (a frozen model, a model in eval mode whose
            # loss reads only its inputs) still runs: the forward pass, buffers
            # included, and no weight update (torch's optimisers skip a
            # parameter without a gradient).
            if self.variants == 0:
                logger.warning("the loss of the training model depends on no parameter that "
                               "requires grad: each step runs the forward pass and updates "
                               "no weight")
            return frozenset()
        if self.accumulators:
            with torch.no_grad():
                for key, g in gradients.items():
                    acc = self.accumulators[key]
                    if self.counts:  # the running mean: acc += (g - acc) / count
                        count = self.counts[key].add_(1)
                        acc.mul_((count - 1) / count).add_(g.to(acc.dtype) / count)
                    else:
                        acc.add_(g.to(acc.dtype))
        else:
            self.optimizer.capture_update(gradients, 1.0, accumulated=False)
        return frozenset(gradients)

    def _on_device(self, output: torch.Tensor) -> torch.Tensor:
        """An output the model computed on the host (from a plain tensor
        attribute, not a buffer: the user guide's counter example) is, as in
        PopTorch, a constant of the step: every run returns its value at capture."""
        if output.device.type == "ipu":
            return output
        logger.warning("the model returns a %s tensor computed on the %s (from a tensor that is "
                       "neither an input, a parameter nor a buffer): it is a constant of the "
                       "step, each run returns its value at compilation; register the tensor "
                       "as a buffer to keep it on the IPU", list(output.shape), output.device)
        return output.to(self._state.device)

    def _bind_outputs(self, outputs: Any) -> None:
        leaves, spec = pytree.tree_flatten(outputs)
        leaves = [self._on_device(o.detach()) if isinstance(o, torch.Tensor) else o
                  for o in leaves]
        tensors = [o for o in leaves if isinstance(o, torch.Tensor)]
        current = self.current
        if current.out_spec is None:
            current.out_leaves, current.out_spec, current.device_outputs = leaves, spec, tensors
            return
        if spec != self.out_spec or [(o.shape, o.dtype) for o in tensors] != [
                (o.shape, o.dtype) for o in self.device_outputs] or [
                o for o in leaves if not isinstance(o, torch.Tensor)] != [
                o for o in self.out_leaves if not isinstance(o, torch.Tensor)]:
            raise Error("the model returns outputs of another structure, shape or value for "
                        "this batch than when it was first captured, after reading a value on "
                        "the host: PopTorch compiles a static graph, so outputs must keep "
                        "their structure and shapes")
        with torch.no_grad():
            for kept, new in zip(self.device_outputs, tensors):
                kept.copy_(new)
