"""What a CPU kernel reads from process-wide state at the call, the ipu computes
with the state of the call too, although the captured graph runs later, maybe on
another thread: the default dtype (int / int, an int tensor times a Python float)."""
import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
import torch

import poptorch


def assert_same(expected, actual) -> None:
    """Bitwise, dtypes included (outputs of wrapped models are on the host)."""
    actual = [t.cpu() for t in actual] if isinstance(actual, (tuple, list)) else actual.cpu()
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """The default dtype for the block, float32 again after it."""
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


def captured_under(default: torch.dtype,
                   op: Callable[[str], torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """op("cpu") and op("ipu") called under `default`: the CPU's result, and the ipu's
    still pending (it runs after the default was set back)."""
    with default_dtype(default):
        return op("cpu"), op("ipu")


def on_inputs(case: str) -> Callable[[str], torch.Tensor]:
    return lambda device: CASES[case](*inputs(device))


# Each op computes in torch.get_default_dtype() on the CPU, from integer inputs.
CASES: Dict[str, Callable[..., torch.Tensor]] = {
    "div": lambda a, b, m: a / b,
    "true_divide": lambda a, b, m: torch.true_divide(a, b),
    "div_out": lambda a, b, m: torch.div(a, b, out=torch.empty(a.shape, device=a.device)),
    "sqrt": lambda a, b, m: torch.sqrt(a.abs()),
    "pow_float": lambda a, b, m: torch.pow(a.abs(), 0.5),
    "atan2": lambda a, b, m: torch.atan2(a, b),
    "mul_python_float": lambda a, b, m: a * 0.1,
    "gt_python_float": lambda a, b, m: a > 100.3,
    "where_python_float": lambda a, b, m: torch.where(m, a, 0.1) * 3,
    "bool_div": lambda a, b, m: m / (m | True),
}


def inputs(device: str):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-1000, 1000, (4096,), generator=g)
    b = torch.randint(1, 50, (4096,), generator=g)
    return a.to(device), b.to(device), (a > 0).to(device)


@pytest.mark.parametrize("default", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_op_computes_in_the_default_dtype_of_its_call(case, default):
    """Captured under one default dtype, run after it was set back: the CPU's values."""
    assert_same(*captured_under(default, on_inputs(case)))


def test_a_graph_run_on_another_thread_computes_in_the_default_of_the_call():
    expected, pending = captured_under(torch.bfloat16, on_inputs("div"))
    results = {}
    thread = threading.Thread(target=lambda: results.update(ipu=pending.cpu()))
    thread.start()
    thread.join()
    assert_same(expected, results["ipu"])


def test_one_program_under_two_defaults_gives_each_call_its_own_result():
    """The executable of one default dtype is not reused for the other."""
    for default in (torch.bfloat16, torch.float32, torch.bfloat16, torch.float16):
        assert_same(*captured_under(default, lambda d: (on_inputs("div")(d) + 1).sum()))


class Quotients(torch.nn.Module):
    def forward(self, a, b):
        return a / b, torch.sqrt(a.abs()) * 0.1


def test_an_inference_model_computes_in_the_default_dtype_of_its_compilation():
    a, b, _ = inputs("cpu")
    model = poptorch.inferenceModel(Quotients())
    with default_dtype(torch.bfloat16):
        expected = Quotients()(a, b)
        first = model(a, b)
        second = model(a, b)
    assert_same(expected, first)
    assert_same(expected, second)
    # Called under another default, the static graph would compute in the old one.
    with pytest.raises(poptorch.Error, match=r"torch.float32, but the model was compiled when it was torch.bfloat16"):
        model(a, b)


# No integer input to cast: the dtype and values come from the default of the call.
WITHOUT_INTEGER_INPUTS: Dict[str, Callable[[str], torch.Tensor]] = {
    "where_python_floats": lambda d: torch.where(torch.arange(6, device=d) % 2 == 0, 1.1, 2.7),
    "full": lambda d: torch.full((5,), 1.1, device=d) * 3,
    "arange": lambda d: torch.arange(0., 1., .1, device=d) * 3,
    "linspace": lambda d: torch.linspace(0, 1, 7, device=d) * 3,
}


@pytest.mark.parametrize("case", sorted(WITHOUT_INTEGER_INPUTS))
def test_an_op_without_integer_inputs_computes_in_the_default_of_its_call(case):
    assert_same(*captured_under(torch.bfloat16, WITHOUT_INTEGER_INPUTS[case]))


def near_powers_of_two(device: str, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Integers around 256, 1024 and 2048, where bfloat16 and float16 round."""
    base = torch.tensor([0, 1, 255, 256, 257, 258, 1023, 1024, 1025, 1026, 2049, 2050, 2051])
    return base.to(dtype).to(device)


# An in-place op on an integer (or bool) tensor with a Python float computes in
# the default dtype and writes the tensor's dtype: the tensor cannot be cast in
# place, so the ipu computes the out-of-place op on the cast tensor.
IN_PLACE: Dict[str, Callable[[str], torch.Tensor]] = {
    "lt_": lambda d: near_powers_of_two(d).lt_(256.3),
    "le_": lambda d: near_powers_of_two(d).le_(1024.7),
    "gt_": lambda d: near_powers_of_two(d).gt_(257.2),
    "ge_": lambda d: near_powers_of_two(d).ge_(2050.5),
    "eq_": lambda d: near_powers_of_two(d).eq_(1025.4),
    "ne_": lambda d: near_powers_of_two(d).ne_(2049.3),
    "lt_int32": lambda d: near_powers_of_two(d, torch.int32).lt_(256.3),
    "gt_uint8": lambda d: near_powers_of_two(d, torch.uint8).gt_(254.6),
    "eq_bool": lambda d: (near_powers_of_two(d) > 256).eq_(1.0001),
    "eq_strided_view": lambda d: near_powers_of_two(d)[::3].eq_(1025.4),
    # Not computed in the default dtype: the value is cast to the tensor's.
    "masked_fill_": lambda d: near_powers_of_two(d).masked_fill_(
        near_powers_of_two(d) > 1000, 1001.7),
}


@pytest.mark.parametrize("default", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", sorted(IN_PLACE))
def test_an_in_place_op_on_an_integer_tensor_computes_in_the_default_of_its_call(case, default):
    """Captured under one default, synced under float32: the CPU's values."""
    assert_same(*captured_under(default, IN_PLACE[case]))


def test_an_in_place_comparison_writes_its_view_and_nothing_else():
    def write_the_middle_row(device: str) -> torch.Tensor:
        base = torch.stack([near_powers_of_two(device)] * 3)
        base[1].lt_(256.3)
        return base

    assert_same(*captured_under(torch.bfloat16, write_the_middle_row))


def test_an_in_place_comparison_under_a_float64_default_is_refused():
    """The CPU computes in float64, which the ipu has not: the clear error, at the call."""
    with default_dtype(torch.float64), \
            pytest.raises(RuntimeError, match="cannot hold Double.*torch.set_default_dtype"):
        near_powers_of_two("ipu").lt_(256.3)


# Integer tensors with Python floats compute in the default dtype on the CPU.
OPERATORS: Dict[str, Callable[[torch.Tensor], Any]] = {
    "gt": lambda a: a > 0.5, "lt": lambda a: a < 0.5, "ge": lambda a: a >= 0.5,
    "le": lambda a: a <= 0.5, "eq": lambda a: a == 0.5, "ne": lambda a: a != 0.5,
    "reflected_lt": lambda a: 0.5 < a, "reflected_eq": lambda a: 0.5 == a,
    "add": lambda a: a + 0.5, "reflected_mul": lambda a: 0.5 * a, "div": lambda a: a / 2,
    "method_gt": lambda a: a.gt(0.5),
}


@pytest.mark.parametrize("case", sorted(OPERATORS))
def test_operators_under_a_float64_default_raise_the_clear_error(case):
    """Python's operators turn a TypeError into NotImplemented: `a > 0.5` said
    "'>' not supported between instances of 'Tensor' and 'float'" and `a == 0.5`
    returned False (identity). The refusal is a RuntimeError, which they pass on."""
    a = near_powers_of_two("ipu")
    with default_dtype(torch.float64), \
            pytest.raises(RuntimeError, match="cannot hold Double.*torch.set_default_dtype"):
        OPERATORS[case](a)


def wrapping_pair(device: str, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Integers whose sums, differences and products leave `dtype`'s range."""
    a = torch.tensor([5, 100, 127, 0, 77], dtype=dtype)
    b = torch.tensor([8, 100, 3, 1, 90], dtype=dtype)
    return a.to(device), b.to(device)


def float32_out(device: str) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=device)


# A floating-point out= tensor does not make an op of integer tensors compute in
# the default dtype: it computes in its inputs' dtype, then converts into out=
# (sub of uint8 5 and 8 is 253.0 on the CPU, not -3.0).
INTEGERS_INTO_FLOAT_OUT: Dict[str, Callable[[str], torch.Tensor]] = {
    "sub_uint8": lambda d: torch.sub(*wrapping_pair(d, torch.uint8), out=float32_out(d)),
    "add_int8": lambda d: torch.add(*wrapping_pair(d, torch.int8), out=float32_out(d)),
    "mul_uint8": lambda d: torch.mul(*wrapping_pair(d, torch.uint8), out=float32_out(d)),
    "sub_scalar_uint8": lambda d: torch.sub(wrapping_pair(d, torch.uint8)[0], 9,
                                            out=float32_out(d)),
    "sum_int64": lambda d: torch.sum(near_powers_of_two(d), 0, out=float32_out(d)),
    # These do compute in the default dtype, out= or not.
    "div_uint8": lambda d: torch.div(*wrapping_pair(d, torch.uint8), out=float32_out(d)),
    "gt_python_float": lambda d: torch.gt(near_powers_of_two(d), 256.3, out=float32_out(d)),
}


@pytest.mark.parametrize("default", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(INTEGERS_INTO_FLOAT_OUT))
def test_integer_inputs_into_a_float_out_compute_as_on_the_cpu(case, default):
    assert_same(*captured_under(default, INTEGERS_INTO_FLOAT_OUT[case]))


class QuotientsOrTriple(torch.nn.Module):
    """A value read on the host picks the variant of the step."""

    def forward(self, a, b, flag):
        q = a / b
        if bool(flag.any()):
            q = q * 3
        return q


def test_a_step_captured_again_in_the_replay_computes_in_the_default_of_its_compilation():
    """Variants captured while a call runs (a value read on the host changed
    from one micro-batch to the next) compute in the default dtype of the call,
    which is the compilation's: another default is refused before anything runs."""
    a, b, _ = inputs("cpu")
    a, b = a.repeat(2, 1), b.repeat(2, 1)
    flags = torch.tensor([[0], [1]])
    model = poptorch.inferenceModel(QuotientsOrTriple(), poptorch.Options().deviceIterations(2))
    with default_dtype(torch.bfloat16):
        expected = torch.cat([QuotientsOrTriple()(a[i:i + 1], b[i:i + 1], flags[i])
                              for i in range(2)])
        first = model(a, b, flags)  # the second micro-batch captures a variant
        swapped = model(a.flip(0), b.flip(0), flags.flip(0))
    assert len(model._micro_step) == 2
    assert_same(expected, first)
    assert_same(expected.flip(0), swapped)
    with pytest.raises(poptorch.Error, match=r"torch.float32, but the model was compiled when it was torch.bfloat16"):
        model(a, b, flags)


def test_a_compiled_function_captured_again_computes_in_the_default_of_its_call():
    """torch.compile(backend="ipu"): a graph captured again for another input
    shape (or recompiled by dynamo for another default) computes in the default
    dtype of the call that captured it, as the CPU's does."""
    def quotients(a, b):
        return (a / b) * 0.1

    compiled = torch.compile(quotients, backend="ipu", dynamic=False)
    a, b, _ = inputs("cpu")
    for default in (torch.float32, torch.bfloat16, torch.float16, torch.float32):
        for rows in (a, a[:3]):
            with default_dtype(default):
                expected = quotients(rows, b[:len(rows)])
                got = compiled(rows.to("ipu"), b[:len(rows)].to("ipu"))
            assert_same(expected, got)
