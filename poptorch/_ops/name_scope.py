"""Name scopes: the names ops get in profile reports ("scope/aten::mm").

``poptorch.NameScope("name")`` scopes the ops captured in its block; a wrapped
model's ops are also scoped by the modules that run them (PopTorch's module
name scopes), unless ``Options.disableModuleNamescope()``. Scopes nest.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List

import torch

from .. import _C
from .._errors import Error


class NameScope:
    """Names the ops run in the block ``<name>/<op>`` in profile reports:

    >>> with poptorch.NameScope("CustomString"):
    ...     y = self.bmm(a, b)
    ...     z = torch.relu(y)
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise Error("Parameter to NameScope must be a string")
        self.name = name

    def __enter__(self) -> "NameScope":
        _C.push_name_scope(self.name)
        return self

    def __exit__(self, *exc: Any) -> None:
        _C.pop_name_scope()


@contextlib.contextmanager
def module_name_scopes(model: torch.nn.Module) -> Iterator[None]:
    """While a wrapped model is captured: each submodule's ops are scoped by
    its attribute name (``encoder/layer/0/attention/aten::mm``)."""
    open_scopes = [0]

    def enter(name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            _C.push_name_scope(name)
            open_scopes[0] += 1
        return hook

    def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
        _C.pop_name_scope()
        open_scopes[0] -= 1

    handles: List[Any] = []
    for path, module in model.named_modules():
        # a TorchScript module takes no Python hooks: its ops keep the scope around it
        if path and not isinstance(module, torch.jit.ScriptModule):
            handles.append(module.register_forward_pre_hook(enter(path.rsplit(".", 1)[-1])))
            handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for _ in range(open_scopes[0]):  # forward raised inside a module
            _C.pop_name_scope()
