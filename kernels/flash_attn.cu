// Flash attention in two launches of fixed count (the node's kernel count never depends on n_kv, so n_kv
// growth keeps the captured topology): a split-KV partial kernel and a combine kernel.
//
// Partial kernels (flash_attn_vec_f16_d{D}_g{G} for decode, flash_attn_mma_f16_d{D} for batches): split s
// covers the positions [s * chunk, (s + 1) * chunk) (chunk = ip[0], a multiple of 32); per (split, head,
// token) they write the unnormalised O (Dv floats), the max m of the scores x_j = scale * q . k_j + mask
// and the sum l of p_j = exp(x_j - m) into the pool scratch t[0] (Dv + 2, n_split, H, T * B). An empty or
// fully masked split gives (0, -inf, 0).
// flash_attn_combine_f32: grid (H / HB, T * B), block (Dv, HB) (HB heads per block: geometry.py): dst = sum_s O_s e^(m_s - M) / sum_s l_s e^(m_s - M),
// M = max_s m_s, splits in order (deterministic; past FAC_CHUNK splits the sums so far are rescaled to the
// running max, chunk by chunk); all splits empty (fully masked row) gives zeros.
// GQA: kv head = h / G. Mask (n_kv, T_pad, M2, M3), F32 or F16 (by descriptor type): dims 2/3 broadcast.
#include "common.cuh"
#include "mma.cuh"

// Out of line: the per-head masks are rare (llama.cpp's broadcasts over heads), and inlined into fa_vec's
// unrolled score loop this was a fifth of its code (fetched anew each decode step: see fav_load8_slow).
__device__ __noinline__ float mask_at(const tdesc &M, i64 j, i64 t, i64 h, i64 b) {
    const char *a = (const char *)M.data + j * M.nb[0] + t * M.nb[1] + (h % M.ne[2]) * M.nb[2] +
                    (b % M.ne[3]) * M.nb[3];
    return M.type == GGML_F16 ? h2f(*(const unsigned short *)a) : *(const float *)a;
}

// ---- decode: flash_attn_vec_f16_d{D}_g{GM} ------------------------------------------------------------
// With ip[2] set (one split, grid.x 1) t[0] is the node and the block writes the normalised output itself, as
// ggml's vec kernel does with one parallel block (then it launches no combine: launch_fattn). Where upstream
// does so, the lowering launches flash_attn_vec_direct_f16_d{D} instead (below): one block per query head, as
// ggml's vec kernel has a block per head (a Gemma 3 layer, 4 heads on one kv head at D 256, on 4 SMs, not 1).
// The partials for one token per block (decode, T <= 8): grid (n_split, Hkv, T * B), 128 threads. One entry point per head size D and group GM (G = H / Hkv rounded up to 1, 2, 4, 8), as ggml
// instantiates its vec kernel per head size: a launch fetches only its own code, and its registers are its
// own (one entry switching over all twelve bodies was 600 KB of SASS at 248 registers). A block owns kv head hk, token t, and positions [s * chunk, (s + 1) * chunk), walked in tiles
// of 32; its G = H / Hkv query heads (G <= 8) share every K/V load. Thread (pg, r) = (tid / R, tid % R),
// R = D / 8: it holds 8 dims [8r, 8r + 8) of the K and V rows of the tile positions pg + PG * i (PG = 128 / R)
// as uint4, loaded one tile ahead (K, V and the mask of a tile are all in flight together: one memory round
// trip per tile, none serialised behind the softmax). Scores: the R lanes of a row reduce their partial
// dots by shuffles, the G heads' together (fav_head_sums); the softmax of a tile runs one warp per head (lane = position), online across tiles
// (m, l per head); p.V accumulates in registers, and the PG row groups are summed in order at the end
// (deterministic).
#define FAV_THREADS 128
#define FAC_CHUNK 8       // flash_attn_combine_f32: splits loaded together
#define FAV_TILE 32
#define FAV_MAX_G 8

// 8 halves of a K or V row that is not 16-byte aligned, element by element: out of line, so the aligned
// path's code (every cache's) stays short; the kernel's instructions are fetched anew each decode step
// (the weights stream through L2 in between), and under ncu a longer body showed as instruction-fetch stalls.
__device__ __noinline__ uint4 fav_load8_slow(const char *row, i64 d, i64 nb0) {
    unsigned short h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = *(const unsigned short *)(row + (d + e) * nb0);
    return make_uint4(h[0] | ((unsigned)h[1] << 16), h[2] | ((unsigned)h[3] << 16), h[4] | ((unsigned)h[5] << 16),
                      h[6] | ((unsigned)h[7] << 16));
}

__device__ __forceinline__ uint4 fav_load8(const char *row, i64 d, i64 nb0, bool vec) {
    if (vec) return *(const uint4 *)(row + d * 2);
    return fav_load8_slow(row, d, nb0);
}

// The sums over a position's R lanes of its GM heads' partial dots v[0..GM): at each shuffle round a lane keeps
// half the heads it holds and passes the other half to its partner (lane ^ off), so the GM sums take
// log2(min(GM, R)) halving rounds of n / 2 shuffles and log2(R / GM) plain ones: 4 shuffles for 4 heads over 8
// lanes, where reducing each head on its own took 12 (they were the kernel's most sampled stall under ncu).
// Afterwards the lane holds the full sums of heads hb .. hb + FAV_HEADS_PER_LANE - 1 in v[0..], hb returned;
// lanes r with r % (R / GM) == 0 (all lanes when GM >= R) hold distinct heads.
#define FAV_HEADS_PER_LANE(R, GM) ((GM) > (R) ? (GM) / (R) : 1)
template <int R, int GM> __device__ __forceinline__ int fav_head_sums(float (&v)[GM], int r) {
    int hb = 0;
#pragma unroll
    for (int off = R / 2, n = GM; off > 0; off >>= 1) {
        if (n > 1) {
            const bool up = (r & off) != 0;
#pragma unroll
            for (int k = 0; k < GM / 2; ++k) {
                if (k < n / 2) {
                    const float send = up ? v[k] : v[k + n / 2];
                    const float keep = up ? v[k + n / 2] : v[k];
                    v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
                }
            }
            if (up) hb += n / 2;
            n /= 2;
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
        }
    }
    return hb;
}

