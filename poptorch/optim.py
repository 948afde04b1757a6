"""PopTorch optimisers: ``SGD``, ``Adam``, ``AdamW``, ``RMSprop`` and ``LAMB``.

They are torch optimisers, with torch's arguments and state layout, that
also work on the CPU, plus PopTorch's attributes: ``loss_scaling``,
``velocity_scaling`` and ``use_combined_accum`` (SGD), ``accum_type``,
``velocity_accum_type`` (SGD), ``first_order_momentum_accum_type``,
``second_order_momentum_accum_type``, ``max_grad_norm``, ``bias_correction``
(AdamW, LAMB), ``use_tf_variant`` (RMSprop), ``max_weight_norm`` (LAMB), and
``variable_attrs`` saying which attributes may change without recompiling:
those passed to the constructor (and ``lr``) are variables, the others
constants.

``step()`` on the host follows the same update rule as the IPU
(:mod:`poptorch._update_rules`): torch's own step where it computes the same,
PopTorch's rule where it would not (gradient clipping, no bias correction,
TensorFlow's RMSprop, LAMB).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Iterable, Optional, Set, Tuple

import torch

from . import _update_rules as rules
from ._errors import Error
from ._logging import logger

__all__ = ["Adam", "AdamW", "LAMB", "Optimizer", "RMSprop", "SGD", "VariableAttributes"]


class VariableAttributes:
    """Which attributes of an optimiser are variables (they may change through
    ``setOptimizer`` without recompiling) and which are constants (embedded in
    the compiled program). ``betas`` names ``beta1`` and ``beta2`` together."""

    def __init__(self, variables: Iterable[str], attributes: Iterable[str]) -> None:
        # PopTorch's private names: scripts written for it set them directly.
        self._allowed_attributes = set(attributes)
        self._variable_attributes: Set[str] = set(variables) & self._allowed_attributes

    def _names(self, attr: str) -> Tuple[str, ...]:
        names = ("beta1", "beta2") if attr == "betas" else (attr,)
        if not set(names) <= self._allowed_attributes:
            raise Error(f"unknown optimiser attribute {attr!r}: expected one of "
                        f"{', '.join(sorted(self._allowed_attributes))}")
        return names

    def isConstant(self, attr: str) -> bool:
        """True if ``attr`` is embedded in the compiled program."""
        return not set(self._names(attr)) & self._variable_attributes

    def markAsConstant(self, attr: str) -> None:
        """Embeds ``attr`` in the program (before the model is compiled)."""
        self._variable_attributes.difference_update(self._names(attr))

    def markAsVariable(self, attr: str) -> None:
        """Lets ``attr`` change through ``setOptimizer`` (before the model is compiled)."""
        self._variable_attributes.update(self._names(attr))

    def __repr__(self) -> str:
        return f"VariableAttributes(variables={sorted(self._variable_attributes)})"


# PopTorch's words: the separate SGD variant ignores velocity scaling (the user
# guide's "Velocity scaling (SGD combined variant only)").
VELOCITY_SCALING_IGNORED = ("velocity_scaling value ignored when using the separate variant "
                            "(use_combined_accum=False). In future, this will lead to an error. "
                            "Please update your code.")


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _accum_type(dtype: Optional[torch.dtype], name: str) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if dtype not in (torch.float16, torch.float32):
        raise Error(f"{name} must be torch.float16 or torch.float32, got {dtype}")
    return dtype


def _torch_flags(**flags: Any) -> Dict[str, Any]:
    """torch's implementation flags (foreach, fused...) that were given."""
    return {name: value for name, value in flags.items() if value is not None}


