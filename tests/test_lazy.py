"""Ops are captured, not run, until a value is needed; graphs are cached."""
import copy
from typing import Dict

import pytest
import torch
from torch import nn

import poptorch
from conftest import run_python

METRIC_KEYS = {"ops_captured", "graphs_compiled", "cache_hits", "cache_evictions", "executions",
               "host_fallbacks", "fallback_ops", "compile_seconds", "execute_seconds",
               "bytes_to_ipu", "bytes_from_ipu"}


def test_ops_are_captured_not_run():
    x = torch.ones(4, device="ipu")
    y = (x * 3 + 1).relu()
    assert poptorch._C.pending_nodes() >= 3
    assert poptorch.metrics()["executions"] == 0
    assert torch.equal(y.cpu(), torch.full((4,), 4.0))
    assert poptorch.metrics()["executions"] == 1
    assert poptorch._C.pending_nodes() == 0


@pytest.mark.parametrize("read", [
    lambda t: t.cpu(), lambda t: t.sum().item(), lambda t: str(t), lambda t: t.tolist(),
    lambda t: poptorch.synchronize(),
])
def test_sync_points_run_the_pending_graph(read):
    t = torch.ones(2, device="ipu") * 5
    read(t)
    assert poptorch.metrics()["executions"] >= 1
    assert poptorch._C.pending_nodes() == 0


def test_shape_errors_surface_at_the_line_that_caused_them(device):
    a = torch.ones(3, 4, device=device)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ torch.ones(5, 4, device=device)
    with pytest.raises(RuntimeError, match="must match"):
        a + torch.ones(5, device=device)


def test_metrics_have_every_counter_and_reset():
    (torch.ones(2, device="ipu") + 1).cpu()
    m = poptorch.metrics()
    assert METRIC_KEYS <= set(m)
    assert m["ops_captured"] > 0 and m["graphs_compiled"] == 1 and m["bytes_from_ipu"] == 8
    poptorch.reset_metrics()
    m = poptorch.metrics()
    assert all(m[k] == 0 for k in METRIC_KEYS - {"fallback_ops"}) and m["fallback_ops"] == {}


def test_the_same_graph_runs_from_the_cache():
    x = torch.randn(8, 8, device="ipu")
    poptorch.synchronize()
    poptorch.reset_metrics()
    for _ in range(3):
        (x @ x).sum().item()
    m = poptorch.metrics()
    assert m["graphs_compiled"] == 1 and m["cache_hits"] == 2


def test_changing_a_python_scalar_does_not_recompile():
    x = torch.randn(16, device="ipu")
    poptorch.synchronize()
    poptorch.reset_metrics()
    for lr in (0.1, 0.01, 0.001):
        expected = (x.cpu() * lr + 1).sum()
        torch.testing.assert_close((x * lr + 1).sum().cpu(), expected)
    assert poptorch.metrics()["graphs_compiled"] == 1


def test_a_graph_that_grows_too_large_runs_on_its_own():
    result = run_python(
        "import torch, poptorch\n"
        "x = torch.zeros(4, device='ipu')\n"
        "for _ in range(25): x = x + 1\n"
        "print(poptorch.metrics()['executions'], poptorch._C.pending_nodes(), x.sum().item())\n",
        env={"POPTORCH_MAX_GRAPH_NODES": "10", "POPTORCH_STREAM_NODES": "0"},
    )
    executions, pending, total = result.stdout.split()
    assert (int(executions), int(pending), float(total)) == (2, 6, 100.0), result.stderr  # zero_ + 25 adds


def test_dead_results_are_not_computed_and_values_stay_right():
    x = torch.randn(64, 64, device="ipu")
    unused = x @ x  # noqa: F841  (dropped before the sync)
    del unused
    y = x.sum()
    torch.testing.assert_close(y.cpu(), x.cpu().sum())