// i modulo a broadcast dim n (a batch index into K, V or the mask: n is 1 or the batch)
__device__ __forceinline__ int fav_bmod(int i, i64 n) { return n == 1 ? 0 : i % (int)n; }

template <int D, int GM> __device__ void fa_vec(const kparams &p, float *smem) {
    constexpr int R = D / 8, PG = FAV_THREADS / R, PPT = FAV_TILE / PG;
    const tdesc &P = p.t[0], &Q = p.t[1], &Kc = p.t[2], &V = p.t[3], &Mk = p.t[4];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, pg = tid / R, r = tid % R;
    // head and token indices in 32 bits (a 64-bit division or modulo is a long software sequence, and the
    // block's setup was a fifth of its samples under ncu)
    const int H = (int)Q.ne[1], T = (int)Q.ne[2];
    const i64 nkv = Kc.ne[2];
    const int G = H / (int)Kc.ne[1], hk = blockIdx.y, h0 = hk * G;   // the kv head and its first query head
    const int t = blockIdx.z % T, b = blockIdx.z / T;
    const bool has_mask = Mk.data != 0;
    const float scale = p.fp[0];
    const i64 j0 = (i64)blockIdx.x * p.ip[0], j1 = min(j0 + (i64)p.ip[0], nkv);

    float *qs = smem;                      // [GM][D]
    float *ss = qs + GM * D;               // [GM][32] scores, then p
    float *al = ss + GM * FAV_TILE;        // [GM] alpha of the tile
    float *red = al + FAV_MAX_G;           // [PG][GM][D] for the final sum over row groups

    const bool kvec = Kc.nb[0] == 2 && ((Kc.data | (u64)Kc.nb[1] | (u64)Kc.nb[2] | (u64)Kc.nb[3]) & 15) == 0;
    const bool vvec = V.nb[0] == 2 && ((V.data | (u64)V.nb[1] | (u64)V.nb[2] | (u64)V.nb[3]) & 15) == 0;
    const char *kbase = (const char *)Kc.data + hk * Kc.nb[1] + fav_bmod(b, Kc.ne[3]) * Kc.nb[3];
    const char *vbase = (const char *)V.data + hk * V.nb[1] + fav_bmod(b, V.ne[3]) * V.nb[3];

    // the mask is read per position when it broadcasts over heads (llama.cpp's: from one row whose address
    // is taken once), per head otherwise (mask_at)
    const bool mhead = has_mask && Mk.ne[2] > 1, m16 = Mk.type == GGML_F16;
    const char *mrow = has_mask ? (const char *)Mk.data + (i64)t * Mk.nb[1] + fav_bmod(b, Mk.ne[3]) * Mk.nb[3] : 0;
    const i64 mnb0 = Mk.nb[0];
    uint4 kr[PPT], vr[PPT];
    float mk[PPT];
    auto load_tile = [&](i64 c0) {
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            const i64 j = c0 + pg + PG * i;
            const bool in = j < j1;
            kr[i] = in ? fav_load8(kbase + j * Kc.nb[2], (i64)r * 8, Kc.nb[0], kvec) : make_uint4(0, 0, 0, 0);
            vr[i] = in ? fav_load8(vbase + j * V.nb[2], (i64)r * 8, V.nb[0], vvec) : make_uint4(0, 0, 0, 0);
            float mv = 0.0f;
            if (in && has_mask && !mhead) {
                const char *a = mrow + j * mnb0;
                mv = m16 ? h2f(*(const unsigned short *)a) : *(const float *)a;
            }
            mk[i] = in ? mv : F32_NEG_INF;   // every lane: the one holding a head's sum writes its score
        }
    };
    load_tile(j0);

    // q rows of the G heads into shmem (unscaled)
    for (int e = tid; e < GM * D; e += FAV_THREADS) {
        const int g = e / D, d = e % D;
        qs[e] = g < G ? load_f(Q, d, h0 + g, t, b) : 0.0f;
    }
    float m = F32_NEG_INF, l = 0.0f;   // of head w (and w + 4), kept by warp w
    float m2 = F32_NEG_INF, l2 = 0.0f;
    float o[GM][8];
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] = 0.0f;
    __syncthreads();

    for (i64 c0 = j0; c0 < j1; c0 += FAV_TILE) {
        uint4 kc[PPT], vc[PPT];
        float mc[PPT];
#pragma unroll
        for (int i = 0; i < PPT; ++i) { kc[i] = kr[i]; vc[i] = vr[i]; mc[i] = mk[i]; }
        if (c0 + FAV_TILE < j1) load_tile(c0 + FAV_TILE);   // the next tile in flight while this one computes

        // scores of the tile: lane r of row group pg holds dims [8r, 8r + 8) of position c0 + pg + PG * i
#pragma unroll
        for (int i = 0; i < PPT; ++i) {
            float kf[8];
            h8(kc[i], kf);
            float v[GM];
#pragma unroll
            for (int g = 0; g < GM; ++g) {   // all GM heads: q rows past G are zeros, their scores unused
                const float4 a = *(const float4 *)(qs + g * D + r * 8);
                const float4 c = *(const float4 *)(qs + g * D + r * 8 + 4);
                v[g] = kf[0] * a.x + kf[1] * a.y + kf[2] * a.z + kf[3] * a.w +
                       kf[4] * c.x + kf[5] * c.y + kf[6] * c.z + kf[7] * c.w;
            }
            const int hb = fav_head_sums<R, GM>(v, r);
            if (GM >= R || r % (R / GM) == 0) {
                const i64 j = c0 + pg + PG * i;
#pragma unroll
                for (int k = 0; k < FAV_HEADS_PER_LANE(R, GM); ++k) {
                    const float sm = (mhead && j < j1) ? mask_at(Mk, j, t, h0 + hb + k, b) : mc[i];
                    ss[(hb + k) * FAV_TILE + pg + PG * i] = sm == F32_NEG_INF ? sm : sm + scale * v[k];
                }
            }
        }
        __syncthreads();
        // online softmax, one warp per head
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int g = w + 4 * k;
            if (g < G && g < GM) {
                float &mm = k == 0 ? m : m2, &ll = k == 0 ? l : l2;
                const float x = ss[g * FAV_TILE + lane];
                const float mn = fmaxf(mm, warp_max(x));
                float pj = 0.0f, alpha = 1.0f;
                if (mn != F32_NEG_INF) {
                    pj = x == F32_NEG_INF ? 0.0f : expf(x - mn);
                    alpha = mm == F32_NEG_INF ? 0.0f : expf(mm - mn);
                }
                ll = ll * alpha + warp_sum(pj);
                mm = mn;
                __syncwarp();
                ss[g * FAV_TILE + lane] = pj;
                if (lane == 0) al[g] = alpha;
            }
        }
        __syncthreads();
        // p . V into this thread's 8 dims of each head
