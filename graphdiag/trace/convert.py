"""A `graphdiag trace` raw stream -> a graphdiag record (the schema of `graphdiag run --events`).

A step (STEP below, also in the header) is one graph launch of the traced process, with the capture,
instantiate and update that made or changed its executable since that executable's last launch; a
capture, instantiate or update no launch followed is a step of its own at the end; and a compute
llama.cpp logged as a warmup reset (it ran eagerly) is a step. Steps are numbered in time order over
every process, thread, stream and device. Executable lineages are graph entries (keys 1, 2, ... in order
of first instantiate), as `graphdiag llama` numbers them: an instantiate of the graph whose update was just
refused continues the refused executable's entry. Pieces shared with graphdiag/llama/convert.py: the
update result names and how a run ended. What a trace cannot show is named in the header, never guessed.
"""

from __future__ import annotations

import bisect
import datetime
import difflib
import json
import lzma
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import events as E
from ..errors import EventFileError
from ..llama.convert import _result_name, _status
from ..llama.units import REUSED, WARMUP_COMPLETE, WARMUP_RESET
from ..report.record.header import RunHeader
from .raw import RAW_NAME, read_raw

STEP = ("one graph launch (with the capture, instantiate and update of its executable since its last launch), "
        "a capture/instantiate/update never launched, or a compute llama.cpp logged as a warmup reset (eager); "
        "numbered in time order over all processes, threads, streams and devices")
NOT_OBSERVABLE = (
    "graph key (steps are keyed by executable lineage)", "which node property changed (the ledger)",
    "eager kernels (only graph calls are watched)",
    "device time (host time of the calls only)", "event synchronisation (cudaEventSynchronize, stream waits)",
    "log lines' exact time (placed by llama.cpp's own timestamps where it prints them, else when graphdiag "
    "read them from CMD's stderr)",
)
INTERPOSED_ONLY = ("graph calls made through the driver API (cuGraphLaunch, ...) or a statically linked CUDA runtime: "
                   "the calls were read through libcudart's symbols (--api interpose)")


def read_through(start_text) -> str:
    """How a process's calls were read, from its "start" line: interpose, off (no CUPTI: a measurement knob) or
    cupti (the line names libcupti)."""
    return start_text if start_text in ("interpose", "off") else "cupti"


NO_BATCHES = ("tokens, positions, sequences (no llama_decode seen: CMD does not call libllama's llama_decode "
              "or llama_process through their dynamic symbols, as a ctypes binding does)")
DISABLED = "disabling CUDA graphs due to"
SYNC_FNS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize")
# common_log's timestamp prefix (llama-server, llama-cli): minutes.seconds.milliseconds.microseconds since the
# log began, on the wall clock (common/log.cpp)
LOG_STAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")
# How late a line's place from its timestamp may fall after the graph call its compute makes next: the stderr
# path's smallest latency (common_log's worker thread, the pipe, graphdiag's reader), which the estimate keeps.
# Measured on llama-server traces (H100, 2026-12-07): 0-20 us after the call; a line of an earlier compute of
# the same llama_decode comes after a graph build at least (far more)
LOG_LATE_NS = 50_000
GRAPH_STARTS = ("cudaStreamBeginCapture", "cudaGraphLaunch")
N_CTX_LINE = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")


def convert_raw(path: str | Path) -> tuple[RunHeader, list[E.Event]]:
    raw_header, lines = read_raw(path)
    return convert(raw_header, lines, source=str(path))


def read_record_or_raw(path: str | Path) -> tuple[RunHeader, list[E.Event]]:
    """A record (read_record), or the raw stream `graphdiag trace --raw` keeps, converted as `trace` converts
    it: what `report` and `diff` read."""
    from ..rawstream import first_line
    from ..report.record.read import read_record
    try:
        head = json.loads(first_line(path))
    except (OSError, ValueError, EOFError, lzma.LZMAError):
        head = None                                  # read_record names what is wrong with the file
    if isinstance(head, dict) and head.get("raw") == RAW_NAME:
        return convert_raw(path)
    if Path(path).suffix == ".xz":                  # records are plain; a compressed file is a raw stream or none
        raise EventFileError(f"{path}: not an xz-compressed graphdiag trace raw stream")
    return read_record(path)


