/* train_loop.c — ft_train_run: one fine-tuning run from data files to a
 * PEFT adapter or a full model, with validation, metrics, atomic checkpoints
 * and bit-exact resume.
 *
 * What a resumed run needs to replay the uninterrupted one exactly: the
 * trainable values, AdamW's moments and step, the trainer's micro-step
 * (dropout masks are seeded from it), the data cursor (epoch orders are
 * seeded from the run seed and the epoch), the step count and the skipped
 * steps (the schedule advances only on updates), and the loss scaler's
 * scale and growth tracker. The checkpoint holds all of them and the run's
 * configuration, which must match the resuming run's.
 *
 * Data parallelism (dist.h): every rank builds the same global micro-batches
 * and trains its own rows of each (ft_batch_shard); the step's target count
 * is summed over ranks before the loss is normalised, so the summed
 * gradients are the global batch's mean. The hooks into the step are few
 * and at fixed points: after the backward pass (sum the gradients: all-reduce,
 * or reduce-scatter under ZeRO 1), the loss scaler's found-inf flag (MAX over
 * ranks, so all skip alike), the global norm (summed over the ranks' parts),
 * the optimizer on this rank's part, and (ZeRO 1, 2) the all-gather of the
 * updated values. ZeRO 2 and 3 work through the trainer's segment windows
 * (train.h ft_train_shard): each segment's gradient is reduce-scattered as
 * the backward finishes it (shard_grads) and, at ZeRO 3, each segment's
 * values are all-gathered when the trainer needs them (shard_values); a
 * rank without rows in a micro-batch runs one without targets, so that
 * every rank makes the same collectives. Only rank 0 touches the output directory; checkpoints
 * hold the whole state (gathered to rank 0), so a run resumes on any number
 * of ranks. With one rank every collective is the identity and the run is
 * the single-process run, bit for bit. */
#include "train/train_loop.h"

#include "adapter/adapter.h"
#include "dist/dist.h"
#include "tokenizer/tokenizer.h"
#include "train/tensorboard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/file.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The public enums are the internal ones under public names: same values. */
_Static_assert(FTUNE_DATA_AUTO == (int)FT_FMT_AUTO && FTUNE_DATA_TEXT == (int)FT_FMT_TEXT &&
               FTUNE_DATA_COMPLETION == (int)FT_FMT_COMPLETION && FTUNE_DATA_ALPACA == (int)FT_FMT_ALPACA &&
               FTUNE_DATA_CHAT == (int)FT_FMT_CHAT && FTUNE_DATA_PLAIN == (int)FT_FMT_PLAIN, "data formats");
_Static_assert(FTUNE_TRAIN_LORA == (int)FT_TRAIN_LORA && FTUNE_TRAIN_FULL == (int)FT_TRAIN_FULL, "train modes");
_Static_assert((int)FTUNE_LORA_Q_PROJ == (int)FT_MOD_BIT(FT_MOD_Q) && (int)FTUNE_LORA_K_PROJ == (int)FT_MOD_BIT(FT_MOD_K) && (int)FTUNE_LORA_V_PROJ == (int)FT_MOD_BIT(FT_MOD_V) &&
               (int)FTUNE_LORA_O_PROJ == (int)FT_MOD_BIT(FT_MOD_O) && (int)FTUNE_LORA_GATE_PROJ == (int)FT_MOD_BIT(FT_MOD_GATE) &&
               (int)FTUNE_LORA_UP_PROJ == (int)FT_MOD_BIT(FT_MOD_UP) && (int)FTUNE_LORA_DOWN_PROJ == (int)FT_MOD_BIT(FT_MOD_DOWN) &&
               (int)FTUNE_LORA_ALL == (int)FT_MOD_ALL, "LoRA targets");
_Static_assert(FTUNE_SCHED_CONSTANT == (int)FT_SCHED_CONSTANT && FTUNE_SCHED_LINEAR == (int)FT_SCHED_LINEAR &&
               FTUNE_SCHED_COSINE == (int)FT_SCHED_COSINE, "schedules");
_Static_assert(FTUNE_LOSS_SCALE_NONE == (int)FT_LOSS_SCALE_NONE && FTUNE_LOSS_SCALE_DYNAMIC == (int)FT_LOSS_SCALE_DYNAMIC &&
               FTUNE_LOSS_SCALE_FIXED == (int)FT_LOSS_SCALE_FIXED, "loss scale modes");
_Static_assert(FTUNE_OPTIM_ADAMW == (int)FT_OPTIM_ADAMW && FTUNE_OPTIM_ADAMW8BIT == (int)FT_OPTIM_ADAMW8BIT, "optimizers");
_Static_assert(FTUNE_TRUNCATE_END == (int)FT_TRUNC_END && FTUNE_TRUNCATE_PROMPT == (int)FT_TRUNC_PROMPT, "truncation");

#define TRY(x) do { ftune_status st_ = (x); if (st_) return st_; } while (0)

void ftune_train_opts_default(ftune_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->val_split = 0.05;
    o->format = FTUNE_DATA_AUTO;
    o->shuffle = true;
    o->mode = FTUNE_TRAIN_LORA;
    o->lora_r = 8;
    o->lora_alpha = 16;
    o->lora_dropout = 0.05f;
    o->lora_targets = FTUNE_LORA_ALL;
    o->tensorboard = true;
    ft_adamw_cfg ac;
    ft_adamw_defaults(&ac);
    o->beta1 = ac.beta1;
    o->beta2 = ac.beta2;
    o->adam_eps = ac.eps;
    o->weight_decay = 0;
    o->lr = 2e-4;
    o->max_grad_norm = 1.0;
    o->schedule = FTUNE_SCHED_COSINE;
    o->batch_size = 1;
    o->grad_accum = 1;
    o->dist_timeout = 300;
}

ftune_status ftune_optim_parse(const char *s, ftune_optim *out) {
    ft_optim_kind k;
    ftune_status st = ft_optim_kind_parse(s ? s : "", &k);
    if (!st) *out = (ftune_optim)k;
    return st;
}

double ft_peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

/* ------------------------------------------------------------ files */

static FTUNE_MUST_USE ftune_status mkdir_p(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return ft_err(FTUNE_ERR_ARG, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", buf, strerror(errno));
    if (!ft_is_dir(buf)) return ft_err(FTUNE_ERR_IO, "%s: exists and is not a directory", buf);
    return FTUNE_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb; (void)f;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes a directory we wrote (and everything in it); absent is fine. */
static FTUNE_MUST_USE ftune_status rm_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return FTUNE_OK;
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ft_err(FTUNE_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return FTUNE_OK;
}

/* Removes path where the outcome is decided already -- a failure being
 * reported, or a checkpoint in place that leaves the copy it replaced --
 * so that failing to remove it changes nothing: ignored, and the message
 * ftune_last_error() gives kept as it was (the failure's, not rm_tree's). */
static void rm_tree_after(const char *path) {
    char *keep = ft_strdup(ftune_last_error());
    ft_ignore_status(rm_tree(path));
    if (keep) { ft_err(FTUNE_OK, "%s", keep); free(keep); }
}

static FTUNE_MUST_USE ftune_status fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0 && e != EINVAL) return ft_err(FTUNE_ERR_IO, "%s: fsync: %s", path, strerror(e));
    return FTUNE_OK;
}




/* ------------------------------------------------------------ the run */

typedef struct {
    const ftune_train_opts *o;
    ftune_train_progress_fn cb;
    void *cb_ctx;
    ftune_model *m;
    ft_data_tokenizer dt;
    ft_dataset *train, *val;
    int T, B, K;
    ft_train_opts topts;
    ft_trainer *tr;
    ft_param *params;
    int n_params;
    ft_adamw opt;
    bool opt_ready;
    ft_sched sched;
    ft_batch_iter *it, *val_it;
    ft_batch *mb;              /* (K) the micro-batches of one step */
    int n_mb;
    ft_batch vb;               /* validation batch */
    ft_adapter *wrapped;       /* the trainer's LoRA as an adapter object (LoRA) */
    int64_t total_steps, total_micro; /* total_micro < 0: unbounded (steps given) */
    int64_t step;              /* optimizer steps done, skipped ones included */
    int64_t skipped;           /* of them, skipped (non-finite gradients): no update, no schedule step */
    ft_grad_scaler scaler;     /* loss scaling (mode NONE: off) */
    const ft_train_hooks *hooks; /* test faults, or NULL */
    cJSON *config;             /* the run configuration stored in checkpoints */
    FILE *metrics, *dump;
    ft_tb_writer tb;           /* rank 0, tensorboard: the events file (tb.ev NULL: none) */
    double *step_times;        /* (world) under MPI: each rank's time in the step, summed over ranks */
    float *init_vals;          /* --init-adapter A/B by (layer, module) */
    int64_t init_off[256 * FT_N_MODS + 1];
    int lock_fd;               /* OUT/.ftune.lock, held for the whole run; -1: none */
    ftune_train_result res;
    /* data parallelism: this rank of world, the ZeRO stage */
    int rank, world, zero;
    int64_t n_flat;            /* trainable floats: the trainer's one flat array */
    float *vals, *grads;       /* the trainer's flat values and gradients (n_flat) */
    int64_t *shard;            /* (world + 1) rank q owns [shard[q], shard[q+1]) of them (ZeRO 1) */
    ft_param *own;             /* what this rank's AdamW updates: params (ZeRO 0) or its pieces (ZeRO 1) */
    int n_own;
    int64_t chunk;             /* the most floats one collective call moves (--bucket-mb) */
    float *full_mv;            /* (2 n_flat) rank 0, ZeRO 1: the whole AdamW state while saved or loaded */
    /* ZeRO 2/3: the trainer's gradients (ZeRO 3: and values) are one segment's window (train.h);
     * this rank keeps its shard [shard[rank], shard[rank+1]) of the summed gradient (and values) */
    ft_train_shard shard_io;
    int64_t own_n;             /* floats of this rank's shard */
    float *own_grad;           /* (own_n) ZeRO 2/3 */
    float *own_vals;           /* (own_n) ZeRO 3 */
    float *own_base;           /* ZeRO >= 1: own[i].data - own_base is its offset in this rank's shard */
    int64_t *seg_off;          /* (world + 1) a segment's split over the ranks, relative to its start */
    float *full_vals;          /* (n_flat) rank 0, ZeRO 3: the whole values while saved or loaded */
    ft_batch idle;             /* ZeRO 2/3: a batch with no targets, for a rank with no rows (collectives) */
    bool resume_sharded;       /* rank 0: --resume's checkpoint is sharded (each rank reads its own) */
    /* --overlap: two non-blocking reduce-scatters in flight, each on its own copy of a segment */
    struct ov_slot {
        float *send, *recv;    /* (win_n), (recv_n) */
        ft_dist_req *req;
        int64_t dst, n;        /* recv's n floats add to own_grad + dst */
        bool pending;
    } ov[2];
    int ov_next;               /* the slot started longest ago: the next to finish and reuse */
    int64_t win_n;             /* floats of the trainer's gradient window */
    int64_t recv_n;            /* the most of a segment this rank receives: min(win_n, own_n) + 1 */
} run;

static bool is_root(const run *r) { return r->rank == 0; }

static void emit(run *r, ftune_train_progress *p) {
    p->total_steps = r->total_steps;
    if (r->cb && is_root(r)) r->cb(r->cb_ctx, p);
}

/* Layouts of q/k rows: RoPE on pairs (2i, 2i+1) as GGUF and llama2.c store
 * llama models, or on (i, i + HS/2) as Hugging Face does. */
static const char *layout_name(bool interleaved) { return interleaved ? "interleaved" : "rotate_half"; }
static const char *layout_desc(bool interleaved) {
    return interleaved ? "interleaved (GGUF, llama2.c)" : "rotate-half (Hugging Face)";
}

/* The run configuration: everything a resumed run must share with the
 * checkpoint's run to continue it exactly. */
static cJSON *make_config(run *r) {
    const ftune_train_opts *o = r->o;
    const ft_config *c = &r->m->cfg;
    cJSON *j = cJSON_CreateObject(), *mo = cJSON_AddObjectToObject(j, "model"), *d = cJSON_AddObjectToObject(j, "data");
    if (!mo || !d) { cJSON_Delete(j); return NULL; }
    /* the model: its shape and a fingerprint of sampled weights */
    cJSON_AddStringToObject(mo, "arch", c->arch);
    int dims[] = { c->C, c->F, c->L, c->NH, c->NKV, c->HS, c->V };
    const char *dn[] = { "hidden_size", "intermediate_size", "layers", "heads", "kv_heads", "head_dim", "vocab" };
    for (int i = 0; i < 7; i++) cJSON_AddNumberToObject(mo, dn[i], dims[i]);
    /* only when quantized, so that checkpoints from before it resume */
    if (r->m->quantized) cJSON_AddStringToObject(mo, "quant", ft_types[r->m->quant].name);
    /* the order of q/k rows (of the weights, hence of lora_B and the optimizer
     * state): the same model in another format has the other one, and the
     * fingerprint below cannot tell (its rows are fixed points of the permutation) */
    cJSON_AddStringToObject(mo, "rope_layout", layout_name(c->rope_interleaved));
    uint64_t h = FT_FNV0;
    float *row = malloc((size_t)(c->C > c->F ? c->C : c->F) * sizeof(float) + (size_t)c->NH * c->HS * sizeof(float));
    if (row) {
        for (int i = 0; i < 16; i++) {
            ft_tensor_row_f32(&r->m->tok_embd, (int64_t)i * c->V / 16, row);
            h = ft_fnv1a(h, row, (size_t)c->C * sizeof(float));
        }
        h = ft_fnv1a(h, r->m->out_norm, (size_t)c->C * sizeof(float));
        for (int l = 0; l < c->L; l++)
            for (int k = 0; k < FT_N_MODS; k++) {
                const ft_linear *lin = ft_model_linear(r->m, l, (ft_module)k);
                ft_tensor_row_f32(&lin->w, lin->out - 1, row);
                h = ft_fnv1a(h, row, (size_t)lin->in * sizeof(float));
            }
        free(row);
    }
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    cJSON_AddStringToObject(mo, "fingerprint", hex);
    /* the training data as tokenized */
    const ft_dataset *ds = r->train;
    h = ft_fnv1a(FT_FNV0, ds->tokens, (size_t)ds->off[ds->n] * sizeof *ds->tokens);
    h = ft_fnv1a(h, ds->mask, (size_t)ds->off[ds->n]);
    h = ft_fnv1a(h, ds->off, (size_t)(ds->n + 1) * sizeof *ds->off);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    cJSON_AddNumberToObject(d, "examples", ds->n);
    cJSON_AddNumberToObject(d, "tokens", (double)ds->off[ds->n]);
    cJSON_AddStringToObject(d, "fingerprint", hex);
    cJSON_AddNumberToObject(d, "val_examples", r->val ? r->val->n : 0);
    /* training settings */
    cJSON_AddStringToObject(j, "mode", o->mode == FTUNE_TRAIN_FULL ? "full" : "lora");
    if (o->mode == FTUNE_TRAIN_LORA) {
        cJSON_AddNumberToObject(j, "lora_r", r->topts.lora.r);
        cJSON_AddNumberToObject(j, "lora_alpha", r->topts.lora.alpha);
        cJSON_AddNumberToObject(j, "lora_dropout", r->topts.lora.dropout);
        char t[128] = "";
        for (int k = 0; k < FT_N_MODS; k++)
            if (r->topts.lora.targets & (1u << k)) {
                if (*t) strcat(t, ",");
                strcat(t, ft_modules[k].peft);
            }
        cJSON_AddStringToObject(j, "lora_targets", t);
        cJSON_AddBoolToObject(j, "rslora", r->topts.lora.rslora);
    }
    cJSON_AddNumberToObject(j, "ctx", r->T);
    cJSON_AddNumberToObject(j, "batch_size", r->B);
    cJSON_AddNumberToObject(j, "grad_accum", r->K);
    cJSON_AddBoolToObject(j, "pack", o->pack);
    cJSON_AddBoolToObject(j, "shuffle", o->shuffle);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    cJSON_AddStringToObject(j, "seed", seed);
    cJSON_AddNumberToObject(j, "lr", o->lr);
    cJSON_AddNumberToObject(j, "min_lr", o->min_lr);
    const char *sn[] = { "constant", "linear", "cosine" };
    cJSON_AddStringToObject(j, "schedule", sn[o->schedule]);
    cJSON_AddNumberToObject(j, "warmup", (double)o->warmup);
    cJSON_AddNumberToObject(j, "total_steps", (double)r->total_steps);
    cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
    cJSON_AddNumberToObject(j, "beta1", o->beta1);
    cJSON_AddNumberToObject(j, "beta2", o->beta2);
    cJSON_AddNumberToObject(j, "adam_eps", o->adam_eps);
    cJSON_AddNumberToObject(j, "max_grad_norm", o->max_grad_norm);
    /* the compute dtype, written when not f32 (so f32 checkpoints are as before) */
    if (r->topts.compute != FT_F32) cJSON_AddStringToObject(j, "dtype", ft_types[r->topts.compute].name);
    return j;
}

