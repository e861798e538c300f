/* train_plan.c — `ftune plan` and `ftune train`'s fit check: the memory a
 * run will hold, before anything is loaded. Every term comes from the
 * function that sizes the real allocation: the weights from
 * ft_weights_plan_of (the loader's ft_held_bytes), the trainer's arenas
 * from ft_trainer_plan (what ft_trainer_new allocates), the optimizer's
 * state from the same plan (ft_optim_state_bytes, as ft_adamw_init), the
 * batches from ft_batch_bytes; the run's trainer options from
 * ft_train_topts_of, which ftune_train_run uses too. */
#include "train/train_loop.h"
#include "model/model.h"
#include "core/mem.h"
#include "dist/dist.h"
#include "dist/dist_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ft_train_topts_of(const ftune_train_opts *o, int B_rank, int T, ft_dtype compute, ft_train_opts *t) {
    ft_train_opts_default(t);
    t->mode = (ft_train_mode)o->mode;
    t->lora.r = o->lora_r;
    t->lora.alpha = o->lora_alpha;
    t->lora.rslora = o->rslora;
    t->lora.dropout = o->lora_dropout;
    t->lora.targets = o->lora_targets;
    t->lora.seed = o->seed;
    t->max_B = B_rank;
    t->max_T = T;
    t->n_threads = o->n_threads;
    t->grad_checkpoint = o->grad_checkpoint;
    t->compute = compute;
    if (o->paged_optim) t->paged_dir = o->paged_dir ? o->paged_dir : o->out_dir;
    t->optim = (ft_optim_kind)o->optim;
    t->paged_optim = o->paged_optim;
}

ftune_status ft_train_seq_len(const ft_config *c, const ftune_train_opts *o, int *T) {
    *T = o->ctx > 0 ? o->ctx : (c->max_T < 512 ? c->max_T : 512);
    if (*T > c->max_T) return ft_err(FTUNE_ERR_ARG, "--ctx %d is longer than the model's context length %d", *T, c->max_T);
    return FTUNE_OK;
}

/* A tokenized file's arrays (ft_dataset: 4-byte ids and a mask byte per
 * token, capacity doubled from 4096) for frac of the file, estimated at one
 * token per byte: what the byte-fallback tokenizers give at most for text
 * (BPE vocabularies give about a quarter of that; a chat template's added
 * tokens are not counted). An estimate from the file's size, not a bound. */
static FTUNE_MUST_USE ftune_status dataset_bytes(const char *path, double frac, size_t *bytes) {
    struct stat sb;
    if (!path) return FTUNE_OK;
    /* the run would fail on it: so does its plan, with the run's message */
    if (stat(path, &sb) != 0) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int64_t cap = 4096;
    while (cap < (int64_t)(frac * (double)sb.st_size)) cap *= 2;
    *bytes += (size_t)cap * 5;
    return FTUNE_OK;
}

/* One configuration's terms. */
typedef struct {
    ft_weights_plan w;
    ft_train_plan tp;
    size_t data, process;
    size_t total;
    int world;
    int64_t own_n;      /* ZeRO >= 1: the floats of rank 0's shard (the largest) */
    size_t shard_bytes; /* ZeRO 2/3: of the gradients (ZeRO 3: and trainables), the shard itself */
    ft_config cfg;
    ft_train_opts t;    /* the trainer's options, as the run builds them */
} plan_terms;

/* One optimizer step's collectives on one rank, by kind: bytes sent (the
 * dist layer's ring model, ft_dist_ring_bytes, per call as the trainer
 * makes it) and how many collectives. The small all-reduces of counts,
 * losses and flags move a few bytes each and are not counted (nor by the
 * dist layer's counters). */
typedef struct {
    uint64_t bytes[3], n[3]; /* all-reduce, reduce-scatter, all-gather */
} plan_comm;

