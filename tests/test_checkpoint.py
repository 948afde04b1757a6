"""Checkpoints: torch.save / torch.load, pickle and copy.deepcopy of ipu tensors,
state dicts, models and optimiser state, each against the same round trip on
the CPU."""
import copy
import io
import pickle

import pytest
import torch

import poptorch
from conftest import run_python


def save_load(obj, **load_args):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_args)


ROUND_TRIPS = {
    "torch.save": save_load,  # weights_only=True, torch's default
    "torch.save-unsafe": lambda obj: save_load(obj, weights_only=False),
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
}


def _base(dtype=torch.float32):
    return torch.arange(24, dtype=torch.float32).reshape(4, 6).sub(7).to(dtype)


def _with_grad(device):
    t = _base().to(device).requires_grad_()
    t.grad = torch.full_like(t, 0.5)
    return [t]


def _views(device):
    whole = _base().to(device)
    return [whole, whole[1:], whole.t(), whole[:, ::2], whole[2, 3]]


# Each builds a list of tensors on `device`; tensors of one list may share storage.
TENSORS = {
    "contiguous": lambda d: [_base().to(d)],
    "views": _views,
    "non-contiguous-alone": lambda d: [_base().to(d)[:, 1::2]],
    "0-dim": lambda d: [torch.tensor(3.5).to(d)],
    "empty": lambda d: [torch.zeros(0, 3).to(d)],
    "int32": lambda d: [_base(torch.int32).to(d)],
    "int64": lambda d: [_base(torch.int64).to(d)],
    "uint8": lambda d: [_base().abs().to(torch.uint8).to(d)],
    "bool": lambda d: [(_base() > 3).to(d)],
    "float16": lambda d: [_base(torch.float16).to(d) / 3],
    "bfloat16": lambda d: [_base(torch.bfloat16).to(d) / 3],
    "complex-conj": lambda d: [torch.complex(_base(), -_base()).to(d).conj()],
    "pending": lambda d: (lambda a: [a * 2 + 1, (a * 2 + 1)[1:].t()])(_base().to(d)),
    "parameter": lambda d: [torch.nn.Parameter(_base().to(d))],
    "frozen-parameter": lambda d: [torch.nn.Parameter(_base().to(d), requires_grad=False)],
    "grad": _with_grad,
}


