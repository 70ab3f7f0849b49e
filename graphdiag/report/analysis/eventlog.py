"""One line per decision, with a verbosity level: the event log of the live run and of `graphdiag report`.

Level 0 (default): phase transitions of each key and every recapture with its cause, e.g.
    step 257 · split 0 · key 0x5eed0000a8f0 · node 41 __fattn__-3 src[1].ne[1] 256→512 · warmup reset
plus evictions, pool invalidations and verify mismatches.
Level 1 (-v): chunk boundaries, fusions, concurrent regions, updates, instantiates, refusals with reasons,
property diffs (with the indices of the other changed nodes) that changed no phase, uid misses, context
rebuilds and scheduler reallocations.
Level 2 (-vv): every step, uid hit, lookup, launch and recorded capture ledger.
"""

from __future__ import annotations

from ... import events as E


def fmt_ns(ns: int) -> str:
    """A duration in µs, the unit of every table: 0.9 µs, 12.5 µs, 610.0 µs, 2700 µs; 11.0 s from a second on."""
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e3:.0f} µs"
    return f"{ns / 1e9:.1f} s"


def fmt_bytes(n: int) -> str:
    """Bytes as B / KiB / MiB / GiB."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def prefix(ev: E.Event) -> str:
    """'step S · split P · key 0x…' (only the parts the event has)."""
    parts = [f"step {ev.step}"]
    if ev.split >= 0:
        parts.append(f"split {ev.split}")
    if ev.key:
        parts.append(f"key {ev.key:#x}")
    return " · ".join(parts)


def _chunk(ev) -> str:
    return f"chunk {ev.chunk}"


def describe(ev: E.Event, gpu_label: str = "gpu") -> str:
    """What the event says, without the step/split/key prefix (stateless; diff uses it too). `gpu_label`
    names a step's GPU time (measured.gpu_phrase: what it is on the simulated driver)."""
    match ev:
        case E.StepStarted():
            return f"{ev.phase} · n_tokens {ev.n_tokens} · n_seqs {ev.n_seqs} · n_kv {ev.n_kv}"
        case E.StepFinished():
            gpu = f" ({gpu_label} {fmt_ns(ev.gpu_ns)})" if ev.gpu_ns else ""
            return f"done · {ev.mode or '-'} · {fmt_ns(ev.duration_ns)}{gpu}"
        case E.WeightsUploaded():
            return f"weights: {ev.n_bytes / 1e6:.1f} MB from {ev.source} uploaded in {fmt_ns(ev.duration_ns)}"
        case E.ContextDecision():
            return "graph reused" if ev.reused else f"graph rebuilt ({ev.reason})"
        case E.GraphSplit():
            each = ", ".join(f"{b} uid {u} ({n} nodes)" for b, u, n in zip(ev.backends, ev.uids, ev.n_nodes))
            return f"{ev.n_splits} split{'s' if ev.n_splits != 1 else ''}: {each}"
        case E.SchedRealloc():
            size = "same size" if ev.same_size else "size changed"
            return f"sched realloc ({size}) {fmt_bytes(ev.buffer_bytes)} {ev.backend}".rstrip()
        case E.KeyLookup():
            return f"{'new entry' if ev.new_entry else 'entry found'} ({ev.n_nodes} nodes)"
        case E.UidHit():
            return f"uid {ev.uid} hit"
        case E.UidMiss():
            return f"uid miss ({ev.old_uid} → {ev.uid})"
        case _:
            return _describe_gate(ev)


def _describe_gate(ev: E.Event) -> str:
    match ev:
        case E.NodeCountChanged():
            return f"node count {ev.old}→{ev.new}"
        case E.PropertyDiff():
            more = f" (+{ev.n_changed_nodes - 1} more nodes)" if ev.n_changed_nodes > 1 else ""
            return f"node {ev.node} {ev.node_name} {ev.field} {ev.old}→{ev.new}{more}"
        case E.Incompatible():
            return f"incompatible: node {ev.node} {ev.node_name} ({ev.op}): {ev.rule}"
        case E.GraphsDisabled():
            return f"graphs disabled: {ev.reason}"
        case E.WarmupTransition():
            return f"warmup {ev.from_state} → {ev.to_state} ({ev.why})"
        case E.PhaseDecided():
            return f"{ev.phase} ({ev.why})" if ev.why else ev.phase
        case E.Evicted():
            return f"evicted after {fmt_ns(ev.idle_ns)} idle ({ev.n_chunks} chunks destroyed)"
        case E.PoolInvalidated():
            return (f"pool invalidated ({ev.reason}): {ev.n_graphs} graphs cleared, "
                    f"{ev.n_captured} executables destroyed, {fmt_bytes(ev.nbytes)}")
        case E.VerifyResult():
            return f"verify {'ok' if ev.ok else 'MISMATCH'} · max |diff| {ev.max_abs_diff:.3g}"
        case E.OracleCheck():
            noise = "" if getattr(ev, "noise", None) is None else f", the model's rounding noise {ev.noise:.3g}"
            held = "".join(f" · {who} NaN {n}, inf {i} of {ev.values}" for who, n, i in
                           (("logits", ev.nan, ev.inf), ("oracle", ev.ref_nan, ev.ref_inf)) if n or i)
            return (f"oracle {'ok' if ev.ok else 'OVER BOUND'} · rel err {ev.rel_err:.3g} "
                    f"(bound {ev.bound:.3g}{noise}){held}")
        case E.RunEnded():
            why = f": {ev.reason}" if ev.reason else ""
            return f"run {ev.status} ({ev.steps_done} steps finished){why}"
        case E.SinkFailed():
            return f"{ev.sink} failed ({ev.error}): cut off, every other output still gets every event"
        case _:
            return _describe_failure(ev) or _describe_chunk(ev)


