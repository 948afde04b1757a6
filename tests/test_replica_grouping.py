"""Replica-grouped weights (per_replica_params, W.replicaGrouping) against the
CPU: each group of replicas trains its value of a weight on the micro-batches
its replicas read, averaged (ReductionType.Mean) over all replicas as PopTorch
does, so that a weight cut in shards trains as the whole weight on the CPU."""
import copy
import pickle
import subprocess
import sys

import pytest
import torch

import poptorch
from poptorch import CommGroupType, ReductionType, VariableRetrievalMode

from dist_scripts.launch import ROOT

REPLICAS, ITERATIONS, ACCUMULATION, MICRO = 4, 2, 2, 3

# (group type, replicas per group, the group of each of 4 replicas)
GROUPINGS = [
    (CommGroupType.Consecutive, 2, [0, 0, 1, 1]),
    (CommGroupType.Orthogonal, 2, [0, 1, 0, 1]),
    (CommGroupType.NoGrouping, 0, [0, 1, 2, 3]),
    (CommGroupType.All, 0, [0, 0, 0, 0]),
]


class Grouped(torch.nn.Module):
    """y = tanh(x @ W + b) @ V, loss mean((y - t)^2); W and b grouped (leading
    dimension: one row per group or replica), V shared by all replicas."""

    def __init__(self, rows):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        w, b = torch.randn(5, 4, generator=generator), torch.randn(4, generator=generator)
        self.W = torch.nn.Parameter(torch.stack([w + 0.1 * i for i in range(rows)]))
        self.b = torch.nn.Parameter(torch.stack([b - 0.1 * i for i in range(rows)]))
        self.V = torch.nn.Parameter(torch.randn(4, 2, generator=generator))

    def forward(self, x, t):
        y = torch.tanh(x @ self.W + self.b) @ self.V
        return y, ((y - t) ** 2).mean()


def batch(step, groups_of_inputs=REPLICAS):
    g = torch.Generator().manual_seed(10 + step)
    rows = ITERATIONS * ACCUMULATION * groups_of_inputs * MICRO
    return torch.randn(rows, 5, generator=g), torch.randn(rows, 2, generator=g)


def micro_batches(x):
    """[iteration][accumulation step][replica] -> rows of that micro-batch."""
    return x.reshape(ITERATIONS, ACCUMULATION, REPLICAS, MICRO, *x.shape[1:])


def cpu_training(model, group, rows_of, steps, reduction, lr=0.1, momentum=0.5):
    """The semantics by hand: per iteration, a grouped row's gradient is the
    sum over its group's micro-batches, the shared V's the sum over all
    micro-batches; Mean divides both by all the micro-batches."""
    W, b, V = (model.W.detach().clone(), model.b.detach().clone(), model.V.detach().clone())
    params = [W, b, V]
    velocity = [torch.zeros_like(p) for p in params]
    outputs = []
    for step in range(steps):
        x, t = batch(step)
        xs, ts = micro_batches(x), micro_batches(t)
        for it in range(ITERATIONS):
            grads = [torch.zeros_like(p) for p in params]
            for acc in range(ACCUMULATION):
                for r in range(REPLICAS):
                    row = rows_of[r]
                    w, bb, v = (W[row].clone().requires_grad_(), b[row].clone().requires_grad_(),
                                V.clone().requires_grad_())
                    y = torch.tanh(xs[it, acc, r] @ w + bb) @ v
                    loss = ((y - ts[it, acc, r]) ** 2).mean()
                    gw, gb, gv = torch.autograd.grad(loss, [w, bb, v])
                    outputs.append((y.detach(), loss.detach()))
                    members = [h for h in range(W.shape[0])
                               if _group_of_row(h, group, rows_of) == group[r]]
                    scale = 1 / (REPLICAS * ACCUMULATION) if reduction == ReductionType.Mean else 1
                    for h in members:
                        grads[0][h] += gw * scale
                        grads[1][h] += gb * scale
                    grads[2] += gv * scale
            for p, g, buf in zip(params, grads, velocity):
                buf.mul_(momentum).add_(g)
                p.sub_(lr * buf)
    return {"W": W, "b": b, "V": V}, outputs


def _group_of_row(h, group, rows_of):
    return group[rows_of.index(h)]