#pragma unroll
        for (int g = 0; g < GM; ++g) {   // heads past G accumulate what is never written out
            const float a = al[g];
            float acc[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = o[g][e] * a;
#pragma unroll
            for (int i = 0; i < PPT; ++i) {
                const float pv = ss[g * FAV_TILE + pg + PG * i];
                float vf[8];
                h8(vc[i], vf);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += pv * vf[e];
            }
#pragma unroll
            for (int e = 0; e < 8; ++e) o[g][e] = acc[e];
        }
        __syncthreads();   // ss / al are rewritten by the next tile
    }

    // sum the PG row groups in order
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        if (g >= G) break;
        float4 *dst = (float4 *)(red + ((i64)pg * GM + g) * D + r * 8);
        dst[0] = make_float4(o[g][0], o[g][1], o[g][2], o[g][3]);
        dst[1] = make_float4(o[g][4], o[g][5], o[g][6], o[g][7]);
    }
    const bool direct = p.ip[2] != 0;      // one split: t[0] is the node, written normalised (no combine)
    if (direct) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {      // each head's l where every thread can read it (al is free now)
            const int g = w + 4 * k;
            if (g < G && g < GM && lane == 0) al[g] = k == 0 ? l : l2;
        }
    }
    __syncthreads();
    const i64 tb = b * T + t;
    if (direct) {
        for (int e = tid; e < G * D; e += FAV_THREADS) {
            const int g = e / D, d = e % D;
            float acc = 0.0f;
            for (int q = 0; q < PG; ++q) acc += red[((i64)q * GM + g) * D + d];
            const float L = al[g];
            store_f(P, d, h0 + g, t, b, L > 0.0f ? acc / L : 0.0f);
        }
        return;
    }
    for (int e = tid; e < G * D; e += FAV_THREADS) {
        const int g = e / D, d = e % D;
        float acc = 0.0f;
        for (int q = 0; q < PG; ++q) acc += red[((i64)q * GM + g) * D + d];
        float *out = (float *)((char *)P.data + blockIdx.x * P.nb[1] + (h0 + g) * P.nb[2] + tb * P.nb[3]);
        out[d] = acc;
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int g = w + 4 * k;
        if (g < G && g < GM && lane == 0) {
            float *out = (float *)((char *)P.data + blockIdx.x * P.nb[1] + (h0 + g) * P.nb[2] + tb * P.nb[3]);
            out[D] = k == 0 ? m : m2;
            out[D + 1] = k == 0 ? l : l2;
        }
    }
}

// ---- decode, one query head per block with no combine (ip[2] and ip[3], the g1 entries) -----------------
// Where upstream's vec kernel runs alone (geometry.fa_direct: one token, n_kv within one tile of D positions;
// Gemma 3's D 256 at n_kv 256) the block owns query head h = blockIdx.y and holds all its scores, so it needs
// no online rescaling and no per-tile barrier: fa_vec's tile loop (three barriers and a 32-lane shuffle
// reduction per 32 positions at D 256) ran Gemma's 4 blocks at 52 µs a layer on the H200, latency-bound with
// one warp per scheduler. Here FAVD_THREADS threads (16 warps: only H blocks run, so each SM gets what it
// can keep loads in flight with; entries of their own, flash_attn_vec_direct_f16_d{D}, so these bounds leave
// fa_vec's registers alone) work in three passes, each warp on its own positions as ggml's vec
// kernel has them (no barrier inside a pass), loads issued in groups ahead of their use:
//   1. scores: LK lanes per position, each with D / LK dims of q in registers and of the K row as uint4
//      loads, reduced by log2(LK) shuffles: s_j = mask_j + scale * q . k_j (-inf stays -inf);
//   2. M = max_j s_j, p_j = exp(s_j - M) (0 where s_j or M is -inf), L = sum_j p_j (block reductions);
//   3. p . V: D / 8 lanes per position (8 dims each, one uint4), the warps' sums added in warp order.
// dst = O / L, zeros where L is 0 (a fully masked row), as fa_vec's direct branch. Deterministic (fixed
// reduction orders). ip[0] (the positions' chunk) is at most D: geometry refuses more (the scores are D
// floats). K and V rows 16-byte aligned (VEC) take uint4 loads, others the element-wise path: a compile-time
// choice, so the unrolled loops carry no branch between their loads. Each lane keeps up to 16 uint4 loads in
// flight (64 registers; at D 256 all of pass 1's, then all of pass 3's: two round trips to memory).
#define FAVD_THREADS 512
#define FAVD_WARPS (FAVD_THREADS / 32)

template <bool VEC> __device__ __forceinline__ uint4 favd_load8(const char *row, i64 d, i64 nb0) {
    if (VEC) return *(const uint4 *)(row + d * 2);
    return fav_load8(row, d, nb0, false);
}

