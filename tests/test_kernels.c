/* test_kernels.c — the Linear kernels (kernels.c and kernels_*.c, chosen by
 * cpu.c) against linear_forward_ref: every weight dtype, awkward sizes,
 * one row (decode) and several (prefill, across the 128-row packing
 * boundary), 1 to 3 threads, with the dispatch forced to every level this
 * CPU supports (the portable path included). */
#include "check.h"
#include "cpu.h"
#include "kernels.h"
#include "linear.h"

#include <math.h>

static const ft_dtype types[] = { FT_F32, FT_BF16, FT_F16, FT_Q8_0, FT_Q4_0 };
#define NTYPES (int)(sizeof types / sizeof types[0])

typedef struct {
    ft_linear l;
    float *w, *x, *bias, *y, *yr, *scratch;
    void *q;
} lin_case;

/* Random N(0, 1) weights converted to dt, input rows and bias. */
static bool case_new(lin_case *c, ft_dtype dt, int OC, int IC, int T, int n_threads, bool bias, ft_rng *rng) {
    memset(c, 0, sizeof *c);
    int64_t nb = ft_dtype_nbytes(dt, (int64_t)OC * IC);
    c->w = malloc((size_t)OC * IC * sizeof(float));
    c->x = malloc((size_t)T * IC * sizeof(float));
    c->bias = malloc((size_t)OC * sizeof(float));
    c->y = malloc((size_t)T * OC * sizeof(float));
    c->yr = malloc((size_t)T * OC * sizeof(float));
    c->scratch = ft_aligned_alloc(linear_scratch_floats(IC, n_threads) * sizeof(float));
    c->q = malloc((size_t)nb);
    if (!c->w || !c->x || !c->bias || !c->y || !c->yr || !c->scratch || !c->q) return false;
    for (size_t i = 0; i < (size_t)OC * IC; i++) c->w[i] = ft_rng_normal(rng);
    for (size_t i = 0; i < (size_t)T * IC; i++) c->x[i] = ft_rng_normal(rng);
    for (int i = 0; i < OC; i++) c->bias[i] = ft_rng_normal(rng);
    ft_types[dt].from_f32(c->w, c->q, (int64_t)OC * IC);
    c->l = (ft_linear){ .w = { .dtype = dt, .ndim = 2, .shape = { OC, IC }, .data = c->q, .nbytes = (size_t)nb },
                        .bias = bias ? c->bias : NULL, .in = IC, .out = OC };
    return true;
}

static void case_free(lin_case *c) {
    free(c->w); free(c->x); free(c->bias); free(c->y); free(c->yr); free(c->scratch); free(c->q);
}

static int levels[3], n_levels;

/* The levels this CPU has; FTUNE_CPU's cap is lifted while testing. */
static void find_levels(void) {
    ft_cpu_force_level(FT_CPU_AVX512);
    int best = ft_cpu_level();
    n_levels = 0;
    for (int lv = FT_CPU_GENERIC; lv <= best; lv++) levels[n_levels++] = lv;
}

/* The dispatch level can be capped and the cap removed again. */
static void test_cpu_levels(void) {
    ft_cpu_force_level(FT_CPU_AVX512);
    int best = ft_cpu_level();
    CHECK(best >= FT_CPU_GENERIC && best <= FT_CPU_AVX512);
    CHECK(!ft_cpu_has_avx512f() || ft_cpu_has_avx2());
    CHECK(!ft_cpu_has_avx512bf16() || ft_cpu_has_avx512f());
    CHECK(best == (ft_cpu_has_avx512f() ? FT_CPU_AVX512 : ft_cpu_has_avx2() ? FT_CPU_AVX2 : FT_CPU_GENERIC));
    ft_cpu_force_level(FT_CPU_GENERIC);
    CHECK(ft_cpu_level() == FT_CPU_GENERIC);
    ft_cpu_force_level(FT_CPU_AVX512 + 1); /* a cap above what the CPU has changes nothing */
    CHECK(ft_cpu_level() == best);
    /* -1 goes back to FTUNE_CPU's cap */
    const char *env = getenv("FTUNE_CPU");
    int env_cap = best;
    for (int lv = FT_CPU_GENERIC; env && lv < best; lv++)
        if (!strcmp(env, ft_cpu_level_name(lv))) env_cap = lv;
    ft_cpu_force_level(-1);
    CHECK(ft_cpu_level() == env_cap);
    ft_cpu_force_level(FT_CPU_AVX512);
    printf("  cpu: avx2 %d, avx512 %d, avx512bf16 %d; dispatch level %s\n", ft_cpu_has_avx2(),
           ft_cpu_has_avx512f(), ft_cpu_has_avx512bf16(), ft_cpu_level_name(best));
}

/* linear_forward (and so the kernels) against the reference for every
 * dtype, level, size and thread count. */
