"""The executable cache: bounded, least recently used out, evictions counted."""
import copy

import pytest
import torch

import poptorch
from conftest import run_python


@pytest.fixture
def small_cache():
    capacity = poptorch._C.executable_cache_capacity()
    poptorch._C.clear_executable_cache()
    poptorch.set_executable_cache_size(2)
    yield
    poptorch.set_executable_cache_size(capacity)


def run_shape(n: int) -> torch.Tensor:
    """One graph whose structure depends on n, checked against the CPU."""
    x = torch.arange(n, dtype=torch.float32)
    result = (x.to("ipu") * 2 + 1).cpu()
    torch.testing.assert_close(result, x * 2 + 1)
    return result


def test_the_least_recently_used_executable_is_evicted(small_cache):
    for n in (1, 2, 3):
        run_shape(n)
    m = poptorch.metrics()
    assert m["graphs_compiled"] == 3 and m["cache_evictions"] == 1
    assert poptorch._C.executable_cache_size() == 2
    run_shape(3)  # still cached: now the most recently used
    assert poptorch.metrics()["cache_hits"] == 1
    run_shape(1)  # evicted: compiled again, which evicts 2
    m = poptorch.metrics()
    assert m["graphs_compiled"] == 4 and m["cache_evictions"] == 2
    run_shape(3)
    assert poptorch.metrics()["cache_hits"] == 2


def test_a_thousand_shapes_keep_a_bounded_cache(small_cache):
    for n in range(1, 31):
        run_shape(n)
    assert poptorch._C.executable_cache_size() == 2
    assert poptorch.metrics()["cache_evictions"] == 28


def test_shrinking_the_cache_evicts_and_zero_keeps_nothing(small_cache):
    run_shape(1)
    run_shape(2)
    poptorch.set_executable_cache_size(0)
    assert poptorch._C.executable_cache_size() == 0
    assert poptorch.metrics()["cache_evictions"] == 2
    run_shape(1)
    run_shape(1)
    m = poptorch.metrics()
    assert m["graphs_compiled"] == 4 and m["cache_hits"] == 0 and m["cache_evictions"] == 4
    for size in (-1, "8", 2.0):  # a str failed comparing with 0
        with pytest.raises(poptorch.Error, match=f"an integer of at least 0, got {size!r}"):
            poptorch.set_executable_cache_size(size)
    with pytest.raises(ValueError):  # as it was
        poptorch.set_executable_cache_size(-1)


def test_a_wrapped_model_keeps_its_program_when_evicted(small_cache):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    reference = copy.deepcopy(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.loss = torch.nn.CrossEntropyLoss()

        def forward(self, x, y):
            out = self.model(x)
            return out, self.loss(out, y)

    training = poptorch.trainingModel(WithLoss(), optimizer=torch.optim.SGD(model.parameters(),
                                                                             lr=0.1))
    cpu_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    for step in range(3):
        if step == 1:
            poptorch.set_executable_cache_size(0)  # evicts the wrapped model's executables
        _, loss = training(x, y)
        cpu_optimizer.zero_grad()
        expected = loss_fn(reference(x), y)
        expected.backward()
        cpu_optimizer.step()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    training.copyWeightsToHost()
    torch.testing.assert_close(model[0].weight.detach(), reference[0].weight.detach())


def test_the_size_comes_from_the_environment():
    result = run_python("import poptorch; print(poptorch._C.executable_cache_capacity())",
                        env={"POPTORCH_EXECUTABLE_CACHE_SIZE": "7"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "7"
    result = run_python("import torch, poptorch; (torch.ones(1, device='ipu') + 1).cpu()",
                        env={"POPTORCH_EXECUTABLE_CACHE_SIZE": "many"})
    assert result.returncode != 0
    assert "POPTORCH_EXECUTABLE_CACHE_SIZE must be an integer of at least 0, got 'many'" in \
        result.stderr
