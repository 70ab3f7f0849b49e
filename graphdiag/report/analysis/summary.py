"""Pure analysis of one run: (header, events) -> Summary. No rendering here.

Counter values come from `counters.Counters` fed with the same events, so the report, the live counters and
the scenario expectations always agree. All times are integer nanoseconds (medians of the samples).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from ... import events as E
from ...counters import Counters
from .graph_memory import GraphMemory, graph_memory
from .accounting import Accounting, account
from .devices import DeviceReport, device_report
from .failures import Faults, faults
from .measured import gpu_time_source, simulated_timings
from ..record.header import RunHeader, as_header
from .strict import strict_findings
from .thrash import KeyThrash, find_thrash


@dataclass
class KeySummary:
    """What happened to one graph key (one GPU split's cache entry) over the run."""

    key: int
    splits: list[int] = field(default_factory=list)   # split indices this key was seen at
    device: int = 0                                     # the device whose cache holds it
    steps_eager: int = 0
    steps_capture: int = 0
    steps_replay: int = 0
    chunks: int = 0                                     # chunk count of the last capture or replay
    updates: int = 0
    instantiates: int = 0
    refusals: dict[str, int] = field(default_factory=dict)   # update refusals by reason
    warmup_resets: int = 0
    evictions: int = 0
    first_step: int = -1
    last_step: int = -1


@dataclass
class Timing:
    """A median over `n` samples and their spread (median absolute deviation from it), in nanoseconds (0
    when n == 0; the spread is 0 for one sample)."""

    median_ns: int = 0
    n: int = 0
    spread_ns: int = 0


def timing_of(samples: list[int]) -> Timing:
    """Median and median absolute deviation (ns) of the samples."""
    med = statistics.median(samples)
    return Timing(int(med), len(samples), int(statistics.median(abs(x - med) for x in samples)))


# timing name -> (event type, attribute); step timings are added per mode in _timings
TIMED = {
    "eager split": (E.EagerRun, "duration_ns"),
    "capture split": (E.CaptureRun, "duration_ns"),
    "replay split": (E.ReplayLaunched, "duration_ns"),
    "chunk update": (E.ChunkUpdated, "duration_ns"),
    "chunk instantiate": (E.ChunkInstantiated, "duration_ns"),
    "update refused": (E.UpdateRefused, "duration_ns"),
}


@dataclass
class Summary:
    """Everything the report shows, as data. `counters` is Counters.snapshot() over the run's events."""

    header: RunHeader
    steps: int = 0                                      # steps finished
    step_modes: dict[str, int] = field(default_factory=dict)   # steps per worst mode (StepFinished.mode)
    keys: list[KeySummary] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Timing] = field(default_factory=dict)
    max_chunks: int = 0
    property_diff_fields: list[str] = field(default_factory=list)   # every field a PropertyDiff named
    property_diff_nodes: list[str] = field(default_factory=list)    # every first-differing node's name
    disabled_reasons: list[str] = field(default_factory=list)
    incompatible: list[str] = field(default_factory=list)           # "node 12 ffn_moe-0 (MUL_MAT_ID): rule"
    verify_checks: int = 0
    verify_mismatches: int = 0
    oracle_checks: int = 0                                # --oracle: steps checked against the numpy forward
    oracle_followed: int = 0                              # MoE tokens whose near-tie expert choice it took
    oracle_refused: int = 0                               # MoE tokens whose expert choice lay beyond the noise
    oracle_failures: int = 0
    oracle_max_rel_err: float = 0.0                       # max over the checks of max|a-b| / max|b|
    oracle_bound: float = 0.0                             # the largest bound of a check
    oracle_max_noise: float | None = None                 # Q8_1 runs: the largest noise-twin distance
    oracle_worst_share: float = 0.0                       # max over the checks of rel_err / bound
    oracle_nonfinite: int = 0                             # checks failed on NaN or inf logits (ours or the oracle's)
    ended: E.RunEnded | None = None                       # how the run ended (None: not recorded, cut short)
    accounting: Accounting = field(default_factory=Accounting)   # where the time goes (accounting.py)
    thrash: list[KeyThrash] = field(default_factory=list)  # keys alternating between graph variants
    graph_memory: GraphMemory = field(default_factory=GraphMemory)   # executables' device memory per key
    strict: list[str] = field(default_factory=list)       # what `run --strict` fails on (empty: clean)
    devices: DeviceReport | None = None                   # per device, on several (--devices N); else None
    faults: Faults = field(default_factory=Faults)        # failed steps, injected faults (failures.py)
    sinks_cut_off: list[str] = field(default_factory=list)   # outputs that failed mid-run: "NAME at step N: error"
    trace: list[str] = field(default_factory=list)         # a traced process's diagnoses (trace_checks.py)

    @property
    def diagnoses(self) -> dict[str, int]:
        """The numbers scenarios bound in [expect] (thrash_keys_min = 1, ...)."""
        gm = self.graph_memory
        return {"thrash_keys": len(self.thrash), "never_replayed": len(gm.never_replayed),
                "graph_bytes_peak": gm.peak_bytes, "stale_replays_prevented": gm.stale_replays_prevented,
                "strict_failures": len(self.strict), "unrecovered_failures": len(self.faults.unrecovered),
                "faults_missed": len(self.faults.missed)}

    @property
    def distinct_keys(self) -> int:
        return len(self.keys)

    @property
    def llama_counters(self) -> dict[str, int]:
        """The counters llama_perf_context_print reports. A trace: the graph reuses llama.cpp logged ("CUDA
        Graph id N reused"), none for a program that is not llama.cpp (no graph log lines, no llama_decode)."""
        c = self.counters
        trace = self.header.trace
        if trace:
            ggml = trace.get("graph_log_lines", c["uid_hits"]) or trace.get("decode_batches")
            return {"graphs reused (its log's uid hits)": c["uid_hits"]} if ggml else {}
        perf = self.header.llama.get("perf") if self.header.llama else None
        if perf:                              # real llama.cpp: its own totals (llama_perf_context)
            return {"graphs reused": int(perf.get("n_reused", 0))}
        return {"graphs reused": c["graphs_reused"], "graph reallocs (same size)": c["reallocs_same"],
                "graph reallocs (size changed)": c["reallocs_changed"]}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["header"] = self.header.to_dict()
        for k in d["keys"]:
            k["key"] = f"{k['key']:#x}"
        d["distinct_keys"] = self.distinct_keys
        d["llama_counters"] = self.llama_counters
        d["ended"] = self.ended.to_dict() if self.ended is not None else None
        d["timings_simulated"] = simulated_timings(self.header)
        d["gpu_time_source"] = gpu_time_source(self.header)     # what timings["step gpu"] measured
        d["diagnoses"] = self.diagnoses
        return d

    def to_json(self) -> str:
        """The `--json` output: stable key order, keys as hex strings."""
        return json.dumps(self.to_dict(), indent=2)


