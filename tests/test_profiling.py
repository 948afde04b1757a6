"""Profiling (issue 12 item 7): the reports Options.enableProfiling,
POPLAR_ENGINE_OPTIONS and PVTI_OPTIONS write (a Chrome/Perfetto trace, the memory
of each IPU, an HTML page), Channel tracepoints, NameScope, and the executor's
performance counters, latencies, compilation time and cycle count."""
import json
import logging
import os
import textwrap

import pytest
import torch

import poptorch
from poptorch._profiling import recorder

from conftest import run_python


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.encoder(x))


def _load(directory, name):
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return json.load(f)


def _spans(trace, cat=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (cat is None or
                                                                    e.get("cat") == cat)]


@pytest.fixture(autouse=True)
def _no_report_left_open():
    yield
    assert not recorder.recording(), "a test left a profile report open"
    assert not poptorch._C.profiling_enabled()


def _profiled_inference(tmp_path, opts=None, iterations=3):
    torch.manual_seed(0)
    model = Mlp()
    opts = (opts or poptorch.Options()).deviceIterations(iterations)
    opts.enableProfiling(str(tmp_path)).modelName("mlp")
    wrapped = poptorch.inferenceModel(model, opts)
    x = torch.randn(iterations * 2, 4)
    out = wrapped(x)
    torch.testing.assert_close(out, model(x))  # profiling changes no result
    metrics = poptorch.metrics()
    wrapped.destroy()  # writes the report
    return tmp_path / "mlp", metrics


def test_enable_profiling_writes_a_trace_memory_summary_and_html(tmp_path):
    report, metrics = _profiled_inference(tmp_path)
    assert sorted(os.listdir(report)) == ["memory.json", "report.html", "summary.json",
                                          "trace.json"]
    trace = _load(report, "trace.json")
    summary = _load(report, "summary.json")["summary"]
    # Every program run of the model (one per micro-batch, on both lanes) and
    # every compilation is in the report, as the metrics count them.
    assert summary["program_runs"] == metrics["executions"] == 3
    assert summary["compilations"] == metrics["graphs_compiled"] >= 1
    assert summary["captures"] == 1
    ops = _spans(trace, "op")
    assert len(ops) == summary["nodes_run"] > 0
    assert {e["pid"] for e in ops} == {1}  # IPU 0's process in the trace
    assert any(e["name"].endswith("aten::addmm") for e in ops)
    programs = _spans(trace, "program")
    assert len(programs) == 3
    # Micro-batches that run at once (two lanes) are on threads of their own,
    # so that each thread's spans nest, as Perfetto wants.
    for thread in {(e["pid"], e["tid"]) for e in ops + programs}:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops + programs
                       if (e["pid"], e["tid"]) == thread)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    # Host I/O: each micro-batch's input copy and each output copy, on IPU 0.
    transfers = _spans(trace, "transfer")
    to_ipu = [e for e in transfers if e["name"].startswith("input")]
    assert len(to_ipu) == 3 and all(e["args"]["bytes"] == 2 * 4 * 4 for e in to_ipu)
    # Every copy to the device (the weights' too) counts, as the metrics count them.
    assert summary["to_ipu"][1] == metrics["bytes_to_ipu"]
    assert summary["from_ipu"][1] == metrics["bytes_from_ipu"]
    # Memory per IPU over the program: counters on IPU 0, peaks in memory.json.
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "memory"]
    ipus = poptorch._C.device_count()
    assert {e["pid"] for e in counters} == set(range(1, ipus + 1))  # every IPU's memory
    counters = [e for e in counters if e["pid"] == 1]
    memory = _load(report, "memory.json")
    assert memory["capacity"] == [poptorch._C.memory_capacity(i)
                                  for i in range(poptorch._C.device_count())]
    (program,) = memory["programs"].values()
    assert program["runs"] == 3 and len(program["nodes"]) == len(program["temporary_bytes"])
    peak = max(b[0] for b in program["temporary_bytes"])
    assert program["peak_temporary_bytes"][0] == peak > 0
    assert max(e["args"]["bytes"] for e in counters) == program["baseline_bytes"][0] + peak


