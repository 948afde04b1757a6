"""Errors where the CPU raises them: what only a run can find (an index out of range) is
raised at the first use of a tensor computed from it, with the op named; the tensors that do
not depend on it are computed; nothing reads back uninitialised memory."""
import copy
from typing import Callable

import pytest
import torch

import poptorch
from conftest import run_python


def cpu_error(f: Callable[[str], object]) -> BaseException:
    with pytest.raises(Exception) as info:
        f("cpu")
    return info.value


# Errors the CPU kernel raises from its arguments alone: the ipu raises them at the call too.
ARGUMENT_ERRORS = {
    "elu_ of an expanded tensor": lambda d: torch.nn.functional.elu_(
        torch.ones(1, 3, device=d).expand(3, 3)),
    "mul_ of an expanded tensor": lambda d: torch.ones(1, 3, device=d).expand(3, 3).mul_(2),
    "clamp_ of an expanded tensor": lambda d: torch.ones(1, 3, device=d).expand(3, 3).clamp_(0, 1),
    "add_ of an overlapping view": lambda d: (lambda a: a[1:].add_(a[:-1]))(
        torch.ones(5, device=d)),
    "sigmoid_ of a transposed view of itself": lambda d: (lambda a: a.t().sigmoid_())(
        torch.ones(1, 3, device=d).expand(3, 3)),
    "add out= of a dtype it cannot hold": lambda d: torch.add(
        torch.randn(3, device=d), 1, out=torch.empty(3, dtype=torch.int64, device=d)),
    "mm out= of a dtype it cannot hold": lambda d: torch.mm(
        torch.randn(3, 3, device=d), torch.randn(3, 3, device=d),
        out=torch.empty(3, 3, dtype=torch.int64, device=d)),
    "bmm of mixed dtypes": lambda d: torch.bmm(torch.randn(1, 2, 2, device=d),
                                               torch.randn(1, 2, 2, device=d).half()),
    "topk beyond the size": lambda d: torch.topk(torch.randn(3, device=d), 5),
    "gather with a float index": lambda d: torch.gather(torch.zeros(3, device=d), 0,
                                                        torch.tensor([0.0], device=d)),
    "index_add_ of another dtype": lambda d: torch.zeros(3, device=d).index_add_(
        0, torch.tensor([0], device=d), torch.ones(1, dtype=torch.int64, device=d)),
    # Checks only the CPU kernel makes (PyTorch's Meta kernels skip them): made at the call by
    # running the CPU kernel on stand-ins (csrc/capture/cpu_checks.h).
    "random_ with from >= to": lambda d: torch.zeros(3, device=d).random_(5, 2),
    "rand_like of an integer tensor": lambda d: torch.rand_like(
        torch.ones(3, dtype=torch.int64, device=d)),
    "neg out= of a complex tensor": lambda d: torch.neg(
        torch.ones(2, device=d), out=torch.empty(2, dtype=torch.complex64, device=d)),
    "frexp out= with a float exponent": lambda d: torch.frexp(
        torch.ones(2, device=d), out=(torch.empty(2, device=d), torch.empty(2, device=d))),
    "cat out= into an expanded tensor": lambda d: torch.cat(
        [torch.ones(2, device=d)] * 2, out=torch.zeros(1, device=d).expand(4)),
    "index_fill_ with a complex value": lambda d: torch.zeros(3, 2, device=d).index_fill_(
        0, torch.tensor([1], device=d), 1 + 2j),
    "index_put_ of another dtype": lambda d: torch.zeros(3, dtype=torch.bool, device=d).index_put_(
        (torch.tensor([0, 2], device=d),), torch.ones(2, device=d)),
    "index_put_ with no index on a 0-dim tensor": lambda d: torch.tensor(1.0, device=d).index_put_(
        (), torch.ones(2, device=d)),
    "setitem with a uint8 mask": lambda d: torch.zeros(2, 3, dtype=torch.uint8, device=d).__setitem__(
        torch.tensor([1, 0], dtype=torch.uint8, device=d), 1),
    "index_select of a 0-dim tensor with an empty index": lambda d: torch.index_select(
        torch.tensor(1.5, device=d), 0, torch.zeros(0, dtype=torch.int64, device=d)),
}


