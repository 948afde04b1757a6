"""Independent nodes on two threads (runtime/inter_op.h): the values are those of the
nodes run in program order, the same at every run, and failures stay where they were.
POPTORCH_INTER_OP=2 runs every segment of independent nodes on two threads, 1 those
where the estimate of the kernels' times says it pays (compiler/parallel_ranges.h)."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import poptorch
from poptorch import _C


class Branches(torch.nn.Module):
    """Two branches of a block, then a head: in the backward, each Linear's weight and input
    gradients are independent, and so are the branches; so are the parameters' updates."""

    def __init__(self, width: int = 32, hidden: int = 64):
        super().__init__()
        self.left = torch.nn.Linear(width, hidden)
        self.right = torch.nn.Linear(width, hidden)
        self.head = torch.nn.Linear(hidden, 5)
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, y):
        out = self.head(torch.relu(self.left(x)) * torch.tanh(self.right(x)))
        return out, self.loss(out, y)


# Small layers (every segment on two threads), and layers whose products the estimate
# runs side by side (as it does the MLP benchmark's).
SIZES = {"2": (32, 64), "1": (512, 512)}


def train(inter_op: str, monkeypatch, steps: int = 3, sizes=None):
    monkeypatch.setenv("POPTORCH_INTER_OP", inter_op)  # read when a program is made
    torch.manual_seed(0)
    width, hidden = sizes or SIZES[inter_op]
    model = Branches(width, hidden)
    reference = copy.deepcopy(model)
    options = poptorch.Options().deviceIterations(4)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    training = poptorch.trainingModel(model, options, optimizer)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4 * 8, width, generator=g), torch.randint(0, 5, (4 * 8,), generator=g)
    losses = [training(x, y)[1] for _ in range(steps)]
    return losses, {k: v.clone() for k, v in training.state_dict().items()}, reference, (x, y)


@pytest.fixture(autouse=True)
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # inter-op needs two
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("inter_op", ["1", "2"])
def test_training_matches_the_cpu_and_program_order(monkeypatch, inter_op):
    losses, weights, reference, (x, y) = train(inter_op, monkeypatch)
    order_losses, order_weights, _, _ = train("0", monkeypatch, sizes=SIZES[inter_op])
    # A kernel's last bits may depend on how many threads it ran on (as on the CPU).
    for a, b in zip(losses, order_losses):
        torch.testing.assert_close(a, b)
    for name, value in weights.items():
        torch.testing.assert_close(value, order_weights[name], msg=name)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for k in range(4):
            optimizer.zero_grad()
            _, loss = reference(x[k * 8:(k + 1) * 8], y[k * 8:(k + 1) * 8])
            loss.backward()
            optimizer.step()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(weights[name], value, msg=name)


@pytest.mark.parametrize("inter_op", ["1", "2"])
def test_the_values_are_the_same_at_every_run(monkeypatch, inter_op):
    losses, weights, _, _ = train(inter_op, monkeypatch)
    again, again_weights, _, _ = train(inter_op, monkeypatch)
    for a, b in zip(losses, again):
        assert torch.equal(a, b)
    for name, value in weights.items():
        assert torch.equal(value, again_weights[name]), name


def threads_used(inter_op: str, monkeypatch, sizes) -> set:
    """The threads (profiler tracks) the nodes of the training steps ran on."""
    _C.profiling_set_enabled(True)
    try:
        _C.profiling_take()
        train(inter_op, monkeypatch, steps=1, sizes=sizes)
        return {event[6] for event in _C.profiling_take() if event[0] == 0}
    finally:
        _C.profiling_set_enabled(False)


def test_the_estimate_chooses_two_threads_for_independent_products_only(monkeypatch):
    assert threads_used("1", monkeypatch, SIZES["1"]) == {0, 1}
    # Tiny layers: every hand-off between threads would cost more than it saves.
    assert threads_used("1", monkeypatch, SIZES["2"]) == {0}
    assert threads_used("2", monkeypatch, SIZES["2"]) == {0, 1}
    assert threads_used("0", monkeypatch, SIZES["1"]) == {0}


def test_a_failing_branch_leaves_the_independent_one_computed(monkeypatch):
    monkeypatch.setenv("POPTORCH_INTER_OP", "2")
    x = torch.arange(16.0, device="ipu").reshape(4, 4)
    good = [x @ x, x.sin(), x * 2]
    bad = torch.index_select(x, 0, torch.tensor([9], device="ipu")).exp()
    expected = torch.arange(16.0).reshape(4, 4)
    cpu = [expected @ expected, expected.sin(), expected * 2]
    for value, reference in zip(good, cpu):
        torch.testing.assert_close(value.cpu(), reference)
    with pytest.raises(IndexError, match="index out of range"):
        bad.cpu()


def test_a_forked_child_exits_cleanly_after_the_parent_used_two_threads(tmp_path):
    """The parent started the second thread; its child has a copy of the handle but no
    such thread, and exits with its own status: destroying the copied handle aborted it
    (SIGABRT). The child runs no kernel: libgomp's threads do not survive fork(), so
    eager PyTorch hangs there too."""
    script = tmp_path / "fork_child.py"
    script.write_text(
        "import os, sys, torch, poptorch\n"
        "torch.set_num_threads(2)\n"
        "torch.manual_seed(0)\n"
        "class Branches(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a, self.b = torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)\n"
        "    def forward(self, x, y):\n"
        "        return torch.nn.functional.mse_loss(self.a(x) + self.b(x), y)\n"
        "model = Branches()\n"
        "training = poptorch.trainingModel(model, poptorch.Options(),\n"
        "                                  torch.optim.SGD(model.parameters(), lr=0.01))\n"
        "x, y = torch.randn(64, 512), torch.randn(64, 512)\n"
        "training(x, y)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(7)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n")
    env = dict(os.environ, POPTORCH_INTER_OP="2", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["7"], done.stdout + done.stderr
