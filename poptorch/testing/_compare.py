"""Comparing a result computed on the ipu with the CPU's."""
from __future__ import annotations

from typing import Any

import torch


def _from_ipu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        assert value.device.type == "ipu", f"expected an ipu tensor, got one on {value.device}"
        return value.cpu()
    if isinstance(value, list):
        return [_from_ipu(v) for v in value]
    if isinstance(value, tuple) and not isinstance(value, torch.Size):
        values = [_from_ipu(v) for v in value]
        return type(value)(*values) if hasattr(value, "_fields") else tuple(values)
    if isinstance(value, dict):
        return {k: _from_ipu(v) for k, v in value.items()}
    return value


def assert_same(cpu_value: Any, ipu_value: Any, **tolerances: Any) -> None:
    """Asserts that ``ipu_value`` (tensors on the ipu, or lists, tuples and dicts
    of them) holds the values of ``cpu_value``, with ``torch.testing.assert_close``
    and its ``tolerances``. Every tensor of ``ipu_value`` must be on the ipu."""
    torch.testing.assert_close(_from_ipu(ipu_value), cpu_value, **tolerances)
