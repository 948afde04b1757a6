"""poptorch::bernoulli_ (csrc/kernels/bernoulli.cpp), which compiled programs run
for aten::bernoulli_.float (dropout's masks): its values against a reference of
the stream written here, the same at any thread count and layout, and its
distribution against PyTorch's CPU kernel (the values differ from the CPU's for
a seed, as the ipu's random values do; docs/user_guide.md)."""
import math

import pytest
import torch

import poptorch  # noqa: F401  (registers torch.ops.poptorch)

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF
LANES = 8
BLOCK = 4 * LANES


def philox(key, counter):
    """The four words of Philox4x32-10 for counter {counter, 0, 0} (64 bits in
    the first two words) under a 64-bit key."""
    c = [counter & MASK, counter >> 32, 0, 0]
    k0, k1 = key & MASK, key >> 32
    for _ in range(10):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK]
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c


def reference(numel, p, seed):
    """Element e is word j of counter 8 b + l, for e = 32 b + 8 j + l."""
    threshold = math.ceil(p * 2 ** 24)
    out = []
    for e in range(numel):
        block, rest = divmod(e, BLOCK)
        word = philox(seed, block * LANES + rest % LANES)[rest // LANES]
        out.append(1.0 if (word >> 8) < threshold else 0.0)
    return torch.tensor(out)


def fill(t, p, seed):
    return torch.ops.poptorch.bernoulli_(t, p, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_values_are_the_stream_of_the_seed(dtype):
    # 1073 elements: 33 whole blocks (vectorised for float32) and a tail of 17.
    seed = 0x0123456789ABCDEF
    out = fill(torch.empty(37, 29, dtype=dtype), 0.7, seed)
    torch.testing.assert_close(out.float().flatten(), reference(37 * 29, 0.7, seed),
                               rtol=0, atol=0)


def test_values_follow_the_row_major_order_whatever_the_layout():
    seed = 99
    strided = fill(torch.empty(29, 37).t(), 0.3, seed)
    assert not strided.is_contiguous()
    torch.testing.assert_close(strided, fill(torch.empty(37, 29), 0.3, seed), rtol=0, atol=0)


def test_values_do_not_depend_on_the_number_of_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fill(torch.empty(300_001), 0.5, 5)
        torch.set_num_threads(2)
        two = fill(torch.empty(300_001), 0.5, 5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_seeds_give_different_streams():
    a, b = fill(torch.empty(4096), 0.5, 1), fill(torch.empty(4096), 0.5, 2)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_certain_outcomes(p):
    assert torch.equal(fill(torch.empty(1000), p, 3), torch.full((1000,), p))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_distribution_matches_the_cpu_kernel(p):
    n = 1 << 20
    ours = fill(torch.empty(n), p, 11)
    cpu = torch.empty(n).bernoulli_(p, generator=torch.Generator().manual_seed(11))
    sigma = math.sqrt(p * (1 - p) / n)
    for mask in (ours, cpu):
        assert abs(mask.mean().item() - p) < 5 * sigma
    # Neighbours (within a counter's lanes, across its words, across blocks)
    # are independent: their correlation is that of independent draws.
    centred = ours - p
    for shift in (1, LANES, BLOCK):
        corr = (centred[:-shift] * centred[shift:]).mean().item() / (p * (1 - p))
        assert abs(corr) < 5 / math.sqrt(n)
    # Runs of kept elements have the geometric lengths of independent draws.
    kept_pairs = (ours[:-1] * ours[1:]).mean().item()
    assert abs(kept_pairs - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / n)


def test_p_outside_the_unit_interval_is_the_cpus_error():
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\]"):
        torch.empty(3).bernoulli_(1.5)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\]"):
        fill(torch.empty(3), 1.5, 0)


def test_compiled_dropout_runs_the_counter_based_fill():
    torch.manual_seed(0)
    x = torch.ones(64, 128, device="ipu")
    poptorch._C.profiling_set_enabled(True)
    try:
        out = torch.nn.functional.dropout(x, 0.25).cpu()
        programs = poptorch._C.profiling_programs()
    finally:
        poptorch._C.profiling_set_enabled(False)
        poptorch._C.profiling_take()
    names = [name for node_names, _, _ in programs.values() for name in node_names]
    assert "poptorch::bernoulli_" in names and "aten::bernoulli_" not in names
    # Kept elements are scaled by 1 / (1 - p), as on the CPU.
    assert set(out.unique().tolist()) <= {0.0, (torch.ones(()) / 0.75).item()}
    kept = (out != 0).float().mean().item()
    assert abs(kept - 0.75) < 5 * math.sqrt(0.75 * 0.25 / out.numel())


def test_compiled_dropout_follows_the_seed_at_the_call():
    def dropped():
        torch.manual_seed(3)
        return torch.nn.functional.dropout(torch.ones(1000, device="ipu"), 0.5).cpu()

    first = dropped()
    assert torch.equal(first, dropped())
    assert not torch.equal(first, torch.nn.functional.dropout(
        torch.ones(1000, device="ipu"), 0.5).cpu())
