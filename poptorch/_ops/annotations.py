"""PopTorch ops that tell the IPU compiler how to run what they wrap:
``nop``, ``set_available_memory``, ``set_overlap_for_input/output``,
``serializedMatMul`` and ``MultiConv``. Their values are those of the plain
computation; the emulated IPU Model plans no tiles, so the planning hints are
checked and logged, and change nothing.
"""
from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence, Union

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _C
from .._errors import AssertionCompatibleError, Error, ValueCompatibleError
from .._logging import logger
from .._losses import isRunningOnIpu
from ..enums import MatMulSerializationMode, MultiConvPlanType, OverlapMode
from . import overlap_checks

_logged: set = set()
_multi_conv = threading.local()  # .active: a MultiConv scope is open in a captured model


def _log_once(what: str, why: str) -> None:
    if what not in _logged:
        _logged.add(what)
        logger.info("%s is accepted but the emulated IPU Model ignores it: %s", what, why)


@torch.library.custom_op("poptorch::nop", mutates_args=(), device_types="cpu")
def _nop(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


@_nop.register_fake
def _nop_fake(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor)


_nop.register_autograd(lambda ctx, grad: grad)


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """An identity that is never optimised away (the ``poptorch::nop`` op of
    the program, a copy of ``tensor``): useful for debugging."""
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"nop must take a torch.Tensor argument; {type(tensor).__name__} is not "
                    "supported")
    return _nop(tensor)


def set_available_memory(tensor: torch.Tensor,
                         available_memory_proportion: float) -> torch.Tensor:
    """Sets the proportion of tile memory the op producing ``tensor`` may use
    for temporaries (between 0 and 1). Returns ``tensor``. The memory model
    bounds a matrix multiplication's working memory by it (in a wrapped
    model's compile-time check); values are unchanged, and other ops
    (convolutions, embeddings) are not modelled."""
    if not isinstance(tensor, torch.Tensor):
        raise Error("You may only set available memory for torch.Tensor values; "
                    f"{type(tensor).__name__} is not supported")
    if not isinstance(available_memory_proportion, (int, float)) or not (
            0.0 <= available_memory_proportion <= 1.0):
        raise Error("set_available_memory: available_memory_proportion must be between 0 "
                    f"and 1, got {available_memory_proportion!r}")
    if not (tensor.device.type == "ipu" and
            _C.set_matmul_available_memory(tensor, float(available_memory_proportion))):
        _log_once("poptorch.set_available_memory on an op other than a pending ipu matmul",
                  "only matrix multiplications' memory is modelled")
    return tensor


def _set_overlap(tensors: Any, mode: OverlapMode, what: str) -> Any:
    if not isinstance(mode, OverlapMode):
        raise Error(f"set_overlap_for_{what}: mode must be a poptorch.OverlapMode, got "
                    f"{mode!r}")
    checks = overlap_checks.current()  # in a wrapped model's forward
    for leaf in pytree.tree_leaves(tensors):
        if not isinstance(leaf, torch.Tensor):
            raise Error(f"You may only set overlap for torch.Tensor {what}s; "
                        f"{type(leaf).__name__} is not supported")
        if checks is not None:
            (checks.mark_input if what == "input" else checks.mark_output)(leaf)
    if mode != OverlapMode.NoOverlap:
        _log_once(f"poptorch.set_overlap_for_{what}",
                  "host transfers are copies between host buffers, with no IO tiles")
    return tensors


def set_overlap_for_input(input_tensors: Any, mode: OverlapMode) -> Any:
    """Asks for the host-to-IPU copies of ``input_tensors`` (a tensor or a
    nested tuple/list/dict of them) to overlap computation; returns them."""
    return _set_overlap(input_tensors, mode, "input")


def set_overlap_for_output(output_tensors: Any, mode: OverlapMode) -> Any:
    """Asks for the IPU-to-host copies of ``output_tensors`` to overlap
    computation; returns them."""
    return _set_overlap(output_tensors, mode, "output")


