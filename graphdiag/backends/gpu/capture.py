"""Gates 5 and 6: the capture loop (ggml_cuda_graph_evaluate_and_capture) and launch_chunk.

Nodes are walked in order. A chunk ends at the first node i >= chunk_end outside a concurrent region; then
EndCapture -> update or instantiate -> launch, and BeginCapture starts the next chunk with
chunk_end = i + chunk_size. Views/no-ops and nodes without the COMPUTE flag are skipped; a fusion returns
the following nodes it absorbed and the loop skips them, so no boundary falls inside a fusion.
"""

from __future__ import annotations

import time

import numpy as np

from ... import events as E
from ...ir.graph import Graph
from ..drivers.base import H200_MULTIPROCESSORS
from ...ir.ops import Op
from .compat import cublas_launches
from .concurrency import Region
from .entry import GraphEntry
from .fusion import Fusion, launching_nodes
from .lowering import KernelOp, ScratchLaunchesOp


def _cublas_nodes(graph: Graph, cc: int, nsm: int) -> list[tuple[int, int]]:
    """(node, kernels upstream's cuBLAS path launches for it) of each MUL_MAT of `graph` that upstream hands
    to cuBLAS with F16 / BF16 / quantized weights (compat.cublas_launches), in node order."""
    mm = np.flatnonzero(graph.arena.rec["op"][graph.nodes] == int(Op.MUL_MAT))
    out = []
    for i in mm.tolist():
        n = cublas_launches(graph.node(i), cc, nsm)
        if n:
            out.append((i, n))
    return out


def _cublas_extra(cublas: list[tuple[int, int]], lowered, lo: int, hi: int) -> int:
    """The kernel nodes upstream's capture of nodes [lo, hi) holds beyond graphdiag's: per mat-mul on
    upstream's cuBLAS path, its launches (compat.cublas_launches) less the lowered op's (none for F16
    weights, whose conversions graphdiag launches too: lowering._cublas_f16)."""
    extra = 0
    for i, n in cublas:
        if lo <= i < hi:
            op = lowered[i]
            if op is not None:
                extra += n - op.n_launches
    return extra


