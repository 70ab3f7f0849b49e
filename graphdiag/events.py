"""Every decision is an event: small frozen dataclasses, an in-process bus, JSON round-trip.

Each event carries the step, the split index, the graph key (first node's struct address, 0 where none),
the split's uid and an integer-ns timestamp (time.perf_counter_ns unless a clock is injected), and the
device whose graph runtime took it (0 on one device; written to a record only when not 0, so one-device
records read as before and records written before there was a device field load with device 0).
Sinks (counters, the terminal report, the JSON-lines record, NVTX, diff) subscribe to the bus.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

SCHEMA_VERSION = 1

EVENT_TYPES: dict[str, type["Event"]] = {}


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"
    step: int = -1
    split: int = -1
    key: int = 0
    uid: int = 0
    t_ns: int = 0
    device: int = 0

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        EVENT_TYPES[cls.kind] = cls

    def to_dict(self) -> dict[str, Any]:
        # the instance dict holds exactly the fields, in field order (both __init__s fill it so, and events
        # are frozen): one copy instead of a getattr per field; device goes last, and only when set
        d = {"kind": self.kind, **self.__dict__}    # tuples serialise as JSON arrays
        device = d.pop("device")
        if device:
            d["device"] = device
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Event":
        cls = EVENT_TYPES.get(d.get("kind", ""))
        if cls is None:
            raise KeyError(f"unknown event kind {d.get('kind')!r}")
        kw = {f.name: _tuplify(d[f.name]) for f in dataclasses.fields(cls) if f.name in d}
        return cls(**kw)


def _tuplify(v):
    """JSON lists back to the tuples events hold (recursively)."""
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


# -- run / step level ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepStarted(Event):
    kind: ClassVar[str] = "step_started"
    phase: str = "decode"          # "prefill" | "decode"
    n_tokens: int = 0
    n_seqs: int = 0
    n_kv: int = 0


@dataclass(frozen=True)
class StepFinished(Event):
    kind: ClassVar[str] = "step_finished"
    duration_ns: int = 0           # host wall time of the step, synchronised
    gpu_ns: int = 0                # GPU time of the step's GPU splits (CUDA events), 0 where unmeasured
    tokens: tuple = ()             # greedy tokens produced, one per sequence
    mode: str = ""                 # worst phase any GPU split took: "eager" | "capture" | "replay" | "cpu"


@dataclass(frozen=True)
class RunEnded(Event):
    """The last event of every run: how it ended. `step` is the step in progress when it stopped (the step
    after the last one when complete); status: "complete" | "interrupted" | "failed"; reason: why it
    stopped ("" when complete): "Ctrl-C", the CUDA error, "output closed (broken pipe)"."""
    kind: ClassVar[str] = "run_ended"
    STATUSES: ClassVar[tuple[str, ...]] = ("complete", "interrupted", "failed")
    status: str = "complete"
    steps_done: int = 0            # steps finished
    reason: str = ""


@dataclass(frozen=True)
class FaultInjected(Event):
    """A fault the scenario asked for (`{ at_step = N, fault = KIND }`) fired: the driver call `call` of this
    step returned `error` (the result the driver would return) instead of running. kind: "launch" |
    "capture" | "instantiate" | "update" | "oom"."""
    kind: ClassVar[str] = "fault_injected"
    fault: str = ""
    call: str = ""                 # "cuGraphLaunch", "cuStreamEndCapture", ...
    error: str = ""                # "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", ...


@dataclass(frozen=True)
class FaultMissed(Event):
    """A fault armed for this step never fired: the step made no driver call of that kind."""
    kind: ClassVar[str] = "fault_missed"
    fault: str = ""
    calls: str = ""                # the calls it waited for ("cuGraphExecUpdate")


@dataclass(frozen=True)
class CellsRemoved(Event):
    """A failed ubatch's KV cells freed, as llama_decode's failure path does (memory->seq_rm(seq, pos_min,
    -1), logged by llama.cpp as "removing memory module entries for seq_id = S, pos = [P, +inf)")."""
    kind: ClassVar[str] = "cells_removed"
    seq: int = 0
    pos_min: int = 0
    n_cells: int = 0


@dataclass(frozen=True)
class EntryReset(Event):
    """A graph entry released after a step that failed while it computed: its executables destroyed (an
    unfinished capture ended first) and its warmup reset, so the key warms up again."""
    kind: ClassVar[str] = "entry_reset"
    n_executables: int = 0
    capture_ended: bool = False
    reason: str = ""


@dataclass(frozen=True)
class StepFailed(Event):
    """A step that did not finish: `error` is what failed ("cuGraphLaunch: CUDA_ERROR_..."), `fault` the
    injected fault behind it ("" for a real failure), `status` llama_decode's return (-2: allocation failed,
    -3: compute failed). `recoverable`: the run goes on with the next step (the step was rolled back); a
    sticky CUDA error, or anything but a CUDA error, ends the run."""
    kind: ClassVar[str] = "step_failed"
    error: str = ""
    fault: str = ""
    status: int = -3
    recoverable: bool = False
    phase: str = "decode"          # "prefill" | "decode"


@dataclass(frozen=True)
class ContextDecision(Event):
    kind: ClassVar[str] = "context"
    reused: bool = False
    reason: str = ""               # why not reused: "first graph", "n_tokens 1→2", "reuse disabled", ...


@dataclass(frozen=True)
class GraphSplit(Event):
    kind: ClassVar[str] = "graph_split"
    n_splits: int = 0
    backends: tuple = ()           # backend name per split
    uids: tuple = ()               # uid per split
    n_nodes: tuple = ()            # node count per split
    devices: tuple = ()            # device per split (-1: the CPU backend); () on one device, as older records


@dataclass(frozen=True)
class DeviceLayout(Event):
    """The layer split of a run on several devices (llama.cpp --split-mode layer), once before step 0."""
    kind: ClassVar[str] = "device_layout"
    names: tuple = ()              # device name per device
    layers: tuple = ()             # device of each repeating layer, then of the output layer
    split_points: tuple = ()       # cumulative normalised shares (float32, as llama.cpp's `splits`)
    shares_from: str = ""          # "--tensor-split" | "free memory"
    simulated: bool = False


@dataclass(frozen=True)
class PeerLink(Event):
    """How split inputs go from `device` to `to_device`: "peer" (direct, peer access enabled) or "host"
    (read back to the host, written to the other device); `reason` says why."""
    kind: ClassVar[str] = "peer_link"
    to_device: int = 0
    mode: str = "host"
    reason: str = ""


@dataclass(frozen=True)
class SchedRealloc(Event):
    kind: ClassVar[str] = "sched_realloc"
    same_size: bool = True
    buffer_bytes: int = 0
    backend: str = ""


# -- the six gates ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyLookup(Event):
    kind: ClassVar[str] = "key_lookup"
    new_entry: bool = False
    n_nodes: int = 0


@dataclass(frozen=True)
class Evicted(Event):
    kind: ClassVar[str] = "evicted"
    idle_ns: int = 0
    n_chunks: int = 0


@dataclass(frozen=True)
class GraphsDisabled(Event):
    kind: ClassVar[str] = "graphs_disabled"
    reason: str = ""               # "env GGML_CUDA_DISABLE_GRAPHS", "compute capability 6.1 < 7.0"


@dataclass(frozen=True)
class Incompatible(Event):
    kind: ClassVar[str] = "incompatible"
    node: int = -1
    node_name: str = ""
    op: str = ""
    rule: str = ""                 # which needs-sync rule fired


@dataclass(frozen=True)
class UidHit(Event):
    kind: ClassVar[str] = "uid_hit"


@dataclass(frozen=True)
class UidMiss(Event):
    """The graph was not the entry's last one (by uid): its ledger was taken. The digests identify the
    graph offline (thrash detection, whatif): props_digest covers every ledger byte (equal digests: the
    ledger comparison finds no change), shape_digest each node's op, type, ne and sources' ne (no addresses);
    first_ne is the first node's ne (what a key of first node + shape adds)."""
    kind: ClassVar[str] = "uid_miss"
    old_uid: int = 0
    n_nodes: int = 0
    props_digest: str = ""
    shape_digest: str = ""
    first_ne: tuple = ()


