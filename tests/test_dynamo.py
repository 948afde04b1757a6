"""torch.compile(backend="ipu") against the CPU: inference and training (AOTAutograd's
forward and backward graphs), replayed without compiling after the first call."""
from __future__ import annotations

import copy
from typing import Callable, Dict, Tuple

import pytest
import torch
import torch._dynamo
from torch import nn

import poptorch
from conftest import run_python, sgd_training_step, train_beside_the_cpu

Inputs = Callable[[], Tuple[torch.Tensor, ...]]


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 10))


MODELS: Dict[str, Tuple[Callable[[], nn.Module], Inputs]] = {
    "mlp": (lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(),
                                  nn.Linear(64, 5)),
            lambda: (torch.randn(8, 20),)),
    "cnn": (_cnn, lambda: (torch.randn(4, 3, 8, 8),)),
    "transformer_layer": (lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                                             batch_first=True),
                          lambda: (torch.randn(2, 7, 32),)),
}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _to_ipu(inputs: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
    return tuple(x.to("ipu") for x in inputs)


def test_the_backend_is_registered():
    assert "ipu" in torch._dynamo.list_backends()


@pytest.mark.parametrize("name", MODELS)
def test_inference_matches_the_cpu_and_replays_without_compiling(name):
    torch.manual_seed(0)
    make_model, make_inputs = MODELS[name]
    model = make_model().eval()
    compiled = torch.compile(copy.deepcopy(model).to("ipu"), backend="ipu")
    with torch.no_grad():
        for call in range(3):
            inputs = make_inputs()
            out = compiled(*_to_ipu(inputs))
            torch.testing.assert_close(out.cpu(), model(*inputs), rtol=1e-5, atol=1e-5)
            if call == 0:
                warm = poptorch.metrics()
    after = poptorch.metrics()
    assert after["graphs_compiled"] == warm["graphs_compiled"]
    assert after["dynamo_graphs"] == warm["dynamo_graphs"] == 1
    assert after["dynamo_replays"] == warm["dynamo_replays"] + 2


@pytest.mark.parametrize("name", MODELS)
def test_training_with_an_optimizer_matches_the_cpu(name):
    torch.manual_seed(0)
    make_model, make_inputs = MODELS[name]
    reference = make_model()
    model = copy.deepcopy(reference).to("ipu")
    compiled = torch.compile(model, backend="ipu")
    ipu_optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    compiles = []
    for _ in range(4):
        inputs = make_inputs()
        ipu_optimizer.zero_grad()
        loss = compiled(*_to_ipu(inputs)).square().mean()
        loss.backward()
        ipu_optimizer.step()
        cpu_optimizer.zero_grad()
        ref_loss = reference(*inputs).square().mean()
        ref_loss.backward()
        cpu_optimizer.step()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
        compiles.append(poptorch.metrics()["graphs_compiled"])
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=key)
    # Warm after two steps (the optimiser makes its momentum at the first):
    # later steps replay and hit the executable cache, compiling nothing.
    assert compiles[1] == compiles[2] == compiles[3], compiles
    assert poptorch.metrics()["dynamo_replays"] >= 8  # a forward and a backward per step


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_whole_compiled_training_step_matches_the_cpu(name):
    # Dynamo breaks the graph at backward(): the forward and backward graphs and
    # the optimiser's step (which writes the parameters in place) replay, joined
    # with the lazy ones_like of backward() into one program run at loss.cpu().
    torch.manual_seed(0)
    make_model, make_inputs = MODELS[name]
    reference = make_model()
    model = copy.deepcopy(reference).to("ipu")
    ipu_step = torch.compile(sgd_training_step(model, momentum=0.9), backend="ipu")
    cpu_step = sgd_training_step(reference, momentum=0.9)
    compiles, programs = [], []
    for _ in range(5):
        (x,) = make_inputs()
        y = torch.randint(0, 5, (x.shape[0],))
        x, y, ran_before = x.to("ipu"), y.to("ipu"), poptorch.metrics()["executions"]
        loss = ipu_step(x, y)
        torch.testing.assert_close(loss.cpu(), cpu_step(x.cpu(), y.cpu()).detach(), rtol=1e-4,
                                   atol=1e-5)
        compiles.append(poptorch.metrics()["graphs_compiled"])
        programs.append(poptorch.metrics()["executions"] - ran_before)
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=key)
    # The optimiser makes its momentum at the first step (another graph) and
    # the third is the first to join whole: compiled once, then replayed.
    assert compiles[2] == compiles[3] == compiles[4], compiles
    assert programs[2:] == [1, 1, 1], programs


