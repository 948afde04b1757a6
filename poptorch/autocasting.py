"""PopTorch's automatic casting between float16 and float32.

* ``Policy(fp16, fp32, promote, demote)``: which operations (torch functions,
  by name, or layer classes) run in float16, in float32, or in the widest or
  narrowest precision of their inputs when those mix float16 and float32.
* Autocast regions: ``with poptorch.autocast():``, ``@poptorch.autocast()``
  and ``layer.autocast()`` (hierarchical: a layer's setting covers the layers
  inside it); ``enabled=False`` makes a region where the policy is off.
* Outside the policy, an operation mixing float16 and float32 follows
  ``Options.Precision.halfFloatCasting``: float16 (PopTorch's default,
  ``FloatDowncastToHalf``) or float32 (``HalfUpcastToFloat``, PyTorch's rule).
  In-place operations keep their output's dtype, as in PyTorch.

The casts are made where the operation is called (a ``TorchFunctionMode``),
above autograd, so the backward runs in the precision the forward chose while
the weights stay in their own dtype (float32 master weights keep their small
updates). In ``trainingModel``/``inferenceModel`` the casting rule applies to the
whole forward, with the options' policy; in lazy mode (``model.to("ipu")``)
autocast regions and layers apply the default policy's operations and the rest
follows PyTorch. Only ipu tensors are cast.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence,
                    Tuple, TypeVar)

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._errors import Error
from .enums import HalfFloatCastingBehavior

__all__ = ["Policy", "autocast", "default"]

_HALF, _FLOAT = torch.float16, torch.float32
_CASTABLE = (_HALF, _FLOAT)
_local = threading.local()


def _regions() -> List[bool]:
    """This thread's stack of autocast regions (innermost last)."""
    if not hasattr(_local, "regions"):
        _local.regions = []
    return _local.regions


class Policy:
    """An automatic casting policy: four lists of torch functions (``torch.bmm``,
    ``torch.relu``...) and/or layer classes (``torch.nn.Conv2d``...).

    :param fp16: run in float16.
    :param fp32: run in float32.
    :param promote: run in float32 when their inputs (a layer's: its parameters)
        mix float16 and float32.
    :param demote: run in float16 when their inputs mix float16 and float32.
    """

    def __init__(self, fp16: Optional[Sequence[Any]] = None,
                 fp32: Optional[Sequence[Any]] = None,
                 promote: Optional[Sequence[Any]] = None,
                 demote: Optional[Sequence[Any]] = None) -> None:
        self.fp16 = list(fp16 or [])
        self.fp32 = list(fp32 or [])
        self.promote = list(promote or [])
        self.demote = list(demote or [])
        self._ops: Dict[str, Dict[str, None]] = {}
        self._layers: Dict[str, Tuple[type, ...]] = {}
        for kind in ("fp16", "fp32", "promote", "demote"):
            entries = getattr(self, kind)
            if isinstance(entries, (str, bytes)) or not all(map(_valid_entry, entries)):
                raise Error(f"poptorch.autocasting.Policy: {kind} must be a list of torch "
                            f"functions (e.g. torch.bmm) or torch.nn.Module classes (e.g. "
                            f"torch.nn.Conv2d), got {entries!r}")
            self._ops[kind] = {e.__name__: None for e in entries if not _is_layer_class(e)}
            self._layers[kind] = tuple(e for e in entries if _is_layer_class(e))

    def _op_dtype(self, name: str, mixed: bool) -> Optional[torch.dtype]:
        """What the operation ``name`` runs in under this policy, or None."""
        if mixed:
            if name in self._ops["promote"]:
                return _FLOAT
            if name in self._ops["demote"]:
                return _HALF
        if name in self._ops["fp16"]:
            return _HALF
        if name in self._ops["fp32"]:
            return _FLOAT
        return None

    def _layer_dtype(self, layer: torch.nn.Module) -> Optional[torch.dtype]:
        """What every operation of ``layer`` runs in under this policy, or None."""
        dtypes = {p.dtype for p in layer.parameters() if p.dtype in (_HALF, _FLOAT)}
        if len(dtypes) == 2:
            if isinstance(layer, self._layers["promote"]):
                return _FLOAT
            if isinstance(layer, self._layers["demote"]):
                return _HALF
        if isinstance(layer, self._layers["fp16"]):
            return _HALF
        if isinstance(layer, self._layers["fp32"]):
            return _FLOAT
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and all(
            getattr(self, kind) == getattr(other, kind)
            for kind in ("fp16", "fp32", "promote", "demote"))

    __hash__ = None  # type: ignore[assignment]  (mutable lists)

    def __repr__(self) -> str:
        def names(entries: List[Any]) -> str:
            return "[" + ", ".join(e.__name__ for e in entries) + "]"
        return (f"Policy(fp16={names(self.fp16)}, fp32={names(self.fp32)}, "
                f"promote={names(self.promote)}, demote={names(self.demote)})")


