"""PyTorch's own op corpus (OpInfo) on the ipu against the CPU: every sample of every op, one
test per op x dtype x direction (forward results; float32 gradients). See opinfo_corpus.py for
what is compared, and opinfo_expected_failures.toml for the known failures: a failure not
listed there fails the test, and so does a listed sample that now passes."""
from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from opinfo_corpus import FLOAT64, Case, cases, describe, op_name, run_case, samples
from opinfo_expected import ExpectedFailures

EXPECTED = ExpectedFailures.load()
UNDEFINED = EXPECTED.undefined_ops()
CASES = list(cases())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.key.replace(" ", "-") for c in CASES])
def test_opinfo(case: Case) -> None:
    result = run_case(case, undefined=case.name in UNDEFINED)
    listed = EXPECTED.expected(case.key, result.samples)
    unexpected = {i: m for i, m in result.failures.items() if i not in listed}
    fixed = sorted(set(listed) - set(result.failures))
    if not unexpected and not fixed:
        return
    all_samples = samples(case)
    lines = [f"{case.name} ({case.direction}, {case.dtype}): {result.samples} samples"]
    for index, message in sorted(unexpected.items()):
        lines.append(f"  sample {index} fails ({describe(all_samples[index])}):\n    {message}")
    for index in fixed:
        lines.append(f"  sample {index} passes now: remove it from opinfo_expected_failures.toml"
                     f" ('{listed[index]}')")
    pytest.fail("\n".join(lines), pytrace=False)


def test_expected_failures_name_real_cases() -> None:
    """Every entry of the expected-failure file names a case that exists (no stale typos)."""
    keys = {c.key for c in CASES}
    assert sorted(EXPECTED.keys() - keys) == []
    names = {op_name(op) for op in op_db}
    assert sorted(set(UNDEFINED) - names) == []
    assert all(not c.reason.startswith("UNEXAMINED") for c in EXPECTED.causes)


@pytest.mark.parametrize("dtype", FLOAT64)
def test_float64_is_refused_with_a_clear_error(dtype: torch.dtype) -> None:
    """float64 and complex128 samples are not run: lazy mode refuses them, as MPS does."""
    host = torch.ones(3, dtype=dtype)
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        host.to("ipu")
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        torch.zeros(3, dtype=dtype, device="ipu")
    ipu = torch.ones(3, dtype=torch.complex64 if dtype.is_complex else torch.float32,
                     device="ipu")
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        ipu.to(dtype)
    with pytest.raises(TypeError, match="IPUs have no 64-bit floating point"):
        ipu.sum(dtype=dtype)
