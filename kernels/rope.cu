// RoPE, and RoPE fused with the K-cache write. One thread per rotated pair: grid-stride over
// (ne0/2) * ne1 * ne2 * ne3 pairs, 256 threads per block.
// ip[0] = n_dims, ip[1] = mode (0 normal: pairs (2i, 2i+1); 2 NEOX: pairs (i, i + n_dims/2)),
// fp[0] = freq_base, fp[1] = freq_scale; the position of token i2 is pos[i2].
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

// theta = pos * freq_scale * freq_base^(-2j / n_dims)
__device__ __forceinline__ void rope_rotate_by(float base, float fscale, int n_dims, i64 j, int pos, float &x0,
                                               float &x1) {
    const float theta = (float)pos * fscale * powf(base, -2.0f * (float)j / (float)n_dims);
    float s, c;
    sincosf(theta, &s, &c);   // full-range accurate (not __sincosf): positions reach thousands of radians
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    x0 = y0; x1 = y1;
}

__device__ __forceinline__ void rope_rotate(const kparams &p, i64 j, int pos, float &x0, float &x1) {
    rope_rotate_by(p.fp[0], p.fp[1], p.ip[0], j, pos, x0, x1);
}

template <typename I> __device__ void rope_t(const kparams &p) {
    const tdesc &D = p.t[0], &X = p.t[1], &P = p.t[2];
    const I npair = (I)(X.ne[0] / 2), n1 = (I)X.ne[1], n2 = (I)X.ne[2];
    const I n = npair * n1 * n2 * (I)X.ne[3], stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const I r = i / npair, j = i - r * npair;
        const I r2 = r / n1, i1 = r - r2 * n1, i3 = r2 / n2, i2 = r2 - i3 * n2;
        i64 a, b;
        const bool rot = rope_pair(j, p.ip[0], p.ip[1], a, b);
        float x0 = load_f(X, a, i1, i2, i3), x1 = load_f(X, b, i1, i2, i3);
        if (rot) rope_rotate(p, j, load_i32(P, i2, 0, 0, 0), x0, x1);
        store_f(D, a, i1, i2, i3, x0);
        store_f(D, b, i1, i2, i3, x1);
    }
}

KERNEL_LB(rope_f32, 256) {
    const tdesc &X = p.t[1];
    if (FITS32(X.ne[0] / 2 * X.ne[1] * X.ne[2] * X.ne[3])) rope_t<unsigned>(p);
    else rope_t<i64>(p);
}

// dst[idx[t], h * D + d] = f16(rope(x)[d, h, t]): the K cache row of token t, heads flattened.
template <typename I> __device__ void rope_set_rows_t(const kparams &p) {
    const tdesc &C = p.t[0], &X = p.t[1], &P = p.t[2], &Ix = p.t[3];
    const i64 hd = X.ne[0];
    const I npair = (I)(hd / 2), nh = (I)X.ne[1], n = npair * nh * (I)X.ne[2], stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const I r = i / npair, j = i - r * npair;
        const I t = r / nh, h = r - t * nh;
        i64 a, b;
        const bool rot = rope_pair(j, p.ip[0], p.ip[1], a, b);
        float x0 = load_f(X, a, h, t, 0), x1 = load_f(X, b, h, t, 0);
        if (rot) rope_rotate(p, j, load_i32(P, t, 0, 0, 0), x0, x1);
        const i64 row = load_i32(Ix, t, 0, 0, 0);
        store_f(C, h * hd + a, row, 0, 0, x0);
        store_f(C, h * hd + b, row, 0, 0, x1);
    }
}

KERNEL_LB(rope_set_rows_f16, 256) {
    const tdesc &X = p.t[1];
    if (FITS32(X.ne[0] / 2 * X.ne[1] * X.ne[2])) rope_set_rows_t<unsigned>(p);
    else rope_set_rows_t<i64>(p);
}

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
    const tdesc &D = p.t[0];
    if (rot) rope_rotate_by(p.fp[1], p.fp[2], p.ip[0], j, pos, x0, x1);
    if (CACHE) {
        store_f(D, i1 * n + a, row, 0, 0, x0);
        store_f(D, i1 * n + b, row, 0, 0, x1);
    } else {
        store_f(D, a, i1, i2, i3, x0);
        store_f(D, b, i1, i2, i3, x1);
    }
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
