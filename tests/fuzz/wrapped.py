"""A fuzzed program through the paths users take to the device, each compared with the CPU.

As a model (``model.py``): under ``poptorch.inferenceModel`` with deviceIterations 1 and
``ITERATIONS`` (each micro-batch its own inputs, sliced from one host batch; a 0-dim input
is seen whole by each), under ``torch.compile(backend="ipu")``, each called twice, the
second time with new input values (the same compiled model); and, when inputs require grad,
as a ``trainingModel`` step (those inputs the parameters, the loss the sum of what requires
grad, SGD) for two steps, whose losses and final parameters must be the CPU's
``torch.optim.SGD``'s. Outputs, and inputs the model changed in place, compare as the lazy
fuzzer's values do (the dtype's tolerance; random values by shape and dtype); a wrapper's
int64 outputs come back as int32, as PopTorch's do. Where the CPU raises for the new values,
the ipu must raise too: never a result.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch

import poptorch

from .compare import Mismatch, compare_values
from .interpreter import Resolved
from .model import ModelProgram, model_program
from .program import Program

ITERATIONS = 2
LEARNING_RATE = 0.1
_MICRO_BATCH_SEEDS = 1 << 20  # value seeds of micro-batches after the first: + j x this
PATHS = ("inferenceModel", "inferenceModel:deviceIterations", "torch.compile",
         "trainingModel")


def check_wrapped(program: Program, resolved: Resolved, value_seeds: Tuple[int, int],
                  ran: Counter, skipped: List[str]) -> None:
    """Runs the program through each wrapped path that applies (counted in `ran`; the
    lines each path's known issues leave out, in `skipped`)."""
    model = model_program(program, resolved, value_seeds[0], "inferenceModel", skipped)
    if model is not None:
        ran["inferenceModel"] += 1
        _check_inference(model, value_seeds, 1)
        if _batchable(model):
            ran["inferenceModel:deviceIterations"] += 1
            _check_inference(model, value_seeds, ITERATIONS)
    model = model_program(program, resolved, value_seeds[0], "torch.compile", skipped)
    if model is not None:
        ran["torch.compile"] += 1
        _check_compiled(model, value_seeds, skipped)
        _check_modes_left(model, "torch.compile(backend='ipu')")
    model = model_program(program, resolved, value_seeds[0], "trainingModel", skipped)
    if model is not None:
        ran["trainingModel"] += 1
        _check_training(model, value_seeds)


def _check_modes_left(model: ModelProgram, label: str) -> None:
    """A call leaves the process's grad modes as it found them (every later program would
    run in them)."""
    if torch.is_inference_mode_enabled() or not torch.is_grad_enabled():
        torch.autograd.grad_mode.set_grad_enabled(True)
        raise _fail(model, label, "inference mode or no_grad left on after the calls")


def _batchable(model: ModelProgram) -> bool:
    """Whether micro-batches can be sliced from one batch: no input empty along dim 0."""
    return all(model.spec(i).shape[:1] != (0,) for i in model.data)


def _fail(model: ModelProgram, label: str, what: str) -> Mismatch:
    return Mismatch(label, model.lines, None, what, model.render(label))


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _expected_int32(values: Dict[str, Any]) -> Dict[str, Any]:
    """What a wrapper returns: int64 as int32 (IPUs have no 64-bit integers)."""
    return {name: v.to(torch.int32) if isinstance(v, torch.Tensor) and v.dtype == torch.int64
            else v for name, v in values.items()}


def _as_tuple(outputs: Any) -> Tuple[Any, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _options() -> poptorch.Options:
    """A wrapper's options. Its ops mixing float16 and float32 compute as PyTorch's do,
    which the CPU's values follow (PopTorch's own default casts to float16: the seeds' rule,
    tested by the half-precision tests)."""
    options = poptorch.Options().showCompilationProgressBar(False)
    options.Precision.halfFloatCasting(poptorch.HalfFloatCastingBehavior.HalfUpcastToFloat)
    return options


def _check_inference(model: ModelProgram, value_seeds: Sequence[int], iterations: int) -> None:
    options = _options().deviceIterations(iterations)
    wrapped = poptorch.inferenceModel(model.model("cpu"), options)
    compiled_shapes: Optional[List[Tuple[int, ...]]] = None
    try:
        for call, value_seed in enumerate(value_seeds):
            seeds = [value_seed + _MICRO_BATCH_SEEDS * j for j in range(iterations)]
            label = f"inferenceModel (deviceIterations {iterations}, call {call + 1}, " \
                f"value seeds {', '.join(map(str, seeds))})"
            batches = [model.inputs(seed) for seed in seeds]
            host = [torch.cat([b[k] for b in batches]) if batches[0][k].dim() else
                    batches[0][k] for k in range(len(model.data))]
            expected_inputs = [x.clone() for x in host]
            reference = _reference_batches(model, expected_inputs, iterations)
            if reference.raised is None:
                compiled_shapes = compiled_shapes or reference.shapes[0]
                if any(shapes != compiled_shapes for shapes in reference.shapes):
                    # Output shapes that the values decide: a static graph cannot give them.
                    _call_raises(model, label, lambda: wrapped(*host), None, poptorch.Error)
                    return
            metrics = poptorch.metrics()
            if not _call_matches(model, label, lambda: wrapped(*host), reference.raised,
                                 reference.outputs, reference.undefined, _expected_int32):
                return
            _check_inputs(model, label, host, expected_inputs, reference.undefined)
            if call:
                _check_no_compile(model, label, metrics)
    finally:
        wrapped.destroy()


@dataclass
class _Reference:
    """The CPU's run of a model on a batch of micro-batches."""
    outputs: Dict[str, Any]  # joined as a wrapper joins them
    undefined: Set[str]
    raised: Optional[BaseException]  # by a line of a micro-batch (then nothing else)
    shapes: List[List[Tuple[int, ...]]]  # of the outputs, per micro-batch


def _reference_batches(model: ModelProgram, batch: Sequence[torch.Tensor],
                       iterations: int) -> _Reference:
    """The CPU's outputs for each micro-batch of `batch`, joined as a wrapper joins them
    (along dim 0; 0-dim ones stacked); `batch` is changed in place as forward changes each
    micro-batch's rows (a 0-dim input as the last micro-batch changes it)."""
    per_iteration, undefined = [], set()
    # Micro-batch j's rows of each input; a 0-dim input is seen whole, with the value
    # the caller passed (what one micro-batch writes into it, the next does not see).
    rows = [[x.tensor_split(iterations)[j] if x.dim() else x for x in batch]
            for j in range(iterations)]
    micro = [[r.clone() for r in rows_j] for rows_j in rows]
    for j in range(iterations):
        # The values in the caller's layout: forward may change a tensor's sizes (t_()).
        as_given = [x.view_as(x) for x in micro[j]]
        trace = model.reference(micro[j], model.program.seed)
        raised = next((r.error for r in trace.records if r.error is not None), None)
        if raised is not None:
            return _Reference({}, set(), raised, [])
        for r, values in zip(rows[j], as_given):
            r.copy_(values)  # a 0-dim input keeps the last micro-batch's write
        per_iteration.append(trace.values)
        undefined |= trace.undefined
    shapes = [[tuple(values[name].shape) for name in model.outputs] for values in per_iteration]
    if iterations == 1 or any(s != shapes[0] for s in shapes):
        return _Reference(per_iteration[0], undefined, None, shapes)
    joined = {}
    for name in model.outputs:
        values = [values[name] for values in per_iteration]
        joined[name] = torch.cat(values) if values[0].dim() else torch.stack(values)
    return _Reference(joined, undefined, None, shapes)


def _outputs(call: Callable[[], Any]) -> Tuple[Optional[List[Any]], Optional[BaseException]]:
    """What a call of a model returned (on the host), or what it raised."""
    try:
        got = _as_tuple(call())
        return [g.cpu() if isinstance(g, torch.Tensor) else g for g in got], None
    except Exception as e:  # pylint: disable=broad-except
        return None, e


def _call_matches(model: ModelProgram, label: str, call: Callable[[], Any],
                  raised: Optional[BaseException], expected: Dict[str, Any],
                  undefined: Set[str],
                  convert: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda v: v) -> bool:
    """Calls the ipu's model: it must raise where the CPU raised, and otherwise return the
    CPU's outputs. False when both raised (the model is not called again)."""
    got, error = _outputs(call)
    return _outputs_match(model, label, got, error, raised, expected, undefined, convert)


def _outputs_match(model: ModelProgram, label: str, got: Optional[List[Any]],
                   error: Optional[BaseException], raised: Optional[BaseException],
                   expected: Dict[str, Any], undefined: Set[str],
                   convert: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda v: v) -> bool:
    if error is not None:
        if raised is not None:
            return False
        raise _fail(model, label, f"the ipu raised {_error(error)}; the cpu did not") from error
    assert got is not None
    if raised is not None:
        raise _fail(model, label, f"the cpu raised {_error(raised)}; the ipu returned")
    if len(got) != len(expected):
        raise _fail(model, label, f"{len(got)} outputs, the cpu {len(expected)}")
    compare_values(convert(expected), dict(zip(expected, got)), undefined, model.lines,
                   label, model.render(label))
    return True


def _check_inputs(model: ModelProgram, label: str, got: Sequence[torch.Tensor],
                  expected: Sequence[torch.Tensor], undefined: Set[str]) -> None:
    """The inputs forward changed in place are changed for the caller, as on the CPU."""
    names = [f"t{i} (the input, after the call)" for i in model.data]
    compare_values(dict(zip(names, expected)), dict(zip(names, [g.cpu() for g in got])),
                   {name for name, i in zip(names, model.data) if f"t{i}" in undefined},
                   model.lines, label, model.render(label))


def _check_no_compile(model: ModelProgram, label: str, before: Dict[str, Any]) -> None:
    """A call with new values of the same shapes runs what the first call compiled, unless
    a value read on the host (a guard) differs."""
    after = poptorch.metrics()
    compiled = after["graphs_compiled"] - before["graphs_compiled"]
    if compiled and after["guard_failures"] == before["guard_failures"]:
        raise _fail(model, label, f"{compiled} graph(s) compiled for new values of the same "
                    "shapes, and no guard failed")


def _check_compiled(model: ModelProgram, value_seeds: Sequence[int],
                    skipped: List[str]) -> None:
    compiled = torch.compile(model.model("ipu", "ipu"), backend="ipu")
    for call, value_seed in enumerate(value_seeds):
        label = f"torch.compile(backend='ipu') (call {call + 1}, value seed {value_seed})"
        inputs = model.inputs(value_seed)
        expected_inputs = [x.clone() for x in inputs]
        trace = model.reference(expected_inputs, model.program.seed)
        raised = next((r.error for r in trace.records if r.error is not None), None)
        on_ipu = [x.to("ipu") for x in inputs]
        got, error = _outputs(lambda: compiled(*on_ipu))
        try:
            if not _outputs_match(model, label, got, error, raised, trace.values,
                                  trace.undefined):
                return
            _check_inputs(model, label, on_ipu, expected_inputs, trace.undefined)
        except Mismatch:
            if raised is None and _aot_eager_gives(model, inputs, got, error, trace.undefined):
                skipped.append("torch.compile: as PyTorch's own aot_eager on the CPU")
                return
            raise


def _aot_eager_gives(model: ModelProgram, inputs: Sequence[torch.Tensor],
                     got: Optional[List[Any]], error: Optional[BaseException],
                     undefined: Set[str]) -> bool:
    """Whether torch.compile on the CPU with PyTorch's own AOTAutograd (backend
    "aot_eager") gives what the ipu gave where eager does not (raises the same, or returns
    the same values): a difference of dynamo's or AOTAutograd's, not the ipu's."""
    cpu = torch.compile(model.model("cpu", "cpu"), backend="aot_eager")
    aot, aot_error = _outputs(lambda: cpu(*[x.clone() for x in inputs]))
    if error is not None or aot_error is not None:
        return type(error) is type(aot_error)
    assert got is not None and aot is not None
    try:
        compare_values(dict(zip(model.outputs, aot)), dict(zip(model.outputs, got)), undefined,
                       model.lines, "", "")
    except Mismatch:
        return False
    return len(aot) == len(got)


def _check_training(model: ModelProgram, value_seeds: Sequence[int]) -> None:
    cpu_model, ipu_model = model.model("cpu"), model.model("cpu")
    cpu_optimizer = torch.optim.SGD(cpu_model.parameters(), lr=LEARNING_RATE)
    training = poptorch.trainingModel(
        ipu_model, _options(), torch.optim.SGD(ipu_model.parameters(), lr=LEARNING_RATE))
    # What each parameter's updates summed: p - lr g rounds at |p| and lr |g|.
    scales = {d.name: torch.zeros(d.value.shape) for d in model.params}
    try:
        for call, value_seed in enumerate(value_seeds):
            label = f"trainingModel with SGD (step {call + 1}, value seed {value_seed})"
            inputs = model.inputs(value_seed)
            torch.manual_seed(model.program.seed)
            cpu_optimizer.zero_grad()
            try:
                loss, scale = cpu_model(*[x.clone() for x in inputs])
                loss.backward()
            except Exception as e:  # pylint: disable=broad-except
                _call_raises(model, label, lambda: training(*inputs), e)
                return
            for d in model.params:
                p = getattr(cpu_model, d.name)
                scales[d.name] += p.detach().float().abs()
                if p.grad is not None:
                    scales[d.name] += LEARNING_RATE * p.grad.float().abs()
            cpu_optimizer.step()
            try:
                got = training(*inputs)[0]
            except Exception as e:  # pylint: disable=broad-except
                raise _fail(model, label, f"the ipu raised {_error(e)}; the cpu did not") from e
            _compare_scaled(model, label, "the loss", loss.detach(), got, scale,
                            _least_precise(model.loss_dtypes))
        label = f"trainingModel with SGD (the parameters after {len(value_seeds)} steps)"
        for d in model.params:
            _compare_scaled(model, label, d.name, getattr(cpu_model, d.name).detach(),
                            getattr(ipu_model, d.name).detach(), scales[d.name], d.value.dtype)
    finally:
        training.destroy()


def _call_raises(model: ModelProgram, label: str, call: Callable[[], Any],
                 raised: Optional[BaseException], expected: type = Exception) -> None:
    """The ipu's model must raise `expected` (the CPU `raised`, or the outputs' shapes
    changed under a static graph)."""
    try:
        call()
    except expected:
        return
    except Exception as e:  # pylint: disable=broad-except
        raise _fail(model, label, f"the ipu raised {_error(e)}, not a "
                    f"{expected.__name__}") from e
    why = f"the cpu raised {_error(raised)}" if raised is not None else \
        "the outputs' shapes differ from the compiled ones"
    raise _fail(model, label, f"{why}; the ipu returned")


# torch.testing.assert_close's default (rtol, atol) of each dtype, as it documents them.
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
               torch.float32: (1.3e-6, 1e-5)}


def _least_precise(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    return max(dtypes, key=lambda dtype: _TOLERANCES[dtype][0])


def _compare_scaled(model: ModelProgram, label: str, name: str, cpu: torch.Tensor,
                    ipu: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
    """Values computed from many roundings (a sum, an update): each element within the
    tolerance of `dtype` (the least precise that went into it) relative to `scale`, the
    magnitude of what was summed, rather than to the result, which cancellation makes
    small. nan where the CPU has nan, infinities equal."""
    if cpu.shape != ipu.shape or cpu.dtype != ipu.dtype:
        raise _fail(model, label, f"{name}: cpu {cpu.dtype}{list(cpu.shape)}, ipu "
                    f"{ipu.dtype}{list(ipu.shape)}")
    rtol, atol = _TOLERANCES[dtype]
    a, b = cpu.float(), ipu.float()
    close = ((a - b).abs() <= atol + rtol * scale) | (a == b) | (a.isnan() & b.isnan())
    if not bool(close.all()):
        where = (~close).nonzero()[0].tolist()
        raise _fail(model, label, f"{name}: at {where} cpu {a[tuple(where)].item()}, ipu "
                    f"{b[tuple(where)].item()} (allowed {atol} + {rtol} x {scale[tuple(where)].item()},"
                    f" {(~close).sum().item()} of {close.numel()} elements differ)")