class CaptureLoop:
    """Runs one split eagerly, or captures it chunk by chunk, or replays its executables."""

    def __init__(self, backend):
        self.b = backend          # the GpuBackend: driver, pool, streams, runtime, bus

    # -- gate 6 -------------------------------------------------------------------------------------------
    def launch_chunk(self, entry: GraphEntry, idx: int, split: int, uid: int, began_ns: int,
                     cublas_extra: int = 0) -> None:
        b, drv, rt = self.b, self.b.driver, self.b.runtime
        cuda_graph = drv.end_capture(b.stream0)
        rt.emit(E.ChunkCaptured, split, entry.key, uid, chunk=idx, n_graph_nodes=drv.graph_num_nodes(cuda_graph),
                capture_ns=time.perf_counter_ns() - began_ns, cublas_extra=cublas_extra)
        try:
            if idx < len(entry.instances):
                t0 = time.perf_counter_ns()
                with b.bus.span("update", "graph/update", idx, rt.step, split, entry.key, uid):
                    out = drv.exec_update(entry.instances[idx], cuda_graph)
                dt = time.perf_counter_ns() - t0
                if out.ok:
                    rt.emit(E.ChunkUpdated, split, entry.key, uid, chunk=idx, duration_ns=dt)
                else:
                    rt.emit(E.UpdateRefused, split, entry.key, uid, chunk=idx, reason=out.result.name,
                            error_node=out.error_node or "", duration_ns=dt)
                    drv.exec_destroy(entry.instances[idx])
                    try:
                        entry.instances[idx] = self._instantiate(entry, idx, cuda_graph, split, uid, True)
                    except BaseException:
                        # never leave a destroyed executable in the entry; the later chunks' executables
                        # no longer line up with a capture that failed here: release them too
                        del entry.instances[idx]
                        rt.destroy_instances(entry, idx)
                        raise
            else:
                assert idx == len(entry.instances)
                entry.instances.append(self._instantiate(entry, idx, cuda_graph, split, uid, False))
        finally:
            drv.graph_destroy(cuda_graph)
        drv.graph_launch(entry.instances[idx], b.stream0)

    def _instantiate(self, entry, idx, cuda_graph, split, uid, after_refusal):
        rt = self.b.runtime
        drv = self.b.driver
        t0 = time.perf_counter_ns()
        with self.b.bus.span("instantiate", "graph/instantiate", idx, rt.step, split, entry.key, uid):
            free0 = drv.mem_get_info()[0]
            inst = drv.instantiate(cuda_graph)
            free1 = drv.mem_get_info()[0]
        rt.emit(E.ChunkInstantiated, split, entry.key, uid, chunk=idx, duration_ns=time.perf_counter_ns() - t0,
                after_refusal=after_refusal, mem_bytes=max(free0 - free1, 0))
        return inst

    # -- gate 5 -------------------------------------------------------------------------------------------
    def evaluate(self, entry: GraphEntry, graph: Graph, split: int, use_graph: bool, update: bool,
                 lowered, plan: dict[int, Fusion], regions: list[Region]) -> tuple[int, int]:
        """Run or capture every node; returns (n_chunks, n_launches)."""
        b, drv, rt = self.b, self.b.driver, self.b.runtime
        capturing = use_graph and update
        if not capturing and not regions and isinstance(lowered, LoweredOps):
            return 0, self.run_eager(lowered)
        chunk_size = rt.opt.chunk_size
        key, uid, n = entry.key, graph.uid, graph.n_nodes
        forks = {r.fork: r for r in regions}   # fork node -> region (the concurrent_events map)
        active: Region | None = None
        n_chunks = n_launches = chunk_start = 0
        chunk_end = chunk_size
        moved_by = ""
        began = time.perf_counter_ns()
        span = b.bus.span("capture chunk", "graph/capture", 0, rt.step, split, key, uid) if capturing else None
        cublas = _cublas_nodes(graph, drv.cc, drv.nsm) if capturing else ()
        if capturing:   # every op prepared before the capture begins (a scratch op still re-packs when
            # the pool hands it another buffer, as it does at any run)
            for op in lowered:
                if op is not None and not op.ready:
                    op.prepare(drv)
            span.__enter__()
            drv.begin_capture(b.stream0)
        stream = b.stream0
        prev_i = 0
        prev_at_chunk = 0                   # prev_i when the current chunk began (to re-run it eagerly)
        b.capture_aborted = False
        i = 0
        while i < n:
            # (1) the chunk boundary, before the fork/join handling of node i (the article's order)
            if capturing and chunk_size > 0 and i >= chunk_end and active is None:
                self.launch_chunk(entry, n_chunks, split, uid, began, _cublas_extra(cublas, lowered, chunk_start, i))
                span.__exit__(None, None, None)
                rt.emit(E.ChunkBoundary, split, key, uid, chunk=n_chunks, start_node=chunk_start, end_node=i,
                        moved_by=moved_by if i > chunk_end else "")
                n_chunks += 1
                chunk_start, moved_by = i, ""
                span = b.bus.span("capture chunk", "graph/capture", i, rt.step, split, key, uid)
                span.__enter__()
                began = time.perf_counter_ns()
                drv.begin_capture(b.stream0)
                chunk_end = i + chunk_size
                prev_at_chunk = prev_i
            # (2) fork / join: a fork absorbed by the previous node's fusion starts its region here
            if active is not None:
                if i == active.join:
                    b.join(active)
                    active, stream = None, b.stream0
                else:
                    stream = b.streams[active.stream_of[i]]
                    if capturing and chunk_size > 0 and i >= chunk_end:
                        moved_by = "concurrent region"
            elif i - prev_i > 1 and (i - 1) in forks:
                active = forks[i - 1]
                b.fork(active)
                stream = b.streams[active.stream_of[i]] if i != active.join else b.stream0
            prev_i = i
            op = lowered[i]
            if op is None:                      # view/no-op, not COMPUTE, or absorbed by a fusion
                i += 1
                continue
            if not op.ready:                   # lowered without preparing (eager): prepared at first use
                op.prepare(drv)
            op.run(drv, stream, b.pool_of(stream))
            n_launches += op.n_launches
            if capturing and b.capture_aborted:
                # the pool invalidated every graph while this chunk was being captured: the capture was
                # ended and dropped (backend.end_capture_for_pool); this chunk's nodes were only recorded,
                # so the split goes on eagerly from the chunk's first node
                capturing, active, stream, moved_by = False, None, b.stream0, ""
                span.__exit__(None, None, None)
                rt.emit(E.CaptureAbandoned, split, key, uid, chunk=n_chunks, node=i,
                        reason="pool invalidated during capture")
                i, prev_i = chunk_start, prev_at_chunk
                continue
            f = plan.get(i)
            skip = f.absorbed if f is not None else 0
            if capturing and chunk_size > 0 and i < chunk_end <= i + skip and not moved_by:
                moved_by = "fusion"
            if skip == 0 and active is None and i in forks:
                active = forks[i]
                b.fork(active)
            i += 1 + skip
        if b.capture_aborted:
            return n_chunks, n_launches
        if capturing:
            self.launch_chunk(entry, n_chunks, split, uid, began, _cublas_extra(cublas, lowered, chunk_start, n))
            span.__exit__(None, None, None)
            rt.emit(E.ChunkBoundary, split, key, uid, chunk=n_chunks, start_node=chunk_start, end_node=n,
                    moved_by="")
            n_chunks += 1
            gone = rt.destroy_instances(entry, n_chunks)
            if gone:
                rt.emit(E.ChunksDestroyed, split, key, uid, first=n_chunks, count=gone)
        return n_chunks, n_launches

    FIRST_RUN, MAX_RUN = 4, 64         # launches in an eager step's first run, and at most in any

    def run_eager(self, lowered: "LoweredOps") -> int:
        """evaluate() where nothing is captured and no region forks: every op on stream 0, in node order, one
        per node group (a node or a fused group: the nodes evaluate() would skip are never visited). The same
        launches in the same order as evaluate()'s walk, without its per-node chunk and fork bookkeeping,
        which is host time an eager step pays per launch. The launches go to the driver in runs
        (launch_batch: one call from C on CUDA) of FIRST_RUN launches, then twice as many each time up to
        MAX_RUN, so the GPU starts on the first kernels while the host stages the rest (one run for a whole
        1b Q8_0 step left the GPU idle its first ~165 us on the H200). A run also ends before the host
        lowers the next block of node groups; before an op that does more
        than launch (the sorted MUL_MAT_ID's sync); and before the pool frees or flushes device memory
        (backend.eager_run, launched by end_capture_for_pool), so no launch follows its scratch buffer's
        release. Returns the launches."""
        b, drv = self.b, self.b.driver
        stream = b.stream0
        pool = b.pool_of(stream)
        b.capture_aborted = False
        # every step after a graph's first: its ops as its first left them, without asking per group
        # whether it is lowered and prepared (about 0.3 us of Python a launch on an eager 1b Q8_0 step)
        ops = lowered.ready_ops()
        if ops is None:
            ops = self._lowering(lowered, drv)
        n_launches = 0
        run: list = []
        b.eager_run = run
        limit = self.FIRST_RUN
        try:
            for op in ops:
                if op is None or len(run) >= limit:
                    if run:
                        drv.launch_batch(stream, run)
                        run.clear()
                        limit = min(2 * limit, self.MAX_RUN)
                    if op is None:
                        continue
                kind = type(op)
                if kind is KernelOp:
                    run.append(op.launch)
                    n_launches += 1
                    continue
                if kind is ScratchLaunchesOp:
                    op.stage(drv, pool, run)
                else:
                    if run:
                        drv.launch_batch(stream, run)
                        run.clear()
                    op.run(drv, stream, pool)
                n_launches += op.n_launches
            if run:
                drv.launch_batch(stream, run)
                run.clear()
        finally:
            b.eager_run = None
        return n_launches

    @staticmethod
    def _lowering(lowered: "LoweredOps", drv):
        """The ops of a graph's first eager step, each prepared at first use, with None where the next
        block of node groups is about to be lowered (run_eager ends its run there first)."""
        for i in lowered.group_starts():
            if not lowered.is_lowered(i):
                yield None
            op = lowered[i]
            if op is not None:
                if not op.ready:               # lowered without preparing (eager): prepared at first use
                    op.prepare(drv)
                yield op

    def replay(self, entry: GraphEntry) -> int:
        drv, s = self.b.driver, self.b.stream0
        for inst in entry.instances:
            drv.graph_launch(inst, s)
        return len(entry.instances)


