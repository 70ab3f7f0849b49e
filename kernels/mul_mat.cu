// Mat-mul for N > 8 (prefill).
//
// mul_mat_f16 and mul_mat_q8_0 run on tensor cores with mma.sync (PTX, so NVRTC needs no <mma.h>):
// block tile 128 (weight rows m) x 64 (columns n), 256 threads = 8 warps as 4 (m) x 2 (n), each warp 32 x 32.
// The register paths (q8_0, and f16 for unaligned views): k tiles of 32 in two shared-memory stages, the next
// loaded into registers while the current one is multiplied, so one barrier per k step. mul_mat_f16's
// pipelined path (aligned rows: every prefill projection) is mm_f16_tiles below. Rows padded so fragment
// reads are bank-conflict free.
//   f16:  A = W (F16), B = x rounded to F16 on load (as ggml's cuBLAS path converts src1), fp32 accumulate,
//         mma.m16n8k16 with ldmatrix.
//   q8_0: A = W's int8 quants, B = x as Q8_1 blocks (quantize.cu), mma.m16n8k32 s8 -> s32 per 32-block,
//         then acc += d_w * d_x * sum (the mat-vec's formula, so both paths compute the same thing).
// mul_mat_f32 keeps the CUDA-core tiled kernel: 16x16 output tiles, K stepped 16 at a time in shmem.
// Grid (ceil(M / BM), ceil(N / BN), B2 * B3); W's dims 2/3 broadcast by division, as ggml's mul_mat.
// The k-split of mul_mat_f16 and mul_mat_q8_0 (graphdiag's stand-in for upstream's stream-k MMQ, whose
// mul_mat_q_stream_k_fixup runs where output tiles leave SMs idle: gpu/compat.py mmq_stream_k_parts):
// ip[0] = S parts (0 or 1: none), grid z = B2 * B3 * S. Part p = blockIdx.z / (B2 * B3) sums k in
// [64 * (p * U / S), 64 * ((p + 1) * U / S)) clipped to K, U = ceil(K / 64); part 0 writes dst, part p > 0
// the same place of t[3] (F32 (M, N, B2, B3 * (S - 1)), pool scratch) at i3 + (p - 1) * B3, which
// mul_mat_fixup_f32 then adds into dst.
#include "common.cuh"
#include "mma.cuh"

#define TILE 16
#define MM_BM 128
#define MM_BN 64
#define MM_BK 32
#define MM_PAD 8   // halves of padding per shmem row (k tiles of 32: 80-byte rows; of 64: 144)



struct mm_part {
    i64 i2, i3, k0, k1;   // the output batch of this block, its part's k range
    int part;
};

__device__ __forceinline__ mm_part mm_k_part(const kparams &p, i64 K) {
    const tdesc &D = p.t[0];
    const i64 S = p.ip[0] > 1 ? p.ip[0] : 1, nz = D.ne[2] * D.ne[3], z = blockIdx.z % nz, U = (K + 63) / 64;
    mm_part r;
    r.part = (int)(blockIdx.z / nz);
    r.i2 = z % D.ne[2];
    r.i3 = z / D.ne[2];
    r.k0 = min(K, 64 * (r.part * U / S));
    r.k1 = min(K, 64 * ((r.part + 1) * U / S));
    return r;
}

// Where a part's outputs go: dst for part 0, else t[3] at batch i3 + (part - 1) * B3 (`i3` set to it).
__device__ __forceinline__ const tdesc &mm_part_out(const kparams &p, const mm_part &r, i64 &i3) {
    i3 = r.i3;
    if (r.part == 0) return p.t[0];
    i3 += (r.part - 1) * p.t[0].ne[3];
    return p.t[3];
}

