"""``poptorch.module_repr`` and ``poptorch.print``: a module's repr that also
shows its forward pre-hooks, where PopTorch's ``BeginBlock`` annotations live."""
from __future__ import annotations

import builtins
from typing import Any

import torch


def _indent(text: str, spaces: int) -> str:
    return ("\n" + " " * spaces).join(text.split("\n"))


def module_repr(m: torch.nn.Module) -> str:
    """``repr(m)``, with the forward pre-hooks of each module (such as
    block annotations) written before its name."""
    module = m
    extra = module.extra_repr()
    extra_lines = extra.split("\n") if extra else []
    child_lines = [f"({name}): {_indent(module_repr(child) if child is not None else 'None', 2)}"
                   for name, child in module._modules.items()]
    hooks = "".join(f"{hook!r} " for hook in module._forward_pre_hooks.values())
    text = hooks + module._get_name() + "("
    lines = extra_lines + child_lines
    if len(extra_lines) == 1 and not child_lines:
        text += extra_lines[0]
    elif lines:
        text += "\n  " + "\n  ".join(lines) + "\n"
    return text + ")"


def print(*objects: Any, **kwargs: Any) -> None:  # pylint: disable=redefined-builtin
    """``builtins.print``, showing modules with :func:`module_repr`."""
    builtins.print(*(module_repr(o) if isinstance(o, torch.nn.Module) else o for o in objects),
                   **kwargs)
