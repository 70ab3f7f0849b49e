// quants.cuh: ggml's weight blocks for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
// MXFP4 (and BF16 rows), decoded one "unit" at a time: the 32 consecutive weights of a row that meet one Q8_1 block
// of x. Layouts are ggml's (ggml-common.h); the arithmetic is graphdiag's contract (graphdiag/backends/kernels.py, QUANT_DOC):
//
//   integer part  v[0..7]: the unit's 32 quants as unsigned bytes, 4 per int (element 4k + i in byte i of
//                 v[k]), before ggml's offsets (Q4_0 0..15, Q5_0/Q5_1 0..31, Q2_K 0..3, Q3_K 0..7, Q4_K
//                 0..15, Q5_K 0..31, Q6_K 0..63; Q4_1 0..15); the IQ4 types hold their levels (kvalues_iq4nl)
//                 as signed bytes instead, MXFP4 its (kvalues_mxfp4: the E2M1 values doubled). Dot products
//                 with Q8_1 quants are exact (dp4a).
//   float part    d, m (the block's or super-block's f16 scales as float) and the integer sub-block scales
//                 sc0, sc1 (Q4_K/Q5_K: 6-bit scale and min; Q6_K: the int8 scales of the two 16-halves;
//                 Q3_K: the 6-bit scales of the halves less 32; Q2_K: the halves' bytes, scale | min << 4;
//                 IQ4_XS: sc0 = its 6-bit sub-block scale - 32).
//
// Dequantised value of quant q (unit_f32, explicit _rn operations: no FMA contraction, so the numpy twin
// gives the same bits):
//   Q4_0 d*(q-8)   Q5_0 d*(q-16)   Q5_1 d*q + m   Q4_K/Q5_K (d*sc)*q - dmin*mn   Q6_K (d*sc)*(q-32)
//   Q4_1 d*q + m   IQ4_NL d*level   IQ4_XS (d*sc0)*level   MXFP4 d*level (d = 2^(e - 128): exact)
//   Q3_K (d*sc)*(q-4)   Q2_K (d*(sc&15))*q - dmin*(sc>>4)    (Q2_K, Q3_K, Q6_K: sc of the element's half)
// Unit . Q8_1 block (unit_q8; d8, s8 = the block's f16 d and d*sum; sx = integer sum of its quants):
//   Q4_0 d*(dot*d8 - 8*s8)   Q5_0 d*(dot*d8 - 16*s8)   Q5_1 d*d8*dot + m*s8
//   Q4_K/Q5_K d8*(d*(dot*sc) - dmin*(sx*mn))   Q6_K d*d8*(sc0*(dot_lo - 32 sx_lo) + sc1*(dot_hi - 32 sx_hi))
//   Q4_1 d*d8*dot + m*s8   IQ4_NL d*d8*dot   IQ4_XS d*d8*(dot*sc0)   MXFP4 d*d8*dot
//   Q3_K d*d8*(sc0*(dot_lo - 4 sx_lo) + sc1*(dot_hi - 4 sx_hi))
//   Q2_K d8*(d*(sc0&15 dot_lo + sc1&15 dot_hi) - dmin*(sc0>>4 sx_lo + sc1>>4 sx_hi))
// as ggml's vec_dot_*_q8_1 (vecdotq.cuh) combine them; the float order of the combination is ours.
#pragma once
#include "common.cuh"

#define GGML_Q4_0 2
#define GGML_Q5_0 6
#define GGML_Q5_1 7
#define GGML_Q2_K 10
#define GGML_Q3_K 11
#define GGML_Q4_K 12
#define GGML_Q5_K 13
#define GGML_Q6_K 14
#define GGML_BF16 30
#define GGML_Q4_1 3
#define GGML_IQ4_NL 20
#define GGML_IQ4_XS 23
#define GGML_MXFP4 39

