"""Synthetic but realistic event sequences, in the order the runtime emits them.

`Synth` is a small script writer: each method appends the events of one decision, stamping t_ns from
a deterministic clock and durations from fixed tables, so reports of these runs are reproducible.
The ready-made runs (`steady_decode`, `batch_change`, `moe_offload`, `pressure_and_idle`) are what the
golden files show. Every capture records its ledger rows (`ledger`: a small llama-like graph whose
activations follow the batch) as the runtime's LedgerCaptured does; `edit_ledger` changes one field of one
node in every recorded ledger of a run.
"""

from __future__ import annotations

import dataclasses
import re
import zlib

from graphdiag import events as E
from graphdiag.config import RunConfig
from graphdiag.report.record import RunHeader

KEY_A = 0x5EED0000A8F0
KEY_B = 0x5EED0000C140
KEY_C = 0x5EED0000D9A0

EAGER_NS, CAPTURE_NS, REPLAY_NS = 4_200_000, 9_600_000, 610_000
INSTANTIATE_NS, UPDATE_NS, REFUSED_NS = 2_700_000, 150_000, 90_000


def header(**settings) -> RunHeader:
    """A simulated run's header with RunConfig-like settings; `settings` override the defaults."""
    s = dict(backend="sim", model="tiny", wtype="f16", seed=0, prompt_tokens=16, steps=8, batch=1,
             chunk_size=0, fusion=True, concurrent_streams=False, graphs_disabled=False,
             reuse_disabled=False, n_cpu_moe=0, pool_cap=None, pool_max_buffers=256, pool_invalidation=False,
             compute_capability="9.0", verify=False, nvtx=True)
    s.update(settings)
    sources = {k: "default" for k in s}
    sources.update({k: "cli" for k in settings})
    cfg = RunConfig(chunk_size=s["chunk_size"], pool_invalidation=s["pool_invalidation"])   # what ran, as the runner says
    return RunHeader(backend="sim", device="simulated GPU (cc 9.0)", simulated=True, model=s["model"],
                     upstream=cfg.upstream, rules=cfg.rules(), article=cfg.article_rules(),
                     settings=s, sources=sources, started="2026-12-01T10:00:00", scenario=None)


