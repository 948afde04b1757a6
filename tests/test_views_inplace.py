"""Views, in-place ops and their combinations give the CPU's results."""
import pytest
import torch

import poptorch
from conftest import assert_same


def _slice_add(x):
    v = x[1:3, ::2]
    v.add_(100)
    return x, v


def _transpose_mul(x):
    x.t()[0].mul_(2)
    return x


def _view_chain(x):
    return x.view(6, 4).transpose(0, 1).reshape(-1)


def _unfold(x):
    return x.unfold(1, 2, 2)


def _expand(x):
    return x[:, :1].expand(4, 3) * 1


def _as_strided(x):
    return torch.as_strided(x, (2, 2), (1, 6), 1)


def _masked_fill(x):
    x.masked_fill_(x > 10, -1)
    return x


def _index_put(x):
    x.index_put_((torch.tensor([0, 2]),), torch.zeros(6, device=x.device))
    return x


def _copy_into_view(x):
    x[:, 1].copy_(torch.arange(4.0, device=x.device))
    x[2:].zero_()
    return x


def _view_of_inplace_result(x):
    y = x.view(-1)
    y.mul_(3)
    x[0, 0] = 42
    return y[:8], x


def _aliasing_in_place(x):
    x[:, 1:].add_(x[:, :-1])  # overlapping source and destination rows
    return x


def _setitem_with_tensor_index(x):
    x[torch.tensor([1, 3])] = torch.ones(6, device=x.device)
    return x


def _resize_and_out(x):
    out = torch.empty(0, device=x.device)
    torch.add(x, 1, out=out)
    return out


CASES = [_slice_add, _transpose_mul, _view_chain, _unfold, _expand, _as_strided, _masked_fill,
         _index_put, _copy_into_view, _view_of_inplace_result, _aliasing_in_place,
         _setitem_with_tensor_index, _resize_and_out]


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__.strip("_"))
def test_matches_cpu(case):
    base = torch.arange(24.0).reshape(4, 6)
    expected = case(base.clone())
    actual = case(base.clone().to("ipu"))
    assert_same(expected, actual)
    assert poptorch.metrics()["host_fallbacks"] == 0


@pytest.mark.parametrize("case,op", [
    (lambda x: torch.nonzero(x > 5), "aten::nonzero"),
    (lambda x: torch.unique(x), "aten::_unique2"),
    (lambda x: x[x > 10], "aten::index.Tensor"),
    (lambda x: torch.masked_select(x, x > 3), "aten::masked_select"),
])
def test_data_dependent_shapes_fall_back_to_the_host(case, op):
    base = torch.tensor([[3.0, 12.0, 5.0], [7.0, 1.0, 12.0]])
    assert_same(case(base), case(base.to("ipu")))
    fallbacks = poptorch.metrics()["fallback_ops"]
    assert poptorch.metrics()["host_fallbacks"] >= 1
    assert any(name.startswith(op) for name in fallbacks), fallbacks


def test_fallback_is_logged_once_per_op():
    from conftest import run_python
    result = run_python(
        "import torch, poptorch\n"
        "x = torch.tensor([0.0, 1.0, 2.0], device='ipu')\n"
        "for _ in range(3): torch.nonzero(x).cpu()\n"
        "print(poptorch.metrics()['fallback_ops'])\n",
        env={"POPTORCH_LOG_LEVEL": "WARN"},
    )
    assert "{'aten::nonzero': 3}" in result.stdout
    assert result.stderr.count("aten::nonzero ran on the host") == 1, result.stderr


def test_view_ops_raise_the_cpus_errors(device):
    # A view of ipu storage cannot run on the host: a failing view op raises
    # the Meta kernel's error, which is the CPU's.
    x = torch.randn(3, 3, device=device)
    with pytest.raises(RuntimeError, match="stride divisible by 2 for all but last dimension"):
        torch.view_as_complex(torch.as_strided(x, (2, 2), (1, 1)))
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        torch.view_as_complex(x)


def _mask_after_slice(x):
    x[:, torch.tensor([True, False, True, False, False, True], device=x.device)] = 0
    return x


def _list_after_slice(x):
    x[1:3, [1, 2]] = -1
    return x


def _mask_in_the_middle(x):
    y = x.view(2, 2, 6)
    y[:, torch.tensor([True, False], device=x.device), :] = 7
    return x


@pytest.mark.parametrize("case", [_mask_after_slice, _list_after_slice, _mask_in_the_middle],
                         ids=lambda f: f.__name__.strip("_"))
def test_index_assignment_after_a_skipped_dimension_matches_cpu(case):
    base = torch.arange(24.0).reshape(4, 6)
    assert_same(case(base.clone()), case(base.clone().to("ipu")))


def test_quantized_tensors_are_refused_not_computed_wrong():
    x = torch.randn(4, device="ipu")
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported"):
        torch.quantize_per_tensor(x, 0.1, 5, torch.quint8)
