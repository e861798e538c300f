/* dtype_ggml.c — the reference conversions of ggml's weight blocks beyond
 * q8_0/q4_0 (layouts in core.h): each dequantizer computes, value for value,
 * what gguf-py's gguf.quants.dequantize and ggml's dequantize_row_* compute
 * (the same f32 products in the same order, no fused multiply-add: the
 * build's -std=c11 keeps -ffp-contract=off), and the quantizers (the
 * 32-element types', q4_K, q5_K, q6_K) follow ggml's quantize_row_*_ref
 * (no importance matrix) operation for operation, so that their bytes are
 * llama-quantize's. The traits rows that
 * use them are in dtype.c. */
#include "core/core.h"
#include "core/dtype_ggml.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define F16(h) ft_f16_to_f32(h)

const int8_t ft_iq4nl_code[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* ------------------------------------------------------- 32-element blocks */

void ft_q4_1_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q4_1 *b = s;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, y += FT_QK) {
        float d = F16(b->d), m = F16(b->m);
        for (int j = 0; j < FT_QK / 2; j++) {
            y[j] = d * (float)(b->qs[j] & 0x0F) + m;
            y[j + FT_QK / 2] = d * (float)(b->qs[j] >> 4) + m;
        }
    }
}

/* element j's fifth bit from qh (little-endian u32), in place 4 */
static inline int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

void ft_q5_0_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q5_0 *b = s;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, y += FT_QK) {
        float d = F16(b->d);
        for (int j = 0; j < FT_QK / 2; j++) {
            y[j] = d * (float)(((b->qs[j] & 0x0F) | q5_high(b->qh, j)) - 16);
            y[j + FT_QK / 2] = d * (float)(((b->qs[j] >> 4) | q5_high(b->qh, j + FT_QK / 2)) - 16);
        }
    }
}

void ft_q5_1_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q5_1 *b = s;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, y += FT_QK) {
        float d = F16(b->d), m = F16(b->m);
        for (int j = 0; j < FT_QK / 2; j++) {
            y[j] = d * (float)((b->qs[j] & 0x0F) | q5_high(b->qh, j)) + m;
            y[j + FT_QK / 2] = d * (float)((b->qs[j] >> 4) | q5_high(b->qh, j + FT_QK / 2)) + m;
        }
    }
}

void ft_q8_1_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q8_1 *b = s;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, y += FT_QK) {
        float d = F16(b->d);
        for (int j = 0; j < FT_QK; j++) y[j] = (float)b->qs[j] * d;
    }
}

void ft_iq4_nl_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_iq4_nl *b = s;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, y += FT_QK) {
        float d = F16(b->d);
        for (int j = 0; j < FT_QK / 2; j++) {
            y[j] = d * (float)ft_iq4nl_code[b->qs[j] & 0x0F];
            y[j + FT_QK / 2] = d * (float)ft_iq4nl_code[b->qs[j] >> 4];
        }
    }
}

/* The smallest and largest of x[0..n). */
static void min_max(const float *x, int n, float *lo, float *hi) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    *lo = mn;
    *hi = mx;
}

/* ggml's quantize_row_q4_1_ref: d = (max-min)/15, q = min(15, (int8)((x-min)/d + 0.5)). */
void ft_q4_1_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, x += FT_QK) {
        float mn, mx;
        min_max(x, FT_QK, &mn, &mx);
        float d = (mx - mn) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b->d = ft_f32_to_f16(d);
        b->m = ft_f32_to_f16(mn);
        for (int j = 0; j < FT_QK / 2; j++) {
            int q0 = ft_code_i8((x[j] - mn) * id + 0.5f), q1 = ft_code_i8((x[j + FT_QK / 2] - mn) * id + 0.5f);
            uint8_t u0 = (uint8_t)(q0 < 15 ? q0 : 15), u1 = (uint8_t)(q1 < 15 ? q1 : 15);
            b->qs[j] = (uint8_t)(u0 | u1 << 4);
        }
    }
}

/* ggml's quantize_row_q5_0_ref: d = max/-16 (max: the value of largest
 * magnitude), q = min(31, (int8)(x/d + 16.5)). */
