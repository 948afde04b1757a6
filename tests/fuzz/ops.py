"""The ops a fuzzed program is made of.

Each entry of ``OPS`` turns one ``Step`` into one line of Python (a ``Line``), choosing its
arguments for the tensors it meets on the CPU (``Chooser``); the same line then runs on
every device. Arguments are mostly valid, so that programs go deep, but not always: an
invalid call is a test too (the ipu must raise what the CPU raises, at the same step).

What a line may never contain is a value the CPU leaves undefined (``torch.empty``,
duplicate indices of a non-accumulating write, an index out of range that only the values
show): index tensors are literals built here, in range and unique where that matters.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .program import Step

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL_DTYPES = (torch.float32, torch.int64, torch.float16, torch.bfloat16, torch.int32,
              torch.bool, torch.int8, torch.uint8)
# Every dtype, also those only type promotion makes (int8 + uint8 is int16).
DTYPE_NAMES = {value: f"torch.{str(value).split('.')[1]}" for value in vars(torch).values()
               if isinstance(value, torch.dtype)}


class Skip(Exception):
    """The step does not apply to the tensors it meets (it is left out of the program)."""


@dataclass
class Line:
    """One statement of a program and what the interpreter needs to know about it."""
    op: str  # entry of OPS, ":" and the variant chosen (for statistics and known issues)
    code: str
    result: Optional[str] = None  # the tensor variable it defines
    scalar: Optional[str] = None  # the Python scalar it defines (a host read)
    reads: Tuple[str, ...] = ()
    writes: Tuple[str, ...] = ()  # tensor variables written in place
    host_read: bool = False  # assigns ``_read`` (or `scalar`), a value read on the host
    read_dtype: Optional[torch.dtype] = None  # the dtype the host read came from
    random: bool = False  # its results are random: compared by shape and dtype only
    # On the CPU namespace after the line ran: whether the values it wrote are undefined
    # (a float -> int cast of an out-of-range value...). Compared by shape and dtype then.
    undefined: Optional[Callable[[Dict[str, object]], bool]] = None
    ipu_refuses: Optional[type] = None  # the CPU runs it, the ipu must raise this
    value_dependent: bool = False  # shapes or control flow depend on values
    # Its reads must have defined values: a gradient accumulated from random values would
    # leave every later gradient of the leaves undefined, unnoticed.
    needs_defined: bool = False
    # Seeds the line's ``rnd`` values: a step keeps its values when others are removed.
    key: int = 0


def shape_lit(shape: Sequence[int]) -> str:
    shape = tuple(shape)
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"


def num_lit(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


def index_lit(values, device: bool = True) -> str:
    """An int64 index tensor (``torch.tensor([])`` would be float32)."""
    on = ", device=dev" if device else ""
    as_tensor = torch.tensor(values, dtype=torch.int64)
    if as_tensor.numel() == 0:
        return f"torch.zeros({shape_lit(as_tensor.shape)}, dtype=torch.int64{on})"
    return f"torch.tensor({values}{on})"


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


def is_int(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and t.dtype != torch.bool


def _satisfies(where: Callable[[torch.Tensor], bool], t: torch.Tensor) -> bool:
    # A view made in inference mode whose base was written since refuses even `.is_leaf`.
    try:
        return where(t)
    except RuntimeError:
        return False


class Chooser:
    """The choices of one step, from its seed; seed 0 makes every first choice."""

    def __init__(self, step: Step, ns: Dict[str, object], tensors: List[str],
                 scalars: List[str], new_name: str, new_scalar: str) -> None:
        self._first = step.choices == 0
        # Also gives the contents of literals (index values, permutations).
        self.rng = random.Random(step.choices)
        self.ns = ns
        self._tensors = tensors
        self._scalars = scalars
        self.new = new_name
        self.new_scalar = new_scalar
        self.reads: List[str] = []

    def int(self, lo: int, hi: int) -> int:
        return lo if self._first or hi <= lo else self.rng.randint(lo, hi)

    def flag(self, one_in: int = 2) -> bool:
        return self.int(0, one_in - 1) == one_in - 1

    def pick(self, options: Sequence):
        return options[self.int(0, len(options) - 1)]

    def tensor(self, where: Callable[[torch.Tensor], bool] = lambda t: True) -> str:
        """A live tensor satisfying `where`, counted back from the newest."""
        candidates = [n for n in self._tensors if _satisfies(where, self.ns[n])]
        if not candidates:
            raise Skip
        name = candidates[-1 - self.int(0, 7) % len(candidates)]
        self.reads.append(name)
        return name

    def has(self, where: Callable[[torch.Tensor], bool]) -> bool:
        """Whether a live tensor satisfies `where` (choosing nothing)."""
        return any(_satisfies(where, self.ns[n]) for n in self._tensors)

    def t(self, name: str) -> torch.Tensor:
        return self.ns[name]

    def dim(self, ndim: int) -> int:
        """A valid dim of a tensor of `ndim` dims, sometimes written negative."""
        if ndim == 0:
            return self.pick((0, -1))
        d = self.int(0, ndim - 1)
        return d - ndim if self.flag(4) else d

    def dims(self, ndim: int) -> Tuple[int, ...]:
        """A few distinct dims (possibly none)."""
        return tuple(sorted(set(self.rng.sample(range(ndim), self.int(0, ndim)))))

    def scalar(self, kind: Optional[str] = None) -> str:
        """A Python scalar: a literal, or a value read from the ipu earlier."""
        if self._scalars and self.flag(3):
            name = self._scalars[-1 - self.int(0, len(self._scalars) - 1)]
            self.reads.append(name)
            return name
        kind = kind or self.pick(("float", "int", "float", "bool"))
        if kind == "int":
            return num_lit(self.pick((2, -1, 0, 3, 7, -4)))
        if kind == "bool":
            return num_lit(self.pick((True, False)))
        return num_lit(self.pick((0.5, -1.5, 2.0, 0.0, 3.25, 1e-3, float("inf"), -0.0)))

    def either(self, *makers: Callable[[], str]) -> str:
        """The result of one of `makers` (only that one consumes choices)."""
        return self.pick(makers)()

    def probe(self, expr: str):
        """Evaluates a side-effect free expression on the CPU tensors (``rnd`` gives ones),
        or None if it raises: to learn a shape or a count while choosing."""
        scope = {"torch": torch, "F": torch.nn.functional, "dev": "cpu",
                 "rnd": lambda shape, dtype: torch.ones(shape, dtype=dtype), **self.ns}
        try:
            return eval(expr, scope)  # noqa: S307 - our own generated code
        except Exception:  # pylint: disable=broad-except
            return None

    def dtype(self, pool: Sequence[torch.dtype] = ALL_DTYPES) -> torch.dtype:
        return self.pick(pool)

    def rnd(self, shape: Sequence[int], dtype: torch.dtype) -> str:
        """Values drawn at run time from the run's value stream (so a replay gets new ones)."""
        return f"rnd({shape_lit(shape)}, {DTYPE_NAMES[dtype]})"

    def host_scalar_tensor(self) -> str:
        """A 0-dim cpu tensor: mixes with ipu tensors the way a python scalar does."""
        return self.pick(("torch.tensor(1.5)", "torch.tensor(2)", "torch.tensor(True)",
                          "torch.tensor(-0.25, dtype=torch.float16)"))

    def line(self, op: str, code: str, **kwargs) -> Line:
        kwargs.setdefault("reads", tuple(self.reads))
        return Line(op=op, code=code, **kwargs)

    def assign(self, op: str, expr: str, **kwargs) -> Line:
        return self.line(op, f"{self.new} = {expr}", result=self.new, **kwargs)


