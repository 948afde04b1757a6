"""The update rules of PopTorch's optimisers, on any device.

One definition serves the IPU, where the update of a ``trainingModel`` is
captured once and replayed (``_device_optimizer.py``), and the host, where
``poptorch.optim`` optimisers step with it whenever torch's own ``step``
would compute something else (``max_grad_norm``, ``bias_correction=False``,
``use_tf_variant``, LAMB). Hyper-parameters may be floats or 0-dim tensors: on
the IPU the variable ones are device tensors, so that a captured update
replays with their new values. The state of each parameter has torch's layout
(``momentum_buffer``, ``exp_avg``, ``step``...), so it moves between the two.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

import torch

from ._errors import Error

def algorithm_of(optimizer: torch.optim.Optimizer) -> str:
    """The update rule an optimiser follows (a class may name its own in ``_algorithm``)."""
    own = getattr(type(optimizer), "_algorithm", None)
    if own is not None:
        return own
    for cls, name in ((torch.optim.AdamW, "adamw"), (torch.optim.Adam, "adam"),
                      (torch.optim.SGD, "sgd"), (torch.optim.RMSprop, "rmsprop")):
        if isinstance(optimizer, cls):
            return name
    raise Error(f"{type(optimizer).__name__} is not supported on the IPU: use poptorch.optim "
                f"SGD, Adam, AdamW, RMSprop or LAMB (or their torch.optim counterparts)")


# The hyper-parameters each rule reads from a param group (PopTorch's names).
_RULE_KEYS = {
    # and velocity_scaling in the combined variant (_keys)
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay"),
    "rmsprop": ("lr", "alpha", "eps", "weight_decay", "momentum", "centered"),
    "lamb": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}
_RULE_KEYS["adamw"] = _RULE_KEYS["adam"]
# Keys of torch's param groups that choose an implementation, not the values
# (foreach...), or that lr schedulers keep (initial_lr): not the rule's business.
_NOT_HYPERPARAMETERS = ("foreach", "fused", "capturable", "differentiable", "initial_lr",
                        "params")


def _keys(algorithm: str, optimizer: Any) -> Tuple[str, ...]:
    """The keys of a param group that ``optimizer``'s rule reads. Velocity
    scaling is the combined SGD variant's (the user guide's "SGD combined
    variant only"): the separate variant ignores it, as PopTorch does."""
    if algorithm == "sgd" and getattr(optimizer, "use_combined_accum", False):
        return _RULE_KEYS["sgd"] + ("velocity_scaling",)
    return _RULE_KEYS[algorithm]


def group_hyperparameters(algorithm: str, group: Dict[str, Any],
                          optimizer: Any) -> Dict[str, Any]:
    """A param group's hyper-parameters under PopTorch's attribute names."""
    for flag in ("maximize", "amsgrad"):
        if group.get(flag):
            raise Error(f"{flag}=True is not supported by PopTorch's {algorithm} optimiser")
    hyper = dict(group)
    if "betas" in hyper:
        hyper["beta1"], hyper["beta2"] = hyper.pop("betas")
    return {name: hyper[name] for name in _keys(algorithm, optimizer) if name in hyper}


def ignored_hyperparameters(algorithm: str, group: Dict[str, Any],
                            optimizer: Any) -> Dict[str, Any]:
    """The keys of a param group that the rule does not read (a user's own, or
    another optimiser's), with their values."""
    known = set(_keys(algorithm, optimizer)) | {"betas", "maximize", "amsgrad"}
    return {name: value for name, value in group.items()
            if name not in known and name not in _NOT_HYPERPARAMETERS}


def _state_dtype(optimizer: Any, attr: str, param: torch.Tensor) -> torch.dtype:
    """The dtype a poptorch.optim attribute asks for (torch optimisers: the parameter's)."""
    return getattr(optimizer, attr, None) or param.dtype


def accumulator_dtype(optimizer: Any, param: torch.Tensor) -> torch.dtype:
    """The dtype gradients of ``param`` are accumulated in (``accum_type``)."""
    return _state_dtype(optimizer, "accum_type", param)


