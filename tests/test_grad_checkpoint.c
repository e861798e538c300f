/* test_grad_checkpoint.c — gradient checkpointing (ft_train_opts.
 * grad_checkpoint = K) against the trainer without it on stories260K (5
 * blocks): K = 1, 2, 3 (which does not divide 5) and 5 (one segment), LoRA
 * with dropout on all seven targets and full fine-tuning, in f32, bf16 and
 * over NF4 bases, with a KV prefix in one case. Two accumulated micro-steps
 * (two sets of dropout masks) and an eval: every loss and every gradient
 * must be bit-identical (memcmp), since recomputing runs the same ops on
 * the same inputs with the same mask seeds. Also the activation plan
 * shrinks, K outside 0..L is refused with a message naming it, and the
 * public ftune_trainer passes the option on. */
#include "ftune.h"
#include "core/core.h"
#include "model/model.h"
#include "nn/block.h"
#include "train/train.h"
#include "check.h"

#include <stdint.h>

static char stories_hf[512];

typedef struct {
    int32_t tok[2 * 24];
    int tgt[2 * 24];
    ft_batch b;
} small_batch;

static void make_batch(small_batch *g, int B, int T, int V, uint64_t seed) {
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int i = 0; i < B * T; i++) g->tok[i] = (int32_t)(ft_rng_u32(&rng) % (uint32_t)(V - 1)) + 1;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) g->tgt[r * T + t] = t + 1 < T && t % 7 != 4 ? g->tok[r * T + t + 1] : -1;
    g->b = (ft_batch){ .B = B, .T = T, .B_max = B, .T_max = T, .tokens = g->tok, .targets = g->tgt };
    for (int i = 0; i < B * T; i++) g->b.n_targets += g->tgt[i] >= 0;
}

/* What one run produced: the two micro-steps' losses, the eval loss, and
 * every gradient (a copy of the flat array) and the prefix gradients. */
typedef struct {
    double loss[2], eval;
    float *grads;
    int64_t n;
    float *pdk, *pdv;         /* (L, P, NKV*HS) with a KV prefix, else NULL */
    size_t n_prefix;
    ft_train_plan plan;
} run_out;

typedef struct {
    const char *name;
    ft_train_mode mode;
    ft_dtype compute;
    const char *load_dtype, *quant;
    bool prefix;
} config;

static bool run(const ftune_model *m, const config *cf, int K, run_out *r) {
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = cf->mode; o.lora.r = 4; o.lora.alpha = 8; o.lora.dropout = 0.25f; o.lora.seed = 9;
    o.max_B = 2; o.max_T = 24; o.n_threads = 2; o.compute = cf->compute; o.grad_checkpoint = K;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (!tr) return false;
    r->plan = *ft_trainer_get_plan(tr);
    if (cf->mode == FT_TRAIN_LORA) { /* B = 0 at init would leave every dA zero */
        ft_rng rng;
        ft_rng_seed(&rng, 77);
        for (int i = 1; i < ft_trainer_n_params(tr); i += 2) {
            const ft_param *p = &ft_trainer_param(tr, i)->opt;
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = 0.05f * ft_rng_normal(&rng);
        }
    }
    const ft_config *c = &m->cfg;
    int P = 3, kvd = c->NKV * c->HS;
    float *pk = NULL, *pv = NULL;
    if (cf->prefix) {
        r->n_prefix = (size_t)c->L * P * kvd;
        pk = malloc(r->n_prefix * sizeof *pk);
        pv = malloc(r->n_prefix * sizeof *pv);
        r->pdk = calloc(r->n_prefix, sizeof *r->pdk);
        r->pdv = calloc(r->n_prefix, sizeof *r->pdv);
        ft_rng rng;
        ft_rng_seed(&rng, 5);
        for (int i = 0; i < c->L * P * kvd; i++) { pk[i] = ft_rng_normal(&rng); pv[i] = ft_rng_normal(&rng); }
        CHECK_OK(ft_trainer_set_kv_prefix(tr, pk, pv, P, r->pdk, r->pdv));
    }
    small_batch b1, b2;
    make_batch(&b1, 2, 24, c->V, 1);
    make_batch(&b2, 1, 17, c->V, 2); /* a smaller second micro-batch: the rows' stride changes */
    int64_t nt = b1.b.n_targets + b2.b.n_targets;
    ft_trainer_zero_grad(tr);
    CHECK_OK(ft_trainer_step(tr, &b1.b, nt, &r->loss[0]));
    CHECK_OK(ft_trainer_step(tr, &b2.b, nt, &r->loss[1]));
    int64_t n_eval;
    CHECK_OK(ft_trainer_eval(tr, &b1.b, &r->eval, &n_eval));
    const float *g = ft_trainer_grads(tr, &r->n);
    r->grads = malloc((size_t)r->n * sizeof *r->grads);
    memcpy(r->grads, g, (size_t)r->n * sizeof *g);
    ft_trainer_free(tr);
    free(pk);
    free(pv);
    return true;
}

/* The first gradient that differs in its bits, by parameter, or -1. */
static int64_t first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) return i;
    return -1;
}

