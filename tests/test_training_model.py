"""trainingModel / inferenceModel against CPU reference loops."""
import copy

import pytest
import torch

import poptorch
from conftest import run_python, train_beside_the_cpu


class Classifier(torch.nn.Module):
    def __init__(self, with_bn: bool = False):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 12)
        self.bn = torch.nn.BatchNorm1d(12) if with_bn else torch.nn.Identity()
        self.l2 = torch.nn.Linear(12, 3)
        self.loss = torch.nn.CrossEntropyLoss()
        self.forward_calls = 0

    def forward(self, x, y=None):
        self.forward_calls += 1
        out = self.l2(torch.relu(self.bn(self.l1(x))))
        if y is None:
            return out
        return out, self.loss(out, y)


def data(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def twins(ipu_optimizer, cpu_optimizer, options=None, **model_args):
    """A model wrapped for training on the ipu, and its CPU twin with its optimiser."""
    torch.manual_seed(0)
    model = Classifier(**model_args)
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, options, ipu_optimizer(model.parameters()))
    return model, ipu, reference, cpu_optimizer(reference.parameters())


def reference_steps(model, optimizer, x, y, steps_per_call):
    """One CPU step per device iteration, on that iteration's whole share of the batch."""
    for xs, ys in zip(x.chunk(steps_per_call), y.chunk(steps_per_call)):
        optimizer.zero_grad()
        model(xs, ys)[1].backward()
        optimizer.step()


OPTIMISERS = {
    "poptorch.SGD": lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    "torch.SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1,
                                           nesterov=False),
    "poptorch.Adam": lambda p: poptorch.optim.Adam(p, lr=0.01, weight_decay=0.01),
    "torch.AdamW": lambda p: torch.optim.AdamW(p, lr=0.01),
    "poptorch.RMSprop": lambda p: poptorch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
}
REFERENCE = {
    "poptorch.SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    "torch.SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1),
    "poptorch.Adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01),
    "torch.AdamW": lambda p: torch.optim.AdamW(p, lr=0.01),
    "poptorch.RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
@pytest.mark.parametrize("iterations,accumulation,replicas", [(1, 1, 1), (3, 1, 1), (1, 4, 1),
                                                              (1, 1, 2), (2, 2, 2)])
def test_training_matches_a_cpu_loop(name, iterations, accumulation, replicas):
    opts = poptorch.Options().deviceIterations(iterations).replicationFactor(replicas)
    opts.Training.gradientAccumulation(accumulation)
    model, ipu, reference, ref_optimizer = twins(OPTIMISERS[name], REFERENCE[name], opts)
    micro = 4
    for call in range(3):
        x, y = data(iterations * accumulation * replicas * micro, seed=call)
        ipu(x, y)
        reference_steps(reference, ref_optimizer, x, y, iterations)
    for (n, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{name}: {n} differs")


def test_the_python_forward_runs_once_and_nothing_recompiles():
    model = Classifier()
    opts = poptorch.Options().deviceIterations(2)
    ipu = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    ipu(*data(8))
    compiled = poptorch.metrics()["graphs_compiled"]
    for seed in range(1, 5):
        ipu(*data(8, seed))
    assert model.forward_calls == 1
    assert poptorch.metrics()["graphs_compiled"] == compiled


def test_batch_norm_statistics_are_trained_and_synced_to_the_host():
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    model, ipu, reference, ref_optimizer = twins(sgd, sgd, with_bn=True)
    for call in range(3):
        x, y = data(8, call)
        ipu(x, y)
        reference_steps(reference, ref_optimizer, x, y, 1)
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    assert int(model.bn.num_batches_tracked) == 3


def test_batch_norm_as_the_first_layer_trains_like_the_cpu():
    # The input does not require grad: batch norm's backward leaves grad_input
    # undefined on the CPU (output_mask), where its Meta kernel computes it.
    class FirstBatchNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(6, momentum=0.1)
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, x, y):
            out = self.fc(self.bn(x))
            return out, torch.nn.functional.cross_entropy(out, y)

    torch.manual_seed(0)
    model = FirstBatchNorm()
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for call in range(2):
        x, y = data(4, call)
        ipu(x, y)
        reference_steps(reference, ref_optimizer, x, y, 1)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)


