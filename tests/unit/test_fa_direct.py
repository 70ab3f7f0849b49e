"""Flash attention as one kernel where upstream's vec kernel runs alone (geometry.fa_direct): at one token on
Ada/Hopper its vec kernel takes the KV range in tiles of D positions and launches flash_attn_combine_results
only for more than one, so D = 256 at n_kv 256 is one kernel and n_kv 512 two (real llama.cpp on Gemma 3
270M, H200: tests/data/llama/kernels-gemma3-nkv-growth.json). The simulator's direct vec kernel computes
what its partials and the combine compute."""

import sys
from pathlib import Path

import numpy as np
import pytest

from graphdiag.backends.geometry import fa_direct, launch_geometry
from graphdiag.backends.kernels import fa_direct_kernel, fa_vec_kernel
from graphdiag.ir.dtypes import GGMLType as G

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from kernel_cases import Case, SimDevice  # noqa: E402


@pytest.mark.parametrize("args,want", [
    ((256, 4, 1, 256, 1, 1, 900), True),       # Gemma 3 at its first 256 cells
    ((256, 4, 1, 512, 1, 1, 900), False),      # two KV tiles: the combine
    ((256, 4, 1, 256, 2, 1, 900), False),      # two tokens: upstream's tensor-core kernel and its fixup
    ((256, 4, 1, 256, 1, 2, 900), False),      # two sequences (ne3 2): not the vec kernel upstream
    ((256, 4, 1, 256, 1, 1, 860), False),      # below Ada: upstream's choice is not modelled, two as before
    ((256, 8, 1, 256, 1, 1, 900), False),      # more than 4 heads per kv head at D 256: tensor cores
    ((128, 32, 8, 256, 1, 1, 900), False),     # D 128: n_kv 256 is two tiles
    ((64, 8, 8, 256, 1, 1, 900), False),
])
def test_the_rule(args, want):
    assert fa_direct(*args) is want


