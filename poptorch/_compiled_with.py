"""What of a wrapped model its compiled step took in, checked before every call.

The compiled step replays the ops its capture ran. A forward hook registered on the model
or a submodule after that (``register_forward_hook``, ``register_forward_pre_hook``, or
the global ``register_module_forward_hook``), or one removed, changes nothing the step
runs; nor does a parameter frozen (``requires_grad_(False)``) or unfrozen after a
trainingModel compiled: the step went on running without the hook, or updating the
frozen weight, without a word. Each such change is an error that says to compile again.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch.nn.modules import module as _module

from ._errors import Error


def _global_hooks() -> Tuple[Dict[int, Any], Dict[int, Any]]:
    # pylint: disable=protected-access
    return dict(_module._global_forward_pre_hooks), dict(_module._global_forward_hooks)


class CompiledWith:
    """The forward hooks (and, in training, which parameters train) of one compiled step."""

    def __init__(self, model: torch.nn.Module, training: bool) -> None:
        # pylint: disable=protected-access
        self._hooks: List[Tuple[str, torch.nn.Module, Dict[int, Any], Dict[int, Any]]] = [
            (name, m, dict(m._forward_pre_hooks), dict(m._forward_hooks))
            for name, m in model.named_modules()]
        self._global = _global_hooks()
        self._trainable: List[Tuple[str, torch.nn.Parameter, bool]] = [
            (name, p, p.requires_grad) for name, p in model.named_parameters()] if training \
            else []

    def check(self) -> None:
        """Raises what changed since the step was compiled."""
        # pylint: disable=protected-access
        for name, m, pre, post in self._hooks:
            if m._forward_pre_hooks != pre or m._forward_hooks != post:
                where = f"the model's submodule {name!r}" if name else "the model"
                self._hook_changed(where)
        if _global_hooks() != self._global:
            self._hook_changed("every module (a global hook, register_module_forward_hook)")
        for name, p, requires_grad in self._trainable:
            if p.requires_grad != requires_grad:
                what = ("frozen (requires_grad=False), and the compiled step goes on training "
                        "it" if requires_grad else "unfrozen (requires_grad=True), and the "
                        "compiled step does not train it")
                raise Error(f"the model's parameter {name!r} was {what}: set requires_grad "
                            "before the first call, or call destroy() to compile it again")

    @staticmethod
    def _hook_changed(where: str) -> None:
        raise Error(f"a forward hook was registered on or removed from {where} after the "
                    "model was compiled, and the compiled step runs the hooks it was compiled "
                    "with: register hooks before the first call, or call destroy() to compile "
                    "it again")
