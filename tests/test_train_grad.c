/* test_train_grad.c — the training step's loss and gradients against the
 * PyTorch float64 autograd reference (scripts/ref_grad.py): LoRA on all
 * seven targets and full fine-tuning (tied embedding) on stories260K, LoRA
 * over a BF16 Qwen2-shaped model with q/k/v biases and an untied head; the
 * GGUF (interleaved RoPE) model against the HF one; packing against
 * separate rows; gradient accumulation against one big batch; and the
 * LoRA-Linear backward against finite differences on awkward sizes. */
#include "ftune.h"
#include "nn/linear.h"
#include "model/model.h"
#include "ops/ops.h"
#include "formats/safetensors.h"
#include "train/train.h"
#include "check.h"

#include <stdint.h>
#include <unistd.h>

static char tmpdir[256];
static char stories_hf[512], stories_gguf[512];

static int run(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "  command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* max_i |a_i - b_i| / max(|b_i|, floor), float against a float64 reference */
static double rel_err_f64(const float *a, const double *b, int64_t n, double floor_) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), floor_);
        if (!(r <= m)) m = isnan(r) ? INFINITY : r;
    }
    return m;
}

static double max_abs_f64(const double *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(b[i]));
    return m;
}

/* ------------------------------------------------------------ batches */

typedef struct {
    int B, T;
    int32_t tokens[256];
    int targets[256], pos[256], doc[256];
} test_batch;

static ft_batch as_batch(test_batch *t, bool with_doc) {
    ft_batch b = { 0 };
    b.B = b.B_max = t->B;
    b.T = b.T_max = t->T;
    b.tokens = t->tokens;
    b.targets = t->targets;
    b.pos = t->pos;
    b.doc = with_doc ? t->doc : NULL;
    for (int i = 0; i < t->B * t->T; i++) b.n_targets += t->targets[i] >= 0;
    return b;
}

/* B rows of T pseudo-random tokens below V, targets the next token (the
 * last of a row and every 5th one ignored), positions 0..T-1. */
static void make_batch(test_batch *b, int B, int T, int V, uint32_t seed) {
    b->B = B;
    b->T = T;
    uint32_t x = seed * 2654435761u + 7;
    for (int r = 0; r < B; r++) {
        for (int t = 0; t < T; t++) {
            x = x * 1664525u + 1013904223u;
            b->tokens[r * T + t] = t == 0 ? 1 : (int32_t)((x >> 8) % (uint32_t)V);
            b->pos[r * T + t] = t;
            b->doc[r * T + t] = 0;
        }
        for (int t = 0; t < T; t++)
            b->targets[r * T + t] = t + 1 < T && (t % 5) != 3 ? b->tokens[r * T + t + 1] : -1;
    }
}

/* ------------------------------------------------------------ the reference */

/* Writes the batch (and, in LoRA mode, the adapter values) for ref_grad.py,
 * runs it, and opens its output. */
static bool run_ref(st_file *out, const char *model_dir, const char *tag, ft_trainer *tr, const test_batch *b,
                    bool with_doc, int64_t n_norm) {
    const ft_train_opts *o = ft_trainer_opts(tr);
    char in_path[512], out_path[512], cmd[2048], n_norm_s[32], r_s[16], alpha_s[32];
    snprintf(in_path, sizeof in_path, "%s/%s_in.safetensors", tmpdir, tag);
    snprintf(out_path, sizeof out_path, "%s/%s_out.safetensors", tmpdir, tag);
    int np = ft_trainer_n_params(tr);
    st_out_tensor *ts = calloc((size_t)np + 4, sizeof *ts);
    int n = 0;
    const char *bn[4] = { "tokens", "targets", "pos", "doc" };
    const void *bd[4] = { b->tokens, b->targets, b->pos, b->doc };
    for (int i = 0; i < (with_doc ? 4 : 3); i++)
        ts[n++] = (st_out_tensor){ .name = bn[i], .dtype = FT_I32, .ndim = 2, .shape = { b->B, b->T }, .data = bd[i] };
    if (o->mode == FT_TRAIN_LORA)
        for (int i = 0; i < np; i++) {
            const ft_param *p = &ft_trainer_param(tr, i)->opt;
            ts[n++] = (st_out_tensor){ .name = p->name, .dtype = FT_F32, .ndim = 2,
                                       .shape = { p->shape[0], p->shape[1] }, .data = p->data };
        }
    snprintf(n_norm_s, sizeof n_norm_s, "%lld", (long long)n_norm);
    snprintf(r_s, sizeof r_s, "%d", o->lora.r);
    snprintf(alpha_s, sizeof alpha_s, "%.9g", o->lora.alpha);
    const char *meta[] = { "mode", o->mode == FT_TRAIN_LORA ? "lora" : "full", "n_norm", n_norm_s, "r", r_s,
                           "alpha", alpha_s, "rslora", o->lora.rslora ? "1" : "0", NULL };
    ftune_status st = ft_st_write(in_path, ts, n, meta);
    free(ts);
    CHECK_OK(st);
    if (st) return false;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/ref_grad.py --model %s --in %s --out %s", model_dir, in_path,
             out_path);
    if (run(cmd) != 0) return false;
    st = ft_st_open(out, out_path);
    CHECK_OK(st);
    return st == FTUNE_OK;
}

