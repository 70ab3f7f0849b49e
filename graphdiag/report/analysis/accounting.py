"""Where a step's time goes: pure analysis over a run's decision events (a live run's or a record's).

Per step: host wall time, the device's busy time and its idle time between kernels (DeviceTime events:
CUPTI on CUDA, the modelled timeline on the simulated driver), and the host's graph management:
  check        the identity check: from the uid test (UidHit/UidMiss) to the phase decision, i.e. the
               node-property ledger's snapshot and comparison on a uid miss
  capture      recording a chunk's launches (ChunkCaptured.capture_ns)
  instantiate  cuGraphInstantiate (ChunkInstantiated)
  update       cuGraphExecUpdate, refused ones included (ChunkUpdated, UpdateRefused)
  launch       the graph launches of a replayed split (ReplayLaunched)
Steps are grouped by phase: decode steps by the worst phase a GPU split took (eager / capture / replay),
prefills apart. All times are integer ns.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable

from ... import events as E

MGMT = ("check", "capture", "instantiate", "update", "launch")
PHASES = ("prefill", "eager", "capture", "replay", "cpu")


@dataclass
class StepTime:
    step: int
    phase: str                     # "prefill" | "eager" | "capture" | "replay" | "cpu"
    n_tokens: int = 0
    wall_ns: int = 0
    gpu_ns: int = 0                # CUDA events around the GPU splits (StepFinished.gpu_ns)
    busy_ns: int = 0               # device busy (kernels)
    idle_ns: int = 0               # device idle between the first and the last kernel
    n_kernels: int = 0
    eager_ns: int = 0              # host time of eager splits (issuing kernels one by one)
    mgmt: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MGMT, 0))

    @property
    def mgmt_ns(self) -> int:
        return sum(self.mgmt.values())


@dataclass
class PhaseTime:
    """Medians over the phase's steps (ns), and the bound (bound_of): "GPU" when the device is busy for at
    least half of the step's wall time, else "host". The wall time holds the host's work before the step's
    first kernel, the device's idle gaps and the read-back after its last kernel, so a step whose kernels
    run back to back after a long host prelude is host-bound. On the simulated driver the wall time is the
    host's (numpy) and the busy time modelled: its steps read host-bound, which is what they are."""
    phase: str
    steps: int = 0
    tokens: int = 0
    wall_ns: int = 0
    busy_ns: int = 0
    idle_ns: int = 0
    mgmt_ns: int = 0
    mgmt: dict[str, int] = field(default_factory=dict)
    mgmt_total_ns: int = 0
    bound: str = ""


@dataclass
class KernelTime:
    kernel: str
    nodes: str                     # the graphdiag nodes it computed (shortened)
    total_ns: int = 0
    count: int = 0


@dataclass
class Accounting:
    source: str = ""               # "cupti" | "modelled" | "" (no device records)
    steps: list[StepTime] = field(default_factory=list)
    phases: list[PhaseTime] = field(default_factory=list)
    top_kernels: list[KernelTime] = field(default_factory=list)
    mgmt_total_ns: int = 0
    tokens: int = 0
    mgmt_per_token_ns: int = 0     # graph management over the run ÷ tokens processed
    attributed: int = 0            # kernels named by graphdiag node
    kernels: int = 0


def account(events: Iterable[E.Event], top: int = 10) -> Accounting:
    """The Accounting of a run from its events (spans ignored)."""
    acc = Accounting()
    steps: dict[int, StepTime] = {}
    pending: dict[tuple[int, int], int] = {}      # (step, split) -> t_ns of the uid test
    kernels: dict[str, KernelTime] = {}
    for ev in events:
        st = steps.get(ev.step)
        match ev:
            case E.StepStarted():
                steps[ev.step] = StepTime(ev.step, "prefill" if ev.phase == "prefill" else "?", ev.n_tokens)
            case E.StepFinished() if st is not None:
                st.wall_ns, st.gpu_ns = ev.duration_ns, ev.gpu_ns
                if st.phase != "prefill":
                    st.phase = ev.mode or "cpu"
            case E.UidHit() | E.UidMiss():
                pending[(ev.step, ev.split)] = ev.t_ns
            case E.PhaseDecided() if st is not None and (ev.step, ev.split) in pending:
                st.mgmt["check"] += max(ev.t_ns - pending.pop((ev.step, ev.split)), 0)
            case E.ChunkCaptured() if st is not None:
                st.mgmt["capture"] += ev.capture_ns
            case E.ChunkInstantiated() if st is not None:
                st.mgmt["instantiate"] += ev.duration_ns
            case E.ChunkUpdated() | E.UpdateRefused() if st is not None:
                st.mgmt["update"] += ev.duration_ns
            case E.ReplayLaunched() if st is not None:
                st.mgmt["launch"] += ev.duration_ns
            case E.EagerRun() if st is not None:
                st.eager_ns += ev.duration_ns
            case E.DeviceTime() if st is not None:
                acc.source = ev.source
                st.busy_ns, st.idle_ns, st.n_kernels = ev.busy_ns, ev.idle_ns, ev.n_kernels
                acc.kernels += ev.n_kernels
                acc.attributed += ev.attributed
                for name, nodes, ns, n in ev.top:
                    k = kernels.setdefault(name, KernelTime(name, nodes))
                    k.nodes = max(k.nodes, nodes, key=len)
                    k.total_ns += ns
                    k.count += n
    acc.steps = [s for s in steps.values() if s.wall_ns]
    acc.phases = [_phase(p, [s for s in acc.steps if s.phase == p]) for p in PHASES]
    acc.phases = [p for p in acc.phases if p.steps]
    acc.top_kernels = sorted(kernels.values(), key=lambda k: (-k.total_ns, k.kernel))[:top]
    acc.mgmt_total_ns = sum(s.mgmt_ns for s in acc.steps)
    acc.tokens = sum(s.n_tokens for s in acc.steps)
    acc.mgmt_per_token_ns = acc.mgmt_total_ns // acc.tokens if acc.tokens else 0
    return acc


def _median(v: list[int]) -> int:
    return int(statistics.median(v)) if v else 0


def _phase(name: str, steps: list[StepTime]) -> PhaseTime:
    p = PhaseTime(name, len(steps), sum(s.n_tokens for s in steps))
    if not steps:
        return p
    p.wall_ns = _median([s.wall_ns for s in steps])
    p.busy_ns = _median([s.busy_ns for s in steps])
    p.idle_ns = _median([s.idle_ns for s in steps])
    p.mgmt_ns = _median([s.mgmt_ns for s in steps])
    p.mgmt = {k: _median([s.mgmt[k] for s in steps]) for k in MGMT}
    p.mgmt_total_ns = sum(s.mgmt_ns for s in steps)
    if any(s.n_kernels for s in steps):
        p.bound = bound_of(p.wall_ns, p.busy_ns)
    return p


def bound_of(wall_ns: int, busy_ns: int) -> str:
    """"GPU" when the device is busy (kernels) for at least half of the wall time (ns), else "host": the
    other half is the host's (before the first kernel, between kernels, after the last). Both figures come
    from events every driver emits (StepFinished.duration_ns, DeviceTime.busy_ns)."""
    return "GPU" if wall_ns > 0 and 2 * busy_ns >= wall_ns else "host"
