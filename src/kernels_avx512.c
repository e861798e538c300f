/* kernels_avx512.c — AVX-512 kernels for Linear's forward (kernels.h).
 * Decode (one row): each output row is a dot product with the weights
 * widened (bf16: a shift; f16: vcvtph2ps) or dequantized (q8_0, q4_0) in
 * registers, four rows at a time sharing the loads of x; memory-bound.
 * Prefill (several rows): the input is packed transposed, 16·NV rows of it
 * across the vector lanes, and each thread runs an MR×NV register tile over
 * panels of MR weight rows widened to f32 a K-block at a time; compute-bound.
 * Dequantized weights are exact in f32 (bf16/f16 widen exactly; q8_0's
 * d·q and q4_0's (q-8)·d fit in 24 bits), so only the order of the f32 sums
 * differs from the reference. OpenMP regions stay in plain functions; the
 * kernels carry the target attribute (no global -march). */
#include "kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

/* ggml block layouts (see dtype.c): a little-endian f16 scale d, then q8_0:
 * 32 int8 (x = d·q); q4_0: 16 bytes, element j in the low nibble of byte j
 * and element j+16 in the high nibble (x = (q-8)·d). */
#define QK 32
#define Q8_BYTES 34
#define Q4_BYTES 18

/* Prefill: K-block of the weight panel (a multiple of QK), and the most
 * input rows packed at once (bounded by the 128·IC floats of scratch). */
#define KC 256
#define MAX_ROWS 128
/* bounds of the register tile: MR weight rows × NV vectors of 16 input rows */
#define MR_MAX 24
#define NV_MAX 4

INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

INLINE __mmask16 tail_mask(int n) { return (__mmask16)((1u << n) - 1); }

/* 16 bf16 or f16 values -> f32. */
INLINE __m512 widen16(__m256i h, int dt) {
    if (dt == FT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* A q8_0 block -> 32 floats in two vectors. */
INLINE void q8_block(const uint8_t *p, __m512 *w0, __m512 *w1) {
    __m512 d = _mm512_set1_ps(half_at(p));
    __m256i q = _mm256_loadu_si256((const __m256i *)(p + 2));
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
}

/* A q4_0 block -> 32 floats: (q-8)·d as one fma q·d + (-8d), exact since
 * the result fits in an f32 mantissa. */
INLINE void q4_block(const uint8_t *p, __m512 *w0, __m512 *w1) {
    float dh = half_at(p);
    __m512 d = _mm512_set1_ps(dh), m8d = _mm512_set1_ps(-8.0f * dh);
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
    __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    *w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), d, m8d);
    *w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), d, m8d);
}

/* ---------------------------------------------------------------- decode */

