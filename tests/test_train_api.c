/* test_train_api.c — the public trainer handle (ftune_trainer_*) against
 * the internal trainer and optimizer it wraps: the same steps by hand give
 * bit-identical losses, in LoRA (with dropout) and full mode; bad arguments
 * are clear errors. */
#include "ftune.h"
#include "check.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/train.h"

static char stories_hf[4096];

enum { B = 2, T = 16, STEPS = 4 };

static void fill_batch(int32_t *tok, int32_t *tgt, int V, int step) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7 + step * 13 + 1) % V);
        tgt[i] = (i % 5 == 3) ? -1 : (int32_t)((i * 11 + step * 3 + 2) % V); /* some ignored */
    }
}

/* The losses of STEPS optimizer steps done by hand with the internals, as
 * ftune_trainer_step documents them: zero-grad, step, clip, AdamW. */
static void reference_losses(const ftune_model *m, const ftune_train_opts *po, double lr, double *loss) {
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = (ft_train_mode)po->mode;
    o.lora.r = po->lora_r;
    o.lora.alpha = po->lora_alpha;
    o.lora.dropout = po->lora_dropout;
    o.lora.targets = po->lora_targets;
    o.lora.seed = po->seed;
    o.max_B = po->batch_size;
    o.max_T = po->ctx;
    o.n_threads = po->n_threads;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (!tr) return;
    int np = ft_trainer_n_params(tr);
    ft_param *ps = calloc((size_t)np, sizeof *ps);
    for (int i = 0; i < np; i++) {
        ps[i] = ft_trainer_param(tr, i)->opt;
        ps[i].decay = po->mode == FTUNE_TRAIN_LORA || ps[i].ndim == 2;
    }
    ft_adamw_cfg ac = { .beta1 = po->beta1, .beta2 = po->beta2, .eps = po->adam_eps, .weight_decay = po->weight_decay };
    ft_adamw opt;
    CHECK_OK(ft_adamw_init(&opt, ps, np, &ac));
    ft_batch b;
    CHECK_OK(ft_batch_init(&b, B, T));
    for (int s = 0; s < STEPS; s++) {
        int32_t tok[B * T], tgt[B * T];
        fill_batch(tok, tgt, m->cfg.V, s);
        int64_t nt = 0;
        for (int i = 0; i < B * T; i++) {
            b.tokens[i] = tok[i];
            b.targets[i] = tgt[i];
            nt += tgt[i] >= 0;
        }
        b.B = B;
        b.T = T;
        b.n_targets = nt;
        b.n_examples = B;
        ft_batch rows = b;
        rows.pos = NULL;
        rows.doc = NULL;
        double sum = 0;
        ft_trainer_zero_grad(tr);
        CHECK_OK(ft_trainer_step(tr, &rows, nt, &sum));
        loss[s] = sum / (double)nt;
        ft_clip_grad_norm(ps, np, po->max_grad_norm);
        ft_adamw_step(&opt, lr);
    }
    ft_batch_free(&b);
    ft_adamw_free(&opt);
    free(ps);
    ft_trainer_free(tr);
}

static void same_as_internals(ftune_train_mode mode) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    o.mode = mode;
    o.lora_r = 4;
    o.lora_dropout = 0.1f; /* the masks are seeded by the micro-step, the same in both */
    o.lora_targets = FTUNE_LORA_Q_PROJ | FTUNE_LORA_V_PROJ | FTUNE_LORA_DOWN_PROJ;
    o.weight_decay = 0.01;
    o.max_grad_norm = 0.5;
    o.seed = 42;
    o.batch_size = B;
    o.ctx = T;
    o.n_threads = 1;
    double lr = 1e-2, want[STEPS], got[STEPS];
    reference_losses(m, &o, lr, want);
    ftune_trainer *tr = NULL;
    CHECK_OK(ftune_trainer_new(&tr, m, &o));
    if (tr) {
        CHECK(ftune_trainer_n_trainable(tr) > 0);
        CHECK(ftune_trainer_n_threads(tr) == 1);
        for (int s = 0; s < STEPS; s++) {
            int32_t tok[B * T], tgt[B * T];
            fill_batch(tok, tgt, m->cfg.V, s);
            CHECK_OK(ftune_trainer_step(tr, tok, tgt, B, T, lr, &got[s]));
            /* the same operations in the same order on one thread: exactly equal */
            CHECKF(got[s] == want[s], "step %d: loss %.17g, by hand %.17g", s, got[s], want[s]);
        }
        /* the updates and batches took effect: the losses moved */
        CHECKF(got[STEPS - 1] != got[0], "loss did not change: %g", got[0]);
    }
    ftune_trainer_free(tr);
    ftune_model_free(m);
}

