"""The report's HTML page: one self-contained file (inline SVG plots, no
scripts or external resources) that a browser opens as it is.

Sections: the summary (counts, times, bytes), the session's timeline (host,
program runs, each IPU's transfers), the longest program run node by node on
each IPU with each IPU's memory under it, each program's memory per IPU node
by node, and the time by op. The summary numbers are also embedded as JSON
(``<script type="application/json" id="profile-data">``) for tools.
"""
from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .analysis import ProgramMemory, Summary, _runs_of_nodes
from .recorder import CAPTURE, Event

WIDTH = 1000
LABEL_WIDTH = 150
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
_TRACK_COLORS = {"compile": "#d62728", CAPTURE: "#9467bd", "program": "#2ca02c",
                 "to_ipu": "#1f77b4", "from_ipu": "#ff7f0e", "user": "#8c564b"}

Span = Tuple[int, int, str, str]  # start ns, end ns, tooltip, colour


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.1f} µs"


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def _axis(x0: float, x1: float, t0: int, t1: int, y: float, unit_ns: float, unit: str) -> str:
    parts = [f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#444"/>']
    for i in range(6):
        x = x0 + (x1 - x0) * i / 5
        value = (t1 - t0) * i / 5 / unit_ns
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#444"/>'
                     f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">'
                     f'{value:.3g}{unit}</text>')
    return "".join(parts)