/* The first key where two configurations differ ("lora_r", "model.vocab"),
 * with both values; false if they agree. */
static bool config_diff(const cJSON *a, const cJSON *b, const char *prefix, char *key, size_t cap, char **va, char **vb) {
    const cJSON *x;
    cJSON_ArrayForEach(x, b) {
        const cJSON *y = cJSON_GetObjectItemCaseSensitive(a, x->string);
        char k[256];
        snprintf(k, sizeof k, "%s%s", prefix, x->string);
        if (y && cJSON_IsObject(x) && cJSON_IsObject(y)) {
            char p2[256];
            snprintf(p2, sizeof p2, "%s.", k);
            if (config_diff(y, x, p2, key, cap, va, vb)) return true;
            continue;
        }
        if (!y || !cJSON_Compare(x, y, true)) {
            snprintf(key, cap, "%s", k);
            *va = y ? cJSON_PrintUnformatted(y) : ft_strdup("(absent)");
            *vb = cJSON_PrintUnformatted(x);
            return true;
        }
    }
    cJSON_ArrayForEach(x, a) {
        if (cJSON_GetObjectItemCaseSensitive(b, x->string)) continue;
        snprintf(key, cap, "%s%s", prefix, x->string);
        *va = cJSON_PrintUnformatted(x);
        *vb = ft_strdup("(absent)");
        return true;
    }
    return false;
}

/* ------------------------------------------------------------ data */

static FTUNE_MUST_USE ftune_status load_data(run *r) {
    const ftune_train_opts *o = r->o;
    ft_dataset_opts dop;
    ft_dataset_opts_default(&dop);
    dop.format = (ft_data_format)o->format;
    dop.ctx_len = r->T;
    dop.train_on_prompt = o->train_on_prompt;
    dop.drop_long = o->drop_long;
    dop.truncate = (ft_truncate_side)o->truncate;
    dop.prompt_key = o->prompt_key;
    dop.completion_key = o->completion_key;
    dop.progress = o->data_progress;
    dop.progress_ctx = o->data_progress_ctx;
    char *chat_system = NULL;
    if (o->chat_template) {
        TRY(ft_chat_template_from_name(&dop.chat_template, o->chat_template));
    } else {
        /* the model's own: the template its tokenizer was loaded with (GGUF
         * tokenizer.chat_template, tokenizer_config.json, chat_template.jinja),
         * with the system message it puts first when a conversation has none */
        TRY(ft_chat_format_of(ftune_model_tokenizer(r->m), &dop.chat_template, &chat_system));
        dop.chat_system = chat_system;
        ft_chat_template t = FT_CHAT_NONE;
        if (dop.chat_template == FT_CHAT_NONE && o->model_path && ft_is_dir(o->model_path) &&
            ft_chat_template_from_hf_dir(&t, o->model_path) == FTUNE_OK)
            dop.chat_template = t;
    }
    ftune_status st = ft_dataset_load(&r->train, o->data_path, &r->dt, &dop);
    if (!st && o->val_path) st = ft_dataset_load(&r->val, o->val_path, &r->dt, &dop);
    free(chat_system);
    if (st) return st;
    if (!o->val_path && o->val_split > 0) {
        if (!(o->val_split < 1)) return ft_err(FTUNE_ERR_ARG, "--val-split %g: expected a fraction in [0, 1)", o->val_split);
        if (r->train->n >= 2) TRY(ft_dataset_split(r->train, o->val_split, o->seed, &r->val));
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------ LoRA from a PEFT directory */

/* Reads --init-adapter's LoRA settings and A/B values; the adapter is
 * attached only while it is read (the trainer wants a bare model). */
static FTUNE_MUST_USE ftune_status read_init_adapter(run *r) {
    const ftune_train_opts *o = r->o;
    const ft_config *c = &r->m->cfg;
    if (c->L > 256) return ft_err(FTUNE_ERR_UNSUPPORTED, "--init-adapter: models of more than 256 layers");
    ft_adapter *a = NULL;
    ftune_status st = ft_adapter_load_peft(&a, r->m, o->init_adapter, false);
    if (st) return ft_err_prefix(st, "--init-adapter");
    const ft_adapter_hparams *lc = &a->cfg;
    const char *bad = NULL;
    char have[64] = "", want[64] = "";
    if ((o->lora_set & FTUNE_SET_LORA_R) && lc->r != r->topts.lora.r) {
        bad = "--lora-r"; snprintf(have, sizeof have, "%d", lc->r); snprintf(want, sizeof want, "%d", r->topts.lora.r);
    } else if ((o->lora_set & FTUNE_SET_LORA_ALPHA) && lc->alpha != r->topts.lora.alpha) {
        bad = "--lora-alpha"; snprintf(have, sizeof have, "%g", lc->alpha); snprintf(want, sizeof want, "%g", r->topts.lora.alpha);
    } else if ((o->lora_set & FTUNE_SET_RSLORA) && lc->rslora != r->topts.lora.rslora) {
        bad = "--rslora"; snprintf(have, sizeof have, "%s", lc->rslora ? "on" : "off");
        snprintf(want, sizeof want, "%s", r->topts.lora.rslora ? "on" : "off");
    } else if ((o->lora_set & FTUNE_SET_LORA_TARGETS) && lc->targets != r->topts.lora.targets) {
        bad = "--lora-targets"; snprintf(have, sizeof have, "mask 0x%x", lc->targets);
        snprintf(want, sizeof want, "mask 0x%x", r->topts.lora.targets);
    }
    if (bad) {
        st = ft_err(FTUNE_ERR_ARG, "--init-adapter %s: the adapter has %s %s, but %s was given (leave it out to use the adapter's)",
                    o->init_adapter, bad, have, want);
        goto done;
    }
    r->topts.lora.r = lc->r;
    r->topts.lora.alpha = lc->alpha;
    r->topts.lora.rslora = lc->rslora;
    r->topts.lora.targets = lc->targets;
    int per_layer = __builtin_popcount(lc->targets);
    if (a->n != c->L * per_layer) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "--init-adapter %s: the adapter covers %d of the %d Linears its target_modules "
                    "name in every layer; training adapts all layers", o->init_adapter, a->n, c->L * per_layer);
        goto done;
    }
    int64_t total = 0;
    memset(r->init_off, 0, sizeof r->init_off);
    for (int i = 0; i < a->n; i++) {
        const ft_adapter_entry *e = &a->e[i];
        total += (int64_t)lc->r * (e->lin->in + e->lin->out);
    }
    r->init_vals = ft_malloc((size_t)(total ? total : 1) * sizeof(float));
    if (!r->init_vals) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    int64_t off = 0;
    for (int i = 0; i < a->n; i++) {
        const ft_adapter_entry *e = &a->e[i];
        int64_t na = (int64_t)lc->r * e->lin->in, nb = (int64_t)lc->r * e->lin->out;
        r->init_off[e->layer * FT_N_MODS + e->mod] = off + 1; /* 0 = none */
        memcpy(r->init_vals + off, e->lora->A, (size_t)na * sizeof(float));
        memcpy(r->init_vals + off + na, e->lora->B, (size_t)nb * sizeof(float));
        off += na + nb;
    }
done:
    ft_adapter_free(a);
    return st;
}

static void apply_init_adapter(run *r) {
    const ft_config *c = &r->m->cfg;
    for (int l = 0; l < c->L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_lora *a = ft_trainer_lora(r->tr, l, k);
            int64_t off = r->init_off[l * FT_N_MODS + k];
            if (!a || !off) continue;
            const ft_linear *lin = ft_model_linear(r->m, l, (ft_module)k);
            int64_t na = (int64_t)a->base.hp->r * lin->in, nb = (int64_t)a->base.hp->r * lin->out;
            memcpy(a->A, r->init_vals + off - 1, (size_t)na * sizeof(float));
            memcpy(a->B, r->init_vals + off - 1 + na, (size_t)nb * sizeof(float));
        }
}

/* ------------------------------------------------------------ outputs */

/* The PEFT adapter from the trainer's LoRA, or (ZeRO 3, where the
 * trainer holds one layer's at a time) with A and B read from full, the
 * whole flat values. */
static FTUNE_MUST_USE ftune_status save_peft(run *r, const char *dir, const float *full, const char *gguf) {
    if (!full) {
        TRY(ft_adapter_save_peft(r->wrapped, dir));
        return gguf ? ft_adapter_save_gguf(r->wrapped, gguf) : FTUNE_OK;
    }
    const ft_config *c = &r->m->cfg;
    ft_lora *cp = ft_calloc((size_t)c->L * FT_N_MODS, sizeof *cp);
    ft_lora **ptr = ft_calloc((size_t)c->L * FT_N_MODS, sizeof *ptr);
    ftune_status st = cp && ptr ? FTUNE_OK : ft_err(FTUNE_ERR_NOMEM, "out of memory");
    /* LoRA's parameters: A then B of each adapted Linear */
    for (int i = 0; !st && i + 1 < ft_trainer_n_params(r->tr); i += 2) {
        const ft_train_param *pa = ft_trainer_param(r->tr, i), *pb = ft_trainer_param(r->tr, i + 1);
        int j = pa->layer * FT_N_MODS + pa->target;
        cp[j] = *ft_trainer_lora(r->tr, pa->layer, pa->target);
        cp[j].A = (float *)full + pa->offset;
        cp[j].B = (float *)full + pb->offset;
        cp[j].dA = cp[j].dB = NULL;
        ptr[j] = &cp[j];
    }
    ft_adapter *a = NULL;
    if (!st) st = ft_adapter_wrap(&a, r->m, ptr);
    if (!st) st = ft_adapter_save_peft(a, dir);
    if (!st && gguf) st = ft_adapter_save_gguf(a, gguf);
    ft_adapter_free(a);
    free(ptr);
    free(cp);
    return st;
}

