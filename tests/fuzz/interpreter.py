"""Runs a program's lines on one device and records what can be observed.

A run executes the lines in one namespace (tensors ``t0, t1...``, python scalars read from
the device ``s0, s1...``, ``dev``, ``rnd``). After every line it records the error the line
raised (if any), the value it read on the host (sync points), and the metadata of every live
tensor, which needs no sync: shapes, strides, dtypes, offsets. At the end it reads every
tensor's values and the leaves' gradients.

On the CPU a run also works out which values are *undefined*: results of random ops, and
anything computed from them or written into their storage (tracked per storage, so a random
write into a view makes its base undefined too). Those are compared by shape and dtype only.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence, Set, Tuple, Union

import torch

import poptorch

from .ops import DTYPE_NAMES, OPS, Chooser, Line, Skip, shape_lit
from .program import InputSpec, Program

_SPECIAL_VALUES = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4])


class Values:
    """The values of program inputs and of the literal operands (``rnd``) of its lines: one
    stream per run and line (``seek``), independent of torch's global generator (random ops
    use that)."""

    def __init__(self, seed: int, device: str) -> None:
        self._seed = seed
        self._generator = torch.Generator().manual_seed(seed)
        self._device = device

    def seek(self, key: int) -> None:
        self._generator.manual_seed(self._seed * 1_000_003 + key)

    def __call__(self, shape: Sequence[int], dtype: torch.dtype,
                 special: bool = False) -> torch.Tensor:
        g = self._generator
        if dtype == torch.bool:
            values = torch.rand(shape, generator=g) < 0.5
        elif dtype.is_complex:
            values = (torch.randn(shape, generator=g, dtype=torch.complex64) * 2).to(dtype)
        elif dtype.is_floating_point:
            values = torch.randn(shape, generator=g) * 2
            if special:
                where = torch.rand(shape, generator=g) < 0.2
                pick = torch.randint(0, len(_SPECIAL_VALUES), tuple(shape), generator=g)
                values = torch.where(where, _SPECIAL_VALUES[pick], values)
            values = values.to(dtype)
        elif dtype == torch.uint8:
            values = torch.randint(0, 20, tuple(shape), generator=g, dtype=dtype)
        else:
            values = torch.randint(-9, 10, tuple(shape), generator=g, dtype=dtype)
        return values.to(self._device)


@dataclass(frozen=True)
class Meta:
    """What a tensor shows without a sync. Strides of dims of size 0 or 1 say nothing (the
    CPU's own kernels disagree about them), so they are left out, as in empty tensors."""
    shape: tuple
    dtype: torch.dtype
    strides: tuple
    offset: int
    contiguous: bool
    requires_grad: bool
    is_leaf: Union[bool, str]
    storage_bytes: int
    inference: bool  # made under torch.inference_mode
    conj: bool  # a complex tensor's lazy conjugate bit

    @staticmethod
    def of(t: torch.Tensor) -> "Meta":
        empty = t.numel() == 0
        strides = tuple(None if empty or size <= 1 else stride
                        for size, stride in zip(t.shape, t.stride()))
        try:
            is_leaf = t.is_leaf
        except RuntimeError as e:  # a view autograd has invalidated: reading it raises
            is_leaf = f"raises {str(e)[:40]}"
        return Meta(tuple(t.shape), t.dtype, strides, 0 if empty else t.storage_offset(),
                    t.is_contiguous(), t.requires_grad, is_leaf, t.untyped_storage().nbytes(),
                    t.is_inference(), t.is_conj())


@dataclass
class Record:
    """What one line did."""
    error: Optional[BaseException]
    read: Any  # the host read, as a cpu tensor (None: none, or not comparable)
    read_undefined: bool
    metas: Dict[str, Meta]


@dataclass
class Trace:
    device: str
    records: List[Record] = field(default_factory=list)
    values: Dict[str, Any] = field(default_factory=dict)  # cpu tensor, or the read's error
    grads: Dict[str, Any] = field(default_factory=dict)
    undefined: Set[str] = field(default_factory=set)  # names whose values are undefined
    grads_undefined: bool = False


def _comparable(value: Any, dtype: Optional[torch.dtype]) -> Any:
    """A host read as a cpu tensor (repr strings are not compared: they name the device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, str):
        return None
    if type(value).__module__ == "numpy":
        return torch.from_numpy(value.copy())
    return torch.tensor(value, dtype=dtype)


def _storage_key(t: torch.Tensor) -> Optional[Tuple[int, int]]:
    """Which memory `t` is in: its storage and that storage's bytes (a resize moves them:
    what a later line writes there is new). Only stored with its storage kept alive, so
    that no later allocation can take the key: whether a value counts as undefined, which
    decides what the generator emits, must not depend on the allocator's history (what
    earlier tests of the process left)."""
    storage = t.untyped_storage()
    return (storage._cdata, storage.data_ptr()) if storage.nbytes() else None


class Run:
    """One execution of a program on one device."""

    def __init__(self, device: str, value_seed: int, manual_seed: int,
                 names: Optional[Dict[str, Any]] = None) -> None:
        torch.manual_seed(manual_seed)
        self.device = device
        self.ns: Dict[str, Any] = {"torch": torch, "F": torch.nn.functional,
                                   "poptorch": poptorch, "dev": device,
                                   "rnd": Values(value_seed, device), **(names or {})}
        self.tensors: List[str] = []
        self.scalars: List[str] = []
        self.trace = Trace(device)
        # The key of each storage holding undefined values, and the storage (kept alive).
        self._undefined_storages: Dict[Tuple[int, int], torch.UntypedStorage] = {}
        self._undefined_scalars: Set[str] = set()

    def is_undefined(self, name: str) -> bool:
        if name in self.scalars:
            return name in self._undefined_scalars
        value = self.ns.get(name)
        return isinstance(value, torch.Tensor) and \
            _storage_key(value) in self._undefined_storages

    def execute(self, line: Line, code: Any) -> Record:
        self.ns["rnd"].seek(line.key)
        error: Optional[BaseException] = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(code, self.ns)  # noqa: S102 - the program's own line
        except Exception as e:  # pylint: disable=broad-except
            error = e
        read = self.ns.pop("_read", None)
        if error is None:
            if line.ipu_refuses is not None:  # the CPU computes it; no ipu line may use it
                self.ns.pop(line.result, None)
            elif line.result is not None:
                self.tensors.append(line.result)
            if line.scalar is not None:
                self.scalars.append(line.scalar)
                read = self.ns[line.scalar]
        if error is not None and line.op.startswith("out:"):
            self._forget_storages_of(line.writes)
        undefined = self._track_undefined(line, error)
        record = Record(error, _comparable(read, line.read_dtype) if line.host_read and
                        error is None else None, undefined,
                        {name: Meta.of(self.ns[name]) for name in self.tensors})
        self.trace.records.append(record)
        return record

    def _forget_storages_of(self, names: Sequence[str]) -> None:
        """The CPU resizes an out= tensor before some of its checks (cat's overlap, mean's
        dtype: PyTorch's deprecated resize of a tensor of the wrong shape), so after a refused
        call its shape, and its storage's size that its views show, are an accident of the
        kernel; the ipu checks first. The tensors on that storage are no longer compared
        nor used. A name this replay never defined (its line raised: a shape the values
        decide, as nonzero's) has no storage."""
        storages = {self.ns[name].untyped_storage()._cdata for name in names if name in self.ns}
        self.tensors = [name for name in self.tensors
                        if self.ns[name].untyped_storage()._cdata not in storages]

    def _track_undefined(self, line: Line, error: Optional[BaseException]) -> bool:
        """Whether what the line produced (or read) is undefined; CPU runs only."""
        if self.device != "cpu":
            return False
        if error is not None:  # a failing in-place op may have written part of its target
            undefined = bool(line.writes)
        else:
            undefined = line.random or any(self.is_undefined(n) for n in line.reads) or \
                (line.undefined is not None and line.undefined(self.ns))
        if undefined:
            for name in (*line.writes, line.result):
                value = self.ns.get(name) if name else None
                if isinstance(value, torch.Tensor) and _storage_key(value) is not None:
                    self._undefined_storages[_storage_key(value)] = value.untyped_storage()
            if line.scalar is not None:
                self._undefined_scalars.add(line.scalar)
        return undefined

    def finish(self, leaves: Sequence[str]) -> Trace:
        """Reads every live tensor and the gradients of the leaves."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._read_all(leaves)

    def _read_all(self, leaves: Sequence[str]) -> Trace:
        for name in self.tensors:
            if self.device == "cpu" and self.is_undefined(name):
                self.trace.undefined.add(name)
            try:
                self.trace.values[name] = self.ns[name].detach().cpu()
            except Exception as e:  # pylint: disable=broad-except
                self.trace.values[name] = e
        for name in leaves:
            try:
                grad = self.ns[name].grad
                self.trace.grads[name] = None if grad is None else grad.cpu()
            except Exception as e:  # pylint: disable=broad-except
                self.trace.grads[name] = e
        return self.trace


def input_call(spec: InputSpec) -> str:
    """How an input's values are drawn (``rnd.seek`` to its index first)."""
    special = ", special=True" if spec.special and spec.dtype.is_floating_point else ""
    return f"rnd({shape_lit(spec.shape)}, {DTYPE_NAMES[spec.dtype]}{special})"


def input_line(index: int, spec: InputSpec) -> Line:
    grad = ".requires_grad_()" if spec.requires_grad and spec.dtype.is_floating_point else ""
    return Line(op="input", code=f"t{index} = {input_call(spec)}{grad}", result=f"t{index}",
                key=index)


def backward_line(run: Run) -> Optional[Line]:
    """The loss: the sum of every defined float tensor that requires grad, backward."""
    terms = [n for n in run.tensors if run.ns[n].requires_grad and
             run.ns[n].dtype.is_floating_point and not run.is_undefined(n)]
    if not terms:
        return None
    loss = " + ".join(f"{n}.float().sum()" for n in terms)
    return Line(op="backward", code=f"_loss = {loss}\n_loss.backward()", reads=tuple(terms))


@dataclass
class Resolved:
    """A program turned into lines (on the CPU), with the CPU's trace of that run."""
    lines: List[Line]
    leaves: List[str]  # inputs that require grad
    cpu: Trace
    skipped: List[str]  # ops (and known issues) left out


def resolve(program: Program, value_seed: int, issues: KnownIssues) -> Resolved:
    """Runs the program on the CPU, choosing each step's arguments for the tensors it meets.
    A line that would hit a known issue is left out (and counted)."""
    run = Run("cpu", value_seed, program.seed)
    lines: List[Line] = []
    skipped: List[str] = []
    for i, spec in enumerate(program.inputs):
        lines.append(input_line(i, spec))
        run.execute(lines[-1], compile_line(lines[-1]))
    leaves = [ln.result for ln, spec in zip(lines, program.inputs)
              if spec.requires_grad and spec.dtype.is_floating_point]
    names = len(program.inputs)
    for k, step in enumerate(program.steps):
        chooser = Chooser(step, run.ns, run.tensors, run.scalars, f"t{names}", f"s{k}")
        try:
            line = OPS[step.op](chooser)
        except Skip:
            skipped.append(step.op)
            continue
        line.key = _STEP_KEYS + k
        if (line.value_dependent or line.needs_defined) and \
                any(run.is_undefined(n) for n in line.reads):
            # Its shapes would be random, or its gradients.
            skipped.append(f"{step.op} of undefined values")
            continue
        issue = issues.before(line, run.ns)
        if issue is None:
            record = run.execute(line, compile_line(line))
            issue = issues.raised(line, run.ns, record.error)
            if issue is not None:  # the CPU refused it without side effects: undone
                run.trace.records.pop()
        if issue is not None:
            skipped.append(f"known issue {issue}")
            continue
        lines.append(line)
        names += line.result is not None
    loss = backward_line(run)
    if loss is not None:
        lines.append(loss)
        run.execute(loss, compile_line(loss))
    run.trace.grads_undefined = loss is not None and run.trace.records[-1].read_undefined
    return Resolved(lines, leaves, run.finish(leaves), skipped)


class KnownIssues(Protocol):
    def before(self, line: Line, ns: Dict[str, Any]) -> Optional[str]: ...

    def raised(self, line: Line, ns: Dict[str, Any],
               error: Optional[BaseException]) -> Optional[str]: ...


_STEP_KEYS = 1000  # line keys of steps (inputs are 0, 1, 2)
_COMPILED: Dict[str, Any] = {}


def compile_line(line: Line) -> Any:
    code = _COMPILED.get(line.code)
    if code is None:
        code = _COMPILED[line.code] = compile(line.code, "<fuzz line>", "exec")
    return code


def replay(lines: Sequence[Line], leaves: Sequence[str], device: str, value_seed: int,
           manual_seed: int, names: Optional[Dict[str, Any]] = None) -> Trace:
    """Runs resolved lines again, on any device, with the values of `value_seed` (and
    `names` defined beforehand)."""
    run = Run(device, value_seed, manual_seed, names)
    for line in lines:
        run.execute(line, compile_line(line))
    if lines and lines[-1].op == "backward":
        run.trace.grads_undefined = run.trace.records[-1].read_undefined
    return run.finish(leaves)


def render(lines: Sequence[Line], program: Program, value_seed: int) -> str:
    """The program as Python to paste: run it with dev = "cpu" and dev = "ipu"."""
    head = [f"torch.manual_seed({program.seed})",
            f"rnd = Values(seed={value_seed}, device=dev)  # from tests.fuzz.interpreter"]
    return "\n".join(head + [f"rnd.seek({line.key}); {line.code}" if "rnd(" in line.code
                              else line.code for line in lines])
