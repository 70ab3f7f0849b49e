"""A built graph's input tensors as the context writes them each step (llm_graph_result::set_inputs): two
slots of host stages and their typed views, the masks written from the KV cells (both caches' for the iSWA
cache), the cell indices, the output rows."""

from __future__ import annotations

import numpy as np

from ..ir.dtypes import GGMLType
from ..ir.tensor import Tensor
from ..model.build import BuiltGraph
from .iswa import IswaCells

_MASK_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}


def input_tensors(inp) -> tuple:
    """The graph's inputs in the order the views are kept: tokens, pos, mask, k/v idxs, out_ids, then the
    SWA cache's mask and k/v idxs (an iSWA graph with a window)."""
    base = (inp.tokens, inp.pos, inp.kq_mask, inp.k_idxs, inp.v_idxs, inp.out_ids)
    if getattr(inp, "kq_mask_swa", None) is None:
        return base
    return base + (inp.kq_mask_swa, inp.k_idxs_swa, inp.v_idxs_swa)


class KeptInputs:
    """A built graph's input stages: for each of the two slots, (stages, typed views in input_tensors'
    order); the graph and its mask's address they were made for; its out_ids; per mask (global, SWA) a
    float32 scratch when the mask is F16. `backend_of(tensor)` says which backend holds a tensor; `cfg`
    (n_ctx, swa_size) how large a later graph's masks may grow."""

    __slots__ = ("res", "mask_addr", "slots", "out_ids", "scratch")

    def __init__(self, res: BuiltGraph, backend_of, cfg):
        inp, p = res.inputs, res.params
        self.res, self.mask_addr = res, inp.kq_mask.data
        self.slots = [_stage(inp, s, backend_of, cfg) for s in (0, 1)]
        self.out_ids = np.arange(p.n_tokens - p.n_outputs, p.n_tokens, dtype=np.int32)
        self.scratch = tuple(None if t.type == GGMLType.F32 else np.empty((t.ne[1], t.ne[0]), np.float32)
                             for t in input_tensors(inp)[2::4])

    def write(self, kv, slot: int, tokens, seqs, pos, cells) -> None:
        """Every input into the views of `slot`, the tokens unless None. With the iSWA cache `cells` is
        (global cells, SWA cells) and the SWA cache's mask and idxs are written too."""
        stages, views = self.slots[slot]
        tok, ps, mask, k_idx, v_idx, out = views[:6]
        for st in stages:
            st.writable()
        out[:] = self.out_ids
        if tokens is not None:
            tok[:] = tokens
        ps[:] = pos
        p = self.res.params
        base_kv, base_cells = (kv.base, cells[0]) if isinstance(kv, IswaCells) else (kv, cells)
        _write_mask(base_kv, seqs, pos, p.n_kv, mask, self.scratch[0])
        k_idx[:] = base_cells
        v_idx[:] = base_cells
        if len(views) > 6:
            mask_s, k_s, v_s = views[6:]
            _write_mask(kv.swa, seqs, pos, p.n_kv_swa, mask_s, self.scratch[1])
            k_s[:] = cells[1]
            v_s[:] = cells[1]


def _stage(inp, slot: int, backend_of, cfg) -> tuple[list, tuple]:
    """(stages, typed views) of one slot: a stage per backend holding inputs."""
    tensors = input_tensors(inp)
    by_backend: dict[int, tuple] = {}
    for i, t in enumerate(tensors):
        by_backend.setdefault(id(be := backend_of(t)), (be, []))[1].append(i)
    views: list = [None] * len(tensors)
    stages = []
    # a later graph of this batch: the same rows at up to the mask's cache's cells
    grows = {2: _mask_grow(tensors[2], cfg.n_ctx)}
    if len(tensors) > 6:
        grows[6] = _mask_grow(tensors[6], cfg.swa_size)
    for be, members in by_backend.values():
        st = be.input_stage(tuple((tensors[i].data, tensors[i].nbytes()) for i in members), slot,
                            sum(grows.get(i, 0) for i in members))
        stages.append(st)
        for i, raw in zip(members, st.views):
            t = tensors[i]
            if t.type in _MASK_DTYPES:                     # a mask: (rows, n_kv)
                views[i] = raw.view(_MASK_DTYPES[t.type]).reshape(-1, t.ne[0])
            else:
                views[i] = raw.view(np.int32)
    return stages, tuple(views)


def _mask_grow(mask: Tensor, cells: int) -> int:
    return max(cells - mask.ne[0], 0) * (mask.nbytes() // max(mask.ne[0], 1))


def _write_mask(cells, seqs, pos, n_kv: int, view: np.ndarray, scratch: np.ndarray | None) -> None:
    """A cache's KQ mask into its input view: directly when the view is float32, else (an F16 mask, read by
    flash attention as it is) through the kept float32 scratch, cast on the copy (0 and -inf are exact)."""
    if view.dtype == np.float32:
        cells.mask(seqs, pos, n_kv, len(view), out=view)
    else:
        np.copyto(view, cells.mask(seqs, pos, n_kv, len(view), out=scratch), casting="same_kind")