# ir::MatMulPlan::Split of each mode.
_SPLITS = {MatMulSerializationMode.InputChannels: 1, MatMulSerializationMode.ReducingDim: 2,
           MatMulSerializationMode.OutputChannels: 3}


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor, mode: MatMulSerializationMode,
                     factor: int = 0, keep_precision: bool = False) -> torch.Tensor:
    """``lhs @ rhs``, which PopTorch computes as ``factor`` smaller products
    split along the dimension ``mode`` names (``InputChannels``: the rows of
    ``lhs``, ``ReducingDim``: the reduced dimension, ``OutputChannels``: the
    columns of ``rhs``), to use less memory. ``factor`` must divide that
    dimension. The emulator computes the product whole (the value is the
    same); the memory model counts the working memory of one part (see the
    user guide's "Memory per IPU")."""
    if not isinstance(mode, MatMulSerializationMode):
        raise Error(f"serializedMatMul: mode must be a poptorch.MatMulSerializationMode, got "
                    f"{mode!r}")
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 0:
        raise Error(f"serializedMatMul: factor must be an integer >= 0, got {factor!r}")
    if not isinstance(keep_precision, bool):
        raise Error(f"serializedMatMul: keep_precision must be a bool, got {keep_precision!r}")
    if mode != MatMulSerializationMode.Disabled:
        dims = {MatMulSerializationMode.InputChannels: ("rows of lhs", lhs.shape[-2]),
                MatMulSerializationMode.ReducingDim: ("columns of lhs", lhs.shape[-1]),
                MatMulSerializationMode.OutputChannels: ("columns of rhs", rhs.shape[-1])}
        name, size = dims[mode]
        if factor < 1 or size % factor != 0:
            raise Error(f"serializedMatMul: the factor ({factor}) must divide the dimension "
                        f"{mode.name} splits (the {size} {name})")
    result = torch.matmul(lhs, rhs)
    if mode != MatMulSerializationMode.Disabled and result.device.type == "ipu":
        _C.serialize_matmul(result, _SPLITS[mode], factor)
    return result


def recomputationCheckpoint(*tensors: Any) -> Any:
    """Marks ``tensors`` (one or more, or one list/tuple of them) as values a
    pipeline stage keeps between its forward and backward passes when
    recomputation is enabled, and returns them (a tuple for several). The
    emulator does not recompute (as PopTorch without recomputation enabled):
    the values and the modelled memory are those of the plain model."""
    sequence = len(tensors) == 1 and isinstance(tensors[0], (list, tuple))
    values = tensors[0] if sequence else tensors
    for tensor in values:
        if not isinstance(tensor, torch.Tensor):
            raise Error(f"recomputationCheckpoint takes tensors, got {type(tensor).__name__}")
    if values:
        _log_once("poptorch.recomputationCheckpoint", "it recomputes nothing")
    if sequence:
        return type(values)(values)
    return values[0] if len(values) == 1 else tuple(values)


def _per_conv(name: str, value: Any, kind: type) -> Optional[tuple]:
    """``value`` for every convolution (one value) or per convolution (a list)."""
    if value is None:
        return None
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)

    def valid(v: Any) -> bool:  # bool is an int, but not a number of tiles
        return isinstance(v, bool) if kind is bool else (
            isinstance(v, kind) and not isinstance(v, bool))
    if not values or not all(valid(v) for v in values):
        raise Error(f"MultiConv: invalid {name} {value!r}")
    return values


