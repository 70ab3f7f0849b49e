// common.cuh: the kernel ABI (graphdiag/backends/abi.py, byte for byte) and element access helpers.
//
// Every kernel is `extern "C" __global__ void NAME(const kparams p)`: one 576-byte record passed by value,
// packed once on the host and reused on every launch. Descriptors carry ggml's ne (elements) and nb
// (bytes), innermost first, so every kernel reads and writes through strides and views work everywhere.
// Compiled by NVRTC without the CUDA toolkit headers: no <cuda_fp16.h>, half conversions use PTX cvt.
#pragma once

#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q8_0 8
#define GGML_Q8_1 9   // activations quantised for the Q8_0 integer-dot kernels (quantize.cu), 36-byte blocks
#define GGML_I32 26
#define QK8_0 32

typedef unsigned long long u64;
typedef long long i64;

struct tdesc {          // abi.TDESC, 80 bytes
    u64 data;           // device address of element (0, 0, 0, 0)
    int type;           // ggml type (GGML_*)
    int pad;
    i64 ne[4];          // elements per dim
    i64 nb[4];          // bytes per step in each dim (for Q8_0, nb[0] is the 34-byte block size)
};

struct kparams {        // abi.KPARAMS, 576 bytes
    tdesc t[6];         // t[0] = dst, t[1..] = sources (see graphdiag/backends/kernels.py)
    int ip[16];
    float fp[8];
};

static_assert(sizeof(tdesc) == 80, "tdesc must match abi.TDESC");
static_assert(sizeof(kparams) == 576, "kparams must match abi.KPARAMS");

#define F32_NEG_INF __int_as_float(0xff800000)

// IEEE half <-> float with round-to-nearest-even (numpy's astype(float16) rounds the same way).
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

// 8 halves (one uint4, as the vectorised F16 loads read them) -> floats
__device__ __forceinline__ void h8(const uint4 v, float *f) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = h2f((unsigned short)(w[i] & 0xffffu));
        f[2 * i + 1] = h2f((unsigned short)(w[i] >> 16));
    }
}

// Byte address of element (i0, i1, i2, i3) of a plain (non-block) tensor.
__device__ __forceinline__ char *addr4(const tdesc &d, i64 i0, i64 i1, i64 i2, i64 i3) {
    return (char *)d.data + i0 * d.nb[0] + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3];
}

// Byte address of the start of row (i1, i2, i3).
__device__ __forceinline__ const char *row_ptr(const tdesc &d, i64 i1, i64 i2, i64 i3) {
    return (const char *)d.data + i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3];
}

// Element k of a row, for a type known at compile time; nb0 = bytes per element (per block for Q8_0).
template <int T> __device__ __forceinline__ float row_elem(const char *row, i64 k, i64 nb0);
template <> __device__ __forceinline__ float row_elem<GGML_F32>(const char *row, i64 k, i64 nb0) {
    return *(const float *)(row + k * nb0);
}
template <> __device__ __forceinline__ float row_elem<GGML_F16>(const char *row, i64 k, i64 nb0) {
    return h2f(*(const unsigned short *)(row + k * nb0));
}
#define GGML_BF16_ELEM 30   // BF16 (quants.cuh names it GGML_BF16): the upper half of an F32
template <> __device__ __forceinline__ float row_elem<GGML_BF16_ELEM>(const char *row, i64 k, i64 nb0) {
    return __uint_as_float((unsigned)*(const unsigned short *)(row + k * nb0) << 16);
}
template <> __device__ __forceinline__ float row_elem<GGML_Q8_0>(const char *row, i64 k, i64 nb0) {
    const char *blk = row + (k / QK8_0) * nb0;   // block_q8_0: f16 scale, then 32 int8 quants
    return h2f(*(const unsigned short *)blk) * (float)(signed char)blk[2 + k % QK8_0];
}

// Element (i0, i1, i2, i3) as float for any supported type (runtime dispatch; generic, slower paths).
__device__ __forceinline__ float load_f(const tdesc &d, i64 i0, i64 i1, i64 i2, i64 i3) {
    const char *row = row_ptr(d, i1, i2, i3);
    switch (d.type) {
    case GGML_F16: return row_elem<GGML_F16>(row, i0, d.nb[0]);
    case GGML_Q8_0: return row_elem<GGML_Q8_0>(row, i0, d.nb[0]);
    case GGML_I32: return (float)*(const int *)(row + i0 * d.nb[0]);
    default: return row_elem<GGML_F32>(row, i0, d.nb[0]);
    }
}