def _is_layer_class(entry: Any) -> bool:
    return isinstance(entry, type) and issubclass(entry, torch.nn.Module)


def _valid_entry(entry: Any) -> bool:
    return _is_layer_class(entry) or (callable(entry) and isinstance(
        getattr(entry, "__name__", None), str))


FuncT = TypeVar("FuncT", bound=Callable[..., Any])


class autocast:  # pylint: disable=invalid-name  (PopTorch's name)
    """An automatic casting region for the operations and layers called in it::

        with poptorch.autocast():
            y = layer(x)

        @poptorch.autocast()
        def forward(self, x): ...

    ``enabled=False`` makes a region where automatic casting is off. Regions nest;
    the innermost decides. In lazy mode a region applies the default policy."""

    def __init__(self, enabled: bool = True) -> None:
        if not isinstance(enabled, bool):
            raise Error(f"poptorch.autocast(enabled) takes a bool, got {enabled!r}")
        self.enabled = enabled
        self._lazy: List[Any] = []

    def __enter__(self) -> "autocast":
        _regions().append(self.enabled)
        if _active_mode() is None:  # lazy mode: the default policy, PyTorch's rule outside it
            cast = casting(default, None, True)
            cast.__enter__()
            self._lazy.append(cast)
        else:
            self._lazy.append(None)
        return self

    def __exit__(self, *exc: Any) -> None:
        _regions().pop()
        cast = self._lazy.pop()
        if cast is not None:
            cast.__exit__(*exc)

    def __call__(self, func: FuncT) -> FuncT:
        @functools.wraps(func)
        def autocast_wrapper(*args: Any, **kwargs: Any) -> Any:
            with autocast(self.enabled):
                return func(*args, **kwargs)
        return autocast_wrapper  # type: ignore[return-value]


def _module_autocast(self: torch.nn.Module, enabled: bool = True) -> torch.nn.Module:
    """Turns PopTorch's automatic casting on (or off) for this layer and the
    layers inside it: its forward runs in ``poptorch.autocast(enabled)``.
    Returns the layer."""
    if not isinstance(enabled, bool):
        raise Error(f"{type(self).__name__}.autocast(enabled) takes a bool, got {enabled!r}")
    self._poptorch_autocast = enabled
    if not getattr(self, "_poptorch_autocast_hooks", False):
        self.register_forward_pre_hook(_enter_layer_region)
        self.register_forward_hook(_leave_layer_region, always_call=True)
        self._poptorch_autocast_hooks = True
    return self


def _enter_layer_region(layer: torch.nn.Module, _inputs: Any) -> None:
    region = autocast(layer._poptorch_autocast)
    region.__enter__()
    if not hasattr(_local, "layer_regions"):
        _local.layer_regions = []
    _local.layer_regions.append(region)


def _leave_layer_region(_layer: torch.nn.Module, _inputs: Any, _output: Any) -> None:
    _local.layer_regions.pop().__exit__(None, None, None)


# PopTorch's API: every layer has autocast().
torch.nn.Module.autocast = _module_autocast  # type: ignore[attr-defined]

# PopTorch's default policy, plus linear (nn.Linear's op, in PyTorch's autocast lists too).
default_fp16 = [
    torch.nn.functional.linear, torch.addbmm, torch.addmm, torch.addmv, torch.addr,
    torch.baddbmm, torch.bmm, torch.chain_matmul, torch.conv1d, torch.conv2d, torch.conv3d,
    torch.conv_tbc, torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d, torch.convolution,
    torch.matmul, torch.mm, torch.mv, torch.nn.Conv2d]
default_fp32: List[Any] = []
default_promote = [
    torch.addcdiv, torch.addcmul, torch.atan2, torch.bilinear, torch.cat, torch.cross, torch.dot,
    torch.equal, torch.index_put, torch.stack, torch.tensordot]