@dataclass
class _Pending:
    """What happened to one executable lineage since its last launch (events without step numbers)."""

    t_ns: int
    device: int = 0
    items: list = field(default_factory=list)       # (event class, kwargs)
    kernel_nodes: int = 0
    captured: bool = False
    cost_ns: int = 0


class _Converter:
    def __init__(self):
        self.events: list[E.Event] = []
        self.step = -1
        self.entries = 0
        self.entry_of: dict[tuple, int] = {}          # (pid, exec) -> entry
        self.graph_of: dict[tuple, int] = {}          # (pid, exec) -> graph id it runs
        self.names: dict[tuple, list] = {}            # (pid, graph) -> kernel names
        self.captures: dict[tuple, tuple] = {}        # (pid, graph) -> (t0, ChunkCaptured kwargs, kernel nodes)
        self.capture_t0: dict[tuple, int] = {}        # (pid, stream) -> BeginCapture t0
        self.refused: dict[tuple, int] = {}           # (pid, graph) -> entry whose update to it was refused
        self.pending: dict[int, _Pending] = {}        # entry -> since its last launch
        self.launched: dict[tuple, int] = {}          # (pid, exec) -> when its last launch returned
        self.logs: list = []                          # (event class, kwargs) for the next step

    # -- steps -----------------------------------------------------------------------------------------
    def _emit_step(self, key: int, p: _Pending, tail: list, t_end: int, mode: str) -> None:
        self.step += 1
        s, dev = self.step, p.device
        out = [E.StepStarted(step=s, t_ns=p.t_ns, phase="decode", device=dev)]
        for cls, kw in self.logs:
            out.append(cls(step=s, split=0, key=key, t_ns=kw.pop("t_ns", p.t_ns), device=dev, **kw))
        self.logs = []
        for cls, kw in p.items + tail:
            out.append(cls(step=s, split=0, key=key, device=dev, **kw))
        out.append(E.StepFinished(step=s, t_ns=t_end, duration_ns=max(t_end - p.t_ns, 0), mode=mode, device=dev))
        self.events += out

    def _pend(self, key: int, t: int, dev: int) -> _Pending:
        return self.pending.setdefault(key, _Pending(t_ns=t, device=dev))

    def _flush(self, key: int, t_end: int) -> None:
        """A lineage's capture/instantiate/update that no launch followed: a step of its own."""
        p = self.pending.pop(key, None)
        if p is not None:
            phase = [(E.PhaseDecided, {"phase": "capture", "why": "observed: graph made, not launched",
                                       "t_ns": p.t_ns})]
            p.items = phase + p.items
            self._emit_step(key, p, [], t_end, "capture")

    # -- calls -----------------------------------------------------------------------------------------
    def api(self, ln: dict[str, Any]) -> None:
        fn, pid, t0, t1 = ln["fn"], ln["pid"], ln["t0_ns"], ln["t1_ns"]
        dev, ok = ln.get("device", 0) or 0, ln["ret"] == 0
        if fn == "cudaStreamBeginCapture":
            self.capture_t0[(pid, ln.get("stream", -1))] = t0
        elif fn == "cudaStreamEndCapture" and ok and "graph" in ln:
            g = (pid, ln["graph"])
            start = self.capture_t0.pop((pid, ln["stream"]), t0)
            self.names[g] = list(ln.get("kernel_names") or [])
            self.captures[g] = (start, {"chunk": 0, "n_graph_nodes": ln.get("nodes", 0), "capture_ns": t1 - start,
                                        "t_ns": start}, ln.get("kernel_nodes", 0))
        elif fn == "cudaGraphInstantiate" and ok and "exec" in ln:
            self._instantiate(ln, pid, dev)
        elif fn == "cudaGraphExecUpdate":
            self._update(ln, pid, dev)
        elif fn == "cudaGraphLaunch":
            self._launch(ln, pid, dev)
        elif fn == "cudaGraphExecDestroy":
            self._destroy(ln, pid, dev)
        elif fn in SYNC_FNS:
            self.events.append(E.TracedCall(step=max(self.step, 0), t_ns=t0, device=dev, fn=fn,
                                            stream=ln.get("stream", -1), pid=pid, tid=ln.get("tid", 0)))

    def _captured_into(self, p: _Pending, pid: int, graph: int) -> None:
        cap = self.captures.pop((pid, graph), None)
        if cap is not None:
            start, kw, kernels = cap
            p.t_ns = min(p.t_ns, start)
            p.items.append((E.ChunkCaptured, kw))
            p.kernel_nodes, p.captured = kernels, True
            p.cost_ns += kw["capture_ns"]

    def _instantiate(self, ln, pid, dev) -> None:
        g, x = ln.get("graph"), (pid, ln["exec"])
        entry = self.refused.pop((pid, g), None)
        after_refusal = entry is not None
        if entry is None:
            self.entries += 1
            entry = self.entries
        self.entry_of[x], self.graph_of[x] = entry, g
        p = self._pend(entry, ln["t0_ns"], dev)
        self._captured_into(p, pid, g)
        before, after = ln.get("mem_free_before"), ln.get("mem_free_after")
        mem = max(before - after, 0) if isinstance(before, int) and isinstance(after, int) else 0
        p.items.append((E.ChunkInstantiated, {"chunk": 0, "duration_ns": ln["t1_ns"] - ln["t0_ns"],
                                              "after_refusal": after_refusal, "mem_bytes": mem,
                                              "t_ns": ln["t0_ns"]}))
        p.cost_ns += ln["t1_ns"] - ln["t0_ns"]

    def _update(self, ln, pid, dev) -> None:
        x, g = (pid, ln["exec"]), ln.get("graph")
        entry = self.entry_of.get(x, 0)
        p = self._pend(entry, ln["t0_ns"], dev)
        self._captured_into(p, pid, g)
        dt, result = ln["t1_ns"] - ln["t0_ns"], ln.get("update_result", 0 if ln["ret"] == 0 else -1)
        p.cost_ns += dt
        if result == 0 and ln["ret"] == 0:
            self.graph_of[x] = g
            p.items.append((E.ChunkUpdated, {"chunk": 0, "duration_ns": dt, "t_ns": ln["t0_ns"]}))
            return
        old = self.names.get((pid, self.graph_of.get(x)), [])
        new = self.names.get((pid, g), [])
        p.items.append((E.UpdateRefused, {"chunk": 0, "reason": _result_name(result) if result >= 0 else
                                          f"error {ln['ret']}", "error_node": error_node(ln, old, new),
                                          "duration_ns": dt, "t_ns": ln["t0_ns"]}))
        self.refused[(pid, g)] = entry

    def _launch(self, ln, pid, dev) -> None:
        x = (pid, ln["exec"])
        entry = self.entry_of.get(x, 0)
        p = self.pending.pop(entry, None)
        dt = max(ln["t1_ns"] - ln["t0_ns"], 1)
        self.launched[x] = ln["t1_ns"]
        call = (E.TracedCall, {"fn": "cudaGraphLaunch", "exec_id": ln["exec"], "stream": ln["stream"], "pid": pid,
                               "tid": ln.get("tid", 0), "t_ns": ln["t0_ns"]})
        if p is not None and (p.captured or any(c is E.ChunkInstantiated for c, _ in p.items)):
            p.items.insert(0, (E.PhaseDecided, {"phase": "capture", "why": "observed: graph made, then launched",
                                                "t_ns": p.t_ns}))
            tail = [(E.CaptureRun, {"n_chunks": 1, "n_launches": p.kernel_nodes, "duration_ns": p.cost_ns + dt,
                                    "t_ns": ln["t0_ns"]}), call]
            self._emit_step(entry, p, tail, ln["t1_ns"], "capture")
            return
        p = p or _Pending(t_ns=ln["t0_ns"], device=dev)     # an update alone (no capture seen) is a replay's
        p.items.insert(0, (E.PhaseDecided, {"phase": "replay", "why": "observed: graph launched without a capture",
                                            "t_ns": ln["t0_ns"]}))
        tail = [(E.ReplayLaunched, {"n_chunks": 1, "duration_ns": dt, "t_ns": ln["t0_ns"]}), call]
        self._emit_step(entry, p, tail, ln["t1_ns"], "replay")

    def _destroy(self, ln, pid, dev) -> None:
        x = (pid, ln["exec"])
        entry = self.entry_of.pop(x, 0)
        self.graph_of.pop(x, None)
        idle = max(ln["t0_ns"] - self.launched.pop(x, ln["t0_ns"]), 0)     # since its last launch (0: never)
        replaced = bool(entry) and entry in self.refused.values()   # its update was refused: re-instantiated next
        if not replaced:
            self._flush(entry, ln["t0_ns"])
        s = max(self.step, 0)
        if entry and not replaced:                  # the lineage ends (a refused one goes on at its instantiate)
            self.events.append(E.Evicted(step=s, split=0, key=entry, t_ns=ln["t0_ns"], device=dev, n_chunks=1,
                                          idle_ns=idle))
        self.events.append(E.TracedCall(step=s, key=entry, t_ns=ln["t0_ns"], device=dev, fn="cudaGraphExecDestroy",
                                        exec_id=ln["exec"], pid=pid, tid=ln.get("tid", 0)))

    def batch(self, ln: dict[str, Any]) -> None:
        seqs = ln.get("seq")
        self.events.append(E.DecodeBatch(
            step=self.step, t_ns=ln["t0_ns"], ctx=ln.get("ctx", 0), n_tokens=ln["n_tokens"],
            tokens=tuple(ln.get("tokens") or ()), embd=bool(ln.get("embd")),
            positions=None if ln["pos"] is None else tuple(ln["pos"]),
            seqs=None if seqs is None else tuple(tuple(q) for q in seqs),
            outputs=None if ln["out"] is None else tuple(ln["out"]), ret=ln["ret"],
            duration_ns=max(ln["t1_ns"] - ln["t0_ns"], 0), pid=ln["pid"], tid=ln.get("tid", 0)))

    # -- llama.cpp's log lines -------------------------------------------------------------------------
    def log(self, ln: dict[str, Any]) -> None:
        text, t = ln["text"], ln["t_ns"]
        m = REUSED.search(text)
        if m:
            self.logs.append((E.UidHit, {"uid": int(m.group(1)), "t_ns": t}))
        elif WARMUP_COMPLETE in text:
            self.logs.append((E.WarmupTransition, {"from_state": "cold", "to_state": "warm", "t_ns": t,
                                                   "why": "warmup complete (llama.cpp's log)"}))
        elif WARMUP_RESET in text:          # that compute ran eagerly: a step of its own
            self.logs.append((E.WarmupTransition, {"from_state": "warm", "to_state": "cold", "t_ns": t,
                                                   "why": "warmup reset: properties changed (llama.cpp's log)"}))
            p = _Pending(t_ns=t, items=[(E.PhaseDecided, {"phase": "eager", "t_ns": t,
                                                         "why": "observed: warmup reset (llama.cpp's log)"}),
                                        (E.EagerRun, {"t_ns": t})])
            self._emit_step(0, p, [], t, "eager")
        elif DISABLED in text:
            reason = text[text.index(DISABLED):].strip()
            self.events.append(E.GraphsDisabled(step=max(self.step, 0), t_ns=t, reason=f"llama.cpp's log: {reason}"))


