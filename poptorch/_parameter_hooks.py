"""Gradient hooks on a model's parameters (``param.register_hook``) in a trainingModel.

The training step differentiates the device copies of the parameters, not the host
parameters the user put the hooks on: a hook that clipped, scaled or zeroed a gradient
was left out of the step without a word. While the step is captured, each hook is put
on its parameter's device copy too, so what it computes is part of the compiled step
(a hook that reads a value on the host is a host read, guarded like any other). The
compiled step holds the hooks it was captured with: adding or removing one afterwards is
an error that says to compile again. A hook run once ``.grad`` is accumulated
(``register_post_accumulate_grad_hook``) cannot run: the step never fills ``.grad``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import torch

from ._errors import Error


def _hooks_of(tensor: torch.Tensor) -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
    """(gradient hooks, post-accumulate-grad hooks) of ``tensor``, in their order."""
    # pylint: disable=protected-access
    hooks = tensor._backward_hooks
    post = getattr(tensor, "_post_accumulate_grad_hooks", None)
    return (tuple(hooks.values()) if hooks else (), tuple(post.values()) if post else ())


class ParameterHooks:
    """The hooks on the parameters of one training model, as its step was compiled."""

    def __init__(self, host: Dict[str, torch.Tensor]) -> None:
        self._host = host  # name -> host tensor (kept up to date by DeviceState)
        self._compiled = self._current()
        for name, (_, post) in self._compiled.items():
            if post:
                raise Error(
                    f"the model's parameter {name!r} has a hook that runs once its .grad is "
                    "accumulated (register_post_accumulate_grad_hook): trainingModel updates "
                    "the weights on the IPU and never fills .grad, so it would never run. "
                    "Remove it: change gradients with param.register_hook, and leave the "
                    "update to the optimizer given to trainingModel")

    def _current(self) -> Dict[str, Tuple[Tuple[Any, ...], Tuple[Any, ...]]]:
        hooks = {}
        for name, tensor in self._host.items():
            of = _hooks_of(tensor)
            if of[0] or of[1]:
                hooks[name] = of
        return hooks

    def check(self) -> None:
        """Before each run: the hooks are those the step was compiled with."""
        current = self._current()
        if current == self._compiled:  # functions compare by identity
            return
        name = sorted(n for n in current.keys() | self._compiled.keys()
                      if current.get(n) != self._compiled.get(n))[0]
        raise Error(f"the hooks on the model's parameter {name!r} changed after the model "
                    "was compiled (register_hook, or a handle removed), and the compiled step "
                    "applies the hooks it was compiled with: call destroy() to compile it again")

    @contextlib.contextmanager
    def on_device(self, device: Dict[str, torch.Tensor]) -> Iterator[None]:
        """While the backward pass is captured: the hooks are on the device copies."""
        handles: List[Any] = []
        seen = set()  # a tensor tied under two names takes its hooks once
        try:
            for name, (hooks, _) in self._compiled.items():
                copy = device[name]
                if id(copy) in seen or not copy.requires_grad:
                    continue
                seen.add(id(copy))
                handles += [copy.register_hook(hook) for hook in hooks]
            yield
        finally:
            for handle in handles:
                handle.remove()
