"""Precompilation: a model written by compileAndExport/save in one process is
loaded by poptorch.load/loadExecutable in another, which compiles nothing and
gets the same results; training goes on from the saved weights and optimiser
state. Files of another version, truncated or random files are errors."""
import collections
import copy
import json
import textwrap

import pytest
import torch

import poptorch
from conftest import run_python

# The model and data both processes use: poptorch.load unpickles the model, so
# its class must exist in the loading process too (here, in its __main__).
COMMON = textwrap.dedent("""
    import json, sys
    import torch
    import poptorch

    class Net(torch.nn.Module):
        def __init__(self, dropout=0.0):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 8)
            self.fc2 = torch.nn.Linear(8, 3)
            self.dropout = torch.nn.Dropout(dropout)
            self.loss = torch.nn.CrossEntropyLoss()

        def forward(self, x, y=None):
            out = self.fc2(self.dropout(torch.relu(self.fc1(x))))
            if y is None:
                return out
            return out, self.loss(out, y)

    def data(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)

    def options():
        return poptorch.Options().showCompilationProgressBar(False)

    def compiled():
        return poptorch.metrics()["graphs_compiled"]
""")


def run(code, **env):
    result = run_python(COMMON + textwrap.dedent(code), env=env)
    assert result.returncode == 0, result.stderr
    return result


def cpu_training(steps):
    """The CPU reference of the training processes below: losses per step, the
    final weights, and the eval-mode outputs for data(99) after each step."""
    namespace = {}
    exec(COMMON, namespace)  # pylint: disable=exec-used
    torch.manual_seed(0)
    model = namespace["Net"]()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses, outputs = [], []
    for step in range(steps):
        model.train()
        x, y = namespace["data"](step)
        optimizer.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        model.eval()
        with torch.no_grad():
            outputs.append(model(namespace["data"](99)[0]))
    return losses, model.state_dict(), outputs


def test_training_goes_on_in_another_process_from_the_saved_weights_and_state(tmp_path):
    run(f"""
        torch.manual_seed(0)
        model = Net()
        training = poptorch.trainingModel(model, options(),
                                          torch.optim.Adam(model.parameters(), lr=0.05))
        losses = [training(*data(step))[1] for step in range(3)]
        training.save({str(tmp_path / "training.poptorch")!r})
        # What the loading process must reproduce: the next steps here.
        losses += [training(*data(step))[1] for step in (3, 4)]
        training.copyWeightsToHost()

        # With dropout, the saved random state gives the same masks.
        torch.manual_seed(1)
        noisy = poptorch.trainingModel(Net(dropout=0.5), options())
        noisy(*data(0))
        noisy.save({str(tmp_path / "noisy.poptorch")!r})
        noisy_losses = [noisy(*data(step))[1] for step in (1, 2)]
        torch.save({{"losses": losses, "weights": model.state_dict(),
                    "noisy_losses": noisy_losses}}, {str(tmp_path / "expected.pt")!r})
    """)
    result = run(f"""
        training = poptorch.load({str(tmp_path / "training.poptorch")!r})
        losses = [training(*data(step))[1] for step in (3, 4)]
        training.copyWeightsToHost()
        noisy = poptorch.load({str(tmp_path / "noisy.poptorch")!r})
        noisy_losses = [noisy(*data(step))[1] for step in (1, 2)]
        torch.save({{"losses": losses, "weights": training.model.state_dict(),
                    "noisy_losses": noisy_losses}}, {str(tmp_path / "loaded.pt")!r})
        print(json.dumps(poptorch.metrics()))
    """)
    metrics = json.loads(result.stdout.splitlines()[-1])
    assert metrics["graphs_compiled"] == 0 and metrics["executables_loaded"] > 0, metrics
    expected = torch.load(tmp_path / "expected.pt")
    loaded = torch.load(tmp_path / "loaded.pt")
    # The same programs on the same state: the same numbers, bit for bit.
    for a, b in zip(expected["losses"][3:], loaded["losses"]):
        assert torch.equal(a, b)
    for name, value in expected["weights"].items():
        assert torch.equal(value, loaded["weights"][name]), name
    for a, b in zip(expected["noisy_losses"], loaded["noisy_losses"]):
        assert torch.equal(a, b)
    # And the run as a whole trains like the CPU.
    cpu_losses, cpu_weights, _ = cpu_training(5)
    torch.testing.assert_close(torch.stack(expected["losses"]), torch.stack(cpu_losses),
                               rtol=1e-4, atol=1e-5)
    for name, value in cpu_weights.items():
        torch.testing.assert_close(loaded["weights"][name], value, rtol=1e-4, atol=1e-5)


