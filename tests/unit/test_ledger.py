"""The vectorised node-property ledger: snapshot layout, first differing node and exact field path."""

import numpy as np

from graphdiag.backends.gpu.ledger import PROPS_DTYPE, changed_nodes, first_field_diff, snapshot, all_field_diffs
from graphdiag.ir import Arena, GGMLType, Graph
from graphdiag.ir.build import Ctx


def _graph(arena, n_tokens, name_suffix=""):
    """w persistent (built once), x and the compute nodes in the rewound region."""
    ctx = Ctx(arena)
    if arena.mark == 0:
        ctx.new_tensor(GGMLType.F16, (64, 32), "w")
        arena.freeze()
    from graphdiag.ir import Tensor
    w = Tensor(arena, 0)
    x = ctx.new_input(GGMLType.F32, (64, n_tokens), "x")
    y = ctx.mul_mat(w, x, "y" + name_suffix)
    z = ctx.rms_norm(y, 1e-5, "z")
    g = Graph(arena)
    g.build_forward_expand(z)
    return g, w, x, y, z


def test_snapshot_matches_node_properties_layout():
    a = Arena()
    g, w, x, y, z = _graph(a, 1)
    w.data, x.data, y.data = 0x1000, 0x2000, 0x3000
    snap = snapshot(a, g.nodes)
    assert snap.dtype.itemsize == 1056 and len(snap) == 2
    assert snap["node"][0]["name"] == b"y"
    assert snap["src_data"][0][:2].tolist() == [0x1000, 0x2000]
    assert snap["src_ne"][0][1].tolist() == [64, 1, 1, 1]
    assert snap["src_data"][1][0] == 0x3000        # z reads y's data
    assert (snap["src_ne"][0][2:] == 0).all()      # null sources stay zero


def test_identical_rebuild_has_no_change_and_batch_change_names_field():
    a = Arena()
    g1, *_ = _graph(a, 1)
    s1 = snapshot(a, g1.nodes)
    a.reset()
    g2, *_ = _graph(a, 1)
    assert g2.first_node_addr == g1.first_node_addr
    assert len(changed_nodes(s1, snapshot(a, g2.nodes))) == 0
    a.reset()
    g3, *_ = _graph(a, 2)
    s3 = snapshot(a, g3.nodes)
    ch = changed_nodes(s1, s3)
    assert ch.tolist() == [0, 1]
    d = first_field_diff(s1, s3, 0)
    assert (d.node, d.node_name, d.op, d.field, d.old, d.new) == (0, "y", "MUL_MAT", "ne[1]", "1", "2")
    fields = [f for f, _, _ in all_field_diffs(s1, s3, 0)]
    assert "src[1].ne[1]" in fields and "nb[2]" in fields


def test_field_paths_for_data_src_data_name_and_op_params():
    a = Arena()
    g, w, x, y, z = _graph(a, 1)
    s0 = snapshot(a, g.nodes)
    x.data = 0x9000
    d = first_field_diff(s0, snapshot(a, g.nodes), int(changed_nodes(s0, snapshot(a, g.nodes))[0]))
    assert (d.field, d.old, d.new) == ("src[1].data", "NULL", "0x9000")
    s1 = snapshot(a, g.nodes)
    z.set_param_f32(0, 1e-6)
    s2 = snapshot(a, g.nodes)
    d = first_field_diff(s1, s2, int(changed_nodes(s1, s2)[0]))
    assert d.field == "op_params[0]" and d.node_name == "z"
    s3 = snapshot(a, g.nodes)
    y.name = "renamed"
    s4 = snapshot(a, g.nodes)
    d = first_field_diff(s3, s4, 0)
    assert (d.field, d.old, d.new) == ("name", "y", "renamed")


def test_address_namer_names_by_allocation_order_and_forgets_freed_buffers():
    from graphdiag.backends.gpu.ledger_rows import AddressNamer
    n = AddressNamer()
    n.add(0x9000)
    n.add(0x1000)
    assert n.name(0x9010) == "b0+0x10" and n.name(0x1004) == "b1+0x4" and n.name(0) == "NULL"
    n.remove(0x9000)
    n.add(0x8000)                      # a new buffer below the freed one, extending past its base
    assert n.name(0x9010) == "b2+0x1010"


def test_the_reported_field_prefers_the_shape_over_a_moved_address():
    """A realloc moves the buffer and the data while ne changes: the report names ne (the cause); an
    address is named only when nothing else differs (addresses are the allocator's, and differ by driver)."""
    a = Arena()
    g, w, x, y, z = _graph(a, 1)
    y.buffer, y.data = 0x100, 0x3000
    old = snapshot(a, g.nodes)
    a.reset()
    g, w, x, y, z = _graph(a, 2)
    y.buffer, y.data = 0x200, 0x5000
    d = first_field_diff(old, snapshot(a, g.nodes), 0)
    assert (d.field, d.old, d.new) == ("ne[1]", "1", "2")
    a.reset()
    g, w, x, y, z = _graph(a, 1)
    y.buffer, y.data = 0x200, 0x3000
    assert first_field_diff(old, snapshot(a, g.nodes), 0).field == "buffer"
    a.reset()
    g, w, x, y, z = _graph(a, 1)       # buffer and data both moved: `data`, whether or not the base moved
    y.buffer, y.data = 0x200, 0x5000
    assert first_field_diff(old, snapshot(a, g.nodes), 0).field == "data"
