"""Several processes, on one host or many: ``torch.distributed`` on ipu tensors.

* :mod:`._backend`: the ``ipu`` process-group backend. Collectives on ipu
  tensors go over the group's host backend (gloo): pending work is run first,
  the buffers are copied to the host, reduced there and copied back.
"""
from __future__ import annotations

import torch.distributed as dist

BACKEND = "ipu"  # init_process_group("ipu"), and the ipu's entry of the default map

if dist.is_available():
    from . import _backend  # noqa: F401  (registers the backend and the ipu's kernels)

__all__ = ["BACKEND"]
