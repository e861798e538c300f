/* test_kernels.c — the Linear kernels (kernels.c and kernels_*.c, chosen by
 * cpu.c) against linear_forward_ref: every weight dtype, awkward sizes,
 * one row (decode) and several (prefill, across the 128-row packing
 * boundary), 1 to 3 threads, with the dispatch forced to every level this
 * CPU supports (the portable path included); then the driver itself in
 * every operand layout the backward uses (dX = dY·W for W of any dtype,
 * dW += dYᵀ·X, the LoRA products) against a plain double-precision
 * product, linear_backward against plain loops for every base dtype, and
 * the same bits on 1 and 3 threads everywhere. */
#include "check.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "nn/linear.h"

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
    c->scratch = ft_aligned_alloc(ft_linear_scratch_floats(IC, n_threads) * sizeof(float));
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

static int levels[FT_CPU_NLEVELS], n_levels;

/* The levels this CPU has; FTUNE_CPU's cap is lifted while testing. */
static void find_levels(void) {
    ft_cpu_force_level(FT_CPU_TOP);
    int best = ft_cpu_level();
    n_levels = 0;
    for (int lv = FT_CPU_GENERIC; lv <= best; lv++) levels[n_levels++] = lv;
}

/* The dispatch level can be capped and the cap removed again. */
static void test_cpu_levels(void) {
    ft_cpu_force_level(FT_CPU_TOP);
    int best = ft_cpu_level();
    CHECK(best >= FT_CPU_GENERIC && best <= FT_CPU_TOP);
    CHECK(!ft_cpu_has_avx512f() || ft_cpu_has_avx2());
    CHECK(!ft_cpu_has_avx512bf16() || ft_cpu_has_avx512f());
    CHECK(!ft_cpu_has_amx() || ft_cpu_has_avx512bf16());
    CHECK(best == (ft_cpu_has_amx()          ? FT_CPU_AMX
                   : ft_cpu_has_avx512bf16() ? FT_CPU_AVX512BF16
                   : ft_cpu_has_avx512f()  ? FT_CPU_AVX512
                   : ft_cpu_has_avx2()     ? FT_CPU_AVX2
                                           : FT_CPU_GENERIC));
    for (int lv = FT_CPU_GENERIC; lv <= FT_CPU_TOP; lv++) CHECK(strcmp(ft_cpu_level_name(lv), "?") != 0);
    ft_cpu_force_level(FT_CPU_GENERIC);
    CHECK(ft_cpu_level() == FT_CPU_GENERIC);
    ft_cpu_force_level(FT_CPU_TOP + 1); /* a cap above what the CPU has changes nothing */
    CHECK(ft_cpu_level() == best);
    /* -1 goes back to FTUNE_CPU's cap */
    const char *env = getenv("FTUNE_CPU");
    int env_cap = best;
    for (int lv = FT_CPU_GENERIC; env && lv < best; lv++)
        if (!strcmp(env, ft_cpu_level_name(lv))) env_cap = lv;
    ft_cpu_force_level(-1);
    CHECK(ft_cpu_level() == env_cap);
    ft_cpu_force_level(FT_CPU_TOP);
    printf("  cpu: avx2 %d, avx512 %d, avx512bf16 %d, amx %d; dispatch level %s\n  %s\n", ft_cpu_has_avx2(),
           ft_cpu_has_avx512f(), ft_cpu_has_avx512bf16(), ft_cpu_has_amx(), ft_cpu_level_name(best),
           ft_cpu_amx_note());
    /* the levels above the best run nowhere here: every test that runs each
     * level (these, test_ops_fast's, test_ops_elem's, test_nf4's) stops at it */
    for (int lv = best + 1; lv <= FT_CPU_TOP; lv++) {
        char name[64];
        snprintf(name, sizeof name, "kernel_level_%s", ft_cpu_level_name(lv));
        if (lv == FT_CPU_AMX)
            check_skip(CHECK_HARDWARE, name, "%s; the amx kernels ran on test_amx_tiles' emulated tile unit only",
                       ft_cpu_amx_note());
        else check_skip(CHECK_HARDWARE, name, "this CPU lacks the %s instructions", ft_cpu_level_name(lv));
    }
}

/* ft_linear_forward (and so the kernels) against the reference for every
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
                        ft_linear_forward(c.y, c.x, &c.l, NULL, T, n_threads, c.scratch);
                        ft_linear_forward_ref(c.yr, c.x, &c.l, NULL, T);
                        /* The same dequantized weights; only the order of the
                         * f32 sums differs (the reference sums in double).
                         * Each output sums IC products of unit normals, so it
                         * has scale sqrt(IC); rounding a running f32 sum of
                         * n terms errs by ~6e-8·sqrt(n) of that scale, with n
                         * ≤ FT_GEMM_KCH = 1024 in the GEMM (a K chunk per
                         * lane) and ≤ 516 in the GEMV (2·VL lanes, VL ≥ 4):
                         * ~2e-6. The floor
                         * sqrt(IC) measures the error against that scale so
                         * that outputs that cancel to near zero are not
                         * judged relative to themselves. The worst seen is
                         * ~3e-6 (every level); 1e-5 leaves room for other
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
    ft_cpu_force_level(FT_CPU_TOP);
    printf("  %d cases over %d levels\n", n_cases, n_levels);
}

/* At every level (the portable one is ours too) each output is computed by
 * one thread in a fixed order, so the result is the same bit for bit
 * whatever the number of threads. */
static void test_thread_invariance(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 3);
    int Ts[] = { 1, 17, 130 };
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (int ti = 0; ti < NTYPES; ti++)
            for (int k = 0; k < 3; k++) {
                int OC = 203, IC = 96, T = Ts[k];
                lin_case c;
                float *y3 = malloc((size_t)T * OC * sizeof(float));
                float *s3 = ft_aligned_alloc(ft_linear_scratch_floats(IC, 3) * sizeof(float));
                if (!y3 || !s3 || !case_new(&c, types[ti], OC, IC, T, 1, false, &rng)) {
                    CHECKF(0, "out of memory");
                    free(y3); free(s3); case_free(&c);
                    return;
                }
                ft_linear_forward(c.y, c.x, &c.l, NULL, T, 1, c.scratch);
                ft_linear_forward(y3, c.x, &c.l, NULL, T, 3, s3);
                CHECKF(!memcmp(c.y, y3, (size_t)T * OC * sizeof(float)), "%s %s T=%d: 1 and 3 threads differ",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, T);
                free(y3); free(s3); case_free(&c);
            }
    }
    ft_cpu_force_level(FT_CPU_TOP);
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
            ft_linear_forward(c.y, c.x, &c.l, NULL, T, 2, c.scratch);
            for (int o = 0; o < OC; o++) {
                CHECKF(isnan(c.y[o]), "%s %s: row 0 output %d = %g, want NaN", ft_cpu_level_name(levels[li]),
                       ft_types[types[ti]].name, o, c.y[o]);
                CHECKF(!isfinite(c.y[OC + o]), "%s %s: row 1 output %d = %g, want Inf or NaN",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, o, c.y[OC + o]);
                CHECKF(isfinite(c.y[2 * OC + o]), "%s %s: row 2 output %d = %g, want finite",
                       ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, o, c.y[2 * OC + o]);
            }
            /* and T = 1 (the decode kernels) */
            ft_linear_forward(c.y, c.x, &c.l, NULL, 1, 2, c.scratch);
            for (int o = 0; o < OC; o++) CHECK(isnan(c.y[o]));
            case_free(&c);
        }
    }
    ft_cpu_force_level(FT_CPU_TOP);
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
                ft_linear_forward(c.y, c.x, &c.l, NULL, T, 2, c.scratch);
                ft_linear_forward_ref(c.yr, c.x, &c.l, NULL, T);
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
    ft_cpu_force_level(FT_CPU_TOP);
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
    ft_cpu_force_level(FT_CPU_TOP);
}