static void comm_add(plan_comm *m, ft_dist_kind k, int64_t floats, int world, uint64_t times) {
    m->bytes[k] += times * ft_dist_ring_bytes(k, (uint64_t)floats * sizeof(float), world);
    m->n[k] += world > 1 ? times : 0;
}

/* What train_loop.c's train_step and the trainer's segment hooks
 * (train_model.c forward/backward) call per step: ZeRO 0 all-reduces the
 * flat gradient once; ZeRO 1 reduce-scatters it and all-gathers the
 * updated values; ZeRO 2 reduce-scatters each segment's gradient as each
 * micro-batch's backward finishes it (the head's in forward, the final
 * norm's, each block's, the embedding's: a tied embedding twice) and
 * all-gathers the values once; ZeRO 3 instead all-gathers each segment's
 * values before it is used: a block before its forward, again before its
 * backward, and once more for a block recomputed by --grad-checkpoint;
 * full mode's embedding, norm (twice) and head each micro-batch. */
static void comm_of(const plan_terms *p, const ftune_train_opts *o, plan_comm *m) {
    memset(m, 0, sizeof *m);
    int W = p->world;
    int64_t n = p->tp.n_trainable;
    uint64_t A = (uint64_t)o->grad_accum;
    if (n == 0) return;
    if (o->zero == 0) { comm_add(m, FT_DIST_ALLREDUCE, n, W, 1); return; }
    if (o->zero == 1) {
        comm_add(m, FT_DIST_REDUCE_SCATTER, n, W, 1);
        comm_add(m, FT_DIST_ALLGATHER, n, W, 1);
        return;
    }
    const ft_config *c = &p->cfg;
    int64_t lay0, layer_n, VC = (int64_t)c->V * c->C;
    ft_trainer_segments(c, &p->t, &lay0, &layer_n);
    bool full = o->mode == FTUNE_TRAIN_FULL;
    /* per micro-batch: the gradients' segments */
    comm_add(m, FT_DIST_REDUCE_SCATTER, layer_n, W, A * (uint64_t)c->L);
    if (full) {
        comm_add(m, FT_DIST_REDUCE_SCATTER, VC, W, 2 * A); /* the head (tied: the embedding) and the embedding */
        comm_add(m, FT_DIST_REDUCE_SCATTER, c->C, W, A);
    }
    if (o->zero == 2) { comm_add(m, FT_DIST_ALLGATHER, n, W, 1); return; }
    /* ZeRO 3's gathers: blocks in every segment but the last are run forward again in backward */
    int K = o->grad_checkpoint, L = c->L;
    int recomputed = K > 0 ? ((L + K - 1) / K - 1) * K : 0;
    comm_add(m, FT_DIST_ALLGATHER, layer_n, W, A * (uint64_t)(2 * L + recomputed));
    if (full) {
        comm_add(m, FT_DIST_ALLGATHER, VC, W, 2 * A); /* the embedding and the head */
        comm_add(m, FT_DIST_ALLGATHER, c->C, W, 2 * A);
    }
}

/* The trainer's ZeRO 2/3 callbacks as the plan sets them: ft_trainer_plan
 * only checks they are there (sizing the windows), never calls them. */
static FTUNE_MUST_USE ftune_status plan_no_values(void *ctx, int64_t lo, int64_t hi, float *v, bool init) {
    return ft_err(FTUNE_ERR_UNSUPPORTED, "a plan moves no values");
}
static FTUNE_MUST_USE ftune_status plan_no_grads(void *ctx, int64_t lo, int64_t hi, float *g) {
    return ft_err(FTUNE_ERR_UNSUPPORTED, "a plan moves no gradients");
}
static const ft_train_shard plan_shard = { .values = plan_no_values, .grads = plan_no_grads };

/* ZeRO's per-rank terms on rank 0 (the largest shard), as train_loop.c's
 * setup_zero and own_pieces allocate them: the trainer's one-segment
 * windows come from ft_trainer_plan (with the shard callbacks set); the
 * shard of n_flat is ft_dist_shard's, plus the one float of padding the
 * run allocates; --overlap's two send windows and receive buffers. */
