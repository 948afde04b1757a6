"""PopTorch: an ``ipu`` device for PyTorch and the PopTorch programming model.

Importing ``poptorch`` registers the ``ipu`` device: ``tensor.to("ipu")`` and
``model.to("ipu")`` capture operations lazily into graphs that are compiled,
cached by structure and run on the emulated IPU when values are needed.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from . import _C
from . import _ops
from . import (_cpu_defaults, _device_module, _dynamo_backend, _dynamo_disable, _fake_cpu,
               _meta_warnings)
from . import _profiling
from . import _grad_scaler
from . import _dlpack, _nested, _recompute, _serialization
from . import _storages
from . import autocasting
from . import distributed
from . import enums
from . import optim
from ._annotations import BeginBlock, Block, BlockFunction, removeBlocks
from ._execution_strategy import (ParallelPhasedExecution, Phase, PipelinedExecution,
                                  SerialPhasedExecution, ShardedExecution, Stage)
from . import profiling
from ._compile_hooks import registerPostCompileHook, registerPreCompileHook
from ._data_accessor import AsynchronousDataAccessor
from ._dataloader import DataLoader
from ._errors import (Error, RecoverableError, UnrecoverableError, UnsupportedError,
                      ValueCompatibleError)
from ._executor import PoplarExecutor, inferenceModel, trainingModel
from ._inputs import ICustomArgParser, registerCustomArgParser
from ._logging import logger, setLogLevel
from ._ops import *  # noqa: F401,F403  (PopTorch's ops are poptorch.<name>)
from ._losses import identity_loss, isRunningOnIpu
from ._precompilation import load as _load
# poptorch.print is PopTorch's; it stays out of __all__ so that `import *` keeps the builtin.
from ._printing import module_repr, print  # pylint: disable=redefined-builtin
from .autocasting import autocast
from ._version import __version__
from .enums import *  # noqa: F401,F403  (PopTorch's enums are poptorch.<name> too)
from .options import Options, TensorLocationSettings

torch._register_device_module("ipu", _device_module)
_profiling.start_from_environment()
_serialization.install()
_dlpack.install()
_nested.install()
_recompute.install()
_storages.install()
_grad_scaler.install()
_dynamo_backend.install()
_dynamo_disable.install()
_C.set_fake_cpu_inference(_fake_cpu.device_dependent_ops(), _fake_cpu.fake, _fake_cpu.run)
_C.set_before_first_inference(_fake_cpu.before_first_inference)
_meta_warnings.install()
_cpu_defaults.adopt()

# The autograd engine sizes its per-device worker queues once, at the first
# backward: if that ran before this import, the ipu has no queue and backward
# on ipu tensors fails inside the engine. Captured ops need no device thread,
# so backward runs on the calling thread, whatever the import order.
torch.autograd.set_multithreading_enabled(False)


def synchronize() -> None:
    """Runs every pending ipu operation now."""
    _C.synchronize()


def metrics() -> Dict[str, Any]:
    """Counters of what the ipu backend did since start (or ``reset_metrics``):
    ``ops_captured``, ``graphs_compiled``, ``cache_hits``, ``cache_evictions``,
    ``executables_loaded`` (from the disk cache or a precompiled file), ``executions``,
    ``host_fallbacks``, ``guard_failures``, ``fallback_ops`` (op name -> count),
    ``compile_seconds``, ``execute_seconds``, ``bytes_to_ipu``, ``bytes_from_ipu``,
    ``bytes_between_ipus`` (tensors a model split over IPUs moved from one IPU to another), and for
    ``torch.compile(backend="ipu")``: ``dynamo_graphs`` (graphs dynamo gave the backend),
    ``dynamo_recompiles`` (of which compiled again after a guard failed) and
    ``dynamo_replays`` (calls of compiled graphs replayed without Python).
    """
    return _C.metrics()


def reset_metrics() -> None:
    """Sets every counter of :func:`metrics` back to zero."""
    _C.reset_metrics()


def set_executable_cache_size(size: int) -> None:
    """Keeps at most ``size`` compiled executables in memory, evicting the least
    recently used (0 keeps none). The default is ``POPTORCH_EXECUTABLE_CACHE_SIZE``,
    or 256. Models already wrapped keep their executables when they are evicted."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueCompatibleError("set_executable_cache_size takes a number of executables, "
                                   f"an integer of at least 0, got {size!r}")
    _C.set_executable_cache_capacity(size)


def load(filename: str, edit_opts_fn: Optional[Callable[[Options], None]] = None) -> PoplarExecutor:
    """Restores a model written by :meth:`PoplarExecutor.compileAndExport` or
    :meth:`PoplarExecutor.save` (with ``export_model=True``): the model and
    its weights, the optimiser and its state, the options and the compiled
    executables, which are not compiled again. ``edit_opts_fn(options)`` may
    change the options first (run-time ones, such as ``useIpuId``). The file
    must come from this very build of poptorch; a file of another version, or a
    damaged one, is a :class:`~poptorch.Error`. Files are unpickled: load only
    files you trust."""
    return _load(filename, edit_opts_fn)


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """False: there is no IPU hardware here; the IPU Model (emulated on the
    host) runs everything."""
    return False


def ipuHardwareVersion() -> int:
    """The version of the IPU the emulation models: 2 (PopTorch's Mk2), the
    argument ``Options.useOfflineIpuTarget`` takes."""
    return 2


__all__ = [
    "AsynchronousDataAccessor", "DataLoader", "autocast", "autocasting", "Error",
    "ICustomArgParser", "Options", "PoplarExecutor", "RecoverableError",
    "TensorLocationSettings", "UnrecoverableError", "UnsupportedError", "ValueCompatibleError",
    "enums", "identity_loss", "inferenceModel",
    "ipuHardwareIsAvailable", "ipuHardwareVersion", "isRunningOnIpu", "load", "logger",
    "metrics", "module_repr", "optim", "profiling", "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook", "reset_metrics", "setLogLevel", "BeginBlock", "Block",
    "BlockFunction", "ParallelPhasedExecution", "Phase", "PipelinedExecution",
    "SerialPhasedExecution", "ShardedExecution", "Stage", "removeBlocks",
    "set_executable_cache_size", "synchronize", "trainingModel",
] + enums.__all__ + _ops.__all__
