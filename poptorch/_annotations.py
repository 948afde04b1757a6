"""Annotations that split a model into blocks, each run on an IPU:
``poptorch.BeginBlock``, ``poptorch.Block``, ``poptorch.BlockFunction`` and
``poptorch.removeBlocks`` (the user guide's "Annotations").

They act only while a ``trainingModel``/``inferenceModel`` captures its step
(:func:`capturing_blocks`): each block is placed by the execution strategy
(``_execution_strategy.py``) and the C++ capture records that placement on
every op the block runs, forward and backward. Elsewhere (on the CPU, in lazy
mode) they do nothing, as in PopTorch.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, NamedTuple, Optional,
                    Set, Union)

import torch

from . import _C
from ._errors import Error
from ._execution_strategy import Placement, _ExecutionStrategy

__all__ = ["BeginBlock", "Block", "BlockFunction", "removeBlocks"]

# Placement::block of ops outside every block (see csrc/ir/graph.h).
_BEFORE_BLOCKS = -1
_OUTSIDE_BLOCKS = -2

# A block's name: a string, or an integer (as PopTorch takes), which names
# block str(n).
BlockId = Union[str, int]


class Split(NamedTuple):
    """How a captured model is split: the stages and IPUs its ops use."""
    stages: List[int]
    ipus: List[int]
    blocks: Dict[str, Placement]

    @property
    def num_ipus(self) -> int:
        return max(self.ipus) + 1


class _BlockCapture:
    """The blocks met while one wrapped model's step is captured on this thread."""

    def __init__(self, strategy: _ExecutionStrategy, num_ipus: int) -> None:
        self._strategy = strategy
        self._num_ipus = num_ipus
        self._ids: List[str] = []            # block index -> user_id
        self._placements: List[Placement] = []
        self._index: Dict[str, int] = {}
        self._next_auto_id = 0
        self._scoped = False                 # a `with Block` scope was used
        self._enclosing: List[int] = []      # blocks whose scope encloses the current one
        self._current = _BEFORE_BLOCKS
        self._highest_stage = 0
        self._recomputing = False            # a checkpointed part runs again in backward
        self.split: Optional[Split] = None

    def next_auto_id(self) -> str:
        self._next_auto_id += 1
        return str(self._next_auto_id - 1)

    def reset_auto_id(self) -> None:
        self._next_auto_id = 0

    def begin(self, user_id: Optional[BlockId], ipu_id: Optional[int]) -> None:
        """From here on, the forward runs in block ``user_id``."""
        block = self.next_auto_id() if user_id is None else str(user_id)
        if block not in self._index:
            placement = self._strategy.place(block, ipu_id, len(self._ids))
            if placement.ipu >= self._num_ipus:
                raise Error(f"block {block!r} is on IPU {placement.ipu}, but there are "
                            f"{self._num_ipus} IPUs (0 to {self._num_ipus - 1}): use an ipu_id "
                            "below that, or more IPUs (POPTORCH_NUM_IPUS)")
            self._index[block] = len(self._ids)
            self._ids.append(block)
            self._placements.append(placement)
        index = self._index[block]
        placement = self._placements[index]
        if (self._strategy.pipelined and not self._recomputing
                and placement.stage < self._highest_stage):
            raise Error(f"block {block!r} is pipeline stage {placement.stage} but runs after "
                        f"stage {self._highest_stage}: in a pipeline, stages must run in "
                        "ascending order. Give later layers higher stages (their ipu_id with "
                        "AutoStage.SameAsIpu), use PipelinedExecution(AutoStage.AutoIncrement), "
                        "or use ShardedExecution, which allows stages in any order")
        self._highest_stage = max(self._highest_stage, placement.stage)
        self._set(index)

    def enter(self, user_id: Optional[BlockId], ipu_id: Optional[int]) -> None:
        self._scoped = True
        self._enclosing.append(self._current)
        self.begin(user_id, ipu_id)

    def exit(self) -> None:
        enclosing = self._enclosing.pop()
        self._set(enclosing if enclosing >= 0 else _OUTSIDE_BLOCKS)

    def _set(self, index: int) -> None:
        self._current = index
        stage, phase, ipu = self._placements[index] if index >= 0 else (0, 0, 0)
        _C.set_block(index, stage, phase, ipu)

    @contextlib.contextmanager
    def recomputing(self, current: int, enclosing: List[int], auto_id: int) -> Iterator[None]:
        """A checkpointed part of the forward runs again in backward, from where
        it began in the forward (``current``, ``enclosing``, ``auto_id``): its
        ops take the blocks they took then, and its blocks begin again (not a
        stage running after later ones)."""
        saved = (self._current, self._enclosing, self._next_auto_id, self._recomputing)
        self._enclosing, self._next_auto_id, self._recomputing = list(enclosing), auto_id, True
        _C.begin_recompute()
        try:
            self._set(current)
            yield
        finally:
            _C.end_recompute()
            self._current, self._enclosing, self._next_auto_id, self._recomputing = saved

    def end_forward(self) -> Split:
        """The forward is captured: checks that a model written with ``Block``
        scopes ran every op in one, and returns how the model is split."""
        _C.end_forward()
        stages: Set[int] = set()
        ipus: Set[int] = set()
        for block, nodes, first_op in _C.forward_block_use():
            if block < 0 and self._scoped:
                where = ("before the first poptorch.Block" if block == _BEFORE_BLOCKS else
                         "after a poptorch.Block scope ended")
                raise Error(f"{nodes} op(s) of the model (the first: {first_op}) run {where}, "
                            "outside every block: a model annotated with poptorch.Block scopes "
                            "must run all its layers inside one. Move them into a `with "
                            "poptorch.Block(...)` scope (or a poptorch.BlockFunction), or use "
                            "poptorch.BeginBlock, which also takes the layers that follow")
            placement = self._placements[block] if block >= 0 else Placement(0, 0, 0)
            stages.add(placement.stage)
            ipus.add(placement.ipu)
        self.split = Split(sorted(stages) or [0], sorted(ipus) or [0],
                           dict(zip(self._ids, self._placements)))
        return self.split