void ft_q5_0_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, x += FT_QK) {
        float amax = 0, max = 0;
        for (int j = 0; j < FT_QK; j++)
            if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
        float d = max / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b->d = ft_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < FT_QK / 2; j++) {
            int q0 = ft_code_i8(x[j] * id + 16.5f), q1 = ft_code_i8(x[j + FT_QK / 2] * id + 16.5f);
            q0 = (uint8_t)(q0 < 31 ? q0 : 31); /* ggml: MIN(31, (int8_t)·) as a uint8_t */
            q1 = (uint8_t)(q1 < 31 ? q1 : 31);
            b->qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j | (uint32_t)((q1 & 0x10) >> 4) << (j + FT_QK / 2);
        }
        for (int k = 0; k < 4; k++) b->qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* ggml's quantize_row_q5_1_ref: d = (max-min)/31, q = (uint8)((x-min)/d + 0.5). */
void ft_q5_1_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, b++, x += FT_QK) {
        float mn, mx;
        min_max(x, FT_QK, &mn, &mx);
        float d = (mx - mn) / 31.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b->d = ft_f32_to_f16(d);
        b->m = ft_f32_to_f16(mn);
        uint32_t qh = 0;
        for (int j = 0; j < FT_QK / 2; j++) {
            int q0 = ft_code_byte((x[j] - mn) * id + 0.5f), q1 = ft_code_byte((x[j + FT_QK / 2] - mn) * id + 0.5f);
            b->qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)((q0 & 0x10) >> 4) << j | (uint32_t)((q1 & 0x10) >> 4) << (j + FT_QK / 2);
        }
        for (int k = 0; k < 4; k++) b->qh[k] = (uint8_t)(qh >> (8 * k));
    }
}

/* ------------------------------------------------------- K-quants (256) */

void ft_q2_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q2_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++) {
        float d = F16(b->d), dmin = F16(b->dmin);
        const uint8_t *q = b->qs;
        int is = 0;
        for (int h = 0; h < FT_QK_K; h += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int half = 0; half < 2; half++) {
                    uint8_t sc = b->scales[is++];
                    float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
    }
}

/* q3_K's 16 6-bit scales, minus 32 */
static void q3_K_scales(const uint8_t p[12], int sc[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? p[j] & 0x0F : p[j - 8] >> 4;
        int hi = (p[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (lo | hi << 4) - 32;
    }
}

void ft_q3_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q3_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++) {
        float d = F16(b->d);
        int sc[16];
        q3_K_scales(b->scales, sc);
        const uint8_t *q = b->qs;
        int is = 0, bit = 0;
        for (int h = 0; h < FT_QK_K; h += 128, q += 32)
            for (int shift = 0; shift < 8; shift += 2, bit++)
                for (int half = 0; half < 2; half++) {
                    float dl = d * (float)sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int v = ((q[l] >> shift) & 3) - ((b->hmask[l] >> bit) & 1 ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
    }
}

void ft_q4_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q4_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++) {
        float d = F16(b->d), dmin = F16(b->dmin);
        const uint8_t *q = b->qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, mn;
            ft_k4_scale_min(j, b->scales, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
            float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0F) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void ft_q5_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q5_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++) {
        float d = F16(b->d), dmin = F16(b->dmin);
        const uint8_t *q = b->qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, mn;
            ft_k4_scale_min(j, b->scales, &sc, &mn);
            float d1 = d * (float)sc, m1 = dmin * (float)mn;
            ft_k4_scale_min(j + 1, b->scales, &sc, &mn);
            float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] & 0x0F) | ((b->qh[l] >> j) & 1) << 4) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((q[l] >> 4) | ((b->qh[l] >> (j + 1)) & 1) << 4) - m2;
        }
    }
}