template <int D, bool VEC> __device__ void fa_vec_direct_body(const kparams &p, float *smem) {
    constexpr int LK = D / 8 < 8 ? D / 8 : 8;          // lanes per position in the scores
    constexpr int CK = D / (8 * LK);                    // uint4 chunks of a K row per lane
    constexpr int PK = FAVD_THREADS / LK;               // positions per block step (scores)
    constexpr int LV = D / 8 < 32 ? D / 8 : 32;         // lanes per position in p . V (8 dims each)
    constexpr int PV = FAVD_THREADS / LV;               // positions per block step (p . V)
    constexpr int SK = (D + PK - 1) / PK;               // block steps covering D positions (scores)
    constexpr int SV = (D + PV - 1) / PV;               // and p . V
    constexpr int GK = 16 / CK < SK ? 16 / CK : SK;     // steps whose loads are in flight together: 16 uint4
    constexpr int GV = 16 < SV ? 16 : SV;               // a lane (64 registers)
    static_assert(D % (8 * LK) == 0 && LV * 8 == D, "fa_vec_direct: head size");
    const tdesc &O = p.t[0], &Q = p.t[1], &Kc = p.t[2], &V = p.t[3], &Mk = p.t[4];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const i64 H = Q.ne[1], T = Q.ne[2], nkv = min((i64)Kc.ne[2], (i64)p.ip[0]);   // nkv <= D (geometry)
    const i64 h = blockIdx.y, hk = h / (H / Kc.ne[1]);
    const i64 t = blockIdx.z % T, b = blockIdx.z / T;
    const bool has_mask = Mk.data != 0;
    const float scale = p.fp[0];

    float *sc = smem;                   // [D] scores, then p
    float *part = sc + D;               // [FAVD_WARPS][D] the warps' p . V
    float *red = part + FAVD_WARPS * D; // [32] block reductions

    const char *kbase = (const char *)Kc.data + hk * Kc.nb[1] + (b % Kc.ne[3]) * Kc.nb[3];
    const char *vbase = (const char *)V.data + hk * V.nb[1] + (b % V.ne[3]) * V.nb[3];
    // Q (F32) and O (F32) rows, and the mask row (F16 or F32: a flag, not load_f's switch per element): the
    // generic loads inlined at every unrolled use made the kernel's code 140 KB (65 KB for the path a
    // launch takes), far past what the SM's instruction caches hold; 37 KB without them.
    const char *qrow = row_ptr(Q, h, t, b);
    const char *mrow = has_mask ? (const char *)Mk.data + t * Mk.nb[1] + (h % Mk.ne[2]) * Mk.nb[2] +
                                      (b % Mk.ne[3]) * Mk.nb[3]
                                : nullptr;
    const bool m16 = Mk.type == GGML_F16;

    // V's lines are asked into L2 now, so pass 3 finds them there rather than a round trip to HBM after the
    // softmax (the KV cache of a layer is cold: a step streams all the weights through L2 between its uses).
    constexpr int VLINES = D * 2 > 128 ? D * 2 / 128 : 1;   // 128-byte lines of a V row
    if (VEC)
        for (i64 j = tid / VLINES; j < nkv; j += FAVD_THREADS / VLINES)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(vbase + j * V.nb[2] + (tid % VLINES) * 128));

    // 1. scores: lane group tid / LK takes positions tid / LK + PK * s; lane kl = tid % LK dims 8 (c LK + kl) + [0, 8)
    const int kl = tid % LK;
    float q[CK][8];
#pragma unroll
    for (int c = 0; c < CK; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) q[c][e] = *(const float *)(qrow + ((i64)(c * LK + kl) * 8 + e) * Q.nb[0]);
#pragma unroll
    for (int s0 = 0; s0 < SK; s0 += GK) {   // GK steps' K rows and mask values in flight at once
        uint4 kr[GK][CK];
        float mk[GK];
#pragma unroll
        for (int u = 0; u < GK; ++u) {
            const i64 j = tid / LK + (i64)PK * (s0 + u);
            const bool in = s0 + u < SK && j < nkv;
#pragma unroll
            for (int c = 0; c < CK; ++c)
                kr[u][c] = in ? favd_load8<VEC>(kbase + j * Kc.nb[2], (i64)(c * LK + kl) * 8, Kc.nb[0])
                              : make_uint4(0, 0, 0, 0);
            mk[u] = 0.0f;
            if (in && has_mask && kl == 0) {
                const char *ma = mrow + j * Mk.nb[0];
                mk[u] = m16 ? h2f(*(const unsigned short *)ma) : *(const float *)ma;
            }
        }
#pragma unroll
        for (int u = 0; u < GK; ++u) {
            const i64 j = tid / LK + (i64)PK * (s0 + u);
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < CK; ++c) {
                float kf[8];
                h8(kr[u][c], kf);
#pragma unroll
                for (int e = 0; e < 8; ++e) dot += q[c][e] * kf[e];
            }
#pragma unroll
            for (int off = LK / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (s0 + u < SK && j < nkv && kl == 0) sc[j] = mk[u] == F32_NEG_INF ? mk[u] : mk[u] + scale * dot;
        }
    }
    __syncthreads();

    // 2. the softmax's max and sum over the block
    float mx = F32_NEG_INF;
    for (i64 j = tid; j < nkv; j += FAVD_THREADS) mx = fmaxf(mx, sc[j]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (i64 j = tid; j < nkv; j += FAVD_THREADS) {
        const float x = sc[j];
        const float pj = (mx == F32_NEG_INF || x == F32_NEG_INF) ? 0.0f : expf(x - mx);
        sc[j] = pj;
        sum += pj;
    }
    const float L = block_sum(sum, red);
    __syncthreads();                    // every p_j written before pass 3 reads them

    // 3. p . V: lane group tid / LV takes positions tid / LV + PV * s; lane vl = tid % LV dims 8 vl + [0, 8)
    const int vl = tid % LV;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.0f;
#pragma unroll
    for (int s0 = 0; s0 < SV; s0 += GV) {   // GV steps' V rows in flight at once
        uint4 vr[GV];
#pragma unroll
        for (int u = 0; u < GV; ++u) {
            const i64 j = tid / LV + (i64)PV * (s0 + u);
            vr[u] = s0 + u < SV && j < nkv ? favd_load8<VEC>(vbase + j * V.nb[2], (i64)vl * 8, V.nb[0])
                                           : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GV; ++u) {
            const i64 j = tid / LV + (i64)PV * (s0 + u);
            const float pj = s0 + u < SV && j < nkv ? sc[j] : 0.0f;
            float vf[8];
            h8(vr[u], vf);
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] += pj * vf[e];
        }
    }
    // the position groups of a warp (LV < 32), then the warps in order
