"""What PopTorch logs about the optimiser of a trainingModel, in its words.

* At DEBUG, the update as compiled: once for the optimiser's defaults
  ("Updating graph optimizer with SGD2, defaultLearningRate=0.01, ...") and
  once per param group ("Updating group 0 optimizer with ..."), each
  hyper-parameter under PopTorch's name, marked "(const)" when it is embedded
  in the captured update rather than held in a device tensor that
  ``setOptimizer`` changes. They are logged when the model is compiled and
  whenever ``setOptimizer`` (or a change on the host) changes a value, so a
  user sees which attributes are constants (see the user guide's "Constant
  attributes").
* A WARNING (DEBUG with ``Options.relaxOptimizerAttributesChecks``), once, for
  an attribute of the optimiser or a key of a param group that appeared after
  compiling ("Ignoring unexpected optimizer attribute in SGD1 optimizer:
  ['lr']"): the update never reads it, so ``optimizer.lr = 0.5`` (instead of
  ``param_groups[i]["lr"]``) changes nothing.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Set

import torch

from ._logging import logger

# Our attribute names -> PopTorch's, per update rule (PopART's camel case).
_GROUP_NAMES = {
    "sgd": {"lr": "learningRate", "weight_decay": "weightDecay", "momentum": "momentum",
            "dampening": "dampening", "velocity_scaling": "velocityScaling",
            "nesterov": "nesterov"},
    "adam": {"lr": "learningRate", "weight_decay": "weightDecay", "beta1": "beta1",
             "beta2": "beta2", "eps": "eps"},
    "rmsprop": {"lr": "learningRate", "weight_decay": "weightDecay", "alpha": "alpha",
                "momentum": "momentum", "eps": "eps"},
}
_GROUP_NAMES["adamw"] = _GROUP_NAMES["adam"]
_GROUP_NAMES["lamb"] = {**_GROUP_NAMES["adam"], "max_weight_norm": "maxWeightNorm"}
_GLOBAL_NAMES = {"loss_scaling": "lossScaling"}  # not per group: no "default" prefix
_UNPREFIXED = {"nesterov"}  # PopTorch names SGD's default nesterov without the prefix


def type_name(optimizer: torch.optim.Optimizer, algorithm: str) -> str:
    """PopTorch's name of the update (SGD1 is the combined variant)."""
    if algorithm == "sgd":
        return "SGD1" if getattr(optimizer, "use_combined_accum", False) else "SGD2"
    return algorithm.upper()


def _number(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, bool):
        return str(int(value))
    return f"{float(value):g}"


def _dtype(dtype: Any) -> str:
    return str(dtype or torch.float32).rsplit(".", 1)[-1]


def describe(optimizer: torch.optim.Optimizer, algorithm: str,
             values: Dict[str, Any], is_constant: Callable[[str], bool],
             prefix: str = "") -> str:
    """``values`` (our names) as PopTorch describes them, sorted by its names,
    then the optimiser's accumulator types and other settings. ``prefix`` makes
    PopTorch's names of the defaults (``default`` + the capitalised name)."""
    names = _GROUP_NAMES[algorithm]
    items = []
    for name, value in values.items():
        popart = names.get(name) or _GLOBAL_NAMES.get(name)
        if popart is None:
            continue  # a torch flag of the rule (decoupled_weight_decay): no PopTorch name
        if prefix and name in names and name not in _UNPREFIXED:
            popart = prefix + popart[0].upper() + popart[1:]
        items.append((popart, f"{_number(value)}{' (const)' if is_constant(name) else ''}"))
    first = "velocity_accum_type" if algorithm == "sgd" else "first_order_momentum_accum_type"
    parts = [type_name(optimizer, algorithm)] + [f"{k}={v}" for k, v in sorted(items)]
    parts += [f"accumType={_dtype(getattr(optimizer, 'accum_type', None))}",
              f"firstOrderMomentumAccumType={_dtype(getattr(optimizer, first, None))}",
              "secondOrderMomentumAccumType="
              f"{_dtype(getattr(optimizer, 'second_order_momentum_accum_type', None))}",
              f"useTfVariant={int(bool(getattr(optimizer, 'use_tf_variant', False)))}",
              f"maxGradNorm={_number(getattr(optimizer, 'max_grad_norm', None) or float('inf'))}"]
    return ", ".join(parts)


def log_update(describe_defaults: str, describe_groups: Iterable[str]) -> None:
    """The DEBUG lines of an update compiled or changed."""
    logger.debug("Updating graph optimizer with %s", describe_defaults)
    for index, text in enumerate(describe_groups):
        logger.debug("Updating group %d optimizer with %s", index, text)


def _public_attributes(optimizer: torch.optim.Optimizer) -> Set[str]:
    """The optimiser's own attributes: not torch's state and groups, nor
    private ones or functions (torch and its LR schedulers add those as they
    go: a scheduler replaces ``optimizer.step`` with a wrapper)."""
    return {name for name, value in vars(optimizer).items()
            if not name.startswith("_") and not callable(value) and name not in
            ("defaults", "state", "param_groups", "variable_attrs")}


class AttributeTracker:
    """Remembers the optimiser's attributes and param group keys when the
    model is compiled, and reports, once each, those that appear later."""

    def __init__(self, optimizer: torch.optim.Optimizer, relax: bool) -> None:
        self._level = logging.DEBUG if relax else logging.WARNING
        self._attributes = _public_attributes(optimizer)
        self._defaults = set(optimizer.defaults)
        self._groups: List[Set[str]] = [set(g) for g in optimizer.param_groups]
        self._said: Set[str] = set()

    def check(self, optimizer: torch.optim.Optimizer, kind: str) -> None:
        """Reports what ``optimizer`` has that the compiled one had not."""
        self._say(_public_attributes(optimizer) - self._attributes, "optimizer attribute", kind)
        self._say(set(optimizer.defaults) - self._defaults, "default group variable", kind)
        for index, group in enumerate(optimizer.param_groups):
            known = self._groups[index] if index < len(self._groups) else set()
            self._say(set(group) - known, f"group {index} attribute", kind)

    def _say(self, extra: Set[str], what: str, kind: str) -> None:
        if not extra:
            return
        message = (f"Ignoring unexpected {what} in {kind} optimizer: {sorted(extra)} (added "
                   "after the model was compiled: the IPU's update does not read it)")
        if message not in self._said:
            self._said.add(message)
            logger.log(self._level, message)