// Bytes per block (units of 32 weights per block: 1, or 8 for the 256-weight super-blocks).
template <int T> struct qblock;
template <> struct qblock<GGML_Q4_0> { static constexpr int bytes = 18, units = 1; };
template <> struct qblock<GGML_Q5_0> { static constexpr int bytes = 22, units = 1; };
template <> struct qblock<GGML_Q5_1> { static constexpr int bytes = 24, units = 1; };
template <> struct qblock<GGML_Q2_K> { static constexpr int bytes = 84, units = 8; };
template <> struct qblock<GGML_Q3_K> { static constexpr int bytes = 110, units = 8; };
template <> struct qblock<GGML_Q4_K> { static constexpr int bytes = 144, units = 8; };
template <> struct qblock<GGML_Q5_K> { static constexpr int bytes = 176, units = 8; };
template <> struct qblock<GGML_Q6_K> { static constexpr int bytes = 210, units = 8; };
template <> struct qblock<GGML_BF16> { static constexpr int bytes = 64, units = 1; };   // 32 bf16 = one unit
template <> struct qblock<GGML_Q4_1> { static constexpr int bytes = 20, units = 1; };
template <> struct qblock<GGML_IQ4_NL> { static constexpr int bytes = 18, units = 1; };
template <> struct qblock<GGML_IQ4_XS> { static constexpr int bytes = 136, units = 8; };
template <> struct qblock<GGML_MXFP4> { static constexpr int bytes = 17, units = 1; };

// The IQ4 types' and MXFP4's quants are signed levels, not offsets from an unsigned range.
template <int T> struct qlevels {
    static constexpr bool value = T == GGML_IQ4_NL || T == GGML_IQ4_XS || T == GGML_MXFP4;
};

struct qunit {
    int v[8];
    float d, m;
    int sc0, sc1;
};

// Blocks are 2-byte aligned at best (Q4_0: 18 bytes): 32-bit words are read as two 16-bit halves, except
// where the layout guarantees 4 (Q2_K / Q4_K / Q5_K / IQ4_XS: 84- / 144- / 176- / 136-byte blocks, quants at
// offsets 16 / 16 / 48 / 8; Q3_K's 110-byte blocks are read in halves).
__device__ __forceinline__ unsigned ld16(const unsigned char *p) { return *(const unsigned short *)p; }
__device__ __forceinline__ int ld32h(const unsigned char *p) { return (int)(ld16(p) | (ld16(p + 2) << 16)); }
__device__ __forceinline__ int ld32(const unsigned char *p) { return *(const int *)p; }

// Q5's high bits: 4 bits of h to bit 4 of each byte.
__device__ __forceinline__ int spread4(unsigned h) {
    return (int)(((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25));
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const unsigned char *q, int &sc, int &mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__device__ __forceinline__ void decode_q4_0(const unsigned char *b, qunit &w) {
    w.d = h2f((unsigned short)ld16(b));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int q = ld32h(b + 2 + 4 * k);
        w.v[k] = q & 0x0F0F0F0F;
        w.v[k + 4] = (q >> 4) & 0x0F0F0F0F;
    }
}

// Q5_0 / Q5_1: quants at qs, high bits qh (bit j: element j).
__device__ __forceinline__ void decode_q5(const unsigned char *qs, unsigned qh, qunit &w) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int q = ld32h(qs + 4 * k);
        w.v[k] = (q & 0x0F0F0F0F) | spread4((qh >> (4 * k)) & 0xFu);
        w.v[k + 4] = ((q >> 4) & 0x0F0F0F0F) | spread4((qh >> (16 + 4 * k)) & 0xFu);
    }
}

// kvalues_iq4nl (ggml-common.h) as little-endian words, four levels a word: -127 -104 -83 -65 | -49 -35 -22 -10
// | 1 13 25 38 | 53 69 89 113.
#define IQ4_LEVELS_0 0xBFAD9881u
#define IQ4_LEVELS_1 0xF6EADDCFu
#define IQ4_LEVELS_2 0x26190D01u
#define IQ4_LEVELS_3 0x71594535u

// kvalues_mxfp4 (ggml-common.h: the E2M1 values doubled), four a word: 0 1 2 3 | 4 6 8 12 | 0 -1 -2 -3 |
// -4 -6 -8 -12.
#define MXFP4_LEVELS_0 0x03020100u
#define MXFP4_LEVELS_1 0x0C080604u
#define MXFP4_LEVELS_2 0xFDFEFF00u
#define MXFP4_LEVELS_3 0xF4F8FAFCu

