/* test_lm_loss_vocab.c — the fused LM head + cross-entropy with the
 * vocabulary in slices (V above FT_LM_LOSS_VSLICE): loss, dh and dW against
 * all logits and the plain cross-entropy in double, on llama-3's V = 128256
 * and awkward V (one class past a slice, odd tails), with ignored targets,
 * targets on slice edges, several row chunks, a frozen head (the one-pass
 * backward) and a trainable one (two passes); against the whole-row path of
 * the same backend in bf16 compute, with a near-certain target (where
 * p - 1 must not cancel to noise); bit-identical across thread counts; and
 * a loss that needs whole rows still gets them at V = 128256. */
#include "nn/lm_loss.h"
#include "ops/ops.h"
#include "check.h"

#include <stdint.h>

static float *randn(ft_rng *rng, size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = ft_rng_normal(rng) * scale;
    return p;
}

typedef struct {
    float *w;     /* (V, C) the values the head holds, as f32 */
    void *q;      /* the head's storage in its dtype */
    ft_linear lin;
} test_head;

static void make_head(test_head *h, ft_dtype dt, int V, int C, ft_rng *rng) {
    float *w = randn(rng, (size_t)V * C, 0.5f);
    int64_t nb = ft_dtype_nbytes(dt, (int64_t)V * C);
    h->q = malloc((size_t)nb);
    ft_types[dt].from_f32(w, h->q, (int64_t)V * C);
    ft_types[dt].to_f32(h->q, w, (int64_t)V * C);
    h->w = w;
    h->lin = (ft_linear){ .w = { .dtype = dt, .ndim = 2, .shape = { V, C }, .data = h->q, .nbytes = (size_t)nb },
                          .in = C, .out = V };
}

typedef struct {
    double loss;
    int64_t count;
    float *dh, *dw;
} lm_result;

static lm_result run_fused(const test_head *hd, const ft_loss *loss, ft_dtype compute, const float *h, const int *tg,
                           int n, int CH, int nt, float scale, bool grad_w) {
    int V = hd->lin.out, C = hd->lin.in;
    lm_result r = { 0 };
    float *scr = ft_aligned_alloc(ft_lm_loss_scratch_floats(CH, V, true) * sizeof(float));
    float *ls = ft_aligned_alloc(ft_linear_train_scratch_floats(C, 0, CH, nt) * sizeof(float));
    ft_backend be = ft_backend_cpu_in(compute, nt);
    ft_lm_loss_env e = { .head = &hd->lin, .loss = loss, .chunk_rows = CH, .be = &be, .scratch = scr,
                         .lin_scratch = ls };
    r.dh = malloc((size_t)n * C * sizeof(float));
    r.dw = grad_w ? calloc((size_t)V * C, sizeof(float)) : NULL;
    int64_t c2;
    double l2 = ft_lm_loss_forward(&e, &c2, h, tg, n);
    r.loss = ft_lm_loss_backward(&e, r.dh, r.dw, &r.count, h, tg, n, scale);
    /* forward and backward both take the loss from the first pass over the slices */
    CHECKF((l2 == r.loss || (isnan(l2) && isnan(r.loss))) && c2 == r.count, "forward %.17g (%lld) vs backward %.17g (%lld)",
           l2, (long long)c2, r.loss, (long long)r.count);
    free(scr);
    free(ls);
    return r;
}

/* The plain version in double: all (n, V) logits, the reference
 * cross-entropy, dh = dlogits·W, dW = dlogitsᵀ·h. */
static double reference(double *dh, double *dw, const float *w, const float *h, const int *tg, int n, int C, int V,
                        double scale) {
    double *lg = malloc((size_t)n * V * sizeof(double)), *dlg = malloc((size_t)n * V * sizeof(double));
    for (int r = 0; r < n; r++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int c = 0; c < C; c++) s += (double)h[(size_t)r * C + c] * w[(size_t)v * C + c];
            lg[(size_t)r * V + v] = s;
        }
    double loss = ft_crossentropy_forward_backward_f64(dlg, lg, tg, n, V, scale);
    memset(dh, 0, (size_t)n * C * sizeof(double));
    memset(dw, 0, (size_t)V * C * sizeof(double));
    for (int r = 0; r < n; r++)
        for (int v = 0; v < V; v++) {
            double d = dlg[(size_t)r * V + v];
            if (d == 0) continue;
            for (int c = 0; c < C; c++) {
                dh[(size_t)r * C + c] += d * w[(size_t)v * C + c];
                dw[(size_t)v * C + c] += d * h[(size_t)r * C + c];
            }
        }
    free(lg);
    free(dlg);
    return loss;
}

static double max_rel_d(const float *a, const double *b, size_t n) {
    double mx = 0, e = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / mx;
        e = isnan(d) ? INFINITY : fmax(e, d);
    }
    return e;
}

