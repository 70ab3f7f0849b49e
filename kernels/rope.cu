// RoPE, and RoPE fused with the K-cache write (and with RMS_NORM + MUL before it). One block per row of x,
// a thread per rotated pair (up to 256 per block, striding beyond).
// ip[0] = n_dims, ip[1] = mode (0 normal: pairs (2i, 2i+1); 2 NEOX: pairs (i, i + n_dims/2)),
// fp[0] = freq_base, fp[1] = freq_scale; the position of token i2 is pos[i2]. rope_f32 and rope_set_rows_f16
// take YaRN (gpt-oss) in fp[2..5]: ext_factor, attn_factor (0: none), the ramp's corr dims (host-computed).
#include "common.cuh"

#define ROPE_NEOX 2

// Element indices (a, b) of pair j, and whether it rotates (pairs past n_dims are copied unchanged).
__device__ __forceinline__ bool rope_pair(i64 j, int n_dims, int mode, i64 &a, i64 &b) {
    const i64 half = n_dims / 2;
    if (mode == ROPE_NEOX) {
        if (j < half) { a = j; b = j + half; return true; }
        a = n_dims + 2 * (j - half); b = a + 1;
        return false;
    }
    a = 2 * j; b = a + 1;
    return a < n_dims;
}

// sin and cos of theta: theta reduced to [-pi, pi] by 2 pi in two parts (Cody-Waite: k * 2pi_hi is exact in
// the fma, 2pi_lo = 2 pi - 2pi_hi), then the hardware's sin and cos, whose absolute error there is 2^-21.4
// (CUDA's __sinf). About 5e-7 in all for the positions a model reaches (|theta| < 2^17), against float32
// theta's own rounding of 1e-5 at position 100 and 1e-4 at 1000. Ten instructions: sincosf's ~200 (its
// Payne-Hanek branch for huge arguments included) were a third of the rope kernels' code, which a decode
// step fetches anew from memory (the weights stream through L2 between two ropes).
__device__ __forceinline__ void rope_sincos(float theta, float &s, float &c) {
    const float k = rintf(theta * 0.15915494309189535f);
    float r = fmaf(-k, 6.28318548202514648f, theta);   // 2pi_hi: 2 pi rounded to float
    r = fmaf(-k, -1.7484555314695172e-07f, r);          // 2pi_lo
    __sincosf(r, &s, &c);
}

// theta = pos * freq_scale * freq_base^(-2j / n_dims)
__device__ __forceinline__ void rope_rotate_by(float base, float fscale, int n_dims, i64 j, int pos, float &x0,
                                               float &x1) {
    const float theta = (float)pos * fscale * powf(base, -2.0f * (float)j / (float)n_dims);
    float s, c;
    rope_sincos(theta, s, c);
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    x0 = y0; x1 = y1;
}

// ggml's rope_yarn: the angle extrapolated below the ramp (pair j <= c0), interpolated (times freq_scale)
// above it, mixed between; cos and sin scaled by attn * (1 + 0.1 ln(1 / freq_scale)) where ext != 0.
__device__ __forceinline__ void rope_rotate_yarn(const kparams &p, i64 j, int pos, float &x0, float &x1) {
    const float fscale = p.fp[1], ext = p.fp[2], c0 = p.fp[4], c1 = p.fp[5];
    const float th_e = (float)pos * powf(p.fp[0], -2.0f * (float)j / (float)p.ip[0]);
    float theta = fscale * th_e, mscale = p.fp[3];
    if (ext != 0.0f) {
        const float y = ((float)j - c0) / fmaxf(0.001f, c1 - c0);
        const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext;
        theta = theta * (1.0f - ramp) + th_e * ramp;
        mscale *= 1.0f + 0.1f * logf(1.0f / fscale);
    }
    float s, c;
    rope_sincos(theta, s, c);
    c *= mscale;
    s *= mscale;
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    x0 = y0; x1 = y1;
}

__device__ __forceinline__ void rope_rotate(const kparams &p, i64 j, int pos, float &x0, float &x1) {
    if (p.fp[3] != 0.0f) rope_rotate_yarn(p, j, pos, x0, x1);
    else rope_rotate_by(p.fp[0], p.fp[1], p.ip[0], j, pos, x0, x1);
}

// Store the pair (a, b) of row (i1, i2, i3): to the rope's own output, or (CACHE) to the F16 cache row `row` at
// i1 * n + a / b (heads flattened, n = the head size).
template <bool CACHE>
__device__ __forceinline__ void rope_store(const tdesc &D, i64 a, i64 b, i64 i1, i64 i2, i64 i3, i64 n, i64 row,
                                           float x0, float x1) {
    if (CACHE) {
        store_f(D, i1 * n + a, row, 0, 0, x0);
        store_f(D, i1 * n + b, row, 0, 0, x1);
    } else {
        store_f(D, a, i1, i2, i3, x0);
        store_f(D, b, i1, i2, i3, x1);
    }
}