class Synth:
    """Appends events step by step. `uid` hands out fresh split uids like ggml_graph_next_uid."""

    def __init__(self):
        self.events: list[E.Event] = []
        self.t = 1_000_000
        self.next_uid = 1
        self.step_no = -1
        self.nodes: dict[int, int] = {}      # key -> node count last seen
        self.n_tokens = 1                    # tokens of the current step's ubatch
        self.last_uid: dict[int, int] = {}   # key -> uid stored in the entry

    def emit(self, ev_type, **kw) -> None:
        self.t += 1_000
        kw.setdefault("step", self.step_no)
        self.events.append(ev_type(t_ns=self.t, **kw))

    def begin(self, n_tokens=1, n_seqs=1, n_kv=256, phase="decode", reused=True, reason="",
              splits=(("CUDA0", 120),)) -> list[int]:
        """Start a step; when the graph is not reused, the scheduler reallocates and splits anew."""
        self.step_no += 1
        self.n_tokens = n_tokens
        self.emit(E.StepStarted, phase=phase, n_tokens=n_tokens, n_seqs=n_seqs, n_kv=n_kv)
        self.emit(E.ContextDecision, reused=reused, reason=reason)
        if not reused:
            uids = tuple(range(self.next_uid, self.next_uid + len(splits)))
            self.next_uid += len(splits)
            self.emit(E.SchedRealloc, same_size=self.step_no > 0, buffer_bytes=1 << 20, backend="CUDA0")
            self.emit(E.GraphSplit, n_splits=len(splits), backends=tuple(b for b, _ in splits), uids=uids,
                      n_nodes=tuple(n for _, n in splits))
            self.uids = list(uids)
        return self.uids

    def lookup(self, split, key, n_nodes, uid_hit) -> None:
        """Gate 1 and the uid fast path of gate 2."""
        new = key not in self.nodes
        self.emit(E.KeyLookup, split=split, key=key, uid=self.uids[split], new_entry=new, n_nodes=n_nodes)
        if uid_hit:
            self.emit(E.UidHit, split=split, key=key, uid=self.uids[split])
        else:
            self.emit(E.UidMiss, split=split, key=key, uid=self.uids[split],
                      old_uid=0 if new else self.last_uid.get(key, 0))
        self.last_uid[key] = self.uids[split]
        if not new and self.nodes[key] != n_nodes:
            self.emit(E.NodeCountChanged, split=split, key=key, uid=self.uids[split],
                      old=self.nodes[key], new=n_nodes)
        self.nodes[key] = n_nodes

    def diff(self, split, key, node, name, op, fld, old, new, n_changed=1) -> None:
        """The first changed node; the changed ones are taken to be it and the nodes right after it."""
        self.emit(E.PropertyDiff, split=split, key=key, uid=self.uids[split], node=node, node_name=name,
                  op=op, field=fld, old=str(old), new=str(new), n_changed_nodes=n_changed,
                  changed=tuple(range(node, node + n_changed)))

    def phase(self, split, key, phase, why, warm=None) -> None:
        """Gate 4: an optional warmup transition ("warm" or "cold"), then the phase decision."""
        ids = dict(split=split, key=key, uid=self.uids[split])
        if warm == "warm":
            self.emit(E.WarmupTransition, from_state="cold", to_state="warm", why="warmup complete", **ids)
        elif warm == "cold":
            self.emit(E.WarmupTransition, from_state="warm", to_state="cold",
                      why="warmup reset: properties changed", **ids)
        self.emit(E.PhaseDecided, phase=phase, why=why, **ids)

    def eager(self, split, key, launches=120) -> None:
        self.emit(E.EagerRun, split=split, key=key, uid=self.uids[split], n_launches=launches,
                  duration_ns=EAGER_NS + 1000 * self.step_no)

    def capture(self, split, key, bounds, outcomes, fusions=(), destroyed=0) -> None:
        """Gate 5/6. bounds: (start, end, moved_by) per chunk; outcomes: "instantiate" | "update" |
        "refused:REASON" per chunk; fusions: (node, pattern, absorbed)."""
        ids = dict(split=split, key=key, uid=self.uids[split])
        for c, ((start, end, moved), outcome) in enumerate(zip(bounds, outcomes)):
            for node, pattern, absorbed in fusions:
                if start <= node < end:
                    self.emit(E.FusionApplied, node=node, pattern=pattern, absorbed=absorbed, **ids)
            self.emit(E.ChunkBoundary, chunk=c, start_node=start, end_node=end, moved_by=moved, **ids)
            self.emit(E.ChunkCaptured, chunk=c, n_graph_nodes=end - start, capture_ns=300_000, **ids)
            if outcome == "update":
                self.emit(E.ChunkUpdated, chunk=c, duration_ns=UPDATE_NS, **ids)
                continue
            if outcome.startswith("refused:"):
                self.emit(E.UpdateRefused, chunk=c, reason=outcome[8:], error_node=f"node {start}",
                          duration_ns=REFUSED_NS, **ids)
            self.emit(E.ChunkInstantiated, chunk=c, duration_ns=INSTANTIATE_NS + 1000 * c,
                      after_refusal=outcome != "instantiate", **ids)
        if destroyed:
            self.emit(E.ChunksDestroyed, first=len(bounds), count=destroyed, **ids)
        self.emit(E.CaptureRun, n_chunks=len(bounds), n_launches=len(bounds), duration_ns=CAPTURE_NS, **ids)
        self.emit(E.LedgerCaptured, nodes=ledger(self.nodes[key], batch=self.n_tokens), **ids)

    def replay(self, split, key, n_chunks) -> None:
        self.emit(E.ReplayLaunched, split=split, key=key, uid=self.uids[split], n_chunks=n_chunks,
                  duration_ns=REPLAY_NS + 100 * self.step_no)

    def finished(self) -> list[E.Event]:
        """The events with the run's RunEnded (complete) appended, as the runner ends every record."""
        done = sum(isinstance(e, E.StepFinished) for e in self.events)
        return self.events + [E.RunEnded(step=self.step_no + 1, t_ns=self.t + 1_000, status="complete",
                                         steps_done=done)]

    def end(self, mode, tokens=(7,)) -> None:
        self.emit(E.StepFinished, duration_ns={"eager": 5_000_000, "capture": 11_000_000, "replay": 900_000,
                                               "cpu": 3_000_000}[mode] + 1000 * self.step_no,
                  gpu_ns=400_000, tokens=tuple(tokens), mode=mode)


