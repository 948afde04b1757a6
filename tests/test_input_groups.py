"""Options.inputReplicaGrouping: replicas of one input group read the same micro-batch."""
import copy

import pytest
import torch

import poptorch
from poptorch import CommGroupType


def grouped(rows_per_group, groups, iterations, replicas_of):
    """A host batch of `iterations x groups` micro-batches, and the batch each
    replica reads: replica r of iteration i reads micro-batch replicas_of[r]."""
    x = torch.randn(iterations * groups * rows_per_group, 5, generator=torch.Generator()
                    .manual_seed(0))
    micro = x.reshape(iterations, groups, rows_per_group, 5)
    per_replica = micro[:, replicas_of].reshape(-1, 5)
    return x, per_replica


@pytest.mark.parametrize("kind, replicas_of", [
    (CommGroupType.Consecutive, [0, 0, 1, 1]),
    (CommGroupType.Orthogonal, [0, 1, 0, 1]),
])
def test_inference_replicas_of_a_group_read_its_micro_batch(kind, replicas_of):
    model = torch.nn.Linear(5, 3)
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.inputReplicaGrouping(2, kind)
    x, per_replica = grouped(3, 2, 2, replicas_of)
    out = poptorch.inferenceModel(model, opts)(x)
    assert out.shape == (2 * 4 * 3, 3), "one output per replica"
    torch.testing.assert_close(out, model(per_replica).detach())


def test_training_equals_replicas_fed_the_repeated_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))

    class WithLoss(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            out = self.net(x)
            return out, (out ** 2).mean()

    twin = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.Training.gradientAccumulation(2)
    plain = opts.clone()
    opts.inputReplicaGrouping(4)  # one group: every replica reads the same micro-batch
    grouped_model = poptorch.trainingModel(WithLoss(model), opts,
                                           torch.optim.SGD(model.parameters(), lr=0.1))
    plain_model = poptorch.trainingModel(WithLoss(twin), plain,
                                         torch.optim.SGD(twin.parameters(), lr=0.1))
    for call in range(2):
        x = torch.randn(2 * 2 * 3, 5, generator=torch.Generator().manual_seed(call))
        repeated = x.reshape(2, 2, 1, 3, 5).expand(2, 2, 4, 3, 5).reshape(-1, 5)
        grouped_model(x)
        plain_model(repeated)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b)


def test_data_loader_batches_fit_the_grouped_model():
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.inputReplicaGrouping(2)
    dataset = torch.utils.data.TensorDataset(torch.randn(40, 5))
    loader = poptorch.DataLoader(opts, dataset, batch_size=3)
    model = torch.nn.Linear(5, 2)
    inference = poptorch.inferenceModel(model, opts)
    for (x,) in loader:
        assert x.shape[0] == 12
        assert inference(x).shape == (24, 2)


def test_a_batch_that_does_not_divide_into_groups_is_an_error():
    opts = poptorch.Options().deviceIterations(2).replicationFactor(4)
    opts.inputReplicaGrouping(2)
    with pytest.raises(poptorch.Error, match=r"input 0 has 10 rows: with inputReplicaGrouping"
                                             r"\(2\) .* = 4 micro-batches"):
        poptorch.inferenceModel(torch.nn.Linear(5, 2), opts)(torch.randn(10, 5))
    opts = opts.clone().replicationFactor(3)  # the model froze the first options
    with pytest.raises(poptorch.Error, match="multiple of 2"):
        poptorch.inferenceModel(torch.nn.Linear(5, 2), opts)(torch.randn(12, 5))


def test_an_input_changed_in_place_is_written_back_from_the_first_replica_of_its_group():
    class AddReplicaIndependentOne(torch.nn.Module):
        def forward(self, x):
            x += 1
            return x * 2

    opts = poptorch.Options().replicationFactor(4).inputReplicaGrouping(2)
    x = torch.arange(4.).reshape(2, 2)  # one row for each of the two groups
    expected = x + 1
    out = poptorch.inferenceModel(AddReplicaIndependentOne(), opts)(x)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, (expected * 2)[[0, 0, 1, 1]])


def test_orthogonal_groups_across_processes_are_refused():
    """Orthogonal groups would take replicas of several processes (which read
    their own inputs): an error before the processes meet."""
    opts = poptorch.Options().replicationFactor(4).inputReplicaGrouping(
        2, poptorch.CommGroupType.Orthogonal)
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(poptorch.Error, match=r"CommGroupType.Orthogonal\) with 2 processes: "
                                             r"its groups would span processes"):
        poptorch.inferenceModel(torch.nn.Linear(5, 2), opts)(torch.randn(8, 5))