default_demote: List[Any] = []
default = Policy(default_fp16, default_fp32, default_promote, default_demote)


# --- the casting mode ------------------------------------------------------

# Operators called through Python's operator syntax, by the name of their function.
_OPERATORS = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__add__": "add",
              "__radd__": "add", "__sub__": "sub", "__rsub__": "sub", "__mul__": "mul",
              "__rmul__": "mul", "__truediv__": "div", "__rtruediv__": "div",
              "__pow__": "pow", "__rpow__": "pow", "__mod__": "remainder",
              "__floordiv__": "floor_divide"}

# Arguments (by position) an operation updates in place: never cast, since a
# cast copy would take the update.
_RUNNING_STATISTICS: Dict[Callable[..., Any], Tuple[int, ...]] = {
    F.batch_norm: (1, 2), torch.batch_norm: (3, 4),
    F.instance_norm: (1, 2), torch.instance_norm: (3, 4)}


# Operations that take a second tensor only for its dtype, shape or as the
# place to write: casting it would change what they mean.
_NOT_CAST = {"to", "type_as", "view_as", "expand_as", "reshape_as", "new_empty", "new_zeros",
             "new_ones", "new_full", "new_tensor", "is_same_size"}


def _name(func: Callable[..., Any]) -> Optional[str]:
    """The operation's name as policies spell it, or None for one never cast
    (in place, or ``__setitem__``, ``__get__``...)."""
    name = getattr(func, "__name__", "")
    if name.startswith("__"):
        return _OPERATORS.get(name)
    return None if name.endswith("_") or name in _NOT_CAST else name


_NAMES: Dict[Any, Optional[str]] = {}  # func -> _name(func): the mode sees every call


def _float_dtypes(args: Sequence[Any], dtypes: set) -> None:
    """Adds the dtypes of the float16/float32 ipu tensors among ``args`` to ``dtypes``."""
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if arg.dtype in _CASTABLE and arg.device.type == "ipu":
                dtypes.add(arg.dtype)
        elif isinstance(arg, (list, tuple)):
            _float_dtypes(arg, dtypes)


def _cast(arg: Any, dtype: torch.dtype) -> Any:
    if isinstance(arg, torch.Tensor):
        if arg.dtype in _CASTABLE and arg.dtype != dtype and arg.device.type == "ipu":
            return arg.to(dtype)
        return arg
    if isinstance(arg, (list, tuple)):
        return type(arg)(_cast(a, dtype) for a in arg)
    return arg


class _CastingMode(TorchFunctionMode):
    """Casts the float16/float32 ipu tensors an operation takes, per the policy
    (inside autocast regions) and the half/float casting rule."""

    def __init__(self, policy: Policy, rule: Optional[HalfFloatCastingBehavior],
                 enabled: bool, model: Optional[torch.nn.Module] = None) -> None:
        super().__init__()
        self.policy = policy
        self.model = model  # whose layers' classes the policy names
        # None: PyTorch's own type promotion, with no casts outside the policy (lazy mode).
        self.mixed_dtype = None if rule is None else (
            _FLOAT if rule == HalfFloatCastingBehavior.HalfUpcastToFloat else _HALF)
        self.enabled = enabled
        self.layers: List[Optional[torch.dtype]] = []  # dtypes of the policy's enclosing layers

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        dtype = self._decide(func, args, kwargs)
        if dtype is None:
            return func(*args, **kwargs)
        if func in _RUNNING_STATISTICS:
            return _norm(func, args, kwargs, dtype)
        return func(*[_cast(a, dtype) for a in args],
                    **{k: _cast(v, dtype) for k, v in kwargs.items()})

    def _decide(self, func: Callable[..., Any], args: Sequence[Any],
                kwargs: Dict[str, Any]) -> Optional[torch.dtype]:
        try:
            name = _NAMES[func]
        except KeyError:
            name = _NAMES[func] = _name(func)
        except TypeError:  # unhashable
            name = _name(func)
        if name is None or "out" in kwargs:
            return None  # in place: the output keeps its dtype, as in PyTorch
        dtypes: set = set()
        _float_dtypes(args, dtypes)
        if kwargs:
            _float_dtypes(tuple(kwargs.values()), dtypes)
        if not dtypes:
            return None
        mixed = len(dtypes) == 2
        regions = _regions()
        if self.enabled and regions and regions[-1]:
            layer = next((d for d in reversed(self.layers) if d is not None), None)
            dtype = layer or self.policy._op_dtype(name, mixed)
            if dtype is not None:
                return dtype
        return self.mixed_dtype if mixed else None