/* ------------------------------------------------ the driver, every layout */

/* An operand of a product case: f32 with strides, or rows of a weight
 * dtype; `f` holds its values as f32 (the dtype's exact dequantization),
 * element (i, j) at f[i·cols + j]. */
typedef struct {
    ft_mat m;
    float *f;
    void *q;
    int rows, cols;
} operand;

static bool operand_new(operand *o, int rows, int cols, ft_dtype dt, bool transposed, ft_rng *rng) {
    memset(o, 0, sizeof *o);
    o->rows = rows;
    o->cols = cols;
    size_t n = (size_t)rows * cols;
    o->f = malloc(n * sizeof(float));
    if (!o->f) return false;
    for (size_t i = 0; i < n; i++) o->f[i] = ft_rng_normal(rng);
    if (dt != FT_F32 && transposed) { /* rows of the transpose: element (i, j) is element i of row j */
        float *t = malloc(n * sizeof(float));
        o->q = malloc((size_t)ft_dtype_nbytes(dt, (int64_t)n));
        if (!t || !o->q) {
            free(t);
            return false;
        }
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = o->f[(size_t)i * cols + j];
        ft_types[dt].from_f32(t, o->q, (int64_t)n);
        ft_types[dt].to_f32(o->q, t, (int64_t)n);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) o->f[(size_t)i * cols + j] = t[(size_t)j * rows + i];
        free(t);
        o->m = ft_mat_rows_t(o->q, dt, rows);
        return true;
    }
    if (dt != FT_F32) {
        o->q = malloc((size_t)ft_dtype_nbytes(dt, (int64_t)n));
        if (!o->q) return false;
        ft_types[dt].from_f32(o->f, o->q, (int64_t)n);
        ft_types[dt].to_f32(o->q, o->f, (int64_t)n);
        o->m = ft_mat_rows(o->q, dt, cols);
        return true;
    }
    /* f32: stored row-major, or transposed (element (i, j) at j·rows + i) */
    o->q = malloc(n * sizeof(float));
    if (!o->q) return false;
    float *d = o->q;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) d[transposed ? (size_t)j * rows + i : (size_t)i * cols + j] = o->f[(size_t)i * cols + j];
    o->m = transposed ? ft_mat_f32(d, 1, rows) : ft_mat_f32(d, cols, 1);
    return true;
}

static void operand_free(operand *o) { free(o->f); free(o->q); }

static const char *layout(const operand *o) {
    if (o->m.dt != FT_F32) return o->m.t ? "weightᵀ" : "weight";
    return o->m.cs == 1 ? "f32" : "f32ᵀ";
}

/* C (M, N) (+)= alpha·A·B through ft_gemm at the current level on 1 and 3
 * threads, against the double-precision product; c_t stores C transposed.
 * Returns the error as in test_linear_kernels, or -1 on failure. */
/* x rounded to the compute type and back (the reference's operands). */
static double rounded(float x, ft_dtype compute) {
    return compute == FT_BF16 ? ft_bf16_to_f32(ft_f32_to_bf16(x))
         : compute == FT_F16  ? ft_f16_to_f32(ft_f32_to_f16(x))
                              : x;
}

/* the name of the table ft_kernels_force put in place, for messages */
static const char *forced_name;

static double gemm_case(ft_dtype compute, int M, int N, int K, ft_dtype adt, bool at, ft_dtype bdt, bool bt, bool c_t,
                        float alpha, bool accumulate, ft_rng *rng) {
    operand A, B;
    size_t nc = (size_t)M * N;
    float *c0 = malloc(nc * sizeof(float)), *c1 = malloc(nc * sizeof(float)), *c3 = malloc(nc * sizeof(float));
    float *ref = malloc(nc * sizeof(float));
    float *scratch = ft_aligned_alloc(FT_GEMM_SCRATCH_FLOATS * sizeof(float));
    double err = -1;
    if (!operand_new(&A, M, K, adt, at, rng) || !operand_new(&B, K, N, bdt, bt, rng) || !c0 || !c1 || !c3 || !ref ||
        !scratch) {
        CHECKF(0, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < nc; i++) c0[i] = ft_rng_normal(rng);
    int64_t crs = c_t ? 1 : N, ccs = c_t ? M : 1;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += rounded(A.f[(size_t)m * K + k], compute) * rounded(B.f[(size_t)k * N + n], compute);
            size_t at_ = (size_t)(m * crs + n * ccs);
            ref[at_] = (float)((accumulate ? c0[at_] : 0) + alpha * s);
        }
    memcpy(c1, c0, nc * sizeof(float));
    memcpy(c3, c0, nc * sizeof(float));
    bool ok1 = ft_gemm_in(compute, c1, crs, ccs, &A.m, &B.m, M, N, K, alpha, accumulate, 1, scratch,
                          FT_GEMM_SCRATCH_FLOATS);
    bool ok3 = ft_gemm_in(compute, c3, crs, ccs, &A.m, &B.m, M, N, K, alpha, accumulate, 3, scratch,
                          FT_GEMM_SCRATCH_FLOATS);
    CHECKF(ok1 && ok3, "M=%d N=%d K=%d A %s B %s: declined", M, N, K, layout(&A), layout(&B));
    if (!ok1 || !ok3) goto done;
    CHECKF(!memcmp(c1, c3, nc * sizeof(float)), "%s M=%d N=%d K=%d A %s B %s: 1 and 3 threads differ",
           forced_name ? forced_name : ft_cpu_level_name(ft_cpu_level()), M, N, K, layout(&A), layout(&B));
    /* as in test_linear_kernels: products of unit normals summed at most
     * FT_GEMM_KCH = 1024 per running f32 sum, measured against
     * their scale |alpha|·sqrt(K) (plus the unit-normal C when adding) */
    err = check_max_rel_err(c1, ref, (long)nc, fabs(alpha) * sqrt((double)K) + (accumulate ? 1 : 0));
done:
    operand_free(&A); operand_free(&B);
    free(c0); free(c1); free(c3); free(ref); free(scratch);
    return err;
}

