"""The simulated kernels: catalogue coverage, semantics against cpu_ops, fused == unfused composition."""

import numpy as np
import pytest

from graphdiag.backends import cpu_ops as ops
from graphdiag.backends.abi import Q8_1, Q8_1_BYTES, new_params, set_desc
from graphdiag.backends.kernels import KERNELS, fa_vec_kernel
from graphdiag.backends.sim_kernels import SIM_KERNELS, quantize_q8_1, run_kernel
from graphdiag.errors import CudaError
from graphdiag.ir.build import contiguous_nb
from graphdiag.ir.dtypes import GGMLType as G
from graphdiag.memory import AddressSpace, dequantize_q8_0, quantize_q8_0

RNG = np.random.default_rng(1)


class Mem:
    """Simulated device memory with tensors placed contiguously; `put` returns (addr, type, ne, nb)."""

    def __init__(self):
        self.space = AddressSpace(0x7000_0000_0000, name="sim")

    def put(self, t: G, ne, values=None):
        nb = contiguous_nb(t, ne)
        addr = self.space.alloc(nb[3] * ne[3])
        if values is not None:
            self.view((addr, t, ne, nb))[...] = values
        return addr, t, ne, nb

    def view(self, d):
        return self.space.ndarray(*d)


def params(*descs, ip=(), fp=()):
    p = new_params()
    for slot, d in enumerate(descs):
        if d is not None:
            set_desc(p, slot, *d)
    p["ip"][: len(ip)] = ip
    p["fp"][: len(fp)] = fp
    return p


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_every_catalogue_kernel_has_a_sim_implementation():
    assert set(SIM_KERNELS) == set(KERNELS)
    from graphdiag.backends.kernels import Q_TYPES, X_TYPES
    n_quant = len([k for k in SIM_KERNELS if any(k.endswith("_" + w) for w in (*Q_TYPES, *X_TYPES))
                   and not k.startswith("rng_fill_")])
    # 66 for F32/F16/Q8_0, the Gemma/Qwen ops, the router argsort, the k-split fixup and the MoE weighted reduction (16 decode + 4 batch attention entries among them), the rest per new weight type
    # (+ 2: 0c1e57098's rms_norm_scale_f32 and glu_swiglu_clamp_f32; + 1: the top-k MoE router, topk_moe_f32;
    # + 4: the direct decode attention, flash_attn_vec_direct_f16_d{32,64,128,256}; + 3: llama's MoE weight norm
    # unfused, sum_rows_f32, clamp_f32, div_f32; + 4: the experts' expert-sorted map, mm_ids_helper, and the
    # mat-muls over it, mul_mat_id_q_q8_0, mul_mat_id_f_f32, mul_mat_id_f_f16; + 2: gpt-oss's add_id_f32 and
    # glu_swiglu_oai_f32; + 1: cpy_f16_f32, the F16 result of upstream's cuBLAS path back to F32)
    assert len([k for k in SIM_KERNELS if not k.startswith("rng_fill_")]) - n_quant == 84
    assert n_quant > 0


def test_unknown_kernel_is_not_found():
    with pytest.raises(CudaError, match="CUDA_ERROR_NOT_FOUND"):
        run_kernel(AddressSpace(0x1000), "mul_mat_vec_iq2_xxs", new_params())   # a type graphdiag has no kernel for


def test_rms_norm_and_add_follow_cpu_ops():
    m = Mem()
    x, w = rand(1, 1, 3, 16), rand(1, 1, 1, 16)
    dx, dw, dst = m.put(G.F32, (16, 3, 1, 1), x), m.put(G.F32, (16, 1, 1, 1), w), m.put(G.F32, (16, 3, 1, 1))
    run_kernel(m.space, "rms_norm_f32", params(dst, dx, fp=(1e-6,)))
    np.testing.assert_array_equal(m.view(dst), ops.rms_norm(x, 1e-6))
    run_kernel(m.space, "add_f32", params(dst, dx, dw))
    np.testing.assert_array_equal(m.view(dst), x + w)