static const double *ref_tensor(const st_file *f, const char *name, int64_t numel) {
    const st_tensor *t = ft_st_find(f, name);
    if (!t || t->dtype != FT_F64 || (int64_t)(t->end - t->begin) != numel * 8) {
        fprintf(stderr, "  reference has no F64 tensor %s of %lld elements\n", name, (long long)numel);
        return NULL;
    }
    return (const double *)t->data;
}

/* Gives every lora_B small random values, so gradients reach lora_A too. */
static void randomise_lora_B(ft_trainer *tr, uint64_t seed) {
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int i = 0; i < ft_trainer_n_params(tr); i++) {
        const ft_param *p = &ft_trainer_param(tr, i)->opt;
        if (strstr(p->name, "lora_B"))
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = 0.1f * ft_rng_normal(&rng);
    }
}

/* Runs one step and compares the loss and every trainable gradient (or the
 * ones whose name contains `only`) with the reference. Returns the worst
 * gradient error; *loss_err gets the loss's. */
static double compare_step(const char *model_dir, const char *tag, ft_trainer *tr, test_batch *tb, bool with_doc,
                           double floor_frac, double *loss_err, char *worst_name_out) {
    ft_batch b = as_batch(tb, with_doc);
    int64_t n_norm = b.n_targets + 3; /* not the batch's own count: the divisor must be the one given */
    double loss = 0;
    ft_trainer_zero_grad(tr);
    CHECK_OK(ft_trainer_step(tr, &b, n_norm, &loss));
    st_file ref = { 0 };
    double worst = INFINITY;
    *loss_err = INFINITY;
    if (!run_ref(&ref, model_dir, tag, tr, tb, with_doc, n_norm)) return worst;
    const double *rl = ref_tensor(&ref, "loss_sum", 1);
    if (rl) *loss_err = fabs(loss - rl[0]) / fabs(rl[0]);
    worst = 0;
    for (int i = 0; i < ft_trainer_n_params(tr); i++) {
        const ft_param *p = &ft_trainer_param(tr, i)->opt;
        const double *g = ref_tensor(&ref, p->name, p->numel);
        if (!g) { worst = INFINITY; continue; }
        /* the floor: a fraction of the tensor's largest gradient */
        double e = rel_err_f64(p->grad, g, p->numel, floor_frac * max_abs_f64(g, p->numel));
        if (e > worst) {
            worst = e;
            if (worst_name_out) snprintf(worst_name_out, 128, "%s", p->name);
        }
    }
    printf("  %s: loss %.6f (rel err %.2e), worst gradient rel err %.2e\n", tag, loss, *loss_err, worst);
    ft_st_close(&ref);
    return worst;
}

/* Loss to 1e-5: float32 forward through 5 blocks and a 512-way softmax,
 * summed in double, is good to a few 1e-7; 1e-5 leaves room for
 * accumulation order without hiding a wrong term (those change the loss at
 * 1e-3 or more). */
#define LOSS_TOL 1e-5
/* Gradients: float32 against float64 through 5 blocks of backward. The
 * float32 result differs from the exact one by ~1e-6 of the tensor's
 * largest gradient (measured: at most 4.3e-6; two float32 runs that only
 * sum in another order, as in the packing test, differ as much), so
 * elements far below the largest carry a large *relative* error that is
 * rounding, not a bug. Hence the error of each element is taken relative to
 * max(|ref|, 0.1 · max|ref|); measured worst: 3.8e-5 (LoRA), 1.7e-5
 * (full). 2e-4 leaves 5x for other BLAS kernels and thread counts, and a
 * missing or misplaced term gives errors of order 1. */
#define GRAD_TOL 2e-4
#define GRAD_FLOOR 0.1

static void test_lora_all_targets_vs_torch(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.lora.r = 4; o.lora.alpha = 8; o.max_B = 2; o.max_T = 24; o.lora.seed = 11; o.n_threads = 2;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (!tr) { ftune_model_free(m); return; }
    CHECK(ft_trainer_n_params(tr) == 5 * 7 * 2);
    {
        ft_lora *a = ft_trainer_lora(tr, 2, 5); /* layer 2 up_proj: the 2·(2·7+5)-th parameter */
        const ft_train_param *p = ft_trainer_param(tr, 2 * (2 * 7 + 5));
        CHECK(a && p && a->A == p->opt.data && a->dA == p->opt.grad);
        CHECK(a && a->base.hp->r == 4 && ft_lora_scale_of(a) == 2.0f);
        CHECK(p && strcmp(p->opt.name, "base_model.model.model.layers.2.mlp.up_proj.lora_A.weight") == 0);
        CHECK(!ft_trainer_lora(tr, 5, 0) && !ft_trainer_lora(tr, 0, 7));
    }
    randomise_lora_B(tr, 5);
    test_batch tb;
    make_batch(&tb, 2, 24, m->cfg.V, 3);
    double le, worst;
    char wn[128] = "";
    worst = compare_step(stories_hf, "lora7", tr, &tb, false, GRAD_FLOOR, &le, wn);
    CHECKF(le <= LOSS_TOL, "loss rel err %.3g", le);
    CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g (%s)", worst, wn);
    ft_trainer_free(tr);
    /* rsLoRA and a subset of targets */
    o.lora.rslora = true; o.lora.targets = FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_V) | FT_MOD_BIT(FT_MOD_DOWN); o.lora.r = 3; o.lora.alpha = 5;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (tr) {
        CHECK(ft_trainer_n_params(tr) == 5 * 3 * 2);
        randomise_lora_B(tr, 6);
        worst = compare_step(stories_hf, "lora_rs", tr, &tb, false, GRAD_FLOOR, &le, wn);
        CHECKF(le <= LOSS_TOL, "loss rel err %.3g", le);
        CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g (%s)", worst, wn);
    }
    ft_trainer_free(tr);
    ftune_model_free(m);
}

