"""A fuzzed program as a model: its lines become an ``nn.Module``'s ``forward``.

The wrapped paths (``poptorch.inferenceModel``, ``trainingModel``, ``torch.compile``) run
a model, not lines: the program's inputs become ``forward``'s arguments (or, for training,
the inputs that require grad become parameters), the literal operands its lines draw
(``rnd(...)``) become buffers that ``forward`` clones (constants of the model: a replay
with new inputs keeps them), and ``forward`` returns every tensor live at its end (for
training: the loss, the sum of those that require grad).

Only lines that make the model a function of its inputs are kept: a line the CPU refused,
one the ipu refuses (float64, which a wrapper demotes instead), autograd calls inside
``forward`` (the wrapper differentiates the step itself), and for training random values
(they would make the parameters undefined); lines that read what a dropped line made are
dropped too. Host reads stay: the wrappers guard them.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from .interpreter import Resolved, Trace, Values, input_call, replay
from .known_issues import EXCLUSIONS
from .ops import Line
from .program import InputSpec, Program

# Autograd inside forward: the wrapper differentiates the step itself.
_AUTOGRAD_OPS = ("backward", "backward_mid")
# Random values would make the trained parameters undefined.
_RANDOM_OPS = ("random", "random_", "reseed")
_LITERAL = re.compile(r"rnd\((\([0-9, ]*\)), (torch\.\w+)\)")
_NAME = re.compile(r"\b[ts]\d+\b")


@dataclass(frozen=True)
class Draw:
    """A tensor the model holds, as the program drew it: ``rnd.seek(key); rnd(...)``."""
    name: str  # the buffer or parameter
    key: int
    call: str  # ``rnd((2, 3), torch.float32)``
    value: torch.Tensor


@dataclass
class ModelProgram:
    """A program's kept lines as a model (see the module's docstring)."""
    program: Program
    training: bool
    lines: List[Line]  # forward's lines; the CPU replays them after `input_lines`
    data: List[int]  # the inputs that are forward's arguments, `t{i}`
    params: List[Draw]  # `p{i}` for the input `t{i}` (training)
    constants: List[Draw]  # the buffers `k{n}`, the literal operands
    outputs: List[str]  # the tensors forward returns (inference), live at its end
    loss_terms: List[str]  # summed into the loss (training)
    loss_dtypes: List[torch.dtype]  # of the loss terms and parameters (training)
    value_seed: int  # that drew the constants and parameters

    @property
    def source(self) -> str:
        args = "".join(f", t{i}" for i in self.data)
        body = [f"t{draw.name[1:]} = self.{draw.name}" for draw in self.params]
        body += [line.code for line in self.lines]
        if self.loss_terms:  # the loss, and the magnitude of what it sums (for tolerances)
            body.append("return " + " + ".join(f"{n}.float().sum()" for n in self.loss_terms)
                        + ", " + " + ".join(f"{n}.detach().float().abs().sum()"
                                            for n in self.loss_terms))
        else:
            body.append(f"return ({''.join(f'{n}, ' for n in self.outputs)})")
        indented = "\n".join("    " + code.replace("\n", "\n    ") for code in body)
        return f"def forward(self{args}):\n{indented}\n"

    def spec(self, i: int) -> InputSpec:
        return self.program.inputs[i]

    def inputs(self, value_seed: int) -> List[torch.Tensor]:
        """forward's arguments, drawn as the program draws its inputs."""
        rnd = Values(value_seed, "cpu")
        values = []
        for i in self.data:
            rnd.seek(i)
            spec = self.spec(i)
            values.append(rnd(spec.shape, spec.dtype, spec.special))
        return values

    def model(self, device: str, factories: Optional[str] = None) -> torch.nn.Module:
        """A fresh model on `device`. Inside its forward, ``dev`` (where factories make
        their tensors) is `factories`: None, the default device, in a model written for the
        CPU (a wrapper makes them on the ipu), "ipu" in one moved there."""
        scope: Dict[str, Any] = {"torch": torch, "F": torch.nn.functional, "dev": factories}
        exec(compile(self.source, "<fuzz model>", "exec"), scope)  # noqa: S102 - our own code
        # A class per program: torch.compile caches its graphs per code object of forward.
        model = type("FuzzModel", (torch.nn.Module,), {"forward": scope["forward"]})()
        for draw in self.constants:
            model.register_buffer(draw.name, draw.value.clone())
        for draw in self.params:
            setattr(model, draw.name, torch.nn.Parameter(draw.value.clone()))
        return model.to(device)

    def reference(self, inputs: Sequence[torch.Tensor], manual_seed: int) -> Trace:
        """The CPU's run of forward on `inputs` (changed in place as forward changes them),
        line by line: what each line raised, and which values are undefined."""
        names = {f"_x{i}": x for i, x in zip(self.data, inputs)}
        names["self"] = self.model("cpu", "cpu")
        first = [Line(op="input", code=f"t{i} = _x{i}", result=f"t{i}") for i in self.data]
        first += [Line(op="input", code=f"t{d.name[1:]} = self.{d.name}", result=f"t{d.name[1:]}")
                  for d in self.params]
        return replay(first + self.lines, [], "cpu", 0, manual_seed, names)

    def render(self, how: str) -> str:
        """Python to paste (with ``from tests.fuzz.interpreter import Values``)."""
        init = [f"rnd = Values(seed={self.value_seed}, device='cpu')"]
        for draw in self.params:
            init.append(f"rnd.seek({draw.key}); self.{draw.name} = "
                        f"torch.nn.Parameter({draw.call})")
        for draw in self.constants:
            init.append(f"rnd.seek({draw.key}); self.register_buffer('{draw.name}', "
                        f"{draw.call})")
        inputs = [f"rnd.seek({i}); t{i} = {input_call(self.spec(i))}" for i in self.data]
        return "\n".join([
            "class Model(torch.nn.Module):", "    def __init__(self):",
            "        super().__init__()", *("        " + line for line in init), "",
            *("    " + line for line in self.source.splitlines()), "",
            "# dev = 'cpu' on the CPU, None for a wrapped model, 'ipu' for a compiled one",
            "# inputs: rnd = Values(seed=<the value seed>, device='cpu')", *inputs,
            f"# called: {how}"])


