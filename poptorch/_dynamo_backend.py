"""``torch.compile(model, backend="ipu")``.

Dynamo hands the backend each FX graph it captures. A graph dynamo captured
with gradients disabled (``torch.no_grad()``, which its guards then require of
every call) is run as dynamo gave it: the lazy capture records its ops at the
dispatcher, in place updates included, so AOTAutograd's functional ATen graph
and its runtime wrappers (tens of microseconds per call) would add nothing.
Otherwise AOTAutograd (``torch._dynamo.backends.common.aot_autograd``) turns it
into a forward and a backward ATen graph for training. Each graph
runs once on the call's ipu tensors under a whole-step capture, as a
wrapped model's step is captured, which gives a program (compiled, or found in
the executable cache by its structure); every later call replays that program
from C++ on the call's tensors (``_C.GraphReplay``): no Python per op and
nothing compiled. A replay in a training step appends the program's ops to the
pending lazy graph instead of running them, so that the forward, the lazy code
of the graph breaks (``loss.backward()``'s ``ones_like``), the backward and the
optimiser's step run as one program at the sync point (``loss.item()``). Inputs
of another layout (sizes, strides, dtypes) or other integer arguments (dynamic
shapes) capture another variant. Code between graphs (graph breaks) runs on ipu
tensors in lazy mode, as any code does.

Importing ``torch._dynamo`` costs about as much as importing torch, so the
backend is registered when dynamo is first imported (by ``torch.compile``,
``torch._dynamo.list_backends()``...), not when poptorch is.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections import OrderedDict
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.utils._pytree as pytree

from . import _C
from ._dynamo_adam import fuse_adam, host_steps_as_inputs
from ._dynamo_dropout import use_counter_based_dropout
from ._dynamo_sgd import fuse_sgd_momentum
from ._errors import Error
from ._logging import logger
from ._step_capture import _whole_step_capture

# torch.compile's modes tune inductor's kernels and CUDA graphs; this backend
# always replays its programs without Python, which is what "reduce-overhead" asks for.
_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

_INDUCTOR_REFUSAL = (
    "inductor, torch.compile's default backend, cannot compile graphs of ipu tensors: use "
    "torch.compile(model, backend=\"ipu\"), which compiles them for the ipu")


def ipu(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, mode: Optional[str] = None,
        options: Optional[Dict[str, Any]] = None) -> Callable[..., Any]:
    """The dynamo backend behind ``torch.compile(model, backend="ipu")``."""
    if mode is not None and mode not in _MODES:
        raise Error(f"torch.compile(backend=\"ipu\") has no mode {mode!r}: use one of "
                    f"{', '.join(_MODES)} (all replay the compiled programs without Python)")
    if options:
        raise Error(f"torch.compile(backend=\"ipu\") takes no options, got {sorted(options)}: "
                    "they configure inductor, which the ipu backend does not use")
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    recompile = bool(compile_id is not None and compile_id.frame_compile_id)
    _C.count_dynamo_graph(recompile)
    if recompile:
        logger.info("torch.compile(backend=\"ipu\"): dynamo compiles a function again (compile "
                    "%s) because a guard failed; TORCH_LOGS=recompiles says which", compile_id)
    if not torch.is_grad_enabled() and not _sets_grad_mode(gm):
        # The optimiser's step is such a graph.
        fuse_sgd_momentum(gm)
        fuse_adam(gm)
        gm, host_steps = host_steps_as_inputs(gm)
        replayed = ReplayedGraph(gm, [*example_inputs, *(h.example() for h in host_steps)])
        if host_steps:
            return lambda *args: replayed([*args, *(h() for h in host_steps)])
        return lambda *args: replayed(list(args))
    # Inference graphs write their inputs in place (an optimiser's step: the
    # parameters), rather than return new values for Python to copy back.
    return aot_autograd(fw_compiler=_training_graph, bw_compiler=_training_graph,
                        inference_compiler=ReplayedGraph,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def _training_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> "ReplayedGraph":
    """AOTAutograd's forward or backward graph: its replays join the step."""
    use_counter_based_dropout(gm)
    return ReplayedGraph(gm, example_inputs, joins_step=True)