@pytest.mark.parametrize("bn_training", [False, True])
def test_a_frozen_model_trains_as_its_forward_pass(bn_training):
    # Every parameter has requires_grad=False (upstream norms_test
    # test_batchNorm_eval_during_training): the step runs, updates no weight,
    # and batch norm's statistics move only in train mode, as on the CPU.
    torch.manual_seed(0)
    model = Classifier(with_bn=True)
    model.requires_grad_(False)
    model.bn.train(bn_training)
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    for call in range(2):
        x, y = data(8, call)
        out, loss = ipu(x, y)
        ref_out, ref_loss = reference(x, y)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(loss, ref_loss)
    ipu.copyWeightsToHost()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)


class _EvalDropout(torch.nn.Module):
    """Upstream misc_nn_layers_test test_dropout_eval_during_training's model:
    the loss reads only the inputs (dropout in eval mode), the parameter is unused."""

    def __init__(self):
        super().__init__()
        self.dropout = torch.nn.Dropout().eval()
        self.unused = torch.nn.Parameter(torch.ones(3))
        self.loss = torch.nn.L1Loss()

    def forward(self, x, target):
        out = self.dropout(x)
        return out, self.loss(out, target)


def test_a_loss_that_reaches_no_parameter_trains_as_its_forward_pass():
    model = _EvalDropout()
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1,
                                                              weight_decay=0.1))
    x, target = torch.randn(4, 3), torch.zeros(4, 3)
    out, loss = ipu(x, target)
    torch.testing.assert_close(out, x)
    torch.testing.assert_close(loss, torch.nn.functional.l1_loss(x, target))
    torch.testing.assert_close(model.unused, torch.ones(3))


def test_an_anchored_gradient_the_loss_does_not_reach_is_an_error():
    model = _EvalDropout()
    opts = poptorch.Options().anchorTensor("g", "Gradient___unused")
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="unused has no gradient"):
        ipu(torch.randn(4, 3), torch.zeros(4, 3))


@pytest.mark.parametrize("mode,expected_rows", [
    (poptorch.OutputMode.All, 4 * 3 * 2), (poptorch.OutputMode.Final, 3 * 2),
    (poptorch.OutputMode.Sum, 3 * 2), (poptorch.OutputMode.EveryN, 2 * 3 * 2),
])
def test_inference_output_modes(mode, expected_rows):
    torch.manual_seed(0)
    model = Classifier()
    opts = poptorch.Options().deviceIterations(4).replicationFactor(2)
    opts.outputMode(mode, 2 if mode == poptorch.OutputMode.EveryN else None)
    ipu = poptorch.inferenceModel(model, opts)
    x, _ = data(4 * 2 * 3)
    out = ipu(x)
    assert out.shape == (expected_rows, 3)
    expected = model(x)
    rows = expected.reshape(4, 2, 3, 3)  # iteration, replica, micro-batch row, class
    if mode == poptorch.OutputMode.All:
        torch.testing.assert_close(out, expected)
    elif mode == poptorch.OutputMode.Final:
        torch.testing.assert_close(out, rows[-1].reshape(-1, 3))
    elif mode == poptorch.OutputMode.Sum:
        torch.testing.assert_close(out, rows.sum(0).reshape(-1, 3))
    else:
        torch.testing.assert_close(out, rows[1::2].reshape(-1, 3))


def test_inference_lanes_cover_every_micro_batch_with_one_openmp_thread():
    # The two inference lanes are an OpenMP team; a team of one runs both in turn.
    code = """
import torch, poptorch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU())
x = torch.randn(5 * 3, 6)
out = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(5))(x)
torch.testing.assert_close(out, model(x))
print("ok")
"""
    result = run_python(code, env={"OMP_NUM_THREADS": "1"})
    assert result.stdout.strip() == "ok", result.stderr


def test_training_losses_come_back_per_output_mode():
    model = Classifier()
    opts = poptorch.Options().deviceIterations(3).outputMode(poptorch.OutputMode.All)
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))
    x, y = data(12)
    out, loss = ipu(x, y)
    assert out.shape == (12, 3) and loss.shape == (3,)
    expected = torch.stack([model(xs, ys)[1] for xs, ys in zip(x.chunk(3), y.chunk(3))])
    torch.testing.assert_close(loss, expected.detach())


