"""The Chrome trace-event JSON timeline (`graphdiag run --timeline FILE`): opens in ui.perfetto.dev and
chrome://tracing.

A sink fed with every event, spans included (subscribe with spans=True), plus each step's device records
(`add_device`). Process 1 is the host runtime: one track of graphdiag's timed scopes (a `step N` slice per
step, graph_compute, capture chunk, instantiate, update, replay, ...), one of instant events for every
decision, and the counters of graph entries and executables held. Process 2 is the device: a track per
CUDA stream and one of graph launches, kernels named by the graphdiag node(s) they compute; on the
simulated driver it is the modelled timeline, labelled SIMULATED in its process and track names. On several
devices (--devices N) each has its own track set: device d is process 2 + d, and its decisions have their
own host track ("decisions (device d)"). Track ids
are small integers in order of first use (as py-spy writes them); slices still open when the run ends or
is interrupted are closed at write time. Times are µs from the first event.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import events as E
from ...errors import EventWriteError
from ..analysis.eventlog import describe
from ..record.write import open_output, probe_output

HOST_PID, DEVICE_PID = 1, 2
HOST_TID, DECISION_TID, COUNTER_TID = 1, 2, 3


def decision_of(ev: E.Event) -> tuple[str, dict] | None:
    """(instant name, args) for the decisions a timeline marks; None for the others."""
    match ev:
        case E.WarmupTransition():
            name = "warmup complete" if ev.to_state == "warm" else "warmup reset"
            return name, {"why": ev.why}
        case E.PropertyDiff():
            return "recapture", {"cause": f"node {ev.node} {ev.node_name} {ev.field} {ev.old}→{ev.new}",
                                 "changed_nodes": ev.n_changed_nodes}
        case E.NodeCountChanged():
            return "recapture", {"cause": f"node count {ev.old}→{ev.new}"}
        case E.PhaseDecided():
            return f"phase {ev.phase}", {"why": ev.why}
        case E.ChunkUpdated():
            return "update", {"chunk": ev.chunk, "us": ev.duration_ns / 1e3}
        case E.ChunkInstantiated():
            return "instantiate", {"chunk": ev.chunk, "us": ev.duration_ns / 1e3, "after_refusal": ev.after_refusal}
        case E.UpdateRefused():
            return f"update refused: {ev.reason}", {"chunk": ev.chunk, "reason": ev.reason,
                                                    "error_node": ev.error_node}
        case E.Evicted():
            return "evicted", {"idle_us": ev.idle_ns / 1e3, "chunks": ev.n_chunks}
        case E.PoolInvalidated():
            return f"pool invalidated: {ev.reason}", {"graphs": ev.n_graphs, "executables": ev.n_captured}
        case E.CaptureAbandoned():
            return "capture abandoned", {"reason": ev.reason}
        case E.GraphsDisabled() | E.Incompatible():
            return ev.kind.replace("_", " "), {"what": describe(ev)}
        case E.FaultInjected():
            return f"fault: {ev.fault}", {"call": ev.call, "error": ev.error}
        case E.FaultMissed():
            return f"fault missed: {ev.fault}", {"waited_for": ev.calls}
        case E.StepFailed():
            return "step failed", {"error": ev.error, "fault": ev.fault, "status": ev.status,
                                   "recoverable": ev.recoverable}
        case E.CellsRemoved():
            return "KV cells removed", {"seq": ev.seq, "pos_min": ev.pos_min, "cells": ev.n_cells}
        case E.EntryReset():
            return "graph released", {"executables": ev.n_executables, "capture_ended": ev.capture_ended,
                                      "reason": ev.reason}
    return None


class TimelineWriter:
    """Collects trace events; `close()` writes the file (idempotent). `simulated` labels the device.

    The file is shown writable by the constructor (probe_output: a path that cannot be written, /dev/full
    included, fails before the run, and an existing file is left as it was) and opened by close(); the
    runner closes it however a started run ends, SIGTERM and a second Ctrl-C included (runner.shielded),
    and not at all when the run was refused before it started."""

    def __init__(self, path: str | Path, simulated: bool = False):
        self.path = Path(path)
        probe_output(self.path, "the timeline")
        self.sink_name = f"the timeline {self.path}"
        self.simulated = simulated
        self.n_devices = 1
        self.out: list[dict] = []
        self._last = 0
        self._open: list[E.SpanBegin] = []
        self._tids: dict[tuple[int, str], int] = {}
        self.entries = self.executables = 0
        self._phase: dict[int, str] = {}
        self._closed = False

    def start(self, header: dict) -> None:
        """The runner's on_header hook: the device is simulated or not."""
        self.simulated = bool(header.get("simulated")) and header.get("backend") != "cpu"
        self.n_devices = int(header.get("settings", {}).get("devices", 1) or 1)

    # -- time and tracks ------------------------------------------------------------------------------
    def _us(self, t_ns: int) -> int:
        """Kept in ns until close() moves every time to µs from the earliest (device records of a step may
        start before the host's first event)."""
        self._last = max(self._last, t_ns)
        return t_ns

    def _tid(self, pid: int, name: str) -> int:
        """A small integer per (process, track name), in order of first use, after the fixed host ones."""
        key = (pid, name)
        if key not in self._tids:
            base = 3 if pid == HOST_PID else 0
            self._tids[key] = base + 1 + sum(1 for p, _ in self._tids if p == pid)
        return self._tids[key]

    # -- host events ----------------------------------------------------------------------------------
    def __call__(self, ev: E.Event) -> None:
        if isinstance(ev, E.SpanBegin):
            self._us(ev.t_ns)
            self._open.append(ev)
        elif isinstance(ev, E.SpanEnd):
            for i in range(len(self._open) - 1, -1, -1):
                if self._open[i].name == ev.name:
                    self._slice(self._open.pop(i), ev.t_ns)
                    break
        else:
            self._decision(ev)

    def _slice(self, b: E.SpanBegin, end_ns: int) -> None:
        name = f"step {b.step}" if b.name == "step" else b.name
        ts = self._us(b.t_ns)
        args = {"step": b.step, "payload": b.payload}
        if b.split >= 0:
            args["split"] = b.split
        if b.key:
            args["key"] = f"{b.key:#x}"
        self.out.append({"ph": "X", "name": name, "cat": b.category, "pid": HOST_PID, "tid": HOST_TID, "ts": ts,
                         "dur": self._us(end_ns) - ts, "args": args})

    def _decision(self, ev: E.Event) -> None:
        t = ev.t_ns
        if not t:
            return
        got = decision_of(ev)
        if isinstance(ev, E.PhaseDecided):           # a phase is marked when it changes, not every step
            if self._phase.get(ev.key) == ev.phase:
                got = None
            self._phase[ev.key] = ev.phase
        if got is not None:
            name, args = got
            args = {"step": ev.step, **({"split": ev.split} if ev.split >= 0 else {}),
                    **({"key": f"{ev.key:#x}"} if ev.key else {}), **args}
            tid = DECISION_TID if not ev.device else self._tid(HOST_PID, f"decisions (device {ev.device})")
            if ev.device:
                args["device"] = ev.device
            self.out.append({"ph": "i", "s": "t", "name": name, "cat": "decision", "pid": HOST_PID,
                             "tid": tid, "ts": self._us(t), "args": args})
        if self._count(ev):
            self.out.append({"ph": "C", "name": "graphs held", "pid": HOST_PID, "tid": COUNTER_TID,
                             "ts": self._us(t), "args": {"entries": self.entries, "executables": self.executables}})

    def _count(self, ev: E.Event) -> bool:
        """Track graph entries and executables held; True when they changed."""
        before = (self.entries, self.executables)
        match ev:
            case E.KeyLookup() if ev.new_entry:
                self.entries += 1
            case E.Evicted():
                self.entries -= 1
                self.executables -= ev.n_chunks
            case E.ChunkInstantiated() if not ev.after_refusal:
                self.executables += 1
            case E.ChunksDestroyed():
                self.executables -= ev.count
            case E.PoolInvalidated():
                self.entries -= ev.n_graphs
                self.executables -= ev.n_captured
        self.entries, self.executables = max(self.entries, 0), max(self.executables, 0)
        return (self.entries, self.executables) != before

    # -- device records -------------------------------------------------------------------------------
    def add_device(self, records) -> None:
        """A step's device records (launch_log.ActivityRecord, host clock, attributed)."""
        sim = " (SIMULATED)" if self.simulated else ""
        groups: dict[int, list] = {}
        for r in records:
            pid = DEVICE_PID + r.device
            tid = self._tid(pid, f"stream {r.stream}{sim}")
            ts = self._us(r.start_ns)
            name = r.label or r.name
            args = {"kernel": r.name} if r.kind == "kernel" else {"bytes": r.nbytes}
            if r.label:
                args["nodes"], args["named via"] = r.label, r.via
            if r.graph_id:
                args["graph_id"], args["graph_node_id"] = r.graph_id, r.node_id
                groups.setdefault(r.correlation, []).append(r)
            self.out.append({"ph": "X", "name": name, "cat": r.kind, "pid": pid, "tid": tid, "ts": ts,
                             "dur": self._us(r.end_ns) - ts, "args": args})
        for corr, rs in groups.items():
            pid = DEVICE_PID + rs[0].device
            tid = self._tid(pid, f"graph launches{sim}")
            a, b = min(r.start_ns for r in rs), max(r.end_ns for r in rs)
            ts = self._us(a)
            self.out.append({"ph": "X", "name": f"graph launch ({len(rs)} nodes)", "cat": "graph", "pid": pid,
                             "tid": tid, "ts": ts, "dur": self._us(b) - ts,
                             "args": {"graph_id": rs[0].graph_id, "correlation": corr}})

    # -- writing --------------------------------------------------------------------------------------
    def _metadata(self) -> list[dict]:
        sim = self.simulated
        dev = "SIMULATED device (modelled timeline, not a GPU)" if sim else "GPU (CUPTI)"
        meta = [{"ph": "M", "name": "process_name", "pid": HOST_PID, "args": {"name": "graphdiag host runtime"}},
                {"ph": "M", "name": "process_sort_index", "pid": HOST_PID, "args": {"sort_index": 1}}]
        for tid, name in ((HOST_TID, "host: graphdiag scopes"), (DECISION_TID, "decisions"),
                          (COUNTER_TID, "graphs held")):
            meta.append({"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": tid, "args": {"name": name}})
        for pid in sorted({p for p, _ in self._tids if p >= DEVICE_PID}):
            name = dev if pid == DEVICE_PID and self.n_devices == 1 else f"device {pid - DEVICE_PID}: {dev}"
            meta += [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
                     {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
        for (pid, name), tid in self._tids.items():
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        return meta

    def close(self) -> None:
        """Close the slices still open at the last time seen, then write the file (once)."""
        if self._closed:
            return
        self._closed = True
        while self._open:
            self._slice(self._open.pop(), self._last)
        t0 = min((e["ts"] for e in self.out), default=0)
        for e in self.out:
            e["ts"] = round((e["ts"] - t0) / 1e3, 3)
            if "dur" in e:
                e["dur"] = round(e["dur"] / 1e3, 3)
        doc = {"traceEvents": self._metadata() + self.out, "displayTimeUnit": "ms",
               "otherData": {"generator": "graphdiag", "simulated_device": self.simulated}}
        f = open_output(self.path, "the timeline")
        try:
            with f:
                f.write(json.dumps(doc, separators=(",", ":")))
        except OSError as e:
            raise EventWriteError(f"cannot write the timeline {self.path}: {e.strerror or e}") from None
