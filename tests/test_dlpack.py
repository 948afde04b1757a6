"""DLPack and ipu tensors: export is refused with a clear error (a shared view could not see
the ipu's queued writes); a host copy is exported on request, with the CPU's values."""
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import poptorch


def computed(device: str) -> torch.Tensor:
    x = torch.arange(6.0, device=device).reshape(2, 3)
    x.mul_(2).add_(1)  # pending on the ipu until something syncs
    return x


EXPORTS = {
    "to_dlpack": torch.utils.dlpack.to_dlpack,
    "torch.from_dlpack": torch.from_dlpack,
    "torch.from_dlpack(device=cpu)": lambda t: torch.from_dlpack(t, device="cpu"),
    "np.from_dlpack": np.from_dlpack,
    "__dlpack__": lambda t: t.__dlpack__(),
}


@pytest.mark.parametrize("name", EXPORTS)
def test_sharing_an_ipu_tensor_is_refused_with_a_clear_error(name):
    EXPORTS[name](computed("cpu"))  # the CPU shares
    with pytest.raises(poptorch.Error, match=r"cannot be shared through DLPack.*t\.cpu\(\)") as info:
        EXPORTS[name](computed("ipu"))
    assert isinstance(info.value, BufferError)  # what DLPack consumers expect of a refusal


def test_a_host_copy_has_the_cpu_values():
    expected = computed("cpu")
    torch.testing.assert_close(torch.from_dlpack(computed("ipu").cpu()), expected)
    np.testing.assert_array_equal(np.from_dlpack(computed("ipu").cpu()), expected.numpy())


def test_a_requested_host_copy_is_exported_after_the_pending_ops():
    expected = np.from_dlpack(computed("cpu"), device="cpu", copy=True)
    actual = np.from_dlpack(computed("ipu"), device="cpu", copy=True)
    np.testing.assert_array_equal(actual, expected)


def test_the_device_is_an_extension_device():
    assert computed("ipu").__dlpack_device__()[0] == torch.utils.dlpack.DLDeviceType.kDLExtDev
    assert computed("cpu").__dlpack_device__() == torch.ones(1).__dlpack_device__()


def test_cpu_tensors_still_share_memory():
    t = torch.arange(4)
    shared = torch.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    shared[0] = -1
    assert t[0] == -1
    np.from_dlpack(t)[1] = -2
    assert t[1] == -2
