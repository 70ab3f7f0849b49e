// Mat-vec kernels (decode's hot path): one warp per weight row, 4 warps per block, up to 8 x columns per
// pass so each weight row is read once. Weight reads are coalesced (16 bytes per lane on the fast paths)
// and partial sums reduced with warp shuffles. Grid: (ceil(M / 4), batch..., ...), block 128, no shmem.
#include "common.cuh"

#define MMV_WARPS 4
#define MMV_NC 8   // x columns per pass (N <= 8 is ggml's mat-vec path; larger N loops)

// 8 halves (one uint4) -> floats
__device__ __forceinline__ void h8(const uint4 v, float *f) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = h2f((unsigned short)(w[i] & 0xffffu));
        f[2 * i + 1] = h2f((unsigned short)(w[i] >> 16));
    }
}

__device__ __forceinline__ bool aligned16(const void *p) { return ((u64)p & 15) == 0; }

// acc[n] += this lane's share of  sum_k w[k] * x_n[k]  for n < nc; x_n = xb + n * xnb1 (F32).
template <int T>
__device__ __forceinline__ void row_dots(const char *w, i64 wnb0, i64 K, const char *xb, i64 xnb0, i64 xnb1,
                                         int nc, float *acc) {
    const int lane = threadIdx.x & 31;
    // Fast paths need contiguous, 16-byte aligned rows (true for weights from the allocator and for
    // contiguous activations); anything else (views, odd strides) takes the generic strided loop.
    const bool xfast = xnb0 == 4 && aligned16(xb) && (xnb1 & 15) == 0;
    if (T == GGML_F16 && xfast && wnb0 == 2 && K % 8 == 0 && aligned16(w)) {
        for (i64 k = lane * 8; k < K; k += 32 * 8) {
            float wf[8];
            h8(*(const uint4 *)(w + k * 2), wf);
#pragma unroll
            for (int n = 0; n < MMV_NC; ++n) {
                if (n < nc) {
                    const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                    const float4 b = *(const float4 *)(xb + n * xnb1 + k * 4 + 16);
                    acc[n] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                              wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
            }
        }
    } else if (T == GGML_F32 && xfast && wnb0 == 4 && K % 4 == 0 && aligned16(w)) {
        for (i64 k = lane * 4; k < K; k += 32 * 4) {
            const float4 wv = *(const float4 *)(w + k * 4);
#pragma unroll
            for (int n = 0; n < MMV_NC; ++n) {
                if (n < nc) {
                    const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                    acc[n] += wv.x * a.x + wv.y * a.y + wv.z * a.z + wv.w * a.w;
                }
            }
        }
    } else if (T == GGML_Q8_0 && xfast && wnb0 == 34 && ((u64)w & 1) == 0) {
        // 4 lanes per 34-byte block, 8 quants each: a warp reads 8 consecutive blocks per step.
        // Blocks are only 2-byte aligned, so quants are read as 4 ushorts.
        const int sub = lane & 3;
        const i64 nblk = K / QK8_0;
        for (i64 b = lane >> 2; b < nblk; b += 8) {
            const char *blk = w + b * 34;
            const float d = h2f(*(const unsigned short *)blk);
            const unsigned short *qs = (const unsigned short *)(blk + 2 + sub * 8);
            float q[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned short v = qs[i];
                q[2 * i] = (float)(signed char)(v & 0xff);
                q[2 * i + 1] = (float)(signed char)(v >> 8);
            }
            const i64 k = b * QK8_0 + sub * 8;
#pragma unroll
            for (int n = 0; n < MMV_NC; ++n) {
                if (n < nc) {
                    const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                    const float4 c = *(const float4 *)(xb + n * xnb1 + k * 4 + 16);
                    acc[n] += d * (q[0] * a.x + q[1] * a.y + q[2] * a.z + q[3] * a.w +
                                   q[4] * c.x + q[5] * c.y + q[6] * c.z + q[7] * c.w);
                }
            }
        }
    } else {
        for (i64 k = lane; k < K; k += 32) {
            const float wv = row_elem<T>(w, k, wnb0);
#pragma unroll
            for (int n = 0; n < MMV_NC; ++n)
                if (n < nc) acc[n] += wv * *(const float *)(xb + n * xnb1 + k * xnb0);
        }
    }
#pragma unroll
    for (int n = 0; n < MMV_NC; ++n) acc[n] = warp_sum(acc[n]);
}

// dst[.., n, m] = W[m] . x[.., n]; W's dims 2/3 broadcast over dst's by division, as ggml's mul_mat.
template <int T> __device__ void mmv(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;   // whole warps leave; no block-wide sync below
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *w = row_ptr(W, m, i2 / (D.ne[2] / W.ne[2]), i3 / (D.ne[3] / W.ne[3]));
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += MMV_NC) {
        const int nc = (int)min((i64)MMV_NC, D.ne[1] - n0);
        float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
        row_dots<T>(w, W.nb[0], W.ne[0], row_ptr(X, n0, i2, i3), X.nb[0], X.nb[1], nc, acc);
#pragma unroll
        for (int n = 0; n < MMV_NC; ++n)
            if (n < nc && lane == n) store_f(D, m, n0 + n, i2, i3, acc[n]);
    }
}