OPS: Dict[str, Callable[[Chooser], Line]] = {}


def op(name: str):
    def register(resolve: Callable[[Chooser], Line]) -> Callable[[Chooser], Line]:
        OPS[name] = resolve
        return resolve
    return register


# ---- shapes -------------------------------------------------------------------------------

def reshape_target(c: Chooser, numel: int) -> List[int]:
    """A shape of `numel` elements, sometimes with a -1."""
    rank = c.int(0, 4)
    if numel == 0:
        shape = [c.int(0, 3) for _ in range(max(rank, 1))]
        shape[c.int(0, len(shape) - 1)] = 0
        return shape
    shape, left = [], numel
    for _ in range(max(rank - 1, 0)):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        shape.append(c.pick(divisors))
        left //= shape[-1]
    if rank > 0 or left != 1:
        shape.append(left)
    if shape and c.flag(3):
        shape[c.int(0, len(shape) - 1)] = -1
    return shape


def broadcastable_to(c: Chooser, shape: Sequence[int]) -> List[int]:
    """A shape that broadcasts to `shape` (drops leading dims, turns some dims into 1)."""
    out = list(shape)[c.int(0, len(shape)):] if c.flag(3) else list(shape)
    return [1 if c.flag(3) else s for s in out]


def broadcast_partner(c: Chooser, shape: Sequence[int]) -> List[int]:
    """A shape that broadcasts with `shape` (the result may be larger than both)."""
    out = broadcastable_to(c, shape)
    out = [c.int(2, 3) if s == 1 and c.flag(3) else s for s in out]
    if c.flag(4):
        out = [c.int(1, 3)] + out
    return out


def broadcasts(a: Sequence[int], b: Sequence[int]) -> bool:
    try:
        torch.broadcast_shapes(tuple(a), tuple(b))
        return True
    except RuntimeError:
        return False


def basic_index(c: Chooser, shape: Sequence[int]) -> str:
    """A basic index (ints, slices with steps, None, Ellipsis) valid for `shape`."""
    parts, ellipsis = [], False
    for size in shape[:c.int(0, len(shape))]:
        kind = c.int(0, 4)
        if kind == 0 and size > 0:
            parts.append(str(c.int(-size, size - 1)))
        elif kind == 1 and not ellipsis:
            parts.append("...")
            ellipsis = True
            break
        elif kind == 2:
            parts.append("None")
            parts.append(":")
        else:
            start = c.int(-size - 1, size) if c.flag() else None
            stop = c.int(-size - 1, size + 1) if c.flag() else None
            step = c.int(1, 3) if c.flag() else None
            text = f"{'' if start is None else start}:{'' if stop is None else stop}"
            parts.append(text + ("" if step is None else f":{step}"))
    if not parts:
        return ":" if shape else "..."
    return ", ".join(parts)


def int_index(c: Chooser, size: int, count: int, unique: bool) -> List[int]:
    """`count` indices into a dim of `size` (negative ones too), distinct if `unique`."""
    if unique:
        positions = c.rng.sample(range(size), min(count, size))
    else:
        positions = [c.rng.randrange(size) for _ in range(count)] if size else []
    return [p - size if c.rng.random() < 0.25 else p for p in positions]


# ---- views --------------------------------------------------------------------------------

