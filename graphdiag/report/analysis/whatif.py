"""What if the graph cache were keyed another way? Replays a record's graph sequence offline (pure).

Policies: `first-node` (llama.cpp's: the first node's struct address, as recorded), `first-node+shape`
(that address and the first node's ne: the fix proposed in llama.cpp #28652), `content-hash` (each
node's op, type and shapes, no addresses, as forks key). The replay applies the runtime's rules to every
recorded graph_compute call: the ledger (a call whose graph differs from the entry's last one), warmup
(a second identical call completes it, a change resets it), update or instantiate per chunk, the 5 s / 10 s
idle sweep on the recorded eviction clock, pool flushes where the record has them, and with `max_graphs`
an LRU cap on entries. Each device of a layer split has its own cache (keys, sweep, cap and pool flushes
per device), and its captures, replays and eager runs are counted apart. Update outcomes are the record's where it tried the same pair of graphs; otherwise
modelled (same shapes, or the same number of launches: updated; else refused), and counted as such.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ... import events as E
from ...errors import EventFileError, UsageError

POLICIES = ("first-node", "first-node+shape", "content-hash")
SWEEP_EVERY_US = 5_000_000       # as backends/gpu/entry.py (ggml's)
EVICT_AFTER_US = 10_000_000


@dataclass
class Call:
    """One graph_compute call of a GPU split, as recorded."""

    step: int
    split: int
    key: int
    clock_us: int
    forced: bool = False          # graphs disabled or split incompatible: eager under any key
    props: str = ""
    shape: str = ""
    first_ne: tuple = ()
    n_nodes: int = 0
    abandoned: bool = False       # the recorded capture was abandoned (a pool flush mid-capture)
    flush_after: bool = False     # a pool flush invalidated every graph during this call
    updates: dict = field(default_factory=dict)   # chunk -> update accepted (as recorded)
    n_launches: int = -1
    device: int = 0               # whose graph cache decided it


@dataclass
class Outcome:
    """What one policy did over the record's calls."""

    policy: str
    max_graphs: int = 0
    captures: int = 0
    instantiates: int = 0
    updates: int = 0
    update_refusals: int = 0
    replays: int = 0
    eager_runs: int = 0
    warmup_resets: int = 0
    evictions: int = 0
    distinct_keys: int = 0
    graphs_held_end: int = 0      # executables held at the end
    graphs_held_peak: int = 0
    modelled_updates: int = 0     # update outcomes not in the record (modelled)
    estimated_chunks: int = 0     # captures whose chunk count the record did not show
    devices: dict = field(default_factory=dict)   # device -> {captures, replays, eager_runs, distinct_keys}


@dataclass
class WhatIf:
    baseline: dict                # the recorded counters (captures, instantiates, ...)
    outcomes: list[Outcome]

    def to_dict(self, policy: str) -> dict:
        chosen = next(o for o in self.outcomes if o.policy == policy)
        return {"baseline": self.baseline, "policies": [asdict(o) for o in self.outcomes],
                "policy": policy, "baseline_captures": self.baseline["captures"], "captures": chosen.captures,
                "replays": chosen.replays, "baseline_replays": self.baseline["replays"]}


def recorded_calls(events) -> list[Call]:
    """The record's graph_compute calls, in order. EventFileError when it lacks the fingerprints."""
    calls: list[Call] = []
    last: dict[int, E.UidMiss] = {}
    miss: E.UidMiss | None = None
    for ev in events:
        match ev:
            case E.UidMiss():
                miss = last[ev.key] = ev
            case E.PhaseDecided():
                forced = ev.why in ("graphs disabled", "incompatible")
                m = miss if miss is not None and (miss.step, miss.split, miss.key) == (ev.step, ev.split, ev.key) \
                    else last.get(ev.key)
                if not forced and (m is None or not m.props_digest or not ev.clock_us):
                    raise EventFileError("the record lacks the graph fingerprints whatif needs (uid_miss "
                                         "digests, the eviction clock): record it again with this graphdiag")
                c = Call(ev.step, ev.split, ev.key, ev.clock_us, forced, device=ev.device)
                if m is not None and not forced:
                    c.props, c.shape, c.first_ne, c.n_nodes = m.props_digest, m.shape_digest, m.first_ne, m.n_nodes
                calls.append(c)
                miss = None
            case E.CaptureAbandoned() if calls:
                calls[-1].abandoned = True
            case E.PoolInvalidated() if calls:
                calls[-1].flush_after = True
            case E.ChunkUpdated() if calls:
                calls[-1].updates[ev.chunk] = True
            case E.UpdateRefused() if calls:
                calls[-1].updates[ev.chunk] = False
            case E.EagerRun() | E.CaptureRun() if calls:
                calls[-1].n_launches = ev.n_launches
    return calls


