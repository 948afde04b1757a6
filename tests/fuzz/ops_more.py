"""Fuzzed ops the other modules leave out: tensors built by repeating and padding others,
searches in sorted tensors and histograms, the losses and embeddings models end and start
with, and the reductions of the index family (index_reduce_, masked_scatter_)."""
from __future__ import annotations

import math
from typing import List

import torch

from .ops import (FLOAT_DTYPES, Chooser, Line, Skip, index_lit, int_index, is_float, is_int,
                  op, shape_lit)


@op("repeat")
def _repeat(c: Chooser) -> Line:
    """repeat / tile / repeat_interleave / F.pad of a live tensor (a copy in a new shape)."""
    x = c.tensor()
    t = c.t(x)
    n = t.dim()
    kind = c.pick(("repeat", "tile", "repeat_interleave", "repeat_interleave_tensor", "pad"))
    if kind in ("repeat", "tile"):
        # repeat needs at least the tensor's rank of counts; tile pads them with ones.
        count = c.int(n if kind == "repeat" else 0, n + 1)
        return c.assign(f"repeat:{kind}",
                        f"{x}.{kind}({shape_lit([c.int(0, 3) for _ in range(count)])})")
    if kind == "repeat_interleave":
        dim = f", dim={c.dim(n)}" if c.flag() else ""
        return c.assign("repeat:repeat_interleave", f"{x}.repeat_interleave({c.int(0, 3)}{dim})")
    if kind == "repeat_interleave_tensor":
        d = c.dim(n)
        size = t.shape[d] if n else 1
        counts = index_lit([c.int(0, 3) for _ in range(size)])
        # The result's size is the counts' sum: a value the ipu reads on the host.
        return c.assign("repeat:repeat_interleave_tensor",
                        f"torch.repeat_interleave({x}, {counts}, dim={d})", value_dependent=True)
    if n == 0:
        raise Skip
    # Constant padding of the last one to three dims (negative pads crop); the other modes
    # pad the last `dims` of a tensor of dims + 1 or dims + 2 dims, by less than their sizes
    # (more: the CPU's error, the ipu's too).
    mode = c.pick(("constant", "reflect", "replicate", "circular"))
    if mode == "constant":
        dims = c.int(1, min(n, 3))
        pads = [c.int(-1, 2) for _ in range(2 * dims)]
    else:
        fits = [d for d in (n - 1, n - 2) if 1 <= d <= 3]
        if not fits:
            raise Skip
        dims = c.pick(fits)
        limit = max(min(t.shape[n - dims:]) - 1, 0)
        pads = [c.int(0, min(2, limit)) for _ in range(2 * dims)]
    value = f", value={c.scalar('float')}" if mode == "constant" and c.flag() else ""
    return c.assign(f"repeat:pad_{mode}", f"F.pad({x}, {shape_lit(pads)}, mode={mode!r}{value})")


@op("search")
def _search(c: Chooser) -> Line:
    """searchsorted / bucketize into sorted boundaries; histc and bincount (its size is the
    largest value: read on the host)."""
    kind = c.pick(("searchsorted", "bucketize", "histc", "bincount"))
    if kind == "bincount":
        x = c.tensor(lambda t: t.dim() == 1 and is_int(t) and t.dtype != torch.bool)
        weights, refuses = "", None
        if c.flag():
            w = c.tensor(lambda t: t.shape == c.t(x).shape and is_float(t))
            weights = f", weights={w}"
            # The CPU counts weights of any other dtype than float32 in float64.
            refuses = TypeError if c.t(w).dtype != torch.float32 else None
        # Non-negative values (a negative one is an error only the values show: at the
        # first read on the ipu).
        return c.assign("search:bincount", f"torch.bincount({x} % 7{weights}, "
                        f"minlength={c.int(0, 4)})", value_dependent=True,
                        ipu_refuses=refuses)
    if kind == "histc":
        x = c.tensor(lambda t: is_float(t) and t.dtype == torch.float32)
        lo = c.pick((0.0, -2.0, -1.0))
        # min < max: with min == max the range is the values' own, and an infinite one is an
        # error only the values show.
        return c.assign("search:histc",
                        f"torch.histc({x}, bins={c.int(1, 6)}, min={lo}, max={lo + c.int(1, 4)})")
    x = c.tensor(lambda t: t.dtype != torch.bool)
    t = c.t(x)
    # Boundaries: a live tensor sorted along its last dim (batched searchsorted wants the
    # leading dims of the values), or fresh values sorted.
    if kind == "searchsorted" and t.dim() > 0 and c.flag():
        sorted_ = f"torch.sort({x}, dim=-1)[0]"
        values = c.rnd([*t.shape[:-1], c.int(0, 4)], t.dtype)
    else:
        sorted_ = f"torch.sort({c.rnd([c.int(0, 5)], t.dtype)})[0]"
        values = x
    right = c.flag()
    if kind == "bucketize":
        return c.assign("search:bucketize", f"torch.bucketize({values}, {sorted_}, "
                        f"right={right}, out_int32={c.flag(4)})")
    side = f", side={'right' if right else 'left'!r}" if c.flag() else f", right={right}"
    return c.assign("search:searchsorted", f"torch.searchsorted({sorted_}, {values}{side})")


