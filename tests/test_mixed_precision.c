/* test_mixed_precision.c — the bf16/f16 compute path (backend.h "Compute
 * type"): every Linear op of the CPU backend in bf16 and f16 against the
 * reference backend in the same compute type and against f32 with a
 * rigorous rounding bound; the embedding's rounding; whole-model gradients
 * in bf16/f16 against f32; full fine-tuning's compute copies; where the
 * weights are held (converted, mapped, quantized) and what stays resident;
 * the Linears' inputs saved in the compute type changing no gradient.
 *
 * Error measures: "rel err" is max |got - want| / max |want| over a tensor
 * (normwise); the bound checks are elementwise. Each tolerance says why. */
#include "nn/backend.h"
#include "cpu/kernels.h"
#include "train/train.h"
#include "check.h"

#include <unistd.h>

static ft_rng rng;

static float *rnd(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * ft_rng_normal(&rng);
    return x;
}
/* Values k/16, k in [-15, 15]: 4 significant bits, exact in bf16 and f16,
 * so sums of up to 2^10 of their products are exact in f32 (the adapter
 * cases use them: see lora_case). */
static float *few_bits(size_t n) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)(ft_rng_uniform(&rng) * 31.0f) - 15) / 16.0f;
    return x;
}
static float *dup_f(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double norm_err(const float *got, const float *want, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (isnan(d)) return INFINITY;
        m = d > m ? d : m;
        s = fabs(want[i]) > s ? fabs(want[i]) : s;
    }
    return s > 0 ? m / s : m;
}
static void cmp(const char *what, const float *got, const float *want, size_t n, double tol) {
    double e = norm_err(got, want, n);
    printf("  %-52s rel err %.2e (tol %.0e)\n", what, e, tol);
    CHECKF(e <= tol, "%s: %.3e > %.0e", what, e, tol);
}

/* Unit roundoff of a compute type: RNE to p significant bits is within
 * 2^-p of the value, relative. */
static double unit_roundoff(ft_dtype c) { return c == FT_BF16 ? 0x1p-8 : c == FT_F16 ? 0x1p-11 : 0x1p-24; }

/* Float sums of up to ~130 terms in another order than the reference's
 * differ by about sqrt(K)·2^-24 ≈ 1e-6 of the scale; 1e-5 leaves 10x, while
 * an operand that is not rounded (or rounded twice to another type) is off
 * by ~u ≈ 4e-3 (bf16) or 5e-4 (f16): 50x above it. */
#define TOL_SUM 1e-5

/* A Linear (in -> out) with weight dtype dt and a bias. */
static ft_linear make_linear(ft_dtype dt, int in, int out, float **w32) {
    *w32 = rnd((size_t)out * in, 0.2f);
    size_t nb = (size_t)ft_dtype_nbytes(dt, (int64_t)out * in);
    void *w = malloc(nb);
    if (dt == FT_F32) memcpy(w, *w32, nb);
    else ft_types[dt].from_f32(*w32, w, (int64_t)out * in);
    ft_linear l = { .w = { .dtype = dt, .ndim = 2, .shape = { out, in }, .data = w, .nbytes = nb }, .in = in, .out = out };
    snprintf(l.w.name, sizeof l.w.name, "test.%s", ft_types[dt].name);
    l.bias = rnd((size_t)out, 0.5f);
    return l;
}

/* Rigorous elementwise bound for C = A·B in compute type c against the f32
 * product of the same (unrounded) operands: each rounded product is within
 * (2u + u²)·|a||b| of the exact one, and either f32 sum of K terms within
 * K·2^-24·Σ|a||b| of the exact sum; so |got - want| <= (2u + u² +
 * 2K·2^-24)·Σ_k |a_k||b_k| (a 1.05 factor covers the bound's own rounding).
 * absprod (n) holds Σ|a||b| per element. Returns the largest ratio of the
 * error to that bound (<= 1 passes). */
static double bound_ratio(const float *got, const float *want, const double *absprod, size_t n, int K, ft_dtype c) {
    double u = unit_roundoff(c), b = 1.05 * (2 * u + u * u + 2.0 * K * 0x1p-24), worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]), lim = b * absprod[i] + 1e-30;
        if (isnan(e)) return INFINITY;
        worst = e / lim > worst ? e / lim : worst;
    }
    return worst;
}

/* Base Linear (no adapter) on random data: forward, dinp, dw; CPU backend
 * on 1 and 3 threads against the reference in the same compute type
 * (TOL_SUM: the operands are rounded identically, only the f32 sums'
 * order differs), and against f32 within the rounding bound. */