#pragma unroll
    for (int off = LV; off < 32; off <<= 1)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] += __shfl_xor_sync(0xffffffffu, o[e], off);
    if (lane < LV) {
        float4 *dst = (float4 *)(part + (i64)w * D + vl * 8);
        dst[0] = make_float4(o[0], o[1], o[2], o[3]);
        dst[1] = make_float4(o[4], o[5], o[6], o[7]);
    }
    __syncthreads();
    char *orow = (char *)row_ptr(O, h, t, b);
    for (int d = tid; d < D; d += FAVD_THREADS) {
        float acc = 0.0f;
#pragma unroll
        for (int q2 = 0; q2 < FAVD_WARPS; ++q2) acc += part[q2 * D + d];
        *(float *)(orow + d * O.nb[0]) = L > 0.0f ? acc / L : 0.0f;
    }
}

template <int D> __device__ void fa_vec_direct(const kparams &p, float *smem) {
    const tdesc &Kc = p.t[2], &V = p.t[3];
    const bool kvec = Kc.nb[0] == 2 && ((Kc.data | (u64)Kc.nb[1] | (u64)Kc.nb[2] | (u64)Kc.nb[3]) & 15) == 0;
    const bool vvec = V.nb[0] == 2 && ((V.data | (u64)V.nb[1] | (u64)V.nb[2] | (u64)V.nb[3]) & 15) == 0;
    if (kvec && vvec) fa_vec_direct_body<D, true>(p, smem);
    else fa_vec_direct_body<D, false>(p, smem);
}

// The launch geometry (graphdiag/backends/geometry.py) refuses params of another D or group.
#define FAV_ENTRY(D, GM)                                                                                   \
    {                                                                                                      \
        extern __shared__ __align__(16) float fav_smem[];                                                  \
        fa_vec<D, GM>(p, fav_smem);                                                                        \
    }
#define FAVD_ENTRY(D)                                                                                      \
    {                                                                                                      \
        extern __shared__ __align__(16) float favd_smem[];                                                 \
        fa_vec_direct<D>(p, favd_smem);                                                                    \
    }
KERNEL_LB(flash_attn_vec_direct_f16_d32, FAVD_THREADS, 1) FAVD_ENTRY(32)
KERNEL_LB(flash_attn_vec_direct_f16_d64, FAVD_THREADS, 1) FAVD_ENTRY(64)
KERNEL_LB(flash_attn_vec_direct_f16_d128, FAVD_THREADS, 1) FAVD_ENTRY(128)
KERNEL_LB(flash_attn_vec_direct_f16_d256, FAVD_THREADS, 1) FAVD_ENTRY(256)
KERNEL_LB(flash_attn_vec_f16_d32_g1, FAV_THREADS) FAV_ENTRY(32, 1)
KERNEL_LB(flash_attn_vec_f16_d32_g2, FAV_THREADS) FAV_ENTRY(32, 2)
KERNEL_LB(flash_attn_vec_f16_d32_g4, FAV_THREADS) FAV_ENTRY(32, 4)
KERNEL_LB(flash_attn_vec_f16_d32_g8, FAV_THREADS) FAV_ENTRY(32, 8)
KERNEL_LB(flash_attn_vec_f16_d64_g1, FAV_THREADS) FAV_ENTRY(64, 1)
KERNEL_LB(flash_attn_vec_f16_d64_g2, FAV_THREADS) FAV_ENTRY(64, 2)
KERNEL_LB(flash_attn_vec_f16_d64_g4, FAV_THREADS) FAV_ENTRY(64, 4)
KERNEL_LB(flash_attn_vec_f16_d64_g8, FAV_THREADS) FAV_ENTRY(64, 8)
KERNEL_LB(flash_attn_vec_f16_d128_g1, FAV_THREADS) FAV_ENTRY(128, 1)
KERNEL_LB(flash_attn_vec_f16_d128_g2, FAV_THREADS) FAV_ENTRY(128, 2)
KERNEL_LB(flash_attn_vec_f16_d128_g4, FAV_THREADS) FAV_ENTRY(128, 4)
KERNEL_LB(flash_attn_vec_f16_d128_g8, FAV_THREADS) FAV_ENTRY(128, 8)
KERNEL_LB(flash_attn_vec_f16_d256_g1, FAV_THREADS) FAV_ENTRY(256, 1)
KERNEL_LB(flash_attn_vec_f16_d256_g2, FAV_THREADS) FAV_ENTRY(256, 2)
KERNEL_LB(flash_attn_vec_f16_d256_g4, FAV_THREADS) FAV_ENTRY(256, 4)
KERNEL_LB(flash_attn_vec_f16_d256_g8, FAV_THREADS) FAV_ENTRY(256, 8)

