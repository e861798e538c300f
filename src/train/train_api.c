/* train_api.c — the public training API besides ftune_train_run (which is
 * train_loop.c): the option-name parsers and a trainer handle that runs one
 * optimizer step (zero-grad, forward + backward, clipping, AdamW) at a time
 * on the caller's token batches, as one step of ftune_train_run with K = 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ftune.h"
#include "core/core.h"
#include "data/data.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/train.h"

ftune_status ftune_data_format_parse(const char *name, ftune_data_format *out) {
    ft_data_format f;
    ftune_status st = ft_data_format_from_name(&f, name);
    if (!st) *out = (ftune_data_format)f; /* same values: train_loop.c asserts it */
    return st;
}

ftune_status ftune_lora_targets_parse(const char *list, unsigned *mask) { return ft_lora_targets_parse(list, mask); }

ftune_status ftune_schedule_parse(const char *name, ftune_schedule *out) {
    ft_sched_kind k;
    ftune_status st = ft_sched_kind_parse(name, &k);
    if (!st) *out = (ftune_schedule)k;
    return st;
}

int64_t ftune_json_nul_at(const char *p, size_t n) { return ft_json_nul_at(p, n); }

struct ftune_trainer {
    const ftune_model *m;
    ft_trainer *tr;
    ft_param *params;          /* (n_params) the optimizer's views of the trainables */
    int n_params;
    ft_adamw opt;
    bool opt_ready;
    ft_batch b;                /* (max_B, max_T) the step's batch */
    bool batch_ready;
    int64_t n_trainable;
    int n_threads;
    double max_grad_norm;      /* 0: only measured */
};

void ftune_trainer_free(ftune_trainer *t) {
    if (!t) return;
    if (t->batch_ready) ft_batch_free(&t->b);
    if (t->opt_ready) ft_adamw_free(&t->opt);
    free(t->params);
    ft_trainer_free(t->tr);
    free(t);
}

ftune_status ftune_trainer_new(ftune_trainer **out, const ftune_model *m, const ftune_train_opts *o) {
    *out = NULL;
    if (!m || !o) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: no model or options");
    if (o->lora_set || o->init_adapter)
        return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: lora_set and init_adapter are for ftune_train_run");
    if (o->mode != FTUNE_TRAIN_LORA && o->mode != FTUNE_TRAIN_FULL)
        return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: mode %d is not FTUNE_TRAIN_LORA or FTUNE_TRAIN_FULL", (int)o->mode);
    const ft_config *c = &m->cfg;
    int T = o->ctx > 0 ? o->ctx : (c->max_T < 512 ? c->max_T : 512);
    if (o->ctx < 0 || T < 2 || T > c->max_T)
        return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: ctx %d: must be 0 or in [2, %d] (the model's context)", o->ctx,
                      c->max_T);
    if (o->batch_size < 1) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: batch_size %d: must be at least 1", o->batch_size);
    if (!(o->max_grad_norm >= 0)) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_new: max_grad_norm must not be negative");
    ftune_trainer *t = calloc(1, sizeof *t);
    if (!t) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    t->m = m;
    ft_train_opts to;
    ft_train_opts_default(&to);
    to.mode = (ft_train_mode)o->mode;
    to.lora.r = o->lora_r;
    to.lora.alpha = o->lora_alpha;
    to.lora.rslora = o->rslora;
    to.lora.dropout = o->lora_dropout;
    to.lora.targets = o->lora_targets;
    to.lora.seed = o->seed;
    to.max_B = o->batch_size;
    to.max_T = T;
    to.n_threads = o->n_threads;
    to.grad_checkpoint = o->grad_checkpoint;
    to.paged_dir = o->paged_optim ? o->paged_dir : NULL;
    to.optim = (ft_optim_kind)o->optim;
    to.paged_optim = o->paged_optim;
    t->n_threads = ft_num_threads(o->n_threads);
    ftune_status st = ft_train_compute_of(m, o->dtype, &to.compute);
    if (!st) st = ft_trainer_new(&t->tr, m, &to);
    if (st) goto fail;
    if ((st = ft_trainer_optim_params(t->tr, o->mode == FTUNE_TRAIN_LORA, &t->params, &t->n_params, &t->n_trainable)))
        goto fail;
    ft_adamw_cfg ac = { .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps, .weight_decay = o->weight_decay,
                        .n_threads = o->n_threads, .kind = to.optim, .block = to.optim_block,
                        .paged = o->paged_optim, .paged_dir = o->paged_dir };
    if (o->optim != FTUNE_OPTIM_ADAMW && o->optim != FTUNE_OPTIM_ADAMW8BIT) {
        st = ft_err(FTUNE_ERR_ARG, "optim %d: expected FTUNE_OPTIM_ADAMW or FTUNE_OPTIM_ADAMW8BIT", (int)o->optim);
        goto fail;
    }
    if (o->paged_optim && !o->paged_dir) {
        st = ft_err(FTUNE_ERR_ARG, "paged_optim: give paged_dir, the directory for the state's file");
        goto fail;
    }
    if ((st = ft_adamw_init(&t->opt, t->params, t->n_params, &ac))) goto fail;
    t->opt_ready = true;
    if ((st = ft_batch_init(&t->b, o->batch_size, T))) goto fail;
    t->batch_ready = true;
    t->max_grad_norm = o->max_grad_norm;
    *out = t;
    return FTUNE_OK;
fail:
    ftune_trainer_free(t);
    return st;
}

