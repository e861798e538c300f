/* dtype_dot.c — the reference integer dot products of ggml's weight blocks
 * with activations quantized to 8 bits, as ggml computes them on its
 * vec_dot path: the f32 activation row is quantized to q8_0 (32-blocks),
 * q8_1 (32-blocks that also carry d·Σq, for the types with a min) or q8_K
 * (256-blocks with the sums of each 16), and each weight block meets its
 * activation block in an exact integer sum, scaled in f32. The order of the
 * f32 operations is fixed here (per block: the scales' product, times the
 * integer sum, added to the running f32 sum in block order), and the
 * kernels (cpu/kernels_q8.c) compute the integer sums in SIMD and then do
 * exactly these f32 operations, so they equal this reference bit for bit.
 * Quantizers follow ggml's quantize_row_q8_0/q8_1/q8_K references. */
#include "core/core.h"
#include "core/dtype_dot.h"

#include <math.h>
#include <string.h>

#define F16(h) ft_f16_to_f32(h)

/* ------------------------------------------------------- activations */

void ft_quantize_act_q8_0(const float *x, void *dst, int64_t n) {
    ft_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, x += FT_QK) {
        float amax = 0;
        for (int j = 0; j < FT_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = ft_f32_to_f16(d);
        for (int j = 0; j < FT_QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void ft_quantize_act_q8_1(const float *x, void *dst, int64_t n) {
    ft_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, x += FT_QK) {
        float amax = 0;
        for (int j = 0; j < FT_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < FT_QK; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = ft_f32_to_f16(d);
        y[i].s = ft_f32_to_f16((float)sum * d);
    }
}

void ft_quantize_act_q8_K(const float *x, void *dst, int64_t n) {
    ft_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / FT_QK_K; i++, x += FT_QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < FT_QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        memset(&y[i], 0, sizeof y[i]);
        if (amax == 0) continue;
        /* the largest magnitude maps to -127 exactly (its sign folded into the scale) */
        float iscale = -127.0f / max;
        for (int j = 0; j < FT_QK_K; j++) {
            long v = lrintf(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        }
        for (int j = 0; j < FT_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[j * 16 + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ------------------------------------------------------- 32-element blocks */

float ft_vec_dot_q8_0(const void *w, const void *act, int64_t n) {
    const ft_block_q8_0 *x = w, *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK; j++) s += x[i].qs[j] * y[i].qs[j];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

float ft_vec_dot_q4_0(const void *w, const void *act, int64_t n) {
    const ft_block_q4_0 *x = w;
    const ft_block_q8_0 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

float ft_vec_dot_q4_1(const void *w, const void *act, int64_t n) {
    const ft_block_q4_1 *x = w;
    const ft_block_q8_1 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s + F16(x[i].m) * F16(y[i].s);
    }
    return sum;
}

static inline int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

float ft_vec_dot_q5_0(const void *w, const void *act, int64_t n) {
    const ft_block_q5_0 *x = w;
    const ft_block_q8_0 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += (((x[i].qs[j] & 0x0F) | q5_high(x[i].qh, j)) - 16) * y[i].qs[j] +
                 (((x[i].qs[j] >> 4) | q5_high(x[i].qh, j + FT_QK / 2)) - 16) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

float ft_vec_dot_q5_1(const void *w, const void *act, int64_t n) {
    const ft_block_q5_1 *x = w;
    const ft_block_q8_1 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ((x[i].qs[j] & 0x0F) | q5_high(x[i].qh, j)) * y[i].qs[j] +
                 ((x[i].qs[j] >> 4) | q5_high(x[i].qh, j + FT_QK / 2)) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s + F16(x[i].m) * F16(y[i].s);
    }
    return sum;
}

float ft_vec_dot_iq4_nl(const void *w, const void *act, int64_t n) {
    const ft_block_iq4_nl *x = w;
    const ft_block_q8_0 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ft_iq4nl_code[x[i].qs[j] & 0x0F] * y[i].qs[j] + ft_iq4nl_code[x[i].qs[j] >> 4] * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * F16(y[i].d) * (float)s;
    }
    return sum;
}

/* ------------------------------------------------------- 256-element blocks */

/* q4_K/q5_K: x = d·sc·q - dmin·m per sub-block of 32, so
 * Σ x·y = y.d·(d·Σ_j sc_j·Σ q·q8 - dmin·Σ_j m_j·(the sub-block's two bsums)) */
float ft_vec_dot_q4_K(const void *w, const void *act, int64_t n) {
    const ft_block_q4_K *x = w;
    const ft_block_q8_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            ft_k4_scale_min(j, x[i].scales, &sc1, &m1);
            ft_k4_scale_min(j + 1, x[i].scales, &sc2, &m2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0x0F) * a[l];
                s2 += (q[l] >> 4) * a[l + 32];
            }
            isum += sc1 * s1 + sc2 * s2;
            msum += m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) + m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        sum += y[i].d * F16(x[i].d) * (float)isum - y[i].d * F16(x[i].dmin) * (float)msum;
    }
    return sum;
}

float ft_vec_dot_q5_K(const void *w, const void *act, int64_t n) {
    const ft_block_q5_K *x = w;
    const ft_block_q8_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        const int8_t *a = y[i].qs;
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            ft_k4_scale_min(j, x[i].scales, &sc1, &m1);
            ft_k4_scale_min(j + 1, x[i].scales, &sc2, &m2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((q[l] & 0x0F) | ((qh[l] >> j) & 1) << 4) * a[l];
                s2 += ((q[l] >> 4) | ((qh[l] >> (j + 1)) & 1) << 4) * a[l + 32];
            }
            isum += sc1 * s1 + sc2 * s2;
            msum += m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) + m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        sum += y[i].d * F16(x[i].d) * (float)isum - y[i].d * F16(x[i].dmin) * (float)msum;
    }
    return sum;
}

/* q6_K: x = d·sc·(q - 32) per sub-block of 16; Σ q·q8 - 32·bsum */
float ft_vec_dot_q6_K(const void *w, const void *act, int64_t n) {
    const ft_block_q6_K *x = w;
    const ft_block_q8_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales, *a = y[i].qs;
        int isum = 0;
        for (int h = 0; h < FT_QK_K; h += 128, ql += 64, qh += 32, sc += 8, a += 128) {
            int s[8] = { 0 };
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                s[is + 0] += (((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32) * a[l];
                s[is + 2] += (((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32) * a[l + 32];
                s[is + 4] += (((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32) * a[l + 64];
                s[is + 6] += (((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32) * a[l + 96];
            }
            for (int k = 0; k < 8; k++) isum += sc[k] * s[k];
        }
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

float ft_vec_dot_iq4_xs(const void *w, const void *act, int64_t n) {
    const ft_block_iq4_xs *x = w;
    const ft_block_q8_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int isum = 0;
        for (int ib = 0; ib < FT_QK_K / 32; ib++, q += 16, a += 32) {
            int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            int s = 0;
            for (int j = 0; j < 16; j++) s += ft_iq4nl_code[q[j] & 0x0F] * a[j] + ft_iq4nl_code[q[j] >> 4] * a[j + 16];
            isum += (ls - 32) * s;
        }
        sum += F16(x[i].d) * y[i].d * (float)isum;
    }
    return sum;
}
