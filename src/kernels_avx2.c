/* kernels_avx2.c — AVX2 + FMA + F16C kernels for Linear's forward
 * (kernels.h), for x86-64 CPUs without AVX-512. The same two shapes as
 * kernels_avx512.c at half the vector width: a fused widen/dequantize-dot
 * for one row (decode) and a register-blocked GEMM over f32-widened weight
 * panels against input rows packed transposed (prefill). AVX2 has no
 * masked 16-bit loads, so ragged ends go through small zero-padded copies.
 * Weights are widened exactly, so only the order of the f32 sums differs
 * from the reference. */
#include "kernels.h"

#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

/* ggml block layouts, as in kernels_avx512.c and dtype.c */
#define QK 32
#define Q8_BYTES 34
#define Q4_BYTES 18

#define KC 256
#define MAX_ROWS 128
/* register tile: MR weight rows × NV vectors of 8 input rows (16 ymm registers) */
#define MR_WIDE 6
#define NV_WIDE 2
#define MR_NARROW 12
#define MR_MAX 12
#define NV_MAX 2

INLINE float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 f32, bf16 or f16 values at p -> f32. */
INLINE __m256 load8(const void *p, int dt) {
    if (dt == FT_F32) return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (dt == FT_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The first n < 8 values at p, zero-padded: read through a copy, since
 * AVX2 cannot mask 16-bit loads. */
INLINE __m256 load8_tail(const void *p, int n, int dt) {
    uint8_t buf[32] = { 0 };
    memcpy(buf, p, (size_t)n * (dt == FT_F32 ? 4 : 2));
    return load8(buf, dt);
}

/* A q8_0 block -> 32 floats, d·q exactly. */
INLINE void q8_block(const uint8_t *p, __m256 w[4]) {
    __m256 d = _mm256_set1_ps(half_at(p));
    for (int i = 0; i < 4; i++) {
        __m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * i));
        w[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
    }
}

/* A q4_0 block -> 32 floats, (q-8)·d exactly as q·d + (-8d). */
INLINE void q4_block(const uint8_t *p, __m256 w[4]) {
    float dh = half_at(p);
    __m256 d = _mm256_set1_ps(dh), m8d = _mm256_set1_ps(-8.0f * dh);
    __m256i q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2)));
    __m256i q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 10)));
    __m256i m = _mm256_set1_epi32(15);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q0, m)), d, m8d);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q1, m)), d, m8d);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), d, m8d);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)), d, m8d);
}

/* ---------------------------------------------------------------- decode */

