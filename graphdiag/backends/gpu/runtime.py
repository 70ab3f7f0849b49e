"""ggml_backend_cuda_graph_compute, gate by gate, over a Driver; every decision is an event.

Gates (SPEC.md): 1 key = first node's struct address (lazy entries, 5 s / 10 s sweep); 2 identity ledger
(uid fast path, node count, property snapshot); 3 compatibility (MUL_MAT_ID needs-sync); 4 enablement
(GGML_CUDA_DISABLE_GRAPHS, compute capability < 7.0) and warmup; 5 the capture loop (capture.py);
6 update or instantiate per chunk (capture.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ... import events as E
from ...errors import InternalError
from ...release import releasing
from ...ir.graph import Graph
from ..drivers.base import Driver
from .compat import check_compatibility
from .entry import Clock, GraphCache, GraphEntry
from .ledger import changed_nodes, first_field_diff, props_digest, shape_digest, snapshot

CC_VOLTA = 700


def _digests(snap):
    """UidMiss's digests, worked out when the event is delivered (bus.emit's `complete`): a 1b prefill's
    460 KB ledger takes ~0.7 ms to hash on the H200 host, which would otherwise come before its first kernel.
    The snapshot is never written after it is taken (the entry keeps it as its ledger), so the digests are
    those of the graph the decision saw."""
    def complete(ev: E.UidMiss) -> None:
        object.__setattr__(ev, "props_digest", props_digest(snap))
        object.__setattr__(ev, "shape_digest", shape_digest(snap))
    return complete


@dataclass(frozen=True)
class RuntimeOptions:
    chunk_size: int = 0                  # > 0: the design article's chunked capture (upstream: one graph per split)
    fusion: bool = True
    concurrent_streams: bool = False
    graphs_disabled: bool = False        # GGML_CUDA_DISABLE_GRAPHS present in the environment
    pdl: bool = True                     # GGML_CUDA_PDL: programmatic dependent launch where cc >= 9.0
    upstream: str = "0c1e57098"          # the upstream commit whose rules the runtime follows (config.UPSTREAMS)
    pool_invalidation: bool = False      # the design article's rule: a pool flush invalidates every graph


class GraphRuntime:
    """The decision half of the GPU backend's graph_compute. `capture` executes what it decides."""

    def __init__(self, driver: Driver, bus: E.EventBus, options: RuntimeOptions, clock: Clock | None = None):
        self.driver = driver
        self.bus = bus
        self.opt = options
        self.clock = clock or Clock()
        self.cache = GraphCache(self.clock)
        self.step = -1
        self.device = 0          # the device this runtime's backend runs on: every event names it
        self.phases: set | None = None   # where the phases decided are added (the stepper's, for its step)

    def emit(self, cls, split: int, key: int, uid: int, complete=None, **kw) -> None:
        self.bus.emit(cls(step=self.step, split=split, key=key, uid=uid, t_ns=time.perf_counter_ns(),
                          device=self.device, **kw), complete)

    def _decided(self, split: int, key: int, uid: int, phase: str, why: str, clock_us: int) -> None:
        """emit(E.PhaseDecided, ...), posted (it comes every step: made when the sinks take it)."""
        if self.phases is not None:
            self.phases.add(phase)
        self.bus.post(E.PhaseDecided, self.step, split, key, uid, time.perf_counter_ns(), self.device, phase, why,
                      clock_us)

    # -- gate 1: the key --------------------------------------------------------------------------------
    def lookup(self, graph: Graph, split: int) -> GraphEntry:
        key = graph.first_node_addr
        entry, created, evicted = self.cache.lookup(key)
        for old, idle_us in evicted:
            with self.bus.span("evict", "graph/evict", len(old.instances), self.step, split, old.key, old.uid):
                n = self.destroy_instances(old, 0)      # counted before: destroying empties the entry
            self.emit(E.Evicted, split, old.key, old.uid, idle_ns=idle_us * 1000, n_chunks=n)
        if created:
            self.emit(E.KeyLookup, split, key, graph.uid, new_entry=True, n_nodes=graph.n_nodes)
        return entry

    def destroy_instances(self, entry: GraphEntry, first: int) -> int:
        """Destroy the entry's executables from `first` on (each tried: the first error raised once all
        were, none left in the entry); returns how many."""
        n = len(entry.instances) - first
        with releasing() as release:
            for inst in entry.instances[first:]:
                release(self.driver.exec_destroy, inst)
            del entry.instances[first:]
        return max(n, 0)

    # -- gate 4a: enablement ----------------------------------------------------------------------------
    def enabled(self, entry: GraphEntry, graph: Graph, split: int) -> bool:
        """ggml_cuda_graph_set_enabled (arch checked only while the entry has no instances) + is_enabled."""
        if not entry.instances and self.driver.cc < CC_VOLTA:
            entry.disable_due_to_gpu_arch = True
        if self.opt.graphs_disabled or entry.disable_due_to_gpu_arch:
            if "disabled" not in entry.reported:
                entry.reported.add("disabled")
                major, minor = self.driver.info.compute_capability
                why = ("env GGML_CUDA_DISABLE_GRAPHS is set" if self.opt.graphs_disabled
                       else f"compute capability {major}.{minor} < 7.0")
                self.emit(E.GraphsDisabled, split, entry.key, graph.uid, reason=why)
            return False
        return True

    # -- gate 3: compatibility --------------------------------------------------------------------------
    def compatible(self, entry: GraphEntry, graph: Graph, split: int) -> bool:
        """ggml_cuda_graph_check_compability. Its verdict is kept with the uid it was taken for: the same
        uid is the same graph (the fast path trusts that too), so a replayed step does not walk the nodes."""
        if graph.uid != 0 and entry.compat_uid == graph.uid:
            inc = entry.compat
        else:
            inc = check_compatibility(graph, self.driver.cc)
            entry.compat_uid, entry.compat = graph.uid, inc
        if inc is None:
            entry.reported.discard("incompatible")
            return True
        if "incompatible" not in entry.reported:      # once per transition, not a flood per step
            entry.reported.add("incompatible")
            node = graph.node(inc.node)
            self.emit(E.Incompatible, split, entry.key, graph.uid, node=inc.node, node_name=inc.node_name,
                      op=node.op.name, rule=inc.rule)
        return False

    # -- gate 2: the identity ledger --------------------------------------------------------------------
    def update_required(self, entry: GraphEntry, graph: Graph, split: int) -> bool:
        """ggml_cuda_graph_update_required: True when the graph differs from the recorded snapshot."""
        if graph.uid != 0 and graph.uid == entry.uid:
            if entry.n_nodes != graph.n_nodes:
                raise InternalError(f"CUDA graph uid {graph.uid} reused with {graph.n_nodes} nodes but "
                                    f"{entry.n_nodes} recorded (llama.cpp aborts: GGML_ASSERT node_props.size() "
                                    f"== n_nodes)")
            self.bus.post(E.UidHit, self.step, split, entry.key, graph.uid, time.perf_counter_ns(), self.device)
            return False
        old_uid, entry.uid = entry.uid, graph.uid
        snap = snapshot(graph.arena, graph.nodes)
        self.emit(E.UidMiss, split, entry.key, graph.uid, _digests(snap), old_uid=old_uid, n_nodes=len(snap),
                  first_ne=tuple(int(x) for x in snap["node"]["ne"][0]) if len(snap) else ())
        old = entry.props
        entry.props = snap
        if old is None or len(old) != len(snap):
            if old is not None:
                self.emit(E.NodeCountChanged, split, entry.key, graph.uid, old=len(old), new=len(snap))
            return True
        diff = changed_nodes(old, snap)
        if len(diff) == 0:
            return False
        d = first_field_diff(old, snap, int(diff[0]))
        self.emit(E.PropertyDiff, split, entry.key, graph.uid, node=d.node, node_name=d.node_name, op=d.op,
                  field=d.field, old=d.old, new=d.new, n_changed_nodes=len(diff),
                  changed=tuple(diff[:512].tolist()))
        return True

    # -- gates 2-4 together -----------------------------------------------------------------------------
    def decide(self, entry: GraphEntry, graph: Graph, split: int) -> tuple[bool, bool]:
        """(use_cuda_graph, cuda_graph_update_required) as graph_compute computes them."""
        use_graph = update = False
        key, uid = entry.key, graph.uid
        if not self.enabled(entry, graph, split):
            self._decided(split, key, uid, "eager", "graphs disabled", entry.last_used_us)
            return False, False
        if not self.compatible(entry, graph, split):
            self._decided(split, key, uid, "eager", "incompatible", entry.last_used_us)
            return False, False
        new_key = entry.props is None
        changed = self.update_required(entry, graph, split)
        if not entry.warmup_complete:
            if not changed:
                entry.warmup_complete = True
                use_graph = update = True
                self.emit(E.WarmupTransition, split, key, uid, from_state="cold", to_state="warm",
                          why="warmup complete: properties unchanged on a second call")
                why = "warmup complete"
            else:
                why = "first call for this key" if new_key else "warming up: properties changed"
        elif changed:
            entry.warmup_complete = False
            self.emit(E.WarmupTransition, split, key, uid, from_state="warm", to_state="cold",
                      why="warmup reset: properties changed")
            why = "warmup reset"
        else:
            use_graph = True
            update = not entry.instances
            why = "no executables" if update else "unchanged"
        phase = "replay" if use_graph and not update else "capture" if use_graph else "eager"
        self._decided(split, key, uid, phase, why, entry.last_used_us)
        return use_graph, update

    def invalidate_all(self, reason: str, nbytes: int) -> None:
        """Pool invalidation: clear every entry of the context (their executables are destroyed)."""
        with self.bus.span("invalidate", "graph/invalidate", 0, self.step):
            entries = self.cache.clear()
            n_captured = sum(self.destroy_instances(e, 0) for e in entries)
        self.emit(E.PoolInvalidated, -1, 0, 0, reason=reason, n_graphs=len(entries), n_captured=n_captured,
                  nbytes=nbytes)