/* out[r] = (row r of w) · x for r < MR (MR ≤ 4); rows rb bytes apart. */
INLINE void gemv_tile(float *out, const float *x, const uint8_t *w, size_t rb, int IC, const int MR, const int dt) {
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    if (dt == FT_F32) {
        int k = 0;
        for (; k + 32 <= IC; k += 32) {
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const float *wr = (const float *)(w + r * rb) + k;
                acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(wr), x0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(wr + 16), x1, acc[r][1]);
            }
        }
        for (; k < IC; k += 16) {
            __mmask16 m = tail_mask(IC - k < 16 ? IC - k : 16);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const float *wr = (const float *)(w + r * rb) + k;
                acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, wr), x0, acc[r][0]);
            }
        }
    } else if (dt == FT_BF16 || dt == FT_F16) {
        int k = 0;
        for (; k + 32 <= IC; k += 32) {
            __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const uint16_t *wr = (const uint16_t *)(w + r * rb) + k;
                __m512 w0 = widen16(_mm256_loadu_si256((const __m256i *)wr), dt);
                __m512 w1 = widen16(_mm256_loadu_si256((const __m256i *)(wr + 16)), dt);
                acc[r][0] = _mm512_fmadd_ps(w0, x0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(w1, x1, acc[r][1]);
            }
        }
        for (; k < IC; k += 16) {
            __mmask16 m = tail_mask(IC - k < 16 ? IC - k : 16);
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const uint16_t *wr = (const uint16_t *)(w + r * rb) + k;
                acc[r][0] = _mm512_fmadd_ps(widen16(_mm256_maskz_loadu_epi16(m, wr), dt), x0, acc[r][0]);
            }
        }
    } else {
        for (int b = 0; b < IC / QK; b++) {
            __m512 x0 = _mm512_loadu_ps(x + b * QK), x1 = _mm512_loadu_ps(x + b * QK + 16);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                __m512 w0, w1;
                if (dt == FT_Q8_0) q8_block(w + r * rb + (size_t)b * Q8_BYTES, &w0, &w1);
                else q4_block(w + r * rb + (size_t)b * Q4_BYTES, &w0, &w1);
                acc[r][0] = _mm512_fmadd_ps(w0, x0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(w1, x1, acc[r][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

INLINE void gemv_range_dt(float *out, const float *x, const uint8_t *w, size_t rb, int IC, int o0, int o1,
                          const int dt) {
    int o = o0;
    for (; o + 4 <= o1; o += 4) gemv_tile(out + o, x, w + (size_t)o * rb, rb, IC, 4, dt);
    for (; o < o1; o++) gemv_tile(out + o, x, w + (size_t)o * rb, rb, IC, 1, dt);
}

/* Output rows [o0, o1). */
TARGET static void gemv_range(float *out, const float *x, const uint8_t *w, size_t rb, ft_dtype dt, int IC, int o0,
                              int o1) {
    switch (dt) {
    case FT_F32: gemv_range_dt(out, x, w, rb, IC, o0, o1, FT_F32); break;
    case FT_BF16: gemv_range_dt(out, x, w, rb, IC, o0, o1, FT_BF16); break;
    case FT_F16: gemv_range_dt(out, x, w, rb, IC, o0, o1, FT_F16); break;
    case FT_Q8_0: gemv_range_dt(out, x, w, rb, IC, o0, o1, FT_Q8_0); break;
    case FT_Q4_0: gemv_range_dt(out, x, w, rb, IC, o0, o1, FT_Q4_0); break;
    default: break;
    }
}

/* --------------------------------------------------------------- prefill */

/* Transposes the 16×16 floats in r (rows become columns). */
INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* s[4i+j] holds, in 128-bit lane L, rows 4i..4i+3 of column 4L+j */
    __m512 s[16];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        s[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        s[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        s[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        s[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512 p0 = _mm512_shuffle_f32x4(s[j], s[4 + j], 0x44), p1 = _mm512_shuffle_f32x4(s[j], s[4 + j], 0xEE);
        __m512 q0 = _mm512_shuffle_f32x4(s[8 + j], s[12 + j], 0x44), q1 = _mm512_shuffle_f32x4(s[8 + j], s[12 + j], 0xEE);
        r[j] = _mm512_shuffle_f32x4(p0, q0, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(p0, q0, 0xDD);
        r[8 + j] = _mm512_shuffle_f32x4(p1, q1, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(p1, q1, 0xDD);
    }
}

/* Packs rows [t0, t0+16) (those < nrows; the rest zero) and columns
 * [k, k+16) of x (nrows, IC) into xp: column kk lands at xp[kk·ld .. +16). */
TARGET static void pack_x16(float *xp, size_t ld, const float *x, int nrows, int IC, int t0, int k) {
    int n = IC - k < 16 ? IC - k : 16;
    __mmask16 m = tail_mask(n);
    __m512 r[16];
    for (int i = 0; i < 16; i++)
        r[i] = t0 + i < nrows ? _mm512_maskz_loadu_ps(m, x + (size_t)(t0 + i) * IC + k) : _mm512_setzero_ps();
    transpose16(r);
    for (int kk = 0; kk < n; kk++) _mm512_storeu_ps(xp + (size_t)kk * ld, r[kk]);
}

/* Widens rows [o0, o0+MR) (rows ≥ OC are zero) and columns [k0, k0+kc) of
 * W to f32 in wp, row r at wp + r·KC. */
TARGET static void pack_w(float *wp, const uint8_t *w, size_t rb, ft_dtype dt, int o0, int MR, int OC, int k0, int kc) {
    for (int r = 0; r < MR; r++) {
        float *dst = wp + (size_t)r * KC;
        if (o0 + r >= OC) {
            memset(dst, 0, (size_t)kc * sizeof(float));
            continue;
        }
        const uint8_t *row = w + (size_t)(o0 + r) * rb;
        if (dt == FT_F32) {
            memcpy(dst, (const float *)row + k0, (size_t)kc * sizeof(float));
        } else if (dt == FT_BF16 || dt == FT_F16) {
            const uint16_t *h = (const uint16_t *)row + k0;
            int k = 0;
            if (dt == FT_BF16)
                for (; k + 16 <= kc; k += 16)
                    _mm512_storeu_ps(dst + k, widen16(_mm256_loadu_si256((const __m256i *)(h + k)), FT_BF16));
            else
                for (; k + 16 <= kc; k += 16)
                    _mm512_storeu_ps(dst + k, widen16(_mm256_loadu_si256((const __m256i *)(h + k)), FT_F16));
            if (k < kc) {
                __mmask16 m = tail_mask(kc - k);
                __m256i v = _mm256_maskz_loadu_epi16(m, h + k);
                _mm512_mask_storeu_ps(dst + k, m, dt == FT_BF16 ? widen16(v, FT_BF16) : widen16(v, FT_F16));
            }
        } else {
            for (int k = 0; k < kc; k += QK) {
                __m512 w0, w1;
                int b = (k0 + k) / QK;
                if (dt == FT_Q8_0) q8_block(row + (size_t)b * Q8_BYTES, &w0, &w1);
                else q4_block(row + (size_t)b * Q4_BYTES, &w0, &w1);
                _mm512_storeu_ps(dst + k, w0);
                _mm512_storeu_ps(dst + k + 16, w1);
            }
        }
    }
}

/* cb (MR, 16·NV) += wp (MR, kc; rows KC apart) · xp (kc, 16·NV): the
 * register tile, a broadcast weight times NV vectors of input rows. */
INLINE void tile(float *cb, const float *xp, const float *wp, int kc, const int MR, const int NV) {
    const int L = 16 * NV;
    __m512 acc[MR_MAX][NV_MAX];
#pragma GCC unroll 24
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m512 xv[NV_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) xv[j] = _mm512_loadu_ps(xp + (size_t)k * L + 16 * j);
#pragma GCC unroll 24
        for (int r = 0; r < MR; r++) {
            __m512 b = _mm512_set1_ps(wp[r * KC + k]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_fmadd_ps(b, xv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 24
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            float *c = cb + r * L + 16 * j;
            _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), acc[r][j]));
        }
}

/* Panels [p0, p1) of MR weight rows against the packed rows [t0, t0+nt)
 * of the input: xp holds nch = ceil(nt/L) chunks of (IC, L). */
INLINE void panels(float *out, const float *xp, const uint8_t *w, size_t rb, ft_dtype dt, int IC, int OC, int t0,
                   int nt, int p0, int p1, const int MR, const int NV) {
    const int L = 16 * NV;
    int nch = (nt + L - 1) / L;
    float wp[MR_MAX * KC] __attribute__((aligned(64)));
    float cb[MAX_ROWS * MR_MAX] __attribute__((aligned(64))); /* nch chunks of (MR, L) */
    for (int p = p0; p < p1; p++) {
        int o0 = p * MR;
        memset(cb, 0, (size_t)nch * MR * L * sizeof(float));
        for (int k0 = 0; k0 < IC; k0 += KC) {
            int kc = IC - k0 < KC ? IC - k0 : KC;
            pack_w(wp, w, rb, dt, o0, MR, OC, k0, kc);
            for (int c = 0; c < nch; c++)
                tile(cb + (size_t)c * MR * L, xp + (size_t)c * IC * L + (size_t)k0 * L, wp, kc, MR, NV);
        }
        int mr = OC - o0 < MR ? OC - o0 : MR;
        for (int t = 0; t < nt; t++) {
            const float *c = cb + (size_t)(t / L) * MR * L + t % L;
            float *o = out + (size_t)(t0 + t) * OC + o0;
            for (int r = 0; r < mr; r++) o[r] = c[r * L];
        }
    }
}

/* Register tiles: 12 weight rows × 32 input rows (24 accumulators) when
 * there are more than 16 rows, else 16 × 16. (6 × 64 and KC 128 or 512
 * measured the same within noise; 8 × 48 ~10% slower.) */
#define MR_WIDE 12
#define NV_WIDE 2
#define MR_NARROW 16

TARGET static void panels_wide(float *out, const float *xp, const uint8_t *w, size_t rb, ft_dtype dt, int IC, int OC,
                               int t0, int nt, int p0, int p1) {
    panels(out, xp, w, rb, dt, IC, OC, t0, nt, p0, p1, MR_WIDE, NV_WIDE);
}
TARGET static void panels_narrow(float *out, const float *xp, const uint8_t *w, size_t rb, ft_dtype dt, int IC,
                                 int OC, int t0, int nt, int p0, int p1) {
    panels(out, xp, w, rb, dt, IC, OC, t0, nt, p0, p1, MR_NARROW, 1);
}

/* Work items handed out dynamically: panels of MR rows, GEMV output rows. */
#define PANEL_GROUP 4
#define GEMV_GROUP 64

static void gemm(float *out, const float *inp, const uint8_t *w, size_t rb, ft_dtype dt, int T, int IC, int OC,
                 int n_threads, float *xp) {
    int NV = T > 16 ? NV_WIDE : 1, L = 16 * NV, MR = NV > 1 ? MR_WIDE : MR_NARROW;
    int np = (OC + MR - 1) / MR, nk16 = (IC + 15) / 16;
#pragma omp parallel num_threads(n_threads)
    for (int t0 = 0; t0 < T; t0 += MAX_ROWS) {
        int nt = T - t0 < MAX_ROWS ? T - t0 : MAX_ROWS, nch = (nt + L - 1) / L;
        const float *x = inp + (size_t)t0 * IC;
        /* the packed input: chunk c, 16-lane group g, column k at
         * xp + c·IC·L + k·L + 16g */
#pragma omp for schedule(static)
        for (int job = 0; job < nch * NV * nk16; job++) {
            int c = job / (NV * nk16), g = job / nk16 % NV, k = job % nk16 * 16;
            pack_x16(xp + (size_t)c * IC * L + (size_t)k * L + 16 * g, (size_t)L, x, nt, IC, c * L + 16 * g, k);
        }
        /* dynamic: on a shared machine a descheduled thread's share goes
         * to the others instead of holding up the barrier */
#pragma omp for schedule(dynamic)
        for (int g = 0; g < (np + PANEL_GROUP - 1) / PANEL_GROUP; g++) {
            int p0 = g * PANEL_GROUP, p1 = p0 + PANEL_GROUP < np ? p0 + PANEL_GROUP : np;
            if (NV > 1) panels_wide(out, xp, w, rb, dt, IC, OC, t0, nt, p0, p1);
            else panels_narrow(out, xp, w, rb, dt, IC, OC, t0, nt, p0, p1);
        }
    }
}

bool ft_matmul_avx512(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC,
                      int n_threads, float *scratch, size_t scratch_floats) {
    if (dt != FT_F32 && dt != FT_BF16 && dt != FT_F16 && dt != FT_Q8_0 && dt != FT_Q4_0) return false;
    if (T < 1 || IC < 1 || OC < 1 || n_threads < 1) return false;
    int64_t rb = ft_dtype_nbytes(dt, IC);
    if (rb < 0) return false;
    if (T == 1) {
        int ng = (OC + GEMV_GROUP - 1) / GEMV_GROUP;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic)
        for (int g = 0; g < ng; g++)
            gemv_range(out, inp, w, (size_t)rb, dt, IC, g * GEMV_GROUP, g + 1 < ng ? (g + 1) * GEMV_GROUP : OC);
        return true;
    }
    if (scratch_floats < (size_t)MAX_ROWS * IC) return false;
    gemm(out, inp, w, (size_t)rb, dt, T, IC, OC, n_threads, scratch);
    return true;
}

#else /* not x86-64: no AVX-512 kernels */

bool ft_matmul_avx512(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC,
                      int n_threads, float *scratch, size_t scratch_floats) {
    return false;
}

#endif
