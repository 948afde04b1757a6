"""``torch.optim.SGD``'s momentum update as one pass per parameter, in the
graphs ``torch.compile(backend="ipu")`` replays.

On ipu tensors ``torch.optim.SGD`` runs its single-tensor rule, which dynamo
traces into three in-place ops per parameter (momentum 0.9, lr 0.1)::

    buf.mul_(0.9); buf.add_(grad, alpha=1); param.add_(buf, alpha=-0.1)

three passes over parameter-sized tensors where the update needs one. With
``foreach=True`` it traces the same three as ops on lists of tensors::

    torch._foreach_mul_(bufs, 0.9); torch._foreach_add_(bufs, grads, alpha=1)
    torch._foreach_add_(params, bufs, alpha=-0.1)

Each parameter's update becomes ``poptorch::torch_sgd_momentum_``
(``csrc/kernels/sgd.cpp``), which computes ``buf = 0.9 buf + grad;
param -= 0.1 buf`` element by element.
Dampening, Nesterov and the first step (which clones the gradient) trace other
ops and stay as they are; weight decay and ``maximize`` change only the
gradient and the sign of ``alpha``, and fuse. The product ``0.9 buf`` is not
rounded on its own (a fused multiply-add), so the buffer may differ from the
CPU's in its last bit.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from ._logging import logger


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fusable_tensor(node: Any, contiguous: bool) -> bool:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return (isinstance(value, torch.Tensor) and value.device.type == "ipu" and
            value.dtype == torch.float32 and (not contiguous or value.is_contiguous()))


def _method(node: Optional[torch.fx.Node], name: str) -> bool:
    return node is not None and node.op == "call_method" and node.target == name


def _function(node: Optional[torch.fx.Node], target: Any) -> bool:
    return node is not None and node.op == "call_function" and node.target is target


def _fusable(param: Any, buf: Any, grad: Any) -> bool:
    if len({param, buf, grad}) != 3 or not all(
            _fusable_tensor(t, contiguous) for t, contiguous in ((param, True), (buf, True),
                                                                   (grad, False))):
        return False
    return (param.meta["example_value"].shape == buf.meta["example_value"].shape ==
            grad.meta["example_value"].shape)


def _chain_at(mul: torch.fx.Node) -> Optional[tuple]:
    """(param, buf, grad, lr, momentum, the three nodes) if ``mul`` starts the
    update of one parameter, else None."""
    if not (_method(mul, "mul_") and len(mul.args) == 2 and not mul.kwargs and
            _number(mul.args[1]) and len(mul.users) == 1):
        return None
    buf, momentum = mul.args
    add = mul.next
    if not (_method(add, "add_") and len(add.args) == 2 and add.args[0] is mul and
            set(add.kwargs) <= {"alpha"} and add.kwargs.get("alpha", 1) == 1 and not add.users):
        return None
    grad = add.args[1]
    step = add.next
    if not (_method(step, "add_") and len(step.args) == 2 and step.args[1] is buf and
            set(step.kwargs) == {"alpha"} and _number(step.kwargs["alpha"]) and not step.users):
        return None
    param = step.args[0]
    if not _fusable(param, buf, grad):
        return None
    return param, buf, grad, -float(step.kwargs["alpha"]), float(momentum), (mul, add, step)


def _foreach_chain_at(mul: torch.fx.Node) -> Optional[tuple]:
    """(params, bufs, grads, lr, momentum, the three nodes) if ``mul`` starts
    the ``foreach`` update of a list of parameters, else None."""
    if not (_function(mul, torch._foreach_mul_) and len(mul.args) == 2 and not mul.kwargs and
            isinstance(mul.args[0], (list, tuple)) and _number(mul.args[1])):
        return None
    bufs, momentum = list(mul.args[0]), mul.args[1]
    add = mul.next
    if not (_function(add, torch._foreach_add_) and len(add.args) == 2 and
            list(add.args[0]) == bufs and set(add.kwargs) <= {"alpha"} and
            add.kwargs.get("alpha", 1) == 1 and isinstance(add.args[1], (list, tuple))):
        return None
    grads = list(add.args[1])
    step = add.next
    if not (_function(step, torch._foreach_add_) and len(step.args) == 2 and
            list(step.args[1]) == bufs and set(step.kwargs) == {"alpha"} and
            _number(step.kwargs["alpha"]) and isinstance(step.args[0], (list, tuple))):
        return None
    params = list(step.args[0])
    if not (len(params) == len(bufs) == len(grads) and len(set(params + bufs)) == 2 * len(bufs)
            and all(_fusable(p, b, g) for p, b, g in zip(params, bufs, grads))):
        return None
    return params, bufs, grads, -float(step.kwargs["alpha"]), float(momentum), (mul, add, step)


def _updates_at(node: torch.fx.Node) -> Optional[tuple]:
    """(the updates as (param, buf, grad) triples, lr, momentum, the nodes
    they replace) if ``node`` starts an update of either form, else None."""
    chain = _chain_at(node)
    if chain is not None:
        param, buf, grad, lr, momentum, ops = chain
        return [(param, buf, grad)], lr, momentum, ops
    chain = _foreach_chain_at(node)
    if chain is not None:
        params, bufs, grads, lr, momentum, ops = chain
        return list(zip(params, bufs, grads)), lr, momentum, ops
    return None


def fuse_sgd_momentum(gm: torch.fx.GraphModule) -> int:
    """Puts ``poptorch::torch_sgd_momentum_`` in place of each parameter's
    three-op momentum update (or its part of three ``foreach`` ops) in
    dynamo's graph ``gm``; returns how many parameters."""
    fused = 0
    for node in list(gm.graph.nodes):  # a chain's erased nodes start none: skipped
        updates = _updates_at(node)
        if updates is None:
            continue
        triples, lr, momentum, ops = updates
        with gm.graph.inserting_before(ops[0]):
            for param, buf, grad in triples:
                gm.graph.call_function(torch.ops.poptorch.torch_sgd_momentum_.default,
                                       (param, buf, grad, lr, momentum))
        for op in reversed(ops):
            gm.graph.erase_node(op)
        fused += len(triples)
    if fused:
        gm.recompile()
        logger.debug("torch.compile(backend=\"ipu\"): %d SGD momentum updates run in one pass "
                     "each", fused)
    return fused
