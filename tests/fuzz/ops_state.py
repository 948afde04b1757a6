"""Fuzzed ops around global state: grad modes, backward in the middle of a program (and
gradients accumulated over several backward calls), and random seeds reset mid-program.

A line here may span several statements (a ``with`` block); none of them uses ``rnd``, so a
printed program stays runnable as it stands (``render`` prefixes ``rnd.seek`` to one line).
"""
from __future__ import annotations

import torch

from .ops import Chooser, Line, basic_index, op, shape_lit

_MODES = {"no_grad": "torch.no_grad()", "inference_mode": "torch.inference_mode()",
          "set_grad_enabled": "torch.set_grad_enabled(False)"}


@op("grad_mode")
def _grad_mode(c: Chooser) -> Line:
    """Ops under no_grad / inference_mode / enable_grad inside no_grad. What they make
    (tensors that do not require grad, inference tensors, views made in no_grad) is used
    later: in place, under autograd, which the CPU refuses in some cases (the ipu must, at
    the same line)."""
    x = c.tensor()
    mode = c.pick(("no_grad", "inference_mode", "enable_grad_inside", "set_grad_enabled"))
    if mode == "enable_grad_inside":
        head = "with torch.no_grad():\n    with torch.enable_grad():\n        "
    else:
        head = f"with {_MODES[mode]}:\n    "
    kind = c.pick(("op", "view", "inplace", "reduce"))
    if kind == "inplace":  # the optimiser's update of a leaf, and of views of it
        target = x if c.flag() else f"{x}[{basic_index(c, c.t(x).shape)}]"
        return c.line(f"grad_mode:{mode}:inplace",
                      head + f"{target}.mul_({c.scalar('float')})", writes=(x,))
    expr = {"op": f"{x} * 2 + 1", "view": f"{x}[{basic_index(c, c.t(x).shape)}]",
            "reduce": f"{x}.float().sum(0, keepdim=True)" if c.t(x).dim() else
            f"{x}.exp()"}[kind]
    return c.line(f"grad_mode:{mode}:{kind}", head + f"{c.new} = {expr}", result=c.new)


@op("backward_mid")
def _backward_mid(c: Chooser) -> Line:
    """A backward before the program's last, so that gradients accumulate over several
    calls; reads, resets and autograd.grad of what has accumulated so far."""
    kind = c.pick(("backward", "backward", "autograd_grad", "read_grad", "reset_grad"))
    if kind in ("read_grad", "reset_grad"):
        leaf = c.tensor(lambda t: t.is_leaf and t.grad is not None)
        if kind == "read_grad":
            return c.assign("backward_mid:read_grad", f"{leaf}.grad.clone()",
                            needs_defined=True)
        code = f"{leaf}.grad = None" if c.flag() else f"{leaf}.grad.zero_()"
        return c.line("backward_mid:reset_grad", code)
    # Mostly a tensor that requires grad; sometimes any (the CPU's error, then).
    x = c.tensor() if c.flag(8) else c.tensor(lambda t: t.requires_grad)
    retain = not c.flag(4)  # freed 1 in 4: a later backward through it is refused
    if kind == "autograd_grad":
        leaf = c.tensor(lambda t: t.is_leaf and t.requires_grad)
        return c.assign("backward_mid:autograd_grad",
                        f"torch.autograd.grad({x}.float().sum(), {leaf}, retain_graph="
                        f"{retain}, allow_unused=True, materialize_grads=True)[0]",
                        needs_defined=True)
    return c.line("backward_mid:backward",
                  f"{x}.float().sum().backward(retain_graph={retain})", needs_defined=True)


@op("reseed")
def _reseed(c: Chooser) -> Line:
    """torch.manual_seed in the middle of a program, while random ops may be pending: the
    same draws after the same seed give the same values (compared as an equality, which is
    defined on both devices), whether one draw or several, a fresh tensor or a view written
    in place."""
    seed = c.int(0, 9)
    shape = shape_lit([c.int(0, 4) for _ in range(c.int(0, 3))])
    kind = c.pick(("rand", "two_draws", "like", "dropout", "view_inplace"))
    if kind == "view_inplace":
        x = c.tensor()
        index = basic_index(c, c.t(x).shape)
        fill = c.pick(("uniform_()", "normal_()", "bernoulli_(0.5)", "random_(0, 5)"))
        draw = [f"_r{i} = {x}.detach().clone(); _r{i}[{index}].{fill}" for i in (0, 1)]
        return c.line("reseed:view_inplace", f"torch.manual_seed({seed}); {draw[0]}; "
                      f"torch.manual_seed({seed}); {draw[1]}; {c.new} = torch.eq(_r0, _r1)",
                      result=c.new)
    if kind in ("like", "dropout"):
        x = c.tensor()
        expr = f"torch.randn_like({x})" if kind == "like" else \
            f"F.dropout({x}, 0.5, training=True)"
    elif kind == "two_draws":
        expr = f"torch.cat([torch.rand({shape}, device=dev).flatten(), " \
               f"torch.randint(0, 9, {shape}, device=dev).flatten()])"
    else:
        expr = f"torch.rand({shape}, device=dev)"
    # nan equals nan here: where dropout drops an inf (inf * 0), each device's own mask,
    # which the devices draw differently, would decide the comparison.
    return c.line(f"reseed:{kind}", f"torch.manual_seed({seed}); _r = {expr}; "
                  f"torch.manual_seed({seed}); _q = {expr}; "
                  f"{c.new} = torch.eq(_r, _q) | (_r.ne(_r) & _q.ne(_q))", result=c.new)
