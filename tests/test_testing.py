"""poptorch.testing: the ipu's DeviceTypeTestBase for PyTorch's device-generic
tests, and the pytest plugin that runs a suite on the cpu and the ipu."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import poptorch.testing
from conftest import ROOT

pytest_plugins = ["pytester"]

# A device-generic test file in PyTorch's style, instantiated through the ipu's base.
GENERIC_TESTS = textwrap.dedent('''
    import torch
    from torch.testing._internal.common_device_type import (
        deviceCountAtLeast, dtypes, instantiate_device_type_tests, onlyCPU,
        onlyNativeDeviceTypes)
    from torch.testing._internal.common_utils import TestCase, run_tests

    KEPT = []

    class TestGeneric(TestCase):
        @dtypes(torch.float32, torch.float64, torch.complex128)
        def test_add(self, device, dtype):
            x = torch.ones(3, device=device, dtype=dtype)
            self.assertEqual((x + 1).device.type, "ipu")
            self.assertEqual(x + 1, torch.full((3,), 2.0, dtype=dtype))

        @onlyNativeDeviceTypes
        def test_native_error_message(self, device):
            with self.assertRaisesRegex(RuntimeError, "cannot be multiplied"):
                torch.ones(2, 3, device=device) @ torch.ones(2, 3, device=device)

        @onlyNativeDeviceTypes
        def test_wrong_message_fails(self, device):
            with self.assertRaisesRegex(RuntimeError, "a message no op gives"):
                torch.ones(2, 3, device=device) @ torch.ones(2, 3, device=device)

        @onlyCPU
        def test_cpu_only(self, device):
            pass

        @deviceCountAtLeast(2)
        def test_devices(self, devices):
            self.assertEqual(devices, [f"ipu:{i}" for i in range(torch.ipu.device_count())])

        def test_deferred_error_is_reported_here(self, device):
            # The index is checked when the graph runs: at this test's tearDown.
            # (KEPT keeps the result alive: dead results are not computed.)
            KEPT.append(torch.ones(3, device=device))
            KEPT[-1].index_add_(0, torch.tensor([7], device=device), torch.ones(1, device=device))

        def test_next_test_starts_clean(self, device):
            self.assertEqual((torch.ones(2, device=device) * 3).sum().item(), 6.0)

        def test_cow_input(self, device):  # the name of test_ops' copy-on-write test
            self.assertTrue(torch._C._is_cow_tensor(torch._lazy_clone(torch.ones(2, device=device))))

    instantiate_device_type_tests(TestGeneric, globals(), only_for="ipu")

    if __name__ == "__main__":
        run_tests()
''')


@pytest.fixture(scope="module")
def generic_outcomes(tmp_path_factory):
    """Runs GENERIC_TESTS through the ipu's base (TORCH_TEST_DEVICES): test -> outcome line."""
    path = tmp_path_factory.mktemp("generic") / "test_generic.py"
    path.write_text(GENERIC_TESTS)
    env = dict(os.environ, TORCH_TEST_DEVICES=poptorch.testing.DEVICE_TEST_BASE,
               PYTHONPATH=str(ROOT), PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    result = subprocess.run([sys.executable, "-m", "pytest", str(path), "-v", "-rs",
                             "-p", "no:cacheprovider"],
                            cwd=path.parent, env=env, capture_output=True, text=True,
                            timeout=300)
    lines = result.stdout.splitlines()
    outcomes = {}
    for line in lines:
        if "::TestGenericIPU::" in line and " " in line:
            name, _, outcome = line.partition("::TestGenericIPU::")[2].partition(" ")
            outcomes[name] = outcome.split()[0]
    return outcomes, result.stdout


def test_the_base_instantiates_ipu_tests_only(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes, log
    assert all(name.split("_ipu")[0] != name for name in outcomes), outcomes
    assert "TestGenericCPU" not in log


def test_float64_and_complex128_variants_skip_with_the_reason(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_add_ipu_float32"] == "PASSED", log
    assert outcomes["test_add_ipu_float64"] == "SKIPPED", log
    assert outcomes["test_add_ipu_complex128"] == "SKIPPED", log
    assert "IPUs have no 64-bit floating point" in log


def test_the_ipu_counts_as_native_and_error_messages_are_checked(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_native_error_message_ipu"] == "PASSED", log
    # For a non-native device type PyTorch would accept any message.
    assert outcomes["test_wrong_message_fails_ipu"] == "FAILED", log


def test_cpu_only_tests_are_skipped_by_pytorch(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_cpu_only_ipu"] == "SKIPPED", log


def test_multi_device_tests_get_every_ipu(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_devices_ipu"] == "PASSED", log


def test_a_deferred_error_is_reported_on_its_test_and_not_the_next(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_deferred_error_is_reported_here_ipu"] in ("FAILED", "ERROR"), log
    assert outcomes["test_next_test_starts_clean_ipu"] == "PASSED", log


def test_a_test_of_a_capability_the_ipu_lacks_skips_with_the_reason(generic_outcomes):
    outcomes, log = generic_outcomes
    assert outcomes["test_cow_input_ipu"] == "SKIPPED", log
    assert "copy-on-write storage" in log


def test_a_lazy_clone_of_an_ipu_tensor_is_a_clone():
    # torch._lazy_clone: the generic kernel refused ipu storage ("Expected storage != nullptr")
    host = torch.randn(3, 4, requires_grad=True)
    x = host.detach().to("ipu").requires_grad_()
    clone = torch._lazy_clone(x)
    torch.testing.assert_close(clone.cpu(), host.detach())
    (clone * 2).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3, 4), 2.0))
    with torch.no_grad():
        clone.add_(1)  # a storage of its own
    torch.testing.assert_close(x.cpu(), host.detach())
    assert torch._lazy_clone(x.detach().t()).stride() == torch._lazy_clone(host.detach().t()).stride()


def test_assert_same_moves_ipu_results_and_checks_their_device():
    expected = {"a": torch.arange(3.0), "b": [torch.ones(2)]}
    poptorch.testing.assert_same(expected, {"a": torch.arange(3.0, device="ipu"),
                                            "b": [torch.ones(2, device="ipu")]})
    with pytest.raises(AssertionError, match="expected an ipu tensor"):
        poptorch.testing.assert_same(torch.ones(2), torch.ones(2))
    with pytest.raises(AssertionError):
        poptorch.testing.assert_same(torch.ones(2), torch.zeros(2, device="ipu"))


PLUGIN_SUITE = textwrap.dedent('''
    import pytest
    import torch

    def test_any(device):
        assert torch.ones(1, device=device).device.type == device

    @pytest.mark.devices("ipu")
    def test_ipu_only(device):
        assert device == "ipu"

    KEPT = []  # keeps results alive: dead results are not computed

    def test_leaves_a_failing_graph(device):
        KEPT.append(torch.ones(3, device=device))
        KEPT[-1].index_add_(0, torch.tensor([7], device=device), torch.ones(1, device=device))
''')


@pytest.fixture
def suite(pytester, monkeypatch):
    """A users' suite that gets the plugin with -p (the subprocess imports this poptorch)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(PLUGIN_SUITE)
    return pytester


def test_the_plugin_runs_tests_on_the_cpu_and_the_ipu(suite):
    pytester = suite
    result = pytester.runpytest_subprocess("-p", "poptorch.testing.pytest_plugin", "-v")
    result.stdout.fnmatch_lines(["*test_any[[]cpu[]] PASSED*", "*test_any[[]ipu[]] PASSED*",
                                 "*test_ipu_only[[]ipu[]] PASSED*"])
    assert "test_ipu_only[cpu]" not in result.stdout.str()
    # The cpu raises at the call; the ipu when the graph runs, after the test body:
    # both are reported on this test.
    result.stdout.fnmatch_lines(["*test_leaves_a_failing_graph[[]cpu[]] FAILED*",
                                 "*test_leaves_a_failing_graph[[]ipu[]] ERROR*"])


def test_the_plugin_option_limits_the_devices(suite):
    pytester = suite
    result = pytester.runpytest_subprocess("-p", "poptorch.testing.pytest_plugin", "-v",
                                           "--poptorch-devices=cpu", "-k", "not failing")
    result.assert_outcomes(passed=1, skipped=1)
    bad = pytester.runpytest_subprocess("-p", "poptorch.testing.pytest_plugin",
                                        "--poptorch-devices=gpu")
    assert "unknown device(s) ['gpu']" in bad.stderr.str()


def _script(name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_pass_rate_script_reruns_an_ipu_test_as_its_cpu_twin():
    script = _script("pytorch_tests")
    assert (script.cpu_twin("test_x.py::TestFooIPU::test_bar_ipu_float32")
            == "test_x.py::TestFooCPU::test_bar_cpu_float32")
    assert script.cpu_twin("t.py::NumpyTestsIPU::test_ipu_like_ipu") == \
        "t.py::NumpyTestsCPU::test_ipu_like_cpu"


def test_the_pass_rate_script_counts_only_the_ipu_classes():
    # `-k ipu` also selects the CPU tests of ops whose name holds "ipu" (flipud).
    script = _script("pytorch_tests")
    assert script.is_ipu_test("test_ops.py::TestCommonIPU::test_out_flipud_ipu_float32")
    assert not script.is_ipu_test("test_ops.py::TestCommonCPU::test_out_flipud_cpu_float32")


def test_the_upstream_script_reads_test_ids_with_spaces(tmp_path):
    # Parametrised strings put spaces (and " - ", brackets) in pytest's test ids.
    spaced = "o.py::test_invalid[key:a-expected_str:(Unknown .* option .*|x - y)]"
    text = (f"{spaced} FAILED [ 50%]\n"
            "o.py::test_plain PASSED [100%]\n"
            "=== short test summary info ===\n"
            f"FAILED {spaced} - AttributeError: upstream-internal _validateOptions\n"
            "FAILED o.py::test_other[a b] - assert 1 == 2\n"
            "ERROR o.py::test_setup\n")
    assert _script("upstream_tests").failures(text) == [
        (spaced, "AttributeError: upstream-internal _validateOptions"),
        ("o.py::test_other[a b]", "assert 1 == 2"),
        ("o.py::test_setup", ""),
    ]
    log = tmp_path / "o.log"
    log.write_text(text)
    assert _script("pytorch_tests").outcomes(log) == {spaced: "FAILED",
                                                      "o.py::test_plain": "PASSED"}
