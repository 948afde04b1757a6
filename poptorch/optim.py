"""PopTorch optimisers: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop`` and ``LAMB``.

They are torch optimisers (they also work on the CPU) with PopTorch's extra
attributes: ``loss_scaling``, ``velocity_scaling`` (SGD), ``accum_type``,
``first_order_momentum_accum_type``, ``second_order_momentum_accum_type``,
``max_grad_norm`` and ``bias_correction`` (Adam/AdamW/LAMB), and
``variable_attrs`` saying which attributes may change without recompiling.
Attributes passed to the constructor are variables; the others are constants.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from ._errors import Error

_EXTRA = ("loss_scaling", "velocity_scaling", "accum_type", "first_order_momentum_accum_type",
          "second_order_momentum_accum_type", "max_grad_norm", "bias_correction",
          "max_weight_norm", "use_combined_accum")


class VariableAttributes:
    """Which attributes of an optimiser are variables (they may change through
    ``setOptimizer`` without recompiling) and which are constants (embedded in
    the compiled program)."""

    def __init__(self, variables: Iterable[str], attributes: Iterable[str]) -> None:
        self._attributes = set(attributes)
        self._variables: Set[str] = set(variables) & self._attributes

    def _check(self, attr: str) -> None:
        if attr not in self._attributes:
            raise Error(f"unknown optimiser attribute {attr!r}: expected one of "
                        f"{', '.join(sorted(self._attributes))}")

    def isConstant(self, attr: str) -> bool:
        self._check(attr)
        return attr not in self._variables

    def markAsConstant(self, attr: str) -> None:
        self._check(attr)
        self._variables.discard(attr)

    def markAsVariable(self, attr: str) -> None:
        self._check(attr)
        self._variables.add(attr)

    def __repr__(self) -> str:
        return f"VariableAttributes(variables={sorted(self._variables)})"


class _PopTorchOptimizer:
    """What PopTorch adds to a torch optimiser."""

    _attributes: Tuple[str, ...] = ()

    def _setup_poptorch(self, passed: Dict[str, Any], **extras: Any) -> None:
        for name, value in extras.items():
            setattr(self, name, value)
        self.variable_attrs = VariableAttributes(
            [k for k, v in passed.items() if v is not None] + ["lr"], self._attributes)


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _check_not_half_state(dtype: Optional[torch.dtype], name: str) -> None:
    if dtype is not None and dtype not in (torch.float16, torch.float32):
        raise Error(f"{name} must be torch.float16 or torch.float32, got {dtype}")


class SGD(_PopTorchOptimizer, torch.optim.SGD):
    """``torch.optim.SGD`` with ``loss_scaling``, ``velocity_scaling``,
    ``use_combined_accum`` and ``max_grad_norm``."""

    _attributes = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "loss_scaling",
                   "velocity_scaling")

    def __init__(self, params, lr: float, momentum: Optional[float] = None,
                 dampening: Optional[float] = None, weight_decay: Optional[float] = None,
                 nesterov: Optional[bool] = None, maximize: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, velocity_scaling: Optional[float] = None,
                 use_combined_accum: Optional[bool] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        if maximize:
            raise Error("poptorch.optim.SGD does not support maximize=True: negate the loss")
        super().__init__(params, lr=lr, momentum=_pick(momentum, 0.0),
                         dampening=_pick(dampening, 0.0), weight_decay=_pick(weight_decay, 0.0),
                         nesterov=_pick(nesterov, False))
        self._setup_poptorch(
            dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                 nesterov=nesterov, loss_scaling=loss_scaling, velocity_scaling=velocity_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), velocity_scaling=_pick(velocity_scaling, 1.0),
            use_combined_accum=_pick(use_combined_accum, False), max_grad_norm=max_grad_norm)


class Adam(_PopTorchOptimizer, torch.optim.Adam):
    """``torch.optim.Adam`` with ``loss_scaling``, accumulator types and
    ``max_grad_norm``."""

    _attributes = ("lr", "beta1", "beta2", "eps", "weight_decay", "loss_scaling")

    def __init__(self, params, lr: Optional[float] = None,
                 betas: Optional[Tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, amsgrad: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        if amsgrad:
            raise Error(f"poptorch.optim.{type(self).__name__} does not support amsgrad=True")
        for dtype, name in ((accum_type, "accum_type"),
                            (first_order_momentum_accum_type, "first_order_momentum_accum_type"),
                            (second_order_momentum_accum_type, "second_order_momentum_accum_type")):
            _check_not_half_state(dtype, name)
        super().__init__(params, lr=_pick(lr, 1e-3), betas=_pick(betas, (0.9, 0.999)),
                         eps=_pick(eps, 1e-8),
                         weight_decay=_pick(weight_decay, self._default_weight_decay()))
        betas_passed = betas is not None
        self._setup_poptorch(
            dict(lr=lr, beta1=betas if betas_passed else None,
                 beta2=betas if betas_passed else None, eps=eps, weight_decay=weight_decay,
                 loss_scaling=loss_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm, bias_correction=True)

    @staticmethod
    def _default_weight_decay() -> float:
        return 0.0


class AdamW(Adam, torch.optim.AdamW):  # type: ignore[misc]
    """``torch.optim.AdamW`` with PopTorch's extra attributes and ``bias_correction``."""

    def __init__(self, params, lr: Optional[float] = None,
                 betas: Optional[Tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, amsgrad: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, bias_correction: Optional[bool] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, accum_type,
                         first_order_momentum_accum_type, second_order_momentum_accum_type,
                         max_grad_norm)
        self.bias_correction = _pick(bias_correction, True)

    @staticmethod
    def _default_weight_decay() -> float:
        return 1e-2


class RMSprop(_PopTorchOptimizer, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` with ``loss_scaling``, accumulator types and
    ``max_grad_norm``."""

    _attributes = ("lr", "alpha", "eps", "weight_decay", "momentum", "loss_scaling")

    def __init__(self, params, lr: Optional[float] = None, alpha: Optional[float] = None,
                 eps: Optional[float] = None, weight_decay: Optional[float] = None,
                 momentum: Optional[float] = None, centered: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        super().__init__(params, lr=_pick(lr, 1e-2), alpha=_pick(alpha, 0.99),
                         eps=_pick(eps, 1e-8), weight_decay=_pick(weight_decay, 0.0),
                         momentum=_pick(momentum, 0.0), centered=_pick(centered, False))
        self._setup_poptorch(
            dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                 loss_scaling=loss_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm)


class LAMB(_PopTorchOptimizer, torch.optim.Optimizer):
    """Layer-wise Adaptive Moments (You et al., 2019), as PopTorch defines it:
    Adam moments, then each update scaled by the trust ratio
    ``min(||w||, max_weight_norm) / ||update||``."""

    _attributes = ("lr", "beta1", "beta2", "eps", "weight_decay", "loss_scaling")

    def __init__(self, params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, bias_correction: bool = True,
                 loss_scaling: Optional[float] = None, max_weight_norm: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._setup_poptorch(
            dict(lr=lr, beta1=betas, beta2=betas, eps=eps, weight_decay=weight_decay,
                 loss_scaling=loss_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), max_weight_norm=max_weight_norm,
            bias_correction=bias_correction, accum_type=accum_type,
            first_order_momentum_accum_type=first_order_momentum_accum_type,
            second_order_momentum_accum_type=second_order_momentum_accum_type,
            max_grad_norm=max_grad_norm)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            hyper = group_hyperparameters("lamb", group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(initial_state("lamb", p, self))
                update_parameter("lamb", p, p.grad.clone(), state, hyper, self)
        return loss


# --- The update rules, on any device. ---------------------------------------
# Hyper-parameters may be floats or 0-dim tensors: on the IPU the variable ones
# are device tensors, so that a captured update replays with their new values.

def algorithm_of(optimizer: torch.optim.Optimizer) -> str:
    """The update rule an optimiser follows."""
    for cls, name in ((LAMB, "lamb"), (torch.optim.AdamW, "adamw"), (torch.optim.Adam, "adam"),
                      (torch.optim.SGD, "sgd"), (torch.optim.RMSprop, "rmsprop")):
        if isinstance(optimizer, cls):
            return name
    raise Error(f"{type(optimizer).__name__} is not supported on the IPU: use poptorch.optim "
                f"SGD, Adam, AdamW, RMSprop or LAMB (or their torch.optim counterparts)")


def group_hyperparameters(algorithm: str, group: Dict[str, Any]) -> Dict[str, Any]:
    """A param group's hyper-parameters under PopTorch's attribute names."""
    hyper = {k: v for k, v in group.items() if k != "params"}
    if "betas" in hyper:
        hyper["beta1"], hyper["beta2"] = hyper.pop("betas")
    for flag in ("maximize", "amsgrad"):
        if hyper.get(flag):
            raise Error(f"{flag}=True is not supported by PopTorch's {algorithm} optimiser")
    return hyper


def attribute_names(algorithm: str) -> Tuple[str, ...]:
    return {"sgd": SGD._attributes, "adam": Adam._attributes, "adamw": Adam._attributes,
            "rmsprop": RMSprop._attributes, "lamb": LAMB._attributes}[algorithm]


def _state_dtype(optimizer: Any, attr: str, param: torch.Tensor) -> torch.dtype:
    return getattr(optimizer, attr, None) or param.dtype


def initial_state(algorithm: str, param: torch.Tensor, optimizer: Any) -> Dict[str, torch.Tensor]:
    """Zeroed state for one parameter, on its device."""
    first = _state_dtype(optimizer, "first_order_momentum_accum_type", param)
    second = _state_dtype(optimizer, "second_order_momentum_accum_type", param)
    zeros = lambda dtype: torch.zeros(param.shape, dtype=dtype, device=param.device)  # noqa: E731
    step = torch.zeros((), dtype=torch.float32, device=param.device)
    if algorithm == "sgd":
        return {"momentum_buffer": zeros(first), "step": step}
    if algorithm in ("adam", "adamw", "lamb"):
        return {"exp_avg": zeros(first), "exp_avg_sq": zeros(second), "step": step}
    return {"square_avg": zeros(second), "momentum_buffer": zeros(first),
            "grad_avg": zeros(first), "step": step}


def state_from_torch(algorithm: str, saved: Dict[str, Any], device_state: Dict[str, torch.Tensor],
                     index: int) -> Dict[str, torch.Tensor]:
    """The device state of one parameter from its state in a torch optimiser
    (loaded, or from steps on the CPU): torch's keys are ours; what torch has
    not created yet starts at zero. Torch's SGD keeps no step: a momentum
    buffer means it has started."""
    unknown = sorted(set(saved) - set(device_state))
    if unknown:
        raise Error(f"the optimiser state of parameter {index} has {unknown}, which "
                    f"{algorithm} has not: it comes from another kind of optimiser")
    values = {}
    for name, target in device_state.items():
        value = saved.get(name)
        if name == "step" and value is None:
            value = 1.0 if algorithm == "sgd" and "momentum_buffer" in saved else 0.0
        if value is None:
            value = 0.0
        value = torch.as_tensor(value)
        if value.dim() and value.shape != target.shape:
            raise Error(f"the optimiser state '{name}' of parameter {index} has shape "
                        f"{list(value.shape)}, the parameter {list(target.shape)}: the state "
                        f"must come from the same model")
        values[name] = value.to(target.dtype).expand(target.shape)  # no float64 on the ipu
    return values


def is_unstarted(state: Dict[str, Any]) -> bool:
    """True for the state of a parameter that was never updated."""
    step = state.get("step")
    return isinstance(step, torch.Tensor) and step.numel() == 1 and float(step) == 0


def update_parameter(algorithm: str, p: torch.Tensor, g: torch.Tensor,
                     state: Dict[str, torch.Tensor], h: Dict[str, Any], optimizer: Any) -> None:
    """One in-place update of parameter ``p`` from its (unscaled) gradient.
    ``g`` is scratch: the update may overwrite it."""
    state["step"].add_(1)
    if algorithm == "sgd":
        _sgd(p, g, state, h, getattr(optimizer, "velocity_scaling", 1.0))
    elif algorithm in ("adam", "adamw"):
        _adam(p, g, state, h, decoupled=algorithm == "adamw",
              bias_correction=getattr(optimizer, "bias_correction", True))
    elif algorithm == "rmsprop":
        _rmsprop(p, g, state, h)
    else:
        _lamb(p, g, state, h, optimizer)


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == 0


def _is_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == 1


def scale_(t: torch.Tensor, factor: Any) -> None:
    """t *= factor (a float or a 0-dim tensor), in one pass, or none for 1."""
    if not _is_one(factor):
        t.mul_(factor)


def _axpy_(y: torch.Tensor, x: torch.Tensor, a: Any) -> None:
    """y += a * x in one pass; ``a`` is a float or a 0-dim tensor."""
    if isinstance(a, torch.Tensor):
        y.addcmul_(x, a)
    elif a != 0:
        y.add_(x, alpha=a)


def _sgd(p, g, state, h, velocity_scaling) -> None:
    if not _is_zero(h["weight_decay"]):
        _axpy_(g, p, h["weight_decay"])
    lr, momentum = h["lr"], h["momentum"]
    if _is_zero(momentum):
        _axpy_(p, g, -lr)
        return
    # The buffer holds velocity x velocity_scaling. torch starts it at the first
    # gradient, undamped: the zero-initialised buffer then needs no dampening.
    buf = state["momentum_buffer"]
    damping = 1 - h["dampening"]
    if not _is_zero(h["dampening"]):
        damping = torch.where(state["step"] == 1, 1.0, damping)
    buf.mul_(momentum)
    _axpy_(buf, g, damping * velocity_scaling if not _is_one(damping) else velocity_scaling)
    if h["nesterov"]:
        _axpy_(g, buf, momentum / velocity_scaling)
        _axpy_(p, g, -lr)
    else:
        _axpy_(p, buf, -lr / velocity_scaling)


def _adam(p, g, state, h, decoupled: bool, bias_correction: bool) -> None:
    lr = h["lr"]
    if decoupled and not _is_zero(h["weight_decay"]):
        p.mul_(1 - lr * h["weight_decay"])
    elif not decoupled and not _is_zero(h["weight_decay"]):
        _axpy_(g, p, h["weight_decay"])
    exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
    exp_avg.lerp_(g.to(exp_avg.dtype), 1 - h["beta1"])
    exp_avg_sq.mul_(h["beta2"])
    _axpy_(exp_avg_sq, g.mul_(g).to(exp_avg_sq.dtype), 1 - h["beta2"])
    denom = exp_avg_sq.sqrt()
    step_size = lr
    if bias_correction:
        denom.div_(torch.sqrt(1 - torch.pow(h["beta2"], step)))
        step_size = lr / (1 - torch.pow(h["beta1"], step))
    denom.add_(h["eps"])
    # p -= step_size * exp_avg / denom, with step_size possibly a tensor.
    p.addcdiv_(exp_avg, denom.div_(-step_size) if isinstance(step_size, torch.Tensor)
               else denom, value=1 if isinstance(step_size, torch.Tensor) else -step_size)


def _rmsprop(p, g, state, h) -> None:
    if not _is_zero(h["weight_decay"]):
        _axpy_(g, p, h["weight_decay"])
    square_avg = state["square_avg"]
    square_avg.mul_(h["alpha"])
    _axpy_(square_avg, (g * g).to(square_avg.dtype), 1 - h["alpha"])
    if h["centered"]:
        grad_avg = state["grad_avg"]
        grad_avg.lerp_(g.to(grad_avg.dtype), 1 - h["alpha"])
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
    else:
        avg = square_avg.sqrt()
    avg.add_(h["eps"])
    if not _is_zero(h["momentum"]):
        buf = state["momentum_buffer"]
        buf.mul_(h["momentum"]).addcdiv_(g, avg)
        _axpy_(p, buf, -h["lr"])
    else:
        _axpy_(p, g.div_(avg), -h["lr"])


def _lamb(p, g, state, h, optimizer) -> None:
    exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], state["step"]
    exp_avg.mul_(h["beta1"])
    _axpy_(exp_avg, g.to(exp_avg.dtype), 1 - h["beta1"])
    exp_avg_sq.mul_(h["beta2"])
    _axpy_(exp_avg_sq, g.mul_(g).to(exp_avg_sq.dtype), 1 - h["beta2"])
    update = exp_avg_sq.sqrt()
    if getattr(optimizer, "bias_correction", True):
        update.div_(torch.sqrt(1 - torch.pow(h["beta2"], step)))
        update.add_(h["eps"])
        update = exp_avg / update
        update.div_(1 - torch.pow(h["beta1"], step))
    else:
        update = exp_avg / update.add_(h["eps"])
    _axpy_(update, p, h["weight_decay"])
    weight_norm = p.norm()
    max_weight_norm = getattr(optimizer, "max_weight_norm", None)
    if max_weight_norm is not None:
        weight_norm = weight_norm.clamp(max=max_weight_norm)
    update_norm = update.norm()
    trust = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
    _axpy_(p, update, -(trust * h["lr"]))


def clip_gradients_(grads: List[torch.Tensor], max_norm: float) -> None:
    """Scales gradients in place so that their global norm is at most
    ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``)."""
    total = torch.sqrt(sum((g.float() * g.float()).sum() for g in grads))
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient)


__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "LAMB", "VariableAttributes"]