static void test_full_vs_torch(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = FT_TRAIN_FULL; o.max_B = 2; o.max_T = 24; o.n_threads = 2;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (tr) {
        /* tied: no lm_head.weight; the embedding takes both contributions */
        CHECK(ft_trainer_find_param(tr, "lm_head.weight") < 0);
        CHECK(ft_trainer_find_param(tr, "model.embed_tokens.weight") == 0);
        int64_t n;
        ft_trainer_values(tr, &n);
        CHECKF(n == m->n_params, "%lld trainable floats, model has %lld parameters", (long long)n,
               (long long)m->n_params);
        test_batch tb;
        make_batch(&tb, 2, 24, m->cfg.V, 4);
        double le;
        char wn[128] = "";
        double worst = compare_step(stories_hf, "full", tr, &tb, false, GRAD_FLOOR, &le, wn);
        CHECKF(le <= LOSS_TOL, "loss rel err %.3g", le);
        CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g (%s)", worst, wn);
    }
    ft_trainer_free(tr);
    ftune_model_free(m);
}

/* BF16 base weights (backward dequantizes tiles), q/k/v biases, an untied
 * 50257-row head, GQA: LoRA on all targets, and full mode's bias grads. */
static void test_qwen2_bf16_vs_torch(void) {
    char dir[512], cmd[1024];
    snprintf(dir, sizeof dir, "%s/qwen2", tmpdir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/make_fixture.py --kind qwen2 --out %s", dir);
    CHECK(run(cmd) == 0);
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, dir, NULL));
    if (!m) return;
    CHECK(m->layers[0].wq.w.dtype == FT_BF16 && m->cfg.qkv_bias && !m->cfg.tied);
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.lora.r = 5; o.lora.alpha = 7; o.max_B = 2; o.max_T = 12; o.lora.seed = 2; o.n_threads = 2;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    test_batch tb;
    make_batch(&tb, 2, 12, m->cfg.V, 9);
    double le, worst;
    char wn[128] = "";
    if (tr) {
        randomise_lora_B(tr, 8);
        worst = compare_step(dir, "qwen2_lora", tr, &tb, false, GRAD_FLOOR, &le, wn);
        CHECKF(le <= LOSS_TOL, "loss rel err %.3g", le);
        CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g (%s)", worst, wn);
    }
    ft_trainer_free(tr);
    tr = NULL;
    o.mode = FT_TRAIN_FULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (tr) {
        CHECK(ft_trainer_find_param(tr, "lm_head.weight") >= 0);
        CHECK(ft_trainer_find_param(tr, "model.layers.1.self_attn.k_proj.bias") >= 0);
        worst = compare_step(dir, "qwen2_full", tr, &tb, false, GRAD_FLOOR, &le, wn);
        CHECKF(le <= LOSS_TOL, "loss rel err %.3g", le);
        CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g (%s)", worst, wn);
    }
    ft_trainer_free(tr);
    ftune_model_free(m);
}

/* The GGUF file stores q/k rows permuted for interleaved RoPE, and its head
 * as a separate copy of the embedding: the loss, the gradients of the
 * tensors that are not permuted, and the HF (tied) embedding's gradient
 * against the GGUF embedding's + head's must match. */
