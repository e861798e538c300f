/* kernels_avx512.c — the AVX-512 primitives of kernels.h: widening a span
 * of a weight row to f32 (bf16: a shift; f16: vcvtph2ps; q8_0 and q4_0
 * dequantized a 32-element block at a time, exactly as dtype.c does, since
 * d·q and (q-8)·d fit in an f32 mantissa), and kernels_isa.h's micro-kernel
 * and row-dot at 16 lanes; then the avx512bf16 level: the same plus the
 * bf16-pair micro-kernel and row-dot on VDPBF16PS. The functions carry the
 * target attribute (no global -march), so one binary runs on every x86-64. */
#include "cpu/kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/transpose16.h"

#define ISA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VL 16
#define VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define VSET1(x) ((vf)_mm512_set1_ps(x))
#define HSUM(v) _mm512_reduce_add_ps((__m512)(v))
/* 12 rows × 32 columns (24 of the 32 zmm registers) when N > 16, else
 * 16 × 16 (measured best with the forward's former kernels) */
#define MR_W 12
#define NV_W 2
#define MR_N 16
#define NV_N 1
#define ISA_NAME "avx512"
#define ISA_TABLE ft_kernels_avx512

#define LOCAL static inline __attribute__((always_inline)) ISA_TARGET

LOCAL __m512 bf16_vec(const uint16_t *h) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

LOCAL __m512 f16_vec(const uint16_t *h) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)); }

LOCAL void q8_0_block(float *dst, const ft_block_q8_0 *b) {
    __m512 d = _mm512_set1_ps(ft_f16_to_f32(b->d));
    __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    _mm512_storeu_ps(dst, _mm512_mul_ps(lo, d));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(hi, d));
}

/* (q-8)·d as one fma q·d + (-8d): exact, the result fits in 24 bits */
LOCAL void q4_0_block(float *dst, const ft_block_q4_0 *b) {
    float dh = ft_f16_to_f32(b->d);
    __m512 d = _mm512_set1_ps(dh), m8d = _mm512_set1_ps(-8.0f * dh);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m8d));
    _mm512_storeu_ps(dst + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m8d));
}

/* nf4: the 16-entry code is one register, so a lookup is one vpermps;
 * code[q]·absmax is the one f32 product dtype.c computes: exact */
LOCAL void nf4_block(float *dst, const ft_block_nf4 *b) {
    const __m512 code = _mm512_loadu_ps(ft_nf4_code), d = _mm512_set1_ps(b->d);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * h));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4), lo = _mm_and_si128(q, m4);
        /* element 2j is byte j's high nibble, 2j+1 its low one */
        __m128i i0 = _mm_unpacklo_epi8(hi, lo), i1 = _mm_unpackhi_epi8(hi, lo);
        __m512 v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i0), code);
        __m512 v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(i1), code);
        _mm512_storeu_ps(dst + 32 * h, _mm512_mul_ps(v0, d));
        _mm512_storeu_ps(dst + 32 * h + 16, _mm512_mul_ps(v1, d));
    }
}

/* int8 rows: q·absmax·(1/127) as two products, left to right, as dtype.c */
LOCAL __m512 i8_vec(const int8_t *q, float a) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(a)), _mm512_set1_ps(FT_I8ROW_INV127));
}

/* ggml's other blocks, dequantized as dtype_ggml.c does: the same f32
 * products and sums in the same order (a product, then the add or
 * subtract; no fused multiply-add), so every value is the reference's bit
 * for bit; tested against it in test_kernels on random blocks. */
#define ISA_GGML_BLOCKS 1

/* 16 bytes at p as 16 int32 lanes */
LOCAL __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
LOCAL __m512 qv(__m512i q) { return _mm512_cvtepi32_ps(q); }
/* lanes 0..15 */
LOCAL __m512i lane_ids(void) { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
/* bits [s, s+16) of u, one a lane, in place 4 (the fifth bit of q5 codes) */
LOCAL __m512i bit4_of(uint32_t u, int s) {
    __m512i v = _mm512_srlv_epi32(_mm512_set1_epi32((int)(u >> s)), lane_ids());
    return _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(1)), 4);
}