def same_storage(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def assert_like_cpu(ipu_result, cpu_result, device):
    """The round trip of the ipu tensors gives what the CPU's gave, on `device`."""
    assert len(ipu_result) == len(cpu_result)
    for i, (a, b) in enumerate(zip(ipu_result, cpu_result)):
        assert type(a) is type(b), i
        assert a.device == torch.device(device), (i, a.device)
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == \
               (b.dtype, b.shape, b.stride(), b.storage_offset()), i
        assert (a.requires_grad, a.is_leaf, a.is_conj(), a.is_neg()) == \
               (b.requires_grad, b.is_leaf, b.is_conj(), b.is_neg()), i
        assert torch.equal(a.detach().cpu().resolve_conj(), b.detach().resolve_conj()), i
        assert (a.grad is None) == (b.grad is None), i
        if b.grad is not None:
            assert a.grad.device == a.device and torch.equal(a.grad.cpu(), b.grad)
        for j in range(i):
            assert same_storage(a, ipu_result[j]) == same_storage(b, cpu_result[j]), (i, j)


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("case", sorted(TENSORS))
def test_tensors_round_trip_like_the_cpu(case, round_trip):
    cpu_result = ROUND_TRIPS[round_trip](TENSORS[case]("cpu"))
    tensors = TENSORS[case]("ipu")
    if case == "pending":
        assert poptorch._C.pending_nodes() > 0  # saved before anything ran
    ipu_result = ROUND_TRIPS[round_trip](tensors)
    assert_like_cpu(ipu_result, cpu_result, "ipu:0")


def test_views_load_as_views_of_one_storage():
    ipu = save_load(_views("ipu"))
    ipu[0][2, 3] = -100.0
    assert ipu[1][1, 3].item() == -100.0 and ipu[2][3, 2].item() == -100.0
    assert ipu[4].item() == -100.0
    copied = copy.deepcopy(_views("ipu"))
    copied[0][2, 3] = -100.0
    assert copied[4].item() == -100.0


def test_copies_are_independent_of_the_original():
    original = _views("ipu")
    for result in (save_load(original), copy.deepcopy(original), pickle.loads(pickle.dumps(original))):
        result[0].zero_()
        assert torch.equal(original[0].cpu(), _base())


def test_a_tensor_saved_from_ipu_1_loads_on_ipu_1():
    loaded = save_load([_base().to("ipu:1")])
    assert_like_cpu(loaded, [_base()], "ipu:1")
    assert_like_cpu(copy.deepcopy(loaded), [_base()], "ipu:1")


# map_location -> where the storages of a checkpoint saved from ipu:0 go.
MAP_LOCATIONS = [
    ("cpu", "cpu"),
    (torch.device("cpu"), "cpu"),
    ("ipu", "ipu:0"),
    ("ipu:1", "ipu:1"),
    (torch.device("ipu", 2), "ipu:2"),
    ({"ipu:0": "cpu"}, "cpu"),
    ({"ipu:0": "ipu:3"}, "ipu:3"),
    ({"cuda:0": "cpu"}, "ipu:0"),  # not the saved location: left alone
    (lambda storage, location: storage, "cpu"),  # the callable keeps the CPU copy
    (lambda storage, location: None, "ipu:0"),  # None: the default restore
    (lambda storage, location: torch.serialization.default_restore_location(storage, "ipu:1"),
     "ipu:1"),
]


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("map_location,target", MAP_LOCATIONS,
                         ids=[f"map{i}" for i in range(len(MAP_LOCATIONS))])
def test_map_location(map_location, target, weights_only):
    tensors = _views("ipu") + TENSORS["bfloat16"]("ipu") + TENSORS["int64"]("ipu")
    expected = _views("cpu") + TENSORS["bfloat16"]("cpu") + TENSORS["int64"]("cpu")
    loaded = save_load(tensors, map_location=map_location, weights_only=weights_only)
    assert_like_cpu(loaded, save_load(expected), target)


@pytest.mark.parametrize("map_location,target", [("ipu", "ipu:0"), ("ipu:1", "ipu:1"),
                                                 (torch.device("ipu:2"), "ipu:2"),
                                                 ({"cpu": "ipu:3"}, "ipu:3")])
def test_a_cpu_checkpoint_maps_to_the_ipu(map_location, target):
    loaded = save_load(_views("cpu") + TENSORS["parameter"]("cpu"), map_location=map_location)
    assert_like_cpu(loaded, save_load(_views("cpu") + TENSORS["parameter"]("cpu")), target)


def test_mmap_load_from_a_file(tmp_path):
    path = tmp_path / "tensors.pt"
    torch.save(_views("ipu"), path)
    assert_like_cpu(torch.load(path, mmap=True), save_load(_views("cpu")), "ipu:0")


def test_bare_ipu_is_the_current_ipu():
    with torch.ipu.device(2):
        loaded = save_load([_base().to("ipu")], map_location="ipu")
    assert loaded[0].device == torch.device("ipu:2")


def test_mapping_to_a_missing_ipu_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"ipu:7 but this machine has 4 IPUs.*map_location"):
        save_load([_base().to("ipu")], map_location="ipu:7")


def storage_bytes(storage):
    return torch.empty(0, dtype=torch.uint8).set_(storage.cpu()).clone()


