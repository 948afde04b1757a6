"""The inputs of a wrapped model, as leaves: tensors (which change from call to
call) and other values (which are part of the compiled step).

Containers are flattened with ``torch.utils._pytree`` (tuples, lists, dicts in
their key order, named tuples...); an object of a type registered with
:func:`registerCustomArgParser` is flattened by its parser, as in PopTorch.
"""
from __future__ import annotations

import abc
import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

import torch
import torch.utils._pytree as pytree

from ._errors import Error, TypeCompatibleError

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
    # The names of the last positional arguments of the canonical form that
    # forward is called with as keywords, as the call that compiled gave them
    # (or left them to their defaults): not part of the structure.
    call_keywords: Tuple[str, ...] = field(default=(), compare=False)


def flatten(args: Tuple[Any, ...], kwargs: Dict[str, Any],
            call_keywords: Tuple[str, ...] = ()) -> Tuple[List[Any], InputSpec, List[Any]]:
    """The leaves of a call, its spec, and the custom objects (to rebuild
    them later around other tensors); ``call_keywords`` as ``bind`` gives them."""
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
    return leaves, InputSpec(tree, tuple(custom), call_keywords), originals


def unflatten(leaves: List[Any], spec: InputSpec, originals: List[Any]) -> Tuple[Tuple[Any, ...],
                                                                                 Dict[str, Any]]:
    """``(args, kwargs)`` from leaves, rebuilding custom objects like
    ``originals``, in the form of the call that compiled (see ``bind``)."""
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
    names = getattr(spec, "call_keywords", ())  # specs saved before it have none
    if not names:
        return tuple(args), kwargs
    split = len(args) - len(names)
    return tuple(args[:split]), {**dict(zip(names, args[split:])), **kwargs}


def _signature(forward: Callable[..., Any]) -> Optional[inspect.Signature]:
    """``forward``'s signature, or None if it has no Python one. Looked up once
    per function: building it is most of what a wrapped model's steady call
    did in Python (a bound method is a new object at every attribute access,
    so methods are known by their function)."""
    function = getattr(forward, "__func__", None)
    if inspect.isfunction(function) and getattr(forward, "__self__", None) is not None:
        return _method_signature(function)
    if inspect.isfunction(forward):
        return _function_signature(forward)
    return _uncached_signature(forward)  # other callables: their objects are not kept alive


def _uncached_signature(forward: Callable[..., Any]) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(forward)
    except (TypeError, ValueError):
        return None


_function_signature = functools.lru_cache(maxsize=64)(_uncached_signature)


@functools.lru_cache(maxsize=64)
def _method_signature(function: Callable[..., Any]) -> Optional[inspect.Signature]:
    """The signature of ``function`` bound to an object: without its first parameter."""
    signature = _uncached_signature(function)
    if signature is None:
        return None
    parameters = list(signature.parameters.values())
    first = parameters[0].kind if parameters else None
    if first == inspect.Parameter.VAR_POSITIONAL:  # *args takes the object too
        return signature
    if first not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return None  # no parameter for the object: inspect has no signature for it either
    return signature.replace(parameters=parameters[1:])


def bind(forward: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]
         ) -> Tuple[Tuple[Any, ...], Dict[str, Any], Tuple[str, ...]]:
    """The call in the canonical form of ``forward``'s signature, defaults
    filled in, as PopTorch matches inputs: ``model(x)`` and ``model(x, y=d)``
    (``d`` the default of ``y``) are calls of one compiled step. Arguments that
    do not fit the signature raise the TypeError that calling it would, as a
    poptorch.Error too (PopTorch's words first for a missing argument).

    Also the names of the canonical positional arguments that the call did
    not give by position: forward is called with them as keywords, so that it
    sees the caller's positional arguments only, as on the CPU (a decorator
    that adds a keyword argument, such as transformers' ``use_cache``, would
    otherwise get it twice; forward pre-hooks see the caller's ``args``)."""
    signature = _signature(forward)
    if signature is None:  # no Python signature: take the call as it is
        return args, kwargs, ()
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        missing = re.fullmatch(r"missing a required argument: '(\w+)'", str(error))
        prefix = f"Mandatory parameter {missing.group(1)} missing: " if missing else ""
        raise TypeCompatibleError(prefix + str(error)) from None
    bound.apply_defaults()
    canonical = tuple(bound.args)
    # Positional-only parameters cannot be given by keyword.
    kinds = [p.kind for p in signature.parameters.values()]
    positional = max(len(args), kinds.count(inspect.Parameter.POSITIONAL_ONLY))
    names = tuple(signature.parameters)[positional:len(canonical)]
    return canonical, dict(bound.kwargs), names if len(canonical) > positional else ()