LOCAL void q4_1_block(float *dst, const ft_block_q4_1 *b) {
    __m512 d = _mm512_set1_ps(ft_f16_to_f32(b->d)), m = _mm512_set1_ps(ft_f16_to_f32(b->m));
    __m512i q = u8x16(b->qs);
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_mul_ps(d, qv(lo)), m));
    _mm512_storeu_ps(dst + 16, _mm512_add_ps(_mm512_mul_ps(d, qv(hi)), m));
}

LOCAL void q5_0_block(float *dst, const ft_block_q5_0 *b) {
    __m512 d = _mm512_set1_ps(ft_f16_to_f32(b->d));
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    __m512i q = u8x16(b->qs), s16 = _mm512_set1_epi32(16);
    __m512i lo = _mm512_or_si512(_mm512_and_si512(q, _mm512_set1_epi32(15)), bit4_of(qh, 0));
    __m512i hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), bit4_of(qh, 16));
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, qv(_mm512_sub_epi32(lo, s16))));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, qv(_mm512_sub_epi32(hi, s16))));
}

LOCAL void q5_1_block(float *dst, const ft_block_q5_1 *b) {
    __m512 d = _mm512_set1_ps(ft_f16_to_f32(b->d)), m = _mm512_set1_ps(ft_f16_to_f32(b->m));
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    __m512i q = u8x16(b->qs);
    __m512i lo = _mm512_or_si512(_mm512_and_si512(q, _mm512_set1_epi32(15)), bit4_of(qh, 0));
    __m512i hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), bit4_of(qh, 16));
    _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_mul_ps(d, qv(lo)), m));
    _mm512_storeu_ps(dst + 16, _mm512_add_ps(_mm512_mul_ps(d, qv(hi)), m));
}

LOCAL void iq4_nl_block(float *dst, const ft_block_iq4_nl *b) {
    const __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)ft_iq4nl_code)));
    __m512 d = _mm512_set1_ps(ft_f16_to_f32(b->d));
    __m512i q = u8x16(b->qs);
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    _mm512_storeu_ps(dst, _mm512_mul_ps(d, _mm512_permutexvar_ps(lo, code)));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(d, _mm512_permutexvar_ps(hi, code)));
}

/* d·q - m over 16 values */
LOCAL void store_dqm(float *dst, __m512i q, float d, float m) {
    _mm512_storeu_ps(dst, _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d), qv(q)), _mm512_set1_ps(m)));
}

LOCAL void q4_K_block(float *y, const ft_block_q4_K *b) {
    float d = ft_f16_to_f32(b->d), dmin = ft_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    const __m512i m4 = _mm512_set1_epi32(15);
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
        uint8_t sc, mn;
        ft_k4_scale_min(j, b->scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int h = 0; h < 32; h += 16) {
            __m512i v = u8x16(q + h);
            store_dqm(y + h, _mm512_and_si512(v, m4), d1, m1);
            store_dqm(y + 32 + h, _mm512_srli_epi32(v, 4), d2, m2);
        }
    }
}

LOCAL void q5_K_block(float *y, const ft_block_q5_K *b) {
    float d = ft_f16_to_f32(b->d), dmin = ft_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    const __m512i m4 = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
        uint8_t sc, mn;
        ft_k4_scale_min(j, b->scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int h = 0; h < 32; h += 16) {
            __m512i v = u8x16(q + h), qh = u8x16(b->qh + h);
            __m512i h1 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, j), one), 4);
            __m512i h2 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, j + 1), one), 4);
            store_dqm(y + h, _mm512_or_si512(_mm512_and_si512(v, m4), h1), d1, m1);
            store_dqm(y + 32 + h, _mm512_or_si512(_mm512_srli_epi32(v, 4), h2), d2, m2);
        }
    }
}