def summarize(header: RunHeader | dict[str, Any], events: Iterable[E.Event]) -> Summary:
    """Build the Summary of a run from its header (RunHeader or dict) and decision events (spans ignored)."""
    header = as_header(header)
    events = [e for e in events if not isinstance(e, (E.SpanBegin, E.SpanEnd))]
    counters = Counters()
    for ev in events:
        counters(ev)
    s = Summary(header=header, counters=counters.snapshot())
    s.steps = sum(isinstance(e, E.StepFinished) for e in events)
    s.step_modes = dict(Counter(e.mode for e in events if isinstance(e, E.StepFinished)))
    s.keys = _key_summaries(events)
    s.timings = _timings(events)
    s.max_chunks = max([e.n_chunks for e in events if isinstance(e, (E.CaptureRun, E.ReplayLaunched))],
                       default=0)
    s.property_diff_fields = sorted({e.field for e in events if isinstance(e, E.PropertyDiff)})
    s.property_diff_nodes = sorted({e.node_name for e in events if isinstance(e, E.PropertyDiff)})
    s.disabled_reasons = sorted({e.reason for e in events if isinstance(e, E.GraphsDisabled)})
    s.incompatible = sorted({f"node {e.node} {e.node_name} ({e.op}): {e.rule}"
                             for e in events if isinstance(e, E.Incompatible)})
    checks = [e for e in events if isinstance(e, E.VerifyResult)]
    s.verify_checks, s.verify_mismatches = len(checks), sum(not e.ok for e in checks)
    oracle = [e for e in events if isinstance(e, E.OracleCheck)]
    s.oracle_checks, s.oracle_failures = len(oracle), sum(not e.ok for e in oracle)
    s.oracle_max_rel_err = max((e.rel_err for e in oracle), default=0.0)
    s.oracle_bound = max((e.bound for e in oracle), default=0.0)
    noises = [e.noise for e in oracle if getattr(e, "noise", None) is not None]
    s.oracle_max_noise = max(noises) if noises else None
    s.oracle_worst_share = max((e.rel_err / e.bound for e in oracle if e.bound), default=0.0)
    s.oracle_nonfinite = sum(bool(e.nan or e.inf or e.ref_nan or e.ref_inf) for e in oracle)
    s.oracle_followed = sum(getattr(e, "followed", 0) for e in oracle)
    s.oracle_refused = sum(getattr(e, "refused", 0) for e in oracle)
    s.ended = next((e for e in reversed(events) if isinstance(e, E.RunEnded)), None)
    s.disabled_reasons = sorted({disabled_cause(header, r) for r in s.disabled_reasons})
    s.accounting = account(events)
    s.thrash = find_thrash(events)
    s.graph_memory = graph_memory(header.simulated, events)
    s.faults = faults(events)
    s.strict = strict_findings(events, s.thrash, s.graph_memory, s.faults)
    if header.trace:
        from .trace_checks import trace_findings
        s.trace = trace_findings(events, header.trace.get("reads", ()))
        s.strict += [f"trace: {x}" for x in s.trace]
    s.devices = device_report(events)
    s.sinks_cut_off = [f"{e.sink} at step {e.step}: {e.error}" for e in events if isinstance(e, E.SinkFailed)]
    return s


