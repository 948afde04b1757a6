"""PyTorch's op corpus (OpInfo) on the ipu: every sample of every op, compared with the CPU.

A *case* is one op (OpInfo name and variant) x one dtype x one direction:

* ``forward``: the op's results on the ipu against the CPU's: values (with PyTorch's default
  tolerance for the dtype, or the op's own ``toleranceOverride``/``precisionOverride`` for
  the CPU where larger), shapes, dtypes, the device, and all strides (also of dims of size
  1 and of empty tensors), which decide whether a later ``.view()`` works and which path
  a later op takes.
* ``backward`` (float32, ops that support autograd): ``torch.autograd.grad`` of the results
  with the same cotangents, on the ipu against the CPU: values, shapes, dtypes and strides.

Random ops (those that call an op tagged ``nondeterministic_seeded``) and the ops listed in
``tests/opinfo_expected_failures.toml`` as undefined on the CPU compare by shape and dtype.
An error the CPU raises must be raised on the ipu, with the same type.

float64 and complex128 are not run: IPUs have no 64-bit floating point, and lazy mode refuses
those dtypes with a TypeError, as PyTorch's MPS backend does. A sample holding such a tensor
is not run; one whose results are float64 on the CPU (``x.double()``, ``dtype=float64``)
must be refused with that TypeError. Ops that compute in float64 internally for float32
results fail with it, and are listed as expected failures for that reason.

``python tests/opinfo_corpus.py [--update] [op ...]`` runs cases outside pytest; ``--update``
rewrites the expected-failure file (see ``opinfo_expected.py``).
"""
from __future__ import annotations

import contextlib
import random
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.testing._comparison import default_tolerances
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import DecorateInfo, OpInfo, SampleInput
from torch.utils._python_dispatch import TorchDispatchMode

import poptorch  # noqa: F401  (registers the ipu device)

# The dtypes run, by the name a case uses. float64 and complex128 are refused by the ipu.
DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
DIRECTIONS = ("forward", "backward")
SEED = 0


def op_name(op: OpInfo) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@dataclass(frozen=True)
class Case:
    op: OpInfo
    dtype: torch.dtype
    direction: str

    @property
    def name(self) -> str:
        return op_name(self.op)

    @property
    def key(self) -> str:
        """How the expected-failure file names the case: "<op> <dtype> <direction>"."""
        return f"{self.name} {DTYPE_NAMES[self.dtype]} {self.direction}"


def cases(ops: Sequence[OpInfo] = op_db) -> Iterator[Case]:
    for op in ops:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES.values():
            if dtype in supported:
                yield Case(op, dtype, "forward")
        if op.supports_autograd and torch.float32 in op.supported_backward_dtypes("cpu"):
            yield Case(op, torch.float32, "backward")


def _seed() -> None:
    # The CPU generator only: torch.manual_seed also seeds every accelerator, which costs
    # more than many samples do.
    torch.random.default_generator.manual_seed(SEED)


def samples(case: Case) -> List[SampleInput]:
    """The case's samples, the same on every run (OpInfo draws them at random). Made by the
    OpInfo's own sample function: OpInfo.sample_inputs also inspects the call stack for the
    test's name, which costs more than running the samples."""
    random.seed(SEED)
    np.random.seed(SEED)
    _seed()
    return list(case.op.sample_inputs_func(case.op, "cpu", case.dtype,
                                           case.direction == "backward"))


# ---------------------------------------------------------------------------------------------
# Running a sample on a device


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map(v, fn) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def tensors_of(value: Any) -> List[torch.Tensor]:
    found: List[torch.Tensor] = []
    _map(value, found.append)
    return found


def copy_to(t: torch.Tensor, device: str) -> torch.Tensor:
    """A copy of `t` on `device` with the same layout: its storage is copied whole and viewed
    with the same sizes, strides and offset, so the op sees the non-contiguous or overlapping
    inputs OpInfo made. A tensor that requires grad becomes a leaf that does."""
    if t.is_conj():
        return copy_to(t.conj(), device).conj()
    if t.is_neg():
        return copy_to(t.resolve_neg(), device)
    storage_numel = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0,
                                                              (storage_numel,))
    base = flat.detach().to(device, copy=True)
    moved = base.as_strided(t.shape, t.stride(), t.storage_offset())
    return moved.requires_grad_(t.requires_grad)


