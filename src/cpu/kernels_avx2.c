/* kernels_avx2.c — the AVX2 (+FMA, F16C) primitives of kernels.h, for
 * x86-64 CPUs without AVX-512: widening a span of a weight row to f32
 * exactly (bf16 shift, vcvtph2ps, q8_0/q4_0 blocks as dtype.c) and
 * kernels_isa.h's micro-kernel and row-dot at 8 lanes. AVX2 has no masked
 * 16-bit loads, so a ragged end of a bf16/f16 span goes through the
 * reference conversion. */
#include "cpu/kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define ISA_TARGET __attribute__((target("avx2,fma,f16c")))
#define VL 8
#define VFMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#define VSET1(x) ((vf)_mm256_set1_ps(x))
#define HSUM(v) hsum8((__m256)(v))
/* 6 rows × 16 columns (12 of the 16 ymm registers) when N > 8, else 12 × 8 */
#define MR_W 6
#define NV_W 2
#define MR_N 12
#define NV_N 1
#define ISA_NAME "avx2"
#define ISA_TABLE ft_kernels_avx2


#define LOCAL static inline __attribute__((always_inline)) ISA_TARGET

/* the 8 lanes' sum as a tree: halves, then pairs */
LOCAL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

LOCAL __m256 bf16_vec(const uint16_t *h) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

LOCAL __m256 f16_vec(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

LOCAL void q8_0_block(float *dst, const ft_block_q8_0 *b) {
    __m256 d = _mm256_set1_ps(ft_f16_to_f32(b->d));
    for (int i = 0; i < 4; i++) {
        __m128i q = _mm_loadl_epi64((const __m128i *)(b->qs + 8 * i));
        _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
    }
}

/* (q-8)·d as q·d + (-8d): exact, the result fits in 24 bits */
LOCAL void q4_0_block(float *dst, const ft_block_q4_0 *b) {
    float dh = ft_f16_to_f32(b->d);
    __m256 d = _mm256_set1_ps(dh), m8d = _mm256_set1_ps(-8.0f * dh);
    __m256i q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b->qs));
    __m256i q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8)));
    __m256i m = _mm256_set1_epi32(15);
    _mm256_storeu_ps(dst, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q0, m)), d, m8d));
    _mm256_storeu_ps(dst + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q1, m)), d, m8d));
    _mm256_storeu_ps(dst + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), d, m8d));
    _mm256_storeu_ps(dst + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)), d, m8d));
}

/* nf4: the 16-entry code in two registers, looked up with vpermps in each
 * and a blend on bit 3 of the index; code[q]·absmax exact as in dtype.c */
LOCAL void nf4_block(float *dst, const ft_block_nf4 *b) {
    const __m256 c_lo = _mm256_loadu_ps(ft_nf4_code), c_hi = _mm256_loadu_ps(ft_nf4_code + 8);
    const __m256 d = _mm256_set1_ps(b->d);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * h));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4), lo = _mm_and_si128(q, m4);
        __m128i ix[2] = { _mm_unpacklo_epi8(hi, lo), _mm_unpackhi_epi8(hi, lo) };
        for (int p = 0; p < 2; p++)
            for (int e = 0; e < 2; e++) {
                __m256i i = _mm256_cvtepu8_epi32(e ? _mm_srli_si128(ix[p], 8) : ix[p]);
                __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)); /* bit 3 to the sign */
                __m256 v = _mm256_blendv_ps(_mm256_permutevar8x32_ps(c_lo, i), _mm256_permutevar8x32_ps(c_hi, i), sel);
                _mm256_storeu_ps(dst + 32 * h + 16 * p + 8 * e, _mm256_mul_ps(v, d));
            }
    }
}

/* int8 rows: q·absmax·(1/127) as two products, left to right, as dtype.c */
LOCAL __m256 i8_vec(const int8_t *q, float a) {
    __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(a)), _mm256_set1_ps(FT_I8ROW_INV127));
}

/* ggml's other blocks, as kernels_avx512.c dequantizes them (the
 * reference's products and sums in its order, no fused multiply-add), 8
 * lanes at a time; test_ggml_blocks checks them bit for bit. */
#define ISA_GGML_BLOCKS 1

LOCAL __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
LOCAL __m256 qv(__m256i q) { return _mm256_cvtepi32_ps(q); }
/* bits [s, s+8) of u, one a lane, in place 4 */
LOCAL __m256i bit4_of(uint32_t u, int s) {
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)(u >> s)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(1)), 4);
}
/* d·q (+ m) over 8 values */
LOCAL void store_dq(float *dst, __m256i q, float d) { _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_set1_ps(d), qv(q))); }
LOCAL void store_dqa(float *dst, __m256i q, float d, float m) {
    _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(d), qv(q)), _mm256_set1_ps(m)));
}
LOCAL void store_dqm(float *dst, __m256i q, float d, float m) {
    _mm256_storeu_ps(dst, _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(d), qv(q)), _mm256_set1_ps(m)));
}
/* iq4's code for 8 nibbles (int32 lanes 0..15) */
LOCAL __m256 iq4_code(__m256i q) {
    const __m128i code = _mm_loadu_si128((const __m128i *)ft_iq4nl_code);
    __m128i idx = _mm_packus_epi16(_mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)), _mm_setzero_si128());
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(code, idx)));
}

