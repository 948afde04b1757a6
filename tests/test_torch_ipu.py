"""torch.ipu like torch.cuda: memory statistics, random state, streams and events, amp."""
from __future__ import annotations

import pytest
import torch

import poptorch


def test_memory_stats_follow_allocations_on_each_ipu():
    for index, device in ((0, 0), (1, 1), (1, "ipu:1"), (2, torch.device("ipu", 2))):
        before = torch.ipu.memory_stats(device)
        x = torch.empty(1024, device=torch.device("ipu", index))
        stats = torch.ipu.memory_stats(device)
        assert stats["allocated_bytes.all.current"] == before["allocated_bytes.all.current"] + 4096
        assert stats["reserved_bytes.all.current"] == stats["allocated_bytes.all.current"]
        assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
        free, total = torch.ipu.mem_get_info(device)
        assert total == stats["total_bytes"]
        assert free == total - stats["allocated_bytes.all.current"]
        del x
        assert torch.ipu.memory_allocated(device) == before["allocated_bytes.all.current"]


def test_peak_memory_resets():
    torch.ipu.reset_peak_memory_stats()
    base = torch.ipu.memory_allocated()
    x = torch.empty(4096, device="ipu")
    del x
    assert torch.ipu.max_memory_allocated() == base + 16384
    torch.ipu.reset_peak_memory_stats(0)
    assert torch.ipu.max_memory_allocated(0) == base
    assert torch.ipu.max_memory_reserved(0) == base


def test_memory_summary_names_the_ipu_and_its_numbers():
    summary = torch.ipu.memory_summary(1, abbreviated=True)
    assert "ipu:1" in summary and "allocated now" in summary and "900.00 MiB" in summary


def test_empty_cache_frees_the_host_memory_kept_for_temporaries():
    x = torch.randn(64, 64).to("ipu")
    ((x @ x).relu() @ x).sum().cpu()  # temporaries in an arena, kept for the next run
    assert torch.ipu.memory_stats()["host_cached_bytes"] > 0
    allocated = torch.ipu.memory_allocated()
    torch.ipu.empty_cache()
    assert torch.ipu.memory_stats()["host_cached_bytes"] == 0
    assert torch.ipu.memory_allocated() == allocated


def test_rng_state_replays_the_ipus_random_numbers():
    state = torch.ipu.get_rng_state()
    a = torch.rand(5, device="ipu").cpu()
    torch.ipu.set_rng_state(state, "ipu:0")
    assert torch.equal(torch.rand(5, device="ipu").cpu(), a)
    states = torch.ipu.get_rng_state_all()
    assert len(states) == torch.ipu.device_count()
    b = torch.rand(5, device="ipu").cpu()
    torch.ipu.set_rng_state_all(states)
    assert torch.equal(torch.rand(5, device="ipu").cpu(), b)
    torch.ipu.manual_seed_all(7)
    c = torch.randn(5, device="ipu").cpu()
    torch.ipu.manual_seed(7)
    assert torch.equal(torch.randn(5, device="ipu").cpu(), c)
    assert torch.ipu.initial_seed() == 7


def test_streams_run_the_pending_work():
    stream = torch.ipu.current_stream()
    assert stream == torch.ipu.default_stream(0) and stream.device == torch.device("ipu", 0)
    with torch.ipu.stream(stream):
        y = torch.ones(3).to("ipu") * 2
    assert not stream.query()  # the multiplication waits to run
    stream.synchronize()
    assert stream.query() and poptorch._C.pending_nodes() == 0
    assert torch.equal(y.cpu(), torch.full((3,), 2.0))


def test_amp_is_torch_autocast_and_grad_scaler_of_the_ipu():
    import torch.ipu.amp  # noqa: F401  (importable like torch.cuda.amp)
    from torch.ipu.amp import GradScaler, autocast

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with autocast():
        out = a.to("ipu") @ b.to("ipu")
    with torch.autocast("ipu", dtype=torch.float16):
        reference = a.to("ipu") @ b.to("ipu")
    assert out.dtype == torch.float16
    assert torch.equal(out.cpu(), reference.cpu())
    with autocast(dtype=torch.bfloat16):
        assert (a.to("ipu") @ b.to("ipu")).dtype == torch.bfloat16
    scaler = GradScaler(init_scale=4.0)
    assert scaler.get_scale() == 4.0 and scaler._device == "ipu"


def test_the_module_is_initialized_and_registered():
    assert torch.ipu.is_initialized()
    torch.ipu.init()
    assert torch.get_device_module("ipu") is torch.ipu
