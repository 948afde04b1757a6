"""Storages made by PyTorch's constructors on the ipu, and storage identity
(``is_set_to``), each against the CPU."""
import copy

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")


def _storages(device):
    return [
        torch.UntypedStorage(device=device),
        torch.UntypedStorage(0, device=device),
        torch.UntypedStorage([1, 2, 255, 0], device=device),
        torch.UntypedStorage(torch.Size([7]), device=device),
        torch.TypedStorage([1.5, -2.0, 3.25], dtype=torch.float32, device=device),
        torch.TypedStorage([True, False], dtype=torch.bool, device=device),
        torch.TypedStorage([[1, 2], [3, 4]][0], dtype=torch.int16, device=device),
    ]


def test_storage_constructors_work_on_the_ipu_like_the_cpu():
    cpu, ipu = _storages("cpu"), _storages("ipu")
    for c, i in zip(cpu, ipu):
        assert type(c) is type(i)
        assert i.device.type == "ipu"
        assert (c.nbytes(), c.size(), c.tolist()) == (i.nbytes(), i.size(), i.tolist())


def test_sized_storages_are_writable_and_resizable_from_python():
    for device in ("cpu", "ipu"):
        s = torch.TypedStorage(4, dtype=torch.float32, device=device)
        s[:] = 0
        s[1:3] = 2.5
        assert s.tolist() == [0.0, 2.5, 2.5, 0.0]
        t = torch.empty(0, device=device).set_(s)
        assert t.device.type == device and t.tolist() == [0.0, 2.5, 2.5, 0.0]


def test_bad_storage_arguments_raise_the_cpus_errors():
    for bad in (dict(args=([1, "x"],)), dict(args=(2, 3))):
        errors = []
        for device in ("cpu", "ipu"):
            with pytest.raises((TypeError, RuntimeError)) as info:
                torch.UntypedStorage(*bad["args"], device=device)
            errors.append(info.type)
        assert errors[0] is errors[1]


def test_clone_and_deepcopy_of_ipu_storages_keep_values_and_sharing():
    results = []
    for device in ("cpu", "ipu"):
        a = torch.arange(6, dtype=torch.float32, device=device) * 2  # pending on the ipu
        clone = a.untyped_storage().clone()
        assert clone.device.type == device
        q = [a, [a.storage()], a.view(2, 3)]
        w = copy.deepcopy(q)
        w[0].add_(1)  # the copied storage and view share the copied tensor's bytes
        results.append((torch.empty(0, device=device).set_(clone).tolist(), w[1][0].tolist(),
                        w[2].tolist(), a.tolist()))
    assert results[0] == results[1]


def test_is_set_to_compares_storage_offset_and_layout_like_the_cpu():
    observed = []
    for device in ("cpu", "ipu"):
        t1 = torch.empty(3, 4, 9, 10, device=device)
        t3 = torch.tensor([], device=device).set_(t1)
        t4 = t3.clone().resize_(12, 90)
        b = torch.tensor([True, True], device=device)
        pending = torch.ones(2, 3, device=device) * 2  # not run yet on the ipu
        observed.append([
            t1.is_set_to(torch.empty(3, 4, 9, 10, device=device)), t1.is_set_to(t3),
            t3.is_set_to(t1), t1.is_set_to(t4), t1.is_set_to(t1.view(4, 3, 9, 10)),
            t1.is_set_to(t1[1:]), b.is_set_to(torch.tensor([0], dtype=torch.bool,
                                                           device=device).set_(b)),
            pending.is_set_to(pending.view(2, 3)), pending.is_set_to(pending.t()),
        ])
    assert observed[0] == observed[1]
    assert observed[1][1]  # a tensor set to another's storage is set to it
