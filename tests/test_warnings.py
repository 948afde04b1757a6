"""Warnings the CPU kernels give at an op's call (a resized non-empty out= tensor, degrees of
freedom <= 0, a deterministic-algorithms alert with warn_only) come at the ipu op's call too,
as many times as on the CPU, with the same category and message; nothing more comes when the
graph runs, and PyTorch's Python Meta kernels (which capture runs to infer shapes) add none
of their own."""
from __future__ import annotations

import warnings
from typing import Callable, List, Tuple

import pytest
import torch
import torch.nn.functional as F

import poptorch
from conftest import run_python

Recorded = List[Tuple[type, str]]


def _record(fn: Callable[[], object]) -> Recorded:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [(w.category, str(w.message)) for w in caught]


def _calls_then_sync(case: Callable[[str], Callable[[], object]], device: str,
                     calls: int = 2) -> Tuple[Recorded, Recorded]:
    """The warnings of `calls` calls of the op, and those of reading the results after."""
    op = case(device)
    results = []
    at_calls = _record(lambda: results.extend(op() for _ in range(calls)))
    at_sync = _record(lambda: [r.cpu() for r in results] and poptorch.synchronize())
    return at_calls, at_sync


def _x(device):
    return torch.arange(6.0, device=device).reshape(2, 3)


def _positive_definite(device):
    a = torch.arange(9.0).reshape(3, 3) / 10
    return (a @ a.T + torch.eye(3)).to(device)


CASES = {
    # A factorisation fails on capture's stand-ins (all zeros, all ones) as it may on the user's
    # values; the warnings its CPU kernel gives before it gets there did not come at the call.
    "cholesky_inverse_into_a_non_empty_out": lambda d: lambda: torch.cholesky_inverse(
        _positive_definite(d), out=torch.ones(9, device=d)),
    "add_into_a_non_empty_out": lambda d: lambda: torch.add(_x(d), 1, out=torch.ones(7, device=d)),
    "index_select_into_a_non_empty_out": lambda d: lambda: torch.index_select(
        _x(d), 0, torch.tensor([1], device=d), out=torch.ones(9, device=d)),
    "sum_into_a_non_empty_out": lambda d: lambda: torch.sum(_x(d), 0, out=torch.ones(9, device=d)),
    "arange_into_an_out_of_another_size": lambda d: lambda: torch.arange(
        4.0, out=torch.ones(7, device=d)),
    "arange_into_an_empty_out": lambda d: lambda: torch.arange(4.0, out=torch.empty(0, device=d)),
    "linspace_into_an_empty_out": lambda d: lambda: torch.linspace(
        0, 1, 5, out=torch.empty(0, device=d)),
    "logspace_into_an_empty_out": lambda d: lambda: torch.logspace(
        0, 1, 5, out=torch.empty(0, device=d)),
    "var_with_no_degrees_of_freedom": lambda d: lambda: torch.var(_x(d)[:1], dim=0),
    "std_of_one_element": lambda d: lambda: torch.std(torch.ones(1, device=d)),
    "no_warning": lambda d: lambda: torch.add(_x(d), 1),
}


@pytest.mark.parametrize("name", CASES)
def test_warnings_come_at_the_call_as_on_the_cpu(name):
    cpu_calls, _ = _calls_then_sync(CASES[name], "cpu")
    ipu_calls, ipu_sync = _calls_then_sync(CASES[name], "ipu")
    assert ipu_calls == cpu_calls
    assert ipu_sync == []


def test_cholesky_into_a_non_empty_out_warns_of_the_resize_at_each_call():
    # torch.cholesky's CPU kernel resizes out after the factorisation, which no stand-in gets
    # through: the resize's warning comes at every call all the same. Its deprecation warning
    # comes once per process: given here first.
    _record(lambda: torch.cholesky(_positive_definite("cpu"), out=torch.empty(0)))
    case = lambda d: lambda: torch.cholesky(_positive_definite(d), out=torch.ones(2, 2, device=d))
    cpu_calls, _ = _calls_then_sync(case, "cpu")
    ipu_calls, ipu_sync = _calls_then_sync(case, "ipu")
    assert len(cpu_calls) == 2 and "was resized" in cpu_calls[0][1]
    assert ipu_calls == cpu_calls
    assert ipu_sync == []


def _unpool(device):
    x = torch.arange(16.0, device=device).reshape(1, 1, 4, 4)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    return lambda: F.max_unpool2d(pooled, indices, 2)