ftune_status ftune_trainer_step(ftune_trainer *t, const int32_t *tokens, const int32_t *targets, int B, int T, double lr,
                                double *loss) {
    if (!t || !tokens || !targets || !loss) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: a NULL argument");
    if (B < 1 || B > t->b.B_max || T < 1 || T > t->b.T_max)
        return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: batch %d x %d: the trainer takes up to %d x %d", B, T,
                      t->b.B_max, t->b.T_max);
    if (!(lr >= 0) || !isfinite(lr)) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: lr %g: must be finite and >= 0", lr);
    int V = t->m->cfg.V;
    int64_t nt = 0;
    for (size_t i = 0; i < (size_t)B * T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: token %d at row %zu, position %zu: not in [0, %d)",
                          (int)tokens[i], i / (size_t)T, i % (size_t)T, V);
        if (targets[i] < -1 || targets[i] >= V)
            return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: target %d at row %zu, position %zu: not -1 or in [0, %d)",
                          (int)targets[i], i / (size_t)T, i % (size_t)T, V);
        nt += targets[i] >= 0;
    }
    if (nt == 0) return ft_err(FTUNE_ERR_ARG, "ftune_trainer_step: the batch has no targets");
    ft_batch *b = &t->b;
    b->B = B;
    b->T = T;
    for (size_t i = 0; i < (size_t)B * T; i++) {
        b->tokens[i] = tokens[i];
        b->targets[i] = targets[i];
    }
    b->n_targets = nt;
    b->n_examples = B;
    ft_batch rows = *b; /* NULL pos and doc: one document per row at positions 0..T-1 */
    rows.pos = NULL;
    rows.doc = NULL;
    double sum;
    ft_trainer_zero_grad(t->tr);
    ftune_status st = ft_trainer_step(t->tr, &rows, nt, &sum);
    if (st) return st;
    *loss = sum / (double)nt;
    double gnorm = ft_clip_grad_norm(t->params, t->n_params, t->max_grad_norm);
    if (!isfinite(*loss) || !isfinite(gnorm))
        return ft_err(FTUNE_ERR_RANGE, "ftune_trainer_step: the loss (%g) or gradient norm (%g) is not finite; try a lower lr",
                      *loss, gnorm);
    ft_trainer_adamw_step(t->tr, &t->opt, lr);
    return FTUNE_OK;
}

int64_t ftune_trainer_n_trainable(const ftune_trainer *t) { return t->n_trainable; }
int ftune_trainer_n_threads(const ftune_trainer *t) { return t->n_threads; }
