"""``torch.optim.SGD``'s momentum update as one pass per parameter, in the
graphs ``torch.compile(backend="ipu")`` replays.

On ipu tensors ``torch.optim.SGD`` runs its single-tensor rule, which dynamo
traces into three in-place ops per parameter (momentum 0.9, lr 0.1)::

    buf.mul_(0.9); buf.add_(grad, alpha=1); param.add_(buf, alpha=-0.1)

three passes over parameter-sized tensors where the update needs one. Each
such chain becomes ``poptorch::torch_sgd_momentum_`` (``csrc/kernels/sgd.cpp``),
which computes ``buf = 0.9 buf + grad; param -= 0.1 buf`` element by element.
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
    if len({param, buf, grad}) != 3 or not all(
            _fusable_tensor(t, contiguous) for t, contiguous in ((param, True), (buf, True),
                                                                   (grad, False))):
        return None
    if not (param.meta["example_value"].shape == buf.meta["example_value"].shape ==
            grad.meta["example_value"].shape):
        return None
    return param, buf, grad, -float(step.kwargs["alpha"]), float(momentum), (mul, add, step)


def fuse_sgd_momentum(gm: torch.fx.GraphModule) -> int:
    """Puts ``poptorch::torch_sgd_momentum_`` in place of each parameter's
    three-op momentum update in dynamo's graph ``gm``; returns how many."""
    fused = 0
    for node in list(gm.graph.nodes):  # a chain's erased nodes are not mul_: skipped
        chain = _chain_at(node)
        if chain is None:
            continue
        param, buf, grad, lr, momentum, ops = chain
        with gm.graph.inserting_before(ops[0]):
            gm.graph.call_function(torch.ops.poptorch.torch_sgd_momentum_.default,
                                   (param, buf, grad, lr, momentum))
        for op in reversed(ops):
            gm.graph.erase_node(op)
        fused += 1
    if fused:
        gm.recompile()
        logger.debug("torch.compile(backend=\"ipu\"): %d SGD momentum updates run in one pass "
                     "each", fused)
    return fused
