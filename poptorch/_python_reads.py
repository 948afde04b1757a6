"""The Python values a wrapped model's ``forward`` reads, guarded as ``torch.compile`` guards them.

The compiled step replays the ops of its capture, so a plain Python value that forward
read then (``x * self.scale``, ``if self.use_relu:``, ``x.reshape(self.n)``, a global
``SCALE``) is baked into it. While the step is captured, each attribute read from a
module's instance dict is recorded: each module's class is swapped for a cached subclass
whose ``__getattribute__`` records the read, and swapped back after. The globals and
closure variables that the methods forward called (and the functions they load) load are
found from their bytecode, outside torch and installed libraries (their constants). After the capture the values are kept (containers copied); before
each call :meth:`PythonReads.hold` compares them with the current ones, in C (one
``dict.get`` per value), and a value that changed selects another specialisation of the
step or captures one. Values that ``forward`` does not read (an epoch number kept on the
model) are not guarded, so changing them costs nothing.

Not guarded here: tensors (parameters and buffers are the step's device tensors; a plain
tensor attribute is a constant of the step, with a warning), ``training`` (a step keeps
its modes), hooks and submodules (``_compiled_with.py`` and ``_device_state.py`` refuse
their changes). An object read from a module (a Hugging Face ``config``) is guarded by
identity and by its own attributes, and the objects among them by theirs, three levels deep.
"""
from __future__ import annotations

import contextlib
import dis
import enum
import functools
import operator
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch

# nn.Module's own bookkeeping (training, _parameters, the hook dicts, ...): guarded elsewhere.
_MODULE_STATE = frozenset(vars(torch.nn.Module()))
_MISSING = object()
# How deep objects read from a module are guarded: a config, the configs it holds, theirs.
_OBJECT_DEPTH = 3
_CONTENTS = operator.attrgetter("cell_contents")
# A module's recorder while its step is captured, by id(module): a capture on another
# thread records into its own, and autograd's threads record too (a checkpointed part
# of forward run again in backward).
_RECORDERS: Dict[int, "_Recorder"] = {}
# The recording subclass of each module class wrapped (it holds the class: kept for good)
_SUBCLASSES: Dict[type, type] = {}
_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                  enum.Enum)