static void linear_case(ft_dtype c, ft_dtype wdt, int T, int in, int out) {
    float *w32;
    ft_linear l = make_linear(wdt, in, out, &w32);
    size_t ni = (size_t)T * in, no = (size_t)T * out, nw = (size_t)out * in;
    float *x = rnd(ni, 1), *dout = rnd(no, 1);
    float *r_out = calloc(no, 4), *r_dinp = calloc(ni, 4), *r_dw = calloc(nw, 4), *r_db = calloc(out, 4);
    float *f_out = calloc(no, 4), *f_dinp = calloc(ni, 4), *f_dw = calloc(nw, 4), *f_db = calloc(out, 4);
    ft_backend ref = ft_backend_ref_in(c), ref32 = ft_backend_ref();
    ref.linear_forward(&ref, r_out, x, &l, NULL, T, NULL);
    ref.linear_backward(&ref, r_dinp, r_dw, r_db, dout, x, NULL, &l, NULL, T, 0, false, NULL);
    ref32.linear_forward(&ref32, f_out, x, &l, NULL, T, NULL);
    ref32.linear_backward(&ref32, f_dinp, f_dw, f_db, dout, x, NULL, &l, NULL, T, 0, false, NULL);
    /* Σ|a||b| per output of the three products, against the stored weight */
    float *w = malloc(nw * 4);
    for (int o = 0; o < out; o++) ft_tensor_row_f32(&l.w, o, w + (size_t)o * in);
    double *ab_out = calloc(no, 8), *ab_dinp = calloc(ni, 8), *ab_dw = calloc(nw, 8);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++)
            for (int i = 0; i < in; i++) {
                double a = fabs(x[(size_t)t * in + i]), ww = fabs(w[(size_t)o * in + i]), d = fabs(dout[(size_t)t * out + o]);
                ab_out[(size_t)t * out + o] += a * ww;
                ab_dinp[(size_t)t * in + i] += d * ww;
                ab_dw[(size_t)o * in + i] += d * a;
            }
    char what[128];
    const char *cn = ft_types[c].name, *wn = ft_types[wdt].name;
    for (int nt = 1; nt <= 3; nt += 2) {
        ft_backend be = ft_backend_cpu_in(c, nt);
        float *scr = malloc(be.linear_scratch_floats(&be, in, 0, T, true) * sizeof(float));
        float *o1 = calloc(no, 4), *d1 = calloc(ni, 4), *w1 = calloc(nw, 4), *b1 = calloc(out, 4);
        be.linear_forward(&be, o1, x, &l, NULL, T, scr);
        be.linear_backward(&be, d1, w1, b1, dout, x, NULL, &l, NULL, T, 0, false, scr);
        snprintf(what, sizeof what, "%s W %s T%d %dx%d %dt: fwd vs ref-%s", cn, wn, T, in, out, nt, cn);
        cmp(what, o1, r_out, no, TOL_SUM);
        cmp("  dinp", d1, r_dinp, ni, TOL_SUM);
        cmp("  dw", w1, r_dw, nw, TOL_SUM);
        cmp("  dbias (f32 sums of dout, unrounded)", b1, f_db, out, TOL_SUM);
        if (nt == 1) {
            /* the bound is on the bias-free product: take the bias out */
            for (int t = 0; t < T; t++)
                for (int o = 0; o < out; o++) {
                    o1[(size_t)t * out + o] -= l.bias[o];
                    f_out[(size_t)t * out + o] -= l.bias[o];
                }
            double r1 = bound_ratio(o1, f_out, ab_out, no, in, c), r2 = bound_ratio(d1, f_dinp, ab_dinp, ni, out, c);
            double r3 = bound_ratio(w1, f_dw, ab_dw, nw, T, c);
            printf("  %s vs f32: normwise rel err fwd %.2e dinp %.2e dw %.2e; of the rounding bound: %.2f %.2f %.2f\n",
                   cn, norm_err(o1, f_out, no), norm_err(d1, f_dinp, ni), norm_err(w1, f_dw, nw), r1, r2, r3);
            CHECKF(r1 <= 1 && r2 <= 1 && r3 <= 1, "%s: outside the rounding bound (%.2f %.2f %.2f)", what, r1, r2, r3);
            /* and the rounding is there: an unrounded product would be far closer to f32 */
            if (wdt != c) CHECKF(norm_err(o1, f_out, no) > 10 * TOL_SUM, "%s: no sign of rounding", what);
            for (int t = 0; t < T; t++)
                for (int o = 0; o < out; o++) f_out[(size_t)t * out + o] += l.bias[o];
        }
        free(scr); free(o1); free(d1); free(w1); free(b1);
    }
    free(w32); free(l.w.data); free(l.bias); free(x); free(dout); free(w);
    free(r_out); free(r_dinp); free(r_dw); free(r_db); free(f_out); free(f_dinp); free(f_dw); free(f_db);
    free(ab_out); free(ab_dinp); free(ab_dw);
}