// Four 4-bit indices (one in the low nibble of each byte of q) -> their four levels as signed bytes, from
// the 16 levels in words L0..L3. __byte_perm picks bytes by 3-bit selectors: the low and the high eight
// levels are looked up apart, then each byte's index bit 3 chooses between them.
__device__ __forceinline__ int nibble_levels(int q, unsigned L0, unsigned L1, unsigned L2, unsigned L3) {
    const unsigned u = (unsigned)q;
    const unsigned sel = (u & 0xFu) | ((u >> 4) & 0xF0u) | ((u >> 8) & 0xF00u) | ((u >> 12) & 0xF000u);
    const unsigned lo = __byte_perm(L0, L1, sel & 0x7777u);
    const unsigned hi = __byte_perm(L2, L3, sel & 0x7777u);
    return (int)__byte_perm(lo, hi, 0x3210u | ((sel & 0x8888u) >> 1));
}

__device__ __forceinline__ int iq4_levels(int q) {
    return nibble_levels(q, IQ4_LEVELS_0, IQ4_LEVELS_1, IQ4_LEVELS_2, IQ4_LEVELS_3);
}

// ggml_e8m0_to_fp32_half: 2^(e - 128), e < 2 as the subnormals 2^-128, 2^-127.
__device__ __forceinline__ float e8m0_half(unsigned e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// MXFP4's 17-byte blocks are byte-aligned: its 16 nibble bytes are read one by one; low nibbles are elements
// 0..15, high nibbles 16..31 (as every 4-bit 32-block of ggml), as kvalues_mxfp4 levels.
__device__ __forceinline__ void decode_mxfp4(const unsigned char *b, qunit &w) {
    w.d = e8m0_half(b[0]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned char *q = b + 1 + 4 * k;
        const int word = (int)(q[0] | (q[1] << 8) | (q[2] << 16) | ((unsigned)q[3] << 24));
        w.v[k] = nibble_levels(word & 0x0F0F0F0F, MXFP4_LEVELS_0, MXFP4_LEVELS_1, MXFP4_LEVELS_2, MXFP4_LEVELS_3);
        w.v[k + 4] = nibble_levels((word >> 4) & 0x0F0F0F0F, MXFP4_LEVELS_0, MXFP4_LEVELS_1, MXFP4_LEVELS_2,
                                   MXFP4_LEVELS_3);
    }
}

// 16 nibble bytes at qs -> the unit's 32 quants: low nibbles elements 0..15, high nibbles 16..31 (ggml's
// order in every 4-bit 32-block), as levels when `levels`.
__device__ __forceinline__ void decode_nibbles(const unsigned char *qs, bool aligned4, bool levels, qunit &w) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int q = aligned4 ? ld32(qs + 4 * k) : ld32h(qs + 4 * k);
        const int lo = q & 0x0F0F0F0F, hi = (q >> 4) & 0x0F0F0F0F;
        w.v[k] = levels ? iq4_levels(lo) : lo;
        w.v[k + 4] = levels ? iq4_levels(hi) : hi;
    }
}

// Q3_K's 6-bit scale i (0..15) from its 12 packed bytes: the low nibble in byte i (i < 8) or the high one of
// byte i - 8, the top 2 bits in byte 8 + i % 4 at bit 2 (i / 4); less ggml's 32.
__device__ __forceinline__ int scale_q3k(int i, const unsigned char *s) {
    const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
    return (lo | (((s[8 + (i & 3)] >> (2 * (i >> 2))) & 3) << 4)) - 32;
}

// Q2_K / Q3_K unit j: 2 bits of the 32 bytes qs[32 (j / 4) ...] at shift 2 (j % 4); Q3_K adds bit j of the 32
// hmask bytes as bit 2 (set: the quant is not lowered by 4).
template <int T> __device__ __forceinline__ void decode_q23k(const unsigned char *b, int j, qunit &w) {
    const int shift = 2 * (j & 3);
    if (T == GGML_Q2_K) {
        const unsigned char *qs = b + 16 + 32 * (j >> 2);
        w.d = h2f((unsigned short)ld16(b + 80));
        w.m = h2f((unsigned short)ld16(b + 82));
        w.sc0 = b[2 * j];
        w.sc1 = b[2 * j + 1];
#pragma unroll
        for (int k = 0; k < 8; ++k) w.v[k] = (ld32(qs + 4 * k) >> shift) & 0x03030303;
    } else {
        const unsigned char *qs = b + 32 + 32 * (j >> 2);
        w.d = h2f((unsigned short)ld16(b + 108));
        w.sc0 = scale_q3k(2 * j, b + 96);
        w.sc1 = scale_q3k(2 * j + 1, b + 96);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w.v[k] = ((ld32h(qs + 4 * k) >> shift) & 0x03030303) | (((ld32h(b + 4 * k) >> j) & 0x01010101) << 2);
    }
}