__device__ __forceinline__ int load_i32(const tdesc &d, i64 i0, i64 i1, i64 i2, i64 i3) {
    return *(const int *)addr4(d, i0, i1, i2, i3);
}

// Store a float into an F32 or F16 element.
__device__ __forceinline__ void store_f(const tdesc &d, i64 i0, i64 i1, i64 i2, i64 i3, float v) {
    char *a = addr4(d, i0, i1, i2, i3);
    if (d.type == GGML_F16) *(unsigned short *)a = f2h(v);
    else *(float *)a = v;
}

__device__ __forceinline__ i64 nelements(const tdesc &d) { return d.ne[0] * d.ne[1] * d.ne[2] * d.ne[3]; }

// Flat index -> (i0, i1, i2, i3) for the shape ne (innermost first).
__device__ __forceinline__ void unravel(i64 i, const i64 *ne, i64 &i0, i64 &i1, i64 &i2, i64 &i3) {
    i0 = i % ne[0]; i /= ne[0];
    i1 = i % ne[1]; i /= ne[1];
    i2 = i % ne[2]; i3 = i / ne[2];
}

// Index math in 32 bits when every flat index fits (the usual case: kernels dispatch on FITS32 once per
// launch): a 64-bit division is a long software sequence, a 32-bit one a few instructions. I is unsigned int
// or i64; the dims are narrowed once, so no expression mixes in a 64-bit divide.
#define FITS32(n) ((n) <= 0x7fffffffLL)

template <typename I> __device__ __forceinline__ void unravel_t(I i, const i64 *ne, I &i0, I &i1, I &i2, I &i3) {
    const I n0 = (I)ne[0], n1 = (I)ne[1], n2 = (I)ne[2];
    const I q = i / n0, r = q / n1;
    i0 = i - q * n0;
    i1 = q - r * n1;
    i3 = r / n2;
    i2 = r - i3 * n2;
}

// i modulo a source dim n that broadcasts against the destination dim nd (no division when they match).
template <typename I> __device__ __forceinline__ I bcast_t(I i, i64 n, i64 nd) {
    return n == nd ? i : i % (I)n;
}

// A tensor of 4-byte type `type` stored densely in ggml order (no view strides, no gaps).
__device__ __forceinline__ bool dense4(const tdesc &d, int type) {
    return d.type == type && d.nb[0] == 4 && d.nb[1] == 4 * d.ne[0] && d.nb[2] == d.nb[1] * d.ne[1] &&
           d.nb[3] == d.nb[2] * d.ne[2];
}
__device__ __forceinline__ bool dense_f32(const tdesc &d) { return dense4(d, GGML_F32); }

// Reductions. Block reductions use a 32-float shared array and assume blockDim.x is a multiple of 32.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();                       // `red` may still be read by a previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : F32_NEG_INF;
    return warp_max(v);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