static void test_gguf_matches_hf(void) {
    ftune_model *mh = NULL, *mg = NULL;
    CHECK_OK(ftune_model_load(&mh, stories_hf, NULL));
    CHECK_OK(ftune_model_load(&mg, stories_gguf, NULL));
    if (!mh || !mg) { ftune_model_free(mh); ftune_model_free(mg); return; }
    CHECK(mg->cfg.rope_interleaved && !mh->cfg.rope_interleaved);
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = FT_TRAIN_FULL; o.max_B = 2; o.max_T = 32; o.n_threads = 2;
    ft_trainer *th = NULL, *tg = NULL;
    CHECK_OK(ft_trainer_new(&th, mh, &o));
    CHECK_OK(ft_trainer_new(&tg, mg, &o));
    if (th && tg) {
        test_batch tb;
        make_batch(&tb, 2, 32, mh->cfg.V, 5);
        ft_batch b = as_batch(&tb, false);
        double lh, lg;
        CHECK_OK(ft_trainer_step(th, &b, b.n_targets, &lh));
        CHECK_OK(ft_trainer_step(tg, &b, b.n_targets, &lg));
        double le = fabs(lh - lg) / fabs(lh);
        /* the same float32 computation with pairs rotated in another order:
         * only summation order differs */
        CHECKF(le <= LOSS_TOL, "HF loss %.8f, GGUF loss %.8f", lh, lg);
        double worst = 0;
        for (int i = 0; i < ft_trainer_n_params(th); i++) {
            if (ft_trainer_param(th, i)->target >= 0) continue; /* q/k rows are permuted in the GGUF */
            const ft_param *p = &ft_trainer_param(th, i)->opt;
            int j = ft_trainer_find_param(tg, p->name);
            CHECK(j >= 0);
            if (j < 0) continue;
            const ft_param *q = &ft_trainer_param(tg, j)->opt;
            float *g = malloc((size_t)p->numel * sizeof(float));
            memcpy(g, q->grad, (size_t)p->numel * sizeof(float));
            int h = ft_trainer_find_param(tg, "lm_head.weight");
            CHECK(h >= 0);
            if (i == 0 && h >= 0) /* the tied embedding gets both contributions */
                for (int64_t k = 0; k < p->numel; k++) g[k] += ft_trainer_param(tg, h)->opt.grad[k];
            float mx = 0;
            for (int64_t k = 0; k < p->numel; k++) mx = fmaxf(mx, fabsf(p->grad[k]));
            double e = check_max_rel_err(g, p->grad, p->numel, GRAD_FLOOR * mx);
            free(g);
            if (e > worst) worst = e;
        }
        printf("  gguf vs hf: loss rel err %.2e, embedding/norm gradients rel err %.2e\n", le, worst);
        /* two float32 computations differing in summation order: see GRAD_TOL */
        CHECKF(worst <= GRAD_TOL, "gradient rel err %.3g", worst);
        double ev;
        int64_t nt;
        CHECK_OK(ft_trainer_eval(tg, &b, &ev, &nt));
        CHECK(nt == b.n_targets);
        CHECKF(fabs(ev - lg) <= 1e-6 * fabs(lg), "eval %.8f, step %.8f", ev, lg);
    }
    ft_trainer_free(th);
    ft_trainer_free(tg);
    ftune_model_free(mh);
    ftune_model_free(mg);
}

/* Grads of a LoRA trainer as one flat copy. */
static float *grads_copy(ft_trainer *tr, int64_t *n) {
    float *g = ft_trainer_grads(tr, n);
    float *c = malloc((size_t)*n * sizeof(float));
    memcpy(c, g, (size_t)*n * sizeof(float));
    return c;
}

static void copy_values(ft_trainer *dst, ft_trainer *src) {
    int64_t n, m;
    float *d = ft_trainer_values(dst, &n), *s = ft_trainer_values(src, &m);
    if (n == m) memcpy(d, s, (size_t)n * sizeof(float));
}

/* Two documents packed into one row (positions reset, doc ids) give the
 * loss and LoRA gradients of the two run as separate rows. */
static void test_packed_equals_separate(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.lora.r = 4; o.lora.alpha = 4; o.max_B = 2; o.max_T = 24; o.n_threads = 2;
    ft_trainer *tp = NULL, *ts = NULL;
    CHECK_OK(ft_trainer_new(&tp, m, &o));
    CHECK_OK(ft_trainer_new(&ts, m, &o));
    if (tp && ts) {
        randomise_lora_B(tp, 1);
        copy_values(ts, tp);
        test_batch docs;
        make_batch(&docs, 2, 12, m->cfg.V, 21);
        int len[2] = { 10, 12 };
        test_batch packed = { .B = 1, .T = 24 }, sep = { .B = 2, .T = 12 };
        int at = 0;
        for (int d = 0; d < 2; d++)
            for (int t = 0; t < len[d]; t++, at++) {
                packed.tokens[at] = docs.tokens[d * 12 + t];
                packed.targets[at] = t + 1 < len[d] ? docs.tokens[d * 12 + t + 1] : -1;
                packed.pos[at] = t;
                packed.doc[at] = d;
            }
        for (; at < 24; at++) { /* padding: its own document, no targets */
            packed.tokens[at] = 0; packed.targets[at] = -1; packed.pos[at] = 0; packed.doc[at] = -1;
        }
        for (int d = 0; d < 2; d++)
            for (int t = 0; t < 12; t++) {
                int i = d * 12 + t;
                bool in = t < len[d];
                sep.tokens[i] = in ? docs.tokens[i] : 0;
                sep.targets[i] = in && t + 1 < len[d] ? docs.tokens[i + 1] : -1;
                sep.pos[i] = t;
                sep.doc[i] = 0;
            }
        ft_batch bp = as_batch(&packed, true), bs = as_batch(&sep, false);
        CHECK(bp.n_targets == bs.n_targets);
        double lp, ls;
        CHECK_OK(ft_trainer_step(tp, &bp, bp.n_targets, &lp));
        CHECK_OK(ft_trainer_step(ts, &bs, bs.n_targets, &ls));
        int64_t n;
        float *gp = grads_copy(tp, &n), *gs = grads_copy(ts, &n);
        float mx = 0;
        for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(gs[i]));
        double e = check_max_rel_err(gp, gs, n, GRAD_FLOOR * mx);
        printf("  packed vs separate: loss %.7f vs %.7f, gradient rel err %.2e\n", lp, ls, e);
        /* the same float32 arithmetic except the GEMM shapes (1 x 24 rows
         * against 2 x 12), hence summation order: rounding, as in GRAD_TOL
         * (measured 7e-8 on the loss, 9.4e-6 on the gradients) */
        CHECKF(fabs(lp - ls) <= 1e-6 * fabs(ls), "packed %.8f, separate %.8f", lp, ls);
        CHECKF(e <= 1e-4, "gradient rel err %.3g", e);
        free(gp);
        free(gs);
    }
    ft_trainer_free(tp);
    ft_trainer_free(ts);
    ftune_model_free(m);
}