LOCAL void q6_K_block(float *y, const ft_block_q6_K *b) {
    float d = ft_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    const __m512i m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3), s32 = _mm512_set1_epi32(32);
    for (int n = 0; n < FT_QK_K; n += 128, ql += 64, qh += 32, sc += 8, y += 128)
        for (int l = 0; l < 32; l += 16) {
            int is = l / 16;
            __m512i a = u8x16(ql + l), c = u8x16(ql + l + 32), h = u8x16(qh + l);
            __m512i q1 = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_slli_epi32(_mm512_and_si512(h, m2), 4));
            __m512i q2 = _mm512_or_si512(_mm512_and_si512(c, m4),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), m2), 4));
            __m512i q3 = _mm512_or_si512(_mm512_srli_epi32(a, 4),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4), m2), 4));
            __m512i q4 = _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(h, 6), 4));
            _mm512_storeu_ps(y + l, _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[is]), qv(_mm512_sub_epi32(q1, s32))));
            _mm512_storeu_ps(y + l + 32, _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[is + 2]), qv(_mm512_sub_epi32(q2, s32))));
            _mm512_storeu_ps(y + l + 64, _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[is + 4]), qv(_mm512_sub_epi32(q3, s32))));
            _mm512_storeu_ps(y + l + 96, _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[is + 6]), qv(_mm512_sub_epi32(q4, s32))));
        }
}

LOCAL void iq4_xs_block(float *y, const ft_block_iq4_xs *b) {
    const __m512 code = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)ft_iq4nl_code)));
    float d = ft_f16_to_f32(b->d);
    const uint8_t *qs = b->qs;
    for (int ib = 0; ib < FT_QK_K / 32; ib++, qs += 16, y += 32) {
        int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | ((b->scales_h >> 2 * ib) & 3) << 4;
        __m512 dl = _mm512_set1_ps(d * (float)(ls - 32));
        __m512i q = u8x16(qs);
        __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
        _mm512_storeu_ps(y, _mm512_mul_ps(dl, _mm512_permutexvar_ps(lo, code)));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(dl, _mm512_permutexvar_ps(hi, code)));
    }
}

/* store_t (kernels.h): 16 × 16 blocks of cb through a register transpose,
 * each column of the block one masked store into a contiguous row of C;
 * alpha·c, then the add, as store and the driver's scalar loop compute them:
 * the same bits. */
ISA_TARGET static void store_t(float *C, int64_t ldc, const float *cb, int nr, int rows, int cols, float alpha,
                               bool overwrite) {
    const __m512 al = _mm512_set1_ps(alpha);
    for (int r0 = 0; r0 < rows; r0 += 16) {
        int rr = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 rm = (__mmask16)(rr == 16 ? 0xFFFF : (1u << rr) - 1);
        for (int l0 = 0; l0 < cols; l0 += 16) {
            int cc = cols - l0 < 16 ? cols - l0 : 16;
            const __mmask16 cm = (__mmask16)(cc == 16 ? 0xFFFF : (1u << cc) - 1);
            __m512i v[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                v[i] = i < rr ? _mm512_maskz_loadu_epi32(cm, cb + (size_t)(r0 + i) * nr + l0) : _mm512_setzero_si512();
            ft_transpose16(v); /* v[j] lane i: cb row r0 + i, column l0 + j */
            for (int j = 0; j < cc; j++) {
                float *d = C + (int64_t)(l0 + j) * ldc + r0;
                __m512 x = _mm512_mul_ps(al, _mm512_castsi512_ps(v[j]));
                if (!overwrite) x = _mm512_add_ps(_mm512_maskz_loadu_ps(rm, d), x);
                _mm512_mask_storeu_ps(d, rm, x);
            }
        }
    }
}
#define ISA_STORE_T store_t

#include "cpu/kernels_isa.h"

/* ------------------------------------------------ avx512bf16: VDPBF16PS */

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
#define LOCAL16 static inline __attribute__((always_inline)) BF16_TARGET
/* 12 rows × 32 columns when N > 16, else 16 × 16, as for f32 (24 and 16
 * accumulators hide the latency; the B loads and A broadcasts fit beside) */
#define MR16_W 12
#define NV16_W 2
#define MR16_N 16
#define NV16_N 1

/* cb (MR, 16·NV) (+)= ap · bp: per pair of k a broadcast word of A (two
 * bf16) against NV vectors of B's pair row, each lane summing both products */
LOCAL16 void tile16_body(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add,
                         const int MR, const int NV) {
    const int NR = 16 * NV;
    __m512 acc[16][2];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) acc[r][j] = add ? _mm512_loadu_ps(cb + r * NR + 16 * j) : _mm512_setzero_ps();
    for (int p = 0; p < kp; p++) {
        __m512bh b[2];
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) b[j] = (__m512bh)_mm512_loadu_si512(bp + (size_t)p * NR + 16 * j);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[r * lda + p]);
#pragma GCC unroll 2
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, b[j]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) _mm512_storeu_ps(cb + r * NR + 16 * j, acc[r][j]);
}

