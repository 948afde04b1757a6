"""Pipelined and sharded execution of models split over IPUs (issue 11 item
5): each IPU runs its stages on a thread of its own; a pipeline overlaps the
stages of successive micro-batches, sharded execution runs one IPU at a time;
errors in a stage reach the caller; tensors crossing IPUs are counted.

Overlap is asserted by the order of the stages' start and end events in the
profile (never by time); the numbers of every strategy against the
unannotated model are in test_multi_ipu.py.
"""
import json

import pytest
import torch

import poptorch

WIDTH = 64


class TwoStages(torch.nn.Module):
    """Stage 0 (IPU 0) and a heavier stage 1 (IPU 1), then a loss."""

    def __init__(self, depth=(1, 6), annotate_first=True):
        super().__init__()
        torch.manual_seed(0)
        self.stages = torch.nn.ModuleList(
            torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(n)])
            for n in depth)
        for ipu, stage in enumerate(self.stages):
            if ipu > 0 or annotate_first:
                poptorch.BeginBlock(stage, ipu_id=ipu)

    def forward(self, x, target=None):
        for stage in self.stages:
            x = torch.tanh(stage(x))
        if target is None:
            return x
        return x, ((x - target) ** 2).mean()


def _stage_spans(tmp_path, name):
    with open(tmp_path / name / "trace.json", encoding="utf-8") as f:
        trace = json.load(f)
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") == "stage"]


def _by_stage(spans):
    """(pipeline stage, micro-batch) -> (start, end)"""
    return {(e["args"]["stage"], e["args"]["micro-batch"]): (e["ts"], e["ts"] + e["dur"])
            for e in spans}


def _profiled(tmp_path, name, opts):
    return opts.enableProfiling(str(tmp_path)).modelName(name)


def _data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, WIDTH, generator=g), torch.randn(n, WIDTH, generator=g)


def test_pipelined_training_overlaps_stages(tmp_path):
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(6)
    model = TwoStages()
    training = poptorch.trainingModel(model, _profiled(tmp_path, "train", opts),
                                      torch.optim.SGD(model.parameters(), lr=0.01))
    training(*_data(6 * 16))
    executions = poptorch.metrics()["executions"]
    training.destroy()  # writes the report
    with open(tmp_path / "train" / "summary.json", encoding="utf-8") as f:
        # Each micro-batch's run through the stages is a program run, as counted.
        assert json.load(f)["summary"]["program_runs"] == executions
    spans = _by_stage(_stage_spans(tmp_path, "train"))
    # Three pipeline stages: forward 0 (IPU 0), forward and backward 1 (IPU 1),
    # backward 0 (IPU 0); every micro-batch through each.
    assert set(spans) == {(s, k) for s in range(3) for k in range(6)}
    ipus = {e["args"]["stage"]: e["pid"] for e in _stage_spans(tmp_path, "train")}
    assert ipus[0] == ipus[2] != ipus[1]
    # Stage 1 of micro-batch 2 started before stage 2 of micro-batch 1
    # finished (counting from 1 as the seeds do).
    assert spans[(0, 1)][0] < spans[(1, 0)][1]
    # Each stage runs its micro-batches in order, each after its previous stage.
    for s in range(3):
        for k in range(6):
            if k:
                assert spans[(s, k - 1)][1] <= spans[(s, k)][0]
            if s:
                assert spans[(s - 1, k)][1] <= spans[(s, k)][0]



def test_layers_before_the_first_block_are_pipeline_stage_0(tmp_path):
    # As in PopTorch, the layers before the first BeginBlock are stage 0 on
    # IPU 0: the model annotated only from its second stage on pipelines as
    # the fully annotated one does, with the same numbers.
    losses, spans = [], []
    for name, annotate_first in (("all", True), ("later", False)):
        opts = poptorch.Options()
        opts.Training.gradientAccumulation(4)
        model = TwoStages(annotate_first=annotate_first)
        training = poptorch.trainingModel(model, _profiled(tmp_path, name, opts),
                                          torch.optim.SGD(model.parameters(), lr=0.01))
        losses.append(training(*_data(4 * 8))[1])
        training.destroy()
        spans.append(_by_stage(_stage_spans(tmp_path, name)))
    assert set(spans[1]) == set(spans[0]) == {(s, k) for s in range(3) for k in range(4)}
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)

