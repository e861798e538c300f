/* test_ops.c — the reference ops in src/ops/ops.c: every backward against
 * central finite differences in float64, every float32 op against its
 * float64 twin, and forward numerics against direct formulas (RoPE layouts,
 * Llama 3 frequencies, packed-document attention, ignored targets).
 *
 * Gradients are checked on the scalar L = sum_i wt_i * out_i with random
 * wt, so that dL/dout = wt is the upstream gradient. Sizes are deliberately
 * awkward (T=7, C=13, F=11, V=17, HS=6, NH=6 over NKV=2 or 3, a cache
 * prefix so that Tk > T).
 */
#include "check.h"
#include "ops/ops.h"

#include <stdint.h>

/* Central differences with h = 1e-5 in float64: the truncation error is
 * h^2/6 * |f'''| ~ 1e-11 and the rounding error eps * |L| / h ~ 1e-16 * 10
 * / 1e-5 = 1e-10, against gradient entries of order 0.1..1, so the
 * analytic and numeric gradients agree to ~1e-9 relative. 1e-6 leaves
 * three orders of magnitude of margin yet catches any wrong term (those
 * show up as errors of order 1). */
#define FD_H 1e-5
#define FD_TOL 1e-6
/* float32 against float64 on the same inputs: float rounds each operation
 * to 6e-8 relative; through short reductions (dot products summed in
 * double, attention outputs summed in float over <= 9 keys), exp/cos/sqrt
 * (<= 1 ulp) and cancellation in gradients of normalized quantities, the
 * observed errors are 5e-8 (matmul) to 3.4e-6 (attention output); 1e-5
 * keeps a margin over that while any real discrepancy (wrong index,
 * missing term) shows up at 1e-2 or more. */
#define F32_TOL 1e-5
/* Entries below 1% of the largest in a tensor are judged against that
 * floor instead of their own size, so that near-zero entries (masked keys,
 * cancellations) do not turn rounding noise into large relative errors. */
#define FLOOR_FRAC 1e-2

static ft_rng rng;

static double *rand_d(size_t n, double scale)
{
    double *x = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = scale * ft_rng_normal(&rng);
    return x;
}
static double *zeros_d(size_t n) { return calloc(n, sizeof(double)); }
static float *to_f(const double *x, size_t n)
{
    float *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
/* Rounds a double array to float values in place, so that the float and
 * double runs see identical inputs. */
static void round_f(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)x[i];
}
static double maxabs_d(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}
static double rel_err_d(const double *a, const double *b, size_t n)
{
    double fl = fmax(FLOOR_FRAC * maxabs_d(b, n), 1e-300), m = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs(a[i] - b[i]) / fmax(fabs(b[i]), fl);
        if (!(r <= m)) m = isnan(r) ? INFINITY : r;
    }
    return m;
}
static double rel_err_fd(const float *a, const double *b, size_t n)
{
    double *ad = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) ad[i] = a[i];
    double e = rel_err_d(ad, b, n);
    free(ad);
    return e;
}
static double dotw(const double *w, const double *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += w[i] * x[i];
    return s;
}

/* Max relative error of the analytic gradient g of loss(ctx) with respect
 * to x[0..n) against central differences. */
typedef double (*loss_fn)(void *ctx);
static double fd_err(loss_fn loss, void *ctx, double *x, const double *g, size_t n)
{
    double *num = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = loss(ctx);
        x[i] = x0 - FD_H;
        double lm = loss(ctx);
        x[i] = x0;
        num[i] = (lp - lm) / (2 * FD_H);
    }
    double e = rel_err_d(g, num, n);
    free(num);
    return e;
}

/* Checks an error against its tolerance and prints the measured value. */
static void check_err(const char *what, const char *name, double err, double tol)
{
    printf("  %-34s %-10s max rel err %.2e (tol %.0e)\n", name, what, err, tol);
    CHECKF(err < tol, "%s: max rel err %s %.3g", name, what, err);
}
#define CHECK_FD(name, err) check_err("vs fd", name, (err), FD_TOL)
#define CHECK_F32(name, err) check_err("f32/f64", name, (err), F32_TOL)

/* ------------------------------------------------------------- rmsnorm */

typedef struct { double *out, *rstd, *inp, *w, *wt; int T, C; } rms_ctx;
static const double rms_eps = 1e-5;
static double rms_loss(void *p)
{
    rms_ctx *c = p;
    ft_rmsnorm_forward_f64(c->out, c->rstd, c->inp, c->w, c->T, c->C, rms_eps);
    return dotw(c->wt, c->out, (size_t)c->T * c->C);
}

