// Mat-vec kernels (decode's hot path): one warp per weight row, 4 warps per block, up to 8 x columns per
// pass so each weight row is read once. Grid: (ceil(M / 4), batch...), block 128, no shmem.
//
// F16 / F32 weights take F32 x: each lane reads 16 bytes of the row per load and keeps MMV_ILP loads in
// flight (the row is consumed 32 * MMV_ILP * 16 bytes per step), so enough bytes are outstanding per SM to
// run near HBM bandwidth. Q8_0 weights take x already quantised to Q8_1 blocks (quantize.cu, pool scratch):
// integer dot products (dp4a) per 32-block, scaled by both blocks' f16 scales, as ggml's mmvq:
//   dst = sum_b d_w[b] * d_x[b] * sum_i q_w[b, i] * q_x[b, i]
// The MoE kernels (mul_mat_id_*) read F32 x for float experts and, as upstream's mmvq / mmq, Q8_1 x for Q8_0
// experts (the sorted fallback's mul_mat_id_gathered_* keeps F32 x for every type).
//
// A row can be shared by several warps of the block (mul_mat_vec / _add at one column, ip[1] = warps per row:
// 1, 2 or 4, chosen by the lowering from M and K): warp `part` of a row takes every nparts-th step of the
// row, the partial sums meet in shared memory and are added in part order (deterministic). Few long rows
// (the K/V projections, M = 512) then still keep enough loads in flight to fill the GPU.
#include "common.cuh"

#define MMV_WARPS 4
#define MMV_NC 8    // x columns per pass (N <= 8 is ggml's mat-vec path; larger N loops)
#define MMV_ILP 4   // 16-byte weight loads in flight per lane (one column; 2 columns or more: 1); 8 measured
                    // slower on the H200 (1b/7b shapes, 2026-12)
#define MMV_ILP_Q 4 // Q8_0 steps of 8 blocks in flight per warp (one column)

