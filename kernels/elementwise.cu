// Element-wise kernels: one thread per destination element (the binary ops: per four), 256 per block,
// grid-stride loop (the grid is capped, see geometry.py). Sources broadcast by modulo, as ggml's binary ops. Dense F32 operands of one
// shape take a flat float4 path; otherwise indices are unravelled in 32 bits when they fit (common.cuh).
#include "common.cuh"

__device__ __forceinline__ float binop(int op, float a, float b, float lim, float alpha) {
    return op == 0 ? a + b : op == 1 ? a * b : op == 2 ? silu(a) * b : op == 3 ? gelu_tanh(a) * b
                   : op == 5 ? __fdiv_rn(a, b) : op == 6 ? swiglu_oai(a, b, lim, alpha) : swiglu_clamp(a, b, lim);
}

__device__ __forceinline__ bool same_ne(const tdesc &a, const tdesc &b) {
    return a.ne[0] == b.ne[0] && a.ne[1] == b.ne[1] && a.ne[2] == b.ne[2] && a.ne[3] == b.ne[3];
}

// op: 0 add, 1 mul, 2 swiglu (silu(a) * b), 3 geglu (gelu_tanh(a) * b), 4 swiglu_clamp (limit fp[0]),
// 5 div (IEEE, rounded to nearest: numpy's a / b to the bit), 6 swiglu_oai (limit fp[0], alpha fp[1])
template <typename I> __device__ void binary_t(const kparams &p, int op) {
    const tdesc &D = p.t[0], &A = p.t[1], &B = p.t[2];
    const float lim = p.fp[0], alpha = p.fp[1];
    const I n = (I)nelements(D), stride = (I)gridDim.x * blockDim.x;
    I i = (I)blockIdx.x * blockDim.x + threadIdx.x;
    if (dense_f32(D) && dense_f32(A) && dense_f32(B) && same_ne(D, A) && same_ne(D, B)) {
        float *d = (float *)D.data;
        const float *a = (const float *)A.data, *b = (const float *)B.data;
        if (n % 4 == 0 && ((D.data | A.data | B.data) & 15) == 0) {
            for (; i < n / 4; i += stride) {
                const float4 x = ((const float4 *)a)[i], y = ((const float4 *)b)[i];
                ((float4 *)d)[i] = make_float4(binop(op, x.x, y.x, lim, alpha), binop(op, x.y, y.y, lim, alpha),
                                               binop(op, x.z, y.z, lim, alpha), binop(op, x.w, y.w, lim, alpha));
            }
        } else {
            for (; i < n; i += stride) d[i] = binop(op, a[i], b[i], lim, alpha);
        }
        return;
    }
    for (; i < n; i += stride) {
        I i0, i1, i2, i3;
        unravel_t(i, D.ne, i0, i1, i2, i3);
        const float a = load_f(A, bcast_t(i0, A.ne[0], D.ne[0]), bcast_t(i1, A.ne[1], D.ne[1]),
                               bcast_t(i2, A.ne[2], D.ne[2]), bcast_t(i3, A.ne[3], D.ne[3]));
        const float b = load_f(B, bcast_t(i0, B.ne[0], D.ne[0]), bcast_t(i1, B.ne[1], D.ne[1]),
                               bcast_t(i2, B.ne[2], D.ne[2]), bcast_t(i3, B.ne[3], D.ne[3]));
        store_f(D, i0, i1, i2, i3, binop(op, a, b, lim, alpha));
    }
}

__device__ void binary(const kparams &p, int op) {
    if (FITS32(nelements(p.t[0]))) binary_t<unsigned>(p, op);
    else binary_t<i64>(p, op);
}

KERNEL_LB(add_f32, 256) { binary(p, 0); }
KERNEL_LB(mul_f32, 256) { binary(p, 1); }
KERNEL_LB(glu_swiglu_f32, 256) { binary(p, 2); }
KERNEL_LB(glu_geglu_f32, 256) { binary(p, 3); }
KERNEL_LB(glu_swiglu_clamp_f32, 256) { binary(p, 4); }
KERNEL_LB(div_f32, 256) { binary(p, 5); }
KERNEL_LB(glu_swiglu_oai_f32, 256) { binary(p, 6); }

