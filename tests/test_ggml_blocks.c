/* test_ggml_blocks.c — ggml's weight blocks beyond q8_0/q4_0 in the
 * kernels: every level's widening of a row span (kernels_<isa>.c, or the
 * reference where a level has no dequantizer of its own) equal bit for bit
 * to the traits' to_f32 (dtype_ggml.c, itself checked against gguf-py by
 * tests/cli_gguf_dequant.sh) on random blocks with finite, subnormal, zero
 * and non-finite scales, at every block-aligned offset and length; then
 * Linear's forward on such weights against linear_forward_ref on every
 * level, 1 and 3 threads, one row (decode) and several (prefill), and the
 * same bits on 1 and 3 threads. */
#include "check.h"
#include "core/dtype_ggml.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "nn/linear.h"

static const ft_dtype types[] = { FT_Q4_1, FT_Q5_0, FT_Q5_1, FT_IQ4_NL, FT_Q2_K, FT_Q3_K,
                                  FT_Q4_K, FT_Q5_K, FT_Q6_K, FT_IQ4_XS, FT_Q8_K };
#define NTYPES (int)(sizeof types / sizeof types[0])

/* byte offsets of each block's f16 scale fields (core.h's layouts) */
static int f16_fields(ft_dtype t, int off[2]) {
    switch (t) {
    case FT_Q4_1: case FT_Q5_1: case FT_Q4_K: case FT_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case FT_Q5_0: case FT_IQ4_NL: case FT_IQ4_XS: off[0] = 0; return 1;
    case FT_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case FT_Q3_K: off[0] = 108; return 1;
    case FT_Q6_K: off[0] = 208; return 1;
    default: return 0; /* q8_K: an f32 d, set below */
    }
}

/* nb random blocks of t; scales random finite f16 (|x| < 2^-2, so that
 * products stay in range), except where `special` puts in one of ±0, the
 * smallest subnormal, the largest finite, inf and NaN */
static void random_blocks(uint8_t *p, ft_dtype t, int nb, bool special, ft_rng *rng) {
    size_t bb = ft_types[t].block_bytes;
    static const uint16_t sp[] = { 0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0x7C00, 0x7E00 };
    for (size_t i = 0; i < (size_t)nb * bb; i++) p[i] = (uint8_t)(ft_rng_u32(rng) >> 24);
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = p + (size_t)b * bb;
        int off[2], n = f16_fields(t, off);
        for (int f = 0; f < n; f++) {
            uint16_t h = ft_f32_to_f16((ft_rng_uniform(rng) - 0.5f) * 0.5f);
            if (special && ft_rng_u32(rng) % 4 == 0) h = sp[ft_rng_u32(rng) % 7];
            memcpy(blk + off[f], &h, 2);
        }
        if (t == FT_Q8_K) {
            float d = (ft_rng_uniform(rng) - 0.5f) * 0.01f;
            memcpy(blk, &d, 4);
        }
    }
}

static bool same_bits(const float *a, const float *b, int n, int *at) {
    for (int i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, a + i, 4);
        memcpy(&y, b + i, 4);
        if (x != y && !(isnan(a[i]) && isnan(b[i]))) { *at = i; return false; }
    }
    return true;
}

static int levels[FT_CPU_NLEVELS], n_levels;

static void test_widen_equals_reference(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    enum { NB = 12 };
    for (int ti = 0; ti < NTYPES; ti++) {
        ft_dtype t = types[ti];
        int QB = ft_types[t].block, K = NB * QB;
        uint8_t *row = malloc((size_t)NB * ft_types[t].block_bytes);
        float *want = malloc((size_t)K * sizeof(float)), *got = malloc((size_t)K * sizeof(float));
        if (!row || !want || !got) { CHECKF(0, "out of memory"); free(row); free(want); free(got); return; }
        for (int rep = 0; rep < 20; rep++) {
            random_blocks(row, t, NB, rep % 2 == 1, &rng);
            ft_dtype_span_to_f32(t, row, 0, want, K);
            for (int li = 0; li < n_levels; li++) {
                const ft_kernel_isa *isa = ft_kernels_for_level(levels[li]);
                for (int b0 = 0; b0 < NB; b0 += 3)
                    for (int nb = 1; b0 + nb <= NB; nb += 4) {
                        memset(got, 0xA5, (size_t)K * sizeof(float));
                        isa->widen(got, row, t, b0 * QB, nb * QB);
                        int at = -1;
                        CHECKF(same_bits(got, want + b0 * QB, nb * QB, &at), "%s %s blocks [%d, %d): value %d: %g, reference %g",
                               ft_cpu_level_name(levels[li]), ft_types[t].name, b0, b0 + nb, at, at >= 0 ? got[at] : 0.0,
                               at >= 0 ? want[b0 * QB + at] : 0.0);
                    }
            }
        }
        free(row); free(want); free(got);
    }
}

