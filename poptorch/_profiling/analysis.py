"""From recorded events to what a report shows: the Chrome/Perfetto trace, the
memory of each IPU over each program, and the summary (counts, times, bytes,
time by op)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from .recorder import CAPTURE, Event

HOST_PID = 0


def ipu_pid(ipu: int) -> int:
    return 1 + max(ipu, 0)


@dataclass
class ProgramMemory:
    """How one executable uses each IPU's memory, node by node."""
    key: int
    node_names: List[str]
    temporary_bytes: List[List[int]]  # [node][ipu]
    peak_temporary_bytes: List[int]
    baseline: List[int] = field(default_factory=list)  # allocated at its first run, per ipu
    runs: int = 0

    def bytes_at(self, node: int, ipu: int, baseline: List[int]) -> int:
        temporaries = self.temporary_bytes[node] if node < len(self.temporary_bytes) else []
        return (baseline[ipu] if ipu < len(baseline) else 0) + (
            temporaries[ipu] if ipu < len(temporaries) else 0)


def _runs_of_nodes(events: List[Event]) -> Dict[int, Event]:
    """For each node event (by index in ``events``), the program run it belongs
    to: nodes are recorded before their run's program event, on its thread
    (its session and track)."""
    pending: Dict[Tuple[int, int, int], List[int]] = defaultdict(list)
    run_of: Dict[int, Event] = {}
    for index, event in enumerate(events):
        if event.kind == "node":
            pending[(event.program, event.session, event.track)].append(index)
        elif event.kind == "program":
            for i in pending.pop((event.program, event.session, event.track), []):
                if events[i].start >= event.start:
                    run_of[i] = event
    return run_of


def program_memory(events: List[Event],
                   programs: Dict[int, Tuple[List[str], List[List[int]], List[int]]]
                   ) -> Dict[int, ProgramMemory]:
    memory: Dict[int, ProgramMemory] = {}
    for event in events:
        if event.kind != "program" or event.program not in programs:
            continue
        info = memory.get(event.program)
        if info is None:
            names, temporaries, peak = programs[event.program]
            info = memory[event.program] = ProgramMemory(event.program, list(names),
                                                         [list(t) for t in temporaries],
                                                         list(peak), list(event.ipu_bytes))
        info.runs += 1
    return memory


class _Threads:
    """The trace's threads: one per (process, name) and as many more as spans
    that overlap need ("compute (2)": micro-batches a call runs at once), since
    a thread's spans must nest."""

    def __init__(self, trace: List[Dict[str, Any]]) -> None:
        self._trace = trace
        self._tids: Dict[Tuple[int, str], int] = {}
        self._ends: Dict[Tuple[int, str], List[float]] = defaultdict(list)

    def tid(self, pid: int, name: str) -> int:
        if (pid, name) not in self._tids:
            self._tids[(pid, name)] = tid = len(self._tids)
            self._trace.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                                "args": {"name": name}})
            self._trace.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                                "args": {"sort_index": tid}})
        return self._tids[(pid, name)]

    def free(self, pid: int, name: str, start: float, end: float) -> int:
        """The first thread of ``name`` whose spans ended by ``start`` (spans
        come in order of start)."""
        ends = self._ends[(pid, name)]
        lane = next((i for i, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        ends[lane] = end
        return self.tid(pid, name if lane == 0 else f"{name} ({lane + 1})")


_HOST_THREADS = {"compile": "compilation", CAPTURE: "capture", "program": "program runs"}


def chrome_trace(events: List[Event], memory: Dict[int, ProgramMemory],
                 num_ipus: int, nodes: bool = True) -> Dict[str, Any]:
    """The Chrome trace-event JSON (Perfetto and chrome://tracing read it):
    the host's compilations, captures and program runs, each IPU's nodes,
    host transfers and memory, and the user's tracepoints. Without ``nodes``,
    no per-node detail (a system trace)."""
    t0 = min((e.start for e in events), default=0)

    def us(ns: int) -> float:
        return (ns - t0) / 1000.0

    trace: List[Dict[str, Any]] = [
        {"ph": "M", "pid": HOST_PID, "name": "process_name", "args": {"name": "Host"}},
        {"ph": "M", "pid": HOST_PID, "name": "process_sort_index", "args": {"sort_index": 0}}]
    for ipu in range(num_ipus):
        pid = ipu_pid(ipu)
        trace += [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"IPU {ipu}"}},
                  {"ph": "M", "pid": pid, "name": "process_sort_index",
                   "args": {"sort_index": pid}}]
    threads = _Threads(trace)
    for name in _HOST_THREADS.values():
        threads.tid(HOST_PID, name)
    run_of = _runs_of_nodes(events) if nodes else {}
    for index in sorted(range(len(events)), key=lambda i: events[i].start):
        e = events[index]
        span = {"ph": "X", "ts": us(e.start), "dur": max(us(e.end) - us(e.start), 0.0),
                "name": e.name}
        end = span["ts"] + span["dur"]
        if e.kind == "node":
            if not nodes:
                continue
            pid = ipu_pid(e.ipu)
            span.update(pid=pid, tid=threads.free(pid, "compute", span["ts"], end), cat="op",
                        args={"program": f"{e.program:016x}", "node": e.node})
            run = run_of.get(index)
            info = memory.get(e.program)
            # Memory as one micro-batch at a time uses it (the caller's lane).
            if run is not None and info is not None and e.track == 0:
                trace.append({"ph": "C", "pid": pid, "name": "memory", "ts": span["ts"],
                              "args": {"bytes": info.bytes_at(e.node, e.ipu, run.ipu_bytes)}})
        elif e.kind in ("to_ipu", "from_ipu"):
            pid = ipu_pid(e.ipu)
            span.update(pid=pid, tid=threads.free(pid, "host I/O", span["ts"], end),
                        cat="transfer", args={"bytes": e.bytes})
        elif e.kind == "stage":  # the pipeline stages an IPU ran, over their nodes
            pid = ipu_pid(e.ipu)
            span.update(pid=pid, tid=threads.free(pid, "pipeline stages", span["ts"], end),
                        cat="stage", args={"stage": e.node, "micro-batch": e.micro_batch})
        elif e.kind == "user":  # a channel's spans nest
            span.update(pid=HOST_PID, tid=threads.tid(HOST_PID,
                                                      f"channel {e.name.split('.', 1)[0]}"),
                        cat="user")
        else:
            span.update(pid=HOST_PID, tid=threads.free(HOST_PID, _HOST_THREADS[e.kind],
                                                       span["ts"], end),
                        cat=e.kind, args={"program": f"{e.program:016x}"} if e.program else {})
            if e.kind == "compile":
                span["args"]["nodes"] = e.bytes
            if e.kind == "program" and nodes and e.track == 0:
                # After a run its temporaries are gone: memory back to what it was.
                for ipu, allocated in enumerate(e.ipu_bytes):
                    trace.append({"ph": "C", "pid": ipu_pid(ipu), "name": "memory",
                                  "ts": us(e.end), "args": {"bytes": allocated}})
        trace.append(span)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


