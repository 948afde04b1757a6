"""Storage of option values: read-only properties with defaults, frozen once
a model or DataLoader uses the options."""
from __future__ import annotations

import difflib
from typing import Any, ClassVar, Dict, Generic, Iterator, Optional, Tuple, TypeVar, overload

from .._errors import AttributeCompatibleError, Error
from .not_honoured import _log_if_not_honoured
from .values import _show

T = TypeVar("T")
S = TypeVar("S", bound="_Settings")


class _Value(Generic[T]):
    """A read-only property backed by ``_values[name]``, with its default."""

    def __init__(self, default: T, doc: str) -> None:
        self.default = default
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "_Value[T]": ...

    @overload
    def __get__(self, obj: "_Settings", objtype: Optional[type] = None) -> T: ...

    def __get__(self, obj: Optional["_Settings"], objtype: Optional[type] = None) -> Any:
        return self if obj is None else obj._values[self.name]

    def __set__(self, obj: "_Settings", value: Any) -> None:
        obj._refuse_assignment(self.name, value)


class _Settings:
    """Stored values with defaults; ``toDict`` and ``repr`` for every option group."""

    _NAME: ClassVar[str] = ""  # how config files and log messages name the group
    _FIELDS: ClassVar[Dict[str, _Value[Any]]] = {}
    _GROUPS: ClassVar[Tuple[str, ...]] = ()  # attributes holding option groups

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._FIELDS = {name: attr for klass in reversed(cls.__mro__)
                       for name, attr in vars(klass).items() if isinstance(attr, _Value)}

    def __init__(self) -> None:
        self._values: Dict[str, Any] = {name: f.default for name, f in self._FIELDS.items()}

    # Set on the options a model or DataLoader uses (Options._freeze): they read
    # them when they run, so a later change would not be what they compiled for.
    _frozen = False

    def _set(self: S, key: str, value: Any) -> S:
        if self._frozen:
            name = f"{self._NAME}.{key}" if self._NAME else key
            raise Error(f"these options can no longer change ({name}): a model or a "
                        "DataLoader uses them, as in PopTorch; change a copy "
                        "(opts.clone() or copy.deepcopy(opts)) and wrap the model with it")
        self._values[key] = value
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        # Each group is set once, by __init__; private state is the class's own.
        if name.startswith("_") or (name in self._GROUPS and name not in self.__dict__):
            super().__setattr__(name, value)
        else:
            self._refuse_assignment(name, value)

    def _refuse_assignment(self, name: str, value: Any) -> None:
        """Options are set with their setter methods: an assignment replaced a
        setter, or made an attribute nothing reads, and the model ran with the
        option's old value without a word."""
        group = f"opts.{self._NAME}." if self._NAME else "opts."
        if name in self._FIELDS:
            how = f"{group}{name} is read-only: set it with the option's setter method"
        elif name in self._GROUPS:
            how = f"{group}{name} is a group of options: set them with its setter methods"
        elif callable(getattr(self, name, None)):
            how = (f"{group}{name} is a setter method: call it, {group}{name}({value!r}), "
                   "rather than assigning to it")
        else:
            setters = [n for n in dir(self) if not n.startswith("_")
                       and callable(getattr(self, n, None))]
            close = difflib.get_close_matches(name, setters, n=1)
            how = (f"{group}{name}: poptorch.Options has no such option, and an attribute "
                   "set on it is read by nothing"
                   + (f"; did you mean {group}{close[0]}({value!r})?" if close else
                      "; options are set with their setter methods"))
        raise AttributeCompatibleError(how)

    def __getstate__(self) -> Dict[str, Any]:
        # Copies (copy.deepcopy, clone) and pickles are not frozen.
        state = dict(self.__dict__)
        state.pop("_frozen", None)
        return state

    def _set_not_honoured(self: S, method: str, key: str, value: Any) -> S:
        _log_if_not_honoured(f"{self._NAME}.{method}" if self._NAME else method, value)
        return self._set(key, value)

    def _items(self) -> Iterator[Tuple[str, Any, Any]]:
        """(name, value, default) of every stored value."""
        for name, field in self._FIELDS.items():
            yield name, self._values[name], field.default

    def toDict(self) -> Dict[str, Any]:
        """All values as a plain dict (nested settings become dicts too)."""
        return {name: value.toDict() if isinstance(value, _Settings) else value
                for name, value, _ in self._items()}

    def __repr__(self) -> str:
        changed = ", ".join(f"{name}={_show(value)}"
                            for name, value, default in self._items() if value != default)
        return f"{type(self).__name__}({changed})"
