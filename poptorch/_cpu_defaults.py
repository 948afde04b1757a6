"""The CPU's per-device choices in PyTorch's Python code, taken for the ipu.

Some of PyTorch's Python functions pick a numerical policy by device type and give devices
they do not know a default of their own. The ipu runs the CPU's kernels, so it takes the
CPU's choices: otherwise the same call computes differently on the two devices.
"""
from __future__ import annotations

import functools

import torch


def adopt() -> None:
    # F.linear_cross_entropy: the CPU accumulates float16/bfloat16 in float32 and chunks by
    # aspect ratio; unknown devices accumulate in the input's dtype. The device only selects
    # these policies in LinearCrossEntropyOptions._adjust.
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    adjust = LinearCrossEntropyOptions._adjust

    @functools.wraps(adjust)
    def adjust_like_cpu(self, *args, device=None, **kwargs):
        if device is not None and device.type == "ipu":
            device = torch.device("cpu")
        return adjust(self, *args, device=device, **kwargs)

    LinearCrossEntropyOptions._adjust = adjust_like_cpu