@dataclass(frozen=True)
class NodeCountChanged(Event):
    kind: ClassVar[str] = "node_count_changed"
    old: int = 0
    new: int = 0


@dataclass(frozen=True)
class PropertyDiff(Event):
    """The first differing node of a changed graph and the exact field, with old and new values."""
    kind: ClassVar[str] = "property_diff"
    node: int = -1
    node_name: str = ""
    op: str = ""
    field: str = ""                # "ne[1]", "op_params", "data", "src[0].data", "src[1].nb[2]", "name", ...
    old: str = ""
    new: str = ""
    n_changed_nodes: int = 0
    changed: tuple = ()            # indices of every changed node (at most 512)


@dataclass(frozen=True)
class LedgerCaptured(Event):
    """The node-property ledger a capture was taken from, one row per node, for node-level diffs between
    runs or steps. Each row: (index, name, op, type, ne, nb, op_params digest, flags, data, sources), where
    addresses are written as `bN+0xOFF` (N: the backend buffer's allocation order) so runs compare."""
    kind: ClassVar[str] = "ledger_captured"
    nodes: tuple = ()


@dataclass(frozen=True)
class WarmupTransition(Event):
    kind: ClassVar[str] = "warmup"
    from_state: str = ""           # "cold" | "warm"
    to_state: str = ""
    why: str = ""                  # "warmup complete" | "warmup reset: properties changed" | ...


