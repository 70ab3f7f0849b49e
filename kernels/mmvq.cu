// Mat-vec kernels for the file's weight types (ggml's MMVQ for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_NL, IQ4_XS, MXFP4 on Q8_1 x from quantize_q8_1; ggml's MMVF for BF16 on F32 x), their fused variants (+ADD,
// gate/up+GLU), the MoE kernels (Q8_1 x for the quantized types as upstream's mmvq / mmq, F32 x for BF16 and for the sorted
// fallback), GET_ROWS and the prefill's dequantisation to F16.
//
// Geometry as mul_mat_vec.cu (geometry.py _mmv): one warp per weight row, 4 warps per block, up to 8 x
// columns per pass; one column may share a row between ip[1] warps. A lane takes whole units (32 weights:
// one Q8_1 block of x, quants.cuh) of the row, lane + 32 * part, stepping 32 * nparts: the integer dot of
// a unit is exact, its float combination is quants.cuh's, and the warp's partial sums meet by warp_sum.
#include "quants.cuh"

#define MMVQ_WARPS 4
#define MMVQ_NC 8

// acc[n] += this warp's share of W row . x column n (n < nc): Q8_1 x for quantized T, F32 x for BF16.
template <int T, int NC>
__device__ __forceinline__ void qdots(const unsigned char *w, i64 K, const char *x, i64 xnb0, i64 xnb1, int nc,
                                      float *acc, int part, int nparts) {
    const int lane = threadIdx.x & 31;
    const i64 nu = K / 32;
    for (i64 u = lane + 32 * part; u < nu; u += 32 * nparts) {
        if (T == GGML_BF16) {
            float y[32];
            unit_f32<T>(w, u, y);
#pragma unroll
            for (int n = 0; n < NC; ++n) {
                if (n >= nc) continue;
                const char *xr = x + n * xnb1 + u * 32 * xnb0;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; ++i) s += y[i] * *(const float *)(xr + i * xnb0);
                acc[n] += s;
            }
        } else {
            qunit q;
            decode<T>(w, u, q);
#pragma unroll
            for (int n = 0; n < NC; ++n)
                if (n < nc) acc[n] += unit_q8<T>(q, x + n * xnb1 + u * 36);
        }
    }
#pragma unroll
    for (int n = 0; n < NC; ++n) acc[n] = warp_sum(acc[n]);
}

template <int T, int NC>
__device__ __forceinline__ void qdots_at(const char *w, const tdesc &W, const tdesc &X, i64 n0, i64 i2, i64 i3,
                                         int nc, float *acc, int part = 0, int nparts = 1) {
    qdots<T, NC>((const unsigned char *)w, W.ne[0], row_ptr(X, n0, i2, i3), X.nb[0], X.nb[1], nc, acc, part, nparts);
}

__device__ __forceinline__ const char *wrow(const tdesc &W, const tdesc &D, i64 m, i64 i2, i64 i3) {
    return row_ptr(W, m, i2 / (D.ne[2] / W.ne[2]), i3 / (D.ne[3] / W.ne[3]));   // ggml's broadcast by division
}

// dst[.., n, m] = W[m] . x[.., n] (+ r[.., n, m] when `add`, r broadcast by modulo).
template <int T, bool add, int NC> __device__ void qmmv_cols(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;   // whole warps leave; no block-wide sync below
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *w = wrow(W, D, m, i2, i3);
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += NC) {
        const int nc = (int)min((i64)NC, D.ne[1] - n0);
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) acc[n] = 0.0f;
        qdots_at<T, NC>(w, W, X, n0, i2, i3, nc, acc);
#pragma unroll
        for (int n = 0; n < NC; ++n) {
            if (n < nc && lane == n) {
                float v = acc[n];
                if (add) v += load_f(R, m % R.ne[0], (n0 + n) % R.ne[1], i2 % R.ne[2], i3 % R.ne[3]);
                store_f(D, m, n0 + n, i2, i3, v);
            }
        }
    }
}