// Unit u of a row (u = block * units + sub-block).
template <int T> __device__ __forceinline__ void decode(const unsigned char *row, i64 u, qunit &w) {
    const int j = (int)(u % qblock<T>::units);
    const unsigned char *b = row + (u / qblock<T>::units) * qblock<T>::bytes;
    w.m = 0.0f;
    w.sc0 = w.sc1 = 0;
    if (T == GGML_Q4_0) {
        decode_q4_0(b, w);
    } else if (T == GGML_Q5_0) {
        w.d = h2f((unsigned short)ld16(b));
        decode_q5(b + 6, (unsigned)ld32h(b + 2), w);
    } else if (T == GGML_Q5_1) {
        w.d = h2f((unsigned short)ld16(b));
        w.m = h2f((unsigned short)ld16(b + 2));
        decode_q5(b + 8, (unsigned)ld32h(b + 4), w);
    } else if (T == GGML_Q4_K || T == GGML_Q5_K) {
        w.d = h2f((unsigned short)ld16(b));
        w.m = h2f((unsigned short)ld16(b + 2));
        scale_min_k4(j, b + 4, w.sc0, w.sc1);
        const unsigned char *qs = b + (T == GGML_Q4_K ? 16 : 48) + 32 * (j >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int q = (ld32(qs + 4 * k) >> (4 * (j & 1))) & 0x0F0F0F0F;
            if (T == GGML_Q5_K) q |= ((ld32(b + 16 + 4 * k) >> j) & 0x01010101) << 4;
            w.v[k] = q;
        }
    } else if (T == GGML_Q4_1) {
        w.d = h2f((unsigned short)ld16(b));
        w.m = h2f((unsigned short)ld16(b + 2));
        decode_nibbles(b + 4, false, false, w);
    } else if (T == GGML_IQ4_NL) {
        w.d = h2f((unsigned short)ld16(b));
        decode_nibbles(b + 2, false, true, w);
    } else if (T == GGML_MXFP4) {
        decode_mxfp4(b, w);
    } else if (T == GGML_IQ4_XS) {   // 136-byte blocks: the quants at 8 + 16 j are 4-byte aligned
        w.d = h2f((unsigned short)ld16(b));
        const unsigned sh = ld16(b + 2);
        const int ls = ((b[4 + (j >> 1)] >> (4 * (j & 1))) & 0xF) | (((sh >> (2 * j)) & 3u) << 4);
        w.sc0 = ls - 32;
        decode_nibbles(b + 8 + 16 * j, true, true, w);
    } else if (T == GGML_Q2_K || T == GGML_Q3_K) {
        decode_q23k<T>(b, j, w);
    } else if (T == GGML_Q6_K) {
        const int n = j >> 2, g = j & 3;
        const unsigned char *ql = b + 64 * n + 32 * (g & 1), *qh = b + 128 + 32 * n;
        const signed char *sc = (const signed char *)(b + 192) + 8 * n + 2 * g;
        w.d = h2f((unsigned short)ld16(b + 208));
        w.sc0 = sc[0];
        w.sc1 = sc[1];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w.v[k] = ((ld32h(ql + 4 * k) >> (4 * (g >> 1))) & 0x0F0F0F0F) |
                     (((ld32h(qh + 4 * k) >> (2 * g)) & 0x03030303) << 4);
    }
}

