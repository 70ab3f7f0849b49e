"""A Gemma 3 Model (model/weights.Model): seeded weights as the presets', or a GGUF file's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ...ir.arena import Arena
from ...ir.dtypes import GGMLType
from ..weights import HostWeights, Model
from .gemma3 import Gemma3Config, create_structs
from .gemma3_graph import Gemma3Builder


def build_gemma3_graph(model: Model, params):
    """The ubatch's graph (model/arch/gemma3_graph.py): the Model's graph_builder."""
    return Gemma3Builder(model, params).build()


def create_model(cfg: Gemma3Config, wtype: GGMLType = GGMLType.F16, seed: int = 0, with_data: bool = True,
                 types: Mapping[str, GGMLType] | None = None, arena: Arena | None = None) -> Model:
    """The structs in a fresh arena, frozen; `with_data`: seeded values as the presets' (weights.HostWeights),
    else zeros (a structure-only model)."""
    arena = arena if arena is not None else Arena()
    s = create_structs(cfg, arena, types or {}, GGMLType(wtype))
    arena.freeze()
    model = Model(cfg, GGMLType(wtype), arena, s.tok_embd, s.output_norm, s.output, s.layers,
                  graph_builder=build_gemma3_graph)
    if with_data:
        model.seed = seed
        model.host = HostWeights(model, seed)
    return model


def create_file_model(g, with_data: bool = True, swa_full: bool = False, n_seq_max: int = 1) -> Model:
    """The model of a validated gemma3 GGUF (model/gguf_io.GgufModel), its SWA cache sized for `n_seq_max`
    sequences (the global size with `swa_full`); the file's memory-mapped values unless `with_data` is False."""
    from ..gguf_io import FileWeights
    cfg = dataclasses.replace(g.cfg, swa_full=swa_full, n_seq_max=n_seq_max)
    model = create_model(cfg, g.main_type, with_data=False, types=g.types)
    if with_data:
        model.file, model.host = g, FileWeights(g)
    return model
