"""The GPU backend (ggml_backend_cuda): buffers on the driver, graph_compute through the graph runtime."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from ... import events as E
from ...errors import GraphdiagError
from ...release import releasing
from ...memory import aligned
from ...ir.graph import Graph
from ..base import Backend, InputStage
from ..drivers.base import Driver
from .capture import CaptureLoop, LoweredOps, lower_graph
from .concurrency import Region, invalid_reason, races, scan
from .entry import Clock, GraphEntry
from .fusion import fusion_plan, launching_nodes, moe_alloc_deps
from .launch_memo import LaunchMemo
from .lowering import refuse_ops_after
from .ledger_rows import AddressNamer, ledger_rows
from .pool import TempPool
from .runtime import CC_VOLTA, GraphRuntime, RuntimeOptions

MAX_STREAMS = 8


@dataclass
class ConcurrentEvents:
    """The backend's concurrent events (ggml_cuda_stream_context): the split's node order before and
    after graph_optimize's interleave, its regions, and whether graph_compute has checked them yet."""
    original: np.ndarray
    interleaved: np.ndarray
    regions: list[Region]
    checked: bool = False


class GpuBackend(Backend):
    is_gpu = True
    alignment = 128               # ggml_backend_cuda_buffer_type_get_alignment

    def __init__(self, driver: Driver, bus: E.EventBus, options: RuntimeOptions, clock: Clock | None = None,
                 pool_cap: int | None = None, pool_max_buffers: int = 256, name: str | None = None):
        self.name = name or ("SIM0" if driver.simulated else "CUDA0")
        self.driver = driver
        self.bus = bus
        self.runtime = GraphRuntime(driver, bus, options, clock)
        driver.set_pdl(options.pdl)
        self.loop = CaptureLoop(self)
        self._pool_args = (pool_cap, pool_max_buffers)
        self.pools: dict[int, TempPool] = {}  # one per stream, as ggml's pools[device][stream]
        self.capture_aborted = False          # set when a pool ended the capture in progress
        self.eager_run: list | None = None    # launches an eager run holds back (CaptureLoop.run_eager)
        self.stream0 = driver.stream_create()
        self.streams = [self.stream0]
        self.fork_event = driver.event_create()
        self.join_events: list = []
        self.concurrent: ConcurrentEvents | None = None   # the regions of the split optimised last
        self.n_devices = 1                    # devices this process uses
        self.buffers: set[int] = set()
        self._pending_host: list[np.ndarray] = []   # host sources of queued copies
        self.sync_epoch = 0                         # synchronize() calls so far
        self.inputs_sent_epoch = [-1, -1]           # per input slot: sync_epoch when a stage last sent
        self._pinned: dict[str, np.ndarray] = {}    # page-locked host buffers by use, grown, never shrunk
        self._read_view: tuple | None = None        # (read buffer, bytes, its slice, read-only view) of tensor_read
        self.force_eager = False
        self.addresses = AddressNamer()       # buffer allocation order, for comparable ledger rows
        self.launch_memo = LaunchMemo()       # lowered launches of unchanged nodes, across graphs
        self._timers: list[tuple] = []        # every (start, end) pair of timing events made (close destroys them)
        self._free_timers: list[tuple] = []   # pairs not held by a GpuTime still to be read
        self._timed: list[tuple] = []         # pairs recorded since the last take_gpu_time
        self._timed_epoch = -1                # sync_epoch when the last timer was recorded

    # -- temporary pools ----------------------------------------------------------------------------------
    def pool_of(self, stream) -> TempPool:
        """The temporary pool of `stream` (ggml_backend_cuda_context::pool(): one per device and stream, so
        branches on concurrent streams never hand each other a buffer still in use). Under the article's
        rule (RuntimeOptions.pool_invalidation) any pool's flush invalidates every graph of the context."""
        key = id(stream)
        pool = self.pools.get(key)
        if pool is None:
            invalidate = self.runtime.invalidate_all if self.runtime.opt.pool_invalidation else None
            pool = TempPool(self.driver, invalidate, *self._pool_args)
            pool.before_flush = self.end_capture_for_pool
            pool.on_alloc = self.addresses.add
            pool.on_free = self.addresses.remove
            self.pools[key] = pool
        return pool

    @property
    def pool(self) -> TempPool:
        """Stream 0's pool (where every node runs outside concurrent regions)."""
        return self.pool_of(self.stream0)

    # -- buffers and tensors --------------------------------------------------------------------------------
    def buffer_alloc(self, nbytes: int) -> int:
        addr = self.driver.mem_alloc(nbytes)
        self.buffers.add(addr)
        self.addresses.add(addr)
        return addr

    def buffer_free(self, addr: int) -> None:
        self.buffers.discard(addr)
        self.addresses.remove(addr)
        self.driver.mem_free(addr)

    def tensor_set(self, addr: int, data: np.ndarray) -> None:
        """Ordered on stream 0 before the work that reads it; no synchronisation per input (the host array
        is kept alive until the next synchronize, in case the driver copies it lazily)."""
        data = np.ascontiguousarray(data)
        self.driver.memcpy_htod(addr, data, self.stream0)
        self._pending_host.append(data)

    def input_stage(self, layout: tuple[tuple[int, int], ...], slot: int = 0, grow: int = 0) -> InputStage:
        return _PinnedStage(self, layout, slot, grow)

    def pinned(self, use: str, nbytes: int, reserve: int = 0) -> np.ndarray:
        """`nbytes` of the page-locked host buffer kept for `use` ("inputs0/1", "read"): made on first need and
        grown by doubling, or to `reserve` bytes when that is more, so steps allocate nothing and a rebuilt
        graph takes the same memory. The inputs reserve what the batch's mask takes at n_ctx cells, as
        llama.cpp sizes its input buffers for the worst case when the context is made: pinning 2-4 MB took
        1-2 ms of a 1b prefill's host time on the GPU host, each time n_kv grew past the buffer."""
        buf = self._pinned.get(use)
        if buf is None or buf.nbytes < nbytes:
            buf = self._pinned[use] = self.driver.host_alloc(max(nbytes, reserve, 4096,
                                                                  2 * (buf.nbytes if buf is not None else 0)))
        return buf[:nbytes]

    def tensor_get(self, addr: int, nbytes: int) -> np.ndarray:
        """A copy read after all queued work (tensor_read's bytes, copied)."""
        return self.tensor_read(addr, nbytes).copy()

    def tensor_read(self, addr: int, nbytes: int) -> np.ndarray:
        """Read after all queued work: into the page-locked read buffer on stream 0, then the streams are
        waited for (ggml_backend_tensor_get_async + synchronize, as llama.cpp reads its outputs into its
        pinned output buffer). The buffer itself, read-only, valid until the next read."""
        kept = self._read_view         # the same views while the buffer and the size stay
        if kept is None or kept[0] is not self._pinned.get("read") or kept[1] != nbytes:
            buf = self.pinned("read", nbytes)
            view = buf.view()
            view.flags.writeable = False
            kept = self._read_view = (self._pinned["read"], nbytes, buf, view)
        self.driver.memcpy_dtoh(kept[2], addr, self.stream0)
        self.synchronize()
        return kept[3]

    def synchronize(self) -> None:
        for s in self.streams:
            self.driver.stream_synchronize(s)
        self._pending_host.clear()
        self.sync_epoch += 1

    # -- concurrency (graph_optimize) -------------------------------------------------------------------
    def graph_optimize(self, graph: Graph, split: int, alloc_deps: dict[int, list[int]] | None = None,
                       reserve: bool = False) -> None:
        """ggml_backend_cuda_graph_optimize, called by the scheduler for each GPU split at every alloc:
        the allocation dependencies of the fusions that ask for them (0c1e57098, fusion on), the key's lookup
        (its last use stamped), then the concurrent regions.

        At 0c1e57098 (#27301) every MoE weighted reduction the split holds keeps its experts, router weights
        and scale alive until its output has run (alloc_deps: output slot -> kept slots), so the allocator
        never places the output over them and the fusion's memory-range check passes.

        With GGML_CUDA_GRAPH_OPT=1 the backend's one map of concurrent events is reset at every call (so,
        as upstream, only the split optimised last keeps its regions), then filled when graphs are enabled
        (and, at d99724f2, the process sees one CUDA device). Each region's nodes are interleaved in
        `graph` (the scheduler allocates in that order, as ggml-alloc walks upstream's).

        A `reserve` graph (the context's worst-case reserve) gets its allocation dependencies only: llama.cpp
        builds those graphs in a metadata buffer of their own, so its lookup there makes an entry under a key
        no step uses, and the regions it forms are reset by the next optimize (a 512-token prompt forms none)."""
        opt = self.runtime.opt
        if alloc_deps is not None and opt.fusion and opt.upstream != "d99724f2":
            moe_alloc_deps(graph, alloc_deps)
        if reserve:
            return
        if graph.n_nodes:
            # ggml_cuda_graph_set_enabled's lookup, made whatever GGML_CUDA_GRAPH_OPT says: at every alloc the
            # split's key is stamped as used now (it may run the 5 s sweep and create the entry)
            self.runtime.lookup(graph, split)
        if not opt.concurrent_streams:
            return
        self.concurrent = None
        if opt.graphs_disabled or self.driver.cc < CC_VOLTA or graph.n_nodes == 0:
            return
        visible = self.driver.visible_devices()
        if opt.upstream == "d99724f2" and visible > 1:
            self._refused(graph, split, reason=f"{visible} CUDA devices visible (d99724f2 needs exactly one)")
            return
        regions, refused = scan(graph)
        for f in refused:
            self._refused(graph, split, f.fork, f.join, f.reason)
        original = graph.nodes.copy()
        for r in regions:
            graph.nodes[r.fork + 1:r.join] = r.interleaved
            self.bus.emit(E.ConcurrentRegion(step=self.runtime.step, split=split, key=graph.first_node_addr,
                                             uid=graph.uid, t_ns=time.perf_counter_ns(), device=self.runtime.device, fork_node=r.fork,
                                             join_node=r.join, fork_name=graph.node(r.fork).name,
                                             n_branches=r.n_branches, branch_sizes=r.branch_sizes()))
        if regions:
            # stored with the split's node lists: graph_optimize runs before the splits get their uids
            self.concurrent = ConcurrentEvents(original, graph.nodes.copy(), regions)
        need = 1 + max((r.n_branches for r in regions), default=0)
        while len(self.streams) < min(need, MAX_STREAMS):
            self.streams.append(self.driver.stream_create())
            self.join_events.append(self.driver.event_create())

    def _refused(self, graph: Graph, split: int, fork: int = -1, join: int = -1, reason: str = "",
                 cleared: int = 0) -> None:
        name = graph.node(fork).name if fork >= 0 else ""
        self.bus.emit(E.ConcurrentRefused(step=self.runtime.step, split=split, key=graph.first_node_addr,
                                          uid=graph.uid, t_ns=time.perf_counter_ns(), device=self.runtime.device,
                                          fork_node=fork,
                                          join_node=join, fork_name=name, reason=reason, cleared=cleared))

    def _regions_for(self, graph: Graph, split: int) -> list[Region]:
        """The regions to launch on their streams in this evaluation or capture (graph_compute's check,
        before any node runs): at the first after graph_optimize, every region is checked on the allocated
        addresses; all valid, the split gets its original order back (so fusions within a stream match);
        one invalid, every region is dropped and the interleaved order runs on stream 0."""
        got = self.concurrent
        if got is None:
            return []
        if not got.checked and np.array_equal(got.interleaved, graph.nodes):
            got.checked = True
            for r in got.regions:
                why = invalid_reason(graph, r)
                if why:
                    self._refused(graph, split, r.fork, r.join, why, cleared=len(got.regions))
                    self.concurrent = None
                    return []
            graph.nodes[:] = got.original
            opt = self.runtime.opt
            plan = fusion_plan(graph, self.driver.cc, launching_nodes(graph), opt.upstream) if opt.fusion else {}
            for r in got.regions:
                pairs = races(graph, r, plan)
                if pairs:
                    (a, sa, b, sb) = pairs[0]
                    self.bus.emit(E.ConcurrentRace(
                        step=self.runtime.step, split=split, key=graph.first_node_addr, uid=graph.uid,
                        t_ns=time.perf_counter_ns(), device=self.runtime.device, fork_node=r.fork,
                        join_node=r.join, fork_name=graph.node(r.fork).name, writer=a, writer_stream=sa,
                        other=b, other_stream=sb, n_pairs=len(pairs)))
        return got.regions if got.checked and np.array_equal(got.original, graph.nodes) else []

    def fork(self, r: Region) -> None:
        self.driver.event_record(self.fork_event, self.stream0)
        for s in range(1, r.n_branches + 1):
            self.driver.stream_wait_event(self.streams[s], self.fork_event)

    def join(self, r: Region) -> None:
        for s in range(1, r.n_branches + 1):
            self.driver.event_record(self.join_events[s - 1], self.streams[s])
            self.driver.stream_wait_event(self.stream0, self.join_events[s - 1])

    # -- graph_compute ----------------------------------------------------------------------------------
    def _lowered(self, entry, graph: Graph, split: int) -> tuple[dict, list]:
        """Fusion plan and lowered launches, rebuilt only when the graph identity (uid) changed. The plan is
        made (and reported) whole; the ops are lowered as the evaluation reaches them (LoweredOps) and
        prepared on the driver right before their first run (all of them before a capture), so an eager
        step's first kernels start while the host still lowers and packs the rest."""
        if entry.lowered is None or entry.lowered_uid != graph.uid or graph.uid == 0:
            launches = launching_nodes(graph)
            opt = self.runtime.opt
            refuse_ops_after(graph, opt.upstream)
            plan = fusion_plan(graph, self.driver.cc, launches, opt.upstream) if opt.fusion else {}
            entry.plan, entry.lowered = plan, LoweredOps(graph, plan, self.driver.cc, launches, self.launch_memo,
                                                      self.driver.nsm)
            entry.lowered_uid = graph.uid
            for i, f in sorted(plan.items()):
                self.runtime.emit(E.FusionApplied, split, entry.key, graph.uid, node=i, pattern=f.pattern,
                                  absorbed=f.absorbed)
        return entry.plan, entry.lowered

    @contextlib.contextmanager
    def verifying(self):
        """Run the next computes eagerly with fresh launches and no decisions (--verify's recompute)."""
        self.force_eager = True
        try:
            yield
        finally:
            self.force_eager = False

    def _compute_unrecorded(self, graph: Graph, split: int) -> None:
        entry = GraphEntry(graph.first_node_addr)
        opt = self.runtime.opt
        refuse_ops_after(graph, opt.upstream)
        plan = fusion_plan(graph, self.driver.cc, upstream=opt.upstream) if opt.fusion else {}
        lowered = lower_graph(graph, plan, self.driver.cc, nsm=self.driver.nsm)   # no memo: lowered afresh
        # no decisions are taken here (eager, nothing captured), but what the pool does while the
        # recompute runs (an invalidation) is reported on the bus like anything else
        self.loop.evaluate(entry, graph, split, False, False, lowered, plan, [])

    def graph_compute(self, graph: Graph, split: int) -> None:
        rt = self.runtime
        if graph.n_nodes == 0:
            return
        if self.force_eager:
            return self._compute_unrecorded(graph, split)
        if self._free_timers:
            pair = self._free_timers.pop()
        else:
            pair = (self.driver.event_create(timing=True), self.driver.event_create(timing=True))
            self._timers.append(pair)
        self.driver.event_record(pair[0], self.stream0)
        try:
            self._compute(graph, split)
        finally:
            self.driver.event_record(pair[1], self.stream0)
            self._timed.append(pair)
            self._timed_epoch = self.sync_epoch

    def take_gpu_time(self) -> "GpuTime":
        """The GPU time (CUDA events on stream 0) of the splits computed since the last call, to be read
        later: the runner reads a step's once the next step's work is queued, so the two event queries
        are not between a read-back and the next launch. The events stay the GpuTime's until it is read
        (a later step times itself with other events)."""
        t = GpuTime(self, self._timed, self._timed_epoch)
        self._timed = []
        return t

    def collect_gpu_ns(self) -> int:
        """take_gpu_time(), read now."""
        return self.take_gpu_time().read()

    def _compute(self, graph: Graph, split: int) -> None:
        rt = self.runtime
        with self.bus.span("graph_compute", "graph/compute", graph.uid, rt.step, split, graph.first_node_addr,
                           graph.uid):
            entry = rt.lookup(graph, split)
            try:
                self._decide_and_run(entry, graph, split)
            except BaseException as e:
                self._release_failed(entry, graph, split, e)
                raise

    def _decide_and_run(self, entry, graph: Graph, split: int) -> None:
        rt = self.runtime
        use_graph, update = rt.decide(entry, graph, split)
        t0 = time.perf_counter_ns()
        if use_graph and not update:
            with self.bus.span("replay", "graph/replay", len(entry.instances), rt.step, split, entry.key,
                               graph.uid):
                n = self.loop.replay(entry)
            t1 = time.perf_counter_ns()   # posted, not through rt.emit's keywords: it comes every step
            self.bus.post(E.ReplayLaunched, rt.step, split, entry.key, graph.uid, t1, rt.device, n, t1 - t0)
            return
        regions = self._regions_for(graph, split)     # may restore the order fusion is planned on
        plan, lowered = self._lowered(entry, graph, split)
        # eager while warming up a key (graphs enabled, entry cold) is labelled "warmup" in timelines
        cold = not entry.warmup_complete and not use_graph and entry.props is not None
        name = "capture" if use_graph else ("warmup" if cold else "eager")
        with self.bus.span(name, f"graph/{name}", graph.uid, rt.step, split, entry.key, graph.uid):
            n_chunks, n_launches = self.loop.evaluate(entry, graph, split, use_graph, update, lowered,
                                                      plan, regions)
        dt = time.perf_counter_ns() - t0
        if use_graph and self.capture_aborted:
            self.capture_aborted = False
            entry.warmup_complete = False
            rt.emit(E.EagerRun, split, entry.key, graph.uid, n_launches=n_launches, duration_ns=dt)
        elif use_graph:
            rt.emit(E.CaptureRun, split, entry.key, graph.uid, n_chunks=n_chunks, n_launches=n_launches,
                    duration_ns=dt)
            rt.emit(E.LedgerCaptured, split, entry.key, graph.uid, nodes=ledger_rows(entry.props, self.addresses))
        else:
            rt.emit(E.EagerRun, split, entry.key, graph.uid, n_launches=n_launches, duration_ns=dt)

    def end_capture_for_pool(self) -> None:
        """The pool is about to free device memory. An eager run of launches not yet made
        (CaptureLoop.run_eager) is launched first: its buffers are still held. Under the article's rule the
        pool then invalidates every graph ("invalidate everything"): a capture in progress cannot survive
        that, so it is ended and dropped first (nothing leaks); the capture loop then finishes the split
        eagerly and the entry warms up again. Upstream's pool ends no capture: its synchronise inside a
        capture fails it, as the driver decides."""
        run = self.eager_run
        if run:
            self.driver.launch_batch(self.stream0, run)
            run.clear()
        if self.runtime.opt.pool_invalidation and self.driver.is_capturing(self.stream0):
            self.capture_aborted = True
            try:
                self.driver.graph_destroy(self.driver.end_capture(self.stream0))
            except GraphdiagError:
                pass                     # an invalidated capture ends in an error: nothing left to destroy

    def _release_failed(self, entry, graph: Graph, split: int, error: BaseException) -> None:
        """A failure while the split computed (a launch, a capture, an instantiate or update that failed):
        a capture in progress is ended and dropped so the streams stay usable, and the entry's executables
        are destroyed and its warmup reset — what they hold is a half-made step's — so the key warms up
        again. Upstream ggml aborts on any CUDA error (CUDA_CHECK); this is what a runtime that survives the
        error has to do before the next decode, and it is reported (EntryReset)."""
        entry.warmup_complete = False
        ended = False
        if self.driver.is_capturing(self.stream0):
            ended = True
            self.capture_aborted = False
            try:
                self.driver.graph_destroy(self.driver.end_capture(self.stream0))
            except GraphdiagError:
                pass                     # an invalidated capture ends in an error: nothing left to destroy
        n = 0
        try:
            n = self.runtime.destroy_instances(entry, 0)
        finally:
            why = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            self.runtime.emit(E.EntryReset, split, entry.key, graph.uid, n_executables=n, capture_ended=ended,
                              reason=why)

    def close(self) -> None:
        """Release the executables, the pools, the buffers, the events and the streams: each one tried even
        when one before it fails, the first error raised once all were."""
        with releasing() as release:
            for e in self.runtime.cache.clear():
                release(self.runtime.destroy_instances, e, 0)
            for pool in self.pools.values():
                release(pool.close)
            self.pools.clear()
            for addr in list(self.buffers):
                release(self.buffer_free, addr)
            for ev in [self.fork_event, *self.join_events, *(e for pair in self._timers for e in pair)]:
                release(self.driver.event_destroy, ev)
            for s in self.streams:
                release(self.driver.stream_destroy, s)
            self.streams = []