def test_inference_models_load_without_compiling(tmp_path):
    run(f"""
        torch.manual_seed(0)
        model = Net().eval()
        x, _ = data(7)
        inference = poptorch.inferenceModel(model, options())
        out = inference(x)
        inference.save({str(tmp_path / "inference.poptorch")!r})

        # Compiled for an offline IPU: it can be exported, not run here.
        offline = poptorch.inferenceModel(model, options().useOfflineIpuTarget(2))
        offline.compileAndExport({str(tmp_path / "offline.poptorch")!r}, x)
        try:
            offline(x)
            raise AssertionError("an offline model ran")
        except poptorch.Error as error:
            assert "offline" in str(error)
            assert isinstance(error, AssertionError)  # PopTorch asserts it

        # Without the model: the loading process wraps the model itself.
        torch.manual_seed(0)
        bare = poptorch.inferenceModel(Net().eval(), options())
        bare.compileAndExport({str(tmp_path / "bare.poptorch")!r}, x, export_model=False)
        torch.save({{"out": out, "bare": bare(x), "cpu": model(x)}},
                   {str(tmp_path / "expected.pt")!r})
    """)
    result = run(f"""
        x, _ = data(7)
        outputs = {{}}
        counts = {{}}
        for name in ("inference", "offline"):
            poptorch.reset_metrics()
            outputs[name] = poptorch.load({str(tmp_path)!r} + f"/{{name}}.poptorch")(x)
            counts[name] = compiled()
        poptorch.reset_metrics()
        torch.manual_seed(0)
        bare = poptorch.inferenceModel(Net().eval(), options())
        bare.loadExecutable({str(tmp_path / "bare.poptorch")!r})
        outputs["bare"] = bare(x)
        counts["bare"] = compiled()
        try:
            poptorch.load({str(tmp_path / "bare.poptorch")!r})
            raise AssertionError("a file without a model was loaded")
        except poptorch.Error as error:
            assert "loadExecutable" in str(error), error
        torch.save(outputs, {str(tmp_path / "loaded.pt")!r})
        print(json.dumps(counts))
    """)
    assert json.loads(result.stdout.splitlines()[-1]) == {"inference": 0, "offline": 0, "bare": 0}
    expected = torch.load(tmp_path / "expected.pt")
    loaded = torch.load(tmp_path / "loaded.pt")
    assert torch.equal(loaded["inference"], expected["out"])
    assert torch.equal(loaded["bare"], expected["bare"])
    torch.testing.assert_close(loaded["offline"], expected["cpu"], rtol=1e-5, atol=1e-6)


def test_precompiled_training_and_validation_models_reconnect_as_in_poptorch(tmp_path):
    # PopTorch's pattern: both models compiled and exported before any step;
    # the loading process loads the training model and wraps the validation
    # model around it, which keeps their weights in sync.
    run(f"""
        torch.manual_seed(0)
        model = Net()
        training = poptorch.trainingModel(model, options(),
                                          torch.optim.Adam(model.parameters(), lr=0.05))
        training.compileAndExport({str(tmp_path / "training.poptorch")!r}, *data(0))
        model.eval()
        validation = poptorch.inferenceModel(model, options())
        validation.compileAndExport({str(tmp_path / "validation.poptorch")!r}, data(0)[0],
                                    export_model=False)
        assert compiled() > 0
    """)
    result = run(f"""
        training = poptorch.load({str(tmp_path / "training.poptorch")!r})
        validation = poptorch.inferenceModel(training)
        validation.loadExecutable({str(tmp_path / "validation.poptorch")!r})
        losses, outputs = [], []
        for step in range(5):
            training.model.train()
            losses.append(training(*data(step))[1])
            training.model.eval()
            outputs.append(validation(data(99)[0]))
        torch.save({{"losses": losses, "outputs": outputs}}, {str(tmp_path / "loaded.pt")!r})
        print(json.dumps(poptorch.metrics()))
    """)
    metrics = json.loads(result.stdout.splitlines()[-1])
    assert metrics["graphs_compiled"] == 0 and metrics["executables_loaded"] > 0, metrics
    loaded = torch.load(tmp_path / "loaded.pt")
    cpu_losses, _, cpu_outputs = cpu_training(5)  # validating after each step
    torch.testing.assert_close(torch.stack(loaded["losses"]), torch.stack(cpu_losses),
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack(loaded["outputs"]), torch.stack(cpu_outputs),
                               rtol=1e-4, atol=1e-5)