void ft_q6_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q6_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++, y += FT_QK_K) {
        float d = F16(b->d);
        const uint8_t *ql = b->ql, *qh = b->qh;
        const int8_t *sc = b->scales;
        for (int h = 0; h < FT_QK_K; h += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[h + l] = d * (float)sc[is] * (float)q1;
                y[h + l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[h + l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[h + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}

void ft_q8_K_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_q8_K *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++, y += FT_QK_K)
        for (int j = 0; j < FT_QK_K; j++) y[j] = b->d * (float)b->qs[j];
}

void ft_iq4_xs_to_f32(const void *s, float *y, int64_t n) {
    const ft_block_iq4_xs *b = s;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++) {
        float d = F16(b->d);
        const uint8_t *qs = b->qs;
        for (int ib = 0; ib < FT_QK_K / 32; ib++, qs += 16, y += 32) {
            int ls = ((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | ((b->scales_h >> 2 * ib) & 3) << 4;
            float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)ft_iq4nl_code[qs[j] & 0x0F];
                y[j + 16] = dl * (float)ft_iq4nl_code[qs[j] >> 4];
            }
        }
    }
}

/* ------------------------------------------------- K-quant quantizers */

/* Round to the nearest integer, ties to even, as ggml's nearest_int: adding
 * 1.5·2^23 leaves the integer in the float's low mantissa bits. Exact for
 * |v| < 2^22; beyond that ggml's assertion is compiled out and its result is
 * these same bits, which are kept so that every block matches its. */
static inline int k_round(float v) {
    union { float f; int32_t i; } u = { .f = v + 12582912.0f };
    return (u.i & 0x007FFFFF) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ggml's make_qkx2_quants: the scale s and min m (returned as -m, >= 0) of n
 * weights x, codes q in [0, nmax], that minimize the weighted squared error
 * Σ w·(s·q + m - x)², m <= 0: the min-max grid first, then nstep+1 grids of
 * (nmax + rmin + k·rdelta) steps over [min, max], each solved in closed form
 * for s and m (weighted least squares) and kept where the error falls. */
static float k_fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *q, float *neg_min, float rmin,
                             float rdelta, int nstep) {
    uint8_t aux[32];
    float lo = x[0], hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(q, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = (float)nmax / (hi - lo), scale = 1.0f / inv, best = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (uint8_t)clampi(k_round(inv * (x[i] - lo)), 0, nmax);
        float e = scale * (float)q[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    for (int k = 0; k <= nstep; k++) {
        inv = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(k_round(inv * (x[i] - lo)), 0, nmax);
            aux[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float s = (sw * sxl - sx * sl) / det, m = (sl2 * sx - sl * sxl) / det;
        if (m > 0) {
            m = 0;
            s = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float e = s * (float)aux[i] + m - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) {
            memcpy(q, aux, (size_t)n);
            best = err;
            scale = s;
            lo = m;
        }
    }
    *neg_min = -lo;
    return scale;
}

/* ggml's make_qx_quants with rmse_type 1 (weights x², no importance
 * matrix): the signed scale of n weights and codes q + nmax in [0, 2·nmax),
 * the best of 19 grids -(nmax + k/10)/max, k in [-9, 9], by the
 * least-squares criterion (Σwxq)²/Σwq². */
static float k_fit_scale_signed(int n, int nmax, const float *x, int8_t *q) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); max = x[i]; }
    if (amax < 1e-15f) { /* ggml's GROUP_MAX_EPS: an all-zero group */
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    float inv = (float)-nmax / max, sxl = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(k_round(inv * x[i]), -nmax, nmax - 1);
        q[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sxl += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    float scale = sl2 != 0 ? sxl / sl2 : 0.0f, best = scale * sxl;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        inv = -((float)nmax + 0.1f * (float)k) / max;
        sxl = sl2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(k_round(inv * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sxl += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
        }
        if (sl2 > 0 && sxl * sxl > best * sl2) {
            for (int i = 0; i < n; i++) q[i] = (int8_t)(nmax + clampi(k_round(inv * x[i]), -nmax, nmax - 1));
            scale = sxl / sl2;
            best = scale * sxl;
        }
    }
    return scale;
}

/* q4_K and q5_K (ggml's quantize_row_q4_K_ref / q5_K_ref): each sub-block
 * of 32 fitted by k_fit_scale_min with weights rms(x) + |x|; the 8 scales
 * and mins quantized to 6 bits against the largest of each (d, dmin in
 * f16); then every code recomputed from the stored scale and min. Fills
 * d, dmin, the 12 scale bytes and q[256] (codes in [0, nmax]). */
static void k_quantize_scale_min(const float *x, int nmax, float rmin, int nstep, uint16_t *d, uint16_t *dmin,
                                 uint8_t scales[12], uint8_t q[FT_QK_K]) {
    float sc[8], mn[8], w[32], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
        float rms = sqrtf(s2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
        sc[j] = k_fit_scale_min(32, nmax, xs, w, q + 32 * j, &mn[j], rmin, 0.1f, nstep);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    float isc = max_sc > 0 ? 63.0f / max_sc : 0.0f, imn = max_mn > 0 ? 63.0f / max_mn : 0.0f;
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        /* ggml stores the rounded value in a uint8_t before its MIN(63, ·) */
        int ls = (uint8_t)k_round(isc * sc[j]), lm = (uint8_t)k_round(imn * mn[j]);
        ls = ls < 63 ? ls : 63;
        lm = lm < 63 ? lm : 63;
        if (j < 4) {
            scales[j] = (uint8_t)ls;
            scales[j + 4] = (uint8_t)lm;
        } else { /* the low 4 bits in bytes 8..11, the high 2 on top of bytes 0..7 */
            scales[j + 4] = (uint8_t)((ls & 0x0F) | (lm & 0x0F) << 4);
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = ft_f32_to_f16(max_sc / 63.0f);
    *dmin = ft_f32_to_f16(max_mn / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        ft_k4_scale_min(j, scales, &s, &m);
        float dl = F16(*d) * (float)s;
        if (dl == 0) continue; /* codes of a zero scale stay the fit's */
        float ml = F16(*dmin) * (float)m;
        for (int l = 0; l < 32; l++) q[32 * j + l] = (uint8_t)clampi(k_round((x[32 * j + l] + ml) / dl), 0, nmax);
    }
}

void ft_q4_K_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q4_K *b = dst;
    uint8_t q[FT_QK_K];
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++, x += FT_QK_K) {
        k_quantize_scale_min(x, 15, -1.0f, 20, &b->d, &b->dmin, b->scales, q);
        for (int j = 0; j < 4; j++) /* 64 codes per 32 bytes: sub-block 2j low nibbles, 2j+1 high */
            for (int l = 0; l < 32; l++) b->qs[32 * j + l] = (uint8_t)(q[64 * j + l] | q[64 * j + 32 + l] << 4);
    }
}

void ft_q5_K_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q5_K *b = dst;
    uint8_t q[FT_QK_K];
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++, x += FT_QK_K) {
        k_quantize_scale_min(x, 31, -0.5f, 15, &b->d, &b->dmin, b->scales, q);
        memset(b->qh, 0, sizeof b->qh);
        for (int j = 0; j < 4; j++) /* the fifth bits of sub-blocks 2j, 2j+1: bits 2j, 2j+1 of qh[l] */
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * j + l], hi = q[64 * j + 32 + l];
                b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1)));
                b->qs[32 * j + l] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
            }
    }
}

