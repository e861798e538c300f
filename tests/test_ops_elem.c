/* test_ops_elem.c — the fast elementwise and row ops of src/ops/ops_elem.c
 * against the references of src/ops/ops.c, at every kernel level this CPU
 * has, on awkward sizes, on 1 and 3 threads (the same bits either way):
 * RoPE and the bf16 conversions bit for bit; SwiGLU and RMSNorm against
 * the float64 twins within stated tolerances; and the threaded references
 * the f32 backend uses (ft_*_mt) bit for bit against the references.
 */
#include "check.h"
#include "cpu/cpu.h"
#include "ops/ops.h"

#include <stdint.h>

static ft_rng rng;

static float *rand_f(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)ft_rng_normal(&rng);
    return x;
}
static float *dup_f(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static int levels[FT_CPU_NLEVELS], n_levels;
static void find_levels(void) {
    n_levels = 0;
    for (int lv = FT_CPU_GENERIC; lv <= ft_cpu_level(); lv++) levels[n_levels++] = lv;
}

/* ------------------------------------------------------------- rope */

static void run_rope(int T, int nh, int HS, bool interleaved) {
    size_t n = (size_t)T * nh * HS;
    float *inv = malloc((size_t)(HS / 2 + 1) * sizeof(float));
    ft_rope_scaling sc = { .type = 2, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                           .original_max_pos = 8192 };
    ft_rope_freqs(inv, HS, 500000.0f, HS % 4 ? NULL : &sc);
    int *pos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = (int)(ft_rng_u32(&rng) % 9000);
    float *x = rand_f(n, 1.0f), *ref = dup_f(x, n), *refb = dup_f(x, n);
    ft_rope_forward(ref, pos, inv, T, nh, HS, interleaved);
    ft_rope_backward(refb, pos, inv, T, nh, HS, interleaved);
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (int nt = 1; nt <= 3; nt += 2) {
            float *y = dup_f(x, n), *yb = dup_f(x, n);
            ft_rope_forward_fast(y, pos, inv, T, nh, HS, interleaved, nt);
            ft_rope_backward_fast(yb, pos, inv, T, nh, HS, interleaved, nt);
            CHECKF(memcmp(y, ref, n * sizeof(float)) == 0 && memcmp(yb, refb, n * sizeof(float)) == 0,
                   "%s T=%d nh=%d HS=%d%s threads %d: not the reference's bits", ft_cpu_level_name(levels[li]), T,
                   nh, HS, interleaved ? " interleaved" : "", nt);
            free(y);
            free(yb);
        }
    }
    ft_cpu_force_level(-1);
    printf("  rope T=%d nh=%d HS=%d%s: bit-identical at %d levels\n", T, nh, HS, interleaved ? " interleaved" : "",
           n_levels);
    free(inv); free(pos); free(x); free(ref); free(refb);
}

static void test_rope(void) {
    /* T·nh·HS above the one-thread cut (32768) in the larger cases */
    const int cs[][3] = { { 1, 1, 2 }, { 7, 3, 6 }, { 65, 5, 64 }, { 130, 6, 34 }, { 300, 4, 128 }, { 33, 2, 32 } };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int il = 0; il < 2; il++) run_rope(cs[i][0], cs[i][1], cs[i][2], il);
}

/* ------------------------------------------------------------- bf16 */