def test_storages_round_trip_and_read_pending_values():
    pending = _base().to("ipu") * 3
    expected = (_base() * 3).untyped_storage()
    assert torch.equal(storage_bytes(pending.untyped_storage()), storage_bytes(expected))
    loaded = save_load(_base().to("ipu").mul(3).untyped_storage())
    loaded_on_cpu = save_load(expected)
    assert type(loaded) is type(loaded_on_cpu) and loaded.dtype == loaded_on_cpu.dtype
    assert loaded.device == torch.device("ipu:0")
    assert torch.equal(storage_bytes(loaded.untyped()), storage_bytes(loaded_on_cpu.untyped()))


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_typed_storages_of_pending_tensors_and_their_views_work_like_the_cpu():
    # tensor.storage() (PyTorch's test files use it) of a tensor whose bytes a graph has
    # not written yet: its values, its pointer shared by the views, and writes through it.
    observed = []
    for device in ("cpu", "ipu"):
        x = _base().to(device) * 3
        view = x.t()[1:]
        storage = view.storage()
        assert storage.data_ptr() == x.storage().data_ptr() == x.data_ptr()
        assert storage._cdata == x.storage()._cdata
        assert view.data_ptr() == storage.data_ptr() + view.storage_offset() * x.element_size()
        values = (len(storage), storage.dtype, storage.tolist())
        storage[0] = -1.0
        observed.append((values, x.tolist(), view.tolist(), storage.device.type))
    assert observed[0][:3] == observed[1][:3]  # and the write reached the tensor and view
    assert [o[3] for o in observed] == ["cpu", "ipu"]


def test_pending_tensors_have_their_own_pointers_like_the_cpu():
    # Pointer identity is how checkpoint code (safetensors, transformers) finds
    # tensors that share memory; a pending tensor has no bytes until it runs.
    for device in ("cpu", "ipu"):
        x = _base().to(device)
        a, b = x * 2, x * 3
        assert a.data_ptr() != b.data_ptr() and a.data_ptr() != 0
        assert a[1:].data_ptr() == a.data_ptr() + 6 * a.element_size()
        assert a.untyped_storage().data_ptr() == a.data_ptr()
        assert torch.equal(a.cpu(), _base() * 2)  # and the values are still computed


def test_safetensors_saves_pending_ipu_tensors_and_refuses_shared_ones_like_the_cpu():
    safetensors = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    tensors = {"a": _base().to("ipu") * 2, "h": _base(torch.float16).to("ipu") / 3}
    loaded = safetensors.load(safetensors.save(tensors))
    for key, value in tensors.items():
        assert torch.equal(loaded[key], value.cpu())
    for device in ("cpu", "ipu"):
        whole = _base().to(device)
        with pytest.raises(RuntimeError, match="Some tensors share memory"):
            safetensors.save({"whole": whole, "rows": whole[1:]})


def test_uninitialised_ipu_tensors_save():
    loaded = save_load([torch.empty(5, 3, device="ipu")])
    assert loaded[0].shape == (5, 3) and loaded[0].device.type == "ipu"


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6),
                                        torch.nn.BatchNorm1d(6))
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.body(self.embed(tokens)))


def models():
    torch.manual_seed(0)
    cpu = Tied()
    cpu.body[2].running_mean.uniform_()
    ipu = copy.deepcopy(cpu).to("ipu")
    # Module.to() re-creates parameters it cannot move in place (PyTorch's
    # list of such devices leaves the ipu out), which unties shared weights.
    ipu.head.weight = ipu.embed.weight
    return cpu, ipu


TOKENS = torch.tensor([1, 4, 2, 9, 0, 3])


def assert_same_model(ipu, cpu, device="ipu:0"):
    ipu.eval(), cpu.eval()
    assert all(t.device == torch.device(device) for t in ipu.state_dict().values())
    assert ipu.head.weight is ipu.embed.weight
    torch.testing.assert_close(ipu(TOKENS.to(device)).cpu(), cpu(TOKENS))


@pytest.mark.parametrize("round_trip", sorted(ROUND_TRIPS))
def test_state_dicts_round_trip(round_trip):
    cpu, ipu = models()
    state = ROUND_TRIPS[round_trip](ipu.state_dict())
    cpu_state = ROUND_TRIPS[round_trip](cpu.state_dict())
    assert list(state) == list(cpu_state)
    assert_like_cpu(list(state.values()), list(cpu_state.values()), "ipu:0")
    fresh = Tied().to("ipu")
    fresh.head.weight = fresh.embed.weight
    fresh.load_state_dict(state)
    assert_same_model(fresh, cpu)


@pytest.mark.parametrize("round_trip", ["torch.save-unsafe", "pickle", "deepcopy"])
def test_whole_models_round_trip(round_trip):
    cpu, ipu = models()
    copied = ROUND_TRIPS[round_trip](ipu)
    assert_same_model(copied, cpu)
    with torch.no_grad():
        copied.body[0].weight.zero_()
    assert_same_model(ipu, cpu)  # the copy is independent


