/* kernels_a16_avx512.c — the integer dot products of kernels_a16.c with
 * AVX-512 VNNI (vpdpwssd: 32 products of 16-bit weights and 16-bit
 * activations summed into 16 int32 lanes in one instruction), used from
 * the avx512 level up where the CPU has AVX512_VNNI. Equal to the
 * reference (dtype_dot.c) bit for bit (test_int_dot): every integer sum is
 * exact, and the f32 operations are the reference's, in its order.
 *
 * 32-element blocks (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) go 16 rows at a
 * time: each row's block leaves 16 int32 lanes, a transposing reduction
 * turns the 16 rows' vectors into one vector of the 16 block sums, and the
 * scaling runs on that vector (lane r is row r's reference expression), so
 * nothing is summed horizontally per block. The scales of the 16 rows come
 * in one gather.
 *
 * 256-element blocks (q4_K, q5_K, q6_K, iq4_xs) go one row at a time: the
 * sub-block scales are multiplied into the 16-bit weights (at most 1953,
 * 8064 and 4064 in magnitude), so one accumulator gathers the whole
 * block's Σ sc·q·a in int32 lanes, widened to int64 once per block. The
 * bounds that keep a lane inside int32 (|a| <= 32767, two products a lane
 * per vpdpwssd) are written where each accumulator is used. */
#include "cpu/kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define LOCAL static inline __attribute__((always_inline, target(TGT)))
#define AVX512 __attribute__((target(TGT)))

/* lane r = the sum of the 16 int32 lanes of p[r], for r < 16 (exact while
 * each row's total fits in int32, which the callers' bounds give) */
LOCAL __m512i sum_rows16(const __m512i p[16]) {
    __m512i t[8], u[4], v[2];
    for (int i = 0; i < 8; i++) /* per 128-bit chunk: rows 2i, 2i+1 interleaved, 2 lanes each */
        t[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per chunk: rows 4i..4i+3, that chunk's 4 lanes summed */
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * i], t[2 * i + 1]), _mm512_unpackhi_epi64(t[2 * i], t[2 * i + 1]));
    for (int i = 0; i < 2; i++) /* chunks: rows 8i..8i+3 (c0+c1, c2+c3), rows 8i+4.. (c0+c1, c2+c3) */
        v[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* 16 bytes of nibbles as 32 words: the low nibbles (elements 0..15), then the high (16..31) */
LOCAL __m512i nibbles32w(const uint8_t *q) {
    __m512i b = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q)));
    return _mm512_mask_srli_epi16(_mm512_and_si512(b, _mm512_set1_epi16(0x0F)), 0xFFFF0000u, b, 4);
}
/* + 16 on element j where bit j of the little-endian 32 bits qh is set */
LOCAL __m512i high5(__m512i w, const uint8_t qh[4]) {
    uint32_t m;
    memcpy(&m, qh, 4);
    return _mm512_mask_add_epi16(w, (__mmask32)m, w, _mm512_set1_epi16(16));
}
/* words 0..15 of the table: ft_iq4nl_code as int16 */
LOCAL __m512i iq4_table(void) {
    int16_t t[32] = { 0 };
    for (int i = 0; i < 16; i++) t[i] = ft_iq4nl_code[i];
    return _mm512_loadu_si512(t);
}

/* the f16 scale (and, with two, the f16 word after it) of block i of 16
 * rows rb bytes apart, as f32 (exact) */
LOCAL __m512i gather16(const uint8_t *w, __m512i roff) { return _mm512_i32gather_epi32(roff, (const void *)w, 1); }
LOCAL __m512 f16_lo(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)); }
LOCAL __m512 f16_hi(__m512i g) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))); }

enum { K_Q8_0, K_Q4_0, K_Q4_1, K_Q5_0, K_Q5_1, K_IQ4_NL };

/* 16 rows of a 32-element-block type. Per row and block the integer sum
 * Σ q·a: |q| <= 127 (q8_0, iq4_nl) or <= 31, |a| <= 32767, 32 terms: < 2^27. */
