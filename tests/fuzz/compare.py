"""Compares what a program did on the ipu with what it did on the CPU.

* Errors: where the CPU raises, the ipu raises the same exception type at the same line;
  where it does not, neither does the ipu (except float64, which the ipu refuses with a
  TypeError).
* After every line, every live tensor's metadata (shape, dtype, strides, offset,
  contiguity, autograd flags, storage size): a later ``.view()`` or ``as_strided`` depends
  on them.
* Values read on the host in the middle (sync points), every tensor at the end, and the
  leaves' gradients, with the dtype's tolerance (``torch.testing.assert_close``); undefined
  values (random ones) by shape and dtype only.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict, Optional, Sequence, Set

import torch

from .interpreter import Meta, Trace
from .ops import Line


class Mismatch(AssertionError):
    """The ipu did something the CPU did not; the message holds the program."""

    def __init__(self, label: str, lines: Sequence[Line], step: Optional[int], what: str,
                 source: str) -> None:
        self.label = label
        self.op = lines[step].op if step is not None else "end"
        where = f"line {step} `{lines[step].code}`" if step is not None else "the end"
        super().__init__(f"{label}: at {where} ({self.op}): {what}\n\nprogram:\n{source}")
        self.what = what


def _error_name(e: Optional[BaseException]) -> str:
    return "no error" if e is None else f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def _value_difference(cpu: Any, ipu: Any, undefined: bool, exact: bool) -> Optional[str]:
    if isinstance(cpu, BaseException):  # reading it raises on the CPU too (an invalid view)
        return None if type(ipu) is type(cpu) else \
            f"the cpu raised {_error_name(cpu)} reading it, the ipu {_error_name(ipu)}"
    if isinstance(ipu, BaseException):
        return f"reading it raised {_error_name(ipu)}"
    if cpu is None or ipu is None:
        return None if cpu is None and ipu is None else f"cpu {cpu!r}, ipu {ipu!r}"
    if cpu.shape != ipu.shape or cpu.dtype != ipu.dtype:
        return f"cpu {cpu.dtype}{list(cpu.shape)}, ipu {ipu.dtype}{list(ipu.shape)}"
    if undefined:
        return None
    try:
        tolerance = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(ipu, cpu, equal_nan=True, **tolerance)
    except AssertionError as e:
        return f"values differ: {e}"
    return None


def _meta_difference(cpu: Meta, ipu: Optional[Meta]) -> Optional[str]:
    if ipu is None:
        return "missing on the ipu"
    diffs = [f"{f.name} cpu {getattr(cpu, f.name)} ipu {getattr(ipu, f.name)}"
             for f in fields(Meta) if getattr(cpu, f.name) != getattr(ipu, f.name)]
    return "; ".join(diffs) or None


def compare(cpu: Trace, ipu: Trace, lines: Sequence[Line], label: str, source: str,
            exact: bool = False, upto: Optional[int] = None) -> None:
    """Raises Mismatch at the first difference of `ipu` from `cpu` (with `exact`, values
    must be bitwise equal, undefined ones included: two ipu runs of one seed). With `upto`,
    only the lines before it are compared, and not the end."""
    def fail(step: Optional[int], what: str) -> None:
        raise Mismatch(label, lines, step, what, source)

    for i, (rc, ri) in enumerate(zip(cpu.records[:upto], ipu.records)):
        refused = cpu.device == "cpu" and rc.error is None and lines[i].ipu_refuses
        expected = lines[i].ipu_refuses if refused else \
            (type(rc.error) if rc.error is not None else None)
        if refused and ri.error is not None and "64" not in str(ri.error):
            fail(i, f"the ipu's refusal does not name float64: {_error_name(ri.error)}")
        if expected is None and ri.error is not None:
            fail(i, f"the ipu raised {_error_name(ri.error)}; the cpu did not")
        if expected is not None and type(ri.error) is not expected:
            fail(i, f"the cpu raised {_error_name(rc.error)} (expected {expected.__name__}"
                 f" on the ipu); the ipu raised {_error_name(ri.error)}")
        diff = _value_difference(rc.read, ri.read, rc.read_undefined and not exact, exact)
        if diff:
            fail(i, f"the value read on the host: {diff}")
        for name, meta in rc.metas.items():
            diff = _meta_difference(meta, ri.metas.get(name))
            if diff:
                fail(i, f"{name}: {diff}")
    if upto is not None:
        return
    for name, value in cpu.values.items():
        diff = _value_difference(value, ipu.values.get(name),
                                 name in cpu.undefined and not exact, exact)
        if diff:
            fail(None, f"{name} at the end: {diff}")
    for name, grad in cpu.grads.items():
        diff = _value_difference(grad, ipu.grads.get(name), cpu.grads_undefined and not exact,
                                 exact)
        if diff:
            fail(None, f"{name}.grad: {diff}")


def compare_values(cpu: Dict[str, Any], ipu: Dict[str, Any], undefined: Set[str],
                   lines: Sequence[Line], label: str, source: str) -> None:
    """Raises Mismatch at the first value of `ipu` that differs from the CPU's (by name;
    `undefined` ones by shape and dtype only)."""
    for name, value in cpu.items():
        diff = _value_difference(value, ipu.get(name), name in undefined, False)
        if diff:
            raise Mismatch(label, lines, None, f"{name}: {diff}", source)
