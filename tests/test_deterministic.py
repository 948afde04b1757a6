"""torch.use_deterministic_algorithms on the ipu: kernels see the setting of
the op's call, not the one in force when the graph runs, and memory the CPU
fills in that mode (new tensors, grown storages, resized out= tensors) holds
the CPU's values."""
import contextlib
import copy
import threading
from typing import Iterator, Tuple

import pytest
import torch

import poptorch
from poptorch.testing import assert_same


@contextlib.contextmanager
def _deterministic(warn_only: bool = False) -> Iterator[None]:
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _index_copy_of_repeated_indices(device):
    """Which of the repeated indices' rows wins depends on the setting."""
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(2000, 4, 3).to(device)
    indices = torch.randint(0, 2000, (40000,), generator=g).to(device)
    rows = torch.randn(40000, 4, 3, generator=g).to(device)
    return target.index_copy(0, indices, rows)


def test_the_setting_at_the_call_decides_not_the_one_at_the_sync():
    with _deterministic():
        expected = _index_copy_of_repeated_indices("cpu")
        result = _index_copy_of_repeated_indices("ipu")
    # Read after the setting was switched off; with several threads the
    # CPU's other kernel would give other rows.
    assert torch.equal(result.cpu(), expected)


DTYPES = [torch.float32, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool]


def _new_memory(device: str, dtype: torch.dtype):
    """Every way to get memory the CPU fills in deterministic mode (NaN, or the
    largest integer): factories, and storages grown by resizing."""
    like = torch.zeros(3, 4, dtype=dtype, device=device)
    return (torch.empty(3, dtype=dtype, device=device),
            torch.empty(2, 3, dtype=dtype, device=device, out=torch.zeros(1, dtype=dtype,
                                                                         device=device)),
            torch.empty_like(like.t()),
            torch.empty_strided((3, 2), (1, 3), dtype=dtype, device=device),
            torch.empty_permuted((2, 3, 5), (1, 0, 2), dtype=dtype, device=device),
            like.new_empty((2, 2)),
            torch.ones(2, dtype=dtype, device=device).resize_(5),
            torch.ones(2, 3, dtype=dtype, device=device).t().resize_(4, 3),
            torch.ones(2, dtype=dtype, device=device).resize_as_(like))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_new_memory_is_filled_deterministically_like_the_cpu(dtype):
    with _deterministic():
        cpu = _new_memory("cpu", dtype)
        ipu = _new_memory("ipu", dtype)
    assert_same(cpu, ipu, equal_nan=True)


def _tensors_from_data(device: str):
    return (torch.tensor([1, 2, 3], device=device), torch.tensor([1.5, -2.0], device=device),
            torch.tensor([True, False], device=device), torch.as_tensor([[4, 5]], device=device),
            torch.zeros(1, device=device).new_tensor([7.0, 8.0]))


@pytest.mark.parametrize("warn_only", [False, True])
def test_tensors_from_python_data(warn_only):
    """torch.tensor(data, device="ipu") copies the data with Python dispatch
    excluded; the fill of its new ipu memory inferred its results on fake CPU
    tensors without FakeTensor's mode, and crashed in the CPU fill kernel."""
    with _deterministic(warn_only):
        cpu = _tensors_from_data("cpu")
        ipu = _tensors_from_data("ipu")
    assert_same(cpu, ipu)


def _out_resized(device: str, out_numel: int) -> Tuple[torch.Tensor, ...]:
    x = torch.arange(15.0, device=device).reshape(5, 3)
    index = torch.tensor([0, 2, 4], device=device)

    def out(dtype=torch.float32):
        return torch.empty(out_numel, dtype=dtype, device=device)

    return (torch.index_select(x, 0, index, out=out()), torch.add(x, 1, out=out()),
            torch.sum(x, 0, out=out()), torch.cat([x, x], out=out()),
            torch.argmax(x, 1, out=out(torch.int64)), torch.arange(4.0, out=out()))


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
@pytest.mark.parametrize("warn_only", [False, True])
@pytest.mark.parametrize("out_numel", [0, 7], ids=["empty_out", "other_size_out"])
def test_out_tensors_resized_by_the_op(warn_only, out_numel):
    with _deterministic(warn_only):
        cpu = _out_resized("cpu", out_numel)
        ipu = _out_resized("ipu", out_numel)
    assert_same(cpu, ipu)