def test_node_names_follow_modules_and_name_scopes(tmp_path):
    class Scoped(Mlp):
        def forward(self, x):
            with poptorch.NameScope("outer"):
                with poptorch.NameScope("inner"):
                    x = x * 2
            return super().forward(x)

    def names(opts, directory):
        opts.enableProfiling(str(directory)).modelName("m")
        wrapped = poptorch.inferenceModel(Scoped(), opts)
        wrapped(torch.ones(2, 4))
        wrapped.destroy()
        return {e["name"] for e in _spans(_load(directory / "m", "trace.json"), "op")}

    scoped = names(poptorch.Options(), tmp_path / "a")
    assert "outer/inner/aten::mul.Tensor" in scoped
    assert "head/aten::addmm" in scoped and any(n.startswith("encoder/0/") for n in scoped)
    plain = names(poptorch.Options().disableModuleNamescope(), tmp_path / "b")
    assert "outer/inner/aten::mul.Tensor" in plain and "aten::addmm" in plain


def test_name_scope_checks_its_name_and_leaves_results_unchanged():
    with pytest.raises(poptorch.Error, match="must be a string"):
        poptorch.NameScope(3)
    x = torch.arange(4.)
    with poptorch.NameScope("s"):
        y = (x.to("ipu") * 3).cpu()
    assert y.tolist() == (x * 3).tolist()


def test_a_failing_forward_leaves_no_module_scope_open(tmp_path):
    class Failing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.inner(x, "unexpected")

    with pytest.raises(TypeError):
        poptorch.inferenceModel(Failing())(torch.ones(1, 2))
    opts = poptorch.Options().enableProfiling(str(tmp_path)).modelName("after")
    wrapped = poptorch.inferenceModel(Mlp(), opts)
    wrapped(torch.ones(2, 4))
    wrapped.destroy()
    names = {e["name"] for e in _spans(_load(tmp_path / "after", "trace.json"), "op")}
    assert "head/aten::addmm" in names and not any(n.startswith("inner/") for n in names)


def test_channel_tracepoints_are_spans_while_recording(tmp_path):
    channel = poptorch.profiling.Channel("MyApp")
    with channel.tracepoint("ignored"):  # nothing records: a no-op
        pass

    class Worker:
        def work(self):
            return 7

    worker = channel.instrument(Worker(), "work")
    report = recorder.open_report(recorder.Report(str(tmp_path), "t", None,
                                                  poptorch._profiling.write_profile))
    with channel.tracepoint("TimeThis"):
        torch.ones(3, device="ipu").sum().item()
    assert worker.work() == 7
    recorder.close_report(report)
    user = _spans(_load(tmp_path, "trace.json"), "user")
    assert [e["name"] for e in user] == ["MyApp.TimeThis", "MyApp.work"]
    assert _load(tmp_path, "summary.json")["summary"]["tracepoints"] == {"MyApp": 2}
    with pytest.raises(poptorch.Error, match="needs a name"):
        poptorch.profiling.Channel("")
    with pytest.raises(poptorch.Error, match="has no method 'missing'"):
        channel.instrument(Worker(), "missing")


def test_perf_counters_and_latencies_follow_poptorch():
    model = Mlp()
    opts = poptorch.Options().deviceIterations(4)
    wrapped = poptorch.inferenceModel(model, opts)
    assert wrapped.getPerfCounters() == {"input": [[]], "input_complete": [[]],
                                         "output": [[]], "output_complete": [[]]}
    with pytest.raises(poptorch.Error, match="not compiled yet"):
        wrapped.compilationTime()
    wrapped(torch.randn(8, 4))
    counters = wrapped.getPerfCounters()
    assert [len(counters[k]) for k in ("input", "input_complete", "output",
                                       "output_complete")] == [1, 1, 1, 1]
    assert all(len(counters[k][0]) == 4 for k in counters)  # one per micro-batch
    for k in range(4):
        assert (counters["input"][0][k] <= counters["input_complete"][0][k]
                <= counters["output"][0][k] <= counters["output_complete"][0][k])
    for latency in (wrapped.getLatency(), wrapped.getHostIpuLatency(),
                    wrapped.getComputeLatency(), wrapped.getIpuHostLatency()):
        low, high, mean = latency
        assert 0 <= low <= mean <= high
    round_trips = [counters["output_complete"][0][k] - counters["input"][0][k] for k in range(4)]
    assert wrapped.getLatency() == pytest.approx(
        (min(round_trips), max(round_trips), sum(round_trips) / 4))
    assert 0 < wrapped.compilationTime() < 300


