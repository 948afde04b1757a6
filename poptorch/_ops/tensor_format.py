"""How ``poptorch.ipu_print_tensor`` writes a tensor: PopTorch's format options
(summarisation, edge items, line width, digits, float format, separator and
brackets), applied to the tensor's values on the host."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Sequence

import torch

FLOAT_FORMATS = ("auto", "fixed", "scientific", "none")


@dataclass(frozen=True)
class TensorFormat:
    """PopTorch's print options, with its defaults."""
    summarise_threshold: int = 1000
    edge_items: int = 3
    max_line_width: int = 80
    digits: int = 4
    float_format: str = "auto"
    separator: str = ", "
    open_bracket: str = "("
    close_bracket: str = ")"


def _int_digits(value: float) -> int:
    """Digits before the point of ``value`` (at least 1)."""
    return max(1, math.floor(math.log10(abs(value))) + 1) if value else 1


def _float_style(values: Sequence[float], fmt: TensorFormat) -> str:
    """'fixed', 'scientific' or 'none' for these (finite) values."""
    if fmt.float_format != "auto":
        return fmt.float_format
    magnitudes = [abs(v) for v in values if v != 0]
    if not magnitudes:
        return "fixed"
    largest, smallest = max(magnitudes), min(magnitudes)
    # Fixed point unless the range is too wide to show every value with the
    # significant digits asked for (whole numbers always fit).
    if largest >= 1e8:
        return "scientific"
    if all(float(v).is_integer() for v in values):
        return "fixed"
    if smallest < 10.0 ** -max(fmt.digits - 1, 1) or largest / smallest > 1e3:
        return "scientific"
    return "fixed"


def _element_strings(values: List, kind: str, fmt: TensorFormat) -> List[str]:
    """The shown elements (``kind``: 'bool', 'int' or 'float') as text, aligned
    to one width unless ``digits`` is 0 or the float format is 'none'.
    ``digits`` counts significant digits, without the exponent: the largest
    value in fixed point, every mantissa in scientific notation."""
    if kind == "bool":
        return ["true" if v else "false" for v in values]
    if kind == "int":
        texts = [str(v) for v in values]
        aligned = fmt.digits > 0
    else:
        finite = [v for v in values if math.isfinite(v)]
        style = _float_style(finite, fmt)
        aligned = fmt.digits > 0 and style != "none"
        largest = max((abs(v) for v in finite), default=0.0)
        decimals = max(fmt.digits - _int_digits(largest), 0)

        def one(v: float) -> str:
            if math.isnan(v):
                return "nan"
            if math.isinf(v):
                return "inf" if v > 0 else "-inf"
            if style == "fixed":
                return f"{v:.{decimals}f}"
            if style == "scientific":
                return f"{v:.{max(fmt.digits - 1, 0)}e}"
            return f"{v:.{fmt.digits}g}" if fmt.digits > 0 else f"{v:g}"
        texts = [one(v) for v in values]
    if aligned and texts:
        width = max(len(t) for t in texts)
        texts = [t.rjust(width) for t in texts]
    return texts


class _Writer:
    """Lays out nested rows of element texts within brackets, as Poplar's
    PrintTensor does: each dimension above the last opens its bracket, puts
    each of its parts on a line of its own, one space deeper per level, and
    closes on a line of its own; a row's elements go on one line."""

    def __init__(self, fmt: TensorFormat) -> None:
        self.fmt = fmt

    def row(self, texts: List[str], depth: int) -> str:
        fmt = self.fmt
        items = [t + fmt.separator for t in texts[:-1]] + texts[-1:]
        line = fmt.open_bracket + "".join(items) + fmt.close_bracket
        if fmt.max_line_width <= 0 or depth + len(line) <= fmt.max_line_width:
            return line
        # As many elements per line as fit (at least one); continuation lines
        # start past the bracket, one space in.
        lead = depth + len(fmt.open_bracket) + 1
        lines: List[str] = []
        current, width = fmt.open_bracket, depth
        for item in items:
            if current.strip(fmt.open_bracket) and width + len((current + item).rstrip()) > \
                    fmt.max_line_width:
                lines.append(current.rstrip())
                current, width = "", lead
            current += item
        lines.append(current + fmt.close_bracket)
        return ("\n" + " " * lead).join(lines)

    def nest(self, parts: List[str], depth: int) -> str:
        fmt = self.fmt
        inner = "".join(" " * (depth + 1) + part + "\n" for part in parts)
        return fmt.open_bracket + "\n" + inner + " " * depth + fmt.close_bracket


def format_tensor(tensor: torch.Tensor, fmt: TensorFormat) -> str:
    """The text of ``tensor`` (any device; read on the host)."""
    t = tensor.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t)
    kind = "bool" if t.dtype == torch.bool else "float" if t.is_floating_point() else "int"
    if kind == "float":
        t = t.to(torch.float64)
    summarise = 0 < fmt.summarise_threshold < t.numel() and fmt.edge_items >= 0

    def shown(x: torch.Tensor, dim: int) -> List[int]:
        n = x.shape[dim]
        if summarise and n > 2 * fmt.edge_items:
            return list(range(fmt.edge_items)) + [-1] + list(range(n - fmt.edge_items, n))
        return list(range(n))

    # First the shown values, to choose one format and width for all of them.
    values: List = []

    def collect(x: torch.Tensor) -> None:
        if x.dim() == 0:
            values.append(x.item())
            return
        for i in shown(x, 0):
            if i >= 0:
                collect(x[i])
    collect(t)
    texts = iter(_element_strings(values, kind, fmt))
    writer = _Writer(fmt)

    def write(x: torch.Tensor, depth: int) -> str:
        if x.dim() == 0:
            return next(texts)
        if x.dim() == 1:
            return writer.row([next(texts) if i >= 0 else "..." for i in shown(x, 0)], depth)
        parts = [write(x[i], depth + 1) if i >= 0 else "..." for i in shown(x, 0)]
        return writer.nest(parts, depth)
    return write(t, 0)