static void test_bf16_convert(void) {
    /* random bit patterns (every exponent: subnormals, inf, NaN) and the edges */
    size_t n = 200003;
    float *x = malloc(n * sizeof(float));
    uint32_t *xb = (uint32_t *)x;
    for (size_t i = 0; i < n; i++) xb[i] = ft_rng_u32(&rng);
    const uint32_t edge[] = { 0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFF80FFFFu,
                              0x00000001u, 0x007FFFFFu, 0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x3F80FFFFu };
    memcpy(x, edge, sizeof edge);
    uint16_t *h_ref = malloc(n * 2), *h = malloc(n * 2);
    float *r_ref = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float)), *w_ref = malloc(n * sizeof(float));
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        h_ref[i] = ft_f32_to_bf16(x[i]);
        r_ref[i] = ft_bf16_to_f32(h_ref[i]);
        w_ref[i] = ft_bf16_to_f32((uint16_t)xb[i]);
    }
    uint16_t *hx = malloc(n * 2);
    for (size_t i = 0; i < n; i++) hx[i] = (uint16_t)xb[i];
    const size_t sizes[] = { 1, 15, 17, 4097, n };
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            size_t m = sizes[si];
            for (int nt = 1; nt <= 3; nt += 2) {
                memset(h, 0, m * 2);
                ft_bf16_from_f32_fast(h, x, m, nt);
                ft_bf16_round_fast(r, x, m, nt);
                ft_bf16_to_f32_fast(w, hx, m, nt);
                CHECKF(memcmp(h, h_ref, m * 2) == 0, "%s n=%zu: to bf16", ft_cpu_level_name(levels[li]), m);
                CHECKF(memcmp(r, r_ref, m * 4) == 0, "%s n=%zu: round", ft_cpu_level_name(levels[li]), m);
                CHECKF(memcmp(w, w_ref, m * 4) == 0, "%s n=%zu: from bf16", ft_cpu_level_name(levels[li]), m);
            }
        }
        /* in place */
        memcpy(r, x, n * sizeof(float));
        ft_bf16_round_fast(r, r, n, 3);
        CHECK(memcmp(r, r_ref, n * 4) == 0);
    }
    ft_cpu_force_level(-1);
    free(x); free(h_ref); free(h); free(r_ref); free(r); free(w_ref); free(w); free(hx);
}

/* ------------------------------------------------------------- swiglu */

/* SwiGLU against the float64 twins on the same float inputs. The vector
 * exp is within 3e-7 relative (test_ops_fast's EXP_TOL, ~5 ulp of 2^-24);
 * forward then rounds 1+e, the quotient and the product (3 more half-ulps,
 * and 1+e passes on at most e's relative error): out is within ~7 ulp =
 * 4.2e-7 relative of the truth; 6e-7 leaves a margin, while a wrong sign
 * or operand is off by O(1). Backward's dgate = dout·up·sig·(1 + g(1-sig))
 * cancels near g = -1.28 (silu' = 0), and 1-sig, rounded from sig ~ 1,
 * carries an absolute 2^-24 that g multiplies (the float reference has
 * both): it is judged against dout·up·sig·(1 + |g|), the size of its terms
 * and of that rounding; relative to that, ~10 roundings after the exp,
 * 1e-6. dup = dout·g·sig: as forward, 6e-7. */
#define SWIGLU_TOL 6e-7
#define SWIGLU_DG_TOL 1e-6