def _describe_failure(ev: E.Event) -> str:
    """describe() of the events of a failed step ("" for any other)."""
    match ev:
        case E.FaultInjected():
            return f"fault {ev.fault!r} injected: {ev.call} returned {ev.error}"
        case E.FaultMissed():
            return f"fault {ev.fault!r} armed but never fired (no {ev.calls} in this step)"
        case E.StepFailed():
            how = "rolled back, the run goes on" if ev.recoverable else "the run ends"
            return f"{ev.phase} step FAILED ({ev.error}) · llama_decode returns {ev.status} · {how}"
        case E.CellsRemoved():
            return (f"KV cells removed: seq {ev.seq} pos [{ev.pos_min}, +inf) ({ev.n_cells} cell"
                    f"{'s' if ev.n_cells != 1 else ''})")
        case E.EntryReset():
            ended = "capture ended, " if ev.capture_ended else ""
            return f"graph released after the failure: {ended}{ev.n_executables} executable(s) destroyed, warmup reset"
    return ""


def _describe_refused(ev: E.ConcurrentRefused) -> str:
    if ev.fork_node < 0:
        return f"concurrent streams off for this split: {ev.reason}"
    join = f" → join node {ev.join_node}" if ev.join_node >= 0 else ""
    what = f"{ev.cleared} concurrent regions dropped" if ev.cleared else "no concurrent region"
    return f"{what}: fork node {ev.fork_node} {ev.fork_name}{join} · {ev.reason}"


def _describe_chunk(ev: E.Event) -> str:
    match ev:
        case E.FusionApplied():
            return f"fusion {ev.pattern} at node {ev.node} (+{ev.absorbed} absorbed)"
        case E.ConcurrentRegion():
            sizes = ", ".join(str(n) for n in ev.branch_sizes)
            return (f"concurrent region: fork node {ev.fork_node} {ev.fork_name} → join node {ev.join_node}"
                    f" · {ev.n_branches} branches ({sizes} nodes)")
        case E.ConcurrentRefused():
            return _describe_refused(ev)
        case E.ConcurrentRace():
            more = f" (+{ev.n_pairs - 1} more pairs)" if ev.n_pairs > 1 else ""
            return (f"concurrent region races: fork node {ev.fork_node} {ev.fork_name} → join node {ev.join_node}"
                    f" · {ev.writer} (stream {ev.writer_stream}) shares bytes with {ev.other} (stream "
                    f"{ev.other_stream}){more}, no event between them; the validity check passed it "
                    f"(llama.cpp runs it so too)")
        case E.ChunkBoundary():
            moved = f" (moved by {ev.moved_by})" if ev.moved_by else ""
            return f"{_chunk(ev)} · nodes {ev.start_node}–{ev.end_node - 1}{moved}"
        case E.ChunkCaptured():
            return f"{_chunk(ev)} captured · {ev.n_graph_nodes} graph nodes · {fmt_ns(ev.capture_ns)}"
        case E.ChunkInstantiated():
            again = " after refusal" if ev.after_refusal else ""
            return f"{_chunk(ev)} instantiated{again} · {fmt_ns(ev.duration_ns)}"
        case E.ChunkUpdated():
            return f"{_chunk(ev)} updated in place · {fmt_ns(ev.duration_ns)}"
        case E.UpdateRefused():
            at = f" at {ev.error_node}" if ev.error_node else ""
            return f"{_chunk(ev)} update refused: {ev.reason}{at} · {fmt_ns(ev.duration_ns)}"
        case E.ChunksDestroyed():
            return f"chunks {ev.first}–{ev.first + ev.count - 1} destroyed (graph got shorter)"
        case E.EagerRun():
            return f"eager · {ev.n_launches} launches · {fmt_ns(ev.duration_ns)}"
        case E.CaptureRun():
            return f"captured and ran {ev.n_chunks} chunks · {fmt_ns(ev.duration_ns)}"
        case E.ReplayLaunched():
            return f"replay · {ev.n_chunks} chunks · {fmt_ns(ev.duration_ns)}"
        case E.LedgerCaptured():
            return f"ledger: {len(ev.nodes)} nodes recorded"
        case _:
            return ev.kind