def _warm_up(s: Synth, key, n_nodes=120, bounds=((0, 120, ""),), n_tokens_prefill=16, fusions=(),
             batch=1) -> None:
    """Steps: prefill eager (new entry), first decode eager (ne[1] 16→batch), then capture."""
    s.begin(n_tokens=n_tokens_prefill, phase="prefill", reused=False, reason="first graph")
    s.lookup(0, key, n_nodes, uid_hit=False)
    s.phase(0, key, "eager", "new entry: no snapshot yet")
    s.eager(0, key)
    s.end("eager", tokens=(11,))
    s.begin(n_tokens=batch, n_seqs=batch, reused=False, reason=f"n_tokens {n_tokens_prefill}→{batch}")
    s.lookup(0, key, n_nodes, uid_hit=False)
    s.diff(0, key, 3, "inp_embd", "GET_ROWS", "ne[1]", n_tokens_prefill, batch, n_changed=96)
    s.phase(0, key, "eager", "properties changed")
    s.eager(0, key)
    s.end("eager", tokens=(7,) * batch)
    s.begin(n_tokens=batch, n_seqs=batch, reused=True)
    s.lookup(0, key, n_nodes, uid_hit=True)
    s.phase(0, key, "capture", "warmup complete", warm="warm")
    s.capture(0, key, bounds, ["instantiate"] * len(bounds), fusions=fusions)
    s.end("capture", tokens=(7,) * batch)


def _replays(s: Synth, key, n, n_chunks=1, batch=1) -> None:
    for _ in range(n):
        s.begin(n_tokens=batch, n_seqs=batch, reused=True)
        s.lookup(0, key, s.nodes[key], uid_hit=True)
        s.phase(0, key, "replay", "warm, unchanged")
        s.replay(0, key, n_chunks)
        s.end("replay", tokens=(7,) * batch)


def steady_decode(n_replays=5, chunk_size=0) -> tuple[RunHeader, list[E.Event]]:
    """Prefill eager, decode eager, capture (warmup complete), then replays on uid hits. One graph per
    split by default (upstream); `chunk_size` N > 0: the article's chunks of N nodes."""
    s = Synth()
    fusions = ((10, "rms_norm+mul", 1), (64, "rms_norm+mul", 1))
    bounds = ((0, 120, ""),) if chunk_size == 0 or chunk_size >= 120 else \
        tuple((a, min(a + chunk_size, 120), "") for a in range(0, 120, chunk_size))
    _warm_up(s, KEY_A, bounds=bounds, fusions=fusions)
    _replays(s, KEY_A, n_replays, n_chunks=len(bounds))
    return header(steps=3 + n_replays, **({"chunk_size": chunk_size} if chunk_size else {})), s.finished()