/* Accumulating two micro-batches normalised by their total target count
 * gives the gradient of one batch holding both. */
static void test_accumulation_equals_big_batch(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.lora.r = 2; o.lora.alpha = 3; o.max_B = 2; o.max_T = 16; o.n_threads = 2;
    o.lora.targets = FT_MOD_BIT(FT_MOD_K) | FT_MOD_BIT(FT_MOD_O) | FT_MOD_BIT(FT_MOD_UP);
    ft_trainer *tb_ = NULL, *ta = NULL;
    CHECK_OK(ft_trainer_new(&tb_, m, &o));
    o.max_B = 1;
    CHECK_OK(ft_trainer_new(&ta, m, &o));
    if (tb_ && ta) {
        randomise_lora_B(tb_, 3);
        copy_values(ta, tb_);
        test_batch big, half[2];
        make_batch(&big, 2, 16, m->cfg.V, 31);
        big.targets[5] = -1; /* uneven target counts between the halves */
        for (int h = 0; h < 2; h++) {
            half[h].B = 1;
            half[h].T = 16;
            memcpy(half[h].tokens, big.tokens + h * 16, 16 * sizeof(int32_t));
            memcpy(half[h].targets, big.targets + h * 16, 16 * sizeof(int));
            memcpy(half[h].pos, big.pos + h * 16, 16 * sizeof(int));
        }
        ft_batch bb = as_batch(&big, false), b0 = as_batch(&half[0], false), b1 = as_batch(&half[1], false);
        CHECK(b0.n_targets != b1.n_targets && b0.n_targets + b1.n_targets == bb.n_targets);
        double lb, l0, l1;
        CHECK_OK(ft_trainer_step(tb_, &bb, bb.n_targets, &lb));
        ft_trainer_zero_grad(ta);
        CHECK_OK(ft_trainer_step(ta, &b0, bb.n_targets, &l0));
        CHECK_OK(ft_trainer_step(ta, &b1, bb.n_targets, &l1));
        int64_t n;
        float *ga = grads_copy(ta, &n), *gb = grads_copy(tb_, &n);
        float mx = 0;
        for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, fabsf(gb[i]));
        double e = check_max_rel_err(ga, gb, n, GRAD_FLOOR * mx);
        printf("  accumulated vs big batch: loss %.7f vs %.7f, gradient rel err %.2e\n", l0 + l1, lb, e);
        /* the same rows and arithmetic; only the GEMM shapes and the order
         * in which the two rows' contributions are added to dA/dB differ:
         * rounding (measured 2e-8 on the loss, 8.7e-6 on the gradients) */
        CHECKF(fabs(l0 + l1 - lb) <= 1e-6 * fabs(lb), "accumulated %.8f, big %.8f", l0 + l1, lb);
        CHECKF(e <= 1e-4, "gradient rel err %.3g", e);
        free(ga);
        free(gb);
    }
    ft_trainer_free(ta);
    ft_trainer_free(tb_);
    ftune_model_free(m);
}

/* ------------------------------------------------ LoRA-Linear vs finite differences */

/* L = sum(y ⊙ G) in double, y = ft_linear_forward_train(x). */
static double lin_loss(const ft_linear *l, const ft_adapter_inst *ad, const float *x, const float *G, int T, uint64_t seed, float *y, float *u,
                       float *scratch) {
    ft_linear_forward_train(y, u, x, l, ad, T, seed, 2, scratch);
    double s = 0;
    for (int i = 0; i < T * l->out; i++) s += (double)y[i] * G[i];
    return s;
}

/* L is linear in every single element of x, A, B and W (y is bilinear in
 * (A, B) but linear in each alone), so a central difference is exact up to
 * rounding for any step: a large step (0.5, exact in binary) keeps the
 * rounding of L (~1e-7 relative, summed in double from float y) small
 * against the change. */