def test_a_model_state_dict_loads_on_the_cpu_and_on_other_ipus():
    cpu, ipu = models()
    buffer = io.BytesIO()
    torch.save(ipu.state_dict(), buffer)
    for device in ("cpu", "ipu:1"):
        buffer.seek(0)
        fresh = Tied().to(device)
        fresh.head.weight = fresh.embed.weight
        fresh.load_state_dict(torch.load(buffer, map_location=device))
        assert_same_model(fresh, cpu, device)


def test_a_checkpoint_loads_without_poptorch_with_map_location_cpu(tmp_path):
    cpu, ipu = models()
    path = tmp_path / "model.pt"
    torch.save({"model": ipu.state_dict(), "step": 3}, path)
    result = run_python(
        "import sys, torch\n"
        f"ckpt = torch.load({str(path)!r}, map_location='cpu')\n"
        "assert 'poptorch' not in sys.modules\n"
        "print(ckpt['step'], sum(float(v.float().sum()) for v in ckpt['model'].values()))\n")
    assert result.returncode == 0, result.stderr
    expected = sum(float(v.float().sum()) for v in cpu.state_dict().values())
    step, total = result.stdout.split()
    assert step == "3" and float(total) == pytest.approx(expected, rel=1e-6)


# --- Optimiser state across trainingModel and the CPU --------------------------

class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(6, 12)
        self.l2 = torch.nn.Linear(12, 3)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        out = self.l2(torch.relu(self.l1(x)))
        return out, self.loss(out, y)


OPTIMISERS = {
    "torch.SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1,
                                           weight_decay=0.01),
    "torch.SGD-nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
    "torch.Adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01),
    "torch.AdamW": lambda p: torch.optim.AdamW(p, lr=0.01),
    "torch.RMSprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "poptorch.SGD": lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.2),
    "poptorch.Adam": lambda p: poptorch.optim.Adam(p, lr=0.01),
    "poptorch.AdamW": lambda p: poptorch.optim.AdamW(p, lr=0.01, weight_decay=0.05),
    "poptorch.RMSprop": lambda p: poptorch.optim.RMSprop(p, lr=0.01, alpha=0.9),
    "poptorch.LAMB": lambda p: poptorch.optim.LAMB(p, lr=0.01),
    # The device holds the combined variant's velocity times velocity_scaling.
    "poptorch.SGD-combined": lambda p: poptorch.optim.SGD(
        p, lr=0.05, momentum=0.9, use_combined_accum=True, velocity_scaling=8.0),
    # Without momentum torch's SGD holds no state; the device's buffer stays unused.
    "torch.SGD-no-momentum": lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.01),
    "poptorch.SGD-combined-no-momentum": lambda p: poptorch.optim.SGD(
        p, lr=0.05, momentum=0.0, use_combined_accum=True, velocity_scaling=8.0),
    # Its step on the CPU follows PopTorch's rule (clipping), not torch's.
    "poptorch.SGD-combined-clipped": lambda p: poptorch.optim.SGD(
        p, lr=0.05, momentum=0.9, use_combined_accum=True, velocity_scaling=8.0,
        max_grad_norm=0.5),
}
STEPS_BEFORE, STEPS_AFTER = 3, 3


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


def fresh(name, seed):
    torch.manual_seed(seed)
    model = Classifier()
    return model, OPTIMISERS[name](model.parameters())


def cpu_steps(model, optimizer, steps):
    losses = []
    for step in steps:
        optimizer.zero_grad()
        loss = model(*batch(step))[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def ipu_steps(training_model, steps):
    return [training_model(*batch(step))[1].item() for step in steps]


def checkpoint(model, optimizer):
    return save_load({"model": model.state_dict(), "optimizer": optimizer.state_dict()})


def resume(name, ckpt):
    model, optimizer = fresh(name, seed=1)  # other weights: the checkpoint must replace them
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return model, optimizer


def one_update_per_call():
    return poptorch.Options().deviceIterations(1)


BEFORE, AFTER = range(STEPS_BEFORE), range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER)