def wrap(model, kind, size, mode, reduction, use_dict=False):
    opts = poptorch.Options().replicationFactor(REPLICAS).deviceIterations(ITERATIONS)
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.Training.accumulationAndReplicationReductionType(reduction)
    opts.outputMode(poptorch.OutputMode.All)
    training = poptorch.trainingModel(
        model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    if use_dict:  # as PopTorch's users write it
        for name in ("W", "b"):
            training.per_replica_params[name] = (kind, size, mode)
    else:
        training.W.replicaGrouping(kind, size, mode)
        training.b.perReplica(kind, size, mode)  # PopTorch's earlier name
    return training


@pytest.mark.parametrize("kind, size, group", GROUPINGS, ids=lambda v: getattr(v, "name", None))
@pytest.mark.parametrize("mode", list(VariableRetrievalMode), ids=lambda m: m.name)
@pytest.mark.parametrize("reduction", [ReductionType.Mean, ReductionType.Sum],
                         ids=lambda r: r.name)
def test_training_equals_each_group_trained_on_its_micro_batches(kind, size, group, mode,
                                                                 reduction):
    if mode == VariableRetrievalMode.AllReplicas:
        rows_of = list(range(REPLICAS))
        initial = [group.index(group[r]) for r in range(REPLICAS)]  # a group's rows start equal
    else:
        rows_of = group
        initial = list(range(max(group) + 1))
    model = Grouped(max(initial) + 1)
    with torch.no_grad():
        model.W.data = model.W.data[initial].clone()
        model.b.data = model.b.data[initial].clone()
    reference = copy.deepcopy(model)
    training = wrap(model, kind, size, mode, reduction, use_dict=reduction == ReductionType.Sum)
    steps = 2
    got = [training(*batch(step)) for step in range(steps)]
    expected_weights, expected_outputs = cpu_training(reference, group, rows_of, steps, reduction)
    close = dict(rtol=1e-4, atol=1e-5)
    for name, value in expected_weights.items():
        torch.testing.assert_close(getattr(model, name).detach(), value, **close, msg=name)
    outs = torch.cat([out for out, _ in got]).reshape(-1, MICRO, 2)
    losses = torch.cat([loss for _, loss in got])
    torch.testing.assert_close(outs, torch.stack([y for y, _ in expected_outputs]), **close)
    torch.testing.assert_close(losses, torch.stack([loss for _, loss in expected_outputs]),
                               **close)
    if mode == VariableRetrievalMode.AllReplicas:  # every replica's row: equal within a group
        for r in range(REPLICAS):
            torch.testing.assert_close(model.W[r], model.W[group.index(group[r])])


@pytest.mark.parametrize("kind, size, group", GROUPINGS[:3], ids=lambda v: getattr(v, "name", None))
def test_inference_replicas_use_their_groups_weights(kind, size, group):
    model = Grouped(max(group) + 1)
    opts = poptorch.Options().replicationFactor(REPLICAS).deviceIterations(ITERATIONS)
    inference = poptorch.inferenceModel(model, opts)
    inference.W.replicaGrouping(kind, size, VariableRetrievalMode.OnePerGroup)
    inference.per_replica_params["b"] = (kind, size, VariableRetrievalMode.OnePerGroup)
    x, t = batch(0)
    x, t = x[:ITERATIONS * REPLICAS * MICRO], t[:ITERATIONS * REPLICAS * MICRO]
    out, _ = inference(x, t)
    xs = x.reshape(ITERATIONS, REPLICAS, MICRO, 5)
    with torch.no_grad():
        expected = torch.stack([torch.stack([
            torch.tanh(xs[i, r] @ model.W[group[r]] + model.b[group[r]]) @ model.V
            for r in range(REPLICAS)]) for i in range(ITERATIONS)])
    torch.testing.assert_close(out.reshape(expected.shape), expected)


def test_the_replica_grouped_weights_example_equals_the_cpu():
    """examples/replica_grouped_weights.py, PopTorch's problem with its API calls
    (replicationFactor(8, 2), W.replicaGrouping(Orthogonal, 2, OnePerGroup)),
    checks its shards against the CPU and prints the whole problem's loss."""
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "replica_grouped_weights.py"),
                             "--steps", "3"], capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "trained shards equal the CPU's: [4, 40, 14]" in result.stdout
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import replica_grouped_weights as example
    finally:
        sys.path.pop(0)
    x, w = example.problem()
    first = float(result.stdout.split("step 0: loss ")[1].split()[0])
    assert first == pytest.approx(float(((x @ w) ** 2).mean()), rel=1e-5)