static void test_linear_kernels(void) {
    int outs[] = { 1, 7, 129 };
    int ins[] = { 32, 96, 4096 + 32 };
    int odd_ins[] = { 1, 15, 47 }; /* bf16/f16/f32 only: no block structure */
    int Ts[] = { 1, 2, 17, 130 };
    ft_rng rng;
    ft_rng_seed(&rng, 11);
    int n_cases = 0;
    for (int li = 0; li < n_levels; li++) {
        double worst = 0;
        ft_cpu_force_level(levels[li]);
        CHECK(ft_cpu_level() == levels[li]);
        for (int ti = 0; ti < NTYPES; ti++)
            for (int oi = 0; oi < 3; oi++)
                for (int ii = 0; ii < 6; ii++)
                    for (int k = 0; k < 4; k++) {
                        ft_dtype dt = types[ti];
                        int OC = outs[oi], IC = ii < 3 ? ins[ii] : odd_ins[ii - 3], T = Ts[k];
                        if (ii >= 3 && ft_types[dt].block > 1) continue;
                        if (T == 130 && IC > 96) continue; /* the reference is slow; 130 rows cross 128 anyway */
                        int n_threads = 1 + (oi + ii + k) % 3;
                        lin_case c;
                        bool bias = (oi + k) % 2;
                        if (!case_new(&c, dt, OC, IC, T, n_threads, bias, &rng)) {
                            CHECKF(0, "out of memory");
                            case_free(&c);
                            return;
                        }
                        linear_forward(c.y, c.x, &c.l, T, n_threads, c.scratch);
                        linear_forward_ref(c.yr, c.x, &c.l, T);
                        /* The same dequantized weights; only the order of the
                         * f32 sums differs (the reference sums in double).
                         * Each output sums IC products of unit normals, so it
                         * has scale sqrt(IC); rounding a running f32 sum of
                         * n terms errs by ~6e-8·sqrt(n) of that scale, with n
                         * ≤ 256 in the SIMD kernels (K-blocks) and ≤ 1032 in
                         * the portable GEMV (4 partial sums): ~2e-6. The floor
                         * sqrt(IC) measures the error against that scale so
                         * that outputs that cancel to near zero are not
                         * judged relative to themselves. The worst seen is
                         * ~2e-6 (every level); 1e-5 leaves room for other
                         * data and still catches one wrong element (an error
                         * of one weight·input is ~1/sqrt(IC) ≥ 1.5e-2). */
                        double e = check_max_rel_err(c.y, c.yr, (long)T * OC, sqrt((double)IC));
                        CHECKF(e < 1e-5, "%s %s OC=%d IC=%d T=%d threads=%d: max rel err %.3g",
                               ft_cpu_level_name(levels[li]), ft_types[dt].name, OC, IC, T, n_threads, e);
                        if (e > worst) worst = e;
                        case_free(&c);
                        n_cases++;
                    }
        printf("  %s: max rel err %.3g\n", ft_cpu_level_name(levels[li]), worst);
    }
    ft_cpu_force_level(FT_CPU_AVX512);
    printf("  %d cases over %d levels\n", n_cases, n_levels);
}

/* In the SIMD kernels each output is computed by one thread in a fixed
 * order, so the result is the same bit for bit whatever the number of
 * threads. (Not asserted of the portable path: BLAS makes no such promise.) */
static void test_thread_invariance(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 3);
    int Ts[] = { 1, 17, 130 };
    for (int li = 0; li < n_levels; li++) {
        if (levels[li] == FT_CPU_GENERIC) continue;
        ft_cpu_force_level(levels[li]);
        for (int ti = 0; ti < NTYPES; ti++)
            for (int k = 0; k < 3; k++) {
                int OC = 203, IC = 96, T = Ts[k];
                lin_case c;
                float *y3 = malloc((size_t)T * OC * sizeof(float));
                float *s3 = ft_aligned_alloc(linear_scratch_floats(IC, 3) * sizeof(float));
                if (!y3 || !s3 || !case_new(&c, types[ti], OC, IC, T, 1, false, &rng)) {
                    CHECKF(0, "out of memory");
                    free(y3); free(s3); case_free(&c);
                    return;
                }
                linear_forward(c.y, c.x, &c.l, T, 1, c.scratch);
                linear_forward(y3, c.x, &c.l, T, 3, s3);
                CHECKF(!memcmp(c.y, y3, (size_t)T * OC * sizeof(float)), "%s %s T=%d: 1 and 3 threads differ",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, T);
                free(y3); free(s3); case_free(&c);
            }
    }
    ft_cpu_force_level(FT_CPU_AVX512);
}

/* Non-finite inputs propagate as in the reference: a NaN or Inf in x makes
 * every output of its row NaN or Inf on every path. */