/* Linear's forward on random blocks against the reference: the kernels
 * widen exactly and differ from linear_forward_ref only in the order of the
 * f32 sums (1e-5 relative to the sum of |w·x|, as test_kernels' bound: a
 * few hundred f32 roundings of 6e-8 each, far above, and far below any
 * wrong element, which moves an output by ~1/sqrt(K) of that sum). */
static void test_linear_on_blocks(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 6);
    int OCs[] = { 1, 9 };
    int Ts[] = { 1, 3, 130 };
    for (int ti = 0; ti < NTYPES; ti++) {
        ft_dtype t = types[ti];
        int IC = ft_types[t].block == FT_QK ? 32 * 41 : 256 * 5;
        for (int oi = 0; oi < 2; oi++)
            for (int k = 0; k < 3; k++) {
                int OC = OCs[oi], T = Ts[k];
                size_t nb = (size_t)ft_dtype_nbytes(t, (int64_t)OC * IC);
                uint8_t *w = malloc(nb);
                float *x = malloc((size_t)T * IC * sizeof(float)), *wf = malloc((size_t)IC * sizeof(float));
                float *y1 = malloc((size_t)T * OC * sizeof(float)), *y3 = malloc((size_t)T * OC * sizeof(float));
                float *yr = malloc((size_t)T * OC * sizeof(float));
                float *scratch = ft_aligned_alloc(ft_linear_scratch_floats(IC, 3) * sizeof(float));
                if (!w || !x || !wf || !y1 || !y3 || !yr || !scratch) {
                    CHECKF(0, "out of memory");
                    free(w); free(x); free(wf); free(y1); free(y3); free(yr); free(scratch);
                    return;
                }
                random_blocks(w, t, (int)(nb / ft_types[t].block_bytes), false, &rng);
                for (size_t i = 0; i < (size_t)T * IC; i++) x[i] = ft_rng_normal(&rng);
                ft_linear l = { .w = { .dtype = t, .ndim = 2, .shape = { OC, IC }, .data = w, .nbytes = nb }, .in = IC, .out = OC };
                ft_linear_forward_ref(yr, x, &l, NULL, T);
                for (int li = 0; li < n_levels; li++) {
                    ft_cpu_force_level(levels[li]);
                    ft_linear_forward(y1, x, &l, NULL, T, 1, scratch);
                    ft_linear_forward(y3, x, &l, NULL, T, 3, scratch);
                    CHECKF(memcmp(y1, y3, (size_t)T * OC * sizeof(float)) == 0, "%s %s %dx%d T=%d: 1 and 3 threads differ",
                           ft_cpu_level_name(levels[li]), ft_types[t].name, OC, IC, T);
                    double worst = 0;
                    for (int r = 0; r < T; r++)
                        for (int o = 0; o < OC; o++) {
                            ft_dtype_span_to_f32(t, w + (size_t)o * (nb / OC), 0, wf, IC);
                            double scale = 0;
                            for (int i = 0; i < IC; i++) scale += fabs((double)wf[i] * x[(size_t)r * IC + i]);
                            double e = fabs((double)y1[(size_t)r * OC + o] - yr[(size_t)r * OC + o]) / (scale > 0 ? scale : 1);
                            if (e > worst) worst = e;
                        }
                    CHECKF(worst < 1e-5, "%s %s %dx%d T=%d: error %.3g of the sum of |w·x|", ft_cpu_level_name(levels[li]),
                           ft_types[t].name, OC, IC, T, worst);
                }
                ft_cpu_force_level(FT_CPU_TOP);
                free(w); free(x); free(wf); free(y1); free(y3); free(yr); free(scratch);
            }
    }
}

int main(void) {
    ft_cpu_force_level(FT_CPU_TOP);
    int best = ft_cpu_level();
    for (int lv = FT_CPU_GENERIC; lv <= best; lv++) levels[n_levels++] = lv;
    RUN(test_widen_equals_reference);
    RUN(test_linear_on_blocks);
    CHECK_EXIT();
}
