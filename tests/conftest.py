"""Shared fixtures: every comparison test runs the same code on cpu and ipu."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

import poptorch
from poptorch.testing import assert_same  # noqa: F401 - the suite imports it from here

# The `device` parametrisation over cpu and ipu (also a pytest11 entry point once
# poptorch is installed; named the same, so it is registered once).
pytest_plugins = ["poptorch.testing.pytest_plugin"]

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