@pytest.mark.parametrize("case", ARGUMENT_ERRORS)
def test_an_argument_error_is_raised_at_the_call(case):
    f = ARGUMENT_ERRORS[case]
    expected = cpu_error(f)
    with pytest.raises(type(expected)) as raised:
        f("ipu")
    assert str(raised.value).splitlines()[0] == str(expected).splitlines()[0]
    poptorch.synchronize()  # and nothing deferred either


# Float arguments CPU kernels check, against 0 and 1, each other or the range of a dtype. The
# checks at the call run once per signature in which floats count by that class only (so that a
# new learning rate is not checked again; csrc/capture/float_class.h): each case follows a valid
# call of the same op on the same shapes.
FLOAT_ARGUMENT_ERRORS = {
    "uniform_ with from > to": (lambda d: torch.zeros(3, device=d).uniform_(0.25, 0.5),
                                lambda d: torch.zeros(3, device=d).uniform_(5.0, 2.0)),
    "bernoulli_ with p > 1": (lambda d: torch.zeros(3, device=d).bernoulli_(0.5),
                              lambda d: torch.zeros(3, device=d).bernoulli_(1.5)),
    "normal_ with a negative std": (lambda d: torch.zeros(3, device=d).normal_(0.0, 2.0),
                                    lambda d: torch.zeros(3, device=d).normal_(0.0, -1.0)),
    "fill_ of a half tensor beyond its range": (
        lambda d: torch.zeros(3, dtype=torch.half, device=d).fill_(2.0),
        lambda d: torch.zeros(3, dtype=torch.half, device=d).fill_(1e5)),
    "full of int8 beyond its range": (
        lambda d: torch.full((3,), 2.0, dtype=torch.int8, device=d),
        lambda d: torch.full((3,), 300.0, dtype=torch.int8, device=d)),
    "uniform_ whose to - from is beyond float32's range": (
        lambda d: torch.zeros(3, device=d).uniform_(-3e38, 42.0),
        lambda d: torch.zeros(3, device=d).uniform_(-3e38, 3e38)),
}


@pytest.mark.parametrize("case", FLOAT_ARGUMENT_ERRORS)
def test_a_float_argument_error_is_raised_at_the_call(case):
    valid, invalid = FLOAT_ARGUMENT_ERRORS[case]
    valid("ipu")
    expected = cpu_error(invalid)
    with pytest.raises(type(expected)) as raised:
        invalid("ipu")
    assert str(raised.value).splitlines()[0] == str(expected).splitlines()[0]
    poptorch.synchronize()


def test_a_refused_in_place_call_leaves_its_tensor_as_the_cpu_does():
    def fill(d):
        x = torch.zeros(3, dtype=torch.half, device=d).fill_(2.0)
        with pytest.raises(RuntimeError, match="without overflow"):
            x.fill_(1e5)
        return x

    torch.testing.assert_close(fill("ipu").cpu(), fill("cpu"))


# Calls that checks of the values pass: the CPU kernel's run on stand-ins at the call (all
# zeros, then all ones) must not refuse them; what the values decide is the run's to check.
CHECKED_BY_VALUE = {
    "integer floor_divide": lambda d: torch.tensor([7, -8], device=d) // torch.tensor(
        [2, 3], device=d),
    "integer remainder": lambda d: torch.remainder(torch.tensor([7, -8], device=d),
                                                   torch.tensor([2, 3], device=d)),
    "inverse": lambda d: torch.linalg.inv(torch.tensor([[2.0, 1.0], [1.0, 3.0]], device=d)),
    "cholesky": lambda d: torch.linalg.cholesky(torch.tensor([[2.0, 1.0], [1.0, 3.0]], device=d)),
    "gather of the last element": lambda d: torch.gather(torch.arange(3.0, device=d), 0,
                                                         torch.tensor([2], device=d)),
    "embedding of the second row": lambda d: torch.nn.functional.embedding(
        torch.tensor([1], device=d), torch.arange(4.0, device=d).view(2, 2)),
    "multinomial of one possible outcome": lambda d: torch.multinomial(
        torch.tensor([0.0, 1.0], device=d), 1),
    "lu_unpack's pivots": lambda d: torch.lu_unpack(
        *torch.linalg.lu_factor(torch.tensor([[1.0, 2.0], [3.0, 1.0]], device=d)))[0],
}


