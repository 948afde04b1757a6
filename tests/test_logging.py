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


@pytest.mark.parametrize("level, named", [
    ("LOUD", "'LOUD': use one of OFF, ERR, WARN, INFO, DEBUG, DEBUG_IR, TRACE, TRACE_ALL "
             "(or PopTorch's integers 0, 1, 2, 3, 4, 6)"),
    (5, "5: use one of 0 (TRACE), 1 (DEBUG), 2 (INFO), 3 (WARN), 4 (ERR), 6 (OFF), or a "
        "name: OFF, ERR"),
    (None, "None: use one of OFF")])
def test_set_log_level_rejects_unknown_levels_naming_the_valid_ones(level, named):
    # A plain ValueError before: now a poptorch.Error, still a ValueError.
    before = poptorch.logger.level
    with pytest.raises(poptorch.Error, match="unknown log level ") as info:
        poptorch.setLogLevel(level)
    assert isinstance(info.value, ValueError)
    assert named in str(info.value)
    assert poptorch.logger.level == before


def test_an_unknown_level_in_the_environment_is_said_and_info_used():
    # It stopped `import poptorch` with a ValueError that did not name the variable.
    result = run_python(FALLBACK, env={"POPTORCH_LOG_LEVEL": "junk"})
    assert result.returncode == 0, result.stderr
    assert "POPTORCH_LOG_LEVEL=junk is not a log level (unknown log level 'junk': use one of " \
        "OFF, ERR, WARN, INFO" in result.stderr
    assert "ran on the host" in result.stderr  # INFO shows warnings


def test_max_repeat_logs_limits_each_message():
    code = ("import poptorch\n"
            "from poptorch._logging import logger\n"
            "def say(i):\n"
            "    logger.warning('again %d', i)\n"
            "for i in range(5):\n"
            "    say(i)\n"
            "poptorch.Options().maxRepeatLogs(2)\n"
            "for i in range(5, 10):\n"
            "    say(i)\n"
            "logger.warning('another message')\n"
            "poptorch.Options().maxRepeatLogs(None)\n"
            "say(10)\n")
    lines = run_python(code).stderr.splitlines()
    assert lines == [f"[poptorch:WARNING] again {i}" for i in range(5)] + [
        "[poptorch:WARNING] again 5",
        "[poptorch:WARNING] again 6 (repeated; its further repeats are not shown)",
        "[poptorch:WARNING] another message",
        "[poptorch:WARNING] again 10"]
    with pytest.raises(poptorch.Error, match="maxRepeatLogs"):
        poptorch.Options().maxRepeatLogs(0)