// CUDA-core tiles; with ip[0] = S > 1 parts (mul_mat_f32 only: graphdiag's stand-in for the split-K GEMM +
// reduce cuBLAS runs on small F32 outputs, compat.cublas_split_k_parts) each part sums its k range into dst
// or the partials, as the tensor-core k-split does; grid z = B2 * B3 * S.
template <int T> __device__ void mm_tiled(const kparams &p) {
    __shared__ float ws[TILE][TILE + 1];   // +1: column reads ws[tx][kk] hit distinct banks
    __shared__ float xs[TILE][TILE + 1];
    const tdesc &W = p.t[1], &X = p.t[2];
    const i64 M = p.t[0].ne[0], N = p.t[0].ne[1], K = W.ne[0];
    const mm_part r = mm_k_part(p, K);
    i64 o3;
    const tdesc &D = mm_part_out(p, r, o3);
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    const i64 m0 = (i64)blockIdx.x * TILE, n0 = (i64)blockIdx.y * TILE;
    const i64 i2 = r.i2, i3 = r.i3;
    const i64 w2 = i2 / (p.t[0].ne[2] / W.ne[2]), w3 = i3 / (p.t[0].ne[3] / W.ne[3]);
    const bool wrow = m0 + ty < M, xrow = n0 + ty < N;
    const char *wr = wrow ? row_ptr(W, m0 + ty, w2, w3) : 0;
    const char *xr = xrow ? row_ptr(X, n0 + ty, i2, i3) : 0;
    float acc = 0.0f;
    for (i64 k0 = r.k0; k0 < r.k1; k0 += TILE) {
        const i64 k = k0 + tx;
        ws[ty][tx] = (wrow && k < r.k1) ? row_elem<T>(wr, k, W.nb[0]) : 0.0f;   // coalesced along k
        xs[ty][tx] = (xrow && k < r.k1) ? row_elem<GGML_F32>(xr, k, X.nb[0]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += ws[tx][kk] * xs[ty][kk];
        __syncthreads();
    }
    if (m0 + tx < M && n0 + ty < N) store_f(D, m0 + tx, n0 + ty, i2, o3, acc);   // consecutive m: coalesced
}

KERNEL_LB(mul_mat_f32, 256) { mm_tiled<GGML_F32>(p); }
// BF16 prefill (more columns than MMVF takes): the same CUDA-core tiles, weights widened exactly to F32.
KERNEL_LB(mul_mat_bf16, 256) { mm_tiled<GGML_BF16_ELEM>(p); }

// dst += the k-split's partial outputs: t[1] F32 (M, N, B2, B3 * ip[0]), ip[0] = S - 1 parts; one thread per
// dst element (grid-stride), the parts added in order.
KERNEL_LB(mul_mat_fixup_f32, 256) {
    const tdesc &D = p.t[0], &P = p.t[1];
    const i64 M = D.ne[0], N = D.ne[1], B2 = D.ne[2], B3 = D.ne[3], total = M * N * B2 * B3;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const i64 m = i % M, n = (i / M) % N, i2 = (i / (M * N)) % B2, i3 = i / (M * N * B2);
        float v = load_f(D, m, n, i2, i3);
        for (int q = 0; q < p.ip[0]; ++q) v += load_f(P, m, n, i2, i3 + q * B3);
        store_f(D, m, n, i2, i3, v);
    }
}

__device__ __forceinline__ bool vec16(const tdesc &d) {
    return ((d.data | (u64)d.nb[1] | (u64)d.nb[2] | (u64)d.nb[3]) & 15) == 0;
}

// ---- F16 weights x F32 activations (rounded to F16) ----------------------------------------------------
// The pipelined path (contiguous, 16-byte aligned W and x, K % 8 == 0: every prefill projection): the register
// path's 128 x 64 tile and warps, W in MM_STAGES k tiles of MM_BK_P by cp.async (zero-filled past the edges), x
// through registers (mm_f16_tiles). H200, PDL off (.out/mmx/bench.py, 27 tilings, all bit-identical):
// K2048 M8192 N512 113.5 -> 81.2 us, K8192 M2048 N512 119.1 -> 97.8 us, K2048 M2048 N512 35.0 -> 26.8 us
// against the F32-staged kernel before it. The products and their order per output are the register path's.
#define MM_STAGES 3   // W's k tiles in flight (the pipelined path)
#define MM_BK_P 64    // the pipelined path's k tile