static void plan_zero(const ftune_train_opts *o, int world, plan_terms *p) {
    if (o->zero < 1) return;
    int64_t *off = malloc((size_t)(world + 1) * sizeof *off);
    if (!off) return;
    ft_dist_shard(p->tp.n_trainable, world, off);
    p->own_n = off[1] - off[0];
    free(off);
    /* AdamW's m and v of this rank's pieces (f32: 8 bytes a float, what ft_optim_state_bytes gives) */
    if (p->tp.n_trainable > 0) p->tp.optim_bytes = p->tp.optim_bytes / (size_t)p->tp.n_trainable * (size_t)p->own_n;
    if (o->zero < 2) return;
    p->shard_bytes = (size_t)(p->own_n + 1) * sizeof(float);
    p->tp.grad_bytes += p->shard_bytes;
    if (o->zero == 3) p->tp.trainable_bytes += p->shard_bytes;
    if (o->overlap) {
        int64_t win = (int64_t)((p->tp.grad_bytes - p->shard_bytes) / sizeof(float));
        int64_t recv = (win < p->own_n ? win : p->own_n) + 1;
        p->tp.grad_bytes += 2 * (size_t)(win + recv) * sizeof(float);
    }
}

static FTUNE_MUST_USE ftune_status plan_terms_of(const ft_config *c0, const ft_weight_desc *d, int nd, const ftune_train_opts *o,
                                  ft_dtype quant, size_t process, int world, plan_terms *p) {
    memset(p, 0, sizeof *p);
    ft_config c = *c0;
    ft_dtype load = FT_F32, compute;
    ftune_status st;
    /* ftune train loads a model for full fine-tuning in f32 (its masters start from the weights as stored) */
    if ((st = ft_compute_parse(o->mode == FTUNE_TRAIN_FULL ? NULL : o->dtype, "--dtype", &load))) return st;
    if ((st = ft_compute_parse(o->dtype, "--dtype", &compute))) return st;
    if (o->mode == FTUNE_TRAIN_FULL && quant != FT_NTYPES)
        return ft_err(FTUNE_ERR_ARG, "--full trains the base weights, which --quant would quantize: quantized bases are "
                      "frozen, train a LoRA adapter on them (QLoRA)");
    if ((st = ft_weights_plan_of(d, nd, quant, load, &p->w))) return st;
    for (int i = 0; i < nd; i++)
        if (d[i].bnb && o->mode == FTUNE_TRAIN_FULL)
            return ft_err(FTUNE_ERR_ARG, "--full trains the base weights, which are quantized (bitsandbytes): train a "
                          "LoRA adapter on them (QLoRA)");
    int T;
    p->world = world;
    if ((st = ft_train_seq_len(&c, o, &T))) return st;
    if (o->batch_size < 1 || o->grad_accum < 1)
        return ft_err(FTUNE_ERR_ARG, "--batch-size %d, --grad-accum %d: both must be at least 1", o->batch_size, o->grad_accum);
    if (o->batch_size % world != 0)
        return ft_err(FTUNE_ERR_ARG, "--batch-size %d (the global batch) does not split evenly over %d ranks: give a "
                      "multiple of %d", o->batch_size, world, world);
    ft_train_opts t;
    ft_train_topts_of(o, o->batch_size / world, T, compute, &t);
    /* a plan without OUT_DIR: the masters' file would be there too (only the flag matters here) */
    if (o->paged_optim && !t.paged_dir) t.paged_dir = ".";
    /* the run's refusals (train_loop.c) of the stages' combinations the plan would size wrongly */
    if (o->zero < 0 || o->zero > 3) return ft_err(FTUNE_ERR_ARG, "--zero %d: expected 0, 1, 2 or 3", o->zero);
    if (o->overlap && o->zero < 2) return ft_err(FTUNE_ERR_ARG, "--overlap overlaps ZeRO 2/3's reduce-scatters: give --zero 2 or 3");
    if (o->optim == FTUNE_OPTIM_ADAMW8BIT && o->zero > 0)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "--optim adamw8bit with --zero %d is not implemented: give --zero 0", o->zero);
    if (o->zero >= 2) {
        t.shard = &plan_shard;
        t.shard_values = o->zero == 3;
    }
    if ((st = ft_trainer_plan(&c, &t, &p->tp))) return st;
    p->cfg = c;
    p->t = t;
    /* the micro-batches, a validation batch, the tokenized files */
    bool val = o->val_path || o->val_split > 0;
    p->data = (size_t)o->grad_accum * ft_batch_bytes(o->batch_size, T) + (val ? ft_batch_bytes(o->batch_size / world, T) : 0);
    if ((st = dataset_bytes(o->data_path, 1, &p->data)) || (st = dataset_bytes(o->val_path, 1, &p->data))) return st;
    /* --val-split: the held-out examples are copied into a dataset of their own */
    if (!o->val_path && o->val_split > 0 && (st = dataset_bytes(o->data_path, o->val_split, &p->data))) return st;
    plan_zero(o, world, p);
    p->process = process;
    p->total = p->w.mapped_total + p->w.owned_total + p->w.other + p->tp.trainable_bytes + p->tp.grad_bytes +
               p->tp.optim_bytes + p->tp.activation_bytes + p->tp.scratch_bytes + p->tp.other_bytes + p->tp.copy_bytes +
               p->data + p->process;
    return FTUNE_OK;
}