class GpuTime:
    """GPU time of some computed splits, read once when first asked: synchronises unless that happened after
    its last timer was recorded (the step's read-back waited already), then gives its events back."""

    __slots__ = ("backend", "pairs", "epoch", "ns")

    def __init__(self, backend: GpuBackend, pairs: list[tuple], epoch: int):
        self.backend, self.pairs, self.epoch = backend, pairs, epoch
        self.ns: int | None = None

    def read(self) -> int:
        if self.ns is None:
            be = self.backend
            if self.pairs and self.epoch == be.sync_epoch:
                be.synchronize()
            self.ns = int(sum(be.driver.event_elapsed_ms(a, b) for a, b in self.pairs) * 1e6)
            be._free_timers.extend(self.pairs)
            self.pairs = []
        return self.ns

    def discard(self) -> None:
        """A failed step's timers: given back unread (the step has no GPU time to report)."""
        self.backend._free_timers.extend(self.pairs)
        self.pairs, self.ns = [], 0

    def fill(self, ev) -> None:
        """bus.emit's `complete` for a StepFinished emitted before its GPU time was read. A device error on
        the way (a later step failed and the run is ending with that error, which the sinks get next)
        leaves the time unmeasured (0) rather than replacing the error being reported."""
        try:
            ns = self.read()
        except GraphdiagError:
            ns = 0
        object.__setattr__(ev, "gpu_ns", ns)