class ReplayedGraph:
    """An ATen graph of AOTAutograd as a boxed function of its arguments:
    captured on the ipu at its first call and replayed afterwards.

    A replay's ops join the pending lazy graph (``_C.GraphReplay.run``), to run
    at the next sync point with the ops around them: a training step's forward
    (``joins_step``), the lazy ``ones_like`` of ``loss.backward()``, the
    backward and the optimiser's graph become one program, whose activations
    are temporaries. Other graphs join only what is pending, and run at once
    when nothing is."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 joins_step: bool = False) -> None:
        # AOTAutograd passes the arguments as a list we may clear. An instance
        # attribute: dynamo's wrappers (functools.wraps) copy only those.
        self._boxed_call = True
        self._gm = gm
        self._lazy_reason = _why_not_replayable(gm, example_inputs)
        if self._lazy_reason:
            logger.info("torch.compile(backend=\"ipu\"): a graph runs in lazy mode (op by op "
                        "from Python, its executable cached) because %s", self._lazy_reason)
        # Non-tensor arguments (symbolic sizes under dynamic shapes): each set
        # of values is a graph of its own.
        self._scalars = [i for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)]
        self._joins_step = joins_step
        # Least recently used first; at most as many as the executable cache keeps
        # (a loop over ever new sizes would otherwise hold every program).
        self._replays: "OrderedDict[Tuple[Any, ...], _Replay]" = OrderedDict()

    def __call__(self, args: List[Any]) -> Any:
        if self._lazy_reason:
            outputs = self._gm(*args)
            args.clear()
            return outputs
        key = tuple(args[i] for i in self._scalars)
        replay = self._replays.get(key)
        if replay is None:
            replay = self._replays[key] = _Replay(self._joins_step)
            while len(self._replays) > max(1, _C.executable_cache_capacity()):
                self._replays.popitem(last=False)
        else:
            self._replays.move_to_end(key)
        tensors = [a for a in args if isinstance(a, torch.Tensor)] if self._scalars else args
        outputs = replay.graph.run(tensors)
        if outputs is None:
            if _C.capturing_step():  # inside a wrapped model's step: the ops join it
                return self._gm(*args)
            outputs = self._capture(replay, args, tensors)
        args.clear()  # AOTAutograd's convention: saved activations go as soon as they can
        return replay.fill(outputs)

    def _capture(self, replay: "_Replay", args: List[Any],
                 tensors: List[torch.Tensor]) -> List[torch.Tensor]:
        inputs = iter(_C.GraphReplay.capture_inputs(tensors))
        capture_args = [next(inputs) if isinstance(a, torch.Tensor) else a for a in args]
        # Random ops draw their seeds at capture; every run replays them with a
        # salt drawn then instead, so the capture leaves the generator alone.
        with torch.no_grad(), torch.random.fork_rng(devices=[]), _whole_step_capture():
            captured = self._gm(*capture_args)
            program = _C.prepare_program()
        leaves = list(captured)
        out_tensors = [o for o in leaves if isinstance(o, torch.Tensor)]
        replay.graph.add(program, [a for a in capture_args if isinstance(a, torch.Tensor)],
                         out_tensors)
        replay.template = [None if isinstance(o, torch.Tensor) else o for o in leaves]
        replay.positions = [i for i, o in enumerate(leaves) if isinstance(o, torch.Tensor)]
        del captured, leaves, out_tensors, capture_args, program
        outputs = replay.graph.run(tensors)
        assert outputs is not None, "a graph just captured must replay on its inputs"
        return outputs


class _Replay:
    """The variants of one graph for one set of non-tensor arguments, and
    where its tensors go among its outputs."""

    def __init__(self, joins_step: bool) -> None:
        self.graph = _C.GraphReplay(joins_step)
        self.template: List[Any] = []
        self.positions: List[int] = []

    def fill(self, tensors: List[torch.Tensor]) -> List[Any]:
        outputs = list(self.template)
        for position, tensor in zip(self.positions, tensors):
            outputs[position] = tensor
        return outputs


def _sets_grad_mode(gm: torch.fx.GraphModule) -> bool:
    """True if the graph turns gradients on or off (``torch.enable_grad()``
    inside a ``no_grad`` region): AOTAutograd decides what needs them."""
    return any(node.op == "call_function" and node.target is torch._C._set_grad_enabled
               for node in gm.graph.nodes)


def _why_not_replayable(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """Why the graph cannot be replayed on the ipu ("" if it can): it computes
    on another device, whose ops a capture on the ipu does not record."""
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if x.device.type != "ipu":
                return f"its argument {i} is a tensor on {x.device}"
        elif not isinstance(x, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            return f"its argument {i} is a {type(x).__name__}"
    for node in gm.graph.nodes:
        # "val" in AOTAutograd's graphs, "example_value" in dynamo's.
        value_meta = node.meta.get("val", node.meta.get("example_value"))
        for value in pytree.tree_leaves(value_meta):
            if isinstance(value, torch.Tensor) and value.device.type != "ipu":
                return f"{node.format_node()} computes a tensor on {value.device}"
    return ""


def _refuse_inductor(*args: Any, **kwargs: Any) -> None:
    raise Error(_INDUCTOR_REFUSAL)


class _InductorRefusal:
    """The ipu's scheduling and wrapper codegen in inductor's device registry:
    made by nothing, as the pass over ipu graphs raises first."""

    supports_caching = False  # nothing of an ipu graph may come from inductor's cache

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse_inductor()

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> None:
        _refuse_inductor()


def _register_backend(registry: ModuleType) -> None:
    registry.register_backend(compiler_fn=ipu, name="ipu")


def _frames_dynamo_skips(eval_frame: ModuleType) -> None:
    # Frames dynamo runs as they are, with all they call:
    # * Lazy capture asks Python (poptorch._fake_cpu) for the results of some
    #   ops. Between compiled graphs (a graph break, loss.backward()) dynamo's
    #   frame hook is still on, so it traced those functions as user code:
    #   seconds of tracing, graph breaks at FakeTensor and guards at every later
    #   call. They and what they call are poptorch's and torch's, never the user's.
    # * A trainingModel/inferenceModel compiles and runs its whole step itself.
    #   Traced by dynamo (torch.compile of the wrapper, or a compiled function
    #   calling it) its Python became a dozen graph breaks and ~45 s of tracing
    #   before the first call, and recompiles after. A traced call of its
    #   methods is instead a graph break, as at a torch.compiler.disable'd
    #   function.
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    from . import _dynamo_disable, _fake_cpu
    from ._executor import LOCKED_CODE, PoplarExecutor

    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for code in (_fake_cpu.fake.__code__, _fake_cpu.run.__code__, LOCKED_CODE):
        eval_frame.set_code_exec_strategy(code, skip)
    for method in vars(PoplarExecutor).values():
        if getattr(method, "__code__", None) is LOCKED_CODE:
            method._torchdynamo_disable = True
            method._torchdynamo_disable_msg = (
                "a poptorch model (trainingModel/inferenceModel) compiles and runs its whole "
                "step itself")
    _dynamo_disable.skip_in_dynamo(eval_frame)


def _refuse_in_inductor(codegen: ModuleType) -> None:
    # Inductor's way for a device to take part (a scheduling, wrapper codegen
    # and a pass over graphs on the device); the pass runs before any code is
    # generated and raises, instead of inductor's `KeyError: 'ipu'`.
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    class RefusalPass(CustomGraphModulePass):
        """A pass inductor's graph cache can key on (it hashes every device's
        pass, for graphs on any device, and refuses plain functions)."""

        def __call__(self, gm: torch.fx.GraphModule) -> None:
            _refuse_inductor()

        def uuid(self) -> str:
            return "poptorch-ipu-refusal"

    codegen.register_backend_for_device("ipu", _InductorRefusal, _InductorRefusal,
                                        _InductorRefusal, _InductorRefusal,
                                        device_custom_pass=RefusalPass())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``action(module)`` once the module ``name`` has been imported."""

    def __init__(self, name: str, action: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._action = action

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # from the finders after this one
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def execute_then_act(module: ModuleType) -> None:
                execute(module)
                self._action(module)

            spec.loader.exec_module = execute_then_act  # type: ignore[method-assign]
        return spec


def _when_imported(name: str, action: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        action(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, action))


def _index_fake_ipu_devices(fake_tensor: ModuleType) -> None:
    # Dynamo traces on FakeTensors, which give a device without an index
    # (torch.zeros(n, device="ipu")) the current one only for the device types
    # _is_indexed_device_type lists, as eager's device guard does for every
    # type. Without it such a tensor is on "ipu" beside the model's on "ipu:0",
    # and ops that check their operands share a device (index_add_) refused
    # them while tracing, where eager runs.
    listed = fake_tensor._is_indexed_device_type
    fake_tensor._is_indexed_device_type = lambda device_type: (
        device_type == "ipu" or listed(device_type))


def install() -> None:
    """Registers the backend "ipu" with dynamo (and keeps dynamo out of
    capture's own Python), and inductor's refusal of ipu graphs, each when its
    module is imported; gives ipu FakeTensors made without a device index the
    current one, as other devices'."""
    _when_imported("torch._dynamo.backends.registry", _register_backend)
    _when_imported("torch._subclasses.fake_tensor", _index_fake_ipu_devices)
    _when_imported("torch._dynamo.eval_frame", _frames_dynamo_skips)
    _when_imported("torch._inductor.codegen.common", _refuse_in_inductor)
