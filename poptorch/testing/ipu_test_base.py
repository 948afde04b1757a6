"""The ipu's ``DeviceTypeTestBase``, for PyTorch's device-generic test files.

PyTorch loads out-of-tree device test bases from the files named in the
``TORCH_TEST_DEVICES`` environment variable: ``common_device_type`` runs each
with ``runpy`` while it is being imported and takes the class the file sets as
``TEST_CLASS``. With this file named there,
``instantiate_device_type_tests(..., only_for="ipu")`` instantiates PyTorch's
generic tests for the ipu (``TestViewOpsIPU.test_..._ipu_float32``...).
"""
from __future__ import annotations

import functools
import sys
import unittest
from typing import Any, Callable, ClassVar, List

import torch
from torch.testing._internal import common_utils

# Imported while common_device_type itself is being imported (runpy): the
# module is partly initialised, but the classes used here are defined already.
from torch.testing._internal.common_device_type import DeviceTypeTestBase

import poptorch

_DEVICE_TYPE_MODULE = sys.modules["torch.testing._internal.common_device_type"]

UNSUPPORTED_DTYPES = (torch.float64, torch.complex128)
UNSUPPORTED_REASON = ("IPUs have no 64-bit floating point: float64 and complex128 ipu tensors "
                      "are refused with a TypeError (as on PyTorch's MPS backend)")

# Generic tests of a capability the ipu does not have, skipped with the reason, as
# PyTorch's files skip them on devices without it (test_cow_input is @skipXPU).
SKIPPED_TESTS = {
    "test_cow_input": ("copy-on-write storage: PyTorch's COW shares a host DataPtr whose context "
                       "is its data, and an ipu storage's context is its lazily materialised "
                       "block; torch._lazy_clone of an ipu tensor is an eager clone"),
}

# PyTorch runs @onlyNativeDeviceTypes tests only on "native" device types, and
# for any other type assertRaisesRegex accepts any message. The ipu is native
# in the sense those tests check: its tensors are strided, views share their
# storage, and its errors are PyTorch's own with the CPU's messages. Counting it
# as native runs those tests and checks its error messages.
if "ipu" not in common_utils.NATIVE_DEVICES:
    common_utils.NATIVE_DEVICES = (*common_utils.NATIVE_DEVICES, "ipu")
_DEVICE_TYPE_MODULE.NATIVE_DEVICES = common_utils.NATIVE_DEVICES


def _dtypes_of(kwargs: dict) -> List[torch.dtype]:
    found = kwargs.get("dtypes", kwargs.get("dtype"))
    if found is None:
        return []
    return list(found) if isinstance(found, (list, tuple)) else [found]


def _skipping_64_bit_floats(test: Callable) -> Callable:
    """Wraps a generic test so that its float64/complex128 variants skip with the reason.

    ``functools.wraps`` carries the test's attributes (``dtypes``, ``parametrize_fn``,
    precision overrides), so PyTorch instantiates the wrapper as it would the test.
    """
    @functools.wraps(test)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        if any(dtype in UNSUPPORTED_DTYPES for dtype in _dtypes_of(kwargs)):
            raise unittest.SkipTest(UNSUPPORTED_REASON)
        return test(self, *args, **kwargs)

    return wrapper


def _skipped(test: Callable, reason: str) -> Callable:
    @functools.wraps(test)  # keeps the attributes PyTorch instantiates from (@ops, @dtypes)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        raise unittest.SkipTest(reason)

    return wrapper


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "ipu":
        return value.cpu()
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        converted = [_to_cpu(v) for v in value]
        return converted if isinstance(value, list) else tuple(converted)
    return value


class IPUTestBase(DeviceTypeTestBase):
    device_type = "ipu"
    primary_device: ClassVar[str]

    @classmethod
    def get_primary_device(cls) -> str:
        return cls.primary_device

    @classmethod
    def get_all_devices(cls) -> List[str]:
        """The primary ipu first, then every other virtual IPU (for @deviceCountAtLeast)."""
        others = [f"ipu:{i}" for i in range(torch.ipu.device_count())
                  if f"ipu:{i}" != cls.primary_device]
        return [cls.primary_device, *others]

    @classmethod
    def setUpClass(cls) -> None:
        cls.primary_device = f"ipu:{torch.ipu.current_device()}"

    @classmethod
    def instantiate_test(cls, name: str, test: Callable, *, generic_cls: Any = None) -> None:
        test = _skipped(test, SKIPPED_TESTS[name]) if name in SKIPPED_TESTS else test
        super().instantiate_test(name, _skipping_64_bit_floats(test), generic_cls=generic_cls)

    def tearDown(self) -> None:
        # Run what the test left pending, so that an error its ops raise when they
        # run is reported on this test, not on the next one that syncs.
        try:
            poptorch.synchronize()
        finally:
            super().tearDown()

    def _should_stop_test_suite(self) -> bool:
        # The emulated ipu has no sticky error state: a failed graph does not
        # break the tests after it. Drain what the failed test left pending.
        try:
            poptorch.synchronize()
        except Exception:  # noqa: BLE001 - the test's own error is reported already
            pass
        return False

    def assertEqual(self, x: Any, y: Any, *args: Any, **kwargs: Any) -> None:
        """PyTorch's assertEqual, on the host copies of ipu tensors.

        Comparing on the ipu would run the comparison's own ops (``isclose``,
        ``abs``...) through the device under test; the host copies are exactly
        the ipu's values. ``exact_device=True`` compares the tensors as they are.
        """
        if not kwargs.get("exact_device", False):
            x, y = _to_cpu(x), _to_cpu(y)
        super().assertEqual(x, y, *args, **kwargs)


TEST_CLASS = IPUTestBase