static void run_swiglu(int T, int F, float scale) {
    size_t n = (size_t)T * F;
    float *g = rand_f(n, scale), *u = rand_f(n, 1.0f), *dy = rand_f(n, 1.0f);
    if (n > 4) { g[0] = -100.0f; g[1] = 100.0f; g[2] = 0.0f; g[3] = -1.2784645f; }
    double *gD = malloc(n * sizeof(double)), *uD = malloc(n * sizeof(double)), *dyD = malloc(n * sizeof(double));
    double *oD = malloc(n * sizeof(double)), *dgD = malloc(n * sizeof(double)), *duD = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) gD[i] = g[i], uD[i] = u[i], dyD[i] = dy[i];
    ft_swiglu_forward_f64(oD, gD, uD, T, F);
    ft_swiglu_backward_f64(dgD, duD, dyD, gD, uD, T, F);
    float *o = malloc(n * sizeof(float)), *dg = malloc(n * sizeof(float)), *du = malloc(n * sizeof(float));
    float *o3 = malloc(n * sizeof(float)), *dg3 = malloc(n * sizeof(float)), *du3 = malloc(n * sizeof(float));
    float *oR = malloc(n * sizeof(float)), *dgR = malloc(n * sizeof(float)), *duR = malloc(n * sizeof(float));
    ft_swiglu_forward(oR, g, u, T, F);
    ft_swiglu_backward(dgR, duR, dy, g, u, T, F);
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        ft_swiglu_forward_fast(o, g, u, T, F, 1);
        ft_swiglu_backward_fast(dg, du, dy, g, u, T, F, 1);
        double eo = 0, edg = 0, edu = 0, ro = 0, rdg = 0, rdu = 0;
        for (size_t i = 0; i < n; i++) {
            double sig = 1 / (1 + exp(-gD[i]));
            double dg_size = fabs(dyD[i] * uD[i]) * sig * (1 + fabs(gD[i])) + 1e-30;
            double fo = fmax(fabs(oD[i]), 1e-30), fu = fmax(fabs(duD[i]), 1e-30);
            eo = fmax(eo, fabs(o[i] - oD[i]) / fo);
            edg = fmax(edg, fabs(dg[i] - dgD[i]) / dg_size);
            edu = fmax(edu, fabs(du[i] - duD[i]) / fu);
            ro = fmax(ro, fabs(oR[i] - oD[i]) / fo);
            rdg = fmax(rdg, fabs(dgR[i] - dgD[i]) / dg_size);
            rdu = fmax(rdu, fabs(duR[i] - duD[i]) / fu);
            if (isnan(o[i]) || isnan(dg[i]) || isnan(du[i])) eo = INFINITY;
        }
        printf("  swiglu %s T=%d F=%d scale %g: max rel err out %.2g dgate %.2g dup %.2g (float reference: %.2g %.2g "
               "%.2g)\n", ft_cpu_level_name(levels[li]), T, F, scale, eo, edg, edu, ro, rdg, rdu);
        CHECKF(eo <= SWIGLU_TOL && edg <= SWIGLU_DG_TOL && edu <= SWIGLU_TOL, "out %g dgate %g dup %g", eo, edg,
               edu);
        ft_swiglu_forward_fast(o3, g, u, T, F, 3);
        ft_swiglu_backward_fast(dg3, du3, dy, g, u, T, F, 3);
        CHECK(memcmp(o3, o, n * sizeof(float)) == 0 && memcmp(dg3, dg, n * sizeof(float)) == 0 &&
              memcmp(du3, du, n * sizeof(float)) == 0);
    }
    ft_cpu_force_level(-1);
    free(g); free(u); free(dy); free(gD); free(uD); free(dyD); free(oD); free(dgD); free(duD);
    free(o); free(dg); free(du); free(o3); free(dg3); free(du3); free(oR); free(dgR); free(duR);
}

static void test_swiglu(void) {
    run_swiglu(1, 1, 2.0f);
    run_swiglu(3, 7, 2.0f);
    run_swiglu(5, 33, 8.0f);
    run_swiglu(65, 1000, 3.0f); /* above the one-thread cut: tasks of 4096 with a ragged end */
    run_swiglu(7, 5003, 30.0f); /* exp's range ends: e = 0 and e = inf */
}

/* ------------------------------------------------------------- rmsnorm */

/* RMSNorm against the float64 twins. Forward: the sum of squares in float
 * lanes of C/16 terms (relative error ~sqrt(C/16)·2^-24 in practice, at
 * most (C/16)·2^-24 = 8e-6 at C = 2000 with every term alike, halved by
 * the square root), then ~4 roundings: 1e-5 relative bounds the worst
 * case. Backward: dx += r·(dy·w - xhat·m) cancels, so each element is
 * judged against |dx0| + r·(|dy·w| + |xhat·m|), the size of its terms;
 * the dot product behind m has the forward's error, 1e-5. dw += Σ_t
 * dy·xhat sums T float terms in order (as the reference, fused): judged
 * against |dw0| + Σ|dy·xhat|, T·2^-24 at worst, 1e-5 for T <= 130. */
#define RMS_TOL 1e-5

