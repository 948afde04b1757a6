"""Options config files: one option setter call per line (``Options.loadFromFile``).

Lines are parsed, never evaluated: a line is a call of one setter with literal
arguments, enum members of :mod:`poptorch.enums`, torch dtypes, or the
execution strategies and stages of PopTorch built from such arguments (as in
``setExecutionStrategy(poptorch.ShardedExecution())``, the user guide's own
example).
"""
from __future__ import annotations

import ast
import inspect
import json
import os
from typing import TYPE_CHECKING, Any, List, Optional, Union

import torch

from . import enums
from . import _execution_strategy as strategies
from ._errors import Error

if TYPE_CHECKING:
    from .options import Options

# Enums a line may name (as ``OutputMode.All`` or ``poptorch.OutputMode.All``).
_CONFIG_ENUMS = {name: getattr(enums, name) for name in enums.__all__}
# Classes a line may build (as ``poptorch.Stage("a")``): option values only.
_CONFIG_CLASSES = {cls.__name__: cls for cls in (
    strategies.Stage, strategies.Phase, strategies.PipelinedExecution,
    strategies.ShardedExecution, strategies.SerialPhasedExecution,
    strategies.ParallelPhasedExecution)}
# Methods of Options and its groups that set nothing.
_NOT_SETTERS = ("loadFromFile", "toDict", "clone", "defaultOutputMode")


class ConfigFileError(Error):
    """A line of an options config file is not an option setter call
    (``poptorch.options.ConfigFileError``, as in PopTorch)."""


def load_config_file(options: "Options", filepath: Union[str, "os.PathLike[str]"]) -> None:
    """Applies each line of the file to ``options``; a bad line raises
    :class:`ConfigFileError` naming the file and line."""
    path = os.fspath(filepath)
    with open(path, encoding="utf-8") as config:
        lines = config.read().splitlines()
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            try:
                _apply_config_line(options, line)
            except Error as error:
                raise ConfigFileError(f"{path}:{number}: {line!r}: {error}") from None


def _dotted(node: ast.expr) -> Optional[List[str]]:
    """``a.b.c`` -> ["a", "b", "c"]; None if the node is not a dotted name."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else head + [node.attr]
    return None


def _config_value(node: ast.expr) -> Any:
    """A literal, an enum member of this module, a torch dtype or one of
    ``_CONFIG_CLASSES`` built from such values."""
    if isinstance(node, ast.Call):
        return _config_object(node)
    name = _dotted(node)
    if name is None:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, RecursionError):
            raise Error(f"{ast.unparse(node)!r} is not a literal") from None
    if name[:2] == ["poptorch", "options"]:
        name = name[2:]
    elif name[:1] == ["poptorch"]:
        name = name[1:]
    enum_class = _CONFIG_ENUMS.get(name[0]) if len(name) == 2 else None
    if enum_class is not None and name[1] in enum_class.__members__:
        return enum_class[name[1]]
    if len(name) == 2 and name[0] == "torch" and isinstance(getattr(torch, name[1], None),
                                                            torch.dtype):
        return getattr(torch, name[1])
    raise Error(f"{'.'.join(name)!r} is not a literal or a member of "
                f"{', '.join(_CONFIG_ENUMS)}")


def _config_object(node: ast.Call) -> Any:
    name = _dotted(node.func)
    if name is not None and name[:1] == ["poptorch"]:
        name = name[1:]
    cls = _CONFIG_CLASSES.get(name[0]) if name is not None and len(name) == 1 else None
    if cls is None:
        raise Error(f"{ast.unparse(node.func)!r} cannot be called in a config file: only "
                    f"{', '.join('poptorch.' + c for c in _CONFIG_CLASSES)} can")
    if any(kw.arg is None for kw in node.keywords):
        raise Error("** arguments are not supported")
    args = [_config_value(arg) for arg in node.args]
    kwargs = {kw.arg: _config_value(kw.value) for kw in node.keywords}
    return cls(*args, **kwargs)


def _apply_config_line(options: "Options", line: str) -> None:
    try:
        tree = ast.parse(line, mode="eval").body
    except SyntaxError as error:
        raise Error(f"not a Python expression ({error.msg})") from None
    path = _dotted(tree.func) if isinstance(tree, ast.Call) else None
    if path is None or not (len(path) == 1 or (len(path) == 2 and path[0] in options._GROUPS)):
        raise Error("expected one option setter call such as deviceIterations(4) or "
                    "Training.gradientAccumulation(2)")
    target: Any = getattr(options, path[0]) if len(path) == 2 else options
    method = inspect.getattr_static(type(target), path[-1], None)
    if (not inspect.isfunction(method) or path[-1].startswith("_")
            or path[-1] in _NOT_SETTERS):
        raise Error(f"{'.'.join(path)} is not an option setter")
    if any(kw.arg is None for kw in tree.keywords):
        raise Error("** arguments are not supported")
    args = [_config_value(arg) for arg in tree.args]
    kwargs = {kw.arg: _config_value(kw.value) for kw in tree.keywords if kw.arg is not None}
    try:
        inspect.signature(method).bind(target, *args, **kwargs)
    except TypeError as error:
        raise Error(f"wrong arguments for {'.'.join(path)}: {error}") from None
    method(target, *args, **kwargs)


def load_default_options(options: "Options", variable: str = "POPTORCH_DEFAULT_OPTIONS") -> None:
    """Applies the options of the environment variable, as PopTorch does: a JSON
    object of setter -> argument (a list for several), e.g.
    ``{"deviceIterations": 2, "Precision.enableFloatingPointExceptions": true,
    "connectionType": "ConnectionType.OnDemand"}``; a string naming an enum
    member stands for it. Each entry is applied as a config file line."""
    text = os.environ.get(variable)
    if not text:
        return
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigFileError(
            f"{variable}: not JSON ({error}), got {text!r}: it takes a JSON object of setter "
            "-> argument, e.g. '{\"deviceIterations\": 2}' (a file of options is loaded with "
            "opts.loadFromFile(path))") from None
    if not isinstance(entries, dict):
        raise ConfigFileError(f"{variable}: expected a JSON object of setter -> argument, "
                              f"got {text!r}")
    for setter, value in entries.items():
        arguments = value if isinstance(value, list) else [value]
        line = f"{setter}({', '.join(_json_argument(a) for a in arguments)})"
        try:
            _apply_config_line(options, line)
        except Error as error:
            raise ConfigFileError(f"{variable}: {line!r}: {error}") from None


def _json_argument(value: Any) -> str:
    """A JSON value as config line source: enum members by name, others literal."""
    if isinstance(value, str):
        try:
            _config_value(ast.parse(value, mode="eval").body)
            return value  # an enum member such as "ConnectionType.OnDemand"
        except (Error, SyntaxError):
            pass
    return repr(value)
