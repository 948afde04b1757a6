"""torch.use_deterministic_algorithms on the ipu: kernels see the setting of
the op's call, not the one in force when the graph runs."""
import torch

from poptorch.testing import assert_same


def _index_copy_of_repeated_indices(device):
    """Which of the repeated indices' rows wins depends on the setting."""
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(2000, 4, 3).to(device)
    indices = torch.randint(0, 2000, (40000,), generator=g).to(device)
    rows = torch.randn(40000, 4, 3, generator=g).to(device)
    return target.index_copy(0, indices, rows)


def test_the_setting_at_the_call_decides_not_the_one_at_the_sync():
    try:
        torch.use_deterministic_algorithms(True)
        expected = _index_copy_of_repeated_indices("cpu")
        result = _index_copy_of_repeated_indices("ipu")
    finally:
        torch.use_deterministic_algorithms(False)
    # Read after the setting was switched off; with several threads the
    # CPU's other kernel would give other rows.
    assert torch.equal(result.cpu(), expected)


def test_new_memory_is_filled_deterministically_like_the_cpu():
    try:
        torch.use_deterministic_algorithms(True)
        cpu = (torch.empty(3), torch.empty(2, dtype=torch.int32))
        ipu = (torch.empty(3, device="ipu"), torch.empty(2, dtype=torch.int32, device="ipu"))
        cpu += (torch.ones(2).resize_(5),)
        ipu += (torch.ones(2, device="ipu").resize_(5),)
    finally:
        torch.use_deterministic_algorithms(False)
    assert_same(cpu, ipu, equal_nan=True)