static void test_linear_bf16_f16(void) {
    ft_dtype cs[2] = { FT_BF16, FT_F16 };
    for (int i = 0; i < 2; i++) {
        linear_case(cs[i], FT_F32, 1, 67, 45);    /* one row: the GEMV path */
        linear_case(cs[i], FT_F32, 37, 67, 45);
        linear_case(cs[i], FT_F32, 5, 129, 31);
        linear_case(cs[i], FT_BF16, 23, 67, 45);  /* a weight already in bf16 */
        linear_case(cs[i], FT_F16, 19, 96, 33);
    }
    /* q8_0 weights stay quantized under any compute type: their
     * dequantized values are rounded like any other operand */
    linear_case(FT_BF16, FT_Q8_0, 19, 96, 45);
}

/* Linear with a LoRA adapter in compute type c, CPU against the reference
 * in the same type. x, A, B and dout have 4 significant bits (few_bits),
 * so the adapter's intermediates u = x·Aᵀ and g = scale·dout·B are exact
 * in f32 on both sides and round to the same bf16/f16 value: then only
 * the order of f32 sums differs (TOL_SUM). With random f32 data an
 * intermediate near a rounding midpoint may round differently on the two
 * sides, a one-ulp (2^-8) step that no tight tolerance can tell from a bug.
 * Dropout 0.5 scales by 2, which keeps xd exact. */
static void lora_case(ft_dtype c, int T, int in, int out, int R, float p) {
    float *w32;
    ft_linear l = make_linear(FT_F32, in, out, &w32);
    size_t ni = (size_t)T * in, no = (size_t)T * out, na = (size_t)R * in, nb = (size_t)out * R;
    ft_adapter_hparams hp = { .r = R, .alpha = 2.0f * R, .dropout = p }; /* scale 2 */
    ft_lora a = { .A = few_bits(na), .B = few_bits(nb), .dA = calloc(na, 4), .dB = calloc(nb, 4) };
    ft_lora_bind(&a, &hp);
    float *x = few_bits(ni), *dout = few_bits(no);
    float *r_out = calloc(no, 4), *r_u = calloc((size_t)T * R, 4), *r_dinp = calloc(ni, 4);
    ft_backend ref = ft_backend_ref_in(c);
    uint64_t seed = 0x5eedu + (uint64_t)T;
    ref.linear_forward_train(&ref, r_out, r_u, x, &l, &a.base, T, seed, NULL);
    ref.linear_backward(&ref, r_dinp, NULL, NULL, dout, x, r_u, &l, &a.base, T, seed, false, NULL);
    float *r_dA = dup_f(a.dA, na), *r_dB = dup_f(a.dB, nb);
    float *r_inf = calloc(no, 4);
    ref.linear_forward(&ref, r_inf, x, &l, &a.base, T, NULL);
    char what[128];
    for (int nt = 1; nt <= 3; nt += 2) {
        ft_backend be = ft_backend_cpu_in(c, nt);
        memset(a.dA, 0, na * 4); memset(a.dB, 0, nb * 4);
        float *scr = malloc(be.linear_scratch_floats(&be, in, R, T, true) * sizeof(float));
        float *o1 = calloc(no, 4), *u1 = calloc((size_t)T * R, 4), *d1 = calloc(ni, 4);
        be.linear_forward_train(&be, o1, u1, x, &l, &a.base, T, seed, scr);
        be.linear_backward(&be, d1, NULL, NULL, dout, x, u1, &l, &a.base, T, seed, false, scr);
        snprintf(what, sizeof what, "%s LoRA T%d %dx%d R%d p%.1f %dt: train fwd", ft_types[c].name, T, in, out, R, p,
                 nt);
        cmp(what, o1, r_out, no, TOL_SUM);
        cmp("  u", u1, r_u, (size_t)T * R, TOL_SUM);
        cmp("  dinp", d1, r_dinp, ni, TOL_SUM);
        cmp("  dA", a.dA, r_dA, na, TOL_SUM);
        cmp("  dB", a.dB, r_dB, nb, TOL_SUM);
        be.linear_forward(&be, o1, x, &l, &a.base, T, scr);
        cmp("  inference fwd", o1, r_inf, no, TOL_SUM);
        free(scr); free(o1); free(u1); free(d1);
    }
    /* u is rounded before it meets B, W before it meets x: the f32 path
     * differs by a fair part of the unit roundoff (0.02·u: well above the
     * sums' 1e-7, well below the ~0.5·u that the roundings give) */
    ft_backend f32 = ft_backend_ref();
    float *f_out = calloc(no, 4), *f_u = calloc((size_t)T * R, 4);
    f32.linear_forward_train(&f32, f_out, f_u, x, &l, &a.base, T, seed, NULL);
    double e = norm_err(r_out, f_out, no);
    printf("  %s against f32: rel err %.2e\n", what, e);
    CHECKF(e > 0.02 * unit_roundoff(c), "%s: the products show no rounding (%.2e)", what, e);
    free(f_out); free(f_u);
    free(w32); free(l.w.data); free(l.bias); free(a.A); free(a.B); free(a.dA); free(a.dB); free(x); free(dout);
    free(r_out); free(r_u); free(r_dinp); free(r_dA); free(r_dB); free(r_inf);
}