LOCAL void rows16_32(float *out, const ft_block_a16 *y, const uint8_t *w, size_t rb, int kind, size_t bb, int nb) {
    const __m512i roff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    const __m512i tab = iq4_table();
    const size_t qs_at = kind == K_Q8_0 || kind == K_Q4_0 || kind == K_IQ4_NL ? 2 : kind == K_Q4_1 ? 4 : kind == K_Q5_0 ? 6 : 8;
    /* the next 16 rows (16·nb·bb bytes, bb <= 64) are prefetched a line
     * per row and block, in address order: the group's rows are short and
     * contiguous, and reading them 16 at a time strides across them */
    const uint8_t *next = w + 16 * rb;
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const uint8_t *bi = w + (size_t)i * bb;
        const __m512i a = _mm512_loadu_si512(y[i].qs);
        __m512i p[16];
        for (int r = 0; r < 16; r++) {
            const uint8_t *b = bi + (size_t)r * rb;
            _mm_prefetch((const char *)next + ((size_t)i * 16 + r) * 64, _MM_HINT_T0);
            __m512i q;
            if (kind == K_Q8_0) q = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + qs_at)));
            else {
                q = nibbles32w(b + qs_at);
                if (kind == K_Q5_0 || kind == K_Q5_1) q = high5(q, b + qs_at - 4);
                else if (kind == K_IQ4_NL) q = _mm512_permutexvar_epi16(q, tab);
            }
            p[r] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q, a);
        }
        __m512i s = sum_rows16(p);
        const __m512i g = gather16(bi, roff);
        const __m512 yd = _mm512_set1_ps(y[i].d);
        /* the reference's expressions, lane r for row r */
        if (kind == K_Q4_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * y[i].sum));
        else if (kind == K_Q5_0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(16 * y[i].sum));
        __m512 t = _mm512_mul_ps(_mm512_mul_ps(f16_lo(g), yd), _mm512_cvtepi32_ps(s));
        if (kind == K_Q4_1 || kind == K_Q5_1)
            t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_mul_ps(f16_hi(g), yd), _mm512_set1_ps((float)y[i].sum)));
        acc = _mm512_add_ps(acc, t);
    }
    _mm512_storeu_ps(out, acc);
}

/* the int64 sum of the 16 int32 lanes of v */
LOCAL int64_t hsum_i64(__m512i v) {
    __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)), hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_reduce_add_epi64(_mm512_add_epi64(lo, hi));
}

/* q4_K and q5_K (x5 non-NULL): per pair of 32-element sub-blocks, 32 bytes
 * of qs (low nibbles the first, high the second) and, for q5_K, bits j and
 * j + 1 of the 32 bytes of qh. One lane: 8 sub-blocks × 2 products of
 * |sc·q| <= 63·31 = 1953 and |a| <= 32767: < 1.03e9 < 2^31. */
LOCAL float row_k45(const ft_block_q4_K *x4, const ft_block_q5_K *x5, const ft_block_a16_K *y, int nb) {
    float sum = 0;
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    for (int i = 0; i < nb; i++) {
        const uint8_t *q = x4 ? x4[i].qs : x5[i].qs, *sc = x4 ? x4[i].scales : x5[i].scales;
        const __m256i qh = x5 ? _mm256_loadu_si256((const __m256i *)x5[i].qh) : _mm256_setzero_si256();
        const int16_t *a = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
        int64_t msum = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            ft_k4_scale_min(j, sc, &sc1, &m1);
            ft_k4_scale_min(j + 1, sc, &sc2, &m2);
            __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)q));
            __m512i lo = _mm512_and_si512(b, m4), hi = _mm512_srli_epi16(b, 4);
            if (x5) {
                lo = _mm512_mask_add_epi16(lo, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << j))), lo, _mm512_set1_epi16(16));
                hi = _mm512_mask_add_epi16(hi, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (j + 1)))), hi,
                                           _mm512_set1_epi16(16));
            }
            acc = _mm512_dpwssd_epi32(acc, _mm512_mullo_epi16(lo, _mm512_set1_epi16(sc1)), _mm512_loadu_si512(a));
            acc = _mm512_dpwssd_epi32(acc, _mm512_mullo_epi16(hi, _mm512_set1_epi16(sc2)), _mm512_loadu_si512(a + 32));
            msum += (int64_t)m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) +
                    (int64_t)m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        int64_t isum = hsum_i64(acc);
        uint16_t d = x4 ? x4[i].d : x5[i].d, dmin = x4 ? x4[i].dmin : x5[i].dmin;
        sum += y[i].d * _cvtsh_ss(d) * (float)isum - y[i].d * _cvtsh_ss(dmin) * (float)msum;
    }
    return sum;
}

/* q6_K: per half of 128, four 32-element groups (ql's low and high nibbles
 * of bytes 0..31 and 32..63, qh's bit pairs 0, 2, 4, 6), each two
 * sub-blocks of 16 with their own int8 scale. One accumulator per half: 4
 * groups × 2 products of |sc·q| <= 128·63 = 8064 and |a| <= 32767:
 * < 2.12e9 < 2^31. Σ sc·(q - 32)·a = Σ sc·q·a - 32·Σ sc·bsum. */