/* Every layout linear.c and lora.c hand the driver, at every level, with
 * sizes across the K chunk (256), the N chunk (256) and every tile edge. */
static void test_gemm_layouts(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 21);
    int Ms[] = { 1, 5, 37, 203 };
    int Ns[] = { 1, 7, 33, 260 };
    int Ks[] = { 1, 19, 300 };
    int blockN[] = { 32, 96, 288 }; /* B in a weight dtype: whole blocks along n */
    int n_cases = 0;
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        double worst = 0;
        for (int mi = 0; mi < 4; mi++)
            for (int ni = 0; ni < 4; ni++)
                for (int ki = 0; ki < 3; ki++) {
                    int M = Ms[mi], N = Ns[ni], K = Ks[ki], i = mi + ni + ki;
                    if ((size_t)M * N * K > 4000000) continue; /* keep the double reference quick */
                    /* dW += dYᵀ·X; dx = g·A; the LoRA u = x·Aᵀ and out += scale·u·Bᵀ (B transposed) */
                    struct { bool at, bt, ct; float alpha; bool acc; } lay[] = {
                        { true, false, false, 1.0f, true },  { false, false, false, 1.0f, false },
                        { false, true, false, 1.0f, false }, { false, true, false, 0.5f, true },
                        { true, false, true, -2.0f, i % 2 },
                    };
                    for (int j = 0; j < 5; j++) {
                        double e = gemm_case(FT_F32, M, N, K, FT_F32, lay[j].at, FT_F32, lay[j].bt, lay[j].ct, lay[j].alpha,
                                             lay[j].acc, &rng);
                        CHECKF(e >= 0 && e < 1e-5, "%s f32 M=%d N=%d K=%d layout %d: max rel err %.3g",
                               ft_cpu_level_name(levels[li]), M, N, K, j, e);
                        if (e > worst) worst = e;
                        n_cases++;
                    }
                }
        /* dX = dY·W for W (K, N) in every dtype, read along its rows */
        for (int ti = 0; ti < NTYPES; ti++)
            for (int mi = 0; mi < 4; mi++)
                for (int ni = 0; ni < 3; ni++)
                    for (int ki = 0; ki < 2; ki++) {
                        int M = Ms[mi], N = blockN[ni], K = Ks[ki + 1];
                        double e = gemm_case(FT_F32, M, N, K, FT_F32, false, types[ti], false, false, 1.0f, (mi + ni) % 2,
                                             &rng);
                        CHECKF(e >= 0 && e < 1e-5, "%s dX, W %s M=%d N=%d K=%d: max rel err %.3g",
                               ft_cpu_level_name(levels[li]), ft_types[types[ti]].name, M, N, K, e);
                        if (e > worst) worst = e;
                        n_cases++;
                    }
        printf("  %s: max rel err %.3g\n", ft_cpu_level_name(levels[li]), worst);
    }
    ft_cpu_force_level(FT_CPU_TOP);
    printf("  %d cases over %d levels\n", n_cases, n_levels);
}

/* ft_gemm_in in bf16 and f16 against the double-precision product of the
 * operands rounded to the compute type, at every level (avx512bf16: the
 * VDPBF16PS pair kernels for bf16): every layout linear.c and lora.c hand
 * the driver (f32 either way round, C transposed, weights read along k and
 * along n) with weights stored in the compute type, in the other one, in
 * f32 and quantized; the GEMV paths (M = 1, N = 1); sizes off every tile
 * edge (mr 12/16, nr 16/32), odd K (the last bf16 pair padded) within a
 * register block, across it (256) and across the K chunk (1025 = 1024 + 1),
 * N across the pairs' N chunk (1030).
 * The error is the f32 summation's alone (the products of rounded values
 * are exact, and VDPBF16PS's pair sums are f32 sums too; no denormals
 * here), so the f32 bound holds: 1e-5 of the unit-normal products' scale
 * sqrt(K), with the worst seen ~3e-6 on every level. */
static void test_gemm_compute(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 23);
    const ft_dtype computes[] = { FT_BF16, FT_F16 };
    /* N = 1030 crosses the bf16 pairs' N chunk (FT_GEMM_NC16 = 1024) */
    int Ms[] = { 1, 6, 13, 45 }, Ns[] = { 1, 9, 17, 64, 1030 }, Ks[] = { 3, 64, 301, 1025 };
    int n_cases = 0;
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        double worst = 0;
        for (int ci = 0; ci < 2; ci++)
            for (int mi = 0; mi < 4; mi++)
                for (int ni = 0; ni < 5; ni++)
                    for (int ki = 0; ki < 4; ki++) {
                        int M = Ms[mi], N = Ns[ni], K = Ks[ki];
                        if ((size_t)M * N * K > 1500000) continue; /* keep the double reference quick */
                        ft_dtype cdt = computes[ci], other = computes[1 - ci];
                        struct { ft_dtype adt; bool at; ft_dtype bdt; bool bt, ct; float alpha; } lay[] = {
                            { FT_F32, false, FT_F32, false, false, 1.0f }, /* g = dout·B, dx = g·A */
                            { FT_F32, true, FT_F32, true, true, 1.0f },    /* both transposed, C transposed */
                            { FT_F32, false, cdt, true, false, 1.0f },     /* forward, many rows: X·Wᵀ */
                            { cdt, false, FT_F32, true, true, 1.0f },      /* forward, few rows: W·Xᵀ into outᵀ */
                            { cdt, false, FT_F32, false, false, 1.0f },    /* weight rows times f32 rows */
                            { FT_F32, false, cdt, false, false, 1.0f },    /* dX = dY·W */
                            { FT_F32, true, FT_F32, false, false, 1.0f },  /* dW += doutᵀ·X, dA, dB */
                            { FT_F32, false, FT_F32, true, false, 0.5f },  /* LoRA u = x·Aᵀ, out += s·u·Bᵀ */
                            { FT_F32, false, other, true, false, 1.0f },   /* weights in the other type */
                            { FT_Q8_0, false, FT_F32, false, false, 1.0f },
                            { FT_F32, false, FT_Q8_0, true, false, -2.0f },
                        };
                        for (int j = 0; j < (int)(sizeof lay / sizeof lay[0]); j++) {
                            /* quantized weights come in whole blocks along their rows */
                            if ((ft_types[lay[j].adt].block > 1 && K % ft_types[lay[j].adt].block) ||
                                (ft_types[lay[j].bdt].block > 1 && (lay[j].bt ? K : N) % ft_types[lay[j].bdt].block))
                                continue;
                            double e = gemm_case(cdt, M, N, K, lay[j].adt, lay[j].at, lay[j].bdt, lay[j].bt, lay[j].ct,
                                                 lay[j].alpha, (j + ki) % 2, &rng);
                            CHECKF(e >= 0 && e < 1e-5, "%s in %s M=%d N=%d K=%d layout %d: max rel err %.3g",
                                   ft_cpu_level_name(levels[li]), ft_types[cdt].name, M, N, K, j, e);
                            if (e > worst) worst = e;
                            n_cases++;
                        }
                    }
        printf("  %s: bf16/f16 compute, max rel err %.3g\n", ft_cpu_level_name(levels[li]), worst);
    }
    ft_cpu_force_level(FT_CPU_TOP);
    /* the pair kernels are there exactly when the CPU has the instructions */
    CHECK(!ft_kernels_for_level(FT_CPU_AVX512)->tile16[0]);
    CHECK(!!ft_kernels_for_level(ft_cpu_level())->tile16[0] == ft_cpu_has_avx512bf16());
    float out[1];
    ft_mat a = ft_mat_f32(out, 1, 1);
    CHECK(!ft_gemm_in(FT_Q8_0, out, 1, 1, &a, &a, 1, 1, 1, 1, false, 1, NULL, 0)); /* not a compute type */
    printf("  %d compute-type cases over %d levels\n", n_cases, n_levels);
}

