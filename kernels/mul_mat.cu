// Tiled mat-mul for N > 8 (prefill): 16x16 output tiles, one output per thread, K stepped 16 at a time
// through shared memory (weights dequantised to F32 on load). Grid (ceil(M/16), ceil(N/16), B2*B3),
// block 256, static shmem 2 * 16 * 17 floats.
#include "common.cuh"

#define TILE 16

template <int T> __device__ void mm_tiled(const kparams &p) {
    __shared__ float ws[TILE][TILE + 1];   // +1: column reads ws[tx][kk] hit distinct banks
    __shared__ float xs[TILE][TILE + 1];
    const tdesc &D = p.t[0], &W = p.t[1], &X = p.t[2];
    const i64 M = D.ne[0], N = D.ne[1], K = W.ne[0];
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    const i64 m0 = (i64)blockIdx.x * TILE, n0 = (i64)blockIdx.y * TILE;
    const i64 i2 = blockIdx.z % D.ne[2], i3 = blockIdx.z / D.ne[2];
    const i64 w2 = i2 / (D.ne[2] / W.ne[2]), w3 = i3 / (D.ne[3] / W.ne[3]);
    const bool wrow = m0 + ty < M, xrow = n0 + ty < N;
    const char *wr = wrow ? row_ptr(W, m0 + ty, w2, w3) : 0;
    const char *xr = xrow ? row_ptr(X, n0 + ty, i2, i3) : 0;
    float acc = 0.0f;
    for (i64 k0 = 0; k0 < K; k0 += TILE) {
        const i64 k = k0 + tx;
        ws[ty][tx] = (wrow && k < K) ? row_elem<T>(wr, k, W.nb[0]) : 0.0f;   // coalesced along k
        xs[ty][tx] = (xrow && k < K) ? row_elem<GGML_F32>(xr, k, X.nb[0]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += ws[tx][kk] * xs[ty][kk];
        __syncthreads();
    }
    if (m0 + tx < M && n0 + ty < N) store_f(D, m0 + tx, n0 + ty, i2, i3, acc);   // consecutive m: coalesced
}

KERNEL_LB(mul_mat_f32, 256) { mm_tiled<GGML_F32>(p); }
KERNEL_LB(mul_mat_f16, 256) { mm_tiled<GGML_F16>(p); }
KERNEL_LB(mul_mat_q8_0, 256) { mm_tiled<GGML_Q8_0>(p); }