def log_places(lines: list[dict[str, Any]]) -> dict[int, int]:
    """Where each log line of `lines` (index -> ns on the trace's clock) belongs in time. graphdiag reads
    CMD's stderr late (common_log prints from a worker thread): by read time a compute's "CUDA Graph id N
    reused" lands after that compute's graph launch, on the next compute. Where llama.cpp stamps its lines,
    a line's time is its stamp plus the smallest (read time - stamp) of the run: its creation time plus the
    stderr path's fastest latency. llama.cpp prints a compute's graph lines before its first graph call
    (cudaStreamBeginCapture or cudaGraphLaunch), so a line placed less than LOG_LATE_NS after such a call of
    the same llama_decode (no batch started in between) belongs before it. Lines without stamps keep their
    read time."""
    stamps = {}
    for i, ln in enumerate(lines):
        m = LOG_STAMP.match(ln["text"]) if ln["ev"] == "log" else None
        if m:
            mi, se, ms, us = map(int, m.groups())
            stamps[i] = (((mi * 60 + se) * 1000 + ms) * 1000 + us) * 1000
    if not stamps:
        return {}
    offset = min(lines[i]["t_ns"] - s for i, s in stamps.items())
    starts = sorted(ln["t0_ns"] for ln in lines if ln["ev"] == "api" and ln["fn"] in GRAPH_STARTS)
    batches = sorted(ln["t0_ns"] for ln in lines if ln["ev"] == "batch")
    at = {}
    for i, s in stamps.items():
        t = s + offset
        k, b = bisect.bisect_right(starts, t) - 1, bisect.bisect_right(batches, t) - 1
        call = starts[k] if k >= 0 else None
        if call is not None and t - call < LOG_LATE_NS and (b < 0 or call >= batches[b]):
            t = call - 1
        at[i] = t
    return at


