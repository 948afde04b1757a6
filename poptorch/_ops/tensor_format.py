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


def _float_style(values: Sequence[float], fmt: TensorFormat) -> str:
    """'fixed', 'scientific' or 'none' for these (finite) values."""
    if fmt.float_format != "auto":
        return fmt.float_format
    magnitudes = [abs(v) for v in values if v != 0]
    if not magnitudes:
        return "fixed"
    largest, smallest = max(magnitudes), min(magnitudes)
    # As numpy and torch choose: fixed point unless the range is too wide to
    # show every value with the digits asked for (whole numbers always fit).
    if largest >= 1e8:
        return "scientific"
    if all(float(v).is_integer() for v in values):
        return "fixed"
    if smallest < 10.0 ** -fmt.digits or largest / smallest > 1e3:
        return "scientific"
    return "fixed"


def _element_strings(values: List, kind: str, fmt: TensorFormat) -> List[str]:
    """The shown elements (``kind``: 'bool', 'int' or 'float') as text, aligned
    to one width unless ``digits`` is 0 or the float format is 'none'."""
    if kind == "bool":
        return ["true" if v else "false" for v in values]
    if kind == "int":
        texts = [str(v) for v in values]
        aligned = fmt.digits > 0
    else:
        style = _float_style([v for v in values if math.isfinite(v)], fmt)
        aligned = fmt.digits > 0 and style != "none"

        def one(v: float) -> str:
            if math.isnan(v):
                return "nan"
            if math.isinf(v):
                return "inf" if v > 0 else "-inf"
            if style == "fixed":
                return f"{v:.{fmt.digits}f}"
            if style == "scientific":
                return f"{v:.{fmt.digits}e}"
            return f"{v:.{fmt.digits}g}" if fmt.digits > 0 else f"{v:g}"
        texts = [one(v) for v in values]
    if aligned and texts:
        width = max(len(t) for t in texts)
        texts = [t.rjust(width) for t in texts]
    return texts


class _Writer:
    """Lays out nested rows of element texts within brackets."""

    def __init__(self, fmt: TensorFormat, indent: int) -> None:
        self.fmt = fmt
        self.indent = indent  # columns before the outermost bracket

    def row(self, texts: List[str], depth: int) -> str:
        fmt = self.fmt
        items = [t + fmt.separator for t in texts[:-1]] + texts[-1:]
        line = fmt.open_bracket + "".join(items) + fmt.close_bracket
        if fmt.max_line_width <= 0 or self.indent + depth + len(line) <= fmt.max_line_width:
            return line
        # As many elements per line as fit; continuation lines start under the
        # first element.
        lead = self.indent + depth + len(fmt.open_bracket)
        lines: List[str] = []
        current = ""
        for item in items:
            if current and lead + len((current + item).rstrip()) > fmt.max_line_width:
                lines.append(current.rstrip())
                current = ""
            current += item
        lines.append(current + fmt.close_bracket)
        return fmt.open_bracket + ("\n" + " " * lead).join(lines)

    def nest(self, parts: List[str], depth: int, dims_left: int) -> str:
        fmt = self.fmt
        # Rows of a matrix go on lines of their own, blocks of higher rank
        # with an empty line between them, as numpy prints them.
        joiner = fmt.separator.rstrip() + "\n" * max(1, dims_left) + " " * (
            self.indent + depth + len(fmt.open_bracket))
        return fmt.open_bracket + joiner.join(parts) + fmt.close_bracket


def format_tensor(tensor: torch.Tensor, fmt: TensorFormat, indent: int = 0) -> str:
    """The text of ``tensor`` (any device; read on the host). ``indent``: the
    columns already used on the first line (a title)."""
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
    writer = _Writer(fmt, indent)

    def write(x: torch.Tensor, depth: int) -> str:
        if x.dim() == 0:
            return next(texts)
        if x.dim() == 1:
            return writer.row([next(texts) if i >= 0 else "..." for i in shown(x, 0)], depth)
        parts = [write(x[i], depth + len(fmt.open_bracket)) if i >= 0 else "..."
                 for i in shown(x, 0)]
        return writer.nest(parts, depth, x.dim() - 1)
    return write(t, 0)