static void test_lora_bf16_f16(void) {
    lora_case(FT_BF16, 23, 67, 45, 4, 0);
    lora_case(FT_BF16, 9, 129, 31, 3, 0.5f);
    lora_case(FT_F16, 23, 67, 45, 4, 0);
    lora_case(FT_F16, 1, 96, 33, 2, 0.5f);
}

/* The embedding's rows are the compute type's values of the table on both
 * backends (exactly: a rounding, no sums), f32 unchanged. */
static void test_embedding_rounding(void) {
    int V = 11, C = 37, T = 6;
    float *tab = rnd((size_t)V * C, 1);
    ft_tensor wte = ft_tensor_f32_view("tok", tab, V, C);
    int32_t tok[6] = { 0, 3, 10, 3, 7, 1 };
    ft_dtype cs[3] = { FT_F32, FT_BF16, FT_F16 };
    for (int i = 0; i < 3; i++) {
        ft_backend be = ft_backend_cpu_in(cs[i], 2), ref = ft_backend_ref_in(cs[i]);
        float *a = calloc((size_t)T * C, 4), *b = calloc((size_t)T * C, 4);
        be.embedding_forward(&be, a, tok, &wte, T);
        ref.embedding_forward(&ref, b, tok, &wte, T);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < C; j++) {
                float want = ft_round_in(cs[i], tab[(size_t)tok[t] * C + j]);
                CHECK(a[(size_t)t * C + j] == want && b[(size_t)t * C + j] == want);
            }
        free(a); free(b);
    }
    free(tab);
}

/* ------------------------------------------------ whole-model gradients */

static char stories_hf[512];

/* One micro-batch of B rows of T pseudo-random tokens, targets the next
 * token (the last of a row ignored). */
typedef struct { int32_t tok[256]; int tgt[256]; ft_batch b; } grad_batch;
static void make_batch(grad_batch *g, int B, int T, int V) {
    memset(g, 0, sizeof *g);
    for (int i = 0; i < B * T; i++) g->tok[i] = (int32_t)(ft_rng_uniform(&rng) * (V - 1)) + 1;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) g->tgt[r * T + t] = t + 1 < T ? g->tok[r * T + t + 1] : -1;
    g->b = (ft_batch){ .B = B, .T = T, .B_max = B, .T_max = T, .tokens = g->tok, .targets = g->tgt };
    for (int i = 0; i < B * T; i++) g->b.n_targets += g->tgt[i] >= 0;
}

/* A trainer in compute type c on m, its LoRA B set from seed (B = 0 at
 * init would leave every dA zero), one step; returns the trainer (the
 * caller frees it) and its loss. */
static ft_trainer *grad_step(const ftune_model *m, ft_train_mode mode, ft_dtype c, grad_batch *gb, double *loss) {
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = mode; o.lora.r = 4; o.lora.alpha = 8; o.max_B = gb->b.B; o.max_T = gb->b.T; o.lora.seed = 5;
    o.n_threads = 2; o.compute = c;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (!tr) return NULL;
    if (mode == FT_TRAIN_LORA) {
        ft_rng r;
        ft_rng_seed(&r, 77);
        for (int i = 1; i < ft_trainer_n_params(tr); i += 2) {
            const ft_param *p = &ft_trainer_param(tr, i)->opt;
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = 0.05f * ft_rng_normal(&r);
        }
    }
    ft_trainer_zero_grad(tr);
    CHECK_OK(ft_trainer_step(tr, &gb->b, gb->b.n_targets, loss));
    return tr;
}

/* Worst normwise rel err over the parameter tensors of a against b (the
 * same parameter list); the name of the worst in *worst_name. Also checks
 * that every tensor of a has a nonzero gradient where b has. */
static double grads_err(ft_trainer *a, ft_trainer *b, char *worst_name, size_t cap, double *global) {
    double worst = 0, d2 = 0, n2 = 0;
    int64_t n;
    const float *ga = ft_trainer_grads(a, &n), *gb = ft_trainer_grads(b, NULL);
    for (int64_t j = 0; j < n; j++) {
        d2 += ((double)ga[j] - gb[j]) * ((double)ga[j] - gb[j]);
        n2 += (double)gb[j] * gb[j];
    }
    *global = n2 > 0 ? sqrt(d2 / n2) : INFINITY;
    for (int i = 0; i < ft_trainer_n_params(b); i++) {
        const ft_param *pa = &ft_trainer_param(a, i)->opt, *pb = &ft_trainer_param(b, i)->opt;
        double e = norm_err(pa->grad, pb->grad, (size_t)pb->numel), na = 0;
        for (int64_t j = 0; j < pa->numel; j++) na = fmax(na, fabs(pa->grad[j]));
        CHECKF(na > 0 || norm_err(pb->grad, pb->grad, 1) != 0, "%s: no gradient", pa->name);
        if (e > worst || isnan(e)) { worst = isnan(e) ? INFINITY : e; snprintf(worst_name, cap, "%s", pa->name); }
    }
    return worst;
}