def q8_1_desc(m: Mem, x: np.ndarray):
    """x (1, 1, N, K) quantised by the quantize_q8_1 kernel into simulated memory: its Q8_1 descriptor."""
    k, n = x.shape[-1], x.shape[-2]
    dx = m.put(G.F32, (k, n, 1, 1), x)
    row = Q8_1_BYTES * (k // 32)
    dq = (m.space.alloc(row * n), Q8_1, (k, n, 1, 1), (Q8_1_BYTES, row, row * n, row * n))
    run_kernel(m.space, "quantize_q8_1", params(dq, dx))
    return dq


def test_quantize_q8_1_rounds_half_to_even_and_keeps_zero_blocks():
    x = np.zeros((1, 1, 1, 64), np.float32)
    x[..., :32] = np.linspace(-2.54, 2.54, 32)   # d = 0.02: x / d lands on .5 for some elements
    q = quantize_q8_1(x)
    d = np.float32(2.54) / np.float32(127)
    np.testing.assert_array_equal(q["qs"][0, 0, 0, 0], np.rint(x[0, 0, 0, :32] / d).astype(np.int8))
    assert q["d"][0, 0, 0, 1] == 0 and not q["qs"][0, 0, 0, 1].any()
    assert q["s"][0, 0, 0, 0] == np.float16(d * q["qs"][0, 0, 0, 0].sum())


def test_mul_mat_vec_q8_0_is_an_integer_dot_on_q8_1_x_and_checks_its_preconditions():
    m = Mem()
    wq = quantize_q8_0(rand(1, 1, 8, 64))
    x = rand(1, 1, 2, 64)
    dw, dq = m.put(G.Q8_0, (64, 8, 1, 1), wq), q8_1_desc(m, x)
    dst = m.put(G.F32, (8, 2, 1, 1))
    run_kernel(m.space, "mul_mat_vec_q8_0", params(dst, dw, dq))
    xq = quantize_q8_1(x)
    want = (dequantize_q8_0(wq)[0, 0] @ (xq["qs"].astype(np.float32) * xq["d"].astype(np.float32)[..., None])
            .reshape(2, 64).T).T
    np.testing.assert_allclose(m.view(dst)[0, 0], want, rtol=1e-5, atol=1e-5)
    assert np.abs(m.view(dst) - ops.mul_mat(wq, x)).max() < 0.05 * np.abs(want).max()   # Q8_1 rounding only
    with pytest.raises(CudaError, match="reads F16"):
        run_kernel(m.space, "mul_mat_vec_f16", params(dst, dw, dq))
    with pytest.raises(CudaError, match="t\\[2\\] is F32, the kernel reads Q8_1"):
        run_kernel(m.space, "mul_mat_vec_q8_0", params(dst, dw, m.put(G.F32, (64, 2, 1, 1), x)))
    big_x, big_dst = q8_1_desc(m, rand(1, 1, 9, 64)), m.put(G.F32, (8, 9, 1, 1))
    with pytest.raises(CudaError, match="N = 9"):
        run_kernel(m.space, "mul_mat_vec_q8_0", params(big_dst, dw, big_x))
    run_kernel(m.space, "mul_mat_q8_0", params(big_dst, dw, big_x))  # the mat-mul kernel takes any N
    small = m.put(G.F32, (8, 2, 1, 1))
    run_kernel(m.space, "mul_mat_q8_0", params(small, dw, dq))
    np.testing.assert_allclose(m.view(small), m.view(dst), rtol=1e-6, atol=1e-6)   # both paths: one formula


def test_mul_mat_f16_rounds_x_to_f16_as_the_tensor_cores_read_it():
    m = Mem()
    w = rand(1, 1, 16, 64).astype(np.float16)
    x = rand(1, 1, 12, 64) * np.float32(1 + 2 ** -13)
    dw, dx, dst = m.put(G.F16, (64, 16, 1, 1), w), m.put(G.F32, (64, 12, 1, 1), x), m.put(G.F32, (16, 12, 1, 1))
    run_kernel(m.space, "mul_mat_f16", params(dst, dw, dx))
    np.testing.assert_array_equal(m.view(dst), ops.mul_mat(w, x.astype(np.float16)))


def test_top_k_and_get_rows_f16():
    m = Mem()
    x = rand(1, 1, 2, 10)
    dx, dk = m.put(G.F32, (10, 2, 1, 1), x), m.put(G.I32, (3, 2, 1, 1))
    run_kernel(m.space, "top_k_f32", params(dk, dx, ip=(3,)))
    np.testing.assert_array_equal(m.view(dk), ops.top_k(x, 3))
    table = rand(1, 1, 5, 8).astype(np.float16)
    dt, di, dg = m.put(G.F16, (8, 5, 1, 1), table), m.put(G.I32, (2, 1, 1, 1), [[[[4, 2]]]]), m.put(G.F32, (8, 2, 1, 1))
    run_kernel(m.space, "get_rows_f16", params(dg, dt, di))
    np.testing.assert_array_equal(m.view(dg)[0, 0], table[0, 0, [4, 2]].astype(np.float32))


def test_rms_norm_mul_equals_rms_norm_then_mul():
    m = Mem()
    dx, dw = m.put(G.F32, (32, 4, 1, 1), rand(1, 1, 4, 32)), m.put(G.F32, (32, 1, 1, 1), rand(1, 1, 1, 32))
    fused, tmp, unfused = (m.put(G.F32, (32, 4, 1, 1)) for _ in range(3))
    run_kernel(m.space, "rms_norm_mul_f32", params(fused, dx, dw, fp=(1e-5,)))
    run_kernel(m.space, "rms_norm_f32", params(tmp, dx, fp=(1e-5,)))
    run_kernel(m.space, "mul_f32", params(unfused, tmp, dw))
    np.testing.assert_array_equal(m.view(fused), m.view(unfused))


@pytest.mark.parametrize("w", ["f16", "q8_0"])
def test_mul_mat_vec_glu_equals_two_mat_vecs_then_swiglu(w):
    m = Mem()
    t = G.F16 if w == "f16" else G.Q8_0
    conv = (lambda a: a.astype(np.float16)) if w == "f16" else quantize_q8_0
    dg, du = m.put(t, (64, 16, 1, 1), conv(rand(1, 1, 16, 64))), m.put(t, (64, 16, 1, 1), conv(rand(1, 1, 16, 64)))
    x = rand(1, 1, 3, 64)
    dx = q8_1_desc(m, x) if w == "q8_0" else m.put(G.F32, (64, 3, 1, 1), x)
    fused, gate, up, unfused = (m.put(G.F32, (16, 3, 1, 1)) for _ in range(4))
    run_kernel(m.space, f"mul_mat_vec_glu_{w}", params(fused, dg, du, dx, ip=(2,)))
    run_kernel(m.space, f"mul_mat_vec_{w}", params(gate, dg, dx))
    run_kernel(m.space, f"mul_mat_vec_{w}", params(up, du, dx))
    run_kernel(m.space, "glu_swiglu_f32", params(unfused, gate, up))
    np.testing.assert_array_equal(m.view(fused), m.view(unfused))


def test_rope_set_rows_equals_rope_then_set_rows():
    m = Mem()
    D, Hkv, T, n_rows = 8, 2, 3, 7
    dx = m.put(G.F32, (D, Hkv, T, 1), rand(1, T, Hkv, D))
    dpos, didx = m.put(G.I32, (T, 1, 1, 1), [[[[3, 4, 5]]]]), m.put(G.I32, (T, 1, 1, 1), [[[[6, 0, 2]]]])
    fused, unfused = m.put(G.F16, (D * Hkv, n_rows, 1, 1)), m.put(G.F16, (D * Hkv, n_rows, 1, 1))
    roped = m.put(G.F32, (D, Hkv, T, 1))
    run_kernel(m.space, "rope_set_rows_f16", params(fused, dx, dpos, didx, ip=(8, 0), fp=(10000.0, 1.0)))
    run_kernel(m.space, "rope_f32", params(roped, dx, dpos, ip=(8, 0), fp=(10000.0, 1.0)))
    rows = (roped[0], G.F32, (D * Hkv, T, 1, 1), contiguous_nb(G.F32, (D * Hkv, T, 1, 1)))  # the VIEW node
    run_kernel(m.space, "set_rows_f16", params(unfused, rows, didx))
    np.testing.assert_array_equal(m.view(fused), m.view(unfused))
    assert m.view(fused)[0, 0, [6, 0, 2]].any() and not m.view(fused)[0, 0, [1, 3, 4, 5]].any()


def test_mul_mat_id_gathered_over_every_expert_equals_the_vec_path():
    m = Mem()
    E, K, M, T, n_used = 4, 32, 5, 3, 2
    dex = m.put(G.F16, (K, M, E, 1), rand(1, E, M, K))
    dx = m.put(G.F32, (K, n_used, T, 1), rand(1, T, n_used, K))
    ids = np.array([[[[1, 3], [3, 0], [1, 2]]]], np.int32)
    dids = m.put(G.I32, (n_used, T, 1, 1), ids)
    vec, gathered = m.put(G.F32, (M, n_used, T, 1)), m.put(G.F32, (M, n_used, T, 1))
    run_kernel(m.space, "mul_mat_id_vec_f16", params(vec, dex, dx, dids))
    pairs = [(s, t) for e in range(E) for t in range(T) for s in range(n_used) if ids[0, 0, t, s] == e]
    dmap = m.put(G.I32, (2, len(pairs), 1, 1), np.array(pairs, np.int32).reshape(1, 1, -1, 2))
    first = 0
    for e in range(E):
        n = int((ids == e).sum())
        run_kernel(m.space, "mul_mat_id_gathered_f16", params(gathered, dex, dx, dmap, ip=(e, n, first)))
        first += n
    np.testing.assert_array_equal(m.view(gathered), m.view(vec))
    np.testing.assert_array_equal(m.view(vec), ops.mul_mat_id(m.view(dex), m.view(dx), ids))


def _attention(m: Mem, dq, dk, dv, dm, chunk: int, n_split: int, D: int, H: int, T: int, scale: float, G_: int = 1):
    """The decode kernel's split-KV partials (head size D, G_ heads per kv head), then flash_attn_combine_f32,
    as the lowering issues them."""
    ne = (D + 2, n_split, H, T)
    part = m.put(G.F32, ne)
    run_kernel(m.space, fa_vec_kernel(D, G_), params(part, dq, dk, dv, dm, ip=(chunk, 1), fp=(scale,)))
    dst = m.put(G.F32, (D, H, T, 1))
    run_kernel(m.space, "flash_attn_combine_f32", params(dst, part))
    return m.view(dst), m.view(part)


@pytest.mark.parametrize("mask_type", [G.F32, G.F16])
def test_split_kv_attention_then_combine_follows_cpu_ops(mask_type):
    m = Mem()
    D, H, Hkv, T, n_kv = 32, 4, 2, 2, 70
    dq = m.put(G.F32, (D, H, T, 1), rand(1, T, H, D))
    dk = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    dv = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    mask = np.zeros((1, 1, 4, n_kv), np.float32)
    mask[0, 0, 1, 20:] = -np.inf     # token 1 sees only split 0: splits 1 and 2 are empty for it
    mask[0, 0, 0, :] = rand(n_kv) * 0.3
    dm = m.put(mask_type, (n_kv, 4, 1, 1), mask.astype(np.float16 if mask_type == G.F16 else np.float32))
    got, part = _attention(m, dq, dk, dv, dm, 32, 3, D, H, T, 0.5, G_=2)
    ref = ops.flash_attn_ext(m.view(dq), m.view(dk), m.view(dv), m.view(dm), 0.5)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)
    assert np.isneginf(part[1, :, 1:, D]).all() and not part[1, :, 1:, D + 1].any()
    nomask, _ = _attention(m, dq, dk, dv, None, 32, 3, D, H, T, 0.5, G_=2)
    assert not np.allclose(nomask, ref)


