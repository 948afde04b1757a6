"""A copy into a temporary (.contiguous(), reshape) is not run when its
readers can read its source through composed views (passes::forwardCopies):
values must be the CPU's whichever way the views go."""
import pytest
import torch
from torch import nn


@pytest.mark.parametrize("read", [
    lambda c: c[1:3] * 2,                      # a slice of each copy dimension
    lambda c: c.unflatten(-1, (2, 4)).sum(-1),  # a dimension split
    lambda c: c.transpose(0, 2) + 1,           # transposed again
    lambda c: c.flatten(0, 1) @ c[0].t(),      # flattened: the copy stays
])
def test_readers_of_a_copy_read_the_cpus_values(read):
    torch.manual_seed(0)
    x = torch.randn(5, 6, 8)

    def f(t):
        c = t.transpose(0, 1).contiguous()
        return read(c), c.sum()

    expected = f(x)
    got = f(x.to("ipu"))
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e)


def test_a_source_written_after_the_copy_keeps_the_copy():
    x = torch.randn(4, 6)

    def f(t):
        t = t.clone()
        c = t.t().contiguous()
        t.mul_(3)
        return c[1:] * 2, t

    for e, g in zip(f(x), f(x.to("ipu"))):
        torch.testing.assert_close(g.cpu(), e)


def test_transformer_inference_gives_the_cpus_values():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 10, 32)
    with torch.no_grad():
        expected = model(x)
        got = model.to("ipu")(x.to("ipu")).cpu()
    torch.testing.assert_close(got, expected)