static void test_nonfinite(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (int ti = 0; ti < NTYPES; ti++) {
            int OC = 9, IC = 64, T = 3;
            lin_case c;
            if (!case_new(&c, types[ti], OC, IC, T, 2, false, &rng)) {
                CHECKF(0, "out of memory");
                case_free(&c);
                return;
            }
            c.x[5] = NAN;           /* row 0 */
            c.x[IC + 7] = INFINITY; /* row 1 */
            linear_forward(c.y, c.x, &c.l, T, 2, c.scratch);
            for (int o = 0; o < OC; o++) {
                CHECKF(isnan(c.y[o]), "%s %s: row 0 output %d = %g, want NaN", ft_cpu_level_name(levels[li]),
                       ft_types[types[ti]].name, o, c.y[o]);
                CHECKF(!isfinite(c.y[OC + o]), "%s %s: row 1 output %d = %g, want Inf or NaN",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, o, c.y[OC + o]);
                CHECKF(isfinite(c.y[2 * OC + o]), "%s %s: row 2 output %d = %g, want finite",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, o, c.y[2 * OC + o]);
            }
            /* and T = 1 (the decode kernels) */
            linear_forward(c.y, c.x, &c.l, 1, 2, c.scratch);
            for (int o = 0; o < OC; o++) CHECK(isnan(c.y[o]));
            case_free(&c);
        }
    }
    ft_cpu_force_level(FT_CPU_AVX512);
}

/* Weights at the edges of their dtype: f16 subnormals, bf16 values below
 * f32's normal range, q8_0/q4_0 blocks with a zero scale. */
static void test_edge_weights(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    ft_dtype dts[] = { FT_F16, FT_BF16, FT_Q8_0, FT_Q4_0 };
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (int di = 0; di < 4; di++)
            for (int T = 1; T <= 3; T += 2) {
                int OC = 5, IC = 96;
                lin_case c;
                if (!case_new(&c, dts[di], OC, IC, T, 2, false, &rng)) {
                    CHECKF(0, "out of memory");
                    case_free(&c);
                    return;
                }
                /* row 0 tiny (f16 subnormal, bf16 subnormal), row 1 zero (a zero q scale) */
                for (int i = 0; i < IC; i++) {
                    c.w[i] = (dts[di] == FT_BF16 ? 1e-39f : 3e-6f) * (float)(i % 7 - 3);
                    c.w[IC + i] = 0;
                }
                ft_types[dts[di]].from_f32(c.w, c.q, (int64_t)OC * IC);
                linear_forward(c.y, c.x, &c.l, T, 2, c.scratch);
                linear_forward_ref(c.yr, c.x, &c.l, T);
                for (int t = 0; t < T; t++) {
                    /* row 0: the products are tiny but exact in f32 where
                     * the reference's are, so compare relative to their own
                     * scale; a flushed subnormal would be off by 100% */
                    double scale = 0;
                    for (int i = 0; i < IC; i++) scale += fabs(c.w[i] * c.x[(size_t)t * IC + i]);
                    double e0 = fabs((double)c.y[(size_t)t * OC] - c.yr[(size_t)t * OC]) / (scale > 0 ? scale : 1);
                    CHECKF(e0 < 1e-5, "%s %s T=%d: tiny row rel err %.3g", ft_cpu_level_name(levels[li]),
                           ft_types[dts[di]].name, t, e0);
                    CHECKF(c.y[(size_t)t * OC + 1] == 0, "%s %s: zero row gives %g", ft_cpu_level_name(levels[li]),
                           ft_types[dts[di]].name, c.y[(size_t)t * OC + 1]);
                }
                double e = check_max_rel_err(c.y, c.yr, (long)T * OC, sqrt((double)IC)); /* as in test_linear_kernels */
                CHECKF(e < 1e-5, "%s %s T=%d: max rel err %.3g", ft_cpu_level_name(levels[li]),
                       ft_types[dts[di]].name, T, e);
                case_free(&c);
            }
    }
    ft_cpu_force_level(FT_CPU_AVX512);
}

/* The driver declines what it does not handle, writing nothing. */
static void test_kernels_decline(void) {
    float out[4] = { 7, 7, 7, 7 }, x[64] = { 0 }, scratch[64];
    uint16_t w[64] = { 0 };
    ft_mat X = ft_mat_f32(x, 1, 16);
    ft_mat Wi = { .p = w, .dt = FT_I32, .rs = 64, .cs = 1 };
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        CHECK(!ft_gemm(out, 1, 4, &Wi, &X, 4, 1, 16, 1, false, 1, scratch, 64)); /* not a weight dtype */
        ft_mat Wb = ft_mat_rows(w, FT_BF16, 16), Wq = { .p = w, .dt = FT_Q8_0, .rs = 34, .cs = 1 };
        CHECK(!ft_gemm(out, 1, 2, &Wb, &X, 2, 2, 16, 1, false, 1, scratch, 64)); /* several rows need the packing scratch */
        CHECK(!ft_gemm(out, 1, 1, &Wq, &X, 1, 1, 16, 1, false, 1, scratch, 64)); /* 16 is not whole q8_0 blocks */
        CHECK(!ft_gemm(out, 1, 1, &Wb, &X, 0, 1, 16, 1, false, 1, scratch, 64)); /* empty */
        CHECK(out[0] == 7 && out[1] == 7 && out[2] == 7 && out[3] == 7);
    }
    ft_cpu_force_level(FT_CPU_AVX512);
}

int main(void) {
    find_levels();
    RUN(test_cpu_levels);
    RUN(test_kernels_decline);
    RUN(test_linear_kernels);
    RUN(test_thread_invariance);
    RUN(test_nonfinite);
    RUN(test_edge_weights);
    CHECK_EXIT();
}