static void test_rmsnorm(void)
{
    int T = 7, C = 13;
    size_t n = (size_t)T * C;
    rms_ctx c = { zeros_d(n), zeros_d(T), rand_d(n, 1), rand_d(C, 1), rand_d(n, 1), T, C };
    for (int i = 0; i < C; i++) c.w[i] += 1;
    round_f(c.inp, n); round_f(c.w, C); round_f(c.wt, n);
    double *dinp = zeros_d(n), *dw = zeros_d(C);
    rms_loss(&c);
    ft_rmsnorm_backward_f64(dinp, dw, c.wt, c.inp, c.w, c.rstd, T, C);
    CHECK_FD("rmsnorm dinp", fd_err(rms_loss, &c, c.inp, dinp, n));
    CHECK_FD("rmsnorm dw", fd_err(rms_loss, &c, c.w, dw, C));

    /* the forward against its formula, row by row */
    rms_loss(&c);
    double e = 0;
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += c.inp[t * C + i] * c.inp[t * C + i];
        for (int i = 0; i < C; i++) {
            double want = c.inp[t * C + i] / sqrt(ss / C + rms_eps) * c.w[i];
            e = fmax(e, fabs(c.out[t * C + i] - want) / fmax(fabs(want), 1e-3));
        }
    }
    CHECKF(e < 1e-13, "rmsnorm forward vs formula %.3g", e); /* double rounding only: ~1e-15 */

    /* accumulation rule: dinp (residual stream) and dw both add up */
    double *dinp2 = zeros_d(n), *dw2 = zeros_d(C);
    ft_rmsnorm_backward_f64(dinp2, dw2, c.wt, c.inp, c.w, c.rstd, T, C);
    ft_rmsnorm_backward_f64(dinp2, dw2, c.wt, c.inp, c.w, c.rstd, T, C);
    for (size_t i = 0; i < n; i++) dinp2[i] *= 0.5;
    for (int i = 0; i < C; i++) dw2[i] *= 0.5;
    /* dinp: one addition per entry, 0 + x + x halved is exact; dw: a sum
     * over T rows continued over T more, so the halving is exact but the
     * order of additions differs: double rounding, ~1e-16 */
    CHECK(rel_err_d(dinp2, dinp, n) == 0);
    CHECKF(rel_err_d(dw2, dw, C) < 1e-14, "dw accumulated twice %.3g", rel_err_d(dw2, dw, C));

    /* float32 against float64 */
    float *fo = malloc(n * sizeof(float)), *fr = malloc(T * sizeof(float));
    float *fi = to_f(c.inp, n), *fw = to_f(c.w, C), *fwt = to_f(c.wt, n);
    float *fdi = calloc(n, sizeof(float)), *fdw = calloc(C, sizeof(float));
    ft_rmsnorm_forward(fo, fr, fi, fw, T, C, (float)rms_eps);
    ft_rmsnorm_backward(fdi, fdw, fwt, fi, fw, fr, T, C);
    rms_loss(&c);
    CHECK_F32("rmsnorm out", rel_err_fd(fo, c.out, n));
    CHECK_F32("rmsnorm dinp", rel_err_fd(fdi, dinp, n));
    CHECK_F32("rmsnorm dw", rel_err_fd(fdw, dw, C));
    free(c.out); free(c.rstd); free(c.inp); free(c.w); free(c.wt); free(dinp); free(dw); free(dinp2); free(dw2);
    free(fo); free(fr); free(fi); free(fw); free(fwt); free(fdi); free(fdw);
}

/* ------------------------------------------------------------- rope */

typedef struct { double *x, *y, *wt, *inv; const int *pos; int T, nh, HS; bool il; } rope_ctx;
static double rope_loss(void *p)
{
    rope_ctx *c = p;
    size_t n = (size_t)c->T * c->nh * c->HS;
    memcpy(c->y, c->x, n * sizeof(double));
    ft_rope_forward_f64(c->y, c->pos, c->inv, c->T, c->nh, c->HS, c->il);
    return dotw(c->wt, c->y, n);
}

static void test_rope_backward(void)
{
    int T = 7, nh = 3, HS = 6;
    int pos[7] = { 0, 1, 5, 6, 17, 100, 4095 };
    size_t n = (size_t)T * nh * HS;
    double inv[3];
    ft_rope_freqs_f64(inv, HS, 10000, NULL);
    for (int il = 0; il < 2; il++) {
        rope_ctx c = { rand_d(n, 1), zeros_d(n), rand_d(n, 1), inv, pos, T, nh, HS, il };
        round_f(c.x, n); round_f(c.wt, n);
        double *dx = malloc(n * sizeof(double));
        memcpy(dx, c.wt, n * sizeof(double));
        ft_rope_backward_f64(dx, pos, inv, T, nh, HS, il);
        CHECK_FD(il ? "rope interleaved dx" : "rope rotate-half dx", fd_err(rope_loss, &c, c.x, dx, n));

        /* float32 against float64 at positions <= 17: the angle is formed
         * in double, but from the float inv_freq, rounded by <= 3e-8
         * relative; the angle error pos * inv_freq * 3e-8 stays below 1e-6
         * rad there, while at position 4095 it reaches ~6e-6 rad and,
         * through entries that nearly cancel, 7e-5 relative in out: the
         * price of a float inv_freq, not of this code */
        int T32 = 5;
        size_t n32 = (size_t)T32 * nh * HS;
        float finv[3], *fx = to_f(c.x, n32), *fdx = to_f(c.wt, n32);
        ft_rope_freqs(finv, HS, 10000, NULL);
        ft_rope_forward(fx, pos, finv, T32, nh, HS, il);
        ft_rope_backward(fdx, pos, finv, T32, nh, HS, il);
        rope_loss(&c);
        CHECK_F32("rope out", rel_err_fd(fx, c.y, n32));
        CHECK_F32("rope dx", rel_err_fd(fdx, dx, n32));
        free(c.x); free(c.y); free(c.wt); free(dx); free(fx); free(fdx);
    }
}

