// The MoE weighted expert reduction (llama.cpp #25952, ggml-cuda's moe_weighted_reduction_f32): the experts'
// outputs times their router weights (and an optional per-expert scale), summed over the used experts, one
// kernel for MUL [+ MUL] + k VIEWs + (k - 1) ADDs. One thread per output element: block (token, 256 columns);
// the experts added in order, each product taken as upstream takes it: (e * scale) * w.
//   t[0] dst F32 (n_embd, n_tokens), contiguous
//   t[1] experts F32 (n_embd, k, n_tokens), contiguous
//   t[2] router weights F32 (1, k, n_tokens), contiguous
//   t[3] per-expert scale F32 (1, k, n_tokens), contiguous; data 0: none
#include "common.cuh"

KERNEL_LB(moe_weighted_reduction_f32, 256) {
    const tdesc &D = p.t[0], &E = p.t[1], &W = p.t[2], &S = p.t[3];
    const i64 n_embd = E.ne[0], k = E.ne[1];
    const i64 token = blockIdx.x, col = (i64)blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= n_embd) return;
    const float *e = (const float *)E.data, *w = (const float *)W.data, *s = (const float *)S.data;
    const i64 first = token * k;
    float sum = (e[first * n_embd + col] * (s ? s[first] : 1.0f)) * w[first];
    for (i64 x = 1; x < k; ++x) {
        const i64 row = first + x;
        sum += (e[row * n_embd + col] * (s ? s[row] : 1.0f)) * w[row];
    }
    ((float *)D.data)[token * n_embd + col] = sum;
}

// The top-k MoE router (ggml-cuda's topk_moe_cuda, softmax form, no bias): SOFT_MAX, the RESHAPE of the
// probabilities, their ARGSORT, the VIEW of its first k and the GET_ROWS of the weights [, the weight norm:
// RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE] [, a SCALE of them] as one kernel. A warp per token, TOPK_MOE_ROWS
// tokens per block; every logit of the block's rows is read before any write (the outputs may alias the
// logits, as upstream allows). p = the row's softmax in F32 (e = exp(x - max), times 1 / sum e; a NaN p, from a
// NaN or infinite logit, is -FLT_MAX, as upstream's); then k rounds of argmax over p (ties: the lower expert),
// each writing ids[r] = expert, keeping p[expert] for slot r and taking the expert out. With the norm, the kept
// p are summed as upstream sums them (each lane adds those of the experts it holds, then a warp sum), the sum
// is raised to at least the CLAMP's minimum, and each kept p is multiplied by 1 / sum; weights[r] = that * scale.
//   t[0] weights F32 (k, T) or (1, k, T), contiguous
//   t[1] ids I32 (k, T): the view of the argsort's rows (row stride nb[1])
//   t[2] logits F32 (n_expert, T), contiguous; n_expert <= 32 * TOPK_MOE_PER_LANE
//   ip[0] k (experts used); ip[1] 1: normalise the weights (the norm fused), 0: not; ip[2] 1: the softmax
//         delayed (gpt-oss's SOFTMAX_WEIGHT router: ARGSORT, VIEW, GET_ROWS, RESHAPE, SOFT_MAX, RESHAPE): the
//         k rounds of argmax run over the logits themselves (a NaN one -FLT_MAX) and the k kept logits are
//         softmaxed afterwards, as upstream's softmax_warp_inplace over them (max, expf, a warp sum of the
//         lanes' terms, times 1 / sum); never with the norm
//   fp[0] scale (1 without the SCALE); fp[1] the CLAMP's minimum (with the norm)
#define TOPK_MOE_ROWS 8
#define TOPK_MOE_PER_LANE 18      // 576 experts (upstream's largest instantiation) over 32 lanes

