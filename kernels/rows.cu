// get_rows: one block per dst row (grid = (ne1, ne2, ne3)), threads striding over ne0 (block 32..256,
// see geometry.py). set_rows: one thread per source element (256 per block, grid-stride).
#include "common.cuh"

// dst[i3, i2, i1, :] = dequant(table[ids[i3, i2, i1], :]); table dims 2/3 follow dst's (by modulo).
template <int T> __device__ void get_rows(const kparams &p) {
    const tdesc &D = p.t[0], &Tb = p.t[1], &I = p.t[2];
    const i64 i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    const i64 r = load_i32(I, i1, i2, i3, 0);
    const char *row = row_ptr(Tb, r, i2 % Tb.ne[2], i3 % Tb.ne[3]);
    for (i64 i0 = threadIdx.x; i0 < D.ne[0]; i0 += blockDim.x)
        store_f(D, i0, i1, i2, i3, row_elem<T>(row, i0, Tb.nb[0]));
}

KERNEL_LB(get_rows_f32, 256) { get_rows<GGML_F32>(p); }
KERNEL_LB(get_rows_f16, 256) { get_rows<GGML_F16>(p); }
KERNEL_LB(get_rows_q8_0, 256) { get_rows<GGML_Q8_0>(p); }

// dst[idx[r], c] = src element e, for e = r * W + c over src's elements in ggml order (W = dst's ne0).
// With src (W, T, ...) this is dst[idx[t], :] = src[t, :]; with src (D, Hkv, T) and W = D * Hkv a token's
// heads fill one cache row. The flat row r is unravelled in idx's own shape (1-D, or shaped like src's
// rows). One thread per src element, grid-stride; the dst type (F16 / F32) decides the store.
template <typename I> __device__ void set_rows_t(const kparams &p) {
    const tdesc &D = p.t[0], &S = p.t[1], &Ix = p.t[2];
    const I n = (I)nelements(S), w = (I)D.ne[0], stride = (I)gridDim.x * blockDim.x;
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        I s0, s1, s2, s3, j0, j1, j2, j3;
        unravel_t(e, S.ne, s0, s1, s2, s3);
        const I rr = e / w;
        unravel_t(rr, Ix.ne, j0, j1, j2, j3);
        const i64 r = load_i32(Ix, j0, j1, j2, j3);
        store_f(D, e - rr * w, r, 0, 0, load_f(S, s0, s1, s2, s3));
    }
}

// The same for a dense F32 source and dense I32 indices (every K/V cache write of a decode): element e is
// src[e], its index idx[e / w], one division and no unravelling ahead of the two loads (the general loop's
// seven divisions made a decode's V write 1.9 us under CUPTI against upstream's 1.3).
__device__ void set_rows_dense(const kparams &p) {
    const tdesc &D = p.t[0], &S = p.t[1], &Ix = p.t[2];
    const unsigned n = (unsigned)nelements(S), w = (unsigned)D.ne[0], stride = gridDim.x * blockDim.x;
    const float *src = (const float *)S.data;
    const int *idx = (const int *)Ix.data;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const unsigned rr = e / w;
        store_f(D, e - rr * w, idx[rr], 0, 0, src[e]);
    }
}

__device__ void set_rows(const kparams &p) {
    const bool fits = FITS32(nelements(p.t[1]));
    if (fits && dense_f32(p.t[1]) && dense4(p.t[2], GGML_I32)) set_rows_dense(p);
    else if (fits) set_rows_t<unsigned>(p);
    else set_rows_t<i64>(p);
}

KERNEL_LB(set_rows_f16, 256) { set_rows(p); }
KERNEL_LB(set_rows_f32, 256) { set_rows(p); }