__device__ __forceinline__ int dp4a_s(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The unit against one Q8_1 block xb (36 bytes: f16 d, f16 d*sum, 32 int8; 4-byte aligned in pool scratch).
template <int T> __device__ __forceinline__ float unit_q8(const qunit &w, const char *xb) {
    const float d8 = h2f(*(const unsigned short *)xb), s8 = h2f(*(const unsigned short *)(xb + 2));
    const int *x = (const int *)(xb + 4);
    int lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        lo = dp4a_s(w.v[k], x[k], lo);
        hi = dp4a_s(w.v[k + 4], x[k + 4], hi);
    }
    if (T == GGML_Q4_0) return w.d * ((float)(lo + hi) * d8 - 8.0f * s8);
    if (T == GGML_Q5_0) return w.d * ((float)(lo + hi) * d8 - 16.0f * s8);
    if (T == GGML_Q5_1 || T == GGML_Q4_1) return w.d * d8 * (float)(lo + hi) + w.m * s8;
    if (T == GGML_IQ4_NL || T == GGML_MXFP4) return w.d * d8 * (float)(lo + hi);
    if (T == GGML_IQ4_XS) return w.d * d8 * (float)((lo + hi) * w.sc0);
    int slo = 0, shi = 0;   // integer sums of x's quants (ggml: dp4a with 0x01010101)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        slo = dp4a_s(0x01010101, x[k], slo);
        shi = dp4a_s(0x01010101, x[k + 4], shi);
    }
    if (T == GGML_Q6_K) return w.d * d8 * (float)(w.sc0 * (lo - 32 * slo) + w.sc1 * (hi - 32 * shi));
    if (T == GGML_Q3_K) return w.d * d8 * (float)(w.sc0 * (lo - 4 * slo) + w.sc1 * (hi - 4 * shi));
    if (T == GGML_Q2_K)
        return d8 * (w.d * (float)((w.sc0 & 15) * lo + (w.sc1 & 15) * hi) -
                     w.m * (float)((w.sc0 >> 4) * slo + (w.sc1 >> 4) * shi));
    return d8 * (w.d * (float)((lo + hi) * w.sc0) - w.m * (float)((slo + shi) * w.sc1));
}

// The unit's 32 weights as float (element i of the unit in y[i]).
template <int T> __device__ __forceinline__ void unit_f32(const unsigned char *row, i64 u, float *y) {
    if (T == GGML_BF16) {
        const unsigned char *b = row + u * 64;
#pragma unroll
        for (int i = 0; i < 32; ++i) y[i] = __uint_as_float(ld16(b + 2 * i) << 16);
        return;
    }
    qunit w;
    decode<T>(row, u, w);
    float a = w.d, c = 0.0f, a2 = w.d, c2 = 0.0f;
    if (T == GGML_Q4_K || T == GGML_Q5_K) {
        a = __fmul_rn(w.d, (float)w.sc0);
        c = __fmul_rn(w.m, (float)w.sc1);
    } else if (T == GGML_IQ4_XS) {
        a = __fmul_rn(w.d, (float)w.sc0);
    } else if (T == GGML_Q6_K || T == GGML_Q3_K) {
        a = __fmul_rn(w.d, (float)w.sc0);
        a2 = __fmul_rn(w.d, (float)w.sc1);
    } else if (T == GGML_Q2_K) {
        a = __fmul_rn(w.d, (float)(w.sc0 & 15));
        a2 = __fmul_rn(w.d, (float)(w.sc1 & 15));
        c = __fmul_rn(w.m, (float)(w.sc0 >> 4));
        c2 = __fmul_rn(w.m, (float)(w.sc1 >> 4));
    }
    const int off = T == GGML_Q4_0 ? 8 : T == GGML_Q5_0 ? 16 : T == GGML_Q6_K ? 32 : T == GGML_Q3_K ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        const int byte = w.v[i >> 2] >> (8 * (i & 3));
        const float q = qlevels<T>::value ? (float)(signed char)byte : (float)((byte & 0xFF) - off);
        if (T == GGML_Q5_1 || T == GGML_Q4_1) y[i] = __fadd_rn(__fmul_rn(w.d, q), w.m);
        else if (T == GGML_Q4_K || T == GGML_Q5_K) y[i] = __fsub_rn(__fmul_rn(a, q), c);
        else if (T == GGML_Q6_K || T == GGML_Q3_K) y[i] = __fmul_rn(i < 16 ? a : a2, q);
        else if (T == GGML_Q2_K) y[i] = __fsub_rn(__fmul_rn(i < 16 ? a : a2, q), i < 16 ? c : c2);
        else y[i] = __fmul_rn(a, q);
    }
}