static void check_config(const config *cf) {
    ftune_load_opts lo = { .dtype = cf->load_dtype, .quant = cf->quant };
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, &lo));
    if (!m) return;
    CHECK(m->cfg.L == 5);
    run_out ref = { 0 };
    if (!run(m, cf, 0, &ref)) { ftune_model_free(m); return; }
    int Ks[] = { 1, 2, 3, 5 };
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
        run_out r = { 0 };
        if (!run(m, cf, Ks[i], &r)) continue;
        CHECK(r.n == ref.n);
        int64_t d = first_diff(r.grads, ref.grads, r.n < ref.n ? r.n : ref.n);
        CHECKF(d < 0, "%s K=%d: gradient %lld is %.9g, without checkpointing %.9g", cf->name, Ks[i], (long long)d,
               d >= 0 ? r.grads[d] : 0.0, d >= 0 ? ref.grads[d] : 0.0);
        CHECKF(memcmp(r.loss, ref.loss, sizeof r.loss) == 0 && memcmp(&r.eval, &ref.eval, sizeof r.eval) == 0,
               "%s K=%d: losses %.17g %.17g eval %.17g vs %.17g %.17g %.17g", cf->name, Ks[i], r.loss[0], r.loss[1],
               r.eval, ref.loss[0], ref.loss[1], ref.eval);
        if (cf->prefix)
            CHECKF(memcmp(r.pdk, ref.pdk, r.n_prefix * sizeof *r.pdk) == 0 &&
                       memcmp(r.pdv, ref.pdv, r.n_prefix * sizeof *r.pdv) == 0,
                   "%s K=%d: the KV prefix gradients differ", cf->name, Ks[i]);
        /* the activation arena holds K blocks, not L: smaller for K < L,
         * the same for K = L (one segment: every block input is kept) */
        if (Ks[i] < m->cfg.L) CHECK(r.plan.activation_bytes < ref.plan.activation_bytes);
        else CHECK(r.plan.activation_bytes == ref.plan.activation_bytes);
        if (d < 0 && memcmp(r.loss, ref.loss, sizeof r.loss) == 0)
            printf("  %s K=%d: %lld gradients and 3 losses bit-identical; activations %.1f KiB (without: %.1f KiB)\n",
               cf->name, Ks[i], (long long)r.n, r.plan.activation_bytes / 1024.0, ref.plan.activation_bytes / 1024.0);
        free(r.grads); free(r.pdk); free(r.pdv);
    }
    free(ref.grads); free(ref.pdk); free(ref.pdv);
    ftune_model_free(m);
}

static void test_lora_f32(void) {
    check_config(&(config){ "LoRA f32", FT_TRAIN_LORA, FT_F32, NULL, NULL, false });
}
static void test_lora_f32_kv_prefix(void) {
    check_config(&(config){ "LoRA f32, KV prefix", FT_TRAIN_LORA, FT_F32, NULL, NULL, true });
}
static void test_full_f32(void) {
    check_config(&(config){ "full f32", FT_TRAIN_FULL, FT_F32, NULL, NULL, false });
}
static void test_lora_bf16(void) {
    check_config(&(config){ "LoRA bf16", FT_TRAIN_LORA, FT_BF16, "bf16", NULL, false });
}
static void test_full_bf16(void) {
    check_config(&(config){ "full bf16", FT_TRAIN_FULL, FT_BF16, "bf16", NULL, false });
}
static void test_lora_nf4(void) {
    check_config(&(config){ "LoRA nf4", FT_TRAIN_LORA, FT_F32, NULL, "nf4", false });
}

static void test_bad_k(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.max_T = 16;
    int bad[] = { -1, 6, 1000 };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.grad_checkpoint = bad[i];
        ft_trainer *tr = NULL;
        ft_train_plan pl;
        CHECK(ft_trainer_new(&tr, m, &o) == FTUNE_ERR_ARG && !tr);
        CHECKF(strstr(ftune_last_error(), "--grad-checkpoint") && strstr(ftune_last_error(), "1..5"), "%s",
               ftune_last_error());
        CHECK(ft_trainer_plan(&m->cfg, &o, &pl) == FTUNE_ERR_ARG);
    }
    ftune_model_free(m);
}

/* The public step-by-step trainer passes the option on: five optimizer
 * steps (dropout, AdamW) give the same loss bits with K = 2 and 3 as
 * without, and K = 6 is refused. */
static void test_public_trainer(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    double ref[5] = { 0 };
    int Ks[] = { 0, 2, 3 };
    for (size_t i = 0; i < sizeof Ks / sizeof Ks[0]; i++) {
        ftune_train_opts o;
        ftune_train_opts_default(&o);
        o.ctx = 24; o.batch_size = 2; o.n_threads = 2; o.lora_dropout = 0.2f; o.grad_checkpoint = Ks[i];
        ftune_trainer *t = NULL;
        CHECK_OK(ftune_trainer_new(&t, m, &o));
        if (!t) continue;
        for (int s = 0; s < 5; s++) {
            small_batch b;
            make_batch(&b, 2, 24, m->cfg.V, 10 + (uint64_t)s);
            int32_t tgt[2 * 24];
            for (int j = 0; j < 2 * 24; j++) tgt[j] = b.tgt[j];
            double loss = 0;
            CHECK_OK(ftune_trainer_step(t, b.tok, tgt, 2, 24, 1e-2, &loss));
            if (i == 0) ref[s] = loss;
            else CHECKF(memcmp(&loss, &ref[s], sizeof loss) == 0, "K=%d step %d: loss %.17g, without %.17g", Ks[i], s,
                        loss, ref[s]);
        }
        ftune_trainer_free(t);
    }
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    o.ctx = 24; o.grad_checkpoint = 6;
    ftune_trainer *t = NULL;
    CHECK(ftune_trainer_new(&t, m, &o) == FTUNE_ERR_ARG && !t);
    ftune_model_free(m);
}

int main(void) {
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    RUN(test_lora_f32);
    RUN(test_lora_f32_kv_prefix);
    RUN(test_full_f32);
    RUN(test_lora_bf16);
    RUN(test_full_bf16);
    RUN(test_lora_nf4);
    RUN(test_bad_k);
    RUN(test_public_trainer);
    CHECK_EXIT();
}
