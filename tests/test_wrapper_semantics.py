"""How trainingModel/inferenceModel treat the model's Python code, as PopTorch
does: modes, tensors made in forward, in-place inputs, unusual inputs and
outputs. Each compared with the model run on the CPU."""
import copy
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import poptorch
from conftest import train_beside_the_cpu


class MakesTensorsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.offsets = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a plain attribute, not a buffer

    def forward(self, x):
        scale = torch.tensor([0.5, 1.0, 1.5, 2.0])
        ramp = torch.arange(4).float()
        ones = torch.ones(x.shape[0], 4)
        return self.lin(x) * scale + ramp + ones + self.offsets


def test_tensors_made_in_forward_on_the_cpu_are_constants_of_the_step():
    model = MakesTensorsInForward()
    ipu = poptorch.inferenceModel(model)
    for seed in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(ipu(x), model(x))


def test_random_tensors_made_in_forward_are_drawn_on_every_run():
    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + torch.rand(x.shape[0], 4)

    ipu = poptorch.inferenceModel(Noisy())
    x = torch.zeros(2, 4)
    first, second = ipu(x), ipu(x)
    assert first.shape == (2, 4) and not torch.equal(first, second)
    assert ((first >= 0) & (first < 1)).all()


class AddsToItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, counter):
        x += 1
        torch.add(counter, 1, out=counter)
        return self.lin(x)


@pytest.mark.parametrize("iterations", [1, 3])
def test_in_place_updates_of_inputs_reach_the_callers_tensors(iterations):
    model = AddsToItsInput()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(iterations))
    x = torch.randn(2 * iterations, 3)
    counter = torch.zeros(2 * iterations, 2)
    expected_x, expected_counter = x.clone(), counter.clone()
    expected = model(expected_x, expected_counter)
    torch.testing.assert_close(ipu(x, counter), expected)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(counter, expected_counter)


def test_an_input_updated_in_place_that_the_wrapper_copied_is_updated_too():
    model = AddsToItsInput()
    ipu = poptorch.inferenceModel(model)
    x = torch.randn(3, 2).t()  # not contiguous: the wrapper works on a copy
    counter = torch.zeros(2, 2, dtype=torch.float64)  # demoted to float32
    expected_x, expected_counter = x.clone(), counter.clone()
    model(expected_x, expected_counter)
    ipu(x, counter)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(counter, expected_counter)


