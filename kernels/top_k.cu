// top_k_f32: one block per row (grid = (rows, ne2, ne3)), 128 threads. Element i's rank is the number of
// elements that beat it (larger, or equal with a lower index); ranks < k are written to dst[rank] = i.
// O(n^2 / threads) per row: meant for expert routing (n = number of experts, tens to hundreds). The row
// is staged in dynamic shmem when it fits (n * 4 <= 48 KiB, see geometry.py).
// argsort_f32_i32_desc: the same ranking with k = n (a full descending argsort, ties: lower index first),
// for ggml_argsort_top_k's ARGSORT (llama.cpp's MoE router); upstream's kernel is a bitonic sort instead.
#include "common.cuh"

#define TOPK_SHMEM_MAX 49152

__device__ __forceinline__ void rank_row(const kparams &p, const i64 k, float *xs) {
    const tdesc &D = p.t[0], &X = p.t[1];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
    const bool staged = n * 4 <= TOPK_SHMEM_MAX;
    if (staged) {
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) xs[i] = load_f(X, i, i1, i2, i3);
        __syncthreads();
    }
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        const float xi = staged ? xs[i] : load_f(X, i, i1, i2, i3);
        i64 rank = 0;
        for (i64 j = 0; j < n && rank < k; ++j) {
            const float xj = staged ? xs[j] : load_f(X, j, i1, i2, i3);
            rank += (xj > xi) || (xj == xi && j < i);
        }
        if (rank < k) *(int *)addr4(D, rank, i1, i2, i3) = (int)i;
    }
}

KERNEL_LB(top_k_f32, 128) {
    extern __shared__ float xs[];
    rank_row(p, p.ip[0], xs);
}

KERNEL_LB(argsort_f32_i32_desc, 128) {
    extern __shared__ float xs[];
    rank_row(p, p.t[1].ne[0], xs);
}
