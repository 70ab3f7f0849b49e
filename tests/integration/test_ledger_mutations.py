"""Mutation test of the identity ledger (issue 10 point 5): every field group of the node-property snapshot
is removed in turn, and a minimal graph pair shows what the omission would do.

Whole-model scenarios change several groups at once (a batch change moves ne, nb, data and every
consumer's src ne together), so removing one group is masked by the others. Here each case is a hand-built
pair of graphs, A and B, over the GPU backend on the simulated driver, that differ in exactly one group:
the same node count, the same struct addresses (the arena is rewound before each build), a new uid for
every build (so the uid fast path never applies). The key is warmed on A (eager, capture, replay), then B
is presented:

* with the full ledger, B is detected (PropertyDiff on the expected field, warmup reset, eager) and the
  device memory after B equals an eager recompute of B (``GpuBackend.verifying()``);
* with the group masked out of the snapshot (zeroed in the old and the new record alike, by wrapping the
  snapshot function the runtime calls), B is taken for A: the runtime replays A's executable, and the
  device memory differs from the eager recompute. The mutation is caught, so the group is needed.

Groups that cannot change alone are shown caught by the group they move with (``COVERED``); groups a
kernel never reads are shown harmless to drop (``NOT_NEEDED``: a masked change replays, and the replay is
still right).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from graphdiag import events as E
from graphdiag.backends.drivers.sim import SimDriver
from graphdiag.backends.gpu import ledger, runtime as runtime_mod
from graphdiag.backends.gpu.backend import GpuBackend
from graphdiag.backends.gpu.runtime import RuntimeOptions
from graphdiag.ir import Arena, GGMLType, Graph, Op, TensorFlag, next_uid
from graphdiag.ir.build import Ctx
from graphdiag.ir.tensor import Tensor

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
BUF = 1 << 14            # one device buffer holds every tensor of a case
X, X2, Y, Y2 = 0, 4096, 8192, 12288   # offsets in it: inputs at X / X2, outputs at Y / Y2

NEEDED, COVERED, NOT_NEEDED = "needed", "covered", "not needed"


@dataclass(frozen=True)
class Case:
    id: str
    mask: tuple[str, ...]      # snapshot fields zeroed: "node.<field>" or "src_data" / "src_ne" / "src_nb"
    build: Callable            # (ctx, base, b: bool) -> list of output tensors (A when b is False)
    field: str                 # the PropertyDiff field the full ledger reports for B
    kind: str = NEEDED
    masked_field: str = ""     # COVERED: the field that still catches B with the group masked
    init: Callable | None = None   # (buffer as float32) -> None: case-specific input values
    why: str = ""


def _leaf(ctx: Ctx, t, ne, data: int, nb=None, name="x") -> Tensor:
    x = ctx.new_tensor(t, ne, name, nb=nb)
    x.flags = x.flags | TensorFlag.INPUT
    x.data = data
    return x


def _node(ctx: Ctx, t, ne, op: Op, srcs, data: int, name: str, nb=None) -> Tensor:
    n = ctx.new_tensor(t, ne, name, op, srcs, nb=nb)
    n.data = data
    return n


# -- the cases --------------------------------------------------------------------------------------------
def op_params_eps(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.rms_norm(x, 4.0 if b else 1e-5, "norm")
    y.data = base + Y
    return [y]


def op_params_softmax_scale(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.soft_max(x, "probs", scale=0.125 if b else 1.0)
    y.data = base + Y
    return [y]


def op_mul_vs_add(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    x2 = _leaf(ctx, F32, (8, 2), base + X2, name="x2")
    y = _node(ctx, F32, (8, 2), Op.ADD if b else Op.MUL, (x, x2), base + Y, "out")
    return [y]


def type_cast_target(ctx, base, b):
    """A cast into a destination of fixed strides (nb0 = 4 for F16 too: a hand-set stride; ggml's own F16
    tensor would have nb0 = 2, so there a type change moves nb with it)."""
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = _node(ctx, F16 if b else F32, (8, 2), Op.CPY, (x,), base + Y, "cast", nb=(4, 32, 64, 64))
    return [y]


def ne_copy_reshaped(ctx, base, b):
    """The same 32 values copied into rows of 8 slots: as 4 rows of 8 (A) or 8 rows of 4 (B), same nb. The
    node is the split's last, so no consumer's src ne sees its ne."""
    x = _leaf(ctx, F32, (8, 4), base + X)
    y = _node(ctx, F32, (4, 8) if b else (8, 4), Op.CPY, (x,), base + Y, "cont", nb=(4, 32, 256, 256))
    return [y]


def nb_strided_output(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = _node(ctx, F32, (8, 2), Op.RMS_NORM, (x,), base + Y, "norm",
              nb=(4, 64, 128, 128) if b else (4, 32, 64, 64))
    y.set_param_f32(0, 1e-5)
    return [y]


def data_output_moved(ctx, base, b):
    """The split's output placed elsewhere (its last node: no consumer's src data moves with it)."""
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.rms_norm(x, 1e-5, "norm")
    y.data = base + (Y2 if b else Y)
    return [y]


def flags_compute_cleared(ctx, base, b):
    """The second node loses GGML_TENSOR_FLAG_COMPUTE in B: the backend must skip it (nothing written)."""
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.rms_norm(x, 1e-5, "norm")
    y.data = base + Y
    z = ctx.soft_max(x, "probs")
    z.data = base + Y2
    return [y, z], (lambda: setattr(z, "flags", z.flags & ~TensorFlag.COMPUTE)) if b else None


def src_ptr_retyped(ctx, base, b):
    """The cast's source switches between an F32 and an I32 tensor over the same bytes (same data, ne,
    nb): only src[0] (the struct pointer) differs; the snapshot's src fields hold no type."""
    xf = _leaf(ctx, F32, (8, 2), base + X, name="xf")
    xi = _leaf(ctx, I32, (8, 2), base + X, name="xi")
    y = _node(ctx, F32, (8, 2), Op.CPY, (xi if b else xf,), base + Y, "cast")
    return [y]