static void test_sliced_vs_plain(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 21);
    const int S = FT_LM_LOSS_VSLICE;
    struct { ft_dtype dt; int n, C, V, CH; } cases[] = {
        { FT_F32, 7, 24, 128256, 3 },   /* llama-3's vocabulary, three row chunks */
        { FT_F32, 5, 19, S + 1, 2 },    /* a last slice of one class */
        { FT_F32, 4, 33, 100003, 4 },   /* an odd tail (100003 - 3·32768 = 1699) */
        { FT_BF16, 6, 40, 2 * S, 5 },   /* whole slices; bf16 weights */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci].n, C = cases[ci].C, V = cases[ci].V, CH = cases[ci].CH;
        test_head hd;
        make_head(&hd, cases[ci].dt, V, C, &rng);
        float *h = randn(&rng, (size_t)n * C, 1.0f);
        int *tg = malloc((size_t)n * sizeof(int));
        /* ignored rows (-100, -1), and targets on either side of slice edges */
        int edge[] = { S - 1, S, V - 1, 0 };
        for (int i = 0; i < n; i++)
            tg[i] = i == 1 ? -100 : i == 4 ? -1 : i % 2 == 0 ? edge[(i / 2) % 4] : (int)(ft_rng_u32(&rng) % (uint32_t)V);
        int64_t want = 0;
        for (int i = 0; i < n; i++) want += tg[i] >= 0;
        float scale = 1.0f / 7;
        double *rdh = malloc((size_t)n * C * sizeof(double)), *rdw = malloc((size_t)V * C * sizeof(double));
        double rl = reference(rdh, rdw, hd.w, h, tg, n, C, V, scale);
        for (int gw = 0; gw < 2; gw++) {
            lm_result r = run_fused(&hd, &ft_loss_crossentropy, FT_F32, h, tg, n, CH, 2, scale, gw);
            CHECKF(r.count == want, "count %lld, want %lld", (long long)r.count, (long long)want);
            /* f32 logits (a C-term sum, a few ulps), exp in float (~2 ulp),
             * the sums in double: 1e-6 of a sum of positive terms, as for
             * the unsliced loss (test_block) */
            double le = fabs(r.loss - rl) / fabs(rl);
            /* dh: a V-term sum of p·w in f32 GEMMs plus the target's term,
             * rescaled per slice by exp(m_old - m_new) (~1 ulp each);
             * relative to the largest entry, as in test_block: 1e-5 */
            double eh = max_rel_d(r.dh, rdh, (size_t)n * C);
            double ew = gw ? max_rel_d(r.dw, rdw, (size_t)V * C) : 0;
            printf("  %s n=%d C=%d V=%d chunk=%d %s head: loss rel err %.2e, dh %.2e, dw %.2e\n",
                   ft_types[cases[ci].dt].name, n, C, V, CH, gw ? "trainable" : "frozen", le, eh, ew);
            CHECKF(le < 1e-6, "V=%d: loss %.10g, reference %.10g (rel %.3g)", V, r.loss, rl, le);
            CHECKF(eh < 1e-5, "V=%d: dh rel err %.3g", V, eh);
            CHECKF(ew < 1e-5, "V=%d: dw rel err %.3g", V, ew);
            /* ignored rows get no gradient */
            for (int i = 0; i < n; i++)
                if (tg[i] < 0)
                    for (int c = 0; c < C; c++) CHECK(r.dh[(size_t)i * C + c] == 0);
            /* each row on one thread, in a fixed order: 1 and 3 threads give the same bits */
            for (int nt = 1; nt <= 3; nt += 2) {
                lm_result s = run_fused(&hd, &ft_loss_crossentropy, FT_F32, h, tg, n, CH, nt, scale, gw);
                CHECKF(s.loss == r.loss, "%d threads: loss %.17g vs %.17g", nt, s.loss, r.loss);
                CHECK(memcmp(s.dh, r.dh, (size_t)n * C * sizeof(float)) == 0);
                if (gw) CHECK(memcmp(s.dw, r.dw, (size_t)V * C * sizeof(float)) == 0);
                free(s.dh); free(s.dw);
            }
            free(r.dh); free(r.dw);
        }
        free(rdh); free(rdw); free(h); free(tg); free(hd.w); free(hd.q);
    }
}

/* the cross-entropy through fn only: a loss lm_loss may not slice */
static double whole_ce(void *ctx, float *dlogits, const float *logits, const int *targets, int r0, int n, int V,
                       float dloss_scale, const ft_backend *be) {
    int *rows = ctx;
    if (n > *rows) *rows = n;
    return be->crossentropy(be, dlogits, logits, targets, n, V, dloss_scale);
}

/* In bf16 compute the GEMMs round their operands to bf16: the sliced path
 * and the whole-row path (be->crossentropy on whole rows) then differ by
 * that rounding only, including on rows whose target is near-certain. */