def timeline_svg(tracks: Sequence[Tuple[str, List[Span]]], t0: int, t1: int,
                 css_class: str) -> str:
    """One row per track, a rectangle per span; spans closer than a pixel
    merge (their tooltip says how many)."""
    row = 22
    height = row * len(tracks) + 30
    span_ns = max(t1 - t0, 1)
    scale = (WIDTH - LABEL_WIDTH - 10) / span_ns
    parts = [f'<svg class="{css_class}" width="{WIDTH}" height="{height}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for index, (name, spans) in enumerate(tracks):
        y = index * row
        parts.append(f'<text x="4" y="{y + 15}">{_e(name)}</text>'
                     f'<line x1="{LABEL_WIDTH}" y1="{y + row}" x2="{WIDTH - 10}" y2="{y + row}" '
                     'stroke="#eee"/>')
        merged: List[List[Any]] = []  # x0, x1, first tooltip, count, colour
        for start, end, tip, colour in sorted(spans):
            x0 = LABEL_WIDTH + (start - t0) * scale
            x1 = max(LABEL_WIDTH + (end - t0) * scale, x0 + 1)
            if merged and x0 <= merged[-1][1] + 0.5 and merged[-1][4] == colour:
                merged[-1][1] = max(merged[-1][1], x1)
                merged[-1][3] += 1
                continue
            merged.append([x0, x1, tip, 1, colour])
        for x0, x1, tip, count, colour in merged:
            label = tip if count == 1 else f"{tip} (and {count - 1} more)"
            parts.append(f'<rect x="{x0:.2f}" y="{y + 3}" width="{x1 - x0:.2f}" '
                         f'height="{row - 6}" fill="{colour}"><title>{_e(label)}</title></rect>')
    unit_ns, unit = (1e6, " ms") if span_ns >= 1e6 else (1e3, " µs")
    parts.append(_axis(LABEL_WIDTH, WIDTH - 10, t0, t1, row * len(tracks) + 4, unit_ns, unit))
    parts.append("</svg>")
    return "".join(parts)


def line_chart_svg(series: Sequence[Tuple[str, List[Tuple[float, float]], str]], x_label: str,
                   limits: Sequence[Tuple[float, str]], css_class: str) -> str:
    """Lines (steps) of bytes against ``x_label``, with dashed limits."""
    height, left, bottom, top = 260, 90, 40, 20
    points = [p for _, values, _ in series for p in values]
    if not points:
        return ""
    x_max = max(x for x, _ in points) or 1.0
    # Scaled to the data: a limit far above it (an IPU's capacity) would flatten
    # the lines, so only limits within the range are drawn.
    y_max = max([y for _, y in points] + [1.0]) * 1.05
    plot_w, plot_h = WIDTH - left - 20, height - top - bottom

    def sx(x: float) -> float:
        return left + x / x_max * plot_w

    def sy(y: float) -> float:
        return top + plot_h - y / y_max * plot_h
    parts = [f'<svg class="{css_class}" width="{WIDTH}" height="{height}" '
             f'xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
             'stroke="#444"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
             f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
             f'{_e(x_label)}</text>']
    for i in range(5):
        y = y_max * i / 4
        parts.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">'
                     f'{_e(_bytes(y))}</text>')
    for value, label in limits:
        if value <= y_max:
            parts.append(f'<line x1="{left}" y1="{sy(value):.1f}" x2="{left + plot_w}" '
                         f'y2="{sy(value):.1f}" stroke="#999" stroke-dasharray="6 4"/>'
                         f'<text x="{left + plot_w}" y="{sy(value) - 4:.1f}" text-anchor="end">'
                         f'{_e(label)}</text>')
    for index, (name, values, colour) in enumerate(series):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
        parts.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'points="{path}"><title>{_e(name)}</title></polyline>'
                     f'<text x="{left + 8}" y="{top + 14 + 14 * index}" fill="{colour}">'
                     f'{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart_svg(items: Sequence[Tuple[str, float]], css_class: str) -> str:
    row, left = 18, 300
    height = row * len(items) + 10
    top_value = max((v for _, v in items), default=0.0) or 1.0
    parts = [f'<svg class="{css_class}" width="{WIDTH}" height="{height}" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for index, (name, value) in enumerate(items):
        y = index * row + 4
        w = (WIDTH - left - 120) * value / top_value
        parts.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end">{_e(name[-45:])}</text>'
                     f'<rect x="{left}" y="{y}" width="{max(w, 1):.1f}" height="{row - 4}" '
                     f'fill="{COLORS[0]}"><title>{_e(name)}: {_seconds(value)}</title></rect>'
                     f'<text x="{left + w + 6:.1f}" y="{y + 12}">{_seconds(value)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: Sequence[Tuple[str, str]], css_id: str) -> str:
    body = "".join(f'<tr><th>{_e(k)}</th><td data-key="{_e(k)}">{_e(v)}</td></tr>'
                   for k, v in rows)
    return f'<table id="{css_id}">{body}</table>'


def _overview(events: List[Event], num_ipus: int) -> Tuple[str, int, int]:
    tracks: List[Tuple[str, List[Span]]] = []
    for kind, name in (("compile", "compilation"), (CAPTURE, "capture"),
                       ("program", "program runs")):
        spans = [(e.start, e.end, f"{e.name}: {_seconds((e.end - e.start) / 1e9)}",
                  _TRACK_COLORS[kind]) for e in events if e.kind == kind]
        tracks.append((name, spans))
    for ipu in range(num_ipus):
        spans = [(e.start, e.end, f"{e.name} ({_bytes(e.bytes)}): "
                  f"{_seconds((e.end - e.start) / 1e9)}", _TRACK_COLORS[e.kind])
                 for e in events if e.kind in ("to_ipu", "from_ipu") and e.ipu == ipu]
        tracks.append((f"IPU {ipu} host I/O", spans))
    channels: Dict[str, List[Span]] = {}
    for e in events:
        if e.kind == "user":
            channels.setdefault(e.name.split(".", 1)[0], []).append(
                (e.start, e.end, f"{e.name}: {_seconds((e.end - e.start) / 1e9)}",
                 _TRACK_COLORS["user"]))
    tracks += [(f"channel {name}", spans) for name, spans in channels.items()]
    t0 = min((e.start for e in events), default=0)
    t1 = max((e.end for e in events), default=1)
    return timeline_svg(tracks, t0, t1, "timeline"), t0, t1


def _longest_run(events: List[Event], memory: Dict[int, ProgramMemory],
                 num_ipus: int) -> str:
    runs = [e for e in events if e.kind == "program"]
    if not runs:
        return "<p>No program ran.</p>"
    run = max(runs, key=lambda e: e.end - e.start)
    run_of = _runs_of_nodes(events)
    nodes = [e for i, e in enumerate(events) if e.kind == "node" and run_of.get(i) is run]
    colour_of: Dict[str, str] = {}
    tracks: List[Tuple[str, List[Span]]] = []
    for ipu in range(num_ipus):
        spans = []
        for e in nodes:
            if e.ipu != ipu:
                continue
            op = e.name.rsplit("/", 1)[-1]
            colour = colour_of.setdefault(op, COLORS[len(colour_of) % len(COLORS)])
            spans.append((e.start, e.end, f"#{e.node} {e.name}: "
                          f"{_seconds((e.end - e.start) / 1e9)}", colour))
        tracks.append((f"IPU {ipu}", spans))
    out = [f"<p>Program <code>{run.program:016x}</code>, {len(nodes)} nodes, "
           f"{_seconds((run.end - run.start) / 1e9)}.</p>",
           timeline_svg(tracks, run.start, run.end, "run-timeline")]
    info = memory.get(run.program)
    if info is not None:
        series = []
        for ipu in range(num_ipus):
            values = [(0.0, float(run.ipu_bytes[ipu] if ipu < len(run.ipu_bytes) else 0))]
            for e in nodes:
                values.append(((e.start - run.start) / 1e6,
                               float(info.bytes_at(e.node, ipu, run.ipu_bytes))))
            values.append(((run.end - run.start) / 1e6, values[0][1]))
            series.append((f"IPU {ipu}", values, COLORS[ipu % len(COLORS)]))
        out.append(line_chart_svg(series, "time in the run (ms)", [], "run-memory"))
    return "".join(out)


def _program_memory(memory: Dict[int, ProgramMemory], capacity: List[int]) -> str:
    if not memory:
        return "<p>No program ran.</p>"
    out = []
    biggest = sorted(memory.values(), key=lambda m: -max(m.peak_temporary_bytes or [0]))[:6]
    for info in biggest:
        used = [ipu for ipu in range(len(info.baseline))
                if info.baseline[ipu] or any(ipu < len(t) and t[ipu] for t in info.temporary_bytes)]
        # A step per node: node n runs over [n, n + 1).
        series = [(f"IPU {ipu}", [(float(n + step), float(info.bytes_at(n, ipu, info.baseline)))
                                  for n in range(len(info.node_names)) for step in (0, 1)],
                   COLORS[ipu % len(COLORS)])
                  for ipu in used]
        limits = [(float(capacity[ipu]), f"IPU {ipu} capacity") for ipu in used
                  if ipu < len(capacity)]
        peaks = ", ".join(f"IPU {ipu}: {_bytes(info.baseline[ipu] + info.peak_temporary_bytes[ipu])}"
                          f" of {_bytes(capacity[ipu])}"
                          for ipu in used if ipu < len(info.peak_temporary_bytes)
                          and ipu < len(capacity))
        out.append(f'<h3>Program <code>{info.key:016x}</code>: {len(info.node_names)} nodes, '
                   f'{info.runs} runs, peak {peaks}</h3>')
        out.append(line_chart_svg(series, "node", limits, "memory"))
    return "".join(out)


def render(title: str, summary: Summary, events: List[Event], memory: Dict[int, ProgramMemory],
           capacity: List[int], metrics: Optional[Dict[str, Any]]) -> str:
    num_ipus = len(capacity)
    overview, t0, t1 = _overview(events, num_ipus)
    rows = [("compilations", str(summary.compilations)),
            ("compilation time", _seconds(summary.compile_seconds)),
            ("program runs", str(summary.program_runs)),
            ("run time", _seconds(summary.run_seconds)),
            ("nodes run", str(summary.nodes_run)),
            ("node time", _seconds(summary.node_seconds)),
            ("host to IPU", f"{summary.to_ipu[0]} copies, {_bytes(summary.to_ipu[1])}, "
                            f"{_seconds(summary.to_ipu[2])}"),
            ("IPU to host", f"{summary.from_ipu[0]} copies, {_bytes(summary.from_ipu[1])}, "
                            f"{_seconds(summary.from_ipu[2])}"),
            ("captures", f"{summary.captures}, {_seconds(summary.capture_seconds)}")]
    rows += [(f"IPU {ipu} peak memory", f"{_bytes(peak)} of {_bytes(capacity[ipu])}")
             for ipu, peak in sorted(summary.peak_bytes.items()) if ipu < len(capacity)]
    rows += [(f"tracepoints of channel {c}", str(n)) for c, n in summary.tracepoints.items()]
    if summary.dropped:
        rows.append(("events dropped (too many)", str(summary.dropped)))
    ops = summary.ops[:25]
    op_rows = "".join(f"<tr><td>{_e(name)}</td><td>{count}</td><td>{_seconds(seconds)}</td></tr>"
                      for name, count, seconds in ops)
    metrics_html = ""
    if metrics is not None:
        metrics_html = ("<section id=\"metrics\"><h2>poptorch.metrics()</h2>" + _table(
            [(k, str(v)) for k, v in metrics.items()], "metrics-table") + "</section>")
    data = {"title": title, "summary": summary.as_dict(), "metrics": metrics,
            "span_seconds": (t1 - t0) / 1e9}
    # "</" would end the script element early.
    embedded = json.dumps(data).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>PopTorch profile: {_e(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 20px; color: #222; }}
svg text {{ font-size: 11px; font-family: sans-serif; }}
table {{ border-collapse: collapse; margin: 8px 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
section {{ margin-bottom: 28px; }}
</style></head>
<body>
<h1>PopTorch profile: {_e(title)}</h1>
<p>{num_ipus} emulated IPUs. Times are the host's (the IPU Model runs every node on the CPU);
memory is the modelled memory of each IPU. The trace is in <code>trace.json</code> (open it in
<a href="https://ui.perfetto.dev">Perfetto</a> or chrome://tracing).</p>
<section id="summary"><h2>Summary</h2>{_table(rows, "summary-table")}</section>
<section id="timeline"><h2>Timeline</h2>{overview}</section>
<section id="run"><h2>The longest program run, node by node, and memory per IPU</h2>
{_longest_run(events, memory, num_ipus)}</section>
<section id="memory"><h2>Memory per IPU over each program</h2>
{_program_memory(memory, capacity)}</section>
<section id="ops"><h2>Time by op</h2>{bar_chart_svg([(n, s) for n, _, s in ops], "ops")}
<table id="ops-table"><tr><th>op</th><th>nodes run</th><th>time</th></tr>{op_rows}</table>
</section>
{metrics_html}
<script type="application/json" id="profile-data">{embedded}</script>
</body></html>
"""