#define MIB(x) ((double)(x) / 1048576.0)

typedef struct {
    char *buf;
    size_t cap, len;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    if (t->len >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (w > 0) t->len = t->len + (size_t)w < t->cap ? t->len + (size_t)w : t->cap;
}

/* The communication rows: bytes per step and rank by collective, and with
 * --net-gbps the time: each collective's bytes at the link's rate plus a
 * latency per ring step (2(N-1) for an all-reduce, N-1 for the others;
 * one message per step, whatever --bucket-mb splits it into). */
static void comm_table(text *t, const plan_terms *p, const ftune_train_opts *o, const ftune_plan_opts *po,
                       ftune_train_plan_result *res) {
    plan_comm m;
    comm_of(p, o, &m);
    static const char *names[3] = { "all-reduce", "reduce-scatter", "all-gather" };
    uint64_t total = m.bytes[0] + m.bytes[1] + m.bytes[2];
    double secs = 0;
    put(t, "communication per step and rank (ring model, %d rank%s, --zero %d, %d micro-batch%s):\n", p->world,
        p->world == 1 ? "" : "s", o->zero, o->grad_accum, o->grad_accum == 1 ? "" : "es");
    for (int k = 0; k < 3; k++) {
        if (!m.n[k]) continue;
        double s = 0;
        if (po->net_gbps > 0) {
            double hops = (double)(k == 0 ? 2 : 1) * (p->world - 1);
            s = (double)m.bytes[k] * 8 / (po->net_gbps * 1e9) + (double)m.n[k] * hops * po->net_latency_us * 1e-6;
            secs += s;
        }
        char label[64];
        snprintf(label, sizeof label, "%s (%llu calls)", names[k], (unsigned long long)m.n[k]);
        if (po->net_gbps > 0) put(t, "  %-48s %10.1f MB %10.3f s\n", label, (double)m.bytes[k] / 1e6, s);
        else put(t, "  %-48s %10.1f MB\n", label, (double)m.bytes[k] / 1e6);
    }
    put(t, "  %-48s %10.1f MB (%llu bytes)\n", "sent", (double)total / 1e6, (unsigned long long)total);
    if (po->net_gbps > 0)
        put(t, "  %-48s %10.3f s at %g Gbit/s, %g us latency\n", "communication time per step", secs, po->net_gbps,
            po->net_latency_us);
    res->comm_bytes = (double)total;
    res->comm_s = secs;
}

ftune_status ftune_train_plan(const char *model_path, const ftune_train_opts *o, const ftune_plan_opts *po,
                              ftune_train_plan_result *res) {
    memset(res, 0, sizeof *res);
    ftune_plan_opts none = { 0 };
    if (!po) po = &none;
    ft_config c;
    ft_weight_desc *d = NULL;
    int nd = 0;
    ftune_status st;
    const char *what = po->preset ? po->preset : model_path;
    if (po->preset) {
        ft_dtype stored;
        if ((st = ft_compute_parse(po->preset_dtype, "--preset-dtype", &stored))) return st;
        st = ft_weights_describe_preset(po->preset, stored, &c, &d, &nd);
    } else if (!model_path) {
        return ft_err(FTUNE_ERR_ARG, "no model (-m MODEL, or --preset NAME)");
    } else if (ft_is_dir(model_path)) {
        st = ft_weights_describe_hf(model_path, &c, &d, &nd);
    } else if (!ft_file_exists(model_path)) {
        return ft_err(FTUNE_ERR_IO, "%s: no such file or directory", model_path);
    } else {
        /* GGUF and llama2.c: loaded as stored, which maps the file and reads only its header and vectors */
        ftune_model *m = NULL;
        ftune_load_opts lo = { .tokenizer_path = po->tokenizer };
        if ((st = ftune_model_load(&m, model_path, &lo))) return st;
        c = m->cfg;
        st = ft_weights_describe_model(m, &d, &nd);
        ftune_model_free(m);
    }
    if (st) return st;
    ft_dtype quant = FT_NTYPES;
    if (po->quant && (st = ft_quant_from_name(po->quant, &quant))) {
        free(d);
        return ft_err_prefix(st, "--quant");
    }
    size_t process = 0;
    ft_mem_rss(&process, NULL);
    int world = po->world > 0 ? po->world : ft_dist_world();
    if (po->world < 0) { free(d); return ft_err(FTUNE_ERR_ARG, "--world %d: expected at least 1", po->world); }
    plan_terms p;
    if ((st = plan_terms_of(&c, d, nd, o, quant, process, world, &p))) { free(d); return st; }

    /* the terms, largest first in the summary */
    struct { const char *name; size_t n; } terms[2 * FT_NTYPES + 12]; /* weights per dtype, and 11 more */
    int nt = 0;
    char wnames[2 * FT_NTYPES][48];
    for (int k = 0; k < FT_NTYPES; k++) {
        if (p.w.mapped[k]) {
            snprintf(wnames[nt], sizeof wnames[nt], "weights (mapped, %s)", ft_types[k].name);
            terms[nt].name = wnames[nt]; terms[nt].n = p.w.mapped[k]; nt++;
        }
    }
    for (int k = 0; k < FT_NTYPES; k++) {
        if (p.w.owned[k]) {
            snprintf(wnames[nt], sizeof wnames[nt], "weights (owned, %s)", ft_types[k].name);
            terms[nt].name = wnames[nt]; terms[nt].n = p.w.owned[k]; nt++;
        }
    }
    int first_other = nt;
    if (p.tp.copy_bytes) { terms[nt].name = "weights (compute copies)"; terms[nt++].n = p.tp.copy_bytes; }
    /* --paged-optim: the optimizer state (and full mode's f32 masters when there are
     * compute copies) in one file-backed row, counted in the total as resident */
    size_t paged = (p.tp.optim_paged ? p.tp.optim_bytes : 0) + (p.tp.masters_paged ? p.tp.trainable_bytes : 0);
    if (!p.tp.masters_paged) { terms[nt].name = "trainables"; terms[nt++].n = p.tp.trainable_bytes; }
    terms[nt].name = "gradients"; terms[nt++].n = p.tp.grad_bytes;
    if (!p.tp.optim_paged) { terms[nt].name = "optimizer state"; terms[nt++].n = p.tp.optim_bytes; }
    if (paged) { terms[nt].name = "paged (file-backed)"; terms[nt++].n = paged; }
    terms[nt].name = "activations"; terms[nt++].n = p.tp.activation_bytes;
    terms[nt].name = "attention workspace"; terms[nt++].n = p.tp.attention_scratch_bytes;
    terms[nt].name = "LM head + loss workspace"; terms[nt++].n = p.tp.loss_scratch_bytes;
    terms[nt].name = "other scratch";
    terms[nt++].n = p.tp.scratch_bytes - p.tp.attention_scratch_bytes - p.tp.loss_scratch_bytes;
    terms[nt].name = "data"; terms[nt++].n = p.data;
    terms[nt].name = "bookkeeping"; terms[nt++].n = p.tp.other_bytes + p.w.other;
    terms[nt].name = "process"; terms[nt++].n = p.process;
    int big = 0;
    for (int i = 1; i < nt; i++)
        if (terms[i].n > terms[big].n) big = i;
    snprintf(res->largest, sizeof res->largest, "%s", terms[big].name);
    res->largest_mib = MIB(terms[big].n);
    res->total_mib = MIB(p.total);
    res->process_mib = MIB(p.process);
    res->mapped_mib = MIB(p.w.mapped_total);

    int T;
    /* plan_terms_of checked it, but a status is never dropped */
    if ((st = ft_train_seq_len(&c, o, &T))) { free(d); return st; }
    text t = { res->table, sizeof res->table, 0 };
    char mode[64];
    if (o->mode == FTUNE_TRAIN_FULL) snprintf(mode, sizeof mode, "full");
    else snprintf(mode, sizeof mode, "LoRA r %d", o->lora_r);
    char extra[128] = "";
    if (quant != FT_NTYPES) snprintf(extra, sizeof extra, ", --quant %s", po->quant);
    if (o->grad_checkpoint)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", --grad-checkpoint %d", o->grad_checkpoint);
    if (o->optim == FTUNE_OPTIM_ADAMW8BIT) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", --optim adamw8bit");
    if (o->paged_optim) snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", --paged-optim");
    put(&t, "memory plan: %s, %s, %s%s, micro-batch %d x %d", what, mode, o->dtype ? o->dtype : "f32", extra,
        o->batch_size, T);
    if (world > 1) put(&t, " (one rank of %d)", world);
    put(&t, "\n");
    put(&t, "  %-48s %10s\n", "term", "MiB");
    for (int i = 0; i < first_other; i++) put(&t, "  %-48s %10.1f\n", terms[i].name, MIB(terms[i].n));
    const char *optim_why = o->optim == FTUNE_OPTIM_ADAMW8BIT ? " (AdamW m, v: 8-bit blocks)" : " (AdamW m, v)";
    char paged_why[64];
    snprintf(paged_why, sizeof paged_why, ": %s%s%s", p.tp.optim_paged ? "AdamW m, v" : "",
             p.tp.optim_paged && p.tp.masters_paged ? "; " : "", p.tp.masters_paged ? "f32 masters" : "");
    for (int i = first_other; i < nt; i++) {
        const char *why = strcmp(terms[i].name, "trainables") == 0 ? " (f32 masters)"
                        : strcmp(terms[i].name, "optimizer state") == 0 ? optim_why
                        : strcmp(terms[i].name, "paged (file-backed)") == 0 ? paged_why
                        : strcmp(terms[i].name, "activations") == 0 ? " (saved for backward)"
                        : strcmp(terms[i].name, "LM head + loss workspace") == 0 ? " (a chunk's logits)"
                        : strcmp(terms[i].name, "other scratch") == 0 ? " (activation gradients, Linears)"
                        : strcmp(terms[i].name, "data") == 0 ?  " (batches; tokens, estimated from file sizes)"
                        : strcmp(terms[i].name, "process") == 0 ? " (code, libraries: measured)" : "";
        char label[96];
        snprintf(label, sizeof label, "%s%s", terms[i].name, why);
        put(&t, "  %-48s %10.1f\n", label, MIB(terms[i].n));
    }
    put(&t, "  %-48s %10.1f\n", "total", MIB(p.total));
    if (paged)
        put(&t, "the paged bytes count as resident (the kernel keeps a file's pages in memory until it runs short, "
            "then writes them back and drops them)\n");
    comm_table(&t, &p, o, po, res);

    /* what each switch would save: the same plan with it */
    typedef struct { const char *name; ftune_train_opts o; ft_dtype quant; } alt;
    alt sw[8]; /* at most seven below */
    int ns = 0;
    bool bnb = false;
    for (int i = 0; i < nd; i++) bnb |= d[i].bnb;
    ft_dtype cur;
    if ((st = ft_compute_parse(o->dtype, "--dtype", &cur))) { free(d); return st; }
    if (cur == FT_F32) { sw[ns] = (alt){ "--dtype bf16", *o, quant, }; sw[ns++].o.dtype = "bf16"; }
    if (o->mode == FTUNE_TRAIN_LORA && quant == FT_NTYPES && !bnb) sw[ns++] = (alt){ "--quant nf4", *o, FT_NF4, };
    if (!o->grad_checkpoint) { sw[ns] = (alt){ "--grad-checkpoint 1", *o, quant, }; sw[ns++].o.grad_checkpoint = 1; }
    char bname[64];
    if (o->batch_size > world) {
        snprintf(bname, sizeof bname, "--batch-size %d --grad-accum %d", world,
                 o->grad_accum * o->batch_size / world);
        sw[ns] = (alt){ bname, *o, quant, };
        sw[ns].o.grad_accum = o->grad_accum * o->batch_size / world;
        sw[ns++].o.batch_size = world;
    }
    if (o->mode == FTUNE_TRAIN_FULL) { sw[ns] = (alt){ "LoRA instead of --full", *o, quant, }; sw[ns++].o.mode = FTUNE_TRAIN_LORA; }
    /* --zero 1 with the 8-bit optimizer is refused (its state is not sharded) */
    if (o->optim == FTUNE_OPTIM_ADAMW && o->zero == 0) {
        sw[ns] = (alt){ "--optim adamw8bit", *o, quant, };
        sw[ns++].o.optim = FTUNE_OPTIM_ADAMW8BIT;
    }
    /* paging moves bytes to a file the kernel may write them out to, which the
     * total still counts as resident: it is listed by what it makes pageable */
    int paged_sw = -1;
    if (!o->paged_optim) {
        paged_sw = ns;
        sw[ns] = (alt){ "--paged-optim", *o, quant, };
        sw[ns++].o.paged_optim = true;
    }
    bool header = false;
    for (int i = 0; i < ns; i++) {
        plan_terms q;
        if (plan_terms_of(&c, d, nd, &sw[i].o, sw[i].quant, process, world, &q)) { ft_err_clear(); continue; }
        if (i == paged_sw) {
            size_t pg = (q.tp.optim_paged ? q.tp.optim_bytes : 0) + (q.tp.masters_paged ? q.tp.trainable_bytes : 0);
            if (!header) put(&t, "what each switch would save:\n");
            header = true;
            put(&t, "  %-48s %10.1f  (total %.1f; %.1f MiB file-backed, which the kernel may page out)\n", sw[i].name,
                MIB(q.total) - MIB(p.total), MIB(q.total), MIB(pg));
            continue;
        }
        if (q.total >= p.total) continue;
        if (!header) put(&t, "what each switch would save:\n");
        header = true;
        put(&t, "  %-48s %10.1f  (total %.1f)\n", sw[i].name, -MIB(p.total - q.total), MIB(q.total));
        if (MIB(p.total - q.total) > res->best_saving_mib) {
            res->best_saving_mib = MIB(p.total - q.total);
            snprintf(res->best_switch, sizeof res->best_switch, "%s", sw[i].name);
        }
    }
    free(d);
    return FTUNE_OK;
}