class Asks64Bits(torch.nn.Module):
    """A model that asks for 64-bit floating point one way or another."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(2, 2)
        self.offsets = torch.tensor([0.5, -1.0], dtype=torch.float64)  # not a buffer

    def forward(self, x):
        y = self.lin(x)
        if self.how == "cast":
            return y.double() * 2 + y.to(torch.float64) + y.type(torch.float64)
        if self.how == "factory":
            return y + torch.ones(2, dtype=torch.float64) + torch.tensor(3.0, dtype=torch.double)
        if self.how == "from data":
            return y + torch.tensor(np.array([1.5, 2.5])) + torch.from_numpy(np.ones(2))
        if self.how == "host tensor":
            return y * self.offsets
        return y.cdouble() * (1 + 2j)


@pytest.mark.parametrize("how", ["cast", "factory", "from data", "host tensor", "complex"])
def test_64_bit_floats_in_the_model_run_in_32_bits_as_in_poptorch(how):
    # Upstream type_support_test: IPUs have no 64-bit floating point, so a
    # wrapped model runs what asks for it in 32 bits (float32, complex64).
    torch.manual_seed(0)
    model = Asks64Bits(how)
    x = torch.randn(3, 2)
    expected = model(x)
    out = poptorch.inferenceModel(model)(x)
    assert out.dtype == {torch.float64: torch.float32,
                         torch.complex128: torch.complex64}[expected.dtype]
    torch.testing.assert_close(out, expected.to(out.dtype))


class Casts64BitsWithALoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Asks64Bits("cast")

    def forward(self, x, target):
        out = self.model(x)
        return out, F.mse_loss(out.float(), target)


def test_64_bit_casts_in_a_training_model_train_like_the_cpu():
    torch.manual_seed(0)
    batches = [(torch.randn(4, 2), torch.randn(4, 2)) for _ in range(3)]
    train_beside_the_cpu(Casts64BitsWithALoss(), batches, lambda out: out[1])


class ScalesByAScalar(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, factor):
        return self.lin(x) * factor


def test_0_dim_inputs_feed_every_micro_batch_whole():
    model = ScalesByAScalar()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    x = torch.randn(4, 3)
    for factor in (2.0, -1.0):
        torch.testing.assert_close(ipu(x, torch.tensor(factor)), model(x, torch.tensor(factor)))


def test_a_model_that_returns_its_inputs_returns_each_micro_batch():
    class Identity(torch.nn.Module):
        def forward(self, x, y):
            return y, x

    ipu = poptorch.inferenceModel(Identity(), poptorch.Options().deviceIterations(2))
    x, y = torch.randn(4, 3), torch.arange(8).reshape(4, 2)
    out_y, out_x = ipu(x, y)
    torch.testing.assert_close(out_x, x)
    torch.testing.assert_close(out_y, y.int())  # int64 results come back as int32


def test_int64_results_come_back_as_int32_as_in_poptorch():
    class Argmax(torch.nn.Module):
        def forward(self, x):
            return x.argmax(dim=1), x.sum(dim=1)

    ipu = poptorch.inferenceModel(Argmax())
    x = torch.randn(5, 7)
    indices, sums = ipu(x)
    assert indices.dtype == torch.int32
    torch.testing.assert_close(indices, x.argmax(dim=1).int())
    torch.testing.assert_close(sums, x.sum(dim=1))


def test_dict_inputs_and_outputs_keep_their_key_order():
    class Dicts(torch.nn.Module):
        def forward(self, inputs):
            assert list(inputs) == ["b", "a"]
            return OrderedDict([("second", inputs["a"] * 2), ("first", inputs["b"] + 1)])

    ipu = poptorch.inferenceModel(Dicts())
    inputs = OrderedDict([("b", torch.ones(2, 2)), ("a", torch.arange(4.0).reshape(2, 2))])
    out = ipu(inputs)
    assert list(out) == ["second", "first"]
    torch.testing.assert_close(out["second"], inputs["a"] * 2)
    torch.testing.assert_close(out["first"], inputs["b"] + 1)


class Pair:
    """A user type holding two tensors."""

    def __init__(self, left, right):
        self.left, self.right = left, right


class PairParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):
        yield struct.left
        yield struct.right

    def reconstruct(self, original_structure, tensor_iterator):
        return Pair(next(tensor_iterator), next(tensor_iterator))


def test_inputs_of_a_user_type_go_through_its_registered_parser():
    poptorch.registerCustomArgParser(Pair, PairParser())

    class UsesPairs(torch.nn.Module):
        def forward(self, pair):
            return pair.left * pair.right

    ipu = poptorch.inferenceModel(UsesPairs(), poptorch.Options().deviceIterations(2))
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        pair = Pair(torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g))
        torch.testing.assert_close(ipu(pair), pair.left * pair.right)


def test_a_parser_must_be_an_icustomargparser():
    with pytest.raises(poptorch.Error, match="ICustomArgParser"):
        poptorch.registerCustomArgParser(Pair, object())


class DropsInTraining(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.9)

    def forward(self, x, y):
        out = self.drop(self.lin(x))
        return out, (out - y).pow(2).mean()


def test_training_keeps_each_submodules_mode():
    torch.manual_seed(0)
    model = DropsInTraining()
    model.drop.eval()  # the user switched dropout off
    batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g))
               for g in (torch.Generator().manual_seed(seed) for seed in range(3))]
    train_beside_the_cpu(model, batches, loss_of=lambda out: out[1])
    assert model.training and not model.drop.training


def test_inference_of_a_model_in_train_mode_runs_it_in_train_mode():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    reference = copy.deepcopy(model)
    ipu = poptorch.inferenceModel(model)
    x = torch.randn(6, 4)
    torch.testing.assert_close(ipu(x), reference(x))  # batch statistics, as on the CPU
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)


def _ctc(h):
    log_probs = h.reshape(4, 3, 4).log_softmax(2)  # (time, batch, classes)
    targets = torch.tensor([[1, 2], [3, 3], [2, 1]])
    return F.ctc_loss(log_probs, targets, torch.full((3,), 4), torch.full((3,), 2))


DATA_DEPENDENT_LOOKING = {
    "max": lambda h: h.max(),
    "max_dim": lambda h: h.max(dim=1).values.sum(),
    "min": lambda h: h.min(),
    "median": lambda h: h.median(),
    "prod": lambda h: h.prod(dim=1).sum(),
    "cumprod": lambda h: h.cumprod(dim=1).sum(),
    "advanced_indexing": lambda h: h[h.argmax(dim=0) % h.shape[0]].sum(),
    "ctc_loss": _ctc,
}


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT_LOOKING))
def test_backward_of_ops_that_look_data_dependent_trains_like_the_cpu(name):
    loss_of = DATA_DEPENDENT_LOOKING[name]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return loss_of(self.lin(x))

    torch.manual_seed(0)
    batches = [(torch.randn(12, 4, generator=torch.Generator().manual_seed(seed)),)
               for seed in range(3)]
    train_beside_the_cpu(Model(), batches, rtol=1e-5, atol=1e-5)


def test_a_learning_rate_scheduler_stepped_after_a_call_does_not_warn(recwarn):
    model = DropsInTraining()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    ipu = poptorch.trainingModel(model, None, optimizer)
    ipu(torch.randn(4, 8), torch.randn(4, 8))
    scheduler.step()
    ipu.setOptimizer(optimizer)
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


class ReturnsItsLoss(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.how = how

    def forward(self, x, t):
        y = self.lin(x)
        if self.how == "functional":
            return y, F.cross_entropy(y, t)
        if self.how == "module made in forward":
            return y, torch.nn.CrossEntropyLoss()(y, t)
        return y, F.cross_entropy(y, t), F.nll_loss(y.log_softmax(1), t)  # two losses


@pytest.mark.parametrize("how", ["functional", "module made in forward"])
def test_the_loss_the_model_returns_is_the_one_trained(how):
    torch.manual_seed(0)
    generators = [torch.Generator().manual_seed(seed) for seed in range(2)]
    batches = [(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g))
               for g in generators]
    train_beside_the_cpu(ReturnsItsLoss(how), batches, loss_of=lambda out: out[1])


def test_several_returned_losses_must_be_combined():
    ipu = poptorch.trainingModel(ReturnsItsLoss("two"))
    with pytest.raises(poptorch.Error, match="2 scalar losses.*identity_loss"):
        ipu(torch.randn(5, 4), torch.randint(0, 3, (5,)))


class SharesModulesAndWeights(torch.nn.Module):
    """A submodule registered under two names, and a weight tied across two modules."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)
        self.wrapper = torch.nn.Sequential(self.inner)
        self.decoder = torch.nn.Linear(4, 4, bias=False)
        self.decoder.weight = self.inner.weight

    def forward(self, x, y):
        return F.mse_loss(self.decoder(self.wrapper(x)), y)