@op("view")
def _view(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    if c.flag(6):  # reinterpret the bytes as another dtype of the same size
        same_size = {torch.float32: torch.int32, torch.int32: torch.float32,
                     torch.float16: torch.bfloat16, torch.bfloat16: torch.float16,
                     torch.int8: torch.uint8, torch.uint8: torch.int8}
        if t.dtype not in same_size:
            raise Skip
        return c.assign("view:dtype", f"{x}.view({DTYPE_NAMES[same_size[t.dtype]]})")
    return c.assign("view:shape", f"{x}.view({shape_lit(reshape_target(c, t.numel()))})")


@op("reshape")
def _reshape(c: Chooser) -> Line:
    x = c.tensor()
    shape = shape_lit(reshape_target(c, c.t(x).numel()))
    form = c.pick((f"{x}.reshape({shape})", f"torch.reshape({x}, {shape})",
                   f"{x}.flatten({c.dim(c.t(x).dim())})", f"{x}.view_as({x})",
                   f"{x}.ravel()"))
    return c.assign("reshape", form)


@op("transpose")
def _transpose(c: Chooser) -> Line:
    x = c.tensor()
    n = c.t(x).dim()
    kind = c.int(0, 4)
    if kind == 0:
        return c.assign("transpose:t", f"{x}.t()")  # refused above 2 dims, as on the CPU
    if kind == 1:
        return c.assign("transpose:mT", f"{x}.mT")
    if kind == 2:
        perm = list(range(n))
        c.rng.shuffle(perm)
        return c.assign("transpose:permute", f"{x}.permute({shape_lit(perm)})")
    if kind == 3:
        return c.assign("transpose:movedim", f"{x}.movedim({c.dim(n)}, {c.dim(n)})")
    return c.assign("transpose:transpose", f"{x}.transpose({c.dim(n)}, {c.dim(n)})")


@op("narrow")
def _narrow(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    d = c.dim(t.dim())
    size = t.shape[d]
    start = c.int(0, size)
    length = c.int(0, size - start)
    if c.flag(5):
        start -= size
    return c.assign("narrow", f"{x}.narrow({d}, {start}, {length})")


@op("select")
def _select(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    d = c.dim(t.dim())
    size = t.shape[d]
    return c.assign("select", f"{x}.select({d}, {c.int(-size, max(size - 1, 0))})")


@op("getitem")
def _getitem(c: Chooser) -> Line:
    x = c.tensor()
    return c.assign("getitem:basic", f"{x}[{basic_index(c, c.t(x).shape)}]")


@op("expand")
def _expand(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    if c.flag(5):
        others = c.tensor(lambda u: broadcasts(u.shape, t.shape))
        return c.assign("expand:as", f"{x}.expand_as({others})")
    sizes = [c.int(0, 3) if s == 1 else (-1 if c.flag() else s) for s in t.shape]
    sizes = [c.int(1, 3) for _ in range(c.int(0, 2) if c.flag() else 0)] + sizes
    return c.assign("expand:sizes", f"{x}.expand({shape_lit(sizes)})")


@op("squeeze")
def _squeeze(c: Chooser) -> Line:
    x = c.tensor()
    n = c.t(x).dim()
    kind = c.int(0, 3)
    if kind == 0:
        return c.assign("squeeze:unsqueeze", f"{x}.unsqueeze({c.int(-n - 1, n)})")
    if kind == 1:
        return c.assign("squeeze:all", f"{x}.squeeze()")
    if kind == 2:
        return c.assign("squeeze:dim", f"{x}.squeeze({c.dim(n)})")
    return c.assign("squeeze:dims", f"{x}.squeeze({shape_lit(c.dims(n))})")


@op("diagonal")
def _diagonal(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() >= 2)
    n = c.t(x).dim()
    d1 = c.dim(n)
    d2 = c.dim(n)
    return c.assign("diagonal", f"{x}.diagonal({c.int(-3, 3)}, {d1}, {d2})")


@op("as_strided")
def _as_strided(c: Chooser) -> Line:
    """A view anywhere inside the storage (never beyond its end)."""
    x = c.tensor()
    t = c.t(x)
    capacity = t.untyped_storage().nbytes() // t.element_size()
    if capacity == 0:
        raise Skip
    sizes = [c.int(0, 4) for _ in range(c.int(0, 3))]
    strides = [c.int(0, 3) for _ in sizes]
    reach = sum((s - 1) * st for s, st in zip(sizes, strides) if s > 0)
    if 0 in sizes:
        reach = 0
    if reach >= capacity:
        raise Skip
    offset = c.int(0, capacity - 1 - reach)
    return c.assign("as_strided",
                    f"{x}.as_strided({shape_lit(sizes)}, {shape_lit(strides)}, {offset})")


@op("unfold")
def _unfold(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    d = c.dim(t.dim())
    size = t.shape[d] if t.dim() else 1
    return c.assign("unfold", f"{x}.unfold({d}, {c.int(0, size)}, {c.int(1, 3)})")


@op("split")
def _split(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    d = c.dim(t.dim())
    size = t.shape[d]
    kind = c.pick(("split", "chunk", "unbind", "split_sizes", "tensor_split"))
    cut = c.int(0, size)
    call = {"split": f"{x}.split({c.int(1, 3)}, {d})", "chunk": f"{x}.chunk({c.int(1, 4)}, {d})",
            "unbind": f"{x}.unbind({d})", "split_sizes": f"{x}.split([{cut}, {size - cut}], {d})",
            "tensor_split": f"torch.tensor_split({x}, {c.int(1, 4)}, {d})"}[kind]
    count = len(c.probe(call) or ())
    # Indexing an empty tuple raises IndexError on both devices: a fine check too.
    piece = c.int(-count, count - 1) if count else 0
    return c.assign(f"split:{kind}", f"{call}[{piece}]")


@op("copying_view")
def _copying_view(c: Chooser) -> Line:
    x = c.tensor()
    form = c.pick(("detach", "contiguous", "clone", "clone_preserve", "clone_contiguous",
                   "alias"))
    code = {"detach": f"{x}.detach()", "contiguous": f"{x}.contiguous()",
            "clone": f"{x}.clone()", "clone_preserve": f"{x}.clone(memory_format="
            "torch.preserve_format)", "clone_contiguous": f"{x}.clone(memory_format="
            "torch.contiguous_format)", "alias": f"torch.ops.aten.alias({x})"}[form]
    return c.assign(f"copying_view:{form}", code)


# ---- in-place ops -------------------------------------------------------------------------

def _operand_for(c: Chooser, target: torch.Tensor, float_only: bool = False) -> str:
    """Something to combine into `target` in place: a tensor that broadcasts to it, a
    python scalar, a 0-dim cpu tensor, or another live tensor."""
    kind = c.int(0, 4)
    if kind == 0:
        return c.scalar("float" if float_only else None)
    if kind == 1:
        return c.host_scalar_tensor()
    if kind == 2:
        return c.tensor(lambda u: broadcasts(u.shape, target.shape)
                        and torch.broadcast_shapes(u.shape, target.shape) == target.shape)
    dtype = c.pick((target.dtype, c.dtype(FLOAT_DTYPES if float_only else ALL_DTYPES)))
    return c.rnd(broadcastable_to(c, target.shape), dtype)


@op("inplace_binary")
def _inplace_binary(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    name = c.pick(("add_", "sub_", "mul_", "div_", "maximum", "pow_", "lerp_", "addcmul_",
                   "bitwise_or_", "atan2_"))
    other = _operand_for(c, t)
    if name == "maximum":
        other = c.tensor(lambda u: u.dtype == t.dtype and broadcasts(u.shape, t.shape))
        return c.line("inplace_binary:maximum", f"torch.maximum({x}, {other}, out={x})",
                      writes=(x,))
    if name == "add_" and c.flag():
        code = f"{x}.add_({other}, alpha={c.pick((2, -1, 0.5))})"
    elif name == "pow_":
        code = f"{x}.pow_({c.pick((2, 0.5, 3, -1))})"
    elif name == "lerp_":
        code = f"{x}.lerp_({c.rnd(broadcastable_to(c, t.shape), t.dtype)}, {c.scalar('float')})"
    elif name == "addcmul_":
        code = f"{x}.addcmul_({other}, {c.rnd(broadcastable_to(c, t.shape), t.dtype)}, " \
               f"value={c.pick((1, -2, 0.5))})"
    else:
        code = f"{x}.{name}({other})"
    return c.line(f"inplace_binary:{name}", code, writes=(x,))


UNARY_INPLACE = ("neg_", "abs_", "relu_", "sigmoid_", "exp_", "sqrt_", "floor_", "tanh_",
                 "sin_", "round_", "reciprocal_", "bitwise_not_", "logical_not_",
                 "nan_to_num_", "square_", "sign_", "trunc_", "clamp_min_(0.5)", "log1p_",
                 "clamp_max_(0)", "F.relu_", "F.elu_", "F.hardtanh_", "F.leaky_relu_")


@op("inplace_unary")
def _inplace_unary(c: Chooser) -> Line:
    x = c.tensor()
    name = c.pick(UNARY_INPLACE)
    if name.startswith("F."):
        code = f"{name}({x})"
    elif "(" in name:
        code = f"{x}.{name}"
    else:
        code = f"{x}.{name}()"
    return c.line(f"inplace_unary:{name.split('(')[0]}", code, writes=(x,))


@op("inplace_meta")
def _inplace_meta(c: Chooser) -> Line:
    """In-place ops that change a tensor's sizes and strides, not its values."""
    x = c.tensor()
    n = c.t(x).dim()
    kind = c.pick(("transpose_", "unsqueeze_", "squeeze_", "t_", "swapdims_", "detach_"))
    args = {"transpose_": f"{c.dim(n)}, {c.dim(n)}", "unsqueeze_": f"{c.int(-n - 1, n)}",
            "squeeze_": "", "t_": "", "swapdims_": f"{c.dim(n)}, {c.dim(n)}",
            "detach_": ""}[kind]
    return c.line(f"inplace_meta:{kind}", f"{x}.{kind}({args})", writes=(x,))


@op("clamp_")
def _clamp(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    kind = c.int(0, 2)
    if kind == 0:
        code = f"{x}.clamp_({c.scalar()}, {c.scalar()})"
    elif kind == 1:
        code = f"{x}.clamp_(min={c.scalar()})"
    else:
        code = f"{x}.clamp_({c.rnd(broadcastable_to(c, t.shape), t.dtype)}, " \
               f"{c.rnd(broadcastable_to(c, t.shape), t.dtype)})"
    return c.line("clamp_", code, writes=(x,))


@op("copy_")
def _copy(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    kind = c.int(0, 3)
    if kind == 0:
        src = c.tensor(lambda u: broadcasts(u.shape, t.shape))
    elif kind == 1:
        src = c.host_scalar_tensor()
    elif kind == 2:  # a cpu tensor of the full shape: a host -> device copy into a view
        src = f"{c.rnd(broadcastable_to(c, t.shape), c.dtype())}.cpu()"
    else:
        src = c.rnd(broadcastable_to(c, t.shape), c.dtype())
    return c.line("copy_", f"{x}.copy_({src})", writes=(x,))


@op("fill_")
def _fill(c: Chooser) -> Line:
    x = c.tensor()
    kind = c.int(0, 2)
    if kind == 0:
        return c.line("fill_:zero_", f"{x}.zero_()", writes=(x,))
    if kind == 1:
        return c.line("fill_:scalar", f"{x}.fill_({c.scalar()})", writes=(x,))
    value = c.pick(("torch.tensor(2.5)", f"{c.tensor(lambda u: u.dim() == 0)}"))
    return c.line("fill_:tensor", f"{x}.fill_({value})", writes=(x,))


@op("index_add_")
def _index_add(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    d = c.dim(t.dim())
    size = t.shape[d] if t.dim() else 1
    kind = c.pick(("index_add_", "index_copy_", "index_fill_"))
    index = int_index(c, size, c.int(0, size + 2), unique=kind != "index_add_")
    index = [i % size for i in index] if kind != "index_fill_" else index
    source_shape = list(t.shape)
    if t.dim():
        source_shape[d] = len(index)
    source = c.rnd(source_shape, c.dtype() if c.flag(6) else t.dtype)
    if kind == "index_add_":
        alpha = f", alpha={c.pick((2, -1))}" if c.flag() else ""
        code = f"{x}.index_add_({d}, {index_lit(index)}, {source}{alpha})"
    elif kind == "index_copy_":
        code = f"{x}.index_copy_({d}, {index_lit(index)}, {source})"
    else:
        code = f"{x}.index_fill_({d}, {index_lit(index)}, {c.scalar()})"
    return c.line(f"index_add_:{kind}", code, writes=(x,))


def _mask_for(c: Chooser, shape: Sequence[int]) -> str:
    """A bool mask that broadcasts to `shape`: a comparison of a live tensor, or values."""
    if c.flag():
        other = c.tensor(lambda u: broadcasts(u.shape, shape)
                         and torch.broadcast_shapes(u.shape, shape) == tuple(shape))
        return f"({other} > 0)"
    return c.rnd(broadcastable_to(c, shape), torch.bool)


@op("masked_fill_")
def _masked_fill(c: Chooser) -> Line:
    x = c.tensor()
    mask = _mask_for(c, c.t(x).shape)
    value = c.host_scalar_tensor() if c.flag(4) else c.scalar()
    if c.flag(4):
        return c.assign("masked_fill_:functional", f"{x}.masked_fill({mask}, {value})")
    return c.line("masked_fill_", f"{x}.masked_fill_({mask}, {value})", writes=(x,))


@op("scatter_")
def _scatter(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    d = c.dim(t.dim()) % t.dim()
    kind = c.pick(("scatter_", "scatter_value", "scatter_add_", "scatter_reduce_",
                   "scatter_functional"))
    # The index is at most the target's size in every dim; along `d` its values are in
    # range, and distinct within a column unless the write accumulates (order independent).
    shape = [c.int(0, s) for s in t.shape]
    accumulate = kind in ("scatter_add_", "scatter_reduce_")
    moved = torch.zeros([*shape[:d], *shape[d + 1:], shape[d]], dtype=torch.int64)
    if moved.numel():
        for row in moved.view(-1, shape[d]):
            row.copy_(torch.tensor([v % t.shape[d] for v in
                                    int_index(c, t.shape[d], shape[d], unique=not accumulate)]))
    index = index_lit(moved.movedim(-1, d).tolist())
    src = c.rnd([s + c.int(0, 1) for s in shape], t.dtype)
    if kind == "scatter_value":
        code = f"{x}.scatter_({d}, {index}, {c.scalar()})"
    elif kind == "scatter_reduce_":
        reduce = c.pick(("sum", "prod", "amax", "amin", "mean"))
        code = f"{x}.scatter_reduce_({d}, {index}, {src}, {reduce!r}, include_self={c.flag()})"
    elif kind == "scatter_functional":
        return c.assign("scatter_:functional", f"torch.scatter({x}, {d}, {index}, {src})")
    else:
        code = f"{x}.{kind}({d}, {index}, {src})"
    return c.line(f"scatter_:{kind}", code, writes=(x,))


def _advanced_index(c: Chooser, shape: Sequence[int], unique: bool) -> Tuple[str, str]:
    """An advanced index for `shape` and what kind it is: int tensors (several broadcast
    together, with slices or Ellipsis around them), a python list, or a bool mask."""
    kind = c.pick(("int", "int_dim1", "two_ints", "list", "mask", "uint8_mask", "cpu_int"))
    if not shape:
        kind = "mask"
    if kind in ("mask", "uint8_mask"):
        k = c.int(1, len(shape)) if shape else 0
        mask = c.rnd(shape[:k], torch.bool)
        return (f"{mask}.to(torch.uint8)" if kind == "uint8_mask" else mask), kind
    if kind == "int_dim1" and len(shape) >= 2:
        last = c.flag()  # `...` indexes the last dim, `:` dim 1
        idx = int_index(c, shape[-1 if last else 1], c.int(1, 3), unique)
        return f"{'...' if last else ':'}, {index_lit(idx)}", kind
    if kind == "two_ints" and len(shape) >= 2:
        count = c.int(1, 3)
        flat = int_index(c, shape[0] * shape[1], count, unique)
        rows = [(p % (shape[0] * shape[1])) // shape[1] for p in flat]
        cols = [(p % (shape[0] * shape[1])) % shape[1] for p in flat]
        return f"{index_lit(rows)}, {index_lit(cols)}", kind
    if shape[0] == 0:
        raise Skip
    idx = int_index(c, shape[0], c.int(1, 4), unique)
    if kind == "list":
        return f"{idx}", kind
    if kind == "cpu_int":  # a cpu index into an ipu tensor, which PyTorch allows
        return index_lit(idx, device=False), kind
    if c.flag(3) and not unique:  # a 2-D index tensor
        return index_lit([idx, idx[::-1]]), "int2d"
    return index_lit(idx), "int"


@op("setitem")
def _setitem(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    if c.flag():
        index, kind = _advanced_index(c, t.shape, unique=True)
    else:
        index, kind = basic_index(c, t.shape), "basic"
    if "mask" in kind:  # how many elements a mask selects depends on its values
        value = c.either(c.scalar, c.host_scalar_tensor)
    else:
        selected = c.probe(f"{x}[{index}]")
        target_shape = selected.shape if selected is not None else t.shape
        value = c.either(c.scalar, c.host_scalar_tensor,
                         lambda: c.rnd(broadcastable_to(c, target_shape), c.dtype()))
    return c.line(f"setitem:{kind}", f"{x}[{index}] = {value}", writes=(x,),
                  value_dependent="mask" in kind)


@op("index_put_")
def _index_put(c: Chooser) -> Line:
    x = c.tensor(lambda t: t.dim() > 0)
    t = c.t(x)
    accumulate = c.flag()
    count = c.int(1, 4)
    dims = c.int(1, min(2, t.dim()))
    flat_size = math.prod(t.shape[:dims])
    if flat_size == 0:
        raise Skip
    flat = int_index(c, flat_size, count, unique=not accumulate)
    indices = []
    for d in range(dims):
        inner = math.prod(t.shape[d + 1:dims])
        indices.append(index_lit([(p % flat_size) // inner % t.shape[d] for p in flat]))
    value_shape = [len(flat)] + list(t.shape[dims:])
    value = c.rnd(broadcastable_to(c, value_shape), t.dtype)
    code = f"{x}.index_put_(({', '.join(indices)},), {value}, accumulate={accumulate})"
    return c.line("index_put_", code, writes=(x,))


# ---- out= ---------------------------------------------------------------------------------

def _out_tensor(c: Chooser, dtype: torch.dtype, input_: Optional[torch.Tensor] = None,
                result_shape: Optional[Sequence[int]] = None) -> Tuple[str, str]:
    """Where an out= result goes: a fresh empty tensor (then it is the result), or a live
    tensor (possibly a view, of another shape or dtype: it is resized, or refused). With
    `input_`, a live tensor sharing its storage is not chosen: a kernel that is not pointwise
    reads that input resized under it (the CPU's result is undefined; the ipu refuses the call,
    tests/test_fuzz_regressions.py). A pointwise kernel (`result_shape` given) only when the
    result resizes it: the resized tensor may then share bytes with the input in another order
    (the CPU's result depends on its loop's order; the ipu refuses the call)."""
    if c.flag():
        return f"torch.empty(0, dtype={DTYPE_NAMES[dtype]}, device=dev)", "fresh"
    if input_ is None:
        return c.tensor(), "live"
    storage = input_.untyped_storage().data_ptr()
    shape = None if result_shape is None else tuple(result_shape)
    return c.tensor(lambda o: o.untyped_storage().data_ptr() != storage or
                    (shape is not None and tuple(o.shape) == shape)), "live"


POINTWISE_OUT = ("add", "mul", "abs", "neg", "exp", "where", "clamp")


@op("out")
def _out(c: Chooser) -> Line:
    a = c.tensor()
    t = c.t(a)
    kind = c.pick(("add", "mul", "abs", "neg", "sum", "amax", "mean", "matmul", "cat", "where",
                   "clamp", "exp", "cumsum", "index_select", "arange", "linspace", "sort"))
    partner = broadcast_partner(c, t.shape) if kind in ("add", "mul") else None
    # An empty dimension does not broadcast with a longer one: the CPU raises, any out= will do.
    result_shape = t.shape if partner is None or not broadcasts(t.shape, partner) else \
        torch.broadcast_shapes(t.shape, partner)
    out, where = _out_tensor(c, t.dtype if kind not in ("arange", "linspace") else
                             torch.float32,
                             t if kind in ("sum", "amax", "mean", "matmul", "cumsum") +
                             POINTWISE_OUT else None,
                             result_shape if kind in POINTWISE_OUT else None)
    d = c.dim(t.dim())
    if kind in ("add", "mul"):
        call = f"torch.{kind}({a}, {c.rnd(partner, t.dtype)}, out={{}})"
    elif kind in ("abs", "neg", "exp"):
        call = f"torch.{kind}({a}, out={{}})"
    elif kind in ("sum", "amax", "mean"):
        call = f"torch.{kind}({a}, {d}, keepdim={c.flag()}, out={{}})"
    elif kind == "matmul":
        if t.dim() == 0:
            raise Skip
        call = f"torch.matmul({a}, {c.rnd((t.shape[-1], c.int(0, 3)), t.dtype)}, out={{}})"
    elif kind == "cat":
        call = f"torch.cat([{a}, {a}], {d if t.dim() else 0}, out={{}})"
    elif kind == "where":
        call = f"torch.where({_mask_for(c, t.shape)}, {a}, {c.scalar()}, out={{}})"
    elif kind == "clamp":
        call = f"torch.clamp({a}, {c.scalar()}, out={{}})"
    elif kind == "cumsum":
        call = f"torch.cumsum({a}, {d}, out={{}})"
    elif kind == "index_select":
        size = t.shape[d] if t.dim() else 1
        idx = int_index(c, size, c.int(0, 3), unique=False)
        call = f"torch.index_select({a}, {d}, {index_lit([i % size for i in idx])}, out={{}})"
    elif kind == "arange":
        call = f"torch.arange({c.int(0, 6)}, out={{}})"
    elif kind == "linspace":
        call = f"torch.linspace(-1, 1, {c.int(0, 6)}, out={{}})"
    else:  # sort: a tuple of outs, only as fresh tensors
        out = f"(torch.empty(0, dtype={DTYPE_NAMES[t.dtype]}, device=dev), " \
              "torch.empty(0, dtype=torch.int64, device=dev))"
        return c.assign("out:sort", f"torch.sort({a}, dim={d}, stable=True, out={out})"
                        f"[{c.int(0, 1)}]")
    if where == "fresh":
        return c.assign(f"out:{kind}", call.format(out))
    return c.line(f"out:{kind}:into_live", call.format(out), writes=(out,))


# ---- values -------------------------------------------------------------------------------

BINARY = {
    "add": ("torch.add({a}, {b})", "{a} + {b}"), "sub": ("torch.sub({a}, {b})", "{a} - {b}"),
    "mul": ("torch.mul({a}, {b})", "{a} * {b}"), "div": ("torch.div({a}, {b})", "{a} / {b}"),
    "div_trunc": ("torch.div({a}, {b}, rounding_mode='trunc')", None),
    "floor_divide": ("torch.floor_divide({a}, {b})", "{a} // {b}"),
    "remainder": ("torch.remainder({a}, {b})", "{a} % {b}"),
    "fmod": ("torch.fmod({a}, {b})", None), "pow": ("torch.pow({a}, {b})", "{a} ** {b}"),
    "maximum": ("torch.maximum({a}, {b})", None), "minimum": ("torch.minimum({a}, {b})", None),
    "fmax": ("torch.fmax({a}, {b})", None), "atan2": ("torch.atan2({a}, {b})", None),
    "eq": ("torch.eq({a}, {b})", "{a} == {b}"), "ne": ("torch.ne({a}, {b})", "{a} != {b}"),
    "lt": ("torch.lt({a}, {b})", "{a} < {b}"), "ge": ("torch.ge({a}, {b})", "{a} >= {b}"),
    "logical_and": ("torch.logical_and({a}, {b})", None),
    "logical_xor": ("torch.logical_xor({a}, {b})", None),
    "bitwise_and": ("torch.bitwise_and({a}, {b})", "{a} & {b}"),
    "bitwise_or": ("torch.bitwise_or({a}, {b})", "{a} | {b}"),
    "bitwise_xor": ("torch.bitwise_xor({a}, {b})", "{a} ^ {b}"),
    "copysign": ("torch.copysign({a}, {b})", None), "hypot": ("torch.hypot({a}, {b})", None),
    "xlogy": ("torch.xlogy({a}, {b})", None), "rsub": ("torch.rsub({a}, {b})", None),
    "add_alpha": ("torch.add({a}, {b}, alpha=2)", None),
}
# Integer division by a zero element is an error only the values show; these ops get a
# floating point result type, or a non-zero python divisor.
_DIVIDES = ("div_trunc", "floor_divide", "remainder", "fmod")


@op("binary")
def _binary(c: Chooser) -> Line:
    a = c.tensor()
    t = c.t(a)
    name = c.pick(tuple(BINARY))
    functional, operator = BINARY[name]
    kind = c.int(0, 4)
    if kind == 0:
        b = c.scalar()
    elif kind == 1:
        b = c.host_scalar_tensor()
    elif kind == 2:
        b = c.tensor(lambda u: broadcasts(u.shape, t.shape))
    elif kind == 3:
        b = a
    else:
        b = c.rnd(broadcast_partner(c, t.shape), c.pick((t.dtype, c.dtype())))
    if name in _DIVIDES or name == "pow":
        # An integer result: a zero divisor or a negative exponent among the values is an
        # error only the values show. Allowed with a python literal (checked at the call).
        # A scalar read from the ipu earlier is a name: probe() evaluates it in the run's names.
        result = torch.result_type(t, c.probe(b))
        integral = not (result.is_floating_point or result.is_complex)
        literal = kind == 0 and b not in c.ns
        if integral and not (literal and (name == "pow" or c.probe(b) != 0)):
            raise Skip
    if operator and c.flag():
        if kind == 0 and c.flag() and name not in _DIVIDES + ("pow",):  # the scalar on the left (radd, rsub, rpow...)
            return c.assign(f"binary:{name}:reflected", operator.format(a=b, b=a))
        return c.assign(f"binary:{name}:operator", operator.format(a=a, b=b))
    return c.assign(f"binary:{name}", functional.format(a=a, b=b))


UNARY = ("neg", "abs", "sign", "sqrt", "rsqrt", "exp", "expm1", "log", "log2", "log1p", "sin",
         "cos", "tan", "atan", "sinh", "tanh", "sigmoid", "relu", "F.gelu", "F.silu",
         "F.softplus", "F.elu", "F.leaky_relu", "F.hardtanh", "F.mish", "floor", "ceil", "round",
         "trunc", "frac", "reciprocal", "erf", "isnan", "isinf", "isfinite", "signbit",
         "bitwise_not", "logical_not", "nan_to_num", "square", "positive", "deg2rad",
         "clamp_min", "sgn", "angle", "exp2", "lgamma")
# Ops whose derivative formula reads values on the host and branches on them (PyTorch's
# FunctionsManual.cpp): prod and cumprod on whether the input holds zeros (and how many),
# max() and min() of everything on whether the result is nan. A replay whose new values take
# the other branch runs other graphs, which may need compiling.
BACKWARD_BRANCHES = ("prod", "prod_dtype", "cumprod", "max_all", "min_all")
UNARY_DIM = ("softmax", "log_softmax", "cumsum", "cumprod", "logcumsumexp", "cummax", "flip",
             "roll", "sort", "argsort", "topk", "diff", "F.normalize", "tril", "triu", "msort",
             "kthvalue", "renorm")


@op("unary")
def _unary(c: Chooser) -> Line:
    x = c.tensor()
    name = c.pick(UNARY)
    if name == "clamp_min":
        return c.assign("unary:clamp_min", f"torch.clamp_min({x}, {c.scalar()})")
    if name == "round" and c.flag():
        return c.assign("unary:round_decimals", f"torch.round({x}, decimals={c.int(-1, 2)})")
    call = f"{name}({x})" if name.startswith("F.") else f"torch.{name}({x})"
    return c.assign(f"unary:{name}", call)


@op("unary_dim")
def _unary_dim(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    n = t.dim()
    d = c.dim(n)
    name = c.pick(UNARY_DIM)
    size = t.shape[d] if n else 1
    calls = {
        "softmax": f"torch.softmax({x}, {d})", "log_softmax": f"F.log_softmax({x}, {d})",
        "cumsum": f"torch.cumsum({x}, {d})", "cumprod": f"torch.cumprod({x}, {d})",
        "logcumsumexp": f"torch.logcumsumexp({x}, {d})",
        "cummax": f"torch.cummax({x}, {d})[{c.int(0, 1)}]",
        "flip": f"torch.flip({x}, {shape_lit(c.dims(n))})",
        "roll": f"torch.roll({x}, {c.int(-3, 3)}, {d})",
        "sort": f"torch.sort({x}, dim={d}, descending={c.flag()}, stable=True)[{c.int(0, 1)}]",
        "argsort": f"torch.argsort({x}, dim={d}, stable=True)",
        "topk": f"torch.topk({x}, {c.int(0, size)}, {d}, largest={c.flag()})[0]",
        "diff": f"torch.diff({x}, dim={d})",
        "F.normalize": f"F.normalize({x}, dim={d})",
        "tril": f"torch.tril({x}, {c.int(-2, 2)})", "triu": f"torch.triu({x}, {c.int(-2, 2)})",
        "msort": f"torch.msort({x})",
        "kthvalue": f"torch.kthvalue({x}, {c.int(1, max(size, 1))}, {d})[0]",
        "renorm": f"torch.renorm({x}, 2, {d}, 1.0)",
    }
    return c.assign(f"unary_dim:{name}", calls[name],
                    value_dependent=name in BACKWARD_BRANCHES and t.requires_grad)


def _float_to_int_undefined(source: str, dtype: torch.dtype) -> Callable[[Dict], bool]:
    """A float -> integer cast is undefined in C++ for values out of the target's range
    (nan and inf included): the CPU's answer then depends on the kernel's code path."""
    def undefined(ns: Dict) -> bool:
        src = ns[source]
        if not (is_float(src) or src.dtype.is_complex) or dtype.is_floating_point or \
                dtype.is_complex or dtype == torch.bool or src.numel() == 0:
            return False
        info = torch.iinfo(dtype)
        v = (src.detach().real if src.dtype.is_complex else src.detach()).float()
        return bool((~torch.isfinite(v) | (v < info.min) | (v >= info.max + 1)).any())
    return undefined


CASTS = ("to", "float", "half", "bfloat16", "int", "long", "bool", "byte", "char", "type_as",
         "to_other", "to_copy", "type")


@op("cast")
def _cast(c: Chooser) -> Line:
    x = c.tensor()
    kind = c.pick(CASTS)
    method_dtypes = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
                     "int": torch.int32, "long": torch.int64, "bool": torch.bool,
                     "byte": torch.uint8, "char": torch.int8}
    if kind in method_dtypes:
        dtype, code = method_dtypes[kind], f"{x}.{kind}()"
    elif kind in ("type_as", "to_other"):
        other = c.tensor()
        dtype = c.t(other).dtype
        code = f"{x}.type_as({other})" if kind == "type_as" else f"{x}.to({other})"
    else:
        dtype = c.dtype()
        code = {"to": f"{x}.to({DTYPE_NAMES[dtype]})",
                "to_copy": f"{x}.to({DTYPE_NAMES[dtype]}, copy=True)",
                "type": f"{x}.type({DTYPE_NAMES[dtype]})"}[kind]
    return c.assign(f"cast:{kind}", code, undefined=_float_to_int_undefined(x, dtype))


@op("float64")
def _float64(c: Chooser) -> Line:
    """The ipu has no float64: it refuses with a TypeError where the CPU computes."""
    kind = c.pick(("double", "to", "zeros", "tensor", "new_zeros", "full"))
    if kind in ("zeros", "tensor", "full"):
        code = {"zeros": "torch.zeros(2, dtype=torch.float64, device=dev)",
                "tensor": "torch.tensor([1.5], dtype=torch.float64, device=dev)",
                "full": "torch.full((2, 1), 0.5, dtype=torch.float64, device=dev)"}[kind]
    else:
        x = c.tensor()
        code = {"double": f"{x}.double()", "to": f"{x}.to(torch.float64)",
                "new_zeros": f"{x}.new_zeros(3, dtype=torch.float64)"}[kind]
    return c.assign(f"float64:{kind}", code, ipu_refuses=TypeError)


REDUCTIONS_TUPLE_DIMS = ("sum", "nansum", "mean", "nanmean", "amax", "amin", "var", "std",
                         "logsumexp", "count_nonzero", "all", "any", "norm", "var_mean",
                         "std_mean")
REDUCTIONS_ONE_DIM = ("argmax", "argmin", "prod", "max", "min", "median", "aminmax", "mode")
REDUCTIONS_FULL = ("max_all", "min_all", "sum_dtype", "prod_dtype", "mean_dtype")


@op("reduction")
def _reduction(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    n = t.dim()
    name = c.pick(REDUCTIONS_TUPLE_DIMS + REDUCTIONS_ONE_DIM + REDUCTIONS_FULL)
    keepdim = c.flag()
    if name in REDUCTIONS_FULL:
        code = {"max_all": f"{x}.max()", "min_all": f"{x}.min()",
                "sum_dtype": f"{x}.sum(dtype={DTYPE_NAMES[c.dtype()]})",
                "prod_dtype": f"{x}.prod(dtype={DTYPE_NAMES[c.dtype()]})",
                "mean_dtype": f"{x}.mean(dtype={DTYPE_NAMES[c.dtype(FLOAT_DTYPES)]})"}[name]
        return c.assign(f"reduction:{name}", code,
                        value_dependent=name in BACKWARD_BRANCHES and t.requires_grad)
    if name in REDUCTIONS_ONE_DIM:
        d = c.dim(n)
        if name in ("max", "min", "median", "mode"):
            code = f"torch.{name}({x}, {d}, keepdim={keepdim})[{c.int(0, 1)}]"
        elif name == "aminmax":
            code = f"torch.aminmax({x}, dim={d}, keepdim={keepdim})[{c.int(0, 1)}]"
        elif c.flag(4) and name != "prod":
            code = f"torch.{name}({x})"  # over everything
        else:
            code = f"torch.{name}({x}, {d}, keepdim={keepdim})"
        return c.assign(f"reduction:{name}", code,
                        value_dependent=name in BACKWARD_BRANCHES and t.requires_grad)
    form = c.int(0, 2)
    dims = "None" if form == 0 or n == 0 else (str(c.dim(n)) if form == 1 else
                                               shape_lit(c.dims(n)))
    extra = ""
    if name in ("var", "std", "var_mean", "std_mean"):
        extra = f", correction={c.int(0, 2)}"
    if name == "norm":
        return c.assign("reduction:norm", f"torch.norm({x}, {c.pick((2, 1, 'fro'))!r}, "
                        f"dim={dims}, keepdim={keepdim})" if dims != "None" else
                        f"torch.norm({x})")
    if name in ("var_mean", "std_mean"):
        return c.assign(f"reduction:{name}", f"torch.{name}({x}, {dims}{extra}, "
                        f"keepdim={keepdim})[{c.int(0, 1)}]")
    if name == "count_nonzero":
        return c.assign("reduction:count_nonzero",
                        f"torch.count_nonzero({x}, {dims})" if dims != "None" else
                        f"torch.count_nonzero({x})")
    if dims == "None" and name in ("amax", "amin", "logsumexp"):
        dims = "()"
    if dims == "None" and name in ("all", "any"):
        return c.assign(f"reduction:{name}", f"torch.{name}({x})")
    return c.assign(f"reduction:{name}",
                    f"torch.{name}({x}, {dims}{extra}, keepdim={keepdim})")


@op("matmul")
def _matmul(c: Chooser) -> Line:
    a = c.tensor(lambda t: t.dim() >= 1 and (is_float(t) or c.flag(8)))
    t = c.t(a)
    dtype = c.dtype() if c.flag(8) else t.dtype
    k = t.shape[-1]
    m = c.int(0, 3)
    name = c.pick(("matmul", "operator", "mm", "bmm", "mv", "dot", "addmm", "baddbmm",
                   "outer", "linear", "einsum", "tensordot", "addmv", "linear_relu"))
    rnd = c.rnd
    if name in ("matmul", "operator"):
        if t.dim() == 1 or c.flag(4):
            b_shape: List[int] = [k] if c.flag(3) else [k, m]
        else:
            batch = broadcastable_to(c, t.shape[:-2]) if c.flag() else []
            b_shape = batch + [k, m]
        b = rnd(b_shape, dtype)
        return c.assign(f"matmul:{name}", f"torch.matmul({a}, {b})" if name == "matmul"
                        else f"{a} @ {b}")
    if name in ("mm", "addmm", "linear", "linear_relu"):
        if t.dim() != 2 and name in ("mm", "addmm"):
            raise Skip
        w = rnd((k, m), dtype) if name in ("mm", "addmm") else rnd((m, k), dtype)
        bias = rnd([m] if c.flag() else [1, m], dtype)
        if name == "mm":
            return c.assign("matmul:mm", f"torch.mm({a}, {w})")
        if name == "addmm":
            return c.assign("matmul:addmm", f"torch.addmm({bias}, {a}, {w}, beta="
                            f"{c.pick((1, 0.5, 0))}, alpha={c.pick((1, 2))})")
        if name == "linear":
            return c.assign("matmul:linear", f"F.linear({a}, {w}, {rnd([m], dtype)})")
        # the addmm + relu the compiler fuses into one kernel
        return c.assign("matmul:linear_relu", f"torch.relu(F.linear({a}, {w}, "
                        f"{rnd([m], dtype)}))")
    if name in ("bmm", "baddbmm"):
        if t.dim() != 3:
            raise Skip
        b = rnd((t.shape[0], k, m), dtype)
        if name == "bmm":
            return c.assign("matmul:bmm", f"torch.bmm({a}, {b})")
        return c.assign("matmul:baddbmm", f"torch.baddbmm({rnd((1, t.shape[1], m), dtype)}, "
                        f"{a}, {b}, alpha={c.pick((1, 0.5))})")
    if name in ("mv", "addmv"):
        if t.dim() != 2:
            raise Skip
        v = rnd((k,), dtype)
        if name == "mv":
            return c.assign("matmul:mv", f"torch.mv({a}, {v})")
        return c.assign("matmul:addmv", f"torch.addmv({rnd((t.shape[0],), dtype)}, {a}, {v})")
    if name in ("dot", "outer"):
        if t.dim() != 1:
            raise Skip
        other = rnd((k,) if name == "dot" else (m,), dtype)
        return c.assign(f"matmul:{name}", f"torch.{name}({a}, {other})")
    if name == "einsum":
        return c.assign("matmul:einsum", f"torch.einsum('...k,km->...m', {a}, "
                        f"{rnd((k, m), dtype)})")
    return c.assign("matmul:tensordot", f"torch.tensordot({a}, {rnd((k, m), dtype)}, dims=1)")


@op("index")
def _index(c: Chooser) -> Line:
    """Reads through advanced indices: getitem, index_select, gather, take."""
    x = c.tensor()
    t = c.t(x)
    kind = c.pick(("getitem", "index_select", "gather", "take", "take_along_dim"))
    if kind == "getitem":
        index, variant = _advanced_index(c, t.shape, unique=False)
        return c.assign(f"index:getitem_{variant}", f"{x}[{index}]",
                        value_dependent="mask" in variant)
    n = t.dim()
    d = c.dim(n)
    size = t.shape[d] if n else 1
    if size == 0 and kind != "take":
        raise Skip
    if kind == "index_select":
        idx = [i % size for i in int_index(c, size, c.int(0, 4), unique=False)]
        return c.assign("index:index_select", f"torch.index_select({x}, {d}, {index_lit(idx)})")
    if kind == "take":
        if t.numel() == 0:
            raise Skip
        idx = [c.rng.randrange(-t.numel(), t.numel()) for _ in range(c.int(0, 4))]
        return c.assign("index:take", f"torch.take({x}, {index_lit(idx)})")
    shape = [c.int(0, s) if i != (d % max(n, 1)) else c.int(0, 4)
             for i, s in enumerate(t.shape)]
    values = torch.randint(0, size, shape, generator=torch.Generator().manual_seed(
        c.rng.randrange(1 << 30)))
    idx_code = index_lit(values.tolist()) if shape else index_lit(values.item())
    if kind == "gather":
        return c.assign("index:gather", f"torch.gather({x}, {d}, {idx_code})")
    return c.assign("index:take_along_dim", f"torch.take_along_dim({x}, {idx_code}, {d})")


@op("dynamic_shape")
def _dynamic_shape(c: Chooser) -> Line:
    """Ops whose result shape depends on the values (they run on the host on the ipu)."""
    x = c.tensor()
    kind = c.pick(("nonzero", "masked_select", "mask_getitem", "unique", "argwhere",
                   "nonzero_tuple"))
    code = {"nonzero": f"torch.nonzero({x})",
            "masked_select": f"torch.masked_select({x}, {_mask_for(c, c.t(x).shape)})",
            "mask_getitem": f"{x}[{x} > 0]" if c.t(x).dtype != torch.bool else f"{x}[{x}]",
            "unique": f"torch.unique({x}, sorted=True)", "argwhere": f"torch.argwhere({x})",
            "nonzero_tuple": f"torch.nonzero({x}, as_tuple=True)[0]"}[kind]
    return c.assign(f"dynamic_shape:{kind}", code, value_dependent=True)


@op("cat")
def _cat(c: Chooser) -> Line:
    a = c.tensor()
    t = c.t(a)
    n = t.dim()
    stack = c.flag(3)
    d = c.int(-n - 1, n) if stack else c.dim(n)
    parts = [a]
    for _ in range(c.int(0, 2)):
        kind = c.int(0, 2)
        if kind == 0:
            parts.append(a)
        elif kind == 1 and not stack and n:
            shape = list(t.shape)
            shape[d] = c.int(0, 3)
            parts.append(c.rnd(shape, c.pick((t.dtype, c.dtype()))))
        else:
            parts.append(c.tensor(lambda u: u.shape == t.shape or u.dim() == n))
    if stack:
        return c.assign("cat:stack", f"torch.stack([{', '.join(parts)}], {d})")
    return c.assign("cat:cat", f"torch.cat([{', '.join(parts)}], {d})")


@op("where")
def _where(c: Chooser) -> Line:
    a = c.tensor()
    t = c.t(a)
    cond = _mask_for(c, broadcast_partner(c, t.shape)) if c.flag() else f"({a} > 0)"
    other = c.either(c.scalar, lambda: c.rnd(broadcast_partner(c, t.shape), c.dtype()),
                     lambda: c.tensor(lambda u: broadcasts(u.shape, t.shape)))
    if c.flag():
        return c.assign("where:scalar_first", f"torch.where({cond}, {other}, {a})")
    return c.assign("where", f"torch.where({cond}, {a}, {other})")


@op("creation")
def _creation(c: Chooser) -> Line:
    shape = shape_lit([c.int(0, 4) for _ in range(c.int(0, 3))])
    dtype = DTYPE_NAMES[c.dtype()]
    kind = c.pick(("zeros", "ones", "full", "arange", "linspace", "eye", "zeros_like",
                   "full_like", "tensor", "new_ones", "empty_fill", "arange_float"))
    if kind in ("zeros_like", "full_like", "new_ones"):
        x = c.tensor()
        code = {"zeros_like": f"torch.zeros_like({x})",
                "full_like": f"torch.full_like({x}, {c.scalar()})",
                "new_ones": f"{x}.new_ones({shape})"}[kind]
        return c.assign(f"creation:{kind}", code, reads=())
    code = {
        "zeros": f"torch.zeros({shape}, dtype={dtype}, device=dev)",
        "ones": f"torch.ones({shape}, dtype={dtype}, device=dev)",
        "full": f"torch.full({shape}, {c.scalar()}, device=dev)",
        "arange": f"torch.arange({c.int(-2, 2)}, {c.int(0, 8)}, {c.int(1, 3)}, device=dev)",
        "arange_float": f"torch.arange(0.5, {c.int(0, 5)}, 0.75, device=dev)",
        "linspace": f"torch.linspace(-2, 3, {c.int(0, 6)}, device=dev)",
        "eye": f"torch.eye({c.int(0, 4)}, {c.int(0, 4)}, dtype={dtype}, device=dev)",
        "tensor": f"torch.tensor({c.pick(('[1.5, -2.0]', '[[1, 2], [3, 4]]', '3', '[True]'))}"
                  ", device=dev)",
        "empty_fill": f"torch.empty({shape}, dtype={dtype}, device=dev).fill_(1)",
    }[kind]
    return c.assign(f"creation:{kind}", code)


# ---- random -------------------------------------------------------------------------------

@op("random")
def _random(c: Chooser) -> Line:
    shape = shape_lit([c.int(0, 4) for _ in range(c.int(0, 3))])
    kind = c.pick(("rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
                   "randperm", "bernoulli", "multinomial", "normal", "dropout", "rand_half",
                   "dropout_inplace"))
    if kind in ("rand_like", "randn_like", "randint_like", "bernoulli", "dropout",
                "dropout_inplace"):
        x = c.tensor()
        if kind == "dropout_inplace":
            return c.line("random:dropout_inplace", f"F.dropout({x}, 0.5, True, inplace=True)",
                          writes=(x,), random=True)
        code = {"rand_like": f"torch.rand_like({x})", "randn_like": f"torch.randn_like({x})",
                "randint_like": f"torch.randint_like({x}, 5)",
                "bernoulli": f"torch.bernoulli(torch.full_like({x}, 0.5))",
                "dropout": f"F.dropout({x}, {c.pick((0.5, 0.0, 1.0))}, training=True)"}[kind]
        return c.assign(f"random:{kind}", code, random=True)
    code = {
        "rand": f"torch.rand({shape}, device=dev)",
        "randn": f"torch.randn({shape}, device=dev)",
        "randint": f"torch.randint(-3, 7, {shape}, device=dev)",
        "randperm": f"torch.randperm({c.int(0, 6)}, device=dev)",
        "multinomial": f"torch.multinomial(torch.tensor([0.2, 0.3, 0.5], device=dev), "
                       f"{c.int(1, 5)}, replacement=True)",
        "normal": f"torch.normal(2.0, 3.0, {shape}, device=dev)",
        "rand_half": f"torch.rand({shape}, dtype=torch.float16, device=dev)",
    }[kind]
    return c.assign(f"random:{kind}", code, random=True)


@op("random_")
def _random_inplace(c: Chooser) -> Line:
    x = c.tensor()
    kind = c.pick(("uniform_", "normal_", "bernoulli_", "random_", "exponential_",
                   "random_range"))
    args = {"uniform_": "-1, 1", "normal_": "0, 2", "bernoulli_": "0.3", "random_": "0, 5",
            "exponential_": "", "random_range": ""}[kind]
    if kind == "random_range":  # an argument check: from > to is refused at the call
        return c.line("random_:random_range", f"{x}.random_({c.int(0, 6)}, {c.int(0, 6)})",
                      writes=(x,), random=True)
    return c.line(f"random_:{kind}", f"{x}.{kind}({args})", writes=(x,), random=True)


# ---- host reads (sync points) --------------------------------------------------------------

@op("host_read")
def _host_read(c: Chooser) -> Line:
    x = c.tensor()
    t = c.t(x)
    kind = c.pick(("cpu", "item", "tolist", "repr", "synchronize", "numpy", "to_cpu"))
    if kind == "synchronize":
        return c.line("host_read:synchronize", "poptorch.synchronize()", reads=())
    if kind == "item":
        index = ", ".join(str(c.int(0, s - 1)) if s else "0" for s in t.shape)
        element = f"{x}[{index}]" if index else x
        return c.line("host_read:item", f"{c.new_scalar} = {element}.item()",
                      scalar=c.new_scalar, host_read=True, read_dtype=t.dtype)
    # numpy() refuses a conjugate or negative bit. On the CPU run .cpu() is the identity and
    # keeps the bit; every other device's copy to the host resolves it (CUDA's too), so the
    # read resolves it first, as users must.
    code = {"cpu": f"{x}.cpu()", "tolist": f"{x}.tolist()", "repr": f"repr({x})",
            "numpy": f"{x}.detach().cpu().resolve_conj().resolve_neg().numpy()",
            "to_cpu": f"{x}.to('cpu')"}[kind]
    return c.line(f"host_read:{kind}", f"_read = {code}", host_read=True, read_dtype=t.dtype)


@op("branch")
def _branch(c: Chooser) -> Line:
    """Python control flow on a value read from the device."""
    x = c.tensor()
    cond = c.tensor()
    test = f"bool({cond})" if c.flag(4) else f"bool({cond}.float().sum() > 0)"
    return c.assign("branch", f"{x}.add(1) if {test} else {x}.mul(2)", value_dependent=True)


# The ops of the other modules register themselves into OPS.
from . import ops_more, ops_nn, ops_state  # noqa: E402,F401 pylint: disable=wrong-import-position

OP_NAMES: Tuple[str, ...] = tuple(OPS)
