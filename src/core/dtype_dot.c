/* dtype_dot.c — the reference integer dot products of ggml's weight blocks
 * with activations quantized to 16-bit integers: the f32 activation row is
 * quantized to a16 (32-blocks: an f32 scale, 32 int16 and their exact sum)
 * or a16_K (256-blocks with the exact sums of each 16), and each weight
 * block meets its activation block in an exact integer sum (int64 where a
 * 256-block's can pass 2^31), scaled in f32. The order of the f32
 * operations is fixed here (per block: the scales' product, times the
 * integer sum, added to the running f32 sum in block order), and the
 * kernels (cpu/kernels_a16.c) compute the integer sums in SIMD and then do
 * exactly these f32 operations, so they equal this reference bit for bit.
 *
 * Why 16 bits and not ggml's 8 (q8_0, q8_1, q8_K): measured on the two real
 * models, 8-bit activations move the held-out perplexity by 0.56% with f32
 * scales (1.25% with q8_1's f16 scale and f16 d·Σq, ggml's layout), 16-bit
 * ones by 0.007% (tests/cli_int_dot.sh): small models' normalised hidden
 * states have outlier channels, and a block scaled to one large value
 * leaves the others too few levels of 8 bits. */
#include "core/core.h"
#include "core/dtype_dot.h"

#include <math.h>
#include <string.h>

#define F16(h) ft_f16_to_f32(h)

/* ------------------------------------------------------- activations */

/* q = x/d rounded to nearest even, d = max|x|/32767 (0: all zero) */
static float quant16(const float *x, int16_t *q, int n) {
    float amax = 0;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 32767.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++) {
        long v = lrintf(x[j] * id);
        q[j] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
    }
    return d;
}

void ft_quantize_act_a16(const float *x, void *dst, int64_t n) {
    ft_block_a16 *y = dst;
    for (int64_t i = 0; i < n / FT_QK; i++, x += FT_QK) {
        y[i].d = quant16(x, y[i].qs, FT_QK);
        int s = 0;
        for (int j = 0; j < FT_QK; j++) s += y[i].qs[j];
        y[i].sum = s;
    }
}

void ft_quantize_act_a16_K(const float *x, void *dst, int64_t n) {
    ft_block_a16_K *y = dst;
    for (int64_t i = 0; i < n / FT_QK_K; i++, x += FT_QK_K) {
        y[i].d = quant16(x, y[i].qs, FT_QK_K);
        for (int g = 0; g < FT_QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[i].qs[g * 16 + l];
            y[i].bsums[g] = s;
        }
    }
}

void ft_a16_to_f32(const void *src, float *y, int64_t n) {
    const ft_block_a16 *b = src;
    for (int64_t i = 0; i < n / FT_QK; i++, y += FT_QK)
        for (int j = 0; j < FT_QK; j++) y[j] = b[i].d * (float)b[i].qs[j];
}

void ft_a16_K_to_f32(const void *src, float *y, int64_t n) {
    const ft_block_a16_K *b = src;
    for (int64_t i = 0; i < n / FT_QK_K; i++, y += FT_QK_K)
        for (int j = 0; j < FT_QK_K; j++) y[j] = b[i].d * (float)b[i].qs[j];
}

/* ------------------------------------------------------- 32-element blocks */

float ft_vec_dot_q8_0(const void *w, const void *act, int64_t n) {
    const ft_block_q8_0 *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK; j++) s += x[i].qs[j] * y[i].qs[j];
        sum += F16(x[i].d) * y[i].d * (float)s;
    }
    return sum;
}

/* q4_0, q5_0: Σ (q - off)·a = Σ q·a - off·Σa */
float ft_vec_dot_q4_0(const void *w, const void *act, int64_t n) {
    const ft_block_q4_0 *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)(s - 8 * y[i].sum);
    }
    return sum;
}

/* q4_1, q5_1: Σ (d·q + m)·a = d·Σ q·a + m·Σa */
float ft_vec_dot_q4_1(const void *w, const void *act, int64_t n) {
    const ft_block_q4_1 *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)s + F16(x[i].m) * y[i].d * (float)y[i].sum;
    }
    return sum;
}

static inline int q5_high(const uint8_t qh[4], int j) { return ((qh[j / 8] >> (j % 8)) & 1) << 4; }

float ft_vec_dot_q5_0(const void *w, const void *act, int64_t n) {
    const ft_block_q5_0 *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ((x[i].qs[j] & 0x0F) | q5_high(x[i].qh, j)) * y[i].qs[j] +
                 ((x[i].qs[j] >> 4) | q5_high(x[i].qh, j + FT_QK / 2)) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)(s - 16 * y[i].sum);
    }
    return sum;
}