def test_inputs_of_any_offset_and_strides_replay_the_same_program():
    weight = torch.randn(6, 6)
    compiled = torch.compile(lambda x, w: torch.relu(x @ w) + 1, backend="ipu")
    data = torch.randn(20, 6)
    data_ipu, weight_ipu = data.to("ipu"), weight.to("ipu")
    out = compiled(data_ipu[0:4], weight_ipu)
    torch.testing.assert_close(out.cpu(), torch.relu(data[0:4] @ weight) + 1)
    compiled_once = poptorch.metrics()["graphs_compiled"]
    for start in (3, 7, 16):  # views at other offsets of a larger storage
        out = compiled(data_ipu[start:start + 4], weight_ipu)
        torch.testing.assert_close(out.cpu(), torch.relu(data[start:start + 4] @ weight) + 1)
    assert poptorch.metrics()["graphs_compiled"] == compiled_once
    # Other strides are another layout: captured again, and right.
    out = compiled(data_ipu[0:6].t(), weight_ipu)
    torch.testing.assert_close(out.cpu(), torch.relu(data[0:6].t() @ weight) + 1)


def test_an_input_never_written_at_the_first_call_is_read_at_later_calls():
    compiled = torch.compile(lambda x: x * 2, backend="ipu")
    compiled(torch.empty(4, device="ipu"))  # garbage in, garbage out
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x.to("ipu")).cpu(), x * 2)


def test_the_same_tensor_twice_and_then_two_tensors():
    compiled = torch.compile(lambda a, b: a * 2 + b, backend="ipu")
    x, y = torch.randn(6), torch.randn(6)
    xi, yi = x.to("ipu"), y.to("ipu")
    torch.testing.assert_close(compiled(xi, xi).cpu(), x * 3)
    torch.testing.assert_close(compiled(xi, yi).cpu(), x * 2 + y)
    torch.testing.assert_close(compiled(yi, yi).cpu(), y * 3)


# Under no_grad dynamo's graph runs as given; otherwise through AOTAutograd.
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_outputs_that_view_or_mutate_inputs_behave_as_on_the_cpu(grad):
    def f(x, y):
        y.add_(1)
        return x[1:], x * 2

    compiled = torch.compile(f, backend="ipu")
    for _ in range(2):
        x, y = torch.randn(5, 3), torch.randn(3)
        xi, yi = x.to("ipu"), y.to("ipu")
        with torch.set_grad_enabled(grad):
            view, doubled = compiled(xi, yi)
        ref_view, ref_doubled = f(x, y)
        torch.testing.assert_close(yi.cpu(), y)
        torch.testing.assert_close(view.cpu(), ref_view)
        torch.testing.assert_close(doubled.cpu(), ref_doubled)
        assert view.untyped_storage().data_ptr() == xi.untyped_storage().data_ptr()


def test_batch_norm_statistics_updated_under_no_grad_match_the_cpu():
    # Train-mode batch norm writes its running statistics in place: inputs the
    # replayed program writes at every call.
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
    model = copy.deepcopy(reference).to("ipu")
    compiled = torch.compile(model, backend="ipu")
    with torch.no_grad():
        for call in range(3):
            x = torch.randn(5, 6)
            out = compiled(x.to("ipu"))
            torch.testing.assert_close(out.cpu(), reference(x), rtol=1e-5, atol=1e-5)
            if call == 0:
                compiled_once = poptorch.metrics()["graphs_compiled"]
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, msg=key)
    metrics = poptorch.metrics()
    assert metrics["graphs_compiled"] == compiled_once and metrics["dynamo_replays"] == 3


def test_gradients_enabled_inside_a_no_grad_call_as_on_the_cpu():
    def f(x, w):
        y = x * 2
        with torch.enable_grad():
            z = y @ w
        return y + 1, z

    compiled = torch.compile(f, backend="ipu")
    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    wi = w.detach().to("ipu").requires_grad_()
    with torch.no_grad():
        ref_y, ref_z = f(x, w)
        for _ in range(2):
            y, z = compiled(x.to("ipu"), wi)
            torch.testing.assert_close(y.cpu(), ref_y)
            torch.testing.assert_close(z.detach().cpu(), ref_z.detach())
            assert (y.requires_grad, z.requires_grad) == (ref_y.requires_grad, ref_z.requires_grad)


def test_a_graph_break_runs_lazily_between_compiled_graphs():
    def f(x):
        y = torch.sin(x) * 2
        scale = y.sum().item()  # a graph break: the value goes to Python
        return torch.cos(y) * scale

    compiled = torch.compile(f, backend="ipu")
    for _ in range(3):
        x = torch.randn(4, 4)
        torch.testing.assert_close(compiled(x.to("ipu")).cpu(), f(x), rtol=1e-5, atol=1e-5)
    # The graph before the break replays; the one after it takes the value read
    # (dynamo passes it as a float64 cpu tensor once it changes) and runs lazily.
    metrics = poptorch.metrics()
    assert metrics["dynamo_graphs"] >= 2 and metrics["dynamo_replays"] >= 3


