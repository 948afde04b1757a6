"""The optimiser of a trainingModel, on the IPU: its state, its variable
hyper-parameters as device tensors (changed by setOptimizer without
recompiling) and its constant ones, embedded in the captured update."""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Set, Tuple

import torch

from . import _C
from . import optim as popoptim
from ._errors import Error

_GLOBAL_ATTRIBUTES = ("loss_scaling",)


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
    if isinstance(optimizer, popoptim._PopTorchOptimizer):
        names = popoptim.attribute_names(algorithm)
        return {n for n in names if not optimizer.variable_attrs.isConstant(n)}
    defaults = _torch_defaults(optimizer)
    variables = {"lr"}
    for group in optimizer.param_groups:
        for name, value in popoptim.group_hyperparameters(algorithm, group).items():
            if name in defaults and value != defaults[name]:
                variables.add(name)
    return variables


class DeviceOptimizer:
    """State and hyper-parameters of one optimiser on the IPU."""

    def __init__(self, optimizer: torch.optim.Optimizer, device_params: Dict[int, torch.Tensor],
                 device: torch.device) -> None:
        self.algorithm = popoptim.algorithm_of(optimizer)
        self.optimizer = optimizer
        self.device = device
        self.variables = variable_attributes(optimizer, self.algorithm)
        self.groups: List[Tuple[List[torch.Tensor], Dict[str, Any]]] = []
        self.state: Dict[int, Dict[str, torch.Tensor]] = {}
        for group in optimizer.param_groups:
            params = [device_params[id(p)] for p in group["params"] if id(p) in device_params]
            hyper = {name: self._value(name, value) for name, value in
                     popoptim.group_hyperparameters(self.algorithm, group).items()}
            self.groups.append((params, hyper))
            for p in params:
                self.state[id(p)] = popoptim.initial_state(self.algorithm, p, optimizer)
        self.loss_scaling = self._value("loss_scaling", getattr(optimizer, "loss_scaling", 1.0))
        self.max_grad_norm = getattr(optimizer, "max_grad_norm", None)
        self._compiled_values = self._constants(optimizer)

    def _value(self, name: str, value: Any) -> Any:
        if name in self.variables and isinstance(value, (int, float)) and not isinstance(value, bool):
            return torch.tensor(float(value), device=self.device)
        return value

    def _constants(self, optimizer: torch.optim.Optimizer) -> Dict[Tuple[int, str], Any]:
        values = {}
        for index, group in enumerate(optimizer.param_groups):
            for name, value in popoptim.group_hyperparameters(self.algorithm, group).items():
                values[(index, name)] = value
        for name in _GLOBAL_ATTRIBUTES:
            values[(-1, name)] = getattr(optimizer, name, 1.0)
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
            grads = {key: g if g.dtype == torch.float32 else g.float()
                     for key, g in gradients.items()}
            factor = reduction / self.loss_scaling  # a float, or a 0-dim tensor if variable
            for g in grads.values():
                popoptim.scale_(g, factor)
            if self.max_grad_norm is not None:
                popoptim.clip_gradients_(list(grads.values()), self.max_grad_norm)
            for params, hyper in self.groups:
                for p in params:
                    if id(p) in grads:
                        popoptim.update_parameter(self.algorithm, p, grads[id(p)],
                                                  self.state[id(p)], hyper, self.optimizer)
            if accumulated:
                for acc in gradients.values():
                    acc.zero_()

    def set_values(self, optimizer: torch.optim.Optimizer) -> None:
        """Takes the new hyper-parameters of ``optimizer`` (setOptimizer)."""
        if popoptim.algorithm_of(optimizer) != self.algorithm:
            raise Error(f"setOptimizer: the model was compiled for {self.algorithm}, got a "
                        f"{type(optimizer).__name__}; wrap the model again to change algorithm")
        if len(optimizer.param_groups) != len(self.groups):
            raise Error("setOptimizer: the new optimiser has "
                        f"{len(optimizer.param_groups)} param groups, the compiled one "
                        f"{len(self.groups)}")
        new = self._constants(optimizer)
        for (index, name), value in new.items():
            target = self.loss_scaling if index < 0 else self.groups[index][1].get(name)
            if isinstance(target, torch.Tensor):
                target.copy_(torch.tensor(float(value)))  # a direct upload, no graph
            elif value != self._compiled_values.get((index, name)):
                raise Error(f"setOptimizer: '{name}' is a constant of the compiled optimiser "
                            f"(was {self._compiled_values.get((index, name))}, now {value}). "
                            f"Pass it to the optimiser's constructor or call "
                            f"optimizer.variable_attrs.markAsVariable('{name}') before "
                            f"compiling to make it variable.")
        self.optimizer = optimizer
        _C.synchronize()

    def state_dict(self) -> Dict[str, Any]:
        """The device state, in torch's layout (state by parameter index)."""
        _C.synchronize()
        state: Dict[int, Dict[str, torch.Tensor]] = {}
        groups = []
        index = 0
        for params, hyper in self.groups:
            indices = []
            for p in params:
                state[index] = {k: v.cpu() for k, v in self.state[id(p)].items()}
                indices.append(index)
                index += 1
            plain = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in hyper.items()}
            groups.append(dict(plain, params=indices))
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Writes a state read by :meth:`state_dict` back to the device."""
        flat = [self.state[id(p)] for params, _ in self.groups for p in params]
        saved = state_dict.get("state", {})
        if len(saved) != len(flat):
            raise Error(f"load_state_dict: the state has {len(saved)} parameters, the optimiser "
                        f"{len(flat)}; it must come from the same model's optimizer.state_dict()")
        for index, tensors in enumerate(flat):
            for name, device_tensor in tensors.items():
                if name not in saved[index]:
                    raise Error(f"load_state_dict: parameter {index} has no '{name}' state: the "
                                f"state dict must come from a PopTorch optimiser's state_dict()")
                device_tensor.copy_(saved[index][name])
        _C.synchronize()