/* ggml's quantize_row_q6_K_ref: each sub-block of 16 fitted by
 * k_fit_scale_signed (nmax 32); the 16 scales quantized to int8 against
 * the one of largest magnitude (d = that / -128, in f16); then every code
 * recomputed from the stored scale, in [-32, 31]. */
void ft_q6_K_from_f32(const float *x, void *dst, int64_t n) {
    ft_block_q6_K *b = dst;
    for (int64_t i = 0; i < n / FT_QK_K; i++, b++, x += FT_QK_K) {
        int8_t q[FT_QK_K];
        float sc[16], max_sc = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            sc[j] = k_fit_scale_signed(16, 32, x + 16 * j, q + 16 * j);
            if (fabsf(sc[j]) > amax) { amax = fabsf(sc[j]); max_sc = sc[j]; }
        }
        memset(b, 0, sizeof *b);
        if (amax < 1e-15f) continue; /* ggml's GROUP_MAX_EPS: all zero, d = 0 */
        float inv = -128.0f / max_sc;
        b->d = ft_f32_to_f16(1.0f / inv);
        for (int j = 0; j < 16; j++) {
            int s = k_round(inv * sc[j]);
            b->scales[j] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < 16; j++) {
            float dl = F16(b->d) * (float)b->scales[j];
            if (dl == 0) continue;
            for (int l = 0; l < 16; l++) q[16 * j + l] = (int8_t)(clampi(k_round(x[16 * j + l] / dl), -32, 31) + 32);
        }
        /* 128 codes per 64 bytes of ql and 32 of qh: element h+l (l < 32) and
         * h+l+64 share ql[l]'s nibbles, h+l+32 and h+l+96 ql[l+32]'s; qh[l]
         * holds the top 2 bits of all four */
        for (int h = 0; h < 2; h++) {
            const int8_t *qq = q + 128 * h;
            uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
                ql[l] = (uint8_t)((q1 & 0x0F) | (q3 & 0x0F) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0x0F) | (q4 & 0x0F) << 4);
                qh[l] = (uint8_t)((q1 >> 4) | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}