def test_random_ops_follow_the_seed_at_the_call():
    torch.manual_seed(7)
    a = torch.rand(5, device="ipu")
    b = torch.nn.functional.dropout(torch.ones(100, device="ipu"), 0.5)
    torch.manual_seed(7)
    c = torch.rand(5, device="ipu")
    d = torch.nn.functional.dropout(torch.ones(100, device="ipu"), 0.5)
    assert torch.equal(a.cpu(), c.cpu()) and torch.equal(b.cpu(), d.cpu())
    assert not torch.equal(a.cpu(), torch.rand(5, device="ipu").cpu())
    kept = (b.cpu() != 0).float().mean().item()
    assert 0.3 < kept < 0.7


def test_uploading_into_a_tensor_used_by_pending_ops_keeps_order():
    x = torch.zeros(3, device="ipu")
    y = x + 1           # reads x before the copy
    x.copy_(torch.tensor([5.0, 6.0, 7.0]))
    z = x + 1           # reads x after the copy
    assert y.tolist() == [1.0, 1.0, 1.0] and z.tolist() == [6.0, 7.0, 8.0]


def test_host_scalars_are_snapshotted_at_capture():
    s = torch.tensor(2.0)
    y = torch.ones(2, device="ipu") * s
    s.fill_(10.0)
    assert y.tolist() == [2.0, 2.0]


def test_meta_results_are_cached_by_signature():
    x = torch.randn(7, 5, device="ipu")
    (x * 2).relu().sum(0).cpu()
    size = poptorch._C.meta_cache_size()
    (x * 2).relu().sum(0).cpu()
    assert poptorch._C.meta_cache_size() == size
    (torch.randn(3, 5, device="ipu") * 2).relu().sum(0).cpu()  # new shapes: new signatures
    assert poptorch._C.meta_cache_size() > size


def test_cached_shapes_follow_scalar_values():
    for n in (3, 5, 3, 8):
        assert torch.arange(n, device="ipu").cpu().tolist() == list(range(n))
    for fill in (1.0, 2.5):
        assert torch.full((2,), fill, device="ipu").tolist() == [fill, fill]


def test_cached_results_keep_aliasing_right():
    base = torch.arange(12.0).reshape(3, 4)
    for _ in range(2):
        a = base.clone().to("ipu")
        b = base.clone().to("ipu")
        a[1:].copy_(a[:-1].clone())    # same storage on both sides
        b[1:].copy_(a[1:])             # different storages, same shapes
        expected = base.clone()
        expected[1:] = expected[:-1].clone()
        assert torch.equal(a.cpu(), expected) and torch.equal(b.cpu(), expected)


def test_streaming_chunks_to_the_device_queue_keeps_results_and_the_cache_right():
    result = run_python(
        "import torch, poptorch\n"
        "torch.manual_seed(0)\n"
        "def run(device):\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(8, 3)).to(device)\n"
        "    opt = torch.optim.Adam(m.parameters(), lr=0.01)\n"
        "    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))\n"
        "    losses, compiled = [], []\n"
        "    for _ in range(6):\n"
        "        opt.zero_grad()\n"
        "        loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))\n"
        "        loss.backward(); opt.step(); losses.append(loss.item())\n"
        "        compiled.append(poptorch.metrics()['graphs_compiled'])\n"
        "    return losses, compiled\n"
        "cpu, _ = run('cpu'); ipu, compiled = run('ipu')\n"
        "print(max(abs(a - b) / abs(a) for a, b in zip(cpu, ipu)) < 1e-4, compiled[2:] == [compiled[1]] * 4)\n",
        env={"POPTORCH_STREAM_NODES": "4"},
    )
    assert result.stdout.split() == ["True", "True"], result.stdout + result.stderr


