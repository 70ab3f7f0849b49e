// flash_attn_ext_f16: one block of 128 threads per (head h, token t); q row in dynamic shmem (D floats);
// scores and then probabilities go through the scratch tensor t[5] (n_kv, H, T), F32 in device memory.
//   pass 1: one warp per kv position j: s_j = scale * q . k_j + mask[t, j]   (-> scratch, running max)
//   pass 2: p_j = exp(s_j - max) (-> scratch), sum
//   pass 3: one thread per output dim d < Dv: dst[d] = sum_j p_j v_j[d] / sum      (v reads coalesced along d)
// GQA: kv head = h / (H / Hkv). Mask (n_kv, T_pad, M2, M3): dims 2/3 broadcast over heads / batch.
// A fully masked row gives zeros (not NaN), as cpu_ops.
#include "common.cuh"

#define FA_THREADS 128

KERNEL_LB(flash_attn_ext_f16, FA_THREADS) {
    extern __shared__ float qs[];
    __shared__ float red[32];
    const tdesc &O = p.t[0], &Q = p.t[1], &Kc = p.t[2], &V = p.t[3], &Mk = p.t[4], &S = p.t[5];
    const i64 h = blockIdx.x, t = blockIdx.y, i3 = blockIdx.z;
    const i64 hd = Q.ne[0], nkv = Kc.ne[2], hk = h / (Q.ne[1] / Kc.ne[1]);
    const bool has_mask = Mk.data != 0;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float scale = p.fp[0];

    for (i64 d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = load_f(Q, d, h, t, i3);
    __syncthreads();

    float mx = F32_NEG_INF;
    for (i64 j = warp; j < nkv; j += nw) {
        const char *kr = row_ptr(Kc, hk, j, i3 % Kc.ne[3]);
        float dot = 0.0f;
        for (i64 d = lane; d < hd; d += 32) dot += qs[d] * row_elem<GGML_F16>(kr, d, Kc.nb[0]);
        dot = warp_sum(dot);
        float s = scale * dot;
        if (has_mask) s += load_f(Mk, j, t, h % Mk.ne[2], i3 % Mk.ne[3]);   // mask dims 2/3 broadcast
        if (lane == 0) *(float *)addr4(S, j, h, t, 0) = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);   // its barriers also publish the scratch writes to the whole block

    float sum = 0.0f;
    for (i64 j = threadIdx.x; j < nkv; j += blockDim.x) {
        float *sp = (float *)addr4(S, j, h, t, 0);
        const float e = mx == F32_NEG_INF ? 0.0f : expf(*sp - mx);
        *sp = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

    for (i64 d = threadIdx.x; d < V.ne[0]; d += blockDim.x) {   // Dv may differ from D
        float acc = 0.0f;
        for (i64 j = 0; j < nkv; ++j)
            acc += *(const float *)addr4(S, j, h, t, 0) * load_f(V, d, hk, j, i3 % V.ne[3]);
        store_f(O, d, h, t, i3, acc * inv);
    }
}
