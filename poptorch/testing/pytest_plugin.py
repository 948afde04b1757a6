"""A pytest plugin that runs a suite's tests on the ``cpu`` and on the ``ipu``.

Installed with poptorch (a ``pytest11`` entry point), so any suite has it:

* A test that takes a ``device`` argument runs once per device, with ids
  ``[cpu]`` and ``[ipu]``::

      def test_relu(device):
          x = torch.tensor([-1.0, 2.0], device=device)
          assert torch.relu(x).tolist() == [0.0, 2.0]

* ``@pytest.mark.devices("ipu")`` limits a test to the devices named.
* ``--poptorch-devices=ipu`` (a comma-separated list) limits the whole run.
* After an ipu test, what it left pending runs, so that an error its ops raise
  is reported on that test, not on a later one.
"""
from __future__ import annotations

from typing import Iterator, List

import pytest

DEVICES = ("cpu", "ipu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--poptorch-devices", default=",".join(DEVICES),
                     help="devices that tests taking a `device` argument run on "
                          "(comma-separated; default: cpu,ipu)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "devices(*names): run this test only on the devices named (cpu, ipu)")
    unknown = set(_selected(config)) - set(DEVICES)
    if unknown:
        raise pytest.UsageError(
            f"--poptorch-devices: unknown device(s) {sorted(unknown)}; choose from {DEVICES}")


def _selected(config: pytest.Config) -> List[str]:
    return [d.strip() for d in config.getoption("--poptorch-devices").split(",") if d.strip()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" not in metafunc.fixturenames:
        return
    devices = _selected(metafunc.config)
    marker = metafunc.definition.get_closest_marker("devices")
    if marker is not None:
        unknown = set(marker.args) - set(DEVICES)
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.devices names "
                                    f"unknown device(s) {sorted(unknown)}")
        devices = [d for d in devices if d in marker.args]
    # An empty list makes pytest report the test as skipped, with the reason.
    metafunc.parametrize("device", devices, indirect=True, ids=devices)


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The device this instance of the test runs on: ``"cpu"`` or ``"ipu"``."""
    name: str = request.param
    if name == "ipu":
        import poptorch  # registers the device; imported only where it is used
        yield name
        poptorch.synchronize()
    else:
        yield name