// ggml-cuda's op_gelu (unary.cuh ggml_cuda_op_gelu_single), term for term: the tanh approximation.
__device__ __forceinline__ float gelu_tanh(float x) {
    const float GELU_COEF_A = 0.044715f, SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

// ggml-cuda's swiglu_clamp_single (0c1e57098): the gate clamped from above, up from both sides, by `limit`.
__device__ __forceinline__ float swiglu_clamp(float g, float u, float limit) {
    return silu(fminf(g, limit)) * fmaxf(fminf(u, limit), -limit);
}

// ggml-cuda's ggml_cuda_op_swiglu_oai_single (gpt-oss's experts): the gate clamped from above, up from both sides,
// then x * sigmoid(alpha x) * (1 + y), term for term.
__device__ __forceinline__ float swiglu_oai(float x, float g, float limit, float alpha) {
    x = fminf(x, limit);
    g = fmaxf(fminf(g, limit), -limit);
    return x / (1.0f + expf(-x * alpha)) * (1.0f + g);
}

// ggml's GLU variants: 0 = REGLU, 1 = GEGLU (tanh approximation), 2 = SWIGLU, 3 = SWIGLU_OAI (with upstream's
// own constants, alpha 1.702 and limit 7: its fused kernels call ggml_cuda_op_swiglu_oai_single with no
// others), 6 = SWIGLU_CLAMP (with `limit`, the GLU's op param 3, which the fused kernels take in fp[0] as
// upstream's fusion_data.glu_limit).
__device__ __forceinline__ float glu(int op, float g, float u, float limit = 0.0f) {
    if (op == 0) return fmaxf(g, 0.0f) * u;
    if (op == 1) return gelu_tanh(g) * u;
    if (op == 3) return swiglu_oai(g, u, 7.0f, 1.702f);
    if (op == 6) return swiglu_clamp(g, u, limit);
    return silu(g) * u;
}

// The experts' biases fused into mul_mat_id_vec(_glu) (MUL_MAT_ID + ADD_ID, gpt-oss): v plus element m of
// expert e's row of B (M, E), v itself where B is absent (data 0). The GLU kernels' gate bias has B's layout
// at the address ip[1] | ip[2] << 32 (kparams' six descriptors are taken), their up bias is B.
__device__ __forceinline__ float plus_expert_bias(const tdesc &B, i64 m, int e, float v) {
    return B.data ? v + load_f(B, m, e, 0, 0) : v;
}

__device__ __forceinline__ float plus_gate_bias(const kparams &p, const tdesc &B, i64 m, int e, float v) {
    if (!B.data) return v;
    const unsigned long long a = (unsigned long long)(unsigned)p.ip[1] | ((unsigned long long)(unsigned)p.ip[2] << 32);
    return v + *(const float *)((const char *)a + m * B.nb[0] + (i64)e * B.nb[1]);
}

// MUL_MAT_ID over mm_ids_helper's expert-sorted map (mul_mat_id_q_* / mul_mat_id_f_*): pair j of the map
// t[4] is (slot, token); expert e's pairs are [bounds[e], bounds[e + 1]) of t[5].
__device__ __forceinline__ void mmid_pair(const tdesc &R, i64 j, int &s, int &t) {
    s = load_i32(R, 0, j, 0, 0);
    t = load_i32(R, 1, j, 0, 0);
}

// The k range [k0, k1) of part blockIdx.z of ip[0] parts (0 or 1: one), as mul_mat.cu's k-split: part p sums
// k in [64 * (p * U / S), 64 * ((p + 1) * U / S)) clipped to K, U = ceil(K / 64).
__device__ __forceinline__ void mmid_k_range(const kparams &p, i64 K, i64 &k0, i64 &k1) {
    const i64 S = p.ip[0] > 1 ? p.ip[0] : 1, U = (K + 63) / 64, q = blockIdx.z;
    k0 = min(K, 64 * (q * U / S));
    k1 = min(K, 64 * ((q + 1) * U / S));
}

// Where part blockIdx.z writes element (m, s, t): dst for part 0, else the partials t[3] at i3 = part - 1.
__device__ __forceinline__ void mmid_store(const kparams &p, i64 m, int s, int t, float v) {
    const int q = blockIdx.z;
    store_f(q == 0 ? p.t[0] : p.t[3], m, s, t, q == 0 ? 0 : q - 1, v);
}

// Programmatic dependent launch (GGML_CUDA_PDL, Hopper+): a kernel launched with the programmatic stream
// serialisation attribute may start before the kernel ahead of it on the stream has finished. Every kernel
// therefore first waits for its predecessors to complete and their writes to be visible (griddepcontrol.wait:
// a no-op when the launch did not use the attribute), then lets its own successor be launched
// (launch_dependents), so the successor's launch latency and block setup overlap this kernel's run. The
// wait comes before any global read, so results are those of plain stream order (ggml_cuda_pdl_sync/_lc).
__device__ __forceinline__ void pdl_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every kernel: `extern "C" __global__ void NAME(const kparams p)`, whose body (the braces after the macro)
// runs after pdl_prologue(). __grid_constant__ keeps the record in the parameter bank when helpers take
// references into it (no 576-byte local copy); the ABI is unchanged.
#define KERNEL_WITH_BOUNDS_(name, bounds) \
    static __device__ __forceinline__ void name##_body(const kparams &p); \
    extern "C" __global__ void bounds name(const __grid_constant__ kparams p) { pdl_prologue(); name##_body(p); } \
    static __device__ __forceinline__ void name##_body(const kparams &p)
#define KERNEL(name) KERNEL_WITH_BOUNDS_(name, )
// KERNEL_LB(name, threads[, min blocks per SM]): the bounds cap the registers the kernel may use.
#define KERNEL_LB(name, ...) KERNEL_WITH_BOUNDS_(name, __launch_bounds__(__VA_ARGS__))