def test_latency_groups_micro_batches_by_returned_output():
    opts = poptorch.Options().deviceIterations(4).outputMode(poptorch.OutputMode.Final)
    wrapped = poptorch.inferenceModel(Mlp(), opts)
    wrapped(torch.randn(8, 4))
    counters = wrapped.getPerfCounters()
    assert len(counters["input"][0]) == 4 and len(counters["output"][0]) == 1
    (end,) = counters["output_complete"][0]
    low, high, _ = wrapped.getLatency()
    assert low == high == pytest.approx(end - min(counters["input"][0]))


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_cycle_count_needs_log_cycle_count_and_a_run():
    wrapped = poptorch.inferenceModel(Mlp())
    wrapped(torch.ones(2, 4))
    with pytest.raises(poptorch.Error, match="logCycleCount to True"):
        wrapped.cycleCount()
    opts = poptorch.Options().logCycleCount(True).replicationFactor(2)
    counted = poptorch.inferenceModel(Mlp(), opts)
    with pytest.raises(poptorch.Error, match="at least once"):
        counted.cycleCount()
    records = _Records()
    poptorch.logger.addHandler(records)
    try:
        counted(torch.ones(4, 4))
    finally:
        poptorch.logger.removeHandler(records)
    cycles = counted.cycleCount()
    assert isinstance(cycles, int) and cycles > 0
    assert records.messages == [f"Total number of IPU cycles: {cycles} (modelled)"]


SCRIPT = """
import json, torch, poptorch
channel = poptorch.profiling.Channel("app")
with channel.tracepoint("lazy"):
    a = torch.ones(64, device="ipu:0") * 2
    b = torch.ones(32, device="ipu:1") + 1
    total = a.sum().item() + b.sum().item()
with channel.tracepoint("wrapped"):
    out = poptorch.inferenceModel(torch.nn.Linear(3, 1))(torch.ones(2, 3))
print(json.dumps(poptorch.metrics()))
"""


def test_poplar_engine_options_report_the_whole_process(tmp_path):
    options = {"autoReport.all": "true", "autoReport.directory": str(tmp_path)}
    result = run_python(SCRIPT, {"POPLAR_ENGINE_OPTIONS": json.dumps(options)})
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    report = tmp_path  # written in the directory, as Poplar's autoReport
    assert sorted(os.listdir(report)) == ["memory.json", "report.html", "summary.json",
                                          "trace.json"]
    summary = _load(report, "summary.json")
    assert summary["title"].startswith("process ")
    s = summary["summary"]
    # The process report counts what the metrics count, lazy mode included.
    assert s["compilations"] == metrics["graphs_compiled"] >= 2
    assert s["program_runs"] == metrics["executions"]
    assert summary["metrics"]["executions"] == metrics["executions"]
    ops = _spans(_load(report, "trace.json"), "op")
    assert {e["pid"] for e in ops} >= {1, 2}  # nodes on IPU 0 and IPU 1
    assert s["tracepoints"] == {"app": 2}


def test_pvti_options_write_a_system_trace_without_nodes(tmp_path):
    result = run_python(SCRIPT, {"PVTI_OPTIONS": json.dumps({"enable": "true",
                                                             "directory": str(tmp_path)})})
    assert result.returncode == 0, result.stderr
    (name,) = os.listdir(tmp_path)
    assert name.startswith("poptorch_") and name.endswith(".pvti.json")
    trace = _load(tmp_path, name)
    assert [e["name"] for e in _spans(trace, "user")] == ["app.lazy", "app.wrapped"]
    assert _spans(trace, "program") and not _spans(trace, "op")


@pytest.mark.parametrize("variable, value, message", [
    ("POPLAR_ENGINE_OPTIONS", "{autoReport", "must be a JSON object"),
    ("PVTI_OPTIONS", "[1]", "must be a JSON object"),
])
def test_malformed_environment_is_a_clear_error(variable, value, message):
    result = run_python("import poptorch", {variable: value})
    assert result.returncode != 0
    assert variable in result.stderr and message in result.stderr


def test_profiling_off_records_nothing():
    wrapped = poptorch.inferenceModel(Mlp())
    wrapped(torch.ones(2, 4))
    assert not poptorch._C.profiling_enabled()
    assert poptorch._C.profiling_take() == []


# --- the HTML page in a real browser (headless Chromium, from Debian's packages:
# scripts/setup.sh installs it) -----------------------------------------------