/* The Meta/GGUF interleaved layout and the HF rotate-half layout are the
 * same rotation once each head's rows are permuted as in the HF converter:
 * hf[p * HS/2 + i] = meta[2i + p]. */
static void test_rope_layouts(void)
{
    int T = 7, nh = 4, HS = 8, half = HS / 2;
    int pos[7] = { 0, 2, 3, 9, 31, 64, 1000 };
    size_t n = (size_t)T * nh * HS;
    float inv[4];
    ft_rope_scaling sc = { 2, 8, 1, 4, 64 };
    ft_rope_freqs(inv, HS, 500000, &sc);
    double *xd = rand_d(n, 1);
    float *hf = to_f(xd, n), *meta = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    for (int r = 0; r < T * nh; r++)
        for (int i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) meta[r * HS + 2 * i + p] = hf[r * HS + p * half + i];
    ft_rope_forward(hf, pos, inv, T, nh, HS, false);
    ft_rope_forward(meta, pos, inv, T, nh, HS, true);
    for (int r = 0; r < T * nh; r++)
        for (int i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) back[r * HS + p * half + i] = meta[r * HS + 2 * i + p];
    /* the same float operations on the same pairs: bitwise equal */
    CHECK(memcmp(back, hf, n * sizeof(float)) == 0);
    free(xd); free(hf); free(meta); free(back);
}

/* Rotary embedding makes q.k depend only on the distance between positions;
 * and position 0 leaves x as it is. */
static void test_rope_relative(void)
{
    int HS = 6;
    double inv[3], q[6], k[6];
    ft_rope_freqs_f64(inv, HS, 10000, NULL);
    double *q0 = rand_d(HS, 1), *k0 = rand_d(HS, 1);
    for (int il = 0; il < 2; il++) {
        double d[2];
        for (int s = 0; s < 2; s++) {
            int pq = 7 + 50 * s, pk = 3 + 50 * s;
            memcpy(q, q0, sizeof q); memcpy(k, k0, sizeof k);
            ft_rope_forward_f64(q, &pq, inv, 1, 1, HS, il);
            ft_rope_forward_f64(k, &pk, inv, 1, 1, HS, il);
            d[s] = dotw(q, k, HS);
        }
        /* a few double roundings of O(1) numbers: ~1e-15 */
        CHECKF(fabs(d[0] - d[1]) < 1e-12 * fmax(1, fabs(d[0])), "q.k at shifted positions: %.17g vs %.17g", d[0], d[1]);
        int p0 = 0;
        memcpy(q, q0, sizeof q);
        ft_rope_forward_f64(q, &p0, inv, 1, 1, HS, il);
        CHECK(memcmp(q, q0, sizeof q) == 0);   /* cos 0 = 1, sin 0 = 0 exactly */
    }
    free(q0); free(k0);
}

/* Llama 3.1 scaling (factor 8, low 1, high 4, original 8192, theta 5e5,
 * HS 128). wavelen_i = 2 pi * theta^(2i/128): kept below 8192/4 = 2048,
 * i.e. theta^(i/64) < 2048 / (2 pi) = 325.95, i < 64 ln(325.95)/ln(5e5)
 * = 28.22 -> i = 0..28; divided by 8 above 8192, theta^(i/64) > 1303.8,
 * i > 34.99 -> i = 35..63; blended for i = 29..34. */