// rope_f32 and rope_set_rows_f16: one block per row (head i1, token i2, batch i3) of x, a thread per rotated
// pair (striding past the block; rows past the grid's y and z, which geometry.py caps at 65535, stride too).
// A row's position and cache row are loaded once per block and no index is divided: the grid-stride loop
// over all pairs this replaces unravelled each pair's index by three divisions ahead of its loads, and a
// decode's rope took 2.4 us under CUPTI against upstream's 1.3-1.5.
// CACHE: dst[idx[i2], i1 * D + d] = f16(rope(x)[d, i1, i2]), the K cache row of token i2, heads flattened
// (t[3] = idx; x's ne3 is 1 by the catalogue).
template <bool CACHE> __device__ void rope_rows(const kparams &p) {
    const tdesc &D = p.t[0], &X = p.t[1], &P = p.t[2];
    const i64 hd = X.ne[0], i1 = blockIdx.x;
    const int npair = (int)(hd / 2), n_dims = p.ip[0], mode = p.ip[1];
    for (i64 i3 = blockIdx.z; i3 < X.ne[3]; i3 += gridDim.z)
        for (i64 i2 = blockIdx.y; i2 < X.ne[2]; i2 += gridDim.y) {
            const int pos = load_i32(P, i2, 0, 0, 0);
            const i64 row = CACHE ? (i64)load_i32(p.t[3], i2, 0, 0, 0) : 0;
            for (int j = threadIdx.x; j < npair; j += blockDim.x) {
                i64 a, b;
                const bool rot = rope_pair(j, n_dims, mode, a, b);
                float x0 = load_f(X, a, i1, i2, i3), x1 = load_f(X, b, i1, i2, i3);
                if (rot) rope_rotate(p, j, pos, x0, x1);
                rope_store<CACHE>(D, a, b, i1, i2, i3, hd, row, x0, x1);
            }
        }
}

KERNEL_LB(rope_f32, 256) { rope_rows<false>(p); }
KERNEL_LB(rope_set_rows_f16, 256) { rope_rows<true>(p); }

// RMS_NORM + MUL + ROPE (QK-norm), optionally + VIEW + SET_ROWS (CACHE): one block per row (head i1, token
// i2, batch i3) of x (t[1]); the row's sum of squares by block reduction, then a thread per rotated pair:
// y = rms_norm(x) * w (t[2], broadcast by modulo), rotated by pos[i2] (t[3]). fp = (eps, freq_base,
// freq_scale), ip = (n_dims, mode). CACHE: written to the F16 cache row idx[i2] (t[4]) at i1 * D + d (heads
// flattened) instead of the rope's own (D, H, T) output. Each pair is read and written by one thread after
// the reduction's barriers, so in place is safe.
// The pair (a, b) of row (i1, i2, i3), normalised and weighted (x0, x1), rotated by pos when `rot`, written to
// the rope's output or (CACHE) to the cache row `row` at i1 * n + a / b.
template <bool CACHE>
__device__ __forceinline__ void norm_rope_store(const kparams &p, i64 j, i64 a, i64 b, bool rot, int pos, i64 row,
                                                i64 i1, i64 i2, i64 i3, i64 n, float x0, float x1) {
    if (rot) rope_rotate_by(p.fp[1], p.fp[2], p.ip[0], j, pos, x0, x1);
    rope_store<CACHE>(p.t[0], a, b, i1, i2, i3, n, row, x0, x1);
}

template <bool CACHE> __device__ void norm_mul_rope_row(const kparams &p) {
    __shared__ float red[32];
    const tdesc &X = p.t[1], &W = p.t[2], &P = p.t[3];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
    const i64 w1 = i1 % W.ne[1], w2 = i2 % W.ne[2], w3 = i3 % W.ne[3];
    if (n / 2 <= (i64)blockDim.x) {
        // A pair per thread (head sizes up to twice the block): the pair's x and w, the position and the
        // cache row are loaded together before the reduction, one round trip to memory in all (loaded after
        // it, as the loop below does, they made a second: Gemma 3's Q/K norms took 6.4 us under ncu, cold,
        // against upstream's 4.0). The sum of squares adds the pairs' x0^2 + x1^2.
        const i64 j = threadIdx.x;
        const bool has = j < n / 2;
        i64 a = 0, b = 0;
        bool rot = false;
        float x0 = 0.0f, x1 = 0.0f, g0 = 0.0f, g1 = 0.0f;
        if (has) {
            rot = rope_pair(j, p.ip[0], p.ip[1], a, b);
            x0 = load_f(X, a, i1, i2, i3);
            x1 = load_f(X, b, i1, i2, i3);
            g0 = load_f(W, a % W.ne[0], w1, w2, w3);
            g1 = load_f(W, b % W.ne[0], w1, w2, w3);
        }
        const int pos = load_i32(P, i2, 0, 0, 0);
        const i64 row = CACHE ? (i64)load_i32(p.t[4], i2, 0, 0, 0) : 0;
        const float ss = block_sum(x0 * x0 + x1 * x1, red);
        const float scale = 1.0f / sqrtf(ss / (float)n + p.fp[0]);   // as norm.cu: not rsqrtf
        if (has) norm_rope_store<CACHE>(p, j, a, b, rot, pos, row, i1, i2, i3, n, x0 * scale * g0, x1 * scale * g1);
        return;
    }
    float ss = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float v = load_f(X, i0, i1, i2, i3);
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)n + p.fp[0]);   // as norm.cu: not rsqrtf
    const int pos = load_i32(P, i2, 0, 0, 0);
    const i64 row = CACHE ? (i64)load_i32(p.t[4], i2, 0, 0, 0) : 0;
    for (i64 j = threadIdx.x; j < n / 2; j += blockDim.x) {
        i64 a, b;
        const bool rot = rope_pair(j, p.ip[0], p.ip[1], a, b);
        norm_rope_store<CACHE>(p, j, a, b, rot, pos, row, i1, i2, i3, n,
                               load_f(X, a, i1, i2, i3) * scale * load_f(W, a % W.ne[0], w1, w2, w3),
                               load_f(X, b, i1, i2, i3) * scale * load_f(W, b % W.ne[0], w1, w2, w3));
    }
}

KERNEL_LB(rms_norm_mul_rope_f32, 256) { norm_mul_rope_row<false>(p); }
KERNEL_LB(rms_norm_mul_rope_set_rows_f16, 256) { norm_mul_rope_row<true>(p); }