static FTUNE_MUST_USE ftune_status save_adapter_dir(run *r, const char *dir, const float *full, const char *gguf) {
    TRY(mkdir_p(dir));
    return save_peft(r, dir, full, gguf);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Full fine-tuning: writes a Hugging Face model whose weights are the
 * trainer's, through the model writer on a shallow copy of the model. */
static FTUNE_MUST_USE ftune_status save_full_model(run *r, const char *dir, const float *full) {
    ftune_model v = *r->m;
    const ft_config *c = &v.cfg;
    v.layers = ft_malloc((size_t)c->L * sizeof *v.layers);
    if (!v.layers) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    memcpy(v.layers, r->m->layers, (size_t)c->L * sizeof *v.layers);
    v.adapter = NULL;
    int n = ft_trainer_n_params(r->tr);
    for (int i = 0; i < n; i++) {
        ft_train_param pw = *ft_trainer_param(r->tr, i);
        if (full) pw.opt.data = (float *)full + pw.offset;
        const ft_train_param *tp = &pw;
        const ft_param *p = &pw.opt;
        if (strcmp(p->name, "model.embed_tokens.weight") == 0) v.tok_embd = ft_tensor_f32_view(p->name, p->data, p->shape[0], p->shape[1]);
        else if (strcmp(p->name, "lm_head.weight") == 0) v.lm_head.w = ft_tensor_f32_view(p->name, p->data, p->shape[0], p->shape[1]);
        else if (strcmp(p->name, "model.norm.weight") == 0) v.out_norm = p->data;
        else if (tp->layer >= 0 && tp->target >= 0) {
            ft_linear *lin = ft_model_linear(&v, tp->layer, (ft_module)tp->target);
            if (ends_with(p->name, ".bias")) lin->bias = p->data;
            else lin->w = ft_tensor_f32_view(p->name, p->data, p->shape[0], p->shape[1]);
        } else if (tp->layer >= 0 && strstr(p->name, "input_layernorm")) v.layers[tp->layer].attn_norm = p->data;
        else if (tp->layer >= 0 && strstr(p->name, "post_attention_layernorm")) v.layers[tp->layer].ffn_norm = p->data;
    }
    if (c->tied) v.lm_head.w = v.tok_embd;
    ft_model_write_opts mo = { .dtype = "f32" };
    ftune_status st = ft_model_write(&v, dir, &mo);
    free(v.layers);
    return st;
}

/* ------------------------------------------------------------ ranks */

/* ------------------------------------------------------------ ZeRO 2 and 3 */

/* Segment [lo, hi) of the flat array split over the ranks' shards:
 * seg_off[q] .. seg_off[q+1] (relative to lo) is rank q's part. */
static void seg_split(run *r, int64_t lo, int64_t hi) {
    for (int q = 0; q <= r->world; q++) {
        int64_t v = r->shard[q] < lo ? lo : r->shard[q] > hi ? hi : r->shard[q];
        r->seg_off[q] = v - lo;
    }
}

/* A segment's gradient of one micro-batch (the trainer's window): summed
 * over the ranks onto the owners (reduce-scatter, in --bucket-mb rounds),
 * and this rank's part added to its shard. */
/* --overlap: waits for a slot's reduce-scatter and adds its part to the shard. */
static FTUNE_MUST_USE ftune_status ov_finish(run *r, struct ov_slot *s) {
    if (!s->pending) return FTUNE_OK;
    /* a wait that failed or timed out leaves the request in flight: s->req stays
     * set, so that the end of the run does not free the buffers MPI may still use */
    TRY(ft_dist_wait(s->req));
    s->req = NULL;
    s->pending = false;
    float *dst = r->own_grad + s->dst;
    for (int64_t i = 0; i < s->n; i++) dst[i] += s->recv[i];
    return FTUNE_OK;
}

/* --overlap: every reduce-scatter in flight finished, oldest first (the
 * order the blocking path adds them in, so the sums are the same). */
static FTUNE_MUST_USE ftune_status ov_drain(run *r) {
    if (!r->o->overlap || r->zero < 2) return FTUNE_OK;
    TRY(ov_finish(r, &r->ov[r->ov_next]));
    return ov_finish(r, &r->ov[r->ov_next ^ 1]);
}

static FTUNE_MUST_USE ftune_status shard_grads(void *ctx, int64_t lo, int64_t hi, float *g) {
    run *r = ctx;
    seg_split(r, lo, hi);
    if (r->o->overlap) {
        /* the oldest slot is finished and reused; the window goes on to the next segment */
        struct ov_slot *s = &r->ov[r->ov_next];
        r->ov_next ^= 1;
        TRY(ov_finish(r, s));
        memcpy(s->send, g, (size_t)(hi - lo) * sizeof(float));
        s->dst = lo + r->seg_off[r->rank] - r->shard[r->rank];
        s->n = r->seg_off[r->rank + 1] - r->seg_off[r->rank];
        TRY(ft_dist_ireduce_scatter_sum_f32(s->send, s->recv, r->seg_off, &s->req));
        s->pending = true;
        return ft_dist_test(r->ov[r->ov_next].req); /* lets MPI move the other one on */
    }
    TRY(ft_dist_reduce_scatter_sum_f32(g, r->seg_off, r->chunk));
    int64_t a = r->seg_off[r->rank], b = r->seg_off[r->rank + 1];
    float *dst = r->own_grad + (lo + a - r->shard[r->rank]);
    for (int64_t i = a; i < b; i++) dst[i - a] += g[i];
    return FTUNE_OK;
}

/* ZeRO 3: a segment's values into the trainer's window (all-gathered from
 * the owners), or at init this rank's part of them kept. Every rank
 * computes the same initial values (the same model and seed, which
 * check_same_run compares), so init moves nothing. */
static FTUNE_MUST_USE ftune_status shard_values(void *ctx, int64_t lo, int64_t hi, float *v, bool init) {
    run *r = ctx;
    seg_split(r, lo, hi);
    int64_t a = r->seg_off[r->rank], b = r->seg_off[r->rank + 1];
    float *mine = r->own_vals + (lo + a - r->shard[r->rank]);
    if (init) {
        memcpy(mine, v + a, (size_t)(b - a) * sizeof(float));
        return FTUNE_OK;
    }
    memcpy(v + a, mine, (size_t)(b - a) * sizeof(float));
    return ft_dist_allgather_f32(v, r->seg_off, r->chunk);
}

/* Before the trainer is built: the flat size, the shards and this rank's
 * shard buffers, counted as gradients (and trainables). */
static FTUNE_MUST_USE ftune_status setup_zero(run *r) {
    ft_train_plan pl;
    r->topts.shard = &r->shard_io;
    r->topts.shard_values = r->zero == 3;
    r->shard_io = (ft_train_shard){ .values = shard_values, .grads = shard_grads, .ctx = r };
    TRY(ft_trainer_plan(&r->m->cfg, &r->topts, &pl));
    r->n_flat = pl.n_trainable;
    if (r->n_flat == 0)
        return ft_err(FTUNE_ERR_ARG, "--zero %d shards the trainable parameters, and this run has none (every weight "
                      "is frozen): use --zero 0", r->zero);
    r->shard = ft_malloc((size_t)(r->world + 1) * sizeof *r->shard);
    r->seg_off = ft_malloc((size_t)(r->world + 1) * sizeof *r->seg_off);
    if (!r->shard || !r->seg_off) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ft_dist_shard(r->n_flat, r->world, r->shard);
    r->own_n = r->shard[r->rank + 1] - r->shard[r->rank];
    r->own_grad = ft_mem_calloc(FT_MEM_GRADS, (size_t)(r->own_n + 1) * sizeof(float));
    if (r->zero == 3) r->own_vals = ft_mem_calloc(FT_MEM_TRAINABLE, (size_t)(r->own_n + 1) * sizeof(float));
    if (!r->own_grad || (r->zero == 3 && !r->own_vals))
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for this rank's shard (%lld floats)", (long long)r->own_n);
    TRY(ft_batch_init(&r->idle, 1, r->T));
    /* one row of padding: no targets, so no loss and a zero gradient */
    for (int t = 0; t < r->T; t++) {
        r->idle.tokens[t] = r->dt.eos_id >= 0 ? r->dt.eos_id : 0;
        r->idle.targets[t] = -1;
        r->idle.pos[t] = t;
        r->idle.doc[t] = 0;
    }
    r->idle.B = 1;
    r->idle.T = r->T;
    r->idle.n_targets = 0;
    return FTUNE_OK;
}

/* ZeRO 2/3: the pieces of the parameters in this rank's shard, their data
 * in the trainer's whole values (ZeRO 2) or this rank's own (ZeRO 3), their
 * gradients in own_grad. */
static FTUNE_MUST_USE ftune_status own_pieces(run *r) {
    r->vals = ft_trainer_values(r->tr, NULL);
    r->grads = NULL;
    r->win_n = (int64_t)(ft_trainer_get_plan(r->tr)->grad_bytes / sizeof(float));
    r->recv_n = (r->win_n < r->own_n ? r->win_n : r->own_n) + 1;
    for (int k = 0; k < 2 && r->o->overlap; k++) {
        r->ov[k].send = ft_mem_alloc(FT_MEM_GRADS, (size_t)r->win_n * sizeof(float));
        r->ov[k].recv = ft_mem_alloc(FT_MEM_GRADS, (size_t)r->recv_n * sizeof(float));
        if (!r->ov[k].send || !r->ov[k].recv) return ft_err(FTUNE_ERR_NOMEM, "out of memory for --overlap's buffers");
    }
    int64_t lo = r->shard[r->rank], hi = r->shard[r->rank + 1];
    r->own_base = r->zero == 3 ? r->own_vals : r->vals + lo;
    r->own = ft_calloc((size_t)(r->n_params ? r->n_params : 1), sizeof *r->own);
    if (!r->own) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    int64_t at = 0;
    for (int i = 0; i < r->n_params; i++) {
        const ft_train_param *p = ft_trainer_param(r->tr, i);
        if (p->offset != at) return ft_err(FTUNE_ERR_UNSUPPORTED, "parameter \"%s\" is not where the flat trainable array has it", p->opt.name);
        int64_t a = p->offset, b = a + p->opt.numel, s = a > lo ? a : lo, e = b < hi ? b : hi;
        at = b;
        if (s >= e) continue;
        ft_param *q = &r->own[r->n_own++];
        *q = r->params[i];
        q->data = r->own_base + (s - lo);
        q->grad = r->own_grad + (s - lo);
        q->numel = e - s;
        q->ndim = 1;
        memset(q->shape, 0, sizeof q->shape);
        q->shape[0] = e - s;
    }
    if (at != r->n_flat) return ft_err(FTUNE_ERR_UNSUPPORTED, "the parameters cover %lld of %lld trainable floats", (long long)at, (long long)r->n_flat);
    return FTUNE_OK;
}

/* The trainer's flat arrays, this rank's shard of them and the parameters
 * (or pieces of parameters) its optimizer updates. */
static FTUNE_MUST_USE ftune_status setup_shards(run *r) {
    if (r->zero >= 2) return own_pieces(r);
    r->vals = ft_trainer_values(r->tr, &r->n_flat);
    r->grads = ft_trainer_grads(r->tr, NULL);
    /* the parameters tile the flat arrays in order (what sharding them assumes) */
    int64_t at = 0;
    for (int i = 0; i < r->n_params; i++) {
        if (r->params[i].data != r->vals + at || r->params[i].grad != r->grads + at)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "parameter \"%s\" is not where the flat trainable array has it", r->params[i].name);
        at += r->params[i].numel;
    }
    if (at != r->n_flat) return ft_err(FTUNE_ERR_UNSUPPORTED, "the parameters cover %lld of %lld trainable floats", (long long)at, (long long)r->n_flat);
    r->shard = ft_malloc((size_t)(r->world + 1) * sizeof *r->shard);
    if (!r->shard) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ft_dist_shard(r->n_flat, r->world, r->shard);
    if (r->zero == 0) {
        r->own = r->params;
        r->n_own = r->n_params;
        return FTUNE_OK;
    }
    r->own_base = r->vals + r->shard[r->rank];
    return ft_params_shard(r->params, r->n_params, r->vals, r->shard[r->rank], r->shard[r->rank + 1], &r->own, &r->n_own);
}

/* What, beyond the stored run configuration, every rank must share: the
 * settings that decide which collectives run when and on what sizes. A
 * difference in any of them is a deadlock (one rank saves or validates
 * where another trains on) or a mismatched message, so they are compared
 * before step 1 with the rest. Named by their ftune_train_opts fields. */
static FTUNE_MUST_USE ftune_status add_schedule(run *r, cJSON *mine) {
    const ftune_train_opts *o = r->o;
    cJSON *d = cJSON_GetObjectItemCaseSensitive(mine, "data");
    if (!d) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    /* the batches an epoch has (the iterator's, from the data and the batch
     * options) and the validation set as tokenized: its batches are
     * spread over the ranks */
    int64_t nb = 0, nvb = 0;
    TRY(ft_batch_iter_epoch_batches(r->it, 0, &nb));
    if (r->val_it) TRY(ft_batch_iter_epoch_batches(r->val_it, 0, &nvb));
    cJSON_AddNumberToObject(d, "batches_per_epoch", (double)nb);
    cJSON_AddNumberToObject(d, "val_batches", (double)nvb);
    char hex[32] = "";
    if (r->val) {
        const ft_dataset *ds = r->val;
        uint64_t h = ft_fnv1a(FT_FNV0, ds->tokens, (size_t)ds->off[ds->n] * sizeof *ds->tokens);
        h = ft_fnv1a(h, ds->mask, (size_t)ds->off[ds->n]);
        h = ft_fnv1a(h, ds->off, (size_t)(ds->n + 1) * sizeof *ds->off);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    }
    cJSON_AddStringToObject(d, "val_fingerprint", hex);
    cJSON_AddNumberToObject(mine, "zero", r->zero);
    cJSON_AddNumberToObject(mine, "bucket_mb", (double)r->chunk * sizeof(float) / 1048576.0);
    cJSON_AddBoolToObject(mine, "overlap", o->overlap);
    cJSON_AddBoolToObject(mine, "consolidate", o->consolidate);
    /* not in the stored configuration: the optimizer file names its kind */
    cJSON_AddStringToObject(mine, "optim", ft_optim_kind_name(r->opt.cfg.kind));
    cJSON_AddStringToObject(mine, "resume", o->resume ? o->resume : "");
    cJSON_AddNumberToObject(mine, "steps", (double)o->steps);
    cJSON_AddNumberToObject(mine, "epochs", o->epochs);
    cJSON_AddNumberToObject(mine, "eval_every", o->eval_every);
    cJSON_AddNumberToObject(mine, "save_every", o->save_every);
    cJSON_AddBoolToObject(mine, "save_initial_adapter", o->save_initial_adapter);
    cJSON_AddNumberToObject(mine, "grad_checkpoint", o->grad_checkpoint);
    const char *lsn[] = { "none", "dynamic", "fixed" };
    cJSON_AddStringToObject(mine, "loss_scale_mode", lsn[r->scaler.mode]);
    cJSON_AddNumberToObject(mine, "loss_scale", r->scaler.scale);
    cJSON_AddNumberToObject(mine, "loss_scale_growth_interval", r->scaler.growth_interval);
    return FTUNE_OK;
}

/* Every rank must train the same run: rank 0's configuration (model and
 * data fingerprints, every setting, add_schedule's) is compared on each
 * rank, and any difference fails every rank, naming the key and the rank. */
static FTUNE_MUST_USE ftune_status check_same_run(run *r) {
    if (r->world == 1) return FTUNE_OK;
    cJSON *mine = cJSON_Duplicate(r->config, true);
    if (!mine) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status ast = add_schedule(r, mine);
    if (ast) { cJSON_Delete(mine); return ast; }
    char *text = cJSON_PrintUnformatted(mine);
    int64_t len = text ? (int64_t)strlen(text) + 1 : 0;
    ftune_status st = text ? FTUNE_OK : ft_err(FTUNE_ERR_NOMEM, "out of memory");
    if (!st) st = ft_dist_bcast(&len, sizeof len, 0);
    char *root = st ? NULL : ft_malloc((size_t)len);
    if (!st && !root) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
    if (!st && is_root(r)) memcpy(root, text, (size_t)len);
    if (!st) st = ft_dist_bcast(root, (size_t)len, 0);
    int bad = 0;
    char key[256], *va = NULL, *vb = NULL;
    if (!st) {
        cJSON *theirs = cJSON_Parse(root);
        if (!theirs) st = ft_err(FTUNE_ERR_FORMAT, "rank %d: rank 0's configuration did not arrive whole", r->rank);
        else if (config_diff(theirs, mine, "", key, sizeof key, &va, &vb)) bad = r->rank + 1;
        cJSON_Delete(theirs);
    }
    int first = bad ? bad : 1 << 30;
    if (!st) {
        int v[2] = { bad, -first }; /* the last and the first differing rank */
        st = ft_dist_allreduce_max_i32(v, 2);
        bad = v[0];
        first = -v[1];
    }
    if (!st && bad) {
        /* the first differing rank's finding, told to every rank (each
         * reports it: a rank's own output may be cut short by the abort) */
        char msg[1024] = "";
        if (r->rank == first - 1)
            snprintf(msg, sizeof msg, "rank %d was started differently from rank 0: %s is %s on rank 0 and %s on rank %d "
                     "(every rank must be given the same model, data and options)", r->rank, key, va ? va : "?",
                     vb ? vb : "?", r->rank);
        st = ft_dist_bcast(msg, sizeof msg, first - 1);
        if (!st) st = ft_err(FTUNE_ERR_ARG, "%s", msg);
    }
    free(va);
    free(vb);
    free(root);
    free(text);
    cJSON_Delete(mine);
    return st;
}

/* ZeRO 1: this rank's pieces' m or v, packed as its flat range, or back. */
static void pack_own(run *r, float *dst, bool v) {
    for (int i = 0; i < r->n_own; i++)
        memcpy(dst + (r->own[i].data - r->own_base), v ? r->opt.v[i] : r->opt.m[i], (size_t)r->own[i].numel * sizeof(float));
}
static void unpack_own(run *r, const float *src, bool v) {
    for (int i = 0; i < r->n_own; i++)
        memcpy(v ? r->opt.v[i] : r->opt.m[i], src + (r->own[i].data - r->own_base), (size_t)r->own[i].numel * sizeof(float));
}

/* The optimizer file: ZeRO 0 saves rank 0's whole state; ZeRO 1 the state
 * checkpoint() gathered into full_mv, under the whole parameters' names,
 * so that either file resumes on any number of ranks at any stage. */
/* r->params at their offsets from base (an array of n_flat floats), as
 * ft_adamw_view reads them; the caller frees. */
static ft_param *flat_params(run *r, float *base) {
    ft_param *ps = ft_malloc((size_t)(r->n_params ? r->n_params : 1) * sizeof *ps);
    if (!ps) return NULL;
    for (int i = 0; i < r->n_params; i++) {
        ps[i] = r->params[i];
        ps[i].data = base + ft_trainer_param(r->tr, i)->offset;
        ps[i].grad = NULL;
    }
    return ps;
}

static FTUNE_MUST_USE ftune_status mv_view(run *r, ft_adamw *view) {
    ft_param *ps = flat_params(r, r->full_mv);
    if (!ps) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = ft_adamw_view(view, ps, r->n_params, &r->opt.cfg, r->full_mv, r->full_mv, r->full_mv + r->n_flat);
    free(ps);
    return st;
}

static FTUNE_MUST_USE ftune_status save_optimizer(run *r, const char *path) {
    if (r->zero == 0) return ft_adamw_save(&r->opt, path, NULL);
    ft_adamw view;
    TRY(mv_view(r, &view));
    view.step = r->opt.step;
    ftune_status st = ft_adamw_save(&view, path, NULL);
    ft_adamw_free(&view);
    return st;
}

/* Rank 0 reads the whole state: ZeRO 0 into its optimizer, ZeRO 1 into
 * full_mv (resume() scatters it). */
static FTUNE_MUST_USE ftune_status load_optimizer(run *r, const char *path) {
    if (r->zero == 0) return ft_adamw_load(&r->opt, path);
    r->full_mv = ft_malloc((size_t)(2 * r->n_flat + 1) * sizeof(float));
    if (!r->full_mv) return ft_err(FTUNE_ERR_NOMEM, "out of memory for the optimizer state of %s", path);
    ft_adamw view;
    TRY(mv_view(r, &view));
    ftune_status st = ft_adamw_load(&view, path);
    if (!st) r->opt.step = view.step;
    ft_adamw_free(&view);
    return st;
}

static FTUNE_MUST_USE ftune_status save_checkpoint(run *r, const char *shard_tmp);
static FTUNE_MUST_USE ftune_status load_checkpoint(run *r, const char *dir);

/* ZeRO 3: the whole values gathered into full_vals on rank 0 (every rank
 * takes part; elsewhere nothing). */
static FTUNE_MUST_USE ftune_status gather_values(run *r) {
    if (r->zero != 3) return FTUNE_OK;
    ftune_status st = FTUNE_OK;
    if (is_root(r) && !(r->full_vals = ft_malloc((size_t)r->n_flat * sizeof(float))))
        st = ft_err(FTUNE_ERR_NOMEM, "out of memory for the whole trainable values");
    int bad = st != FTUNE_OK;
    TRY(ft_dist_allreduce_max_i32(&bad, 1));
    if (bad) ft_dist_set_failed_together();
    if (bad) return st ? st : ft_err(FTUNE_ERR_NOMEM, "rank %d: rank 0 is out of memory for the whole values", r->rank);
    return ft_dist_gather_f32(r->full_vals, r->own_vals, r->shard, 0, r->chunk);
}

/* Whether checkpoints are sharded: ZeRO >= 1 on several ranks, full
 * fine-tuning, without --consolidate (LoRA's state is small: always whole). */
static bool sharded_ckpt(const run *r) {
    return r->zero >= 1 && r->world > 1 && r->o->mode == FTUNE_TRAIN_FULL && !r->o->consolidate;
}

/* This rank's shard of a checkpoint: its range's values and AdamW moments,
 * with the range and the job's size in the metadata. */