static void test_rope_llama3(void)
{
    int HS = 128;
    ft_rope_scaling sc = { 2, 8, 1, 4, 8192 };
    double fd[64];
    float ff[64];
    ft_rope_freqs_f64(fd, HS, 500000, &sc);
    ft_rope_freqs(ff, HS, 500000, &sc);
    double e_d = 0, e_f = 0;
    for (int i = 0; i < 64; i++) {
        double base = pow(500000.0, -2.0 * i / HS), want;
        if (i <= 28) {
            want = base;
        } else if (i >= 35) {
            want = base / 8;
        } else {
            double wavelen = 2 * M_PI / base, smooth = (8192 / wavelen - 1) / (4 - 1);
            CHECKF(smooth > 0 && smooth < 1, "i=%d smooth=%g", i, smooth);
            want = (1 - smooth) * base / 8 + smooth * base;
        }
        e_d = fmax(e_d, fabs(fd[i] - want) / want);
        e_f = fmax(e_f, fabs(ff[i] - want) / want);
    }
    /* double: a few roundings of pow/divide, ~1e-15 */
    CHECKF(e_d < 1e-13, "llama3 inv_freq f64 vs hand formula %.3g", e_d);
    /* float: the double result rounded once, <= 2^-24 = 6e-8 relative */
    CHECKF(e_f < 1e-7, "llama3 inv_freq f32 vs hand formula %.3g", e_f);
    CHECK(ff[0] == 1.0f);

    /* linear scaling divides every frequency by the factor */
    ft_rope_scaling lin = { 1, 4, 0, 0, 0 };
    double l[3], u[3];
    ft_rope_freqs_f64(l, 6, 10000, &lin);
    ft_rope_freqs_f64(u, 6, 10000, NULL);
    for (int i = 0; i < 3; i++) CHECK(fabs(l[i] - u[i] / 4) <= 1e-16 * u[i]);
    CHECK(fabs(u[1] - pow(10000.0, -2.0 / 6)) < 1e-15);
}

/* ------------------------------------------------------------- swiglu */

typedef struct { double *out, *g, *u, *wt; int T, F; } swi_ctx;
static double swi_loss(void *p)
{
    swi_ctx *c = p;
    ft_swiglu_forward_f64(c->out, c->g, c->u, c->T, c->F);
    return dotw(c->wt, c->out, (size_t)c->T * c->F);
}

static void test_swiglu(void)
{
    int T = 7, F = 11;
    size_t n = (size_t)T * F;
    swi_ctx c = { zeros_d(n), rand_d(n, 3), rand_d(n, 1), rand_d(n, 1), T, F };
    c.g[0] = -40; c.g[1] = 40;   /* saturated: exp(40) must not overflow the float path */
    round_f(c.g, n); round_f(c.u, n); round_f(c.wt, n);
    double *dg = zeros_d(n), *du = zeros_d(n);
    ft_swiglu_backward_f64(dg, du, c.wt, c.g, c.u, T, F);
    CHECK_FD("swiglu dgate", fd_err(swi_loss, &c, c.g, dg, n));
    CHECK_FD("swiglu dup", fd_err(swi_loss, &c, c.u, du, n));

    float *fg = to_f(c.g, n), *fu = to_f(c.u, n), *fwt = to_f(c.wt, n);
    float *fo = malloc(n * sizeof(float)), *fdg = malloc(n * sizeof(float)), *fdu = malloc(n * sizeof(float));
    ft_swiglu_forward(fo, fg, fu, T, F);
    ft_swiglu_backward(fdg, fdu, fwt, fg, fu, T, F);
    swi_loss(&c);
    CHECK_F32("swiglu out", rel_err_fd(fo, c.out, n));
    CHECK_F32("swiglu dgate", rel_err_fd(fdg, dg, n));
    CHECK_F32("swiglu dup", rel_err_fd(fdu, du, n));
    free(c.out); free(c.g); free(c.u); free(c.wt); free(dg); free(du);
    free(fg); free(fu); free(fwt); free(fo); free(fdg); free(fdu);
}

/* ------------------------------------------------------------- attention */

typedef struct {
    double *out, *att, *q, *k, *v, *wt;
    const int *qpos, *doc;
    int T, Tk, NH, NKV, HS;
} att_ctx;
static double att_loss(void *p)
{
    att_ctx *c = p;
    ft_attention_forward_f64(c->out, c->att, c->q, c->k, c->v, c->qpos, c->doc, c->T, c->Tk, c->NH, c->NKV,
                          c->HS, c->NKV * c->HS, 1);
    return dotw(c->wt, c->out, (size_t)c->T * c->NH * c->HS);
}

/* T = 5 new queries at positions 4..8 over a cache of Tk = 9 (a prefix of
 * 4), NH = 6 heads sharing NKV kv heads, HS = 6; with and without
 * documents (the prefix and the first new token in doc 0, the rest doc 1). */
