"""Differences from the CPU the fuzzer has found and that are not fixed yet.

Each entry keeps the generator from emitting the lines that hit it (never silently: the
skips are counted in the statistics), says why, and names the regression test in
``tests/test_fuzz_regressions.py`` that reproduces it as a strict expected failure: when the
bug is fixed that test fails (XPASS), and the entry goes.

An entry matches a line before it runs (`hits`, on the CPU tensors it would meet), or after
the CPU refused it (the line is then undone): by the CPU's message (`cpu_raises`, a regular
expression), or because the ipu raises the same error only at the next sync (`deferred`,
found by running the line on ipu copies of its tensors).
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

import poptorch

from .ops import Line


@dataclass(frozen=True)
class KnownIssue:
    reason: str  # what differs, and who is fixing it
    test: str  # a regression test reproducing it
    ops: Tuple[str, ...] = ("",)  # prefixes of the op variants it concerns
    cpu_raises: Optional[str] = None
    deferred: bool = False
    hits: Optional[Callable[[Line, Dict[str, Any]], bool]] = None


KNOWN_ISSUES: Dict[str, KnownIssue] = {
    "errors_deferred_to_the_sync": KnownIssue(
        reason="a check that only the CPU kernel makes, not the Meta kernel (a dtype its "
               "dtype dispatch lacks, index_put_'s dtypes, index_select of a scalar...): the "
               "CPU raises at the call, the ipu the same error only at the next sync (issue 9 "
               "item 11, error placement: being fixed by the helper on errors)",
        test="test_a_dtype_the_kernel_lacks_is_refused_at_the_call", deferred=True),
}


class _IpuCopies:
    """ipu copies of CPU tensors with their sizes, strides and offsets, views of one copy of
    each storage (so overlap and aliasing checks see what the real run sees)."""

    def __init__(self) -> None:
        self._storages: Dict[Tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        key = (value.untyped_storage().data_ptr(), value.dtype)
        if key not in self._storages:
            whole = torch.empty(0, dtype=value.dtype).set_(
                value.untyped_storage(), 0, (value.untyped_storage().nbytes() //
                                             value.element_size(),))
            self._storages[key] = whole.to("ipu")
        whole = self._storages[key]
        if value.requires_grad and not value.is_leaf:
            whole = whole.detach().requires_grad_().clone()
        copy = whole.as_strided(value.shape, value.stride(), value.storage_offset())
        if value.requires_grad and value.is_leaf:
            return copy.detach().requires_grad_()
        return copy


def defers_on_the_ipu(line: Line, ns: Dict[str, Any], error: BaseException) -> bool:
    """Whether `line`, run on ipu copies of its tensors, passes the call and raises `error`'s
    type at the next sync."""
    from .interpreter import Values  # pylint: disable=import-outside-toplevel
    copy = _IpuCopies()
    try:
        scope = {name: copy(value) for name, value in ns.items()}
    except RuntimeError:  # a view autograd has invalidated cannot be copied: no probe
        return False
    scope.update(dev="ipu", rnd=Values(0, "ipu"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(line.code, scope)  # noqa: S102 - the program's own line
    except Exception:  # pylint: disable=broad-except
        drain()  # what the line captured before it raised is not the program's
        return False  # raised at the call (the real run compares the type)
    try:
        poptorch.synchronize()
    except Exception as e:  # pylint: disable=broad-except
        return type(e) is type(error)
    return False


def drain() -> None:
    """Runs what is pending on the ipu, ignoring its error: what a failed check or a probe
    left behind must not be blamed on the next one, nor change its graphs."""
    try:
        poptorch.synchronize()
    except Exception:  # pylint: disable=broad-except
        pass


class Exclusions:
    """The known issues, as the generator consults them."""

    def __init__(self, issues: Dict[str, KnownIssue]) -> None:
        self._issues = issues

    def before(self, line: Line, ns: Dict[str, Any]) -> Optional[str]:
        for name, issue in self._issues.items():
            if issue.hits is not None and line.op.startswith(issue.ops) and \
                    issue.hits(line, ns):
                return name
        return None

    def raised(self, line: Line, ns: Dict[str, Any],
               error: Optional[BaseException]) -> Optional[str]:
        if error is None:
            return None
        for name, issue in self._issues.items():
            if not line.op.startswith(issue.ops):
                continue
            if issue.cpu_raises is not None and re.search(issue.cpu_raises, str(error)):
                return name
            if issue.deferred and defers_on_the_ipu(line, ns, error):
                return name
        return None


EXCLUSIONS = Exclusions(KNOWN_ISSUES)
