"""poptorch.for_loop and poptorch.cond against plain Python loops and ifs on the
CPU: in lazy mode and inside inferenceModel/trainingModel, the body traced once,
the condition decided on the device (never a host read, never a recompile)."""
import pytest
import torch

import poptorch


class Loop(torch.nn.Module):
    """A loop whose body updates a buffer in place and uses a weight."""

    def __init__(self, count, use_poptorch=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((3,), 0.5))
        self.register_buffer("total", torch.zeros(3))
        self.count = count
        self.use_poptorch = use_poptorch
        self.traced = 0

    def body(self, x, y):
        self.traced += 1
        self.total.add_(x)
        return torch.tanh(x * self.weight + 1), y * 2

    def forward(self, x, y):
        if self.use_poptorch:
            x, y = poptorch.for_loop(self.count, self.body, [x, y])
        else:
            for _ in range(self.count):
                x, y = self.body(x, y)
        return x + y


def test_for_loop_in_lazy_mode_runs_the_body_count_times():
    cpu = Loop(5, use_poptorch=False)
    x, y = torch.randn(3), torch.ones(3)
    expected = cpu(x, y)
    ipu = Loop(5).to("ipu")
    out = ipu(x.to("ipu"), y.to("ipu"))
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(ipu.total.cpu(), cpu.total)
    assert ipu.traced == 1  # traced once, as PopTorch does


def test_for_loop_on_the_cpu_is_a_python_loop():
    cpu, reference = Loop(4), Loop(4, use_poptorch=False)
    x, y = torch.randn(3), torch.ones(3)
    torch.testing.assert_close(cpu(x, y), reference(x, y))
    torch.testing.assert_close(cpu.total, reference.total)


def test_for_loop_in_an_inference_model_with_device_iterations():
    cpu = Loop(4, use_poptorch=False)
    model = Loop(4)
    x, y = torch.randn(3 * 3), torch.rand(3 * 3)
    expected = torch.cat([cpu(a, b) for a, b in zip(x.split(3), y.split(3))])
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(3))
    torch.testing.assert_close(wrapped(x, y), expected)
    wrapped.copyWeightsToHost()
    torch.testing.assert_close(model.total, cpu.total)
    assert model.traced == 1


def test_for_loop_trains_like_the_python_loop():
    torch.manual_seed(0)

    class Trained(torch.nn.Module):
        def __init__(self, use_poptorch):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.use_poptorch = use_poptorch

        def forward(self, x, target):
            body = lambda h: torch.tanh(self.linear(h))  # noqa: E731
            if self.use_poptorch:
                (x,) = poptorch.for_loop(3, body, [x])
            else:
                for _ in range(3):
                    x = body(x)
            return x, ((x - target) ** 2).mean()

    model, reference = Trained(True), Trained(False)
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(2, 4), torch.randn(2, 4)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        _, loss = reference(x, target)
        loss.backward()
        optimizer.step()
    wrapped = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        _, ipu_loss = wrapped(x, target)
    torch.testing.assert_close(ipu_loss, loss.detach())
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach())


def test_for_loop_prints_every_iteration(capsys):
    def body(x):
        return poptorch.ipu_print_tensor(x + 1, "i")
    x = torch.zeros(1).to("ipu")
    (out,) = poptorch.for_loop(3, body, [x])
    assert out.cpu().tolist() == [3.0]
    assert capsys.readouterr().err.splitlines() == ["i: (1.000)", "i: (2.000)", "i: (3.000)"]