def _plain(value: Any) -> bool:
    """Data compared by value: numbers, strings, dtypes, enums and containers of them."""
    if isinstance(value, _PLAIN_SCALARS):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _kept(value: Any) -> Any:
    """The value as read, with its containers copied: a list changed in place differs."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_kept(v) for v in value) if type(value) in (
            list, tuple, set, frozenset) else value
    if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
        return {k: _kept(v) for k, v in value.items()}
    return value


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (RuntimeError, ValueError, TypeError):  # an array's or a tensor's __eq__
        return False


class PythonReads:
    """The Python values one specialisation of a step read, and where they live."""

    def __init__(self) -> None:
        self._labels: List[Tuple[str, str]] = []  # what the user calls each value, and where
        self._dicts: List[Dict[str, Any]] = []  # a module's __dict__ or a function's globals
        self._keys: List[str] = []
        self._values: List[Any] = []
        self._objects: List[Dict[str, Any]] = []  # vars() of objects read from modules
        self._object_values: List[Dict[str, Any]] = []
        self._object_labels: List[Tuple[str, str]] = []
        self._cells: List[Any] = []  # closure cells
        self._cell_values: List[Any] = []
        self._cell_labels: List[Tuple[str, str]] = []
        # (id of the dict, key) of each value; (id of the owner, name) of each getter's
        self._guarded: Set[Tuple[int, str]] = set()
        # values read through a getter: class attributes, TorchScript modules' attributes
        self._getters: List[Callable[[], Any]] = []
        self._getter_values: List[Any] = []
        self._getter_labels: List[Tuple[str, str]] = []

    def hold(self) -> bool:
        """True when every value read is what it was at the capture."""
        try:
            return (list(map(dict.get, self._dicts, self._keys)) == self._values
                    and self._objects == self._object_values
                    and list(map(_CONTENTS, self._cells)) == self._cell_values
                    and [read() for read in self._getters] == self._getter_values)
        # an array's or a tensor's __eq__, an emptied cell, a deleted class attribute
        except (RuntimeError, ValueError, TypeError, AttributeError):
            return False

    def changes(self) -> List[Tuple[str, str]]:
        """What changed since the capture, and where forward read it (file:line, or "")."""
        out = []
        for (label, site), holder, key, kept in zip(self._labels, self._dicts, self._keys,
                                                     self._values):
            now = holder.get(key, _MISSING)
            if not _equal(now, kept):
                out.append((_changed(label, kept, now), site))
        for (label, site), live, kept in zip(self._object_labels, self._objects,
                                             self._object_values):
            for key in sorted(live.keys() | kept.keys()):
                if not _equal(live.get(key, _MISSING), kept.get(key, _MISSING)):
                    out.append((f"{label}, its attribute {key!r}, changed", site))
        for (label, site), cell, kept in zip(self._cell_labels, self._cells, self._cell_values):
            if not _equal(_cell(cell), kept):
                out.append((_changed(label, kept, _cell(cell)), site))
        for (label, site), read, kept in zip(self._getter_labels, self._getters,
                                             self._getter_values):
            now = _read(read)
            if not _equal(now, kept):
                out.append((_changed(label, kept, now), site))
        return out

    def add(self, label: str, site: str, holder: Dict[str, Any], key: str) -> None:
        if (id(holder), key) in self._guarded:
            return
        self._guarded.add((id(holder), key))
        value = holder.get(key, _MISSING)
        self._labels.append((label, site))
        self._dicts.append(holder)
        self._keys.append(key)
        self._values.append(_kept(value) if value is not _MISSING else None)
        self._add_object(value, label, site, _OBJECT_DEPTH)

    def _add_object(self, value: Any, label: str, site: str, depth: int) -> None:
        """An object read from a module (a config) is guarded by its attributes, and the
        objects among them by theirs (``self.cfg.model.scale``), ``depth`` levels deep."""
        if depth == 0 or not _has_own_attributes(value) or any(
                o is vars(value) for o in self._objects):
            return
        attributes = vars(value)
        self._objects.append(attributes)
        self._object_values.append(dict(attributes))
        self._object_labels.append((label, site))
        for key, inner in attributes.items():
            self._add_object(inner, f"{label}, its attribute {key!r}", site, depth - 1)

    def add_cell(self, label: str, site: str, cell: Any) -> None:
        if all(c is not cell for c in self._cells):
            self._cells.append(cell)
            self._cell_values.append(_kept(_cell(cell)))
            self._cell_labels.append((label, site))

    def add_getter(self, label: str, site: str, getter: Callable[[], Any],
                   key: Tuple[int, str]) -> None:
        """A value ``getter`` reads (``key``: the id of its owner and its name): a
        capture records forward's reads, and backward's again (checkpointing)."""
        if key in self._guarded:
            return
        self._guarded.add(key)
        self._getters.append(getter)
        self._getter_values.append(_kept(getter()))
        self._getter_labels.append((label, site))

    def add_script_attributes(self, path: str, module: torch.jit.ScriptModule) -> None:
        """Every plain attribute of a TorchScript module (``self.scale``): its compiled
        code reads them in C++, out of the recorder's sight, so all are guarded."""
        attributes = module._c  # pylint: disable=protected-access
        where = f"the model's submodule {path!r}" if path else "the model"
        for name in module._concrete_type.get_attributes():  # pylint: disable=protected-access
            if name not in _MODULE_STATE and name != "_is_full_backward_hook" and _plain(
                    attributes.getattr(name)):
                self.add_getter(f"the TorchScript attribute {name!r} of {where}", "",
                                functools.partial(attributes.getattr, name),
                                (id(attributes), name))


def stateless(module: Any) -> bool:
    """A module holding no parameter and no buffer (an activation): the step's guards
    take it being replaced by another such module (``self.act = nn.GELU()``)."""
    return (isinstance(module, torch.nn.Module) and next(module.parameters(), None) is None
            and next(module.buffers(), None) is None)


def _changed(label: str, kept: Any, now: Any) -> str:
    now_text = "deleted" if now is _MISSING else _short(now)
    return f"{label} changed from {_short(kept)} to {now_text}"