/* the driver's panels are rows FT_GEMM_KC/2 words apart: constant offsets, as in kernels_isa.h */
BF16_TARGET static void tile16_wide(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add) {
    if (lda == FT_GEMM_KC / 2) tile16_body(cb, bp, ap, FT_GEMM_KC / 2, kp, add, MR16_W, NV16_W);
    else tile16_body(cb, bp, ap, lda, kp, add, MR16_W, NV16_W);
}
BF16_TARGET static void tile16_narrow(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp,
                                      bool add) {
    if (lda == FT_GEMM_KC / 2) tile16_body(cb, bp, ap, FT_GEMM_KC / 2, kp, add, MR16_N, NV16_N);
    else tile16_body(cb, bp, ap, lda, kp, add, MR16_N, NV16_N);
}

/* out[r] = row r · x for r < NRW: 32 bf16 of each row per VDPBF16PS
 * straight from memory (decode reads each weight once: no packing), two
 * accumulators per row; the ragged end through masked loads. */
LOCAL16 void dot16_body(float *out, const uint32_t *x, const uint8_t *w, size_t rb, int K, const int NRW) {
    const uint16_t *xh = (const uint16_t *)x;
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(xh + k), x1 = (__m512bh)_mm512_loadu_si512(xh + k + 32);
#pragma GCC unroll 4
        for (int r = 0; r < NRW; r++) {
            const uint16_t *h = (const uint16_t *)(w + r * rb) + k;
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_loadu_si512(h), x0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)_mm512_loadu_si512(h + 32), x1);
        }
    }
    for (; k < K; k += 32) {
        int n = K - k < 32 ? K - k : 32;
        __mmask32 m = n == 32 ? ~(__mmask32)0 : ((__mmask32)1 << n) - 1;
        __m512bh x0 = (__m512bh)_mm512_maskz_loadu_epi16(m, xh + k);
#pragma GCC unroll 4
        for (int r = 0; r < NRW; r++) {
            const uint16_t *h = (const uint16_t *)(w + r * rb) + k;
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_maskz_loadu_epi16(m, h), x0);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

BF16_TARGET static void dot_rows16(float *out, const uint32_t *x, const uint8_t *w, size_t rb, int K, int nrows) {
    if (nrows == 4) {
        dot16_body(out, x, w, rb, K, 4);
        return;
    }
    for (int r = 0; r < nrows; r++) dot16_body(out + r, x, w + r * rb, rb, K, 1);
}

/* ft_f32_to_bf16 on 16 lanes, each result in its lane's low half: add
 * 0x7FFF plus the kept lsb, keep the top half; a NaN keeps its payload's
 * top bits and is made quiet */
LOCAL16 __m512i bf16_round16(__m512 x) {
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    __m512i u = _mm512_castps_si512(x);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* Whether any of x's lanes is subnormal (exponent 0, mantissa not 0).
 * VCVTNEPS2BF16 rounds as bf16_round16 does (RNE, NaN quieted as
 * ft_f32_to_bf16 does) except that it reads subnormal inputs as zero: the
 * conversions below use it for vectors without them (nearly all: a
 * subnormal activation is below 1.2e-38) and bf16_round16 for the rest. */
LOCAL16 bool any_subnormal(__m512 x) {
    __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
    return _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(a, a), a, _mm512_set1_epi32(0x00800000)) != 0;
}

BF16_TARGET static void to_bf16(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(src + i);
        __m256i h = any_subnormal(x) ? _mm512_cvtepi32_epi16(bf16_round16(x)) : (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = ft_f32_to_bf16(src[i]);
}

/* dst[l] = lo[l] | hi[l] << 16: two rows of bf16 (k and k+1) as pair words */
BF16_TARGET static void pair_rows16(uint32_t *dst, const uint16_t *lo, const uint16_t *hi, int n) {
    int l = 0;
    for (; l + 16 <= n; l += 16) {
        __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(lo + l)));
        __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(hi + l)));
        _mm512_storeu_si512(dst + l, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
    for (; l < n; l++) dst[l] = (uint32_t)lo[l] | (uint32_t)hi[l] << 16;
}