__device__ __forceinline__ bool aligned16(const void *p) { return ((u64)p & 15) == 0; }

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// acc[n] += this lane's share of  sum_k w[k] * x_n[k]  for n < nc; x_n = xb + n * xnb1 (F32).
//
// The vectorised paths issue ILP loads per lane (zero past the row's end), then use those inside it. The
// use is predicated (`continue`), not a `break` out of the unrolled loop: the break made the compiler hold
// back loads (measured on the H200, cold L2: K11008 M4096 31.7 -> 26.2 us, K4096 M4096 13.5 -> 12.4 us,
// K2048 M32000 36.4 -> 35.1 us). The order of the sums is unchanged.
template <int T, int NC = MMV_NC>
__device__ __forceinline__ void row_dots(const char *w, i64 wnb0, i64 K, const char *xb, i64 xnb0, i64 xnb1,
                                         int nc, float *acc, int part = 0, int nparts = 1) {
    constexpr int ILP = NC == 1 ? MMV_ILP : 1;
    const int lane = threadIdx.x & 31;
    // Fast paths need contiguous, 16-byte aligned rows (true for weights from the allocator and for
    // contiguous activations); anything else (views, odd strides) takes the generic strided loop.
    const bool xfast = xnb0 == 4 && aligned16(xb) && (xnb1 & 15) == 0;
    if (T == GGML_F16 && xfast && wnb0 == 2 && K % 8 == 0 && aligned16(w)) {
        for (i64 k0 = lane * 8 + part * 256 * ILP; k0 < K; k0 += 32 * 8 * ILP * nparts) {
            uint4 wv[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                const i64 k = k0 + u * 256;
                wv[u] = k < K ? *(const uint4 *)(w + k * 2) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                const i64 k = k0 + u * 256;
                if (k >= K) continue;
                float wf[8];
                h8(wv[u], wf);
#pragma unroll
                for (int n = 0; n < NC; ++n) {
                    if (n < nc) {
                        const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                        const float4 b = *(const float4 *)(xb + n * xnb1 + k * 4 + 16);
                        acc[n] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                                  wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        }
    } else if (T == GGML_F32 && xfast && wnb0 == 4 && K % 4 == 0 && aligned16(w)) {
        for (i64 k0 = lane * 4 + part * 128 * ILP; k0 < K; k0 += 32 * 4 * ILP * nparts) {
            float4 wv[ILP];
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                const i64 k = k0 + u * 128;
                wv[u] = k < K ? *(const float4 *)(w + k * 4) : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < ILP; ++u) {
                const i64 k = k0 + u * 128;
                if (k >= K) continue;
#pragma unroll
                for (int n = 0; n < NC; ++n) {
                    if (n < nc) {
                        const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                        acc[n] += wv[u].x * a.x + wv[u].y * a.y + wv[u].z * a.z + wv[u].w * a.w;
                    }
                }
            }
        }
    } else if (T == GGML_Q8_0 && xfast && wnb0 == 34 && ((u64)w & 1) == 0) {
        // F32 x (the MoE kernels): 4 lanes per 34-byte block, 8 quants each (blocks are 2-byte aligned).
        const int sub = lane & 3;
        const i64 nblk = K / QK8_0;
        for (i64 b = (lane >> 2) + 8 * part; b < nblk; b += 8 * nparts) {
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
            for (int n = 0; n < NC; ++n) {
                if (n < nc) {
                    const float4 a = *(const float4 *)(xb + n * xnb1 + k * 4);
                    const float4 c = *(const float4 *)(xb + n * xnb1 + k * 4 + 16);
                    acc[n] += d * (q[0] * a.x + q[1] * a.y + q[2] * a.z + q[3] * a.w +
                                   q[4] * c.x + q[5] * c.y + q[6] * c.z + q[7] * c.w);
                }
            }
        }
    } else {
        for (i64 k = lane + 32 * part; k < K; k += 32 * nparts) {
            const float wv = row_elem<T>(w, k, wnb0);
#pragma unroll
            for (int n = 0; n < NC; ++n)
                if (n < nc) acc[n] += wv * *(const float *)(xb + n * xnb1 + k * xnb0);
        }
    }
#pragma unroll
    for (int n = 0; n < NC; ++n) acc[n] = warp_sum(acc[n]);
}

// Two F16 rows against one F32 column (the gate/up pair of the fused GLU at batch 1): both rows' loads are
// interleaved, MMV_ILP per row in flight, so the pair costs one row's round trips. Caller checks the
// fast-path conditions of row_dots (contiguous, 16-byte aligned, K % 8 == 0).
__device__ __forceinline__ void row_dots2_f16(const char *w1, const char *w2, i64 K, const char *xb, float &a1,
                                              float &a2) {
    constexpr int ILP = MMV_ILP;   // per row: 2 * MMV_ILP loads in flight
    const int lane = threadIdx.x & 31;
    for (i64 k0 = lane * 8; k0 < K; k0 += 32 * 8 * ILP) {
        uint4 v1[ILP], v2[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            const i64 k = k0 + u * 256;
            v1[u] = k < K ? *(const uint4 *)(w1 + k * 2) : make_uint4(0, 0, 0, 0);
            v2[u] = k < K ? *(const uint4 *)(w2 + k * 2) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            const i64 k = k0 + u * 256;
            if (k >= K) continue;   // predicated, as row_dots
            float f1[8], f2[8];
            h8(v1[u], f1);
            h8(v2[u], f2);
            const float4 a = *(const float4 *)(xb + k * 4);
            const float4 b = *(const float4 *)(xb + k * 4 + 16);
            a1 += f1[0] * a.x + f1[1] * a.y + f1[2] * a.z + f1[3] * a.w + f1[4] * b.x + f1[5] * b.y + f1[6] * b.z +
                  f1[7] * b.w;
            a2 += f2[0] * a.x + f2[1] * a.y + f2[2] * a.z + f2[3] * a.w + f2[4] * b.x + f2[5] * b.y + f2[6] * b.z +
                  f2[7] * b.w;
        }
    }
    a1 = warp_sum(a1);
    a2 = warp_sum(a2);
}

// Funnel shift right: the 32 bits of hi:lo starting at bit sh (0..31).
__device__ __forceinline__ unsigned shf_r(unsigned lo, unsigned hi, unsigned sh) {
    unsigned d;
    asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(sh));
    return d;
}

// The 8 quant words of the 34-byte Q8_0 block at blk (2-byte aligned): its 32 quants start 2 bytes in, so
// they are 4-byte aligned for every other block. 8 aligned word loads and a funnel shift serve both cases;
// when the quants start mid-word, the last two come from one 2-byte load, so no byte past the block is read.
__device__ __forceinline__ void q8_block_words(const unsigned char *blk, int *q) {
    const u64 qa = (u64)(blk + 2);
    const unsigned *wb = (const unsigned *)(qa & ~(u64)3);
    const unsigned sh = (unsigned)(qa & 3) * 8;
    unsigned wv[9];
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[i] = wb[i];
    wv[8] = sh ? (unsigned)*(const unsigned short *)(blk + 32) : 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = (int)shf_r(wv[i], wv[i + 1], sh);
}

// sum_i q[i] . (the 32 int8 of the Q8_1 block at xb), as one integer sum (ggml's vec_dot_q8_0_q8_1).
__device__ __forceinline__ int q8_1_dot32(const int *q, const char *xb) {
    const int *xi = (const int *)(xb + 4);
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) sum = dp4a(q[i], xi[i], sum);
    return sum;
}

