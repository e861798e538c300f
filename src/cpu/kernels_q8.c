/* kernels_q8.c — integer dot products of weight rows with 8-bit
 * activations (the GEMV path of kernels.c when integer products are on):
 * the reference (the traits' vec_dot, dtype_dot.c) and AVX2 versions
 * (maddubs: unsigned 8-bit × signed 8-bit pairs summed to 16 bits, then
 * to 32), used at every x86 level from avx2 up. Each block's integer sum
 * is exact and its f32 scaling is the reference's expression, in the
 * reference's order, so the results equal the reference bit for bit
 * (test_q8_dot). */
#include "cpu/kernels.h"

#include <string.h>

void ft_q8dot_rows_ref(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows) {
    for (int r = 0; r < nrows; r++) out[r] = ft_types[dt].vec_dot(w + (size_t)r * rb, act, K);
}

#if defined(__x86_64__)
#include <immintrin.h>

#define LOCAL static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* f16 to f32 (exact, the value ft_f16_to_f32 gives) in one instruction */
#define F16(h) _cvtsh_ss(h)

LOCAL int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
LOCAL int hsum_i32_128(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
/* Σ u·s over 32 bytes (u unsigned, s signed; |u·s + u'·s'| < 2^15 for the
 * ranges used: u <= 63 with s >= -128, or |u| <= 128 against |s| <= 127),
 * as 8 int32 lanes (lane k: bytes 4k..4k+3) */
LOCAL __m256i dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
/* Σ x·y of two signed 32-byte vectors (x never -128·-128 pairs that overflow: x from a weight block is in
 * [-128, 127], y from the activation quantizer in [-127, 127] for q8_0; |x|·|y|·2 <= 128·127·2 < 2^15) */
LOCAL __m256i dot_ss(__m256i x, __m256i y) { return dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }
/* 16 bytes of nibbles as 32: the low nibbles (elements 0..15), then the high (16..31) */
LOCAL __m256i nibbles32(const uint8_t *q) {
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
/* byte j = 0x10 where bit j of the little-endian 32 bits qh is set, else 0 */
LOCAL __m256i bits32_x16(const uint8_t qh[4]) {
    uint32_t v;
    memcpy(&v, qh, 4);
    __m256i b = _mm256_set1_epi32((int)v);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    b = _mm256_shuffle_epi8(b, shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}
LOCAL __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
LOCAL __m256i iq4_codes(__m256i q) {
    const __m128i t = _mm_loadu_si128((const __m128i *)ft_iq4nl_code);
    return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), q);
}

AVX2 static float dot_q8_0(const uint8_t *w, const void *act, int K) {
    const ft_block_q8_0 *x = (const void *)w, *y = act;
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        int s = hsum_i32(dot_ss(load32(x[i].qs), load32(y[i].qs)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

AVX2 static float dot_q4_0(const uint8_t *w, const void *act, int K) {
    const ft_block_q4_0 *x = (const void *)w;
    const ft_block_q8_0 *y = act;
    const __m256i ones = _mm256_set1_epi8(1);
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        __m256i a = load32(y[i].qs);
        int s = hsum_i32(_mm256_sub_epi32(dot_us(nibbles32(x[i].qs), a), _mm256_slli_epi32(dot_us(ones, a), 3)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

AVX2 static float dot_q4_1(const uint8_t *w, const void *act, int K) {
    const ft_block_q4_1 *x = (const void *)w;
    const ft_block_q8_1 *y = act;
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        int s = hsum_i32(dot_us(nibbles32(x[i].qs), load32(y[i].qs)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s + F16(x[i].m) * F16(y[i].s);
    }
    return sum;
}

AVX2 static float dot_q5_0(const uint8_t *w, const void *act, int K) {
    const ft_block_q5_0 *x = (const void *)w;
    const ft_block_q8_0 *y = act;
    const __m256i ones = _mm256_set1_epi8(1);
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        __m256i a = load32(y[i].qs), q = _mm256_or_si256(nibbles32(x[i].qs), bits32_x16(x[i].qh));
        int s = hsum_i32(_mm256_sub_epi32(dot_us(q, a), _mm256_slli_epi32(dot_us(ones, a), 4)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

AVX2 static float dot_q5_1(const uint8_t *w, const void *act, int K) {
    const ft_block_q5_1 *x = (const void *)w;
    const ft_block_q8_1 *y = act;
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        __m256i q = _mm256_or_si256(nibbles32(x[i].qs), bits32_x16(x[i].qh));
        int s = hsum_i32(dot_us(q, load32(y[i].qs)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s + F16(x[i].m) * F16(y[i].s);
    }
    return sum;
}

AVX2 static float dot_iq4_nl(const uint8_t *w, const void *act, int K) {
    const ft_block_iq4_nl *x = (const void *)w;
    const ft_block_q8_0 *y = act;
    float sum = 0;
    for (int i = 0; i < K / FT_QK; i++) {
        int s = hsum_i32(dot_ss(iq4_codes(nibbles32(x[i].qs)), load32(y[i].qs)));
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

/* q4_K and q5_K: per pair of 32-element sub-blocks, 32 bytes of qs: low
 * nibbles the first sub-block, high nibbles the second (plus bits j and
 * j + 1 of qh for q5_K) */
LOCAL float dot_k45(const ft_block_q4_K *x4, const ft_block_q5_K *x5, const void *act, int K) {
    const ft_block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    float sum = 0;
    for (int i = 0; i < K / FT_QK_K; i++) {
        const uint8_t *q = x4 ? x4[i].qs : x5[i].qs, *sc = x4 ? x4[i].scales : x5[i].scales;
        __m256i qh = x5 ? load32(x5[i].qh) : _mm256_setzero_si256();
        const int8_t *a = y[i].qs;
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            ft_k4_scale_min(j, sc, &sc1, &m1);
            ft_k4_scale_min(j + 1, sc, &sc2, &m2);
            __m256i b = load32(q);
            __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            if (x5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j + 1), one), 4));
            }
            int s1 = hsum_i32(dot_us(lo, load32(a))), s2 = hsum_i32(dot_us(hi, load32(a + 32)));
            isum += sc1 * s1 + sc2 * s2;
            msum += m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) + m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        uint16_t d = x4 ? x4[i].d : x5[i].d, dmin = x4 ? x4[i].dmin : x5[i].dmin;
        sum += y[i].d * F16(d) * (float)isum - y[i].d * F16(dmin) * (float)msum;
    }
    return sum;
}
AVX2 static float dot_q4_K(const uint8_t *w, const void *act, int K) { return dot_k45((const void *)w, NULL, act, K); }
AVX2 static float dot_q5_K(const uint8_t *w, const void *act, int K) { return dot_k45(NULL, (const void *)w, act, K); }

/* q6_K: per half of 128, four 32-byte groups (ql low/high nibbles of
 * bytes 0..31 and 32..63, with qh's bit pairs 0, 2, 4, 6), each two
 * sub-blocks of 16 (the two 128-bit halves of the vector) */
AVX2 static float dot_q6_K(const uint8_t *w, const void *act, int K) {
    const ft_block_q6_K *x = (const void *)w;
    const ft_block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    float sum = 0;
    for (int i = 0; i < K / FT_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales, *a = y[i].qs;
        const int16_t *bs = y[i].bsums;
        int isum = 0;
        for (int h = 0; h < FT_QK_K; h += 128, ql += 64, qh += 32, sc += 8, a += 128, bs += 8) {
            __m256i l0 = load32(ql), l1 = load32(ql + 32), hb = load32(qh);
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4)),
            };
            for (int g = 0; g < 4; g++) {
                __m256i d = dot_us(q[g], load32(a + 32 * g));
                int s0 = hsum_i32_128(_mm256_castsi256_si128(d)), s1 = hsum_i32_128(_mm256_extracti128_si256(d, 1));
                /* q - 32: the sub-blocks' bsums (16 each) */
                isum += sc[2 * g] * (s0 - 32 * bs[2 * g]) + sc[2 * g + 1] * (s1 - 32 * bs[2 * g + 1]);
            }
        }
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

AVX2 static float dot_iq4_xs(const uint8_t *w, const void *act, int K) {
    const ft_block_iq4_xs *x = (const void *)w;
    const ft_block_q8_K *y = act;
    float sum = 0;
    for (int i = 0; i < K / FT_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int isum = 0;
        for (int ib = 0; ib < FT_QK_K / 32; ib++, q += 16, a += 32) {
            int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            isum += (ls - 32) * hsum_i32(dot_ss(iq4_codes(nibbles32(q)), load32(a)));
        }
        sum += F16(x[i].d) * y[i].d * (float)isum;
    }
    return sum;
}

AVX2 void ft_q8dot_rows_avx2(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows) {
    float (*f)(const uint8_t *, const void *, int) = NULL;
    switch (dt) {
    case FT_Q8_0: f = dot_q8_0; break;
    case FT_Q4_0: f = dot_q4_0; break;
    case FT_Q4_1: f = dot_q4_1; break;
    case FT_Q5_0: f = dot_q5_0; break;
    case FT_Q5_1: f = dot_q5_1; break;
    case FT_IQ4_NL: f = dot_iq4_nl; break;
    case FT_Q4_K: f = dot_q4_K; break;
    case FT_Q5_K: f = dot_q5_K; break;
    case FT_Q6_K: f = dot_q6_K; break;
    case FT_IQ4_XS: f = dot_iq4_xs; break;
    default: ft_q8dot_rows_ref(out, act, w, rb, dt, K, nrows); return;
    }
    for (int r = 0; r < nrows; r++) out[r] = f(w + (size_t)r * rb, act, K);
}
#endif