def _short(name: str) -> str:
    """A kernel's function for a report line: a mangled C++ name's identifier (`_Z11k_bin_bcastIX...` ->
    k_bin_bcast), another name up to its parameter list (the raw stream keeps the whole name)."""
    m = re.match(r"_Z(\d+)", name)
    if m:
        return name[m.end():m.end() + int(m.group(1))]
    return name.split("(")[0][:120]


def _first_topology_change(old: list[str], new: list[str]) -> str:
    """Where CUDA named no node: the first kernel the new graph adds or drops against the executable's, the two
    kernel lists aligned (difflib); a kernel whose function alone changed does not change the topology, so it is
    named only where nothing was added or dropped ("" where the kernels are the same)."""
    ops = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    op = next((op for op in ops if op[0] != "replace" or op[2] - op[1] != op[4] - op[3]), ops[0] if ops else None)
    if op is None:
        return ""
    tag, i1, i2, j1, j2 = op
    more = f"; {len(ops) - 1} more change{'s' if len(ops) > 2 else ''}" if len(ops) > 1 else ""
    if tag == "delete" or (tag == "replace" and i2 - i1 > j2 - j1 and j2 == j1):
        return f"kernel {i1}: {_short(old[i1])} removed (CUDA named no node{more})"
    if tag == "insert":
        return f"kernel {j1}: {_short(new[j1])} added (CUDA named no node{more})"
    if i2 - i1 > j2 - j1:
        return f"kernel {i1 + j2 - j1}: {_short(old[i1 + j2 - j1])} removed (CUDA named no node{more})"
    if j2 - j1 > i2 - i1:
        return f"kernel {j1 + i2 - i1}: {_short(new[j1 + i2 - i1])} added (CUDA named no node{more})"
    return f"kernel {i1}: {_short(old[i1])} -> {_short(new[j1])} (CUDA named no node{more})"


