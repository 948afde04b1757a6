"""What an op's results look like on the CPU, for the few ops whose Meta kernel asks for the device.

Capture infers each op's results from its Meta kernel, on meta twins of the ipu tensors. A
meta tensor has no device, and a few of PyTorch's Meta kernels written in Python decide a
result's shape, layout or checks by the device; on a meta tensor they answer for CUDA. The
ipu runs the CPU's kernels, so for these ops capture asks PyTorch's FakeTensor (meta tensors
that carry a device) with the device set to the CPU, as torch.compile does for CPU graphs.

Every other op's Meta kernel runs on the meta twins directly: FakeTensorMode imports
torch._dynamo, sympy and parts of torch._inductor the first time (seconds, ~80 MB), which
a process that never meets one of these ops does not pay. Capture corrects the answers of
convolutions and batch norm in C++ (capture/cpu_alignment.cpp), so common models never
create a FakeTensorMode.
"""
from __future__ import annotations

import importlib
import logging
import signal
import sys
import threading
from typing import Callable, List

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_CPU = torch.device("cpu")
_local = threading.local()


# The ops whose Python Meta kernel answers otherwise for the CPU than on a meta tensor
# (torch 2.13: torch/_meta_registrations.py's device_hint() and fake_device sites, the
# reference kernels and the FakeTensor rules that reach them; tests/test_fake_cpu_ops.py
# checks the list against PyTorch's sources). Ops that the ipu never infers this way (a
# composite kernel decomposes them first, or a structured one answers) are not listed.
_DEVICE_DEPENDENT_OPS = (
    # The CPU's (MKL's) FFT strides differ from cuFFT's.
    "aten::_fft_c2c", "aten::_fft_c2c.out", "aten::_fft_r2c", "aten::_fft_r2c.out",
    "aten::_fft_c2r", "aten::_fft_c2r.out",
    # Column-major eigenvectors and right singular vectors on the CPU.
    "aten::linalg_eig", "aten::linalg_eig.out",
    # The CPU sizes embedding_bag's bookkeeping (offset2bag, bag_size, max_indices) its way.
    "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
    # The CPU keeps channels-last through padding and pixel shuffle; its channel shuffle
    # always copies (CUDA's may return a view).
    "aten::reflection_pad2d", "aten::reflection_pad2d.out", "aten::replication_pad2d.out",
    "aten::channel_shuffle",
    # nonzero_static's strides; histc's CPU dtype check; median and mode alert under
    # deterministic algorithms on CUDA only; _scaled_mm's CUDA-only layout checks.
    "aten::nonzero_static", "aten::nonzero_static.out", "aten::histc", "aten::histc.out",
    "aten::median.dim_values", "aten::nanmedian.dim_values", "aten::mode",
    "aten::mode.values", "aten::_scaled_mm", "aten::_scaled_mm_v2",
)


def device_dependent_ops() -> List[str]:
    """The aten ops ("aten::add.out") whose results capture infers on fake CPU tensors."""
    return list(_DEVICE_DEPENDENT_OPS)


def _import_uninterrupted(name: str) -> None:
    """Imports module `name` with Ctrl-C deferred to the import's end. sympy and torch._dynamo
    take seconds to import the first time; interrupted in the middle, sympy stays
    half-imported for the rest of the process (no attribute 'core'), every later shape
    inference fails and every op falls back to the host. Python delivers signals to the main
    thread only: elsewhere the import is not interrupted anyway."""
    if (name in sys.modules or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):  # a handler set outside Python
        return
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        signal.raise_signal(signal.SIGINT)  # to the handler the user had


def before_first_inference() -> None:
    """Capture calls this before it first infers shapes: PyTorch's Python Meta kernels import
    sympy (torch._prims_common.elementwise_dtypes) at their first run."""
    _import_uninterrupted("sympy")


def _mode() -> FakeTensorMode:
    # One per thread: a mode's entry state is its own. Capture caches results per signature,
    # so FakeTensor's own cache (process-wide, unbounded) would only grow.
    mode = getattr(_local, "mode", None)
    if mode is None:
        _import_uninterrupted("torch._dynamo.config")  # FakeTensorMode imports it
        mode = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)
        mode.cache_enabled = False
        _local.mode = mode
    return mode


def fake(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Fake CPU tensors with the layouts (and storages) of these meta tensors."""
    mode = _mode()
    return [FakeTensor(mode, t, _CPU) for t in tensors]


def run(call: Callable[[], None]) -> None:
    """Calls `call` (which runs an op on tensors from fake()) under FakeTensor's mode. What the
    op raises goes to capture, which then runs the op on the host (or passes Ctrl-C on)."""
    _local.running = True
    try:
        with _mode():
            call()
    finally:
        _local.running = False


class _QuietWhileInferring(logging.Filter):
    """FakeTensor logs every failing Meta kernel as an error; for capture a failure only means
    that the op runs on the host (where the CPU raises the user's error, if it is one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_local, "running", False)


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietWhileInferring())
