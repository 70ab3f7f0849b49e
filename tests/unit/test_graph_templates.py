"""GraphTemplates: a graph stamped out again is, struct for struct, the graph the builder would build."""

import numpy as np
import pytest

from graphdiag.ir.arena import Arena
from graphdiag.model.build import DECODE, PREFILL, GraphParams, build_graph
from graphdiag.model.templates import GraphTemplates
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model

# a prefill growing chunk by chunk, decode batches, another prefill: keys repeat with new n_kv values
STEPS = [GraphParams(512, 1, 1, PREFILL, 512), GraphParams(512, 1, 1, PREFILL, 1024),
         GraphParams(1, 1, 1, DECODE, 1280), GraphParams(4, 4, 4, DECODE, 1280),
         GraphParams(512, 1, 1, PREFILL, 1536), GraphParams(1, 1, 1, DECODE, 1536),
         GraphParams(7, 1, 7, PREFILL, 1792), GraphParams(4, 4, 4, DECODE, 2048),
         GraphParams(7, 1, 7, PREFILL, 256)]


def _twins(preset: str, upstream: str = "0c1e57098"):
    """Two identical structure-only models, in small arenas that must grow as the graphs are built."""
    return [create_model(PRESETS[preset], with_data=False, arena=Arena(capacity=16), upstream=upstream)
            for _ in range(2)]


def _same(built, fresh, a: Arena, b: Arena) -> None:
    assert a.top == b.top and a.capacity == b.capacity
    assert a.raw[: a.top].tobytes() == b.raw[: b.top].tobytes()
    assert np.array_equal(built.graph.nodes, fresh.graph.nodes)
    assert np.array_equal(built.graph.leafs, fresh.graph.leafs)
    assert built.graph.uid == fresh.graph.uid == 0
    slots = lambda r: [t.idx for t in vars(r.inputs).values()] + [r.logits.idx]
    assert slots(built) == slots(fresh)


@pytest.mark.parametrize("preset,upstream", [("tiny", "0c1e57098"), ("moe-tiny", "0c1e57098"),
                                             ("small", "0c1e57098"), ("tiny", "d99724f2")])
def test_stamped_graphs_equal_built_ones(preset, upstream):
    """The n_kv-shaped set: the F16 mask and the cache views (0c1e57098); the F32 mask, its cast and the
    cache views (d99724f2)."""
    m, ref = _twins(preset, upstream)
    tpl = GraphTemplates(m)
    for p in STEPS:
        for x in (m, ref):
            x.arena.reset()
        built, fresh = build_graph(m, p, tpl), build_graph(ref, p)
        assert built.params is p
        _same(built, fresh, m.arena, ref.arena)
        # what the scheduler does to a built graph (rewire sources, place data) must not leak into a template
        m.arena.rec["data"][m.arena.mark: m.arena.top] = 0xDEAD
        m.arena.rec["src"][built.graph.nodes, 0] = 0
    assert (tpl.misses, tpl.hits) == (4, 5)


def test_the_first_slot_is_part_of_the_key():
    """A compute region that starts elsewhere (arena.skip) moves every source pointer: no stale template."""
    m, ref = _twins("tiny")
    tpl = GraphTemplates(m)
    p = GraphParams(1, 1, 1, DECODE, 256)
    for skip in (0, 3, 0, 3):
        for x in (m, ref):
            x.arena.skip = skip
            x.arena.reset()
        _same(build_graph(m, p, tpl), build_graph(ref, p), m.arena, ref.arena)
    assert (tpl.misses, tpl.hits) == (2, 2)


def test_least_recently_used_template_is_dropped():
    m, _ = _twins("tiny")
    tpl = GraphTemplates(m, limit=2)
    for n in (1, 2, 1, 3, 2):                       # 2 is dropped when 3 comes in
        m.arena.reset()
        build_graph(m, GraphParams(n, n, n, DECODE, 256), tpl)
    assert (tpl.misses, tpl.hits) == (4, 1)


def test_templates_serve_one_model():
    m, other = _twins("tiny")
    with pytest.raises(ValueError, match="model it was made for"):
        build_graph(other, GraphParams(1, 1, 1, DECODE, 256), GraphTemplates(m))
