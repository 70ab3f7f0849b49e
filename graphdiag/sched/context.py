"""The context, modelled on llama_context::process_ubatch: KV cells, graph params, graph reuse.

Each step places the ubatch's tokens in KV-cache cells, derives the graph params (n_tokens, n_seqs, n_outputs,
graph type, padded n_kv) and either reuses the previous graph (only the inputs are refreshed; the scheduler stays
allocated, so split uids are unchanged) or resets the arena's compute region and the scheduler and rebuilds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .. import events as E
from ..backends.base import Backend
from ..errors import InternalError, UsageError
from ..ir.dtypes import GGMLType
from ..ir.tensor import Tensor
from ..model.build import DECODE, PREFILL, BuiltGraph, GraphParams, GraphTemplates, build_graph, padded_n_kv
from ..model.weights import Model, load_model
from .devices import LayerSplit
from .scheduler import Scheduler


class KvCells:
    """Which (sequence, position) each KV-cache cell holds (-1: free), as llama_kv_cells. What a decode
    step asks (a sequence's next position, the highest used cell, the lowest free one) is kept up to date
    as cells are placed and removed, as llama_kv_cells keeps its seq_pos and used sets: no scan of n_ctx
    cells per step."""

    def __init__(self, n_ctx: int):
        self.seq = np.full(n_ctx, -1, np.int32)
        self.pos = np.full(n_ctx, -1, np.int32)
        self._next: dict[int, int] = {}      # seq -> its highest position + 1
        self._used_p1 = 0                    # highest used cell + 1
        self._n_kv = padded_n_kv(0, n_ctx)   # n_kv() of _used_p1, worked out again whenever it changes
        self._free = 0                       # no free cell below this one
        self._placed: list[int] = []         # cells placed since the last removal, in order
        self._row: _MaskRow | None = None    # the last one-token mask row, for the next to start from

    def next_pos(self, seq: int) -> int:
        """The position the sequence's next token takes (0 for a new sequence)."""
        return self._next.get(seq, 0)

    def place(self, seqs: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Put each token in the lowest free cell; returns the cells (int32, one per token)."""
        n = len(seqs)
        f = self._free
        if n == 1 and f < len(self.seq) and self.seq[f] < 0:        # decode: the cell after the last
            # slices, not an index array: the same casts in a third of the time
            self.seq[f:f + 1], self.pos[f:f + 1] = seqs, pos
            self._placed.append(f)
            self._free = f + 1
            if f >= self._used_p1:
                self._used(f + 1)
            q = int(seqs[0])
            self._next[q] = max(self._next.get(q, 0), int(pos[0]) + 1)
            return np.array([f], np.int32)
        free = np.flatnonzero(self.seq[f:] < 0)
        if free.size < n:
            raise UsageError(f"KV cache full: {n} tokens, {free.size} free cells (n_ctx {len(self.seq)})")
        cells = (free[:n] + f).astype(np.int32)
        self.seq[cells], self.pos[cells] = seqs, pos
        self._placed.extend(cells.tolist())
        self._free = int(cells[-1]) + 1
        self._used(max(self._used_p1, int(cells[-1]) + 1))
        if n == 1:
            q = int(seqs[0])
            self._next[q] = max(self._next.get(q, 0), int(pos[0]) + 1)
        else:
            seqs, pos = np.asarray(seqs), np.asarray(pos)
            for q in np.unique(seqs).tolist():
                self._next[q] = max(self._next.get(q, 0), int(pos[seqs == q].max()) + 1)
        return cells

    def remove(self, seq: int) -> None:
        gone = self.seq == seq
        self.seq[gone], self.pos[gone] = -1, -1
        self._placed.clear()                 # freed cells: a kept mask row no longer says what they hold
        self._row = None
        self._next.pop(seq, None)
        used = np.flatnonzero(self.seq >= 0)
        self._used(int(used[-1]) + 1 if used.size else 0)
        hole = np.flatnonzero(gone)
        if hole.size:
            self._free = min(self._free, int(hole[0]))

    def n_kv(self) -> int:
        """Cells the attention reads: highest used cell + 1, padded to 256, at most n_ctx."""
        return self._n_kv

    def _used(self, used_p1: int) -> None:
        self._used_p1, self._n_kv = used_p1, padded_n_kv(used_p1, len(self.seq))

    def mask(self, seqs: np.ndarray, pos: np.ndarray, n_kv: int, n_rows: int,
             out: np.ndarray | None = None) -> np.ndarray:
        """KQ mask (n_rows, n_kv) float32: 0 where the cell is the token's sequence at pos <= its pos, -inf
        elsewhere and in the padding rows; written into `out` when given (an input stage's view)."""
        m = np.empty((n_rows, n_kv), np.float32) if out is None else out
        n = len(seqs)
        row = self._row_update(int(seqs[0]), pos, n_kv) if n == 1 else None
        if row is not None:
            m[0] = row
            if n_rows > 1:
                m[1:] = _NEG_INF
            return m
        if n and (seqs == seqs[0]).all():
            # one sequence (a prefill): a cell is visible at its position if it holds that sequence, so one
            # (n, n_kv) comparison against the cells' positions, other sequences' cells never visible
            mine = self.seq[:n_kv] == seqs[0]
            cell_pos = np.where(mine, self.pos[:n_kv], _NEVER32)
            if _int32_exact(pos, cell_pos):
                _mask_bits(m[:n].view(np.int32), pos.astype(np.int32, copy=False), cell_pos)
                m[n:] = _NEG_INF
                if n == 1:
                    self._row_keep(int(seqs[0]), pos, n_kv, m[0])
                return m
            ok = np.where(mine, self.pos[:n_kv].astype(np.int64), _NEVER)[None, :] <= pos[:, None]
        else:
            ok = (self.seq[None, :n_kv] == seqs[:, None]) & (self.pos[None, :n_kv] <= pos[:, None])
        # one pass in place: each cell's value looked up by its bool (no fill to overwrite, no temporary)
        _MASK_VALUES.take(ok.view(np.uint8), out=m[:n], mode="clip")
        m[n:] = _NEG_INF
        if n == 1:
            self._row_keep(int(seqs[0]), pos, n_kv, m[0])
        return m

    def _row_update(self, seq: int, pos: np.ndarray, n_kv: int) -> np.ndarray | None:
        """The kept one-token row brought up to (seq, pos[0]) by the cells placed since it was made; None when
        it cannot serve (none kept, another sequence or n_kv, an earlier or non-integer position).

        Why that is the whole change: the kept row was made when every cell of `seq` sat at or before its
        position (_row_keep), and no cell was freed since (remove drops it), so a cell not placed since
        holds what it held then; at a position as late or later it is visible exactly as it was (its
        sequence's cells all before both positions, other cells never). A cell placed since was free then
        (-inf) and is worked out again from what it holds now."""
        row = self._row
        if row is None or row.seq != seq or row.n_kv != n_kv or pos.dtype.kind not in "iu":
            return None
        p = int(pos[0])
        if p < row.pos:
            return None
        placed, values = self._placed, row.values
        for c in placed[row.n_placed:]:
            if c < n_kv:
                values[c] = 0.0 if int(self.seq[c]) == seq and int(self.pos[c]) <= p else _NEG_INF
        if self._next.get(seq, 0) <= p + 1:      # every cell of seq at or before p: the row stays usable
            row.pos, row.n_placed = p, len(placed)
        else:
            self._row = None
        return values

    def _row_keep(self, seq: int, pos: np.ndarray, n_kv: int, values: np.ndarray) -> None:
        """Keep a copy of a one-token row just written, when every cell of its sequence is at or before its
        position (what _row_update relies on); drop the kept one otherwise."""
        ok = seq >= 0 and pos.dtype.kind in "iu" and self._next.get(seq, 0) <= int(pos[0]) + 1
        self._row = _MaskRow(seq, int(pos[0]), n_kv, len(self._placed), values.copy()) if ok else None


class _MaskRow:
    """A one-token KQ mask row (n_kv float32) for `seq` at `pos`, made when `n_placed` cells had been placed
    since the last removal."""

    __slots__ = ("seq", "pos", "n_kv", "n_placed", "values")

    def __init__(self, seq: int, pos: int, n_kv: int, n_placed: int, values: np.ndarray):
        self.seq, self.pos, self.n_kv, self.n_placed, self.values = seq, pos, n_kv, n_placed, values


def _int32_exact(pos: np.ndarray, cell_pos: np.ndarray) -> bool:
    """Whether token position minus cell position is exact in int32 and negative exactly where the cell is
    masked: positions in [0, 2**31 - 1), cells' positions (_NEVER32 for another sequence's) not negative."""
    return (pos.dtype.kind in "iu" and cell_pos.size > 0
            and bool(pos.min() >= 0 and pos.max() < _NEVER32 and cell_pos.min() >= 0))


def _mask_bits(d: np.ndarray, pos: np.ndarray, cell_pos: np.ndarray) -> None:
    """The mask's rows as int32 bits in `d` (n, n_kv), three passes in place and no temporary: the position
    difference is negative where the cell is masked (after the token, or _NEVER32), its sign spread over the
    word (-1 or 0) and kept where -inf has bits set (0.0 is all zero)."""
    np.subtract(pos[:, None], cell_pos[None, :], out=d)
    np.right_shift(d, 31, out=d)
    np.bitwise_and(d, _NEG_INF_BITS, out=d)


_NEG_INF = np.float32(-np.inf)
_MASK_VALUES = np.array([-np.inf, 0.0], np.float32)     # masked, visible
_NEVER = np.int64(1) << 62       # a cell position no token's (int32) position reaches
_NEVER32 = np.int32(np.iinfo(np.int32).max)   # the same in int32, for tokens below that position
_NEG_INF_BITS = _NEG_INF.view(np.int32)           # 0xff800000


def _n_seqs(seqs: np.ndarray) -> int:
    return 1 if len(seqs) == 1 else len(set(seqs.tolist()))


def _reuse_blocker(prev: GraphParams, new: GraphParams) -> str:
    """Why a graph built for `prev` cannot serve `new` ("" if it can): llm_graph_params::allow_reuse plus
    the inputs' can_reuse (the KQ mask's ne[0] must equal n_kv). Prefill and decode are not different graph
    types in llama.cpp (both LLM_GRAPH_TYPE_DEFAULT): only their shapes tell them apart."""
    for field, label in (("n_tokens", "n_tokens"), ("n_seqs", "n_seqs"), ("n_outputs", "n_outputs"),
                         ("n_kv", "n_kv")):
        a, b = getattr(prev, field), getattr(new, field)
        if a != b:
            return f"{label} {a}→{b}"
    return ""


class Context:
    """Runs ubatches through the scheduler. `step` is the number of the next step (from 0)."""

    def __init__(self, model: Model, sched: Scheduler, bus: E.EventBus | None = None, reuse_disabled: bool = False):
        self.model, self.sched = model, sched
        self.bus = bus if bus is not None else E.EventBus()
        self.reuse_disabled = reuse_disabled
        self.kv = KvCells(model.cfg.n_ctx)
        self.res: BuiltGraph | None = None
        self.templates = GraphTemplates(model)    # graphs built before, stamped out again for a new n_kv
        self._inputs: _GraphInputs | None = None  # the kept graph's input stages
        self._slot = 0                            # the input slot the next step writes
        self._prepared: _Prepared | None = None   # the next decode step's placement, done early
        self._logits_place: tuple | None = None   # (res, backend, addr, nbytes, shape)
        self.step = 0
        self.n_reused = 0

    # -- public API -----------------------------------------------------------------------------------------
    def decode(self, tokens: Mapping[int, int] | Sequence[int]) -> np.ndarray:
        """One token per sequence ({seq: token}, or a list for seqs 0..n-1) -> logits (n_seqs, n_vocab) f32."""
        if type(tokens) is dict:                          # the runner's: no (seq, token) pairs to unzip
            keys, toks = list(tokens), list(tokens.values())
        else:
            items = list(tokens.items()) if isinstance(tokens, Mapping) else list(enumerate(tokens))
            keys, toks = [s for s, _ in items], [t for _, t in items]
        pre = self._prepared
        if pre is not None and tuple(keys) == pre.seqs:   # the prepared array holds what np.array(keys) would
            seqs, pos = pre.seqs_a, pre.pos
        else:
            seqs = np.array(keys, np.int32)
            if pre is not None:
                if pre.seqs != tuple(seqs.tolist()):
                    raise InternalError(f"decode of sequences {seqs.tolist()} after preparing {list(pre.seqs)}")
                pos = pre.pos
            else:
                pos = np.array([self.kv.next_pos(s) for s in seqs.tolist()], np.int32)
        return self.process_ubatch(np.array(toks, np.int32), seqs, pos, len(keys), DECODE)

    def prepare_decode(self, seqs: Sequence[int]) -> None:
        """The part of the next decode step (one token for each of `seqs`) that does not depend on its tokens,
        done now, while the GPU computes this step: its KV cells are placed and, when the kept graph will
        serve it, every input but the tokens is written into the input slot the next step sends. The next
        call must be decode() of the same sequences. Nothing is decided or reported here: the step's own
        events and decisions come when it runs, in their usual order, and a graph that must be rebuilt is
        built then (this step's work may still be reading the memory it would reuse)."""
        if self._prepared is not None:
            raise InternalError("prepare_decode called twice for one step")
        seqs_a = np.asarray(seqs, np.int32)
        seq_ids = seqs_a.tolist()
        pos = np.array([self.kv.next_pos(s) for s in seq_ids], np.int32)
        try:
            cells = self.kv.place(seqs_a, pos)
        except UsageError:
            return                                     # a full cache: the step itself reports it
        self._prepared = pre = _Prepared(tuple(seq_ids), seqs_a, pos, cells)
        if self.res is None or self._reuse_reason(self._decode_params(seqs_a)):
            return
        kept = self._kept_inputs()
        self._write_inputs(kept, self._slot, None, seqs_a, pos, cells)
        pre.written = (kept, self._slot)

    def prefill(self, tokens: Sequence[int], seq: int = 0, all_logits: bool = False) -> np.ndarray:
        """Many tokens of one sequence -> logits of the last token (1, n_vocab), or of every token."""
        n = len(tokens)
        pos = self.kv.next_pos(seq) + np.arange(n, dtype=np.int32)
        return self.process_ubatch(np.asarray(tokens, np.int32), np.full(n, seq, np.int32), pos,
                                   n if all_logits else 1, PREFILL)

    def invalidate(self) -> None:
        """Drop the kept graph (as llama.cpp after a scheduler reserve): the next step rebuilds."""
        self.res = None

    def process_ubatch(self, tokens: np.ndarray, seqs: np.ndarray, pos: np.ndarray, n_outputs: int,
                       gtype: str) -> np.ndarray:
        """One step: place in the cache, reuse or rebuild, set inputs, compute; logits (n_outputs, n_vocab)."""
        step = self.step
        pre, self._prepared = self._prepared, None
        cells = pre.cells if pre is not None else self.kv.place(seqs, pos)
        params = self._params(len(tokens), _n_seqs(seqs), n_outputs, gtype, self.kv.n_kv())
        self.bus.emit(E.StepStarted(step=step, phase=gtype, n_tokens=params.n_tokens, n_seqs=params.n_seqs,
                                    n_kv=params.n_kv))
        self.sched.step = step
        reason = self._reuse_reason(params)
        self.bus.emit(E.ContextDecision(step=step, reused=not reason, reason=reason))
        if reason:
            self.model.arena.reset()
            self.sched.reset()
            self.res = build_graph(self.model, params, self.templates)
            self.sched.alloc_graph(self.res.graph)
        else:
            self.n_reused += 1
        self._set_inputs(tokens, seqs, pos, cells, pre)
        self.sched.graph_compute(self.res.graph)
        self.step += 1
        self.bus.flush()               # the step's work is queued: held events reach the sinks while it runs
        if self.before_read is not None:
            self.before_read()         # the runner's early work for the next step, also while the GPU runs
        return self.read_logits()

    before_read = None                 # a callable run between the launch and the read-back of every step

    def _decode_params(self, seqs: np.ndarray) -> GraphParams:
        return self._params(len(seqs), _n_seqs(seqs), len(seqs), DECODE, self.kv.n_kv())

    def _params(self, *fields) -> GraphParams:
        """This step's GraphParams; the kept graph's own object when nothing changed (a decode step)."""
        kept = self.res.params if self.res is not None else None
        if kept is not None and (kept.n_tokens, kept.n_seqs, kept.n_outputs, kept.gtype, kept.n_kv) == fields:
            return kept
        return GraphParams(*fields)

    def can_reuse(self, params: GraphParams) -> bool:
        return self.res is not None and not _reuse_blocker(self.res.params, params)

    def read_logits(self) -> np.ndarray:
        """The last computed logits: (n_outputs, n_vocab) float32, read from the backend holding them (where
        they live is looked up once per built graph, as the inputs)."""
        t = self.res.logits
        place = self._logits_place
        if place is None or place[0] is not self.res or place[2] != t.data:
            place = self._logits_place = (self.res, self.sched.backend_of(t), t.data, t.nbytes(), (t.ne[1], t.ne[0]))
        _, be, addr, nbytes, shape = place
        raw = be.tensor_get(addr, nbytes)              # synchronous: waits for the backend; a fresh copy
        return raw.view(np.float32).reshape(shape)

    _logits = read_logits  # the runner's name for it

    # -- internals -----------------------------------------------------------------------------------------
    def _reuse_reason(self, params: GraphParams) -> str:
        if self.res is None:
            return "first graph"
        if self.reuse_disabled:
            return "reuse disabled"
        prev = self.res.params
        return "" if params is prev else _reuse_blocker(prev, params)    # _params hands back the kept one

    def _set_inputs(self, tokens, seqs, pos, cells, pre: _Prepared | None = None) -> None:
        """llm_graph_result::set_inputs: write this step's input tensors in place, in the input stages of the
        backends holding them, and send them (one batch per backend). The stages and their typed views are
        made once per built graph (a reused graph keeps its placement), two of each: steps alternate between
        the slots, so the next step's inputs can be written while this one's copies are in flight. Every
        input is written every step (out_ids too, fixed by the graph's params): a later graph's stage takes
        the same host memory. A step prepared early (prepare_decode) wrote all but its tokens already."""
        kept = self._kept_inputs()
        stages, views = kept.slots[self._slot]
        if pre is not None and pre.written == (kept, self._slot):     # kept compares by identity
            views[0][:] = tokens
        else:
            self._write_inputs(kept, self._slot, tokens, seqs, pos, cells)
        for st in stages:
            st.send()
        self._slot ^= 1

    def _kept_inputs(self) -> _GraphInputs:
        inp = self.res.inputs
        kept = self._inputs
        if kept is None or kept.res is not self.res or kept.mask_addr != inp.kq_mask.data:
            p = self.res.params
            kept = self._inputs = _GraphInputs(self.res, inp.kq_mask.data,
                                               [self._stage_inputs(inp, s) for s in (0, 1)],
                                               np.arange(p.n_tokens - p.n_outputs, p.n_tokens, dtype=np.int32))
        return kept

    def _write_inputs(self, kept: _GraphInputs, slot: int, tokens, seqs, pos, cells) -> None:
        """Every input of the kept graph into the views of `slot`, the tokens unless None."""
        stages, (tok, ps, mask, k_idx, v_idx, out) = kept.slots[slot]
        for st in stages:
            st.writable()
        out[:] = kept.out_ids
        if tokens is not None:
            tok[:] = tokens
        ps[:] = pos
        self.kv.mask(seqs, pos, self.res.params.n_kv, len(mask), out=mask)
        k_idx[:] = cells
        v_idx[:] = cells

    def _stage_inputs(self, inp, slot: int) -> tuple[list, tuple]:
        """(stages, typed views of tokens, pos, mask, k/v idxs and out_ids) of one slot: a stage per backend
        holding inputs."""
        tensors = (inp.tokens, inp.pos, inp.kq_mask, inp.k_idxs, inp.v_idxs, inp.out_ids)
        by_backend: dict[int, tuple] = {}
        for i, t in enumerate(tensors):
            by_backend.setdefault(id(be := self.sched.backend_of(t)), (be, []))[1].append(i)
        views: list = [None] * len(tensors)
        stages = []
        for be, members in by_backend.values():
            st = be.input_stage(tuple((tensors[i].data, tensors[i].nbytes()) for i in members), slot)
            stages.append(st)
            for i, raw in zip(members, st.views):
                t = tensors[i]
                if t.type == GGMLType.F32:                     # the mask: (rows, n_kv)
                    views[i] = raw.view(np.float32).reshape(-1, t.ne[0])
                else:
                    views[i] = raw.view(np.int32)
        return stages, tuple(views)


class _GraphInputs:
    """A built graph's input stages: for each of the two slots, (stages, typed views of tokens, pos, mask,
    k/v idxs, out_ids); the graph and its mask's address they were made for; its out_ids."""

    __slots__ = ("res", "mask_addr", "slots", "out_ids")

    def __init__(self, res: BuiltGraph, mask_addr: int, slots: list, out_ids: np.ndarray):
        self.res, self.mask_addr, self.slots, self.out_ids = res, mask_addr, slots, out_ids


class _Prepared:
    """A decode step placed early: its sequences (a tuple of ints and the int32 array), positions and cells,
    and (the graph's inputs, slot) when its inputs but the tokens were written too."""

    __slots__ = ("seqs", "seqs_a", "pos", "cells", "written")

    def __init__(self, seqs: tuple, seqs_a: np.ndarray, pos: np.ndarray, cells: np.ndarray):
        self.seqs, self.seqs_a, self.pos, self.cells, self.written = seqs, seqs_a, pos, cells, None


def make_context(model: Model, backends: list[Backend], bus: E.EventBus | None = None, n_cpu_moe: int = 0,
                 reuse_disabled: bool = False, split: LayerSplit | None = None, copier=None) -> Context:
    """Load the model (backends[0] default, backends[-1] the CPU for --n-cpu-moe), wire scheduler and context.
    With a layer `split` the GPU backends come first, one per device in device order (backend index =
    device), and `copier` moves split inputs between them."""
    bus = bus if bus is not None else E.EventBus()
    cpu = backends[-1] if len(backends) > 1 else None
    gpus = [b for b in backends if b.is_gpu]
    if split is not None and len(gpus) > 1:
        buffers = load_model(model, gpus, cpu, n_cpu_moe, device_of=split.tensor_device)
        pin = split.node_device
    else:
        buffers, pin = load_model(model, backends[0], cpu, n_cpu_moe), None
    sched = Scheduler(backends, model.arena, bus, pin=pin, copier=copier)
    for wb in buffers:
        sched.register_buffer(wb.addr, wb.nbytes, wb.backend)
    return Context(model, sched, bus, reuse_disabled)