def _kept_lines(resolved: Resolved, inputs: int, path: str,
                skipped: Optional[List[str]]) -> List[Line]:
    kept: List[Line] = []
    dropped: Set[str] = set()
    training = path == "trainingModel"
    for line, record in zip(resolved.lines[inputs:], resolved.cpu.records[inputs:]):
        uses = (set(line.reads) | set(_NAME.findall(line.code))) - {line.result, line.scalar}
        issue = EXCLUSIONS.in_path(line, path)
        if issue is not None and skipped is not None:
            skipped.append(f"known issue {issue}")
        if record.error is not None or line.ipu_refuses is not None or issue is not None or \
                line.op.split(":")[0] in _AUTOGRAD_OPS or uses & dropped or \
                (training and (line.random or line.undefined is not None or
                               line.op.split(":")[0] in _RANDOM_OPS)):
            dropped.update(name for name in (line.result, line.scalar) if name)
            continue
        kept.append(line)
    return kept


def _with_constants(lines: Sequence[Line], rnd: Values) -> Tuple[List[Line], List[Draw]]:
    """The lines with each literal operand ``rnd(...)`` replaced by a buffer's clone."""
    constants: List[Draw] = []
    out = []
    for line in lines:
        rnd.seek(line.key)

        def constant(match: re.Match) -> str:
            shape = ast.literal_eval(match.group(1))
            dtype = getattr(torch, match.group(2).split(".")[1])
            name = f"k{len(constants)}"
            constants.append(Draw(name, line.key, match.group(0), rnd(shape, dtype)))
            return f"self.{name}.clone()"

        out.append(replace(line, code=_LITERAL.sub(constant, line.code)))
    return out, constants


def model_program(program: Program, resolved: Resolved, value_seed: int, path: str,
                  skipped: Optional[List[str]] = None) -> Optional[ModelProgram]:
    """The program as a model for a wrapped `path` (its known issues left out, and counted
    in `skipped`), or None when no line of it applies (or, for training, no parameter
    reaches the loss)."""
    n = len(program.inputs)
    training = path == "trainingModel"
    lines, constants = _with_constants(_kept_lines(resolved, n, path, skipped),
                                       Values(value_seed, "cpu"))
    if not lines:
        return None
    rnd = Values(value_seed, "cpu")
    params, data = [], []
    for i, spec in enumerate(program.inputs):
        if training and spec.requires_grad and spec.dtype.is_floating_point:
            rnd.seek(i)
            params.append(Draw(f"p{i}", i, input_call(spec),
                               rnd(spec.shape, spec.dtype, spec.special)))
        else:
            data.append(i)
    if training and not params:
        return None
    model = ModelProgram(program, training, lines, data, params, constants, [], [], [],
                         value_seed)
    cpu = model.reference(model.inputs(value_seed), program.seed)
    # Dropped lines change what later ones meet: a refused line leaves the program another.
    if any(record.error is not None for record in cpu.records):
        return None
    model.outputs = list(cpu.values)
    if training:
        if cpu.undefined:
            return None
        metas = cpu.records[-1].metas
        model.loss_terms = [name for name, meta in metas.items()
                            if meta.requires_grad and meta.dtype.is_floating_point]
        if not model.loss_terms:
            return None
        model.loss_dtypes = [metas[n].dtype for n in model.loss_terms] + \
            [p.value.dtype for p in params]
    return model