class Optimizer:
    """What PopTorch adds to a torch optimiser: the base of ``poptorch.optim``'s.

    ``state_dict()`` is torch's (it loads into the torch optimiser of the same
    kind, on the CPU) plus PopTorch's ``"ipu_state"`` and ``"ipu_param"``:
    while a ``trainingModel`` uses the optimiser, the device's state tensors
    (``"<state>___<parameter index>"``) and variable hyper-parameters
    (``"<name>___group<i>"``, ``"loss_scaling"``), else None.
    ``load_state_dict`` takes torch's part, then writes the ``ipu_state`` and
    ``ipu_param`` entries it holds (all or some) over it: on the device of the
    model the optimiser drives, or, when it drives none yet, when it does.
    """

    _attributes: Tuple[str, ...] = ()  # the attributes that may be variables
    _extras: Tuple[str, ...] = ()  # PopTorch's attributes, kept by pickle and deepcopy

    def __setattr__(self, name: str, value: Any) -> None:
        # The device scales the loss by it and divides the gradients by it: 0
        # (or inf, nan) made every weight nan after one step, where the CPU's
        # step ignores it; a negative one flips nothing but is no scale.
        if name == "loss_scaling" and not (isinstance(value, numbers.Real)
                                           and not isinstance(value, bool)
                                           and 0 < value < math.inf):
            raise Error(f"{type(self).__name__}: loss_scaling must be a finite number above "
                        f"0, got {value!r} (1.0 scales nothing; 128 to 1024 are usual for "
                        "float16)")
        super().__setattr__(name, value)

    def _setup_poptorch(self, passed: Dict[str, Any], **extras: Any) -> None:
        for name, value in extras.items():
            setattr(self, name, value)
        self.variable_attrs = VariableAttributes(
            [k for k, v in passed.items() if v is not None] + ["lr"], self._attributes)

    def state_dict(self) -> Dict[str, Any]:
        """torch's state dict, with ``"ipu_state"`` and ``"ipu_param"`` (see the
        class doc; those loaded and not yet on a device while it drives none)."""
        state = torch.optim.Optimizer.state_dict(self)  # type: ignore[arg-type]
        pending = getattr(self, "_loaded_ipu_state", None) or (None, None)
        state.setdefault("ipu_state", pending[0])
        state.setdefault("ipu_param", pending[1])
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's ``load_state_dict``, then the ``ipu_state`` and ``ipu_param`` entries."""
        written = tuple(dict(state_dict.get(k) or {}) for k in ("ipu_state", "ipu_param"))
        if any(written):
            # The device optimiser takes them after torch's part (its load
            # post-hook), or when it is made (_device_optimizer).
            self._loaded_ipu_state = written
        super().load_state_dict(state_dict)  # type: ignore[misc]

    def __getstate__(self) -> Dict[str, Any]:
        # torch's __setstate__ takes every key back into __dict__.
        state = torch.optim.Optimizer.__getstate__(self)  # type: ignore[arg-type]
        # While a model drives it, its state is the device's, which a copy
        # takes in torch's layout (imported here: that module imports this one).
        from ._device_optimizer import torch_state  # pylint: disable=import-outside-toplevel
        device_state = torch_state(self)  # type: ignore[arg-type]
        if device_state is not None:
            state["state"] = device_state
        for name in self._extras + ("variable_attrs",):
            state[name] = getattr(self, name)
        return state

    def _torch_step_computes_the_rule(self) -> bool:
        """True when torch's own ``step`` computes PopTorch's update."""
        return getattr(self, "max_grad_norm", None) is None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One update of every parameter with a gradient, as on the IPU."""
        if self._torch_step_computes_the_rule():
            return super().step(closure)  # type: ignore[misc]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step_with_the_rule()
        return loss

    def _step_with_the_rule(self) -> None:
        algorithm = rules.algorithm_of(self)  # type: ignore[arg-type]
        # The host's state is torch's (the velocity itself, as a checkpoint
        # holds it): velocity scaling is a representation of the device's.
        groups = [(group["params"], {name: value for name, value in
                                     rules.group_hyperparameters(algorithm, group, self).items()
                                     if name != "velocity_scaling"})
                  for group in self.param_groups]  # type: ignore[attr-defined]
        grads: Dict[int, torch.Tensor] = {}
        states: Dict[int, Dict[str, torch.Tensor]] = {}
        index = 0
        for params, _ in groups:
            for p in params:
                if p.grad is not None:
                    grads[id(p)] = p.grad.detach().to(torch.float32, copy=True)
                    states[id(p)] = self._rule_state(algorithm, p, index)
                index += 1
        rules.apply_update(algorithm, self, groups, grads, states,
                           getattr(self, "max_grad_norm", None))

    def _rule_state(self, algorithm: str, p: torch.Tensor, index: int) -> Dict[str, torch.Tensor]:
        """The state of ``p`` with every tensor the rule uses (one torch's
        step made may lack some)."""
        state = self.state[p]  # type: ignore[attr-defined]
        group = next(g for g in self.param_groups  # type: ignore[attr-defined]
                     if any(q is p for q in g["params"]))
        full = rules.initial_state(algorithm, p, self, group)
        if set(state) != set(full):
            loaded = rules.state_from_torch(algorithm, state, full, index)
            state.clear()
            state.update({name: loaded[name].clone() if name in loaded else value
                          for name, value in full.items()})
        return state


class SGD(Optimizer, torch.optim.SGD):
    """``torch.optim.SGD`` with ``loss_scaling``, ``velocity_scaling`` (the
    combined variant holds its velocity scaled on the IPU; its state dict and
    its steps on the CPU hold torch's), ``use_combined_accum``, ``accum_type`` (of the
    gradient accumulators), ``velocity_accum_type`` (of the velocity) and
    ``max_grad_norm`` (global gradient clipping)."""

    _attributes = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "loss_scaling",
                   "velocity_scaling")
    _extras = ("loss_scaling", "velocity_scaling", "use_combined_accum", "accum_type",
               "velocity_accum_type", "max_grad_norm")

    def __init__(self, params, lr: float, momentum: Optional[float] = None,
                 dampening: Optional[float] = None, weight_decay: Optional[float] = None,
                 nesterov: Optional[bool] = None, maximize: Optional[bool] = None,
                 foreach: Optional[bool] = None, differentiable: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, velocity_scaling: Optional[float] = None,
                 use_combined_accum: Optional[bool] = None,
                 accum_type: Optional[torch.dtype] = None,
                 velocity_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        if maximize:
            raise Error("poptorch.optim.SGD does not support maximize=True: negate the loss")
        super().__init__(params, lr=lr, momentum=_pick(momentum, 0.0),
                         dampening=_pick(dampening, 0.0), weight_decay=_pick(weight_decay, 0.0),
                         nesterov=_pick(nesterov, False),
                         **_torch_flags(foreach=foreach, differentiable=differentiable))
        self._setup_poptorch(
            dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                 nesterov=nesterov, loss_scaling=loss_scaling, velocity_scaling=velocity_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), velocity_scaling=_pick(velocity_scaling, 1.0),
            use_combined_accum=_pick(use_combined_accum, False),
            accum_type=_accum_type(accum_type, "accum_type"),
            velocity_accum_type=_accum_type(velocity_accum_type, "velocity_accum_type"),
            max_grad_norm=max_grad_norm)
        if velocity_scaling is not None and not self.use_combined_accum:
            logger.warning(VELOCITY_SCALING_IGNORED)
        if self.use_combined_accum:
            # The combined variant's velocity scaling may differ between groups
            # (the user guide's one per-group PopTorch attribute); a group added
            # later (add_param_group) takes the default.
            self.defaults["velocity_scaling"] = self.velocity_scaling
            for group in self.param_groups:
                group.setdefault("velocity_scaling", self.velocity_scaling)


class Adam(Optimizer, torch.optim.Adam):
    """``torch.optim.Adam`` with ``loss_scaling``, the accumulator types and
    ``max_grad_norm`` (global gradient clipping). ``amsgrad`` and ``maximize``
    are not supported."""

    # amsgrad: only False, but passing it makes it a variable, as in PopTorch
    _attributes = ("lr", "beta1", "beta2", "eps", "weight_decay", "loss_scaling", "amsgrad")
    _extras = ("loss_scaling", "accum_type", "first_order_momentum_accum_type",
               "second_order_momentum_accum_type", "max_grad_norm", "bias_correction")

    def __init__(self, params, lr: Optional[float] = None,
                 betas: Optional[Tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, amsgrad: Optional[bool] = None,
                 foreach: Optional[bool] = None, maximize: Optional[bool] = None,
                 capturable: Optional[bool] = None, differentiable: Optional[bool] = None,
                 fused: Optional[bool] = None, loss_scaling: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        self._init_adam(params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, accum_type,
                        first_order_momentum_accum_type, second_order_momentum_accum_type,
                        max_grad_norm, True,
                        _torch_flags(foreach=foreach, maximize=maximize, capturable=capturable,
                                     differentiable=differentiable, fused=fused))

    def _init_adam(self, params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, accum_type,
                   first_order_momentum_accum_type, second_order_momentum_accum_type,
                   max_grad_norm, bias_correction, flags: Dict[str, Any]) -> None:
        name = type(self).__name__
        if amsgrad:
            raise Error(f"poptorch.optim.{name} does not support amsgrad=True")
        if flags.get("maximize"):
            raise Error(f"poptorch.optim.{name} does not support maximize=True: negate the loss")
        # Positionally: Adam's torch constructor, then AdamW's default weight decay.
        torch_class = torch.optim.AdamW if isinstance(self, torch.optim.AdamW) else torch.optim.Adam
        torch_class.__init__(self, params, lr=_pick(lr, 1e-3), betas=_pick(betas, (0.9, 0.999)),
                             eps=_pick(eps, 1e-8),
                             weight_decay=_pick(weight_decay, 1e-2 if torch_class is
                                                torch.optim.AdamW else 0.0), **flags)
        self._setup_poptorch(
            dict(lr=lr, beta1=betas, beta2=betas, eps=eps, weight_decay=weight_decay,
                 loss_scaling=loss_scaling, amsgrad=amsgrad),
            loss_scaling=_pick(loss_scaling, 1.0), accum_type=_accum_type(accum_type, "accum_type"),
            first_order_momentum_accum_type=_accum_type(first_order_momentum_accum_type,
                                                        "first_order_momentum_accum_type"),
            second_order_momentum_accum_type=_accum_type(second_order_momentum_accum_type,
                                                         "second_order_momentum_accum_type"),
            max_grad_norm=max_grad_norm, bias_correction=bias_correction)

    def _torch_step_computes_the_rule(self) -> bool:
        return super()._torch_step_computes_the_rule() and self.bias_correction


class AdamW(Adam, torch.optim.AdamW):  # type: ignore[misc]
    """``torch.optim.AdamW`` (decoupled weight decay, 0.01 by default) with
    PopTorch's attributes and ``bias_correction``: without it the moments are
    used as they are, ``p -= lr * (m / (sqrt(v) + eps) + weight_decay * p)``,
    on the IPU and in ``step()`` alike."""

    def __init__(self, params, lr: Optional[float] = None,
                 betas: Optional[Tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, amsgrad: Optional[bool] = None,
                 maximize: Optional[bool] = None, foreach: Optional[bool] = None,
                 capturable: Optional[bool] = None, differentiable: Optional[bool] = None,
                 fused: Optional[bool] = None, loss_scaling: Optional[float] = None,
                 bias_correction: Optional[bool] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        self._init_adam(params, lr, betas, eps, weight_decay, amsgrad, loss_scaling, accum_type,
                        first_order_momentum_accum_type, second_order_momentum_accum_type,
                        max_grad_norm, _pick(bias_correction, True),
                        _torch_flags(foreach=foreach, maximize=maximize, capturable=capturable,
                                     differentiable=differentiable, fused=fused))


class RMSprop(Optimizer, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` with ``loss_scaling``, the accumulator types,
    ``use_tf_variant`` and ``max_grad_norm`` (global gradient clipping).

    ``use_tf_variant=True`` follows TensorFlow's RMSprop, as PopTorch
    documents it: the mean squares start at one, eps is added under the square
    root, and with momentum the buffer accumulates ``lr`` times the step::

        v = alpha * v + (1 - alpha) * g**2             (v starts at 1)
        d = sqrt(v - mean_g**2 + eps) if centered else sqrt(v + eps)
        buf = momentum * buf + lr * g / d;  p -= buf   (p -= lr * g / d without momentum)
    """

    _attributes = ("lr", "alpha", "eps", "weight_decay", "momentum", "loss_scaling")
    _extras = ("loss_scaling", "accum_type", "first_order_momentum_accum_type",
               "second_order_momentum_accum_type", "use_tf_variant", "max_grad_norm")

    def __init__(self, params, lr: Optional[float] = None, alpha: Optional[float] = None,
                 eps: Optional[float] = None, weight_decay: Optional[float] = None,
                 momentum: Optional[float] = None, centered: Optional[bool] = None,
                 foreach: Optional[bool] = None, maximize: Optional[bool] = None,
                 differentiable: Optional[bool] = None, loss_scaling: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 use_tf_variant: Optional[bool] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        if maximize:
            raise Error("poptorch.optim.RMSprop does not support maximize=True: negate the loss")
        super().__init__(params, lr=_pick(lr, 1e-2), alpha=_pick(alpha, 0.99),
                         eps=_pick(eps, 1e-8), weight_decay=_pick(weight_decay, 0.0),
                         momentum=_pick(momentum, 0.0), centered=_pick(centered, False),
                         **_torch_flags(foreach=foreach, differentiable=differentiable))
        self._setup_poptorch(
            dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                 loss_scaling=loss_scaling),
            loss_scaling=_pick(loss_scaling, 1.0), accum_type=_accum_type(accum_type, "accum_type"),
            first_order_momentum_accum_type=_accum_type(first_order_momentum_accum_type,
                                                        "first_order_momentum_accum_type"),
            second_order_momentum_accum_type=_accum_type(second_order_momentum_accum_type,
                                                         "second_order_momentum_accum_type"),
            use_tf_variant=_pick(use_tf_variant, False), max_grad_norm=max_grad_norm)

    def _torch_step_computes_the_rule(self) -> bool:
        return super()._torch_step_computes_the_rule() and not self.use_tf_variant


