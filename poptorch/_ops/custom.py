"""``poptorch.custom_op``: calls a custom operator the PopTorch way.

PopTorch's custom ops are PopART ops compiled into a library. Here a custom op
is a PyTorch operator registered with ``torch.library`` (a CPU kernel, a fake
kernel for shapes and, for training, a derivative); the emulated IPU runs its
CPU kernel as a node of the program. It can be called directly
(``torch.ops.<namespace>.<name>(...)``) or with ``poptorch.custom_op(inputs,
name, domain, domain_version, example_outputs, attributes)``, where ``domain``
is the operator's namespace and the attributes become keyword arguments.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from .._errors import Error

Attribute = Union[float, int, str, list, tuple]


def _check_attributes(attributes: Dict[str, Attribute]) -> None:
    # PopTorch's rules for attributes, with its errors (ValueError).
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError("All attribute keys must be strings.")
        if not isinstance(value, (float, int, str, list, tuple)):
            raise ValueError("Attribute values must be floats, ints, strings or a list/tuple "
                             "of float, ints of strings.")
        if isinstance(value, (list, tuple)):
            if any(not isinstance(e, type(value[0])) for e in value):
                raise ValueError("The types in a list/tuple attribute must all be the same.")
        for text in [key, *(value if isinstance(value, (list, tuple)) else [value])]:
            if isinstance(text, str) and not text.isascii():
                raise ValueError(f"{text} contains non-ASCII characters.")


def _namespace(domain: str) -> str:
    """The torch.library namespace of a PopART-style domain ("com.acme" ->
    "com_acme")."""
    return domain.replace(".", "_").replace("-", "_")


def _find(name: str, domain: str) -> Any:
    namespace = _namespace(domain)
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        raise Error(f"custom_op: no operator {namespace}::{name} is registered. Register it "
                    f"with torch.library, e.g. @torch.library.custom_op("
                    f"\"{namespace}::{name}\", mutates_args=(), device_types=\"cpu\") and a "
                    "register_fake for its output shapes (the domain's dots become "
                    "underscores in the namespace)") from None


def custom_op(inputs: Sequence[torch.Tensor], name: str, domain: str, domain_version: int,
              example_outputs: Sequence[torch.Tensor],
              attributes: Optional[Dict[str, Attribute]] = None) -> List[torch.Tensor]:
    """Applies the custom operator ``<domain>::<name>`` (registered with
    ``torch.library``; dots of the domain become underscores) to ``inputs``,
    with ``attributes`` as keyword arguments, and returns its outputs as a
    list. ``example_outputs`` give the outputs' number, shapes and dtypes,
    which the operator must return. ``domain_version`` is PopART's version of
    the domain: it is checked to be an integer and otherwise not used.
    """
    if not isinstance(name, str) or not isinstance(domain, str):
        raise Error("custom_op: name and domain must be strings")
    if not isinstance(domain_version, int) or isinstance(domain_version, bool):
        raise Error(f"custom_op: domain_version must be an integer, got {domain_version!r}")
    inputs = list(inputs)
    examples = list(example_outputs)
    for what, tensors in (("inputs", inputs), ("example_outputs", examples)):
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise Error(f"custom_op: {what} must be tensors")
    attributes = dict(attributes or {})
    _check_attributes(attributes)
    outputs = _find(name, domain)(*inputs, **attributes)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    got = [(tuple(o.shape), o.dtype) for o in outputs]
    expected = [(tuple(e.shape), e.dtype) for e in examples]
    if got != expected:
        raise Error(f"custom_op {_namespace(domain)}::{name} returned outputs of shapes and "
                    f"dtypes {got} where example_outputs give {expected}")
    return outputs
