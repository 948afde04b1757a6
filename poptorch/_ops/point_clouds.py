"""``poptorch.fps`` and ``poptorch.nearest``: the ``torch_cluster`` operators
PopTorch provides for point clouds.

``nearest`` is computed with tensor ops (pairwise squared distances, masked
across samples, argmin), so a compiled step computes it on the device.
``fps`` (farthest point sampling) is iterative: it is the ``poptorch::fps``
operator, whose CPU kernel the emulated IPU runs as one node; its output size
follows from ``ptr`` and ``ratio`` alone.
"""
from __future__ import annotations

import math
from typing import List, Optional, Union

import torch

from .._errors import Error


def _sample_sizes(ptr: List[int], ratio: float) -> List[int]:
    return [math.ceil((end - start) * ratio) for start, end in zip(ptr[:-1], ptr[1:])]


@torch.library.custom_op("poptorch::fps", mutates_args=(), device_types="cpu",
                         tags=(torch.Tag.nondeterministic_seeded,))
def _fps(src: torch.Tensor, ptr: List[int], ratio: float, random_start: bool) -> torch.Tensor:
    points = src.reshape(src.shape[0], -1).to(torch.float64)
    chosen: List[torch.Tensor] = []
    for (start, end), count in zip(zip(ptr[:-1], ptr[1:]), _sample_sizes(ptr, ratio)):
        if count == 0:
            continue
        segment = points[start:end]
        # The runtime seeds the default generator for this node on every run.
        first = int(torch.randint(end - start, ())) if random_start else 0
        picked = [first]
        distance = ((segment - segment[first]) ** 2).sum(dim=1)
        for _ in range(count - 1):
            nxt = int(torch.argmax(distance))
            picked.append(nxt)
            distance = torch.minimum(distance, ((segment - segment[nxt]) ** 2).sum(dim=1))
        chosen.append(torch.tensor(picked, dtype=torch.int64) + start)
    if not chosen:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat(chosen)


@_fps.register_fake
def _fps_fake(src: torch.Tensor, ptr: List[int], ratio: float,
              random_start: bool) -> torch.Tensor:
    return src.new_empty(sum(_sample_sizes(ptr, ratio)), dtype=torch.int64)


def fps(src: torch.Tensor, ptr: List[int], ratio: float = 0.5,
        random_start: bool = False) -> torch.Tensor:
    """Farthest point sampling (``torch_cluster.fps``): for each sample
    ``src[ptr[i]:ptr[i+1]]``, ``ceil(size * ratio)`` points, each the farthest
    from those already chosen, starting with the first point (or a random one).
    Returns their indices into ``src`` (int64)."""
    if not isinstance(src, torch.Tensor):
        raise Error(f"`fps` must take a torch.Tensor input; {type(src).__name__} is not "
                    "supported")
    if not isinstance(ptr, list) or not all(isinstance(p, int) for p in ptr):
        raise Error("`ptr` must be a list of integers.")
    if len(ptr) < 2:
        raise Error("`ptr` must contain at least 2 elements.")
    if ptr[0] != 0 or ptr[-1] != src.shape[0] or any(a > b for a, b in zip(ptr, ptr[1:])):
        raise Error(f"`ptr` must rise from 0 to the number of points ({src.shape[0]}), "
                    f"got {ptr}")
    if not isinstance(ratio, float) or not 0.0 < ratio <= 1.0:
        raise Error(f"`ratio` must be a float in (0, 1], got {ratio!r}")
    if not isinstance(random_start, bool):
        raise Error(f"`random_start` must be of bool type, got {type(random_start).__name__}")
    return _fps(src, ptr, ratio, random_start)


BatchVector = Optional[Union[List[int], torch.Tensor]]


def _check_sorted(batch: List[int], name: str) -> None:
    if any(a > b for a, b in zip(batch, batch[1:])):
        raise Error(f"nearest: `{name}` must be sorted")


def nearest(x: torch.Tensor, y: torch.Tensor, batch_x: BatchVector = None,
            batch_y: BatchVector = None) -> torch.Tensor:
    """For each point of ``x``, the index of the nearest point of ``y``
    (``torch_cluster.nearest``), among the points of the same sample when
    ``batch_x`` and ``batch_y`` (sorted sample indices, lists or tensors)
    are given."""
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            raise Error(f"`nearest` must take a torch.Tensor `{name}` input; "
                        f"{type(value).__name__} is not supported")
    if x.dim() == 1:
        x, y = x.unsqueeze(-1), y.unsqueeze(-1)
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1]:
        raise Error(f"nearest: x and y must be matrices of points of one size, got "
                    f"{list(x.shape)} and {list(y.shape)}")
    squared = ((x.unsqueeze(1) - y.unsqueeze(0)) ** 2).sum(dim=-1)
    if batch_x is None and batch_y is None:
        return squared.argmin(dim=1)
    if batch_x is None or batch_y is None:
        raise Error("nearest: give both `batch_x` and `batch_y`, or neither")
    for name, batch, points in (("batch_x", batch_x, x), ("batch_y", batch_y, y)):
        if isinstance(batch, list):
            _check_sorted(batch, name)
        elif not isinstance(batch, torch.Tensor):
            raise Error(f"`batch_x` and `batch_y` must be torch.Tensors or lists, `{name}` is "
                        f"{type(batch).__name__}")
        if len(batch) != points.shape[0]:
            raise Error(f"nearest: `{name}` has {len(batch)} entries for {points.shape[0]} points")
    if isinstance(batch_x, list) and isinstance(batch_y, list) and not set(batch_x) <= set(
            batch_y):
        raise Error("nearest: a sample of `batch_x` has no point in `batch_y`")
    as_tensor = (lambda b: b.to(x.device) if isinstance(b, torch.Tensor)
                 else torch.tensor(b, device=x.device))
    other_sample = as_tensor(batch_x).unsqueeze(1) != as_tensor(batch_y).unsqueeze(0)
    return squared.masked_fill(other_sample, math.inf).argmin(dim=1)