/* The same from two f32 rows, each rounded to bf16 as to_bf16 does; hi
 * NULL: zeros (an odd K's last pair) */
BF16_TARGET static void pair_rows16_f32(uint32_t *dst, const float *lo, const float *hi, int n) {
    int l = 0;
    /* word i: bf16 i of the conversion (lo) low, bf16 16 + i (hi) high */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (; l + 16 <= n; l += 16) {
        __m512 x = _mm512_loadu_ps(lo + l), y = hi ? _mm512_loadu_ps(hi + l) : _mm512_setzero_ps();
        if (!any_subnormal(x) && !any_subnormal(y)) {
            _mm512_storeu_si512(dst + l, _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(y, x)));
            continue;
        }
        __m512i a = bf16_round16(x), b = bf16_round16(y);
        _mm512_storeu_si512(dst + l, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
    for (; l < n; l++) dst[l] = (uint32_t)ft_f32_to_bf16(lo[l]) | (hi ? (uint32_t)ft_f32_to_bf16(hi[l]) << 16 : 0);
}

/* A strip of B from 16 columns' pair words: column j's kp words at src +
 * j·ld (j < ncols; later columns zero) to dst[p·nr + j], p < kp: 16 pairs
 * a register transpose at a time */
BF16_TARGET static void pack_cols16(uint32_t *dst, int nr, const uint32_t *src, int ld, int ncols, int kp) {
    for (int p0 = 0; p0 < kp; p0 += 16) {
        int np = kp - p0 < 16 ? kp - p0 : 16;
        const __mmask16 pm = np >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << np) - 1);
        __m512i v[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++)
            v[j] = j < ncols ? _mm512_maskz_loadu_epi32(pm, src + (size_t)j * ld + p0) : _mm512_setzero_si512();
        ft_transpose16(v); /* v[i]: pair p0 + i of the 16 columns */
        for (int i = 0; i < np; i++) _mm512_storeu_si512(dst + (size_t)(p0 + i) * nr, v[i]);
    }
}

/* An A panel stored k-major (element (m, k) at src[k·cs + m]): rows r <
 * rows of wp (rows ld words apart) get the pairs of k in [0, kc), rounded
 * to bf16 (an odd kc's last pair padded with a zero); 16 pairs × 16 rows a
 * register transpose at a time. rows <= 16. */