def test_deterministic_alerts_with_warn_only():
    """max_unpool2d's CPU kernel has no deterministic implementation: with warn_only it
    warns at every call (its Python decomposition's own alert is not given twice)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        cpu_calls, _ = _calls_then_sync(_unpool, "cpu")
        ipu_calls, ipu_sync = _calls_then_sync(_unpool, "ipu")
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(cpu_calls) == 2
    assert ipu_calls == cpu_calls
    assert ipu_sync == []


_COUNT_ONCE_WARNINGS = """
import warnings, torch, poptorch
device = "{device}"
real = torch.zeros(3, device=device)
complex_values = torch.ones(3, dtype=torch.complex64, device=device)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        real.copy_(complex_values)
real.cpu()
print([str(w.message) for w in caught])
"""


def test_a_warning_the_cpu_gives_once_per_process_is_given_once():
    """copy_ of complex values into a real tensor warns once per process (TORCH_WARN_ONCE)."""
    cpu, ipu = (run_python(_COUNT_ONCE_WARNINGS.format(device=d)) for d in ("cpu", "ipu"))
    assert cpu.returncode == 0 and ipu.returncode == 0, cpu.stderr + ipu.stderr
    assert "discards the imaginary part" in cpu.stdout
    assert ipu.stdout == cpu.stdout


def test_warn_always_makes_once_warnings_every_call():
    torch.set_warn_always(True)
    try:
        calls = {}
        for device in ("cpu", "ipu"):
            real = torch.zeros(3, device=device)
            complex_values = torch.ones(3, dtype=torch.complex64, device=device)
            calls[device] = _record(lambda: [real.copy_(complex_values) for _ in range(2)])
    finally:
        torch.set_warn_always(False)
    assert len(calls["cpu"]) == 2
    assert calls["ipu"] == calls["cpu"]


def test_python_meta_warnings_outside_shape_inference_are_given():
    """PyTorch's Python helpers still warn when they run for their own sake (not to infer an ipu
    op's shapes), naming the caller's line as they did."""
    from torch._prims_common.wrappers import _resize_output_check

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _resize_output_check(torch.zeros(2), (3,))
    assert len(caught) == 1 and "was resized" in str(caught[0].message)
    assert caught[0].filename == __file__


_WRAPPED_MODEL_WARNINGS = """
import warnings, torch, poptorch


class WarnsInForward(torch.nn.Module):
    # var of one row (no degrees of freedom: TORCH_WARN, at every call), and copy_ of complex
    # values into a real tensor (TORCH_WARN_ONCE: once per process).
    def forward(self, x):
        real = torch.zeros(3, device=x.device)
        real.copy_(torch.ones(3, dtype=torch.complex64, device=x.device))
        return torch.var(x[:1], dim=0) + real.sum()


model = WarnsInForward()
run = model if "{device}" == "cpu" else poptorch.inferenceModel(model)
x = torch.arange(6.0).reshape(2, 3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        run(x)
print(sorted(w.category.__name__ + ": " + str(w.message) for w in caught))
"""


def test_a_wrapped_model_gives_its_kernel_warnings_at_every_call():
    """As the CPU model: a TORCH_WARN at each of its calls, a TORCH_WARN_ONCE once."""
    cpu, ipu = (run_python(_WRAPPED_MODEL_WARNINGS.format(device=d)) for d in ("cpu", "ipu"))
    assert cpu.returncode == 0 and ipu.returncode == 0, cpu.stderr + ipu.stderr
    assert cpu.stdout.count("degrees of freedom") == 3
    assert cpu.stdout.count("discards the imaginary part") == 1
    assert ipu.stdout == cpu.stdout


_COMPLEX32_FACTORIES = {
    "empty": lambda d: torch.empty(3, dtype=torch.chalf, device=d),
    "empty_strided": lambda d: torch.empty_strided((2, 3), (1, 2), dtype=torch.chalf, device=d),
    "zeros": lambda d: torch.zeros(3, dtype=torch.chalf, device=d),
    "ones": lambda d: torch.ones(3, dtype=torch.chalf, device=d),
    "full": lambda d: torch.full((3,), 2.0, dtype=torch.chalf, device=d),
    "randn": lambda d: torch.randn(3, dtype=torch.chalf, device=d),
    "zeros_like": lambda d: torch.zeros_like(torch.ones(3, device=d), dtype=torch.chalf),
    "to": lambda d: torch.ones(2, 3, device=d).t().to(torch.chalf),
    # Their Python Meta kernels allocate complex32 Meta tensors, which warns too: the capture's
    # shape inference gave those warnings as well, at its first call of a signature.
    "rand": lambda d: torch.rand(3, dtype=torch.chalf, device=d),
    "add": lambda d: torch.zeros(3, dtype=torch.chalf, device=d) + 1,
}


@pytest.mark.parametrize("name", _COMPLEX32_FACTORIES)
def test_a_complex32_factory_warns_as_the_cpu_allocator(name):
    """The CPU's allocator warns 'ComplexHalf support is experimental' when it makes a complex32
    tensor; the ipu's factories, which do not go through it, warned nothing (PyTorch's
    test_torch test_complex_half_experimental_warning). Each call warns as many times as on the
    CPU, the first too."""
    factory = _COMPLEX32_FACTORIES[name]
    torch.set_warn_always(True)
    try:
        calls = {d: _record(lambda: [factory(d) for _ in range(2)]) for d in ("cpu", "ipu")}
    finally:
        torch.set_warn_always(False)
    assert len(calls["cpu"]) >= 2 and "ComplexHalf support is experimental" in calls["cpu"][0][1]
    assert calls["ipu"] == calls["cpu"]


_COMPLEX32_ONCE = """
import warnings, torch, poptorch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        torch.zeros(3, dtype=torch.chalf, device="{device}")
print([str(w.message) for w in caught])
"""


def test_the_complex32_warning_is_given_once_per_process_as_on_the_cpu():
    cpu, ipu = (run_python(_COMPLEX32_ONCE.format(device=d)) for d in ("cpu", "ipu"))
    assert cpu.returncode == 0 and ipu.returncode == 0, cpu.stderr + ipu.stderr
    assert cpu.stdout.count("ComplexHalf support is experimental") == 1
    assert ipu.stdout == cpu.stdout