@pytest.mark.parametrize("case", CHECKED_BY_VALUE)
def test_a_call_whose_values_pass_the_kernels_checks_is_not_refused(case):
    f = CHECKED_BY_VALUE[case]
    torch.testing.assert_close(f("ipu").cpu(), f("cpu"))


def test_the_checks_at_the_call_draw_no_random_numbers():
    """A random op's stand-in run draws from a generator of its own (or gives the default one
    its state back): the first call of a signature, which is checked, draws what a later one
    does."""
    def draw():
        torch.manual_seed(0)
        x = torch.ones(7, 5, device="ipu")
        results = [torch.nn.functional.dropout(x, 0.5), torch.rand_like(x),
                   torch.empty(7, 5, device="ipu").random_(0, 9)]
        return [r.cpu() for r in results] + [torch.rand(3)]

    first = draw()  # signatures not seen before: checked as the CPU kernel
    for a, b in zip(first, draw()):
        torch.testing.assert_close(a, b)


RUNTIME_FAILURES = {
    "gather": lambda d: torch.gather(torch.arange(4.0, device=d), 0, torch.tensor([7], device=d)),
    "index_select": lambda d: torch.index_select(torch.arange(4.0, device=d), 0,
                                                 torch.tensor([9], device=d)),
    "index": lambda d: torch.arange(4.0, device=d)[torch.tensor([1, 9], device=d)],
    "index, negative": lambda d: torch.ones(2, 3, device=d)[:, torch.tensor([-4], device=d)],
    "embedding": lambda d: torch.nn.functional.embedding(torch.tensor([[1, 5]], device=d),
                                                         torch.ones(3, 2, device=d)),
    "index_add_": lambda d: torch.ones(3, device=d).index_add_(0, torch.tensor([7], device=d),
                                                               torch.ones(1, device=d)),
    "scatter_": lambda d: torch.zeros(3, device=d).scatter_(0, torch.tensor([4], device=d),
                                                            torch.ones(1, device=d)),
}


@pytest.mark.parametrize("op", RUNTIME_FAILURES)
def test_a_failed_op_poisons_what_depends_on_it_and_nothing_else(op):
    failing = RUNTIME_FAILURES[op]
    expected = cpu_error(failing)
    x = torch.arange(4.0, device="ipu")
    before = x * 2  # the same graph, independent of the failure
    result = failing("ipu")  # deferred: the index is checked when the graph runs
    downstream = result.sum() + 1
    after = x + 1
    torch.testing.assert_close(before.cpu(), torch.arange(4.0) * 2)
    torch.testing.assert_close(after.cpu(), torch.arange(4.0) + 1)
    reads = [lambda: result.cpu(), lambda: downstream.item(), lambda: str(downstream),
             lambda: result.tolist(), lambda: result + 1]  # the last: use in a later graph
    for read in reads:
        with pytest.raises(type(expected)) as raised:
            read()
        message = str(raised.value)
        assert str(expected).splitlines()[0] in message, message
        assert "when the ipu ran it" in message and "aten::" in message, message


def test_a_failed_in_place_write_poisons_its_tensor():
    target = torch.zeros(4, device="ipu")
    target.index_put_((torch.tensor([5], device="ipu"),), torch.tensor(1.0, device="ipu"))
    other = torch.ones(4, device="ipu") + 1
    torch.testing.assert_close(other.cpu(), torch.full((4,), 2.0))
    with pytest.raises(IndexError, match="index 5 is out of bounds.*aten::_index_put_impl_"):
        target.cpu()
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        target.add_(1)  # writing to it uses it too
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        target.copy_(torch.zeros(4))


