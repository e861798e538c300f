/* test_ops_fast.c — the fast paths in src/ops/ops_fast.c against the plain
 * references in src/ops/ops.c: vector exp against double exp, attention forward
 * (training rows, and inference over a cache prefix with a row stride),
 * attention backward, cross-entropy; at every kernel level this CPU has, on
 * awkward sizes (T = 1, 7, 65, 130, and 530/600/777 keys: several of the
 * forward's key tiles; HS = 6, 8, 24, 40, 64; NH/NKV = 6/2, 4/2, 4/4),
 * with packed-document masks; and the same bits on 1 and 3 threads.
 */
#include "check.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "ops/ops.h"

#include <stdint.h>

/* Attention: float32 against the float64 twin on the same inputs (the
 * float reference is measured too and printed beside it). The reference
 * sums each score's dot product in double; the fast path in float, so a
 * score of size |s| ~ 10 (inputs of scale 1.5) carries an absolute error
 * of ~1e-6, which is the relative error of its probability; outputs then
 * sum up to 130 such terms in float, and backward's ds = p·(dp - Σp·dp)
 * cancels by up to ~10x. Observed: up to 4e-5 (out) and 5.5e-5 (dq),
 * 3-5x the float reference's own 1e-5; 2e-4 leaves a margin while a wrong
 * index or a missing term shows up as 1e-2 or more. */
#define ATT_TOL 2e-4
/* Cross-entropy: float32 against the float32 reference, whose exp and
 * sums are in double: the fast path's float exp (< 1e-7) and the rounding
 * of e·(scale/sum) give ~4e-7; 1e-5 leaves a margin. */
#define F32_TOL 1e-5
/* entries below 1% of a tensor's largest are judged against that floor */
#define FLOOR_FRAC 1e-2
/* vector exp against double exp: ~7 float operations after an exact range
 * reduction, each rounding to 2^-24 = 6e-8 relative; Taylor truncation adds
 * 5e-9. 3e-7 is about 5 ulp: a wrong coefficient shows up as 1e-4 or more. */
#define EXP_TOL 3e-7

static ft_rng rng;

static float *rand_f(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)ft_rng_normal(&rng);
    return x;
}
static double *to_d(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
static float *to_f(const double *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
static double maxabs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}
static double rel_err(const float *a, const float *b, size_t n) {
    return check_max_rel_err(a, b, (long)n, fmax(maxabs(b, n) * FLOOR_FRAC, 1e-30));
}

static int levels[FT_CPU_NLEVELS], n_levels;
static void find_levels(void) {
    int top = ft_cpu_level();
    n_levels = 0;
    for (int lv = FT_CPU_GENERIC; lv <= top; lv++) levels[n_levels++] = lv;
}

static void test_exp(void) {
    size_t n = 200001;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (size_t i = 0; i < n; i++) x[i] = -87.0f + 175.0f * (float)i / (float)(n - 1);
        ft_exp_fast(y, x, n);
        double m = 0;
        for (size_t i = 0; i < n; i++) {
            double e = exp((double)x[i]);
            m = fmax(m, fabs(y[i] - e) / e);
        }
        printf("  exp %s: max rel err %.3g over [-87, 88]\n", ft_cpu_level_name(levels[li]), m);
        CHECKF(m <= EXP_TOL, "%s: %g", ft_cpu_level_name(levels[li]), m);
        /* the edges: exact 0 below the range and for -inf, inf above, NaN kept */
        float ex[5] = { -INFINITY, -200.0f, 100.0f, NAN, 0.0f }, ey[5];
        ft_exp_fast(ey, ex, 5);
        CHECK(ey[0] == 0 && ey[1] == 0 && isinf(ey[2]) && ey[2] > 0 && isnan(ey[3]) && ey[4] == 1.0f);
    }
    ft_cpu_force_level(-1);
    free(x);
    free(y);
}

typedef struct { int B, T, Tk, NH, NKV, HS, kv_stride, with_doc; } att_case;