static void fd_check(float *v, const float *grad, int64_t n, const ft_linear *l, const ft_adapter_inst *ad,
                     const float *x, const float *G, int T, uint64_t seed, float *y, float *u, float *scratch, const char *what) {
    const float h = 0.5f;
    double worst = 0, gmax = 0;
    for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(grad[i]));
    for (int64_t i = 0; i < n; i++) {
        float keep = v[i];
        v[i] = keep + h;
        double lp = lin_loss(l, ad, x, G, T, seed, y, u, scratch);
        v[i] = keep - h;
        double lm = lin_loss(l, ad, x, G, T, seed, y, u, scratch);
        v[i] = keep;
        double fd = (lp - lm) / (2 * h);
        double e = fabs(fd - grad[i]) / fmax(fabs(fd), 1e-2 * gmax);
        if (e > worst) worst = e;
    }
    /* float32 forward: L carries ~1e-6 relative rounding, divided by a
     * change of order |grad|·h; 1e-3 against the floor is far above that
     * and far below a wrong term */
    CHECKF(worst <= 1e-3, "%s: finite-difference rel err %.3g", what, worst);
}

static void test_lora_linear_finite_differences(void) {
    const int T = 5, IC = 37, OC = 13, R = 3; /* awkward sizes; 13 rows span no whole tile */
    ft_dtype types[] = { FT_F32, FT_BF16, FT_F16 };
    for (int ti = 0; ti < 3; ti++)
        for (int drop = 0; drop < 2; drop++) {
            ft_rng rng;
            ft_rng_seed(&rng, 100 + ti * 2 + drop);
            float *w32 = malloc(sizeof(float) * OC * IC), *bias = malloc(sizeof(float) * OC);
            void *wq = malloc((size_t)ft_dtype_nbytes(types[ti], (int64_t)OC * IC));
            float *x = malloc(sizeof(float) * T * IC), *G = malloc(sizeof(float) * T * OC);
            float *A = malloc(sizeof(float) * R * IC), *B = malloc(sizeof(float) * OC * R);
            float *dA = malloc(sizeof(float) * R * IC), *dB = malloc(sizeof(float) * OC * R);
            float *dw = calloc((size_t)OC * IC, sizeof(float)), *db = calloc(OC, sizeof(float));
            float *dx = malloc(sizeof(float) * T * IC), *y = malloc(sizeof(float) * T * OC);
            float *y2 = malloc(sizeof(float) * T * OC), *u = malloc(sizeof(float) * T * R);
            float *scratch = malloc(ft_linear_train_scratch_floats(IC, R, T, 2) * sizeof(float));
            for (int i = 0; i < OC * IC; i++) w32[i] = 0.3f * ft_rng_normal(&rng);
            for (int i = 0; i < OC; i++) bias[i] = ft_rng_normal(&rng);
            for (int i = 0; i < T * IC; i++) x[i] = ft_rng_normal(&rng);
            for (int i = 0; i < T * OC; i++) G[i] = ft_rng_normal(&rng);
            ft_types[types[ti]].from_f32(w32, wq, (int64_t)OC * IC);
            ft_lora a;
            ft_adapter_hparams hp = { .r = R, .alpha = 2.5f, .dropout = drop ? 0.3f : 0.0f };
            ft_lora_init(&a, &hp, A, B, dA, dB, IC, OC, &rng);
            for (int i = 0; i < OC * R; i++) B[i] = ft_rng_normal(&rng);
            ft_linear l = { .w = { .dtype = types[ti], .ndim = 2, .shape = { OC, IC }, .data = wq,
                                   .nbytes = (size_t)ft_dtype_nbytes(types[ti], (int64_t)OC * IC) },
                            .bias = bias, .in = IC, .out = OC };
            const ft_adapter_inst *ad = &a.base;
            uint64_t seed = 77;
            lin_loss(&l, ad, x, G, T, seed, y, u, scratch);
            /* dy = G; twice, to see that parameter grads accumulate */
            for (int rep = 0; rep < 2; rep++)
                ft_linear_backward(dx, types[ti] == FT_F32 ? dw : NULL, db, G, x, u, &l, ad, T, seed, false, 2, scratch);
            for (int i = 0; i < R * IC; i++) dA[i] *= 0.5f;
            for (int i = 0; i < OC * R; i++) dB[i] *= 0.5f;
            for (int i = 0; i < OC * IC; i++) dw[i] *= 0.5f;
            for (int i = 0; i < OC; i++) db[i] *= 0.5f;
            char what[64];
            const char *tn = ft_types[types[ti]].name;
            snprintf(what, sizeof what, "%s dropout=%d dA", tn, drop);
            fd_check(A, dA, R * IC, &l, ad, x, G, T, seed, y2, u, scratch, what);
            snprintf(what, sizeof what, "%s dropout=%d dB", tn, drop);
            fd_check(B, dB, OC * R, &l, ad, x, G, T, seed, y2, u, scratch, what);
            snprintf(what, sizeof what, "%s dropout=%d dx", tn, drop);
            fd_check(x, dx, T * IC, &l, ad, x, G, T, seed, y2, u, scratch, what);
            snprintf(what, sizeof what, "%s dropout=%d dbias", tn, drop);
            fd_check(bias, db, OC, &l, ad, x, G, T, seed, y2, u, scratch, what);
            if (types[ti] == FT_F32) { /* the base weight is trainable only in f32 */
                snprintf(what, sizeof what, "%s dropout=%d dw", tn, drop);
                fd_check((float *)wq, dw, OC * IC, &l, ad, x, G, T, seed, y2, u, scratch, what);
            }
            /* dx must accumulate on request */
            float *dx2 = malloc(sizeof(float) * T * IC);
            for (int i = 0; i < T * IC; i++) dx2[i] = 1.0f;
            ft_linear_backward(dx2, NULL, NULL, G, x, u, &l, ad, T, seed, true, 2, scratch);
            double e = 0;
            for (int i = 0; i < T * IC; i++) e = fmax(e, fabs(dx2[i] - 1.0f - dx[i]) / (1 + fabs(dx[i])));
            /* one float add onto 1: off by at most 2^-24 · (1 + |dx|) */
            CHECKF(e <= 1e-6, "accumulated dx off by %.3g", e);
            free(dx2);
            /* without dropout, the training forward is the inference forward and its reference */
            if (!drop) {
                ft_linear_forward(y2, x, &l, ad, T, 2, scratch);
                double e1 = check_max_rel_err(y2, y, T * OC, 1.0);
                float *yr = malloc(sizeof(float) * T * OC);
                ft_linear_forward_ref(yr, x, &l, ad, T);
                double e2 = check_max_rel_err(y, yr, T * OC, 1.0);
                free(yr);
                /* y is O(1) (unit inputs, weights ~0.3, 37 + 3 products): the
                 * same sgemm calls must agree to rounding (1e-6), and BLAS
                 * against the double-summed loop to 37 roundings (1e-5) */
                CHECKF(e1 <= 1e-6 && e2 <= 1e-5, "inference %.3g, reference %.3g", e1, e2);
            }
            free(w32); free(bias); free(wq); free(x); free(G); free(A); free(B); free(dA); free(dB); free(dw);
            free(db); free(dx); free(y); free(y2); free(u); free(scratch);
        }
}