@torch.compiler.disable(recursive=False)
def _run_between_graphs(y: torch.Tensor) -> torch.Tensor:
    # Dynamo skips this frame but keeps its hook on for what it calls, as for
    # the code of a graph break (loss.backward()'s ones_like).
    return torch.nn.functional.pad(y, (1, 1, 1, 1), mode="reflect")


def test_capture_between_graphs_is_not_traced_by_dynamo():
    # Reflection padding's result is inferred on fake CPU tensors
    # (poptorch._fake_cpu); a shape no other test uses misses capture's cache.
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from poptorch import _fake_cpu

    def f(x):
        y = x + 1
        return _run_between_graphs(y)[..., 1:-1, 1:-1] * y

    x = torch.randn(5, 11, 7, 3)
    out = torch.compile(f, backend="ipu")(x.to("ipu"))
    torch.testing.assert_close(out.cpu(), f(x))
    for function in (_fake_cpu.fake, _fake_cpu.run):
        assert not _debug_get_cache_entry_list(function.__code__), function


# A fresh process: xlogy's reference kernel (its Meta kernel on the ipu) has not run yet,
# so its first call, inside the hooked frame, goes through poptorch._dynamo_disable's
# stand-in for torch._disable_dynamo's wrapper.
_FIRST_KERNEL_CALL_BETWEEN_GRAPHS = """
import torch
import poptorch  # before torch._dynamo: the stand-ins are installed
from poptorch import _dynamo_disable
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

def xlogy_kernel():
    for wrapper in _dynamo_disable._wrappers():
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))
        fn = cells["fn"].cell_contents
        if fn.__module__ == "torch._refs" and fn.__name__ == "xlogy":
            return fn
    raise AssertionError("torch._refs.xlogy is no longer wrapped by torch._disable_dynamo")

@torch.compiler.disable(recursive=False)
def between(y):  # dynamo runs this frame, with its hook on for what it calls
    return torch.xlogy(y, y + 1)

def f(x):
    y = x.abs() + 1
    return between(y) * 2

kernel = xlogy_kernel()
assert isinstance(getattr(kernel, "__dynamo_disable"), _dynamo_disable.UntilDynamoIsLoaded)
x = torch.rand(3, 4)
out = torch.compile(f, backend="ipu")(x.to("ipu"))
torch.testing.assert_close(out.cpu(), f(x))
assert not isinstance(getattr(kernel, "__dynamo_disable"), _dynamo_disable.UntilDynamoIsLoaded)
stand_in = _dynamo_disable.UntilDynamoIsLoaded.__call__.__code__
assert not _debug_get_cache_entry_list(stand_in), "dynamo compiled the stand-in"
assert sum(counters["graph_break"].values()) == 1, dict(counters["graph_break"])
assert poptorch.metrics()["dynamo_graphs"] == 2, poptorch.metrics()
"""


def test_a_reference_kernel_first_run_between_graphs_is_not_traced_by_dynamo():
    """The wrapped kernel's first call after torch._dynamo is loaded comes in the
    hooked code of a graph break: dynamo runs the stand-in as it runs its own
    wrapper (no frame of it compiled, no graph break in it), with the CPU's result."""
    result = run_python(_FIRST_KERNEL_CALL_BETWEEN_GRAPHS)
    assert result.returncode == 0, result.stderr[-3000:]


def test_dynamic_shapes_capture_a_program_per_size():
    compiled = torch.compile(lambda x: (x * x).sum(0), backend="ipu", dynamic=True)
    for rows in (3, 5, 3, 9):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x.to("ipu")).cpu(), (x * x).sum(0))
    assert poptorch.metrics()["dynamo_graphs"] == 1


def test_sizes_beyond_the_executable_cache_capacity_are_captured_again():
    compiled = torch.compile(lambda x: x * 2, backend="ipu", dynamic=True)
    capacity = poptorch._C.executable_cache_capacity()
    poptorch.set_executable_cache_size(2)
    try:
        for rows in (2, 3, 4, 2, 5, 2):
            x = torch.randn(rows)
            torch.testing.assert_close(compiled(x.to("ipu")).cpu(), x * 2)
    finally:
        poptorch.set_executable_cache_size(capacity)
    # Two programs are kept: 4 evicts 2, which is captured again; its last call replays.
    assert poptorch.metrics()["graphs_compiled"] == 5


def test_recompiles_after_a_failed_guard_are_counted():
    compiled = torch.compile(lambda x: x + 1, backend="ipu", dynamic=False)
    compiled(torch.zeros(3).to("ipu"))
    compiled(torch.zeros(3, dtype=torch.int32).to("ipu"))
    out = compiled(torch.ones(3).to("ipu"))
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0))
    metrics = poptorch.metrics()
    assert metrics["dynamo_graphs"] == 2 and metrics["dynamo_recompiles"] == 1


