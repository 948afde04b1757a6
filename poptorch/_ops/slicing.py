"""``poptorch.dynamic_slice`` and ``poptorch.dynamic_update``: slices whose start
is a tensor, so a compiled step reads it on the device on every run (a Python
``int(start)`` would be a host read, specialised on the value seen)."""
from __future__ import annotations

from typing import Optional

import torch

from .._errors import Error


def _check_int(name: str, value: object, what: str, minimum: Optional[int]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise Error(f"{what}: {name} must be an integer, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise Error(f"{what}: {name} must be at least {minimum}, got {value}")


def _check_size(size: object, what: str) -> None:
    """A slice's size is end - start: PopTorch's words for one that is not positive."""
    _check_int("size", size, what, None)
    if size <= 0:
        why = ("The start and end of a slice must be different." if size == 0 else
               "Taking a slice of a tensor with the end less than the start is not supported.")
        raise Error(f"{what}: size must be at least 1, got {size}. {why}")


def _indices(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int,
             what: str) -> torch.Tensor:
    """The positions ``start, start + step, ...`` below ``start + size`` along ``dim``."""
    if not isinstance(start, torch.Tensor):
        raise Error(f"{what}: the start must be a torch.Tensor, got {type(start).__name__}")
    if start.numel() != 1 or start.is_floating_point() or start.is_complex():
        raise Error(f"{what}: the start must be an integer tensor of one element, got "
                    f"{start.dtype} of shape {list(start.shape)}")
    if not -tensor.dim() <= dim < max(tensor.dim(), 1):
        raise Error(f"{what}: dim {dim} is out of range for a tensor of {tensor.dim()} "
                    "dimensions")
    first = start.to(tensor.device).reshape(()).to(torch.int64)
    return first + torch.arange(0, size, step, device=tensor.device)


def dynamic_slice(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int,
                  step: int) -> torch.Tensor:
    """``tensor[start:start + size:step]`` along ``dim``, as in PopTorch, with
    ``start`` a one-element integer tensor read on the device: ``size`` (the
    slice's end minus its start) and ``step`` are constants, so the result has
    ``ceil(size / step)`` elements along ``dim``. Positions past the end raise
    an IndexError when the program runs."""
    what = "dynamic_slice"
    if not isinstance(tensor, torch.Tensor):
        raise Error(f"{what} must take a torch.Tensor input; {type(tensor).__name__} is not "
                    "supported")
    _check_int("dim", dim, what, -tensor.dim())
    _check_size(size, what)
    _check_int("step", step, what, 1)
    return tensor.index_select(dim, _indices(tensor, dim, start, size, step, what))


def dynamic_update(input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor,
                   size: int) -> torch.Tensor:
    """A copy of ``input`` with ``src`` written at positions ``start`` to
    ``start + size - 1`` along ``dim`` (``start``: a one-element integer tensor,
    read on the device)."""
    what = "dynamic_update"
    for name, value in (("input", input), ("src", src)):
        if not isinstance(value, torch.Tensor):
            raise Error(f"{what}: {name} must be a torch.Tensor, got {type(value).__name__}")
    _check_int("dim", dim, what, -input.dim())
    _check_size(size, what)
    if input.dim() != src.dim():
        raise Error(f"{what}: input and src tensors must have the same number of dimensions "
                    f"({input.dim()} vs {src.dim()})")
    if input.dtype != src.dtype:
        raise Error(f"{what}: input and src tensors must have the same dtype ({input.dtype} vs "
                    f"{src.dtype})")
    indices = _indices(input, dim, start, size, 1, what)
    expected = list(input.shape)
    expected[dim] = size
    if list(src.shape) != expected:
        raise Error(f"{what}: src must have shape {expected} (input's, with size {size} along "
                    f"dim {dim}), got {list(src.shape)}")
    return input.index_copy(dim, indices, src)
