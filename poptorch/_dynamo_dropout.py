"""Dropout's masks from the counter-based generator in the training graphs
``torch.compile(backend="ipu")`` replays.

AOTAutograd traces dropout as ``aten.native_dropout(x, p, train)``, whose CPU
kernel fills a boolean mask with ``bernoulli_`` element by element from the
Mersenne Twister on one thread (7% of a one-thread BERT training step). Lazy
mode and the wrapped models meet dropout as PyTorch's own decomposition, a
float ``bernoulli_`` that ``passes::useCounterBasedRandomFills`` runs as
``poptorch::bernoulli_`` (Philox, both cores). Each ``native_dropout`` here
becomes that decomposition, with the CPU kernel's arithmetic::

    noise = empty_like(x).bernoulli_(1 - p)    # 0.0 or 1.0
    output = x.mul(noise).mul(1 / (1 - p))     # the CPU's x.mul(mask).mul_(scale)
    mask = noise.ne(0)                         # the boolean mask the backward reads

so the output is the CPU's for the same mask; the masks follow the seed and
have the CPU's distribution, not its values (as in lazy mode).
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ._logging import logger

_aten = torch.ops.aten


def _replaceable(node: torch.fx.Node) -> bool:
    # train=None means training, as True does; an empty input keeps the CPU's
    # own (float) mask.
    if not (node.op == "call_function" and node.target is _aten.native_dropout.default and
            len(node.args) == 3 and not node.kwargs and node.args[2] is not False):
        return False
    value = node.meta.get("val")
    x = value[0] if isinstance(value, (tuple, list)) and value else None
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0 and
            all(user.op == "call_function" and user.target is operator.getitem
                for user in node.users))


def use_counter_based_dropout(gm: torch.fx.GraphModule) -> int:
    """Puts the float-noise decomposition in place of each training
    ``native_dropout`` of AOTAutograd's graph ``gm``; returns how many."""
    replaced = 0
    for node in list(gm.graph.nodes):
        if not _replaceable(node):
            continue
        x, p, _ = node.args
        p1m = 1.0 - float(p)
        scale = 0.0 if p1m == 0 else 1.0 / p1m
        graph = gm.graph
        with graph.inserting_before(node):
            noise = graph.call_function(_aten.empty_like.default, (x,),
                                        {"memory_format": torch.contiguous_format})
            noise = graph.call_function(_aten.bernoulli_.float, (noise, p1m))
            masked = graph.call_function(_aten.mul.Tensor, (x, noise))
            output = graph.call_function(_aten.mul.Tensor, (masked, scale))
            mask = graph.call_function(_aten.ne.Scalar, (noise, 0))
        for item in list(node.users):
            item.replace_all_uses_with(output if item.args[1] == 0 else mask)
            graph.erase_node(item)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
        logger.debug("torch.compile(backend=\"ipu\"): %d dropouts draw their masks from the "
                     "counter-based generator", replaced)
    return replaced