KERNEL_LB(flash_attn_combine_f32, 256) {
    const tdesc &O = p.t[0], &P = p.t[1], &S = p.t[2];   // S: the sinks (gpt-oss), data 0 without
    const int h = blockIdx.x * blockDim.y + threadIdx.y, tb = blockIdx.y, Dv = (int)P.ne[0] - 2, ns = (int)P.ne[1],
              T = (int)O.ne[2];
    if (h >= P.ne[2]) return;
    const int t = tb % T, b = tb / T;
    const char *base = (const char *)P.data + h * P.nb[2] + tb * P.nb[3];
    const i64 snb = P.nb[1];
    // Splits in chunks of FAC_CHUNK: a chunk's m, l and o[d] are all loaded before any is used, one round trip
    // to memory per chunk (a loop that waited for the max before loading the rest made two, and ggml's
    // combine ran in 1.6 us against this one's 2.6 at a decode's 8 splits). The running max M rescales the
    // chunks before (as the partial kernels rescale their tiles); a decode's splits are one chunk, where M is
    // the max over all and the sums run in split order as before.
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float M = F32_NEG_INF, acc = 0.0f, L = 0.0f;
        for (int s0 = 0; s0 < ns; s0 += FAC_CHUNK) {
            float ms[FAC_CHUNK], ls[FAC_CHUNK], os[FAC_CHUNK];
#pragma unroll
            for (int u = 0; u < FAC_CHUNK; ++u) {
                const bool in = s0 + u < ns;
                const float *ps = (const float *)(base + (s0 + u) * snb);
                ms[u] = in ? ps[Dv] : F32_NEG_INF;
                ls[u] = in ? ps[Dv + 1] : 0.0f;
                os[u] = in ? ps[d] : 0.0f;
            }
            float Mc = M;
#pragma unroll
            for (int u = 0; u < FAC_CHUNK; ++u) Mc = fmaxf(Mc, ms[u]);
            if (Mc == F32_NEG_INF) continue;           // every split so far empty or fully masked
            const float rs = expf(M - Mc);             // 0 while M is -inf (acc and L are 0 then)
            acc *= rs;
            L *= rs;
#pragma unroll
            for (int u = 0; u < FAC_CHUNK; ++u) {
                if (ms[u] == F32_NEG_INF) continue;
                const float wgt = expf(ms[u] - Mc);
                L += ls[u] * wgt;
                acc += os[u] * wgt;
            }
            M = Mc;
        }
        if (S.data) {                                  // the head's sink joins the denominator only
            const float sk = load_f(S, h, 0, 0, 0), Mn = fmaxf(M, sk), rs = expf(M - Mn);
            acc *= rs;
            L = L * rs + expf(sk - Mn);
        }
        store_f(O, d, h, t, b, L > 0.0f ? acc / L : 0.0f);
    }
}

// ---- prefill: flash_attn_mma_f16_d{D} ----------------------------------------------------------------
// The partials on tensor cores (as ggml's fattn-mma-f16 serves batches): Q and
// P enter the products as F16, accumulation is F32. Grid (n_split, Hkv, ceil(G * T / 64) * B), 128 threads.
// A block owns kv head hk, 64 query rows of it (row r = t * G + g: the G heads sharing hk, token-major, so
// every K/V tile is loaded once for all of them) and the positions of split s, walked in tiles of 64: K and
// V tiles go to shared memory in two stages, the next tile's cp.async in flight while this one computes
// (Q staged there first, as F16, then held as mma fragments). Each warp owns 16
// rows: S = Q K^T by mma.m16n8k16 (16 x 64 per tile), + mask, online softmax in the accumulator layout
// (rows g and g + 8 of the quad, reduced over the 4 lanes of a quad), P rounded to F16 becomes the A fragment
// of O += P V (V read with ldmatrix.trans). A tile whose mask is -inf for all 16 rows of a warp is skipped
// (exp(-inf) = 0 adds nothing). m and l are those of the unrounded scores; an empty or fully masked split
// gives (0, -inf, 0).
#define FAM_ROWS 64
#define FAM_KV 64
#define F32_LOG2E 1.4426950408889634f
#define F32_LN2 0.6931471805599453f
#define FAM_THREADS 128

__device__ __forceinline__ unsigned fam_h2(float lo, float hi) { return pack_h2(f2h(lo), f2h(hi)); }