def test_torch_profiler_sees_the_nodes_a_program_runs():
    from torch.profiler import profile

    def count_mm(device):
        a, b = torch.randn(4, 5), torch.randn(5, 3)
        with profile() as prof:
            (a.to(device) @ b.to(device)).cpu()
        return sum(e.count for e in prof.key_averages() if e.key == "aten::mm")

    # On the ipu the op is recorded when captured and again when it runs.
    assert count_mm("ipu") == count_mm("cpu") + 1


def _run_on_ipu_checked(model: nn.Module, x: torch.Tensor) -> Dict[str, int]:
    """Runs a copy of ``model`` on the ipu, checks its output against the CPU's
    and returns how often each op ran (captured or run) under the profiler."""
    from torch.profiler import profile
    expected = model(x)
    on_ipu = copy.deepcopy(model).to("ipu")
    with profile() as prof:
        y = on_ipu(x.to("ipu")).cpu()
    torch.testing.assert_close(y, expected)
    return {e.key: e.count for e in prof.key_averages()}


def test_linear_then_relu_runs_as_one_fused_kernel_with_the_cpus_values():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ops = _run_on_ipu_checked(model, torch.randn(8, 16))
    assert ops.get("aten::_addmm_activation", 0) == 1
    # Captured once as relu; never run as one.
    assert ops.get("aten::relu", 0) == 1


@pytest.mark.parametrize("approximate,fused", [("none", True), ("tanh", False)])
def test_linear_then_gelu_runs_fused_when_the_cpus_fused_kernel_computes_it(approximate, fused):
    # BERT's intermediate layer at inference: Linear on a 3-D batch, then the
    # exact GELU (in training the backward reads the product: no fusion).
    # _addmm_activation's GELU is the exact one; the tanh approximation stays apart.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate=approximate), nn.Linear(32, 4))
    with torch.no_grad():
        ops = _run_on_ipu_checked(model, torch.randn(2, 8, 16))
    assert ops.get("aten::_addmm_activation", 0) == (1 if fused else 0)
    assert ops.get("aten::gelu", 0) == (1 if fused else 2)


def test_a_bias_added_to_a_product_runs_as_one_addmm_with_the_cpus_values():
    # linear on an input it must reshape (a transposed batch) runs mm, then
    # add_ of the bias: on the ipu the two run as one addmm.
    torch.manual_seed(0)
    model = nn.Linear(16, 24)
    ops = _run_on_ipu_checked(model, torch.randn(8, 5, 16).transpose(0, 1))
    assert ops.get("aten::addmm", 0) == 1
    # Captured once as mm and add_; never run as them.
    assert ops.get("aten::mm", 0) == 1 and ops.get("aten::add_", 0) == 1


def test_a_fused_bias_takes_the_alpha_of_each_run():
    # The add_'s alpha is a runtime value: one executable serves every alpha.
    a, b, bias = torch.randn(6, 4), torch.randn(4, 3), torch.randn(3)

    def product_plus_bias(device, alpha):
        y = a.to(device) @ b.to(device)
        return y.view(2, 3, 3).add_(bias.to(device), alpha=alpha).cpu()

    product_plus_bias("ipu", 1.0)
    compiled = poptorch.metrics()["graphs_compiled"]
    for alpha in (0.5, -2.0, 3.0):
        torch.testing.assert_close(product_plus_bias("ipu", alpha), product_plus_bias("cpu", alpha))
    assert poptorch.metrics()["graphs_compiled"] == compiled


def test_matrix_products_write_into_planned_memory_across_runs():
    # Temporaries live in an arena reused by every run: results must not
    # depend on what an earlier run left there.
    torch.manual_seed(0)
    a, b, c = torch.randn(64, 32), torch.randn(32, 48), torch.randn(48, 8)
    for scale in (1.0, -2.0, 0.5):
        expected = torch.relu((a * scale) @ b) @ c + 1
        result = (torch.relu((a.to("ipu") * scale) @ b.to("ipu")) @ c.to("ipu") + 1).cpu()
        torch.testing.assert_close(result, expected)
