"""The differential fuzzer's CI slice (a fixed set of programs), and checks of the checker.

The long run is ``python -m tests.fuzz --minutes 30`` (docs/testing.md).
"""
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings

from fuzz import OP_NAMES, Mismatch, Stats, check_program, programs
from fuzz.compare import compare
from fuzz.interpreter import Meta, Record, Trace, replay
from fuzz.ops import ALL_DTYPES, DTYPE_NAMES, Line
from fuzz.wrapped import PATHS

def _derandomized(examples: int) -> settings:
    """The same programs every run: derandomized, no example database."""
    return settings(derandomize=True, database=None, deadline=None, max_examples=examples,
                    report_multiple_bugs=False, print_blob=False,
                    suppress_health_check=list(HealthCheck))


# About two minutes on a 2-core machine.
CI_SLICE = _derandomized(700)


@pytest.mark.slow
def test_cpu_and_ipu_agree_on_random_programs():
    stats = Stats()

    @CI_SLICE
    @given(programs(OP_NAMES))
    def fuzz(program):
        check_program(program, stats, note)

    fuzz()
    print(stats.summary())
    # The slice exercises every kind of op (each ran without error on the CPU at least once).
    assert set(OP_NAMES) <= stats.entries_ran(), set(OP_NAMES) - stats.entries_ran()


# Short programs (up to 10 steps: dynamo traces about five lines a second), through the
# wrapped paths only; about 40 s on two loaded cores (60 programs, 45 through a wrapper).
WRAPPED_SLICE = _derandomized(60)


@pytest.mark.slow
def test_wrapped_models_agree_with_the_cpu_on_random_programs():
    stats = Stats()

    @WRAPPED_SLICE
    @given(programs(OP_NAMES, chunks=1))
    def fuzz(program):
        check_program(program, stats, note, lazy=False, wrapped=True)

    fuzz()
    print(stats.summary())
    assert set(PATHS) <= set(stats.wrapped), set(PATHS) - set(stats.wrapped)


# ---- the checker catches what it must catch ------------------------------------------------

def _trace(device, error=None, strides=(3, 1), value=None):
    meta = Meta((2, 3), torch.float32, strides, 0, strides == (3, 1), False, True, 24, False,
                False)
    value = torch.zeros(2, 3) if value is None else value
    return Trace(device, [Record(error, None, False, {"t0": meta})], {"t0": value})


LINES = [Line(op="test", code="t0 = ...", result="t0")]


@pytest.mark.parametrize("ipu, what", [
    (_trace("ipu", strides=(1, 2)), "strides cpu (3, 1) ipu (1, 2)"),
    (_trace("ipu", error=RuntimeError("x")), "the ipu raised RuntimeError: x; the cpu did not"),
    (_trace("ipu", value=torch.ones(2, 3)), "values differ"),
    (_trace("ipu", value=RuntimeError("poisoned")), "reading it raised RuntimeError"),
])
def test_a_difference_is_a_mismatch(ipu, what):
    with pytest.raises(Mismatch, match="program:") as raised:
        compare(_trace("cpu"), ipu, LINES, "cpu vs ipu", "the source")
    assert what in str(raised.value)


def test_an_error_must_have_the_cpus_type_at_the_same_line():
    cpu = _trace("cpu", error=IndexError("out of range"))
    compare(cpu, _trace("ipu", error=IndexError("out of range")), LINES, "ok", "")
    with pytest.raises(Mismatch, match="the cpu raised IndexError"):
        compare(cpu, _trace("ipu", error=RuntimeError("other")), LINES, "cpu vs ipu", "")
    with pytest.raises(Mismatch, match="the ipu raised no error"):
        compare(cpu, _trace("ipu"), LINES, "cpu vs ipu", "")


def test_float64_must_be_refused_with_a_type_error():
    lines = [Line(op="float64", code="t0 = ...", result="t0", ipu_refuses=TypeError)]
    refused = _trace("ipu", error=TypeError("IPUs have no 64-bit floating point"))
    compare(_trace("cpu"), refused, lines, "ok", "")
    with pytest.raises(Mismatch, match="the ipu raised no error"):
        compare(_trace("cpu"), _trace("ipu"), lines, "cpu vs ipu", "")


def test_an_out_tensor_a_refused_call_resized_on_the_cpu_is_not_compared():
    # The CPU resizes cat's out= tensor before it refuses the overlap; the ipu refuses first.
    lines = [Line(op="input", code="t0 = rnd((1,), torch.float32)", result="t0"),
             Line(op="out:cat:into_live", code="torch.cat([t0, t0], 0, out=t0)",
                  writes=("t0",), key=1000)]
    cpu, ipu = (replay(lines, [], dev, value_seed=0, manual_seed=0) for dev in ("cpu", "ipu"))
    assert [type(r.error) for r in ipu.records] == [type(None), RuntimeError]
    compare(cpu, ipu, lines, "cpu vs ipu", "the source")


def test_every_dtype_type_promotion_makes_has_a_name():
    for a in ALL_DTYPES:
        for b in ALL_DTYPES:
            assert torch.promote_types(a, b) in DTYPE_NAMES  # int8 + uint8 is int16