/* VDPBF16PS treats subnormal inputs as zero (kernels.h): at the
 * avx512bf16 level a bf16 product of subnormals is 0 instead of the
 * plain semantics' tiny value; every other level is exact, and a product
 * of normal values next to them is unaffected on every level. */
static void test_gemm_bf16_subnormal(void) {
    enum { M = 3, N = 20, K = 33 };
    float a[M * K], b[K * N], c[M * N];
    float *scratch = ft_aligned_alloc(FT_GEMM_SCRATCH_FLOATS * sizeof(float));
    if (!scratch) {
        CHECKF(0, "out of memory");
        return;
    }
    for (int i = 0; i < M * K; i++) a[i] = i < K ? 1e-39f : 1.0f; /* row 0 subnormal (exact in bf16) */
    for (int i = 0; i < K * N; i++) b[i] = 0.5f;
    ft_mat A = ft_mat_f32(a, K, 1), B = ft_mat_f32(b, N, 1);
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        CHECK(ft_gemm_in(FT_BF16, c, N, 1, &A, &B, M, N, K, 1.0f, false, 2, scratch, FT_GEMM_SCRATCH_FLOATS));
        bool pairs = levels[li] >= FT_CPU_AVX512BF16;
        /* every partial sum of k·0.5·bf16(1e-39) is exact in f32 (the
         * subnormal has 7 significant bits at most), and so are the normal
         * rows' 33·0.5; the pair kernels read the subnormal inputs as 0 */
        float tiny = 33 * 0.5f * ft_bf16_to_f32(ft_f32_to_bf16(1e-39f));
        for (int n = 0; n < N; n++) {
            CHECKF(c[n] == (pairs ? 0.0f : tiny), "%s: subnormal row gives %g", ft_cpu_level_name(levels[li]), c[n]);
            CHECKF(c[N + n] == 16.5f && c[2 * N + n] == 16.5f, "%s: normal rows give %g, %g",
                   ft_cpu_level_name(levels[li]), c[N + n], c[2 * N + n]);
        }
    }
    ft_cpu_force_level(FT_CPU_TOP);
    free(scratch);
}

/* Whether /proc/cpuinfo lists amx_bf16 (Linux's own reading of cpuid). */
static bool cpuinfo_lists_amx(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5) && strstr(line, " amx_bf16")) found = true;
    fclose(f);
    return found;
}

/* The AMX probe: a level only when it passed; asking for amx (the cap, as
 * FTUNE_CPU=amx does) on a CPU without working tiles runs the best level
 * there is, and the note says why in one line. */
static void test_amx_probe(void) {
    ft_cpu_force_level(FT_CPU_TOP);
    int best = ft_cpu_level();
    const char *note = ft_cpu_amx_note();
    CHECKF(!strncmp(note, "AMX: ", 5) && !strchr(note, '\n'), "note \"%s\"", note);
    CHECK(!strcmp(ft_cpu_level_name(FT_CPU_AMX), "amx"));
    if (!cpuinfo_lists_amx()) CHECKF(!ft_cpu_has_amx(), "probe passed where /proc/cpuinfo lists no amx_bf16");
    ft_cpu_force_level(FT_CPU_AMX);
    CHECK(ft_cpu_level() == best);
    CHECK((best == FT_CPU_AMX) == ft_cpu_has_amx());
    if (!ft_cpu_has_amx()) CHECK(ft_kernels_for_level(best) != ft_kernels_for_level(FT_CPU_AMX));
    ft_cpu_force_level(FT_CPU_AVX512BF16); /* a cap below amx is obeyed */
    CHECK(ft_cpu_level() <= FT_CPU_AVX512BF16);
    ft_cpu_force_level(FT_CPU_TOP);
    printf("  level %s; %s\n", ft_cpu_level_name(best), note);
}

/* cb = ap · bp for one call of a tile16, in double from the pairs. */
static void tile16_ref(double *ref, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, int mr, int nr) {
    for (int m = 0; m < mr; m++)
        for (int n = 0; n < nr; n++) {
            double s = 0;
            for (int p = 0; p < kp; p++)
                for (int h = 0; h < 2; h++)
                    s += (double)ft_bf16_to_f32((uint16_t)(ap[m * lda + p] >> 16 * h)) *
                         ft_bf16_to_f32((uint16_t)(bp[(size_t)p * nr + n] >> 16 * h));
            ref[m * nr + n] = s;
        }
}

/* One table's tile16 called directly: every kp from 1 to FT_GEMM_KC/2
 * (every tail length), lda the driver's and another, with add, and NaN
 * bits everywhere past kp in the panel and the strip: a kernel that read
 * past the pairs it was given would turn its outputs into NaN. */
