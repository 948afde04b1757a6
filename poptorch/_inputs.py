"""The inputs of a wrapped model, as leaves: tensors (which change from call to
call) and other values (which are part of the compiled step).

Containers are flattened with ``torch.utils._pytree`` (tuples, lists, dicts in
their key order, named tuples...); an object of a type registered with
:func:`registerCustomArgParser` is flattened by its parser, as in PopTorch.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple, Type

import torch
import torch.utils._pytree as pytree

from ._errors import Error

_PARSERS: Dict[type, "ICustomArgParser"] = {}


class ICustomArgParser(abc.ABC):
    """Tells PopTorch which tensors an object of a user type passed to a model
    holds, and how to rebuild it around other tensors."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[torch.Tensor]:
        """Yields the tensors ``struct`` holds, always in the same order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[torch.Tensor]) -> Any:
        """An object like ``original_structure`` holding the tensors
        ``tensor_iterator`` yields, in ``yieldTensors``' order."""


def registerCustomArgParser(arg_type: Type[Any], parser: ICustomArgParser) -> None:
    """Makes ``parser`` flatten inputs of type ``arg_type`` (exactly that type)."""
    if not isinstance(arg_type, type):
        raise Error(f"registerCustomArgParser: expected a type, got {arg_type!r}")
    if not isinstance(parser, ICustomArgParser):
        raise Error("registerCustomArgParser: the parser must be an instance of a subclass of "
                    f"poptorch.ICustomArgParser, got {type(parser).__name__}")
    _PARSERS[arg_type] = parser


@dataclass(frozen=True)
class _Custom:
    """A custom object among the leaves: its type and how many tensors it holds."""
    type: type
    count: int


@dataclass(frozen=True)
class InputSpec:
    """The structure of a call's inputs; equal specs take the same leaves."""
    tree: Any
    custom: Tuple[Tuple[int, _Custom], ...]  # (position among the tree's leaves, what)


def flatten(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[List[Any], InputSpec, List[Any]]:
    """The leaves of a call, its spec, and the custom objects (to rebuild
    them later around other tensors)."""
    tree_leaves, tree = pytree.tree_flatten((args, kwargs),
                                            is_leaf=lambda x: type(x) in _PARSERS)
    leaves: List[Any] = []
    custom: List[Tuple[int, _Custom]] = []
    originals: List[Any] = []
    for position, leaf in enumerate(tree_leaves):
        parser = _PARSERS.get(type(leaf))
        if parser is None:
            leaves.append(leaf)
            continue
        tensors = list(parser.yieldTensors(leaf))
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise Error(f"the parser of {type(leaf).__name__} yielded a "
                            f"{type(t).__name__}: yieldTensors must yield tensors")
        custom.append((position, _Custom(type(leaf), len(tensors))))
        originals.append(leaf)
        leaves.extend(tensors)
    return leaves, InputSpec(tree, tuple(custom)), originals


def unflatten(leaves: List[Any], spec: InputSpec, originals: List[Any]) -> Tuple[Tuple[Any, ...],
                                                                                 Dict[str, Any]]:
    """``(args, kwargs)`` from leaves, rebuilding custom objects like ``originals``."""
    rest = iter(leaves)
    tree_leaves: List[Any] = []
    customs = dict(spec.custom)
    for position in range(spec.tree.num_leaves):
        what = customs.get(position)
        if what is None:
            tree_leaves.append(next(rest))
            continue
        original = originals[len([p for p in customs if p < position])]
        tensors = iter([next(rest) for _ in range(what.count)])
        tree_leaves.append(_PARSERS[what.type].reconstruct(original, tensors))
    args, kwargs = pytree.tree_unflatten(tree_leaves, spec.tree)
    return tuple(args), kwargs