def test_for_loop_errors():
    x = torch.zeros(2).to("ipu")
    with pytest.raises(ValueError, match="list of tensors"):
        poptorch.for_loop(2, lambda a: a, (x,))
    with pytest.raises(ValueError, match="index 1"):
        poptorch.for_loop(2, lambda a, b: (a, b), [x, 1.0])
    with pytest.raises(poptorch.Error, match="count"):
        poptorch.for_loop(-1, lambda a: a, [x])
    with pytest.raises(poptorch.Error, match="returns 2 tensors for 1 inputs"):
        poptorch.for_loop(2, lambda a: (a, a), [x])
    with pytest.raises(poptorch.Error, match="shape"):
        poptorch.for_loop(2, lambda a: a.sum(), [x])
    with pytest.raises(poptorch.Error, match="reads a tensor's value on the host"):
        poptorch.for_loop(2, lambda a: a * a.sum().item(), [x])


class Branches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, condition, x):
        return poptorch.cond(condition, lambda a: a * self.scale, [x],
                             lambda a: a - 1, [x])[0]


def test_cond_on_the_cpu_is_an_if():
    model = Branches()
    x = torch.ones(2)
    assert model(torch.tensor(True), x).tolist() == [3.0, 3.0]
    assert model(torch.tensor(False), x).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("flag", [True, False])
def test_cond_in_lazy_mode(flag):
    model = Branches().to("ipu")
    x = torch.tensor([1.0, 2.0])
    out = model(torch.tensor(flag).to("ipu"), x.to("ipu"))
    assert out.cpu().tolist() == Branches()(torch.tensor(flag), x).tolist()


def test_cond_decides_on_the_device_per_micro_batch():
    model = Branches()
    conditions = torch.tensor([True, False, False, True])
    x = torch.arange(8.).reshape(4, 2)
    expected = torch.stack([model(c, v) for c, v in zip(conditions, x)])
    wrapped = poptorch.inferenceModel(Branches(), poptorch.Options().deviceIterations(4))
    torch.testing.assert_close(wrapped(conditions, x), expected)
    compiled = poptorch.metrics()["graphs_compiled"]
    flipped = ~conditions
    torch.testing.assert_close(wrapped(flipped, x),
                               torch.stack([model(c, v) for c, v in zip(flipped, x)]))
    metrics = poptorch.metrics()
    assert metrics["graphs_compiled"] == compiled and metrics["guard_failures"] == 0


def test_cond_trains_the_branch_taken():
    model, reference = Branches(), Branches()
    condition, x = torch.tensor(True), torch.tensor([1.0, 2.0])

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, c, v):
            return self.inner(c, v).sum()
    wrapped = poptorch.trainingModel(WithLoss(model), None,
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped(condition, x)
    reference(condition, x).sum().backward()
    with torch.no_grad():
        expected = reference.scale - 0.1 * reference.scale.grad
    torch.testing.assert_close(model.scale.detach(), expected)


def test_cond_errors():
    c, x = torch.tensor(True).to("ipu"), torch.zeros(2).to("ipu")
    outer = torch.zeros(2).to("ipu")
    with pytest.raises(ValueError, match="list of tensors"):
        poptorch.cond(c, lambda a: a, x, lambda a: a, [x])
    with pytest.raises(poptorch.Error, match="one element"):
        poptorch.cond(torch.ones(2).to("ipu"), lambda a: a, [x], lambda a: a, [x])
    with pytest.raises(poptorch.Error, match="returns 1 tensors and the else branch 2"):
        poptorch.cond(c, lambda a: a, [x], lambda a: (a, a), [x])
    with pytest.raises(poptorch.Error, match="shape"):
        poptorch.cond(c, lambda a: a, [x], lambda a: a.sum(), [x])
    with pytest.raises(poptorch.Error, match="changes in place"):
        poptorch.cond(c, lambda a: outer.add_(a), [x], lambda a: a, [x])
    with pytest.raises(poptorch.Error, match="acts on the host"):
        poptorch.cond(c, lambda a: poptorch.ipu_print_tensor(a), [x], lambda a: a, [x])
    # Changing a tensor made inside the branch is fine.
    out = poptorch.cond(c, lambda a: (a + 1).mul_(2), [x], lambda a: a, [x])[0]
    assert out.cpu().tolist() == [2.0, 2.0]
