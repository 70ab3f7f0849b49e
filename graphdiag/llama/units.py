"""One llama_decode's graph calls and log lines grouped into graph computes, as far as they are observable.

ggml's CUDA backend, per graph compute (ggml-cuda.cu at 0c1e57098): the cache lookup (which may evict idle
entries: their executables destroyed), "CUDA Graph id N reused" on a uid hit, "CUDA graph warmup complete" /
"CUDA graph warmup reset", then when capturing BeginCapture … EndCapture, Instantiate (only when the entry
has no executable yet), ExecUpdate (on every capture; a refusal: ExecDestroy of that executable and a new
Instantiate), and Launch. A compute ends at its launch; an eager one launches nothing, so it is seen only
by its warmup-reset line (or, for a decode that launched nothing at all, by the absence of any launch).

Entries: ggml keeps one executable per entry and replaces it only after a refused update, so an executable
lineage is one entry. Entries are numbered 1, 2, … in the order of their first capture; an eager compute's
entry (the graph key) is not observable and is 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

REUSED = re.compile(r"CUDA Graph id (\d+) reused")
WARMUP_COMPLETE = "CUDA graph warmup complete"
WARMUP_RESET = "CUDA graph warmup reset"


@dataclass
class Capture:
    """A capture's calls: times in ns (CUPTI's callback clock), update_result a cudaGraphExecUpdateResult
    (None: no update call), reinstantiated after a refused update."""

    t0_ns: int = 0
    capture_ns: int = 0
    nodes: int = 0                 # graph nodes created during the capture, of any type
    kernel_nodes: int = 0
    instantiate_ns: int | None = None       # a first instantiate (a new entry), None: the entry had one
    update_result: int | None = None
    update_ns: int = 0
    error_node: bool = False
    reinstantiate_ns: int | None = None


@dataclass
class Unit:
    """One graph compute. phase: "eager" | "capture" | "replay"; entry 0 where not observable."""

    phase: str = "eager"
    entry: int = 0
    uid: int = 0                   # from "CUDA Graph id N reused" (0: no uid hit logged)
    warmup: str = ""               # "complete" | "reset" | ""
    evicted: list[int] = field(default_factory=list)   # entries whose executable this lookup destroyed
    capture: Capture | None = None
    launch_ns: int = 0
    t_ns: int = 0
    seen: bool = True              # False: a decode that launched nothing (no line marks the compute)


class Grouper:
    """Groups each decode's lines into Units, keeping the executable -> entry map across decodes."""

    def __init__(self):
        self.entry_of: dict[int, int] = {}       # live executable id -> entry
        self.entries = 0

    def decode(self, lines: list[dict[str, Any]]) -> list[Unit]:
        """The graph computes of one decode, in order (at least one: eager when nothing was launched)."""
        units: list[Unit] = []
        cur: Unit | None = None
        evicted: list[int] = []

        def start(t: int) -> Unit:
            nonlocal cur, evicted
            if cur is not None:
                units.append(cur)                # closed without a launch: it ran eagerly
            cur, evicted = Unit(t_ns=t, evicted=evicted), []
            return cur

        for ln in lines:
            t = ln.get("t_ns", ln.get("t0_ns", 0))
            if ln["ev"] == "log":
                cur = self._log(ln["text"], cur, start, t)
            elif ln["fn"] == "cudaGraphExecDestroy" and not _refusal_destroy(cur, ln):
                entry = self.entry_of.pop(ln["exec"], 0)
                if entry:                        # evicted at the next compute's cache lookup, before its logs
                    evicted.append(entry)
            else:
                if cur is None or _starts_new(cur, ln["fn"]):
                    start(t)
                if self._api(cur, ln):
                    units.append(cur)
                    cur = None
        if cur is not None:
            units.append(cur)
        return units or [Unit(t_ns=lines[0].get("t_ns", 0) if lines else 0, evicted=evicted, seen=False)]

    def _log(self, text: str, cur: Unit | None, start, t: int) -> Unit | None:
        m = REUSED.search(text)
        if m:
            u = start(t)
            u.uid = int(m.group(1))
            return u
        for marker, state in ((WARMUP_COMPLETE, "complete"), (WARMUP_RESET, "reset")):
            if marker in text:
                u = cur if cur is not None and not cur.warmup and cur.capture is None else start(t)
                u.warmup = state
                return u
        return cur                                # any other line: not a decision

    def _api(self, u: Unit, ln: dict[str, Any]) -> bool:
        """Apply one graph call to the open compute; True when it ended it (the launch)."""
        fn, c = ln["fn"], u.capture
        dt = ln.get("t1_ns", 0) - ln.get("t0_ns", 0)
        if fn == "cudaStreamBeginCapture":
            u.capture = Capture(t0_ns=ln.get("t0_ns", 0))
        elif fn == "cudaStreamEndCapture":
            c = u.capture = c or Capture(t0_ns=ln.get("t0_ns", 0))
            c.capture_ns = ln.get("t1_ns", 0) - c.t0_ns
            c.nodes, c.kernel_nodes = ln.get("nodes", 0), ln.get("kernel_nodes", 0)
        elif fn == "cudaGraphInstantiate":
            c = u.capture = c or Capture()
            if c.update_result not in (None, 0):             # after a refusal: the same entry, a new executable
                self.entry_of[ln["exec"]] = u.entry
                c.reinstantiate_ns = dt
            else:
                self.entries += 1
                u.entry = self.entry_of[ln["exec"]] = self.entries
                c.instantiate_ns = dt
        elif fn == "cudaGraphExecUpdate":
            c = u.capture = c or Capture()
            u.entry = u.entry or self.entry_of.get(ln["exec"], 0)
            c.update_result, c.update_ns = ln["update_result"], dt
            c.error_node = bool(ln.get("error_node", False))
        elif fn == "cudaGraphExecDestroy":                   # the refused executable
            self.entry_of.pop(ln["exec"], None)
        elif fn == "cudaGraphLaunch":
            u.entry = u.entry or self.entry_of.get(ln["exec"], 0)
            u.phase = "capture" if c is not None else "replay"
            u.launch_ns = max(dt, 1)
            return True
        return False


def _starts_new(u: Unit, fn: str) -> bool:
    """A call that cannot belong to the open compute: a second capture, or one after its warmup reset."""
    return u.warmup == "reset" or (fn == "cudaStreamBeginCapture" and u.capture is not None)


def _refusal_destroy(u: Unit | None, ln: dict[str, Any]) -> bool:
    """The ExecDestroy of a refused update (ggml destroys the executable, then instantiates anew)."""
    return (u is not None and u.capture is not None and u.capture.update_result not in (None, 0)
            and u.capture.reinstantiate_ns is None)
