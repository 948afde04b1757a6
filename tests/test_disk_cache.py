"""The executable cache on disk (POPTORCH_CACHE_DIR, Options.enableExecutableCaching):
a second process compiles nothing it has seen, in lazy mode and for wrapped
models; processes may write one directory at once; a damaged entry is logged
and compiled again, never a crash or a wrong result."""
import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import poptorch
from conftest import ROOT, run_python

# Checks its values against the CPU and prints its metrics.
LAZY = textwrap.dedent("""
    import json
    import torch, poptorch
    torch.manual_seed(0)
    x, w = torch.randn(8, 5), torch.randn(5, 3)
    out = torch.nn.functional.gelu(x.to("ipu") @ w.to("ipu")).sum(0).cpu()
    torch.testing.assert_close(out, torch.nn.functional.gelu(x @ w).sum(0))
    scaled = (x.to("ipu") * 3).softmax(1).cpu()
    torch.testing.assert_close(scaled, (x * 3).softmax(1))
    print(json.dumps(poptorch.metrics()))
""")

# A trainingModel with its cache in the directory given as argv[1] (or none).
WRAPPED = textwrap.dedent("""
    import json, sys
    import torch, poptorch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    reference = __import__("copy").deepcopy(model)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
        def forward(self, x, y):
            out = self.model(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    opts = poptorch.Options().showCompilationProgressBar(False)
    opts.enableExecutableCaching(sys.argv[1] if len(sys.argv) > 1 else None)
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(WithLoss(), opts,
                                      torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        _, loss = training(x, y)
        optimizer.zero_grad()
        losses = [torch.nn.functional.cross_entropy(reference(x[i:i + 4]), y[i:i + 4])
                  for i in (0, 4)]
        (sum(losses) / 2).backward()
        optimizer.step()
        torch.testing.assert_close(loss, losses[-1].detach(), rtol=1e-5, atol=1e-6)
    training.copyWeightsToHost()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    print(json.dumps(poptorch.metrics()))
""")


def run(code, cache_dir=None, args=()):
    env = {"POPTORCH_CACHE_DIR": str(cache_dir) if cache_dir else ""}
    result = run_python(code if not args else
                        f"import sys; sys.argv[1:] = {list(map(str, args))!r}\n" + code, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


def entries(directory):
    return sorted(p for p in directory.iterdir() if p.suffix == ".poptorch_exe")


def test_a_second_process_compiles_nothing_in_lazy_mode(tmp_path):
    first, _ = run(LAZY, tmp_path)
    assert first["graphs_compiled"] == 2 and first["executables_loaded"] == 0
    assert len(entries(tmp_path)) == 2
    second, _ = run(LAZY, tmp_path)
    assert second["graphs_compiled"] == 0 and second["executables_loaded"] == 2


def test_a_second_process_compiles_nothing_for_a_wrapped_model(tmp_path):
    first, _ = run(WRAPPED, args=[tmp_path])
    assert first["graphs_compiled"] > 0
    second, _ = run(WRAPPED, args=[tmp_path])
    assert second["graphs_compiled"] == 0
    assert second["executables_loaded"] == first["graphs_compiled"]


def test_a_model_without_caching_writes_nothing_whatever_the_environment(tmp_path):
    # POPTORCH_CACHE_DIR is the default of Options, and the model turns it off.
    run(WRAPPED, tmp_path)
    assert entries(tmp_path) == []


@pytest.mark.slow
def test_processes_may_write_one_directory_at_once(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "POPTORCH_CACHE_DIR": ""}
    processes = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.argv[1:] = "
                                   f"[{str(tmp_path)!r}]\n" + WRAPPED],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**__import__("os").environ, **env})
                 for _ in range(4)]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        assert "unusable" not in stderr
    # Whole entries only, and no temporary files left behind.
    assert all(p.suffix == ".poptorch_exe" for p in tmp_path.iterdir())
    later, _ = run(WRAPPED, args=[tmp_path])
    assert later["graphs_compiled"] == 0


@pytest.mark.slow
def test_a_damaged_entry_is_logged_and_compiled_again(tmp_path):
    first, _ = run(LAZY, tmp_path)
    truncated, flipped = entries(tmp_path)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 3] ^= 0x04
    flipped.write_bytes(bytes(data))
    second, stderr = run(LAZY, tmp_path)  # the values are checked against the CPU
    assert stderr.count("is unusable") == 2, stderr
    assert second["graphs_compiled"] == 2
    # The damaged entries were written again.
    third, _ = run(LAZY, tmp_path)
    assert third["graphs_compiled"] == 0
    for entry in entries(tmp_path):
        entry.write_bytes(torch.randint(0, 256, (2000,), dtype=torch.uint8).numpy().tobytes())
    fourth, stderr = run(LAZY, tmp_path)
    assert fourth["graphs_compiled"] == 2 and stderr.count("is unusable") == 2


def test_a_directory_that_cannot_be_written_is_logged_once(tmp_path):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory")
    metrics, stderr = run(LAZY, blocked)
    assert metrics["graphs_compiled"] == 2
    assert stderr.count("cannot write to") == 1, stderr


# An inference model caching in the directory argv[1], checked against the CPU.
CACHED_INFERENCE = textwrap.dedent("""
    import json, sys
    import torch, poptorch
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU())
    x = torch.randn(3, 5)
    opts = poptorch.Options().enableExecutableCaching(sys.argv[1])
    torch.testing.assert_close(poptorch.inferenceModel(model, opts)(x), model(x))
    print(json.dumps(poptorch.metrics()))
""")


def test_a_directory_gets_the_executables_the_process_compiled_without_one(tmp_path):
    # Found in memory, compiled for a model that caches nowhere (another test
    # file's, when the suite runs), they were not written: the directory stayed
    # empty and a later process compiled them again.
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU())
    x = torch.randn(3, 5)
    uncached = poptorch.Options().enableExecutableCaching(None)
    poptorch.inferenceModel(copy.deepcopy(model), uncached)(x)
    compiled = poptorch.metrics()["graphs_compiled"]
    opts = poptorch.Options().enableExecutableCaching(tmp_path)
    torch.testing.assert_close(poptorch.inferenceModel(model, opts)(x), model(x))
    assert poptorch.metrics()["graphs_compiled"] == compiled  # from memory
    assert entries(tmp_path)
    later, _ = run(CACHED_INFERENCE, args=[tmp_path])
    assert later["graphs_compiled"] == 0 and later["executables_loaded"] > 0


def test_options_put_a_wrapped_model_s_executables_in_their_directory(tmp_path):
    opts = poptorch.Options().showCompilationProgressBar(False).enableExecutableCaching(tmp_path)
    model = poptorch.inferenceModel(torch.nn.Linear(3, 2), opts)
    x = torch.randn(4, 3)
    torch.testing.assert_close(model(x), model.model(x))
    assert len(entries(tmp_path)) >= 1