static void test_attention_backward(void)
{
    int T = 5, Tk = 9, NH = 6, HS = 6;
    int qpos[5] = { 4, 5, 6, 7, 8 };
    int doc[9] = { 0, 0, 0, 0, 0, 1, 1, 1, 1 };
    int nkvs[2] = { 2, 3 };
    for (int a = 0; a < 2; a++) {
        for (int use_doc = 0; use_doc < 2; use_doc++) {
            int NKV = nkvs[a];
            size_t nq = (size_t)T * NH * HS, nk = (size_t)Tk * NKV * HS, na = (size_t)NH * T * Tk;
            att_ctx c = { zeros_d(nq), zeros_d(na), rand_d(nq, 1), rand_d(nk, 1), rand_d(nk, 1), rand_d(nq, 1),
                          qpos, use_doc ? doc : NULL, T, Tk, NH, NKV, HS };
            round_f(c.q, nq); round_f(c.k, nk); round_f(c.v, nk); round_f(c.wt, nq);
            double *dq = zeros_d(nq), *dk = zeros_d(nk), *dv = zeros_d(nk);
            att_loss(&c);
            ft_attention_backward_f64(dq, dk, dv, c.wt, c.att, c.q, c.k, c.v, T, Tk, NH, NKV, HS);
            char name[64];
            snprintf(name, sizeof name, "attention NKV=%d doc=%d dq", NKV, use_doc);
            CHECK_FD(name, fd_err(att_loss, &c, c.q, dq, nq));
            name[strlen(name) - 1] = 'k';
            CHECK_FD(name, fd_err(att_loss, &c, c.k, dk, nk));
            name[strlen(name) - 1] = 'v';
            CHECK_FD(name, fd_err(att_loss, &c, c.v, dv, nk));

            /* the online-softmax path (att == NULL), serial and threaded */
            att_loss(&c);
            double *o2 = zeros_d(nq);
            ft_attention_forward_f64(o2, NULL, c.q, c.k, c.v, qpos, c.doc, T, Tk, NH, NKV, HS, NKV * HS, 1);
            /* same sums in another order: double rounding, ~1e-15 */
            CHECKF(rel_err_d(o2, c.out, nq) < 1e-12, "online softmax vs saved att %.3g", rel_err_d(o2, c.out, nq));
            double *o3 = zeros_d(nq);
            ft_attention_forward_f64(o3, NULL, c.q, c.k, c.v, qpos, c.doc, T, Tk, NH, NKV, HS, NKV * HS, 3);
            CHECK(memcmp(o2, o3, nq * sizeof(double)) == 0);   /* each row computed the same way */
            /* the saved-probabilities path on 3 threads: the same bits as on 1 */
            double *o4 = zeros_d(nq), *a4 = zeros_d(na);
            ft_attention_forward_f64(o4, a4, c.q, c.k, c.v, qpos, c.doc, T, Tk, NH, NKV, HS, NKV * HS, 3);
            CHECK(memcmp(o4, c.out, nq * sizeof(double)) == 0 && memcmp(a4, c.att, na * sizeof(double)) == 0);
            free(o4); free(a4);

            /* float32 against float64, both paths */
            float *fq = to_f(c.q, nq), *fk = to_f(c.k, nk), *fv = to_f(c.v, nk), *fwt = to_f(c.wt, nq);
            float *fo = malloc(nq * sizeof(float)), *fo2 = malloc(nq * sizeof(float));
            float *fatt = malloc(na * sizeof(float));
            float *fdq = malloc(nq * sizeof(float)), *fdk = malloc(nk * sizeof(float)), *fdv = malloc(nk * sizeof(float));
            ft_attention_forward(fo, fatt, fq, fk, fv, qpos, c.doc, T, Tk, NH, NKV, HS, NKV * HS, 1);
            ft_attention_forward(fo2, NULL, fq, fk, fv, qpos, c.doc, T, Tk, NH, NKV, HS, NKV * HS, 2);
            ft_attention_backward(fdq, fdk, fdv, fwt, fatt, fq, fk, fv, T, Tk, NH, NKV, HS);
            CHECK_F32("attention out", rel_err_fd(fo, c.out, nq));
            CHECK_F32("attention out (online)", rel_err_fd(fo2, c.out, nq));
            CHECK_F32("attention att", rel_err_fd(fatt, c.att, na));
            CHECK_F32("attention dq", rel_err_fd(fdq, dq, nq));
            CHECK_F32("attention dk", rel_err_fd(fdk, dk, nk));
            CHECK_F32("attention dv", rel_err_fd(fdv, dv, nk));

            /* masked keys get probability exactly 0; rows sum to 1 */
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const double *p = c.att + ((size_t)h * T + t) * Tk;
                    double s = 0;
                    for (int j = 0; j < Tk; j++) {
                        bool vis = j <= qpos[t] && (!use_doc || doc[j] == doc[qpos[t]]);
                        if (!vis) CHECK(p[j] == 0);
                        s += p[j];
                    }
                    CHECK(fabs(s - 1) < 1e-14);   /* <= 9 double additions */
                }
            free(c.out); free(c.att); free(c.q); free(c.k); free(c.v); free(c.wt);
            free(dq); free(dk); free(dv); free(o2); free(o3);
            free(fq); free(fk); free(fv); free(fwt); free(fo); free(fo2); free(fatt); free(fdq); free(fdk); free(fdv);
        }
    }
}