static void run_rmsnorm(int T, int C) {
    size_t n = (size_t)T * C;
    float *x = rand_f(n, 2.0f), *w = rand_f((size_t)C, 1.0f), *dy = rand_f(n, 1.0f), *dx0 = rand_f(n, 1.0f);
    float *dw0 = rand_f((size_t)C, 1.0f);
    double *xD = malloc(n * sizeof(double)), *wD = malloc((size_t)C * sizeof(double)), *dyD = malloc(n * sizeof(double));
    double *oD = malloc(n * sizeof(double)), *rD = malloc((size_t)T * sizeof(double)), *rD0 = malloc((size_t)T * sizeof(double));
    double *dxD = malloc(n * sizeof(double)), *dwD = calloc((size_t)C, sizeof(double));
    for (size_t i = 0; i < n; i++) xD[i] = x[i], dyD[i] = dy[i], dxD[i] = 0;
    for (int i = 0; i < C; i++) wD[i] = w[i];
    ft_rmsnorm_forward_f64(oD, rD0, xD, wD, T, C, 1e-5);
    float *o = malloc(n * sizeof(float)), *r = malloc((size_t)T * sizeof(float)), *o3 = malloc(n * sizeof(float));
    float *r3 = malloc((size_t)T * sizeof(float));
    float *dx = malloc(n * sizeof(float)), *dw = malloc((size_t)C * sizeof(float)), *dx3 = malloc(n * sizeof(float));
    float *dw3 = malloc((size_t)C * sizeof(float));
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        ft_rmsnorm_forward_fast(o, r, x, w, T, C, 1e-5f, 1);
        double eo = 0, er = 0;
        for (size_t i = 0; i < n; i++) eo = fmax(eo, fabs(o[i] - oD[i]) / fmax(fabs(oD[i]), 1e-30));
        for (int t = 0; t < T; t++) er = fmax(er, fabs(r[t] - rD0[t]) / rD0[t]);
        /* backward from the fast path's own rstd, in double on the same rstd */
        for (int t = 0; t < T; t++) rD[t] = r[t];
        memset(dwD, 0, (size_t)C * sizeof(double));
        for (size_t i = 0; i < n; i++) dxD[i] = 0;
        ft_rmsnorm_backward_f64(dxD, dwD, dyD, xD, wD, rD, T, C);
        memcpy(dx, dx0, n * sizeof(float));
        memcpy(dw, dw0, (size_t)C * sizeof(float));
        ft_rmsnorm_backward_fast(dx, dw, dy, x, w, r, T, C, 1);
        double edx = 0, edw = 0;
        for (int t = 0; t < T; t++) {
            double dot = 0;
            for (int i = 0; i < C; i++) dot += dyD[(size_t)t * C + i] * wD[i] * xD[(size_t)t * C + i] * rD[t];
            double m = fabs(dot / C);
            for (int i = 0; i < C; i++) {
                size_t k = (size_t)t * C + i;
                double size = fabs(dx0[k]) + rD[t] * (fabs(dyD[k] * wD[i]) + fabs(xD[k] * rD[t]) * m);
                edx = fmax(edx, fabs(dx[k] - (dx0[k] + dxD[k])) / size);
            }
        }
        for (int i = 0; i < C; i++) {
            double size = fabs(dw0[i]);
            for (int t = 0; t < T; t++) size += fabs(dyD[(size_t)t * C + i] * xD[(size_t)t * C + i] * rD[t]);
            edw = fmax(edw, fabs(dw[i] - (dw0[i] + dwD[i])) / size);
        }
        printf("  rmsnorm %s T=%d C=%d: max rel err out %.2g rstd %.2g dx %.2g dw %.2g\n",
               ft_cpu_level_name(levels[li]), T, C, eo, er, edx, edw);
        CHECKF(eo <= RMS_TOL && er <= RMS_TOL && edx <= RMS_TOL && edw <= RMS_TOL, "out %g rstd %g dx %g dw %g", eo,
               er, edx, edw);
        ft_rmsnorm_forward_fast(o3, r3, x, w, T, C, 1e-5f, 3);
        memcpy(dx3, dx0, n * sizeof(float));
        memcpy(dw3, dw0, (size_t)C * sizeof(float));
        ft_rmsnorm_backward_fast(dx3, dw3, dy, x, w, r, T, C, 3);
        CHECK(memcmp(o3, o, n * sizeof(float)) == 0 && memcmp(r3, r, (size_t)T * sizeof(float)) == 0 &&
              memcmp(dx3, dx, n * sizeof(float)) == 0 && memcmp(dw3, dw, (size_t)C * sizeof(float)) == 0);
        /* dw NULL (a frozen norm): dx alone, the same bits */
        memcpy(dx3, dx0, n * sizeof(float));
        ft_rmsnorm_backward_fast(dx3, NULL, dy, x, w, r, T, C, 3);
        CHECK(memcmp(dx3, dx, n * sizeof(float)) == 0);
    }
    ft_cpu_force_level(-1);
    free(x); free(w); free(dy); free(dx0); free(dw0); free(xD); free(wD); free(dyD); free(oD); free(rD); free(rD0);
    free(dxD); free(dwD); free(o); free(r); free(o3); free(r3); free(dx); free(dw); free(dx3); free(dw3);
}