// Copy `idx` of a pipelined W tile (rows of BK halves in 16-byte chunks): its source, row r0 + idx / (chunks per row) of T (R rows, broadcast dims d2, d3; past the edge the
// last row, never copied: k = K), the k of its chunk, and its place in stage 0 of `tile`.
template <int BK, class Tile>
__device__ __forceinline__ void mm_copy_slot(const tdesc &T, i64 r0, i64 R, i64 d2, i64 d3, int idx, int K,
                                             Tile &tile, const char *&src, int &k, unsigned &dst) {
    constexpr int PER = 16 / sizeof(tile[0][0]), CH = BK / PER;
    static_assert(CH == 4 || CH == 8 || CH == 16, "chunks per row: 4, 8 or 16");
    const int row = idx / CH, c = idx % CH;
    const i64 r = r0 + row;
    src = row_ptr(T, r < R ? r : R - 1, d2, d3) + c * 16;
    k = r < R ? c * PER : K;
    dst = smem_u32(&tile[row][c * PER]);
}

// A warp's MI x NI accumulator fragments (m16n8, 4 floats each) set to 0, and stored: c[mi][ni][0..3] at rows
// m0w + mi*16 + g (+8), columns n0w + ni*8 + 2*tig (+1).
template <int MI, int NI> __device__ __forceinline__ void zero_acc(float (*acc)[NI][4]) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;
}

template <int MI, int NI>
__device__ __forceinline__ void store_acc(const tdesc &D, const float (*acc)[NI][4], i64 m0w, i64 n0w, i64 i2, i64 i3) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const i64 m = m0w + mi * 16 + g + (c >= 2 ? 8 : 0), n = n0w + ni * 8 + 2 * tig + (c & 1);
                if (m < D.ne[0] && n < D.ne[1]) store_f(D, m, n, i2, i3, acc[mi][ni][c]);
            }
}

// The pipelined tile of BM rows x BN columns, WGM x WGN warps (each (BM / WGM) x (BN / WGN)), k tiles of BK.
// W by cp.async, STAGES tiles in flight; x through registers: each thread loads its float4s of tile kt + 2
// while tile kt is multiplied and rounds them to F16 into the free one of two B tiles after it, so x takes
// no F32 staging in shared memory and no separate rounding pass (the F32 stages and their rounding were a
// third of the shared-memory traffic of the earlier kernel). One barrier per k step. Every output sums its
// k16 products in k order whatever the tiling, so each geometry gives the register path's bits. Shared
// memory (geometry.py mm_f16_smem): STAGES x BM x (BK + 8) halves of W + 2 x BN x (BK + 8) halves of x.
template <int BM, int BN, int WGM, int WGN, int STAGES, int BK, bool XH>
__device__ __forceinline__ void mm_f16_tiles(const kparams &p, unsigned char *smem) {
    constexpr int THREADS = 32 * WGM * WGN, WM = BM / WGM, WN = BN / WGN, MI = WM / 16, NI = WN / 8, KS = BK / 16;
    static_assert(MI * 16 == WM && NI * 8 == WN && NI % 2 == 0 && KS * 16 == BK, "steps");
    typedef unsigned short ATile[BM][BK + MM_PAD];
    typedef unsigned short BTile[BN][BK + MM_PAD];
    constexpr int NA = BM * BK / 8 / THREADS, NX = BN * BK / 4 / THREADS;
    static_assert(NA * THREADS * 8 == BM * BK && NX * THREADS * 4 == BN * BK, "whole copies per thread");
    ATile *As = (ATile *)smem;
    BTile *Bs = (BTile *)(smem + STAGES * sizeof(ATile));
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2];
    const i64 M = D.ne[0], N = D.ne[1];
    const mm_part part = mm_k_part(p, W.ne[0]);
    const int K = (int)(part.k1 - part.k0);   // this part's k range, from part.k0 (a multiple of 64: aligned)
    const i64 m0 = (i64)blockIdx.x * BM, n0 = (i64)blockIdx.y * BN;
    const i64 i2 = part.i2, i3 = part.i3;
    const i64 w2 = i2 / (D.ne[2] / W.ne[2]), w3 = i3 / (D.ne[3] / W.ne[3]);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp % WGM, wn = warp / WGM;
    const char *wr[NA];
    unsigned a_dst[NA];
    int wk[NA];