class GpuTimes:
    """Several backends' GpuTime, read as their sum (a run over several GPUs)."""

    __slots__ = ("times",)

    def __init__(self, times: list[GpuTime]):
        self.times = times

    def read(self) -> int:
        return sum(t.read() for t in self.times)

    def discard(self) -> None:
        for t in self.times:
            t.discard()

    fill = GpuTime.fill


class _PinnedStage(InputStage):
    """A graph's inputs in the backend's page-locked input buffer, laid out as on the device: tensors whose
    allocator blocks are adjacent (the allocator places a graph's inputs first, one aligned block after
    another) share a run; the runs go to the device as one batch of asynchronous copies on stream 0
    (Driver.copies_prepare, once per stage); the padding between blocks is each block's own. The grouping is
    worked out once per graph. Each of the two slots has its own buffer; a later
    stage of the same slot takes the same memory (one graph's inputs are live at a time), so writing waits
    for whichever stage of the slot sent last."""

    def __init__(self, backend: GpuBackend, layout: tuple[tuple[int, int], ...], slot: int = 0, grow: int = 0):
        self.backend, self.layout, self.slot = backend, layout, slot
        runs = _copy_runs(layout, backend.alignment)
        need = sum(aligned(total) for _, total, _ in runs)
        buf = backend.pinned(f"inputs{slot}", need, need + aligned(grow) if grow else 0)
        self.views: list[np.ndarray] = [buf[:0]] * len(layout)
        sends: list[tuple[int, np.ndarray]] = []
        off = 0
        for start, total, members in runs:
            run = buf[off: off + total]
            sends.append((start, run))
            for i, at in members:
                self.views[i] = run[at: at + layout[i][1]]
            off += aligned(total)
        self._copies = backend.driver.copies_prepare(sends)

    def writable(self) -> list[np.ndarray]:
        be = self.backend
        if be.sync_epoch == be.inputs_sent_epoch[self.slot]:   # its last copies may still be reading
            be.synchronize()
        return self.views

    def send(self) -> None:
        be = self.backend
        be.driver.copies_issue(self._copies, be.stream0)
        be.inputs_sent_epoch[self.slot] = be.sync_epoch


def _copy_runs(layout: tuple[tuple[int, int], ...], alignment: int) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Group (addr, nbytes) items, by address, into runs of adjacent allocator blocks (`alignment`: the graph
    allocator's): (start, bytes to copy, [(item index, offset in the run)]) per run."""
    order = sorted(range(len(layout)), key=lambda i: layout[i][0])
    runs: list[tuple[int, int, list[tuple[int, int]]]] = []
    end = None
    for i in order:
        addr, nbytes = layout[i]
        if runs and addr == end:
            start, _, members = runs[-1]
            members.append((i, addr - start))
            runs[-1] = (start, addr - start + nbytes, members)
        else:
            runs.append((addr, nbytes, [(i, 0)]))
        end = addr + -(-nbytes // alignment) * alignment
    return runs