static void test_sliced_bf16_and_whole_rows(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    int n = 6, C = 48, V = 128256, CH = 4;
    test_head hd;
    make_head(&hd, FT_BF16, V, C, &rng);
    float *h = randn(&rng, (size_t)n * C, 1.0f);
    int tg[6] = { 3, 70000, -100, 128255, 32768, 5 };
    /* row 5: h along w_5 makes p_5 near 1, where p - 1 is small */
    float nn = 0;
    for (int c = 0; c < C; c++) nn += hd.w[5 * C + c] * hd.w[5 * C + c];
    for (int c = 0; c < C; c++) h[5 * C + c] = hd.w[5 * C + c] * (11.0f / sqrtf(nn));
    double mx = -INFINITY, sum = 0, *lg = malloc((size_t)V * sizeof(double));
    for (int v = 0; v < V; v++) {
        double d = 0;
        for (int c = 0; c < C; c++) d += (double)h[5 * C + c] * hd.w[(size_t)v * C + c];
        lg[v] = d;
        mx = fmax(mx, d);
    }
    for (int v = 0; v < V; v++) sum += exp(lg[v] - mx);
    double one_minus_p = -expm1(lg[5] - mx - log(sum));
    free(lg);
    printf("  row 5: 1 - p_target = %.3g\n", one_minus_p);
    CHECKF(one_minus_p > 1e-6 && one_minus_p < 1e-2, "row 5 is not near-certain: 1 - p = %.3g", one_minus_p);
    int rows_seen = 0;
    ft_loss whole = { whole_ce, &rows_seen, "cross-entropy, whole rows", false };
    for (int gw = 0; gw < 2; gw++) {
        lm_result a = run_fused(&hd, &ft_loss_crossentropy, FT_BF16, h, tg, n, CH, 2, 0.25f, gw);
        lm_result b = run_fused(&hd, &whole, FT_BF16, h, tg, n, CH, 2, 0.25f, gw);
        /* a loss that needs whole rows got at least one, at most the chunk */
        CHECKF(rows_seen >= 1 && rows_seen <= CH, "whole-row loss saw %d rows", rows_seen);
        /* the loss: the same bf16 logits, summed in another grouping: 1e-6 */
        double le = fabs(a.loss - b.loss) / fabs(b.loss);
        /* dh: each term's operand rounded to bf16 (2^-9 relative) in both,
         * at different points (e before the 1/S scaling, or p - onehot
         * after it): a few 2^-9 of the largest entry, 1e-2; per row too,
         * so that the near-certain row 5 (|dh| ~ 1e-4 of the others) is
         * held to its own scale */
        double eh = 0, ew = 0;
        for (int r = 0; r < n; r++) {
            float m = 0;
            for (int c = 0; c < C; c++) m = fmaxf(m, fabsf(b.dh[r * C + c]));
            if (m > 0) eh = fmax(eh, check_max_rel_err(a.dh + r * C, b.dh + r * C, C, m));
        }
        if (gw) {
            float m = 0;
            for (long i = 0; i < (long)V * C; i++) m = fmaxf(m, fabsf(b.dw[i]));
            ew = check_max_rel_err(a.dw, b.dw, (long)V * C, m);
        }
        printf("  bf16 V=%d %s head: sliced vs whole rows: loss %.2e, dh (per row) %.2e, dw %.2e\n", V,
               gw ? "trainable" : "frozen", le, eh, ew);
        CHECKF(le < 1e-6, "loss %.10g vs %.10g", a.loss, b.loss);
        CHECKF(eh < 1e-2, "dh rel err %.3g", eh);
        CHECKF(ew < 1e-2, "dw rel err %.3g", ew);
        free(a.dh); free(a.dw); free(b.dh); free(b.dw);
    }
    free(h); free(hd.w); free(hd.q);
}

/* A target >= V is not a class: NaN, never a read past the slice. */
static void test_sliced_bad_target(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    test_head hd;
    int V = FT_LM_LOSS_VSLICE + 100, C = 8;
    make_head(&hd, FT_F32, V, C, &rng);
    float *h = randn(&rng, 3 * C, 1.0f);
    int tg[3] = { 1, V, 2 };
    lm_result r = run_fused(&hd, &ft_loss_crossentropy, FT_F32, h, tg, 3, 2, 1, 1.0f, false);
    CHECK(isnan(r.loss));
    for (int c = 0; c < C; c++) CHECK(r.dh[C + c] == 0);
    free(r.dh); free(h); free(hd.w); free(hd.q);
}

/* The scratch no longer grows with V: rows x FT_LM_LOSS_VSLICE. */
static void test_scratch_bound(void) {
    int CH = ft_lm_loss_chunk_rows(128256, 4096);
    CHECKF(CH == (int)(FT_LM_LOSS_CHUNK_FLOATS / FT_LM_LOSS_VSLICE), "rows per chunk %d", CH);
    size_t a = ft_lm_loss_scratch_floats(CH, 128256, true), b = ft_lm_loss_scratch_floats(CH, 1 << 20, true);
    CHECKF(a == b, "scratch %zu floats at V=128256, %zu at V=2^20", a, b);
    CHECK(a < FT_LM_LOSS_CHUNK_FLOATS + 16 * (size_t)CH);
    /* up to the slice width, as before: rows x V, twice for the gradient */
    CHECK(ft_lm_loss_scratch_floats(262, 32000, true) == 2 * (size_t)262 * 32000);
}

int main(void) {
    RUN(test_sliced_vs_plain);
    RUN(test_sliced_bf16_and_whole_rows);
    RUN(test_sliced_bad_target);
    RUN(test_scratch_bound);
    CHECK_EXIT();
}