// ADD_ID (gpt-oss's expert biases), one thread per destination element: dst[i0, i1, i2] = a[i0, i1, i2] +
// b[i0, ids[i1, i2]], as ggml-cuda's add_id_kernel (which runs a block per row).
template <typename I> __device__ void add_id_t(const kparams &p) {
    const tdesc &D = p.t[0], &A = p.t[1], &B = p.t[2], &ID = p.t[3];
    const I n = (I)nelements(D), stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I i0, i1, i2, i3;
        unravel_t(i, D.ne, i0, i1, i2, i3);
        const int e = load_i32(ID, i1, i2, 0, 0);
        store_f(D, i0, i1, i2, i3, load_f(A, i0, i1, i2, i3) + load_f(B, i0, e, 0, 0));
    }
}

KERNEL_LB(add_id_f32, 256) {
    if (FITS32(nelements(p.t[0]))) add_id_t<unsigned>(p);
    else add_id_t<i64>(p);
}

// Unary ops with two float parameters, one thread per element:
// op 0, GGML_OP_SCALE with its bias: dst = x * fp[0] + fp[1], a rounded multiply then a rounded add, never an
//       FMA, so the simulator's numpy (two roundings) gives the same bytes;
// op 1, GGML_OP_CLAMP: dst = fminf(fmaxf(x, fp[0]), fp[1]), ggml-cuda's op_clamp (a NaN becomes fp[0]).
__device__ __forceinline__ float unop(int op, float x, float a, float b) {
    return op == 0 ? __fadd_rn(__fmul_rn(x, a), b) : fminf(fmaxf(x, a), b);
}

template <typename I> __device__ void unary_t(const kparams &p, int op) {
    const tdesc &D = p.t[0], &X = p.t[1];
    const I n = (I)nelements(D), stride = (I)gridDim.x * blockDim.x;
    const float a = p.fp[0], b = p.fp[1];
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I i0, i1, i2, i3;
        unravel_t(i, D.ne, i0, i1, i2, i3);
        store_f(D, i0, i1, i2, i3, unop(op, load_f(X, i0, i1, i2, i3), a, b));
    }
}

__device__ void unary(const kparams &p, int op) {
    if (FITS32(nelements(p.t[0]))) unary_t<unsigned>(p, op);
    else unary_t<i64>(p, op);
}

KERNEL_LB(scale_f32, 256) { unary(p, 0); }
KERNEL_LB(clamp_f32, 256) { unary(p, 1); }

// Copy between strided layouts: element i of src (flat, in src's ne) goes to element i of dst (in dst's
// ne), as ggml's cpy; with equal ne this is a plain strided copy. The dst type (F32/F16) decides the store.
template <typename I> __device__ void copy_t(const kparams &p) {
    const tdesc &D = p.t[0], &S = p.t[1];
    const I n = (I)nelements(S), stride = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        I s0, s1, s2, s3, d0, d1, d2, d3;
        unravel_t(i, S.ne, s0, s1, s2, s3);
        if (same_ne(D, S)) { d0 = s0; d1 = s1; d2 = s2; d3 = s3; }
        else unravel_t(i, D.ne, d0, d1, d2, d3);
        store_f(D, d0, d1, d2, d3, load_f(S, s0, s1, s2, s3));
    }
}

__device__ void copy(const kparams &p) {
    if (FITS32(nelements(p.t[1]))) copy_t<unsigned>(p);
    else copy_t<i64>(p);
}

KERNEL_LB(cpy_f32_f32, 256) { copy(p); }
KERNEL_LB(cpy_f32_f16, 256) { copy(p); }
KERNEL_LB(cpy_f16_f32, 256) { copy(p); }