def test_set_optimizer_changes_lr_without_recompiling():
    model, ipu, reference, ref_optimizer = twins(lambda p: poptorch.optim.SGD(p, lr=0.1),
                                                 lambda p: torch.optim.SGD(p, lr=0.1))
    ipu(*data(4, 0))
    reference_steps(reference, ref_optimizer, *data(4, 0), 1)
    compiled = poptorch.metrics()["graphs_compiled"]
    ipu.setOptimizer(poptorch.optim.SGD(model.parameters(), lr=0.01))
    for g in ref_optimizer.param_groups:
        g["lr"] = 0.01
    ipu(*data(4, 1))
    reference_steps(reference, ref_optimizer, *data(4, 1), 1)
    assert poptorch.metrics()["graphs_compiled"] == compiled
    torch.testing.assert_close(model.l1.weight, reference.l1.weight)


def test_a_scheduler_stepped_without_set_optimizer_is_followed():
    # PopTorch needs setOptimizer() after the host optimiser changes, and runs the old
    # learning rate without it; here the next call takes the new one, as on the CPU.
    optimizers = []

    def sgd(params):
        optimizers.append(torch.optim.SGD(params, lr=0.1))
        return optimizers[-1]

    model, ipu, reference, ref_optimizer = twins(sgd, sgd)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in optimizers]
    compiled = None
    for step in range(3):
        ipu(*data(4, step))
        reference_steps(reference, ref_optimizer, *data(4, step), 1)
        for scheduler in schedulers:
            scheduler.step()
        compiled = compiled or poptorch.metrics()["graphs_compiled"]
    assert poptorch.metrics()["graphs_compiled"] == compiled
    torch.testing.assert_close(model.l1.weight, reference.l1.weight)


def test_a_constant_attribute_changed_on_the_host_is_an_error_at_the_next_call():
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ipu = poptorch.trainingModel(model, None, optimizer)
    ipu(*data(4))
    optimizer.param_groups[0]["weight_decay"] = 0.1
    with pytest.raises(poptorch.Error, match="'weight_decay' is a constant"):
        ipu(*data(4))


def test_an_optimizer_of_another_models_parameters_is_an_error():
    model = Classifier()
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(Classifier().parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="holds none of the model's parameters"):
        ipu(*data(4))


def test_changing_a_constant_attribute_is_an_error():
    model = Classifier()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer.variable_attrs.markAsConstant("momentum")
    ipu = poptorch.trainingModel(model, None, optimizer)
    ipu(*data(4))
    with pytest.raises(poptorch.Error, match="'momentum' is a constant.*markAsVariable"):
        ipu.setOptimizer(poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))


def test_torch_optimiser_defaults_are_constants():
    model = Classifier()
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    ipu(*data(4))
    ipu.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.5))  # lr is always variable
    with pytest.raises(poptorch.Error, match="'weight_decay' is a constant"):
        ipu.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.1))


class CustomLoss(torch.nn.Module):
    def __init__(self, reduction):
        super().__init__()
        self.l = torch.nn.Linear(4, 2)
        self.reduction = reduction

    def forward(self, x):
        out = self.l(x)
        return out, poptorch.identity_loss((out ** 2).sum(1), reduction=self.reduction)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_identity_loss_marks_custom_losses(reduction):
    torch.manual_seed(0)
    model = CustomLoss(reduction)
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.01))
    x = torch.randn(5, 4)
    _, loss = ipu(x)
    opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    _, ref_loss = reference(x)
    ref_loss.backward()
    opt.step()
    torch.testing.assert_close(loss, ref_loss.detach())
    torch.testing.assert_close(model.l.weight, reference.l.weight)


def test_identity_loss_rejects_unknown_reductions():
    with pytest.raises(poptorch.Error, match="reduction must be one of"):
        poptorch.identity_loss(torch.ones(2), reduction="max")


def test_a_training_model_without_a_loss_is_an_error():
    model = torch.nn.Linear(4, 2)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph: trainingModel needs"):
        ipu(torch.randn(2, 4))