// One whole Q8_0 block (one lane) against the Q8_1 block of x: d_w * d_x * (integer dot of the 32 quants).
__device__ __forceinline__ float q8_lane_block(const unsigned char *blk, const char *xb) {
    int q[8];
    q8_block_words(blk, q);
    return h2f(*(const unsigned short *)blk) * h2f(*(const unsigned short *)xb) * (float)q8_1_dot32(q, xb);
}

// One column against blocks [b0, nblk) of a Q8_0 row, a whole block per lane (lane + 32 * part, stepping
// 32 * nparts): rows of fewer than Q8_STEP blocks (tiny's and Gemma 3's K 512 / 640: the LM head), rows not
// 16-byte aligned (odd rows of a 640-wide matrix) and the blocks past a staged row's last whole step. Each
// lane has its block's 8 words in flight at once; the 4-lanes-a-block loop this replaces (2-byte loads, 8
// blocks a pass) ran Gemma 3's Q8_0 LM head (K 640, 262144 rows) at half of ggml's bandwidth on the H200.
__device__ __forceinline__ float q8_row_lanes(const char *w, i64 b0, i64 nblk, const char *xq, int part, int nparts) {
    const int lane = threadIdx.x & 31;
    float a = 0.0f;
#pragma unroll 2
    for (i64 b = b0 + lane + 32 * part; b < nblk; b += 32 * nparts)
        a += q8_lane_block((const unsigned char *)w + b * 34, xq + b * 36);
    return a;
}

// One column against a 16-byte aligned Q8_0 row, staged: the row is read in steps of Q8_STEP blocks (1088
// bytes, a multiple of 16) as coalesced 16-byte loads (3 per lane, the next step's in flight while this one
// is used) into the warp's shared buffer; each lane then takes one whole block of the step from there (one
// integer dot of 32 quants, one scale product: measured on the H200, cold L2, K2048 M32000: 31.6 -> 22.5 us
// against 4 lanes per block). Step s of the row goes to part s % nparts; the blocks past the last whole step
// take a lane each straight from global memory (q8_row_lanes).
#define Q8_STEP 32
#define Q8_STEP_U4 (Q8_STEP * 34 / 16)   // 68 uint4 per step
#define Q8_STAGE (Q8_STEP * 34)
__device__ __forceinline__ float q8_row_staged(const char *w, i64 K, const char *xq, int part, int nparts) {
    __shared__ __align__(16) unsigned char stage[MMV_WARPS][Q8_STAGE];
    const int lane = threadIdx.x & 31;
    uint4 *st = (uint4 *)stage[(threadIdx.x >> 5) % MMV_WARPS];
    const i64 nblk = K / QK8_0, nsteps = nblk / Q8_STEP;
    float a = 0.0f;
    uint4 n0 = make_uint4(0, 0, 0, 0), n1 = n0, n2 = n0;
    auto fetch = [&](i64 s) {
        const uint4 *src = (const uint4 *)(w + s * (Q8_STEP * 34));
        n0 = src[lane];
        n1 = src[lane + 32];
        if (lane < Q8_STEP_U4 - 64) n2 = src[lane + 64];
    };
    if (part < nsteps) fetch(part);
    for (i64 s = part; s < nsteps; s += nparts) {
        const uint4 c0 = n0, c1 = n1, c2 = n2;
        if (s + nparts < nsteps) fetch(s + nparts);
        __syncwarp();   // the previous step's reads of the buffer are done
        st[lane] = c0;
        st[lane + 32] = c1;
        if (lane < Q8_STEP_U4 - 64) st[lane + 64] = c2;
        __syncwarp();
        a += q8_lane_block((const unsigned char *)st + lane * 34, xq + (s * Q8_STEP + lane) * 36);
    }
    return a + q8_row_lanes(w, nsteps * Q8_STEP, nblk, xq, part, nparts);
}

