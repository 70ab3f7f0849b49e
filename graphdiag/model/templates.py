"""GraphTemplates: graphs built before, stamped out again as bytes for another n_kv (model/build.py's graphs)."""

from __future__ import annotations

import dataclasses
import struct
from collections import OrderedDict

from ..ir.arena import TENSOR_DTYPE, TENSOR_SIZE
from ..ir.graph import Graph
from ..ir.tensor import Tensor
from .arch import get_arch
from .graph_context import BuiltGraph, GraphContext, GraphInputs, GraphParams
from .weights import Model

_LAYOUT = struct.Struct("<4q4Q")                  # ne then nb, adjacent in the struct
assert TENSOR_DTYPE.fields["nb"][1] == TENSOR_DTYPE.fields["ne"][1] + 32
_O_NE = TENSOR_DTYPE.fields["ne"][1]
_INPUT_FIELDS = tuple(f.name for f in dataclasses.fields(GraphInputs))


class _Template:
    """A graph's structs as built (bytes of slots [start, end)), its node and leaf lists, the slots of its
    inputs and logits, and the n_kv-shaped tensors."""

    __slots__ = ("start", "end", "raw", "nodes", "leafs", "inputs", "logits", "n_kv_shaped")

    def __init__(self, b: GraphContext, start: int, res: BuiltGraph):
        arena = b.m.arena
        self.start, self.end = start, arena.top
        self.raw = bytes(arena.mem[start * TENSOR_SIZE:arena.top * TENSOR_SIZE])
        self.nodes, self.leafs = res.graph.nodes.copy(), res.graph.leafs.copy()
        self.inputs = {f: getattr(res.inputs, f).idx for f in _INPUT_FIELDS}
        self.logits = res.logits.idx
        self.n_kv_shaped = b.n_kv_shaped


class GraphTemplates:
    """Graphs built before, kept to stamp out the same graph again for another n_kv (a prefill's n_kv grows
    chunk by chunk): the structs are copied back as bytes and only the n_kv-shaped ones (the KQ mask, its
    cast under d99724f2's rules, the cache views) get their ne/nb rewritten, by the layouts the builder made
    them with.

    Key: (n_tokens, n_seqs, n_outputs, gtype, the compute region's first slot). It is complete because the
    builder reads nothing else: the params, the model's config and upstream, its persistent structs (type,
    ne, nb and addresses of weights and caches, fixed once the arena is frozen; their data is never read), and
    the first slot, which sets every compute struct's address and so every source pointer. n_kv is left out
    of the key as it sets only the n_kv-shaped tensors' layouts. One model per instance; at most `limit`
    graphs kept, the least recently used dropped first."""

    def __init__(self, model: Model, limit: int = 8):
        self.model, self.limit = model, limit
        self._kept: OrderedDict[tuple, _Template] = OrderedDict()
        self.hits = self.misses = 0

    def build(self, model: Model, params: GraphParams) -> BuiltGraph:
        if model is not self.model:
            raise ValueError("GraphTemplates serves the model it was made for")
        arena = model.arena
        key = (params.n_tokens, params.n_seqs, params.n_outputs, params.gtype, arena.top)
        tpl = self._kept.get(key)
        if tpl is None:
            self.misses += 1
            b = get_arch(model.cfg.arch).Builder(model, params)   # build.builder_for (build imports this module)
            res = b.build()
            self._kept[key] = _Template(b, key[-1], res)
            if len(self._kept) > self.limit:
                self._kept.popitem(last=False)
            return res
        self.hits += 1
        self._kept.move_to_end(key)
        return self._stamp(tpl, params)

    def _stamp(self, tpl: _Template, params: GraphParams) -> BuiltGraph:
        """The template's structs in its slots, with params' n_kv layouts."""
        arena = self.model.arena
        arena.fit(tpl.end)
        mem = arena.mem
        mem[tpl.start * TENSOR_SIZE:tpl.end * TENSOR_SIZE] = tpl.raw
        arena.top = tpl.end
        for slot, layout in tpl.n_kv_shaped:
            ne, nb = layout(params.n_kv)
            _LAYOUT.pack_into(mem, slot * TENSOR_SIZE + _O_NE, *ne, *nb)
        g = Graph(arena, tpl.nodes.copy(), tpl.leafs.copy())
        inputs = GraphInputs(**{f: Tensor(arena, i) for f, i in tpl.inputs.items()})
        return BuiltGraph(g, params, inputs, Tensor(arena, tpl.logits))