static double tile16_direct(const ft_kernel_isa *isa, ft_rng *rng) {
    enum { KP = FT_GEMM_KC / 2, LDA2 = KP + 3 };
    double worst = 0;
    uint32_t *ap = malloc((size_t)32 * LDA2 * sizeof(uint32_t)), *bp = malloc((size_t)(KP + 16) * 32 * sizeof(uint32_t));
    float *cb = malloc(32 * 32 * sizeof(float)), *c0 = malloc(32 * 32 * sizeof(float));
    double *ref = malloc(32 * 32 * sizeof(double));
    if (!ap || !bp || !cb || !c0 || !ref) {
        CHECKF(0, "out of memory");
        goto done;
    }
    for (int shape = 0; shape < 2; shape++)
        for (int kp = 1; kp <= KP; kp++) {
            int mr = isa->mr16[shape], nr = isa->nr16[shape];
            int64_t lda = kp % 2 ? KP : LDA2;
            bool add = kp % 3 == 0;
            const uint32_t nan2 = 0x7FC17FC1; /* two bf16 NaNs */
            for (size_t i = 0; i < (size_t)32 * LDA2; i++) ap[i] = nan2;
            for (size_t i = 0; i < (size_t)(KP + 16) * 32; i++) bp[i] = nan2;
            for (int m = 0; m < mr; m++)
                for (int p = 0; p < kp; p++)
                    ap[m * lda + p] = (uint32_t)ft_f32_to_bf16(ft_rng_normal(rng)) |
                                      (uint32_t)ft_f32_to_bf16(ft_rng_normal(rng)) << 16;
            for (size_t i = 0; i < (size_t)kp * nr; i++)
                bp[i] = (uint32_t)ft_f32_to_bf16(ft_rng_normal(rng)) | (uint32_t)ft_f32_to_bf16(ft_rng_normal(rng)) << 16;
            for (int i = 0; i < mr * nr; i++) cb[i] = c0[i] = ft_rng_normal(rng);
            if (isa->tiles_begin) isa->tiles_begin(); /* as the driver brackets a task */
            isa->tile16[shape](cb, bp, ap, lda, kp, add);
            if (isa->tiles_end) isa->tiles_end();
            tile16_ref(ref, bp, ap, lda, kp, mr, nr);
            for (int i = 0; i < mr * nr; i++) {
                double want = ref[i] + (add ? c0[i] : 0);
                /* 2·kp products of unit normals (scale sqrt(2kp)) in one running f32 sum: as in gemm_case */
                double e = fabs(cb[i] - want) / (sqrt(2.0 * kp) + (add ? 1 : 0));
                if (!(e < 1e-5)) {
                    CHECKF(0, "%s shape %d kp=%d lda=%lld add=%d: element %d = %g, want %g", isa->name, shape, kp,
                           (long long)lda, add, i, cb[i], want);
                    goto done;
                }
                if (e > worst) worst = e;
            }
        }
done:
    free(ap); free(bp); free(cb); free(c0); free(ref);
    return worst;
}

/* The amx tables this CPU runs: the emulated tile unit wherever the
 * avx512bf16 level does (its other kernels), the real one where the probe
 * passed; none is a skip of the current test. */
static int amx_tables(const ft_kernel_isa *tables[2]) {
    int n = 0;
    if (ft_cpu_has_avx512bf16()) tables[n++] = &ft_kernels_amx_emulated;
    if (ft_cpu_has_amx()) tables[n++] = ft_kernels_for_level(FT_CPU_AMX);
    if (!n) check_skip(CHECK_HARDWARE, NULL, "this CPU has no avx512bf16, which the amx tables' other kernels need");
    return n;
}

/* store_t (C stored transposed) against the driver's scalar loop, bit for
 * bit: rows and columns on and off 16, overwrite and accumulate. */
static void test_store_t(void) {
    const ft_kernel_isa *isa = ft_kernels_for_level(ft_cpu_level());
    if (!isa->store_t) {
        check_skip(CHECK_HARDWARE, NULL, "no store_t at this CPU's best level (%s): it needs avx512", isa->name);
        return;
    }
    ft_rng rng;
    ft_rng_seed(&rng, 37);
    enum { NR = 32, LDC = 40 };
    float cb[32 * NR], c[40 * LDC], ref[40 * LDC];
    const int dims[] = { 1, 7, 16, 17, 31, 32 };
    int n = 0;
    for (int ri = 0; ri < 6; ri++)
        for (int ci = 0; ci < 6; ci++)
            for (int ow = 0; ow < 2; ow++) {
                int rows = dims[ri], cols = dims[ci];
                for (int i = 0; i < 32 * NR; i++) cb[i] = ft_rng_normal(&rng);
                for (int i = 0; i < 40 * LDC; i++) c[i] = ref[i] = ft_rng_normal(&rng);
                float alpha = ow ? 0.37f : -1.5f;
                isa->store_t(c, LDC, cb, NR, rows, cols, alpha, ow);
                for (int l = 0; l < cols; l++)
                    for (int r = 0; r < rows; r++)
                        ref[l * LDC + r] = ow ? alpha * cb[r * NR + l] : ref[l * LDC + r] + alpha * cb[r * NR + l];
                CHECKF(!memcmp(c, ref, sizeof c), "%s rows %d cols %d overwrite %d", isa->name, rows, cols, ow);
                n++;
            }
    printf("  %s: store_t equal to the scalar loop bit for bit in %d cases\n", isa->name, n);
}

/* The amx tables' gemm16 (attention's products on the tiles): M, N and kp
 * on and off the 16-word tile edges, operand rows longer than used with
 * NaN bits past the used part (a kernel that read past its operand's edge
 * would turn outputs into NaN), C's rows longer than N with a sentinel
 * past N (untouched), both C = alpha·A·B and C += alpha·A·B (alpha 1
 * and others: whole 32 × 32 blocks with alpha 1 load and store C in place);
 * against the
 * double product of the same bf16 pairs, bound 1e-5 relative to the sum's
 * scale as in tile16_direct (exact products, f32 sums). */
static void test_gemm16(void) {
    const ft_kernel_isa *tables[2];
    int n_tables = amx_tables(tables);
    if (!n_tables) return;
    CHECK(!ft_kernels_for_level(FT_CPU_AVX512BF16)->gemm16);
    ft_rng rng;
    ft_rng_seed(&rng, 31);
    const int sz[] = { 1, 15, 16, 17, 32, 33, 50, 70 };
    enum { NS = sizeof sz / sizeof sz[0], PAD = 5 };
    const uint32_t nan2 = 0x7FC17FC1;
    for (int ti = 0; ti < n_tables; ti++) {
        const ft_kernel_isa *isa = tables[ti];
        double worst = 0;
        int n_cases = 0;
        for (int mi = 0; mi < NS; mi++)
            for (int ni = 0; ni < NS; ni++)
                for (int ki = 0; ki < NS; ki++) {
                    int M = sz[mi], N = sz[ni], kp = sz[ki], lda = kp + PAD, ldb = N + PAD, ldc = N + PAD;
                    int v = (mi + ni + ki) % 4; /* alpha 1 takes the whole blocks' in-place path */
                    bool acc = v % 2;
                    float alpha = v == 0 ? 0.5f : v == 3 ? -0.75f : 1.0f;
                    uint32_t *a = malloc((size_t)M * lda * 4), *b = malloc((size_t)kp * ldb * 4);
                    float *c = malloc((size_t)M * ldc * 4), *c0 = malloc((size_t)M * ldc * 4);
                    for (int i = 0; i < M * lda; i++)
                        a[i] = i % lda < kp ? (uint32_t)ft_f32_to_bf16(ft_rng_normal(&rng)) |
                                                  (uint32_t)ft_f32_to_bf16(ft_rng_normal(&rng)) << 16
                                            : nan2;
                    for (int i = 0; i < kp * ldb; i++)
                        b[i] = i % ldb < N ? (uint32_t)ft_f32_to_bf16(ft_rng_normal(&rng)) |
                                                 (uint32_t)ft_f32_to_bf16(ft_rng_normal(&rng)) << 16
                                           : nan2;
                    for (int i = 0; i < M * ldc; i++) c[i] = c0[i] = i % ldc < N ? ft_rng_normal(&rng) : 1234.5f;
                    isa->tiles_begin();
                    isa->gemm16(c, ldc, a, lda, b, ldb, M, N, kp, alpha, acc);
                    isa->tiles_end();
                    for (int m = 0; m < M && !check_failed_; m++)
                        for (int n = 0; n < ldc; n++) {
                            if (n >= N) {
                                CHECKF(c[m * ldc + n] == 1234.5f, "%s M=%d N=%d kp=%d: C(%d, %d) past N written",
                                       isa->name, M, N, kp, m, n);
                                continue;
                            }
                            double sum = 0;
                            for (int p = 0; p < kp; p++)
                                for (int h = 0; h < 2; h++)
                                    sum += (double)ft_bf16_to_f32((uint16_t)(a[m * lda + p] >> 16 * h)) *
                                           ft_bf16_to_f32((uint16_t)(b[p * ldb + n] >> 16 * h));
                            double want = alpha * sum + (acc ? c0[m * ldc + n] : 0);
                            double e = fabs(c[m * ldc + n] - want) / (fabs(alpha) * sqrt(2.0 * kp) + (acc ? 1 : 0));
                            if (!(e < 1e-5)) {
                                CHECKF(0, "%s M=%d N=%d kp=%d acc=%d: C(%d, %d) = %g, want %g", isa->name, M, N, kp,
                                       acc, m, n, c[m * ldc + n], want);
                                break;
                            }
                            if (e > worst) worst = e;
                        }
                    free(a); free(b); free(c); free(c0);
                    n_cases++;
                }
        printf("  %s: gemm16, %d shapes, max rel err %.3g\n", isa->name, n_cases, worst);
    }
}