/* Queries at positions Tk-T .. Tk-1 (a cache prefix when Tk > T). */
static void run_attention(const att_case *c) {
    int B = c->B, T = c->T, Tk = c->Tk, NH = c->NH, NKV = c->NKV, HS = c->HS, ks = c->kv_stride;
    size_t qd = (size_t)NH * HS, kvd = (size_t)NKV * HS;
    float *q = rand_f((size_t)B * T * qd, 1.5f), *k = rand_f((size_t)B * Tk * ks, 1.5f);
    float *v = rand_f((size_t)B * Tk * ks, 1.0f), *dout = rand_f((size_t)B * T * qd, 1.0f);
    int *pos = malloc((size_t)T * sizeof(int)), *doc = malloc((size_t)B * Tk * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = Tk - T + t;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tk; j++) doc[(size_t)b * Tk + j] = (j + b) / 5; /* documents of 5 tokens, shifted */
    const int *dp = c->with_doc ? doc : NULL;
    float *out_ref = calloc((size_t)B * T * qd, sizeof(float)), *att = calloc((size_t)NH * T * Tk, sizeof(float));
    /* packed copies of k and v for backward (stride NKV·HS) */
    float *kp = malloc((size_t)B * Tk * kvd * sizeof(float)), *vp = malloc((size_t)B * Tk * kvd * sizeof(float));
    for (size_t j = 0; j < (size_t)B * Tk; j++) {
        memcpy(kp + j * kvd, k + j * ks, kvd * sizeof(float));
        memcpy(vp + j * kvd, v + j * ks, kvd * sizeof(float));
    }
    float *dq_ref = calloc((size_t)B * T * qd, sizeof(float)), *dk_ref = calloc((size_t)B * Tk * kvd, sizeof(float));
    float *dv_ref = calloc((size_t)B * Tk * kvd, sizeof(float));
    double *lse_ref = malloc((size_t)B * NH * T * sizeof(double));
    /* the float64 twins on the same (float) inputs: the truth both float
     * paths are measured against */
    size_t nq = (size_t)B * T * qd, nk = (size_t)B * Tk * kvd, nkv = (size_t)B * Tk * ks;
    double *qD = to_d(q, nq), *kD = to_d(k, nkv), *vD = to_d(v, nkv), *kpD = to_d(kp, nk), *vpD = to_d(vp, nk);
    double *doutD = to_d(dout, nq), *attD = calloc((size_t)NH * T * Tk, sizeof(double));
    double *oD = calloc(nq, sizeof(double)), *dqD = calloc(nq, sizeof(double)), *dkD = calloc(nk, sizeof(double));
    double *dvD = calloc(nk, sizeof(double));
    for (int b = 0; b < B; b++) {
        const int *db = dp ? dp + (size_t)b * Tk : NULL;
        ft_attention_forward_f64(oD + (size_t)b * T * qd, attD, qD + (size_t)b * T * qd, kD + (size_t)b * Tk * ks,
                              vD + (size_t)b * Tk * ks, pos, db, T, Tk, NH, NKV, HS, ks, 1);
        ft_attention_backward_f64(dqD + (size_t)b * T * qd, dkD + (size_t)b * Tk * kvd, dvD + (size_t)b * Tk * kvd,
                               doutD + (size_t)b * T * qd, attD, qD + (size_t)b * T * qd, kpD + (size_t)b * Tk * kvd,
                               vpD + (size_t)b * Tk * kvd, T, Tk, NH, NKV, HS);
    }
    float *oT = to_f(oD, nq), *dqT = to_f(dqD, nq), *dkT = to_f(dkD, nk), *dvT = to_f(dvD, nk);
    for (int b = 0; b < B; b++) {
        const float *qb = q + (size_t)b * T * qd, *kb = k + (size_t)b * Tk * ks, *vb = v + (size_t)b * Tk * ks;
        const int *db = dp ? dp + (size_t)b * Tk : NULL;
        ft_attention_forward(out_ref + (size_t)b * T * qd, att, qb, kb, vb, pos, db, T, Tk, NH, NKV, HS, ks, 1);
        ft_attention_backward(dq_ref + (size_t)b * T * qd, dk_ref + (size_t)b * Tk * kvd, dv_ref + (size_t)b * Tk * kvd,
                           dout + (size_t)b * T * qd, att, qb, kp + (size_t)b * Tk * kvd, vp + (size_t)b * Tk * kvd,
                           T, Tk, NH, NKV, HS);
        /* log-sum-exp of the scaled scores over the visible keys, in double */
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *qt = qb + (size_t)t * qd + (size_t)h * HS;
                int last = pos[t];
                double m = -INFINITY, s = 0, sc[4096];
                for (int j = 0; j <= last; j++) {
                    sc[j] = -INFINITY;
                    if (db && db[j] != db[last]) continue;
                    double d = 0;
                    for (int e = 0; e < HS; e++) d += (double)qt[e] * kb[(size_t)j * ks + (size_t)(h / (NH / NKV)) * HS + e];
                    sc[j] = d / sqrt((double)HS);
                    m = fmax(m, sc[j]);
                }
                for (int j = 0; j <= last; j++) s += exp(sc[j] - m);
                lse_ref[((size_t)b * NH + h) * T + t] = m + log(s);
            }
    }
    /* the float reference's own error: what the fast path may match */
    double r_out = rel_err(out_ref, oT, nq), r_dq = rel_err(dq_ref, dqT, nq), r_dk = rel_err(dk_ref, dkT, nk),
           r_dv = rel_err(dv_ref, dvT, nk);
    printf("  reference B=%d T=%d Tk=%d NH=%d NKV=%d HS=%d%s: out %.2g dq %.2g dk %.2g dv %.2g\n", B, T, Tk, NH, NKV,
           HS, dp ? " doc" : "", r_out, r_dq, r_dk, r_dv);
    float *out = malloc(nq * sizeof(float)), *lse = malloc((size_t)B * NH * T * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    float *out3 = malloc(nq * sizeof(float)), *dq3 = malloc(nq * sizeof(float)), *dk3 = malloc(nk * sizeof(float));
    size_t sf = ft_attention_fast_scratch_floats(Tk, HS, 3, true);
    float *scr = ft_aligned_alloc(sf * sizeof(float));
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        ft_attention_forward_fast(out, lse, q, k, v, pos, dp, B, T, Tk, NH, NKV, HS, ks, 1, scr);
        double e_out = rel_err(out, oT, nq), e_lse = 0;
        for (size_t i = 0; i < (size_t)B * NH * T; i++)
            e_lse = fmax(e_lse, fabs(lse[i] - lse_ref[i]) / fmax(fabs(lse_ref[i]), 1.0));
        ft_attention_backward_fast(dq, dk, dv, dout, lse, q, kp, vp, pos, dp, B, T, Tk, NH, NKV, HS, 1, scr);
        double e_dq = rel_err(dq, dqT, nq), e_dk = rel_err(dk, dkT, nk), e_dv = rel_err(dv, dvT, nk);
        printf("  %s B=%d T=%d Tk=%d NH=%d NKV=%d HS=%d%s: out %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n",
               ft_cpu_level_name(levels[li]), B, T, Tk, NH, NKV, HS, dp ? " doc" : "", e_out, e_lse, e_dq, e_dk, e_dv);
        /* lse is judged with a floor of 1 (|lse| ~ 1..5): float rounding of
         * the max plus log of a double sum, 1e-6 */
        CHECKF(e_out <= ATT_TOL && e_lse <= 1e-6 && e_dq <= ATT_TOL && e_dk <= ATT_TOL && e_dv <= ATT_TOL,
               "out %g lse %g dq %g dk %g dv %g", e_out, e_lse, e_dq, e_dk, e_dv);
        /* the lse-free forward (inference) gives the same output */
        ft_attention_forward_fast(out3, NULL, q, k, v, pos, dp, B, T, Tk, NH, NKV, HS, ks, 3, scr);
        CHECK(memcmp(out3, out, nq * sizeof(float)) == 0);
        /* 3 threads: the same bits */
        ft_attention_backward_fast(dq3, dk3, dv, dout, lse, q, kp, vp, pos, dp, B, T, Tk, NH, NKV, HS, 3, scr);
        CHECK(memcmp(dq3, dq, nq * sizeof(float)) == 0 && memcmp(dk3, dk, nk * sizeof(float)) == 0);
    }
    ft_cpu_force_level(-1);
    free(q); free(k); free(v); free(dout); free(pos); free(doc); free(out_ref); free(att); free(kp); free(vp);
    free(dq_ref); free(dk_ref); free(dv_ref); free(lse_ref); free(out); free(lse); free(dq); free(dk); free(dv);
    free(out3); free(dq3); free(dk3); free(scr);
    free(qD); free(kD); free(vD); free(kpD); free(vpD); free(doutD); free(attD); free(oD); free(dqD); free(dkD);
    free(dvD); free(oT); free(dqT); free(dkT); free(dvT);
}