LOCAL float row_q6_K(const ft_block_q6_K *x, const ft_block_a16_K *y, int nb) {
    float sum = 0;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    for (int i = 0; i < nb; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        const int16_t *a = y[i].qs;
        int64_t isum = 0, bsc = 0;
        for (int k = 0; k < 16; k++) bsc += (int64_t)sc[k] * y[i].bsums[k];
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, a += 128) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4)),
            };
            __m512i acc = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                __m512i s = _mm512_inserti64x4(_mm512_set1_epi16(sc[2 * g]), _mm256_set1_epi16(sc[2 * g + 1]), 1);
                acc = _mm512_dpwssd_epi32(acc, _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q[g]), s), _mm512_loadu_si512(a + 32 * g));
            }
            isum += hsum_i64(acc);
        }
        isum -= 32 * bsc;
        sum += y[i].d * _cvtsh_ss(x[i].d) * (float)isum;
    }
    return sum;
}

/* iq4_xs: 8 sub-blocks of 32 with 6-bit scales ls - 32 in [-32, 31]. One
 * lane: 8 × 2 products of |code·(ls - 32)| <= 127·32 = 4064 and
 * |a| <= 32767: < 2.131e9 < 2^31. */
LOCAL float row_iq4_xs(const ft_block_iq4_xs *x, const ft_block_a16_K *y, int nb) {
    float sum = 0;
    const __m512i tab = iq4_table();
    for (int i = 0; i < nb; i++) {
        const uint8_t *q = x[i].qs;
        const int16_t *a = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
        for (int ib = 0; ib < FT_QK_K / 32; ib++, q += 16, a += 32) {
            int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            __m512i c = _mm512_permutexvar_epi16(nibbles32w(q), tab);
            acc = _mm512_dpwssd_epi32(acc, _mm512_mullo_epi16(c, _mm512_set1_epi16((short)(ls - 32))), _mm512_loadu_si512(a));
        }
        sum += _cvtsh_ss(x[i].d) * y[i].d * (float)hsum_i64(acc);
    }
    return sum;
}

AVX512 void ft_idot_rows_avx512(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows) {
    int kind = -1;
    switch (dt) {
    case FT_Q8_0: kind = K_Q8_0; break;
    case FT_Q4_0: kind = K_Q4_0; break;
    case FT_Q4_1: kind = K_Q4_1; break;
    case FT_Q5_0: kind = K_Q5_0; break;
    case FT_Q5_1: kind = K_Q5_1; break;
    case FT_IQ4_NL: kind = K_IQ4_NL; break;
    case FT_Q4_K:
        for (int r = 0; r < nrows; r++) out[r] = row_k45((const void *)(w + (size_t)r * rb), NULL, act, K / FT_QK_K);
        return;
    case FT_Q5_K:
        for (int r = 0; r < nrows; r++) out[r] = row_k45(NULL, (const void *)(w + (size_t)r * rb), act, K / FT_QK_K);
        return;
    case FT_Q6_K:
        for (int r = 0; r < nrows; r++) out[r] = row_q6_K((const void *)(w + (size_t)r * rb), act, K / FT_QK_K);
        return;
    case FT_IQ4_XS:
        for (int r = 0; r < nrows; r++) out[r] = row_iq4_xs((const void *)(w + (size_t)r * rb), act, K / FT_QK_K);
        return;
    default: ft_idot_rows_ref(out, act, w, rb, dt, K, nrows); return;
    }
    /* the gather's row offsets are int32: 15 rows must fit */
    int r = 0;
    if (rb <= (size_t)INT32_MAX / 16)
        for (; r + 16 <= nrows; r += 16) {
            float *o = out + r;
            const uint8_t *wr = w + (size_t)r * rb;
            int nb = K / FT_QK;
            switch (kind) { /* the kind a constant in each copy */
            case K_Q8_0: rows16_32(o, act, wr, rb, K_Q8_0, sizeof(ft_block_q8_0), nb); break;
            case K_Q4_0: rows16_32(o, act, wr, rb, K_Q4_0, sizeof(ft_block_q4_0), nb); break;
            case K_Q4_1: rows16_32(o, act, wr, rb, K_Q4_1, sizeof(ft_block_q4_1), nb); break;
            case K_Q5_0: rows16_32(o, act, wr, rb, K_Q5_0, sizeof(ft_block_q5_0), nb); break;
            case K_Q5_1: rows16_32(o, act, wr, rb, K_Q5_1, sizeof(ft_block_q5_1), nb); break;
            default: rows16_32(o, act, wr, rb, K_IQ4_NL, sizeof(ft_block_iq4_nl), nb); break;
            }
        }
    if (r < nrows) ft_idot_rows_avx2(out + r, act, w + (size_t)r * rb, rb, dt, K, nrows - r);
}
#endif
