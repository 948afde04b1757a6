"""Shared fixtures: every comparison test runs the same code on cpu and ipu."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch

import poptorch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_metrics():
    poptorch.synchronize()
    poptorch.reset_metrics()
    yield


def run_python(code: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for settings read at start-up)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=300)


def assert_same(cpu_value, ipu_value, **tolerances) -> None:
    """Compares a cpu result with the ipu result (moved to the cpu)."""
    def to_cpu(v):
        if isinstance(v, torch.Tensor):
            assert v.device.type == "ipu", f"expected an ipu tensor, got one on {v.device}"
            return v.cpu()
        if isinstance(v, (list, tuple)):
            return type(v)(to_cpu(x) for x in v)
        return v
    torch.testing.assert_close(to_cpu(ipu_value), cpu_value, **tolerances)
