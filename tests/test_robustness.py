"""The ipu device under interruptions and fork(): Ctrl-C in a Meta kernel, forked children."""
import pytest
import torch

import poptorch
from conftest import run_python

LIBRARY = torch.library.Library("poptorch_robustness", "DEF")
HOST_CALLS = []


def _define(name: str, meta) -> None:
    """An op `name(Tensor x) -> Tensor` computing x * 2 on the host, with the given Meta kernel."""
    LIBRARY.define(f"{name}(Tensor x) -> Tensor")

    def host(x):
        HOST_CALLS.append(name)
        return x * 2
    LIBRARY.impl(name, host, "CPU")
    LIBRARY.impl(name, meta, "Meta")


def _raise(error):
    def meta(x):
        raise error
    return meta


_define("interrupted", _raise(KeyboardInterrupt))
_define("exiting", _raise(SystemExit(3)))
_define("out_of_memory", _raise(MemoryError))
_define("cannot_infer", _raise(RuntimeError("no shape for you")))


@pytest.mark.parametrize("name, error", [("interrupted", KeyboardInterrupt),
                                         ("exiting", SystemExit),
                                         ("out_of_memory", MemoryError)])
def test_an_interrupt_in_a_meta_kernel_reaches_the_caller(name, error):
    HOST_CALLS.clear()
    x = torch.ones(3, device="ipu")
    with pytest.raises(error):
        getattr(torch.ops.poptorch_robustness, name)(x)
    assert HOST_CALLS == [] and poptorch.metrics()["fallback_ops"] == {}
    torch.testing.assert_close((x + 1).cpu(), torch.full((3,), 2.0))  # nothing left behind


def test_an_ordinary_meta_error_still_runs_the_op_on_the_host():
    HOST_CALLS.clear()
    x = torch.ones(3, device="ipu")
    result = torch.ops.poptorch_robustness.cannot_infer(x)
    assert HOST_CALLS == ["cannot_infer"]
    torch.testing.assert_close(result.cpu(), torch.full((3,), 2.0))
    assert poptorch.metrics()["fallback_ops"] == {"poptorch_robustness::cannot_infer": 1}


# The first shape inference imports sympy (PyTorch's Python Meta kernels use it); a
# Ctrl-C arrives when sympy.core is imported and sympy.polys not yet (interrupted
# there, sympy stayed half-imported: no attribute "core").
INTERRUPTED_IMPORT = """
import importlib.abc, os, signal, sys, torch, poptorch
assert "sympy" not in sys.modules
# Python's own handler: a child of a background job starts with SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
class InterruptAtSympyPolys(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "sympy.polys":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, InterruptAtSympyPolys())
try:
    torch.ones(2, 3, device="ipu")
    raise SystemExit("no KeyboardInterrupt")
except KeyboardInterrupt:
    pass
import sympy
assert hasattr(sympy, "core"), "sympy half-imported"
a, b = torch.ones(2, 3, device="ipu"), torch.ones(3, 4, device="ipu")
result = torch.addmm(torch.zeros(4, device="ipu"), a, b).cpu()
assert torch.equal(result, torch.full((2, 4), 3.0)), result
assert poptorch.metrics()["fallback_ops"] == {}, poptorch.metrics()["fallback_ops"]
print("ok")
"""


def test_ctrl_c_while_shape_inference_imports_its_dependencies_is_raised_after_the_import():
    result = run_python(INTERRUPTED_IMPORT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


FORK = """
import os, torch, poptorch
x = torch.ones(8, device="ipu")
for _ in range(10): x = x + 1
assert x.cpu()[0].item() == 11
for _ in range(10): x = x + 1   # streamed to the worker: maybe still queued at fork()
pid = os.fork()
if pid == 0:
    y = x * 2
    for _ in range(10): y = y + 1
    os._exit(0 if torch.equal(y.cpu(), torch.full((8,), 52.0)) else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert torch.equal(x.cpu(), torch.full((8,), 21.0))
print("ok")
"""


def test_a_forked_child_runs_streamed_graphs():
    # Small tensors: the CPU kernels stay off OpenMP, which GNU OpenMP does not
    # support across fork() (plain PyTorch hangs there too).
    result = run_python(FORK, env={"POPTORCH_STREAM_NODES": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
