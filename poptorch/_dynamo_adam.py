"""``torch.optim.Adam``'s and ``AdamW``'s update as one kernel, in the graphs
``torch.compile(backend="ipu")`` runs.

On ipu tensors Adam runs its single-tensor rule, which dynamo traces (with
``capturable`` set, as dynamo does for every compiled optimiser) into some
twenty ops per parameter: the step's increment and the bias corrections on
its 0-dim ``step`` tensor, then five passes over parameter-sized tensors::

    step += 1
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2) ... fma(grad * grad, 1 - beta2, .) ... copy_
    bias_correction1 = 1 - beta1 ** step   (and 2, the step size, its sqrt...)
    denom = (exp_avg_sq.sqrt() / (bc2_sqrt * -step_size)).add_(eps / -step_size)
    param.addcdiv_(exp_avg, denom)

Every parameter's chain with the same hyperparameters becomes one call of
PyTorch's own fused kernel, ``torch._fused_adam_`` (what ``Adam(fused=True)``
runs on the CPU: one pass per parameter), after one ``_foreach_add_`` of the
steps. AdamW's decay (``param.mul_(1 - lr * wd)``) becomes the kernel's
AdamW form (``torch._fused_adamw_``), which decays in the same pass; the
gradient's changes before the chain, ``maximize``'s ``-grad`` and Adam's L2
term ``grad.add(param, alpha=weight_decay)``, are the kernel's ``maximize``
and ``weight_decay``, applied in the same order in its pass; ``amsgrad`` and
tensor hyperparameters trace other ops and are left alone.
The values are the CPU fused kernel's, within rounding of the traced rule's.

The ``step`` tensors of ``torch.optim`` live on the CPU unless the optimiser is
made ``capturable`` (dynamo sets that for CUDA only); a captured program would
keep their values as constants. So the fused graph takes them as an input
instead (``host_steps_as_inputs``): at each call they are counted on the host,
as torch.optim counts them, and uploaded as one tensor, and the graph's
program replays as any other.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx

from ._logging import logger

_prims = torch.ops.prims


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _node(value: Any, op: str, target: Any, nargs: int) -> Optional[Tuple[Any, ...]]:
    """``value``'s arguments if it is the node ``op``/``target`` with ``nargs``
    positional arguments and no keyword ones, else None."""
    if not (isinstance(value, torch.fx.Node) and value.op == op and value.target == target and
            len(value.args) == nargs and not value.kwargs):
        return None
    return value.args


def _method(value: Any, name: str, nargs: int) -> Optional[Tuple[Any, ...]]:
    return _node(value, "call_method", name, nargs)


def _function(value: Any, target: Any, nargs: int) -> Optional[Tuple[Any, ...]]:
    return _node(value, "call_function", target, nargs)


def _tensor_value(node: Any) -> Optional[torch.Tensor]:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


class _Chain:
    """One parameter's traced update: its tensors, hyperparameters and nodes."""

    def __init__(self) -> None:
        self.nodes: List[torch.fx.Node] = []
        self.tensors: Dict[str, torch.fx.Node] = {}
        self.hyper: Dict[str, float] = {}

    def take(self, node: torch.fx.Node) -> torch.fx.Node:
        self.nodes.append(node)
        return node


def _bias_correction(chain: _Chain, value: Any, beta: str) -> Optional[torch.fx.Node]:
    """The step node if ``value`` is ``1 - beta ** step``."""
    args = _function(value, operator.sub, 2)
    if args is None or args[0] != 1:
        return None
    power = _function(args[1], operator.pow, 2)
    if power is None or not _number(power[0]):
        return None
    chain.take(value)
    chain.take(args[1])
    chain.hyper[beta] = float(power[0])
    return power[1]