@dataclass
class Inputs:
    """A sample's arguments on one device, and the leaves that require grad."""
    input: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    leaves: List[torch.Tensor]


# Tensor arguments OpInfo makes on the CPU whatever the device under test, because the op
# requires them there: op name -> index in the sample's args.
HOST_ARGUMENTS = {"tensor_split": 0}


def _inputs(case: Case, sample: SampleInput, device: str) -> Inputs:
    leaves: List[torch.Tensor] = []

    def move(t: torch.Tensor) -> torch.Tensor:
        moved = copy_to(t, device)
        if moved.requires_grad:
            leaves.append(moved)
        return moved

    args = [_map(a, move) for a in sample.args]
    host = HOST_ARGUMENTS.get(case.op.name)
    if host is not None and host < len(args) and isinstance(sample.args[host], torch.Tensor):
        args[host] = sample.args[host]
    return Inputs(_map(sample.input, move), _on_device(tuple(args), device),
                  _on_device(_map(dict(sample.kwargs), move), device), leaves)


def _on_device(value: Any, device: str) -> Any:
    """Arguments naming the CPU (factories' `device=`, `.to("cpu")`) name `device` instead."""
    if isinstance(value, torch.device) and value.type == "cpu":
        return torch.device(device)
    if isinstance(value, str) and value == "cpu":
        return device
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        mapped = [_on_device(v, device) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    return value


class _RandomOpDetector(TorchDispatchMode):
    """Notes whether any aten op run under it draws random numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.random = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.random |= torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _cotangents(outputs: List[torch.Tensor]) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in outputs]


def _differentiable(value: Any) -> List[torch.Tensor]:
    return [t for t in tensors_of(value) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


@dataclass
class Run:
    forward: Any  # the op's results
    value: Any  # what is compared: the results (forward) or the leaves' gradients (backward)


def run_sample(case: Case, sample: SampleInput, device: str) -> Run:
    inputs = _inputs(case, sample, device)
    _seed()
    # A factory sample with no device argument makes its result on the default device.
    factory = not tensors_of([sample.input, sample.args, sample.kwargs])
    with torch.device(device) if factory else contextlib.nullcontext():
        result = case.op(inputs.input, *inputs.args, **inputs.kwargs)
    if case.direction == "forward":
        return Run(result, result)
    outputs = _differentiable(sample.output_process_fn_grad(result))
    if not outputs or not inputs.leaves:
        return Run(result, [])
    cotangents = [c.to(device) for c in _cotangents(outputs)]
    return Run(result, torch.autograd.grad(outputs, inputs.leaves, cotangents, allow_unused=True))


def to_host(value: Any) -> Any:
    """`value` with its tensors on the host, in their layout on the device."""
    return _map(value, lambda t: copy_to(t.detach(), "cpu") if t.device.type == "ipu" else t.detach())


# ---------------------------------------------------------------------------------------------
# Comparing


def tolerance(op: OpInfo, dtype: torch.dtype) -> Dict[str, float]:
    """PyTorch's default tolerance for `dtype`, or the op's own where it declares a larger one
    (OpInfo's toleranceOverride and precisionOverride decorators that apply to the CPU)."""
    rtol, atol = default_tolerances(dtype)
    for info in op.decorators:
        if isinstance(info, DecorateInfo):
            if not info.active_if or info.device_type not in (None, "cpu") or (
                    info.dtypes and dtype not in info.dtypes):
                continue
            decorators = info.decorators
        else:
            decorators = [info]
        for decorator in decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                rtol = max(rtol, decorator.d[dtype].rtol)
                atol = max(atol, decorator.d[dtype].atol)
            elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
                atol = max(atol, decorator.d[dtype])
    return {"rtol": rtol, "atol": atol}


def _compared_dtype(sample_dtype: torch.dtype, expected: Any) -> torch.dtype:
    """The dtype whose tolerance applies: the sample's, or for an integer sample whose result
    is floating point (tanh of int64 computes in float32, on the CPU as on the ipu) the
    result's, as torch.testing.assert_close chooses by the result."""
    if sample_dtype.is_floating_point or sample_dtype.is_complex:
        return sample_dtype
    results = tensors_of(expected)
    if results and (results[0].dtype.is_floating_point or results[0].dtype.is_complex):
        return results[0].dtype
    return sample_dtype


def _strides(t: torch.Tensor) -> Tuple[int, ...]:
    return t.stride() if t.layout == torch.strided else ()


def compare_layouts(expected: Any, actual: Any, check_strides: bool) -> None:
    """Raises AssertionError naming the first difference in structure, shapes, dtypes or
    strides between two host results."""
    exp, act = tensors_of(expected), tensors_of(actual)
    if type(expected) is not type(actual) and not (
            isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list))):
        raise AssertionError(f"result is a {type(actual).__name__}, the CPU's a "
                             f"{type(expected).__name__}")
    if len(exp) != len(act):
        raise AssertionError(f"{len(act)} tensors, the CPU gives {len(exp)}")
    for i, (e, a) in enumerate(zip(exp, act)):
        where = f"result {i}" if len(exp) > 1 else "result"
        if e.shape != a.shape or e.dtype != a.dtype:
            raise AssertionError(f"{where}: {tuple(a.shape)} {a.dtype}, the CPU gives "
                                 f"{tuple(e.shape)} {e.dtype}")
        if check_strides and _strides(e) != _strides(a):
            raise AssertionError(f"{where}: strides {a.stride()}, the CPU gives {e.stride()} "
                                 f"(shape {tuple(e.shape)})")


