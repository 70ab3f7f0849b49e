// Weights drawn on the device: a counter-based generator, bit-identical to graphdiag/backends/rng.py.
//
// Element i (flat, ggml order) of tensor ip[2] under the seed (ip[0] low, ip[1] high 32 bits):
//   key = mix64(seed * GOLDEN + index + 1); z = mix64(key + (i + 1) * GOLDEN)
//   c = sum of z's four 16-bit lanes - 2 * 65535;  x = f32(c) * fp[0] + fp[1]
// The multiply and add are __fmul_rn / __fadd_rn: never contracted to an FMA, so numpy rounds the same.
// t[0] is the destination, contiguous (a weight in its buffer). One thread per element, grid-stride;
// Q8_0: one warp per 32-element block (amax by warp reduction, then quantised as memory.quantize_q8_0).
#include "common.cuh"

#define RNG_GOLDEN 0x9E3779B97F4A7C15ull

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 rng_key(const kparams &p) {
    const u64 seed = (u64)(unsigned)p.ip[0] | ((u64)(unsigned)p.ip[1] << 32);
    return mix64(seed * RNG_GOLDEN + (u64)(unsigned)p.ip[2] + 1ull);
}

__device__ __forceinline__ float rng_value(u64 key, u64 i, float mul, float add) {
    const u64 z = mix64(key + (i + 1ull) * RNG_GOLDEN);
    const int s = (int)(z & 0xffff) + (int)((z >> 16) & 0xffff) + (int)((z >> 32) & 0xffff) + (int)(z >> 48);
    return __fadd_rn(__fmul_rn((float)(s - 2 * 65535), mul), add);
}

KERNEL_LB(rng_fill_f32, 256) {
    const u64 key = rng_key(p);
    const i64 n = nelements(p.t[0]);
    float *dst = (float *)p.t[0].data;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] = rng_value(key, (u64)i, p.fp[0], p.fp[1]);
}

KERNEL_LB(rng_fill_f16, 256) {
    const u64 key = rng_key(p);
    const i64 n = nelements(p.t[0]);
    unsigned short *dst = (unsigned short *)p.t[0].data;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        dst[i] = f2h(rng_value(key, (u64)i, p.fp[0], p.fp[1]));
}

KERNEL_LB(rng_fill_q8_0, 256) {
    const u64 key = rng_key(p);
    const i64 nblocks = nelements(p.t[0]) / QK8_0;
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 nwarps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 b = warp; b < nblocks; b += nwarps) {   // uniform per warp: every lane takes the same trips
        const float x = rng_value(key, (u64)(b * QK8_0 + lane), p.fp[0], p.fp[1]);
        const float amax = warp_max(fabsf(x));
        const float d = __fdiv_rn(amax, 127.0f);
        const float inv = d > 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
        float q = rintf(__fmul_rn(x, inv));          // round half to even, as np.round
        q = fminf(fmaxf(q, -127.0f), 127.0f);
        char *blk = (char *)p.t[0].data + b * 34;    // block_q8_0: f16 scale, then 32 int8 quants
        blk[2 + lane] = (signed char)(int)q;
        if (lane == 0) *(unsigned short *)blk = f2h(d);
    }
}