class ScalarWithoutGradient(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.how = how
        if how == "frozen":
            self.lin.requires_grad_(False)

    def forward(self, x):
        if self.how == "no_grad":
            with torch.no_grad():
                return self.lin(x).sum()
        y = self.lin(x)
        return (y.detach() if self.how == "detached" else y).sum()


@pytest.mark.parametrize("how", ["detached", "no_grad", "frozen"])
def test_a_returned_scalar_that_requires_no_gradient_trains_as_its_forward_pass(how):
    """As a loss module or identity_loss that reaches no trainable parameter
    (PopTorch's frozen models): the step returns the CPU's loss and updates nothing."""
    torch.manual_seed(0)
    model = ScalarWithoutGradient(how)
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1,
                                                              momentum=0.9, weight_decay=0.1))
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(ipu(x), reference(x))
    ipu.copyWeightsToHost()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, msg=name)


def test_several_scalars_that_require_no_gradient_are_no_loss():
    model = ScalarWithoutGradient("frozen")
    model.forward = lambda x: (model.lin(x).sum(), model.lin(x).mean())
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="returns 2 scalars and none requires a gradient"):
        ipu(torch.randn(2, 4))


def test_bad_batches_and_changed_inputs_are_errors():
    model = Classifier()
    opts = poptorch.Options().deviceIterations(2)
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="multiple of deviceIterations \\(2\\)"):
        ipu(*data(5))
    ipu(*data(8))
    shapes = r"Shape mismatch for x: expected torch.Size\(\[8, 6\]\) but got torch.Size\(\[10, 6\]\)"
    with pytest.raises(poptorch.Error, match=shapes):
        ipu(*data(10))
    x, y = data(8)
    with pytest.raises(poptorch.Error, match="torch.int32"):
        ipu(x, y.int())


def test_original_model_holds_trained_weights_and_copies_work():
    torch.manual_seed(0)
    model = Classifier()
    before = model.l1.weight.detach().clone()
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.5))
    ipu(*data(4))
    assert not torch.equal(model.state_dict()["l1.weight"], before)
    model.l1.weight.data = torch.zeros_like(before)  # replaced on the host
    ipu.copyWeightsToDevice()
    inference = poptorch.inferenceModel(model)
    out = inference(data(4)[0])
    torch.testing.assert_close(out, model(data(4)[0]))


def test_training_updates_are_seen_by_an_inference_model_of_the_same_model():
    model = Classifier()
    training = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.5))
    inference = poptorch.inferenceModel(model)
    x, y = data(4)
    first = inference(x)
    training(x, y)
    second = inference(x)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, model(x))


def test_optimizer_state_dict_reads_and_writes_the_device():
    torch.manual_seed(0)
    model = Classifier()
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.01)
    ipu = poptorch.trainingModel(model, None, optimizer)
    ipu(*data(4))
    state = copy.deepcopy(optimizer.state_dict())  # as on the CPU, state_dict() is live
    assert float(state["state"][0]["step"]) == 1.0
    assert state["state"][0]["exp_avg"].abs().sum() > 0
    ipu(*data(4, 1))
    assert float(optimizer.state_dict()["state"][0]["step"]) == 2.0
    optimizer.load_state_dict(state)
    assert float(optimizer.state_dict()["state"][0]["step"]) == 1.0


def test_detach_attach_and_destroy():
    model, ipu, reference, ref_optimizer = twins(lambda p: poptorch.optim.Adam(p, lr=0.01),
                                                 lambda p: torch.optim.Adam(p, lr=0.01))
    before = torch.ipu.memory_allocated(0)
    ipu(*data(4, 0))
    reference_steps(reference, ref_optimizer, *data(4, 0), 1)
    held = torch.ipu.memory_allocated(0)
    ipu.detachFromDevice()
    assert torch.ipu.memory_allocated(0) < held
    assert not ipu.isAttachedToDevice()
    with pytest.raises(RuntimeError, match="Device is not attached"):  # PopTorch's words
        ipu.detachFromDevice()
    ipu.attachToDevice()
    ipu(*data(4, 1))
    reference_steps(reference, ref_optimizer, *data(4, 1), 1)
    torch.testing.assert_close(model.l1.weight, reference.l1.weight, rtol=1e-4, atol=1e-6)
    ipu.destroy()
    assert torch.ipu.memory_allocated(0) <= before + 1024
    assert not ipu.isCompiled() and not ipu.isAttachedToDevice()
    # As in PopTorch, the next call compiles again (here for another batch
    # size), and training goes on from the weights and optimiser state.
    ipu(*data(2, 2))
    reference_steps(reference, ref_optimizer, *data(2, 2), 1)
    torch.testing.assert_close(model.l1.weight, reference.l1.weight, rtol=1e-4, atol=1e-6)