/* The gradients of one step on stories260K in bf16 and f16 against f32,
 * LoRA on all seven Linears and full fine-tuning. Every Linear rounds its
 * input and weight (u = 2^-8 for bf16, 2^-11 for f16), forward and
 * backward, five layers deep, and the errors scale with u: per tensor
 * (normwise) the worst measured is 12.8u (bf16 and f16 alike, always a
 * q_proj or k_proj, whose gradients come through the softmax as small
 * differences), the whole gradient vector's relative 2-norm error 2.2u at
 * most. The tolerances (25u per tensor, 8u for the vector) leave 2x and
 * 3.6x; an unrounded
 * path would be ~1e-6, a wrong gradient O(1). The model converted at load
 * and the f32 model rounded in the products are the same numbers up to the
 * order of f32 sums (measured bit-identical with today's kernels; 1e-4
 * allows another kernel's order, a rare rounding flip of an activation
 * included). */
static void test_model_grads_vs_f32(void) {
    ftune_model *m32 = NULL, *mb = NULL, *mh = NULL;
    ftune_load_opts lb = { .dtype = "bf16" }, lh = { .dtype = "f16" };
    CHECK_OK(ftune_model_load(&m32, stories_hf, NULL));
    CHECK_OK(ftune_model_load(&mb, stories_hf, &lb));
    CHECK_OK(ftune_model_load(&mh, stories_hf, &lh));
    if (!m32 || !mb || !mh) { ftune_model_free(m32); ftune_model_free(mb); ftune_model_free(mh); return; }
    CHECK(strcmp(ftune_model_dtype(mb), "bf16") == 0 && mb->lm_head.w.dtype == FT_BF16 && mb->tok_embd.dtype == FT_BF16);
    CHECK(mb->layers[0].wq.w.dtype == FT_BF16 && mh->layers[0].w_down.w.dtype == FT_F16);
    CHECK(mb->owned_bytes > 0);
    grad_batch gb;
    make_batch(&gb, 2, 24, m32->cfg.V);
    ft_train_mode modes[2] = { FT_TRAIN_LORA, FT_TRAIN_FULL };
    for (int mi = 0; mi < 2; mi++) {
        const char *mn = mi ? "full" : "LoRA";
        double l32, lbf, lb32, lhf;
        ft_trainer *t32 = grad_step(m32, modes[mi], FT_F32, &gb, &l32);
        ft_trainer *tb = grad_step(mb, modes[mi], FT_BF16, &gb, &lbf);
        ft_trainer *tb32 = grad_step(m32, modes[mi], FT_BF16, &gb, &lb32);
        ft_trainer *th = grad_step(mh, modes[mi], FT_F16, &gb, &lhf);
        if (t32 && tb && tb32 && th) {
            char wn[160] = "";
            double gl;
            double eb = grads_err(tb, t32, wn, sizeof wn, &gl);
            printf("  %s bf16 vs f32: summed loss %.6f vs %.6f, gradient rel err: worst tensor %.2e = %.1fu (%s), "
                   "whole vector %.2e = %.1fu\n", mn, lbf, l32, eb, eb / unit_roundoff(FT_BF16), wn, gl,
                   gl / unit_roundoff(FT_BF16));
            CHECKF(eb <= 25 * unit_roundoff(FT_BF16), "%s bf16 gradient rel err %.3g (%s)", mn, eb, wn);
            CHECKF(gl <= 8 * unit_roundoff(FT_BF16), "%s bf16 gradient vector rel err %.3g", mn, gl);
            CHECKF(eb > 1e-5, "%s: the bf16 gradients show no rounding", mn);
            double eh = grads_err(th, t32, wn, sizeof wn, &gl);
            printf("  %s f16 vs f32: summed loss %.6f, gradient rel err: worst tensor %.2e = %.1fu (%s), "
                   "whole vector %.2e = %.1fu\n", mn, lhf, eh, eh / unit_roundoff(FT_F16), wn, gl,
                   gl / unit_roundoff(FT_F16));
            CHECKF(eh <= 25 * unit_roundoff(FT_F16), "%s f16 gradient rel err %.3g (%s)", mn, eh, wn);
            CHECKF(gl <= 8 * unit_roundoff(FT_F16), "%s f16 gradient vector rel err %.3g", mn, gl);
            /* both losses: the mean cross-entropy moves by ~u/10 */
            CHECKF(fabs(lbf - l32) <= unit_roundoff(FT_BF16) * fabs(l32), "%s bf16 loss %.6f vs %.6f", mn, lbf, l32);
            double ec = grads_err(tb32, tb, wn, sizeof wn, &gl);
            printf("  %s bf16 on the f32 model vs the model converted at load: loss %.9g vs %.9g, rel err %.2e\n", mn,
                   lb32, lbf, ec);
            CHECKF(ec <= 1e-4, "%s: conversion at load differs from rounding in the products: %.3g (%s)", mn, ec, wn);
        }
        ft_trainer_free(t32); ft_trainer_free(tb); ft_trainer_free(tb32); ft_trainer_free(th);
    }
    /* an f32 trainer on a model whose weights were rounded at load is refused */
    ft_train_opts o;
    ft_train_opts_default(&o);
    ft_trainer *tr = NULL;
    CHECK(ft_trainer_new(&tr, mb, &o) == FTUNE_ERR_ARG && !tr);
    CHECK(strstr(ftune_last_error(), "loaded for compute dtype bf16"));
    ftune_model_free(m32); ftune_model_free(mb); ftune_model_free(mh);
}