def cpu_reference(name):
    """Losses of the steps after the checkpoint, and the final weights, on the CPU."""
    model, optimizer = fresh(name, seed=0)
    cpu_steps(model, optimizer, BEFORE)
    return cpu_steps(model, optimizer, AFTER), model.state_dict()


def assert_same_training(losses, model, reference):
    expected_losses, expected_weights = reference
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-6)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), expected_weights[key], rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_training_resumes_on_the_ipu_from_a_cpu_checkpoint(name):
    model, optimizer = fresh(name, seed=0)
    cpu_steps(model, optimizer, BEFORE)
    model, optimizer = resume(name, checkpoint(model, optimizer))
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_training_resumes_on_the_cpu_from_an_ipu_checkpoint(name):
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, BEFORE)
    model, optimizer = resume(name, checkpoint(training.model, optimizer))
    assert_same_training(cpu_steps(model, optimizer, AFTER), model, cpu_reference(name))


@pytest.mark.parametrize("name", ["torch.SGD", "torch.Adam", "poptorch.RMSprop"])
def test_training_resumes_on_the_ipu_from_an_ipu_checkpoint(name):
    model, optimizer = fresh(name, seed=0)
    ipu_steps(poptorch.trainingModel(model, one_update_per_call(), optimizer), BEFORE)
    model, optimizer = resume(name, checkpoint(model, optimizer))
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))


@pytest.mark.parametrize("name", ["torch.SGD", "poptorch.Adam"])
def test_loading_a_checkpoint_into_a_wrapped_model_writes_the_device(name):
    model, optimizer = fresh(name, seed=0)
    cpu_steps(model, optimizer, BEFORE)
    ckpt = checkpoint(model, optimizer)
    model, optimizer = fresh(name, seed=1)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, [7, 8])  # state and weights that the checkpoint must replace
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))


@pytest.mark.parametrize("name", ["torch.Adam", "torch.SGD", "torch.SGD-no-momentum",
                                  "poptorch.SGD-combined", "poptorch.SGD-combined-no-momentum"])
def test_the_optimizer_state_dict_follows_the_device_like_the_cpu(name):
    # The same entries as torch's: SGD's hold no step, and none without momentum.
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    cpu_model, cpu_optimizer = fresh(name, seed=0)
    ipu_steps(training, BEFORE)
    cpu_steps(cpu_model, cpu_optimizer, BEFORE)
    state, cpu_state = optimizer.state_dict(), cpu_optimizer.state_dict()
    assert state["param_groups"] == cpu_state["param_groups"]
    assert sorted(state["state"]) == sorted(cpu_state["state"])
    for index, entry in cpu_state["state"].items():
        assert sorted(state["state"][index]) == sorted(entry)
        for key, value in entry.items():
            torch.testing.assert_close(state["state"][index][key], value, rtol=1e-5, atol=1e-7)
    # Like torch's, the state dict holds the live state: the next step changes it.
    ipu_steps(training, AFTER)
    if "step" in cpu_state["state"].get(0, {}):
        assert float(state["state"][0]["step"]) == STEPS_BEFORE + STEPS_AFTER


@pytest.mark.parametrize("name", ["torch.Adam", "torch.SGD"])
def test_loading_an_unstarted_optimizer_state_restarts_the_device_state(name):
    # torch's load_state_dict replaces the whole state: the device's moments restart too.
    model, optimizer = fresh(name, seed=0)
    unstarted = save_load(optimizer.state_dict())
    weights = save_load(model.state_dict())
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, BEFORE)
    model.load_state_dict(weights)
    optimizer.load_state_dict(unstarted)
    reference_model, reference = fresh(name, seed=0)
    torch.testing.assert_close(ipu_steps(training, AFTER),
                               cpu_steps(reference_model, reference, AFTER), rtol=1e-5, atol=1e-6)


def momentum_buffers(optimizer):
    return [entry["momentum_buffer"] for _, entry in
            sorted(optimizer.state_dict()["state"].items())]