_local = threading.local()


def recompute_state() -> Optional[Callable[[], ContextManager[None]]]:
    """Where the forward is now among the blocks, to begin a checkpointed part's
    recomputation there (see _recompute.py); None outside a capture."""
    capture = _active()
    if capture is None:
        return None
    where = (capture._current, list(capture._enclosing), capture._next_auto_id)
    return lambda: capture.recomputing(*where)


def _active() -> Optional[_BlockCapture]:
    return getattr(_local, "capture", None)


@contextlib.contextmanager
def capturing_blocks(strategy: _ExecutionStrategy) -> Iterator[_BlockCapture]:
    """Blocks act while a wrapped model's step is captured on this thread."""
    if _active() is not None:
        raise Error("a model wrapped by trainingModel/inferenceModel was called while another "
                    "one's step was being captured on the same thread")
    capture = _BlockCapture(strategy, _C.device_count())
    _local.capture = capture
    _C.begin_placements()
    try:
        yield capture
    finally:
        _C.end_placements()
        _local.capture = None


@contextlib.contextmanager
def outside_blocks() -> Iterator[None]:
    """Ops captured meanwhile on this thread (a step's optimiser update) are
    in no block: each runs on the IPU whose memory holds its largest input."""
    _C.begin_placements()
    _C.end_forward()
    try:
        yield
    finally:
        _C.end_placements()


def _check_id(user_id: Any, ipu_id: Any, what: str) -> None:
    # PopTorch takes integer names too (BeginBlock(layer, 1, 2)): block 1 is
    # the block named "1", which Stage("1") lists.
    if user_id is not None and (isinstance(user_id, bool) or
                                not isinstance(user_id, (str, int))):
        raise Error(f"{what}: user_id is a string (the block's name), got {user_id!r}")
    if ipu_id is not None and (isinstance(ipu_id, bool) or not isinstance(ipu_id, int)
                               or ipu_id < 0):
        raise Error(f"{what}: ipu_id is an integer >= 0, got {ipu_id!r}")


