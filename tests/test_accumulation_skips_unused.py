"""With gradient accumulation, the update skips a parameter that took no gradient,
as torch.optim skips one whose .grad is None: no weight decay, no momentum."""
import copy

import pytest
import torch

import poptorch

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
}


def beside_the_cpu(model_class, name, accumulation=2):
    """A new model wrapped in a trainingModel accumulating `accumulation`
    micro-batches with optimiser `name`, and its CPU copy with its own."""
    torch.manual_seed(0)
    model = model_class()
    reference = copy.deepcopy(model)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    ipu = poptorch.trainingModel(model, opts, OPTIMIZERS[name](model.parameters()))
    return model, reference, ipu, OPTIMIZERS[name](reference.parameters()), accumulation


class OneUnusedLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)  # no gradient: forward never calls it

    def forward(self, x, y):
        out = self.used(x)
        return out, torch.nn.functional.mse_loss(out, y)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_parameter_without_gradient_is_not_updated(name):
    model, reference, ipu, optimizer, accumulation = beside_the_cpu(OneUnusedLayer, name)
    for _ in range(3):
        x, y = torch.randn(accumulation * 2, 4), torch.randn(accumulation * 2, 4)
        ipu(x, y)
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(accumulation), y.chunk(accumulation)):
            (reference(xs, ys)[1] / accumulation).backward()
        optimizer.step()
    ipu.copyWeightsToHost()
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)


class Branching(torch.nn.Module):
    """Trains `sometimes` only for micro-batches whose `use` flags are set: a
    value read on the host, so each value is a variant of the captured step."""

    def __init__(self):
        super().__init__()
        self.always = torch.nn.Linear(4, 4)
        self.sometimes = torch.nn.Linear(4, 4)

    def forward(self, x, y, use):
        out = self.always(x)
        if bool(use.any()):
            out = out + self.sometimes(x)
        return out, torch.nn.functional.mse_loss(out, y)


# Each step's `use` flag per micro-batch: whether that micro-batch trains `sometimes`.
ORDERS = {
    "more_first": [(1, 1), (0, 0), (1, 0), (0, 0), (0, 1)],
    "fewer_first": [(0, 0), (1, 1), (0, 0), (0, 1), (1, 0)],
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_variants_update_the_parameters_their_micro_batches_trained(name, order):
    """A step whose micro-batches all took the variant without `sometimes`
    leaves it and its optimiser state alone, as torch.optim skips a parameter
    whose .grad is None; a step where any micro-batch trained it updates it."""
    model, reference, ipu, optimizer, accumulation = beside_the_cpu(Branching, name)
    for flags in ORDERS[order]:
        x, y = torch.randn(accumulation * 2, 4), torch.randn(accumulation * 2, 4)
        use = torch.tensor(flags).repeat_interleave(2)
        _, loss = ipu(x, y, use)
        optimizer.zero_grad()
        losses = []
        for xs, ys, us in zip(x.chunk(accumulation), y.chunk(accumulation), use.chunk(accumulation)):
            losses.append(reference(xs, ys, us)[1])
            (losses[-1] / accumulation).backward()
        optimizer.step()
        torch.testing.assert_close(loss, losses[-1].detach(), rtol=1e-5, atol=1e-6)
    ipu.copyWeightsToHost()
    for (key, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