def test_modules_and_weights_shared_under_several_names_train_and_stay_on_the_host():
    torch.manual_seed(0)
    batches = [(torch.randn(3, 4), torch.randn(3, 4)) for _ in range(3)]
    model = SharesModulesAndWeights()
    train_beside_the_cpu(model, batches)  # also checks the devices of the weights
    assert model.decoder.weight is model.inner.weight
    assert all(not t.is_ipu for t in model.state_dict().values())


class NormalisesAndReads(torch.nn.Module):
    """Batch norm (its statistics move only in train mode) and a value read
    on the host (each new value captures another variant of the step)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        y = self.norm(self.lin(x))
        return y.pow(2).mean() * (2.0 if x[0, 0].item() > 0 else 1.0)


@pytest.mark.parametrize("how", ["attached again", "another variant"])
def test_a_step_captured_again_keeps_the_modes_it_was_compiled_in(how):
    # PopTorch compiles the model in the modes it has then; model.eval() for
    # validation must not turn a step captured again into an eval-mode step
    # (batch norm statistics frozen, as on the CPU in eval mode).
    torch.manual_seed(0)
    model = NormalisesAndReads()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.rand(4, 3)
    batches = [x, x, -x if how == "another variant" else x]
    for step, batch in enumerate(batches):
        if step == 1:
            if how == "attached again":
                training.detachFromDevice()
            model.eval()  # validation on the CPU between training calls
            model(batch)
        loss = training(batch)
        optimizer.zero_grad()
        expected = reference(batch)
        expected.backward()
        optimizer.step()
        torch.testing.assert_close(loss, expected.detach())
    assert not model.training  # the user's modes are the user's
    model.train()
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


def _new_data(model):
    model.lin.weight.data = torch.full((3, 3), 0.25)  # the tensor is the same, its data not


def _new_parameter(model):
    model.lin.weight = torch.nn.Parameter(torch.full((3, 3), 0.25))


def _new_buffer(model):
    model.norm.running_mean = torch.full((3,), 0.5)


def _loaded_by_assignment(model):
    state = {name: torch.full_like(t, 0.25) for name, t in model.state_dict().items()}
    model.load_state_dict(state, assign=True)


HOST_CHANGES = {"param.data =": _new_data, "a new Parameter": _new_parameter,
                "a buffer assigned anew": _new_buffer,
                "load_state_dict(assign=True)": _loaded_by_assignment}


@pytest.mark.parametrize("how", HOST_CHANGES)
def test_weights_changed_on_the_host_are_used_by_the_next_call(how):
    # PopTorch needs copyWeightsToDevice() here and runs the old weights without it.
    torch.manual_seed(0)
    model = NormalisesAndReads().eval()
    reference = copy.deepcopy(model)
    ipu = poptorch.inferenceModel(model)
    x = torch.rand(4, 3)
    torch.testing.assert_close(ipu(x), reference(x))
    for m in (model, reference):
        HOST_CHANGES[how](m)
    torch.testing.assert_close(ipu(x), reference(x))
    with torch.no_grad():  # the new tensors are the device's now: in-place changes reach it
        model.lin.bias.add_(1)
        reference.lin.bias.add_(1)
    torch.testing.assert_close(ipu(x), reference(x))


def test_training_goes_on_from_weights_given_new_data_on_the_host():
    torch.manual_seed(0)
    model = NormalisesAndReads()
    x = torch.rand(4, 3)
    training = train_beside_the_cpu(model, [(x,)], loss_of=lambda out: out)
    _new_data(model)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    loss = training(x)
    expected = reference(x)
    expected.backward()
    optimizer.step()
    torch.testing.assert_close(loss, expected.detach())
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)


HOST_CHANGES_A_STEP_CANNOT_TAKE = {
    "a parameter its optimizer does not hold": (True, _new_parameter, "optimizer updates the old"),
    "a parameter removed": (False, lambda m: setattr(m.lin, "bias", None), "removed"),
    "another dtype": (False, lambda m: m.half(), "torch.float16 tensor of shape"),
    "another shape": (False, lambda m: setattr(m.lin.weight, "data", torch.ones(3, 2)),
                      "of shape \\[3, 2\\]"),
    # The step ran the old module, silently.
    "a submodule replaced": (False, lambda m: setattr(m, "lin", torch.nn.Linear(3, 3)),
                             "submodule 'lin' was replaced by another module.*destroy"),
    "a submodule added": (True, lambda m: m.add_module("extra", torch.nn.ReLU()),
                          "submodule 'extra' was added"),
    "a gradient hook added": (True, lambda m: m.lin.bias.register_hook(lambda g: g * 0),
                              "hooks on the model's parameter 'lin.bias' changed"),
    # The step ran without the hook, or went on training the frozen weight, silently.
    "a forward hook added": (False, lambda m: m.lin.register_forward_hook(lambda *a: a[2] * 2),
                             "forward hook was registered on or removed from the model's "
                             "submodule 'lin'.*destroy"),
    "a forward pre-hook added": (True, lambda m: m.register_forward_pre_hook(lambda *a: None),
                                 "forward hook was registered on or removed from the model "),
    "a parameter frozen": (True, lambda m: m.lin.weight.requires_grad_(False),
                           "'lin.weight' was frozen.*goes on training it.*destroy"),
}


@pytest.mark.parametrize("case", HOST_CHANGES_A_STEP_CANNOT_TAKE)
def test_a_host_change_the_compiled_step_cannot_take_is_an_error(case):
    training, change, message = HOST_CHANGES_A_STEP_CANNOT_TAKE[case]
    model = NormalisesAndReads()
    wrapped = (poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
               if training else poptorch.inferenceModel(model))
    x = torch.rand(4, 3)
    wrapped(x)
    change(model)
    with pytest.raises(poptorch.Error, match=message):
        wrapped(x)


def test_a_forward_hook_removed_after_compiling_is_an_error_and_destroy_takes_the_hooks():
    torch.manual_seed(0)
    model = NormalisesAndReads().eval()
    reference = copy.deepcopy(model)
    handle = model.lin.register_forward_hook(lambda module, args, out: out * 2)
    reference.lin.register_forward_hook(lambda module, args, out: out * 2)
    ipu = poptorch.inferenceModel(model)
    x = torch.rand(4, 3)
    torch.testing.assert_close(ipu(x), reference(x))
    handle.remove()
    with pytest.raises(poptorch.Error, match="submodule 'lin' after the model was compiled"):
        ipu(x)
    ipu.destroy()
    torch.testing.assert_close(ipu(x), copy.deepcopy(model)(x))


def test_a_parameter_frozen_before_compiling_again_stays_as_it_is():
    torch.manual_seed(0)
    model = NormalisesAndReads()
    x = torch.rand(4, 3)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    training(x)
    model.lin.weight.requires_grad_(False)
    training.destroy()
    frozen, bias = model.lin.weight.detach().clone(), model.lin.bias.detach().clone()
    training(x)
    torch.testing.assert_close(model.lin.weight.detach(), frozen, rtol=0, atol=0)
    assert not torch.equal(model.lin.bias.detach(), bias)  # the others train


GRADIENT_HOOKS = {"zeroes": lambda g: g * 0, "clamps": lambda g: g.clamp(-0.01, 0.01),
                  "observes": lambda g: None}


@pytest.mark.parametrize("hook", GRADIENT_HOOKS.values(), ids=GRADIENT_HOOKS.keys())
def test_gradient_hooks_on_parameters_change_the_training_step(hook):
    # The step differentiated the device copies, and left the hooks on the host
    # parameters out: a zeroed gradient still trained, silently.
    # The second batch reads another value on the host: the hooks are in its variant too.
    torch.manual_seed(0)
    model = NormalisesAndReads()

    def register_hooks(m: torch.nn.Module) -> None:
        m.lin.weight.register_hook(hook)
        m.lin.bias.register_hook(lambda g: g * 3)

    x = torch.rand(4, 3)
    training = train_beside_the_cpu(model, [(x,), (x * 2,), (x,)], prepare=register_hooks)
    handle = model.lin.bias.register_hook(lambda g: g)
    with pytest.raises(poptorch.Error, match="hooks on the model's parameter 'lin.bias' changed"):
        training(x)
    handle.remove()
    training(x)


def test_a_post_accumulate_grad_hook_is_an_error_in_a_training_model():
    model = NormalisesAndReads()
    model.lin.weight.register_post_accumulate_grad_hook(lambda p: None)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="'lin.weight' has a hook that runs once its .grad "
                       "is accumulated.*never fills .grad"):
        training(torch.rand(4, 3))