def _in_range(c: Chooser, shape: List[int], size: int) -> str:
    """An int64 tensor of `shape` of indices in [0, size) (class indices, embedding rows)."""
    values = torch.tensor(int_index(c, size, math.prod(shape), unique=False),
                          dtype=torch.int64) % size
    return index_lit(values.reshape(shape).tolist() if shape else values.item())


LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy",
          "cross_entropy_probs", "nll_loss", "binary_cross_entropy",
          "binary_cross_entropy_with_logits", "kl_div")


@op("loss")
def _loss(c: Chooser) -> Line:
    """A loss of a live float tensor against fresh targets, with each reduction: class
    indices in range for (N, C, ...) inputs, probabilities for the binary losses."""
    x = c.tensor(lambda t: t.dtype in FLOAT_DTYPES)
    t = c.t(x)
    kind = c.pick(LOSSES)
    reduction = c.pick(("'mean'", "'sum'", "'none'"))
    if kind in ("cross_entropy", "nll_loss", "cross_entropy_probs"):
        if t.dim() not in (1, 2, 3, 4) or t.shape[1 if t.dim() > 1 else 0] == 0:
            raise Skip
        class_dim = 1 if t.dim() > 1 else 0
        classes = t.shape[class_dim]
        if kind == "cross_entropy_probs":
            target = f"torch.softmax({c.rnd(list(t.shape), t.dtype)}, {class_dim})"
        else:
            target = _in_range(c, [s for i, s in enumerate(t.shape) if i != class_dim],
                               classes)
        smoothing = f", label_smoothing={c.pick((0.1, 0.5))}" \
            if kind != "nll_loss" and c.flag() else ""
        fn = "nll_loss" if kind == "nll_loss" else "cross_entropy"
        source = f"F.log_softmax({x}, {class_dim})" if kind == "nll_loss" else x
        return c.assign(f"loss:{kind}",
                        f"F.{fn}({source}, {target}, reduction={reduction}{smoothing})")
    target = c.rnd(list(t.shape), t.dtype)
    if kind == "binary_cross_entropy":
        # Probabilities, nan made a number: one outside [0, 1] is an error only the values
        # show (raised at the first read on the ipu).
        return c.assign("loss:binary_cross_entropy", f"F.binary_cross_entropy(torch.sigmoid("
                        f"{x}.nan_to_num()), torch.sigmoid({target}), reduction={reduction})")
    if kind == "binary_cross_entropy_with_logits":
        return c.assign("loss:binary_cross_entropy_with_logits",
                        f"F.binary_cross_entropy_with_logits({x}, torch.sigmoid({target}), "
                        f"reduction={reduction})")
    if kind == "kl_div":
        return c.assign("loss:kl_div", f"F.kl_div({x}, {target}, reduction={reduction}, "
                        f"log_target=True)")
    extra = f", beta={c.pick((0.5, 2.0))}" if kind == "smooth_l1_loss" else \
        f", delta={c.pick((0.5, 2.0))}" if kind == "huber_loss" else ""
    return c.assign(f"loss:{kind}", f"F.{kind}({x}, {target}, reduction={reduction}{extra})")


@op("embedding")
def _embedding(c: Chooser) -> Line:
    """Looks up rows of a live 2-D float tensor (an embedding table), by indices in range,
    with padding_idx and max_norm (which renormalises the table's rows in place); one_hot of
    a live integer tensor."""
    if c.flag(4):
        x = c.tensor(lambda t: t.dtype == torch.int64)
        # Classes in range: one out of it is an error only the values show.
        return c.assign("embedding:one_hot", f"F.one_hot({x} % 10, {c.int(0, 3) + 10})")
    w = c.tensor(lambda t: t.dim() == 2 and t.shape[0] > 0 and is_float(t))
    rows = c.t(w).shape[0]
    index = _in_range(c, [c.int(0, 3) for _ in range(c.int(0, 2))], rows)
    kind = c.pick(("plain", "padding_idx", "max_norm"))
    if kind == "max_norm":
        # Writes the table's rows in place (under no_grad), as the CPU does.
        return c.assign("embedding:max_norm", f"F.embedding({index}, {w}, max_norm=1.0)",
                        writes=(w,))
    pad = f", padding_idx={c.int(-rows, rows - 1)}" if kind == "padding_idx" else ""
    return c.assign(f"embedding:{kind}", f"F.embedding({index}, {w}{pad})")


@op("index_reduce_")
def _index_reduce(c: Chooser) -> Line:
    """index_reduce_ (each reduction, with and without the target's own values) and
    masked_scatter_, in place into a live tensor or a view of one."""
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    if c.flag(3):
        mask = f"({c.rnd(list(t.shape), torch.float32)} > 0)"
        source = c.rnd([t.numel() + c.int(0, 2)], t.dtype)
        return c.line("index_reduce_:masked_scatter_", f"{x}.masked_scatter_({mask}, {source})",
                      writes=(x,))
    d = c.dim(t.dim())
    size = t.shape[d]
    if size == 0:
        raise Skip
    index = [i % size for i in int_index(c, size, c.int(0, size + 2), unique=False)]
    shape = list(t.shape)
    shape[d] = len(index)
    reduce = c.pick(("prod", "mean", "amax", "amin"))
    return c.line(f"index_reduce_:{reduce}",
                  f"{x}.index_reduce_({d}, {index_lit(index)}, {c.rnd(shape, t.dtype)}, "
                  f"{reduce!r}, include_self={c.flag()})", writes=(x,))