@dataclass(frozen=True)
class PhaseDecided(Event):
    kind: ClassVar[str] = "phase"
    phase: str = ""                # "eager" | "capture" | "replay" | "disabled" | "incompatible"
    why: str = ""
    clock_us: int = 0              # the eviction clock at this key's lookup (µs; modelled on the sim driver)


@dataclass(frozen=True)
class FusionApplied(Event):
    kind: ClassVar[str] = "fusion"
    node: int = -1
    pattern: str = ""              # "rms_norm+mul", "mul_mat_vec+glu", "rope+view+set_rows"
    absorbed: int = 0              # following nodes skipped


@dataclass(frozen=True)
class ConcurrentRegion(Event):
    kind: ClassVar[str] = "concurrent_region"
    fork_node: int = -1
    join_node: int = -1
    fork_name: str = ""
    n_branches: int = 0
    branch_sizes: tuple = ()


@dataclass(frozen=True)
class ChunkBoundary(Event):
    kind: ClassVar[str] = "chunk_boundary"
    chunk: int = 0
    start_node: int = 0            # first node of the chunk
    end_node: int = 0              # one past the last node
    moved_by: str = ""             # "" | "concurrent region" | "fusion" (boundary later than chunk_end)


@dataclass(frozen=True)
class ChunkCaptured(Event):
    kind: ClassVar[str] = "chunk_captured"
    chunk: int = 0
    n_graph_nodes: int = 0         # CUDA graph nodes captured
    capture_ns: int = 0


@dataclass(frozen=True)
class ChunkInstantiated(Event):
    kind: ClassVar[str] = "chunk_instantiated"
    chunk: int = 0
    duration_ns: int = 0
    after_refusal: bool = False
    mem_bytes: int = 0             # device memory the executable took: free memory before - after (cuMemGetInfo;
                                   # modelled on the simulated driver)