class LAMB(Optimizer, torch.optim.Optimizer):
    """Layer-wise Adaptive Moments (You et al., 2019), as PopTorch defines it:
    Adam moments (bias-corrected with ``bias_correction``), then each update
    ``u = m / (sqrt(v) + eps) + weight_decay * p`` is scaled by the trust ratio
    ``min(||p||, max_weight_norm) / ||u||`` (1 when ``||p||`` or ``||u||`` is
    0, so ``max_weight_norm=0`` freezes the weights); ``max_weight_norm``
    defaults to 65500, float16's largest value."""

    _algorithm = "lamb"
    _attributes = ("lr", "beta1", "beta2", "eps", "weight_decay", "loss_scaling",
                   "max_weight_norm")
    _extras = ("loss_scaling", "max_weight_norm", "bias_correction", "accum_type",
               "first_order_momentum_accum_type", "second_order_momentum_accum_type",
               "max_grad_norm")

    def __init__(self, params, lr: Optional[float] = None,
                 betas: Optional[Tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, bias_correction: Optional[bool] = None,
                 loss_scaling: Optional[float] = None, max_weight_norm: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        super().__init__(params, dict(lr=_pick(lr, 1e-3), betas=_pick(betas, (0.9, 0.999)),
                                      eps=_pick(eps, 1e-8),
                                      weight_decay=_pick(weight_decay, 1e-2)))
        self._setup_poptorch(
            dict(lr=lr, beta1=betas, beta2=betas, eps=eps, weight_decay=weight_decay,
                 loss_scaling=loss_scaling, max_weight_norm=max_weight_norm),
            loss_scaling=_pick(loss_scaling, 1.0),
            max_weight_norm=_pick(max_weight_norm, 65500.0),
            bias_correction=_pick(bias_correction, True),
            accum_type=_accum_type(accum_type, "accum_type"),
            first_order_momentum_accum_type=_accum_type(first_order_momentum_accum_type,
                                                        "first_order_momentum_accum_type"),
            second_order_momentum_accum_type=_accum_type(second_order_momentum_accum_type,
                                                         "second_order_momentum_accum_type"),
            max_grad_norm=max_grad_norm)

    def _torch_step_computes_the_rule(self) -> bool:
        return False  # torch has no LAMB