/* The amx micro-kernel (kernels_amx.h) through the driver, on the
 * emulated tile unit everywhere the avx512bf16 level runs and on the real
 * one where the probe passed: every M, N, K of 1, 15, 16, 17, 31, 33, 257
 * and 1000+ (tile edges at 16 and 32, the k tail, K chunks of 256 and
 * 1024) in the layouts linear.c and lora.c hand ft_gemm_in, against the
 * double product of the bf16-rounded operands, with the same 1e-5 bound as
 * test_gemm_compute (the products are exact and every sum is an f32 sum;
 * the worst seen is ~3e-6, as on avx512bf16) and the same bits on 1 and 3
 * threads (gemm_case); the subnormal inputs read as zero. The emulation
 * checks our data movement and tile configuration, not Intel's
 * instruction: only the real table's run tests that. */
static void test_amx_tiles(void) {
    const ft_kernel_isa *tables[2];
    int n_tables = amx_tables(tables);
    if (!n_tables) return;
    ft_rng rng;
    ft_rng_seed(&rng, 29);
    const int sz[] = { 1, 15, 16, 17, 31, 33, 257, 1030 };
    enum { NS = sizeof sz / sizeof sz[0] };
    float *scratch = ft_aligned_alloc(FT_GEMM_SCRATCH_FLOATS * sizeof(float));
    if (!scratch) {
        CHECKF(0, "out of memory");
        return;
    }
    for (int ti = 0; ti < n_tables; ti++) {
        const ft_kernel_isa *isa = tables[ti];
        CHECK(isa->tile16[0] && isa->mr16[0] == 32 && isa->nr16[0] == 32 && isa->nr16[1] == 16);
        double direct = tile16_direct(isa, &rng);
        ft_kernels_force(isa);
        forced_name = isa->name;
        double worst = 0;
        int n_cases = 0;
        for (int mi = 0; mi < NS; mi++)
            for (int ni = 0; ni < NS; ni++)
                for (int ki = 0; ki < NS; ki++) {
                    int M = sz[mi], N = sz[ni], K = sz[ki], i = mi + ni + ki;
                    if ((size_t)M * N * K > 2500000) continue; /* the emulation and the double reference are slow */
                    struct { ft_dtype adt; bool at; ft_dtype bdt; bool bt, ct; float alpha; } lay[] = {
                        { FT_F32, false, FT_BF16, true, false, 1.0f },  /* forward: X·Wᵀ */
                        { FT_F32, false, FT_BF16, false, false, 1.0f }, /* dX = dY·W */
                        { FT_F32, true, FT_F32, false, false, 1.0f },   /* dW += doutᵀ·X */
                        { FT_F32, false, FT_F32, true, true, -0.5f },   /* LoRA products, C transposed */
                        { FT_BF16, false, FT_F32, true, true, 1.0f },   /* few rows: W·Xᵀ into outᵀ */
                    };
                    int j = i % 5;
                    double e = gemm_case(FT_BF16, M, N, K, lay[j].adt, lay[j].at, lay[j].bdt, lay[j].bt, lay[j].ct,
                                         lay[j].alpha, i % 2, &rng);
                    CHECKF(e >= 0 && e < 1e-5, "%s M=%d N=%d K=%d layout %d: max rel err %.3g", isa->name, M, N, K, j,
                           e);
                    if (e > worst) worst = e;
                    n_cases++;
                }
        /* subnormal bf16 inputs are read as zero, as VDPBF16PS does */
        enum { M = 3, N = 20, K = 33 };
        float a[M * K], b[K * N], c[M * N];
        for (int i = 0; i < M * K; i++) a[i] = i < K ? 1e-39f : 1.0f;
        for (int i = 0; i < K * N; i++) b[i] = 0.5f;
        ft_mat A = ft_mat_f32(a, K, 1), B = ft_mat_f32(b, N, 1);
        CHECK(ft_gemm_in(FT_BF16, c, N, 1, &A, &B, M, N, K, 1.0f, false, 2, scratch, FT_GEMM_SCRATCH_FLOATS));
        for (int n = 0; n < N; n++)
            CHECKF(c[n] == 0.0f && c[N + n] == 16.5f && c[2 * N + n] == 16.5f, "%s: subnormal rows give %g %g %g",
                   isa->name, c[n], c[N + n], c[2 * N + n]);
        ft_kernels_force(NULL);
        forced_name = NULL;
        printf("  %s: %d driver cases, max rel err %.3g; direct tile16 calls (kp 1..%d), max rel err %.3g\n",
               isa->name, n_cases, worst, FT_GEMM_KC / 2, direct);
    }
    free(scratch);
    printf("  tested: %s\n", ft_cpu_has_amx() ? "the emulated tile unit and the real one (tdpbf16ps ran here)"
                                              : "the emulated tile unit only: our tiling, tails, strides and tile "
                                                "configuration; the real tdpbf16ps did not run (no AMX here)");
}

/* linear_backward for every base dtype and level, with bias and a LoRA
 * adapter under dropout, against plain loops on the dequantized weight:
 * dinp, dw (an f32 gradient whatever W's dtype), dbias, dA, dB. */