@pytest.mark.parametrize("trained_on", ["ipu", "cpu"])
def test_a_combined_sgd_state_dict_holds_torch_sgds_momentum(trained_on):
    """Its velocity scaling (changed half-way: the device rescales its
    velocity) is the device's affair: the state dict holds torch.optim.SGD's
    momentum buffers, and torch.optim.SGD resumes from it. They were scaled."""
    name = "poptorch.SGD-combined"
    model, optimizer = fresh(name, seed=0)
    torch.manual_seed(0)
    reference_model = Classifier()
    reference = torch.optim.SGD(reference_model.parameters(), lr=0.05, momentum=0.9)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer) \
        if trained_on == "ipu" else None
    for step in BEFORE:
        if step == 1:
            optimizer.param_groups[0]["velocity_scaling"] = 2.0
        if training is not None:
            ipu_steps(training, [step])
        else:
            cpu_steps(model, optimizer, [step])
        cpu_steps(reference_model, reference, [step])
    # So do copies of the optimiser itself (pickle, deepcopy, torch.save of it).
    for saved in (optimizer, copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        for ours, theirs in zip(momentum_buffers(saved), momentum_buffers(reference)):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    if training is not None:  # PopTorch's ipu_state is the device's own tensor
        torch.testing.assert_close(optimizer.state_dict()["ipu_state"]["momentum_buffer___0"],
                                   2.0 * momentum_buffers(reference)[0], rtol=1e-5, atol=1e-7)
    resumed_model, _ = fresh("torch.SGD", seed=1)
    resumed_model.load_state_dict(model.state_dict())
    resumed = torch.optim.SGD(resumed_model.parameters(), lr=0.05, momentum=0.9)
    resumed.load_state_dict(checkpoint(model, optimizer)["optimizer"])
    torch.testing.assert_close(cpu_steps(resumed_model, resumed, AFTER),
                               cpu_steps(reference_model, reference, AFTER), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["torch.SGD", "torch.Adam"])
def test_a_wrapped_optimizer_that_never_stepped_has_no_state(name):
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    training.compile(*batch(0))
    assert optimizer.state_dict()["state"] == {}
    # Resuming from it on the CPU is a fresh start (SGD's first step is undamped).
    resumed_model, resumed = resume(name, checkpoint(model, optimizer))
    reference_model, reference = fresh(name, seed=0)
    torch.testing.assert_close(cpu_steps(resumed_model, resumed, BEFORE),
                               cpu_steps(reference_model, reference, BEFORE))


def test_detach_and_attach_keep_the_optimizer_state():
    name = "torch.SGD"
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, BEFORE)
    training.detachFromDevice()
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert momentum.device.type == "cpu" and momentum.abs().sum() > 0
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))


def test_set_optimizer_with_a_loaded_optimizer_uses_its_state():
    name = "poptorch.Adam"
    model, optimizer = fresh(name, seed=0)
    cpu_steps(model, optimizer, BEFORE)
    ckpt = checkpoint(model, optimizer)
    model, first = fresh(name, seed=1)
    model.load_state_dict(ckpt["model"])
    training = poptorch.trainingModel(model, one_update_per_call(), first)
    training.compile(*batch(0))
    second = OPTIMISERS[name](model.parameters())
    second.load_state_dict(ckpt["optimizer"])
    training.setOptimizer(second)
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))
    assert first.state_dict()["state"] == {}  # the first keeps its own (unstarted) copy


def test_set_optimizer_with_a_new_optimizer_keeps_the_device_state():
    name = "torch.SGD"
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, BEFORE)
    replacement = OPTIMISERS[name](model.parameters())
    training.setOptimizer(replacement)
    assert_same_training(ipu_steps(training, AFTER), model, cpu_reference(name))
    assert sorted(replacement.state_dict()["state"]) == [0, 1, 2, 3]  # now its view
    assert optimizer.state_dict()["state"][0]["momentum_buffer"].abs().sum() > 0  # a copy


def test_a_state_from_another_kind_of_optimizer_is_a_clear_error():
    model, optimizer = fresh("torch.Adam", seed=0)
    cpu_steps(model, optimizer, BEFORE)
    ckpt = checkpoint(model, optimizer)
    model, sgd = fresh("torch.SGD", seed=0)
    sgd.load_state_dict(ckpt["optimizer"])  # torch accepts it; its step() would fail
    training = poptorch.trainingModel(model, one_update_per_call(), sgd)
    with pytest.raises(poptorch.Error, match="exp_avg.*another kind of optimiser"):
        training(*batch(0))


