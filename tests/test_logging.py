"""POPTORCH_LOG_LEVEL and setLogLevel govern what PopTorch logs."""
import pytest

import poptorch
from conftest import run_python

FALLBACK = ("import torch, poptorch\n"
            "torch.nonzero(torch.tensor([0.0, 1.0], device='ipu')).cpu()\n")


def test_warnings_show_at_the_default_level():
    assert "ran on the host" in run_python(FALLBACK).stderr


def test_off_silences_everything():
    assert "ran on the host" not in run_python(FALLBACK, env={"POPTORCH_LOG_LEVEL": "OFF"}).stderr


def test_debug_logs_compilation():
    code = "import torch, poptorch\n(torch.ones(2, device='ipu') * 2).cpu()\n"
    stderr = run_python(code, env={"POPTORCH_LOG_LEVEL": "DEBUG"}).stderr
    assert "compiling a graph of" in stderr


def test_set_log_level_rejects_unknown_levels():
    with pytest.raises(ValueError, match="unknown log level"):
        poptorch.setLogLevel("LOUD")
    poptorch.setLogLevel("INFO")
