"""Fuzzed ops of layers and layouts: memory formats (channels-last tensors that later ops
meet), the nn functions models are made of (convolutions, pooling, normalisations), and
complex64 tensors."""
from __future__ import annotations

import torch

from .ops import FLOAT_DTYPES, Chooser, Line, is_float, op

_CHANNELS_LAST = "memory_format=torch.channels_last"


def _image(c: Chooser, rank: int, where=lambda t: True) -> str:
    """A live tensor of `rank` dims satisfying `where`; without one (most programs: inputs
    have any rank), fresh values of that rank, channels-last 4-D ones half the time."""
    if c.has(lambda t: t.dim() == rank and where(t)) and not c.flag(3):
        return c.tensor(lambda t: t.dim() == rank and where(t))
    fresh = c.rnd([c.int(1, 3), c.int(1, 4), *[c.int(1, 5) for _ in range(rank - 2)]],
                  c.dtype(FLOAT_DTYPES))
    return f"{fresh}.contiguous({_CHANNELS_LAST})" if rank == 4 and c.flag() else fresh


@op("memory_format")
def _memory_format(c: Chooser) -> Line:
    """A tensor in channels-last order (only 4-D ones have it: the CPU refuses the others,
    and so must the ipu), or made like one (preserve_format keeps the layout)."""
    x = c.tensor() if c.flag(8) else _image(c, 4)
    kind = c.pick(("contiguous", "to", "clone", "empty_like_copy", "zeros_like", "back"))
    code = {"contiguous": f"{x}.contiguous({_CHANNELS_LAST})",
            "to": f"{x}.to({_CHANNELS_LAST})", "clone": f"{x}.clone({_CHANNELS_LAST})",
            "empty_like_copy": f"torch.empty_like({x}, {_CHANNELS_LAST}).copy_({x})",
            "zeros_like": f"torch.zeros_like({x}, memory_format=torch.preserve_format)",
            "back": f"{x}.contiguous(memory_format=torch.contiguous_format)"}[kind]
    return c.assign(f"memory_format:{kind}", code)


NN = ("conv2d", "conv1d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "layer_norm",
      "group_norm", "batch_norm", "batch_norm_eval", "interpolate", "instance_norm")


def _nn_call(c: Chooser, x: str, t: torch.Tensor, kind: str) -> str:
    """The call; its sizes fit `t` mostly (a kernel larger than the input, channels that do
    not divide into groups: the CPU's error, then)."""
    dtype = t.dtype
    n = t.dim()
    channels = t.shape[1] if n >= 3 else (t.shape[0] if n else 1)
    if kind in ("conv2d", "conv1d"):
        spatial = 2 if kind == "conv2d" else 1
        groups = c.pick((1, 1, channels if channels else 1))
        out = groups * c.int(1, 2)
        kernel = [c.int(1, 3) for _ in range(spatial)]
        weight = c.rnd([out, max(channels // groups, 1), *kernel], dtype)
        bias = c.rnd([out], dtype) if c.flag() else "None"
        padding = c.pick((0, 1, repr("same")))
        stride = 1 if "same" in str(padding) else c.int(1, 2)  # strided 'same' is refused
        return f"F.{kind}({x}, {weight}, {bias}, stride={stride}, padding={padding}, " \
               f"groups={groups})"
    if kind in ("max_pool2d", "avg_pool2d"):
        k = c.int(1, 3)
        return f"F.{kind}({x}, {k}, stride={c.int(1, 2)}, padding={c.int(0, k // 2)}, " \
               f"ceil_mode={c.flag()})"
    if kind == "adaptive_avg_pool2d":
        return f"F.adaptive_avg_pool2d({x}, ({c.int(1, 3)}, {c.int(1, 3)}))"
    if kind == "layer_norm":
        last = list(t.shape[-1:])
        return f"F.layer_norm({x}, {last}, {c.rnd(last, dtype)}, {c.rnd(last, dtype)})"
    if kind == "group_norm":
        return f"F.group_norm({x}, {c.pick((1, 2, 3))}, {c.rnd([channels], dtype)}, " \
               f"{c.rnd([channels], dtype)})"
    if kind == "batch_norm":
        return f"F.batch_norm({x}, None, None, {c.rnd([channels], dtype)}, None, " \
               "training=True)"
    if kind == "batch_norm_eval":
        return f"F.batch_norm({x}, {c.rnd([channels], dtype)}, " \
               f"{c.rnd([channels], dtype)}.abs(), training=False)"
    if kind == "instance_norm":
        return f"F.instance_norm({x})"
    mode = c.pick(("'nearest'", "'bilinear'"))
    return f"F.interpolate({x}, scale_factor={c.pick((2, 0.5))}, mode={mode})"


@op("nn")
def _nn(c: Chooser) -> Line:
    """What models are made of, on 4-D inputs (3-D for conv1d), contiguous or channels-last
    or any view; sometimes on a tensor of another rank or dtype (the CPU's error)."""
    kind = c.pick(NN)
    rank = 3 if kind == "conv1d" else 4
    x = c.tensor() if c.flag(8) else _image(c, rank, is_float)
    return c.assign(f"nn:{kind}", _nn_call(c, x, c.probe(x), kind))


@op("complex")
def _complex(c: Chooser) -> Line:
    """complex64 tensors, made from real ones and viewed back as real: the other ops meet
    them as they meet any live tensor."""
    kind = c.pick(("complex", "to", "polar", "view_as_complex", "view_as_real", "real", "imag",
                   "conj", "resolve_conj", "mul", "abs", "angle"))
    if kind in ("complex", "polar"):
        x = c.tensor(lambda t: t.dtype == torch.float32)
        y = c.tensor(lambda t: t.dtype == torch.float32 and t.shape == c.t(x).shape)
        return c.assign(f"complex:{kind}", f"torch.{kind}({x}, {y})")
    if kind == "to":
        return c.assign("complex:to", f"{c.tensor()}.to(torch.complex64)")
    if kind == "view_as_complex":
        x = c.tensor(lambda t: t.dtype == torch.float32 and t.dim() > 0 and t.shape[-1] == 2)
        return c.assign("complex:view_as_complex", f"torch.view_as_complex({x})")
    if c.has(lambda t: t.dtype.is_complex):
        z = c.tensor(lambda t: t.dtype.is_complex)
    else:
        z = c.rnd(c.t(c.tensor()).shape, torch.complex64)
    if kind == "mul":
        other = c.either(c.scalar, lambda: c.tensor(lambda t: t.shape == c.probe(z).shape))
        return c.assign("complex:mul", f"{z} * {other}")
    if kind in ("real", "imag"):
        return c.assign(f"complex:{kind}", f"{z}.{kind}")
    return c.assign(f"complex:{kind}", f"torch.{kind}({z})")