static void test_linear_backward(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 33);
    const int OC = 45, IC = 96, T = 37, R = 4;
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        double worst = 0;
        for (int ti = 0; ti < NTYPES; ti++) {
            lin_case c;
            if (!case_new(&c, types[ti], OC, IC, T, 3, true, &rng)) {
                CHECKF(0, "out of memory");
                case_free(&c);
                return;
            }
            size_t nA = (size_t)R * IC, nB = (size_t)OC * R;
            float *Am = malloc(nA * 4), *Bm = malloc(nB * 4), *dA = calloc(nA, 4), *dB = calloc(nB, 4);
            float *dAr = calloc(nA, 4), *dBr = calloc(nB, 4), *dout = malloc((size_t)T * OC * 4);
            float *dinp = malloc((size_t)T * IC * 4), *dinpr = malloc((size_t)T * IC * 4);
            float *dw = calloc((size_t)OC * IC, 4), *dwr = calloc((size_t)OC * IC, 4);
            float *db = calloc(OC, 4), *dbr = calloc(OC, 4), *u = malloc((size_t)T * R * 4);
            float *xd = malloc((size_t)T * IC * 4), *dx = malloc((size_t)T * IC * 4), *g = malloc((size_t)T * R * 4);
            float *yr = malloc((size_t)T * OC * 4), *wf = malloc((size_t)OC * IC * 4);
            float *scratch = ft_aligned_alloc(ft_linear_train_scratch_floats(IC, R, T, 3) * sizeof(float));
            if (!Am || !Bm || !dA || !dB || !dAr || !dBr || !dout || !dinp || !dinpr || !dw || !dwr || !db || !dbr ||
                !u || !xd || !dx || !g || !yr || !wf || !scratch) {
                CHECKF(0, "out of memory");
            } else {
                for (size_t i = 0; i < nA; i++) Am[i] = ft_rng_normal(&rng);
                for (size_t i = 0; i < nB; i++) Bm[i] = ft_rng_normal(&rng);
                for (size_t i = 0; i < (size_t)T * OC; i++) dout[i] = ft_rng_normal(&rng);
                ft_adapter_hparams hp = { .r = R, .alpha = 8, .dropout = 0.25f }; /* scale 2 */
                ft_lora a = { .base = { .kind = &ft_lora_kind, .hp = &hp }, .A = Am, .B = Bm, .dA = dA, .dB = dB };
                const ft_adapter_inst *ad = &a.base;
                uint64_t seed = 77;
                ft_linear_forward_train(c.y, u, c.x, &c.l, ad, T, seed, 3, scratch);
                ft_linear_backward(dinp, dw, db, dout, c.x, u, &c.l, ad, T, seed, false, 3, scratch);
                /* the reference: plain loops in double on the dequantized W,
                 * the adapter through lora.c's plain-loop references */
                for (int o = 0; o < OC; o++) ft_tensor_row_f32(&c.l.w, o, wf + (size_t)o * IC);
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < IC; i++) {
                        double s = 0;
                        for (int o = 0; o < OC; o++) s += (double)dout[(size_t)t * OC + o] * wf[(size_t)o * IC + i];
                        dinpr[(size_t)t * IC + i] = (float)s;
                    }
                for (int o = 0; o < OC; o++) {
                    double sb = 0;
                    for (int t = 0; t < T; t++) sb += dout[(size_t)t * OC + o];
                    dbr[o] = (float)sb;
                    for (int i = 0; i < IC; i++) {
                        double s = 0;
                        for (int t = 0; t < T; t++) s += (double)dout[(size_t)t * OC + o] * c.x[(size_t)t * IC + i];
                        dwr[(size_t)o * IC + i] = (float)s;
                    }
                }
                ft_lora ar = a;
                ar.dA = dAr;
                ar.dB = dBr;
                ft_lora_dropout(xd, c.x, hp.dropout, seed, T, IC, 1);
                memset(yr, 0, (size_t)T * OC * 4);
                float *ur = malloc((size_t)T * R * 4);
                if (ur) {
                    ft_lora_forward(yr, ur, xd, &ar, T, IC, OC);
                    double eu = check_max_rel_err(u, ur, (long)T * R, sqrt((double)IC));
                    CHECKF(eu < 1e-5, "%s %s: saved u max rel err %.3g", ft_cpu_level_name(levels[li]),
                           ft_types[types[ti]].name, eu);
                    ft_lora_backward(dx, dout, xd, ur, &ar, T, IC, OC, g);
                    free(ur);
                }
                ft_lora_dropout(dx, dx, hp.dropout, seed, T, IC, 1);
                for (size_t i = 0; i < (size_t)T * IC; i++) dinpr[i] += dx[i];
                /* every gradient is a sum of at most max(T, OC) = 45 unit-normal
                 * products (the adapter's through R = 4 more, scaled by 2 and by
                 * the dropout's 4/3), so errors are f32 rounding of sums of that
                 * scale: observed ~1e-6; 1e-5 as elsewhere in this file */
                struct { const char *name; const float *got, *want; long n; double scale; } cmp[] = {
                    { "dinp", dinp, dinpr, (long)T * IC, sqrt((double)OC) * 4 },
                    { "dw", dw, dwr, (long)OC * IC, sqrt((double)T) },
                    { "dbias", db, dbr, OC, sqrt((double)T) },
                    { "dA", dA, dAr, (long)nA, sqrt((double)T * OC) * 4 },
                    { "dB", dB, dBr, (long)nB, sqrt((double)T * IC) * 4 },
                };
                for (int k = 0; k < 5; k++) {
                    double e = check_max_rel_err(cmp[k].got, cmp[k].want, cmp[k].n, cmp[k].scale);
                    CHECKF(e < 1e-5, "%s W %s: %s max rel err %.3g", ft_cpu_level_name(levels[li]),
                           ft_types[types[ti]].name, cmp[k].name, e);
                    if (e > worst) worst = e;
                }
                /* and the same bits on one thread */
                float *dinp1 = malloc((size_t)T * IC * 4), *dw1 = calloc((size_t)OC * IC, 4);
                float *dA1 = calloc(nA, 4), *dB1 = calloc(nB, 4);
                if (dinp1 && dw1 && dA1 && dB1) {
                    a.dA = dA1;
                    a.dB = dB1;
                    ft_linear_backward(dinp1, dw1, NULL, dout, c.x, u, &c.l, ad, T, seed, false, 1, scratch);
                    CHECKF(!memcmp(dinp, dinp1, (size_t)T * IC * 4) && !memcmp(dw, dw1, (size_t)OC * IC * 4) &&
                               !memcmp(dA, dA1, nA * 4) && !memcmp(dB, dB1, nB * 4),
                           "%s W %s: linear_backward differs on 1 and 3 threads", ft_cpu_level_name(levels[li]),
                           ft_types[types[ti]].name);
                }
                free(dinp1); free(dw1); free(dA1); free(dB1);
            }
            free(Am); free(Bm); free(dA); free(dB); free(dAr); free(dBr); free(dout); free(dinp); free(dinpr);
            free(dw); free(dwr); free(db); free(dbr); free(u); free(xd); free(dx); free(g); free(yr); free(wf);
            free(scratch);
            case_free(&c);
        }
        printf("  %s: max rel err %.3g\n", ft_cpu_level_name(levels[li]), worst);
    }
    ft_cpu_force_level(FT_CPU_TOP);
}