# --- in one process: what the files must refuse --------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture
def exported(tmp_path):
    path = tmp_path / "model.poptorch"
    model = poptorch.inferenceModel(Net(), poptorch.Options().showCompilationProgressBar(False))
    model.compileAndExport(path, torch.ones(2, 4))
    return path


def test_a_random_file_is_an_error(tmp_path):
    path = tmp_path / "random.poptorch"
    path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(poptorch.Error, match="not a file written by compileAndExport"):
        poptorch.load(path)
    with pytest.raises(poptorch.Error, match="no such file"):
        poptorch.load(tmp_path / "missing.poptorch")


def test_a_pickle_of_another_object_is_an_error_that_does_not_advise_unsafe_loading(tmp_path):
    # torch.load's own text said to load it with weights_only=False.
    path = tmp_path / "other.poptorch"
    torch.save(collections.Counter(a=1), path)
    with pytest.raises(poptorch.Error, match="not a file written by compileAndExport") as error:
        poptorch.load(path)
    assert "weights_only" not in str(error.value)


def test_a_truncated_file_is_an_error(exported):
    data = exported.read_bytes()
    exported.write_bytes(data[: len(data) // 2])
    with pytest.raises(poptorch.Error, match="damaged"):
        poptorch.load(exported)


def test_a_changed_file_is_an_error(exported):
    outer = torch.load(exported, weights_only=True)
    payload = bytearray(outer["payload"])
    payload[len(payload) // 2] ^= 1
    outer["payload"] = bytes(payload)
    torch.save(outer, exported)
    with pytest.raises(poptorch.Error, match="does not match its checksum"):
        poptorch.load(exported)


@pytest.mark.parametrize("key, value", [("poptorch", "0.0.1"), ("torch", "1.13.0"),
                                        ("format_version", 0),
                                        ("build", "poptorch executable format 1, other")])
def test_a_file_of_another_version_is_an_error(exported, key, value):
    outer = torch.load(exported, weights_only=True)
    outer["header"][key] = value
    torch.save(outer, exported)
    with pytest.raises(poptorch.Error, match="export the model again"):
        poptorch.load(exported)
    model = poptorch.inferenceModel(Net())
    with pytest.raises(poptorch.Error, match="export the model again"):
        model.loadExecutable(exported)


def test_a_damaged_executable_is_an_error(exported):
    # The payload is intact but an executable in it is not.
    payload = poptorch._precompilation.read(str(exported))
    payload["executables"][0] = payload["executables"][0][:100]
    poptorch._precompilation.write(str(exported), payload)
    with pytest.raises(poptorch.Error, match="holds an executable that cannot be used"):
        poptorch.load(exported)


def test_misuses_are_errors(exported, tmp_path):
    model = poptorch.inferenceModel(Net())
    with pytest.raises(poptorch.Error, match="not compiled yet"):
        model.save(tmp_path / "early.poptorch")
    training = poptorch.trainingModel(torch.nn.Sequential(Net(), torch.nn.L1Loss()))
    with pytest.raises(poptorch.Error, match="holds a inferenceModel; this is a trainingModel"):
        training.loadExecutable(exported)
    model(torch.ones(2, 4))
    with pytest.raises(poptorch.Error, match="compiled already"):
        model.loadExecutable(exported)


def test_export_makes_missing_directories_as_poptorch_does(tmp_path):
    model = poptorch.inferenceModel(Net(), poptorch.Options().showCompilationProgressBar(False))
    x = torch.randn(2, 4)
    target = tmp_path / "not" / "there" / "model.poptorch"
    model.compileAndExport(target, x)
    torch.testing.assert_close(poptorch.load(target)(x), model.model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("where, why", [("a_file/model.poptorch", "a file has that name"),
                                        ("a_file/below/model.poptorch", "Not a directory"),
                                        ("x" * 300, "File name too long")])
def test_export_where_no_file_can_be_written_names_the_path(tmp_path, where, why):
    (tmp_path / "a_file").write_text("not a directory")
    model = poptorch.inferenceModel(Net(), poptorch.Options().showCompilationProgressBar(False))
    target = str(tmp_path / where)
    with pytest.raises(poptorch.Error, match=f"cannot write {target}: .*{why}"):
        model.compileAndExport(target, torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match=f"cannot write {target}"):
        model.save(target)


def test_load_applies_edit_opts_fn_and_runs_where_it_is_loaded(exported):
    seen = []

    def edit(options):
        seen.append(options.connection_type)
        options.deviceIterations(2)

    model = poptorch.load(exported, edit_opts_fn=edit)
    assert seen == [poptorch.ConnectionType.Always]
    assert model.options.device_iterations == 2
    x = torch.randn(4, 4)
    torch.testing.assert_close(model(x), model.model(x), rtol=1e-5, atol=1e-6)


def test_save_writes_into_a_directory_and_a_saved_model_loads_in_process(tmp_path):
    torch.manual_seed(0)
    net = Net()
    reference = copy.deepcopy(net)
    model = poptorch.inferenceModel(net, poptorch.Options().showCompilationProgressBar(False))
    x = torch.randn(2, 4)
    model(x)
    model.save(tmp_path)  # a directory: PopTorch writes model.poptorch in it
    loaded = poptorch.load(tmp_path / "model.poptorch")
    torch.testing.assert_close(loaded(x), reference(x), rtol=1e-5, atol=1e-6)
    # Loading the directory finds it there (it said "no such file").
    torch.testing.assert_close(poptorch.load(tmp_path)(x), reference(x), rtol=1e-5, atol=1e-6)


def test_an_inference_model_can_wrap_a_training_model():
    net = torch.nn.Sequential(Net(), torch.nn.L1Loss())
    training = poptorch.trainingModel(net)
    inference = poptorch.inferenceModel(training)
    assert inference.model is net


class WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Net()

    def forward(self, x, y):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, y)


def test_automatic_loss_scaling_goes_on_from_the_saved_scale(tmp_path):
    def scale(model):
        return float(model._optimizer.state_dict()["ipu_param"]["loss_scaling"])

    torch.manual_seed(0)
    model = WithLoss()
    opts = poptorch.Options().showCompilationProgressBar(False)
    opts.Training.setAutomaticLossScaling(True)
    training = poptorch.trainingModel(
        model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=8.0))
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(2, 4, generator=g), torch.randint(0, 2, (2,), generator=g))
            for _ in range(4)]
    for x, y in data[:2]:
        training(x, y)
    training.save(tmp_path / "scaled.poptorch")
    saved_scale = scale(training)
    assert saved_scale != 8.0  # the rule changed it, or the test shows nothing
    losses = [training(x, y)[1] for x, y in data[2:]]
    loaded = poptorch.load(tmp_path / "scaled.poptorch")
    assert scale(loaded) == saved_scale
    assert [loaded(x, y)[1] for x, y in data[2:]] == losses
    assert scale(loaded) == scale(training)


def test_a_model_that_cannot_be_pickled_is_an_error(tmp_path):
    class Local(Net):  # pickle finds no class defined in a function
        pass

    model = poptorch.inferenceModel(Local(), poptorch.Options().showCompilationProgressBar(False))
    with pytest.raises(poptorch.Error, match="export_model=False"):
        model.compileAndExport(tmp_path / "local.poptorch", torch.ones(2, 4))
    assert not (tmp_path / "local.poptorch").exists()
    model.save(tmp_path / "bare.poptorch", export_model=False)
    bare = poptorch.inferenceModel(Local(), poptorch.Options().showCompilationProgressBar(False))
    bare.loadExecutable(tmp_path / "bare.poptorch")
    x = torch.randn(2, 4)
    torch.testing.assert_close(bare(x), bare.model(x))