def test_synchronize_raises_the_first_error_it_ran_and_reads_keep_raising():
    bad = torch.gather(torch.arange(4.0, device="ipu"), 0, torch.tensor([7], device="ipu"))
    with pytest.raises(RuntimeError, match="index 7 is out of bounds.*aten::gather"):
        poptorch.synchronize()
    poptorch.synchronize()  # reported once
    with pytest.raises(RuntimeError, match="index 7 is out of bounds.*aten::gather"):
        bad.cpu()


def test_a_read_of_an_unrelated_tensor_does_not_raise():
    x = torch.arange(4.0, device="ipu")
    bad = torch.index_select(x, 0, torch.tensor([9], device="ipu"))
    torch.testing.assert_close((x * 3).cpu(), torch.arange(4.0) * 3)
    with pytest.raises(IndexError, match="index out of range"):
        bad.cpu()


STREAMED = """
import torch, poptorch
x = torch.arange(4.0, device="ipu")
errors = []
try:
    bad = torch.gather(x, 0, torch.tensor([7], device="ipu"))
    # later chunks read the failed one; once its chunk has run (timing), an op reading it
    # raises its error at the call
    for _ in range(6): bad = bad + 1
except RuntimeError as e:
    errors.append(e)
good = x
for _ in range(6): good = good + 1
assert torch.equal(good.cpu(), torch.arange(4.0) + 6)
if not errors:
    try:
        bad.cpu()
    except RuntimeError as e:
        errors.append(e)
assert len(errors) == 1, "the failed gather raised nowhere"
assert "index 7 is out of bounds" in str(errors[0]) and "aten::gather" in str(errors[0]), errors
print("ok")
"""


def test_graphs_streamed_to_the_device_queue_poison_their_results():
    result = run_python(STREAMED, env={"POPTORCH_STREAM_NODES": "2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


OUT_OF_MEMORY = """
import torch, poptorch
x = torch.ones(2_000_000, device="ipu")  # 8 MB
z = ((x * 3) + (x * 4)).sum()  # 16 MB of temporaries when the graph runs
small = torch.ones(2, device="ipu") * 2
held = torch.empty(4_000_000, device="ipu")  # 16 MB more: the temporaries no longer fit
try:
    poptorch.synchronize()
    raise AssertionError("synchronize() did not raise")
except torch.OutOfMemoryError as e:
    assert "temporaries" in str(e), e
for t in (z, small):
    try:
        t.cpu()
    except torch.OutOfMemoryError:
        continue
    raise AssertionError("read back without an error")
del held
print(torch.ones(2, device="ipu").sum().item())
"""


def test_a_graph_whose_temporaries_do_not_fit_poisons_every_result():
    result = run_python(OUT_OF_MEMORY, env={"POPTORCH_IPU_MEMORY_MB": "36"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"


class Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(5, 3)
        self.linear = torch.nn.Linear(3, 2)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, tokens, labels=None):
        out = self.linear(self.embedding(tokens).mean(1))
        return out if labels is None else (out, self.loss(out, labels))


def test_a_wrapped_model_raises_a_bad_batch_at_the_call_and_recovers():
    torch.manual_seed(0)
    model = Embedder()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    good, labels = torch.tensor([[0, 1], [2, 3]]), torch.tensor([0, 1])
    bad = torch.tensor([[0, 1], [2, 9]])

    def cpu_step(tokens):
        cpu_optimizer.zero_grad()
        loss = reference(tokens, labels)[1]
        loss.backward()
        cpu_optimizer.step()
        return loss.detach()

    for tokens in (good, bad, good):
        if tokens is bad:
            expected = cpu_error(lambda _: cpu_step(bad))
            with pytest.raises(type(expected), match="index out of range.*when the ipu ran it"):
                training(tokens, labels)
            continue
        _, loss = training(tokens, labels)
        torch.testing.assert_close(loss, cpu_step(tokens), rtol=1e-5, atol=1e-6)
    training.copyWeightsToHost()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