def _read(getter: Callable[[], Any]) -> Any:
    try:
        return getter()
    except AttributeError:
        return _MISSING


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _has_own_attributes(value: Any) -> bool:
    """An object (a config) whose attributes forward may read (PythonReads._add_object)."""
    return (hasattr(value, "__dict__") and type(vars(value)) is dict  # pylint: disable=unidiomatic-typecheck
            and not callable(value) and not _plain(value)
            and not isinstance(value, (type, types.ModuleType, torch.nn.Module, torch.Tensor)))


class _Recorder:
    """What the modules read during one capture: (module, attribute) pairs, and the
    Python functions read from them (``self.forward``, ``self.helper``)."""

    def __init__(self) -> None:
        # (module, where it was first read), by (id of the module, attribute)
        self.reads: Dict[Tuple[int, str], Tuple[torch.nn.Module, str]] = {}
        # the same, of plain class attributes of the user's classes (``scale = 2.0`` in
        # the class body), which an instance attribute of that name would shadow later
        self.class_reads: Dict[Tuple[int, str], Tuple[torch.nn.Module, str]] = {}
        self.functions: Dict[int, types.FunctionType] = {}

    def read(self, module: torch.nn.Module, name: str, value: Any) -> None:
        if name in _MODULE_STATE or isinstance(value, torch.Tensor) or (
                name.startswith("__") and name.endswith("__")):
            return
        own = object.__getattribute__(module, "__dict__")
        key = (id(module), name)
        if own.get(name, _MISSING) is value:  # not a method, property or class attribute
            if key not in self.reads:
                self.reads[key] = (module, _site())
        elif name not in own and key not in self.class_reads and _plain(value) and \
                _user_class_attribute(type(module), name) is value:
            self.class_reads[key] = (module, _site())
        function = value.__func__ if isinstance(value, types.MethodType) else value
        if isinstance(function, types.FunctionType) and not _installed(function):
            self.functions.setdefault(id(function), function)


def _site() -> str:
    """Where the user's code read an attribute: the caller of ``__getattribute__``."""
    frame = sys._getframe(3)  # pylint: disable=protected-access
    return f"{frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})"


def _user_class_attribute(cls: type, name: str) -> Any:
    """The class attribute ``name`` as the class body of one of the user's classes (not
    torch's or an installed library's) defines it, or _MISSING."""
    for klass in cls.__mro__:
        if name in vars(klass):
            module = sys.modules.get(klass.__module__)
            filename = getattr(module, "__file__", None) or ""
            if klass.__module__.split(".")[0] == "torch" or _in_site_packages(filename):
                return _MISSING
            return vars(klass)[name]
    return _MISSING


def _in_site_packages(filename: str) -> bool:
    filename = filename.replace("\\", "/")
    return "/site-packages/" in filename or "/dist-packages/" in filename


def _installed(function: types.FunctionType) -> bool:
    """A function of torch or of an installed library (transformers): its globals and
    closure variables are the library's constants, not the user's values."""
    return ((function.__module__ or "").split(".")[0] == "torch"
            or _in_site_packages(function.__code__.co_filename))