class Block:
    """A scope of the model that runs in one block:

    >>> with poptorch.Block("Encoder", ipu_id=1):
    ...     x = self.encoder(x)

    Blocks with the same ``user_id`` are one block; the execution strategy
    groups blocks into stages (by default, a block's stage is its IPU).
    Outside a wrapped model's capture it does nothing."""

    def __init__(self, user_id: Optional[BlockId] = None, ipu_id: Optional[int] = None) -> None:
        _check_id(user_id, ipu_id, "poptorch.Block")
        self._user_id = user_id
        self._ipu_id = ipu_id

    @staticmethod
    def useAutoId() -> None:
        """Call at the start of ``forward``: blocks without a ``user_id`` are
        then named "0", "1", ... in the order they begin."""
        capture = _active()
        if capture is not None:
            capture.reset_auto_id()

    @staticmethod
    def start(user_id: Optional[BlockId] = None, ipu_id: Optional[int] = None) -> None:
        """Begins a block that lasts until the next one begins (as BeginBlock)."""
        _check_id(user_id, ipu_id, "poptorch.Block.start")
        capture = _active()
        if capture is not None:
            capture.begin(user_id, ipu_id)

    def __enter__(self) -> "Block":
        capture = _active()
        if capture is not None:
            capture.enter(self._user_id, self._ipu_id)
        return self

    def __exit__(self, *exc: Any) -> None:
        capture = _active()
        if capture is not None:
            capture.exit()


def BlockFunction(user_id: Optional[BlockId] = None,
                  ipu_id: Optional[int] = None) -> Callable[[Callable], Callable]:
    """Decorates a function so that it runs in a block:

    >>> @poptorch.BlockFunction("Decoder", ipu_id=1)
    ... def decoder(self, encoded):
    ...     return self.decoder_layers(encoded)
    """
    _check_id(user_id, ipu_id, "poptorch.BlockFunction")

    def decorator(function: Callable) -> Callable:
        @functools.wraps(function)
        def in_block(*args: Any, **kwargs: Any) -> Any:
            with Block(user_id, ipu_id):
                return function(*args, **kwargs)
        return in_block
    return decorator


class _BlockHook:
    """The forward pre-hook BeginBlock registers: the block begins when the
    layer is called, and lasts until another one begins."""

    def __init__(self, user_id: Optional[BlockId], ipu_id: Optional[int]) -> None:
        self.user_id = user_id
        self.ipu_id = ipu_id

    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        capture = _active()
        if capture is not None:
            capture.begin(self.user_id, self.ipu_id)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self.user_id!r}, ipu_id={self.ipu_id!r})"


class _BeginBlockFunction:
    """BeginBlock of a function rather than a layer."""

    def __init__(self, function: Callable, user_id: Optional[BlockId], ipu_id: Optional[int]):
        self._hook = _BlockHook(user_id, ipu_id)
        self._function = function
        # PopTorch's names, which its tests read.
        self._user_id = user_id
        self._ipu_id = ipu_id

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._hook(None, args)  # type: ignore[arg-type]
        return self._function(*args, **kwargs)


def BeginBlock(layer_to_call: torch.nn.Module, user_id: Optional[BlockId] = None,
               ipu_id: Optional[int] = None) -> torch.nn.Module:
    """Begins a block when ``layer_to_call`` runs: the layer and every layer
    after it run in this block, until another block begins. Returns the layer
    (changed in place).

    >>> model.encoder.layer[2] = poptorch.BeginBlock(model.encoder.layer[2], ipu_id=1)
    """
    _check_id(user_id, ipu_id, "poptorch.BeginBlock")
    if not isinstance(layer_to_call, torch.nn.Module):
        if callable(layer_to_call):
            return _BeginBlockFunction(layer_to_call, user_id, ipu_id)  # type: ignore[return-value]
        raise Error(f"poptorch.BeginBlock takes a torch.nn.Module (or a function), got "
                    f"{type(layer_to_call).__name__}")
    if isinstance(layer_to_call, torch.jit.ScriptModule):
        raise Error("poptorch.BeginBlock cannot annotate a TorchScript module "
                    f"({type(layer_to_call).__name__}: it takes no Python hooks): annotate the "
                    "Python module that calls it, or call it inside `with poptorch.Block(...)`")
    hooks = layer_to_call._forward_pre_hooks  # pylint: disable=protected-access
    if any(isinstance(hook, _BlockHook) for hook in hooks.values()):
        raise Error(f"module has already been assigned to a block (this "  # PopTorch's words
                    f"{type(layer_to_call).__name__} begins one): call "
                    "poptorch.removeBlocks(layer) first to annotate it again")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:
    """Removes every BeginBlock annotation from ``module`` and its submodules."""
    if not isinstance(module, torch.nn.Module):
        raise Error(f"poptorch.removeBlocks takes a torch.nn.Module, got {type(module).__name__}")
    for m in module.modules():
        hooks = m._forward_pre_hooks  # pylint: disable=protected-access
        for key in [k for k, hook in hooks.items() if isinstance(hook, _BlockHook)]:
            del hooks[key]
