"""Gradient checkpointing (torch.utils.checkpoint) in a trainingModel: the
checkpointed part of forward runs again in backward under the poptorch state of
its first run (the half/float casting rule, autocast regions, blocks), for
use_reentrant True and False, with the CPU's losses and weights."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import poptorch

STEPS = 3


class Model(torch.nn.Module):
    """first -> checkpoint(tanh(inner(x) + h) * constant) -> head -> loss:
    the checkpointed part takes the float32 input and the first layer's output,
    and makes a tensor (a constant of the step); `around` is the context of the
    checkpoint call (of the checkpointed part, `inside`) and of the head,
    `inner_of` computes the inner layer."""

    def __init__(self, use_reentrant, around=None, inside=False):
        super().__init__()
        self.first, self.inner, self.head = (torch.nn.Linear(4, 4), torch.nn.Linear(4, 4),
                                             torch.nn.Linear(4, 2))
        self.use_reentrant = use_reentrant
        self.around = around or (lambda part: _Nothing())
        self.inside = inside

    def inner_of(self, t):
        return self.inner(t)

    def part(self, h, x):
        with self.around("inner") if self.inside else _Nothing():
            return torch.tanh(self.inner_of(x) + h) * torch.linspace(0.5, 1.5, 4, dtype=h.dtype)

    def forward(self, x, y):
        h = self.first(x)
        with _Nothing() if self.inside else self.around("inner"):
            h = checkpoint(self.part, h, x, use_reentrant=self.use_reentrant)
        with self.around("head"):
            out = self.head(h)
        return out, F.mse_loss(out.float(), y)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def train(model, reference, inputs=lambda x: x, accumulation=1, **close):
    """STEPS steps of `model` in a trainingModel and `reference` on the CPU,
    which accumulates the micro-batches' gradients."""
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    ipu = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(2 * accumulation, 4, generator=data)
        y = torch.randn(2 * accumulation, 2, generator=data)
        _, loss = ipu(x, y)
        optimizer.zero_grad()
        for xs, ys in zip(x.chunk(accumulation), y.chunk(accumulation)):
            ref = reference(inputs(xs), ys)[1]
            (ref / accumulation).backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref.detach(), **close)  # the last micro-batch's
    ipu.copyWeightsToHost()
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b.to(a.dtype), msg=name, **close)
    ipu.destroy()


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_half_model_recomputes_under_the_casting_rule(use_reentrant):
    """A float16 model given float32 inputs: FloatDowncastToHalf casts them in
    forward, and again when the checkpointed part runs in backward (an error
    before: mat1 and mat2 of other dtypes). The CPU model is given float16."""
    torch.manual_seed(0)
    model = Model(use_reentrant).half()
    train(model, copy.deepcopy(model), inputs=lambda x: x.half(), rtol=2e-3, atol=2e-3)


class _ExplicitCasts(Model):
    """The CPU's version of autocast around the checkpoint: the inner linear in
    float16 (its weights cast), then the head mixes float16 and float32, which
    FloatDowncastToHalf runs in float16."""

    def inner_of(self, t):
        return F.linear(t.half(), self.inner.weight.half(), self.inner.bias.half())

    def part(self, h, x):
        return torch.tanh(self.inner_of(x) + h.half()) * torch.linspace(0.5, 1.5, 4).half()

    def forward(self, x, y):
        h = checkpoint(self.part, self.first(x), x, use_reentrant=self.use_reentrant)
        out = F.linear(h, self.head.weight.half(), self.head.bias.half())
        return out, F.mse_loss(out.float(), y)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_an_autocast_region_is_recomputed_in_float16(use_reentrant):
    """`with poptorch.autocast():` around the checkpoint call: the recomputed
    linear runs in float16 as its first run did (float32 before: its saved
    values and the backward parted from the forward's)."""
    torch.manual_seed(0)
    around = lambda part: poptorch.autocast() if part == "inner" else _Nothing()  # noqa: E731
    model = Model(use_reentrant, around)
    reference = _ExplicitCasts(use_reentrant)
    reference.load_state_dict(model.state_dict())
    train(model, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("blocks", ["scopes", "begin_block"])
def test_blocks_are_entered_again_when_recomputed(use_reentrant, blocks):
    """The checkpointed part in a block of its own, before the head's block on
    another IPU (a later pipeline stage): its recomputation in backward begins
    that block again, which must not count as a stage running after a later one."""
    torch.manual_seed(0)
    if blocks == "scopes":
        ipus = {"inner": 0, "head": 1}
        model = Model(use_reentrant, lambda part: poptorch.Block(part, ipu_id=ipus[part]),
                      inside=True)
        model.first = poptorch.BeginBlock(model.first, "first", ipu_id=0)
        reference = Model(use_reentrant)
        reference.load_state_dict(model.state_dict())
    else:
        model = Model(use_reentrant)
        reference = copy.deepcopy(model)
        model.inner = poptorch.BeginBlock(model.inner, "inner", ipu_id=0)
        model.head = poptorch.BeginBlock(model.head, "head", ipu_id=1)
    # A pipeline of 2 stages: 3 micro-batches at least.
    train(model, reference, accumulation=3, rtol=1e-5, atol=1e-6)