def test_replication_factor_with_input_replication_factor():
    opts = poptorch.Options().replicationFactor(8, 2)
    assert (opts.replication_factor, opts.input_group_size, opts.input_group_type) == (
        8, 4, CommGroupType.Consecutive)
    with pytest.raises(poptorch.Error, match=r"replicationFactor\(8, 3\)"):
        poptorch.Options().replicationFactor(8, 3)


def _compiled_with(per_replica, rows=2, optimizer=None, replicas=REPLICAS):
    model = Grouped(rows)
    opts = poptorch.Options().replicationFactor(replicas)
    training = poptorch.trainingModel(model, opts, optimizer(model.parameters())
                                      if optimizer else None)
    training.per_replica_params.update(per_replica)
    x, t = batch(0)
    return training, x[:replicas * MICRO], t[:replicas * MICRO]


@pytest.mark.parametrize("per_replica, rows, message", [
    ({"W": (CommGroupType.Consecutive, 2, VariableRetrievalMode.OnePerGroup)}, 3,
     r"one value per group in its first dimension \(2 with CommGroupType.Consecutive over 4 "
     r"replicas\), but its shape is \[3, 5, 4\]"),
    ({"W": (CommGroupType.Consecutive, 3, VariableRetrievalMode.OnePerGroup)}, 2,
     "groups of 3 replicas"),
    ({"nope": (CommGroupType.All, 0, VariableRetrievalMode.OnePerGroup)}, 1,
     "'nope', which is not a parameter"),
    ({"W": (CommGroupType.Orthogonal, 0, VariableRetrievalMode.OnePerGroup)}, 1,
     "needs at least 1 replica per group"),
    ({"W": (CommGroupType.All, 0, 2)}, 1, "must be a poptorch.VariableRetrievalMode"),
    ({"W": (CommGroupType.All, 0)}, 1, r"must be \(CommGroupType"),
    ({"W": (CommGroupType.Consecutive, 2, VariableRetrievalMode.AllReplicas)}, 4,
     "rows 0 and 1 belong to replicas of one group"),
])
def test_bad_groupings_are_errors(per_replica, rows, message):
    training, x, t = _compiled_with(per_replica, rows)
    with pytest.raises(poptorch.Error, match=message):
        training(x, t)


def test_norm_based_updates_are_refused():
    per_replica = {"W": (CommGroupType.Consecutive, 2, VariableRetrievalMode.OnePerGroup)}
    training, x, t = _compiled_with(per_replica, optimizer=lambda p: poptorch.optim.LAMB(p))
    with pytest.raises(poptorch.Error, match="LAMB takes norms over whole weights"):
        training(x, t)


def test_grouping_after_compiling_is_an_error():
    training, x, t = _compiled_with({}, rows=1)
    training(x, t)
    training.W.replicaGrouping(CommGroupType.All, 0, VariableRetrievalMode.OnePerGroup)
    with pytest.raises(poptorch.Error, match="per_replica_params changed after the model was "
                                             "compiled"):
        training(x, t)


def test_a_copied_parameter_reaches_no_wrapper():
    model = Grouped(1)
    training = poptorch.trainingModel(model)
    training.W.replicaGrouping(CommGroupType.All, 0, VariableRetrievalMode.OnePerGroup)
    assert not hasattr(copy.deepcopy(model.W), "replicaGrouping")  # deepcopy drops it
    copied = pickle.loads(pickle.dumps(model.W))  # pickle keeps it, reaching no wrapper
    with pytest.raises(poptorch.Error, match="call it on a parameter read from its wrapper"):
        copied.replicaGrouping(CommGroupType.All, 0, VariableRetrievalMode.OnePerGroup)


