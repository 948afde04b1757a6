"""Values the host reads inside a wrapped model's forward: the step is
specialised on them and guarded, never replayed with a stale value."""
import copy
import logging
import threading

import pytest
import torch

import poptorch
from conftest import run_python, train_beside_the_cpu


class ScalesByAnElement(torch.nn.Module):
    def forward(self, x):
        return x * x[0, 0].item()


def test_an_item_read_in_forward_follows_the_data():
    model = poptorch.inferenceModel(ScalesByAnElement())
    for seed in range(4):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(model(x), x * x[0, 0].item())
    assert poptorch.metrics()["guard_failures"] > 0



def _scaled_micro_batches(scales):
    """Two rows per micro-batch, the first element of micro-batch k being scales[k]."""
    x = torch.randn(2 * len(scales), 3, generator=torch.Generator().manual_seed(0))
    x[0::2, 0] = torch.tensor(scales)
    return x


def test_an_item_read_in_forward_follows_the_data_of_every_micro_batch():
    # The micro-batches run two at a time on the inference lanes, with the
    # variant captured first; those whose value differs, and the rest of their
    # lane, run again on the calling thread, which captures a variant for them.
    model = ScalesByAnElement()
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(8))
    scales = [1.0, 1.0, 1.0, 2.0, 1.0, 3.0, 3.0, 1.0]
    x = _scaled_micro_batches(scales)
    failures = poptorch.metrics()["guard_failures"]
    expected = torch.cat([model(rows) for rows in x.split(2)])
    torch.testing.assert_close(wrapped(x), expected)
    assert poptorch.metrics()["guard_failures"] > failures
    # With three variants the step no longer runs on the lanes; the values hold.
    torch.testing.assert_close(wrapped(x), expected)
    x = _scaled_micro_batches([2.0] * 8)
    torch.testing.assert_close(wrapped(x), x * 2.0)


def test_a_step_with_a_guard_runs_its_micro_batches_on_both_lanes():
    code = """
import torch, poptorch
class ScalesByAnElement(torch.nn.Module):
    def forward(self, x):
        return x * x[0, 0].item()
x = torch.randn(8, 3)
x[0::2, 0] = torch.tensor([1.0, 1.0, 2.0, 1.0])
out = poptorch.inferenceModel(ScalesByAnElement(), poptorch.Options().deviceIterations(4))(x)
torch.testing.assert_close(out, torch.cat([rows * rows[0, 0] for rows in x.split(2)]))
print("ok")
"""
    result = run_python(code, env={"POPTORCH_LOG_LEVEL": "DEBUG"})
    assert result.stdout.strip() == "ok", result.stderr
    assert "the inference micro-batches run on two lanes" in result.stderr
    # Micro-batch 2 (lane 0) fails its guard and runs again on the calling
    # thread, which captures a variant for it; micro-batch 3 (lane 1) ran on its lane.
    assert "micro-batch 2 runs again on the calling thread" in result.stderr
    assert "micro-batch 3 runs again" not in result.stderr

def test_a_value_that_keeps_changing_is_an_error_naming_the_line(monkeypatch):
    monkeypatch.setenv("POPTORCH_MAX_STEP_VARIANTS", "2")
    model = poptorch.inferenceModel(ScalesByAnElement())
    model(torch.ones(1, 2))
    model(torch.full((1, 2), 2.0))
    with pytest.raises(poptorch.Error, match=r"test_host_reads.py:\d+ \(in forward\)") as info:
        model(torch.full((1, 2), 3.0))
    assert "POPTORCH_MAX_STEP_VARIANTS" in str(info.value)
    assert "test_host_reads.py" in info.value.location
    # The variants kept still serve the values they were captured for.
    torch.testing.assert_close(model(torch.ones(1, 2)), torch.ones(1, 2))


@pytest.mark.parametrize("value", ["x", "0", "-1", "2.5"])
def test_a_bad_variant_limit_names_the_variable(monkeypatch, value):
    # int('x') raised a bare ValueError at the first failed guard.
    monkeypatch.setenv("POPTORCH_MAX_STEP_VARIANTS", value)
    model = poptorch.inferenceModel(ScalesByAnElement())
    model(torch.ones(1, 2))
    with pytest.raises(poptorch.Error, match=f"POPTORCH_MAX_STEP_VARIANTS must be an integer "
                       f"of at least 1, got '{value}'"):
        model(torch.full((1, 2), 2.0))