def initial_state(algorithm: str, param: torch.Tensor, optimizer: Any,
                  group: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """The state of a parameter of param group ``group`` before its first
    update, on its device: zeros (the TensorFlow variant of RMSprop starts its
    squares at one). RMSprop has the average gradient only when centred, as in
    torch (its momentum buffer always: momentum may be a variable)."""
    first_attr = ("velocity_accum_type" if algorithm == "sgd"
                  else "first_order_momentum_accum_type")
    first = _state_dtype(optimizer, first_attr, param)
    second = _state_dtype(optimizer, "second_order_momentum_accum_type", param)
    zeros = lambda dtype: torch.zeros(param.shape, dtype=dtype, device=param.device)  # noqa: E731
    step = torch.zeros((), dtype=torch.float32, device=param.device)
    if algorithm == "sgd":
        return {"momentum_buffer": zeros(first), "step": step}
    if algorithm in ("adam", "adamw", "lamb"):
        return {"exp_avg": zeros(first), "exp_avg_sq": zeros(second), "step": step}
    square_avg = zeros(second)
    if getattr(optimizer, "use_tf_variant", False):
        square_avg.fill_(1)
    state = {"square_avg": square_avg, "momentum_buffer": zeros(first), "step": step}
    if group.get("centered"):
        state["grad_avg"] = zeros(first)
    return state


def state_from_torch(algorithm: str, saved: Dict[str, Any], device_state: Dict[str, torch.Tensor],
                     index: int) -> Dict[str, torch.Tensor]:
    """The values of ``device_state`` (one parameter's, as ``initial_state``
    makes it) found in its state in a torch optimiser (loaded, or from steps
    on the CPU), in the device's dtypes: torch's keys are ours; what torch has
    not created yet keeps its initial value (it is left out). Torch's SGD
    keeps no step: a momentum buffer means it has started."""
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
            continue
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
    velocity_scaling = h.get("velocity_scaling", 1.0)  # the combined variant's groups have it
    if algorithm == "sgd" and _sgd_momentum_fuses(p, g, state, h, velocity_scaling):
        _sgd_momentum_fused(p, g, state, h, velocity_scaling)
        return
    state["step"].add_(1)
    if algorithm == "sgd":
        _sgd(p, g, state, h, velocity_scaling)
    elif algorithm in ("adam", "adamw"):
        # torch.optim.Adam(decoupled_weight_decay=True) is AdamW.
        _adam(p, g, state, h, decoupled=algorithm == "adamw" or h.get("decoupled_weight_decay"),
              bias_correction=getattr(optimizer, "bias_correction", True))
    elif algorithm == "rmsprop":
        _rmsprop(p, g, state, h, getattr(optimizer, "use_tf_variant", False))
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


def _is_float32_scalar_on(value: Any, device: torch.device) -> bool:
    return (not isinstance(value, torch.Tensor) or
            (value.dtype == torch.float32 and value.numel() == 1 and value.device == device))


def _sgd_momentum_fuses(p, g, state, h, velocity_scaling) -> bool:
    """Whether ``poptorch::sgd_momentum_`` computes ``_sgd``'s update of ``p``:
    momentum without dampening, float32 tensors of one shape on one device, a
    constant velocity scaling."""
    buf, step = state["momentum_buffer"], state["step"]
    if _is_zero(h["momentum"]) or not _is_zero(h["dampening"]) or not isinstance(
            h["nesterov"], bool) or isinstance(velocity_scaling, torch.Tensor):
        return False
    if any(t.dtype != torch.float32 or t.device != p.device or t.shape != p.shape or
           not t.is_contiguous() for t in (p, g, buf)):
        return False
    return isinstance(step, torch.Tensor) and all(
        _is_float32_scalar_on(value, p.device)
        for value in (step, h["lr"], h["momentum"], h["weight_decay"]))


def _sgd_momentum_fused(p, g, state, h, velocity_scaling) -> None:
    """``_sgd`` with momentum and without dampening, step counter included, in
    one pass over the parameter (``csrc/kernels/sgd.cpp``)."""
    def tensor(value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        return torch.full((), float(value), dtype=torch.float32, device=p.device)

    decay = None if _is_zero(h["weight_decay"]) else tensor(h["weight_decay"])
    torch.ops.poptorch.sgd_momentum_(p, state["momentum_buffer"], state["step"], g,
                                     tensor(h["lr"]), tensor(h["momentum"]), decay,
                                     float(velocity_scaling), h["nesterov"])


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


def _rmsprop(p, g, state, h, tf_variant: bool) -> None:
    """torch's RMSprop, or TensorFlow's: squares start at one (``initial_state``),
    eps is added under the square root, and the momentum buffer accumulates
    ``lr x`` the step."""
    if not _is_zero(h["weight_decay"]):
        _axpy_(g, p, h["weight_decay"])
    square_avg = state["square_avg"]
    square_avg.mul_(h["alpha"])
    _axpy_(square_avg, (g * g).to(square_avg.dtype), 1 - h["alpha"])
    if h["centered"]:
        grad_avg = state["grad_avg"]
        grad_avg.lerp_(g.to(grad_avg.dtype), 1 - h["alpha"])
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1)
    else:
        avg = square_avg.clone()
    if tf_variant:
        avg.add_(h["eps"]).sqrt_()
    else:
        avg.sqrt_().add_(h["eps"])
    if not _is_zero(h["momentum"]):
        buf = state["momentum_buffer"]
        buf.mul_(h["momentum"])
        if tf_variant:
            _axpy_(buf, g.div_(avg), h["lr"])
            p.sub_(buf)
        else:
            buf.addcdiv_(g, avg)
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
    # The device's value (variable) when the optimiser has one, else the host's.
    max_weight_norm = h.get("max_weight_norm", getattr(optimizer, "max_weight_norm", None))
    clipped = weight_norm if max_weight_norm is None else weight_norm.clamp(max=max_weight_norm)
    update_norm = update.norm()
    # 1 when a norm is 0 (a weight that starts at zeros); max_weight_norm=0 gives 0.
    trust = torch.where((weight_norm > 0) & (update_norm > 0), clipped / update_norm, 1.0)
    _axpy_(p, update, -(trust * h["lr"]))


def apply_update(algorithm: str, optimizer: Any,
                 groups: Iterable[Tuple[Iterable[torch.Tensor], Dict[str, Any]]],
                 grads: Dict[int, torch.Tensor], states: Dict[int, Dict[str, torch.Tensor]],
                 max_grad_norm: Any) -> None:
    """Updates every parameter of ``groups`` (params, hyper-parameters) that has
    a gradient in ``grads`` (by id; float32, unscaled, used as scratch), first
    clipping their global norm to ``max_grad_norm`` (None: no clipping)."""
    if max_grad_norm is not None:
        clip_gradients_(list(grads.values()), max_grad_norm)
    for params, hyper in groups:
        for p in params:
            if id(p) in grads:
                update_parameter(algorithm, p, grads[id(p)], states[id(p)], hyper, optimizer)


def clip_gradients_(grads: List[torch.Tensor], max_norm: float) -> None:
    """Scales gradients in place so that their global norm is at most
    ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``)."""
    total = torch.sqrt(sum((g.float() * g.float()).sum() for g in grads))
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient)
