"""poptorch::tanh (csrc/kernels/tanh.cpp), which compiled programs run for
float32 aten::tanh (passes::useOwnKernels): SLEEF's vectorised 3.5-ulp tanhf. Its
values against the CPU's within float32's tolerance, exact at the special
values, for every layout and length (the tail of a length that is no multiple
of eight goes through the vector path too); other dtypes and layouts run the
CPU's own tanh; a graph and a trained model with tanh match the CPU."""
import math

import pytest
import torch
from torch import nn

import poptorch
from conftest import train_micro_batches_beside_the_cpu


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (37, 29), (8, 128, 1024)])
def test_values_match_the_cpu(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 4
    torch.testing.assert_close(torch.ops.poptorch.tanh(x), torch.tanh(x))


def test_error_is_within_three_and_a_half_ulp_of_the_exact_value():
    # Dense over [-10, 10]: the polynomial's range and the saturation.
    x = torch.linspace(-10, 10, 1_000_003)
    exact = x.double().tanh()
    error = (torch.ops.poptorch.tanh(x).double() - exact).abs()
    # One ulp of a float32 in [2^(e-1), 2^e) is 2^(e-24).
    ulp = torch.ldexp(torch.ones_like(exact), exact.abs().frexp().exponent - 24)
    assert (error / ulp.clamp_min(2.0 ** -149)).max().item() <= 3.5


def test_special_values_are_the_cpus():
    x = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-30, -1e-45, 20.0, -20.0])
    got, want = torch.ops.poptorch.tanh(x), torch.tanh(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    number = ~x.isnan()  # a NaN's sign means nothing
    assert torch.equal(got[number].signbit(), want[number].signbit())


def test_layouts_and_out_tensors():
    x = torch.randn(6, 10, 5, 7)
    for view in (x.transpose(0, 2), x.to(memory_format=torch.channels_last), x[:, ::2]):
        got = torch.ops.poptorch.tanh(view)
        torch.testing.assert_close(got, torch.tanh(view))
        assert got.shape == view.shape
    out = torch.empty(0)
    torch.ops.poptorch.tanh.out(x, out=out)  # resized, as a structured out= kernel does
    torch.testing.assert_close(out, torch.tanh(x))
    y = x.clone()
    torch.ops.poptorch.tanh.out(y, out=y)  # in place
    torch.testing.assert_close(y, torch.tanh(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes_run_the_cpus_tanh(dtype):
    x = torch.randn(100, dtype=dtype)
    torch.testing.assert_close(torch.ops.poptorch.tanh(x), torch.tanh(x), rtol=0, atol=0)


def _ran_fast_tanh(fn, *args):
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, any(e.name == "poptorch::tanh" for e in prof.events())


def test_a_lazy_graph_runs_it_for_float32_and_matches_the_cpu():
    x = torch.randn(64, 33)
    out, fast = _ran_fast_tanh(lambda t: (torch.tanh(t * 0.5) + 1).cpu(), x.to("ipu"))
    torch.testing.assert_close(out, torch.tanh(x * 0.5) + 1)
    assert fast
    out, fast = _ran_fast_tanh(lambda t: torch.tanh(t).cpu(), x.half().to("ipu"))
    torch.testing.assert_close(out, torch.tanh(x.half()), rtol=0, atol=0)
    assert not fast


class _TanhNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 40), nn.Linear(40, 3)

    def forward(self, x, y):
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, nn.functional.cross_entropy(out, y)


def test_training_and_inference_models_with_tanh_match_the_cpu():
    torch.manual_seed(0)
    x, y = torch.randn(4 * 8, 12), torch.randint(0, 3, (4 * 8,))
    ipu = _TanhNet()
    cpu = train_micro_batches_beside_the_cpu(ipu, x, y)
    inference = poptorch.inferenceModel(ipu.eval(), poptorch.Options().deviceIterations(4))
    torch.testing.assert_close(inference(x, y)[0], cpu(x, y)[0].detach())