def _scalar_part(chain: _Chain, denom: torch.fx.Node) -> bool:
    """Matches ``denom = (exp_avg_sq.sqrt() / (bc2.sqrt() * -lr / bc1)).add_(eps / (-lr / bc1))``."""
    args = _method(denom, "add_", 2)
    quotient = _function(args[0], operator.truediv, 2) if args else None
    eps_term = _function(args[1], operator.truediv, 2) if args else None
    if quotient is None or eps_term is None or not _number(eps_term[0]):
        return False
    sqrt_v = _method(quotient[0], "sqrt", 1)
    scale = _function(quotient[1], operator.mul, 2)
    if sqrt_v is None or scale is None:
        return False
    bc2_sqrt = _method(scale[0], "sqrt", 1)
    step_size_neg = scale[1]
    step_size = _method(step_size_neg, "neg", 1)
    if bc2_sqrt is None or step_size is None or eps_term[1] is not step_size_neg:
        return False
    lr_over = _function(step_size[0], operator.truediv, 2)
    if lr_over is None or not _number(lr_over[0]):
        return False
    for node in (denom, args[0], args[1], quotient[0], quotient[1], scale[0], step_size_neg,
                 step_size[0]):
        chain.take(node)
    step1 = _bias_correction(chain, lr_over[1], "beta1")
    step2 = _bias_correction(chain, bc2_sqrt[0], "beta2")
    increment = _function(step1, operator.iadd, 2)
    if step1 is None or step1 is not step2 or increment is None or increment[1] != 1:
        return False
    chain.take(step1)
    chain.tensors.update(exp_avg_sq=sqrt_v[0], step=increment[0])
    chain.hyper.update(lr=float(lr_over[0]), eps=float(eps_term[0]))
    return True


def _moments(chain: _Chain) -> bool:
    """Matches the moments' updates: ``exp_avg.lerp_(grad, 1 - beta1)`` and
    ``exp_avg_sq``'s ``mul_(beta2)``, ``fma(grad * grad, 1 - beta2, .)``, ``copy_``."""
    exp_avg, exp_avg_sq = chain.tensors["exp_avg"], chain.tensors["exp_avg_sq"]
    lerps = [n for n in exp_avg.users if _method(n, "lerp_", 3) and n.args[0] is exp_avg]
    scales = [n for n in exp_avg_sq.users if _method(n, "mul_", 2) and n.args[0] is exp_avg_sq]
    if len(lerps) != 1 or len(scales) != 1:
        return False
    _, grad, weight = lerps[0].args
    scaled = scales[0]
    copies = [u for u in scaled.users if _method(u, "copy_", 2) and u.args[0] is scaled]
    fma = _function(copies[0].args[1], _prims.fma.default, 3) if len(copies) == 1 else None
    square = _function(fma[0], torch.mul, 2) if fma else None
    beta1, beta2 = chain.hyper["beta1"], chain.hyper["beta2"]
    if not (fma and square and fma[2] is scaled and square == (grad, grad) and
            weight == 1 - beta1 and scaled.args[1] == beta2 and fma[1] == 1 - beta2):
        return False
    for node in (lerps[0], scaled, fma[0], copies[0].args[1], copies[0]):
        chain.take(node)
    chain.tensors["grad"] = grad
    return True


def _decoupled_decay(chain: _Chain) -> None:
    """Takes AdamW's decay of the parameter, ``param.mul_(1 - lr * weight_decay)``
    (traced with the factor computed), into the chain: the fused kernel's AdamW
    form applies it in the same pass. Only a parameter's one ``mul_`` by a number
    other than 1 is taken; its weight decay is what the factor and lr give."""
    param = chain.tensors["param"]
    decays = [n for n in param.users if _method(n, "mul_", 2) and n.args[0] is param]
    if len(decays) != 1 or not _number(decays[0].args[1]) or decays[0].args[1] == 1:
        return
    chain.take(decays[0])
    chain.hyper["weight_decay"] = (1.0 - float(decays[0].args[1])) / chain.hyper["lr"]


def _gradient_changes(chain: _Chain) -> None:
    """Takes the gradient's changes before the moments into the chain, as the
    fused kernel's options: Adam's L2 term ``grad.add(param, alpha=wd)`` (not
    with AdamW's decay: the kernel has one weight decay), then ``maximize``'s
    negation, ``-grad``. Only nodes the chain alone uses are taken."""
    grad = chain.tensors["grad"]
    l2 = grad if isinstance(grad, torch.fx.Node) else None
    if (l2 is not None and "weight_decay" not in chain.hyper and l2.op == "call_method" and
            l2.target == "add" and len(l2.args) == 2 and l2.args[1] is chain.tensors["param"] and
            list(l2.kwargs) == ["alpha"] and _number(l2.kwargs["alpha"]) and
            l2.kwargs["alpha"] != 0 and len(l2.users) == 2):  # the lerp_ and the square
        chain.take(l2)
        chain.hyper["l2_weight_decay"] = float(l2.kwargs["alpha"])
        grad = l2.args[0]
    negated = (_function(grad, operator.neg, 1) or _method(grad, "neg", 1))
    if negated is not None and len(grad.users) == (1 if "l2_weight_decay" in chain.hyper else 2):
        chain.take(grad)
        chain.hyper["maximize"] = True
        grad = negated[0]
    chain.tensors["grad"] = grad


