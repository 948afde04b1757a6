"""Autograd's view metadata of ipu tensors is the CPU's (csrc/capture/view_autograd.cpp).

c10 says the IPU cannot do as_strided, so PyTorch would rebuild a view's history after an
in-place write by replaying its view ops; the CPU uses one as_strided. Each case runs on
both devices and compares gradients, the grad_fn a view ends with, and what autograd says
about it."""
from typing import Any, Callable, List

import pytest
import torch
from torch.autograd.forward_ad import dual_level, make_dual, unpack_dual

import poptorch  # noqa: F401 - registers the ipu
from poptorch.testing import assert_same


def _grad_fn(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


def _dtype_view_filled_in_place(dev):
    x = torch.tensor(1.5, device=dev).requires_grad_()
    bits = x.view(torch.int32)
    view = bits.view(())
    bits.fill_(x.view(()))
    return [view.is_leaf, _grad_fn(view), view.requires_grad]


def _integer_view_filled_from_a_tensor_that_requires_grad(dev):
    ints = torch.tensor(3, device=dev)
    view = ints.view((1,))
    view.fill_(torch.tensor(1.5, device=dev).requires_grad_())
    return [view, _grad_fn(view), _grad_fn(ints)]


def _views_of_a_detached_base(dev):
    x = torch.tensor(1.5, device=dev).requires_grad_()
    view = x.view(())
    bits = view.view(torch.int32)
    x.detach_()
    bits.neg_()
    return [view.requires_grad, view.is_leaf, _grad_fn(view)]


def _base_squeezed_in_place(dev):
    a = torch.arange(6.0, device=dev).reshape(1, 2, 3).requires_grad_()
    b = a.clone()
    v = b[0].t()
    b.squeeze_(0)
    b.mul_(2)
    return [torch.autograd.grad((v * v).sum(), a)[0], _grad_fn(v)]


def _chain_of_views_written_in_place(dev):
    a = torch.arange(24.0, device=dev).reshape(2, 3, 4).requires_grad_()
    b = a * 1
    v = b.transpose(0, 2)[1:3].unsqueeze(0).expand(2, -1, -1, -1)[0]
    v.add_(torch.ones_like(v) * 2)
    b.view(6, 4)[2:4].mul_(5)
    loss = (b * b).sum() + v.sum()
    return [torch.autograd.grad(loss, a)[0], _grad_fn(v), _grad_fn(b)]


def _view_as_real_of_a_view(dev):
    # A view that changes metadata, of a view without a view function: the CPU chains
    # an as_strided matching the base with view_as_real.
    z = torch.view_as_complex(torch.arange(12.0).reshape(3, 2, 2)).to(dev).requires_grad_()
    w = z.clone()
    r = torch.view_as_real(w.t())
    r.mul_(2)
    loss = torch.view_as_real(w).pow(2).sum()
    new_base = torch.view_as_complex(torch.arange(100.0, 112.0).reshape(3, 2, 2)).to(dev)
    return [torch.autograd.grad(loss, z)[0], _grad_fn(r), _grad_fn(w),
            r._view_func_unsafe(new_base), r._rev_view_func_unsafe(r * 0).shape]


def _conj_of_a_row_then_the_base_written(dev):
    z = torch.view_as_complex(torch.arange(12.0).reshape(3, 2, 2)).to(dev).requires_grad_()
    w = z.clone()
    c = w[1].conj()
    w.mul_(3)
    loss = torch.view_as_real(c.resolve_conj()).sum()
    return [torch.autograd.grad(loss, z)[0], _grad_fn(c)]


def _neg_view_of_a_row(dev):
    a = torch.arange(6.0, device=dev).reshape(2, 3).requires_grad_()
    b = a.clone()
    n = torch._neg_view(b[0])
    b.add_(1)
    return [torch.autograd.grad((n * n).sum(), a)[0], _grad_fn(n)]


def _outputs_of_split_written_through_the_base(dev):
    a = torch.arange(12.0, device=dev).reshape(4, 3).requires_grad_()
    b = a.clone()
    _, q = b.split(2)
    r = q.t()
    b.mul_(2)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        r.grad_fn  # pylint: disable=pointless-statement
    return [q.requires_grad]


def _forward_ad_through_views(dev):
    with dual_level():
        x = make_dual(torch.arange(6.0, device=dev), torch.ones(6, device=dev))
        y = x.clone().view(2, 3)
        v = y.t()
        y.mul_(y)
        return [unpack_dual(v).tangent, unpack_dual(y).tangent]


def _views_replayed_as_their_ops(dev):
    # With view replay on, the CPU gives every view its view functions, forward and reverse
    # (PyTorch's test_ops test_view_replay). Views of a view made with replay off are not
    # covered: PyTorch's chain refuses them on the ipu (docs/pytorch_tests.md).
    a = torch.arange(24.0, device=dev).reshape(2, 3, 4).clone()
    results = []
    with torch.autograd._force_original_view_tracking(True):
        for view in (a.transpose(0, 2), a[1:, :2], a.unsqueeze(0), a.view(6, 4)):
            reverse = view._rev_view_func_unsafe(view.detach())
            results += [view._view_func_unsafe(a.clone() + 1), reverse,
                        reverse._is_view(), reverse._base is not None]
    return results


CASES: List[Callable[[str], List[Any]]] = [
    _views_replayed_as_their_ops,
    _dtype_view_filled_in_place, _integer_view_filled_from_a_tensor_that_requires_grad,
    _views_of_a_detached_base, _base_squeezed_in_place, _chain_of_views_written_in_place,
    _view_as_real_of_a_view, _conj_of_a_row_then_the_base_written, _neg_view_of_a_row,
    _outputs_of_split_written_through_the_base, _forward_ad_through_views,
]


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__.strip("_"))
def test_view_autograd_matches_cpu(case):
    cpu, ipu = case("cpu"), case("ipu")
    assert len(cpu) == len(ipu)
    for expected, actual in zip(cpu, ipu):
        if isinstance(expected, torch.Tensor):
            assert_same(expected.detach(), actual.detach())
        else:
            assert expected == actual


def test_the_views_that_change_metadata_are_torchgens():
    # The C++ side keeps its own list (with inverses); a new torch may add one.
    gen = pytest.importorskip("torchgen.packaged.autograd.gen_inplace_or_view_type")
    ours = {"view_as_real", "view_as_complex", "_conj", "_neg_view"}
    assert {n for n in gen.VIEW_FUNCTIONS_WITH_METADATA_CHANGE if "nested" not in n} == ours


def test_views_under_functorch_transforms_match_cpu():
    # Wrapper tensors (vmap, grad) add dispatch keys above autograd's.
    from torch.func import grad, vmap  # pylint: disable=import-outside-toplevel

    def f(row):
        return (row.view(2, 2).t()[0] * row[1:3]).sum()

    x = torch.arange(12.0).reshape(3, 4)
    for transform, arg in ((vmap(f), x), (grad(f), x[0]), (vmap(grad(f)), x)):
        assert_same(transform(arg), transform(arg.to("ipu")))