/* One query, two keys, HS = 2: out = (e^s1 v1 + e^s2 v2) / (e^s1 + e^s2)
 * with s_j = q.k_j / sqrt(2). */
static void test_attention_formula(void)
{
    double q[2] = { 0.3, -1.2 }, k[4] = { 1.0, 0.5, -0.7, 2.0 }, v[4] = { 2.0, -1.0, 0.25, 3.0 };
    int qpos = 1;
    double out[2], att[2];
    ft_attention_forward_f64(out, att, q, k, v, &qpos, NULL, 1, 2, 1, 1, 2, 2, 1);
    double s1 = (q[0] * k[0] + q[1] * k[1]) / sqrt(2.0), s2 = (q[0] * k[2] + q[1] * k[3]) / sqrt(2.0);
    double e1 = exp(s1), e2 = exp(s2);
    for (int d = 0; d < 2; d++) {
        double want = (e1 * v[d] + e2 * v[2 + d]) / (e1 + e2);
        CHECKF(fabs(out[d] - want) < 1e-14, "d=%d %.17g vs %.17g", d, out[d], want);   /* double rounding */
    }
    CHECK(fabs(att[0] - e1 / (e1 + e2)) < 1e-15);
}

/* Packed documents: attention with a doc mask equals attention over each
 * document alone (positions within the packed row are cache positions). */
static void test_attention_docs(void)
{
    int T = 9, NH = 6, NKV = 2, HS = 6;
    int doc[9] = { 0, 0, 0, 1, 1, 1, 1, 2, 2 };
    int qpos[9];
    for (int t = 0; t < T; t++) qpos[t] = t;
    size_t nq = (size_t)T * NH * HS, nk = (size_t)T * NKV * HS;
    double *qd = rand_d(nq, 1), *kd = rand_d(nk, 1), *vd = rand_d(nk, 1);
    float *q = to_f(qd, nq), *k = to_f(kd, nk), *v = to_f(vd, nk);
    float *packed = malloc(nq * sizeof(float)), *sep = malloc(nq * sizeof(float));
    ft_attention_forward(packed, NULL, q, k, v, qpos, doc, T, T, NH, NKV, HS, NKV * HS, 1);
    int start = 0;
    while (start < T) {
        int end = start;
        while (end < T && doc[end] == doc[start]) end++;
        int len = end - start;
        ft_attention_forward(sep + (size_t)start * NH * HS, NULL, q + (size_t)start * NH * HS,
                          k + (size_t)start * NKV * HS, v + (size_t)start * NKV * HS, qpos, NULL,
                          len, len, NH, NKV, HS, NKV * HS, 1);
        start = end;
    }
    /* the same keys in the same order: bitwise equal */
    CHECK(memcmp(packed, sep, nq * sizeof(float)) == 0);

    /* GQA: NKV = 2 equals full multi-head attention with each kv head
     * repeated for its 3 query heads */
    float *krep = malloc(nq * sizeof(float)), *vrep = malloc(nq * sizeof(float)), *mha = malloc(nq * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++)
            for (int d = 0; d < HS; d++) {
                krep[(t * NH + h) * HS + d] = k[(t * NKV + h / (NH / NKV)) * HS + d];
                vrep[(t * NH + h) * HS + d] = v[(t * NKV + h / (NH / NKV)) * HS + d];
            }
    ft_attention_forward(mha, NULL, q, krep, vrep, qpos, doc, T, T, NH, NH, HS, NH * HS, 1);
    CHECK(memcmp(packed, mha, nq * sizeof(float)) == 0);
    free(qd); free(kd); free(vd); free(q); free(k); free(v); free(packed); free(sep);
    free(krep); free(vrep); free(mha);
}

/* Positions outside the cache do not read outside it: a position past the
 * end sees the whole cache, a negative one sees nothing (zero output). */
static void test_attention_bad_pos(void)
{
    int Tk = 3, HS = 4;
    float q[8] = { 1, 2, 3, 4, -1, 0.5f, 0, 2 }, k[12], v[12], out[8], att[6], out2[4];
    for (int i = 0; i < 12; i++) { k[i] = (float)(i % 5) - 2; v[i] = (float)i; }
    int qpos[2] = { -1, Tk + 5 };
    ft_attention_forward(out, att, q, k, v, qpos, NULL, 2, Tk, 1, 1, HS, HS, 1);
    for (int d = 0; d < HS; d++) CHECK(out[d] == 0);
    for (int j = 0; j < Tk; j++) CHECK(att[j] == 0);
    int last = Tk - 1;
    ft_attention_forward(out2, NULL, q + HS, k, v, &last, NULL, 1, Tk, 1, 1, HS, HS, 1);
    /* the two paths sum in different orders: float rounding, ~1e-7 */
    CHECK(check_max_rel_err(out + HS, out2, HS, 1e-3) < 1e-5);
}