def src_data_input_moved(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + (X2 if b else X))
    y = ctx.rms_norm(x, 1e-5, "norm")
    y.data = base + Y
    return [y]


def src_ne_top_k(ctx, base, b):
    """llama.cpp #18561's shape: top_k over a source with more candidates per row (ne0 8 -> 12, rows at a
    fixed stride): the top_k node's own struct (ne = (k, rows), op_params k) is unchanged."""
    x = _leaf(ctx, F32, (12, 2) if b else (8, 2), base + X, nb=(4, 64, 128, 128))
    y = ctx.top_k(x, 4, "top_k")
    y.data = base + Y
    return [y]


def _ascending_rows(buf):
    buf[X // 4: X // 4 + 32] = np.tile(np.arange(16, dtype=np.float32), 2)


def src_nb_strided_input(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X, nb=(4, 64, 128, 128) if b else (4, 32, 64, 64))
    y = ctx.rms_norm(x, 1e-5, "norm")
    y.data = base + Y
    return [y]


def view_offs_cache_view(ctx, base, b):
    """A view of a cache at another offset: its data moves with view_offs (data = view_src.data + offs),
    and so does the consumer's src[0].data."""
    cache = _leaf(ctx, F32, (8, 16), base + X, name="cache")
    offs = 256 if b else 0
    v = ctx.view(cache, (8, 2), (4, 32), offs, "cache_view")
    v.data = base + X + offs
    y = ctx.rms_norm(v, 1e-5, "norm")
    y.data = base + Y
    return [y]


def view_src_other_cache(ctx, base, b):
    c0 = _leaf(ctx, F32, (8, 2), base + X, name="cache0")
    c1 = _leaf(ctx, F32, (8, 2), base + X2, name="cache1")
    src = c1 if b else c0
    v = ctx.view(src, (8, 2), (4, 32), 0, "cache_view")
    v.data = src.data
    y = ctx.rms_norm(v, 1e-5, "norm")
    y.data = base + Y
    return [y]


def ne_kv_view_grows(ctx, base, b):
    """The K-cache view at n_kv 8 -> 16 (as 256 -> 512): the view's ne grows with the same nb and data;
    its consumer's src[0].ne grows with it (top_k's own ne does not depend on ne0)."""
    cache = _leaf(ctx, F32, (16, 2), base + X, name="cache")
    v = ctx.view(cache, (16, 2) if b else (8, 2), (4, 64), 0, "k_view")
    v.data = base + X
    y = ctx.top_k(v, 4, "top_k")
    y.data = base + Y
    return [y]


def src_leaf_retyped_in_place(ctx, base, b):
    """The cast's source is the same leaf struct (same slot, same data, ne, nb) rebuilt as I32 instead of
    F32: no node record changes (leaves are not in the snapshot; src fields hold no type)."""
    x = _leaf(ctx, I32 if b else F32, (8, 2), base + X)
    y = _node(ctx, F32, (8, 2), Op.CPY, (x,), base + Y, "cast")
    return [y]


def name_only(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.rms_norm(x, 1e-5, "norm-b" if b else "norm-a")
    y.data = base + Y
    return [y]


def buffer_only(ctx, base, b):
    x = _leaf(ctx, F32, (8, 2), base + X)
    y = ctx.rms_norm(x, 1e-5, "norm")
    y.data = base + Y
    y.buffer = 0xB0F2 if b else 0xB0F1
    return [y]


def src_ptr_same_type(ctx, base, b):
    x0 = _leaf(ctx, F32, (8, 2), base + X, name="x0")
    x1 = _leaf(ctx, F32, (8, 2), base + X, name="x1")
    y = ctx.rms_norm(x1 if b else x0, 1e-5, "norm")
    y.data = base + Y
    return [y]


CASES = [
    Case("op_params", ("node.op_params",), op_params_eps, "op_params[0]"),
    Case("op_params-softmax-scale", ("node.op_params",), op_params_softmax_scale, "op_params[0]"),
    Case("op", ("node.op",), op_mul_vs_add, "op"),
    Case("type", ("node.type",), type_cast_target, "type"),
    Case("ne", ("node.ne",), ne_copy_reshaped, "ne[0]"),
    Case("nb", ("node.nb",), nb_strided_output, "nb[1]"),
    Case("data", ("node.data",), data_output_moved, "data"),
    Case("flags", ("node.flags",), flags_compute_cleared, "flags"),
    Case("src-pointers", ("node.src",), src_ptr_retyped, "src[0]"),
    Case("src-data", ("src_data",), src_data_input_moved, "src[0].data"),
    Case("src-ne", ("src_ne",), src_ne_top_k, "src[0].ne[0]", init=_ascending_rows),
    Case("src-nb", ("src_nb",), src_nb_strided_input, "src[0].nb[1]"),
    # groups that cannot change alone: caught by the group they move with
    Case("view_offs", ("node.view_offs",), view_offs_cache_view, "view_offs", COVERED, "data"),
    Case("view_offs+data", ("node.view_offs", "node.data"), view_offs_cache_view, "view_offs", COVERED,
         "src[0].data"),
    Case("view_offs+data+src-data", ("node.view_offs", "node.data", "src_data"), view_offs_cache_view,
         "view_offs", NEEDED, why="every address of the move removed: nothing is left to catch it"),
    Case("view_src", ("node.view_src",), view_src_other_cache, "src[0]", COVERED, "src[0]"),
    Case("view_src+src+data", ("node.view_src", "node.src", "node.data"), view_src_other_cache, "src[0]",
         COVERED, "src[0].data"),
    Case("ne-kv-view", ("node.ne",), ne_kv_view_grows, "ne[0]", COVERED, "src[0].ne[0]"),
    Case("ne-kv-view+src-ne", ("node.ne", "src_ne"), ne_kv_view_grows, "ne[0]", NEEDED,
         why="the view's ne and its consumer's src ne both removed"),
    # groups no kernel reads: a masked change replays, and the replay is right
    Case("name", ("node.name",), name_only, "name", NOT_NEEDED),
    Case("buffer", ("node.buffer",), buffer_only, "buffer", NOT_NEEDED),
    Case("src-pointers-same-type", ("node.src",), src_ptr_same_type, "src[0]", NOT_NEEDED),
]


# -- the harness ------------------------------------------------------------------------------------------
def masked_snapshot(fields: tuple[str, ...]):
    """ledger.snapshot with `fields` zeroed in every record (old and new alike: each call goes through it)."""
    real = ledger.snapshot

    def snap(arena, nodes, out=None):
        s = real(arena, nodes, out)
        for f in fields:
            if f.startswith("node."):
                s["node"][f[5:]] = 0
            else:
                s[f] = 0
        return s
    return snap


class Rig:
    """A GPU backend on the simulated driver, one device buffer, one arena rewound for every build."""

    def __init__(self, case: Case):
        self.case = case
        self.driver = SimDriver(memory_bytes=64 << 20)
        self.bus = E.EventBus()
        self.events: list = []
        self.bus.subscribe(self.events.append)
        self.gpu = GpuBackend(self.driver, self.bus, RuntimeOptions())
        self.base = self.gpu.buffer_alloc(BUF)
        self.arena = Arena(capacity=64)
        self.init = np.random.default_rng(7).standard_normal(BUF // 4).astype(np.float32)
        if case.init is not None:
            case.init(self.init)

    def build(self, b: bool) -> Graph:
        self.arena.reset()
        got = self.case.build(Ctx(self.arena), self.base, b)
        outs, post = got if isinstance(got, tuple) else (got, None)
        g = Graph(self.arena)
        for t in outs:
            g.build_forward_expand(t)
        if post is not None:
            post()
        g.uid = next_uid()
        return g

    def memory_after(self, g: Graph, eager: bool = False) -> np.ndarray:
        """The whole buffer after computing g over freshly written inputs (the same bytes every time)."""
        self.gpu.tensor_set(self.base, self.init)
        if eager:
            with self.gpu.verifying():
                self.gpu.graph_compute(g, 0)
        else:
            self.gpu.graph_compute(g, 0)
        return self.gpu.tensor_get(self.base, BUF)

    def present_b(self):
        """Warm the key on A (eager, capture, replay), then compute B; (B's events, memory, eager memory)."""
        for _ in range(3):
            self.memory_after(self.build(False))
        assert self.phases() == ["eager", "capture", "replay"]
        first = len(self.events)
        g = self.build(True)
        got = self.memory_after(g)
        new = self.events[first:]
        want = self.memory_after(g, eager=True)
        return new, got, want

    def phases(self) -> list[str]:
        return [e.phase for e in self.events if isinstance(e, E.PhaseDecided)]

    def close(self):
        self.gpu.close()
        self.driver.close()


@pytest.fixture
def rig(request):
    r = Rig(request.param)
    yield r
    r.close()


def _phase(evs) -> str:
    (p,) = [e.phase for e in evs if isinstance(e, E.PhaseDecided)]
    return p


def _diff_field(evs) -> str | None:
    d = [e for e in evs if isinstance(e, E.PropertyDiff)]
    return d[0].field if d else None


@pytest.mark.parametrize("rig", CASES, ids=[c.id for c in CASES], indirect=True)
def test_full_ledger_detects_the_change_and_computes_it(rig):
    evs, got, want = rig.present_b()
    assert _diff_field(evs) == rig.case.field
    assert [(w.from_state, w.to_state) for w in evs if isinstance(w, E.WarmupTransition)] == [("warm", "cold")]
    assert _phase(evs) == "eager"
    assert np.array_equal(got, want)


@pytest.mark.parametrize("rig", CASES, ids=[c.id for c in CASES], indirect=True)
def test_the_group_masked_out_of_the_snapshot(rig, monkeypatch):
    case = rig.case
    monkeypatch.setattr(runtime_mod, "snapshot", masked_snapshot(case.mask))
    evs, got, want = rig.present_b()
    if case.kind == NEEDED:
        # the omission replays A's executable for B: stale, and the eager recompute says so
        assert _diff_field(evs) is None and _phase(evs) == "replay"
        assert not np.array_equal(got, want), f"{case.id}: the stale replay computed what B computes"
    elif case.kind == COVERED:
        assert _diff_field(evs) == case.masked_field and _phase(evs) == "eager"
        assert np.array_equal(got, want)
    else:
        assert _diff_field(evs) is None and _phase(evs) == "replay"
        assert np.array_equal(got, want), f"{case.id}: a field no kernel reads changed the replay's result"


def test_every_snapshot_field_group_has_a_case():
    """The cases cover every field of node_properties but the implicit padding and `extra` (always NULL:
    graphdiag gives no tensor an extra, as ggml-cuda no longer does)."""
    masked = {f for c in CASES for f in c.mask}
    fields = {f"node.{n}" for n in ledger.PROPS_DTYPE["node"].names} | {"src_data", "src_ne", "src_nb"}
    assert fields - masked == {"node.padding", "node.extra"}


def test_a_leaf_source_retyped_in_place_is_not_in_the_snapshot():
    """What no group covers: a source that is not a node, rebuilt at the same struct address with another
    type of the same size (F32 -> I32, same data, ne and nb). node_properties holds a source's data, ne and
    nb, not its type, so the full ledger replays the stale executable. Upstream's ledger has the same blind
    spot; a ggml-built graph reaches it only if an input changes type in place, which llama.cpp never does."""
    r = Rig(Case("src-type", (), src_leaf_retyped_in_place, ""))
    try:
        evs, got, want = r.present_b()
        assert _diff_field(evs) is None and _phase(evs) == "replay"
        assert not np.array_equal(got, want)
    finally:
        r.close()