def compare_values(expected: Any, actual: Any, tol: Dict[str, float]) -> None:
    """Raises AssertionError if the values of two host results differ beyond `tol`."""
    if not tensors_of(expected):
        if expected != actual:
            raise AssertionError(f"result {actual!r}, the CPU gives {expected!r}")
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False,
                               check_stride=False, **tol)


# ---------------------------------------------------------------------------------------------
# Running a case

FLOAT64 = (torch.float64, torch.complex128)


@dataclass
class CaseResult:
    samples: int = 0
    failures: Dict[int, str] = field(default_factory=dict)  # sample index -> what went wrong
    float64_samples: int = 0  # float64 or complex128 inputs or results: refused by the ipu
    random: bool = False  # some sample drew random numbers (compared by shape and dtype)


def _error_text(error: BaseException) -> str:
    text = traceback.format_exception_only(type(error), error)[-1].strip()
    return " ".join(text.split())[:400]


@dataclass
class Outcome:
    failure: Optional[str] = None  # what went wrong on the ipu
    random: bool = False  # the sample drew random numbers: compared by shape and dtype
    float64: bool = False  # the sample makes float64: the ipu refused it, as it must


def _is_float64_refusal(error: Exception) -> bool:
    return isinstance(error, TypeError) and "64-bit floating point" in str(error)


def _draws_random_numbers(case: Case, sample: SampleInput) -> bool:
    """Runs the sample on the CPU again, watching for random ops. Only when values differ:
    a Python dispatch mode can change what the CPU computes (linalg_lstsq's residuals)."""
    detector = _RandomOpDetector()
    with detector:
        run_sample(case, sample, "cpu")
    return detector.random


def check_sample(case: Case, sample: SampleInput, undefined: bool) -> Outcome:
    cpu_error: Optional[Exception] = None
    makes_float64 = False
    try:
        cpu = run_sample(case, sample, "cpu")
        expected = to_host(cpu.value)
        makes_float64 = any(t.dtype in FLOAT64 for t in tensors_of(cpu.forward))
    except Exception as error:  # the CPU refuses the sample: the ipu must refuse it too
        cpu_error = error
    outcome = Outcome()
    try:
        result = run_sample(case, sample, "ipu").value
        devices = {t.device.type for t in tensors_of(result)}
        actual = to_host(result)
    except Exception as error:
        if makes_float64 and _is_float64_refusal(error):
            outcome.float64 = True
        elif cpu_error is None or type(error) is not type(cpu_error):
            outcome.failure = _error_text(error)
        return outcome
    if makes_float64:
        outcome.failure = "the result is float64 on the CPU: the ipu must refuse it"
    elif cpu_error is not None:
        outcome.failure = f"no error where the CPU raises {_error_text(cpu_error)}"
    else:
        try:
            if "cpu" in devices:
                raise AssertionError("a result is on the cpu, not the ipu")
            compare_layouts(expected, actual, check_strides=True)
            if not undefined:
                try:
                    compare_values(expected, actual,
                                   tolerance(case.op, _compared_dtype(case.dtype, expected)))
                except AssertionError:
                    # Random ops compare by shape and dtype (done above).
                    outcome.random = _draws_random_numbers(case, sample)
                    if not outcome.random:
                        raise
        except AssertionError as error:
            outcome.failure = " ".join(str(error).split())[:400]
    return outcome


