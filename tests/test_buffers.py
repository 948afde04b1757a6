"""PyTorch buffers in wrapped models (the seeds' "PyTorch buffers"), against the
CPU: in-place updates persist across runs and micro-batches, the host reads
them after inferenceModel calls, replicas keep their own with
broadcastBuffers(False), and replacing a buffer in forward is an error."""
import pytest
import torch

import poptorch


class Counter(torch.nn.Module):
    """The seeds' counter: a buffer incremented in place on every run."""

    def __init__(self):
        super().__init__()
        self.register_buffer("i", torch.tensor([0.0]))

    def forward(self):
        self.i += 1
        return self.i.clone()


def test_in_place_updates_persist_across_runs():
    model = Counter()
    wrapped = poptorch.inferenceModel(model)
    assert [wrapped().item() for _ in range(4)] == [1.0, 2.0, 3.0, 4.0]
    wrapped.copyWeightsToHost()
    assert model.i.item() == 4.0


class Accumulating(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(1, 2))

    def forward(self, x):
        self.total.copy_(self.total + x)
        return self.total


def test_buffer_updates_follow_every_micro_batch_like_the_cpu():
    cpu = Accumulating()
    x = torch.arange(8.).reshape(4, 2)
    expected = [cpu(row).clone() for _ in range(2) for row in x.split(1)]
    model = Accumulating()
    wrapped = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(4))
    outputs = torch.cat([wrapped(x) for _ in range(2)])
    torch.testing.assert_close(outputs, torch.cat(expected))
    wrapped.copyWeightsToHost()
    torch.testing.assert_close(model.total, cpu.total)


def test_batch_norm_statistics_train_like_the_cpu():
    torch.manual_seed(0)

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x, target):
            y = self.bn(self.linear(x))
            return y, ((y - target) ** 2).mean()
    model, reference = Normed(), Normed()
    reference.load_state_dict(model.state_dict())
    x, target = torch.randn(3 * 4, 3), torch.randn(3 * 4, 3)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for xs, ts in zip(x.split(4), target.split(4)):
        optimizer.zero_grad()
        reference(xs, ts)[1].backward()
        optimizer.step()
    wrapped = poptorch.trainingModel(model, poptorch.Options().deviceIterations(3),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
    wrapped(x, target)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(dict(model.named_buffers())[name], buffer)


class ReplicaBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("buffer", torch.zeros(1, 2))

    def forward(self, x):
        self.buffer.copy_(self.buffer + x)
        return poptorch.identity_loss(self.buffer, reduction="none")


@pytest.mark.parametrize("iterations", [1, 3])
def test_replicas_keep_their_own_buffers(iterations):
    opts = poptorch.Options().replicationFactor(2).deviceIterations(iterations)
    opts.broadcastBuffers(False)
    model = ReplicaBuffer()
    wrapped = poptorch.inferenceModel(model, opts)
    x = torch.tensor([[9.0], [2.0]]).repeat(iterations, 1)
    for _ in range(5):
        y = wrapped(x)
    # Replica r sees every micro-batch of its own: 5 calls x `iterations` each.
    last = y.reshape(iterations, 2, 2)[-1]
    torch.testing.assert_close(last, torch.tensor([[9.0, 9.0], [2.0, 2.0]]) * 5 * iterations)
    # The host sees replica 0's buffer.
    torch.testing.assert_close(model.buffer, torch.full((1, 2), 9.0 * 5 * iterations))


def test_replicated_buffers_train_per_replica():
    torch.manual_seed(0)

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)
            self.bn = torch.nn.BatchNorm1d(2)

        def forward(self, x):
            return poptorch.identity_loss(self.bn(self.linear(x)).square().mean(),
                                          reduction="mean")
    model = Normed()
    replica = [Normed(), Normed()]
    for r in replica:
        r.load_state_dict(model.state_dict())
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))
    x = torch.randn(2 * 4, 2)
    wrapped(x)
    for r, rows in zip(replica, x.split(4)):
        r(rows)
    torch.testing.assert_close(model.bn.running_mean, replica[0].bn.running_mean)
    assert not torch.allclose(replica[0].bn.running_mean, replica[1].bn.running_mean)


def test_replicas_cannot_broadcast_buffers_changed_in_place():
    opts = poptorch.Options().replicationFactor(2)
    wrapped = poptorch.inferenceModel(ReplicaBuffer(), opts)
    with pytest.raises(poptorch.Error, match=r"does not support broadcasting buffers.*"
                                             r"broadcastBuffers\(False\)"):
        wrapped(torch.tensor([[1.0], [2.0]]))


def test_constant_buffers_are_fine_with_replicas():
    class Constant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("stuff", torch.tensor([1, 2, 3], dtype=torch.int32))

        def forward(self, x):
            return torch.sum(x + (1.0 + self.stuff))
    wrapped = poptorch.inferenceModel(Constant(), poptorch.Options().replicationFactor(2))
    assert wrapped(torch.tensor([1, 2])).tolist() == [12.0, 15.0]


def test_copy_named_buffers_to_device_reaches_every_replica():
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    opts.updatableNamedBuffers(["buffer"])
    model = ReplicaBuffer()
    wrapped = poptorch.inferenceModel(model, opts)
    x = torch.tensor([[1.0], [2.0]])
    wrapped(x)
    model.buffer = torch.full((1, 2), 100.0)
    wrapped.copyNamedBuffersToDevice()
    torch.testing.assert_close(wrapped(x), torch.tensor([[101.0, 101.0], [102.0, 102.0]]))


class Reassigning(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x):
        self.y = self.y + x  # the wrong way: a new tensor, not an in-place update
        return self.y


class Removing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("y", torch.tensor([2.0]))

    def forward(self, x):
        del self._buffers["y"]
        return x + 1


def test_replacing_or_removing_a_buffer_in_forward_is_an_error():
    with pytest.raises(poptorch.Error, match=r"Buffer y is reassigned within the model when "
                                             r"calling the forward method\. This is not "
                                             r"supported\. Consider using self\.y\.copy_"):
        poptorch.inferenceModel(Reassigning())(torch.tensor([5.0]))
    with pytest.raises(poptorch.Error, match=r"Buffer y is removed from the model"):
        poptorch.inferenceModel(Removing())(torch.tensor([5.0]))