def lazy_steps(model, optimizer, steps):
    losses = []
    for step in steps:
        optimizer.zero_grad()
        loss = model(*(t.to("ipu") for t in batch(step)))[1]
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return losses  # ipu tensors: reading them would run the pending step


@pytest.mark.parametrize("name", ["torch.Adam", "torch.SGD"])
@pytest.mark.parametrize("resume_on", ["cpu", "ipu"])
def test_lazy_mode_training_resumes_from_a_checkpoint(name, resume_on):
    model, _ = fresh(name, seed=0)
    model.to("ipu")
    optimizer = OPTIMISERS[name](model.parameters())
    lazy_steps(model, optimizer, BEFORE)
    assert poptorch._C.pending_nodes() > 0  # the last step has not run yet
    ckpt = save_load(checkpoint(model, optimizer), map_location=resume_on)
    model, _ = fresh(name, seed=1)
    model.to(resume_on)
    optimizer = OPTIMISERS[name](model.parameters())
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if resume_on == "cpu":
        losses = cpu_steps(model, optimizer, AFTER)
    else:
        losses = [loss.item() for loss in lazy_steps(model, optimizer, AFTER)]
    assert_same_training(losses, model, cpu_reference(name))


def test_a_second_training_model_takes_the_optimizer_over():
    name = "torch.Adam"
    model, optimizer = fresh(name, seed=0)
    first = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(first, BEFORE)
    second = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    losses = ipu_steps(second, AFTER[:1])  # starts from the first's state
    first.destroy()  # must leave the second's state alone
    losses += ipu_steps(second, AFTER[1:])
    assert float(optimizer.state_dict()["state"][0]["step"]) == STEPS_BEFORE + STEPS_AFTER
    assert_same_training(losses, model, cpu_reference(name))


@pytest.mark.parametrize("name", ["torch.SGD", "poptorch.Adam"])
@pytest.mark.parametrize("round_trip", sorted(set(ROUND_TRIPS) - {"torch.save"}))
def test_a_saved_wrapper_loads_as_a_wrapper_that_trains_on(round_trip, name):
    """As PopTorch's (upstream pipelining_test test_block_function_saving), a
    wrapper saves its model, options and optimiser, and loads as a wrapper of
    them that compiles again and trains on like the CPU. It was refused."""
    model, optimizer = fresh(name, seed=0)
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    ipu_steps(training, BEFORE)
    clone = ROUND_TRIPS[round_trip](training)
    assert isinstance(clone, poptorch.PoplarExecutor) and not clone.isCompiled()
    assert clone.model is not model
    assert_same_training(ipu_steps(clone, AFTER), clone.model, cpu_reference(name))
    cpu = Classifier()
    cpu.load_state_dict({k: v.cpu() for k, v in clone.model.state_dict().items()})
    inference = ROUND_TRIPS[round_trip](poptorch.inferenceModel(cpu))
    torch.testing.assert_close(inference(*batch(0)), cpu(*batch(0)))


def test_torch_load_refuses_a_wrapper_as_any_module_by_default():
    model, optimizer = fresh("torch.SGD", seed=0)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ROUND_TRIPS["torch.save"](model)  # the CPU's own refusal
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ROUND_TRIPS["torch.save"](poptorch.trainingModel(model, optimizer=optimizer))


def test_a_float64_state_loads_in_the_device_dtype():
    model, optimizer = fresh("torch.Adam", seed=0)
    model.double()  # CPU training in float64, then model.float() for the ipu
    for step in BEFORE:
        optimizer.zero_grad()
        x, y = batch(step)
        model(x.double(), y)[1].backward()
        optimizer.step()
    expected = {k: v.float() for k, v in optimizer.state[model.l1.weight].items()}
    model.float()  # parameters keep their identity; the optimiser state stays float64
    training = poptorch.trainingModel(model, one_update_per_call(), optimizer)
    training.compile(*batch(0))
    for key, value in expected.items():
        assert optimizer.state[model.l1.weight][key].dtype == torch.float32
        torch.testing.assert_close(optimizer.state[model.l1.weight][key], value)