def _recording_class(cls: type) -> Optional[type]:
    """A subclass of ``cls`` with its layout whose instances record their attribute reads."""
    sub = _SUBCLASSES.get(cls)
    if sub is None:

        def __getattribute__(self: Any, name: str) -> Any:  # pylint: disable=invalid-name
            # super(), not cls.__getattribute__: dynamo (a torch.compile'd call of the
            # module inside forward) traces super().__getattribute__ as the plain
            # lookup, where it would recurse into this method again.
            value = super(sub, self).__getattribute__(name)
            if torch.compiler.is_compiling():  # dynamo guards what it traces
                return value
            recorder = _RECORDERS.get(id(self))
            if recorder is not None:
                recorder.read(self, name, value)
            return value

        # Not a frame for dynamo to compile: its frame callback reads the module's
        # attributes, which would run this method again.
        torch._dynamo.eval_frame.skip_code(__getattribute__.__code__)  # pylint: disable=protected-access

        try:
            sub = type(cls)(cls.__name__, (cls,), {
                "__slots__": (), "__getattribute__": __getattribute__,
                "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        except TypeError:  # a final class, or a metaclass that refuses
            return None
        _SUBCLASSES[cls] = sub
    return sub


@contextlib.contextmanager
def recording(model: torch.nn.Module, reads: PythonReads) -> Iterator[None]:
    """Adds to ``reads`` what the model's modules read from Python inside the block (a
    step's capture), and the globals and closure variables their methods load."""
    recorder = _Recorder()
    swapped: List[Tuple[torch.nn.Module, type, type]] = []
    names = {id(m): name for name, m in model.named_modules()}
    try:
        for module in list(model.modules()):
            if isinstance(module, torch.jit.ScriptModule):
                reads.add_script_attributes(names.get(id(module), ""), module)
                continue
            _RECORDERS[id(module)] = recorder
            cls = type(module)
            sub = _recording_class(cls)
            if sub is not None:
                try:
                    module.__class__ = sub
                except TypeError:  # __class__ assignment refused (a layout of its own)
                    continue
                swapped.append((module, cls, sub))
        yield
    finally:
        for key in names:
            _RECORDERS.pop(key, None)
        for module, cls, sub in swapped:
            if type(module) is sub:  # a lazy module became its final class meanwhile
                module.__class__ = cls
    for (_, name), (module, site) in recorder.reads.items():
        prefix = names.get(id(module), "")
        label = f"the model's attribute {(prefix + '.' if prefix else '') + name!r}"
        reads.add(label, site, vars(module), name)
    for (_, name), (module, site) in recorder.class_reads.items():
        prefix = names.get(id(module), "")
        label = (f"the model's attribute {(prefix + '.' if prefix else '') + name!r} "
                 f"(of its class {type(module).__name__})")
        reads.add(label, site, vars(module), name)  # an instance attribute set later
        reads.add_getter(label, site, functools.partial(getattr, type(module), name),
                         (id(type(module)), name))
    for module in model.modules():
        prefix = names.get(id(module), "")
        for child_name, child in module._modules.items():  # pylint: disable=protected-access
            if stateless(child):
                path = f"{prefix}.{child_name}" if prefix else child_name
                reads.add(f"the model's submodule {path!r}", "", module._modules, child_name)  # pylint: disable=protected-access
    for fn in _with_the_functions_they_load(list(recorder.functions.values())):
        code = fn.__code__
        for name, line in _global_loads(code):
            if _plain(fn.__globals__.get(name, _MISSING)):
                module = fn.__globals__.get("__name__", "?")
                site = f"{code.co_filename}:{line} (in {code.co_name})"
                reads.add(f"the global {name!r} of {module}", site, fn.__globals__, name)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            if name != "__class__" and _plain(_cell(cell)):
                site = f"{code.co_filename}:{code.co_firstlineno} (in {code.co_name})"
                reads.add_cell(f"the variable {name!r} of {fn.__qualname__}", site, cell)


@functools.lru_cache(maxsize=4096)
def _global_loads(code: types.CodeType) -> Tuple[Tuple[str, int], ...]:
    """The names a function's code (its comprehensions and lambdas too) loads as
    globals, each with the line of its first load."""
    names: Dict[str, int] = {}
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            positions = instruction.positions
            line = positions.lineno if positions and positions.lineno else code.co_firstlineno
            names.setdefault(instruction.argval, line)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for name, line in _global_loads(const):
                names.setdefault(name, line)
    return tuple(names.items())


def _with_the_functions_they_load(functions: List[types.FunctionType]) -> List[types.FunctionType]:
    """The functions, and the Python functions they load as globals (a helper of the
    user's file), outside installed libraries: one level, as forward reads values through
    such helpers."""
    seen = {id(f) for f in functions}
    loaded = []
    for fn in functions:
        wrapped = getattr(fn, "__wrapped__", None)  # under a decorator
        for value in [wrapped] + [fn.__globals__.get(n) for n, _ in _global_loads(fn.__code__)]:
            if isinstance(value, types.FunctionType) and id(value) not in seen and not _installed(
                    value):
                seen.add(id(value))
                loaded.append(value)
    return functions + loaded