def _case(direct: bool, h=4, hkv=1, n_kv=256, vis=200, masked_row=False):
    d = 256
    c = Case(fa_vec_kernel(d, h // hkv), "x", 1e-6)
    c.rng = np.random.default_rng(7)
    kc, vc = c.randn(G.F16, d * hkv, n_kv), c.randn(G.F16, d * hkv, n_kv)
    kview = c.view(kc, (d, hkv, n_kv), (2, 2 * d, kc.nb[1]))
    vview = c.view(vc, (d, hkv, n_kv), (2, 2 * d, vc.nb[1]))
    m = np.zeros((8, n_kv), np.float32)
    m[:, vis:] = -np.inf
    if masked_row:
        m[...] = -np.inf
    q = c.randn(G.F32, d, h, 1)
    if direct:
        return c.set(c.output(G.F32, d, h, 1), q, kview, vview, c.put(G.F16, m), ip=(n_kv, 1, 1), fp=(1 / 16,))
    return c.set(c.output(G.F32, d + 2, 1, h, 1), q, kview, vview, c.put(G.F16, m), ip=(n_kv, 1), fp=(1 / 16,))


@pytest.mark.parametrize("kw", [{}, {"h": 8, "hkv": 4}, {"masked_row": True}])
def test_the_direct_kernel_is_partials_then_combine(kw):
    direct = _case(True, **kw).run(SimDevice()).view(np.float32)
    part = _case(False, **kw).run(SimDevice()).view(np.float32).reshape(1, -1, 1, 258)[..., :]
    c = Case("flash_attn_combine_f32", "x", 1e-6)
    h = part.shape[1]
    got = c.set(c.output(G.F32, 256, h, 1), c.put(G.F32, part.reshape(1, h, 1, 258)))
    combined = got.run(SimDevice()).view(np.float32)
    assert np.array_equal(direct[: 256 * h], combined[: 256 * h])
    if kw.get("masked_row"):
        assert not direct[: 256 * h].any()


def test_the_direct_launch_is_one_split():
    c = _case(True)
    p = c.params([0x1000 * (i + 1) for i in range(len(c.bufs))])
    assert launch_geometry(c.kernel, p.tobytes())[0] == (1, 1, 1)      # t[0] is the node: (256, 4, 1) is no split count


def test_the_direct_kernel_takes_f32_q_and_o_only():
    """Its Q and O rows are read and written as F32 (no per-element type switch: the kernel's code size), so the
    geometry refuses any other type rather than let it read the bytes as floats."""
    c = _case(True)
    c.kernel = fa_direct_kernel(256)
    p = c.params([0x1000 * (i + 1) for i in range(len(c.bufs))])
    p["ip"][3] = 1                     # a block per query head, as the lowering sets it
    assert launch_geometry(c.kernel, p.tobytes())[0] == (1, 4, 1)
    for slot in (0, 1):
        q = p.copy()
        q["t"][slot]["type"] = int(G.F16)
        with pytest.raises(ValueError, match="reads Q and writes O as F32"):
            launch_geometry(c.kernel, q.tobytes())


def test_gemma_attention_is_lowered_one_block_per_query_head():
    """The lowering launches Gemma 3's direct attention on flash_attn_vec_direct_f16_d*, one block per query head
    (grid (1, 4, 1)) as ggml's vec kernel has a block per head; the four heads sharing a kv head in one block
    (g4, grid (1, 1, 1)) ran on one SM at 94 µs a layer on the H200 (kernel_profile, 18 layers a step)."""
    from graphdiag.backends.gpu.lowering import lower_node
    from graphdiag.ir.ops import Op
    from graphdiag.model.build import DECODE, GraphParams, build_graph
    from graphdiag.model.presets import PRESETS
    from graphdiag.model.weights import create_model
    g = build_graph(create_model(PRESETS["gemma3-tiny"], G.F16, with_data=False),
                    GraphParams(1, 1, 1, DECODE, 256)).graph
    i = next(i for i in range(g.n_nodes) if g.node(i).op == Op.FLASH_ATTN_EXT)
    q, k = g.node(i).src[0], g.node(i).src[1]
    assert q.ne[2] == 4                                                 # 4 query heads on one kv head
    launch = lower_node(g, i, None, 900).launch
    assert launch.kernel == fa_direct_kernel(q.ne[0]) and launch.grid == (1, 4, 1)
    assert launch.block == (512, 1, 1)
    assert tuple(launch.params["ip"][1:4]) == (1, 1, 1)
    c = _case(True)
    p = c.params([0x1000 * (i + 1) for i in range(len(c.bufs))])
    p["ip"][3] = 1
    assert launch_geometry(fa_direct_kernel(256), p.tobytes())[0] == (1, 4, 1)
    with pytest.raises(ValueError, match="one query head per block is flash_attn_vec_direct_f16_d256"):
        launch_geometry(fa_vec_kernel(256, 4), p.tobytes())             # per head: the direct entry only
    p["ip"][0] = 288
    with pytest.raises(ValueError, match="at most 256"):
        launch_geometry(fa_direct_kernel(256), p.tobytes())             # its scores hold at most D positions
    p["ip"][0] = 128
    with pytest.raises(ValueError, match="all n_kv = 256 positions"):
        launch_geometry(fa_direct_kernel(256), p.tobytes())             # fewer would drop positions silently
    p["ip"][0], p["ip"][3] = 256, 0
    with pytest.raises(ValueError, match="one query head"):
        launch_geometry(fa_direct_kernel(256), p.tobytes())


@pytest.mark.parametrize("args,want", [
    ((64, 8, 8, 256, 1, 1, 900), True),        # tiny decode: upstream's vec kernel
    ((64, 8, 8, 256, 2, 1, 900), False),       # 2 tokens: its tensor-core kernel (recorded: tiny Q8_0 at 2 and 8)
    ((64, 8, 8, 256, 8, 1, 900), False),
    ((128, 8, 2, 256, 1, 1, 900), True),       # qwen3moe-tiny decode (G 4)
    ((128, 8, 2, 256, 1, 1, 800), False),      # Ampere: below Ada the GQA optimisation takes the tensor cores
    ((64, 8, 8, 256, 1, 1, 800), True),        # ... and without GQA the vec kernel
    ((256, 8, 1, 256, 1, 1, 900), False),      # more than 4 query heads a kv head at D 256
    ((64, 8, 8, 300, 1, 1, 900), False),       # a KV range not padded to 256
    ((64, 8, 8, 256, 4, 1, 700), True),        # before Turing: graphdiag's own rule (up to 8 tokens)
])
def test_which_flash_attention_kernel_runs(args, want):
    """geometry.fa_takes_vec: graphdiag's vec kernel where upstream's ggml_cuda_get_best_fattn_kernel
    (0c1e57098) takes its vec kernel."""
    from graphdiag.backends.geometry import fa_takes_vec
    assert fa_takes_vec(*args) is want