def error_node(ln: dict[str, Any], old: list[str], new: list[str]) -> str:
    """The node an update was refused at, named from the kernel names of both graphs (the executable's and the
    new one's, in cuGraphGetNodes order): "node 41: mul_mat_q_stream_k_fixup added"; where CUDA named no node, the
    first kernel the new graph adds or drops (_first_topology_change)."""
    if not ln.get("error_node"):
        return _first_topology_change(old, new)
    idx, k = ln.get("error_node_index"), ln.get("error_node_kernel_index")
    name = ln.get("error_node_kernel")
    if name is None or k is None:
        return f"node {idx}: not a kernel node"
    where = f" (kernel {k} of {len(new)}; the executable's graph has {len(old)})"
    if k >= len(old) or (len(new) > len(old) and old[k] == new[min(k + 1, len(new) - 1)]):
        return f"node {idx}: {name} added{where}"
    if len(new) < len(old) and k + 1 < len(old) and old[k + 1] == name:
        return f"node {idx}: {old[k]} removed{where}"
    was = ln.get("error_from_kernel") or old[k]
    return f"node {idx}: {was} -> {name}{where}" if was != name else f"node {idx}: {name} changed{where}"


def convert(raw_header: dict[str, Any], lines: list[dict[str, Any]], source: str = "") -> tuple[RunHeader, list[E.Event]]:
    """(header, events) of the converted record."""
    c = _Converter()
    timed = [ln for ln in lines if ln["ev"] in ("api", "log", "batch")]
    at = log_places(timed)
    order = sorted(range(len(timed)), key=lambda i: at.get(i, timed[i].get("t0_ns", timed[i].get("t_ns", 0))))
    timed = [timed[i] | ({"t_ns": at[i]} if i in at else {}) for i in order]
    handle = {"api": c.api, "log": c.log, "batch": c.batch}
    for ln in timed:
        handle[ln["ev"]](ln)
    t_last = max((ln.get("t1_ns", ln.get("t_ns", 0)) for ln in timed), default=0)
    for key in list(c.pending):
        c._flush(key, t_last)
    end = next((ln for ln in reversed(lines) if ln["ev"] == "end"), None)
    status, reason = _status(end)
    steps_done = sum(isinstance(e, E.StepFinished) for e in c.events)
    c.events.append(E.RunEnded(step=c.step + 1, t_ns=int((end or {}).get("t_ns", t_last) or t_last),
                               status=status, steps_done=steps_done, reason=reason))
    return _header(raw_header, lines, source, end), c.events