#pragma unroll
    for (int i = 0; i < NA; ++i) {
        mm_copy_slot<BK>(W, m0, M, w2, w3, tid + THREADS * i, K, As[0], wr[i], wk[i], a_dst[i]);
        wr[i] += part.k0 * 2;
    }
    // x: chunk idx = tid + THREADS * i: column idx / (BK / 4), 4 elements at k (idx % (BK / 4)) * 4; XH: x is
    // already F16 (the copy upstream's cuBLAS path converts it into), 4 halves loaded and stored as they are
    constexpr int XC = BK / 4, XB = XH ? 2 : 4;
    const char *xr[NX];
    int xk[NX];
    unsigned short *xdst[NX];
#pragma unroll
    for (int i = 0; i < NX; ++i) {
        const int idx = tid + THREADS * i, col = idx / XC, c = idx % XC;
        const i64 n = n0 + col;
        xr[i] = row_ptr(X, n < N ? n : N - 1, i2, i3) + (part.k0 + c * 4) * XB;
        xk[i] = n < N ? c * 4 : K;
        xdst[i] = &Bs[0][col][c * 4];
    }
    const int nk = (K + BK - 1) / BK;
    auto issue = [&](int kt) {
        if (kt < nk) {
            const unsigned st = (unsigned)kt % STAGES;
            const int k0 = kt * BK;
#pragma unroll
            for (int i = 0; i < NA; ++i) {
                const bool in = wk[i] + k0 < K;
                cp_async16_at(a_dst[i] + st * sizeof(ATile), in ? wr[i] + k0 * 2 : wr[i], in ? 16 : 0);
            }
        }
        cp_async_commit();
    };
    float4 xv[NX];
    uint2 xhv[NX];
    auto load_x = [&](int kt) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < NX; ++i) {
            const bool in = kt < nk && xk[i] + k0 < K;
            if (XH) xhv[i] = in ? __ldg((const uint2 *)(xr[i] + k0 * 2)) : make_uint2(0, 0);
            else xv[i] = in ? __ldg((const float4 *)(xr[i] + k0 * 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    auto store_x = [&](int buf) {
#pragma unroll
        for (int i = 0; i < NX; ++i)
            *(uint2 *)(xdst[i] + buf * (sizeof(BTile) / 2)) = XH ? xhv[i] :
                make_uint2(pack_h2(f2h(xv[i].x), f2h(xv[i].y)), pack_h2(f2h(xv[i].z), f2h(xv[i].w)));
    };
    unsigned a_ld[MI], b_ld[NI / 2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) a_ld[mi] = smem_u32(&As[0][wm * WM + mi * 16 + (lane & 15)][(lane >> 4) * 8]);
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj)
        b_ld[nj] = smem_u32(&Bs[0][wn * WN + nj * 16 + (lane & 7) + (lane >> 4) * 8][((lane >> 3) & 1) * 8]);
    float acc[MI][NI][4];
    zero_acc<MI, NI>(acc);
    auto frags = [&](unsigned (*af)[4], unsigned (*bf)[2], unsigned ao, unsigned bo) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) ldmatrix_x4_at(af[mi], a_ld[mi] + ao);
#pragma unroll
        for (int nj = 0; nj < NI / 2; ++nj) {
            unsigned r[4];
            ldmatrix_x4_at(r, b_ld[nj] + bo);
            bf[2 * nj][0] = r[0]; bf[2 * nj][1] = r[1];
            bf[2 * nj + 1][0] = r[2]; bf[2 * nj + 1][1] = r[3];
        }
    };
    auto mmas = [&](unsigned (*af)[4], unsigned (*bf)[2]) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma_f16(acc[mi][ni], af[mi], bf[ni]);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    load_x(0);
    store_x(0);
    load_x(1);
    for (int kt = 0; kt < nk; ++kt) {
        cp_async_wait_pending<STAGES - 2>();   // tile kt has landed
        __syncthreads();   // x of tile kt stored; every warp is done with tile kt - 1
        const unsigned ao = ((unsigned)kt % STAGES) * sizeof(ATile), bo = (kt & 1) * sizeof(BTile);
        issue(kt + STAGES - 1);
        unsigned af[2][MI][4], bf[2][NI][2];
        frags(af[0], bf[0], ao, bo);
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            if (ks + 1 < KS) frags(af[(ks + 1) & 1], bf[(ks + 1) & 1], ao + 32 * (ks + 1), bo + 32 * (ks + 1));
            mmas(af[ks & 1], bf[ks & 1]);
        }
        if (kt + 1 < nk) {
            store_x((kt + 1) & 1);   // the buffer tile kt - 1 used: free since the barrier
            load_x(kt + 2);
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    i64 o3;
    const tdesc &O = mm_part_out(p, part, o3);
    store_acc<MI, NI>(O, acc, m0 + wm * WM, n0 + wn * WN, i2, o3);
}