/* Masks: the kept fraction is 1-p, kept values are scaled by 1/(1-p), the
 * same seed gives the same mask and another seed another. PEFT's init. */
static void test_dropout_and_init(void) {
    const int T = 50, IC = 200;
    float *x = malloc(sizeof(float) * T * IC), *a = malloc(sizeof(float) * T * IC), *b = malloc(sizeof(float) * T * IC);
    for (int i = 0; i < T * IC; i++) x[i] = 1.0f + (float)(i % 7);
    ft_lora_dropout(a, x, 0.25f, 5, T, IC, 2);
    ft_lora_dropout(b, x, 0.25f, 5, T, IC, 1);
    int kept = 0, scaled = 1;
    for (int i = 0; i < T * IC; i++) {
        if (a[i] != 0) { kept++; scaled &= fabsf(a[i] - x[i] / 0.75f) <= 1e-6f * a[i]; }
    }
    CHECK(memcmp(a, b, sizeof(float) * T * IC) == 0); /* independent of threads */
    CHECK(scaled);
    /* 10000 Bernoulli(0.75) draws: std 0.0043; 0.02 is more than 4 sigma */
    CHECKF(fabs(kept / 10000.0 - 0.75) < 0.02, "kept %d of 10000", kept);
    ft_lora_dropout(b, x, 0.25f, 6, T, IC, 2);
    CHECK(memcmp(a, b, sizeof(float) * T * IC) != 0);
    /* the row-interleaved masks are the plain ones: row t from its own
     * stream, element kept when ft_rng_uniform < 1 - p; T = 50 leaves a
     * partial block of rows, and 0.25 (keep·2^24 an integer) and 0.1, 0.05,
     * 0.3 (not) test both sides of the integer threshold; also in place */
    const float ps[] = { 0.25f, 0.1f, 0.05f, 0.3f, 0.999f };
    for (int k = 0; k < 5; k++) {
        float keep = 1.0f - ps[k], inv = 1.0f / keep;
        for (int t = 0; t < T; t++) {
            ft_rng r;
            ft_rng_seed(&r, 77 + (uint64_t)(t + 1) * FT_DROPOUT_ROW_STEP);
            for (int i = 0; i < IC; i++) b[t * IC + i] = ft_rng_uniform(&r) < keep ? x[t * IC + i] * inv : 0.0f;
        }
        ft_lora_dropout(a, x, ps[k], 77, T, IC, 2);
        CHECKF(memcmp(a, b, sizeof(float) * T * IC) == 0, "p %g: the masks differ from the per-row reference", ps[k]);
        memcpy(a, x, sizeof(float) * T * IC);
        ft_lora_dropout(a, a, ps[k], 77, T, IC, 1);
        CHECKF(memcmp(a, b, sizeof(float) * T * IC) == 0, "p %g: in place differs", ps[k]);
    }
    ft_lora l;
    ft_rng rng;
    ft_rng_seed(&rng, 1);
    float A[4 * 200], B[3 * 4];
    ft_adapter_hparams hp = { .r = 4, .alpha = 8 };
    ft_lora_init(&l, &hp, A, B, NULL, NULL, 200, 3, &rng);
    float mx = 0, sum = 0, bz = 0;
    for (int i = 0; i < 800; i++) { mx = fmaxf(mx, fabsf(A[i])); sum += A[i]; }
    for (int i = 0; i < 12; i++) bz = fmaxf(bz, fabsf(B[i]));
    /* U(-1/sqrt(200), 1/sqrt(200)): bound 0.0707; 800 draws fill it to
     * within 1%, and their mean is 0 within 3 sigma (0.0707/sqrt(3*800)*3) */
    CHECKF(mx <= 1 / sqrtf(200.0f) && mx > 0.99f / sqrtf(200.0f), "max |A| %g", mx);
    CHECKF(fabsf(sum / 800) < 0.0044f, "mean A %g", sum / 800);
    CHECK(bz == 0 && ft_lora_scale_of(&l) == 2.0f && ft_lora_scale(8, 4, true) == 4.0f);
    free(x); free(a); free(b);
}