BF16_TARGET static void pack_at16(uint32_t *wp, int64_t ld, const float *src, int64_t cs, int rows, int kc) {
    const __mmask16 m = rows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
    int kp = (kc + 1) / 2;
    for (int p0 = 0; p0 < kp; p0 += 16) {
        int np = kp - p0 < 16 ? kp - p0 : 16;
        __m512i v[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            int k = 2 * (p0 + j);
            if (j >= np) {
                v[j] = _mm512_setzero_si512();
                continue;
            }
            __m512i lo = bf16_round16(_mm512_maskz_loadu_ps(m, src + (int64_t)k * cs));
            __m512i hi = k + 1 < kc ? bf16_round16(_mm512_maskz_loadu_ps(m, src + (int64_t)(k + 1) * cs))
                                    : _mm512_setzero_si512();
            v[j] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(hi, 16));
        }
        ft_transpose16(v); /* v[r] lane j: row r's pair p0 + j */
        const __mmask16 pm = np >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << np) - 1);
        for (int r = 0; r < rows; r++) _mm512_mask_storeu_epi32(wp + (int64_t)r * ld + p0, pm, v[r]);
    }
}

const ft_kernel_isa ft_kernels_avx512bf16 = {
    .name = "avx512bf16",
    .mr = { MR_W, MR_N },
    .nr = { VL * NV_W, VL * NV_N },
    .tile = { tile_wide, tile_narrow },
    .widen = widen,
    .store = store,
    .store_t = store_t,
    .dot_rows = dot_rows,
    .mr16 = { MR16_W, MR16_N },
    .nr16 = { 16 * NV16_W, 16 * NV16_N },
    .tile16 = { tile16_wide, tile16_narrow },
    .dot_rows16 = dot_rows16,
    .to_bf16 = to_bf16,
    .pair_rows16 = pair_rows16,
    .pair_rows16_f32 = pair_rows16_f32,
    .pack_at16 = pack_at16,
    .pack_cols16 = pack_cols16,
};

/* ------------------------------------------------ amx: the tile unit */

/* The amx level is avx512bf16 with tile16 on tdpbf16ps (kernels_amx.c):
 * f32 products, decode's row-dots and the conversions stay as above. The
 * emulated table runs the same micro-kernel on kernels_amx_emu.c's C
 * model of the tiles; no level dispatches to it, only tests. */
void ft_amx_tile16_wide(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_tile16_narrow(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_emu_tile16_wide(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_emu_tile16_narrow(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_tiles_begin(void);
void ft_amx_tiles_end(void);
void ft_amx_gemm16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                   int kp, float alpha, bool acc);
void ft_amx_emu_gemm16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M,
                       int N, int kp, float alpha, bool acc);
void ft_amx_emu_tiles_begin(void);
void ft_amx_emu_tiles_end(void);

#define AMX_TABLE(nm, wide, narrow, begin, end, g16)                                                                              \
    {                                                                                                              \
        .name = nm, .mr = { MR_W, MR_N }, .nr = { VL * NV_W, VL * NV_N }, .tile = { tile_wide, tile_narrow },      \
        .widen = widen, .store = store, .store_t = store_t, .dot_rows = dot_rows, .mr16 = { 32, 32 }, .nr16 = { 32, 16 },             \
        .tile16 = { wide, narrow }, .dot_rows16 = dot_rows16, .to_bf16 = to_bf16, .pair_rows16 = pair_rows16,     \
        .pair_rows16_f32 = pair_rows16_f32, .pack_at16 = pack_at16, .pack_cols16 = pack_cols16,                    \
        .tiles_begin = begin, .tiles_end = end, .gemm16 = g16,                                                      \
    }
const ft_kernel_isa ft_kernels_amx =
    AMX_TABLE("amx", ft_amx_tile16_wide, ft_amx_tile16_narrow, ft_amx_tiles_begin, ft_amx_tiles_end, ft_amx_gemm16);
const ft_kernel_isa ft_kernels_amx_emulated = AMX_TABLE("amx (emulated tiles)", ft_amx_emu_tile16_wide,
                                                        ft_amx_emu_tile16_narrow, ft_amx_emu_tiles_begin,
                                                        ft_amx_emu_tiles_end, ft_amx_emu_gemm16);

#endif