/* Full fine-tuning in bf16 holds compute copies of the Linears' masters:
 * after two AdamW steps (each refreshing them) and an eval, values, loss
 * and gradients equal those of reading the masters rounded in the
 * products (no_compute_copies), to the same 1e-4 as above (measured
 * bit-identical); the copies are in the plan and counted as weights. */
static void test_full_compute_copies(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    grad_batch gb;
    make_batch(&gb, 2, 16, m->cfg.V);
    ft_trainer *tr[2] = { NULL, NULL };
    ft_param *ps[2] = { NULL, NULL };
    ft_adamw opt[2];
    double loss[2] = { 0, 0 }, vloss[2] = { 0, 0 };
    for (int k = 0; k < 2; k++) {
        ft_train_opts o;
        ft_train_opts_default(&o);
        o.mode = FT_TRAIN_FULL; o.max_B = 2; o.max_T = 16; o.n_threads = 2; o.compute = FT_BF16;
        o.no_compute_copies = k == 1;
        size_t w0 = ft_mem_current(FT_MEM_WEIGHTS);
        CHECK_OK(ft_trainer_new(&tr[k], m, &o));
        if (!tr[k]) break;
        const ft_train_plan *pl = ft_trainer_get_plan(tr[k]);
        CHECK(k == 1 ? pl->copy_bytes == 0 : pl->copy_bytes >= (size_t)2 * (m->n_params - 2 * m->cfg.V * m->cfg.C));
        CHECK(ft_mem_current(FT_MEM_WEIGHTS) - w0 == pl->copy_bytes);
        int np;
        CHECK_OK(ft_trainer_optim_params(tr[k], false, &ps[k], &np, NULL));
        ft_adamw_cfg ac;
        ft_adamw_defaults(&ac);
        CHECK_OK(ft_adamw_init(&opt[k], ps[k], np, &ac));
        for (int step = 0; step < 2; step++) {
            ft_trainer_zero_grad(tr[k]);
            CHECK_OK(ft_trainer_step(tr[k], &gb.b, gb.b.n_targets, &loss[k]));
            ft_trainer_adamw_step(tr[k], &opt[k], 1e-3);
        }
        int64_t nt;
        CHECK_OK(ft_trainer_eval(tr[k], &gb.b, &vloss[k], &nt));
    }
    if (tr[0] && tr[1]) {
        char wn[160] = "";
        double gl, e = grads_err(tr[0], tr[1], wn, sizeof wn, &gl);
        int64_t n;
        const float *v0 = ft_trainer_values(tr[0], &n), *v1 = ft_trainer_values(tr[1], NULL);
        double ev = norm_err(v0, v1, (size_t)n);
        printf("  full bf16, compute copies vs masters rounded in the products, after 2 steps: loss %.9g vs %.9g, "
               "eval %.9g vs %.9g, gradient rel err %.2e, values %.2e\n", loss[0], loss[1], vloss[0], vloss[1], e, ev);
        CHECKF(e <= 1e-4 && ev <= 1e-4 && fabs(vloss[0] - vloss[1]) <= 1e-4 * fabs(vloss[1]), "%.3g %.3g", e, ev);
    }
    for (int k = 0; k < 2; k++) {
        if (ps[k]) { ft_adamw_free(&opt[k]); free(ps[k]); }
        ft_trainer_free(tr[k]);
    }
    ftune_model_free(m);
}

/* Where the weights are held for a compute type: f32 matrices converted to
 * owned bf16 copies (exactly the matrices' bytes in bf16 more owned than an
 * f32 load), a model stored in bf16 left mapped (no more owned bytes than
 * in f32: only the f32 copies of its vectors), f16 converted to bf16,
 * q8_0 left quantized; the tied head follows the embedding. */