def _header(raw: dict[str, Any], lines: list[dict[str, Any]], source: str, end: dict | None) -> RunHeader:
    pids = sorted({ln["pid"] for ln in lines if ln["ev"] in ("start", "api")})
    devices = sorted({ln.get("device", 0) for ln in lines if ln["ev"] == "api"})
    cmd = raw.get("cmd") or []
    batches = sum(ln["ev"] == "batch" for ln in lines)
    unread = sum(ln["ev"] == "batch" and ln["n_tokens"] < 0 for ln in lines)
    not_observable = list(NOT_OBSERVABLE) + ([] if batches else [NO_BATCHES]) + (
        [f"the contents of {unread} decode batches (llama_batch_ext built through calls the library did not see)"]
        if unread else [])
    reads = sorted({read_through(ln.get("text")) for ln in lines if ln["ev"] == "start"})
    if "interpose" in reads:
        not_observable.append(INTERPOSED_ONLY)
    n_ctx = [int(m.group(1)) for ln in lines if ln["ev"] == "log" for m in [N_CTX_LINE.search(ln["text"])] if m]
    graph_lines = sum(ln["ev"] == "log" for ln in lines)
    trace = {"cmd": cmd, "raw": source, "pids": pids, "devices": devices, "step": STEP, "decode_batches": batches,
             "graph_log_lines": graph_lines,
             "exit": (end or {}).get("code"), "not_observable": not_observable, "reads": reads,
             "errors": [ln["text"] for ln in lines if ln["ev"] == "error"]}
    if n_ctx:
        trace["n_ctx"] = n_ctx                 # llama.cpp's "llama_context: n_ctx = N", each context's
    if raw.get("synthetic"):                   # a fixture written by hand or by a tool, not a recording
        trace["synthetic"] = str(raw["synthetic"])
    if raw.get("excerpt"):                     # a recording cut short for a fixture: what was kept
        trace["excerpt"] = str(raw["excerpt"])
    return RunHeader(backend="cuda", device=", ".join(f"CUDA device {d}" for d in devices) or "no device seen",
                     simulated=False, model=" ".join(cmd), settings={"cmd": " ".join(cmd)},
                     note="an unmodified process traced through CUDA injection ("
                          + ("libcudart's calls interposed" if reads == ["interpose"] else "CUPTI callbacks")
                          + ") and its stderr",
                     started=raw.get("started") or datetime.datetime.now().isoformat(timespec="seconds"),
                     trace=trace)