def test_pipelined_inference_overlaps_stages(tmp_path):
    model = TwoStages()
    opts = _profiled(tmp_path, "infer", poptorch.Options().deviceIterations(8))
    inference = poptorch.inferenceModel(model, opts)
    x, _ = _data(8 * 16)
    torch.testing.assert_close(inference(x), model(x), rtol=1e-5, atol=1e-6)
    inference.destroy()
    spans = _by_stage(_stage_spans(tmp_path, "infer"))
    assert set(spans) == {(s, k) for s in range(2) for k in range(8)}
    assert spans[(0, 1)][0] < spans[(1, 0)][1]


def test_sharded_execution_runs_one_ipu_at_a_time(tmp_path):
    model = TwoStages()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.AutoStage.SameAsIpu))
    training = poptorch.trainingModel(model, _profiled(tmp_path, "sharded", opts),
                                      torch.optim.SGD(model.parameters(), lr=0.01))
    training(*_data(4 * 8))
    training.destroy()
    spans = sorted(_by_stage(_stage_spans(tmp_path, "sharded")).items(), key=lambda s: s[1])
    assert len(spans) == 3 * 4
    # Never two at once, and micro-batch after micro-batch.
    assert [key for key, _ in spans] == [(s, k) for k in range(4) for s in range(3)]
    assert all(a[1][1] <= b[1][0] for a, b in zip(spans, spans[1:]))


class Lookup(torch.nn.Module):
    """Stage 1 indexes a table with an input: an index out of range fails
    there, on IPU 1's thread, when that micro-batch runs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.front = torch.nn.Linear(4, 4)
        self.table = torch.nn.Parameter(torch.randn(10, 4))
        poptorch.BeginBlock(self.front, ipu_id=0)

    def forward(self, x, index):
        x = self.front(x)
        with poptorch.Block(ipu_id=1):
            return x + self.table.index_select(0, index), x.sum()


@pytest.mark.parametrize("bad", [0, 3, 5], ids=["first", "middle", "last"])
def test_a_stage_error_reaches_the_caller(bad):
    model = Lookup()
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(6))
    x = torch.randn(12, 4)
    good = torch.randint(0, 10, (12,))
    torch.testing.assert_close(inference(x, good)[0], model(x, good)[0])
    index = good.clone()
    index[2 * bad] = 10
    with pytest.raises(IndexError) as cpu:
        model(x, index)
    with pytest.raises(IndexError, match="out of range") as ipu:
        inference(x, index)
    assert type(ipu.value) is type(cpu.value)
    # The pipeline stopped cleanly: the model runs again.
    torch.testing.assert_close(inference(x, good)[0], model(x, good)[0])


def test_a_stage_error_in_training_reaches_the_caller():
    model = Lookup()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x = torch.randn(8, 4)
    index = torch.randint(0, 10, (8,))
    training(x, index)
    index[5] = -11
    with pytest.raises(IndexError):
        training(x, index)


class TwoLookups(torch.nn.Module):
    """Stage 0 selects rows of a table (an IndexError, 'out of range'), stage
    1 gathers from another (a RuntimeError, 'out of bounds')."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rows = torch.nn.Parameter(torch.randn(10, 4))
        self.values = torch.nn.Parameter(torch.randn(10, 4))

    def forward(self, select, gather):
        with poptorch.Block(ipu_id=0):
            x = self.rows.index_select(0, select)
        with poptorch.Block(ipu_id=1):
            return x + torch.gather(self.values, 0, gather)


def test_the_earliest_micro_batch_error_is_raised():
    """Micro-batch 1 fails in stage 1, micro-batch 2 in stage 0, which the
    pipeline may run first: the error is micro-batch 1's, as on the CPU."""
    model = TwoLookups()
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    select = torch.randint(0, 10, (8,))
    gather = torch.randint(0, 10, (8, 4))
    torch.testing.assert_close(inference(select, gather), model(select, gather))
    gather[2, 0] = 12  # micro-batch 1 (rows 2 and 3)
    select[4] = 10     # micro-batch 2 (rows 4 and 5)
    with pytest.raises(RuntimeError, match="out of bounds") as cpu:
        for k in range(4):  # the CPU, micro-batch after micro-batch
            model(select[2 * k:2 * k + 2], gather[2 * k:2 * k + 2])
    with pytest.raises(RuntimeError, match="out of bounds") as ipu:
        inference(select, gather)
    assert type(ipu.value) is type(cpu.value)


def test_bytes_between_ipus_are_counted():
    """Each micro-batch sends stage 0's activations (rows x WIDTH float32) to
    IPU 1; nothing else crosses in inference."""
    model = TwoStages(depth=(1, 1))
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    x, _ = _data(4 * 3)
    inference(x)
    poptorch.reset_metrics()
    inference(x)
    assert poptorch.metrics()["bytes_between_ipus"] == 4 * (3 * WIDTH * 4)
