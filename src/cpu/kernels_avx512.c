/* kernels_avx512.c — the AVX-512 primitives of kernels.h: widening a span
 * of a weight row to f32 (bf16: a shift; f16: vcvtph2ps; q8_0 and q4_0
 * dequantized a 32-element block at a time, exactly as dtype.c does, since
 * d·q and (q-8)·d fit in an f32 mantissa), and kernels_isa.h's micro-kernel
 * and row-dot at 16 lanes. The functions carry the target attribute (no
 * global -march), so one binary runs on every x86-64. */
#include "cpu/kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define ISA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define VL 16
#define VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define VSET1(x) ((vf)_mm512_set1_ps(x))
/* 12 rows × 32 columns (24 of the 32 zmm registers) when N > 16, else
 * 16 × 16 (measured best with the forward's former kernels) */
#define MR_W 12
#define NV_W 2
#define MR_N 16
#define NV_N 1
#define ISA_NAME "avx512"
#define ISA_TABLE ft_kernels_avx512

#define LOCAL static inline __attribute__((always_inline)) ISA_TARGET

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

#include "cpu/kernels_isa.h"

#endif