def batch_change() -> tuple[RunHeader, list[E.Event]]:
    """Steady at batch 8, then batch 9: warmup reset, eager, recapture with the update refused
    (TOPOLOGY_CHANGED: the fused mat-vec no longer applies) and re-instantiated, then replays. Captured in
    the article's chunks of 64 nodes (a fusion moves the first boundary)."""
    s = Synth()
    bounds = ((0, 64, "fusion"), (64, 120, ""))
    _warm_up(s, KEY_A, bounds=bounds, fusions=((40, "mul_mat_vec+glu", 2),), batch=8)
    _replays(s, KEY_A, 2, n_chunks=2, batch=8)
    s.begin(n_tokens=9, n_seqs=9, reused=False, reason="n_tokens 8→9")
    s.lookup(0, KEY_A, 120, uid_hit=False)
    s.diff(0, KEY_A, 41, "__fattn__-3", "FLASH_ATTN_EXT", "src[1].ne[1]", 8, 9, n_changed=70)
    s.phase(0, KEY_A, "eager", "properties changed", warm="cold")
    s.eager(0, KEY_A)
    s.end("eager", tokens=(7,) * 9)
    s.begin(n_tokens=9, n_seqs=9, reused=True)
    s.lookup(0, KEY_A, 120, uid_hit=True)
    s.phase(0, KEY_A, "capture", "warmup complete", warm="warm")
    s.capture(0, KEY_A, ((0, 62, ""), (62, 120, "")), ["refused:TOPOLOGY_CHANGED", "update"])
    s.end("capture", tokens=(7,) * 9)
    _replays(s, KEY_A, 2, n_chunks=2, batch=9)
    return header(batch=8, chunk_size=64, steps=len({e.step for e in s.events})), s.finished()


def moe_offload() -> tuple[RunHeader, list[E.Event]]:
    """Two GPU splits around a CPU expert split (n_cpu_moe): two keys warm up and replay together."""
    s = Synth()
    splits = (("CUDA0", 40), ("CPU", 6), ("CUDA0", 48))
    s.begin(n_tokens=16, phase="prefill", reused=False, reason="first graph", splits=splits)
    for split, key in ((0, KEY_B), (2, KEY_C)):
        s.lookup(split, key, splits[split][1], uid_hit=False)
        s.phase(split, key, "eager", "new entry: no snapshot yet")
        s.eager(split, key, launches=splits[split][1])
    s.end("eager", tokens=(11,))
    for step in range(4):
        s.begin(n_tokens=1, reused=step > 0, reason="n_tokens 16→1", splits=splits)
        for split, key in ((0, KEY_B), (2, KEY_C)):
            s.lookup(split, key, splits[split][1], uid_hit=step > 0)
            if step == 0:
                s.diff(split, key, 0 if split == 0 else 1, "attn_norm-0" if split == 0 else "ffn_moe_out-0",
                       "RMS_NORM" if split == 0 else "CPY", "ne[1]", 16, 1)
                s.phase(split, key, "eager", "properties changed")
                s.eager(split, key, launches=splits[split][1])
            elif step == 1:
                s.phase(split, key, "capture", "warmup complete", warm="warm")
                s.capture(split, key, ((0, splits[split][1], ""),), ["instantiate"])
            else:
                s.phase(split, key, "replay", "warm, unchanged")
                s.replay(split, key, 1)
        s.end(("eager", "capture", "replay", "replay")[step])
    return header(model="moe-tiny", n_cpu_moe=2, steps=5), s.finished()


def pressure_and_idle() -> tuple[RunHeader, list[E.Event]]:
    """A steady run interrupted by a pool invalidation (the article's rule: entries cleared, re-warmed) and by
    an idle gap that evicts the entry."""
    s = Synth()
    _warm_up(s, KEY_A)
    _replays(s, KEY_A, 1)
    s.emit(E.PoolInvalidated, reason="free into full pool", n_graphs=1, n_captured=1, nbytes=4 << 20)
    s.nodes.clear()
    _replays_after_reset(s)
    s.emit(E.Evicted, step=s.step_no + 1, key=KEY_A, idle_ns=11_000_000_000, n_chunks=1)
    s.nodes.clear()
    _replays_after_reset(s)
    return header(pool_cap=8 << 20, pool_invalidation=True, steps=len({e.step for e in s.events})), s.finished()