static FTUNE_MUST_USE ftune_status write_shard(run *r, const char *path) {
    int64_t lo = r->shard[r->rank], n = r->shard[r->rank + 1] - lo;
    float *mv = ft_malloc((size_t)(2 * n + 1) * sizeof(float));
    if (!mv) return ft_err(FTUNE_ERR_NOMEM, "out of memory for the optimizer shard");
    pack_own(r, mv, false);
    pack_own(r, mv + n, true);
    const float *vals = r->zero == 3 ? r->own_vals : r->vals + lo;
    const char *names[3] = { "values", "exp_avg", "exp_avg_sq" };
    const float *data[3] = { vals, mv, mv + n };
    st_out_tensor ts[3];
    for (int i = 0; i < 3; i++) {
        ts[i] = (st_out_tensor){ .name = names[i], .dtype = FT_F32, .ndim = 1, .data = data[i] };
        ts[i].shape[0] = n;
    }
    char rk[24], wd[24], los[24], his[24], nf[24];
    snprintf(rk, sizeof rk, "%d", r->rank);
    snprintf(wd, sizeof wd, "%d", r->world);
    snprintf(los, sizeof los, "%lld", (long long)lo);
    snprintf(his, sizeof his, "%lld", (long long)(lo + n));
    snprintf(nf, sizeof nf, "%lld", (long long)r->n_flat);
    const char *meta[] = { "ftune.kind", "checkpoint-shard", "rank", rk, "world", wd, "lo", los, "hi", his,
                           "n_flat", nf, NULL };
    ftune_status st = ft_st_write(path, ts, 3, meta);
    free(mv);
    return st;
}

/* Reads this rank's shard of checkpoint dir, checked against this rank's range. */
static FTUNE_MUST_USE ftune_status read_shard(run *r, const char *dir) {
    char name[64], path[4400];
    ft_ckpt_shard_name(name, r->rank, r->world);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int64_t lo = r->shard[r->rank], n = r->shard[r->rank + 1] - lo;
    st_file f;
    TRY(ft_st_open(&f, path));
    ftune_status st = FTUNE_OK;
    const char *keys[] = { "rank", "world", "lo", "hi", "n_flat" };
    int64_t want[] = { r->rank, r->world, lo, lo + n, r->n_flat };
    for (int i = 0; i < 5 && !st; i++) {
        const char *v = ft_st_meta(&f, keys[i]);
        char *end = NULL;
        long long got = v ? strtoll(v, &end, 10) : -1;
        if (!v || *end || got != want[i])
            st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata %s is %s, this rank expects %lld", path, keys[i], v ? v : "missing",
                        (long long)want[i]);
    }
    const char *names[3] = { "values", "exp_avg", "exp_avg_sq" };
    float *mv = st ? NULL : ft_malloc((size_t)(2 * n + 1) * sizeof(float));
    if (!st && !mv) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 3 && !st; i++) {
        const st_tensor *t = ft_st_find(&f, names[i]);
        if (!t || t->dtype != FT_F32 || t->ndim != 1 || t->shape[0] != n) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is missing or not F32 of %lld elements", path, names[i],
                        (long long)n);
            break;
        }
        float *dst = i == 0 ? (r->zero == 3 ? r->own_vals : r->vals + lo) : mv + (i - 1) * n;
        memcpy(dst, t->data, (size_t)n * sizeof(float));
    }
    if (!st) {
        unpack_own(r, mv, false);
        unpack_own(r, mv + n, true);
    }
    free(mv);
    ft_st_close(&f);
    return st;
}

/* After rank 0's save (st: this rank's status): every rank waits for rank
 * 0's word, since one that went on (or stopped) and failed would abort the
 * job while rank 0 is still writing; a failure of rank 0 is then one every
 * rank returns together (ftune_dist_failed_together), a rank's own is not. */
static FTUNE_MUST_USE ftune_status after_root_save(run *r, ftune_status st) {
    int failed = st != FTUNE_OK;
    double limit = ft_dist_set_timeout(0); /* waits for rank 0's disk: not timed */
    ftune_status bst = ft_dist_bcast(&failed, sizeof failed, 0);
    ft_dist_set_timeout(limit);
    if (!bst && failed) ft_dist_set_failed_together();
    if (st || bst) return st ? st : bst;
    if (failed) return ft_err(FTUNE_ERR_IO, "rank %d: rank 0 could not save checkpoint-%lld (its error says why)", r->rank, (long long)r->step);
    return FTUNE_OK;
}

/* A sharded checkpoint: rank 0 makes the temporary directory, every rank
 * writes its shard into it, and once all have, rank 0 adds
 * trainer_state.json (the manifest: the world size and every shard's
 * checksum) and renames it into place, which completes the checkpoint. */
static FTUNE_MUST_USE ftune_status checkpoint_sharded(run *r) {
    long pid = (long)getpid();
    TRY(ft_dist_bcast(&pid, sizeof pid, 0));
    char tmp[4200], path[4400], name[64];
    snprintf(tmp, sizeof tmp, "%s/checkpoint-%lld.tmp.%ld", r->o->out_dir, (long long)r->step, pid);
    ftune_status st = FTUNE_OK;
    if (is_root(r)) {
        st = rm_tree(tmp);
        if (!st) st = mkdir_p(tmp);
    }
    int failed = st != FTUNE_OK;
    TRY(ft_dist_bcast(&failed, sizeof failed, 0));
    if (failed) ft_dist_set_failed_together();
    if (failed) return st ? st : ft_err(FTUNE_ERR_IO, "rank %d: rank 0 could not create %s (its error says why)", r->rank, tmp);
    ft_ckpt_shard_name(name, r->rank, r->world);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    st = write_shard(r, path);
    int bad = st != FTUNE_OK;
    double limit = ft_dist_set_timeout(0); /* waits for the slowest rank's disk: not timed */
    ftune_status ast = ft_dist_allreduce_max_i32(&bad, 1);
    ft_dist_set_timeout(limit);
    TRY(ast);
    if (bad) {
        ft_dist_set_failed_together(); /* every rank knows: none aborts the others */
        if (is_root(r)) rm_tree_after(tmp); /* the shard's failure is the one to report */
        return st ? st : ft_err(FTUNE_ERR_IO, "rank %d: another rank could not write its shard of checkpoint-%lld (its "
                                "error says why)", r->rank, (long long)r->step);
    }
    if (is_root(r)) st = save_checkpoint(r, tmp);
    else snprintf(r->res.checkpoint, sizeof r->res.checkpoint, "%s/checkpoint-%lld", r->o->out_dir, (long long)r->step);
    return after_root_save(r, st);
}

/* A checkpoint of the whole run, written by rank 0: under ZeRO 1 the
 * optimizer shards are gathered to it first (every rank takes part); or a
 * sharded one. */
static FTUNE_MUST_USE ftune_status checkpoint(run *r) {
    ft_dist_set_phase("checkpoint-%lld", (long long)r->step);
    if (sharded_ckpt(r)) return checkpoint_sharded(r);
    ftune_status st = FTUNE_OK;
    if (r->zero > 0) {
        int64_t own_n = r->shard[r->rank + 1] - r->shard[r->rank];
        float *mine = ft_malloc((size_t)(own_n + 1) * sizeof(float));
        if (is_root(r)) r->full_mv = ft_malloc((size_t)(2 * r->n_flat + 1) * sizeof(float));
        if (!mine || (is_root(r) && !r->full_mv)) st = ft_err(FTUNE_ERR_NOMEM, "out of memory for the optimizer state");
        for (int k = 0; k < 2 && !st; k++) {
            pack_own(r, mine, k == 1);
            st = ft_dist_gather_f32(is_root(r) ? r->full_mv + k * r->n_flat : NULL, mine, r->shard, 0, r->chunk);
        }
        free(mine);
    }
    if (!st) st = gather_values(r);
    if (!st && is_root(r)) st = save_checkpoint(r, NULL);
    else if (!st) snprintf(r->res.checkpoint, sizeof r->res.checkpoint, "%s/checkpoint-%lld", r->o->out_dir, (long long)r->step);
    free(r->full_vals);
    r->full_vals = NULL;
    free(r->full_mv);
    r->full_mv = NULL;
    return after_root_save(r, st);
}

/* --resume: rank 0 reads and checks the checkpoint, then hands every rank
 * the values, the optimizer state (its shard under ZeRO 1), the step, the
 * dropout micro-step, the data cursor, the skipped steps and the loss scaler. */
static FTUNE_MUST_USE ftune_status resume(run *r) {
    ft_dist_set_phase("resuming from %s", r->o->resume);
    ftune_status st = is_root(r) ? load_checkpoint(r, r->o->resume) : FTUNE_OK;
    int bad = st != FTUNE_OK;
    double limit = ft_dist_set_timeout(0); /* waits for rank 0's disk: not timed */
    ftune_status ast = ft_dist_allreduce_max_i32(&bad, 1);
    ft_dist_set_timeout(limit);
    TRY(ast);
    if (bad) ft_dist_set_failed_together();
    if (bad) return st ? st : ft_err(FTUNE_ERR_ARG, "rank %d: rank 0 could not resume from %s (its error says why)", r->rank, r->o->resume);
    int sharded = r->resume_sharded;
    TRY(ft_dist_bcast(&sharded, sizeof sharded, 0));
    ft_data_cursor cur = ft_batch_iter_cursor(r->it);
    int64_t v[6] = { r->step, (int64_t)ft_trainer_get_micro_step(r->tr), cur.epoch, cur.index, r->opt.step, r->skipped };
    TRY(ft_dist_bcast(v, sizeof v, 0));
    TRY(ft_dist_bcast(&r->scaler, sizeof r->scaler, 0)); /* its scale and growth tracker */
    if (sharded) {
        /* each rank its own shard (rank 0 has checked every shard's checksum) */
        st = read_shard(r, r->o->resume);
        bad = st != FTUNE_OK;
        TRY(ft_dist_allreduce_max_i32(&bad, 1));
        if (bad) return st ? st : ft_err(FTUNE_ERR_FORMAT, "rank %d: another rank could not read its shard of %s (its "
                                         "error says why)", r->rank, r->o->resume);
        if (r->zero < 3) TRY(ft_dist_allgather_f32(r->vals, r->shard, r->chunk));
    } else if (r->zero == 3) {
        st = ft_dist_scatter_f32(r->full_vals, r->own_vals, r->shard, 0, r->chunk);
        free(r->full_vals);
        r->full_vals = NULL;
        TRY(st);
    } else TRY(ft_dist_bcast(r->vals, (size_t)r->n_flat * sizeof(float), 0));
    if (!sharded && r->zero == 0) TRY(ft_dist_bcast(r->opt.state, r->opt.state_bytes, 0));
    else if (!sharded) {
        int64_t own_n = r->shard[r->rank + 1] - r->shard[r->rank];
        float *mine = ft_malloc((size_t)(own_n + 1) * sizeof(float));
        if (!mine) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        for (int k = 0; k < 2 && !st; k++) {
            st = ft_dist_scatter_f32(is_root(r) ? r->full_mv + k * r->n_flat : NULL, mine, r->shard, 0, r->chunk);
            if (!st) unpack_own(r, mine, k == 1);
        }
        free(mine);
        free(r->full_mv);
        r->full_mv = NULL;
        if (st) return st;
    }
    if (!is_root(r)) {
        r->step = v[0];
        ft_trainer_set_micro_step(r->tr, (uint64_t)v[1]);
        TRY(ft_batch_iter_seek(r->it, (ft_data_cursor){ v[2], v[3] }));
        r->opt.step = v[4];
        r->skipped = v[5];
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------ checkpoints */

/* The trainables from the trainer, or (ZeRO 3) from full, the whole flat values. */
static FTUNE_MUST_USE ftune_status write_trainable(run *r, const char *path, const float *full) {
    int n = ft_trainer_n_params(r->tr);
    st_out_tensor *ts = ft_calloc((size_t)n, sizeof *ts);
    if (!ts) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const ft_train_param *tp = ft_trainer_param(r->tr, i);
        const ft_param *p = &tp->opt;
        ts[i] = (st_out_tensor){ .name = p->name, .dtype = FT_F32, .ndim = p->ndim, .data = full ? full + tp->offset : p->data };
        ts[i].shape[0] = p->shape[0];
        ts[i].shape[1] = p->shape[1];
    }
    const char *meta[] = { "ftune.kind", "trainable", NULL };
    ftune_status st = ft_st_write(path, ts, n, meta);
    free(ts);
    return st;
}

static FTUNE_MUST_USE ftune_status read_trainable(run *r, const char *path, float *full) {
    st_file f;
    TRY(ft_st_open(&f, path));
    int n = ft_trainer_n_params(r->tr);
    ftune_status st = FTUNE_OK;
    if (f.n != n) st = ft_err(FTUNE_ERR_FORMAT, "%s: %d tensors, the trainer has %d", path, f.n, n);
    for (int i = 0; i < n && !st; i++) {
        const ft_train_param *tp = ft_trainer_param(r->tr, i);
        const ft_param *p = &tp->opt;
        const st_tensor *t = ft_st_find(&f, p->name);
        if (!t) { st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is missing", path, p->name); break; }
        bool shape_ok = t->dtype == FT_F32 && t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
                        (p->ndim == 1 || t->shape[1] == p->shape[1]);
        if (!shape_ok) { st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": dtype or shape differs from the trainer's", path, p->name); break; }
        memcpy(full ? full + tp->offset : p->data, t->data, (size_t)p->numel * sizeof(float));
    }
    ft_st_close(&f);
    return st;
}

/* The files of a checkpoint whose checksums trainer_state.json records. */
static const char *const ckpt_sums[] = { "trainable.safetensors", "optimizer.safetensors", "adapter_model.safetensors",
                                         "adapter_config.json" };

/* Rank 0 writes a checkpoint: whole (every file here), or sharded, where
 * shard_tmp is the temporary directory holding every rank's shard already
 * and only trainer_state.json (with their checksums) is added before the
 * rename that completes it. */
static FTUNE_MUST_USE ftune_status save_checkpoint(run *r, const char *shard_tmp) {
    char dir[4096], tmp[4200], old[4200], path[4400];
    snprintf(dir, sizeof dir, "%s/checkpoint-%lld", r->o->out_dir, (long long)r->step);
    /* the pid keeps two processes apart even where the lock cannot (a
     * directory on a file system without flock) */
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    if (shard_tmp) snprintf(tmp, sizeof tmp, "%s", shard_tmp);
    snprintf(old, sizeof old, "%s.old.%ld", dir, (long)getpid());
    ftune_status st = FTUNE_OK;
    if (!shard_tmp) {
        st = rm_tree(tmp);
        if (!st) st = mkdir_p(tmp);
        if (!st) { snprintf(path, sizeof path, "%s/trainable.safetensors", tmp); st = write_trainable(r, path, r->full_vals); }
        if (!st) { snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp); st = save_optimizer(r, path); }
        if (!st && r->wrapped) st = save_peft(r, tmp, r->full_vals, NULL);
    }
    if (!st) {
        cJSON *j = cJSON_CreateObject();
        ft_data_cursor cur = ft_batch_iter_cursor(r->it);
        char ms[32];
        snprintf(ms, sizeof ms, "%llu", (unsigned long long)ft_trainer_get_micro_step(r->tr));
        cJSON_AddStringToObject(j, "format", FT_CKPT_FORMAT);
        cJSON_AddNumberToObject(j, "version", FT_CKPT_VERSION);
        cJSON_AddNumberToObject(j, "step", (double)r->step);
        cJSON_AddStringToObject(j, "micro_step", ms);
        cJSON_AddNumberToObject(j, "data_epoch", (double)cur.epoch);
        cJSON_AddNumberToObject(j, "data_index", (double)cur.index);
        cJSON_AddNumberToObject(j, "skipped_steps", (double)r->skipped);
        if (ft_grad_scaler_on(&r->scaler)) {
            cJSON *ls = cJSON_AddObjectToObject(j, "loss_scaler");
            cJSON_AddStringToObject(ls, "mode", ft_loss_scale_mode_name(r->scaler.mode));
            cJSON_AddNumberToObject(ls, "scale", (double)r->scaler.scale); /* an f32: exact in a double */
            cJSON_AddNumberToObject(ls, "growth_tracker", r->scaler.growth_tracker);
            cJSON_AddNumberToObject(ls, "growth_interval", r->scaler.growth_interval);
        }
        if (r->o->model_path) cJSON_AddStringToObject(j, "model_path", r->o->model_path);
        cJSON_AddItemReferenceToObject(j, "config", r->config);
        /* checksums of the files as they are on disk, read back */
        cJSON *sums = cJSON_AddObjectToObject(j, "checksums");
        size_t n_sums = sizeof ckpt_sums / sizeof ckpt_sums[0];
        for (size_t i = 0; i < n_sums + (shard_tmp ? (size_t)r->world : 0) && !st; i++) {
            char name[64];
            if (i < n_sums) snprintf(name, sizeof name, "%s", ckpt_sums[i]);
            else ft_ckpt_shard_name(name, (int)(i - n_sums), r->world);
            snprintf(path, sizeof path, "%s/%s", tmp, name);
            if (!ft_file_exists(path)) {
                /* a shard rank 0 cannot see: the ranks do not share the output directory */
                if (i >= n_sums)
                    st = ft_err(FTUNE_ERR_IO, "%s: rank %d wrote it, but rank 0 does not see it: sharded checkpoints "
                                "need -o on a file system every rank shares (else give --consolidate)", path,
                                (int)(i - n_sums));
                continue;
            }
            uint64_t h;
            if ((st = ft_file_fnv1a(path, &h))) break;
            char hex[32];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
            cJSON_AddStringToObject(sums, name, hex);
        }
        if (shard_tmp) {
            cJSON *sh = cJSON_AddObjectToObject(j, "shards");
            cJSON_AddNumberToObject(sh, "world", r->world);
            cJSON_AddNumberToObject(sh, "opt_step", (double)r->opt.step);
        }
        snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
        char *text = NULL;
        size_t text_len = 0;
        if (!st) st = ft_ckpt_state_text(j, &text, &text_len);
        if (!st) st = ft_write_file_atomic(path, text, text_len);
        free(text);
        cJSON_Delete(j);
    }
    if (!st) st = fsync_dir(tmp);
    if (!st && ft_is_dir(dir)) {
        if (!(st = rm_tree(old)) && rename(dir, old) != 0)
            st = ft_err(FTUNE_ERR_IO, "%s: cannot rename: %s", dir, strerror(errno));
    }
    if (!st && rename(tmp, dir) != 0) st = ft_err(FTUNE_ERR_IO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    if (!st) st = fsync_dir(r->o->out_dir);
    if (st) {
        ft_err_prefix(st, "saving checkpoint %s", dir);
        rm_tree_after(tmp); /* the save's failure is the one to report */
        return st;
    }
    /* the checkpoint is in place: a copy of the one it replaced left behind
     * costs disk, not the run */
    rm_tree_after(old);
    snprintf(r->res.checkpoint, sizeof r->res.checkpoint, "%s", dir);
    ftune_train_progress p = { .ev = FTUNE_TRAIN_SAVE, .step = r->step, .path = dir };
    emit(r, &p);
    return FTUNE_OK;
}

/* The other checkpoints beside dir (in its parent), for a message:
 * "checkpoint-5, checkpoint-10" or "none". */
static void sibling_checkpoints(const char *dir, char *out, size_t cap) {
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    const char *self = slash ? slash + 1 : parent;
    char selfname[256];
    snprintf(selfname, sizeof selfname, "%s", self);
    if (slash) *slash = 0;
    else snprintf(parent, sizeof parent, ".");
    snprintf(out, cap, "none");
    DIR *d = opendir(slash && !*parent ? "/" : parent);
    if (!d) return;
    size_t len = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char *endp;
        if (strncmp(e->d_name, "checkpoint-", 11) != 0 || strcmp(e->d_name, selfname) == 0) continue;
        strtoll(e->d_name + 11, &endp, 10);
        if (endp == e->d_name + 11 || *endp) continue;
        int k = snprintf(out + len, cap - len, "%s%s", len ? ", " : "", e->d_name);
        if (k < 0 || (size_t)k >= cap - len) break;
        len += (size_t)k;
    }
    closedir(d);
}

