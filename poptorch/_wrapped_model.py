"""The model given to ``trainingModel`` gets PopTorch's ``destroy()`` and
``copyWeightsToHostIfNeeded()``.

As in PopTorch, the model becomes, while it is wrapped, an instance of a
subclass of its class named ``Poptorch<Name>`` that adds them. Pickling,
``torch.save`` and ``copy.deepcopy`` see the original class, and the model
gets it back when its wrapper is destroyed or collected.
"""
from __future__ import annotations

import copyreg
import weakref
from typing import Any

import torch

# Wrapped model -> its newest trainingModel (weakly: the wrapper owns the model).
_WRAPPERS: "weakref.WeakKeyDictionary[torch.nn.Module, Any]" = weakref.WeakKeyDictionary()
# Original class -> its Poptorch subclass, made once per class.
_SUBCLASSES: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()


class _WrappedModel:
    """Added to the class of a model wrapped by trainingModel."""

    _poptorch_original: type

    def destroy(self) -> None:
        """Destroys the trainingModel wrapping this model (see
        ``PoplarExecutor.destroy``); nothing if it is gone already."""
        wrapper = _wrapper_of(self)
        if wrapper is not None:
            wrapper.destroy()

    def copyWeightsToHostIfNeeded(self) -> bool:
        """See ``PoplarExecutor.copyWeightsToHostIfNeeded``: False, the host
        weights are always the device's."""
        wrapper = _wrapper_of(self)
        return False if wrapper is None else wrapper.copyWeightsToHostIfNeeded()

    def __reduce_ex__(self, protocol: Any) -> Any:
        wrapped = type(self)
        self.__class__ = wrapped._poptorch_original
        try:
            reduced = self.__reduce_ex__(protocol)
        finally:
            self.__class__ = wrapped
        if reduced[0] is copyreg.__newobj__:
            # pickle refuses __newobj__ of a class the object no longer has at
            # save time; the equivalent reconstructor makes the original class.
            cls, *args = reduced[1]
            if not args:
                reduced = (copyreg._reconstructor, (cls, object, None)) + tuple(reduced[2:])
        return reduced


def _wrapper_of(model: torch.nn.Module) -> Any:
    ref = _WRAPPERS.get(model)
    return None if ref is None else ref()


def wrap(model: torch.nn.Module, wrapper: Any) -> None:
    """Gives ``model`` the methods that reach ``wrapper`` (a trainingModel)."""
    if not isinstance(model, _WrappedModel):
        original = type(model)
        subclass = _SUBCLASSES.get(original)
        if subclass is None:
            subclass = type(f"Poptorch{original.__name__}", (_WrappedModel, original),
                            {"_poptorch_original": original, "__module__": original.__module__})
            _SUBCLASSES[original] = subclass
        model.__class__ = subclass
    _WRAPPERS[model] = weakref.ref(wrapper)
    weakref.finalize(wrapper, _unwrap, weakref.ref(model), id(wrapper))


def unwrap(model: torch.nn.Module, wrapper: Any) -> None:
    """Gives the model its class back (``destroy``), unless a newer wrapper uses it."""
    _unwrap(weakref.ref(model), id(wrapper))


def _unwrap(model_ref: "weakref.ref[torch.nn.Module]", wrapper_id: int) -> None:
    model = model_ref()
    if model is None or not isinstance(model, _WrappedModel):
        return
    current = _wrapper_of(model)
    if current is not None and id(current) != wrapper_id:
        return
    _WRAPPERS.pop(model, None)
    model.__class__ = type(model)._poptorch_original
