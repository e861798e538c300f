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

#include "cpu/kernels_isa.h"

#endif