@dataclass(frozen=True)
class ChunkUpdated(Event):
    kind: ClassVar[str] = "chunk_updated"
    chunk: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class UpdateRefused(Event):
    kind: ClassVar[str] = "update_refused"
    chunk: int = 0
    reason: str = ""               # UpdateResult name, e.g. "TOPOLOGY_CHANGED"
    error_node: str = ""
    duration_ns: int = 0


@dataclass(frozen=True)
class CaptureAbandoned(Event):
    """A capture ended and dropped before it completed (the pool invalidated every graph meanwhile);
    the split finished eagerly from node `node`'s chunk."""
    kind: ClassVar[str] = "capture_abandoned"
    chunk: int = 0
    node: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ChunksDestroyed(Event):
    kind: ClassVar[str] = "chunks_destroyed"
    first: int = 0
    count: int = 0


@dataclass(frozen=True)
class EagerRun(Event):
    kind: ClassVar[str] = "eager_run"
    n_launches: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class CaptureRun(Event):
    kind: ClassVar[str] = "capture_run"
    n_chunks: int = 0
    n_launches: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class ReplayLaunched(Event):
    kind: ClassVar[str] = "replay"
    n_chunks: int = 0
    duration_ns: int = 0


@dataclass(frozen=True)
class PoolInvalidated(Event):
    kind: ClassVar[str] = "pool_invalidated"
    reason: str = ""               # "alloc failure" | "free into full pool"
    n_graphs: int = 0              # entries cleared
    n_captured: int = 0            # executables destroyed
    nbytes: int = 0


@dataclass(frozen=True)
class VerifyResult(Event):
    kind: ClassVar[str] = "verify"
    ok: bool = True
    max_abs_diff: float = 0.0


@dataclass(frozen=True)
class OracleCheck(Event):
    """A step's logits against the independent numpy forward (relative error: max|a-b| / max|b|)."""
    kind: ClassVar[str] = "oracle"
    ok: bool = True
    rel_err: float = 0.0
    bound: float = 0.0


@dataclass(frozen=True)
class DeviceTime(Event):
    """A step's device activity, from CUPTI's records (source "cupti") or the simulated driver's modelled
    timeline (source "modelled"). busy_ns: time at least one kernel ran; span_ns: first kernel start to
    last kernel end; idle_ns = span_ns - busy_ns (the device waiting between kernels); memcpy_ns: copy time.
    top: (kernel, graphdiag node labels, ns, count) per kernel function of the step, most time first.
    attributed: kernels named by the graphdiag node(s) they compute."""
    kind: ClassVar[str] = "device_time"
    source: str = ""
    n_kernels: int = 0
    busy_ns: int = 0
    span_ns: int = 0
    idle_ns: int = 0
    n_memcpy: int = 0
    memcpy_ns: int = 0
    attributed: int = 0
    top: tuple = ()


@dataclass(frozen=True)
class SinkFailed(Event):
    """An observer (the terminal report, the timeline, NVTX, a caller's sink) raised at `step`: it was cut
    off alone and gets nothing more; the run went on and every other sink got every event. sink: its name
    (sink_name); error: the exception, "Type: message"."""
    kind: ClassVar[str] = "sink_failed"
    sink: str = ""
    error: str = ""


@dataclass(frozen=True)
class SpanBegin(Event):
    """Start of a timed scope (step, context, split compute, eager, warmup, chunk capture, update,
    instantiate, replay, eviction, invalidation). Only sinks subscribed with spans=True receive spans."""
    kind: ClassVar[str] = "span_begin"
    name: str = ""                 # a fixed string per kind of scope (registered once by NVTX)
    category: str = ""             # slash path, e.g. "graph/capture"
    payload: int = 0               # a number: uid, chunk index, node index...


@dataclass(frozen=True)
class SpanEnd(Event):
    kind: ClassVar[str] = "span_end"
    name: str = ""
    category: str = ""


class _NullSpan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL_SPAN = _NullSpan()


