"""The optimiser of a trainingModel, on the IPU: its state, its variable
hyper-parameters as device tensors (changed by setOptimizer without
recompiling) and its constant ones, embedded in the captured update.

The state starts from the host optimiser's own (``load_state_dict`` before
wrapping, or steps taken on the CPU), and the host optimiser's ``state`` then
*aliases* the device state, as the host model's weights alias the device
weights: ``optimizer.state_dict()`` is the device's current state, in torch's
layout, and resumes on the CPU. ``load_state_dict`` while wrapped writes the
loaded state (and hyper-parameters) to the device. The combined SGD variant
holds its velocity times its velocity scaling on the device (and in the host
aliases, ``optimizer.state``): its state dict divides it back, so that a
checkpoint holds torch.optim.SGD's momentum buffers, and loading multiplies.
"""
from __future__ import annotations

import collections
import inspect
import logging
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import torch

from . import _C
from . import _loss_scaling
from . import _optimizer_log
from . import _update_rules as rules
from . import optim as popoptim
from ._errors import Error
from ._logging import logger

# Attributes of the optimiser, not of its param groups (defaults when absent).
_GLOBAL_ATTRIBUTES = {"loss_scaling": 1.0, "max_weight_norm": None}


def _torch_defaults(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    signature = inspect.signature(type(optimizer).__init__)
    defaults = {name: p.default for name, p in signature.parameters.items()
                if p.default is not inspect.Parameter.empty}
    if "betas" in defaults:
        defaults["beta1"], defaults["beta2"] = defaults.pop("betas")
    return defaults


def variable_attributes(optimizer: torch.optim.Optimizer, algorithm: str) -> Set[str]:
    """PopTorch's rules: for poptorch.optim, what the constructor was given (or
    markAsVariable says); for torch.optim, what differs from the defaults; lr always."""
    if isinstance(optimizer, popoptim.Optimizer):
        names = type(optimizer)._attributes
        return {n for n in names if not optimizer.variable_attrs.isConstant(n)}
    defaults = _torch_defaults(optimizer)
    variables = {"lr"}
    for group in optimizer.param_groups:
        for name, value in rules.group_hyperparameters(algorithm, group, optimizer).items():
            if name in defaults and value != defaults[name]:
                variables.add(name)
    return variables


def _snapshot(values: Dict[Tuple[int, str], Any]) -> Dict[Tuple[int, str], Any]:
    """Values to compare later: a tensor hyper-parameter (``lr=torch.tensor(...)``)
    may be changed in place, so its value is kept, not the tensor."""
    return {key: value.tolist() if isinstance(value, torch.Tensor) else value
            for key, value in values.items()}


class DeviceOptimizer:
    """State and hyper-parameters of one optimiser on the IPU."""

    def __init__(self, optimizer: torch.optim.Optimizer, device_params: Dict[int, torch.Tensor],
                 device: torch.device, relax_checks: bool = False,
                 automatic_loss_scaling: bool = False, offline: bool = False) -> None:
        self.algorithm = rules.algorithm_of(optimizer)
        self.optimizer = optimizer
        self.device = device
        self._relax_checks = relax_checks  # Options.relaxOptimizerAttributesChecks
        # Compiled for an offline IPU: the state is on no device, so the state
        # dict has no ipu_state / ipu_param (None), as in PopTorch.
        self.offline = offline
        self._reported: Set[str] = set()
        self._report_ignored(optimizer)
        self._tracker = _optimizer_log.AttributeTracker(optimizer, relax_checks)
        self.variables = variable_attributes(optimizer, self.algorithm)
        self.groups: List[Tuple[List[torch.Tensor], Dict[str, Any]]] = []
        self.state: Dict[int, Dict[str, torch.Tensor]] = {}
        self._device_params = device_params  # id(host parameter) -> device parameter
        if not any(id(p) in device_params for g in optimizer.param_groups for p in g["params"]):
            raise Error("the optimizer given to trainingModel holds none of the model's "
                        "parameters, so nothing would be trained: make it from the wrapped "
                        "model's parameters (torch.optim.SGD(model.parameters(), ...))")
        for group in optimizer.param_groups:
            params = [device_params[id(p)] for p in group["params"] if id(p) in device_params]
            hyper = {name: self._value(name, value) for name, value in
                     rules.group_hyperparameters(self.algorithm, group, optimizer).items()}
            self.groups.append((params, hyper))
            for p in params:
                self.state[id(p)] = rules.initial_state(self.algorithm, p, optimizer, group)
        self.automatic_loss_scaling = automatic_loss_scaling  # Training.setAutomaticLossScaling
        if automatic_loss_scaling:  # the scale changes on the device
            self.variables.add("loss_scaling")
        self.loss_scaling = self._value("loss_scaling", getattr(optimizer, "loss_scaling", 1.0))
        # LAMB's clip of the weight norm in its trust ratio
        self.max_weight_norm = self._value("max_weight_norm",
                                           getattr(optimizer, "max_weight_norm", None))
        self.max_grad_norm = getattr(optimizer, "max_grad_norm", None)
        self._compiled_values = self._constants(optimizer)
        # The separate SGD variant's velocity_scaling, which its update ignores
        # (its constructor said so): a change is said once, in the same words.
        self._ignored_velocity_scaling = _separate_velocity_scaling(optimizer)
        self._ignored_change_reported = False
        self._applied = _snapshot(self._compiled_values)  # the values the device has
        self._hooks: List[Any] = []
        self._attach(optimizer)
        self._log_update(optimizer)

    def _report_ignored(self, optimizer: torch.optim.Optimizer) -> None:
        """Says once (WARN, or DEBUG with relaxOptimizerAttributesChecks) which
        param group keys the update does not read."""
        for index, group in enumerate(optimizer.param_groups):
            ignored = rules.ignored_hyperparameters(self.algorithm, group, optimizer)
            for name, value in ignored.items():
                if name not in self._reported:
                    self._reported.add(name)
                    logger.log(logging.DEBUG if self._relax_checks else logging.WARNING,
                               "the optimiser attribute '%s' (%r, param group %d) is ignored: "
                               "the IPU's %s update does not use it", name, value, index,
                               self.algorithm)

    def _log_update(self, optimizer: torch.optim.Optimizer) -> None:
        """PopTorch's DEBUG description of the update (see _optimizer_log):
        the optimiser's defaults and each group's values, "(const)" for those
        embedded in the captured update."""
        if not logger.isEnabledFor(logging.DEBUG):
            return
        describe = _optimizer_log.describe
        defaults = dict(rules.group_hyperparameters(self.algorithm, optimizer.defaults,
                                                      optimizer))
        extras = {name: getattr(self, name) for name in _GLOBAL_ATTRIBUTES
                  if getattr(self, name) is not None}
        max_weight_norm = extras.pop("max_weight_norm", None)
        if max_weight_norm is not None:  # LAMB's, a group value for PopTorch
            defaults["max_weight_norm"] = max_weight_norm
        defaults.update(extras)

        def constant(name: str) -> bool:
            return name not in self.variables

        groups = []
        for _, hyper in self.groups:
            values = dict(hyper)
            if max_weight_norm is not None:
                values["max_weight_norm"] = max_weight_norm
            groups.append(describe(optimizer, self.algorithm, values,
                                   lambda name, values=values: not isinstance(
                                       values[name], torch.Tensor)))
        _optimizer_log.log_update(describe(optimizer, self.algorithm, defaults, constant,
                                           prefix="default"), groups)

    def new_accumulator(self, param: torch.Tensor) -> torch.Tensor:
        """A zeroed gradient accumulator for ``param``, of the optimiser's ``accum_type``."""
        return torch.zeros_like(param, dtype=rules.accumulator_dtype(self.optimizer, param))

    def ipu_state(self) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """PopTorch's ``ipu_state`` (the state tensors, by ``<state>___<index>``,
        the index of the parameter in the state dict, and with automatic loss
        scaling ``lossScaleUpdateFactor``) and ``ipu_param`` (the
        variable hyper-parameters), as host views of the device's tensors."""
        state, index = {}, 0
        for group in self.optimizer.param_groups:
            for host in group["params"]:
                device = self._device_params.get(id(host))
                for name, tensor in (self.state[id(device)].items() if device is not None
                                     else ()):
                    state[f"{name}___{index}"] = _C.host_alias(tensor)
                index += 1
        if self.automatic_loss_scaling:
            # PopTorch's name: how far the automatic rule has moved the scale
            # from the optimiser's loss_scaling (the step's scale is their product).
            base = float(getattr(self.optimizer, "loss_scaling", 1.0))
            state["lossScaleUpdateFactor"] = _C.host_alias(self.loss_scaling) / base
        params = {f"{name}___group{i}": _C.host_alias(value)
                  for i, (_, hyper) in enumerate(self.groups) for name, value in hyper.items()
                  if isinstance(value, torch.Tensor)}
        for name in _GLOBAL_ATTRIBUTES:
            if isinstance(getattr(self, name), torch.Tensor):
                params[name] = _C.host_alias(getattr(self, name))
        return state, params

    def _value(self, name: str, value: Any) -> Any:
        if name in self.variables and isinstance(value, (int, float)) and not isinstance(value, bool):
            return torch.tensor(float(value), device=self.device)
        return value

    def _constants(self, optimizer: torch.optim.Optimizer) -> Dict[Tuple[int, str], Any]:
        values = {}
        for index, group in enumerate(optimizer.param_groups):
            hyper = rules.group_hyperparameters(self.algorithm, group, optimizer)
            for name, value in hyper.items():
                values[(index, name)] = value
        for name, default in _GLOBAL_ATTRIBUTES.items():
            values[(-1, name)] = getattr(optimizer, name, default)
        return values

    @property
    def grad_scale(self) -> Any:
        """What the loss is multiplied by before differentiation."""
        return self.loss_scaling

    def capture_update(self, gradients: Dict[int, torch.Tensor], reduction: float,
                       accumulated: bool) -> None:
        """Records the update of every parameter that has a gradient (times
        ``reduction``, e.g. 1 / micro-batches for mean). The gradients serve
        as scratch; accumulated ones are cleared after the update."""
        with torch.no_grad():
            # Read before the gradients (scratch) are unscaled.
            statistics = (_loss_scaling.Statistics(gradients.values())
                          if self.automatic_loss_scaling else None)
            grads = {key: g if g.dtype == torch.float32 else g.float()
                     for key, g in gradients.items()}
            factor = reduction / self.loss_scaling  # a float, or a 0-dim tensor if variable
            for g in grads.values():
                rules.scale_(g, factor)

            groups = self.groups
            if isinstance(self.max_weight_norm, torch.Tensor):  # variable: the device's
                groups = [(params, {**hyper, "max_weight_norm": self.max_weight_norm})
                          for params, hyper in self.groups]

            def update() -> None:
                rules.apply_update(self.algorithm, self.optimizer, groups, grads,
                                   self.state, self.max_grad_norm)

            if statistics is not None:
                protected = [p for params, _ in self.groups for p in params
                             if id(p) in gradients]
                protected += [t for p in protected for t in self.state[id(p)].values()]
                _loss_scaling.update_with_automatic_scale(self.loss_scaling, statistics,
                                                          protected, update)
            else:
                update()
            if accumulated:
                for acc in gradients.values():
                    acc.zero_()

    def set_values(self, optimizer: torch.optim.Optimizer, who: str = "setOptimizer") -> None:
        """Takes the new hyper-parameters of ``optimizer`` (setOptimizer; `who` names
        the call in errors)."""
        if rules.algorithm_of(optimizer) != self.algorithm:
            raise Error(f"{who}: the model was compiled for {self.algorithm}, got a "
                        f"{type(optimizer).__name__}; wrap the model again to change algorithm")
        if len(optimizer.param_groups) != len(self.groups):
            raise Error(f"{who}: the optimiser has {len(optimizer.param_groups)} param "
                        f"groups, the model was compiled with {len(self.groups)}. Param "
                        "groups cannot be added (optimizer.add_param_group) or removed once "
                        "the model is compiled: give the optimiser every group before the "
                        "first call, or wrap the model again")
        for index, (group, (params, _)) in enumerate(zip(optimizer.param_groups, self.groups)):
            given = [self._device_params.get(id(p)) for p in group["params"]]
            if [id(p) for p in given if p is not None] != [id(p) for p in params]:
                raise Error(f"{who}: param group {index} of the optimiser holds other "
                            "parameters than those the model was compiled with (another "
                            "model's, or the model's in other groups): make the optimiser "
                            "from the wrapped model's parameters, grouped as before, or wrap "
                            "the model again")
        self._tracker.check(optimizer, _optimizer_log.type_name(optimizer, self.algorithm))
        self._report_ignored_change(optimizer)
        new = self._constants(optimizer)
        for (index, name), value in new.items():
            target = getattr(self, name) if index < 0 else self.groups[index][1].get(name)
            if isinstance(target, torch.Tensor):
                if name == "velocity_scaling":
                    self._rescale_velocity(index, float(target), float(value))
                target.copy_(torch.tensor(float(value)))  # a direct upload, no graph
            elif value != self._compiled_values.get((index, name)):
                raise Error(f"{who}: '{name}' is a constant of the compiled optimiser "
                            f"(was {self._compiled_values.get((index, name))}, now {value}). "
                            f"Pass it to the optimiser's constructor or call "
                            f"optimizer.variable_attrs.markAsVariable('{name}') before "
                            f"compiling to make it variable.")
        if optimizer is not self.optimizer:
            self.release()
            self._attach(optimizer)
        if _snapshot(new) != self._applied:
            self._log_update(optimizer)
        self._applied = _snapshot(new)
        _C.synchronize()

    def _rescale_velocity(self, index: int, old: float, new: float) -> None:
        """The velocity of group ``index`` is held times its velocity scaling:
        a new scaling rescales it, so that the training goes on unchanged."""
        if old == new:
            return
        _C.synchronize()
        for p in self.groups[index][0]:
            _C.host_alias(self.state[id(p)]["momentum_buffer"]).mul_(new / old)

    def follow_host_changes(self) -> None:
        """Before a run: hyper-parameters changed on the host optimiser (an LR
        scheduler's step, ``param_groups[i]["lr"] = ...``) are taken, where
        PopTorch needs a setOptimizer() and runs the old values without it."""
        self._report_ignored_change(self.optimizer)
        if _snapshot(self._constants(self.optimizer)) != self._applied:
            logger.debug("the optimiser's hyper-parameters changed on the host: taking them "
                         "as setOptimizer() does")
            self.set_values(self.optimizer, "the optimiser changed since the model was "
                            "compiled")

    def _report_ignored_change(self, optimizer: torch.optim.Optimizer) -> None:
        """Warns once when the separate SGD variant's ignored velocity_scaling
        changed (the lr and the other hyper-parameters are taken)."""
        value = _separate_velocity_scaling(optimizer)
        if value != self._ignored_velocity_scaling:
            self._ignored_velocity_scaling = value
            if not self._ignored_change_reported:
                self._ignored_change_reported = True
                logger.warning(popoptim.VELOCITY_SCALING_IGNORED)

    def _host_parameters(self, optimizer: torch.optim.Optimizer
                         ) -> List[Tuple[Any, Dict[str, torch.Tensor], float]]:
        """(host parameter, its device state, its velocity scaling) for every
        parameter on the device."""
        devices = [(host, self._device_params.get(id(host)), self._velocity_scaling(index))
                   for index, group in enumerate(optimizer.param_groups)
                   for host in group["params"]]
        # A parameter given to the optimiser after compiling (add_param_group) has none.
        return [(host, self.state[id(device)], scaling) for host, device, scaling in devices
                if device is not None and id(device) in self.state]

    def _velocity_scaling(self, group_index: int) -> float:
        """How many times torch's momentum buffer the device holds for param
        group ``group_index``: the combined SGD variant's velocity scaling
        (1 otherwise, or for a group the device has not)."""
        if self.algorithm != "sgd" or group_index >= len(self.groups):
            return 1.0
        return float(self.groups[group_index][1].get("velocity_scaling", 1.0))

    def torch_layout(self, state: Dict[Any, Dict[str, Any]]) -> Dict[Any, Dict[str, Any]]:
        """``state`` (a state dict's, by parameter index, the live tensors) as torch
        holds it (``_torch_entry``), so that a checkpoint loads into torch's optimiser."""
        index = 0
        for group_index, group in enumerate(self.optimizer.param_groups):
            for _ in group["params"]:
                if state.get(index):
                    entry = self._torch_entry(group_index, state[index], copy=False)
                    if entry is None:
                        del state[index]
                    else:
                        state[index] = entry  # a new dict: the state dict's are the optimiser's
                index += 1
        return state

    def _torch_entry(self, group_index: int, entry: Dict[str, Any],
                     copy: bool) -> Optional[Dict[str, Any]]:
        """A parameter's state ``entry`` on the device as torch holds it (None for
        none): the device holds the combined SGD variant's velocity times its velocity
        scaling, and for SGD a momentum buffer whatever the momentum (it may change)
        and a step; torch's SGD holds no step (a momentum buffer means it has started,
        which loading restores) and no state at all without momentum. ``copy``: copies
        of the tensors, not the live ones."""
        if self.algorithm == "sgd":
            if not self.optimizer.param_groups[group_index]["momentum"]:
                return None
            entry = {name: t for name, t in entry.items() if name != "step"}
        scaling = self._velocity_scaling(group_index)
        return {name: t / scaling if name == "momentum_buffer" and scaling != 1
                else (t.clone() if copy else t) for name, t in entry.items()}

    def _attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Starts from ``optimizer``'s state (when it has one), then makes it
        alias the device state and follow it through its state-dict hooks."""
        owner = _OWNERS.get(optimizer)
        if owner is not None and owner() is not None and owner() is not self:
            owner().release()  # the optimiser now drives this model
        self.optimizer = optimizer
        self._load(optimizer)
        self._write_loaded_ipu_state(optimizer)

        def reload(optimizer: torch.optim.Optimizer, this=weakref.ref(self)) -> None:
            if this() is not None:  # the model may be gone; its state lives on
                this()._reload(optimizer)

        self._hooks = [optimizer.register_state_dict_pre_hook(_synchronize),
                       optimizer.register_state_dict_post_hook(_device_state_dict),
                       optimizer.register_load_state_dict_post_hook(reload)]
        _OWNERS[optimizer] = weakref.ref(self)

    def _load(self, optimizer: torch.optim.Optimizer, restart: bool = False) -> None:
        """Copies the host optimiser's state to the device, then makes the
        host state alias it. ``restart``: what the host state lacks restarts
        from the initial state (a loaded state dict replaces the whole state,
        as in torch), not from the device's."""
        # The initial state first: the copies are then uploads, not nodes of
        # its graph, which stays the same whatever was loaded (a precompiled
        # model finds its executable).
        _C.synchronize()
        groups = {id(host): group for group in optimizer.param_groups for host in group["params"]}
        with torch.no_grad():
            for index, (host, device_state, scaling) in enumerate(
                    self._host_parameters(optimizer)):
                if restart:
                    initial = rules.initial_state(self.algorithm, self._device_params[id(host)],
                                                  optimizer, groups[id(host)])
                    for name, value in device_state.items():
                        value.copy_(initial[name])
                saved = optimizer.state.get(host)
                if saved:
                    for name, value in rules.state_from_torch(
                            self.algorithm, saved, device_state, index).items():
                        if name == "momentum_buffer":
                            value = value * scaling
                        device_state[name].copy_(value)
        _C.synchronize()
        for host, device_state, _ in self._host_parameters(optimizer):
            optimizer.state[host] = {name: _C.host_alias(t) for name, t in device_state.items()}

    def _reload(self, optimizer: torch.optim.Optimizer) -> None:
        """After ``optimizer.load_state_dict``: its state and hyper-parameters
        go to the device, then the loaded ``ipu_state`` / ``ipu_param``."""
        self._load(optimizer, restart=True)
        self.set_values(optimizer)
        self._write_loaded_ipu_state(optimizer)

    def _write_loaded_ipu_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Writes the ``ipu_state`` and ``ipu_param`` entries of a state dict
        that ``optimizer`` loaded (poptorch.optim.Optimizer.load_state_dict)
        to the device tensors ``ipu_state()`` names."""
        loaded = optimizer.__dict__.pop("_loaded_ipu_state", None)
        if loaded is None:
            return
        _C.synchronize()
        state, params = self.ipu_state()
        for kind, values, targets in (("ipu_state", loaded[0], state),
                                      ("ipu_param", loaded[1], params)):
            for key, value in values.items():
                if key not in targets:
                    raise Error(
                        f"load_state_dict: {kind} has {key!r}, which the optimiser of this "
                        f"model has not (it has {sorted(targets)}; constant hyper-parameters "
                        "have no entry): load a state dict of the same model and optimiser")
                value = torch.as_tensor(value)
                if value.shape != targets[key].shape:
                    raise Error(f"load_state_dict: {kind}[{key!r}] has shape "
                                f"{list(value.shape)}, the device's {list(targets[key].shape)}")
                if key == "lossScaleUpdateFactor":  # a ratio, not a device tensor
                    base = float(getattr(optimizer, "loss_scaling", 1.0))
                    _C.host_alias(self.loss_scaling).copy_(value * base)
                else:
                    targets[key].copy_(value)  # host aliases: the device's memory

    def release(self) -> None:
        """Gives the host optimiser its own copy of the state (the device
        state goes away with the model) and stops following it."""
        if not self._hooks:
            return  # released already (another model took the optimiser over)
        _C.synchronize()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        copies = self.torch_state()
        self.optimizer.state.clear()
        self.optimizer.state.update(copies)
        del _OWNERS[self.optimizer]

    def torch_state(self) -> Dict[Any, Dict[str, Any]]:
        """The host optimiser's ``state`` with copies of the device's, in
        torch's layout (``_torch_entry``); parameters the device never updated
        have none, as in torch."""
        _C.synchronize()
        state = collections.defaultdict(dict, self.optimizer.state)
        on_device = {id(host) for host, _, _ in self._host_parameters(self.optimizer)}
        for group_index, group in enumerate(self.optimizer.param_groups):
            for host in group["params"]:
                if id(host) not in on_device:
                    continue
                aliases = state.pop(host, {})
                if aliases and not rules.is_unstarted(aliases):
                    entry = self._torch_entry(group_index, aliases, copy=True)
                    if entry is not None:
                        state[host] = entry
        return state


# optimiser -> the DeviceOptimizer whose state it aliases.
_OWNERS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, Any]" = weakref.WeakKeyDictionary()


def torch_state(optimizer: torch.optim.Optimizer) -> Any:
    """``DeviceOptimizer.torch_state`` of the model ``optimizer`` drives, or
    None when it drives none."""
    owner = _OWNERS.get(optimizer)
    device = owner() if owner is not None else None
    return None if device is None else device.torch_state()


def _separate_velocity_scaling(optimizer: torch.optim.Optimizer) -> Any:
    """The velocity_scaling of a separate-variant poptorch.optim.SGD, or None."""
    if isinstance(optimizer, popoptim.SGD) and not optimizer.use_combined_accum:
        return getattr(optimizer, "velocity_scaling", None)
    return None


def _synchronize(optimizer: torch.optim.Optimizer) -> None:
    _C.synchronize()  # the host aliases show what the device computed


def _device_state_dict(optimizer: torch.optim.Optimizer,
                       state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """Parameters the device never updated have no state, as in torch (an SGD
    momentum buffer of zeros would otherwise count as started on the CPU), and
    momentum buffers are torch's (``torch_layout``); a poptorch.optim optimiser
    also gets PopTorch's ``ipu_state`` and ``ipu_param`` (the device's own tensors)."""
    state_dict["state"] = {index: state for index, state in state_dict["state"].items()
                           if not rules.is_unstarted(state)}
    owner = _OWNERS.get(optimizer)
    device = owner() if owner is not None else None
    if device is not None:
        state_dict["state"] = device.torch_layout(state_dict["state"])
    if isinstance(optimizer, popoptim.Optimizer) and device is not None and not device.offline:
        state_dict["ipu_state"], state_dict["ipu_param"] = device.ipu_state()
    return state_dict