// One column, ip[1] warps per row: 4 / ip[1] rows per block, parts added in order (deterministic).
template <int T, bool add> __device__ void qmmv_split(const kparams &p) {
    __shared__ float sums[MMVQ_WARPS];
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const int nparts = p.ip[1], warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % nparts;
    const i64 m = (i64)blockIdx.x * (MMVQ_WARPS / nparts) + warp / nparts;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    float acc[1] = {0.0f};
    if (m < D.ne[0]) qdots_at<T, 1>(wrow(W, D, m, i2, i3), W, X, 0, i2, i3, 1, acc, part, nparts);
    if (lane == 0) sums[warp] = acc[0];
    __syncthreads();
    if (part == 0 && lane == 0 && m < D.ne[0]) {
        float v = 0.0f;
        for (int q = 0; q < nparts; ++q) v += sums[warp + q];
        if (add) v += load_f(R, m % R.ne[0], 0, i2 % R.ne[2], i3 % R.ne[3]);
        store_f(D, m, 0, i2, i3, v);
    }
}

template <int T, bool add> __device__ void qmmv(const kparams &p) {
    if (p.t[0].ne[1] == 1 && p.ip[1] > 1) qmmv_split<T, add>(p);
    else if (p.t[0].ne[1] == 1) qmmv_cols<T, add, 1>(p);
    else qmmv_cols<T, add, MMVQ_NC>(p);
}

// dst[n, m] = glu(W_gate[m] . x[n], W_up[m] . x[n]) (ip[0]: 0 REGLU, 1 GEGLU, 2 SWIGLU, 6 SWIGLU_CLAMP;
// fp[0]: its limit).
template <int T, int NC> __device__ void qmmv_glu_cols(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *g = wrow(G, D, m, i2, i3), *u = wrow(U, D, m, i2, i3);
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += NC) {
        const int nc = (int)min((i64)NC, D.ne[1] - n0);
        float ag[NC], au[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) ag[n] = au[n] = 0.0f;
        qdots_at<T, NC>(g, G, X, n0, i2, i3, nc, ag);
        qdots_at<T, NC>(u, U, X, n0, i2, i3, nc, au);
#pragma unroll
        for (int n = 0; n < NC; ++n)
            if (n < nc && lane == n) store_f(D, m, n0 + n, i2, i3, glu(p.ip[0], ag[n], au[n], p.fp[0]));
    }
}

template <int T> __device__ void qmmv_glu(const kparams &p) {
    if (p.t[0].ne[1] == 1) qmmv_glu_cols<T, 1>(p);
    else qmmv_glu_cols<T, MMVQ_NC>(p);
}

// The sorted fallback's MoE kernels (and BF16's) read F32 x: W row . x with the weights dequantised per unit.
template <int T> __device__ __forceinline__ float frow_dot(const char *w, i64 K, const char *x, i64 xnb0) {
    const int lane = threadIdx.x & 31;
    float a = 0.0f;
    for (i64 u = lane; u < K / 32; u += 32) {
        float y[32];
        unit_f32<T>((const unsigned char *)w, u, y);
#pragma unroll
        for (int i = 0; i < 32; ++i) a += y[i] * *(const float *)(x + (u * 32 + i) * xnb0);
    }
    return warp_sum(a);
}

// An expert's row against one x row over units [u0, u1): the quantized types on Q8_1 x (quantize_q8_1: the
// unit's integer dot, as the mat-vec's qdots), BF16 on F32 x (as frow_dot). Every lane returns the sum.
template <int T>
__device__ __forceinline__ float id_row_dot(const char *w, const char *x, i64 xnb0, i64 u0, i64 u1) {
    const int lane = threadIdx.x & 31;
    float a = 0.0f;
    for (i64 u = u0 + lane; u < u1; u += 32) {
        if (T == GGML_BF16) {
            float y[32];
            unit_f32<T>((const unsigned char *)w, u, y);
#pragma unroll
            for (int i = 0; i < 32; ++i) a += y[i] * *(const float *)(x + (u * 32 + i) * xnb0);
        } else {
            qunit q;
            decode<T>((const unsigned char *)w, u, q);
            a += unit_q8<T>(q, x + u * 36);
        }
    }
    return warp_sum(a);
}