/* 1: the checkpoint's model has interleaved q/k rows, 0: rotate-half, -1:
 * unknown. Its config's "rope_layout"; a checkpoint from before that field
 * was written: the format its model_path names (a directory: Hugging Face;
 * .gguf: interleaved for llama, as the loader keeps it; another file:
 * llama2.c), unknown when there is none or it is gone. */
static int ckpt_interleaved(const ft_ckpt_state *cs) {
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(cs->config, "model");
    const cJSON *rl = cJSON_GetObjectItemCaseSensitive(mo, "rope_layout");
    if (rl) {
        if (!cJSON_IsString(rl)) return -1;
        return strcmp(rl->valuestring, layout_name(true)) == 0 ? 1 : strcmp(rl->valuestring, layout_name(false)) == 0 ? 0 : -1;
    }
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(cs->root, "model_path");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(mo, "arch");
    if (!cJSON_IsString(mp)) return -1;
    const char *p = mp->valuestring;
    size_t n = strlen(p);
    if (ft_is_dir(p)) return 0;
    if (n >= 5 && strcmp(p + n - 5, ".gguf") == 0) return cJSON_IsString(arch) && strcmp(arch->valuestring, "llama") == 0;
    return ft_file_exists(p) ? 1 : -1;
}

/* A checkpoint trained on the same model in the other q/k layout: the rows
 * of q_proj/k_proj (full: weights and biases; LoRA: lora_B) in the values
 * just read and in AdamW's m and v, permuted into this run's layout (an
 * exact reordering). 8-bit moments are refused: their blocks span rows. */
static FTUNE_MUST_USE ftune_status permute_resumed(run *r, const char *dir, bool to_interleaved) {
    const ft_config *c = &r->m->cfg;
    int n = ft_trainer_n_params(r->tr);
    for (int i = 0; i < n; i++) {
        const ft_train_param *tp = ft_trainer_param(r->tr, i);
        const ft_param *p = &tp->opt;
        int heads = tp->target >= 0 ? ft_module_rope_heads(c, (ft_module)tp->target) : 0;
        if (heads == 0 || (r->o->mode == FTUNE_TRAIN_LORA && !strstr(p->name, "lora_B"))) continue;
        int rows = (int)p->shape[0], cols = p->ndim == 1 ? 1 : (int)p->shape[1];
        float *m = NULL, *v = NULL;
        if (r->zero == 0) {
            for (int j = 0; j < r->opt.n && !m; j++)
                if (strcmp(r->opt.params[j].name, p->name) == 0) {
                    m = r->opt.m[j];
                    v = r->opt.v[j];
                    if (!m) return ft_err(FTUNE_ERR_UNSUPPORTED, "--resume %s: the checkpoint's q/k rows are in the %s "
                                          "layout, this run's model has the %s one, and %s's 8-bit optimizer state "
                                          "cannot be permuted exactly: resume on the model in the checkpoint's format",
                                          dir, layout_desc(!to_interleaved), layout_desc(to_interleaved), p->name);
                }
            if (!m) return ft_err(FTUNE_ERR_ARG, "%s: no optimizer state for %s", dir, p->name);
        } else {
            m = r->full_mv + tp->offset;
            v = r->full_mv + r->n_flat + tp->offset;
        }
        float *val = r->zero == 3 ? r->full_vals + tp->offset : p->data;
        float *t[3] = { val, m, v };
        for (int k = 0; k < 3; k++) TRY(ft_permute_rope_rows(t[k], rows, cols, heads, to_interleaved));
    }
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status load_checkpoint(run *r, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (!ft_is_dir(dir)) return ft_err(FTUNE_ERR_IO, "--resume %s: no such checkpoint directory", dir);
    char *text;
    size_t len;
    TRY(ft_read_file(path, &text, &len));
    ft_ckpt_state cs;
    ftune_status st = ft_ckpt_state_parse(&cs, text, len, path);
    free(text);
    if (st) return st;
    /* the compute dtype first: the model's fingerprint differs with it too */
    const cJSON *cd = cJSON_GetObjectItemCaseSensitive(cs.config, "dtype");
    const char *ck_dt = cJSON_IsString(cd) ? cd->valuestring : "f32", *run_dt = ft_types[r->topts.compute].name;
    if (strcmp(ck_dt, run_dt) != 0) {
        st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint was trained with --dtype %s, this run has --dtype %s: "
                    "resume with --dtype %s (no conversion is done: the run would not continue exactly)", dir, ck_dt,
                    run_dt, ck_dt);
        ft_ckpt_state_free(&cs);
        return st;
    }
    char key[256], *va = NULL, *vb = NULL;
    /* a different quantization changes the weights, hence the fingerprint:
     * name the cause instead */
    const cJSON *qa = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cs.config, "model"), "quant");
    const char *qs = cJSON_IsString(qa) ? qa->valuestring : "none";
    const char *qr = r->m->quantized ? ft_types[r->m->quant].name : "none";
    if (strcmp(qs, qr) != 0) {
        st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint's base weights were quantized as %s, this run's as %s "
                    "(--quant must be the same)", dir, qs, qr);
        goto done;
    }
    /* the checkpoint's q/k layout: recorded, or (a checkpoint from before it
     * was) the one the loader gives the file its model_path names */
    cJSON *cmo = cJSON_GetObjectItemCaseSensitive((cJSON *)cs.config, "model");
    int ck_inter = ckpt_interleaved(&cs);
    if (ck_inter < 0 && cJSON_GetObjectItemCaseSensitive(cmo, "rope_layout")) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: \"config\".\"model\".\"rope_layout\" must be \"interleaved\" or \"rotate_half\"",
                    path);
        goto done;
    }
    bool run_inter = r->m->cfg.rope_interleaved, permute = ck_inter >= 0 && (ck_inter != 0) != run_inter;
    /* compared here, not as a setting: another layout is permuted below */
    if (cJSON_IsObject(cmo)) {
        cJSON_DeleteItemFromObjectCaseSensitive(cmo, "rope_layout");
        cJSON_AddStringToObject(cmo, "rope_layout", layout_name(run_inter));
    }
    if (config_diff(cs.config, r->config, "", key, sizeof key, &va, &vb)) {
        bool model = strncmp(key, "model.", 6) == 0, data = strncmp(key, "data.", 5) == 0;
        if (strcmp(key, "model.fingerprint") == 0 || strcmp(key, "data.fingerprint") == 0)
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint is from a different %s: same shape, different %s "
                        "(fingerprint %s there, %s in this run)", dir, model ? "model" : "training set",
                        model ? "weights" : "tokens", va ? va : "?", vb ? vb : "?");
        else st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint is from a different %s: %s is %s there, %s in this run",
                    dir, model ? "model" : data ? "training set" : "configuration", key, va ? va : "?", vb ? vb : "?");
        free(va);
        free(vb);
        goto done;
    }
    int64_t s = cs.step;
    if (s >= r->total_steps) {
        st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint is at step %lld, and this run has %lld steps", dir,
                    (long long)s, (long long)r->total_steps);
        goto done;
    }
    /* every step before the last trains K micro-batches (only the last of an
     * --epochs run may have fewer, and a checkpoint there does not resume) */
    if (cs.micro_step != (uint64_t)s * (uint64_t)r->K) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: micro_step %llu does not fit step %lld with %d micro-batch(es) per step "
                    "(it must be %llu)", path, (unsigned long long)cs.micro_step, (long long)s, r->K,
                    (unsigned long long)s * (unsigned long long)r->K);
        goto done;
    }
    /* the data cursor is where those micro-batches end */
    {
        ft_data_cursor want;
        if ((st = ft_batch_iter_cursor_after(r->it, cs.micro_step, &want))) goto done;
        if (want.epoch != cs.data_epoch || want.index != cs.data_index) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: data cursor epoch %lld, index %lld, but step %lld's %llu micro-batches "
                        "end at epoch %lld, index %lld", path, (long long)cs.data_epoch, (long long)cs.data_index,
                        (long long)s, (unsigned long long)cs.micro_step, (long long)want.epoch, (long long)want.index);
            goto done;
        }
    }
    /* a version 3 dynamic loss scaler: its scale and growth tracker steer the
     * run (which f16 steps overflow), and no checksum or other field checks them */
    if (!cs.state_checked && cs.has_scaler && cs.scaler_mode == FT_LOSS_SCALE_DYNAMIC) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: a version %d checkpoint has no checksum of its own, and its dynamic loss "
                    "scaler's state (scale, growth tracker) cannot be checked otherwise: it does not resume (train again "
                    "from the start, or from a checkpoint this version wrote)", path, cs.version);
        goto done;
    }
    /* the files, checked before any is read */
    for (int i = 0; i < cs.n_files; i++) {
        char fp[4400];
        snprintf(fp, sizeof fp, "%s/%s", dir, cs.files[i].name);
        uint64_t h;
        if ((st = ft_file_fnv1a(fp, &h))) goto done;
        if (h != cs.files[i].fnv) {
            char others[1024];
            sibling_checkpoints(dir, others, sizeof others);
            st = ft_err(FTUNE_ERR_FORMAT, "--resume %s: %s is damaged (checksum %016llx, trainer_state.json records "
                        "%016llx); nothing was loaded. Other checkpoints there: %s", dir, cs.files[i].name,
                        (unsigned long long)h, (unsigned long long)cs.files[i].fnv, others);
            goto done;
        }
    }
    /* the loss scaler: a version 3 checkpoint's must be this run's kind; a
     * version 2 one predates loss scaling and leaves this run's scaler at
     * its initial state */
    if (cs.version >= 3) {
        ft_loss_scale_mode there = cs.has_scaler ? cs.scaler_mode : FT_LOSS_SCALE_NONE;
        const ft_grad_scaler *sc = &r->scaler;
        if (there != sc->mode) {
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint's run used --loss-scale %s, this run %s: give the "
                        "same --loss-scale", dir, there == FT_LOSS_SCALE_FIXED ? "N (fixed)" : ft_loss_scale_mode_name(there),
                        sc->mode == FT_LOSS_SCALE_FIXED ? "N (fixed)" : ft_loss_scale_mode_name(sc->mode));
            goto done;
        }
        if (sc->mode == FT_LOSS_SCALE_FIXED && cs.scale != sc->scale) {
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint's run used --loss-scale %g, this run %g", dir,
                        (double)cs.scale, (double)sc->scale);
            goto done;
        }
        if (sc->mode == FT_LOSS_SCALE_DYNAMIC && cs.growth_interval != sc->growth_interval) {
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint's loss scale grows every %d finite steps, this run's "
                        "every %d", dir, (int)cs.growth_interval, (int)sc->growth_interval);
            goto done;
        }
    }
    if (cs.shard_world && permute) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "--resume %s: the checkpoint's q/k rows are in the %s layout of the model it was "
                    "trained on, this run's model has the %s one, and a sharded checkpoint is not permuted: resume it on "
                    "the model in the checkpoint's format", dir, layout_desc(!run_inter), layout_desc(run_inter));
        goto done;
    }
    if (cs.shard_world) {
        if (cs.shard_world != r->world) {
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint is sharded over %d ranks (a file per rank's ZeRO "
                        "shard) and this run has %d: resume it on %d ranks (with --consolidate there, its next "
                        "checkpoints are whole and resume on any number of ranks)", dir, cs.shard_world, r->world,
                        cs.shard_world);
            goto done;
        }
        if (r->zero == 0) {
            st = ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint holds ZeRO shards of the optimizer state: resume "
                        "with --zero 1, 2 or 3", dir);
            goto done;
        }
        r->opt.step = cs.shard_opt_step;
        r->resume_sharded = true;
    } else {
        snprintf(path, sizeof path, "%s/trainable.safetensors", dir);
        if (r->zero == 3 && !(r->full_vals = ft_malloc((size_t)r->n_flat * sizeof(float)))) {
            st = ft_err(FTUNE_ERR_NOMEM, "out of memory for the trainable values of %s", dir);
            goto done;
        }
        if ((st = read_trainable(r, path, r->full_vals))) goto done;
        snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
        if ((st = load_optimizer(r, path))) goto done;
        if (permute && (st = permute_resumed(r, dir, run_inter))) goto done;
    }
    /* skipped steps never reached the optimizer */
    if (r->opt.step != s - cs.skipped_steps) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: optimizer step %lld, but the checkpoint is at step %lld with %lld skipped", path,
                    (long long)r->opt.step, (long long)s, (long long)cs.skipped_steps);
        goto done;
    }
    ft_data_cursor cur = { cs.data_epoch, cs.data_index };
    if ((st = ft_batch_iter_seek(r->it, cur))) { st = ft_err_prefix(st, "%s", dir); goto done; }
    ft_trainer_set_micro_step(r->tr, cs.micro_step);
    r->step = s;
    r->skipped = cs.skipped_steps;
    if (cs.has_scaler) {
        r->scaler.scale = cs.scale;
        r->scaler.growth_tracker = cs.growth_tracker;
    }
