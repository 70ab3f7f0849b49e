"""Upstream's stream-k MMQ fixup and graphdiag's k-split that stands in for it: the rule (launch_mul_mat_q at
0c1e57098), the three launches it lowers to, and the split's sum being the unsplit product (simulated kernels).
The kernel counts it gives against real llama.cpp's captures are tests/integration/test_captured_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiag.backends.abi import Q8_1, Q8_1_BYTES, new_params, set_desc
from graphdiag.backends.gpu.capture import lower_graph
from graphdiag.backends.gpu.compat import mmq_stream_k_parts
from graphdiag.backends.gpu.fusion import fusion_plan
from graphdiag.backends.gpu.lowering import op_launches
from graphdiag.backends.sim_kernels import k_parts, quantize_q8_1, run_kernel
from graphdiag.backends.sim_view import AddressSpace
from graphdiag.ir.dtypes import GGMLType
from graphdiag.model.build import DECODE, GraphParams, build_graph
from graphdiag.model.presets import PRESETS
from graphdiag.model.weights import create_model
from graphdiag.memory import quantize_q8_0

H200 = 132


@pytest.mark.parametrize("m,ncols,batch,expect", [
    (262144, 9, 1, 0),     # Gemma 3's tied lm_head: 2048 tiles, 16 waves, 96 % efficient: no fixup
    (2048, 9, 1, 8),       # 16 tiles on 132 SMs: fixup (parts capped at 8)
    (256, 9, 1, 4),        # 2 tiles, K = 256: 4 units of 64, so 4 parts
    (128 * 132, 9, 1, 0),  # exactly one wave: 100 %
    (128 * 120, 9, 1, 0),  # 120 tiles: 90 % (integer percent, as upstream), no fixup
    (128 * 118, 9, 1, 2),  # 118 tiles: 89 %
    (640, 512, 1, 7),      # 5 x 4 tiles: 15 %; ceil(132 / 20) parts
    (640, 512, 8, 2),      # 160 tiles: 2 waves, 60 %
])
def test_fixup_rule_follows_launch_mul_mat_q(m, ncols, batch, expect):
    k = 256 if m == 256 else 2048
    assert mmq_stream_k_parts(m, ncols, batch, k, H200, 900) == expect


def test_no_stream_k_below_volta_and_tiles_follow_the_sm_count():
    assert mmq_stream_k_parts(2048, 9, 1, 2048, H200, 610) == 0        # Pascal's dp4a configs: no stream-k
    assert mmq_stream_k_parts(2048, 9, 1, 2048, H200, 700) == 8
    assert mmq_stream_k_parts(128 * 16, 9, 1, 2048, 16, 900) == 0       # 16 tiles on 16 SMs: one full wave
    assert mmq_stream_k_parts(128 * 16, 200, 1, 2048, 16, 900) == 0     # 2 column tiles: 32 tiles, 2 waves
    assert mmq_stream_k_parts(128 * 17, 9, 1, 2048, 16, 900) == 2       # 17 on 16: 53 %


def _batch_launches(wtype, n_tokens, nsm=H200):
    """The kernels of tiny's graph of `n_tokens` sequences decoding one token each (every row an output)."""
    m = create_model(PRESETS["tiny"], wtype, with_data=False)
    g = build_graph(m, GraphParams(n_tokens, n_tokens, n_tokens, DECODE, 256)).graph
    return [la.kernel for op in lower_graph(g, fusion_plan(g, 900), 900, nsm=nsm) if op is not None
            for la in op_launches(op)]


def test_tiny_q8_0_lowers_a_fixup_after_each_mat_mul_llama_cpp_fixes_up():
    """tiny Q8_0 at 9 sequences: llama.cpp's capture had 29 mul_mat_q_stream_k_fixup (kernels-tiny-q8_0-fusion-
    boundary.json: all 7 mat-muls of 4 layers and the lm_head); each follows a split mul_mat_q8_0."""
    names = _batch_launches(GGMLType.Q8_0, 9)
    assert names.count("mul_mat_fixup_f32") == 29
    at = [i for i, n in enumerate(names) if n == "mul_mat_fixup_f32"]
    assert all(names[i - 1] == "mul_mat_q8_0" and names[i - 2] == "quantize_q8_1" for i in at)
    assert _batch_launches(GGMLType.F16, 9).count("mul_mat_fixup_f32") == 0       # cuBLAS/MMF: none
    assert _batch_launches(GGMLType.Q8_0, 9, nsm=1).count("mul_mat_fixup_f32") == 0   # one SM: every tile full