LOCAL void q4_1_block(float *dst, const ft_block_q4_1 *b) {
    float d = ft_f16_to_f32(b->d), m = ft_f16_to_f32(b->m);
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int h = 0; h < 16; h += 8) {
        __m256i q = u8x8(b->qs + h);
        store_dqa(dst + h, _mm256_and_si256(q, m4), d, m);
        store_dqa(dst + 16 + h, _mm256_srli_epi32(q, 4), d, m);
    }
}

LOCAL void q5_0_block(float *dst, const ft_block_q5_0 *b) {
    float d = ft_f16_to_f32(b->d);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i m4 = _mm256_set1_epi32(15), s16 = _mm256_set1_epi32(16);
    for (int h = 0; h < 16; h += 8) {
        __m256i q = u8x8(b->qs + h);
        store_dq(dst + h, _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(q, m4), bit4_of(qh, h)), s16), d);
        store_dq(dst + 16 + h, _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(q, 4), bit4_of(qh, 16 + h)), s16), d);
    }
}

LOCAL void q5_1_block(float *dst, const ft_block_q5_1 *b) {
    float d = ft_f16_to_f32(b->d), m = ft_f16_to_f32(b->m);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int h = 0; h < 16; h += 8) {
        __m256i q = u8x8(b->qs + h);
        store_dqa(dst + h, _mm256_or_si256(_mm256_and_si256(q, m4), bit4_of(qh, h)), d, m);
        store_dqa(dst + 16 + h, _mm256_or_si256(_mm256_srli_epi32(q, 4), bit4_of(qh, 16 + h)), d, m);
    }
}

LOCAL void iq4_nl_block(float *dst, const ft_block_iq4_nl *b) {
    __m256 d = _mm256_set1_ps(ft_f16_to_f32(b->d));
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int h = 0; h < 16; h += 8) {
        __m256i q = u8x8(b->qs + h);
        _mm256_storeu_ps(dst + h, _mm256_mul_ps(d, iq4_code(_mm256_and_si256(q, m4))));
        _mm256_storeu_ps(dst + 16 + h, _mm256_mul_ps(d, iq4_code(_mm256_srli_epi32(q, 4))));
    }
}

LOCAL void q4_K_block(float *y, const ft_block_q4_K *b) {
    float d = ft_f16_to_f32(b->d), dmin = ft_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
        uint8_t sc, mn;
        ft_k4_scale_min(j, b->scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int h = 0; h < 32; h += 8) {
            __m256i v = u8x8(q + h);
            store_dqm(y + h, _mm256_and_si256(v, m4), d1, m1);
            store_dqm(y + 32 + h, _mm256_srli_epi32(v, 4), d2, m2);
        }
    }
}

LOCAL void q5_K_block(float *y, const ft_block_q5_K *b) {
    float d = ft_f16_to_f32(b->d), dmin = ft_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    const __m256i m4 = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
        uint8_t sc, mn;
        ft_k4_scale_min(j, b->scales, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
        float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int h = 0; h < 32; h += 8) {
            __m256i v = u8x8(q + h), qh = u8x8(b->qh + h);
            __m256i h1 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, j), one), 4);
            __m256i h2 = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(qh, j + 1), one), 4);
            store_dqm(y + h, _mm256_or_si256(_mm256_and_si256(v, m4), h1), d1, m1);
            store_dqm(y + 32 + h, _mm256_or_si256(_mm256_srli_epi32(v, 4), h2), d2, m2);
        }
    }
}

LOCAL void q6_K_block(float *y, const ft_block_q6_K *b) {
    float d = ft_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    const __m256i m4 = _mm256_set1_epi32(15), m2 = _mm256_set1_epi32(3), s32 = _mm256_set1_epi32(32);
    for (int n = 0; n < FT_QK_K; n += 128, ql += 64, qh += 32, sc += 8, y += 128)
        for (int l = 0; l < 32; l += 8) {
            int is = l / 16;
            __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi32(_mm256_and_si256(h, m2), 4));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, m4),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2), m2), 4));
            __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 4), m2), 4));
            __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(h, 6), 4));
            store_dq(y + l, _mm256_sub_epi32(q1, s32), d * (float)sc[is]);
            store_dq(y + l + 32, _mm256_sub_epi32(q2, s32), d * (float)sc[is + 2]);
            store_dq(y + l + 64, _mm256_sub_epi32(q3, s32), d * (float)sc[is + 4]);
            store_dq(y + l + 96, _mm256_sub_epi32(q4, s32), d * (float)sc[is + 6]);
        }
}

LOCAL void iq4_xs_block(float *y, const ft_block_iq4_xs *b) {
    float d = ft_f16_to_f32(b->d);
    const uint8_t *qs = b->qs;
    const __m256i m4 = _mm256_set1_epi32(15);
    for (int ib = 0; ib < FT_QK_K / 32; ib++, qs += 16, y += 32) {
        int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | ((b->scales_h >> 2 * ib) & 3) << 4;
        __m256 dl = _mm256_set1_ps(d * (float)(ls - 32));
        for (int h = 0; h < 16; h += 8) {
            __m256i q = u8x8(qs + h);
            _mm256_storeu_ps(y + h, _mm256_mul_ps(dl, iq4_code(_mm256_and_si256(q, m4))));
            _mm256_storeu_ps(y + 16 + h, _mm256_mul_ps(dl, iq4_code(_mm256_srli_epi32(q, 4))));
        }
    }
}

#include "cpu/kernels_isa.h"

#endif