_PROBE = """<script>
const cells = id => Object.fromEntries([...document.querySelectorAll(`#${id} tr`)].map(
    row => [row.querySelector("th").innerText, row.querySelector("td").innerText]));
const drawn = svg => [...svg.querySelectorAll("rect, polyline")].filter(shape => {
    const box = shape.getBoundingClientRect(); return box.width > 0 && box.height >= 0; });
const probe = {
  title: document.title,
  summary: cells("summary-table"),
  metrics: document.getElementById("metrics-table") ? cells("metrics-table") : null,
  svgs: [...document.querySelectorAll("svg")].map(svg => ({
    cls: svg.getAttribute("class"), width: svg.getBoundingClientRect().width,
    height: svg.getBoundingClientRect().height, shapes: drawn(svg).length})),
  ops: [...document.querySelectorAll("#ops-table tr")].slice(1).map(
      row => [...row.querySelectorAll("td")].map(td => td.innerText)),
  data: JSON.parse(document.getElementById("profile-data").textContent),
};
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify(probe);
document.body.appendChild(out);
</script>"""


def _chromium():
    import shutil
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)


def _open_in_browser(page, tmp_path):
    """Loads ``page`` in headless Chromium with a probe script; returns what the
    probe read from the rendered page and a screenshot (RGB array)."""
    import html
    import re
    import subprocess
    import matplotlib.image
    browser = _chromium()
    if browser is None:
        message = "no Chromium: scripts/setup.sh installs Debian's chromium package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                      encoding="utf-8")
    # The virtual time budget makes Chromium run the page's scripts and paint
    # before it dumps or shoots: on a loaded machine the screenshot was taken
    # of a page not yet drawn (all white).
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--virtual-time-budget=30000", f"--user-data-dir={tmp_path / 'chromium'}"]
    dom = subprocess.run(flags + ["--dump-dom", probed.as_uri()], capture_output=True,
                         text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert match, f"the probe did not run: {dom.stderr[-2000:]}"
    shot = tmp_path / "page.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1100,1600", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists(), "Chromium wrote no screenshot"
    return json.loads(html.unescape(match.group(1))), matplotlib.image.imread(str(shot))[..., :3]


def _has_colour(image, hex_colour, at_least=20):
    import numpy as np
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return int((np.abs(image - rgb).max(axis=-1) < 0.02).sum()) >= at_least


def test_the_html_page_renders_in_a_browser_with_the_metrics_numbers(tmp_path):
    options = {"autoReport.all": "true", "autoReport.directory": str(tmp_path / "out")}
    result = run_python(SCRIPT, {"POPLAR_ENGINE_OPTIONS": json.dumps(options)})
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    report = tmp_path / "out"
    title = _load(report, "summary.json")["title"]
    summary = _load(report, "summary.json")["summary"]
    memory = _load(report, "memory.json")
    page, image = _open_in_browser(report / "report.html", tmp_path)

    assert page["title"] == f"PopTorch profile: {title}"
    shown = page["summary"]
    assert shown["compilations"] == str(metrics["graphs_compiled"])
    assert shown["program runs"] == str(metrics["executions"])
    assert shown["nodes run"] == str(summary["nodes_run"])
    assert shown["host to IPU"].startswith(f"{summary['to_ipu'][0]} copies")
    assert shown["tracepoints of channel app"] == "2"
    for ipu in (0, 1):  # each IPU's peak: the largest baseline + temporaries of its programs
        peak = max(p["baseline_bytes"][ipu] + p["peak_temporary_bytes"][ipu]
                   for p in memory["programs"].values() if ipu < len(p["peak_temporary_bytes"]))
        assert shown[f"IPU {ipu} peak memory"].startswith(f"{peak} B of ")
    # The metrics table is poptorch.metrics() at exit, the numbers the script printed.
    for key in ("graphs_compiled", "executions", "bytes_to_ipu", "bytes_from_ipu"):
        assert page["metrics"][key] == str(metrics[key])
    assert page["data"]["summary"]["program_runs"] == metrics["executions"]
    # Plots: the timeline, the longest run node by node, its memory, each
    # program's memory, the time by op; each laid out with something drawn.
    drawn = {svg["cls"]: svg for svg in page["svgs"]}
    assert set(drawn) == {"timeline", "run-timeline", "run-memory", "memory", "ops"}
    for svg in page["svgs"]:
        assert svg["width"] == 1000 and svg["height"] > 0 and svg["shapes"] > 0, svg
    assert [row[0] for row in page["ops"]] == [op[0] for op in summary["ops"][:25]]
    # Pixels: program runs (green) and IPU 0's memory line (blue) are on screen.
    assert _has_colour(image, "#2ca02c") and _has_colour(image, "#1f77b4")
