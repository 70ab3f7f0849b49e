// The MoE weighted expert reduction (llama.cpp #25952, ggml-cuda's moe_weighted_reduction_f32): the experts'
// outputs times their router weights (and an optional per-expert scale), summed over the used experts, one
// kernel for MUL [+ MUL] + k VIEWs + (k - 1) ADDs. One thread per output element: block (token, 256 columns);
// the experts added in order, each product taken as upstream takes it: (e * scale) * w.
//   t[0] dst F32 (n_embd, n_tokens), contiguous
//   t[1] experts F32 (n_embd, k, n_tokens), contiguous
//   t[2] router weights F32 (1, k, n_tokens), contiguous
//   t[3] per-expert scale F32 (1, k, n_tokens), contiguous; data 0: none
#include "common.cuh"

KERNEL_LB(moe_weighted_reduction_f32, 256) {
    const tdesc &D = p.t[0], &E = p.t[1], &W = p.t[2], &S = p.t[3];
    const i64 n_embd = E.ne[0], k = E.ne[1];
    const i64 token = blockIdx.x, col = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= n_embd) return;
    const float *e = (const float *)E.data, *w = (const float *)W.data, *s = (const float *)S.data;
    const i64 first = token * k;
    float sum = (e[first * n_embd + col] * (s ? s[first] : 1.0f)) * w[first];
    for (i64 x = 1; x < k; ++x) {
        const i64 row = first + x;
        sum += (e[row * n_embd + col] * (s ? s[row] : 1.0f)) * w[row];
    }
    ((float *)D.data)[token * n_embd + col] = sum;
}