class BranchesOnTheData(torch.nn.Module):
    """Batch norm updates its statistics before the value read is checked."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x, y):
        out = self.bn(self.lin(x))
        if (x[:, 0] > 0).all():
            out = out * 2
        else:
            out = out - 1
        return out, (out - y).pow(2).mean()


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    if step % 3 == 0:
        x[:, 0] = x[:, 0].abs() + 0.1
    return x, y


@pytest.mark.parametrize("accumulation", [1, 2])
def test_training_with_a_data_dependent_branch_matches_the_cpu(accumulation):
    torch.manual_seed(0)
    model = BranchesOnTheData()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(7):
        batches = [_batch(step * accumulation + i) for i in range(accumulation)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        _, loss = ipu(x, y)
        optimizer.zero_grad()
        for xs, ys in batches:
            out, ref_loss = reference(xs, ys)
            (ref_loss / accumulation).backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        # Running statistics too: a step whose guard failed changed nothing.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_a_branch_that_changes_between_device_iterations_matches_the_cpu():
    torch.manual_seed(0)
    model = BranchesOnTheData()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(3)
    opts.outputMode(poptorch.OutputMode.All)
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for call in range(3):
        batches = [_batch(3 * call + i) for i in range(3)]  # one of each three branches
        outputs, losses = ipu(torch.cat([b[0] for b in batches]),
                              torch.cat([b[1] for b in batches]))
        for i, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            out, ref_loss = reference(x, y)
            ref_loss.backward()
            optimizer.step()
            torch.testing.assert_close(losses[i], ref_loss, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(outputs[4 * i:4 * i + 4], out, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_data_seen_before_compiles_nothing():
    model = poptorch.inferenceModel(BranchesOnTheData().eval())
    batches = [_batch(0), _batch(1)]  # one takes each branch
    for x, y in batches:
        model(x, y)
    compiled = poptorch.metrics()["graphs_compiled"]
    for _ in range(3):
        for x, y in batches:
            out, _ = model(x, y)
            torch.testing.assert_close(out, model.model(x, y)[0])
    assert poptorch.metrics()["graphs_compiled"] == compiled


class CountsDistinctValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x, y):
        distinct = torch.unique(x)  # its length depends on the data
        present = x.nonzero()
        loss = (self.lin(x).squeeze(1) - y).pow(2).mean()
        return loss + 0.01 * distinct.sum() + 0.001 * present.shape[0]


def test_ops_whose_shape_depends_on_the_data_train_like_the_cpu():
    torch.manual_seed(0)
    generators = [torch.Generator().manual_seed(step) for step in range(5)]
    batches = [(torch.randint(0, 2 + step % 3, (4, 3), generator=g).float(),
                torch.randn(4, generator=g)) for step, g in enumerate(generators)]
    train_beside_the_cpu(CountsDistinctValues(), batches)


def test_printing_inside_forward_shows_the_values(capsys):
    class Prints(torch.nn.Module):
        def forward(self, x):
            y = x + 1
            print("y =", y.tolist())
            return y * 2

    model = poptorch.inferenceModel(Prints())
    out = model(torch.tensor([[1.0, 2.0]]))
    assert "y = [[2.0, 3.0]]" in capsys.readouterr().out
    torch.testing.assert_close(out, torch.tensor([[4.0, 6.0]]))


def test_an_error_inside_forward_keeps_the_users_traceback():
    class Broken(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(5, 5, device=x.device)  # wrong shape

    with pytest.raises(RuntimeError) as info:
        poptorch.inferenceModel(Broken())(torch.ones(2, 3))
    frames = [entry.name for entry in info.traceback]
    assert "forward" in frames


def test_one_model_called_from_several_threads_returns_each_call_its_own_result():
    model = torch.nn.Linear(8, 8)
    ipu = poptorch.inferenceModel(model)
    ipu(torch.zeros(4, 8))
    errors = []

    def worker(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for _ in range(20):
            x = torch.randn(4, 8, generator=g)
            try:
                torch.testing.assert_close(ipu(x), model(x))
            except Exception as error:  # reported below, in the test's thread
                errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_float64_inputs_are_demoted_to_float32_once_with_a_warning():
    class Records(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    records = Records()
    poptorch.logger.addHandler(records)
    try:
        model = torch.nn.Linear(3, 2)
        ipu = poptorch.inferenceModel(model)
        x = torch.randn(4, 3, dtype=torch.float64)
        out = ipu(x)
        ipu(x)
    finally:
        poptorch.logger.removeHandler(records)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, model(x.float()))
    assert sum("64-bit" in m for m in records.messages) == 1


def test_lazy_ops_of_another_thread_stay_out_of_a_step_being_captured():
    stop = threading.Event()
    errors = []

    def lazy_worker() -> None:
        x = torch.arange(6.0)
        while not stop.is_set():
            try:
                torch.testing.assert_close((x.to("ipu") * 3 + 1).cpu(), x * 3 + 1)
            except Exception as error:  # reported below, in the test's thread
                errors.append(error)
                return

    worker = threading.Thread(target=lazy_worker)
    worker.start()
    try:
        for seed in range(3):
            model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU())
            x = torch.randn(2, 6, generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(poptorch.inferenceModel(model)(x), model(x))
    finally:
        stop.set()
        worker.join()
    assert not errors, errors[0]