static void test_attention_train(void) {
    const att_case cs[] = {
        { 2, 7, 7, 6, 2, 6, 12, 0 },     { 1, 65, 65, 4, 4, 8, 32, 1 },  { 3, 130, 130, 6, 2, 8, 16, 1 },
        { 1, 130, 130, 4, 4, 64, 256, 0 }, { 2, 1, 1, 6, 2, 6, 12, 0 },  { 1, 33, 33, 2, 1, 64, 64, 1 },
        /* past the forward's 256-key tiles: the online softmax across three tiles, with and without
         * documents (whose keys lie in one tile, the others wholly masked) */
        { 1, 600, 600, 4, 2, 40, 80, 0 }, { 2, 530, 530, 4, 2, 40, 80, 1 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_attention(&cs[i]);
}

/* inference: queries after a cache prefix (Tk > T), rows kv_stride apart
 * with room to spare, and T = 1 decode */
static void test_attention_cache(void) {
    const att_case cs[] = {
        { 1, 7, 20, 6, 2, 6, 20, 0 }, { 1, 1, 130, 6, 2, 8, 24, 0 }, { 1, 65, 130, 4, 4, 64, 300, 0 },
        { 1, 1, 1, 4, 4, 8, 32, 0 },  { 1, 1, 67, 4, 4, 64, 256, 1 }, { 1, 3, 777, 6, 2, 24, 48, 0 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_attention(&cs[i]);
}

/* NaN in, NaN out: a query whose every score is NaN (a NaN in q, in a
 * row wholly in one key tile and in one spanning three) and queries that see
 * a NaN key (a NaN score among finite ones, in the last tile) give NaN
 * outputs and lse at every level, as the reference does; the others are the
 * reference's. Before, the online softmax took an all-NaN tile for a fully
 * masked one and gave zeros. */
static void test_attention_nan(void) {
    const int T = 600, NH = 2, NKV = 1, HS = 8, ks = NKV * HS, qd = NH * HS;
    size_t nq = (size_t)T * qd, nk = (size_t)T * ks;
    float *q = rand_f(nq, 1.0f), *k = rand_f(nk, 1.0f), *v = rand_f(nk, 1.0f);
    float *ref = malloc(nq * sizeof(float)), *out = malloc(nq * sizeof(float)), *lse = malloc((size_t)NH * T * sizeof(float));
    int *pos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = t;
    for (int d = 0; d < HS; d++) { q[5 * qd + d] = NAN; q[(size_t)590 * qd + HS + d] = NAN; } /* (t 5, h 0), (t 590, h 1) */
    k[(size_t)550 * ks + 3] = NAN;                                                            /* key 550: queries >= 550 */
    ft_attention_forward(ref, NULL, q, k, v, pos, NULL, T, T, NH, NKV, HS, ks, 1);
    float *scr = ft_aligned_alloc(ft_attention_fast_scratch_floats(T, HS, 2, false) * sizeof(float));
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        for (int with_lse = 0; with_lse < 2; with_lse++) {
            ft_attention_forward_fast(out, with_lse ? lse : NULL, q, k, v, pos, NULL, 1, T, T, NH, NKV, HS, ks, 2, scr);
            int bad = 0, nan_rows = 0;
            double e = 0;
            for (int t = 0; t < T; t++)
                for (int h = 0; h < NH; h++) {
                    bool want_nan = (t == 5 && h == 0) || (t == 590 && h == 1) || t >= 550;
                    const float *o = out + (size_t)t * qd + (size_t)h * HS, *r = ref + (size_t)t * qd + (size_t)h * HS;
                    for (int d = 0; d < HS; d++) {
                        if (want_nan != (isnan(r[d]) != 0)) bad |= 1;              /* the reference agrees */
                        if (want_nan != (isnan(o[d]) != 0)) bad |= 2;
                        else if (!want_nan) e = fmax(e, fabs(o[d] - r[d]) / fmax(fabs(r[d]), 1e-3));
                    }
                    if (with_lse && want_nan != (isnan(lse[(size_t)h * T + t]) != 0)) bad |= 4;
                    nan_rows += want_nan;
                }
            CHECKF(!bad && e <= ATT_TOL, "%s%s: bad %d (1 reference, 2 output, 4 lse), finite rows' error %g",
                   ft_cpu_level_name(levels[li]), with_lse ? " with lse" : "", bad, e);
            if (li == n_levels - 1 && with_lse)
                printf("  %d NaN rows NaN at every level, the others within %.2g of the reference\n", nan_rows, e);
        }
    }
    ft_cpu_force_level(-1);
    free(q); free(k); free(v); free(ref); free(out); free(lse); free(pos); free(scr);
}

/* ------------------------------------------------------------- bf16 attention */

static double bf(double x) { return ft_bf16_to_f32(ft_f32_to_bf16((float)x)); }

/* The bf16 maths of ft_attention_*_fast_in(FT_BF16) in double: q, k, v,
 * dout rounded to bf16; scores, softmax, lse, dp, D and ds in double;
 * the probabilities rounded (to float, then bf16) before P·V and dV, the
 * score gradients before dQ and dK. One batch row; k, v rows ks apart. */
static void att_bf16_ref(double *out, double *lse, double *dq, double *dk, double *dv, double *sz, const float *q,
                         const float *k, const float *v, const float *dout, const int *pos, const int *doc, int T,
                         int NH, int NKV, int HS, int ks) {
    /* sz: the size of each output's terms (out, dq, dk, dv in turn): Σ of
     * |p·v|, |ds|·|k|, |ds|·|q|, |p·dy| with |ds| taken as p·(|dp| + |D|)·scale */
    size_t nqo = (size_t)T * NH * HS, nko = (size_t)(pos[T - 1] + 1) * NKV * HS;
    double *so = sz, *sq = sz + nqo, *sk = sq + nqo, *sv = sk + nko;
    size_t qd = (size_t)NH * HS, kvd = (size_t)NKV * HS;
    double scale = (float)(1.0 / sqrt((double)HS)), *p = malloc(4096 * sizeof(double)), *dp = malloc(4096 * sizeof(double));
    for (int h = 0; h < NH; h++) {
        int kh = h / (NH / NKV);
        for (int t = 0; t < T; t++) {
            const float *qt = q + (size_t)t * qd + (size_t)h * HS, *dyt = dout + (size_t)t * qd + (size_t)h * HS;
            int last = pos[t];
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= last; j++) {
                p[j] = -INFINITY;
                if (doc && doc[j] != doc[last]) continue;
                double d = 0;
                for (int e = 0; e < HS; e++) d += bf(qt[e]) * bf(k[(size_t)j * ks + (size_t)kh * HS + e]);
                p[j] = d * scale;
                m = fmax(m, p[j]);
            }
            for (int j = 0; j <= last; j++) sum += exp(p[j] - m);
            double l = m + log(sum), D = 0;
            lse[(size_t)h * T + t] = l;
            for (int j = 0; j <= last; j++) {
                p[j] = exp(p[j] - l);
                double d = 0;
                for (int e = 0; e < HS; e++) d += bf(dyt[e]) * bf(v[(size_t)j * ks + (size_t)kh * HS + e]);
                dp[j] = d;
                D += p[j] * d;
            }
            size_t ot = (size_t)t * qd + (size_t)h * HS;
            double *o = out + ot, *g = dq + ot;
            for (int e = 0; e < HS; e++) o[e] = g[e] = so[ot + e] = sq[ot + e] = 0;
            for (int j = 0; j <= last; j++) {
                double pr = bf(p[j]), ds = bf(p[j] * (dp[j] - D) * scale), dsz = p[j] * (fabs(dp[j]) + fabs(D)) * scale;
                for (int e = 0; e < HS; e++) {
                    size_t kj = (size_t)j * ks + (size_t)kh * HS + e, pj = (size_t)j * kvd + (size_t)kh * HS + e;
                    o[e] += pr * bf(v[kj]);
                    g[e] += ds * bf(k[kj]);
                    dv[pj] += pr * bf(dyt[e]);
                    dk[pj] += ds * bf(qt[e]);
                    so[ot + e] += p[j] * fabs(bf(v[kj]));
                    sq[ot + e] += dsz * fabs(bf(k[kj]));
                    sv[pj] += p[j] * fabs(bf(dyt[e]));
                    sk[pj] += dsz * fabs(bf(qt[e]));
                }
            }
        }
    }
    free(p);
    free(dp);
}

static double rel_err_d(const float *a, const double *b, size_t n) {
    float *bf_ = to_f(b, n);
    double e = rel_err(a, bf_, n);
    free(bf_);
    return e;
}
/* max |a - b| / size, the size of each element's terms */
static double term_err(const float *a, const double *b, const double *size, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]) / fmax(size[i], 1e-30);
        m = isnan(e) || e > m ? (isnan(e) ? INFINITY : e) : m;
    }
    return m;
}

