"""Runs PyTorch's OpInfo corpus on cpu and ipu and compares the results.

Used by tests/test_opinfo.py; `python tests/opinfo_corpus.py` runs it alone and
prints the report.
"""
from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode

import poptorch  # noqa: F401  (registers the ipu device)

SAMPLES_PER_OP = 4
# Ops whose results are uninitialised memory: only shapes and dtypes compare.
UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                 "new_empty_strided"}


@dataclass
class OpResult:
    name: str
    samples: int = 0
    passed: int = 0
    random: bool = False
    failure: Optional[str] = None


@dataclass
class Report:
    results: List[OpResult] = field(default_factory=list)

    @property
    def counted(self) -> List[OpResult]:
        return [r for r in self.results if r.samples > 0]

    @property
    def pass_rate(self) -> float:
        counted = self.counted
        return sum(r.failure is None for r in counted) / max(1, len(counted))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        failures = [r for r in self.counted if r.failure is not None]
        payload: Dict[str, Any] = {
            "ops_counted": len(self.counted),
            "ops_passed": len(self.counted) - len(failures),
            "pass_rate": self.pass_rate,
            "failures": {r.name: r.failure for r in failures},
            "random_ops_compared_by_shape": sorted(r.name for r in self.counted if r.random),
        }
        path.write_text(json.dumps(payload, indent=2))


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map(v, fn) for v in value]
        return type(value)(mapped) if not hasattr(value, "_fields") else type(value)(*mapped)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _tensors(value: Any) -> List[torch.Tensor]:
    found: List[torch.Tensor] = []
    _map(value, lambda t: found.append(t))
    return found


def _run(op, sample, device: str, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    # Fresh copies: in-place ops must not change the sample for the next run.
    moved = sample.transform(lambda t: t.to(device, copy=True) if isinstance(t, torch.Tensor) else t)
    kwargs = dict(moved.kwargs)
    if "device" in kwargs:  # factories: ask for the device under test
        kwargs["device"] = device
    result = op(moved.input, *moved.args, **kwargs)
    return _map(result, lambda t: t.cpu() if t.device.type == "ipu" else t), _map(
        result, lambda t: t.device.type
    )


def _compare(expected: Any, actual: Any, by_shape: bool) -> None:
    exp, act = _tensors(expected), _tensors(actual)
    assert len(exp) == len(act), f"{len(exp)} tensors expected, got {len(act)}"
    if by_shape:
        for e, a in zip(exp, act):
            assert e.shape == a.shape and e.dtype == a.dtype, f"{e.shape}/{e.dtype} vs {a.shape}/{a.dtype}"
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False)


class _RandomOpDetector(TorchDispatchMode):
    """Notes whether any aten op run under it draws random numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.random |= torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def check_op(op) -> OpResult:
    result = OpResult(op.variant_test_name and f"{op.name}.{op.variant_test_name}" or op.name)
    if torch.float32 not in op.supported_dtypes("cpu"):
        return result
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    except Exception:  # an OpInfo that cannot make samples on this build is not counted
        return result
    for sample in samples[:SAMPLES_PER_OP]:
        detector = _RandomOpDetector()
        try:
            with detector:
                expected, _ = _run(op, sample, "cpu")
        except Exception:
            continue  # the CPU cannot run this sample either: not counted
        random = detector.random or op.name in UNINITIALISED
        result.samples += 1
        result.random |= random
        try:
            actual, devices = _run(op, sample, "ipu")
            _compare(expected, actual, by_shape=random)
            wrong = [d for d in _tensors_devices(devices) if d == "cpu"]
            assert not wrong or not _tensors(expected), "a result came back on the cpu, not the ipu"
            result.passed += 1
        except Exception as error:  # recorded in the report
            lines = traceback.format_exception_only(type(error), error)
            result.failure = lines[-1].strip()[:300]
            break
    return result


def _tensors_devices(devices: Any) -> List[str]:
    if isinstance(devices, str):
        return [devices]
    if isinstance(devices, (list, tuple)):
        return [d for v in devices for d in _tensors_devices(v)]
    if isinstance(devices, dict):
        return [d for v in devices.values() for d in _tensors_devices(v)]
    return []


def run_corpus(ops=None) -> Report:
    report = Report()
    for op in ops if ops is not None else op_db:
        report.results.append(check_op(op))
    return report


if __name__ == "__main__":
    import sys

    names = set(sys.argv[1:])
    report = run_corpus([o for o in op_db if not names or o.name in names])
    out = Path("build/reports/opinfo.json")
    report.write(out)
    data = json.loads(out.read_text())
    for name, failure in data["failures"].items():
        print(f"{name}: {failure}")
    print(f"pass rate {data['pass_rate']:.3f} ({data['ops_passed']}/{data['ops_counted']})")