/* ------------------------------------------------------------- cross-entropy */

typedef struct { double *logits; const int *tg; int T, V; } ce_ctx;
static double ce_loss(void *p)
{
    ce_ctx *c = p;
    return ft_crossentropy_forward_backward_f64(NULL, c->logits, c->tg, c->T, c->V, 1);
}

static void test_crossentropy(void)
{
    int T = 7, V = 17;
    int tg[7] = { 3, -1, 16, 0, -100, 5, 5 };
    size_t n = (size_t)T * V;
    ce_ctx c = { rand_d(n, 2), tg, T, V };
    round_f(c.logits, n);
    double *dl = zeros_d(n);
    double loss = ft_crossentropy_forward_backward_f64(dl, c.logits, tg, T, V, 1);
    CHECK_FD("crossentropy dlogits", fd_err(ce_loss, &c, c.logits, dl, n));

    /* ignored rows: no loss, zero gradient; the rest: -log softmax */
    double want = 0;
    for (int t = 0; t < T; t++) {
        const double *x = c.logits + (size_t)t * V;
        if (tg[t] < 0) {
            for (int i = 0; i < V; i++) CHECK(dl[(size_t)t * V + i] == 0);
            continue;
        }
        double s = 0;
        for (int i = 0; i < V; i++) s += exp(x[i]);
        want += -log(exp(x[tg[t]]) / s);
    }
    CHECKF(fabs(loss - want) < 1e-13 * want, "loss %.17g vs %.17g", loss, want);   /* double rounding */

    /* dloss_scale scales the gradient only */
    double *dl2 = zeros_d(n);
    double loss2 = ft_crossentropy_forward_backward_f64(dl2, c.logits, tg, T, V, 0.25);
    CHECK(loss2 == loss);
    for (size_t i = 0; i < n; i++) dl2[i] *= 4;
    CHECK(rel_err_d(dl2, dl, n) == 0);   /* scaling by a power of 2 is exact */

    /* a target outside the vocabulary is not read; the loss says so */
    int bad[1] = { V };
    CHECK(isnan(ft_crossentropy_forward_backward_f64(dl2, c.logits, bad, 1, V, 1)));

    float *fl = to_f(c.logits, n), *fdl = malloc(n * sizeof(float));
    double floss = ft_crossentropy_forward_backward(fdl, fl, tg, T, V, 1);
    /* the float path sums in double on the same (float) logits: identical
     * up to exp in double of float inputs, ~1e-15 */
    CHECKF(fabs(floss - loss) < 1e-12 * loss, "float loss %.17g vs %.17g", floss, loss);
    CHECK_F32("crossentropy dlogits", rel_err_fd(fdl, dl, n));
    free(c.logits); free(dl); free(dl2); free(fl); free(fdl);
}

static void test_softmax(void)
{
    int n = 17;
    double *x = rand_d(n, 3), *y = malloc(n * sizeof(double));
    x[4] = 700;   /* exp(700) is near overflow: the max must be subtracted */
    memcpy(y, x, n * sizeof(double));
    double lse = ft_softmax_inplace_f64(y, n);
    double s = 0, e = 0;
    for (int i = 0; i < n; i++) s += y[i];
    for (int i = 0; i < n; i++) e = fmax(e, fabs(y[i] - exp(x[i] - lse)));
    CHECK(fabs(s - 1) < 1e-14);                 /* 17 double additions */
    CHECKF(e < 1e-15, "softmax vs exp(x - lse) %.3g", e);   /* probabilities <= 1, double rounding */
    CHECK(fabs(lse - 700) < 1e-9 && lse >= 700); /* the other terms are exp(-690): invisible */
    free(x); free(y);
}

/* ------------------------------------------------------------- matmul */

typedef struct { double *out, *inp, *w, *b, *wt; int T, IC, OC; } mm_ctx;
static double mm_loss(void *p)
{
    mm_ctx *c = p;
    ft_matmul_forward_ref_f64(c->out, c->inp, c->w, c->b, c->T, c->IC, c->OC);
    return dotw(c->wt, c->out, (size_t)c->T * c->OC);
}