KERNEL_LB(topk_moe_f32, 32 * TOPK_MOE_ROWS) {
    const tdesc &W = p.t[0], &I = p.t[1], &L = p.t[2];
    const i64 n = L.ne[0], rows = L.ne[1] * L.ne[2] * L.ne[3];
    const int lane = threadIdx.x, k = p.ip[0];
    const bool with_norm = p.ip[1] != 0, delayed = p.ip[2] != 0;
    const i64 row = (i64)blockIdx.x * TOPK_MOE_ROWS + threadIdx.y;
    const float scale = p.fp[0], clamp_min = p.fp[1];
    float wt[TOPK_MOE_PER_LANE];
    const float *lg = (const float *)L.data + row * n;
#pragma unroll
    for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) {
        const i64 e = lane + 32 * j;
        wt[j] = (row < rows && e < n) ? lg[e] : F32_NEG_INF;
    }
    __syncthreads();              // the block's logits all read: the outputs may alias them
    if (row >= rows) return;
    if (delayed) {                    // the logits themselves, a NaN one -FLT_MAX
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j)
            wt[j] = lane + 32 * j < n ? (isnan(wt[j]) ? -3.402823466e38f : wt[j]) : F32_NEG_INF;
    } else {
        float mx = F32_NEG_INF;
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) mx = fmaxf(mx, wt[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) {
            const float e = lane + 32 * j < n ? expf(wt[j] - mx) : 0.0f;
            wt[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        const float inv = 1.0f / sum;     // as upstream: a NaN or infinite logit makes every p NaN ...
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) {   // ... and a NaN p is -FLT_MAX, so the argmax stays unique
            const float v = wt[j] * inv;
            wt[j] = lane + 32 * j < n ? (isnan(v) ? -3.402823466e38f : v) : F32_NEG_INF;
        }
    }
    float kept[TOPK_MOE_PER_LANE];    // round r's p, held by lane r % 32 in slot r / 32 (upstream's layout)
#pragma unroll
    for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) kept[j] = 0.0f;
    float kept_sum = 0.0f;            // this lane's share of the norm's sum: the p of the experts it holds
    char *ids = (char *)I.data + row * I.nb[1];
    for (int r = 0; r < k; ++r) {
        float best = wt[0];
        int expert = lane;
#pragma unroll
        for (int j = 1; j < TOPK_MOE_PER_LANE; ++j) {
            if (wt[j] > best) { best = wt[j]; expert = lane + 32 * j; }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, best, off);
            const int x = __shfl_xor_sync(0xffffffffu, expert, off);
            if (v > best || (v == best && x < expert)) { best = v; expert = x; }
        }
        if ((expert & 31) == lane) {
            kept_sum += best;
#pragma unroll
            for (int j = 0; j < TOPK_MOE_PER_LANE; ++j)
                if (j == expert / 32) wt[j] = F32_NEG_INF;
        }
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j)
            if (j == r / 32 && lane == (r & 31)) kept[j] = best;
        if (lane == 0) *(int *)(ids + (i64)r * I.nb[0]) = expert;
    }
    float norm = 1.0f;
    if (with_norm) norm = 1.0f / fmaxf(warp_sum(kept_sum), clamp_min);
    if (delayed) {                    // softmax over the k kept logits, as upstream's softmax_warp_inplace
        float km = F32_NEG_INF;
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j)
            if (lane + 32 * j < k) km = fmaxf(km, kept[j]);
        km = warp_max(km);
        float ks = 0.0f;
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) {
            const float e = lane + 32 * j < k ? expf(kept[j] - km) : 0.0f;
            kept[j] = e;
            ks += e;
        }
        const float kinv = 1.0f / warp_sum(ks);
#pragma unroll
        for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) kept[j] *= kinv;
    }
    float *w = (float *)W.data + row * k;
#pragma unroll
    for (int j = 0; j < TOPK_MOE_PER_LANE; ++j) {
        const int r = lane + 32 * j;
        if (r < k) w[r] = kept[j] * norm * scale;    // (p * (1 / sum)) * scale, as upstream; norm 1: exact
    }
}

// mm_ids_helper: MUL_MAT_ID's (slot, token) pairs sorted by expert, as ggml-cuda's mm_ids_helper (mmid.cu)
// prepares them for its MMQ and MMF paths. Block e (one warp) counts the pairs of lower experts (its start,
// bounds[e]), then writes its own pairs token by token, slots in order within a token (a ballot per 32
// pairs keeps that order); the last block writes bounds[E], the end of the map.
//   t[0] map I32 (2, n_used * T): pair j = (slot, token)
//   t[1] ids I32 (n_used, T)
//   t[2] bounds I32 (E + 1)
// Grid (E), block 32.
KERNEL_LB(mm_ids_helper, 32) {
    const tdesc &R = p.t[0], &I = p.t[1], &B = p.t[2];
    const int e = blockIdx.x, lane = threadIdx.x & 31, n_used = (int)I.ne[0];
    const i64 n = I.ne[0] * I.ne[1];
    int before = 0;
    for (i64 k = lane; k < n; k += 32) before += load_i32(I, k % n_used, k / n_used, 0, 0) < e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
    int at = before;
    for (i64 k0 = 0; k0 < n; k0 += 32) {
        const i64 k = k0 + lane;
        const bool hit = k < n && load_i32(I, k % n_used, k / n_used, 0, 0) == e;
        const unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (hit) {
            const i64 j = at + __popc(mask & ((1u << lane) - 1u));
            *(int *)addr4(R, 0, j, 0, 0) = (int)(k % n_used);
            *(int *)addr4(R, 1, j, 0, 0) = (int)(k / n_used);
        }
        at += __popc(mask);
    }
    if (lane == 0) {
        *(int *)addr4(B, e, 0, 0, 0) = before;
        if (e == (int)B.ne[0] - 2) *(int *)addr4(B, e + 1, 0, 0, 0) = at;
    }
}