static void test_trainer_lora_same_as_internals(void) { same_as_internals(FTUNE_TRAIN_LORA); }
static void test_trainer_full_same_as_internals(void) { same_as_internals(FTUNE_TRAIN_FULL); }

static void expect_err(ftune_status st, ftune_status want, const char *needle) {
    CHECKF(st == want, "status %s, expected %s", ftune_status_name(st), ftune_status_name(want));
    CHECKF(strstr(ftune_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"", ftune_last_error(), needle);
}

static void test_trainer_bad_arguments(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    o.batch_size = B;
    o.ctx = T;
    ftune_trainer *tr = NULL;
    o.lora_set = FTUNE_SET_LORA_R;
    expect_err(ftune_trainer_new(&tr, m, &o), FTUNE_ERR_ARG, "lora_set");
    CHECK(tr == NULL);
    o.lora_set = 0;
    o.ctx = m->cfg.max_T + 1;
    expect_err(ftune_trainer_new(&tr, m, &o), FTUNE_ERR_ARG, "ctx");
    o.ctx = T;
    o.batch_size = 0;
    expect_err(ftune_trainer_new(&tr, m, &o), FTUNE_ERR_ARG, "batch_size");
    o.batch_size = B;
    CHECK_OK(ftune_trainer_new(&tr, m, &o));
    if (tr) {
        int32_t tok[B * T], tgt[B * T];
        fill_batch(tok, tgt, m->cfg.V, 0);
        double loss;
        expect_err(ftune_trainer_step(tr, tok, tgt, B + 1, T, 1e-3, &loss), FTUNE_ERR_ARG, "up to 2 x 16");
        expect_err(ftune_trainer_step(tr, tok, tgt, B, T + 1, 1e-3, &loss), FTUNE_ERR_ARG, "up to 2 x 16");
        tok[T + 3] = m->cfg.V;
        expect_err(ftune_trainer_step(tr, tok, tgt, B, T, 1e-3, &loss), FTUNE_ERR_ARG, "row 1, position 3");
        tok[T + 3] = 0;
        tgt[5] = -2;
        expect_err(ftune_trainer_step(tr, tok, tgt, B, T, 1e-3, &loss), FTUNE_ERR_ARG, "target -2");
        for (int i = 0; i < B * T; i++) tgt[i] = -1;
        expect_err(ftune_trainer_step(tr, tok, tgt, B, T, 1e-3, &loss), FTUNE_ERR_ARG, "no targets");
        expect_err(ftune_trainer_step(tr, tok, tgt, B, T, NAN, &loss), FTUNE_ERR_ARG, "lr");
    }
    ftune_trainer_free(tr);
    ftune_trainer_free(NULL);
    ftune_model_free(m);
}

static void test_option_parsers(void) {
    ftune_data_format f;
    CHECK_OK(ftune_data_format_parse("chat", &f));
    CHECK(f == FTUNE_DATA_CHAT);
    CHECK(ftune_data_format_parse("yaml", &f) == FTUNE_ERR_ARG);
    unsigned mask = 0;
    CHECK_OK(ftune_lora_targets_parse("q_proj,down", &mask));
    CHECK(mask == (FTUNE_LORA_Q_PROJ | FTUNE_LORA_DOWN_PROJ));
    CHECK_OK(ftune_lora_targets_parse("all", &mask));
    CHECK(mask == FTUNE_LORA_ALL);
    CHECK(ftune_lora_targets_parse("q,lm_head", &mask) == FTUNE_ERR_ARG);
    ftune_schedule sk;
    CHECK_OK(ftune_schedule_parse("linear", &sk));
    CHECK(sk == FTUNE_SCHED_LINEAR);
    CHECK(ftune_schedule_parse("step", &sk) == FTUNE_ERR_ARG);
}

int main(void) {
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    RUN(test_trainer_lora_same_as_internals);
    RUN(test_trainer_full_same_as_internals);
    RUN(test_trainer_bad_arguments);
    RUN(test_option_parsers);
    CHECK_EXIT();
}
