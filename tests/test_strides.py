"""Results on the ipu have the strides the CPU gives them: a later .view() then succeeds or
fails on both devices alike. Each case runs on the CPU and on the ipu from inputs of the same
layout, and compares values and strides."""
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same


def same_layout(t: torch.Tensor, device: str) -> torch.Tensor:
    """`t` on `device` with its strides (built without relying on .to() keeping them)."""
    base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return base.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def check(fn: Callable, *inputs: torch.Tensor) -> None:
    expected = fn(*inputs)
    actual = fn(*(same_layout(t, "ipu") for t in inputs))
    for e, a in zip(expected if isinstance(expected, tuple) else [expected],
                    actual if isinstance(actual, tuple) else [actual]):
        assert a.shape == e.shape
        assert a.stride() == e.stride(), f"ipu strides {a.stride()}, the CPU's {e.stride()}"
        assert_same(e, a, atol=1e-5, rtol=1e-5)


TRANSPOSED = torch.randn(3, 4).t()
STRIDED_SLICE = torch.randn(5, 6).t()[::2]
CHANNELS_LAST = torch.randn(2, 4, 5, 6).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("layout", ["transposed", "strided_slice", "channels_last"])
def test_moving_to_the_ipu_keeps_the_layout(layout):
    t = {"transposed": TRANSPOSED, "strided_slice": STRIDED_SLICE,
         "channels_last": CHANNELS_LAST}[layout]
    moved = t.to("ipu")
    # As for CUDA: the strides of a dense tensor, dense strides in the same order otherwise.
    assert moved.stride() == t.clone().stride()
    assert_same(t, moved)
    assert moved.cpu().stride() == t.clone().stride()


CONVERSIONS = {
    "half": lambda t: t.half(),
    "int": lambda t: t.int(),
    "float_to_complex": lambda t: t.to(torch.complex64),
    "clone": lambda t: t.clone(),
    "zeros_like": torch.zeros_like,
    "abs": torch.abs,
    "neg": torch.neg,
    "sin": torch.sin,
    "add_scalar": lambda t: t + 1,
}


@pytest.mark.parametrize("name", CONVERSIONS)
@pytest.mark.parametrize("layout", ["transposed", "strided_slice"])
def test_conversions_and_pointwise_ops_keep_the_input_layout(name, layout):
    check(CONVERSIONS[name], TRANSPOSED if layout == "transposed" else STRIDED_SLICE)


@pytest.mark.parametrize("op", [torch.abs, torch.sin, lambda t, out: torch.add(t, 1, out=out)])
def test_an_empty_out_tensor_takes_the_layout_of_the_inputs(op):
    """A pointwise kernel resizing its out= tensor gives it its inputs' order of strides."""
    def run(t):
        out = torch.empty(0, device=t.device)
        op(t, out=out)
        return out
    check(run, TRANSPOSED)


def test_a_view_of_a_result_succeeds_or_fails_as_on_the_cpu():
    for device in ("cpu", "ipu"):
        half = same_layout(TRANSPOSED, device).half()
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            half.view(-1)


NCHW_OPS = {
    "conv2d": lambda x: F.conv2d(x, torch.ones(3, 4, 3, 3, device=x.device)),
    "conv2d_bias": lambda x: F.conv2d(x, torch.ones(3, 4, 3, 3, device=x.device),
                                      torch.ones(3, device=x.device)),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "group_norm": lambda x: F.group_norm(x, 2),
    "max_pool2d": lambda x: F.max_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x, 2),
    "interpolate": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "relu": F.relu,
}


@pytest.mark.parametrize("name", NCHW_OPS)
def test_channels_last_inputs_give_channels_last_results(name):
    check(NCHW_OPS[name], CHANNELS_LAST)


def test_a_channels_last_weight_gives_a_channels_last_convolution():
    weight = torch.randn(3, 4, 3, 3).to(memory_format=torch.channels_last)
    check(F.conv2d, CHANNELS_LAST.contiguous(), weight)


@pytest.mark.parametrize("fn", [torch.linalg.svd, torch.linalg.eig, torch.linalg.qr,
                                lambda a: torch.linalg.lstsq(a, a)])
def test_linalg_results_are_column_major_as_on_the_cpu(fn):
    check(fn, torch.randn(4, 4) + 4 * torch.eye(4))