def property_diff_line(ev: E.PropertyDiff, most: int = 8) -> str:
    """describe() of a PropertyDiff, naming up to `most` of the other changed nodes when the event lists
    them: 'node 3 inp_embd ne[1] 16→1 (+95 more nodes: 4, 5, 7, …)'."""
    others = [i for i in ev.changed if i != ev.node]
    if ev.n_changed_nodes <= 1 or not others:
        return describe(ev)
    shown = ", ".join(map(str, others[:most])) + (", …" if ev.n_changed_nodes - 1 > most else "")
    return describe(ev).replace(" more nodes)", f" more nodes: {shown})")


# Fixed levels; PhaseDecided, WarmupTransition and the cause events are decided in EventLog.
LEVEL = {
    E.WeightsUploaded: 0, E.Evicted: 0, E.PoolInvalidated: 0, E.SinkFailed: 0, E.FaultInjected: 0, E.FaultMissed: 0, E.StepFailed: 0,
    E.CellsRemoved: 1, E.EntryReset: 0,
    E.ContextDecision: 1, E.SchedRealloc: 1, E.GraphSplit: 1, E.UidMiss: 1, E.FusionApplied: 2,
    E.ConcurrentRegion: 1, E.ConcurrentRefused: 1, E.ConcurrentRace: 0, E.ChunkBoundary: 1, E.ChunkInstantiated: 1, E.ChunkUpdated: 1,
    E.UpdateRefused: 1, E.ChunksDestroyed: 1, E.WarmupTransition: 1, E.NodeCountChanged: 1,
    E.PropertyDiff: 1, E.Incompatible: 1, E.GraphsDisabled: 1,
    E.StepStarted: 2, E.StepFinished: 2, E.KeyLookup: 2, E.UidHit: 2, E.ChunkCaptured: 2, E.EagerRun: 2,
    E.CaptureRun: 2, E.ReplayLaunched: 2, E.LedgerCaptured: 2,
}
CAUSES = (E.PropertyDiff, E.NodeCountChanged, E.Incompatible, E.GraphsDisabled)


class EventLog:
    """Turns events into (level, line) pairs. Keeps per key the last phase, the pending cause and
    whether a warmup reset happened, so a phase transition is one line that says why."""

    def __init__(self):
        self.gpu_label = "gpu"                # what a step's GPU time is called (set from the run header)
        self.phase: dict[int, str] = {}
        self.cause: dict[int, str] = {}
        self.reset: set[int] = set()

    def feed(self, ev: E.Event) -> list[tuple[int, str]]:
        """The lines this event produces (possibly none)."""
        if isinstance(ev, (E.SpanBegin, E.SpanEnd)):
            return []
        if isinstance(ev, E.PhaseDecided):
            return self._phase(ev)
        if isinstance(ev, E.WeightsUploaded):          # before step 0: no step to name
            return [(LEVEL[E.WeightsUploaded], describe(ev))]
        if isinstance(ev, CAUSES) and ev.key:
            self.cause.setdefault(ev.key, describe(ev))
        elif isinstance(ev, E.WarmupTransition) and ev.to_state != "warm":
            self.reset.add(ev.key)
        elif isinstance(ev, E.PoolInvalidated):
            self.phase.clear()
        elif isinstance(ev, E.Evicted):
            self.phase.pop(ev.key, None)
        elif isinstance(ev, (E.VerifyResult, E.OracleCheck)):
            return [(1 if ev.ok else 0, f"{prefix(ev)} · {describe(ev)}")]
        elif isinstance(ev, E.RunEnded):
            return [(2 if ev.status == "complete" else 0, f"{prefix(ev)} · {describe(ev)}")]
        if isinstance(ev, E.PropertyDiff):
            return [(LEVEL[E.PropertyDiff], f"{prefix(ev)} · {property_diff_line(ev)}")]
        if isinstance(ev, E.StepFinished):
            return [(LEVEL[E.StepFinished], f"{prefix(ev)} · {describe(ev, self.gpu_label)}")]
        return [(LEVEL.get(type(ev), 2), f"{prefix(ev)} · {describe(ev)}")]

    def _phase(self, ev: E.PhaseDecided) -> list[tuple[int, str]]:
        prev = self.phase.get(ev.key)
        self.phase[ev.key] = ev.phase
        cause = self.cause.pop(ev.key, "")
        reset = ev.key in self.reset
        self.reset.discard(ev.key)
        head = prefix(ev)
        if reset:
            return [(0, f"{head} · {cause} · warmup reset" if cause else f"{head} · warmup reset")]
        if prev != ev.phase:
            # the cause line already says why when it starts with the same word ("incompatible: node ...")
            why = f" · {ev.why}" if ev.why and not cause.startswith(ev.why) else ""
            tail = f" · {cause}" if cause else ""
            return [(0, f"{head} · {prev or 'new'} → {ev.phase}{why}{tail}")]
        level = 2 if ev.phase == "replay" else 1
        return [(level, f"{head} · {describe(ev)}")]