def test_compile_without_running_and_is_running_on_ipu():
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(2, 2)

        def forward(self, x):
            seen.append(poptorch.isRunningOnIpu())
            return self.l(x)

    ipu = poptorch.inferenceModel(Probe())
    assert not ipu.isCompiled()
    ipu.compile(torch.ones(3, 2))
    assert ipu.isCompiled() and seen == [True]
    assert not poptorch.isRunningOnIpu()


@pytest.mark.parametrize("extra", [dict(loss_scaling=128.0), dict(max_grad_norm=0.05),
                                   dict(velocity_scaling=4.0)])
def test_sgd_extras_match_their_cpu_meaning(extra):
    model, ipu, reference, ref_optimizer = twins(
        lambda p: poptorch.optim.SGD(p, lr=0.1, momentum=0.9, **extra),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    for call in range(3):
        x, y = data(8, call)
        ipu(x, y)
        ref_optimizer.zero_grad()
        reference(x, y)[1].backward()
        if "max_grad_norm" in extra:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), extra["max_grad_norm"])
        ref_optimizer.step()
    torch.testing.assert_close(model.l1.weight, reference.l1.weight, rtol=1e-4, atol=1e-6)


def test_lamb_trains_like_its_cpu_implementation():
    lamb = lambda p: poptorch.optim.LAMB(p, lr=0.01)  # noqa: E731
    model, ipu, reference, ref_optimizer = twins(lamb, lamb)
    for call in range(3):
        ipu(*data(8, call))
        reference_steps(reference, ref_optimizer, *data(8, call), 1)
    torch.testing.assert_close(model.l1.weight, reference.l1.weight, rtol=1e-4, atol=1e-6)


def test_helpers_and_error_classes():
    assert poptorch.ipuHardwareIsAvailable() is False
    assert poptorch.ipuHardwareVersion() == 2
    error = poptorch.RecoverableError("link lost", "IPU_RESET")
    assert isinstance(error, poptorch.Error) and error.recovery_action == "IPU_RESET"
    assert error.message == "link lost" and error.type and isinstance(error.location, str)
    assert issubclass(poptorch.UnrecoverableError, poptorch.Error)
    try:
        poptorch.trainingModel(torch.nn.Linear(2, 2))(torch.ones(1, 2))
    except poptorch.Error as e:
        assert "needs a loss" in e.message and "test_training_model.py" in e.location


class CountingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        self.calls.add_(1)
        return x + self.calls


def test_inference_micro_batches_that_update_a_buffer_run_in_order():
    model = CountingModel()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(6))
    out = ipu(torch.zeros(6, 1))
    assert out.flatten().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert float(model.calls) == 6.0


def test_host_tensors_held_outside_the_model_are_constants_of_the_step():
    """A loss weight held in a closure, not by the model: the composite op
    computes (1 - target).mul_(input) on it, which mixed host and ipu tensors."""
    torch.manual_seed(0)
    target, weight, pos_weight = torch.rand(6, 3), torch.rand(6, 3), torch.rand(3)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.lin(x)
            return y, torch.nn.functional.binary_cross_entropy_with_logits(
                y, target, weight=weight, pos_weight=pos_weight)

    train_beside_the_cpu(Model(), [(torch.rand(6, 3),) for _ in range(3)],
                         loss_of=lambda out: out[1])


class _Checkpointed(torch.nn.Module):
    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.inner, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        self.use_reentrant = use_reentrant

    def forward(self, x):
        hidden = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(self.inner(t)), x,
                                                   use_reentrant=self.use_reentrant)
        return self.head(hidden).sum()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_trains_like_the_cpu(use_reentrant):
    # Checkpointed forward ran again in backward with the host's weights, stale once the
    # device had trained them: the losses parted from the CPU's at the third step.
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = train_beside_the_cpu(_Checkpointed(use_reentrant), [(x,)] * 4)
    model.destroy()