def _replays_after_reset(s: Synth) -> None:
    """A fresh entry for the same key: eager (new), capture, replay."""
    s.begin(n_tokens=1, reused=True)
    s.lookup(0, KEY_A, 120, uid_hit=False)
    s.phase(0, KEY_A, "eager", "new entry: no snapshot yet")
    s.eager(0, KEY_A)
    s.end("eager")
    s.begin(n_tokens=1, reused=True)
    s.lookup(0, KEY_A, 120, uid_hit=True)
    s.phase(0, KEY_A, "capture", "warmup complete", warm="warm")
    s.capture(0, KEY_A, ((0, 120, ""),), ["instantiate"])
    s.end("capture")
    _replays(s, KEY_A, 1)


# -- ledger rows ----------------------------------------------------------------------------------------------
LAYER = (("attn_norm", "RMS_NORM"), ("Qcur", "MUL_MAT"), ("Kcur", "MUL_MAT"), ("Vcur", "MUL_MAT"),
         ("kqv_out", "MUL_MAT"), ("ffn_inp", "ADD"), ("ffn_norm", "RMS_NORM"), ("ffn_gate", "MUL_MAT"),
         ("ffn_up", "MUL_MAT"), ("ffn_out", "MUL_MAT"), ("l_out", "ADD"), ("l_out_view", "VIEW"))
NAMED = {3: ("inp_embd", "GET_ROWS"), 41: ("__fattn__-3", "FLASH_ATTN_EXT")}   # as the PropertyDiffs name them


def ledger(n_nodes=120, batch=1, n_kv=256) -> tuple:
    """LedgerCaptured rows of a synthetic graph: weights in buffer b0, activations in three rotating slots
    of the compute buffer b1 (slot size follows the batch), the KV cache in b2."""
    def act(i: int) -> str:
        return f"b1+{0x800 * batch * (i % 3):#x}"

    ne, nb = (512, batch, 1, 1), (4, 2048, 2048 * batch, 2048 * batch)
    rows = []
    for i in range(n_nodes):
        name, op = NAMED.get(i) or (f"{LAYER[i % 12][0]}-{i // 12}", LAYER[i % 12][1])
        srcs = ((0, ne, nb, act(i - 1)),) if i else ()
        if op == "MUL_MAT":
            srcs = ((0, (512, 512, 1, 1), (2, 1024, 524288, 524288), f"b0+{0x80000 * i:#x}"), (1, ne, nb, act(i - 1)))
        elif op == "FLASH_ATTN_EXT":
            srcs += ((1, (n_kv, batch, 1, 1), (2, 2 * n_kv, 2 * n_kv * batch, 2 * n_kv * batch), "b2+0x0"),)
        rows.append((i, name, op, "F32", ne, nb, f"{zlib.crc32(op.encode()):08x}", 16, act(i), srcs))
    return tuple(rows)


_PATH = re.compile(r"(?:src\[(\d+)\]\.)?(ne|nb|data)(?:\[(\d+)\])?")


def _put(item: tuple, pos: int, value) -> tuple:
    return item[:pos] + (value,) + item[pos + 1:]


def _set_field(item: tuple, at: int, k: str | None, value) -> tuple:
    """item[at] = value, or item[at][k] = value when the path names an element."""
    return _put(item, at, value if k is None else _put(item[at], int(k), value))


def edit_ledger(run, node: int, path: str, value):
    """The run with field `path` ("ne[1]", "nb[2]", "data", "src[1].data", "src[0].ne[0]") of node `node`
    set to `value` in every recorded ledger."""
    header, events = run
    src, fld, k = _PATH.fullmatch(path).groups()

    def edit(row: tuple) -> tuple:
        if row[0] != node:
            return row
        if src is None:
            return _set_field(row, {"ne": 4, "nb": 5, "data": 8}[fld], k, value)
        at = {"ne": 1, "nb": 2, "data": 3}[fld]
        return _put(row, 9, tuple(_set_field(s, at, k, value) if s[0] == int(src) else s for s in row[9]))

    return header, [dataclasses.replace(e, nodes=tuple(edit(r) for r in e.nodes))
                    if isinstance(e, E.LedgerCaptured) else e for e in events]