def _chain_at(addcdiv: torch.fx.Node) -> Optional[_Chain]:
    """The chain that ends in ``param.addcdiv_(exp_avg, denom)``, or None."""
    args = _method(addcdiv, "addcdiv_", 3)
    if args is None:
        return None
    chain = _Chain()
    chain.take(addcdiv)
    param, exp_avg, denom = args
    chain.tensors.update(param=param, exp_avg=exp_avg)
    if not (_scalar_part(chain, denom) and _moments(chain)):
        return None
    _decoupled_decay(chain)
    _gradient_changes(chain)
    values = {name: _tensor_value(node) for name, node in chain.tensors.items()}
    p = values["param"]
    if not (all(v is not None for v in values.values()) and p.device.type == "ipu" and
            p.dtype == torch.float32 and values["step"].dim() == 0 and
            all(values[n].shape == p.shape and values[n].dtype == p.dtype and
                values[n].device == p.device for n in ("grad", "exp_avg", "exp_avg_sq"))):
        return None
    return chain


def adam_update(params: List[torch.Tensor], grads: List[torch.Tensor],
                exp_avgs: List[torch.Tensor], exp_avg_sqs: List[torch.Tensor],
                steps: List[torch.Tensor], lr: float, beta1: float, beta2: float,
                eps: float, weight_decay: float = 0.0, l2_weight_decay: float = 0.0,
                maximize: bool = False) -> None:
    """The update the fused graph calls: the traced rule's step increment,
    then PyTorch's fused kernel on the parameters' device (its AdamW form for
    a decoupled ``weight_decay``, its Adam form with ``l2_weight_decay``)."""
    torch._foreach_add_(steps, 1)
    device = params[0].device
    if any(s.device != device for s in steps):
        steps = list(_uploaded(steps, device).unbind())
    _fused_kernel(params, grads, exp_avgs, exp_avg_sqs, steps, lr=lr, beta1=beta1, beta2=beta2,
                  eps=eps, weight_decay=weight_decay, l2_weight_decay=l2_weight_decay,
                  maximize=maximize)


def adam_update_of_steps(params: List[torch.Tensor], grads: List[torch.Tensor],
                         exp_avgs: List[torch.Tensor], exp_avg_sqs: List[torch.Tensor],
                         steps: torch.Tensor, lr: float, beta1: float, beta2: float,
                         eps: float, weight_decay: float = 0.0, l2_weight_decay: float = 0.0,
                         maximize: bool = False) -> None:
    """``adam_update`` with the steps already counted, on the device, one per
    parameter in ``steps`` (``HostSteps`` gives it)."""
    _fused_kernel(params, grads, exp_avgs, exp_avg_sqs, list(steps.unbind()), lr=lr,
                  beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                  l2_weight_decay=l2_weight_decay, maximize=maximize)


def _fused_kernel(params: List[torch.Tensor], grads: List[torch.Tensor],
                  exp_avgs: List[torch.Tensor], exp_avg_sqs: List[torch.Tensor],
                  steps: List[torch.Tensor], lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, l2_weight_decay: float, maximize: bool) -> None:
    kernel = torch._fused_adamw_ if weight_decay else torch._fused_adam_
    kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
           weight_decay=weight_decay or l2_weight_decay, eps=eps, amsgrad=False,
           maximize=maximize)


def _uploaded(steps: List[torch.Tensor], device: torch.device) -> torch.Tensor:
    return torch.stack([s.to(torch.float32) for s in steps]).to(device)


class HostSteps:
    """A fused update's ``step`` tensors kept on the CPU, as torch.optim keeps
    them: counted on the host and uploaded as one input of the graph at each
    call, so that the graph's program replays (a capture would keep their
    values as constants)."""

    def __init__(self, steps: List[torch.Tensor], device: torch.device) -> None:
        self._steps = steps
        self._device = device

    def example(self) -> torch.Tensor:
        return torch.empty(len(self._steps), device=self._device)

    def __call__(self) -> torch.Tensor:
        torch._foreach_add_(self._steps, 1)
        return _uploaded(self._steps, self._device)