@dataclass
class Summary:
    """The numbers a report states (in seconds and bytes)."""
    compilations: int = 0
    compile_seconds: float = 0.0
    program_runs: int = 0
    run_seconds: float = 0.0
    nodes_run: int = 0
    node_seconds: float = 0.0
    to_ipu: Tuple[int, int, float] = (0, 0, 0.0)    # transfers, bytes, seconds
    from_ipu: Tuple[int, int, float] = (0, 0, 0.0)
    captures: int = 0
    capture_seconds: float = 0.0
    tracepoints: Dict[str, int] = field(default_factory=dict)  # per channel
    ops: List[Tuple[str, int, float]] = field(default_factory=list)  # name, count, seconds
    ipu_seconds: Dict[int, float] = field(default_factory=dict)
    peak_bytes: Dict[int, int] = field(default_factory=dict)  # per ipu
    dropped: int = 0

    def as_dict(self) -> Dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}


def summarise(events: List[Event], memory: Dict[int, ProgramMemory], dropped: int) -> Summary:
    s = Summary(dropped=dropped)
    ops: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    to_ipu, from_ipu = [0, 0, 0.0], [0, 0, 0.0]
    for e in events:
        seconds = (e.end - e.start) / 1e9
        if e.kind == "compile":
            s.compilations += 1
            s.compile_seconds += seconds
        elif e.kind == "program":
            s.program_runs += 1
            s.run_seconds += seconds
        elif e.kind == "node":
            s.nodes_run += 1
            s.node_seconds += seconds
            op = e.name.rsplit("/", 1)[-1]
            ops[op][0] += 1
            ops[op][1] += seconds
            s.ipu_seconds[e.ipu] = s.ipu_seconds.get(e.ipu, 0.0) + seconds
        elif e.kind in ("to_ipu", "from_ipu"):
            totals = to_ipu if e.kind == "to_ipu" else from_ipu
            totals[0] += 1
            totals[1] += e.bytes
            totals[2] += seconds
        elif e.kind == CAPTURE:
            s.captures += 1
            s.capture_seconds += seconds
        elif e.kind == "user":
            channel = e.name.split(".", 1)[0]
            s.tracepoints[channel] = s.tracepoints.get(channel, 0) + 1
    s.to_ipu, s.from_ipu = tuple(to_ipu), tuple(from_ipu)
    s.ops = sorted(((name, int(c), t) for name, (c, t) in ops.items()), key=lambda o: -o[2])
    for info in memory.values():
        for ipu, baseline in enumerate(info.baseline):
            peak = baseline + (info.peak_temporary_bytes[ipu]
                               if ipu < len(info.peak_temporary_bytes) else 0)
            s.peak_bytes[ipu] = max(s.peak_bytes.get(ipu, 0), peak)
    return s