def test_ops_run_on_the_ipu_with_python_dispatch_disabled():
    """Ops whose results capture infers on fake CPU tensors are still captured
    (not run on the host) when the caller disabled Python dispatch."""
    x = torch.randn(5, 3)
    index = torch.tensor([0, 2])
    ipu_x, ipu_index = x.to("ipu"), index.to("ipu")
    before = poptorch.metrics()["host_fallbacks"]
    with torch._C._DisableTorchDispatch():
        result = torch.index_select(ipu_x, 0, ipu_index)
        filled = torch.empty(2, 2, device="ipu").fill_(3.0)
    assert poptorch.metrics()["host_fallbacks"] == before
    assert_same((torch.index_select(x, 0, index), torch.full((2, 2), 3.0)), (result, filled))


def _index_put_and_copy_of_repeated_indices(device):
    """Graph of kernels that read the setting: index_copy, index_put with and
    without accumulate (float sums whose order the setting decides)."""
    g = torch.Generator().manual_seed(1)
    indices = torch.randint(0, 500, (60000,), generator=g).to(device)
    rows = torch.randn(60000, 3, generator=g).to(device)
    target = torch.zeros(500, 3, device=device)
    copied = target.index_copy(0, indices, rows)
    put = target.index_put((indices,), rows)
    summed = target.index_put((indices,), rows, accumulate=True)
    return copied, put, summed


def _sync_on_another_thread_while_reading_the_flag(pending) -> Tuple[set, list]:
    """Syncs `pending` on a new thread; meanwhile this thread reads the flag."""
    seen = set()
    results = []
    thread = threading.Thread(target=lambda: results.append([t.cpu() for t in pending]))
    thread.start()
    while True:  # at least one reading, however fast the sync
        seen.add((torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled()))
        if not thread.is_alive():
            break
    thread.join()
    return seen, results[0]


def test_a_graph_captured_under_the_flag_runs_deterministically_without_setting_it():
    """Synced after the setting was switched off, on another thread: the CPU's
    deterministic values, and this thread never sees the flag set."""
    with _deterministic():
        expected = _index_put_and_copy_of_repeated_indices("cpu")
        pending = _index_put_and_copy_of_repeated_indices("ipu")
    seen, results = _sync_on_another_thread_while_reading_the_flag(pending)
    assert seen == {(False, False)}
    torch.testing.assert_close(tuple(results), expected, rtol=0, atol=0)


def test_a_graph_captured_without_the_flag_runs_without_clearing_it():
    pending = _index_put_and_copy_of_repeated_indices("ipu")
    with _deterministic():
        seen, results = _sync_on_another_thread_while_reading_the_flag(pending)
        expected = _index_put_and_copy_of_repeated_indices("cpu")
    assert seen == {(True, False)}
    # Without the flag the order of repeated indices is unspecified: which
    # row wins and the order of the sums may differ, the sets of values not.
    copied, put, summed = results
    for result, reference in ((copied, expected[0]), (put, expected[1])):
        rows = {tuple(r) for r in reference.tolist()} | {(0.0, 0.0, 0.0)}
        assert all(tuple(r) in rows for r in result.tolist())
    torch.testing.assert_close(summed, expected[2])


def _put_without_accumulate(device):
    return torch.zeros(5, device=device).put_(torch.tensor([0, 3, 0], device=device),
                                              torch.tensor([1.0, 2.0, 3.0], device=device))


