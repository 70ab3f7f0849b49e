// Row reductions: one block per row (grid = (ne1, ne2, ne3)), block 32..256 threads striding over ne0.
#include "common.cuh"

// per row: x / sqrt(mean(x^2) + eps), times w (broadcast by modulo, as ggml's binary ops) when `mul`.
__device__ void rms_norm_row(const kparams &p, bool mul) {
    __shared__ float red[32];
    const tdesc &D = p.t[0], &X = p.t[1], &Wt = p.t[2];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = X.ne[0];
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
        store_f(D, i0, i1, i2, i3, v);
    }
}

KERNEL_LB(rms_norm_f32, 256) { rms_norm_row(p, false); }
KERNEL_LB(rms_norm_mul_f32, 256) { rms_norm_row(p, true); }

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