/* Bad input is refused with a message, never a crash. */
static void test_bad_input(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.max_B = 1; o.max_T = 8; o.lora.r = 0;
    ft_trainer *tr = NULL;
    CHECK(ft_trainer_new(&tr, m, &o) == FTUNE_ERR_ARG && !tr);
    o.lora.r = 2; o.lora.dropout = 1.0f;
    CHECK(ft_trainer_new(&tr, m, &o) == FTUNE_ERR_ARG && !tr);
    o.lora.dropout = 0; o.lora.targets = 0;
    CHECK(ft_trainer_new(&tr, m, &o) == FTUNE_ERR_ARG && !tr);
    o.lora.targets = FT_MOD_ALL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    unsigned mask;
    CHECK_OK(ft_lora_targets_parse("q_proj,v,down", &mask));
    CHECK(mask == (FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_V) | FT_MOD_BIT(FT_MOD_DOWN)));
    CHECK(ft_lora_targets_parse("q,x", &mask) == FTUNE_ERR_ARG);
    if (tr) {
        test_batch tb;
        make_batch(&tb, 1, 8, m->cfg.V, 1);
        ft_batch b = as_batch(&tb, false);
        double loss;
        b.T = 9;
        CHECK(ft_trainer_step(tr, &b, 5, &loss) == FTUNE_ERR_ARG);
        b.T = 8;
        CHECK(ft_trainer_step(tr, &b, 0, &loss) == FTUNE_ERR_ARG);
        tb.tokens[3] = m->cfg.V;
        CHECK(ft_trainer_step(tr, &b, 5, &loss) == FTUNE_ERR_ARG);
        CHECK(strstr(ftune_last_error(), "column 3") != NULL);
        tb.tokens[3] = 1; tb.targets[2] = m->cfg.V;
        CHECK(ft_trainer_step(tr, &b, 5, &loss) == FTUNE_ERR_ARG);
    }
    ft_trainer_free(tr);
    ft_trainer_free(NULL);
    ftune_model_free(m);
}

/* Time per step on stories260K, B=4, T=64 (printed, not checked). */
static void test_step_time(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    for (int mode = 0; mode < 2; mode++) {
        ft_train_opts o;
        ft_train_opts_default(&o);
        o.mode = mode ? FT_TRAIN_FULL : FT_TRAIN_LORA;
        o.max_B = 4; o.max_T = 64; o.n_threads = 2;
        ft_trainer *tr = NULL;
        CHECK_OK(ft_trainer_new(&tr, m, &o));
        if (!tr) continue;
        static test_batch tb;
        make_batch(&tb, 4, 64, m->cfg.V, 2);
        ft_batch b = as_batch(&tb, false);
        double loss;
        CHECK_OK(ft_trainer_step(tr, &b, b.n_targets, &loss));
        int n = 10;
        double t0 = ft_time_s();
        for (int i = 0; i < n; i++) CHECK_OK(ft_trainer_step(tr, &b, b.n_targets, &loss));
        double dt = (ft_time_s() - t0) / n;
        ft_train_plan plan;
        CHECK_OK(ft_trainer_plan(&m->cfg, &o, &plan));
        printf("  %s step B=4 T=64: %.2f ms (%.0f tokens/s); activations %.1f MiB, scratch %.1f MiB, "
               "trainable %lld floats\n",
               mode ? "full" : "lora r=8 all targets", dt * 1e3, 256 / dt, plan.activation_bytes / 1048576.0,
               plan.scratch_bytes / 1048576.0, (long long)plan.n_trainable);
        CHECK(isfinite(loss));
        ft_trainer_free(tr);
    }
    ftune_model_free(m);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune_test_train_grad_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    check_data_path(stories_gguf, sizeof stories_gguf, "models/stories260K/stories260K.gguf");
    RUN(test_lora_linear_finite_differences);
    RUN(test_dropout_and_init);
    RUN(test_bad_input);
    RUN(test_lora_all_targets_vs_torch);
    RUN(test_full_vs_torch);
    RUN(test_qwen2_bf16_vs_torch);
    RUN(test_gguf_matches_hf);
    RUN(test_packed_equals_separate);
    RUN(test_accumulation_equals_big_batch);
    RUN(test_step_time);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    run(cmd);
    CHECK_EXIT();
}
