/* dtype_ggml.c — the reference conversions of ggml's weight blocks beyond
 * q8_0/q4_0 (layouts in core.h): each dequantizer computes, value for value,
 * what gguf-py's gguf.quants.dequantize and ggml's dequantize_row_* compute
 * (the same f32 products in the same order, no fused multiply-add: the
 * build's -std=c11 keeps -ffp-contract=off), and the quantizers of the
 * 32-element types follow ggml's quantize_row_*_ref. The traits rows that
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
            int q0 = (int8_t)((x[j] - mn) * id + 0.5f), q1 = (int8_t)((x[j + FT_QK / 2] - mn) * id + 0.5f);
            b->qs[j] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
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
            int q0 = (int8_t)(x[j] * id + 16.5f), q1 = (int8_t)(x[j + FT_QK / 2] * id + 16.5f);
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
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
            int q0 = (uint8_t)((x[j] - mn) * id + 0.5f), q1 = (uint8_t)((x[j + FT_QK / 2] - mn) * id + 0.5f);
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
