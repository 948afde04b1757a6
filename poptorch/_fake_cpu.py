"""What an op's results look like on the CPU, for ops whose Meta kernel asks for the device.

Capture infers each op's results from its Meta kernel, on meta twins of the ipu tensors. But
a meta tensor has no device, and many Meta kernels written in Python decide the layout of a
result by the device (channels-last convolutions, batch norm's empty eval statistics and
column-major linalg results on the CPU, embedding_bag's bookkeeping...): on a meta tensor they
answer for CUDA. The ipu runs the CPU's kernels, so for these ops capture asks PyTorch's
FakeTensor (meta tensors that carry a device) with the device set to the CPU, as torch.compile
does for CPU graphs.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Callable, List

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_CPU = torch.device("cpu")
_local = threading.local()


def python_meta_ops() -> List[str]:
    """The aten ops whose Meta kernel is written in Python ("aten::add.out")."""
    import torch._meta_registrations as registrations

    library = registrations._meta_lib_dont_use_me_use_register_meta
    names = []
    for impl in library._op_impls:  # "aten/add.out/Meta"
        namespace, name, _ = impl.split("/")
        names.append(f"{namespace}::{name}")
    return names


def _import_dynamo_uninterrupted() -> None:
    """FakeTensorMode imports torch._dynamo (and sympy) the first time: seconds. A Ctrl-C
    in the middle would leave sympy half-imported for the rest of the process, every later
    shape inference failing and every op falling back to the host. So on the main thread
    (the only one Python delivers signals to) a Ctrl-C waits for the import's end."""
    if ("torch._dynamo.config" in sys.modules
            or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):  # a handler set outside Python
        return
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        import torch._dynamo.config  # noqa: F401 - imported for FakeTensorMode
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        signal.raise_signal(signal.SIGINT)  # to the handler the user had


def _mode() -> FakeTensorMode:
    # One per thread: a mode's entry state is its own. Capture caches results per signature,
    # so FakeTensor's own cache (process-wide, unbounded) would only grow.
    mode = getattr(_local, "mode", None)
    if mode is None:
        _import_dynamo_uninterrupted()
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