done:
    ft_ckpt_state_free(&cs);
    return st;
}

/* metrics.jsonl of a resumed run: the lines up to the checkpoint's step
 * from the checkpoint's run, then the new ones. */
static FTUNE_MUST_USE ftune_status open_metrics(run *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->o->out_dir);
    char *keep = NULL;
    size_t nkeep = 0;
    if (r->o->resume && r->step > 0) {
        char src[4200];
        snprintf(src, sizeof src, "%s/../metrics.jsonl", r->o->resume);
        char *text;
        size_t len;
        if (ft_file_exists(src) && ft_read_file(src, &text, &len) == FTUNE_OK) {
            keep = ft_malloc(len + 1);
            for (char *line = text; keep && line < text + len;) {
                char *nl = memchr(line, '\n', (size_t)(text + len - line));
                size_t ll = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
                char save = line[ll];
                line[ll] = 0;
                cJSON *j = cJSON_Parse(line);
                const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
                if (cJSON_IsNumber(s) && s->valuedouble <= (double)r->step) {
                    memcpy(keep + nkeep, line, ll);
                    nkeep += ll;
                    keep[nkeep++] = '\n';
                }
                cJSON_Delete(j);
                line[ll] = save;
                line += ll + 1;
            }
            free(text);
        }
    }
    ftune_status st = ft_write_file_atomic(path, keep ? keep : "", nkeep);
    free(keep);
    if (st) return st;
    r->metrics = fopen(path, "a");
    if (!r->metrics) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return FTUNE_OK;
}

static const char *tb_dir(const ftune_train_opts *o) { return o->tensorboard_dir ? o->tensorboard_dir : o->out_dir; }

/* The TensorBoard directory, before step 1: made, writable (a file is
 * created there and removed: the permission bits do not tell root's
 * answer), and, for a new run in a directory of its own, without another
 * run's events files (their steps would mix with this run's). */
static FTUNE_MUST_USE ftune_status claim_tb_dir(run *r) {
    const ftune_train_opts *o = r->o;
    if (!o->tensorboard) return FTUNE_OK;
    const char *dir = tb_dir(o);
    ftune_status st = mkdir_p(dir);
    if (st) return ft_err_prefix(st, "--tensorboard %s", dir);
    char probe[4400];
    snprintf(probe, sizeof probe, "%s/.ftune-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return ft_err(FTUNE_ERR_IO, "--tensorboard %s: cannot write there: %s", dir, strerror(errno));
    close(fd);
    unlink(probe);
    if (o->tensorboard_dir && !o->resume && !o->overwrite && ft_tb_count_files(dir) > 0)
        return ft_err(FTUNE_ERR_ARG, "--tensorboard %s holds events files of another run: give --overwrite to replace "
                      "them, or another directory", dir);
    return FTUNE_OK;
}

/* The events file: a new one, or for a resumed run the directory's files
 * cut after the checkpoint's step and the newest continued. Up to 8 scalars
 * a step and a step time per rank. */
static FTUNE_MUST_USE ftune_status open_tb(run *r) {
    const ftune_train_opts *o = r->o;
    if (!o->tensorboard) return FTUNE_OK;
    if (o->overwrite) TRY(ft_tb_remove_all(tb_dir(o)));
    return ft_tb_open(&r->tb, tb_dir(o), o->resume ? r->step : -1, 8 + (r->world > 1 ? r->world : 0));
}

/* One step's scalars as one Event: metrics.jsonl's numbers under
 * TensorBoard's usual tags. */
static FTUNE_MUST_USE ftune_status tb_step(run *r, const ftune_train_progress *p) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    ft_tb_writer *w = &r->tb;
    ft_tb_begin(w, (double)now.tv_sec + 1e-9 * (double)now.tv_nsec, p->step);
    ft_tb_scalar(w, "train/loss", (float)p->loss);
    ft_tb_scalar(w, "train/learning_rate", (float)p->lr);
    ft_tb_scalar(w, "train/grad_norm", (float)p->grad_norm);
    ft_tb_scalar(w, "train/tokens_per_second", (float)p->tokens_per_s);
    ft_tb_scalar(w, "memory/peak_rss", (float)p->peak_mib);
    if (p->has_val_loss) ft_tb_scalar(w, "eval/loss", (float)p->val_loss);
    if (p->loss_scaling || r->skipped) ft_tb_scalar(w, "train/loss_scale", (float)p->loss_scale);
    for (int q = 0; r->world > 1 && q < r->world; q++) {
        char tag[FT_TB_TAG_MAX];
        snprintf(tag, sizeof tag, "dist/step_time_s/rank_%d", q);
        ft_tb_scalar(w, tag, (float)r->step_times[q]);
    }
    return ft_tb_flush(w);
}

static FTUNE_MUST_USE ftune_status dump_batch(run *r, const ft_batch *b, int micro, int64_t ntt) {
    FILE *f = r->dump;
    fprintf(f, "{\"step\":%lld,\"micro\":%d,\"B\":%d,\"T\":%d,\"n_targets_total\":%lld", (long long)r->step + 1, micro,
            b->B, b->T, (long long)ntt);
    const char *names[] = { "tokens", "targets", "pos", "doc" };
    for (int a = 0; a < 4; a++) {
        fprintf(f, ",\"%s\":[", names[a]);
        for (int i = 0; i < b->B; i++) {
            fputc(i ? ',' : '[', f);
            if (i) fputc('[', f);
            for (int t = 0; t < b->T; t++) {
                size_t k = (size_t)i * b->T + t;
                int v = a == 0 ? b->tokens[k] : a == 1 ? b->targets[k] : a == 2 ? b->pos[k] : b->doc[k];
                fprintf(f, t ? ",%d" : "%d", v);
            }
            fputc(']', f);
        }
        fputc(']', f);
    }
    fputs("}\n", f);
    if (ferror(f)) return ft_err(FTUNE_ERR_IO, "%s: write failed", r->o->dump_batches);
    return FTUNE_OK;
}

/* Token-weighted mean loss over the whole validation set. */
static FTUNE_MUST_USE ftune_status validate(run *r, double *loss) {
    ft_dist_set_phase("validation after step %lld", (long long)r->step);
    int64_t nb;
    TRY(ft_batch_iter_seek(r->val_it, (ft_data_cursor){ 0, 0 }));
    TRY(ft_batch_iter_epoch_batches(r->val_it, 0, &nb));
    double sum = 0;
    int64_t nt = 0;
    /* batch i on rank i mod world; every rank advances through all */
    int64_t mine = 0;
    for (int64_t i = 0; i < nb; i++) {
        double ls;
        int64_t n;
        TRY(ft_batch_iter_next(r->val_it, &r->vb));
        if (i % r->world != r->rank) continue;
        TRY(ft_trainer_eval(r->tr, &r->vb, &ls, &n));
        sum += ls;
        nt += n;
        mine++;
    }
    /* ZeRO 3 gathers values in every forward: every rank runs as many (a
     * rank short of a batch evaluates one without targets) */
    for (int64_t i = mine; r->zero == 3 && i < (nb + r->world - 1) / r->world; i++) {
        double ls;
        int64_t n;
        TRY(ft_trainer_eval(r->tr, &r->idle, &ls, &n));
    }
    TRY(ft_dist_allreduce_sum_f64(&sum, 1));
    TRY(ft_dist_allreduce_sum_i64(&nt, 1));
    if (nt == 0) return ft_err(FTUNE_ERR_ARG, "%s: the validation set has no target tokens", r->val->path);
    *loss = sum / (double)nt;
    return FTUNE_OK;
}

/* The global gradient norm: under ZeRO 0 every rank holds every gradient;
 * under ZeRO 1 the squares of the ranks' parts are summed. */
static FTUNE_MUST_USE ftune_status global_norm(run *r, double *norm) {
    double ss = ft_grad_sumsq(r->own, r->n_own);
    if (r->zero > 0) TRY(ft_dist_allreduce_sum_f64(&ss, 1));
    *norm = sqrt(ss);
    return FTUNE_OK;
}

/* The optimizer-step half of a step, after backward of its micro-batches
 * and the sum of the gradients over ranks: unscale and check (loss
 * scaling), skip or clip and update this rank's part. The schedule is
 * indexed by updates done (step - skipped), as Hugging Face's Trainer steps
 * its scheduler only when the optimizer ran; a skipped step reports the
 * learning rate it would have used. */
static FTUNE_MUST_USE ftune_status optimizer_step(run *r, double loss, double *gnorm, double *lr, bool *skipped) {
    const ft_train_hooks *h = r->hooks;
    int64_t n = r->step + 1; /* this step, 1-based */
    if (h && h->inf_grad_step == n) {
        /* ZeRO 2/3: the trainer's gradients are gone by now; this rank's piece holds its part */
        const ft_param *p = r->zero >= 2 ? (r->n_own ? &r->own[r->n_own / 2] : NULL) : &r->params[r->n_params / 2];
        if (p) p->grad[p->numel / 2] = INFINITY;
    }
    /* The loss comes from the forward, which the scale does not touch: a
     * non-finite one is no overflow that a lower scale (a skipped step)
     * cures, and a dynamic scaler would skip every step and train nothing.
     * Every rank holds the same sum, so every rank stops here alike. */
    if (!isfinite(loss)) {
        const char *v = isnan(loss) ? "NaN" : loss > 0 ? "inf" : "-inf";
        if (r->topts.compute == FT_F16)
            return ft_err(FTUNE_ERR_RANGE, "step %lld: the loss is %s before any loss scaling: the f16 forward "
                          "overflowed (an activation beyond f16's range, 65504), which no loss scale cures; train "
                          "with --dtype bf16 (f32's range) or f32", (long long)n, v);
        return ft_err(FTUNE_ERR_RANGE, "step %lld: the loss is %s before any loss scaling (the forward is not finite, "
                      "which no loss scale cures); try a lower --lr", (long long)n, v);
    }
    /* every rank decides alike: a non-finite gradient in any rank's part skips the step on all */
    int found_inf = ft_grad_scaler_unscale(&r->scaler, r->own, r->n_own);
    TRY(ft_dist_allreduce_max_i32(&found_inf, 1));
    bool by_hand = h && h->skip_step == n;
    *skipped = ft_grad_scaler_update(&r->scaler, found_inf || by_hand) || by_hand;
    *lr = ft_sched_lr(&r->sched, r->step - r->skipped);
    if (*skipped) {
        TRY(global_norm(r, gnorm)); /* measured only, for the log */
        r->skipped++;
        /* PyTorch would halve on forever; a scale below f32's normal range
         * means no scale makes these gradients finite */
        if (r->scaler.mode == FT_LOSS_SCALE_DYNAMIC && !(r->scaler.scale >= FLT_MIN))
            return ft_err(FTUNE_ERR_RANGE, "step %lld: the gradients are not finite even at loss scale %g (%lld steps "
                          "skipped); the loss is %g: try a lower --lr", (long long)n, (double)r->scaler.scale * 2,
                          (long long)r->skipped, loss);
        return FTUNE_OK;
    }
    TRY(global_norm(r, gnorm));
    if (!isfinite(loss) || !isfinite(*gnorm)) {
        if (r->scaler.mode == FT_LOSS_SCALE_FIXED)
            return ft_err(FTUNE_ERR_RANGE, "step %lld: the loss (%g) or gradient norm (%g) is not finite at the fixed "
                          "loss scale %g; a fixed scale skips no step: try --loss-scale dynamic, a lower scale or a "
                          "lower --lr", (long long)n, loss, *gnorm, (double)r->scaler.scale);
        return ft_err(FTUNE_ERR_RANGE, "step %lld: the loss (%g) or gradient norm (%g) is not finite; try a lower --lr",
                      (long long)n, loss, *gnorm);
    }
    ft_clip_grad_by_norm(r->own, r->n_own, *gnorm, r->o->max_grad_norm);
    ft_trainer_adamw_step(r->tr, &r->opt, *lr); /* this rank's part, through the trainer's backend */
    /* ZeRO 1/2: every rank's trainer reads the whole values; ZeRO 3 gathers each segment when it is needed */
    if (r->zero == 1 || r->zero == 2) TRY(ft_dist_allgather_f32(r->vals, r->shard, r->chunk));
    return FTUNE_OK;
}

/* One optimizer step over up to K global micro-batches, of which this rank
 * trains its rows, each seeded with the same loss scale; one round of
 * communication, the finiteness check and the update once per step. */
static FTUNE_MUST_USE ftune_status train_step(run *r, double *loss, double *gnorm, double *lr, int64_t *n_tokens, bool *skipped) {
    ft_dist_set_phase("step %lld", (long long)r->step + 1);
    int kk = 0;
    *n_tokens = 0;
    /* this rank's target and token counts, then the global ones */
    int64_t cnt[2] = { 0, 0 };
    for (; kk < r->K; kk++) {
        if (r->total_micro >= 0 && r->step * r->K + kk >= r->total_micro) break;
        TRY(ft_batch_iter_next(r->it, &r->mb[kk]));
        ft_batch v;
        ft_batch_shard(&v, &r->mb[kk], r->rank, r->world);
        cnt[0] += v.n_targets;
        for (size_t i = 0; i < (size_t)v.B * v.T; i++) cnt[1] += v.doc[i] >= 0;
    }
    if (kk == 0) return ft_err(FTUNE_ERR_ARG, "no micro-batches left for step %lld", (long long)r->step + 1);
    TRY(ft_dist_allreduce_sum_i64(cnt, 2));
    int64_t ntt = cnt[0];
    *n_tokens = cnt[1];
    if (ntt == 0)
        return ft_err(FTUNE_ERR_ARG, "step %lld: its %d micro-batch(es) have no target tokens", (long long)r->step + 1, kk);
    if (r->dump)
        for (int k = 0; k < kk; k++) TRY(dump_batch(r, &r->mb[k], k, ntt));
    ft_trainer_zero_grad(r->tr);
    if (r->zero >= 2) memset(r->own_grad, 0, (size_t)r->own_n * sizeof(float));
    double sum = 0;
    for (int k = 0; k < kk; k++) {
        ft_batch v;
        ft_batch_shard(&v, &r->mb[k], r->rank, r->world);
        double ls;
        if (v.B == 0 && r->zero >= 2) {
            /* the short last batch of an epoch, nothing for this rank: its
             * collectives still run, on a batch with no targets (a zero
             * gradient); its dropout micro-step advances as the others' do */
            uint64_t ms = ft_trainer_get_micro_step(r->tr);
            TRY(ft_trainer_step_scaled(r->tr, &r->idle, ntt, r->scaler.scale, &ls));
            ft_trainer_set_micro_step(r->tr, ms + 1);
            TRY(ov_drain(r));
            continue;
        }
        if (v.B == 0) { /* the short last batch of an epoch: nothing for this rank */
            ft_trainer_set_micro_step(r->tr, ft_trainer_get_micro_step(r->tr) + 1);
            continue;
        }
        TRY(ft_trainer_step_scaled(r->tr, &v, ntt, r->scaler.scale, &ls));
        TRY(ov_drain(r));
        sum += ls;
    }
    /* after the backward pass: the loss and gradients of the global batch.
     * (An FP16 loss scaler's found-inf flag joins here, all-reduced with
     * ft_dist_allreduce_max_i32, so that every rank skips the same steps.) */
    TRY(ft_dist_allreduce_sum_f64(&sum, 1));
    /* (ZeRO 2/3 reduce-scattered each segment's as the backward finished it) */
    if (r->zero == 0) TRY(ft_dist_allreduce_sum_f32(r->grads, r->n_flat, r->chunk));
    else if (r->zero == 1) TRY(ft_dist_reduce_scatter_sum_f32(r->grads, r->shard, r->chunk));
    *loss = sum / (double)ntt;
    TRY(optimizer_step(r, *loss, gnorm, lr, skipped));
    r->step++;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status check_opts(const ftune_train_opts *o) {
    if (!o->model) return ft_err(FTUNE_ERR_ARG, "no model");
    if (!o->data_path) return ft_err(FTUNE_ERR_ARG, "no training data (--data FILE)");
    if (!o->out_dir) return ft_err(FTUNE_ERR_ARG, "no output directory (-o DIR)");
    if (o->batch_size < 1) return ft_err(FTUNE_ERR_ARG, "--batch-size %d: must be at least 1", o->batch_size);
    if (o->grad_accum < 1) return ft_err(FTUNE_ERR_ARG, "--grad-accum %d: must be at least 1", o->grad_accum);
    if (o->steps < 0 || o->epochs < 0) return ft_err(FTUNE_ERR_ARG, "--steps and --epochs must not be negative");
    if (o->steps > 0 && o->epochs > 0) return ft_err(FTUNE_ERR_ARG, "give --steps or --epochs, not both");
    if (o->ctx < 0 || o->ctx == 1) return ft_err(FTUNE_ERR_ARG, "--ctx %d: must be at least 2", o->ctx);
    if (o->eval_every < 0 || o->save_every < 0) return ft_err(FTUNE_ERR_ARG, "--eval-every and --save-every must not be negative");
    if (o->warmup < 0) return ft_err(FTUNE_ERR_ARG, "--warmup must not be negative");
    if (!(o->lr >= 0) || !(o->min_lr >= 0)) return ft_err(FTUNE_ERR_ARG, "--lr and --min-lr must not be negative");
    if (!(o->max_grad_norm >= 0)) return ft_err(FTUNE_ERR_ARG, "--max-grad-norm must not be negative");
    if (!(o->val_split >= 0 && o->val_split < 1)) return ft_err(FTUNE_ERR_ARG, "--val-split %g: expected a fraction in [0, 1)", o->val_split);
    if (o->optim != FTUNE_OPTIM_ADAMW && o->optim != FTUNE_OPTIM_ADAMW8BIT)
        return ft_err(FTUNE_ERR_ARG, "optim %d: expected FTUNE_OPTIM_ADAMW or FTUNE_OPTIM_ADAMW8BIT", (int)o->optim);
    /* ZeRO 1 cuts parameters at flat-range boundaries, which 8-bit state's
     * blocks (counted from each parameter's start) would have to follow */
    if (o->optim == FTUNE_OPTIM_ADAMW8BIT && o->zero > 0)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "--optim adamw8bit with --zero %d is not implemented: the 8-bit state is "
                      "not sharded; give --zero 0 (every rank keeps the whole 8-bit state) or --optim adamw", o->zero);
    if (o->mode == FTUNE_TRAIN_FULL) {
        if (o->init_adapter) return ft_err(FTUNE_ERR_ARG, "--init-adapter starts a LoRA run; it does not apply to --full");
        if (o->export_gguf) return ft_err(FTUNE_ERR_ARG, "--export-gguf writes a LoRA adapter; it does not apply to --full");
        if (o->save_initial_adapter) return ft_err(FTUNE_ERR_ARG, "--save-initial-adapter does not apply to --full");
        if (o->model && o->model->quantized)
            return ft_err(FTUNE_ERR_ARG, "--full trains the base weights, which are quantized (%s): quantized bases are "
                          "frozen, train a LoRA adapter on them (QLoRA)", ft_types[o->model->quant].name);
        /* the model is written at the end; what it would refuse, refused before training */
        ftune_status st = o->model ? ft_model_check_hf_output(o->model) : FTUNE_OK;
        if (st) return ft_err_prefix(st, "--full writes a Hugging Face model");
    }
    return FTUNE_OK;
}