def disabled_cause(header: RunHeader, reason: str) -> str:
    """The runtime says the environment disabled graphs (it only sees the option); name the real source."""
    src = header.sources.get("graphs_disabled", "default")
    if not reason.startswith("env GGML_CUDA_DISABLE_GRAPHS") or src.startswith("env"):
        return reason
    if src == "cli":
        return "--no-graphs on the command line"
    if src == "scenario":
        return f"graphs_disabled = true in scenario {header.scenario}"
    return reason


def _key_summaries(events: list[E.Event]) -> list[KeySummary]:
    """One KeySummary per non-zero key, in order of first appearance."""
    keys: dict[int, KeySummary] = {}
    for ev in events:
        if not ev.key:
            continue
        ks = keys.get(ev.key)
        if ks is None:
            ks = keys[ev.key] = KeySummary(key=ev.key, first_step=ev.step, device=ev.device)
        if ev.split >= 0 and ev.split not in ks.splits:
            ks.splits.append(ev.split)
        ks.last_step = max(ks.last_step, ev.step)
        _count_into(ks, ev)
    return list(keys.values())


def _count_into(ks: KeySummary, ev: E.Event) -> None:
    match ev:
        case E.EagerRun():
            ks.steps_eager += 1
        case E.CaptureRun():
            ks.steps_capture += 1
            ks.chunks = ev.n_chunks
        case E.ReplayLaunched():
            ks.steps_replay += 1
            ks.chunks = ev.n_chunks
        case E.ChunkUpdated():
            ks.updates += 1
        case E.ChunkInstantiated():
            ks.instantiates += 1
        case E.UpdateRefused():
            ks.refusals[ev.reason] = ks.refusals.get(ev.reason, 0) + 1
        case E.WarmupTransition() if ev.to_state != "warm":
            ks.warmup_resets += 1
        case E.Evicted():
            ks.evictions += 1


def _timings(events: list[E.Event]) -> dict[str, Timing]:
    """Medians of split-step, per-chunk and per-step times (only names that have samples). An eager compute of
    0 ns was not timed (a trace or a watched llama.cpp sees a warmup reset in llama.cpp's log, not its host
    time): left out, so no median or replay speedup is made of it."""
    samples: dict[str, list[int]] = {}
    for name, (cls, attr) in TIMED.items():
        samples[name] = [getattr(e, attr) for e in events
                         if isinstance(e, cls) and not (cls is E.EagerRun and getattr(e, attr) == 0)]
    finished = [e for e in events if isinstance(e, E.StepFinished) and (e.duration_ns or e.mode != "eager")]
    for mode in ("eager", "capture", "replay", "cpu"):
        samples[f"step ({mode})"] = [e.duration_ns for e in finished if e.mode == mode]
    phase = {e.step: e.phase for e in events if isinstance(e, E.StepStarted)}
    samples["step (eager decode)"] = [e.duration_ns for e in finished
                                      if e.mode == "eager" and phase.get(e.step) == "decode"]
    samples["step"] = [e.duration_ns for e in finished]
    samples["step gpu"] = [e.gpu_ns for e in finished if e.gpu_ns]
    return {k: timing_of(v) for k, v in samples.items() if v}


def refusal_reasons(summary: Summary) -> list[str]:
    """Every update-refusal reason seen, sorted."""
    return sorted(summary.counters.get("refusals_by_reason", {}))