def test_attention_of_a_fully_masked_row_is_zero():
    m = Mem()
    D, H, T, n_kv = 32, 2, 1, 40
    dq, dk, dv = m.put(G.F32, (D, H, T, 1), rand(1, T, H, D)), *(
        m.put(G.F16, (D, H, n_kv, 1), rand(1, n_kv, H, D).astype(np.float16)) for _ in range(2))
    dm = m.put(G.F16, (n_kv, 1, 1, 1), np.full((1, 1, 1, n_kv), -np.inf, np.float16))
    got, _ = _attention(m, dq, dk, dv, dm, 32, 2, D, H, T, 1.0)
    assert not got.any()


def test_cpy_f32_f16_converts_and_checks_the_destination_type():
    m = Mem()
    x = rand(1, 1, 2, 6)
    dx, d16 = m.put(G.F32, (6, 2, 1, 1), x), m.put(G.F16, (6, 2, 1, 1))
    run_kernel(m.space, "cpy_f32_f16", params(d16, dx))
    np.testing.assert_array_equal(m.view(d16), x.astype(np.float16))
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        run_kernel(m.space, "cpy_f32_f32", params(d16, dx))


def test_decode_attention_entry_runs_only_its_own_head_size_and_group():
    """flash_attn_vec_f16_d{D}_g{G}: the exact split-KV partials for its (D, G) (combined: the attention);
    the CUDA entry of another (D, G) would index its shared memory wrongly, so the simulated one refuses it."""
    m = Mem()
    D, H, Hkv, n_kv = 32, 8, 2, 40
    dq = m.put(G.F32, (D, H, 1, 1), rand(1, 1, H, D))
    dk = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    dv = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    vec = m.put(G.F32, (D + 2, 2, H, 1))
    run_kernel(m.space, "flash_attn_vec_f16_d32_g4", params(vec, dq, dk, dv, None, ip=(32, 1), fp=(0.5,)))
    dst = m.put(G.F32, (D, H, 1, 1))
    run_kernel(m.space, "flash_attn_combine_f32", params(dst, vec))
    ref = ops.flash_attn_ext(m.view(dq), m.view(dk), m.view(dv), None, 0.5)
    np.testing.assert_allclose(m.view(dst), ref, rtol=2e-6, atol=2e-6)
    for wrong in ("flash_attn_vec_f16_d32_g8", "flash_attn_vec_f16_d64_g4"):
        with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
            run_kernel(m.space, wrong, params(vec, dq, dk, dv, None, ip=(32, 1), fp=(0.5,)))