class _Entry:
    def __init__(self):
        self.props = ""
        self.warm = False
        self.instances: list[str] = []     # the shape digest each chunk's executable was captured from
        self.last_used = 0


class _Replay:
    """The runtime's rules over recorded calls, for one key policy."""

    def __init__(self, policy: str, max_graphs: int, chunks_of: dict, learned: dict, launches: dict,
                 chunk_size: int):
        self.o = Outcome(policy, max_graphs)
        self.policy, self.max_graphs = policy, max_graphs
        self.chunks_of, self.learned, self.launches, self.chunk_size = chunks_of, learned, launches, chunk_size
        self.entries: dict = {}           # (device, key) -> _Entry: one cache per device
        self.keys: set = set()
        self.last_sweep: dict[int, int] = {}
        self.held = 0

    def key(self, c: Call):
        if self.policy == "first-node" or not c.shape:
            return c.device, c.key
        return c.device, ((c.key, c.first_ne) if self.policy == "first-node+shape" else c.shape)

    def _count(self, c: Call, what: str) -> None:
        self.o.devices.setdefault(c.device, {"captures": 0, "replays": 0, "eager_runs": 0, "distinct_keys": 0})
        self.o.devices[c.device][what] += 1

    def _drop(self, e: _Entry) -> None:
        self.held -= len(e.instances)
        e.instances = []

    def lookup(self, c: Call) -> _Entry:
        now = c.clock_us
        if now - self.last_sweep.get(c.device, 0) >= SWEEP_EVERY_US:
            self.last_sweep[c.device] = now
            for k in [k for k, e in self.entries.items()
                      if k[0] == c.device and now - e.last_used >= EVICT_AFTER_US]:
                self._drop(self.entries.pop(k))
                self.o.evictions += 1
        k = self.key(c)
        if k not in self.keys:
            self.keys.add(k)
            self._count(c, "distinct_keys")
        e = self.entries.get(k)
        if e is None:
            mine = [x for x in self.entries if x[0] == c.device]
            if self.max_graphs and len(mine) >= self.max_graphs:
                lru = min(mine, key=lambda x: self.entries[x].last_used)
                self._drop(self.entries.pop(lru))
                self.o.evictions += 1
            e = self.entries[k] = _Entry()
        e.last_used = now
        return e

    def call(self, c: Call) -> None:
        o = self.o
        if c.forced:
            if self.policy == "first-node":
                self.lookup(c)
            o.eager_runs += 1
            self._count(c, "eager_runs")
            return self._flush(c)
        e = self.lookup(c)
        changed = e.props != c.props
        e.props = c.props
        capture = False
        if not e.warm:
            if not changed:
                e.warm = capture = True
        elif changed:
            e.warm = False
            o.warmup_resets += 1
        elif not e.instances:
            capture = True
        else:
            o.replays += 1
            self._count(c, "replays")
            return self._flush(c)
        if not capture or c.abandoned:
            o.eager_runs += 1
            self._count(c, "eager_runs")
            e.warm = e.warm and not c.abandoned
            return self._flush(c)
        self._capture(e, c)
        self._count(c, "captures")
        self._flush(c)

    def _capture(self, e: _Entry, c: Call) -> None:
        o = self.o
        o.captures += 1
        n = self.chunks_of.get(c.shape)
        if n is None:
            o.estimated_chunks += 1
            n = max(1, math.ceil(c.n_nodes / self.chunk_size)) if self.chunk_size > 0 else 1
        for i in range(n):
            if i < len(e.instances):
                ok = self._update_ok(e.instances[i], c.shape, i)
                if ok:
                    o.updates += 1
                else:
                    o.update_refusals += 1
                    o.instantiates += 1
            else:
                o.instantiates += 1
                self.held += 1
            if i < len(e.instances):
                e.instances[i] = c.shape
            else:
                e.instances.append(c.shape)
        self.held -= len(e.instances) - n
        del e.instances[n:]
        o.graphs_held_peak = max(o.graphs_held_peak, self.held)

    def _update_ok(self, old: str, new: str, chunk: int) -> bool:
        got = self.learned.get((old, new, chunk))
        if got is not None:
            return got
        if old == new:
            return True
        self.o.modelled_updates += 1
        a, b = self.launches.get(old), self.launches.get(new)
        return a is not None and a == b

    def _flush(self, c: Call) -> None:
        if c.flush_after:                 # the flushing device's context only
            for k in [k for k in self.entries if k[0] == c.device]:
                self._drop(self.entries.pop(k))

    def finish(self) -> Outcome:
        self.o.graphs_held_end = self.held
        self.o.distinct_keys = len(self.keys)
        return self.o


