/* test_int_dot.c — the integer dot products of the decode path: every
 * weight dtype with a vec_dot, on random blocks (every bit pattern of the
 * quants and scales, the f16 scales made finite) and random activations
 * (with an all-zero block and one dominated by a single value):
 *   - the activation quantizers (16 bits): every element within half a
 *     step of x, the sums exact;
 *   - the reference vec_dot (dtype_dot.c) against the float64 product of
 *     the dequantized weights and the dequantized activations: the integer
 *     part is exact, so the only error is the f32 scaling of each block and
 *     the f32 running sum (tolerance 1e-5 of Σ|w·a|, about 100 f32 ulps);
 *   - the AVX2 and AVX-512 VNNI kernels equal to the reference bit for bit,
 *     on 37 rows (two of the VNNI kernel's 16-row groups and a tail), and
 *     on blocks at the extremes (every quant at its largest magnitude, the
 *     largest sub-block scales, activations ±32767 throughout), where an
 *     int32 lane that overflowed would show;
 *   - ft_gemm_in's GEMV with integer products on: each output the
 *     reference's, the same bits on 1, 2 and 3 threads, and against the
 *     widened f32 product within what 16-bit activations cost (reported). */
#include "check.h"
#include "core/dtype_dot.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"

#include <math.h>

static const ft_dtype types[] = { FT_Q8_0, FT_Q4_0, FT_Q4_1, FT_Q5_0, FT_Q5_1, FT_IQ4_NL,
                                  FT_Q4_K, FT_Q5_K, FT_Q6_K, FT_IQ4_XS };
#define NTYPES (int)(sizeof types / sizeof types[0])

static ft_rng rng;

/* nb random blocks of t with finite f16 scales of magnitude below 2^-4 */
static void random_blocks(uint8_t *p, ft_dtype t, int nb) {
    size_t bb = ft_types[t].block_bytes;
    for (size_t i = 0; i < (size_t)nb * bb; i++) p[i] = (uint8_t)(ft_rng_u32(&rng) >> 24);
    for (int b = 0; b < nb; b++)
        for (int s = 0; s < ft_types[t].n_scales; s++) {
            uint16_t h = ft_f32_to_f16((2.0f * ft_rng_uniform(&rng) - 1.0f) / 16.0f);
            memcpy(p + (size_t)b * bb + ft_types[t].scale_at[s], &h, 2);
        }
}

static void random_act(float *x, int K) {
    for (int i = 0; i < K; i++) x[i] = ft_rng_normal(&rng);
    for (int i = 0; i < 32 && i < K; i++) x[i] = 0;          /* an all-zero block */
    if (K >= 64) x[40] = 1000.0f;                            /* one value dominating its block */
}

static void to_f32_act(ft_dtype at, const void *q, float *y, int K) {
    if (at == FT_A16) ft_a16_to_f32(q, y, K);
    else ft_a16_K_to_f32(q, y, K);
}

static void test_quantize_act(void) {
    const ft_dtype acts[] = { FT_A16, FT_A16_K };
    const int K = 1024;
    float x[1024], y[1024];
    static uint8_t q[4096];
    for (int a = 0; a < 2; a++) {
        random_act(x, K);
        ft_types[acts[a]].quantize_act(x, q, K);
        to_f32_act(acts[a], q, y, K);
        int bs = ft_types[acts[a]].block, bad = 0, wrong = 0;
        for (int b = 0; b < K / bs; b++) {
            float amax = 0;
            for (int j = 0; j < bs; j++) amax = fmaxf(amax, fabsf(x[b * bs + j]));
            /* half a step of amax/32767, and the f32 rounding of d·q */
            float tol = amax / 32767.0f * 0.5f * 1.001f + amax * 1.2e-7f;
            for (int j = 0; j < bs; j++) bad += !(fabsf(y[b * bs + j] - x[b * bs + j]) <= tol);
            if (acts[a] == FT_A16) {
                const ft_block_a16 *k = (const void *)q;
                int s = 0;
                for (int j = 0; j < bs; j++) s += k[b].qs[j];
                wrong += s != k[b].sum;
            } else {
                const ft_block_a16_K *k = (const void *)q;
                for (int g = 0; g < 16; g++) {
                    int s = 0;
                    for (int l = 0; l < 16; l++) s += k[b].qs[g * 16 + l];
                    wrong += s != k[b].bsums[g];
                }
            }
        }
        CHECKF(bad == 0, "%s: %d elements beyond half a step", ft_types[acts[a]].name, bad);
        CHECKF(wrong == 0, "%s: %d sums wrong", ft_types[acts[a]].name, wrong);
    }
}

/* every byte of the blocks 0xFF (the largest quants; q6_K's int8 scales
 * -1) or 0x80/0x88 patterns (q8_0's -128, the iq4 code -127, q6_K's -128
 * scales), the scales set to 1/16 */
static void extreme_blocks(uint8_t *p, ft_dtype t, int nb, int pattern) {
    size_t bb = ft_types[t].block_bytes;
    memset(p, pattern == 0 ? 0xFF : pattern == 1 ? 0x80 : 0x00, (size_t)nb * bb);
    for (int b = 0; b < nb; b++)
        for (int s = 0; s < ft_types[t].n_scales; s++) {
            uint16_t h = ft_f32_to_f16(1.0f / 16.0f);
            memcpy(p + (size_t)b * bb + ft_types[t].scale_at[s], &h, 2);
        }
}