def _fast_init(cls: type) -> None:
    """Give a frozen event class an __init__ that fills the instance dict directly. The dataclass one calls
    object.__setattr__ once per field (~2 µs for a ten-field event, six events per replayed step); this one
    takes the same parameters in the same order with the same defaults, and the class stays frozen (no
    assignment after construction, same eq and hash)."""
    fs = dataclasses.fields(cls)
    if any(f.default is dataclasses.MISSING or not f.init for f in fs):
        return                               # required or non-init fields: keep the dataclass __init__
    params = ", ".join(f"{f.name}=_d{i}" for i, f in enumerate(fs))
    body = "; ".join(f"d[{f.name!r}] = {f.name}" for f in fs)
    ns = {f"_d{i}": f.default for i, f in enumerate(fs)}
    exec(f"def __init__(self, {params}):\n    d = self.__dict__; {body}", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init


class _Span:
    __slots__ = ("bus", "name", "category", "payload", "step", "split", "key", "uid")

    def __init__(self, bus, name, category, payload, step, split, key, uid):
        self.bus, self.name, self.category, self.payload = bus, name, category, payload
        self.step, self.split, self.key, self.uid = step, split, key, uid

    def __enter__(self):
        self.bus._emit_span(SpanBegin(step=self.step, split=self.split, key=self.key, uid=self.uid,
                                      t_ns=self.bus.clock(), name=self.name, category=self.category,
                                      payload=self.payload))
        return self

    def __exit__(self, *exc):
        self.bus._emit_span(SpanEnd(step=self.step, split=self.split, key=self.key, uid=self.uid,
                                    t_ns=self.bus.clock(), name=self.name, category=self.category))
        return False


def sink_name(sink) -> str:
    """What a report calls a sink: its `sink_name` (or its object's, for a bound method), else its type's."""
    owner = getattr(sink, "__self__", sink)
    name = getattr(owner, "sink_name", None)
    return name if isinstance(name, str) else getattr(sink, "__qualname__", type(sink).__name__)


def _cut_off_by(e: BaseException, essential: bool) -> bool:
    """Whether a sink that raised `e` is cut off alone (True) or its error goes on to end the run: an
    essential sink's (the record on a full disk), a closed output's (BrokenPipeError: the reader went
    away) and Ctrl-C/SIGTERM/exit (not Exception) end it, once every other sink has the event."""
    return isinstance(e, Exception) and not essential and not isinstance(e, BrokenPipeError)


class EventBus:
    """Synchronous publish/subscribe. `emit` stamps t_ns (from `clock`) when the event has none.

    Decision events go to every sink; span events only to sinks subscribed with spans=True, and `span()`
    is a shared no-op when there are none (nothing costly on hot paths).

    Held delivery keeps the observers off a step's critical path: between `hold()` and `release()` the
    decision events for plain sinks (record, counters, terminal, JSON lines) are queued, stamped as they
    happen, and handed over in order at `flush()` — which the context calls once the step's work is
    queued on the device, so the sinks run while the GPU computes (`post` even defers making the event).
    Internal sinks (the run's own state) and span sinks (NVTX ranges and marks, timelines, which
    are about *when*) always get every event at once. An internal sink may name the event types it takes
    (`kinds`): it is then handed only those (and their subclasses), in subscription order with the
    others; the bus works out each type's internal sinks once, not a call per sink per event.

    No event is lost to a failing sink. A plain or span sink that raises is cut off alone (unsubscribed,
    `on_sink_error` told once, a SinkFailed event sent to the others) and the rest still get every event.
    An essential sink's error (subscribe(essential=True): the record, the run's own state), a closed
    output (BrokenPipeError) or an interrupt is raised once every other sink has the event, and at
    flush() once the whole queue is delivered. Internal sinks' errors go out at once (the run's own state
    is wrong). The guards cost nothing until a sink raises (Python 3.11's zero-cost try)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns):
        self._sinks: tuple[Callable[[Event], None], ...] = ()
        self._span_sinks: tuple[Callable[[Event], None], ...] = ()
        self._internal: list[tuple[Callable[[Event], None], tuple[type, ...] | None]] = []
        self._routes: dict[type, tuple] = {}     # event type -> the internal sinks it goes to
        self._held: list[Event] | None = None
        self._holds = 0                          # hold() calls not yet released: holds nest
        self.clock = clock
        self._essential: set = set()             # sinks whose errors end the run (the record)
        self.cut_off: list = []                  # sinks that raised and were cut off, in order
        self._late: list[Event] = []             # SinkFailed events to send once the current one is delivered
        self.on_sink_error: Callable[[SinkFailed], None] | None = None

    def subscribe(self, sink: Callable[[Event], None], spans: bool = False, internal: bool = False,
                  kinds: tuple[type, ...] | None = None, essential: bool = False) -> Callable[[Event], None]:
        """Add a sink. essential: its errors end the run (see the class) instead of cutting it off."""
        if kinds is not None and not internal:
            raise ValueError("only internal sinks take `kinds`")
        if internal:
            self._internal.append((sink, tuple(kinds) if kinds is not None else None))
            self._routes.clear()
        elif spans:                              # tuples: a delivery loop is never changed under it
            self._span_sinks = (*self._span_sinks, sink)
        else:
            self._sinks = (*self._sinks, sink)
        if essential:
            self._essential.add(sink)
        return sink

    def unsubscribe(self, sink) -> None:
        self._sinks = tuple(s for s in self._sinks if s != sink)
        self._span_sinks = tuple(s for s in self._span_sinks if s != sink)
        self._internal = [(s, k) for s, k in self._internal if s != sink]
        self._routes.clear()

    def _route(self, cls: type) -> tuple:
        """The internal sinks events of type `cls` go to, in subscription order (worked out once)."""
        got = self._routes[cls] = tuple(s for s, kinds in self._internal if kinds is None or issubclass(cls, kinds))
        return got

    def emit(self, ev: Event, complete: Callable[[Event], None] | None = None) -> None:
        """Deliver `ev`. `complete(ev)`, when given, fills in fields that cost time to work out and that only
        observers read (UidMiss's digests): it runs before the first sink sees the event. For held plain
        sinks that is at flush(), once the step's work is queued on the device; with no plain sink it never
        runs. An internal or span sink for the event, or an unheld bus, has it run at once."""
        if ev.t_ns == 0:
            # stamped in place: the event was just made by its emitter, nobody else holds it yet (a
            # dataclasses.replace per event cost ~5 µs on the replay path)
            object.__setattr__(ev, "t_ns", self.clock())
        route = self._routes.get(type(ev))
        if route is None:
            route = self._route(type(ev))
        if complete is not None and (route or self._held is None or self._span_sinks):
            complete(ev)
            complete = None
        for s in route:
            s(ev)
        if self._held is not None:
            self._held.append(ev if complete is None else (ev, complete))
            if self._span_sinks:
                self._deliver(self._span_sinks, ev)
        else:
            self._deliver((*self._sinks, *self._span_sinks), ev)

    def _deliver(self, sinks: tuple, ev: Event) -> None:
        """Hand `ev` to each of `sinks`; one that raises is cut off or its error raised after the others."""
        raised = None
        for s in sinks:
            try:
                s(ev)
            except BaseException as e:
                raised = self._sink_raised(s, e, ev, raised)
        while self._late:                        # a sink was cut off: the others hear of it, in order
            self._deliver((*self._sinks, *self._span_sinks), self._late.pop(0))
        if raised is not None:
            raise raised

    def _sink_raised(self, sink, e: BaseException, ev: Event, raised: BaseException | None):
        """Cut `sink` off for `e`, or keep `e` to raise (the first such error wins)."""
        if not _cut_off_by(e, sink in self._essential):
            return raised if raised is not None else e
        self.cut_off.append(sink)
        self.unsubscribe(sink)
        failed = SinkFailed(step=ev.step, t_ns=self.clock(), sink=sink_name(sink), error=f"{type(e).__name__}: {e}")
        if self.on_sink_error is not None:
            self.on_sink_error(failed)
        (self._held if self._held is not None else self._late).append(failed)
        return raised

    def guarded(self, sink, step: int, *args) -> None:
        """sink(*args) for one of a sink's side channels (a timeline's device records of `step`) under the
        bus's rules, its owner (a bound method's object) with it: skipped once cut off, cut off if it raises."""
        owner = getattr(sink, "__self__", sink)
        if owner in self.cut_off:
            return
        try:
            sink(*args)
        except Exception as e:
            if not _cut_off_by(e, owner in self._essential):
                raise
            self._sink_raised(owner, e, Event(step=step), None)
            while self._late:
                self._deliver((*self._sinks, *self._span_sinks), self._late.pop(0))

    def post(self, cls: type, *fields, complete: Callable[[Event], None] | None = None) -> None:
        """emit(cls(*fields), complete), the fields in declaration order (t_ns stamped by the caller), for
        the events of every replayed step: when the event would only be queued (the bus held, no internal
        or span sink for its type), its fields are queued instead and the event is made when flush() hands
        it over, once the step's work is queued on the device. The sinks see the same event either way."""
        route = self._routes.get(cls)
        if route is None:
            route = self._route(cls)
        if route or self._held is None or self._span_sinks:
            self.emit(cls(*fields), complete)
        else:
            self._held.append((cls, fields, complete))

    def hold(self) -> None:
        """Queue plain sinks' events until flush() or the matching release(); holds nest (a run holds
        across its steps, each step holds within it)."""
        self._holds += 1
        if self._held is None:
            self._held = []

    def flush(self) -> None:
        """Deliver the queued events, in order (completing those emitted with `complete`), and keep holding.
        A sink's error that ends the run is raised once the whole queue is delivered to the others."""
        raised = None
        while self._held:
            pending, self._held = self._held, []
            sinks = self._sinks
            if not sinks:
                continue                 # nobody to deliver to: nothing to complete either
            for ev in pending:
                if type(ev) is tuple:
                    if len(ev) == 2:     # (event, complete): emitted with fields still to fill in
                        ev, complete = ev
                    else:                # (type, fields, complete): posted, made now
                        cls, fields, complete = ev
                        ev = cls(*fields)
                    if complete is not None:
                        complete(ev)
                for s in sinks:
                    try:
                        s(ev)
                    except BaseException as e:
                        raised = self._sink_raised(s, e, ev, raised)
                        sinks = self._sinks          # the next events skip a sink cut off
        if raised is not None:
            raise raised

    def release(self) -> None:
        """End one hold; the outermost delivers what is queued and stops holding (a sink that fails leaves
        the bus unheld all the same)."""
        self._holds = max(self._holds - 1, 0)
        if self._holds:
            return
        try:
            self.flush()
        finally:
            self._held = None

    def span(self, name: str, category: str, payload: int = 0, step: int = -1, split: int = -1,
             key: int = 0, uid: int = 0):
        """Context manager bracketing a timed scope with SpanBegin/SpanEnd (no-op without span sinks)."""
        if not self._span_sinks:
            return _NULL_SPAN
        return _Span(self, name, category, payload, step, split, key, uid)

    def _emit_span(self, ev: Event) -> None:
        self._deliver(self._span_sinks, ev)


class Recorder:
    """A sink that keeps every event (for tests, reports and the JSON-lines writer)."""

    def __init__(self):
        self.events: list[Event] = []

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)

    def of(self, *types) -> list[Event]:
        return [e for e in self.events if isinstance(e, types)]


for _cls in (Event, *EVENT_TYPES.values()):
    _fast_init(_cls)
