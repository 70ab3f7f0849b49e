// quantize_q8_1: F32 activations x (K, N, B2, B3), any strides, to contiguous Q8_1 blocks for the Q8_0
// integer-dot kernels (mul_mat_vec*_q8_0, mul_mat_q8_0). One warp per block of 32, lane = element:
//   d = max|x| / 127;  q = rint(x / d) (0 when d == 0);  block = {f16 d, f16 d * sum(q), int8 q[32]}
// (36 bytes; rows of K / 32 blocks). IEEE division and round-to-nearest-even, so the numpy twin
// (sim_kernels) produces the same bytes. 8 warps per block, grid-stride over all 32-blocks.
#include "common.cuh"

KERNEL_LB(quantize_q8_1, 256) {
    const tdesc &Y = p.t[0], &X = p.t[1];
    const int lane = threadIdx.x & 31;
    const i64 nbk = X.ne[0] / QK8_0, total = nbk * X.ne[1] * X.ne[2] * X.ne[3];
    const i64 wstride = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 g = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < total; g += wstride) {
        const i64 b = g % nbk, r = g / nbk;
        const i64 i1 = r % X.ne[1], i2 = (r / X.ne[1]) % X.ne[2], i3 = r / (X.ne[1] * X.ne[2]);
        const float v = *(const float *)(row_ptr(X, i1, i2, i3) + (b * QK8_0 + lane) * X.nb[0]);
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        int q = 0;
        if (amax != 0.0f) q = __float2int_rn(v / d);
        const float sum = warp_sum((float)q);   // |sum| <= 32 * 127: exact in any order
        char *blk = (char *)Y.data + i1 * Y.nb[1] + i2 * Y.nb[2] + i3 * Y.nb[3] + b * 36;
        blk[4 + lane] = (signed char)q;
        if (lane == 0) {
            *(unsigned short *)blk = f2h(d);
            *(unsigned short *)(blk + 2) = f2h(d * sum);
        }
    }
}
