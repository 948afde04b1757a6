"""torch.histc of integer tensors on the ipu counts as CUDA's does (the CPU's takes
floating types only): Hugging Face's mixture-of-experts layers count the tokens per
expert with an int32 histc on every device but the CPU and MPS."""
import pytest
import torch

import poptorch


def cuda_histc(values, bins, low, high):
    """CUDA's rule for integers (SummaryOps.cu), element by element."""
    values = [int(v) for v in values.reshape(-1)]
    if low == high and values:
        low, high = min(values), max(values)
    if low == high:
        low, high = low - 1, high + 1
    counts = [0] * bins
    for v in values:
        if low <= v <= high:
            counts[min((v - low) * bins // (high - low), bins - 1)] += 1
    return counts


CASES = [  # values, bins, min, max
    ([0, 1, 2, 3, 3, 4, -1, 5], 4, 0, 3),  # outside the range: dropped; max: the last bin
    ([0, 1, 2, 3, 3, 4], 3, 0, 4),  # bins narrower than one value each
    ([7, 7, 7], 4, 0, 0),  # min == max: the data's range, widened by one
    ([5, -3, 9, 0, 2], 5, 0, 0),
    ([], 3, 0, 0),
    ([1, 2, 3, 1000], 7, -50, 2000),
]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8,
                                   torch.uint8])
@pytest.mark.parametrize("values, bins, low, high", CASES)
def test_integer_histc_is_cudas(dtype, values, bins, low, high):
    info = torch.iinfo(dtype)
    if not info.min <= min(values, default=0) <= max(values, default=0) <= info.max:
        pytest.skip(f"values beyond {dtype}")
    x = torch.tensor(values, dtype=dtype).reshape(-1, 1) if values else torch.tensor(
        [], dtype=dtype)
    result = torch.histc(x.to("ipu"), bins=bins, min=low, max=high)
    assert result.dtype == dtype and result.device.type == "ipu"
    assert result.cpu().tolist() == cuda_histc(x, bins, low, high)
    # Small integers count as the CPU counts them as floats.
    expected = torch.histc(x.float(), bins=bins, min=low, max=high)
    assert result.cpu().tolist() == expected.to(dtype).tolist()


def test_float_histc_is_still_the_cpus():
    x = torch.randn(100)
    torch.testing.assert_close(torch.histc(x.to("ipu"), bins=7, min=-1, max=1).cpu(),
                               torch.histc(x, bins=7, min=-1, max=1), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.histc(torch.ones(3, dtype=torch.bool), bins=2)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="ipu"), bins=2).cpu()


@pytest.mark.parametrize("bins, low, high, message", [
    (0, 0, 3, "bins must be > 0"),
    (3, 3, 1, "max must be larger than min"),
])
def test_integer_histc_refuses_at_the_call_as_the_cpu(bins, low, high, message):
    x = torch.arange(4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=message):
        torch.histc(x.float(), bins=bins, min=low, max=high)
    with pytest.raises(RuntimeError, match=message):
        torch.histc(x.to("ipu"), bins=bins, min=low, max=high)


def test_integer_histc_in_a_wrapped_model_reads_nothing_on_the_host():
    class Router(torch.nn.Module):
        def forward(self, experts):
            return torch.histc(experts, bins=4, min=0, max=3)

    model = poptorch.inferenceModel(Router())
    compiled = None
    for seed in range(3):
        experts = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(seed),
                                dtype=torch.int32)
        counts = model(experts)
        assert counts.tolist() == cuda_histc(experts, 4, 0, 3)
        if compiled is None:
            compiled = poptorch.metrics()["graphs_compiled"]
    # Other routings replay the one compiled step: no value was read on the host.
    assert poptorch.metrics()["graphs_compiled"] == compiled