def test_save_and_load_keep_the_grouping(tmp_path):
    model = Grouped(2)
    training = wrap(model, CommGroupType.Orthogonal, 2, VariableRetrievalMode.OnePerGroup,
                    ReductionType.Mean)
    training(*batch(0))
    training.save(tmp_path / "grouped.poptorch")
    loaded = poptorch.load(tmp_path / "grouped.poptorch")
    assert loaded.per_replica_params == training.per_replica_params
    for step in (1, 2):
        torch.testing.assert_close(loaded(*batch(step)), training(*batch(step)))
    torch.testing.assert_close(loaded.model.W, model.W)


def test_a_submodules_parameter_by_its_name():
    """per_replica_params takes the names of named_parameters(), as PopTorch's
    users loop over them; a Linear's weight grouped per replica."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 3))
    with torch.no_grad():
        model[0].weight.data = torch.stack([model[0].weight * (r + 1) for r in range(REPLICAS)])
    linear = model[0]  # its forward sees a [3, 5] row of the weight
    inference = poptorch.inferenceModel(model, poptorch.Options().replicationFactor(REPLICAS))
    inference.per_replica_params["0.weight"] = (CommGroupType.NoGrouping, 0,
                                                VariableRetrievalMode.OnePerGroup)
    x = torch.randn(REPLICAS * MICRO, 5)
    out = inference(x)
    with torch.no_grad():
        expected = torch.cat([x[r * MICRO:(r + 1) * MICRO] @ linear.weight[r].t() + linear.bias
                              for r in range(REPLICAS)])
    torch.testing.assert_close(out, expected)


class _Head(torch.nn.Module):
    def __init__(self, scoped):
        super().__init__()
        self.scoped = scoped
        self.W = torch.nn.Parameter(torch.randn(REPLICAS, 4, 2))

    def forward(self, h):
        if not self.scoped:
            return h @ self.W
        with poptorch.Block(ipu_id=1):
            return h @ self.W


class _TwoStages(torch.nn.Module):
    def __init__(self, scoped):
        super().__init__()
        self.scoped = scoped
        self.a = torch.nn.Linear(4, 4)
        self.head = _Head(scoped)
        if not scoped:
            self.a = poptorch.BeginBlock(self.a, ipu_id=0)
            self.head = poptorch.BeginBlock(self.head, ipu_id=1)

    def forward(self, x, t):
        if self.scoped:
            with poptorch.Block(ipu_id=0):
                h = self.a(x)
        else:
            h = self.a(x)
        y = self.head(h)
        return y, ((y - t) ** 2).mean()


def _pipelined(model):
    opts = poptorch.Options().replicationFactor(REPLICAS)
    opts.Training.gradientAccumulation(ACCUMULATION * 2)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training.per_replica_params["head.W"] = (CommGroupType.NoGrouping, 0,
                                             VariableRetrievalMode.OnePerGroup)
    g = torch.Generator().manual_seed(1)
    rows = ACCUMULATION * 2 * REPLICAS * MICRO
    return training, torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)


def test_a_pipelined_model_with_a_grouped_weight_equals_the_cpu():
    """BeginBlock stages: the shared Linear on IPU 0, the head's per-replica W
    on IPU 1 trained on its replica's micro-batches; Mean divides both by every
    micro-batch."""
    torch.manual_seed(0)
    model = _TwoStages(scoped=False)
    reference = copy.deepcopy(model)
    training, x, t = _pipelined(model)
    training(x, t)
    steps = ACCUMULATION * 2
    xs, ts = x.reshape(steps, REPLICAS, MICRO, 4), t.reshape(steps, REPLICAS, MICRO, 2)
    params = list(reference.a.parameters())
    grads = [torch.zeros_like(p) for p in params]
    grad_w = torch.zeros_like(reference.head.W)
    for step in range(steps):
        for r in range(REPLICAS):
            y = reference.a(xs[step, r]) @ reference.head.W[r]
            got = torch.autograd.grad(((y - ts[step, r]) ** 2).mean(), params + [reference.head.W])
            for g, add in zip(grads, got):
                g += add / (steps * REPLICAS)
            grad_w += got[-1] / (steps * REPLICAS)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= 0.1 * g
        reference.head.W -= 0.1 * grad_w
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def test_block_scopes_with_grouped_weights_are_refused():
    training, x, t = _pipelined(_TwoStages(scoped=True))
    with pytest.raises(poptorch.Error, match="annotate the model with poptorch.BeginBlock"):
        training(x, t)
