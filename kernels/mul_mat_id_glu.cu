// mul_mat_id_vec_glu_{f32,f16}: the float experts' fused gate/up mat-vec + GLU of one token (ggml fuses
// MUL_MAT_ID, MUL_MAT_ID, GLU when the experts' float mat-vec writes one column; Q8_0's, on Q8_1 x up to 8
// tokens, is in mul_mat_vec.cu):
//   dst[t, s, m] = glu(G[ids[t, s]][m] . x[t, s or 0], U[ids[t, s]][m] . x[t, s or 0])   (ip[0]: the GLU op,
//   fp[0]: SWIGLU_CLAMP's limit; with the experts' biases fused, gpt-oss: t[5] the up bias, the gate bias at
//   ip[1] | ip[2] << 32, each added to its product before the GLU)
// One warp per output row m, 4 rows per block; grid (ceil(M / 4), n_used, T) as mul_mat_id_vec.
#include "common.cuh"

#define MMID_GLU_WARPS 4

template <int T> __device__ void mmid_glu(const kparams &p) {
    const tdesc &D = p.t[0], &G = p.t[1], &U = p.t[2], &X = p.t[3], &I = p.t[4];
    const i64 m = (i64)blockIdx.x * MMID_GLU_WARPS + (threadIdx.x >> 5);
    if (m >= D.ne[0]) return;
    const int lane = threadIdx.x & 31;
    const i64 s = blockIdx.y, t = blockIdx.z;
    const int e = load_i32(I, s, t, 0, 0);
    const char *g = row_ptr(G, m, e, 0), *u = row_ptr(U, m, e, 0);
    const char *x = row_ptr(X, X.ne[1] > 1 ? s : 0, t, 0);
    float ag = 0.0f, au = 0.0f;
    for (i64 k = lane; k < G.ne[0]; k += 32) {
        const float xv = *(const float *)(x + k * X.nb[0]);
        ag += row_elem<T>(g, k, G.nb[0]) * xv;
        au += row_elem<T>(u, k, U.nb[0]) * xv;
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0)
        store_f(D, m, s, t, 0, glu(p.ip[0], plus_gate_bias(p, p.t[5], m, e, ag), plus_expert_bias(p.t[5], m, e, au),
                                   p.fp[0]));
}

KERNEL_LB(mul_mat_id_vec_glu_f32, 128) { mmid_glu<GGML_F32>(p); }
KERNEL_LB(mul_mat_id_vec_glu_f16, 128) { mmid_glu<GGML_F16>(p); }