static void test_matmul(void)
{
    int T = 7, IC = 13, OC = 11;
    size_t ni = (size_t)T * IC, nw = (size_t)OC * IC, no = (size_t)T * OC;
    mm_ctx c = { zeros_d(no), rand_d(ni, 1), rand_d(nw, 1), rand_d(OC, 1), rand_d(no, 1), T, IC, OC };
    round_f(c.inp, ni); round_f(c.w, nw); round_f(c.b, OC); round_f(c.wt, no);
    double *di = zeros_d(ni), *dw = zeros_d(nw), *db = zeros_d(OC);
    ft_matmul_backward_ref_f64(di, dw, db, c.wt, c.inp, c.w, T, IC, OC);
    CHECK_FD("matmul dinp", fd_err(mm_loss, &c, c.inp, di, ni));
    CHECK_FD("matmul dw", fd_err(mm_loss, &c, c.w, dw, nw));
    CHECK_FD("matmul dbias", fd_err(mm_loss, &c, c.b, db, OC));

    /* dinp overwrites, dw/dbias accumulate */
    double *di2 = rand_d(ni, 1), *dw2 = zeros_d(nw), *db2 = zeros_d(OC);
    ft_matmul_backward_ref_f64(di2, dw2, db2, c.wt, c.inp, c.w, T, IC, OC);
    ft_matmul_backward_ref_f64(di2, dw2, db2, c.wt, c.inp, c.w, T, IC, OC);
    for (size_t i = 0; i < nw; i++) dw2[i] *= 0.5;
    for (int i = 0; i < OC; i++) db2[i] *= 0.5;
    CHECK(rel_err_d(di2, di, ni) == 0 && rel_err_d(dw2, dw, nw) == 0 && rel_err_d(db2, db, OC) == 0);

    float *fi = to_f(c.inp, ni), *fw = to_f(c.w, nw), *fb = to_f(c.b, OC), *fwt = to_f(c.wt, no);
    float *fo = malloc(no * sizeof(float)), *fdi = malloc(ni * sizeof(float));
    float *fdw = calloc(nw, sizeof(float)), *fdb = calloc(OC, sizeof(float));
    ft_matmul_forward_ref(fo, fi, fw, fb, T, IC, OC);
    ft_matmul_backward_ref(fdi, fdw, fdb, fwt, fi, fw, T, IC, OC);
    mm_loss(&c);
    CHECK_F32("matmul out", rel_err_fd(fo, c.out, no));
    CHECK_F32("matmul dinp", rel_err_fd(fdi, di, ni));
    CHECK_F32("matmul dw", rel_err_fd(fdw, dw, nw));
    CHECK_F32("matmul dbias", rel_err_fd(fdb, db, OC));
    free(c.out); free(c.inp); free(c.w); free(c.b); free(c.wt); free(di); free(dw); free(db);
    free(di2); free(dw2); free(db2); free(fi); free(fw); free(fb); free(fwt); free(fo); free(fdi); free(fdw); free(fdb);
}

/* ------------------------------------------------------------- embedding */

typedef struct { double *out, *wte, *wt; const int *tok; int T, C, V; } emb_ctx;
static double emb_loss(void *p)
{
    emb_ctx *c = p;
    if (ft_embedding_forward_f64(c->out, c->tok, c->wte, c->T, c->C, c->V) != FTUNE_OK) return NAN;
    return dotw(c->wt, c->out, (size_t)c->T * c->C);
}

static void test_embedding(void)
{
    int T = 7, C = 13, V = 17;
    int tok[7] = { 3, 16, 0, 3, 9, 3, 16 };   /* repeats: their gradients add */
    size_t nw = (size_t)V * C, no = (size_t)T * C;
    emb_ctx c = { zeros_d(no), rand_d(nw, 1), rand_d(no, 1), tok, T, C, V };
    double *dwte = zeros_d(nw);
    CHECK_OK(ft_embedding_backward_f64(dwte, c.wt, tok, T, C, V));
    CHECK_FD("embedding dwte", fd_err(emb_loss, &c, c.wte, dwte, nw));
    emb_loss(&c);
    for (int t = 0; t < T; t++) CHECK(memcmp(c.out + t * C, c.wte + tok[t] * C, C * sizeof(double)) == 0);

    int bad[2] = { 1, V };
    float *fo = malloc(no * sizeof(float)), *fw = to_f(c.wte, nw), *fd = calloc(nw, sizeof(float));
    CHECK(ft_embedding_forward(fo, bad, fw, 2, C, V) == FTUNE_ERR_RANGE);
    CHECK(strstr(ftune_last_error(), "outside the vocabulary") != NULL);
    bad[1] = -1;
    CHECK(ft_embedding_backward(fd, fo, bad, 2, C, V) == FTUNE_ERR_RANGE);
    for (size_t i = 0; i < nw; i++) CHECK(fd[i] == 0);   /* nothing half-done */
    free(c.out); free(c.wte); free(c.wt); free(dwte); free(fo); free(fw); free(fd);
}

int main(void)
{
    ft_rng_seed(&rng, 1234);
    RUN(test_rmsnorm);
    RUN(test_rope_backward);
    RUN(test_rope_layouts);
    RUN(test_rope_relative);
    RUN(test_rope_llama3);
    RUN(test_swiglu);
    RUN(test_attention_backward);
    RUN(test_attention_formula);
    RUN(test_attention_docs);
    RUN(test_attention_bad_pos);
    RUN(test_crossentropy);
    RUN(test_softmax);
    RUN(test_matmul);
    RUN(test_embedding);
    CHECK_EXIT();
}
