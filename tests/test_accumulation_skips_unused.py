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
    torch.manual_seed(0)
    model = OneUnusedLayer()
    reference = copy.deepcopy(model)
    accumulation = 2
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    ipu = poptorch.trainingModel(model, opts, OPTIMIZERS[name](model.parameters()))
    optimizer = OPTIMIZERS[name](reference.parameters())
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