static void test_vec_dot(void) {
    const int Ks[] = { 256, 768, 1536 };
    bool avx2 = ft_cpu_level() >= FT_CPU_AVX2;
    bool vnni = ft_cpu_level() >= FT_CPU_AVX512 && ft_cpu_has_avx512vnni();
    double worst = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        ft_dtype t = types[ti], at = ft_types[t].act;
        for (int ki = 0; ki < 3 + 3; ki++) {
            int K = Ks[ki % 3], R = 37, extreme = ki >= 3 ? ki - 3 : -1;
            size_t rb = (size_t)ft_dtype_nbytes(t, K);
            uint8_t *w = malloc(rb * R), *act = malloc((size_t)ft_dtype_nbytes(at, K));
            float *x = malloc(sizeof(float) * K), *wf = malloc(sizeof(float) * K), *af = malloc(sizeof(float) * K);
            if (extreme < 0) {
                random_blocks(w, t, R * K / ft_types[t].block);
                random_act(x, K);
            } else {
                extreme_blocks(w, t, R * K / ft_types[t].block, extreme);
                for (int i = 0; i < K; i++) x[i] = extreme == 2 ? (i % 2 ? 1.0f : -1.0f) : extreme == 1 ? -1.0f : 1.0f;
            }
            ft_types[at].quantize_act(x, act, K);
            to_f32_act(at, act, af, K);
            float ref[37], simd[37];
            ft_idot_rows_ref(ref, act, w, rb, t, K, R);
            double err = 0;
            for (int r = 0; r < R; r++) {
                ft_types[t].to_f32(w + r * rb, wf, K);
                double e = 0, mag = 0;
                for (int i = 0; i < K; i++) { e += (double)wf[i] * af[i]; mag += fabs((double)wf[i] * af[i]); }
                err = fmax(err, fabs(ref[r] - e) / fmax(mag, 1e-30));
            }
            worst = fmax(worst, err);
            CHECKF(err <= 1e-5, "%s K=%d: reference vec_dot off the exact product by %.3g of Σ|w·a|", ft_types[t].name,
                   K, err);
            if (avx2) {
                ft_idot_rows_avx2(simd, act, w, rb, t, K, R);
                CHECKF(memcmp(simd, ref, sizeof ref) == 0, "%s K=%d: avx2 differs from the reference (%.9g vs %.9g)",
                       ft_types[t].name, K, simd[0], ref[0]);
            }
            if (vnni) {
                ft_idot_rows_avx512(simd, act, w, rb, t, K, R);
                int bad = -1;
                for (int r = 0; r < R && bad < 0; r++)
                    if (memcmp(&simd[r], &ref[r], sizeof(float))) bad = r;
                CHECKF(bad < 0, "%s K=%d%s: avx512 vnni differs from the reference at row %d (%.9g vs %.9g)",
                       ft_types[t].name, K, extreme >= 0 ? " (extreme blocks)" : "", bad, simd[bad < 0 ? 0 : bad],
                       ref[bad < 0 ? 0 : bad]);
            }
            free(w); free(act); free(x); free(wf); free(af);
        }
    }
    printf("  every dtype's vec_dot within %.2g of the exact product of its dequantized operands%s%s\n", worst,
           avx2 ? "; avx2 equal bit for bit" : " (no avx2 here)",
           vnni ? "; avx512 vnni equal bit for bit" : " (no avx512 vnni here)");
}

static void test_gemv(void) {
    const int K = 1536, N = 70;
    double worst = 0;
    for (int ti = 0; ti < NTYPES; ti++) {
        ft_dtype t = types[ti], at = ft_types[t].act;
        size_t rb = (size_t)ft_dtype_nbytes(t, K);
        uint8_t *w = malloc(rb * N), *act = malloc((size_t)ft_dtype_nbytes(at, K));
        float x[1536], y1[70], y2[70], y3[70], yr[70], yw[70];
        random_blocks(w, t, N * K / ft_types[t].block);
        random_act(x, K);
        ft_types[at].quantize_act(x, act, K);
        ft_idot_rows_ref(yr, act, w, rb, t, K, N);
        ft_mat X = ft_mat_f32(x, K, 1), W = ft_mat_rows_t(w, t, K);
        bool was = ft_gemm_set_int_dot(true);
        bool ok = ft_gemm_in(FT_F32, y1, N, 1, &X, &W, 1, N, K, 1.0f, false, 1, NULL, 0) &&
                  ft_gemm_in(FT_F32, y2, N, 1, &X, &W, 1, N, K, 1.0f, false, 2, NULL, 0) &&
                  ft_gemm_in(FT_F32, y3, N, 1, &X, &W, 1, N, K, 1.0f, false, 3, NULL, 0);
        ft_gemm_set_int_dot(false);
        ok = ok && ft_gemm_in(FT_F32, yw, N, 1, &X, &W, 1, N, K, 1.0f, false, 2, NULL, 0);
        ft_gemm_set_int_dot(was);
        CHECKF(ok, "%s: ft_gemm_in declined", ft_types[t].name);
        CHECKF(memcmp(y1, yr, sizeof yr) == 0, "%s: the GEMV differs from the reference", ft_types[t].name);
        CHECKF(memcmp(y1, y2, sizeof y1) == 0 && memcmp(y1, y3, sizeof y1) == 0, "%s: threads change the bits",
               ft_types[t].name);
        double e = 0, mag = 0;
        for (int n = 0; n < N; n++) { e = fmax(e, fabs(y1[n] - yw[n])); mag = fmax(mag, fabs(yw[n])); }
        worst = fmax(worst, e / fmax(mag, 1e-30));
    }
    printf("  GEMV with integer products: the reference's bits on 1, 2, 3 threads; against the widened f32 product "
           "%.2g of the largest output (16-bit activations)\n", worst);
}

int main(void) {
    ft_rng_seed(&rng, 77);
    RUN(test_quantize_act);
    RUN(test_vec_dot);
    RUN(test_gemv);
    CHECK_EXIT();
}