static char tmpdir[256];
static void test_weights_held(void) {
    ftune_load_opts lb = { .dtype = "bf16" };
    ftune_model *m32 = NULL, *mb = NULL;
    CHECK_OK(ftune_model_load(&m32, stories_hf, NULL));
    CHECK_OK(ftune_model_load(&mb, stories_hf, &lb));
    if (m32 && mb) {
        size_t want = 0;
        want += (size_t)ft_dtype_nbytes(FT_BF16, ft_tensor_numel(&m32->tok_embd));
        for (int l = 0; l < m32->cfg.L; l++)
            for (int k = 0; k < FT_N_MODS; k++)
                want += (size_t)ft_dtype_nbytes(FT_BF16, ft_tensor_numel(&ft_layer_linear(&m32->layers[l], k)->w));
        if (!m32->cfg.tied) want += (size_t)ft_dtype_nbytes(FT_BF16, ft_tensor_numel(&m32->lm_head.w));
        printf("  stories260K f32 -> bf16: %zu bytes of owned copies (f32 load: %zu), expected %zu more\n",
               mb->owned_bytes, m32->owned_bytes, want);
        CHECK(mb->owned_bytes == m32->owned_bytes + want);
        CHECK(!mb->cfg.tied || (mb->lm_head.w.data == mb->tok_embd.data && mb->lm_head.w.dtype == FT_BF16));
    }
    ftune_model_free(mb);
    const char *stored[3] = { "bf16", "f16", "q8_0" };
    for (int i = 0; i < 3; i++) {
        char dir[400], path[420];
        snprintf(dir, sizeof dir, "%s/stored_%s", tmpdir, stored[i]);
        if (i < 2) {
            CHECK_OK(ftune_init_model(dir, "stories260K", NULL, stored[i], 3, 0));
            snprintf(path, sizeof path, "%s", dir);
        } else {
            snprintf(path, sizeof path, "%s.gguf", dir);
            CHECK_OK(ftune_model_save_merged(m32, path, "q8_0"));
        }
        ftune_model *a = NULL, *b = NULL;
        CHECK_OK(ftune_model_load(&a, path, NULL));
        CHECK_OK(ftune_model_load(&b, path, &lb));
        if (a && b) {
            /* q8_0's GGUF keeps matrices whose rows are not whole blocks (w_down: 172 columns) in f32 */
            ft_dtype held = i < 2 ? FT_BF16 : FT_Q8_0;
            bool converted = i == 1;
            CHECK(b->layers[1].w_up.w.dtype == held && b->layers[0].wq.w.dtype == held);
            CHECK(b->layers[0].w_down.w.dtype == FT_BF16);
            size_t want = 0; /* bf16 bytes of the matrices stored in another float type */
            for (int l = 0; l < a->cfg.L; l++)
                for (int k = 0; k < FT_N_MODS; k++) {
                    const ft_tensor *t = &ft_layer_linear(&a->layers[l], k)->w;
                    if (t->dtype == FT_F32 || t->dtype == FT_F16) want += (size_t)ft_dtype_nbytes(FT_BF16, ft_tensor_numel(t));
                }
            if (a->tok_embd.dtype == FT_F32 || a->tok_embd.dtype == FT_F16)
                want += (size_t)ft_dtype_nbytes(FT_BF16, ft_tensor_numel(&a->tok_embd));
            printf("  stored %s, loaded for bf16: wq %s, w_down %s, owned %zu bytes (in f32: %zu; %zu expected more)\n",
                   stored[i], ft_types[b->layers[0].wq.w.dtype].name, ft_types[b->layers[0].w_down.w.dtype].name,
                   b->owned_bytes, a->owned_bytes, want);
            CHECK(b->owned_bytes == a->owned_bytes + want);
            /* left mapped: in none of the model's owned buffers */
            const uint8_t *w = b->layers[0].wq.w.data;
            bool owned = false;
            for (int k = 0; k < b->n_owned; k++) {
                const uint8_t *o = b->owned[k].p;
                owned |= b->owned[k].counted && w >= o && w < o + b->owned[k].n;
            }
            CHECK(owned == converted);
        }
        ftune_model_free(a); ftune_model_free(b);
    }
    ftune_model_free(m32);
    /* the f32 file's pages of a converted matrix leave the resident set.
     * Measured on a made-up model whose matrices are 1-3 MiB: around each
     * vector, the header and every tensor boundary the kernel maps a whole
     * page-cache folio or fault-around window (16-64 KiB and more on recent
     * kernels), which on stories260K's 16 KiB matrices was 15% to 36% of
     * the mapping from one run to the next; here it is a few percent.
     * 25% is the bound, a mapping left resident is 100%. */
    char cfg[440], big[420];
    snprintf(cfg, sizeof cfg, "%s/big_config.json", tmpdir);
    snprintf(big, sizeof big, "%s/big", tmpdir);
    FILE *f = fopen(cfg, "w");
    CHECK(f && fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 512,"
                     " \"intermediate_size\": 1536, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                     " \"num_key_value_heads\": 8, \"vocab_size\": 1024, \"max_position_embeddings\": 256,"
                     " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000, \"tie_word_embeddings\": false,"
                     " \"hidden_act\": \"silu\", \"torch_dtype\": \"float32\"}\n", f) >= 0);
    if (f) CHECK(fclose(f) == 0);
    CHECK_OK(ftune_init_model(big, NULL, cfg, "f32", 4, 0));
    CHECK_OK(ftune_model_load(&mb, big, &lb));
    if (mb) {
        size_t mapped = ft_mem_mapped(), res = ft_mem_mapped_resident();
        printf("  bf16 load of an f32 file (%.1f MiB): %zu of %zu mapped bytes resident\n", mapped / 1048576.0, res,
               mapped);
        CHECK(mapped > 0 && (res == 0 || res < mapped / 4)); /* 0: smaps unreadable here */
        /* and the memory plan reads only the vectors from the mapping */
        ft_mem_table t = { 0 };
        ft_model_mem_plan(mb, &t);
        printf("  planned mapped bytes %zu of %lld as stored\n", t.planned[FT_MEM_ROW_MAPPED], (long long)mb->weight_bytes);
        CHECK(t.planned[FT_MEM_ROW_MAPPED] < (size_t)mb->weight_bytes / 100 && t.planned[FT_MEM_WEIGHTS] == mb->owned_bytes);
    }
    ftune_model_free(mb);
}