def _norm(func: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any],
          dtype: torch.dtype) -> Any:
    """A norm with running statistics in ``dtype``. The statistics are updated in
    place, so they are never cast: float16 statistics of a float32 norm are
    computed in float32 copies written back after the op; float32 statistics of a
    float16 norm are used as they are, with float32 weight and bias (the CPU's
    kernels normalise a float16 input with float32 parameters)."""
    kept = _RUNNING_STATISTICS[func]
    names = ("running_mean", "running_var")
    args = [a if i in kept else _cast(a, dtype) for i, a in enumerate(args)]
    kwargs = {k: v if k in names else _cast(v, dtype) for k, v in kwargs.items()}
    stats = [(args, i) for i in kept if i < len(args)] + [(kwargs, k) for k in names
                                                          if k in kwargs]
    stats = [(where, key) for where, key in stats if isinstance(where[key], torch.Tensor)]
    if dtype == _FLOAT:
        updated = []
        for where, key in stats:
            if where[key].dtype == _HALF:
                updated.append((where[key], _cast(where[key], _FLOAT)))
                where[key] = updated[-1][1]
        result = func(*args, **kwargs)
        with torch.no_grad():
            for stat, copy in updated:
                stat.copy_(copy)
        return result
    if stats and all(where[key].dtype == _FLOAT for where, key in stats):
        params = (3, 4) if kept[0] == 1 else (1, 2)  # F.*(x, mean, var, weight, bias), torch.*
        args = [_cast(a, _FLOAT) if i in params else a for i, a in enumerate(args)]
        kwargs = {k: _cast(v, _FLOAT) if k in ("weight", "bias") else v
                  for k, v in kwargs.items()}
    return func(*args, **kwargs)


def _active_mode() -> Optional[_CastingMode]:
    return getattr(_local, "mode", None)


@contextlib.contextmanager
def casting(policy: Policy, rule: Optional[HalfFloatCastingBehavior], enabled: bool,
            model: Optional[torch.nn.Module] = None) -> Iterator[None]:
    """Applies the policy (inside autocast regions) and the casting rule (None:
    PyTorch's) to the operations this thread calls; with ``model``, its layers' ``autocast()``
    settings and the policy's layer classes apply too."""
    with _in_mode(_CastingMode(policy, rule, enabled, model)):
        yield


@contextlib.contextmanager
def _in_mode(mode: _CastingMode) -> Iterator[None]:
    """``mode`` applies to this thread's operations, and to its model's layers."""
    previous, _local.mode = _active_mode(), mode
    hooks = _layer_hooks(mode.model, mode) if mode.model is not None and mode.enabled else []
    try:
        with mode:
            yield
    finally:
        for hook in hooks:
            hook.remove()
        _local.mode = previous


def recompute_state() -> Optional[Callable[[], ContextManager[None]]]:
    """The casts in force now, to apply again when a checkpointed part of the
    forward (torch.utils.checkpoint) runs again in backward, outside the
    casting mode and the regions (see _recompute.py); None when no casting
    mode is active."""
    mode = _active_mode()
    if mode is None:
        return None
    regions, layers = list(_regions()), list(mode.layers)

    @contextlib.contextmanager
    def again() -> Iterator[None]:
        saved = (_regions(), mode.layers)
        _local.regions, mode.layers = list(regions), list(layers)
        try:
            with _in_mode(mode):
                yield
        finally:
            _local.regions, mode.layers = saved

    return again


def _layer_hooks(model: torch.nn.Module, mode: _CastingMode) -> List[Any]:
    """Hooks that give the layers of the policy's classes their precision
    around their forward, inside autocast regions. They run after the layer's
    own ``autocast()`` hooks, registered before."""
    hooks = []
    classes = tuple(c for kind in mode.policy._layers.values() for c in kind)
    for layer in model.modules():
        if not isinstance(layer, classes):
            continue

        def enter(module: torch.nn.Module, _inputs: Any) -> None:
            regions = _regions()
            in_region = bool(regions and regions[-1])
            mode.layers.append(mode.policy._layer_dtype(module) if in_region else None)

        def leave(_module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
            mode.layers.pop()

        hooks.append(layer.register_forward_pre_hook(enter))
        hooks.append(layer.register_forward_hook(leave, always_call=True))
    return hooks
