"""What a CPU kernel reads from process-wide state at the call, the ipu computes
with the state of the call too, although the captured graph runs later, maybe on
another thread: the default dtype (int / int, an int tensor times a Python float)."""
import threading
from typing import Callable, Dict

import pytest
import torch

import poptorch


def assert_same(expected, actual) -> None:
    """Bitwise, dtypes included (outputs of wrapped models are on the host)."""
    actual = [t.cpu() for t in actual] if isinstance(actual, (tuple, list)) else actual.cpu()
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)

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
    op = CASES[case]
    torch.set_default_dtype(default)
    try:
        expected = op(*inputs("cpu"))
        pending = op(*inputs("ipu"))
    finally:
        torch.set_default_dtype(torch.float32)
    assert_same(expected, pending)


def test_a_graph_run_on_another_thread_computes_in_the_default_of_the_call():
    torch.set_default_dtype(torch.bfloat16)
    try:
        expected = CASES["div"](*inputs("cpu"))
        pending = CASES["div"](*inputs("ipu"))
    finally:
        torch.set_default_dtype(torch.float32)
    results = {}
    thread = threading.Thread(target=lambda: results.update(ipu=pending.cpu()))
    thread.start()
    thread.join()
    assert_same(expected, results["ipu"])


def test_one_program_under_two_defaults_gives_each_call_its_own_result():
    """The executable of one default dtype is not reused for the other."""
    for default in (torch.bfloat16, torch.float32, torch.bfloat16, torch.float16):
        torch.set_default_dtype(default)
        try:
            expected = (CASES["div"](*inputs("cpu")) + 1).sum()
            pending = (CASES["div"](*inputs("ipu")) + 1).sum()
        finally:
            torch.set_default_dtype(torch.float32)
        assert_same(expected, pending)


class Quotients(torch.nn.Module):
    def forward(self, a, b):
        return a / b, torch.sqrt(a.abs()) * 0.1


def test_an_inference_model_computes_in_the_default_dtype_of_its_compilation():
    a, b, _ = inputs("cpu")
    model = poptorch.inferenceModel(Quotients())
    torch.set_default_dtype(torch.bfloat16)
    try:
        expected = Quotients()(a, b)
        first = model(a, b)
        second = model(a, b)
    finally:
        torch.set_default_dtype(torch.float32)
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
    "lt_python_float_in_place": lambda d: torch.tensor([256, 257, 1, 0], device=d).lt_(256.3),
}
OPEN = {
    "lt_python_float_in_place": "an in-place op on an integer tensor with a Python float "
                                "computes in the default dtype of its run: the tensor it writes "
                                "is not cast (docs/testing.md)",
}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=OPEN[c])) if c in OPEN else c
    for c in sorted(WITHOUT_INTEGER_INPUTS)])
def test_an_op_without_integer_inputs_computes_in_the_default_of_its_call(case):
    op = WITHOUT_INTEGER_INPUTS[case]
    torch.set_default_dtype(torch.bfloat16)
    try:
        expected = op("cpu")
        pending = op("ipu")
    finally:
        torch.set_default_dtype(torch.float32)
    assert_same(expected, pending)