def _run(space, name, slots, ip=()):
    p = new_params()
    for i, (addr, t, ne, nb) in enumerate(slots):
        if addr:
            set_desc(p, i, addr, t, ne, nb)
    p["ip"][: len(ip)] = ip
    run_kernel(space, name, p)


def _put(space, data: bytes) -> int:
    a = space.alloc(len(data))
    space.bytes(a, len(data))[...] = np.frombuffer(data, np.uint8)
    return a


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
@pytest.mark.parametrize("parts", [2, 3, 7])
def test_split_and_fixup_sum_to_the_unsplit_product(wtype, parts):
    """K = 416: 7 units of 64, the last one partial (Q8_0: one block of 32); 7 parts: one unit each."""
    rng = np.random.default_rng(parts)
    k, m, n, b = 416, 70, 11, 2
    space = AddressSpace(0x7F00_0000_0000)
    wv = rng.standard_normal((m, k)).astype(np.float32)
    xv = rng.standard_normal((b, n, k)).astype(np.float32)
    f32 = int(GGMLType.F32)
    if wtype == "q8_0":
        w = (_put(space, quantize_q8_0(wv).tobytes()), int(GGMLType.Q8_0), (k, m, 1, 1), (34, 34 * k // 32, 34 * m * k // 32, 34 * m * k // 32))
        row = Q8_1_BYTES * k // 32
        x = (_put(space, quantize_q8_1(xv).tobytes()), Q8_1, (k, n, b, 1), (Q8_1_BYTES, row, row * n, row * n * b))
    else:
        w = (_put(space, wv.astype(np.float16).tobytes()), int(GGMLType.F16), (k, m, 1, 1), (2, 2 * k, 2 * k * m, 2 * k * m))
        x = (_put(space, xv.tobytes()), f32, (k, n, b, 1), (4, 4 * k, 4 * k * n, 4 * k * n * b))
    nb = (4, 4 * m, 4 * m * n, 4 * m * n * b)
    whole = (space.alloc(nb[3]), f32, (m, n, b, 1), nb)
    dst = (space.alloc(nb[3]), f32, (m, n, b, 1), nb)
    partials = (space.alloc(nb[3] * (parts - 1)), f32, (m, n, b, parts - 1), nb)
    _run(space, f"mul_mat_{wtype}", [whole, w, x])
    _run(space, f"mul_mat_{wtype}", [dst, w, x, partials], ip=(parts,))
    ranges = k_parts(np.array([(parts,)], [("ip", "<i4", (1,))])[0], k)
    assert ranges[0][0] == 0 and ranges[-1][1] == k and all(a[1] == b_[0] for a, b_ in zip(ranges, ranges[1:]))
    first = space.ndarray(dst[0], f32, dst[2], dst[3]).copy()
    _run(space, "mul_mat_fixup_f32", [dst, partials], ip=(parts - 1,))
    want = space.ndarray(whole[0], f32, whole[2], whole[3])
    got = space.ndarray(dst[0], f32, dst[2], dst[3])
    assert not np.allclose(first, want, atol=1e-3)            # part 0 alone is not the product
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())


def test_a_simulated_q8_0_prefill_through_the_split_meets_the_oracle(capsys):
    """tiny Q8_0 with a 40-token prompt: every prefill mat-mul takes the k-split and its fixup (the lowering
    test above), and the replayed and eager results stay within the oracle's bound."""
    from graphdiag.cli.main import main
    assert main(["run", "--backend", "sim", "--model", "tiny", "--wtype", "q8_0", "--oracle", "--verify",
                 "--steps", "3", "--prompt-tokens", "40"]) == 0
    out = capsys.readouterr().out
    assert "0 over the bound" in out and "0 mismatches" in out
