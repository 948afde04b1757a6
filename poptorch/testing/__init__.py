"""Testing tools for code that runs on the ipu.

* ``DEVICE_TEST_BASE``: the file to name in ``TORCH_TEST_DEVICES`` so that
  PyTorch's ``instantiate_device_type_tests`` runs its device-generic tests on
  the ipu (see ``docs/pytorch_tests.md``)::

      TORCH_TEST_DEVICES=$(python -m poptorch.testing) \\
          python -m pytest test_view_ops.py -k ipu

* A pytest plugin (``poptorch.testing.pytest_plugin``, registered as a
  ``pytest11`` entry point) that runs tests taking a ``device`` argument on the
  ``cpu`` and on the ``ipu``.
* ``assert_same(cpu_value, ipu_value)``: compares a result computed on the CPU
  with the same result computed on the ipu.
"""
from __future__ import annotations

from pathlib import Path

from ._compare import assert_same

DEVICE_TEST_BASE = str(Path(__file__).resolve().parent / "ipu_test_base.py")

__all__ = ["DEVICE_TEST_BASE", "assert_same"]