/* out[r] = (row r of w) · x for r < MR (MR ≤ 4); rows rb bytes apart. */
INLINE void gemv_tile(float *out, const float *x, const uint8_t *w, size_t rb, int IC, const int MR, const int dt) {
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    if (dt == FT_F32 || dt == FT_BF16 || dt == FT_F16) {
        size_t es = dt == FT_F32 ? 4 : 2;
        int k = 0;
        for (; k + 16 <= IC; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const uint8_t *wr = w + r * rb + k * es;
                acc[r][0] = _mm256_fmadd_ps(load8(wr, dt), x0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(load8(wr + 8 * es, dt), x1, acc[r][1]);
            }
        }
        for (; k < IC; k += 8) {
            int n = IC - k < 8 ? IC - k : 8;
            __m256 x0 = n == 8 ? _mm256_loadu_ps(x + k) : load8_tail(x + k, n, FT_F32);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const uint8_t *wr = w + r * rb + k * es;
                acc[r][0] = _mm256_fmadd_ps(n == 8 ? load8(wr, dt) : load8_tail(wr, n, dt), x0, acc[r][0]);
            }
        }
    } else {
        for (int b = 0; b < IC / QK; b++) {
            const float *xb = x + b * QK;
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
            __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                __m256 wv[4];
                if (dt == FT_Q8_0) q8_block(w + r * rb + (size_t)b * Q8_BYTES, wv);
                else q4_block(w + r * rb + (size_t)b * Q4_BYTES, wv);
                acc[r][0] = _mm256_fmadd_ps(wv[0], x0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(wv[1], x1, acc[r][1]);
                acc[r][0] = _mm256_fmadd_ps(wv[2], x2, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(wv[3], x3, acc[r][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) out[r] = hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
}

INLINE void gemv_range_dt(float *out, const float *x, const uint8_t *w, size_t rb, int IC, int o0, int o1,
                          const int dt) {
    int o = o0;
    for (; o + 4 <= o1; o += 4) gemv_tile(out + o, x, w + (size_t)o * rb, rb, IC, 4, dt);
    for (; o < o1; o++) gemv_tile(out + o, x, w + (size_t)o * rb, rb, IC, 1, dt);
}

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

/* Transposes the 8×8 floats in r. */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* s[4i+j] holds, in 128-bit lane L, rows 4i..4i+3 of column 4L+j */
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        __m256 a = t[4 * i], b = t[4 * i + 1], c = t[4 * i + 2], d = t[4 * i + 3];
        s[4 * i] = _mm256_shuffle_ps(a, c, 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(a, c, 0xEE);
        s[4 * i + 2] = _mm256_shuffle_ps(b, d, 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(b, d, 0xEE);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
}

/* Packs rows [t0, t0+8) (those < nrows; the rest zero) and columns
 * [k, k+8) of x (nrows, IC) into xp: column kk lands at xp[kk·ld .. +8). */
TARGET static void pack_x8(float *xp, size_t ld, const float *x, int nrows, int IC, int t0, int k) {
    int n = IC - k < 8 ? IC - k : 8;
    __m256 r[8];
    for (int i = 0; i < 8; i++) {
        const float *src = x + (size_t)(t0 + i) * IC + k;
        r[i] = t0 + i >= nrows ? _mm256_setzero_ps() : n == 8 ? _mm256_loadu_ps(src) : load8_tail(src, n, FT_F32);
    }
    transpose8(r);
    for (int kk = 0; kk < n; kk++) _mm256_storeu_ps(xp + (size_t)kk * ld, r[kk]);
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
                for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(dst + k, load8(h + k, FT_BF16));
            else
                for (; k + 8 <= kc; k += 8) _mm256_storeu_ps(dst + k, load8(h + k, FT_F16));
            if (k < kc) {
                __m256 v = dt == FT_BF16 ? load8_tail(h + k, kc - k, FT_BF16) : load8_tail(h + k, kc - k, FT_F16);
                float tmp[8];
                _mm256_storeu_ps(tmp, v);
                memcpy(dst + k, tmp, (size_t)(kc - k) * sizeof(float));
            }
        } else {
            for (int k = 0; k < kc; k += QK) {
                __m256 wv[4];
                int b = (k0 + k) / QK;
                if (dt == FT_Q8_0) q8_block(row + (size_t)b * Q8_BYTES, wv);
                else q4_block(row + (size_t)b * Q4_BYTES, wv);
                for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + k + 8 * i, wv[i]);
            }
        }
    }
}

/* cb (MR, 8·NV) += wp (MR, kc; rows KC apart) · xp (kc, 8·NV). */
INLINE void tile(float *cb, const float *xp, const float *wp, int kc, const int MR, const int NV) {
    const int L = 8 * NV;
    __m256 acc[MR_MAX][NV_MAX];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) acc[r][j] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 xv[NV_MAX];
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) xv[j] = _mm256_loadu_ps(xp + (size_t)k * L + 8 * j);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m256 b = _mm256_broadcast_ss(wp + r * KC + k);
#pragma GCC unroll 2
            for (int j = 0; j < NV; j++) acc[r][j] = _mm256_fmadd_ps(b, xv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int j = 0; j < NV; j++) {
            float *c = cb + r * L + 8 * j;
            _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), acc[r][j]));
        }
}

INLINE void panels(float *out, const float *xp, const uint8_t *w, size_t rb, ft_dtype dt, int IC, int OC, int t0,
                   int nt, int p0, int p1, const int MR, const int NV) {
    const int L = 8 * NV;
    int nch = (nt + L - 1) / L;
    float wp[MR_MAX * KC] __attribute__((aligned(32)));
    float cb[MAX_ROWS * MR_MAX] __attribute__((aligned(32))); /* nch chunks of (MR, L) */
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
    int NV = T > 8 ? NV_WIDE : 1, L = 8 * NV, MR = NV > 1 ? MR_WIDE : MR_NARROW;
    int np = (OC + MR - 1) / MR, nk8 = (IC + 7) / 8;
#pragma omp parallel num_threads(n_threads)
    for (int t0 = 0; t0 < T; t0 += MAX_ROWS) {
        int nt = T - t0 < MAX_ROWS ? T - t0 : MAX_ROWS, nch = (nt + L - 1) / L;
        const float *x = inp + (size_t)t0 * IC;
        /* chunk c, 8-lane group g, column k at xp + c·IC·L + k·L + 8g */
#pragma omp for schedule(static)
        for (int job = 0; job < nch * NV * nk8; job++) {
            int c = job / (NV * nk8), g = job / nk8 % NV, k = job % nk8 * 8;
            pack_x8(xp + (size_t)c * IC * L + (size_t)k * L + 8 * g, (size_t)L, x, nt, IC, c * L + 8 * g, k);
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

bool ft_matmul_avx2(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC, int n_threads,
                    float *scratch, size_t scratch_floats) {
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

#else /* not x86-64 */

bool ft_matmul_avx2(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC, int n_threads,
                    float *scratch, size_t scratch_floats) {
    return false;
}

#endif
