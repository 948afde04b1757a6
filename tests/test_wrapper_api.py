"""PopTorch's API around a wrapped model: anchored tensors, state, hooks, repr,
destroy on the model, setLogLevel."""
import copy
import io
import logging
import pickle

import pytest
import torch

import poptorch
from poptorch import OutputMode


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.fc2 = torch.nn.Linear(3, 2)
        self.register_buffer("offset", torch.zeros(2))

    def forward(self, x, y=None):
        out = self.fc2(torch.relu(self.fc1(x))) + self.offset
        if y is None:
            return out
        return out, ((out - y) ** 2).mean()


def net():
    torch.manual_seed(0)
    return Net()


def batch(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)


# --- anchored tensors ----------------------------------------------------------

def cpu_micro_batches(model, x, y, lr):
    """Per micro-batch of 2 rows: fc2.bias's gradient, then fc2.weight after
    the SGD step."""
    grads, weights = [], []
    for xs, ys in zip(x.split(2), y.split(2)):
        model.zero_grad()
        model(xs, ys)[1].backward()
        grads.append(model.fc2.bias.grad.clone())
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        weights.append(model.fc2.weight.detach().clone())
    return torch.stack(grads), torch.stack(weights)


class _DebugLines(logging.Handler):
    """Collects poptorch's DEBUG messages while entered."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self._level = poptorch.logger.level
        poptorch.logger.addHandler(self)
        poptorch.logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc):
        poptorch.logger.removeHandler(self)
        poptorch.logger.setLevel(self._level)


def test_anchored_gradients_and_updated_weights_match_the_cpu():
    opts = poptorch.Options().deviceIterations(3)
    opts.anchorTensor("grad", "Gradient___model.fc2.bias", OutputMode.All)  # PopTorch's prefix
    opts.anchorTensor("weight", "UpdatedVar___fc2.weight")  # the model's mode: Final
    opts.anchorTensor("summed", "Gradient___fc2.bias", OutputMode.Sum)
    opts.anchorTensor("every2", "fc2.weight", OutputMode.EveryN, 3)
    model, reference = net(), net()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch(6)
    logged = _DebugLines()
    with logged:
        out, loss = training(x, y)
    # PopTorch's words: name, PopART's mode name / period
    for line in ("Gradient___model.fc2.bias ALL/1", "UpdatedVar___fc2.weight FINAL/1",
                 "Gradient___fc2.bias Sum/1", "fc2.weight EVERYN/3"):
        assert any(line in text for text in logged.lines), (line, logged.lines)
    grads, weights = cpu_micro_batches(reference, x, y, lr=0.1)
    torch.testing.assert_close(training.getAnchoredTensor("grad"), grads.flatten())
    torch.testing.assert_close(training.getAnchoredTensor("weight"), weights[-1])
    torch.testing.assert_close(training.getAnchoredTensor("summed"), grads.sum(0))
    torch.testing.assert_close(training.getAnchoredTensor("every2"), weights[2])
    assert loss.dim() == 0, "the model's own outputs keep their mode (Final)"


def test_anchors_in_inference_and_tensor_names():
    opts = poptorch.Options().deviceIterations(2).anchorTensor("offset", "offset")
    model = net()
    inference = poptorch.inferenceModel(model, opts)
    with pytest.raises(poptorch.Error, match="not compiled yet") as error:
        inference.getTensorNames()
    assert isinstance(error.value, AssertionError)  # PopTorch asserts it
    inference(batch(4)[0])
    assert inference.getTensorNames() == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                          "offset"]
    torch.testing.assert_close(inference.getAnchoredTensor("offset"), torch.zeros(4))
    with pytest.raises(poptorch.Error, match="no tensor anchored as 'nope'"):
        inference.getAnchoredTensor("nope")
    training = poptorch.trainingModel(net())
    training(*batch(2))
    assert "Gradient___fc1.weight" in training.getTensorNames()
    assert "UpdatedVar___fc2.bias" in training.getTensorNames()


@pytest.mark.parametrize("name, accumulation, message", [
    ("Gradient___fc9.bias", 1, "the model has no tensor 'Gradient___fc9.bias'"),
    ("UpdatedVar___fc2.bias", 2, "only return updated weights when each micro-batch"),
])
def test_anchor_errors(name, accumulation, message):
    opts = poptorch.Options().anchorTensor("a", name)
    opts.Training.gradientAccumulation(accumulation)
    with pytest.raises(poptorch.Error, match=message):
        poptorch.trainingModel(net(), opts)(*batch(2 * accumulation))


# --- state ---------------------------------------------------------------------

def test_load_state_dict_writes_the_device():
    model = net()
    inference = poptorch.inferenceModel(model)
    x = batch(4)[0]
    inference(x)
    other = Net()
    result = inference.load_state_dict(other.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    torch.testing.assert_close(inference(x), other(x).detach())
    with pytest.raises(RuntimeError, match="Missing key"):
        inference.load_state_dict({}, strict=True)


def test_copy_named_buffers_to_device_takes_a_new_buffer():
    model = net()
    opts = poptorch.Options().updatableNamedBuffers(["offset"])
    inference = poptorch.inferenceModel(model, opts)
    x = batch(4)[0]
    before = inference(x)
    model.offset = torch.full((2,), 5.0)  # a new tensor object
    inference.copyNamedBuffersToDevice()
    torch.testing.assert_close(inference(x), before + 5)
    model.offset = torch.full((2,), 3.0)  # the next call takes it without the copy too
    torch.testing.assert_close(inference(x), before + 3)
    model.offset.fill_(1.0)  # and it is now the device's
    torch.testing.assert_close(inference(x), before + 1)


def test_copy_named_buffers_to_device_errors():
    with pytest.raises(poptorch.Error, match="no buffer is updatable"):
        poptorch.inferenceModel(net()).copyNamedBuffersToDevice()
    with pytest.raises(poptorch.Error, match=r"no buffer \['bias'\]"):
        opts = poptorch.Options().updatableNamedBuffers(["bias"])
        poptorch.inferenceModel(net(), opts).copyNamedBuffersToDevice()
    with pytest.raises(poptorch.Error, match="not attached"):
        opts = poptorch.Options().updatableNamedBuffers(["offset"])
        poptorch.inferenceModel(net(), opts).copyNamedBuffersToDevice()


class Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand_like(x)


def test_rng_state_replays_the_random_numbers():
    inference = poptorch.inferenceModel(Noisy())
    x = torch.zeros(3, 2)
    inference(x)
    state = inference.rng_state
    assert all(isinstance(v, int) for v in state)
    first = inference(x)
    assert not torch.equal(first, inference(x))
    inference.rng_state = state
    torch.testing.assert_close(inference(x), first)
    with pytest.raises(poptorch.Error, match="rng_state takes the list"):
        inference.rng_state = [1, 2, 3]


def test_models_wrapped_with_one_random_seed_draw_the_same_numbers():
    """As PopTorch (upstream random_sampling_test test_random_seed_repeatability):
    Options.randomSeed(n) fixes a model's random numbers, however many models
    were compiled before; the second model drew other numbers."""
    opts = poptorch.Options().randomSeed(42)
    x = torch.zeros(3, 2)
    first = poptorch.inferenceModel(Noisy(), opts)(x)
    torch.testing.assert_close(poptorch.inferenceModel(Noisy(), opts)(x), first)
    torch.manual_seed(5)  # the host's generator does not change them either
    torch.testing.assert_close(poptorch.inferenceModel(Noisy(), opts)(x), first)
    other = poptorch.inferenceModel(Noisy(), poptorch.Options().randomSeed(43))(x)
    assert not torch.equal(other, first)


def test_copy_weights_to_host_if_needed_is_never_needed():
    model = net()
    training = poptorch.trainingModel(model)
    training(*batch(2))
    assert training.copyWeightsToHostIfNeeded() is False
    assert model.copyWeightsToHostIfNeeded() is False


# --- the wrapped model -----------------------------------------------------------

def test_copying_weights_before_the_first_call_is_a_no_op():
    # The user guide's trainingModel.py calls copyWeightsToDevice() on an
    # inference model that never ran after training the host model.
    model = net()
    inference = poptorch.inferenceModel(model)
    inference.copyWeightsToHost()
    with torch.no_grad():
        model.fc1.weight.mul_(2)
    inference.copyWeightsToDevice()
    assert not inference.isCompiled()
    x, _ = batch(2)
    torch.testing.assert_close(inference(x), model(x))


def test_destroy_on_the_model_destroys_its_training_wrapper():
    model = net()
    training = poptorch.trainingModel(model)
    assert type(model).__name__ == "PoptorchNet" and isinstance(model, Net)
    training(*batch(2))
    model.destroy()
    assert type(model) is Net and not hasattr(model, "destroy")
    assert not training.isCompiled()
    training(*batch(2))  # compiles again, and wraps the model again
    assert type(model).__name__ == "PoptorchNet"


@pytest.mark.parametrize("round_trip", [
    copy.deepcopy,
    lambda m: pickle.loads(pickle.dumps(m)),
    lambda m: torch.load(io.BytesIO(_saved(m)), weights_only=False),
])
def test_a_wrapped_model_saves_as_its_own_class(round_trip):
    model = net()
    training = poptorch.trainingModel(model)
    training(*batch(2))
    clone = round_trip(model)
    assert type(clone) is Net
    torch.testing.assert_close(clone.fc1.weight.cpu(), model.fc1.weight.detach())
    assert type(model).__name__ == "PoptorchNet", "the original stays wrapped"


def _saved(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()


def test_the_model_gets_its_class_back_when_the_wrapper_goes():
    model = net()
    training = poptorch.trainingModel(model)
    del training
    import gc
    gc.collect()
    assert type(model) is Net


def test_repr_is_the_model_repr():
    model = net()
    assert repr(poptorch.inferenceModel(model)) == repr(model)


class WithMethods(Net):
    def predict(self, x):  # runs the model
        return self(x).argmax(-1)

    def first_layer(self, x):  # runs a submodule only
        return self.fc1(x)

    def width(self):  # runs nothing
        return self.fc1.in_features


@pytest.mark.parametrize("wrap", [poptorch.inferenceModel, poptorch.trainingModel])
def test_model_methods_that_run_it_are_refused_through_the_wrapper(wrap):
    # The wrapper hands out the model's attributes, as PopTorch's does; a
    # method of the model's that runs the model or a submodule ran it on
    # the host, silently.
    torch.manual_seed(0)
    model = WithMethods()
    wrapped = wrap(model)
    x, y = batch(2)
    first = wrapped(x, y) if wrap is poptorch.trainingModel else wrapped(x)
    for call, where in [(lambda: wrapped.predict(x), "the model"),
                        (lambda: wrapped.first_layer(x), "its submodule 'fc1'"),
                        (lambda: wrapped.forward(x), "the model")]:
        with pytest.raises(poptorch.Error, match=f"WithMethods.*runs {where} on the host"):
            call()
    assert wrapped.width() == 4
    # The refusal leaves no hook behind: the compiled step runs on.
    second = wrapped(x, y) if wrap is poptorch.trainingModel else wrapped(x)
    if wrap is poptorch.inferenceModel:
        torch.testing.assert_close(second, first)
        torch.testing.assert_close(second, model(x))
    assert wrapped.model.predict(x).shape == (2,)  # the host model, asked for


# --- hooks and logging ----------------------------------------------------------

def test_compile_hooks_run_around_each_compilation():
    calls = []
    pre = poptorch.registerPreCompileHook(lambda: calls.append("pre"))
    post = poptorch.registerPostCompileHook(lambda: calls.append("post"))
    try:
        model = poptorch.inferenceModel(net())
        model(batch(2)[0])
        model(batch(2)[0])
        assert calls == ["pre", "post"], "once per compilation"

        class Broken(torch.nn.Module):
            def forward(self, x):
                raise ValueError("broken model")

        with pytest.raises(ValueError, match="broken model"):
            poptorch.inferenceModel(Broken())(batch(2)[0])
        assert calls == ["pre", "post"] * 2, "the post-compile hook runs after a failure too"
    finally:
        pre.remove()
        post.remove()
    poptorch.inferenceModel(net())(batch(2)[0])
    assert calls == ["pre", "post"] * 2, "removed"
    with pytest.raises(poptorch.Error, match="must be callable"):
        poptorch.registerPreCompileHook("not a function")


@pytest.mark.parametrize("level, python_level", [
    (0, logging.DEBUG - 5), (1, logging.DEBUG), (2, logging.INFO), (3, logging.WARNING),
    (4, logging.ERROR), (6, logging.CRITICAL + 10), ("DEBUG_IR", logging.DEBUG)])
def test_set_log_level_takes_poptorch_levels(level, python_level):
    try:
        poptorch.setLogLevel(level)
        assert poptorch.logger.level == python_level
    finally:
        poptorch.setLogLevel("INFO")
    with pytest.raises(ValueError, match="unknown log level 5"):
        poptorch.setLogLevel(5)


def test_module_repr_is_torch_repr_plus_forward_pre_hooks(capsys):
    model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(8, 2), torch.nn.Identity(),
                                torch.nn.Linear(8, 2))
    assert poptorch.module_repr(model) == repr(model)

    class Tag:
        def __call__(self, module, args):
            return None

        def __repr__(self):
            return "Tag()"

    model[2].register_forward_pre_hook(Tag())
    assert poptorch.module_repr(model) == repr(model).replace("(2): Linear", "(2): Tag() Linear")
    poptorch.print(model, "and text")
    assert capsys.readouterr().out == poptorch.module_repr(model) + " and text\n"