def lower_graph(graph: Graph, plan: dict[int, Fusion], cc: int, launches: list[bool] | None = None,
                memo=None, nsm: int = H200_MULTIPROCESSORS) -> list:
    """Every node's lowered op at once (None where the loop launches nothing), not yet prepared: a
    complete LoweredOps as a list."""
    return list(LoweredOps(graph, plan, cc, launches, memo, nsm))


class LoweredOps:
    """The lowered op of each node index (None where the loop launches nothing), made as the evaluation
    first reaches it, in blocks of node groups (a node, or a fused group): FIRST_BLOCK groups, then twice as
    many each time (up to MAX_BLOCK, as a block's remembered groups are built together). An eager step's
    first kernels go out while the host still lowers the rest, as ggml's eager loop launches node by node.
    Not prepared on the driver: CaptureLoop.evaluate prepares each op right before its first run (all of
    them before a capture). `ops[i]` lowers up to node i; iterating lowers everything. `launches`: launching_nodes(graph),
    when the caller has it; `memo`: a LaunchMemo to take unchanged groups from; `cc`, `nsm`: the device's
    compute capability and multiprocessors (kernel choice, the stream-k split).

    What lowering reads (descriptors, memo keys) is gathered for each block's node range when the block is
    lowered: the structs of a graph do not change while its uid holds, so a group lowered later is lowered
    as it would have been at the start."""

    FIRST_BLOCK, MAX_BLOCK = 8, 128

    __slots__ = ("_graph", "_cc", "_nsm", "_memo", "_ops", "_groups", "_starts", "_next", "_upto", "_block",
                 "_names", "_ready")

    def __init__(self, graph: Graph, plan: dict[int, Fusion], cc: int, launches: list[bool] | None = None,
                 memo=None, nsm: int = H200_MULTIPROCESSORS):
        n = graph.n_nodes
        if launches is None:
            launches = launching_nodes(graph)
        groups: list[tuple[int, int, Fusion | None]] = []      # (first node, end, fusion), in node order
        i = 0
        while i < n:
            if not launches[i]:
                i += 1
                continue
            f = plan.get(i)
            end = i + 1 + (f.absorbed if f is not None else 0)
            groups.append((i, end, f))
            i = end
        self._graph, self._cc, self._nsm, self._memo = graph, cc, nsm, memo
        self._ops: list = [None] * n
        self._groups, self._next, self._upto = groups, 0, 0 if groups else n
        self._starts = tuple(g[0] for g in groups)
        self._block = self.FIRST_BLOCK
        self._names = graph.arena.rec["name"][graph.nodes].tolist()
        self._ready: tuple | None = None

    def __len__(self) -> int:
        return len(self._ops)

    def group_starts(self) -> tuple[int, ...]:
        """The first node of each node group, in order (what an evaluation without forks visits)."""
        return self._starts

    def ready_ops(self) -> tuple | None:
        """The op of each node group in order, leaving out the groups that launch nothing, once every group
        is lowered and its op prepared (ops stay prepared: a scratch op re-packs itself); None before."""
        if self._ready is None and self._upto == len(self._ops):
            ops = tuple(op for op in (self._ops[i] for i in self._starts) if op is not None)
            if all(op.ready for op in ops):
                self._ready = ops
        return self._ready

    def is_lowered(self, i: int) -> bool:
        """Whether node i's op is made already (asking for it lowers nothing)."""
        return i < self._upto

    def __getitem__(self, i: int):
        while i >= self._upto:
            self._lower_block()
        return self._ops[i]

    def __iter__(self):
        while self._upto < len(self._ops):
            self._lower_block()
        return iter(self._ops)

    def _lower_block(self) -> None:
        from .descriptors import DescriptorTable
        from .launch_memo import KEY_BYTES, key_rows
        from .lowering import lower_node, op_launches
        graph, cc, memo, names = self._graph, self._cc, self._memo, self._names
        block = self._groups[self._next : self._next + self._block]
        lo, hi = block[0][0], block[-1][1]            # the block's node range
        descs = DescriptorTable(graph, lo, hi)
        keys = key_rows(graph, lo, hi) if memo is not None else b""
        items: list[tuple] = []          # (node, label, op; None: made from the memo below), in node order
        found: list = []
        for i, end, f in block:
            if f is None:
                label, pattern = names[i].decode(), None
            else:
                label, pattern = "+".join(name.decode() for name in names[i:end]), f.pattern
            got = None
            if memo is not None:
                key = (pattern, cc, self._nsm, keys[(i - lo) * KEY_BYTES : (end - lo) * KEY_BYTES])
                got = memo.lookup(key)
            if got is not None:
                found.append(got)
                items.append((i, label, None))
            else:
                mark = len(descs.described)
                op = lower_node(graph, i, f, cc, descs, self._nsm)
                if memo is not None:
                    memo.put(key, op, descs.described[mark:])
                items.append((i, label, op))
        made = iter(memo.build(found, graph.arena)) if found else None
        for i, label, op in items:
            if op is None:
                op = next(made)
            for launch in op_launches(op):
                launch.label = label
            self._ops[i] = op
        # the block is done only now: a lowering that raised leaves it to be lowered again at the next ask,
        # never a node without its op
        self._next += len(block)
        self._block = min(2 * self._block, self.MAX_BLOCK)
        # every node before the next group's first is final (the ones between groups launch nothing)
        self._upto = self._groups[self._next][0] if self._next < len(self._groups) else len(self._ops)