template <int D> __device__ void fa_mma(const kparams &p, unsigned short *smem) {
    constexpr int LD = D + 8;             // halves per shmem row (16-byte rows, conflict-free ldmatrix)
    constexpr int NT = FAM_KV / 8;        // n-tiles of S per kv tile
    constexpr int DT = D / 8;             // n-tiles of O
    constexpr int KS = D / 16;            // k-steps of S
    const tdesc &P = p.t[0], &Q = p.t[1], &Kc = p.t[2], &V = p.t[3], &Mk = p.t[4];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g4 = lane >> 2, tig = lane & 3;
    const i64 H = Q.ne[1], T = Q.ne[2], G = H / Kc.ne[1], nkv = Kc.ne[2], R = G * T;
    const i64 ntile = (R + FAM_ROWS - 1) / FAM_ROWS;
    const i64 hk = blockIdx.y, tile = blockIdx.z % ntile, b = blockIdx.z / ntile;
    const bool has_mask = Mk.data != 0;
    const float scale = p.fp[0];
    const i64 j0 = (i64)blockIdx.x * p.ip[0], j1 = min(j0 + (i64)p.ip[0], nkv);
    // two stages of (K tile, V tile); the Q rows are staged in stage 1's K tile first (QS: in their own
    // region after the stages, where they stay: at D = 256 Q's fragments in registers (64) next to O's (128)
    // spilled 768 bytes; read from shared memory per k-step they do not)
    constexpr bool QS = D >= 256;   // geometry.py FAM_Q_SMEM_MIN_D
    auto kst = [&](int st) { return smem + st * (2 * FAM_KV * LD); };   // stage st: K tile, then V tile
    unsigned short *const Qs = QS ? kst(2) : kst(1);
    unsigned short *Ks = Qs;

    // Q rows of the block as F16 into Ks's space, then each warp's 16 rows into A fragments
    for (int e = tid; e < FAM_ROWS * D; e += FAM_THREADS) {
        const int rr = e / D, d = e % D;
        const i64 r = tile * FAM_ROWS + rr;
        float v = 0.0f;
        if (r < R) v = load_f(Q, d, hk * G + r % G, r / G, b);
        Ks[rr * LD + d] = f2h(v);
    }
    __syncthreads();
    unsigned qf[QS ? 1 : KS][4];
    auto qfrag = [&](int ks, unsigned (&f)[4]) {
        ldmatrix_x4(f, &Qs[(w * 16 + (lane & 15)) * LD + ks * 16 + (lane >> 4) * 8]);
    };
    if (!QS) {
#pragma unroll
        for (int ks = 0; ks < (QS ? 1 : KS); ++ks) qfrag(ks, qf[ks]);
        __syncthreads();
    }

    // this thread's two rows (g4 and g4 + 8 of the warp's 16)
    i64 rt[2], rh[2];
    bool rok[2];
    const char *mrow[2];   // the mask row of each (its head and batch broadcast by modulo, once)
    const bool m16 = Mk.type == GGML_F16,
               mpair = m16 && Mk.nb[0] == 2 && ((Mk.data | (u64)Mk.nb[1] | (u64)Mk.nb[2] | (u64)Mk.nb[3]) & 3) == 0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const i64 r = tile * FAM_ROWS + w * 16 + g4 + 8 * k;
        rok[k] = r < R;
        rt[k] = rok[k] ? r / G : 0;
        rh[k] = rok[k] ? hk * G + r % G : 0;
        mrow[k] = has_mask ? (const char *)Mk.data + rt[k] * Mk.nb[1] + (rh[k] % Mk.ne[2]) * Mk.nb[2] +
                                 (b % Mk.ne[3]) * Mk.nb[3] : 0;
    }
    const i64 kb = b % Kc.ne[3], vb = b % V.ne[3];
    const bool kvec = Kc.nb[0] == 2 && ((Kc.data | (u64)Kc.nb[1] | (u64)Kc.nb[2] | (u64)Kc.nb[3]) & 15) == 0;
    const bool vvec = V.nb[0] == 2 && ((V.data | (u64)V.nb[1] | (u64)V.nb[2] | (u64)V.nb[3]) & 15) == 0;
    const char *kbase = (const char *)Kc.data + hk * Kc.nb[1] + kb * Kc.nb[3];
    const char *vbase = (const char *)V.data + hk * V.nb[1] + vb * V.nb[3];

    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) o[i][c] = 0.0f;
    float m[2] = {F32_NEG_INF, F32_NEG_INF}, l[2] = {0.0f, 0.0f};

    // K and V tile of positions [c0, c0 + 64) into stage st (positions past j1 are zero; their scores are
    // -inf): 16-byte cp.async (zero-filled past j1) when both caches are aligned, else loads through registers
    const bool async_kv = kvec && vvec;
    auto fetch = [&](i64 c0, int st) {
        for (int e = tid; e < FAM_KV * (D / 8); e += FAM_THREADS) {
            const int jj = e / (D / 8), d = (e % (D / 8)) * 8;
            const i64 j = c0 + jj;
            if (async_kv) {
                const bool in = j < j1;
                const char *kg = kbase + (in ? j : j0) * Kc.nb[2] + d * 2, *vg = vbase + (in ? j : j0) * V.nb[2] + d * 2;
                const int n = in ? 16 : 0;
                cp_async16(kst(st) + jj * LD + d, kg, n);
                cp_async16(kst(st) + (FAM_KV + jj) * LD + d, vg, n);
            } else {
                uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
                if (j < j1) {
                    kv = fav_load8(kbase + j * Kc.nb[2], d, Kc.nb[0], false);
                    vv = fav_load8(vbase + j * V.nb[2], d, V.nb[0], false);
                }
                *(uint4 *)(kst(st) + jj * LD + d) = kv;
                *(uint4 *)(kst(st) + (FAM_KV + jj) * LD + d) = vv;
            }
        }
        cp_async_commit();
    };
    // The mask of this thread's scores of the tile at c0: s[nt][c] at row g4 + 8 * (c >> 1), position
    // c0 + nt * 8 + 2 * tig + (c & 1), as pairs of F16 bits (-inf past j1 and in rows past R; 0 without a
    // mask). An aligned F16 mask (every graph's: an F16 input, or its cast under d99724f2) is read one tile
    // ahead, so its loads are in flight while the tile before computes (their latency was the kernel's main
    // stall: ncu); any other mask is read when its tile comes.
    constexpr unsigned NEG2 = 0xfc00fc00u;   // two F16 -inf
    const bool raw_mask = !has_mask || mpair;
    auto mask_at = [&](int k, i64 j) -> unsigned {   // raw_mask: the pair at positions j, j + 1 of row k
        if (!rok[k] || j >= j1) return NEG2;
        if (!has_mask) return j + 1 < j1 ? 0u : 0xfc000000u;
        if (j + 1 < j1) return *(const unsigned *)(mrow[k] + j * 2);
        return 0xfc000000u | *(const unsigned short *)(mrow[k] + j * 2);
    };
    unsigned mnext[NT][2];
    auto mask_tile = [&](i64 c0, unsigned (*dst)[2]) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int k = 0; k < 2; ++k) dst[nt][k] = mask_at(k, c0 + nt * 8 + 2 * tig);
    };
    // the F32 / unaligned mask at score (nt, c) of the tile at c0 (row g4 + 8 * (c >> 1), position
    // c0 + nt * 8 + 2 * tig + (c & 1)), at full precision; -inf past j1 and in rows past R
    auto mask_full = [&](i64 c0, int nt, int c) -> float {
        const int k = c >> 1;
        const i64 j = c0 + nt * 8 + 2 * tig + (c & 1);
        if (!rok[k] || j >= j1) return F32_NEG_INF;
        const char *a = mrow[k] + j * Mk.nb[0];
        return m16 ? h2f(*(const unsigned short *)a) : *(const float *)a;
    };
    if (raw_mask && j0 < j1) mask_tile(j0, mnext);
    // scores in log2 units (exp2 is one MUFU op, expf several ALU ops around it): s = mask * log2(e) +
    // scale * log2(e) * (q . k); m and the partial's m are in these units until stored (natural units)
    const float sl2 = scale * F32_LOG2E;

    if (j0 < j1) fetch(j0, 0);
    int stage = 0;
    for (i64 c0 = j0; c0 < j1; c0 += FAM_KV, stage ^= 1) {
        Ks = kst(stage);
        const unsigned short *Vs = Ks + FAM_KV * LD;
        // the next tile in flight while this one computes (its stage was released by the last barrier)
        if (c0 + FAM_KV < j1) fetch(c0 + FAM_KV, stage ^ 1);
        // the tile's mask stays packed (F16 pairs, 16 registers) until the scores need it: expanded to floats
        // before S = Q K^T it held 32 registers across the products, which at D = 256 (O alone is 128) spilled
        unsigned mcur[NT][2];
        bool live = false;
        if (raw_mask) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    mcur[nt][k] = mnext[nt][k];
                    live |= mcur[nt][k] != NEG2;
                }
            if (c0 + FAM_KV < j1) mask_tile(c0 + FAM_KV, mnext);
        } else {   // an F32 or unaligned mask: read here for `live`, again (the same values) for the scores
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) live |= mask_full(c0, nt, c) != F32_NEG_INF;
        }
        if (c0 + FAM_KV < j1) asm volatile("cp.async.wait_group 1;" ::: "memory");   // this tile's group
        else asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (__any_sync(0xffffffffu, live)) {
            // S = Q K^T
            float acc[NT][4];
            float (&s)[NT][4] = acc;   // the scores replace the products in place
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[nt][c] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                unsigned qk[4];
                if (QS) qfrag(ks, qk);
                const unsigned (&qa)[4] = QS ? qk : qf[QS ? 0 : ks];
#pragma unroll
                for (int n2 = 0; n2 < NT / 2; ++n2) {
                    unsigned r[4];
                    ldmatrix_x4(r, &Ks[(n2 * 16 + (lane & 7) + (lane >> 4) * 8) * LD + ks * 16 + ((lane >> 3) & 1) * 8]);
                    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                    mma_f16(acc[2 * n2], qa, b0);
                    mma_f16(acc[2 * n2 + 1], qa, b1);
                }
            }
            // scores (a masked one stays -inf: -inf + finite), online softmax per row (the quad's 4 lanes
            // hold a row's 64 positions)
            float mx[2] = {F32_NEG_INF, F32_NEG_INF};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const unsigned v = raw_mask ? mcur[nt][c >> 1] : 0u;
                    const float mk = raw_mask ? h2f((unsigned short)((c & 1) ? v >> 16 : v & 0xffffu)) : mask_full(c0, nt, c);
                    s[nt][c] = fmaf(sl2, acc[nt][c], mk * F32_LOG2E);
                    mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
                }
            float alpha[2], mb[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 1));
                mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], 2));
                const float mn = fmaxf(m[k], mx[k]);
                // exponents are taken from mb: mn, or 0 while the row has seen only -inf (then every s and
                // m is -inf, exp2 gives 0, and o and l stay 0 whatever alpha is)
                mb[k] = mn == F32_NEG_INF ? 0.0f : mn;
                alpha[k] = exp2f(m[k] - mb[k]);
                m[k] = mn;
            }
            float ls[2] = {0.0f, 0.0f};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float pj = exp2f(s[nt][c] - mb[c >> 1]);
                    s[nt][c] = pj;
                    ls[c >> 1] += pj;
                }
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                ls[k] += __shfl_xor_sync(0xffffffffu, ls[k], 1);
                ls[k] += __shfl_xor_sync(0xffffffffu, ls[k], 2);
                l[k] = l[k] * alpha[k] + ls[k];
            }