def run_case(case: Case, undefined: bool = False) -> CaseResult:
    """Runs every sample of `case`; `undefined`: the op's CPU values mean nothing (compared by
    shape and dtype). A sample with a float64 or complex128 input is not run (the ipu cannot
    hold it); one whose results are float64 on the CPU must be refused by the ipu."""
    result = CaseResult()
    for index, sample in enumerate(samples(case)):
        result.samples += 1
        if any(t.dtype in FLOAT64 for t in tensors_of([sample.input, sample.args,
                                                       sample.kwargs])):
            result.float64_samples += 1
            continue
        outcome = check_sample(case, sample, undefined)
        result.random |= outcome.random
        result.float64_samples += outcome.float64
        if outcome.failure is not None:
            result.failures[index] = outcome.failure
    return result


def describe(sample: SampleInput) -> str:
    """A short description of a sample, for failure messages."""
    def show(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            layout = "" if value.is_contiguous() else f", stride={tuple(value.stride())}"
            return f"Tensor{list(value.shape)} {str(value.dtype)[6:]}{layout}"
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return "(" + ", ".join(show(v) for v in value) + ")"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
        return repr(value)
    return f"input={show(sample.input)}, args={show(tuple(sample.args))}, " \
           f"kwargs={show(dict(sample.kwargs))}"


# ---------------------------------------------------------------------------------------------
# Command line: run cases, print what fails, optionally rewrite the expected-failure file


def _new_reason(message: str) -> str:
    """The provisional cause of a failure not yet examined: its message, without numbers."""
    import re
    return "UNEXAMINED: " + re.sub(r"[-+]?\d[\d.e+-]*", "N", message)[:160]


def main(argv: Sequence[str]) -> None:
    import argparse
    import time

    from opinfo_expected import ExpectedFailures

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="op names (all if none)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated")
    parser.add_argument("--directions", default=",".join(DIRECTIONS))
    parser.add_argument("--update", action="store_true",
                        help="rewrite tests/opinfo_expected_failures.toml from this run")
    options = parser.parse_args(argv)
    expected = ExpectedFailures.load()
    undefined = expected.undefined_ops()
    chosen = [op for op in op_db if not options.ops or op.name in options.ops
              or op_name(op) in options.ops]
    totals: Dict[str, List[float]] = {}
    for case in cases(chosen):
        if DTYPE_NAMES[case.dtype] not in options.dtypes.split(",") or \
                case.direction not in options.directions.split(","):
            continue
        start = time.perf_counter()
        result = run_case(case, undefined=case.name in undefined)
        total = totals.setdefault(f"{DTYPE_NAMES[case.dtype]} {case.direction}", [0, 0, 0, 0, 0])
        total[0] += 1
        total[1] += result.samples
        total[2] += result.float64_samples
        total[3] += len(result.failures)
        total[4] += time.perf_counter() - start
        listed = expected.expected(case.key, result.samples)
        for index, message in result.failures.items():
            mark = " " if index in listed else "+"
            print(f"{mark} {case.key} sample {index}: {message[:200]}", flush=True)
        for index in sorted(set(listed) - set(result.failures)):
            print(f"- {case.key} sample {index}: passes now", flush=True)
        if options.update:
            expected.updated(case.key, result.samples, result.failures, _new_reason)
    print(f"{'case kind':<20} {'cases':>6} {'samples':>8} {'float64':>8} {'failing':>8} "
          f"{'seconds':>8}")
    for kind, (n, samples_run, f64, failing, seconds) in totals.items():
        print(f"{kind:<20} {n:>6} {samples_run:>8} {f64:>8} {failing:>8} {seconds:>8.1f}")
    if options.update:
        expected.write()


if __name__ == "__main__":
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    main(sys.argv[1:])