def test_random_ops_draw_new_values_on_each_call_and_follow_the_seed():
    compiled = torch.compile(lambda x: nn.functional.dropout(x, 0.5, training=True),
                             backend="ipu")
    x = torch.ones(1000).to("ipu")
    torch.manual_seed(1)
    first, second = compiled(x).cpu(), compiled(x).cpu()
    assert not torch.equal(first, second)
    torch.manual_seed(1)
    assert torch.equal(compiled(x).cpu(), first)
    for out in (first, second):  # kept elements are scaled by 1 / (1 - p)
        assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_a_graph_on_cpu_tensors_runs_as_is():
    compiled = torch.compile(lambda x, y: x + y.cpu(), backend="ipu")
    x, y = torch.randn(3), torch.randn(3)
    out = compiled(x, y.to("ipu"))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x + y)


def test_modes_are_accepted_and_unknown_modes_and_options_refused():
    compiled = torch.compile(lambda x: x * 3, backend="ipu", mode="max-autotune")
    torch.testing.assert_close(compiled(torch.ones(2).to("ipu")).cpu(), torch.full((2,), 3.0))
    with pytest.raises(Exception, match="has no mode 'fastest'"):
        torch.compile(lambda x: x * 4, backend="ipu", mode="fastest")(torch.ones(2).to("ipu"))
    with pytest.raises(Exception, match="takes no options"):
        torch.compile(lambda x: x * 5, backend="ipu",
                      options={"max_autotune": True})(torch.ones(2).to("ipu"))


@pytest.mark.slow
def test_the_default_backend_says_to_use_the_ipu_backend():
    compiled = torch.compile(lambda x: torch.relu(x) + 1)
    with pytest.raises(Exception, match='backend="ipu"') as raised:
        compiled(torch.randn(4).to("ipu"))
    assert "KeyError" not in str(raised.value)


@pytest.mark.slow
def test_inductor_still_compiles_cpu_graphs_once_the_ipu_is_refused():
    # Inductor's graph cache hashes the pass each device registered, for graphs
    # on any device: the ipu's refusal must be a pass it can hash.
    import torch._inductor.codegen.common  # noqa: F401  (registers the ipu's refusal)
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    torch.testing.assert_close(torch.compile(model, backend="inductor")(x), model(x))


# Not a compiled submodule: trainingModel would see its parameters under two names.
_compiled_call = torch.compile(lambda module, x: module(x), backend="ipu")


class _CompiledInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor = None):
        out = self.head(_compiled_call(self.inner, x))
        return out if y is None else (out, nn.functional.cross_entropy(out, y))


def test_a_compiled_module_inside_a_wrapped_model_joins_its_step():
    torch.manual_seed(0)
    model = _CompiledInside()
    reference = copy.deepcopy(model)
    inference = poptorch.inferenceModel(model)
    for _ in range(2):
        x = torch.randn(4, 8)
        torch.testing.assert_close(inference(x), reference.head(reference.inner(x)))
    assert poptorch.metrics()["dynamo_graphs"] >= 1
    inference.destroy()
    train_beside_the_cpu(_CompiledInside(),
                         [(torch.randn(4, 8), torch.randint(0, 3, (4,))) for _ in range(3)],
                         loss_of=lambda out: out[1])


def test_a_compiled_poptorch_model_runs_its_own_step():
    # dynamo traced the wrapper's Python: a dozen graph breaks, ~45 s before the
    # first call and a recompile at the second.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = torch.compile(poptorch.inferenceModel(copy.deepcopy(model)), backend="ipu")
    before = poptorch.metrics()
    for _ in range(3):
        x = torch.randn(2, 4)
        torch.testing.assert_close(compiled(x), model(x).detach())
    after = poptorch.metrics()
    assert after["dynamo_graphs"] == before["dynamo_graphs"]
    assert after["graphs_compiled"] - before["graphs_compiled"] == 1


def test_a_compiled_function_calling_a_training_model_trains_as_the_cpu():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    reference = copy.deepcopy(model)
    wrapped = poptorch.trainingModel(_WithLoss(model), None,
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)

    @torch.compile(backend="ipu")
    def step(x, y):
        _, loss = wrapped(x * 2, y)
        return loss + 1

    for _ in range(3):
        x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
        got = step(x, y)
        optimizer.zero_grad()
        want = nn.functional.cross_entropy(reference(x * 2), y)
        want.backward()
        optimizer.step()
        torch.testing.assert_close(got, want.detach() + 1)
    torch.testing.assert_close(model.weight.detach(), reference.weight.detach())


class _WithLoss(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        out = self.model(x)
        return out, nn.functional.cross_entropy(out, y)