float ft_vec_dot_q5_1(const void *w, const void *act, int64_t n) {
    const ft_block_q5_1 *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ((x[i].qs[j] & 0x0F) | q5_high(x[i].qh, j)) * y[i].qs[j] +
                 ((x[i].qs[j] >> 4) | q5_high(x[i].qh, j + FT_QK / 2)) * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)s + F16(x[i].m) * y[i].d * (float)y[i].sum;
    }
    return sum;
}

float ft_vec_dot_iq4_nl(const void *w, const void *act, int64_t n) {
    const ft_block_iq4_nl *x = w;
    const ft_block_a16 *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK; i++) {
        int s = 0;
        for (int j = 0; j < FT_QK / 2; j++)
            s += ft_iq4nl_code[x[i].qs[j] & 0x0F] * y[i].qs[j] + ft_iq4nl_code[x[i].qs[j] >> 4] * y[i].qs[j + FT_QK / 2];
        sum += F16(x[i].d) * y[i].d * (float)s;
    }
    return sum;
}

/* ------------------------------------------------------- 256-element blocks */

/* q4_K/q5_K (qh NULL for q4_K): x = d·sc·q - dmin·m per sub-block of 32, so
 * Σ x·a = a.d·(d·Σ_j sc_j·Σ q·qa - dmin·Σ_j m_j·(the sub-block's two bsums));
 * q5_K's fifth bit of element l of sub-block j is bit j of qh[l] */
static float dot_k45(uint16_t d, uint16_t dmin, const uint8_t *scales, const uint8_t *q, const uint8_t *qh,
                     const ft_block_a16_K *y) {
    const int16_t *a = y->qs;
    int64_t isum = 0, msum = 0;
    for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
        uint8_t sc1, m1, sc2, m2;
        ft_k4_scale_min(j, scales, &sc1, &m1);
        ft_k4_scale_min(j + 1, scales, &sc2, &m2);
        int s1 = 0, s2 = 0;
        for (int l = 0; l < 32; l++) {
            int h1 = qh ? ((qh[l] >> j) & 1) << 4 : 0, h2 = qh ? ((qh[l] >> (j + 1)) & 1) << 4 : 0;
            s1 += ((q[l] & 0x0F) | h1) * a[l];
            s2 += ((q[l] >> 4) | h2) * a[l + 32];
        }
        isum += (int64_t)sc1 * s1 + (int64_t)sc2 * s2;
        msum += (int64_t)m1 * (y->bsums[2 * j] + y->bsums[2 * j + 1]) + (int64_t)m2 * (y->bsums[2 * j + 2] + y->bsums[2 * j + 3]);
    }
    return y->d * F16(d) * (float)isum - y->d * F16(dmin) * (float)msum;
}

float ft_vec_dot_q4_K(const void *w, const void *act, int64_t n) {
    const ft_block_q4_K *x = w;
    const ft_block_a16_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) sum += dot_k45(x[i].d, x[i].dmin, x[i].scales, x[i].qs, NULL, &y[i]);
    return sum;
}

float ft_vec_dot_q5_K(const void *w, const void *act, int64_t n) {
    const ft_block_q5_K *x = w;
    const ft_block_a16_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) sum += dot_k45(x[i].d, x[i].dmin, x[i].scales, x[i].qs, x[i].qh, &y[i]);
    return sum;
}

/* q6_K: x = d·sc·(q - 32) per sub-block of 16; Σ q·qa - 32·bsum */
float ft_vec_dot_q6_K(const void *w, const void *act, int64_t n) {
    const ft_block_q6_K *x = w;
    const ft_block_a16_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        const int16_t *a = y[i].qs;
        const int32_t *bs = y[i].bsums;
        int64_t isum = 0;
        for (int h = 0; h < FT_QK_K; h += 128, ql += 64, qh += 32, sc += 8, a += 128, bs += 8) {
            int s[8] = { 0 };
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                s[is + 0] += ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) * a[l];
                s[is + 2] += ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) * a[l + 32];
                s[is + 4] += ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) * a[l + 64];
                s[is + 6] += ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) * a[l + 96];
            }
            for (int k = 0; k < 8; k++) isum += (int64_t)sc[k] * (s[k] - 32 * bs[k]);
        }
        sum += y[i].d * F16(x[i].d) * (float)isum;
    }
    return sum;
}

float ft_vec_dot_iq4_xs(const void *w, const void *act, int64_t n) {
    const ft_block_iq4_xs *x = w;
    const ft_block_a16_K *y = act;
    float sum = 0;
    for (int64_t i = 0; i < n / FT_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int16_t *a = y[i].qs;
        int64_t isum = 0;
        for (int ib = 0; ib < FT_QK_K / 32; ib++, q += 16, a += 32) {
            int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0x0F) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            int s = 0;
            for (int j = 0; j < 16; j++) s += ft_iq4nl_code[q[j] & 0x0F] * a[j] + ft_iq4nl_code[q[j] >> 4] * a[j + 16];
            isum += (int64_t)(ls - 32) * s;
        }
        sum += F16(x[i].d) * y[i].d * (float)isum;
    }
    return sum;
}