def test_batch_attention_on_tensor_cores_rounds_q_and_p_to_f16_and_combines_the_same():
    """flash_attn_mma_f16_d{D}: partials over tiles of 64 with q and p in F16, so the combined result is the
    exact attention within F16 rounding, not bit-equal to it; l and m keep the unrounded scores; a fully
    masked row and an empty split give (0, -inf, 0); another head size is refused."""
    m = Mem()
    D, H, Hkv, T, n_kv, chunk = 32, 6, 2, 12, 200, 96     # G = 3: 64-row tiles cross tokens; 3 splits
    dq = m.put(G.F32, (D, H, T, 1), rand(1, T, H, D))
    dk = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    dv = m.put(G.F16, (D, Hkv, n_kv, 1), rand(1, n_kv, Hkv, D).astype(np.float16))
    mask = np.zeros((1, 1, 16, n_kv), np.float32)
    for t in range(T):
        mask[0, 0, t, 150 + t:] = -np.inf                     # causal: split 2 sees nothing of rows t < 42
    mask[0, 0, 3, :] = -np.inf                                # a fully masked row
    dm = m.put(G.F16, (n_kv, 16, 1, 1), mask.astype(np.float16))
    part = m.put(G.F32, (D + 2, 3, H, T))
    run_kernel(m.space, "flash_attn_mma_f16_d32", params(part, dq, dk, dv, dm, ip=(chunk, 64), fp=(0.4,)))
    dst = m.put(G.F32, (D, H, T, 1))
    run_kernel(m.space, "flash_attn_combine_f32", params(dst, part))
    got, p = m.view(dst), m.view(part)
    ref = ops.flash_attn_ext(m.view(dq), m.view(dk), m.view(dv), m.view(dm), 0.4)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert 0 < err < 2e-3, err
    assert not got[0, 3].any() and np.isneginf(p[3, :, :, D]).all() and not p[3, :, :, D + 1].any()
    assert np.isneginf(p[:, :, 2, D]).all()                  # the last split is past every row's horizon
    exact = m.put(G.F32, (D + 2, 3, H, T))                   # the exact partials of q rounded to F16
    dq16 = m.put(G.F32, (D, H, T, 1), m.view(dq).astype(np.float16).astype(np.float32))
    run_kernel(m.space, fa_vec_kernel(D, H // Hkv), params(exact, dq16, dk, dv, dm, ip=(chunk, 1), fp=(0.4,)))
    np.testing.assert_array_equal(p[..., D], m.view(exact)[..., D])   # the same maxima: scores are unrounded
    with pytest.raises(CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        run_kernel(m.space, "flash_attn_mma_f16_d64", params(part, dq, dk, dv, dm, ip=(chunk, 64), fp=(0.4,)))


def test_the_q8_0_dot_widens_a_block_of_rows_at_a_time_past_widen_max(monkeypatch):
    """sim_kernels.q8_dot widens W's quants to float32 at most _WIDEN_MAX elements at a time (a 262 144-row
    embedding was 0.67 GB at once): the same sums (numpy may add a row's blocks in another order: float32's
    last bits), a fraction of the memory."""
    import tracemalloc
    import graphdiag.backends.sim_kernels as sk
    wq = quantize_q8_0(rand(1, 1, 4096, 256))                 # 4096 rows of 8 blocks: 4 MB once widened
    xq = quantize_q8_1(rand(1, 1, 3, 256))

    def dot(widen_max):
        monkeypatch.setattr(sk, "_WIDEN_MAX", widen_max)
        tracemalloc.start()
        try:
            return sk.q8_dot(wq, xq), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    whole, whole_peak = dot(1 << 23)
    rows, rows_peak = dot(8 * 32 * 100 + 5)                    # 100 rows a pass, the last pass short
    np.testing.assert_allclose(rows, whole, rtol=1e-5, atol=1e-6 * np.abs(whole).max())
    assert rows_peak < whole_peak / 4