// dst[t, s, m] = experts[ids[t, s]][m] . x[t, s or 0]: Q8_1 x for the quantized types (upstream's mmvq, up to
// 8 tokens), F32 x for BF16 (its MMF). Grid (ceil(M/4), n_used, T).
template <int T> __device__ void qmmv_id(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &I = p.t[3];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    const char *w = row_ptr(W, m, e, 0), *x = row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0);
    const float v = T == GGML_BF16 ? frow_dot<T>(w, W.ne[0], x, X.nb[0]) : id_row_dot<T>(w, x, X.nb[0], 0, W.ne[0] / 32);
    if ((threadIdx.x & 31) == 0) store_f(D, m, s, t, 0, plus_expert_bias(p.t[4], m, e, v));
}

// dst[t, s, m] = glu(G[ids[t, s]][m] . x, U[ids[t, s]][m] . x): the quantized types on Q8_1 x up to 8 tokens
// (upstream's mmvq with its fusion), BF16 on F32 x at one token (its mmvf).
template <int T> __device__ void qmmv_id_glu(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3], &I = p.t[4];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    const char *x = row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), *gw = row_ptr(G, m, e, 0), *uw = row_ptr(U, m, e, 0);
    const i64 nu = G.ne[0] / 32;
    const float g = T == GGML_BF16 ? frow_dot<T>(gw, G.ne[0], x, X.nb[0]) : id_row_dot<T>(gw, x, X.nb[0], 0, nu);
    const float u = T == GGML_BF16 ? frow_dot<T>(uw, U.ne[0], x, X.nb[0]) : id_row_dot<T>(uw, x, X.nb[0], 0, nu);
    if ((threadIdx.x & 31) == 0)
        store_f(D, m, s, t, 0, glu(p.ip[0], plus_gate_bias(p, p.t[5], m, e, g), plus_expert_bias(p.t[5], m, e, u), p.fp[0]));
}

// MUL_MAT_ID over mm_ids_helper's expert-sorted map (common.cuh mmid_pair): expert blockIdx.y, a warp per
// row m, each of the expert's pairs (s, t) in turn, k part blockIdx.z: the quantized types on Q8_1 x in
// ip[0] parts (upstream's mul_mat_q), BF16 on F32 x in one (upstream's mul_mat_f_ids). Grid (ceil(M/4), E,
// parts).
template <int T> __device__ void qmmid_sorted(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[4], &B = p.t[5];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int e = blockIdx.y;
    i64 k0, k1;
    mmid_k_range(p, W.ne[0], k0, k1);
    const char *w = row_ptr(W, m, e, 0);
    const int j1 = load_i32(B, e + 1, 0, 0, 0);
    for (int j = load_i32(B, e, 0, 0, 0); j < j1; ++j) {
        int s, t;
        mmid_pair(R, j, s, t);
        const float v = id_row_dot<T>(w, row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0], k0 / 32, k1 / 32);
        if ((threadIdx.x & 31) == 0) mmid_store(p, m, s, t, v);
    }
}

// One expert (ip[0]) over rows [ip[2], ip[2] + ip[1]) of the (slot, token) map. Grid (ceil(M/4), rows).
template <int T> __device__ void qmmv_gathered(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const i64 m = (i64)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0] || (int)blockIdx.y >= p.ip[1]) return;
    const i64 j = (i64)p.ip[2] + blockIdx.y;
    const bool pairs = R.ne[0] == 2;
    const int s = pairs ? load_i32(R, 0, j, 0, 0) : load_i32(R, 2 * j, 0, 0, 0);
    const int t = pairs ? load_i32(R, 1, j, 0, 0) : load_i32(R, 2 * j + 1, 0, 0, 0);
    const float v = frow_dot<T>(row_ptr(W, m, p.ip[0], 0), W.ne[0], row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0]);
    if ((threadIdx.x & 31) == 0) store_f(D, m, s, t, 0, v);
}