#pragma unroll
            for (int i = 0; i < DT; ++i) {
                o[i][0] *= alpha[0]; o[i][1] *= alpha[0];
                o[i][2] *= alpha[1]; o[i][3] *= alpha[1];
            }
            // O += P V: P's accumulator fragments of n-tiles 2kk, 2kk + 1 are the A fragment of k-step kk
#pragma unroll
            for (int kk = 0; kk < FAM_KV / 16; ++kk) {
                const unsigned a[4] = {fam_h2(s[2 * kk][0], s[2 * kk][1]), fam_h2(s[2 * kk][2], s[2 * kk][3]),
                                       fam_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]), fam_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int d2 = 0; d2 < DT / 2; ++d2) {
                    unsigned r[4];
                    ldmatrix_x4_trans(r, &Vs[(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + d2 * 16 + (lane >> 4) * 8]);
                    const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                    mma_f16(o[2 * d2], a, b0);
                    mma_f16(o[2 * d2 + 1], a, b1);
                }
            }
        }
        __syncthreads();   // Ks / Vs are rewritten by the next tile
    }

#pragma unroll
    for (int k = 0; k < 2; ++k) {
        if (!rok[k]) continue;
        const i64 tb = b * T + rt[k];
        float *out = (float *)((char *)P.data + blockIdx.x * P.nb[1] + rh[k] * P.nb[2] + tb * P.nb[3]);
#pragma unroll
        for (int i = 0; i < DT; ++i)
            *(float2 *)(out + i * 8 + 2 * tig) = make_float2(o[i][2 * k], o[i][2 * k + 1]);
        if (tig == 0) { out[D] = m[k] * F32_LN2; out[D + 1] = l[k]; }   // m back in natural units
    }
}

#define FAM_ENTRY(D)                                                                                       \
    {                                                                                                      \
        extern __shared__ __align__(16) unsigned short fam_smem[];                                         \
        fa_mma<D>(p, fam_smem);                                                                            \
    }
KERNEL_LB(flash_attn_mma_f16_d32, FAM_THREADS) FAM_ENTRY(32)
KERNEL_LB(flash_attn_mma_f16_d64, FAM_THREADS) FAM_ENTRY(64)
KERNEL_LB(flash_attn_mma_f16_d128, FAM_THREADS) FAM_ENTRY(128)
KERNEL_LB(flash_attn_mma_f16_d256, FAM_THREADS) FAM_ENTRY(256)