def positional_names(forward: Callable[..., Any]) -> List[str]:
    """The names of ``forward``'s positional parameters (for messages), its
    ``*args`` last as ``"*args"``."""
    signature = _signature(forward)
    if signature is None:
        return []
    parameters = signature.parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in parameters if p.kind in kinds]
    names += ["*" + p.name for p in parameters if p.kind == inspect.Parameter.VAR_POSITIONAL]
    return names


def _argument_name(position: int, names: List[str]) -> str:
    fixed = [n for n in names if not n.startswith("*")]
    if position < len(fixed):
        return fixed[position]
    if len(fixed) < len(names):
        return f"{names[-1][1:]}[{position - len(fixed)}]"
    return f"positional argument {position}"


def _kind(spec: Any) -> str:
    if spec.is_leaf():
        return "a Tensor or scalar"
    if issubclass(spec.type, dict):  # the same size may hold other keys
        return f"a {spec.type.__name__} with keys {list(spec.context)}"
    return f"a {spec.type.__name__} of {spec.num_children}"


def describe_change(old: InputSpec, new: InputSpec, names: List[str]) -> str:
    """How the structure of a call's inputs differs from the compiled one's,
    by argument name (PopTorch's wording)."""
    old_args, old_kwargs = old.tree.children()
    new_args, new_kwargs = new.tree.children()
    if old_args.num_children != new_args.num_children:
        return (f"Number of positional arguments mismatch: expected {old_args.num_children} "
                f"arguments but got {new_args.num_children}")
    missing = [k for k in old_kwargs.context if k not in new_kwargs.context]
    if missing:
        return f"Missing arguments: {', '.join(missing)}."
    unexpected = [k for k in new_kwargs.context if k not in old_kwargs.context]
    if unexpected:
        return f"Unexpected arguments: {', '.join(unexpected)}."
    pairs = [(_argument_name(i, names), o, n) for i, (o, n) in enumerate(
        zip(old_args.children(), new_args.children()))]
    pairs += [(k, old_kwargs.children()[old_kwargs.context.index(k)], n)
              for k, n in zip(new_kwargs.context, new_kwargs.children())]
    for name, o, n in pairs:
        if o != n:
            return f"Type mismatch for {name}: expected {_kind(o)} but got {_kind(n)}"
    return "the custom arguments (registerCustomArgParser) hold other numbers of tensors"


def leaf_names(spec: InputSpec, names: List[str]) -> Optional[List[str]]:
    """A name per leaf of calls of ``spec`` (``x``, ``t[1]``, ``y['a']``), or
    None where custom arguments make leaves that the tree does not name."""
    if spec.custom:
        return None
    dummy = pytree.tree_unflatten([None] * spec.tree.num_leaves, spec.tree)
    paths, _ = pytree.tree_flatten_with_path(dummy)
    result = []
    for path, _ in paths:
        head = path[1]
        first = (_argument_name(head.idx, names) if path[0].idx == 0 else str(head.key))
        result.append(first + "".join(str(k) for k in path[2:]))
    return result


def check_default_dtype(compiled_with: torch.dtype) -> None:
    """Raises if torch.get_default_dtype() is not the one the step was captured
    with: ops on integer tensors (``a / b``, ``a * 0.5``) computed in that one."""
    current = torch.get_default_dtype()
    if current != compiled_with:
        raise Error(f"torch.get_default_dtype() is {current}, but the model was compiled when "
                    f"it was {compiled_with}, and ops on integer tensors compute in the "
                    "default dtype of their capture. PopTorch compiles a static graph: set the "
                    "default dtype back, or call destroy() to compile again.")
