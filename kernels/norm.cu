// Row reductions: one block per row (grid = (ne1, ne2, ne3)), threads striding over ne0 (rms_norm: n / 16
// threads, 32..1024; soft_max: 32..256).
#include "common.cuh"

// Fast path (contiguous 16-byte aligned rows of x, dst and w, n % 4 == 0, n <= 16 * blockDim): each thread
// loads its float4s of x and w at once, keeps x in registers across the reduction, and writes once: one
// memory round trip per row instead of n / blockDim serial loads (decode's one-row norms are latency-bound:
// 19 us for a 4096-wide row in the old loop on the H200). geometry.py sizes the block to n / (4 * RMS_V)
// threads, so each thread takes RMS_V float4s (a 4096-wide row: 256 threads).
#define RMS_V 4   // float4s per thread in the fast path

__device__ __forceinline__ bool rms_fast(const tdesc &d, i64 n) {
    return d.nb[0] == 4 && ((d.data | (u64)d.nb[1] | (u64)d.nb[2] | (u64)d.nb[3]) & 15) == 0 && n % 4 == 0;
}

// per row: x / sqrt(mean(x^2) + eps), times w (broadcast by modulo, as ggml's binary ops) when `mul`, plus r
// (t[3], broadcast the same way: the fused ADD's other operand) when `add`, times fp[1] when `scaled` (the
// fused SCALE's factor: upstream's rms_norm_f32<do_scale>, scale_out * (x * rsqrt), never with `mul`).
__device__ void rms_norm_row(const kparams &p, bool mul, bool add = false, bool scaled = false) {
    __shared__ float red[32];
    const tdesc &D = p.t[0], &X = p.t[1], &Wt = p.t[2], &R = p.t[3];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
    const bool fast = rms_fast(X, n) && rms_fast(D, n) && (!mul || (rms_fast(Wt, n) && Wt.ne[0] == n)) &&
                      (!add || (rms_fast(R, n) && R.ne[0] == n)) && n <= (i64)4 * RMS_V * blockDim.x;
    if (fast) {
        const float4 *xr = (const float4 *)row_ptr(X, i1, i2, i3);
        const float4 *wr = mul ? (const float4 *)row_ptr(Wt, i1 % Wt.ne[1], i2 % Wt.ne[2], i3 % Wt.ne[3]) : 0;
        const float4 *rr = add ? (const float4 *)row_ptr(R, i1 % R.ne[1], i2 % R.ne[2], i3 % R.ne[3]) : 0;
        const int n4 = (int)(n / 4);
        float4 xv[RMS_V], wv[RMS_V], rv[RMS_V];
#pragma unroll
        for (int u = 0; u < RMS_V; ++u) {
            const int i = threadIdx.x + u * blockDim.x;
            xv[u] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            wv[u] = (mul && i < n4) ? wr[i] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            rv[u] = (add && i < n4) ? rr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < RMS_V; ++u) ss += xv[u].x * xv[u].x + xv[u].y * xv[u].y + xv[u].z * xv[u].z + xv[u].w * xv[u].w;
        ss = block_sum(ss, red);
        const float scale = 1.0f / sqrtf(ss / (float)n + p.fp[0]);
        float4 *dr = (float4 *)row_ptr(D, i1, i2, i3);
#pragma unroll
        for (int u = 0; u < RMS_V; ++u) {
            const int i = threadIdx.x + u * blockDim.x;
            if (i < n4) {
                float4 v = make_float4(xv[u].x * scale, xv[u].y * scale, xv[u].z * scale, xv[u].w * scale);
                if (mul) { v.x *= wv[u].x; v.y *= wv[u].y; v.z *= wv[u].z; v.w *= wv[u].w; }
                if (add) { v.x += rv[u].x; v.y += rv[u].y; v.z += rv[u].z; v.w += rv[u].w; }
                if (scaled) { v.x *= p.fp[1]; v.y *= p.fp[1]; v.z *= p.fp[1]; v.w *= p.fp[1]; }
                dr[i] = v;
            }
        }
        return;
    }
    float ss = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float v = load_f(X, i0, i1, i2, i3);
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float scale = 1.0f / sqrtf(ss / (float)n + p.fp[0]);   // not rsqrtf: keep ~1 ulp vs numpy
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float v = load_f(X, i0, i1, i2, i3) * scale;
        if (mul) v *= load_f(Wt, i0 % Wt.ne[0], i1 % Wt.ne[1], i2 % Wt.ne[2], i3 % Wt.ne[3]);
        if (add) v += load_f(R, i0 % R.ne[0], i1 % R.ne[1], i2 % R.ne[2], i3 % R.ne[3]);
        if (scaled) v *= p.fp[1];
        store_f(D, i0, i1, i2, i3, v);
    }
}

KERNEL_LB(rms_norm_f32, 1024) { rms_norm_row(p, false); }
KERNEL_LB(rms_norm_mul_f32, 1024) { rms_norm_row(p, true); }
KERNEL_LB(rms_norm_mul_add_f32, 1024) { rms_norm_row(p, true, true); }
KERNEL_LB(rms_norm_scale_f32, 1024) { rms_norm_row(p, false, false, true); }

// per row: dst[0] = sum_i x[i] (GGML_OP_SUM_ROWS; the block's partial sums in a fixed order)
KERNEL_LB(sum_rows_f32, 256) {
    __shared__ float red[32];
    const tdesc &D = p.t[0], &X = p.t[1];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
    float s = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) s += load_f(X, i0, i1, i2, i3);
    s = block_sum(s, red);
    if (threadIdx.x == 0) store_f(D, 0, i1, i2, i3, s);
}

// per row: softmax(scale * x)
KERNEL_LB(soft_max_f32, 256) {
    __shared__ float red[32];
    const tdesc &D = p.t[0], &X = p.t[1];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
    const float scale = p.fp[0];
    float mx = F32_NEG_INF;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) mx = fmaxf(mx, scale * load_f(X, i0, i1, i2, i3));
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        const float e = mx == F32_NEG_INF ? 0.0f : expf(scale * load_f(X, i0, i1, i2, i3) - mx);
        store_f(D, i0, i1, i2, i3, e);   // dst may alias x (in place): each element is read before written
        sum += e;
    }
    sum = block_sum(sum, red);   // its barriers also order the writes above before the reads below
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;   // a fully masked (-inf) row gives zeros
    for (i64 i0 = threadIdx.x; i0 < n; i0 += blockDim.x)
        store_f(D, i0, i1, i2, i3, load_f(D, i0, i1, i2, i3) * inv);
}