/* bf16 attention against att_bf16_ref. Both sides round the same operands;
 * they differ where a probability or score gradient, computed in float on
 * one side and double on the other, lies so near a bf16 rounding boundary
 * that the two round apart: one term changes by one bf16 ulp (2^-8 of it
 * at most), and where the terms cancel (dq, dk sum ds of both signs) that
 * is a large part of a small result. So each output is judged against the
 * size of its terms (Σ|term|, with |ds| as p·(|dp| + |D|)·scale, which
 * also covers the float error of the cancelling dp - D): within 2^-7 =
 * 7.8e-3, one flip of the largest term (a bf16 ulp is 2^-8..2^-7 of the
 * value; observed: 5e-3 on the smallest case, below 5e-4 elsewhere); float
 * sums add ~1e-6. And against
 * the result, with the usual floor: the f32 path (nothing rounded) is
 * 0.1-0.5 away from the bf16 maths on these inputs, and the bf16 path must
 * be at least 4x closer (observed: 5x on the worst small case, 100x and
 * more elsewhere), which a missing rounding of q, k or P does not meet. */
#define ATT_BF16_TOL 7.8e-3
#define ATT_BF16_GAIN 4.0

static void run_attention_bf16(const att_case *c) {
    int B = c->B, T = c->T, Tk = c->Tk, NH = c->NH, NKV = c->NKV, HS = c->HS, ks = c->kv_stride;
    size_t qd = (size_t)NH * HS, kvd = (size_t)NKV * HS, nq = (size_t)B * T * qd, nk = (size_t)B * Tk * kvd;
    float *q = rand_f(nq, 1.5f), *k = rand_f((size_t)B * Tk * ks, 1.5f), *v = rand_f((size_t)B * Tk * ks, 1.0f);
    float *dout = rand_f(nq, 1.0f);
    int *pos = malloc((size_t)T * sizeof(int)), *doc = malloc((size_t)B * Tk * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = Tk - T + t;
    for (int b = 0; b < B; b++)
        for (int j = 0; j < Tk; j++) doc[(size_t)b * Tk + j] = (j + b) / 5;
    const int *dp = c->with_doc ? doc : NULL;
    float *kp = malloc(nk * sizeof(float)), *vp = malloc(nk * sizeof(float));
    for (size_t j = 0; j < (size_t)B * Tk; j++) {
        memcpy(kp + j * kvd, k + j * ks, kvd * sizeof(float));
        memcpy(vp + j * kvd, v + j * ks, kvd * sizeof(float));
    }
    double *oR = calloc(nq, sizeof(double)), *lR = calloc((size_t)B * NH * T, sizeof(double));
    double *dqR = calloc(nq, sizeof(double)), *dkR = calloc(nk, sizeof(double)), *dvR = calloc(nk, sizeof(double));
    /* term sizes, batch row by batch row: out, dq (T·qd each), dk, dv (Tk·kvd each) */
    size_t per_b = 2 * (size_t)T * qd + 2 * (size_t)Tk * kvd;
    double *szR = calloc((size_t)B * per_b, sizeof(double));
    double *so = malloc(nq * sizeof(double)), *sq = malloc(nq * sizeof(double)), *sk = malloc(nk * sizeof(double));
    double *sv = malloc(nk * sizeof(double));
    for (int b = 0; b < B; b++)
        att_bf16_ref(oR + (size_t)b * T * qd, lR + (size_t)b * NH * T, dqR + (size_t)b * T * qd,
                     dkR + (size_t)b * Tk * kvd, dvR + (size_t)b * Tk * kvd, szR + b * per_b, q + (size_t)b * T * qd,
                     k + (size_t)b * Tk * ks, v + (size_t)b * Tk * ks, dout + (size_t)b * T * qd, pos,
                     dp ? dp + (size_t)b * Tk : NULL, T, NH, NKV, HS, ks);
    for (int b = 0; b < B; b++) {
        const double *z = szR + b * per_b;
        size_t a = (size_t)T * qd, e = (size_t)Tk * kvd;
        memcpy(so + b * a, z, a * sizeof(double));
        memcpy(sq + b * a, z + a, a * sizeof(double));
        memcpy(sk + b * e, z + 2 * a, e * sizeof(double));
        memcpy(sv + b * e, z + 2 * a + e, e * sizeof(double));
    }
    float *out = malloc(nq * sizeof(float)), *lse = malloc((size_t)B * NH * T * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    float *out3 = malloc(nq * sizeof(float)), *dq3 = malloc(nq * sizeof(float)), *dk3 = malloc(nk * sizeof(float));
    float *dv3 = malloc(nk * sizeof(float));
    float *scr = ft_aligned_alloc(ft_attention_fast_scratch_floats(Tk, HS, 3, true) * sizeof(float));
    /* the f32 path's distance from the bf16 maths: what rounding changes */
    ft_attention_forward_fast(out, lse, q, k, v, pos, dp, B, T, Tk, NH, NKV, HS, ks, 1, scr);
    ft_attention_backward_fast(dq, dk, dv, dout, lse, q, kp, vp, pos, dp, B, T, Tk, NH, NKV, HS, 1, scr);
    double f_out = rel_err_d(out, oR, nq), f_dq = rel_err_d(dq, dqR, nq), f_dk = rel_err_d(dk, dkR, nk),
           f_dv = rel_err_d(dv, dvR, nk);
    printf("  f32 path vs bf16 maths B=%d T=%d Tk=%d NH=%d NKV=%d HS=%d%s: out %.2g dq %.2g dk %.2g dv %.2g\n", B, T,
           Tk, NH, NKV, HS, dp ? " doc" : "", f_out, f_dq, f_dk, f_dv);
    /* every level, and where the avx512bf16 level runs, the amx level's
     * tile products on the emulated tile unit (the last pass) */
    bool emu = ft_cpu_has_avx512bf16();
    for (int li = 0; li < n_levels + emu; li++) {
        const bool on_emu = li == n_levels;
        ft_cpu_force_level(on_emu ? FT_CPU_AVX512BF16 : levels[li]);
        if (on_emu) ft_kernels_force(&ft_kernels_amx_emulated);
        const char *lname = on_emu ? ft_kernels_amx_emulated.name : ft_cpu_level_name(levels[li]);
        ft_attention_forward_fast_in(FT_BF16, out, lse, q, k, v, pos, dp, B, T, Tk, NH, NKV, HS, ks, 1, scr);
        ft_attention_backward_fast_in(FT_BF16, dq, dk, dv, dout, lse, q, kp, vp, pos, dp, B, T, Tk, NH, NKV, HS, 1,
                                      scr);
        double e_out = rel_err_d(out, oR, nq), e_dq = rel_err_d(dq, dqR, nq), e_dk = rel_err_d(dk, dkR, nk),
               e_dv = rel_err_d(dv, dvR, nk), e_lse = 0;
        for (size_t i = 0; i < (size_t)B * NH * T; i++)
            e_lse = fmax(e_lse, fabs(lse[i] - lR[i]) / fmax(fabs(lR[i]), 1.0));
        double t_out = term_err(out, oR, so, nq), t_dq = term_err(dq, dqR, sq, nq), t_dk = term_err(dk, dkR, sk, nk),
               t_dv = term_err(dv, dvR, sv, nk);
        printf("  bf16 %s: relative to the result: out %.2g lse %.2g dq %.2g dk %.2g dv %.2g; to the terms: out %.2g "
               "dq %.2g dk %.2g dv %.2g\n", lname, e_out, e_lse, e_dq, e_dk, e_dv, t_out,
               t_dq, t_dk, t_dv);
        /* lse: float scores of bf16 operands (exact products, float sums) */
        CHECKF(e_lse <= 1e-6, "lse %g", e_lse);
        CHECKF(t_out <= ATT_BF16_TOL && t_dq <= ATT_BF16_TOL && t_dk <= ATT_BF16_TOL && t_dv <= ATT_BF16_TOL,
               "out %g dq %g dk %g dv %g", t_out, t_dq, t_dk, t_dv);
        CHECKF(e_out * ATT_BF16_GAIN <= f_out && e_dq * ATT_BF16_GAIN <= f_dq && e_dk * ATT_BF16_GAIN <= f_dk &&
                   e_dv * ATT_BF16_GAIN <= f_dv,
               "not closer to the bf16 maths than the f32 path: out %g/%g dq %g/%g dk %g/%g dv %g/%g", e_out, f_out,
               e_dq, f_dq, e_dk, f_dk, e_dv, f_dv);
        /* 3 threads and the lse-free forward: the same bits */
        ft_attention_forward_fast_in(FT_BF16, out3, NULL, q, k, v, pos, dp, B, T, Tk, NH, NKV, HS, ks, 3, scr);
        ft_attention_backward_fast_in(FT_BF16, dq3, dk3, dv3, dout, lse, q, kp, vp, pos, dp, B, T, Tk, NH, NKV, HS, 3,
                                      scr);
        CHECK(memcmp(out3, out, nq * sizeof(float)) == 0 && memcmp(dq3, dq, nq * sizeof(float)) == 0 &&
              memcmp(dk3, dk, nk * sizeof(float)) == 0 && memcmp(dv3, dv, nk * sizeof(float)) == 0);
        if (on_emu) ft_kernels_force(NULL);
    }
    ft_cpu_force_level(-1);
    free(szR); free(so); free(sq); free(sk); free(sv);
    free(q); free(k); free(v); free(dout); free(pos); free(doc); free(kp); free(vp); free(oR); free(lR); free(dqR);
    free(dkR); free(dvR); free(out); free(lse); free(dq); free(dk); free(dv); free(out3); free(dq3); free(dk3);
    free(dv3); free(scr);
}

/* training shapes (GQA, documents) and a cache prefix, odd HS included */
static void test_attention_bf16(void) {
    const att_case cs[] = {
        { 2, 7, 7, 6, 2, 6, 12, 0 },      { 1, 65, 65, 4, 4, 8, 32, 1 }, { 3, 130, 130, 6, 2, 8, 16, 1 },
        { 1, 130, 130, 4, 4, 64, 256, 0 }, { 2, 1, 1, 6, 2, 6, 12, 0 },  { 1, 33, 33, 2, 1, 64, 64, 1 },
        { 1, 65, 130, 4, 2, 64, 300, 0 }, { 1, 1, 67, 4, 4, 64, 256, 1 }, { 1, 40, 40, 3, 1, 7, 21, 1 },
        /* past the forward's 256-key tiles: both of the bf16 forward's passes over three and four
         * tiles, with documents, and a cache prefix */
        { 1, 600, 600, 4, 2, 40, 80, 1 }, { 1, 3, 777, 6, 2, 24, 48, 0 },
        /* one query row (decode's unpacked path) past the 256-key tiles: grouped heads, a ragged
         * HS (24: part of a 32-float block; 7: odd), documents, two batch rows */
        { 1, 1, 300, 6, 2, 24, 48, 0 }, { 2, 1, 531, 4, 1, 7, 21, 1 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_attention_bf16(&cs[i]);
}

static void run_ce(int T, int V, bool with_grad) {
    float *x = rand_f((size_t)T * V, 3.0f);
    int *y = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) y[t] = t % 5 == 3 ? -1 : t % 7 == 2 ? -100 : (int)(ft_rng_u32(&rng) % (uint32_t)V);
    float scale = 1.0f / (float)T;
    float *d_ref = with_grad ? malloc((size_t)T * V * sizeof(float)) : NULL;
    float *d = with_grad ? malloc((size_t)T * V * sizeof(float)) : NULL;
    float *d3 = with_grad ? malloc((size_t)T * V * sizeof(float)) : NULL;
    double l_ref = ft_crossentropy_forward_backward(d_ref, x, y, T, V, scale);
    for (int li = 0; li < n_levels; li++) {
        ft_cpu_force_level(levels[li]);
        double l = ft_crossentropy_fast(d, x, y, T, V, scale, 1);
        double el = fabs(l - l_ref) / fmax(fabs(l_ref), 1e-30), ed = with_grad ? rel_err(d, d_ref, (size_t)T * V) : 0;
        printf("  ce %s T=%d V=%d%s: loss %.2g dlogits %.2g\n", ft_cpu_level_name(levels[li]), T, V,
               with_grad ? "" : " (loss only)", el, ed);
        /* the loss sums rows of lse - x[y] in double; each lse differs
         * by float exp rounding (~1e-7 relative to the row sum): 1e-6 */
        CHECKF(el <= 1e-6 && ed <= F32_TOL, "loss %g dlogits %g", el, ed);
        double l3 = ft_crossentropy_fast(d3, x, y, T, V, scale, 3);
        CHECK(l3 == l);
        if (with_grad) CHECK(memcmp(d3, d, (size_t)T * V * sizeof(float)) == 0);
    }
    ft_cpu_force_level(-1);
    /* a target >= V makes the loss NaN, as in the reference */
    y[0] = V;
    CHECK(isnan(ft_crossentropy_fast(d, x, y, T, V, scale, 2)));
    free(x); free(y); free(d_ref); free(d); free(d3);
}

static void test_crossentropy(void) {
    run_ce(7, 17, true);
    run_ce(65, 1000, true);
    run_ce(130, 513, false);
    run_ce(600, 5003, true);
}

int main(void) {
    ft_rng_seed(&rng, 1234);
    find_levels();
    RUN(test_exp);
    RUN(test_attention_train);
    RUN(test_attention_cache);
    RUN(test_attention_nan);
    RUN(test_attention_bf16);
    RUN(test_crossentropy);
    CHECK_EXIT();
}