class _CountConvolutions(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() in ("aten::convolution", "aten::_convolution"):
            self.count += 1
        return func(*args, **(kwargs or {}))


class MultiConv:
    """Combines the convolutions run inside the scope into one
    multi-convolution, which PopLibs plans together:

    >>> with poptorch.MultiConv():
    ...     y = self.convA(x)
    ...     v = self.convB(u)

    The per-convolution settings (a single value for all, or one per
    convolution) are checked against the convolutions of the scope. The
    emulator runs each convolution as it is: results are those of the plain
    convolutions.
    """

    def __init__(self) -> None:
        self._settings: dict = {}
        self._counter: Optional[_CountConvolutions] = None

    def availableMemoryProportions(self, value: Union[float, List[float]]) -> "MultiConv":
        """The proportion of memory for temporaries, each in [0, 1)."""
        values = _per_conv("available memory proportion", value, float)
        if values and not all(0.0 <= v < 1.0 for v in values):
            raise Error(f"MultiConv: available memory proportions must be in [0, 1), got {value}")
        return self._set("availableMemoryProportions", values)

    def partialsTypes(self, value: Union[torch.dtype, List[torch.dtype]]) -> "MultiConv":
        """The type of partial sums (``torch.float`` or ``torch.half``); another
        value is a ``ValueError`` (also a ``poptorch.Error``), as in PopTorch."""
        values = value if isinstance(value, (list, tuple)) else (value,)
        if not values or not all(v in (torch.float32, torch.float16) for v in values):
            raise ValueCompatibleError(f"Invalid partials types: {value!r}. MultiConv "
                                       "partials types are torch.float or torch.half")
        return self._set("partialsTypes", tuple(values))

    def enableConvDithering(self, value: Union[bool, List[bool]]) -> "MultiConv":
        """Per-convolution dithering of tile placement."""
        return self._set("enableConvDithering", _per_conv("dithering", value, bool))

    def planType(self, value: Optional[MultiConvPlanType]) -> "MultiConv":
        """``MultiConvPlanType.Parallel`` or ``Serial``; another value is an
        ``AssertionError`` (also a ``poptorch.Error``), as in PopTorch."""
        if value is not None and not isinstance(value, MultiConvPlanType):
            raise AssertionCompatibleError(f"Invalid plan type: {value!r}. MultiConv plan "
                                           "types are poptorch.MultiConvPlanType.Parallel "
                                           "or Serial")
        return self._set("planType", value)

    def perConvReservedTiles(self, value: int) -> "MultiConv":
        """Tiles reserved for each convolution."""
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise Error(f"MultiConv: perConvReservedTiles must be an integer >= 0, got {value!r}")
        return self._set("perConvReservedTiles", value)

    def cycleBackOff(self, value: float) -> "MultiConv":
        """Cycle back-off proportion, between 0 and 1."""
        if not isinstance(value, float) or not 0.0 <= value <= 1.0:
            raise Error(f"MultiConv: cycleBackOff must be a float between 0 and 1, got {value!r}")
        return self._set("cycleBackOff", value)

    def _set(self, key: str, value: Any) -> "MultiConv":
        self._settings[key] = value
        return self

    def __enter__(self) -> "MultiConv":
        # As PopTorch, in a model being compiled for the IPU (its MultiConv
        # does nothing on the CPU): scopes do not nest.
        if isRunningOnIpu() and getattr(_multi_conv, "active", False):
            raise Error("Nested poptorch.MultiConv is not supported: close the outer "
                        "`with poptorch.MultiConv():` scope before opening another")
        self._counter = _CountConvolutions()
        self._counter.__enter__()
        _multi_conv.active = isRunningOnIpu()
        return self

    def __exit__(self, *exc: Any) -> None:
        counter, self._counter = self._counter, None
        counter.__exit__(*exc)
        _multi_conv.active = False
        if exc[0] is not None:
            return
        if isRunningOnIpu() and counter.count == 0:
            raise Error("Unexpected end_multi_conv: the poptorch.MultiConv scope ran no "
                        "convolution; put the convolutions to combine inside it")
        for key, value in self._settings.items():
            if isinstance(value, Sequence) and len(value) not in (1, counter.count):
                raise Error(f"MultiConv: {key} has {len(value)} values for {counter.count} "
                            "convolutions: give one value for all, or one per convolution")
        if self._settings:
            _log_once("poptorch.MultiConv settings", "convolutions run one by one on the host")