def host_steps_as_inputs(gm: torch.fx.GraphModule
                         ) -> Tuple[torch.fx.GraphModule, List[HostSteps]]:
    """``gm`` with each ``adam_update`` whose steps are host tensors of the
    graph (dynamo's attributes) an ``adam_update_of_steps`` of a new last input,
    and what gives those inputs, in order. A new graph module when there are
    any: dynamo reads its graph's inputs after the backend returns."""
    updates = [n for n in gm.graph.nodes if n.target is adam_update and _host_steps(gm, n)]
    if not updates:
        return gm, []
    graph = torch.fx.Graph()
    copies: Dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copies))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    given = []
    for update in updates:
        node = copies[update]
        with graph.inserting_after(placeholders[-1] if placeholders else None):
            placeholders.append(graph.placeholder(f"adam_steps_{len(given)}"))
        step_nodes = node.args[4]
        node.target = adam_update_of_steps
        node.args = (*node.args[:4], placeholders[-1], *node.args[5:])
        for step_node in step_nodes:
            if not step_node.users:
                graph.erase_node(step_node)
        given.append(HostSteps(_host_steps(gm, update), _tensor_value(update.args[0][0]).device))
    return torch.fx.GraphModule(gm, graph), given


def _host_steps(gm: torch.fx.GraphModule, update: torch.fx.Node) -> List[torch.Tensor]:
    """The step tensors of ``adam_update`` node ``update`` if they are 0-dim
    host tensors held by ``gm`` and its parameters are on a device, else []."""
    step_nodes = update.args[4]
    if _tensor_value(update.args[0][0]) is None or not all(n.op == "get_attr"
                                                            for n in step_nodes):
        return []
    steps = [_attribute(gm, n.target) for n in step_nodes]
    if not all(isinstance(s, torch.Tensor) and s.device.type == "cpu" and s.dim() == 0
               for s in steps):
        return []
    return steps


def _attribute(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for name in target.split("."):
        value = getattr(value, name)
    return value


def _safe_to_move(chains: List[_Chain], position: Dict[torch.fx.Node, int],
                  nodes: List[torch.fx.Node]) -> bool:
    """Whether the chains' updates may all run where the last of them ends:
    no other node uses a chain's tensor after the chain first does (nodes
    before it, as AdamW's decay of the parameter, see it as they did), nor
    what a chain computes."""
    ours = {n for chain in chains for n in chain.nodes}
    end = position[chains[-1].nodes[0]]
    for chain in chains:
        if any(u not in ours for n in chain.nodes for u in n.users):
            return False
        for tensor in chain.tensors.values():
            first = min(position[n] for n in chain.nodes if tensor in n.all_input_nodes)
            if any(u not in ours and first < position[u] <= end for u in tensor.users):
                return False
    return True


def fuse_adam(gm: torch.fx.GraphModule) -> int:
    """Puts one ``adam_update`` per set of hyperparameters in place of each
    parameter's traced Adam update in dynamo's graph ``gm``; returns how many
    parameters."""
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    groups: Dict[Tuple[Tuple[str, float], ...], List[_Chain]] = {}
    for node in nodes:
        chain = _chain_at(node)
        if chain is not None:
            groups.setdefault(tuple(sorted(chain.hyper.items())), []).append(chain)
    fused = 0
    for key, chains in groups.items():
        if not _safe_to_move(chains, position, nodes):
            continue
        hyper = dict(key)
        lists = [[c.tensors[name] for c in chains]
                 for name in ("param", "grad", "exp_avg", "exp_avg_sq", "step")]
        with gm.graph.inserting_after(chains[-1].nodes[0]):
            gm.graph.call_function(adam_update, tuple(lists),
                                   {name: hyper[name] for name in (
                                       "lr", "beta1", "beta2", "eps", "weight_decay",
                                       "l2_weight_decay", "maximize")
                                    if name in hyper})
        ordered = sorted({n for c in chains for n in c.nodes}, key=position.__getitem__,
                         reverse=True)
        for node in ordered:  # users first
            gm.graph.erase_node(node)
        fused += len(chains)
    if fused:
        gm.recompile()
        logger.debug("torch.compile(backend=\"ipu\"): %d Adam updates run as one fused kernel",
                     fused)
    return fused
