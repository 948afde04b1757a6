"""The constructors of nested tensors, checked before they put ipu memory in a
strided nested tensor.

Nested tensors of the strided layout cannot hold ipu memory (PyTorch's
``NestedTensorImpl`` takes CPU, CUDA, XPU, HPU and PrivateUse1 storages only);
the jagged layout holds ordinary ipu tensors and works. The ops that make
strided ones from ipu tensors are refused by the C++ core
(``csrc/capture/layouts.cpp``). ``torch.nested.nested_tensor`` and
``as_nested_tensor`` of host data with ``device="ipu"`` never reach an ipu
kernel: their op's kernel runs for the CPU, copies the data to the ipu and
fails PyTorch's INTERNAL ASSERT as it wraps that copy. So they are checked here
first, with the same advice.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from ._errors import UnsupportedError


def _checked(constructor: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``constructor`` refusing a strided result with ``device`` the ipu."""
    signature = inspect.signature(constructor)
    name = f"torch.nested.{constructor.__name__}"

    @functools.wraps(constructor)
    def construct(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = signature.bind(*args, **kwargs).arguments
        device = bound.get("device")
        if (device is not None and torch.device(device).type == "ipu"
                and bound.get("layout") in (None, torch.strided)):
            raise UnsupportedError(
                f"{name}: nested tensors of the strided layout are not supported on the ipu; "
                f"make them with layout=torch.jagged ({name}(..., layout=torch.jagged, "
                "device=\"ipu\")), which holds ipu tensors")
        return constructor(*args, **kwargs)
    return construct


def install() -> None:
    for name in ("nested_tensor", "as_nested_tensor"):
        setattr(torch.nested, name, _checked(getattr(torch.nested, name)))