def test_batch_norm_in_eval_mode_returns_empty_saved_statistics_as_the_cpu():
    def run(x):
        mean, var = torch.zeros(4, device=x.device), torch.ones(4, device=x.device)
        return torch.ops.aten.native_batch_norm(x, None, None, mean, var, False, 0.1, 1e-5)
    check(run, CHANNELS_LAST)


# Dense, with dims of size 1 whose strides are not the contiguous ones (a narrowed dim), and
# not dense: the CPU's sort keeps self's strides, or infers dense ones in self's order.
@pytest.mark.parametrize("layout", [torch.zeros(1, 3, 1, 1).narrow(1, 2, 1),
                                    torch.randn(2, 3, 4).transpose(0, 2)[::2]],
                         ids=["size_one_dims", "strided"])
@pytest.mark.parametrize("fn", [lambda x: torch.sort(x, 0), lambda x: torch.msort(x),
                                lambda x: torch.argsort(x, dim=-1, stable=True)],
                         ids=["sort", "msort", "argsort"])
def test_sort_results_keep_the_cpu_strides(fn, layout):
    check(fn, layout)


@pytest.mark.parametrize("layout", ["transposed", "strided_slice"])
def test_max_unpool2d_of_strided_inputs_places_values_as_on_the_cpu(layout):
    pooled, indices = F.max_pool2d(torch.randn(1, 4, 4, 8), 2, return_indices=True)
    if layout == "transposed":
        pooled, indices = (t.transpose(2, 3).contiguous().transpose(2, 3) for t in (pooled, indices))
    else:  # every other plane
        pooled, indices = pooled[:, ::2], indices[:, ::2]
    check(lambda p, i: F.max_unpool2d(p, i, 2), pooled, indices)


# Dims of size 1 with strides other than the contiguous ones, and empty tensors: PyTorch's
# Python Meta kernels restride such results by their own rule, the CPU keeps self's strides
# (empty_like) or orders them as TensorIterator does.
SIZE_ONE_DIMS = torch.randn(12).as_strided((4, 1, 3), (3, 7, 1))
EMPTY = torch.randn(3, 0).t()
ODD_LAYOUT_OPS = {
    "hardtanh": F.hardtanh,
    "relu6": F.relu6,
    "relu": F.relu,
    "prelu": lambda x: F.prelu(x, torch.full((1,), 0.25, device=x.device)),
    "leaky_relu": F.leaky_relu,
    "gelu": F.gelu,
    "softmax": lambda x: F.softmax(x, -1),
    "batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "clone": torch.clone,
    "mul": lambda x: x * x,
}


@pytest.mark.parametrize("layout", [SIZE_ONE_DIMS, EMPTY], ids=["size_one_dims", "empty"])
@pytest.mark.parametrize("name", ODD_LAYOUT_OPS)
def test_results_of_size_one_and_empty_dims_have_the_cpu_strides(name, layout):
    check(ODD_LAYOUT_OPS[name], layout)


def test_pixel_unshuffle_of_a_single_channel_has_the_cpu_strides():
    check(lambda x: F.pixel_unshuffle(x, 2), torch.randn(2, 1, 4, 6)[:, :, :, :4])


def test_an_out_tensor_resized_from_size_one_dims_has_the_cpu_strides():
    def run(t):
        out = torch.empty(0, device=t.device)
        torch.clamp(t, -1, 1, out=out)
        return out
    check(run, SIZE_ONE_DIMS)



@pytest.mark.parametrize("format", [None, torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("layout", ["transposed", "strided_slice", "channels_last"])
def test_resize_to_its_own_size_keeps_the_strides_unless_a_format_is_asked(layout, format):
    t = {"transposed": TRANSPOSED, "strided_slice": STRIDED_SLICE,
         "channels_last": CHANNELS_LAST}[layout]
    if format is torch.channels_last and t.dim() != 4:
        pytest.skip("channels_last is for 4-d tensors")
    kwargs = {} if format is None else {"memory_format": format}
    resized = {device: same_layout(t, device).resize_(t.shape, **kwargs)
               for device in ("cpu", "ipu")}
    assert resized["ipu"].stride() == resized["cpu"].stride()
    assert resized["ipu"].storage_offset() == resized["cpu"].storage_offset()
    if format is None:  # the elements are unchanged
        assert_same(resized["cpu"], resized["ipu"])
