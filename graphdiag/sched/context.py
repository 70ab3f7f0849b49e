"""The context, modelled on llama_context::process_ubatch: KV cells, graph params, graph reuse.

Each step places the ubatch's tokens in KV-cache cells, derives the graph params (n_tokens, n_seqs, n_outputs,
graph type, padded n_kv) and either reuses the previous graph (only the inputs are refreshed; the scheduler stays
allocated, so split uids are unchanged) or resets the arena's compute region and the scheduler and rebuilds.

Graph results by output (llama.cpp 0c1e57098, #28549): the context keeps one graph result for ubatches with
outputs and one for ubatches with none (gf_res_prev[n_outputs > 0]), each with its own metadata buffer, so a
no-output ubatch (a prompt's ubatches before its last) builds its structs elsewhere: its first node, the CUDA
graph key, differs from the decode graph's. Only the active result is reused (gf_res_prev_active), so a switch
between them still rebuilds, into the same addresses as before. With `arenas_by_output` off (ggml d99724f2)
there is one result: both build in one buffer and share a key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .. import events as E
from ..backends.base import Backend
from ..errors import InternalError, UsageError
from ..model.build import DECODE, PREFILL, BuiltGraph, GraphParams, build_graph
from ..model.templates import GraphTemplates
from ..model.weights import Model, load_model
from ..plan import N_UBATCH
from .devices import LayerSplit
from .graph_inputs import KeptInputs
from .iswa import IswaCells
from .kv_cells import KvCells
from .scheduler import Scheduler

NO_OUTPUT_ARENA_SLOT = 1 << 15    # where the no-output graph result's structs start: far from the other's


def _n_seqs(seqs: np.ndarray) -> int:
    return 1 if len(seqs) == 1 else len(set(seqs.tolist()))


def _reuse_blocker(prev: GraphParams, new: GraphParams) -> str:
    """Why a graph built for `prev` cannot serve `new` ("" if it can): llm_graph_params::allow_reuse plus
    the inputs' can_reuse (the KQ mask's ne[0] must equal n_kv). Prefill and decode are not different graph
    types in llama.cpp (both LLM_GRAPH_TYPE_DEFAULT): only their shapes tell them apart."""
    for field, label in (("n_tokens", "n_tokens"), ("n_seqs", "n_seqs"), ("n_outputs", "n_outputs"),
                         ("n_kv", "n_kv"), ("n_kv_swa", "n_kv (SWA)")):
        a, b = getattr(prev, field), getattr(new, field)
        if a != b:
            why = f"{label} {a}→{b}"
            if field == "n_kv" and prev.n_kv_swa != new.n_kv_swa:     # both iSWA masks: say both
                why += f", n_kv (SWA) {prev.n_kv_swa}→{new.n_kv_swa}"
            return why
    return ""


def _make_cells(cfg):
    """The model's KV cells: llama.cpp's iSWA cache (global + sliding-window) for a model with a window,
    one cache of n_ctx cells otherwise."""
    if getattr(cfg, "n_swa", 0) > 0:
        return IswaCells(cfg.n_ctx, cfg.swa_size, cfg.n_swa)
    return KvCells(cfg.n_ctx)


def _n_kv_swa(kv) -> int:
    return kv.n_kv_swa() if isinstance(kv, IswaCells) else 0


class Context:
    """Runs ubatches through the scheduler. `step` is the number of the next step (from 0)."""

    def __init__(self, model: Model, sched: Scheduler, bus: E.EventBus | None = None, reuse_disabled: bool = False,
                 arenas_by_output: bool = True):
        self.model, self.sched = model, sched
        self.bus = bus if bus is not None else E.EventBus()
        self.reuse_disabled = reuse_disabled
        self.arenas_by_output = arenas_by_output  # two graph results, by n_outputs > 0 (0c1e57098; see above)
        self.kv = _make_cells(model.cfg)
        self.res: BuiltGraph | None = None
        self.templates = GraphTemplates(model)    # graphs built before, stamped out again for a new n_kv
        self._inputs: KeptInputs | None = None    # the kept graph's input stages
        self._slot = 0                            # the input slot the next step writes
        self._prepared: _Prepared | None = None   # the next decode step's placement, done early
        self._logits_place: tuple | None = None   # (res, backend, addr, nbytes, shape)
        self._logits_view: tuple | None = None    # (the read buffer, its float32 logits view)
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

    def prefill(self, tokens: Sequence[int], seq: int = 0, all_logits: bool = False,
                n_outputs: int = 1) -> np.ndarray:
        """Many tokens of one sequence, one ubatch -> logits of the last `n_outputs` tokens (n_outputs,
        n_vocab): the last token's by default, every token's with all_logits, none (0 rows) for a prompt's
        ubatch before its last."""
        n = len(tokens)
        pos = self.kv.next_pos(seq) + np.arange(n, dtype=np.int32)
        return self.process_ubatch(np.asarray(tokens, np.int32), np.full(n, seq, np.int32), pos,
                                   n if all_logits else n_outputs, PREFILL)

    def caller_ubatch(self, tokens: Sequence[int], pos: Sequence[int], seqs: Sequence[int], n_outputs: int,
                      removes: Sequence[tuple[int, int]] = ()) -> np.ndarray:
        """A ubatch as a caller of llama_decode gave it (token ids, positions, sequence ids, how many rows
        want logits), after removing the cells of each (seq, pos_min) in `removes` as the caller's
        llama_memory_seq_rm(seq, pos_min, -1) did. A graph type only names templates (llama.cpp has one
        type): decode when every row is its own sequence's and wants logits, else prefill."""
        for q, p0 in removes:
            n = self.kv.seq_rm(int(q), int(p0))
            self.bus.emit(E.CellsRemoved(step=self.step, t_ns=self.bus.clock(), seq=int(q), pos_min=int(p0),
                                         n_cells=n))
        seq_a = np.asarray(seqs, np.int32)
        one_each = len(set(seq_a.tolist())) == len(seq_a) and n_outputs == len(seq_a)
        return self.process_ubatch(np.asarray(tokens, np.int32), seq_a, np.asarray(pos, np.int32), n_outputs,
                                   DECODE if one_each else PREFILL)

    def invalidate(self) -> None:
        """Drop the kept graph (as llama.cpp after a scheduler reserve): the next step rebuilds."""
        self.res = None

    def sched_reserve(self, n_ubatch: int = N_UBATCH, n_seq_max: int = 1, n_outputs_max: int | None = None) -> None:
        """llama_context::sched_reserve, as the context is made: the worst-case graphs over the whole KV cache
        (memory->init_full: n_kv is every cell of each cache, the SWA one's too) reserved in turn on the
        scheduler: a prompt ubatch of min(n_ctx, n_ubatch) tokens with min(that, n_outputs_max) outputs
        (None: llama.cpp's default, n_batch, never below n_ubatch: every token), a decode ubatch of one token per
        sequence, the prompt ubatch again. ggml-alloc keeps the last plan; every later graph that fits it
        (the same node and leaf counts, no tensor larger: ggml_gallocr_needs_realloc) is placed by it, so a
        decode graph's tensors sit where the prompt's did, and which of its fusions pass the memory-range check
        depends on that plan (its masks' sizes included: n_kv of each cache). The kept graph is dropped, as
        graph_reserve resets gf_res_prev."""
        cfg = self.model.cfg
        n_tokens = min(cfg.n_ctx, n_ubatch)
        n_outputs = min(n_tokens, n_outputs_max or n_tokens)
        n_kv, n_kv_swa = self.kv.size, getattr(self.kv, "size_swa", 0)
        for t, outs, gtype in ((n_tokens, n_outputs, PREFILL), (n_seq_max, n_seq_max, DECODE),
                               (n_tokens, n_outputs, PREFILL)):
            self.model.arena.reset(0)
            self.sched.reset()
            params = GraphParams(t, min(n_seq_max, t), outs, gtype, n_kv, n_kv_swa)
            self.sched.reserve(build_graph(self.model, params, self.templates).graph)
        self.res = None

    def process_ubatch(self, tokens: np.ndarray, seqs: np.ndarray, pos: np.ndarray, n_outputs: int,
                       gtype: str) -> np.ndarray:
        """One step: place in the cache, reuse or rebuild, set inputs, compute; logits (n_outputs, n_vocab)."""
        step = self.step
        pre, self._prepared = self._prepared, None
        cells = pre.cells if pre is not None else self.kv.place(seqs, pos)
        try:
            return self._run_ubatch(step, tokens, seqs, pos, cells, pre, n_outputs, gtype)
        except BaseException:
            self._roll_back(step, seqs, pos)
            raise

    def _roll_back(self, step: int, seqs: np.ndarray, pos: np.ndarray) -> None:
        """llama_decode's failure path: every position the failed ubatch placed is removed from the cache
        (seq_rm(seq, pos_min, -1) for each of its sequences), and so is the next step's placement if it was
        made already, so the next decode sees the cache as it was before. The step still counts (the next
        one gets the next number). A graph that was built and allocated stays the kept one, as llama.cpp's
        gf_res_prev_active (a failed build or allocation left none: see _run_ubatch)."""
        pre, self._prepared = self._prepared, None
        first: dict[int, int] = {}
        for q, p in zip(seqs.tolist(), pos.tolist()):
            first[q] = min(first.get(q, p), p)
        if pre is not None:
            for q, p in zip(pre.seqs, pre.pos.tolist()):
                first[q] = min(first.get(q, p), p)
        for q, p0 in sorted(first.items()):
            n = self.kv.seq_rm(q, p0)
            self.bus.emit(E.CellsRemoved(step=step, t_ns=self.bus.clock(), seq=q, pos_min=p0, n_cells=n))
        self.step = step + 1

    def _run_ubatch(self, step: int, tokens, seqs, pos, cells, pre, n_outputs: int, gtype: str) -> np.ndarray:
        params = self._params(len(tokens), _n_seqs(seqs), n_outputs, gtype, self.kv.n_kv(), _n_kv_swa(self.kv))
        bus = self.bus
        # posted (made when the sinks take them): the fields in order, from step, split, key, uid, t_ns, device
        bus.post(E.StepStarted, step, -1, 0, 0, bus.clock(), 0, gtype, params.n_tokens, params.n_seqs, params.n_kv)
        self.sched.step = step             # the GPU runtimes' step too
        reason = self._reuse_reason(params)
        bus.post(E.ContextDecision, step, -1, 0, 0, bus.clock(), 0, not reason, reason)
        if reason:
            self.res = None                # not kept until it is built and allocated (gf_res_prev_active)
            no_output = self.arenas_by_output and params.n_outputs == 0
            self.model.arena.reset(NO_OUTPUT_ARENA_SLOT if no_output else 0)
            self.sched.reset()
            res = build_graph(self.model, params, self.templates)
            self.sched.alloc_graph(res.graph)
            self.res = res
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

    def recompute(self) -> None:
        """Compute the kept graph again on the last step's inputs (--verify's recompute), sent again first:
        the graph's own nodes may have taken their memory after their last reader, as ggml-alloc lets them."""
        stages, _ = self._kept_inputs().slots[self._slot ^ 1]     # _set_inputs flipped the slot after sending
        for st in stages:
            st.send()
        self.sched.graph_compute(self.res.graph)

    def _decode_params(self, seqs: np.ndarray) -> GraphParams:
        return self._params(len(seqs), _n_seqs(seqs), len(seqs), DECODE, self.kv.n_kv(), _n_kv_swa(self.kv))

    def _params(self, *fields) -> GraphParams:
        """This step's GraphParams; the kept graph's own object when nothing changed (a decode step)."""
        kept = self.res.params if self.res is not None else None
        if kept is not None and (kept.n_tokens, kept.n_seqs, kept.n_outputs, kept.gtype, kept.n_kv,
                                 kept.n_kv_swa) == fields:
            return kept
        return GraphParams(*fields)

    def can_reuse(self, params: GraphParams) -> bool:
        return self.res is not None and not _reuse_blocker(self.res.params, params)

    def read_logits(self) -> np.ndarray:
        """The last computed logits: (n_outputs, n_vocab) float32, read from the backend holding them (where
        they live is looked up once per built graph, as the inputs). A fresh array, unless `logits_in_place`
        is set: then the backend's own read buffer, read-only and valid until the next read (as llama.cpp's
        logits, in its pinned output buffer until the next decode), so a step copies nothing after its
        work ends."""
        t = self.res.logits
        place = self._logits_place
        if place is None or place[0] is not self.res or place[2] != t.data:
            place = self._logits_place = (self.res, self.sched.backend_of(t), t.data, t.nbytes(), (t.ne[1], t.ne[0]))
        _, be, addr, nbytes, shape = place
        # synchronous: waits for the backend
        if not self.logits_in_place:
            return be.tensor_get(addr, nbytes).view(np.float32).reshape(shape)
        raw = be.tensor_read(addr, nbytes)
        kept = self._logits_view       # (raw, logits): a backend hands out the same read buffer each step
        if kept is None or kept[0] is not raw or kept[1].shape != shape:
            kept = self._logits_view = (raw, raw.view(np.float32).reshape(shape))
        return kept[1]

    logits_in_place = False            # the runner's setting: logits valid until the next read, not copied

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

    def _kept_inputs(self) -> KeptInputs:
        inp = self.res.inputs
        kept = self._inputs
        if kept is None or kept.res is not self.res or kept.mask_addr != inp.kq_mask.data:
            kept = self._inputs = KeptInputs(self.res, self.sched.backend_of, self.model.cfg)
        return kept

    def _write_inputs(self, kept: KeptInputs, slot: int, tokens, seqs, pos, cells) -> None:
        """Every input of the kept graph into the views of `slot`, the tokens unless None."""
        kept.write(self.kv, slot, tokens, seqs, pos, cells)