// dst[i3, i2, i1, :] = dequant(table[ids[i3, i2, i1], :]): one block per dst row, threads over units.
template <int T> __device__ void qget_rows(const kparams &p) {
    const tdesc &D = p.t[0], &Tb = p.t[1], &I = p.t[2];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    const i64 r = load_i32(I, i1, i2, i3, 0);
    const unsigned char *row = (const unsigned char *)row_ptr(Tb, r, i2 % Tb.ne[2], i3 % Tb.ne[3]);
    for (i64 u = threadIdx.x; u < D.ne[0] / 32; u += blockDim.x) {
        float y[32];
        unit_f32<T>(row, u, y);
#pragma unroll
        for (int i = 0; i < 32; ++i) store_f(D, u * 32 + i, i1, i2, i3, y[i]);
    }
}

// dst F16 (K, M, W2, W3), contiguous pool scratch = f16(dequant(W)): the prefill's weights for mul_mat_f16.
// One thread per unit, grid-stride; 32 halves written as four 16-byte stores.
template <int T> __device__ void qdequant_f16(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1];
    const i64 nu = W.ne[0] / 32, total = nu * W.ne[1] * W.ne[2] * W.ne[3];
    for (i64 g = (i64)blockIdx.x * blockDim.x + threadIdx.x; g < total; g += (i64)gridDim.x * blockDim.x) {
        const i64 u = g % nu, r = g / nu, i1 = r % W.ne[1], i23 = r / W.ne[1];
        const i64 i2 = i23 % W.ne[2], i3 = i23 / W.ne[2];
        float y[32];
        unit_f32<T>((const unsigned char *)row_ptr(W, i1, i2, i3), u, y);
        uint4 *o = (uint4 *)addr4(D, u * 32, i1, i2, i3);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            unsigned h[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                h[i] = (unsigned)f2h(y[8 * k + 2 * i]) | ((unsigned)f2h(y[8 * k + 2 * i + 1]) << 16);
            o[k] = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}

// One wrapper per (operation, weight type): plain names so the driver can find each kernel's file.
KERNEL_LB(mul_mat_vec_q4_0, 128, 8) { qmmv<GGML_Q4_0, false>(p); }
KERNEL_LB(mul_mat_vec_q5_0, 128, 8) { qmmv<GGML_Q5_0, false>(p); }
KERNEL_LB(mul_mat_vec_q5_1, 128, 8) { qmmv<GGML_Q5_1, false>(p); }
KERNEL_LB(mul_mat_vec_q4_1, 128, 8) { qmmv<GGML_Q4_1, false>(p); }
KERNEL_LB(mul_mat_vec_iq4_nl, 128, 8) { qmmv<GGML_IQ4_NL, false>(p); }
KERNEL_LB(mul_mat_vec_iq4_xs, 128, 8) { qmmv<GGML_IQ4_XS, false>(p); }
KERNEL_LB(mul_mat_vec_q4_k, 128, 8) { qmmv<GGML_Q4_K, false>(p); }
KERNEL_LB(mul_mat_vec_q5_k, 128, 8) { qmmv<GGML_Q5_K, false>(p); }
KERNEL_LB(mul_mat_vec_q6_k, 128, 8) { qmmv<GGML_Q6_K, false>(p); }
KERNEL_LB(mul_mat_vec_q2_k, 128, 8) { qmmv<GGML_Q2_K, false>(p); }
KERNEL_LB(mul_mat_vec_q3_k, 128, 8) { qmmv<GGML_Q3_K, false>(p); }
KERNEL_LB(mul_mat_vec_bf16, 128, 8) { qmmv<GGML_BF16, false>(p); }
KERNEL_LB(mul_mat_vec_add_q4_0, 128, 8) { qmmv<GGML_Q4_0, true>(p); }
KERNEL_LB(mul_mat_vec_add_q5_0, 128, 8) { qmmv<GGML_Q5_0, true>(p); }
KERNEL_LB(mul_mat_vec_add_q5_1, 128, 8) { qmmv<GGML_Q5_1, true>(p); }
KERNEL_LB(mul_mat_vec_add_q4_1, 128, 8) { qmmv<GGML_Q4_1, true>(p); }
KERNEL_LB(mul_mat_vec_add_iq4_nl, 128, 8) { qmmv<GGML_IQ4_NL, true>(p); }
KERNEL_LB(mul_mat_vec_add_iq4_xs, 128, 8) { qmmv<GGML_IQ4_XS, true>(p); }
KERNEL_LB(mul_mat_vec_add_q4_k, 128, 8) { qmmv<GGML_Q4_K, true>(p); }
KERNEL_LB(mul_mat_vec_add_q5_k, 128, 8) { qmmv<GGML_Q5_K, true>(p); }
KERNEL_LB(mul_mat_vec_add_q6_k, 128, 8) { qmmv<GGML_Q6_K, true>(p); }
KERNEL_LB(mul_mat_vec_add_q2_k, 128, 8) { qmmv<GGML_Q2_K, true>(p); }
KERNEL_LB(mul_mat_vec_add_q3_k, 128, 8) { qmmv<GGML_Q3_K, true>(p); }
KERNEL_LB(mul_mat_vec_add_bf16, 128, 8) { qmmv<GGML_BF16, true>(p); }
KERNEL_LB(mul_mat_vec_glu_q4_0, 128, 8) { qmmv_glu<GGML_Q4_0>(p); }
KERNEL_LB(mul_mat_vec_glu_q5_0, 128, 8) { qmmv_glu<GGML_Q5_0>(p); }
KERNEL_LB(mul_mat_vec_glu_q5_1, 128, 8) { qmmv_glu<GGML_Q5_1>(p); }
KERNEL_LB(mul_mat_vec_glu_q4_1, 128, 8) { qmmv_glu<GGML_Q4_1>(p); }
KERNEL_LB(mul_mat_vec_glu_iq4_nl, 128, 8) { qmmv_glu<GGML_IQ4_NL>(p); }
KERNEL_LB(mul_mat_vec_glu_iq4_xs, 128, 8) { qmmv_glu<GGML_IQ4_XS>(p); }
KERNEL_LB(mul_mat_vec_glu_q4_k, 128, 8) { qmmv_glu<GGML_Q4_K>(p); }
KERNEL_LB(mul_mat_vec_glu_q5_k, 128, 8) { qmmv_glu<GGML_Q5_K>(p); }
KERNEL_LB(mul_mat_vec_glu_q6_k, 128, 8) { qmmv_glu<GGML_Q6_K>(p); }
KERNEL_LB(mul_mat_vec_glu_q2_k, 128, 8) { qmmv_glu<GGML_Q2_K>(p); }
KERNEL_LB(mul_mat_vec_glu_q3_k, 128, 8) { qmmv_glu<GGML_Q3_K>(p); }
KERNEL_LB(mul_mat_vec_glu_bf16, 128, 8) { qmmv_glu<GGML_BF16>(p); }
KERNEL_LB(mul_mat_id_vec_q4_0, 128) { qmmv_id<GGML_Q4_0>(p); }
KERNEL_LB(mul_mat_id_vec_q5_0, 128) { qmmv_id<GGML_Q5_0>(p); }
KERNEL_LB(mul_mat_id_vec_q5_1, 128) { qmmv_id<GGML_Q5_1>(p); }
KERNEL_LB(mul_mat_id_vec_q4_1, 128) { qmmv_id<GGML_Q4_1>(p); }
KERNEL_LB(mul_mat_id_vec_iq4_nl, 128) { qmmv_id<GGML_IQ4_NL>(p); }
KERNEL_LB(mul_mat_id_vec_iq4_xs, 128) { qmmv_id<GGML_IQ4_XS>(p); }
KERNEL_LB(mul_mat_id_vec_q4_k, 128) { qmmv_id<GGML_Q4_K>(p); }
KERNEL_LB(mul_mat_id_vec_q5_k, 128) { qmmv_id<GGML_Q5_K>(p); }
KERNEL_LB(mul_mat_id_vec_q6_k, 128) { qmmv_id<GGML_Q6_K>(p); }
KERNEL_LB(mul_mat_id_vec_q2_k, 128) { qmmv_id<GGML_Q2_K>(p); }
KERNEL_LB(mul_mat_id_vec_q3_k, 128) { qmmv_id<GGML_Q3_K>(p); }
KERNEL_LB(mul_mat_id_vec_bf16, 128) { qmmv_id<GGML_BF16>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q4_0, 128) { qmmv_id_glu<GGML_Q4_0>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q5_0, 128) { qmmv_id_glu<GGML_Q5_0>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q5_1, 128) { qmmv_id_glu<GGML_Q5_1>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q4_1, 128) { qmmv_id_glu<GGML_Q4_1>(p); }
KERNEL_LB(mul_mat_id_vec_glu_iq4_nl, 128) { qmmv_id_glu<GGML_IQ4_NL>(p); }
KERNEL_LB(mul_mat_id_vec_glu_iq4_xs, 128) { qmmv_id_glu<GGML_IQ4_XS>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q4_k, 128) { qmmv_id_glu<GGML_Q4_K>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q5_k, 128) { qmmv_id_glu<GGML_Q5_K>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q6_k, 128) { qmmv_id_glu<GGML_Q6_K>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q2_k, 128) { qmmv_id_glu<GGML_Q2_K>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q3_k, 128) { qmmv_id_glu<GGML_Q3_K>(p); }
KERNEL_LB(mul_mat_id_vec_glu_bf16, 128) { qmmv_id_glu<GGML_BF16>(p); }
KERNEL_LB(mul_mat_id_q_q4_0, 128) { qmmid_sorted<GGML_Q4_0>(p); }
KERNEL_LB(mul_mat_id_q_q5_0, 128) { qmmid_sorted<GGML_Q5_0>(p); }
KERNEL_LB(mul_mat_id_q_q5_1, 128) { qmmid_sorted<GGML_Q5_1>(p); }
KERNEL_LB(mul_mat_id_q_q4_1, 128) { qmmid_sorted<GGML_Q4_1>(p); }
KERNEL_LB(mul_mat_id_q_iq4_nl, 128) { qmmid_sorted<GGML_IQ4_NL>(p); }
KERNEL_LB(mul_mat_id_q_iq4_xs, 128) { qmmid_sorted<GGML_IQ4_XS>(p); }
KERNEL_LB(mul_mat_id_q_q4_k, 128) { qmmid_sorted<GGML_Q4_K>(p); }
KERNEL_LB(mul_mat_id_q_q5_k, 128) { qmmid_sorted<GGML_Q5_K>(p); }
KERNEL_LB(mul_mat_id_q_q6_k, 128) { qmmid_sorted<GGML_Q6_K>(p); }
KERNEL_LB(mul_mat_id_q_q2_k, 128) { qmmid_sorted<GGML_Q2_K>(p); }
KERNEL_LB(mul_mat_id_q_q3_k, 128) { qmmid_sorted<GGML_Q3_K>(p); }
KERNEL_LB(mul_mat_id_f_bf16, 128) { qmmid_sorted<GGML_BF16>(p); }
KERNEL_LB(mul_mat_id_gathered_q4_0, 128) { qmmv_gathered<GGML_Q4_0>(p); }
KERNEL_LB(mul_mat_id_gathered_q5_0, 128) { qmmv_gathered<GGML_Q5_0>(p); }
KERNEL_LB(mul_mat_id_gathered_q5_1, 128) { qmmv_gathered<GGML_Q5_1>(p); }
KERNEL_LB(mul_mat_id_gathered_q4_1, 128) { qmmv_gathered<GGML_Q4_1>(p); }
KERNEL_LB(mul_mat_id_gathered_iq4_nl, 128) { qmmv_gathered<GGML_IQ4_NL>(p); }
KERNEL_LB(mul_mat_id_gathered_iq4_xs, 128) { qmmv_gathered<GGML_IQ4_XS>(p); }
KERNEL_LB(mul_mat_id_gathered_q4_k, 128) { qmmv_gathered<GGML_Q4_K>(p); }
KERNEL_LB(mul_mat_id_gathered_q5_k, 128) { qmmv_gathered<GGML_Q5_K>(p); }
KERNEL_LB(mul_mat_id_gathered_q6_k, 128) { qmmv_gathered<GGML_Q6_K>(p); }
KERNEL_LB(mul_mat_id_gathered_q2_k, 128) { qmmv_gathered<GGML_Q2_K>(p); }
KERNEL_LB(mul_mat_id_gathered_q3_k, 128) { qmmv_gathered<GGML_Q3_K>(p); }
KERNEL_LB(mul_mat_id_gathered_bf16, 128) { qmmv_gathered<GGML_BF16>(p); }
KERNEL_LB(get_rows_q4_0, 256) { qget_rows<GGML_Q4_0>(p); }
KERNEL_LB(get_rows_q5_0, 256) { qget_rows<GGML_Q5_0>(p); }
KERNEL_LB(get_rows_q5_1, 256) { qget_rows<GGML_Q5_1>(p); }
KERNEL_LB(get_rows_q4_1, 256) { qget_rows<GGML_Q4_1>(p); }
KERNEL_LB(get_rows_iq4_nl, 256) { qget_rows<GGML_IQ4_NL>(p); }
KERNEL_LB(get_rows_iq4_xs, 256) { qget_rows<GGML_IQ4_XS>(p); }
KERNEL_LB(get_rows_q4_k, 256) { qget_rows<GGML_Q4_K>(p); }
KERNEL_LB(get_rows_q5_k, 256) { qget_rows<GGML_Q5_K>(p); }
KERNEL_LB(get_rows_q6_k, 256) { qget_rows<GGML_Q6_K>(p); }
KERNEL_LB(get_rows_q2_k, 256) { qget_rows<GGML_Q2_K>(p); }
KERNEL_LB(get_rows_q3_k, 256) { qget_rows<GGML_Q3_K>(p); }
KERNEL_LB(get_rows_bf16, 256) { qget_rows<GGML_BF16>(p); }
KERNEL_LB(dequantize_f16_q4_0, 256) { qdequant_f16<GGML_Q4_0>(p); }
KERNEL_LB(dequantize_f16_q5_0, 256) { qdequant_f16<GGML_Q5_0>(p); }
KERNEL_LB(dequantize_f16_q5_1, 256) { qdequant_f16<GGML_Q5_1>(p); }
KERNEL_LB(dequantize_f16_q4_1, 256) { qdequant_f16<GGML_Q4_1>(p); }
KERNEL_LB(dequantize_f16_iq4_nl, 256) { qdequant_f16<GGML_IQ4_NL>(p); }
KERNEL_LB(dequantize_f16_iq4_xs, 256) { qdequant_f16<GGML_IQ4_XS>(p); }
KERNEL_LB(dequantize_f16_q4_k, 256) { qdequant_f16<GGML_Q4_K>(p); }
KERNEL_LB(dequantize_f16_q5_k, 256) { qdequant_f16<GGML_Q5_K>(p); }
KERNEL_LB(dequantize_f16_q6_k, 256) { qdequant_f16<GGML_Q6_K>(p); }
KERNEL_LB(dequantize_f16_q2_k, 256) { qdequant_f16<GGML_Q2_K>(p); }
KERNEL_LB(dequantize_f16_q3_k, 256) { qdequant_f16<GGML_Q3_K>(p); }
KERNEL_LB(dequantize_f16_bf16, 256) { qdequant_f16<GGML_BF16>(p); }

// MXFP4 (gpt-oss's experts): as IQ4_NL, its levels kvalues_mxfp4 and its scale an E8M0 exponent
KERNEL_LB(mul_mat_vec_mxfp4, 128, 8) { qmmv<GGML_MXFP4, false>(p); }
KERNEL_LB(mul_mat_vec_add_mxfp4, 128, 8) { qmmv<GGML_MXFP4, true>(p); }
KERNEL_LB(mul_mat_vec_glu_mxfp4, 128, 8) { qmmv_glu<GGML_MXFP4>(p); }
KERNEL_LB(mul_mat_id_vec_mxfp4, 128) { qmmv_id<GGML_MXFP4>(p); }
KERNEL_LB(mul_mat_id_vec_glu_mxfp4, 128) { qmmv_id_glu<GGML_MXFP4>(p); }
KERNEL_LB(mul_mat_id_q_mxfp4, 128) { qmmid_sorted<GGML_MXFP4>(p); }
KERNEL_LB(mul_mat_id_gathered_mxfp4, 128) { qmmv_gathered<GGML_MXFP4>(p); }
KERNEL_LB(get_rows_mxfp4, 256) { qget_rows<GGML_MXFP4>(p); }
KERNEL_LB(dequantize_f16_mxfp4, 256) { qdequant_f16<GGML_MXFP4>(p); }