// The GLU pair (gate and up rows against one column) staged together: both rows' steps are in flight at
// once (six 16-byte loads per lane), and each lane takes the same block of both rows against one x block.
__device__ __forceinline__ void q8_rows2_staged(const char *wg, const char *wu, i64 K, const char *xq, float &ag,
                                                float &au) {
    __shared__ __align__(16) unsigned char stage2[MMV_WARPS][2][Q8_STAGE];
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % MMV_WARPS;
    uint4 *sg = (uint4 *)stage2[warp][0], *su = (uint4 *)stage2[warp][1];
    const i64 nblk = K / QK8_0, nsteps = nblk / Q8_STEP;
    for (i64 s = 0; s < nsteps; ++s) {
        const uint4 *g = (const uint4 *)(wg + s * (Q8_STEP * 34)), *u = (const uint4 *)(wu + s * (Q8_STEP * 34));
        const uint4 g0 = g[lane], g1 = g[lane + 32], u0 = u[lane], u1 = u[lane + 32];
        uint4 g2 = make_uint4(0, 0, 0, 0), u2 = g2;
        if (lane < Q8_STEP_U4 - 64) { g2 = g[lane + 64]; u2 = u[lane + 64]; }
        __syncwarp();
        sg[lane] = g0; sg[lane + 32] = g1; su[lane] = u0; su[lane + 32] = u1;
        if (lane < Q8_STEP_U4 - 64) { sg[lane + 64] = g2; su[lane + 64] = u2; }
        __syncwarp();
        const char *xb = xq + (s * Q8_STEP + lane) * 36;
        const unsigned char *bg = (const unsigned char *)sg + lane * 34, *bu = (const unsigned char *)su + lane * 34;
        const float dx = h2f(*(const unsigned short *)xb);
        int q[8];   // one row's words at a time: fewer registers live
        q8_block_words(bg, q);
        ag += h2f(*(const unsigned short *)bg) * dx * (float)q8_1_dot32(q, xb);
        q8_block_words(bu, q);
        au += h2f(*(const unsigned short *)bu) * dx * (float)q8_1_dot32(q, xb);
    }
    for (i64 b = nsteps * Q8_STEP + lane; b < nblk; b += 32) {
        ag += q8_lane_block((const unsigned char *)wg + b * 34, xq + b * 36);
        au += q8_lane_block((const unsigned char *)wu + b * 34, xq + b * 36);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
}

// Q8_0 row . Q8_1 x rows (xq + n * xnb1: K / 32 blocks of 36 bytes: f16 d, f16 s, 32 int8). 4 lanes per
// weight block (8 quants = 2 ints each), 8 blocks per warp step, ILP steps in flight (several columns). One
// column takes the staged loop above (16-byte aligned rows of Q8_STEP blocks or more), else a block a lane.
template <int NC>
__device__ __forceinline__ void row_dots_q8_1(const char *w, i64 wnb0, i64 K, const char *xq, i64 xnb1, int nc,
                                              float *acc, int part = 0, int nparts = 1) {
    constexpr int ILP = NC == 1 ? MMV_ILP_Q : 1;
    const int lane = threadIdx.x & 31, sub = lane & 3;
    const i64 nblk = K / QK8_0;
    if (NC == 1 && wnb0 == 34) {
        const float a = nblk >= Q8_STEP && aligned16(w) ? q8_row_staged(w, K, xq, part, nparts)
                                                        : q8_row_lanes(w, 0, nblk, xq, part, nparts);
        acc[0] = warp_sum(acc[0] + a);
        return;
    }
    for (i64 b0 = (lane >> 2) + 8 * ILP * part; b0 < nblk; b0 += 8 * ILP * nparts) {
        int wq[ILP][2];
        float wd[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            const i64 b = b0 + 8 * u;
            if (b < nblk) {
                const char *blk = w + b * wnb0;
                const unsigned short *qs = (const unsigned short *)(blk + 2 + sub * 8);
                wd[u] = h2f(*(const unsigned short *)blk);
                wq[u][0] = (int)((unsigned)qs[0] | ((unsigned)qs[1] << 16));
                wq[u][1] = (int)((unsigned)qs[2] | ((unsigned)qs[3] << 16));
            } else {
                wd[u] = 0.0f; wq[u][0] = wq[u][1] = 0;
            }
        }
#pragma unroll
        for (int u = 0; u < ILP; ++u) {
            const i64 b = b0 + 8 * u;
            if (b >= nblk) continue;   // predicated, as row_dots
#pragma unroll
            for (int n = 0; n < NC; ++n) {
                if (n < nc) {
                    const char *xb = xq + n * xnb1 + b * 36;
                    const float dx = h2f(*(const unsigned short *)xb);
                    const int *xi = (const int *)(xb + 4 + sub * 8);
                    const int s = dp4a(wq[u][1], xi[1], dp4a(wq[u][0], xi[0], 0));
                    acc[n] += wd[u] * dx * (float)s;
                }
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NC; ++n) acc[n] = warp_sum(acc[n]);
}

// One column pass of W[m] . x[n0 .. n0 + nc): F32 x for float weights, Q8_1 x for Q8_0 weights.
template <int T, int NC>
__device__ __forceinline__ void dots(const char *w, const tdesc &W, const tdesc &X, i64 n0, i64 i2, i64 i3, int nc,
                                     float *acc, int part = 0, int nparts = 1) {
    if (T == GGML_Q8_0) row_dots_q8_1<NC>(w, W.nb[0], W.ne[0], row_ptr(X, n0, i2, i3), X.nb[1], nc, acc, part, nparts);
    else row_dots<T, NC>(w, W.nb[0], W.ne[0], row_ptr(X, n0, i2, i3), X.nb[0], X.nb[1], nc, acc, part, nparts);
}

// dst[.., n, m] = W[m] . x[.., n] (+ r[.., n, m] when `add`: the residual ADD fused into the mat-vec).
// W's dims 2/3 broadcast over dst's by division, as ggml's mul_mat; r broadcasts by modulo, as ggml's add.
// NC = 1 (one column, decode at batch 1) is its own instantiation: no registers for 8 columns.
template <int T, bool add, int NC> __device__ __forceinline__ void mmv_cols(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;   // whole warps leave; no block-wide sync below
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *w = row_ptr(W, m, i2 / (D.ne[2] / W.ne[2]), i3 / (D.ne[3] / W.ne[3]));
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += NC) {
        const int nc = (int)min((i64)NC, D.ne[1] - n0);
        float acc[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) acc[n] = 0.0f;
        dots<T, NC>(w, W, X, n0, i2, i3, nc, acc);
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

// One column, ip[1] warps per row (2 or 4): 4 / ip[1] rows per block. No warp leaves before the barrier.
template <int T, bool add> __device__ __forceinline__ void mmv_split(const kparams &p) {
    __shared__ float sums[MMV_WARPS];
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[3];
    const int nparts = p.ip[1], warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % nparts;
    const i64 m = (i64)blockIdx.x * (MMV_WARPS / nparts) + warp / nparts;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    float acc[1] = {0.0f};
    if (m < D.ne[0]) {
        const char *w = row_ptr(W, m, i2 / (D.ne[2] / W.ne[2]), i3 / (D.ne[3] / W.ne[3]));
        dots<T, 1>(w, W, X, 0, i2, i3, 1, acc, part, nparts);
    }
    if (lane == 0) sums[warp] = acc[0];
    __syncthreads();
    if (part == 0 && lane == 0 && m < D.ne[0]) {
        float v = 0.0f;
        for (int q = 0; q < nparts; ++q) v += sums[warp + q];
        if (add) v += load_f(R, m % R.ne[0], 0, i2 % R.ne[2], i3 % R.ne[3]);
        store_f(D, m, 0, i2, i3, v);
    }
}

template <int T, bool add> __device__ void mmv(const kparams &p) {
    if (p.t[0].ne[1] == 1 && p.ip[1] > 1) mmv_split<T, add>(p);
    else if (p.t[0].ne[1] == 1) mmv_cols<T, add, 1>(p);
    else mmv_cols<T, add, MMV_NC>(p);
}

// dst[n, m] = glu(W_gate[m] . x[n], W_up[m] . x[n]) (ip[0]: 0 REGLU, 1 GEGLU, 2 SWIGLU, 6 SWIGLU_CLAMP;
// fp[0]: its limit).
template <int T, int NC> __device__ __forceinline__ void mmv_glu_cols(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int lane = threadIdx.x & 31;
    const i64 i2 = blockIdx.y % D.ne[2], i3 = blockIdx.y / D.ne[2];
    const char *g = row_ptr(G, m, i2 / (D.ne[2] / G.ne[2]), i3 / (D.ne[3] / G.ne[3]));
    const char *u = row_ptr(U, m, i2 / (D.ne[2] / U.ne[2]), i3 / (D.ne[3] / U.ne[3]));
    for (i64 n0 = 0; n0 < D.ne[1]; n0 += NC) {
        const int nc = (int)min((i64)NC, D.ne[1] - n0);
        float ag[NC], au[NC];
#pragma unroll
        for (int n = 0; n < NC; ++n) ag[n] = au[n] = 0.0f;
        const char *xb = row_ptr(X, n0, i2, i3);
        const i64 K = G.ne[0];
        if (T == GGML_F16 && NC == 1 && G.nb[0] == 2 && U.nb[0] == 2 && X.nb[0] == 4 && K % 8 == 0 &&
            aligned16(g) && aligned16(u) && aligned16(xb)) {
            row_dots2_f16(g, u, K, xb, ag[0], au[0]);
        } else if (T == GGML_Q8_0 && NC == 1 && G.nb[0] == 34 && U.nb[0] == 34 && aligned16(g) && aligned16(u)) {
            q8_rows2_staged(g, u, K, xb, ag[0], au[0]);
        } else {
            dots<T, NC>(g, G, X, n0, i2, i3, nc, ag);
            dots<T, NC>(u, U, X, n0, i2, i3, nc, au);
        }
#pragma unroll
        for (int n = 0; n < NC; ++n)
            if (n < nc && lane == n) store_f(D, m, n0 + n, i2, i3, glu(p.ip[0], ag[n], au[n], p.fp[0]));
    }
}

template <int T> __device__ void mmv_glu(const kparams &p) {
    if (p.t[0].ne[1] == 1) mmv_glu_cols<T, 1>(p);
    else mmv_glu_cols<T, MMV_NC>(p);
}

// One expert row against one x row: Q8_1 x (quantize_q8_1) for Q8_0, F32 x for F16 / F32; k in [k0, k1)
// (whole 32-blocks for Q8_0). The sum is in acc[0] on every lane; acc holds MMV_NC floats (row_dots' columns).
template <int T>
__device__ __forceinline__ void mmid_row(const char *w, const tdesc &W, const char *x, i64 xnb0, i64 k0, i64 k1,
                                         float *acc) {
    if (T == GGML_Q8_0) row_dots_q8_1<1>(w + (k0 / QK8_0) * W.nb[0], W.nb[0], k1 - k0, x + (k0 / QK8_0) * 36, 0, 1, acc);
    else row_dots<T>(w + k0 * W.nb[0], W.nb[0], k1 - k0, x + k0 * xnb0, xnb0, 0, 1, acc);
}

// dst[t, s, m] = experts[ids[t, s]][m] . x[t, s or 0]. Grid (ceil(M/4), n_used, T).
template <int T> __device__ void mmv_id(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &I = p.t[3];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
    mmid_row<T>(row_ptr(W, m, e, 0), W, row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0], 0, W.ne[0], acc);
    if ((threadIdx.x & 31) == 0) store_f(D, m, s, t, 0, plus_expert_bias(p.t[4], m, e, acc[0]));
}

// The fused expert gate/up + GLU on Q8_1 x (Q8_0 experts, up to 8 tokens: upstream's mmvq takes the fusion at
// every batch it serves): dst[t, s, m] = glu(G[ids[t, s]][m] . xq, U[ids[t, s]][m] . xq). Grid (ceil(M/4),
// n_used, T). The float experts' form (one token, F32 x) is mul_mat_id_glu.cu's.
__device__ void mmv_id_glu_q8_0(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3], &I = p.t[4];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    const char *x = row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0);
    float ag[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0}, au[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
    mmid_row<GGML_Q8_0>(row_ptr(G, m, e, 0), G, x, X.nb[0], 0, G.ne[0], ag);
    mmid_row<GGML_Q8_0>(row_ptr(U, m, e, 0), U, x, X.nb[0], 0, U.ne[0], au);
    if ((threadIdx.x & 31) == 0)
        store_f(D, m, s, t, 0, glu(p.ip[0], plus_gate_bias(p, p.t[5], m, e, ag[0]), plus_expert_bias(p.t[5], m, e, au[0]),
                                   p.fp[0]));
}

// MUL_MAT_ID over mm_ids_helper's expert-sorted map (common.cuh mmid_pair): expert blockIdx.y, one warp per
// row m, each of the expert's pairs (s, t) in turn: dst[t, s, m] = experts[e][m] . x[t, s or 0] over the k
// part blockIdx.z (Q8_0: Q8_1 x, ip[0] parts, upstream's mul_mat_q; F16 / F32: F32 x, one part, upstream's
// mul_mat_f_ids). Grid (ceil(M/4), E, parts).
template <int T> __device__ void mmid_sorted(const kparams &p) {
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2], &R = p.t[4], &B = p.t[5];
    const i64 m = (i64)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int e = blockIdx.y;
    i64 k0, k1;
    mmid_k_range(p, W.ne[0], k0, k1);
    const char *w = row_ptr(W, m, e, 0);
    const int j1 = load_i32(B, e + 1, 0, 0, 0);
    for (int j = load_i32(B, e, 0, 0, 0); j < j1; ++j) {
        int s, t;
        mmid_pair(R, j, s, t);
        float acc[MMV_NC] = {0, 0, 0, 0, 0, 0, 0, 0};
        mmid_row<T>(w, W, row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0), X.nb[0], k0, k1, acc);
        if ((threadIdx.x & 31) == 0) mmid_store(p, m, s, t, acc[0]);
    }
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
KERNEL_LB(mul_mat_vec_f32, 128, 8) { mmv<GGML_F32, false>(p); }
KERNEL_LB(mul_mat_vec_f16, 128, 8) { mmv<GGML_F16, false>(p); }
KERNEL_LB(mul_mat_vec_q8_0, 128, 8) { mmv<GGML_Q8_0, false>(p); }
KERNEL_LB(mul_mat_vec_add_f32, 128, 8) { mmv<GGML_F32, true>(p); }
KERNEL_LB(mul_mat_vec_add_f16, 128, 8) { mmv<GGML_F16, true>(p); }
KERNEL_LB(mul_mat_vec_add_q8_0, 128, 8) { mmv<GGML_Q8_0, true>(p); }
KERNEL_LB(mul_mat_vec_glu_f32, 128, 8) { mmv_glu<GGML_F32>(p); }
KERNEL_LB(mul_mat_vec_glu_f16, 128, 8) { mmv_glu<GGML_F16>(p); }
KERNEL_LB(mul_mat_vec_glu_q8_0, 128, 8) { mmv_glu<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_id_vec_f32, 128) { mmv_id<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_vec_f16, 128) { mmv_id<GGML_F16>(p); }
KERNEL_LB(mul_mat_id_vec_q8_0, 128) { mmv_id<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_id_vec_glu_q8_0, 128) { mmv_id_glu_q8_0(p); }
KERNEL_LB(mul_mat_id_q_q8_0, 128) { mmid_sorted<GGML_Q8_0>(p); }
KERNEL_LB(mul_mat_id_f_f32, 128) { mmid_sorted<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_f_f16, 128) { mmid_sorted<GGML_F16>(p); }
KERNEL_LB(mul_mat_id_gathered_f32, 128) { mmv_gathered<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_gathered_f16, 128) { mmv_gathered<GGML_F16>(p); }
KERNEL_LB(mul_mat_id_gathered_q8_0, 128) { mmv_gathered<GGML_Q8_0>(p); }
