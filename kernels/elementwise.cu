// Element-wise kernels: one thread per destination element, 256 per block, grid-stride loop (the grid is
// capped, see geometry.py). Sources broadcast by modulo, as ggml's binary ops.
#include "common.cuh"

__device__ __forceinline__ float load_bcast(const tdesc &s, i64 i0, i64 i1, i64 i2, i64 i3) {
    return load_f(s, i0 % s.ne[0], i1 % s.ne[1], i2 % s.ne[2], i3 % s.ne[3]);
}

// op: 0 add, 1 mul, 2 swiglu (silu(a) * b)
__device__ void binary(const kparams &p, int op) {
    const tdesc &D = p.t[0], &A = p.t[1], &B = p.t[2];
    const i64 n = nelements(D);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 i0, i1, i2, i3;
        unravel(i, D.ne, i0, i1, i2, i3);
        const float a = load_bcast(A, i0, i1, i2, i3), b = load_bcast(B, i0, i1, i2, i3);
        store_f(D, i0, i1, i2, i3, op == 0 ? a + b : op == 1 ? a * b : silu(a) * b);
    }
}

KERNEL_LB(add_f32, 256) { binary(p, 0); }
KERNEL_LB(mul_f32, 256) { binary(p, 1); }
KERNEL_LB(glu_swiglu_f32, 256) { binary(p, 2); }

// Copy between strided layouts: element i of src (flat, in src's ne) goes to element i of dst (in dst's
// ne), as ggml's cpy; with equal ne this is a plain strided copy. The dst type (F32/F16) decides the store.
__device__ void copy(const kparams &p) {
    const tdesc &D = p.t[0], &S = p.t[1];
    const i64 n = nelements(S);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 s0, s1, s2, s3, d0, d1, d2, d3;
        unravel(i, S.ne, s0, s1, s2, s3);
        unravel(i, D.ne, d0, d1, d2, d3);
        store_f(D, d0, d1, d2, d3, load_f(S, s0, s1, s2, s3));
    }
}

KERNEL_LB(cpy_f32_f32, 256) { copy(p); }
KERNEL_LB(cpy_f32_f16, 256) { copy(p); }