def test_an_op_that_the_flag_refuses_is_refused_at_its_call():
    with _deterministic(), pytest.raises(RuntimeError, match="put_ does not have a deterministic"):
        _put_without_accumulate("ipu")


def test_an_op_the_flag_refuses_called_without_it_and_run_under_it_says_what_to_do():
    """Its CPU kernel reads the setting as it runs, and the runtime does not set it."""
    pending = _put_without_accumulate("ipu")
    with _deterministic(), pytest.raises(RuntimeError, match=r"aten::put_ was called without.*Synchronise"):
        pending.cpu()


def test_an_op_the_flag_refuses_called_without_it_runs_under_warn_only():
    pending = _put_without_accumulate("ipu")
    expected = _put_without_accumulate("cpu")
    with _deterministic(warn_only=True):
        pending.cpu()
    assert_same(expected, pending)


# Wrapped models: the setting at the model's call decides, as on the CPU ------

class _Put(torch.nn.Module):
    def forward(self, values, indices):
        return torch.zeros(5).put_(indices, values)


class _IndexCopy(torch.nn.Module):
    def forward(self, target, indices, rows):
        return target.index_copy(0, indices, rows)


_PUT_ARGUMENTS = (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 3, 0]))


def test_a_wrapped_model_compiled_without_the_flag_is_refused_under_it_at_the_call():
    """Its step was replayed: the runtime refused put_ with lazy mode's advice
    to synchronise, which a wrapped model's user cannot act on."""
    model = poptorch.inferenceModel(_Put())
    expected = _Put()(*_PUT_ARGUMENTS)
    assert_same(expected, model(*_PUT_ARGUMENTS).to("ipu"))
    with _deterministic(), pytest.raises(RuntimeError) as error:
        model(*_PUT_ARGUMENTS)
    with _deterministic(), pytest.raises(RuntimeError) as cpu_error:
        _Put()(*_PUT_ARGUMENTS)
    assert str(error.value) == str(cpu_error.value)
    assert_same(expected, model(*_PUT_ARGUMENTS).to("ipu"))  # runs again without it


def test_a_wrapped_model_warns_at_the_call_under_warn_only():
    model = poptorch.inferenceModel(_Put())
    model(*_PUT_ARGUMENTS)
    with _deterministic(warn_only=True), pytest.warns(
            UserWarning, match="put_ does not have a deterministic implementation"):
        result = model(*_PUT_ARGUMENTS)
    assert_same(_Put()(*_PUT_ARGUMENTS), result.to("ipu"))


def test_a_wrapped_model_compiled_without_the_flag_computes_under_it_as_the_cpu():
    g = torch.Generator().manual_seed(0)
    arguments = (torch.zeros(2000, 4, 3), torch.randint(0, 2000, (40000,), generator=g),
                 torch.randn(40000, 4, 3, generator=g))
    model = poptorch.inferenceModel(_IndexCopy())
    model(*arguments)
    with _deterministic():
        result = model(*arguments)
        expected = _IndexCopy()(*arguments)
    assert torch.equal(result, expected)


def test_a_training_model_keeps_its_weights_and_state_when_the_flag_changes():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3))
    ipu = copy.deepcopy(cpu)
    cpu_optimizer = torch.optim.Adam(cpu.parameters(), lr=0.01)
    loss = lambda model, x: model(x).square().mean()  # noqa: E731

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = ipu

        def forward(self, x):
            return loss(self.model, x)

    training = poptorch.trainingModel(
        WithLoss(), optimizer=torch.optim.Adam(ipu.parameters(), lr=0.01))
    for step in range(4):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        with _deterministic() if step % 2 else contextlib.nullcontext():
            training(x)
        cpu_optimizer.zero_grad()
        loss(cpu, x).backward()
        cpu_optimizer.step()
    for ours, theirs in zip(ipu.parameters(), cpu.parameters()):
        torch.testing.assert_close(ours.detach().cpu(), theirs.detach(), rtol=1e-5, atol=1e-6)