static void test_rmsnorm(void) {
    run_rmsnorm(1, 1);
    run_rmsnorm(3, 7);
    run_rmsnorm(5, 33);
    run_rmsnorm(65, 1000); /* above the one-thread cut, 16 dw tasks with a ragged end */
    run_rmsnorm(130, 2000);
}

/* ------------------------------------------------ threaded references */

/* ft_rmsnorm_*_mt and ft_swiglu_*_mt split the reference's rows or spans:
 * the same bits on 1, 2 and 3 threads, dinp and dw accumulating onto
 * nonzero values as the reference's do, sizes below and above the
 * one-thread cut-off and not multiples of a task. */
static void run_mt(int T, int C) {
    size_t n = (size_t)T * C;
    float *x = rand_f(n, 1.5f), *u = rand_f(n, 1.0f), *dy = rand_f(n, 1.0f), *w = rand_f((size_t)C, 1.0f);
    float *dx0 = rand_f(n, 0.1f), *dw0 = rand_f((size_t)C, 0.1f);
    float *ro = malloc(n * sizeof(float)), *rr = malloc((size_t)T * sizeof(float));
    float *rdx = dup_f(dx0, n), *rdw = dup_f(dw0, (size_t)C);
    float *so = malloc(n * sizeof(float)), *sg = malloc(n * sizeof(float)), *su = malloc(n * sizeof(float));
    ft_rmsnorm_forward(ro, rr, x, w, T, C, 1e-5f);
    ft_rmsnorm_backward(rdx, rdw, dy, x, w, rr, T, C);
    ft_swiglu_forward(so, x, u, T, C);
    ft_swiglu_backward(sg, su, dy, x, u, T, C);
    for (int nt = 1; nt <= 3; nt++) {
        float *o = malloc(n * sizeof(float)), *r = malloc((size_t)T * sizeof(float));
        float *dx = dup_f(dx0, n), *dw = dup_f(dw0, (size_t)C), *dxn = dup_f(dx0, n);
        float *o2 = malloc(n * sizeof(float)), *g2 = malloc(n * sizeof(float)), *u2 = malloc(n * sizeof(float));
        ft_rmsnorm_forward_mt(o, r, x, w, T, C, 1e-5f, nt);
        ft_rmsnorm_backward_mt(dx, dw, dy, x, w, rr, T, C, nt);
        ft_rmsnorm_backward_mt(dxn, NULL, dy, x, w, rr, T, C, nt); /* dw NULL: dinp alone */
        ft_swiglu_forward_mt(o2, x, u, T, C, nt);
        ft_swiglu_backward_mt(g2, u2, dy, x, u, T, C, nt);
        CHECKF(!memcmp(o, ro, n * 4) && !memcmp(r, rr, (size_t)T * 4), "rmsnorm_forward_mt T=%d C=%d threads %d", T,
               C, nt);
        CHECKF(!memcmp(dx, rdx, n * 4) && !memcmp(dw, rdw, (size_t)C * 4) && !memcmp(dxn, rdx, n * 4),
               "rmsnorm_backward_mt T=%d C=%d threads %d", T, C, nt);
        CHECKF(!memcmp(o2, so, n * 4) && !memcmp(g2, sg, n * 4) && !memcmp(u2, su, n * 4),
               "swiglu_mt T=%d C=%d threads %d", T, C, nt);
        free(o), free(r), free(dx), free(dw), free(dxn), free(o2), free(g2), free(u2);
    }
    printf("  threaded references T=%d C=%d: the references' bits on 1, 2 and 3 threads\n", T, C);
    free(x), free(u), free(dy), free(w), free(dx0), free(dw0), free(ro), free(rr), free(rdx), free(rdw);
    free(so), free(sg), free(su);
}

static void test_threaded_references(void) {
    run_mt(1, 7);
    run_mt(3, 257);
    run_mt(37, 1000); /* above the one-thread cut-off, rows not a multiple of 16 */
    run_mt(129, 771); /* columns not a multiple of dw's 256 */
}

int main(void) {
    ft_rng_seed(&rng, 4321);
    find_levels();
    RUN(test_rope);
    RUN(test_bf16_convert);
    RUN(test_swiglu);
    RUN(test_rmsnorm);
    RUN(test_threaded_references);
    CHECK_EXIT();
}
