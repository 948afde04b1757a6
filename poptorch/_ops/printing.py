"""``poptorch.ipu_print_tensor``: an op of the compiled program that prints a
tensor every time the program runs (every micro-batch a call replays), and its
gradient when the backward pass runs.

It is the ``poptorch::ipu_print_tensor`` operator, registered with
``torch.library``: a CPU kernel (which the emulated IPU runs, as it runs every
op) that prints and returns a copy, a fake kernel for shapes, and a derivative
that prints the incoming gradient. Its node has host effects
(``ir::Node::hasHostEffects``): it is never optimised away, even when its
result is unused, and prints in program order.
"""
from __future__ import annotations

import sys
from typing import Any, Tuple

import torch

from .. import _C
from .._errors import Error
from .tensor_format import FLOAT_FORMATS, TensorFormat, format_tensor


@torch.library.custom_op("poptorch::ipu_print_tensor", mutates_args=(), device_types="cpu")
def _print_tensor(tensor: torch.Tensor, title: str, print_gradient: bool,
                  summarise_threshold: int, edge_items: int, max_line_width: int, digits: int,
                  float_format: str, separator: str, open_bracket: str,
                  close_bracket: str) -> torch.Tensor:
    # While the host reads a value during a step's capture, the pending graph
    # runs on the side: the step has not run, so nothing is printed.
    if not _C.evaluating_for_host_read():
        fmt = TensorFormat(summarise_threshold, edge_items, max_line_width, digits, float_format,
                           separator, open_bracket, close_bracket)
        prefix = f"{title}: " if title else ""
        # On stderr, where PopTorch's (Poplar's) prints go
        sys.stderr.write(prefix + format_tensor(tensor, fmt) + "\n")
        sys.stderr.flush()
    return tensor.clone()


@_print_tensor.register_fake
def _print_tensor_fake(tensor: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(tensor)


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.options = inputs[1:]


def _backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
    title, print_gradient, *fmt = ctx.options
    if print_gradient:
        grad = _print_tensor(grad, f"{title}_gradient" if title else "gradient", False, *fmt)
    return (grad,) + (None,) * len(ctx.options)


_print_tensor.register_autograd(_backward, setup_context=_setup_context)


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3,
                     max_line_width: int = 80, digits: int = 4, float_format: str = "auto",
                     separator: str = ", ", open_bracket: str = "(",
                     close_bracket: str = ")") -> torch.Tensor:
    """Prints ``tensor`` every time the program runs (each micro-batch of each
    call of a wrapped model; at the sync point in lazy mode) and returns it.

    In the backward pass it prints the gradient of the tensor, titled
    ``"<title>_gradient"``, unless ``print_gradient`` is False. Use the
    returned tensor in place of ``tensor``, as PopTorch asks (here the print
    happens even if it is not used).

    :param title: Printed before the value, followed by ``": "``.
    :param summarise_threshold: Above this many elements only the first and
        last ``edge_items`` of each dimension are printed, around ``...``
        (0: never summarise).
    :param max_line_width: Lines longer than this are split (0: never).
    :param digits: Significant digits of floating-point values, without the
        exponent (in fixed point, those of the largest value); elements are
        aligned to one width (0: each printed on its own, unaligned).
    :param float_format: ``"auto"`` (fixed point unless the values' range
        needs scientific notation), ``"fixed"``, ``"scientific"`` or ``"none"``
        (each value in its shortest form with ``digits`` significant digits).
    :param separator: Between elements. ``open_bracket``, ``close_bracket``:
        around each dimension. As Poplar lays tensors out, each dimension
        above the last puts its parts on lines of their own, one space deeper
        per level; a row longer than ``max_line_width`` goes on several lines.
    :returns: ``tensor``'s value.
    """
    if not isinstance(tensor, torch.Tensor):
        raise Error("ipu_print_tensor must take a torch.Tensor argument; "
                    f"{type(tensor).__name__} is not supported")
    if float_format not in FLOAT_FORMATS:
        raise Error(f"ipu_print_tensor: float_format must be one of {FLOAT_FORMATS}, "
                    f"got {float_format!r}")
    for name, value in (("summarise_threshold", summarise_threshold),
                        ("edge_items", edge_items), ("max_line_width", max_line_width),
                        ("digits", digits)):
        if not isinstance(value, int) or value < 0:
            raise Error(f"ipu_print_tensor: {name} must be an integer >= 0, got {value!r}")
    return _print_tensor(tensor, str(title), bool(print_gradient), summarise_threshold,
                         edge_items, max_line_width, digits, float_format, str(separator),
                         str(open_bracket), str(close_bracket))
