"""The decode/prefill graph of one ubatch: the architecture's builder picked from the registry.

The builders are model/arch/'s (each on the public interface in model/graph_context.py, as llama.cpp's
src/models/*.cpp on llm_graph_context); this module sits above the registry, so nothing under model/arch/
imports it. GraphParams, GraphInputs, BuiltGraph and the graph constants are graph_context's, named here too
for the modules that build graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arch import get_arch
from .graph_context import (CAST_MASK_UPSTREAM, DECODE, KQ_MASK_PAD, KV_PAD, PREFILL, BuiltGraph,  # noqa: F401
                            GraphContext, GraphInputs, GraphParams, _pad)
from .weights import Model

if TYPE_CHECKING:
    from .templates import GraphTemplates


def build_graph(model: Model, params: GraphParams, templates: "GraphTemplates | None" = None) -> BuiltGraph:
    """Build the ubatch's graph in the arena's compute region (call `arena.reset()` first to rebuild); with
    `templates`, a graph of the same shape built before is stamped out instead (the same structs)."""
    if params.n_kv > model.cfg.n_ctx:
        raise ValueError(f"n_kv {params.n_kv} > n_ctx {model.cfg.n_ctx}")
    if templates is not None and _stampable(model) and builder_for(model).TEMPLATES:
        return templates.build(model, params)
    return builder_for(model)(model, params).build()


def builder_for(model: Model) -> type[GraphContext]:
    """The graph builder of the model's architecture (model/arch/: the registry)."""
    return get_arch(model.cfg.arch).Builder


def _stampable(model: Model) -> bool:
    """Whether GraphTemplates may stamp the arch's graphs: it rewrites one set of n_kv-shaped tensors, so an
    arch whose graphs have others (gemma3's SWA cache) sets STAMPABLE = False and is built afresh."""
    return getattr(get_arch(model.cfg.arch), "STAMPABLE", True)


def padded_n_kv(used_cells: int, n_ctx: int) -> int:
    """llama.cpp's n_kv: cells in use (highest used cell + 1) padded to KV_PAD, at most n_ctx."""
    return min(n_ctx, max(KV_PAD, _pad(used_cells, KV_PAD)))