static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

#define LOCK_NAME ".ftune.lock"

/* The files a run writes into -o at the end: a LoRA run's adapter (and
 * --export-gguf's), a full run's model as merge writes it (the base's
 * tokenizer files copied beside). */
static const char *const run_outputs[] = { "adapter_model.safetensors", "adapter_config.json", "adapter.gguf",
                                           "model.safetensors", "config.json", "tokenizer.json",
                                           "tokenizer_config.json", "special_tokens_map.json",
                                           "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                                           "chat_template.jinja" };

/* checkpoint-STEP (digits only) holding a trainer_state.json that ftune
 * wrote (its "format"), not another trainer's (HF Trainer's checkpoint-500
 * has one too) or a directory someone named checkpoint-best. */
static bool ftune_checkpoint(const char *out_dir, const char *name) {
    const char *p = name + 11;
    if (strncmp(name, "checkpoint-", 11) != 0 || !*p) return false;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return false;
    char path[4400], *text = NULL;
    snprintf(path, sizeof path, "%s/%s/trainer_state.json", out_dir, name);
    if (!ft_file_exists(path) || ft_read_file(path, &text, NULL) != FTUNE_OK) {
        ft_err_clear(); /* not ftune's: kept, nothing to report */
        return false;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format");
    bool ours = cJSON_IsString(f) && strcmp(f->valuestring, FT_CKPT_FORMAT) == 0;
    cJSON_Delete(j);
    return ours;
}

/* --save-initial-adapter's directory: initial/ holding an adapter's files only */
static bool ftune_initial(const char *out_dir, const char *name) {
    if (strcmp(name, "initial") != 0) return false;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    DIR *d = opendir(path);
    if (!d) return false;
    bool ours = true;
    for (struct dirent *e; ours && (e = readdir(d));)
        ours = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
               strcmp(e->d_name, "adapter_model.safetensors") == 0 || strcmp(e->d_name, "adapter_config.json") == 0;
    closedir(d);
    return ours;
}

/* Whether an entry of the output directory is what `--overwrite` removes:
 * exactly what a run writes there: its metrics, final adapter or model,
 * initial adapter and checkpoints; anything else (another tool's
 * checkpoint-500, a checkpoint-best, notes) stays. The temporaries a
 * killed save leaves went before, in remove_dead_temporaries. */
static bool stale_output(const char *out_dir, const char *name) {
    if (strcmp(name, "metrics.jsonl") == 0 || ft_tb_is_events_file(name)) return true;
    for (size_t i = 0; i < sizeof run_outputs / sizeof run_outputs[0]; i++)
        if (strcmp(name, run_outputs[i]) == 0) return true;
    return ftune_initial(out_dir, name) || ftune_checkpoint(out_dir, name);
}

/* v as a JSON number in buf (32 bytes): %.{digits}g, or %.1f for digits < 0;
 * null when it is not finite, as JSON has no inf or NaN. */
static const char *json_num(char *buf, double v, int digits) {
    if (!isfinite(v)) snprintf(buf, 32, "null");
    else if (digits < 0) snprintf(buf, 32, "%.1f", v);
    else snprintf(buf, 32, "%.*g", digits, v);
    return buf;
}

/* "checkpoint-STEP.KIND.PID" (KIND tmp or old, as save_checkpoint names its
 * temporaries): the pid and the checkpoint's own name, or false. */
static bool ckpt_temporary(const char *name, const char *kind, long *pid, char *ckpt, size_t cap) {
    const char *p = name + 11;
    if (strncmp(name, "checkpoint-", 11) != 0 || *p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    size_t base = (size_t)(p - name), k = strlen(kind);
    if (p[0] != '.' || strncmp(p + 1, kind, k) != 0 || p[1 + k] != '.') return false;
    const char *q = p + 2 + k;
    long v = 0;
    if (*q < '1' || *q > '9') return false; /* no sign, no leading zero */
    for (; *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v > INT32_MAX) return false;
    }
    if (*q || base >= cap) return false;
    memcpy(ckpt, name, base);
    ckpt[base] = 0;
    *pid = v;
    return true;
}

/* A save killed part-way leaves checkpoint-STEP.tmp.PID (and, if it was
 * replacing checkpoint-STEP, checkpoint-STEP.old.PID) behind. Removed here,
 * with this run holding the directory's lock, when process PID is gone
 * (kill(pid, 0) fails with ESRCH; a live one, or one of another user, is
 * never touched); an .old one only when checkpoint-STEP is in place, as it
 * is otherwise the one complete copy. */
static FTUNE_MUST_USE ftune_status remove_dead_temporaries(const char *out_dir) {
    DIR *d = opendir(out_dir);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", out_dir, strerror(errno));
    ftune_status st = FTUNE_OK;
    for (struct dirent *e; (e = readdir(d)) && !st;) {
        char ckpt[256], path[4400];
        long pid;
        bool tmp = ckpt_temporary(e->d_name, "tmp", &pid, ckpt, sizeof ckpt);
        if (!tmp && !ckpt_temporary(e->d_name, "old", &pid, ckpt, sizeof ckpt)) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        if (!tmp) {
            snprintf(path, sizeof path, "%s/%s", out_dir, ckpt);
            if (!ft_is_dir(path)) continue;
        }
        snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
        st = rm_tree(path);
        if (st) ft_err_prefix(st, "removing %s, left by process %ld that is gone", path, pid);
    }
    closedir(d);
    return st;
}

/* The canonical path of path, or of its nearest existing ancestor with the
 * rest appended as given (a -o not made yet), into out (PATH_MAX bytes). */
static bool canonical_path(const char *path, char *out) {
    char buf[PATH_MAX], cwd[PATH_MAX];
    int n = path[0] == '/' ? snprintf(buf, sizeof buf, "%s", path)
                           : getcwd(cwd, sizeof cwd) ? snprintf(buf, sizeof buf, "%s/%s", cwd, path) : -1;
    if (n < 0 || n >= (int)sizeof buf) return false;
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
    /* buf[0, cut) is tried, buf + cut ("" or "/rest") is the tail */
    for (size_t cut = len;;) {
        char saved = buf[cut];
        buf[cut] = 0;
        char *r = realpath(cut ? buf : "/", out);
        buf[cut] = saved;
        if (r) {
            size_t k = strlen(out);
            if (k == 1 && buf[cut]) k = 0; /* out is "/": the tail alone */
            return snprintf(out + k, PATH_MAX - k, "%s", buf + cut) < (int)(PATH_MAX - k);
        }
        if (cut == 0) return false;
        do cut--; while (cut > 0 && buf[cut] != '/');
    }
}

/* --resume CKPT with -o OUT: CKPT must be one of OUT's checkpoints (OUT is
 * its parent directory). Another run's checkpoint would have this run
 * replace that run's adapter, metrics and same-numbered checkpoints and mix
 * the two in one directory; an OUT inside CKPT would write into the
 * checkpoint being read. Checked before OUT is made. */
static FTUNE_MUST_USE ftune_status check_resume_dir(const ftune_train_opts *o) {
    char ck[PATH_MAX], out[PATH_MAX];
    if (!realpath(o->resume, ck) || !ft_is_dir(ck))
        return ft_err(FTUNE_ERR_IO, "--resume %s: no such checkpoint directory", o->resume);
    if (!canonical_path(o->out_dir, out)) return ft_err(FTUNE_ERR_IO, "-o %s: cannot resolve the path", o->out_dir);
    size_t k = strlen(ck);
    if (strcmp(out, ck) == 0 || (strncmp(out, ck, k) == 0 && out[k] == '/'))
        return ft_err(FTUNE_ERR_ARG, "-o %s is inside the checkpoint being resumed (%s): the run would write into the "
                      "checkpoint it reads; give the checkpoint's run directory as -o", o->out_dir, o->resume);
    char *slash = strrchr(ck, '/');
    if (slash == ck) slash[1] = 0;
    else if (slash) *slash = 0;
    if (strcmp(ck, out) != 0)
        return ft_err(FTUNE_ERR_ARG, "--resume %s: the checkpoint is not one of -o %s's (it belongs to the run in %s): "
                      "a resumed run writes its adapter, metrics and checkpoints into -o, and would replace or mix "
                      "with that run's. Give -o %s, or copy that run's directory and resume the copy's checkpoint "
                      "into it", o->resume, o->out_dir, ck, ck);
    return FTUNE_OK;
}

/* Everything about the output paths that can be checked before training:
 * not the base model's directory, creatable, locked against a second run,
 * and empty unless resuming or overwriting. */
static FTUNE_MUST_USE ftune_status claim_out_dir(run *r) {
    const ftune_train_opts *o = r->o;
    if (o->resume && o->overwrite) return ft_err(FTUNE_ERR_ARG, "give --resume or --overwrite, not both");
    if (o->model_path) {
        char parent[4200];
        snprintf(parent, sizeof parent, "%s", o->model_path);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0;
        else snprintf(parent, sizeof parent, ".");
        bool is_model_dir = ft_is_dir(o->model_path) ? same_file(o->out_dir, o->model_path) : same_file(o->out_dir, parent);
        if (is_model_dir)
            return ft_err(FTUNE_ERR_ARG, "-o %s is the base model's directory (%s); the outputs would overwrite or mix "
                          "with the model's files: choose another directory", o->out_dir, o->model_path);
    }
    if (o->dump_batches && ft_is_dir(o->dump_batches))
        return ft_err(FTUNE_ERR_ARG, "--dump-batches %s is a directory", o->dump_batches);
    if (o->resume) TRY(check_resume_dir(o));
    TRY(mkdir_p(o->out_dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, o->out_dir);
    r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (r->lock_fd < 0) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (flock(r->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t k = pread(r->lock_fd, pid, sizeof pid - 1, 0);
        if (k > 0) pid[k] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(r->lock_fd);
        r->lock_fd = -1;
        if (e == EWOULDBLOCK)
            return ft_err(FTUNE_ERR_IO, "%s: another training run (process %s) is writing to this output directory; "
                          "wait for it or choose another -o", o->out_dir, *pid ? pid : "?");
        return ft_err(FTUNE_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(r->lock_fd, 0) != 0 || pwrite(r->lock_fd, pid, (size_t)n, 0) != n)
        return ft_err(FTUNE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    TRY(remove_dead_temporaries(o->out_dir));
    if (o->resume) return FTUNE_OK;
    DIR *d = opendir(o->out_dir);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", o->out_dir, strerror(errno));
    char names[512] = "";
    int count = 0;
    size_t len = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || strcmp(e->d_name, LOCK_NAME) == 0) continue;
        if (count++ < 4) {
            int k = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", e->d_name);
            if (k > 0 && (size_t)k < sizeof names - len) len += (size_t)k;
        }
    }
    closedir(d);
    if (count && !o->overwrite)
        return ft_err(FTUNE_ERR_ARG, "-o %s is not empty (%s%s): it holds another run. Give --resume %s/checkpoint-STEP "
                      "to continue it, --overwrite to replace it, or another -o", o->out_dir, names,
                      count > 4 ? ", ..." : "", o->out_dir);
    return FTUNE_OK;
}

/* --overwrite: removes the previous run's outputs (stale_output), so that
 * none of them is mistaken for this run's or left beside it. */
static FTUNE_MUST_USE ftune_status clear_old_run(run *r) {
    DIR *d = opendir(r->o->out_dir);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", r->o->out_dir, strerror(errno));
    ftune_status st = FTUNE_OK;
    for (struct dirent *e; (e = readdir(d)) && !st;) {
        if (!stale_output(r->o->out_dir, e->d_name)) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", r->o->out_dir, e->d_name);
        st = rm_tree(path);
    }
    closedir(d);
    return st;
}

static FTUNE_MUST_USE ftune_status setup(run *r) {
    const ftune_train_opts *o = r->o;
    const ft_config *c = &r->m->cfg;
    TRY(check_opts(o));
    const ftune_tokenizer *tok = ftune_model_tokenizer(r->m);
    if (!tok) return ft_err(FTUNE_ERR_ARG, "%s: the model has no tokenizer", o->model_path ? o->model_path : "model");
    ft_data_tokenizer_init(&r->dt, tok);
    TRY(ft_train_seq_len(c, o, &r->T));
    r->B = o->batch_size;
    r->K = o->grad_accum;
    r->rank = ft_dist_rank();
    r->world = ft_dist_world();
    r->zero = o->zero;
    if (o->zero < 0 || o->zero > 3) return ft_err(FTUNE_ERR_ARG, "--zero %d: expected 0, 1, 2 or 3", o->zero);
    if (o->overlap && o->zero < 2)
        return ft_err(FTUNE_ERR_ARG, "--overlap overlaps ZeRO 2 and 3's gradient reduce-scatters with the backward: "
                      "give --zero 2 or 3");
    if (o->zero == 3 && o->init_adapter)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "--init-adapter with --zero 3 is not supported (the trainer holds one "
                      "layer's values at a time): use --zero 2 or less");
    if (!(o->bucket_mb >= 0) || o->bucket_mb > 1024) return ft_err(FTUNE_ERR_ARG, "--bucket-mb %g: expected 0 to 1024", o->bucket_mb);
    if (!(o->dist_timeout >= 0) || o->dist_timeout > 1e9)
        return ft_err(FTUNE_ERR_ARG, "--dist-timeout %g: expected seconds, 0 (wait forever) to 1e9", o->dist_timeout);
    ft_dist_set_timeout(o->dist_timeout);
    ft_dist_set_phase("the start (comparing the ranks' settings)");
    r->chunk = (int64_t)((o->bucket_mb > 0 ? o->bucket_mb : 16) * 1048576.0 / sizeof(float));
    if (r->chunk < 1024) r->chunk = 1024;
    if (r->B % r->world != 0)
        return ft_err(FTUNE_ERR_ARG, "--batch-size %d (the global batch) does not split evenly over %d ranks: give a "
                      "multiple of %d", r->B, r->world, r->world);
    if (is_root(r)) {
        TRY(claim_out_dir(r));
        TRY(claim_tb_dir(r));
    }
    TRY(load_data(r));

    ft_dtype compute;
    TRY(ft_train_compute_of(r->m, o->dtype, &compute));
    ft_train_topts_of(o, r->B / r->world, r->T, compute, &r->topts); /* this rank's rows of a micro-batch */
    if (o->init_adapter) TRY(read_init_adapter(r));
    if (r->zero >= 2) TRY(setup_zero(r));
    TRY(ft_trainer_new(&r->tr, r->m, &r->topts));
    if (r->init_vals) apply_init_adapter(r);

    int64_t n_trainable = 0;
    TRY(ft_trainer_optim_params(r->tr, o->mode == FTUNE_TRAIN_LORA, &r->params, &r->n_params, &n_trainable));
    TRY(setup_shards(r));
    ft_adamw_cfg ac = { .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->adam_eps, .weight_decay = o->weight_decay,
                        .n_threads = o->n_threads, .kind = r->topts.optim, .block = r->topts.optim_block,
                        .paged = r->topts.paged_optim, .paged_dir = o->paged_dir ? o->paged_dir : o->out_dir };
    TRY(ft_adamw_init(&r->opt, r->own, r->n_own, &ac));
    r->opt_ready = true;

    if (o->mode == FTUNE_TRAIN_LORA) {
        ft_lora **loras = ft_calloc((size_t)c->L * FT_N_MODS, sizeof *loras);
        if (!loras) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        for (int l = 0; l < c->L; l++)
            for (int k = 0; k < FT_N_MODS; k++) loras[l * FT_N_MODS + k] = ft_trainer_lora(r->tr, l, k);
        ftune_status st = ft_adapter_wrap(&r->wrapped, r->m, loras);
        free(loras);
        TRY(st);
    }

    ft_batch_opts bo = { .B = r->B, .T = r->T, .pack = o->pack, .shuffle = o->shuffle, .seed = o->seed,
                         .pad_id = r->dt.eos_id >= 0 ? r->dt.eos_id : 0 };
    TRY(ft_batch_iter_new(&r->it, r->train, &bo));
    r->mb = ft_calloc((size_t)r->K, sizeof *r->mb);
    if (!r->mb) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int k = 0; k < r->K; k++, r->n_mb++) TRY(ft_batch_init(&r->mb[k], r->B, r->T));
    if (r->val) {
        ft_batch_opts vo = bo;
        vo.pack = false;
        vo.shuffle = false;
        vo.B = r->B / r->world; /* whole batches, spread over the ranks */
        TRY(ft_batch_iter_new(&r->val_it, r->val, &vo));
        TRY(ft_batch_init(&r->vb, vo.B, r->T));
    }

    /* how many steps */
    if (o->steps > 0) {
        r->total_steps = o->steps;
        r->total_micro = -1;
    } else {
        int epochs = o->epochs > 0 ? o->epochs : 1;
        int64_t m = 0;
        for (int e = 0; e < epochs; e++) {
            int64_t nb;
            TRY(ft_batch_iter_epoch_batches(r->it, e, &nb));
            m += nb;
        }
        r->total_micro = m;
        r->total_steps = (m + r->K - 1) / r->K;
    }
    r->sched = (ft_sched){ .kind = (ft_sched_kind)o->schedule, .lr = o->lr, .min_lr = o->min_lr, .warmup_steps = o->warmup,
                           .total_steps = r->total_steps };
    TRY(ft_grad_scaler_init(&r->scaler, (ft_loss_scale_mode)o->loss_scale_mode, o->loss_scale,
                            o->loss_scale_growth_interval));
    r->config = make_config(r);
    if (!r->config) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    TRY(check_same_run(r));
    if (o->resume) TRY(resume(r));
    else if (r->world > 1 && r->zero < 3) TRY(ft_dist_bcast(r->vals, (size_t)r->n_flat * sizeof(float), 0)); /* one start for all */
    if (!is_root(r)) return FTUNE_OK; /* the rest is the outputs' */
    if (o->overwrite) TRY(clear_old_run(r));
    TRY(open_metrics(r));
    TRY(open_tb(r));
    if (o->dump_batches) {
        r->dump = fopen(o->dump_batches, "w");
        if (!r->dump) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", o->dump_batches, strerror(errno));
    }

    ftune_train_progress p = { .ev = FTUNE_TRAIN_START, .n_train = r->train->n, .n_val = r->val ? r->val->n : 0,
                            .train_tokens = r->train->stats.n_tokens, .train_targets = r->train->stats.n_targets,
                            .val_tokens = r->val ? r->val->stats.n_tokens : 0, .n_trainable = n_trainable,
                            .T = r->T, .B = r->B, .K = r->K, .data_format = ft_data_format_name(r->train->format),
                            .step = r->step, .start_step = r->step, .loss_scaling = ft_grad_scaler_on(&r->scaler),
                            .loss_scale = r->scaler.scale, .skipped_steps = r->skipped };
    const ft_dataset *sets[2] = { r->train, r->val };
    for (int i = 0; i < 2; i++)
        if (sets[i]) {
            p.n_truncated += sets[i]->stats.n_truncated;
            p.n_dropped_long += sets[i]->stats.n_dropped_long;
            p.n_dropped_empty += sets[i]->stats.n_dropped_empty;
            p.n_truncated_empty += sets[i]->stats.n_truncated_empty;
        }
    emit(r, &p);
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status train(run *r) {
    const ftune_train_opts *o = r->o;
    TRY(setup(r));
    int64_t start = r->step;
    if (o->save_initial_adapter && r->wrapped && start == 0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/initial", o->out_dir);
        TRY(gather_values(r));
        if (is_root(r)) TRY(save_adapter_dir(r, dir, r->full_vals, NULL));
        free(r->full_vals);
        r->full_vals = NULL;
    }
    if (r->val) {
        double vl;
        TRY(validate(r, &vl));
        r->res.has_val = true;
        r->res.val_loss_first = r->res.val_loss_last = vl;
        ftune_train_progress p = { .ev = FTUNE_TRAIN_EVAL, .step = r->step, .start_step = start, .has_val_loss = true, .val_loss = vl };
        emit(r, &p);
    }
    if (r->world > 1 && !(r->step_times = ft_calloc((size_t)r->world, sizeof(double))))
        return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    double t0 = ft_time_s();
    ft_dist_reset_counters();
    while (r->step < r->total_steps) {
        double ts = ft_time_s(), loss = 0, gnorm = 0, lr = 0;
        int64_t ntok;
        bool skipped = false;
        ft_dist_counters c0, c1;
        ft_dist_get_counters(&c0);
        TRY(train_step(r, &loss, &gnorm, &lr, &ntok, &skipped));
        ft_dist_get_counters(&c1);
        r->res.comm_bytes += (c1.allreduce_bytes + c1.reduce_scatter_bytes + c1.allgather_bytes + c1.other_bytes) -
                             (c0.allreduce_bytes + c0.reduce_scatter_bytes + c0.allgather_bytes + c0.other_bytes);
        r->res.comm_calls += c1.calls - c0.calls;
        r->res.comm_steps++;
        double te = ft_time_s();
        r->res.last_loss = loss;
        bool scaling = ft_grad_scaler_on(&r->scaler);
        ftune_train_progress p = { .ev = FTUNE_TRAIN_STEP, .step = r->step, .start_step = start, .loss = loss, .lr = lr,
                                .grad_norm = gnorm, .tokens_per_s = te > ts ? (double)ntok / (te - ts) : 0,
                                .elapsed_s = te - t0, .peak_mib = ft_peak_rss_mib(), .loss_scaling = scaling,
                                .loss_scale = r->scaler.scale, .skipped_steps = r->skipped, .skipped = skipped };
        p.eta_s = p.elapsed_s / (double)(r->step - start) * (double)(r->total_steps - r->step);
        bool last = r->step == r->total_steps;
        if (r->val && (last || (o->eval_every > 0 && r->step % o->eval_every == 0))) {
            TRY(validate(r, &p.val_loss));
            p.has_val_loss = true;
            r->res.val_loss_last = p.val_loss;
        }
        if (r->world > 1) {
            memset(r->step_times, 0, (size_t)r->world * sizeof(double));
            r->step_times[r->rank] = te - ts;
            TRY(ft_dist_allreduce_sum_f64(r->step_times, r->world));
        }
        if (is_root(r)) {
            /* JSON has no inf or NaN: a non-finite value (a skipped step's grad norm, the loss
             * of an f16 forward that overflowed) is null */
            char ls[32], lrs[32], gn[32], vl[32], sc[32], tps[32], rss[32];
            fprintf(r->metrics, "{\"step\":%lld,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"tokens_per_s\":%s,"
                    "\"peak_rss_mib\":%s", (long long)r->step, json_num(ls, loss, 9), json_num(lrs, lr, 9),
                    json_num(gn, gnorm, 9), json_num(tps, p.tokens_per_s, -1), json_num(rss, p.peak_mib, -1));
            if (p.has_val_loss) fprintf(r->metrics, ",\"val_loss\":%s", json_num(vl, p.val_loss, 9));
            if (scaling || r->skipped)
                fprintf(r->metrics, ",\"loss_scale\":%s,\"skipped_steps\":%lld,\"skipped\":%s",
                        json_num(sc, (double)r->scaler.scale, 9), (long long)r->skipped, skipped ? "true" : "false");
            for (int q = 0; r->world > 1 && q < r->world; q++)
                fprintf(r->metrics, "%s%s", q ? "," : ",\"step_time_s\":[", json_num(sc, r->step_times[q], 6));
            fputs(r->world > 1 ? "]}\n" : "}\n", r->metrics);
            if (fflush(r->metrics) != 0 || ferror(r->metrics))
                return ft_err(FTUNE_ERR_IO, "%s/metrics.jsonl: write failed: %s", o->out_dir, strerror(errno));
            if (r->tb.ev) TRY(tb_step(r, &p));
        }
        emit(r, &p);
        bool saved = false;
        if (o->save_every > 0 && r->step % o->save_every == 0) {
            TRY(checkpoint(r));
            saved = true;
        }
        /* every rank stops after the same step (a signal reaches them at different times) */
        ft_dist_set_phase("the end of step %lld", (long long)r->step);
        int stop = o->stop && *o->stop;
        TRY(ft_dist_allreduce_max_i32(&stop, 1));
        if (stop && !last) {
            if (!saved) TRY(checkpoint(r));
            return ft_err(FTUNE_ERR_INTERRUPTED, "interrupted after step %lld of %lld; checkpoint saved in %s "
                          "(continue with --resume %s)", (long long)r->step, (long long)r->total_steps,
                          r->res.checkpoint, r->res.checkpoint);
        }
    }
    /* final outputs: whole, on rank 0 (ZeRO 1 has all-gathered the values) */
    ft_dist_set_phase("the final outputs");
    TRY(gather_values(r)); /* ZeRO 3: the whole values on rank 0 */
    if (is_root(r) && o->mode == FTUNE_TRAIN_LORA) {
        char path[4200];
        snprintf(path, sizeof path, "%s/adapter.gguf", o->out_dir);
        TRY(save_adapter_dir(r, o->out_dir, r->full_vals, o->export_gguf ? path : NULL));
    } else if (is_root(r)) TRY(save_full_model(r, o->out_dir, r->full_vals));
    ftune_train_progress p = { .ev = FTUNE_TRAIN_DONE, .step = r->step, .start_step = start, .path = o->out_dir };
    emit(r, &p);
    return FTUNE_OK;
}

ftune_status ftune_train_run(const ftune_train_opts *o, ftune_train_progress_fn progress, void *ctx, ftune_train_result *res) {
    return ft_train_run_hooked(o, NULL, progress, ctx, res);
}

ftune_status ft_train_run_hooked(const ftune_train_opts *o, const ft_train_hooks *hooks, ftune_train_progress_fn progress,
                                 void *ctx, ftune_train_result *res) {
    run *r = calloc(1, sizeof *r);
    if (!r) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    r->o = o;
    r->hooks = hooks;
    r->scaler.scale = 1.0f;
    r->cb = progress;
    r->cb_ctx = ctx;
    r->m = o->model;
    r->lock_fd = -1;
    double limit = ft_dist_set_timeout(0); /* the run's own (setup sets it) until it returns */
    ftune_status st = train(r);
    ft_dist_set_timeout(limit);
    ft_dist_set_phase("%s", "");
    r->res.steps_done = r->step;
    r->res.total_steps = r->total_steps;
    r->res.loss_scale = r->scaler.scale;
    r->res.skipped_steps = r->skipped;
    if (r->tr) {
        ft_mem_table mt = { 0 }; /* ft_trainer_mem_table adds to the planned rows */
        ft_trainer_mem_table(r->tr, &mt);
        /* the trainer plans the optimizer over every trainable (its kind and paging
         * from r->topts); under ZeRO 1 this rank holds only its shard's state, which
         * ft_adamw_init sized with the same ft_optim_state_bytes */
        if (r->opt_ready && r->own != r->params) {
            const ft_train_plan *tp = ft_trainer_get_plan(r->tr);
            ft_mem_class k = tp->optim_paged ? FT_MEM_PAGED : FT_MEM_OPTIM;
            mt.planned[k] = mt.planned[k] - tp->optim_bytes + r->opt.state_bytes;
        }
        /* ZeRO 2/3: the trainer's one-segment windows (its plan) and this rank's shards */
        if (r->own_grad) mt.planned[FT_MEM_GRADS] += (size_t)(r->own_n + 1) * sizeof(float);
        if (r->own_vals) mt.planned[FT_MEM_TRAINABLE] += (size_t)(r->own_n + 1) * sizeof(float);
        if (r->ov[0].send) mt.planned[FT_MEM_GRADS] += 2 * (size_t)(r->win_n + r->recv_n) * sizeof(float);
        ft_mem_table_format(&mt, r->res.memory_table, sizeof r->res.memory_table);
    }
    r->res.peak_rss_mib = ft_peak_rss_mib();
    if (res) *res = r->res;
    if (r->metrics) fclose(r->metrics);
    ft_tb_close(&r->tb);
    free(r->step_times);
    if (r->dump && fclose(r->dump) != 0 && !st) st = ft_err(FTUNE_ERR_IO, "%s: write failed", o->dump_batches);
    cJSON_Delete(r->config);
    for (int k = 0; k < r->n_mb; k++) ft_batch_free(&r->mb[k]);
    free(r->mb);
    ft_batch_free(&r->vb);
    ft_batch_iter_free(r->it);
    ft_batch_iter_free(r->val_it);
    ft_adapter_free(r->wrapped);
    if (r->opt_ready) ft_adamw_free(&r->opt);
    if (r->own != r->params) free(r->own);
    free(r->shard);
    free(r->seg_off);
    free(r->full_mv);
    free(r->full_vals);
    ft_mem_free(FT_MEM_GRADS, r->own_grad, r->own_grad ? (size_t)(r->own_n + 1) * sizeof(float) : 0);
    ft_mem_free(FT_MEM_TRAINABLE, r->own_vals, r->own_vals ? (size_t)(r->own_n + 1) * sizeof(float) : 0);
    ft_batch_free(&r->idle);
    for (int k = 0; k < 2; k++) {
        /* a reduce-scatter still in flight (an error stopped the step): MPI may still write its
         * buffers and waiting could hang on a rank that stopped too; the job is ending: leave them */
        if (r->ov[k].req) continue;
        ft_mem_free(FT_MEM_GRADS, r->ov[k].send, r->ov[k].send ? (size_t)r->win_n * sizeof(float) : 0);
        ft_mem_free(FT_MEM_GRADS, r->ov[k].recv, r->ov[k].recv ? (size_t)r->recv_n * sizeof(float) : 0);
    }
    free(r->params);
    ft_trainer_free(r->tr);
    ft_dataset_free(r->train);
    ft_dataset_free(r->val);
    free(r->init_vals);
    if (r->lock_fd >= 0) close(r->lock_fd); /* releases the lock */
    free(r);
    return st;
}
