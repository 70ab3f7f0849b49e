// quantize_q8_1: F32 activations x (K, N, B2, B3), any strides, to contiguous Q8_1 blocks for the Q8_0
// integer-dot kernels (mul_mat_vec*_q8_0, mul_mat_q8_0). One warp per block of 32, lane = element:
//   d = max|x| / 127;  q = rint(x / d) (0 when d == 0);  block = {f16 d, f16 d * sum(q), int8 q[32]}
// (36 bytes; rows of K / 32 blocks). IEEE division and round-to-nearest-even, so the numpy twin
// (sim_kernels) produces the same bytes. 8 warps per block, grid-stride over all 32-blocks.
#include "common.cuh"

template <typename I> __device__ void quantize_t(const kparams &p) {
    const tdesc &Y = p.t[0], &X = p.t[1];
    const int lane = threadIdx.x & 31;
    const I nbk = (I)(X.ne[0] / QK8_0), n1 = (I)X.ne[1], n2 = (I)X.ne[2], total = nbk * n1 * n2 * (I)X.ne[3];
    const I wstride = (I)gridDim.x * (blockDim.x >> 5);
    for (I g = (I)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < total; g += wstride) {
        const I r = g / nbk, b = g - r * nbk;
        const I r2 = r / n1, i1 = r - r2 * n1, i3 = r2 / n2, i2 = r2 - i3 * n2;
        const float v = *(const float *)(row_ptr(X, i1, i2, i3) + ((i64)b * QK8_0 + lane) * X.nb[0]);
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        int q = 0;
        if (amax != 0.0f) q = __float2int_rn(v / d);
        const float sum = warp_sum((float)q);   // |sum| <= 32 * 127: exact in any order
        char *blk = (char *)Y.data + i1 * Y.nb[1] + i2 * Y.nb[2] + i3 * Y.nb[3] + (i64)b * 36;
        blk[4 + lane] = (signed char)q;
        if (lane == 0) {
            *(unsigned short *)blk = f2h(d);
            *(unsigned short *)(blk + 2) = f2h(d * sum);
        }
    }
}

KERNEL_LB(quantize_q8_1, 256) {
    const tdesc &X = p.t[1];
    if (FITS32(X.ne[0] / QK8_0 * X.ne[1] * X.ne[2] * X.ne[3])) quantize_t<unsigned>(p);
    else quantize_t<i64>(p);
}