// dst[n, m] = glu(W_gate[m] . x[n], W_up[m] . x[n]) (ip[0]: 0 REGLU, 1 GEGLU, 2 SWIGLU).
template <int T> __device__ void mmv_glu(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *g = row_ptr(G, m, i2 / (D.ne[2] / G.ne[2]), i3 / (D.ne[3] / G.ne[3]));
    const char *u = row_ptr(U, m, i2 / (D.ne[2] / U.ne[2]), i3 / (D.ne[3] / U.ne[3]));
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += MMV_NC) {
        const int nc = (int)min((i64)MMV_NC, D.ne[1] - n0);
        float ag[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0}, au[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
        const char *xb = row_ptr(X, n0, i2, i3);
        row_dots<T>(g, G.nb[0], G.ne[0], xb, X.nb[0], X.nb[1], nc, ag);
        row_dots<T>(u, U.nb[0], U.ne[0], xb, X.nb[0], X.nb[1], nc, au);
#pragma unroll
        for (int n = 0; n < MMV_NC; ++n)
            if (n < nc && lane == n) store_f(D, m, n0 + n, i2, i3, glu(p.ip[0], ag[n], au[n]));
    }
}

// dst[.., n, m] = W[m] . x[.., n] + r[.., n, m] (the residual ADD fused into the mat-vec).
template <int T> __device__ void mmv_add(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *w = row_ptr(W, m, i2 / (D.ne[2] / W.ne[2]), i3 / (D.ne[3] / W.ne[3]));
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += MMV_NC) {
        const int nc = (int)min((i64)MMV_NC, D.ne[1] - n0);
        float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
        row_dots<T>(w, W.nb[0], W.ne[0], row_ptr(X, n0, i2, i3), X.nb[0], X.nb[1], nc, acc);
#pragma unroll
        for (int n = 0; n < MMV_NC; ++n)
            if (n < nc && lane == n) store_f(D, m, n0 + n, i2, i3, acc[n] + load_f(R, m, n0 + n, i2, i3));
    }
}

// dst[t, s, m] = experts[ids[t, s]][m] . x[t, s or 0]. Grid (ceil(M/4), n_used, T).
template <int T> __device__ void mmv_id(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &I = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
    row_dots<T>(row_ptr(W, m, e, 0), W.nb[0], W.ne[0], row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0], 0, 1, acc);
    if ((threadIdx.x & 31) == 0) store_f(D, m, s, t, 0, acc[0]);
}

// One expert (ip[0]) over rows [ip[2], ip[2] + ip[1]) of the (slot, token) map. Grid (ceil(M/4), rows).
// The map is (2, rows) pairs, or a flat (2 * rows) array of interleaved slot, token.
template <int T> __device__ void mmv_gathered(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0] || (int)blockIdx.y >= p.ip[1]) return;
    const i64 j = (i64)p.ip[2] + blockIdx.y;
    const bool pairs = R.ne[0] == 2;
    const int s = pairs ? load_i32(R, 0, j, 0, 0) : load_i32(R, 2 * j, 0, 0, 0);
    const int t = pairs ? load_i32(R, 1, j, 0, 0) : load_i32(R, 2 * j + 1, 0, 0, 0);
    float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
    row_dots<T>(row_ptr(W, m, p.ip[0], 0), W.nb[0], W.ne[0], row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0], 0, 1,
                acc);
    if ((threadIdx.x & 31) == 0) store_f(D, m, s, t, 0, acc[0]);
}

// One wrapper per (operation, weight type): plain names so the driver can find each kernel's file.
KERNEL_LB(mul_mat_vec_f32, 128) { mmv<GGML_F32>(p); }
KERNEL_LB(mul_mat_vec_f16, 128) { mmv<GGML_F16>(p); }
KERNEL_LB(mul_mat_vec_q8_0, 128) { mmv<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_vec_glu_f32, 128) { mmv_glu<GGML_F32>(p); }
KERNEL_LB(mul_mat_vec_glu_f16, 128) { mmv_glu<GGML_F16>(p); }
KERNEL_LB(mul_mat_vec_glu_q8_0, 128) { mmv_glu<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_vec_add_f32, 128) { mmv_add<GGML_F32>(p); }
KERNEL_LB(mul_mat_vec_add_f16, 128) { mmv_add<GGML_F16>(p); }
KERNEL_LB(mul_mat_vec_add_q8_0, 128) { mmv_add<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_id_vec_f32, 128) { mmv_id<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_vec_f16, 128) { mmv_id<GGML_F16>(p); }
KERNEL_LB(mul_mat_id_vec_q8_0, 128) { mmv_id<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_id_gathered_f32, 128) { mmv_gathered<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_gathered_f16, 128) { mmv_gathered<GGML_F16>(p); }
KERNEL_LB(mul_mat_id_gathered_q8_0, 128) { mmv_gathered<GGML_Q8_0>(p); }