/* The pair-packing primitives of a level with tile16, bit for bit against
 * ft_f32_to_bf16 one value at a time: values across every rounding case
 * (ties to even, NaN with payloads, ±inf, ±0, subnormals, the largest
 * finite values that round to inf), lengths and row counts off 16, odd kc
 * (the last pair's high half zero), rows < 16 (rows past them untouched). */
static uint32_t pair_ref(const float *lo, const float *hi) {
    return (uint32_t)ft_f32_to_bf16(*lo) | (hi ? (uint32_t)ft_f32_to_bf16(*hi) << 16 : 0);
}

static void test_pair_packing(void) {
    const ft_kernel_isa *isa = ft_kernels_for_level(ft_cpu_level());
    if (!isa->tile16[0]) {
        check_skip(CHECK_HARDWARE, NULL, "no pair kernels at this CPU's best level (%s): they need avx512bf16",
                   isa->name);
        return;
    }
    ft_rng rng;
    ft_rng_seed(&rng, 29);
    enum { N = 300, KC = 257, CS = 21 };
    /* twice: subnormals every 8th value (every vector of 16 has some), and
     * one in 512 (most vectors have none: the conversions' fast path) */
    float *vs[2];
    for (int pass = 0; pass < 2; pass++) {
        float *v = vs[pass] = malloc(sizeof(float) * KC * CS);
        for (int i = 0; i < KC * CS; i++) {
            uint32_t u = ft_rng_u32(&rng);
            switch (pass ? (i % 512 == 2 ? 2 : i % 8 == 2 ? 7 : i % 8) : i % 8) {
            case 0: u = (u & 0xFFFF0000u) | 0x8000u; break;          /* a tie: to even */
            case 1: u = 0x7F800000u | (u & 0x807FFFFFu) | 1u; break; /* NaN, any payload and sign */
            case 2: u = (u & 0x80000000u) | (u & 0x007FFFFFu); break; /* subnormal or ±0 */
            case 3: u = (u & 0x80000000u) | 0x7F7FFFFFu; break;      /* rounds to ±inf */
            case 4: u = (u & 0x80000000u) | 0x7F800000u; break;      /* ±inf */
            default: break;                                          /* anything */
            }
            memcpy(&v[i], &u, 4);
        }
    }
    uint32_t *dst = malloc(sizeof(uint32_t) * N), *wp = malloc(sizeof(uint32_t) * 16 * 140);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *v = vs[pass];
        for (int n = 1; n <= N; n += 37) {
            uint16_t h[N];
            isa->to_bf16(h, v + 3, n);
            for (int l = 0; l < n; l++) bad += h[l] != ft_f32_to_bf16(v[3 + l]);
            isa->pair_rows16_f32(dst, v, v + N, n);
            for (int l = 0; l < n; l++) bad += dst[l] != pair_ref(v + l, v + N + l);
            isa->pair_rows16_f32(dst, v + 7, NULL, n);
            for (int l = 0; l < n; l++) bad += dst[l] != pair_ref(v + 7 + l, NULL);
        }
        /* A (m, k) = v[k·CS + m]: rows 1..16, kc 1..257 */
        for (int rows = 1; rows <= 16; rows += 5)
            for (int kc = 1; kc <= KC; kc += 32) {
                for (int i = 0; i < 16 * 140; i++) wp[i] = 0xA5A5A5A5u;
                isa->pack_at16(wp, 140, v, CS, rows, kc);
                for (int r = 0; r < 16; r++)
                    for (int p = 0; p < (kc + 1) / 2; p++) {
                        uint32_t want = r < rows ? pair_ref(v + (2 * p) * CS + r,
                                                            2 * p + 1 < kc ? v + (2 * p + 1) * CS + r : NULL)
                                                 : 0xA5A5A5A5u;
                        bad += wp[r * 140 + p] != want;
                    }
            }
    }
    /* pair_rows16 from bf16 rows (no rounding of its own: one set of values) */
    float *v = vs[0];
    for (int n = 1; n <= N; n += 37) {
        uint16_t lo[N], hi[N];
        for (int l = 0; l < n; l++) lo[l] = ft_f32_to_bf16(v[l]), hi[l] = ft_f32_to_bf16(v[N + l]);
        isa->pair_rows16(dst, lo, hi, n);
        for (int l = 0; l < n; l++) bad += dst[l] != pair_ref(v + l, v + N + l);
    }
    /* pack_cols16: column j's words at src + j·ld to dst[p·32 + j], zeros past ncols */
    uint32_t *src = malloc(sizeof(uint32_t) * 16 * 131), *strip = malloc(sizeof(uint32_t) * 130 * 32);
    for (int i = 0; i < 16 * 131; i++) src[i] = ft_rng_u32(&rng);
    for (int ncols = 0; ncols <= 16; ncols += 3)
        for (int kp = 1; kp <= 130; kp += 43) {
            for (int i = 0; i < 130 * 32; i++) strip[i] = 0x5A5A5A5Au;
            isa->pack_cols16(strip + 16, 32, src, 131, ncols, kp); /* the strip's second 16 columns */
            for (int p = 0; p < 130; p++)
                for (int l = 0; l < 32; l++) {
                    uint32_t want = p >= kp || l < 16 ? 0x5A5A5A5Au : l - 16 < ncols ? src[(l - 16) * 131 + p] : 0;
                    bad += strip[p * 32 + l] != want;
                }
        }
    free(src);
    free(strip);
    CHECKF(bad == 0, "%s: %d pair words differ from ft_f32_to_bf16's (or from the words given)", isa->name, bad);
    printf("  %s: to_bf16, pair_rows16, pair_rows16_f32, pack_at16 and pack_cols16 give ft_f32_to_bf16's bits\n",
           isa->name);
    free(vs[0]), free(vs[1]);
    free(dst);
    free(wp);
}

int main(void) {
    find_levels();
    RUN(test_cpu_levels);
    RUN(test_kernels_decline);
    RUN(test_linear_kernels);
    RUN(test_thread_invariance);
    RUN(test_nonfinite);
    RUN(test_edge_weights);
    RUN(test_gemm_layouts);
    RUN(test_gemm_compute);
    RUN(test_gemm_bf16_subnormal);
    RUN(test_pair_packing);
    RUN(test_amx_probe);
    RUN(test_amx_tiles);
    RUN(test_gemm16);
    RUN(test_store_t);
    RUN(test_linear_backward);
    CHECK_EXIT();
}