__device__ void mm_f16_pipelined(const kparams &p, unsigned char *smem) {
    mm_f16_tiles<MM_BM, MM_BN, 4, 2, MM_STAGES, MM_BK_P, false>(p, smem);
}

__device__ void mm_f16_pipelined_xh(const kparams &p, unsigned char *smem) {
    mm_f16_tiles<MM_BM, MM_BN, 4, 2, MM_STAGES, MM_BK_P, true>(p, smem);
}

__device__ void mm_f16_registers(const kparams &p, unsigned char *smem);

KERNEL_LB(mul_mat_f16, 256) {
    extern __shared__ __align__(16) unsigned char mm_smem[];   // geometry.py: the pipelined path's stages
    const tdesc &W = p.t[1], &X = p.t[2];
    const bool wvec = W.nb[0] == 2 && vec16(W) && W.ne[0] % 8 == 0;
    if (wvec && X.type == GGML_F16 && X.nb[0] == 2 && vec16(X)) mm_f16_pipelined_xh(p, mm_smem);
    else if (wvec && X.type != GGML_F16 && X.nb[0] == 4 && vec16(X)) mm_f16_pipelined(p, mm_smem);
    else mm_f16_registers(p, mm_smem);
}

// The general path (views, odd strides or K): two stages through registers.
__device__ void mm_f16_registers(const kparams &p, unsigned char *smem) {
    typedef unsigned short ATile[MM_BM][MM_BK + MM_PAD];
    typedef unsigned short BTile[MM_BN][MM_BK + MM_PAD];
    ATile *As = (ATile *)smem;
    BTile *Bs = (BTile *)(smem + 2 * sizeof(ATile));
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2];
    const mm_part part = mm_k_part(p, W.ne[0]);
    const i64 M = D.ne[0], N = D.ne[1], K = part.k1;   // k from part.k0 to K
    const i64 m0 = (i64)blockIdx.x * MM_BM, n0 = (i64)blockIdx.y * MM_BN;
    const i64 i2 = part.i2, i3 = part.i3;
    const i64 w2 = i2 / (D.ne[2] / W.ne[2]), w3 = i3 / (D.ne[3] / W.ne[3]);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    const bool wvec = W.nb[0] == 2 && vec16(W), xh = X.type == GGML_F16, xvec = !xh && X.nb[0] == 4 && vec16(X);

    uint4 ra[2];
    uint2 rb[2];
    auto load = [&](i64 k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {   // A: 128 rows x 4 chunks of 8 halves
            const int idx = tid + 256 * i, row = idx >> 2, c = idx & 3;
            const i64 m = m0 + row, k = k0 + c * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (m < M) {
                const char *wr = row_ptr(W, m, w2, w3);
                if (wvec && k + 8 <= K) {
                    v = *(const uint4 *)(wr + k * 2);
                } else {
                    unsigned short h[8];
#pragma unroll
                    for (int e = 0; e < 8; ++e) h[e] = k + e < K ? *(const unsigned short *)(wr + (k + e) * W.nb[0]) : 0;
                    v = make_uint4(pack_h2(h[0], h[1]), pack_h2(h[2], h[3]), pack_h2(h[4], h[5]), pack_h2(h[6], h[7]));
                }
            }
            ra[i] = v;
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {   // B: 64 columns x 8 chunks of 4 floats, rounded to F16 (F16 x: as is)
            const int idx = tid + 256 * i, row = idx >> 3, c = idx & 7;
            const i64 n = n0 + row, k = k0 + c * 4;
            float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (xh) {
                unsigned short h[4] = {0, 0, 0, 0};
                if (n < N) {
                    const char *xr = row_ptr(X, n, i2, i3);
#pragma unroll
                    for (int e = 0; e < 4; ++e) if (k + e < K) h[e] = *(const unsigned short *)(xr + (k + e) * X.nb[0]);
                }
                rb[i] = make_uint2(pack_h2(h[0], h[1]), pack_h2(h[2], h[3]));
                continue;
            }
            if (n < N) {
                const char *xr = row_ptr(X, n, i2, i3);
                if (xvec && k + 4 <= K) {
                    const float4 v = *(const float4 *)(xr + k * 4);
                    f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) f[e] = k + e < K ? *(const float *)(xr + (k + e) * X.nb[0]) : 0.0f;
                }
            }
            rb[i] = make_uint2(pack_h2(f2h(f[0]), f2h(f[1])), pack_h2(f2h(f[2]), f2h(f[3])));
        }
    };
    auto store = [&](int s) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int idx = tid + 256 * i;
            *(uint4 *)&As[s][idx >> 2][(idx & 3) * 8] = ra[i];
            *(uint2 *)&Bs[s][idx >> 3][(idx & 7) * 4] = rb[i];
        }
    };

    float acc[2][4][4];
    zero_acc<2, 4>(acc);

    const i64 nk = (K - part.k0 + MM_BK - 1) / MM_BK;
    load(part.k0);
    store(0);
    __syncthreads();
    for (i64 kt = 0; kt < nk; ++kt) {
        const int s = (int)(kt & 1);
        if (kt + 1 < nk) load(part.k0 + (kt + 1) * MM_BK);
#pragma unroll
        for (int kk = 0; kk < MM_BK; kk += 16) {
            unsigned af[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                ldmatrix_x4(af[mi], &As[s][wm * 32 + mi * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                unsigned r[4];
                ldmatrix_x4(r, &Bs[s][wn * 32 + nj * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);
                bf[2 * nj][0] = r[0]; bf[2 * nj][1] = r[1];
                bf[2 * nj + 1][0] = r[2]; bf[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) mma_f16(acc[mi][ni], af[mi], bf[ni]);
        }
        if (kt + 1 < nk) store(s ^ 1);
        __syncthreads();
    }
    i64 o3;
    const tdesc &O = mm_part_out(p, part, o3);
    store_acc<2, 4>(O, acc, m0 + wm * 32, n0 + wn * 32, i2, o3);
}

// ---- Q8_0 weights x Q8_1 activations, integer tensor cores ---------------------------------------------
KERNEL_LB(mul_mat_q8_0, 256) {
    __shared__ __align__(16) int Aq[2][MM_BM][12];   // 32 quants (8 ints) + 4 ints padding: 48-byte rows
    __shared__ __align__(16) int Bq[2][MM_BN][12];
    __shared__ float Ad[2][MM_BM], Bd[2][MM_BN];
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2];
    const mm_part part = mm_k_part(p, W.ne[0]);
    const i64 M = D.ne[0], N = D.ne[1], kb0 = part.k0 / QK8_0, nkb = part.k1 / QK8_0;   // blocks kb0 .. nkb
    const i64 m0 = (i64)blockIdx.x * MM_BM, n0 = (i64)blockIdx.y * MM_BN;
    const i64 i2 = part.i2, i3 = part.i3;
    const i64 w2 = i2 / (D.ne[2] / W.ne[2]), w3 = i3 / (D.ne[3] / W.ne[3]);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    const int g = lane >> 2, tig = lane & 3;

    int ra[4] = {0, 0, 0, 0}, rb[4] = {0, 0, 0, 0};
    float rad = 0.0f, rbd = 0.0f;
    auto load = [&](i64 kb) {
        {   // A: 128 rows x 2 halves of a 34-byte block (16 quants each)
            const int row = tid >> 1, half = tid & 1;
            const i64 m = m0 + row;
            ra[0] = ra[1] = ra[2] = ra[3] = 0;
            rad = 0.0f;
            if (m < M) {
                const char *blk = row_ptr(W, m, w2, w3) + kb * W.nb[0];
                const unsigned short *q = (const unsigned short *)(blk + 2 + half * 16);
#pragma unroll
                for (int i = 0; i < 4; ++i) ra[i] = (int)pack_h2(q[2 * i], q[2 * i + 1]);
                rad = h2f(*(const unsigned short *)blk);
            }
        }
        if (tid < 2 * MM_BN) {   // B: 64 columns x 2 halves of a 36-byte Q8_1 block
            const int row = tid >> 1, half = tid & 1;
            const i64 n = n0 + row;
            rb[0] = rb[1] = rb[2] = rb[3] = 0;
            rbd = 0.0f;
            if (n < N) {
                const char *blk = row_ptr(X, n, i2, i3) + kb * 36;
                const int *q = (const int *)(blk + 4 + half * 16);
#pragma unroll
                for (int i = 0; i < 4; ++i) rb[i] = q[i];
                rbd = h2f(*(const unsigned short *)blk);
            }
        }
    };
    auto store = [&](int s) {
        const int row = tid >> 1, half = tid & 1;
        *(int4 *)&Aq[s][row][half * 4] = make_int4(ra[0], ra[1], ra[2], ra[3]);
        if (half == 0) Ad[s][row] = rad;
        if (tid < 2 * MM_BN) {
            *(int4 *)&Bq[s][row][half * 4] = make_int4(rb[0], rb[1], rb[2], rb[3]);
            if (half == 0) Bd[s][row] = rbd;
        }
    };

    float acc[2][4][4];
    zero_acc<2, 4>(acc);

    if (kb0 < nkb) load(kb0);   // an empty part (more parts than k units) stores zeros
    store(0);
    __syncthreads();
    for (i64 kb = kb0; kb < nkb; ++kb) {
        const int s = (int)((kb - kb0) & 1);
        if (kb + 1 < nkb) load(kb + 1);
        int af[2][4], bf[4][2];
        float da[2][2], db[4][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int r = wm * 32 + mi * 16 + g;
            af[mi][0] = Aq[s][r][tig]; af[mi][1] = Aq[s][r + 8][tig];
            af[mi][2] = Aq[s][r][4 + tig]; af[mi][3] = Aq[s][r + 8][4 + tig];
            da[mi][0] = Ad[s][r]; da[mi][1] = Ad[s][r + 8];
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const int c = wn * 32 + ni * 8;
            bf[ni][0] = Bq[s][c + g][tig]; bf[ni][1] = Bq[s][c + g][4 + tig];
            db[ni][0] = Bd[s][c + 2 * tig]; db[ni][1] = Bd[s][c + 2 * tig + 1];
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                int sum[4] = {0, 0, 0, 0};
                mma_s8(sum, af[mi], bf[ni]);
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[mi][ni][c] += da[mi][c >> 1] * db[ni][c & 1] * (float)sum[c];
            }
        if (kb + 1 < nkb) store(s ^ 1);
        __syncthreads();
    }
    i64 o3;
    const tdesc &O = mm_part_out(p, part, o3);
    store_acc<2, 4>(O, acc, m0 + wm * 32, n0 + wn * 32, i2, o3);
}