/* ln1, ln2 and the attention output saved in bf16/f16 instead of f32:
 * every gradient is the same to the bit (they feed only products, which
 * round them; LoRA's dropout acts on the rounded input both ways), LoRA
 * with dropout and full fine-tuning, and the activations take less. */
static void test_saved_acts_in_compute_type(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    grad_batch gb;
    make_batch(&gb, 2, 24, m->cfg.V);
    ft_dtype cs[2] = { FT_BF16, FT_F16 };
    for (int ci = 0; ci < 2; ci++)
        for (int mode = 0; mode < 2; mode++) {
            ft_trainer *tr[2] = { NULL, NULL };
            double loss[2] = { 0, 0 };
            size_t acts[2] = { 0, 0 };
            for (int k = 0; k < 2; k++) {
                ft_train_opts o;
                ft_train_opts_default(&o);
                o.mode = mode ? FT_TRAIN_FULL : FT_TRAIN_LORA; o.lora.r = 4; o.lora.dropout = 0.1f; o.lora.seed = 9;
                o.max_B = 2; o.max_T = 24; o.n_threads = 2; o.compute = cs[ci]; o.f32_acts = k == 1;
                CHECK_OK(ft_trainer_new(&tr[k], m, &o));
                if (!tr[k]) break;
                acts[k] = ft_trainer_get_plan(tr[k])->activation_bytes;
                if (!mode) {
                    ft_rng r;
                    ft_rng_seed(&r, 78);
                    for (int i = 1; i < ft_trainer_n_params(tr[k]); i += 2) {
                        const ft_param *p = &ft_trainer_param(tr[k], i)->opt;
                        for (int64_t j = 0; j < p->numel; j++) p->data[j] = 0.05f * ft_rng_normal(&r);
                    }
                }
                ft_trainer_zero_grad(tr[k]);
                CHECK_OK(ft_trainer_step(tr[k], &gb.b, gb.b.n_targets, &loss[k]));
            }
            if (tr[0] && tr[1]) {
                int64_t n;
                const float *g0 = ft_trainer_grads(tr[0], &n), *g1 = ft_trainer_grads(tr[1], NULL);
                bool same = loss[0] == loss[1] && memcmp(g0, g1, (size_t)n * sizeof(float)) == 0;
                printf("  %s %s: ln1/ln2/atty saved in %s: activations %zu bytes (f32: %zu), gradients %s\n",
                       ft_types[cs[ci]].name, mode ? "full" : "LoRA, dropout 0.1", ft_types[cs[ci]].name, acts[0],
                       acts[1], same ? "bit-identical" : "DIFFER");
                CHECK(same);
                CHECK(acts[0] < acts[1]);
            }
            ft_trainer_free(tr[0]); ft_trainer_free(tr[1]);
        }
    ftune_model_free(m);
}

int main(void) {
    ft_rng_seed(&rng, 0x31337);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune_test_mixed_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    RUN(test_linear_bf16_f16);
    RUN(test_lora_bf16_f16);
    RUN(test_embedding_rounding);
    RUN(test_model_grads_vs_f32);
    RUN(test_full_compute_copies);
    RUN(test_weights_held);
    RUN(test_saved_acts_in_compute_type);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