class _Prepared:
    """A decode step placed early: its sequences (a tuple of ints and the int32 array), positions and cells,
    and (the graph's inputs, slot) when its inputs but the tokens were written too."""

    __slots__ = ("seqs", "seqs_a", "pos", "cells", "written")

    def __init__(self, seqs: tuple, seqs_a: np.ndarray, pos: np.ndarray, cells: np.ndarray):
        self.seqs, self.seqs_a, self.pos, self.cells, self.written = seqs, seqs_a, pos, cells, None


def make_context(model: Model, backends: list[Backend], bus: E.EventBus | None = None, n_cpu_moe: int = 0,
                 reuse_disabled: bool = False, split: LayerSplit | None = None, copier=None,
                 arenas_by_output: bool = True, upstream: str = "0c1e57098", n_ubatch: int = N_UBATCH,
                 n_seq_max: int = 1, n_outputs_max: int | None = None) -> Context:
    """Load the model (backends[0] default, backends[-1] the CPU for --n-cpu-moe), wire scheduler and context,
    and reserve the worst-case graphs (Context.sched_reserve: `n_ubatch`, `n_seq_max`, `n_outputs_max`, None
    for llama.cpp's default n_batch). With a layer `split` the GPU backends come first, one per device in
    device order (backend index = device), and `copier` moves split inputs between them. `arenas_by_output`:
    one graph result for ubatches with outputs and one for those without (llama.cpp 0c1e57098), else one
    (ggml d99724f2); `upstream`: whose ggml-alloc rules place the tensors (its in-place ops)."""
    bus = bus if bus is not None else E.EventBus()
    cpu = backends[-1] if len(backends) > 1 else None
    gpus = [b for b in backends if b.is_gpu]
    if split is not None and len(gpus) > 1:
        buffers = load_model(model, gpus, cpu, n_cpu_moe, device_of=split.tensor_device)
        pin = split.node_device
    else:
        buffers, pin = load_model(model, backends[0], cpu, n_cpu_moe), None
    sched = Scheduler(backends, model.arena, bus, pin=pin, copier=copier, upstream=upstream)
    for wb in buffers:
        sched.register_buffer(wb.addr, wb.nbytes, wb.backend)
    ctx = Context(model, sched, bus, reuse_disabled, arenas_by_output)
    ctx.sched_reserve(n_ubatch, n_seq_max, n_outputs_max)
    return ctx