def _learn(calls: list[Call]) -> tuple[dict, dict, dict]:
    """Empty tables of chunks per shape and update outcomes (filled by _chunks), and launches per shape."""
    launches: dict = {}
    for c in calls:
        if not c.forced and c.n_launches >= 0:
            launches.setdefault(c.shape, c.n_launches)
    return {}, {}, launches


def what_if(events, policies=POLICIES, max_graphs: int = 0, chunk_size: int = 0) -> WhatIf:
    """Replay the record under each policy (first-node first: it should match the record). `chunk_size`:
    the record's (0: one graph per split, as upstream; N > 0: the article's chunks of N nodes)."""
    if max_graphs < 0:
        raise UsageError(f"--max-graphs must be >= 0, not {max_graphs}")
    for p in policies:
        if p not in POLICIES:
            raise UsageError(f"unknown key policy {p!r} (known: {', '.join(POLICIES)})")
    events = [e for e in events if not isinstance(e, (E.SpanBegin, E.SpanEnd))]
    calls = recorded_calls(events)
    if not calls:              # every count would be 0 under every policy: nothing was compared
        n = sum(isinstance(e, E.StepFinished) for e in events)
        raise EventFileError(f"no graph_compute calls of a GPU split to replay (the record has {n} finished "
                             f"step{'s' if n != 1 else ''}{'' if n else ': no run was recorded'})")
    chunks_of, learned, launches = _learn(calls)
    _chunks(events, calls, chunks_of, learned)
    outcomes = []
    for p in policies:
        r = _Replay(p, max_graphs, chunks_of, learned, launches, chunk_size)
        for c in calls:
            r.call(c)
        outcomes.append(r.finish())
    return WhatIf(_baseline(events), outcomes)


def _chunks(events, calls: list[Call], chunks_of: dict, learned: dict) -> None:
    """Chunk counts per shape from the record's captures and replays; and instantiates into fresh chunk
    slots mark what each executable was made from (for the outcomes learned above)."""
    by_call = {(c.step, c.split, c.key): c for c in calls if not c.forced}
    made: dict = {}
    for ev in events:
        if isinstance(ev, (E.CaptureRun, E.ReplayLaunched)):
            c = by_call.get((ev.step, ev.split, ev.key))
            if c is not None:
                chunks_of.setdefault(c.shape, ev.n_chunks)
        elif isinstance(ev, (E.ChunkInstantiated, E.ChunkUpdated, E.UpdateRefused)):
            c = by_call.get((ev.step, ev.split, ev.key))
            if c is None:
                continue
            if not isinstance(ev, E.ChunkInstantiated):
                old = made.get((ev.key, ev.chunk))
                if old is not None:
                    learned.setdefault((old, c.shape, ev.chunk), isinstance(ev, E.ChunkUpdated))
            made[(ev.key, ev.chunk)] = c.shape


def _baseline(events) -> dict:
    from ...counters import Counters
    cn = Counters()
    for ev in events:
        cn(ev)
    c = cn.snapshot()
    held: set = set()
    peak = 0
    for ev in events:
        match ev:
            case E.ChunkInstantiated():
                held.add((ev.key, ev.chunk))
                peak = max(peak, len(held))
            case E.ChunksDestroyed():
                held -= {(ev.key, i) for i in range(ev.first, ev.first + ev.count)}
            case E.Evicted():
                held = {kc for kc in held if kc[0] != ev.key}
            case E.PoolInvalidated():
                held = set()
    keys = {ev.key for ev in events if isinstance(ev, E.PhaseDecided)}
    return {"captures": c["captures"], "instantiates": c["instantiates"], "updates": c["updates"],
            "update_refusals": c["update_refusals"], "replays": c["replays"], "eager_runs": c["eager_runs"],
            "warmup_resets": c["warmup_resets"], "evictions": c["evictions"], "distinct_keys": len(keys),
            "graphs_held_end": len(held), "graphs_held_peak": peak}
