/* train_model.c — the model-level training step: forward over a (B, T)
 * micro-batch keeping what backward needs (the block is block.c's, the
 * same one sessions run), final norm + the fused lm_head + loss of
 * lm_loss.c, and backward block by block into LoRA adapters or into f32
 * copies of every weight. llm.c-style memory: sizes
 * are planned once by carve(), which both measures and lays out each arena.
 *
 * What a block keeps for backward (rows BT = B·T): the block input (the
 * residual stream), both norms' outputs and rstd, q and k after RoPE, v,
 * the attention output, the residual after attention, gate and up, and
 * each adapter's u = dropout(x)·Aᵀ, and attention's log-sum-exp per query
 * and head. Attention probabilities are not kept: backward recomputes them
 * from q, k and the log-sum-exp a tile of queries at a time (ops_fast.c).
 * Dropout masks are regenerated from their seed. The SwiGLU output is recomputed too (one pass over F).
 *
 * Mixed precision (o.compute bf16/f16): every product of the backend
 * rounds its operands to the compute type. Trainables are f32 masters.
 * LoRA's A and B are read as they are (rounded while packed: the same
 * numbers as bf16 copies, without them: they are small). In full mode the
 * Linears' masters (and an untied head's) get compute copies (copy_bytes)
 * that the products read instead, half the bytes of f32; they are
 * refreshed from the masters in the first forward after zero_grad or an
 * optimizer step, and in every eval. The embedding has no copy: its rows
 * are gathered and rounded by the backend; a tied head reads the master.
 * Saved activations: the Linears' inputs ln1, ln2 and the attention
 * output are saved in the compute type (block.h ln1_c, ...): they feed only
 * products, which round them anyway, and LoRA's dropout is applied to the
 * rounded input (lora.c), so no result changes. The residual stream (read
 * by rmsnorm's backward), q, k, v and lse (attention's backward), gate and
 * up (SwiGLU's backward), rstd stay f32: f32 ops read them, and rounding
 * them would change the gradients.
 *
 * Gradient checkpointing (o.grad_checkpoint = K > 0): the L blocks run in
 * segments of K; res keeps only each segment's input and the last block's
 * output, plus K-1 rows for the inputs inside one segment, and la holds K
 * blocks' activations (block l uses slot l % K). Backward re-runs each
 * segment's forward (ft_block_forward, the same io and mask seeds) before
 * backpropagating through it, except the last segment, whose activations
 * are still those of the forward. Forward is a pure function of (x,
 * weights, io), so the gradients are bit-identical to K = 0. */
#include "train/train.h"
#include "nn/block.h"
#include "nn/lm_loss.h"
#include "nn/backend_profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A block's saved activations (ft_block_acts, rows BT): the block input is
 * the residual stream, res; u[k] is NULL where Linear k has no adapter; h
 * is the shared scratch hbuf (SwiGLU is recomputed in backward). */
typedef ft_block_acts layer_acts;
typedef ft_block_grads layer_grads;

struct ft_trainer {
    const ftune_model *m;
    ft_config cfg;
    ft_train_opts o;
    int nt;
    ft_backend be;            /* every op of a step runs through it (the CPU's, in o.compute) */
    ft_prof *prof;            /* FTUNE_PROFILE: be times the CPU backend's ops (printed at free); else NULL */
    uint64_t micro_step;
    /* the trainer's view of the model */
    ft_tensor tok_embd;       /* (V, C): the model's, or the f32 trainable copy */
    float *out_norm;          /* (C) */
    ft_linear lm_head;        /* (V, C) */
    ft_layer *layers;         /* (L) */
    ft_lora *loras;           /* (L, 7) */
    const ft_adapter_inst **set; /* (L, 7): the adapter set the block binds (&loras[i].base where trained, else NULL) */
    float *inv_freq;          /* (HS/2) */
    const ft_block_hooks *hooks; /* or NULL */
    /* trainables */
    ft_train_param *params;
    int n_params;
    int64_t n_values;
    float *values, *grads;    /* (n_values) each */
    float *d_tok_embd, *d_out_norm, *d_lm_head; /* into grads (full mode), else NULL */
    layer_grads *lg;          /* (L) */
    /* activations */
    float *act_arena;
    float *res;               /* (L+1, BT, C) residual stream: block inputs, then the last output;
                               * checkpointing: (n_seg + K, BT, C), see block_in */
    layer_acts *la;           /* (L) or, checkpointing, (K): see acts_slot */
    float *lnf, *rstdf;       /* (BT, C), (BT) */
    /* scratch */
    float *scr_arena;
    float *dres, *dln;        /* (BT, C) */
    float *dq, *datty;        /* (BT, NH*HS) */
    float *dk, *dv;           /* (BT, NKV*HS) */
    float *hbuf, *dh, *dgate, *dup; /* (BT, F) */
    float *att_scratch;       /* ft_attention_fast_scratch_floats(max_T, HS, nt, true) */
    float *lm_scratch;        /* ft_lm_loss_scratch_floats(CH, V): a chunk's logits and their gradient */
    float *lin_scratch;       /* linear_train_scratch_floats */
    int *idx;                 /* (max_T) 0..T-1: causal positions */
    int *pos0;                /* (BT) default positions */
    int CH;                   /* cross-entropy rows per chunk */
    /* KV prefix (ft_trainer_set_kv_prefix), P = 0 without */
    int P;
    const float *pk, *pv;     /* (L, P, NKV*HS) */
    float *pdk, *pdv;         /* (L, P, NKV*HS) gradients, or NULL */
    float *kv_arena;          /* the four below, then attention scratch for P + max_T keys */
    float *kv_k, *kv_v, *dkv_k, *dkv_v; /* (max_B, P + max_T, NKV*HS) */
    float *p_att_scratch;
    int *pidx;                /* (max_T) P + t: each query's index among the keys */
    size_t kv_bytes;          /* of kv_arena */
    ft_train_plan plan;       /* the sizes every arena below was allocated with */
    /* full mode in bf16/f16: compute copies of the masters (plan.copy_bytes) */
    uint8_t *copy_arena;
    struct compute_copy { const float *master; void *copy; int64_t n; } *copies; /* (n_copies) */
    int n_copies;
    bool copies_stale;        /* masters may have changed since the last refresh */
    /* ZeRO 2/3 (o.shard): values and/or grads are one segment's window (train.h) */
    int64_t lay0, layer_n;    /* block l's segment is [lay0 + l layer_n, + layer_n) */
    int64_t norm_lo, head_lo; /* full mode: the final norm's and the head's offsets (tied: 0) */
    ft_block_hooks shard_hooks; /* the block hooks that fill and drain the windows, then call hooks */
    ftune_status step_st;     /* the first error in this step: a shard callback's, or the embedding backward's */
};

void ft_train_opts_default(ft_train_opts *o) {
    memset(o, 0, sizeof *o);
    o->mode = FT_TRAIN_LORA;
    o->lora.r = 8;
    o->lora.alpha = 16;
    o->lora.targets = FT_MOD_ALL;
    o->max_B = 1;
    o->max_T = 512;
    o->optim = FT_OPTIM_ADAMW;
    o->optim_block = FT_ADAM8_BLOCK;
}

ftune_status ft_train_compute_of(const ftune_model *m, const char *dtype, ft_dtype *out) {
    if (!dtype) { *out = m->compute; return FTUNE_OK; }
    return ft_compute_parse(dtype, "--dtype", out);
}

ftune_status ft_lora_targets_parse(const char *s, unsigned *mask) {
    *mask = 0;
    if (!s || !*s) return ft_err(FTUNE_ERR_ARG, "empty LoRA target list");
    if (strcmp(s, "all") == 0 || strcmp(s, "all-linear") == 0) { *mask = FT_MOD_ALL; return FTUNE_OK; }
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int k = 0;
        for (; k < FT_N_MODS; k++)
            if ((strlen(ft_modules[k].name) == n && strncmp(p, ft_modules[k].name, n) == 0) ||
                (strlen(ft_modules[k].peft) == n && strncmp(p, ft_modules[k].peft, n) == 0))
                break;
        if (k == FT_N_MODS)
            return ft_err(FTUNE_ERR_ARG, "LoRA target \"%.*s\" is not one of q,k,v,o,gate,up,down", (int)n, p);
        *mask |= 1u << k;
        p += n;
        if (*p == ',') p++;
    }
    if (!*mask) return ft_err(FTUNE_ERR_ARG, "empty LoRA target list");
    return FTUNE_OK;
}

/* ------------------------------------------------------------ layout */

static void lin_dims(const ft_config *c, int k, int *out, int *in) {
    int qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    switch (k) {
    case FT_MOD_Q: *out = qd; *in = c->C; break;
    case FT_MOD_K: case FT_MOD_V: *out = kvd; *in = c->C; break;
    case FT_MOD_O: *out = c->C; *in = qd; break;
    case FT_MOD_GATE: case FT_MOD_UP: *out = c->F; *in = c->C; break;
    default: *out = c->C; *in = c->F; break;
    }
}

static ft_linear *lin_of(ft_layer *ly, int k) { return ft_layer_linear(ly, k); }

/* Appends a parameter spec (when ps is non-NULL) and returns its numel. */
static int64_t add_param(ft_train_param *ps, int *n, int64_t *off, const char *name, int ndim, int64_t d0,
                         int64_t d1, int layer, int target) {
    int64_t numel = ndim == 1 ? d0 : d0 * d1;
    if (ps) {
        ft_train_param *p = &ps[*n];
        memset(p, 0, sizeof *p);
        snprintf(p->opt.name, sizeof p->opt.name, "%s", name);
        p->opt.numel = numel;
        p->opt.ndim = ndim;
        p->opt.shape[0] = d0;
        p->opt.shape[1] = ndim == 1 ? 0 : d1;
        p->opt.decay = ndim == 2; /* matrices (every LoRA tensor is one), as Hugging Face's Trainer */
        p->offset = *off;
        p->layer = layer;
        p->target = target;
    }
    (*n)++;
    *off += numel;
    return numel;
}

/* The trainer's adapters: LoRA instances (tr->loras). */
#define LORA_KIND (&ft_lora_kind)

/* The trainable tensors, in order: LoRA: per layer, per target, the
 * kind's parameters (A then B).
 * Full: the embedding, per layer its norms, linears and biases, the final
 * norm, the head when untied. Returns the count; *total gets the floats. */
static int param_specs(const ft_config *c, const ft_train_opts *o, ft_train_param *ps, int64_t *total) {
    int n = 0;
    int64_t off = 0;
    char name[160];
    if (o->mode == FT_TRAIN_LORA) {
        for (int l = 0; l < c->L; l++)
            for (int k = 0; k < FT_N_MODS; k++) {
                if (!(o->lora.targets & (1u << k))) continue;
                int out, in;
                lin_dims(c, k, &out, &in);
                /* the kind's parameters, named as in the PEFT file */
                for (int i = 0; i < LORA_KIND->n_params; i++) {
                    int64_t sh[2];
                    LORA_KIND->param_shape(sh, &o->lora, i, in, out);
                    snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s", l, ft_modules[k].path,
                             LORA_KIND->defs[i].peft);
                    add_param(ps, &n, &off, name, 2, sh[0], sh[1], l, k);
                }
            }
    } else {
        add_param(ps, &n, &off, "model.embed_tokens.weight", 2, c->V, c->C, -1, -1);
        for (int l = 0; l < c->L; l++) {
            snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
            add_param(ps, &n, &off, name, 1, c->C, 0, l, -1);
            for (int k = 0; k < FT_N_MODS; k++) {
                int out, in;
                lin_dims(c, k, &out, &in);
                snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, ft_modules[k].path);
                add_param(ps, &n, &off, name, 2, out, in, l, k);
                if (c->qkv_bias && k <= FT_MOD_V) {
                    snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, ft_modules[k].path);
                    add_param(ps, &n, &off, name, 1, out, 0, l, k);
                }
                if (k == FT_MOD_O) {
                    snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
                    add_param(ps, &n, &off, name, 1, c->C, 0, l, -1);
                }
            }
        }
        add_param(ps, &n, &off, "model.norm.weight", 1, c->C, 0, -1, -1);
        if (!c->tied) add_param(ps, &n, &off, "lm_head.weight", 2, c->V, c->C, -1, -1);
    }
    *total = off;
    return n;
}

/* Lays out an arena: with base NULL only measures. Every piece starts on a
 * 64-byte boundary. */
typedef struct { float *base; size_t off, att, loss; } carver; /* att, loss: floats of those workspaces */
static float *carve(carver *cv, size_t n) {
    float *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += (n + 15) & ~(size_t)15;
    return p;
}

static int max_in(const ft_config *c) {
    int m = c->C > c->F ? c->C : c->F;
    return m > c->NH * c->HS ? m : c->NH * c->HS;
}

static int ce_rows(const ft_config *c, size_t BT) { return ft_lm_loss_chunk_rows(c->V, (int)BT); }

/* Checkpointing with K: segments of K blocks, the last one shorter when K
 * does not divide L. */
static int n_segments(const ft_config *c, const ft_train_opts *o) {
    return o->grad_checkpoint ? (c->L + o->grad_checkpoint - 1) / o->grad_checkpoint : c->L;
}
/* Rows of the residual arena: every block input and the last output; or,
 * checkpointing, each segment's input, the last output and the K-1 inputs
 * inside the segment being run. */
static int res_rows(const ft_config *c, const ft_train_opts *o) {
    return o->grad_checkpoint ? n_segments(c, o) + o->grad_checkpoint : c->L + 1;
}
/* Blocks whose activations are held at once. */
static int act_slots(const ft_config *c, const ft_train_opts *o) {
    return o->grad_checkpoint ? o->grad_checkpoint : c->L;
}

static void carve_acts(ft_trainer *tr, carver *cv, const ft_config *c, const ft_train_opts *o) {
    size_t BT = (size_t)o->max_B * o->max_T, C = c->C, F = c->F, qd = (size_t)c->NH * c->HS,
           kvd = (size_t)c->NKV * c->HS;
    float *res = carve(cv, (size_t)res_rows(c, o) * BT * C);
    if (tr) tr->res = res;
    /* bf16/f16: ln1, atty and ln2 are saved in the compute type (half the
     * bytes; they feed only products, which round them anyway) and pass
     * through one f32 buffer shared by every layer */
    bool small = o->compute != FT_F32 && !o->f32_acts;
    float *shared = small ? carve(cv, BT * (C > qd ? C : qd)) : NULL;
#define CARVE_C(n) ((void *)carve(cv, ((size_t)ft_dtype_nbytes(o->compute, (int64_t)(n)) + 3) / 4))
    for (int l = 0; l < act_slots(c, o); l++) {
        layer_acts a = { 0 };
        a.rstd1 = carve(cv, BT);
        a.q = carve(cv, BT * qd); a.k = carve(cv, BT * kvd); a.v = carve(cv, BT * kvd);
        a.lse = carve(cv, BT * (size_t)c->NH); a.mid = carve(cv, BT * C);
        a.rstd2 = carve(cv, BT);
        if (small) {
            a.ln1 = a.atty = a.ln2 = shared;
            a.ln1_c = CARVE_C(BT * C); a.ln2_c = CARVE_C(BT * C); a.atty_c = CARVE_C(BT * qd);
        } else {
            a.ln1 = carve(cv, BT * C); a.atty = carve(cv, BT * qd); a.ln2 = carve(cv, BT * C);
        }
        a.gate = carve(cv, BT * F); a.up = carve(cv, BT * F);
        if (o->mode == FT_TRAIN_LORA)
            for (int k = 0; k < FT_N_MODS; k++)
                if (o->lora.targets & (1u << k)) a.u[k] = carve(cv, BT * (size_t)o->lora.r);
        if (tr) tr->la[l] = a;
    }
#undef CARVE_C
    float *lnf = carve(cv, BT * C), *rstdf = carve(cv, BT);
    if (tr) { tr->lnf = lnf; tr->rstdf = rstdf; }
}

static void carve_scratch(ft_trainer *tr, carver *cv, const ft_config *c, const ft_train_opts *o, int nt) {
    size_t BT = (size_t)o->max_B * o->max_T, T = (size_t)o->max_T, C = c->C, F = c->F,
           qd = (size_t)c->NH * c->HS, kvd = (size_t)c->NKV * c->HS;
    int CH = ce_rows(c, BT);
    int R = o->mode == FT_TRAIN_LORA ? o->lora.r : 0;
    float *p[16];
    p[0] = carve(cv, BT * C); p[1] = carve(cv, BT * C);
    p[2] = carve(cv, BT * qd); p[3] = carve(cv, BT * qd);
    p[4] = carve(cv, BT * kvd); p[5] = carve(cv, BT * kvd);
    p[6] = carve(cv, BT * F); p[7] = carve(cv, BT * F); p[8] = carve(cv, BT * F); p[9] = carve(cv, BT * F);
    size_t at = cv->off;
    p[10] = carve(cv, ft_attention_fast_scratch_floats((int)T, c->HS, nt, true));
    cv->att = cv->off - at;
    at = cv->off;
    p[12] = carve(cv, ft_lm_loss_scratch_floats(CH, c->V, true));
    cv->loss = cv->off - at;
    p[14] = carve(cv, ft_linear_train_scratch_floats(max_in(c), R, (int)BT, nt));
    if (!tr) return;
    tr->dres = p[0]; tr->dln = p[1]; tr->dq = p[2]; tr->datty = p[3]; tr->dk = p[4]; tr->dv = p[5];
    tr->hbuf = p[6]; tr->dh = p[7]; tr->dgate = p[8]; tr->dup = p[9];
    tr->att_scratch = p[10]; tr->lm_scratch = p[12]; tr->lin_scratch = p[14];
    tr->CH = CH;
}

static FTUNE_MUST_USE ftune_status check_opts(const ft_config *c, const ft_train_opts *o) {
    if (o->mode != FT_TRAIN_LORA && o->mode != FT_TRAIN_FULL)
        return ft_err(FTUNE_ERR_ARG, "training mode %d is not LoRA or full", (int)o->mode);
    if ((unsigned)o->compute >= FT_NTYPES || !ft_compute_ok(o->compute))
        return ft_err(FTUNE_ERR_ARG, "compute dtype %d is not f32, bf16 or f16", (int)o->compute);
    if (o->max_B < 1 || o->max_T < 1 || (int64_t)o->max_B * o->max_T > (1 << 24))
        return ft_err(FTUNE_ERR_ARG, "micro-batch of %d x %d tokens is not a valid size", o->max_B, o->max_T);
    if (o->grad_checkpoint < 0 || o->grad_checkpoint > c->L)
        return ft_err(FTUNE_ERR_ARG,
                      "gradient checkpointing every %d blocks (--grad-checkpoint %d): K must be in 1..%d, the "
                      "model's layer count (0: off)",
                      o->grad_checkpoint, o->grad_checkpoint, c->L);
    if (o->mode == FT_TRAIN_LORA) {
        if (o->lora.r < 1 || o->lora.r > 65536) return ft_err(FTUNE_ERR_ARG, "LoRA rank %d is not in 1..65536", o->lora.r);
        if (!(o->lora.targets & FT_MOD_ALL) || (o->lora.targets & ~(unsigned)FT_MOD_ALL))
            return ft_err(FTUNE_ERR_ARG, "LoRA target mask 0x%x selects none of q,k,v,o,gate,up,down", o->lora.targets);
        if (!(o->lora.dropout >= 0 && o->lora.dropout < 1))
            return ft_err(FTUNE_ERR_ARG, "LoRA dropout %g is not in [0, 1)", o->lora.dropout);
        if (!isfinite(o->lora.alpha)) return ft_err(FTUNE_ERR_ARG, "LoRA alpha is not finite");
        /* linear_forward runs an adapter's u = x·Aᵀ through 128·in floats of scratch */
        int min_in = c->C < c->F ? c->C : c->F;
        if (c->NH * c->HS < min_in) min_in = c->NH * c->HS;
        if ((int64_t)o->lora.r > 128 * (int64_t)min_in)
            return ft_err(FTUNE_ERR_ARG, "LoRA rank %d is more than 128 x the smallest layer width %d", o->lora.r, min_in);
    }
    if (o->shard && (!o->shard->grads || (o->shard_values && !o->shard->values)))
        return ft_err(FTUNE_ERR_ARG, "sharded training without its gradient (or value) callback");
    if (o->shard_values && !o->shard) return ft_err(FTUNE_ERR_ARG, "sharded values need sharded gradients");
    if (o->optim != FT_OPTIM_ADAMW && o->optim != FT_OPTIM_ADAMW8BIT)
        return ft_err(FTUNE_ERR_ARG, "optimizer kind %d is not adamw or adamw8bit", (int)o->optim);
    if (o->optim == FT_OPTIM_ADAMW8BIT &&
        (o->optim_block < 64 || o->optim_block > FT_ADAM8_MAX_BLOCK || (o->optim_block & (o->optim_block - 1))))
        return ft_err(FTUNE_ERR_ARG, "adamw8bit block %d is not a power of two in 64..%d", o->optim_block, FT_ADAM8_MAX_BLOCK);
    return FTUNE_OK;
}

/* The trainer's small bookkeeping arrays (FT_MEM_OTHER), each sized here
 * once for both the plan and the allocation. */
enum { O_LAYERS, O_LORAS, O_SET, O_LG, O_LA, O_INV_FREQ, O_IDX, O_POS0, O_PARAMS, O_COPIES, N_OTHER };

/* Whether full mode holds compute copies, and how many matrices get one. */
static bool has_copies(const ft_train_opts *o) {
    return o->mode == FT_TRAIN_FULL && o->compute != FT_F32 && !o->no_compute_copies && !o->shard_values;
}

/* One block's segment of the flat trainables (the same in every block). */
static int64_t layer_floats(const ft_config *c, const ft_train_opts *o, int64_t total) {
    if (o->mode == FT_TRAIN_LORA) return total / c->L;
    return (total - (int64_t)c->V * c->C * (c->tied ? 1 : 2) - c->C) / c->L;
}
/* The largest segment: what a window of values or gradients holds (ZeRO 2/3). */
static int64_t window_floats(const ft_config *c, const ft_train_opts *o, int64_t total) {
    int64_t w = layer_floats(c, o, total);
    if (o->mode == FT_TRAIN_FULL && (int64_t)c->V * c->C > w) w = (int64_t)c->V * c->C;
    return w > 0 ? w : 1;
}
static int n_copy_matrices(const ft_config *c) { return c->L * FT_N_MODS + (c->tied ? 0 : 1); }
/* Bytes of the copy of a (rows, cols) matrix, 64-byte aligned. */
static size_t copy_size(ft_dtype compute, int64_t rows, int64_t cols) {
    return ((size_t)ft_dtype_nbytes(compute, rows * cols) + 63) & ~(size_t)63;
}
static void other_sizes(const ft_config *c, const ft_train_opts *o, int n_params, size_t sz[N_OTHER]) {
    sz[O_LAYERS] = (size_t)c->L * sizeof(ft_layer);
    sz[O_LORAS] = (size_t)c->L * FT_N_MODS * sizeof(ft_lora);
    sz[O_SET] = (size_t)c->L * FT_N_MODS * sizeof(ft_adapter_inst *);
    sz[O_LG] = (size_t)c->L * sizeof(layer_grads);
    sz[O_LA] = (size_t)act_slots(c, o) * sizeof(layer_acts);
    sz[O_INV_FREQ] = (size_t)c->HS / 2 * sizeof(float);
    sz[O_IDX] = (size_t)o->max_T * sizeof(int);
    sz[O_POS0] = (size_t)o->max_B * o->max_T * sizeof(int);
    sz[O_PARAMS] = (size_t)n_params * sizeof(ft_train_param);
    sz[O_COPIES] = has_copies(o) ? (size_t)n_copy_matrices(c) * sizeof(struct compute_copy) : 0;
}

/* The one size table: ft_trainer_plan reports it, ft_trainer_new allocates
 * exactly these bytes per class. */
static FTUNE_MUST_USE ftune_status plan_fill(const ft_config *c, const ft_train_opts *o, int nt, ft_train_plan *plan) {
    memset(plan, 0, sizeof *plan);
    int64_t total;
    int n_params = param_specs(c, o, NULL, &total);
    plan->n_trainable = total;
    plan->trainable_bytes = plan->grad_bytes = (size_t)total * sizeof(float);
    if (o->shard) plan->grad_bytes = (size_t)window_floats(c, o, total) * sizeof(float);
    if (o->shard_values) plan->trainable_bytes = (size_t)window_floats(c, o, total) * sizeof(float);
    /* the optimizer's state per tensor (8-bit blocks are per parameter, small ones f32),
     * as ft_adamw_init sizes it for ft_trainer_optim_params' list, in this order */
    ft_train_param *ps = ft_calloc((size_t)n_params + 1, sizeof *ps);
    int64_t *ne = ft_calloc((size_t)n_params + 1, sizeof *ne);
    if (!ps || !ne) {
        free(ps);
        free(ne);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    }
    param_specs(c, o, ps, &total);
    for (int i = 0; i < n_params; i++) ne[i] = ps[i].opt.numel;
    plan->optim_bytes = ft_optim_state_bytes(ne, n_params, o->optim, o->optim_block, o->paged_optim);
    plan->optim_paged = o->paged_optim;
    free(ps);
    free(ne);
    plan->masters_paged = o->paged_dir && has_copies(o);
    carver a = { 0 }, s = { 0 };
    carve_acts(NULL, &a, c, o);
    carve_scratch(NULL, &s, c, o, nt);
    plan->activation_bytes = a.off * sizeof(float);
    plan->scratch_bytes = s.off * sizeof(float);
    plan->attention_scratch_bytes = s.att * sizeof(float);
    plan->loss_scratch_bytes = s.loss * sizeof(float);
    size_t sz[N_OTHER];
    other_sizes(c, o, n_params, sz);
    plan->other_bytes = sizeof(ft_trainer);
    for (int i = 0; i < N_OTHER; i++) plan->other_bytes += sz[i];
    if (has_copies(o)) {
        for (int k = 0; k < FT_N_MODS; k++) {
            int out, in;
            lin_dims(c, k, &out, &in);
            plan->copy_bytes += (size_t)c->L * copy_size(o->compute, out, in);
        }
        if (!c->tied) plan->copy_bytes += copy_size(o->compute, c->V, c->C);
    }
    return FTUNE_OK;
}

ftune_status ft_trainer_plan(const ft_config *c, const ft_train_opts *o, ft_train_plan *plan) {
    memset(plan, 0, sizeof *plan);
    ftune_status st = check_opts(c, o);
    if (st) return st;
    return plan_fill(c, o, ft_num_threads(o->n_threads), plan);
}

void ft_trainer_segments(const ft_config *c, const ft_train_opts *o, int64_t *lay0, int64_t *layer_n) {
    int64_t total;
    param_specs(c, o, NULL, &total);
    *layer_n = layer_floats(c, o, total);
    *lay0 = o->mode == FT_TRAIN_FULL ? (int64_t)c->V * c->C : 0;
}

void ft_train_plan_table(const ft_train_plan *p, ft_mem_table *t) {
    t->planned[p->masters_paged ? FT_MEM_PAGED : FT_MEM_TRAINABLE] += p->trainable_bytes;
    if (p->masters_paged) t->has_plan[FT_MEM_PAGED] = true;
    t->planned[FT_MEM_GRADS] += p->grad_bytes;
    t->planned[p->optim_paged ? FT_MEM_PAGED : FT_MEM_OPTIM] += p->optim_bytes;
    if (p->optim_paged) t->has_plan[FT_MEM_PAGED] = true;
    t->planned[FT_MEM_ACTS] += p->activation_bytes;
    t->planned[FT_MEM_SCRATCH] += p->scratch_bytes;
    t->planned[FT_MEM_OTHER] += p->other_bytes;
    t->planned[FT_MEM_WEIGHTS] += p->copy_bytes;
    t->has_plan[FT_MEM_TRAINABLE] = t->has_plan[FT_MEM_GRADS] = t->has_plan[FT_MEM_OPTIM] = true;
    t->has_plan[FT_MEM_ACTS] = t->has_plan[FT_MEM_SCRATCH] = t->has_plan[FT_MEM_OTHER] = true;
}

/* ------------------------------------------------------------ new / free */

static void copy_rows(float *dst, const ft_tensor *t, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) ft_tensor_row_f32(t, r, dst + r * cols);
}

/* The first error of a step, kept for the step to return: ZeRO 2/3's
 * windows' traffic (train.h ft_train_shard) and the embedding backward. */
static void step_keep(ft_trainer *tr, ftune_status st) {
    if (st && !tr->step_st) tr->step_st = st;
}
static void seg_init(ft_trainer *tr, int64_t lo, int64_t n) {
    if (tr->o.shard_values) step_keep(tr, tr->o.shard->values(tr->o.shard->ctx, lo, lo + n, tr->values, true));
}
static void seg_need(ft_trainer *tr, int64_t lo, int64_t n) {
    if (tr->o.shard_values) step_keep(tr, tr->o.shard->values(tr->o.shard->ctx, lo, lo + n, tr->values, false));
}
static void seg_zero(ft_trainer *tr, int64_t n) {
    if (tr->o.shard) tr->be.zero(&tr->be, tr->grads, (size_t)n * sizeof(float));
}
static void seg_done(ft_trainer *tr, int64_t lo, int64_t n) {
    if (tr->o.shard) step_keep(tr, tr->o.shard->grads(tr->o.shard->ctx, lo, lo + n, tr->grads));
}

/* The block hooks under ZeRO 2/3: a block's values before its forward and
 * backward, its gradient window zeroed before and handed on after its
 * backward; then the caller's hooks (ft_trainer_set_hooks), if any. */
static void shard_layer_hook(void *ctx, ft_block_event ev, int layer, const float *rows, int n, int C) {
    ft_trainer *tr = ctx;
    int64_t lo = tr->lay0 + layer * tr->layer_n;
    if (ev == FT_BLOCK_PRE_FORWARD || ev == FT_BLOCK_PRE_BACKWARD) seg_need(tr, lo, tr->layer_n);
    if (ev == FT_BLOCK_PRE_BACKWARD) seg_zero(tr, tr->layer_n);
    if (ev == FT_BLOCK_POST_BACKWARD) seg_done(tr, lo, tr->layer_n);
    if (tr->hooks && tr->hooks->layer) tr->hooks->layer(tr->hooks->ctx, ev, layer, rows, n, C);
}
static void shard_linear_hook(void *ctx, int layer, int which, const float *inp, int n, int in) {
    ft_trainer *tr = ctx;
    if (tr->hooks && tr->hooks->linear_input) tr->hooks->linear_input(tr->hooks->ctx, layer, which, inp, n, in);
}

/* Full mode in bf16/f16: points Linear l of the trainer's view at the next
 * compute copy of its master (filled by refresh_copies). */
static void bind_copy(ft_trainer *tr, ft_linear *l, size_t *off) {
    if (!tr->copy_arena) return;
    ft_dtype c = tr->o.compute;
    int64_t rows = l->w.shape[0], cols = l->w.shape[1];
    struct compute_copy *cc = &tr->copies[tr->n_copies++];
    cc->master = l->w.data;
    cc->copy = tr->copy_arena + *off;
    cc->n = rows * cols;
    *off += copy_size(c, rows, cols);
    l->w.data = cc->copy;
    l->w.dtype = c;
    l->w.nbytes = (size_t)ft_dtype_nbytes(c, cc->n);
}

static void refresh_copies(ft_trainer *tr) {
    for (int i = 0; i < tr->n_copies; i++)
        ft_types[tr->o.compute].from_f32(tr->copies[i].master, tr->copies[i].copy, tr->copies[i].n);
    tr->copies_stale = false;
}

/* Full mode: copies every weight into the trainable array and points the
 * trainer's view (and the grad pointers) at the copies. */
static void bind_full(ft_trainer *tr) {
    size_t coff = 0;
    const ftune_model *m = tr->m;
    const ft_config *c = &tr->cfg;
    int i = 0;
    ft_train_param *p = tr->params;
    copy_rows(p[i].opt.data, &m->tok_embd, c->V, c->C);
    tr->tok_embd = ft_tensor_f32_view(m->tok_embd.name, p[i].opt.data, c->V, c->C);
    tr->d_tok_embd = p[i].opt.grad;
    seg_init(tr, 0, (int64_t)c->V * c->C);
    i++;
    for (int l = 0; l < c->L; l++) {
        const ft_layer *src = &m->layers[l];
        ft_layer *ly = &tr->layers[l];
        layer_grads *g = &tr->lg[l];
        memcpy(p[i].opt.data, src->attn_norm, (size_t)c->C * sizeof(float));
        ly->attn_norm = p[i].opt.data; g->attn_norm = p[i].opt.grad; i++;
        for (int k = 0; k < FT_N_MODS; k++) {
            const ft_linear *sl = lin_of((ft_layer *)src, k);
            ft_linear *dl = lin_of(ly, k);
            copy_rows(p[i].opt.data, &sl->w, sl->out, sl->in);
            dl->w = ft_tensor_f32_view(sl->w.name, p[i].opt.data, sl->out, sl->in);
            bind_copy(tr, dl, &coff);
            g->w[k] = p[i].opt.grad;
            i++;
            if (c->qkv_bias && k <= FT_MOD_V) {
                if (sl->bias) memcpy(p[i].opt.data, sl->bias, (size_t)sl->out * sizeof(float));
                dl->bias = p[i].opt.data; g->b[k] = p[i].opt.grad; i++;
            }
            if (k == FT_MOD_O) {
                memcpy(p[i].opt.data, src->ffn_norm, (size_t)c->C * sizeof(float));
                ly->ffn_norm = p[i].opt.data; g->ffn_norm = p[i].opt.grad; i++;
            }
        }
        seg_init(tr, tr->lay0 + l * tr->layer_n, tr->layer_n);
    }
    memcpy(p[i].opt.data, m->out_norm, (size_t)c->C * sizeof(float));
    tr->out_norm = p[i].opt.data; tr->d_out_norm = p[i].opt.grad;
    seg_init(tr, p[i].offset, c->C);
    i++;
    if (c->tied) {
        tr->lm_head.w = tr->tok_embd;
        tr->d_lm_head = tr->d_tok_embd;
    } else {
        copy_rows(p[i].opt.data, &m->lm_head.w, c->V, c->C);
        tr->lm_head.w = ft_tensor_f32_view(m->lm_head.w.name, p[i].opt.data, c->V, c->C);
        bind_copy(tr, &tr->lm_head, &coff);
        tr->d_lm_head = p[i].opt.grad;
        seg_init(tr, p[i].offset, (int64_t)c->V * c->C);
        i++;
    }
    tr->copies_stale = true;
}

static void bind_lora(ft_trainer *tr) {
    const ft_config *c = &tr->cfg;
    ft_rng rng;
    ft_rng_seed(&rng, tr->o.lora.seed);
    for (int i = 0; i < tr->n_params; i += LORA_KIND->n_params) {
        const ft_train_param *p = &tr->params[i];
        int l = p->layer, k = p->target;
        ft_linear *lin = lin_of(&tr->layers[l], k);
        ft_lora *a = &tr->loras[l * FT_N_MODS + k];
        /* the instance reads its hyper-parameters from the trainer's options */
        ft_lora_bind(a, &tr->o.lora);
        for (int j = 0; j < LORA_KIND->n_params; j++) {
            LORA_KIND->bind(&a->base, j, p[j].opt.data, p[j].opt.grad);
            memset(p[j].opt.grad, 0, (size_t)p[j].opt.numel * sizeof(float));
        }
        LORA_KIND->init(&a->base, lin->in, lin->out, &rng);
        tr->set[l * FT_N_MODS + k] = &a->base;
        if (i + 2 >= tr->n_params || tr->params[i + 2].layer != l) seg_init(tr, tr->lay0 + l * tr->layer_n, tr->layer_n);
    }
    (void)c;
}

ftune_status ft_trainer_new(ft_trainer **out, const ftune_model *m, const ft_train_opts *o) {
    *out = NULL;
    const ft_config *c = &m->cfg;
    ftune_status st = check_opts(c, o);
    if (st) return st;
    /* the trainer's forward binds only its own adapters (ft_block_env), so a
     * default adapter of the model would silently not be trained on top of */
    if (m->adapter)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "the model carries an adapter: merge it into the model before training");
    if (o->compute == FT_F32 && m->compute != FT_F32)
        return ft_err(FTUNE_ERR_ARG, "the model was loaded for compute dtype %s (its matrices were rounded to it): "
                      "an f32 trainer needs the model loaded in f32", ft_types[m->compute].name);
    /* a model loaded in f32 (or bf16) has not been range-checked for f16 */
    if (o->compute != m->compute && (st = ft_model_check_range(m, o->compute))) return st;
    ft_train_plan plan;
    if ((st = plan_fill(c, o, ft_num_threads(o->n_threads), &plan))) return st;
    ft_trainer *tr = ft_mem_calloc(FT_MEM_OTHER, sizeof *tr);
    if (!tr) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    tr->m = m;
    tr->cfg = *c;
    tr->o = *o;
    tr->nt = ft_num_threads(o->n_threads);
    tr->be = ft_backend_cpu_in(o->compute, tr->nt);
    const char *prof = getenv("FTUNE_PROFILE");
    if (prof && *prof && strcmp(prof, "0") && (tr->prof = ft_mem_calloc(FT_MEM_OTHER, sizeof *tr->prof))) {
        tr->prof->inner = tr->be;
        tr->prof->head = &tr->lm_head;
        tr->be = ft_backend_profiled(tr->prof);
    }
    tr->tok_embd = m->tok_embd;
    tr->out_norm = m->out_norm;
    tr->lm_head = m->lm_head;
    int64_t total;
    tr->n_params = param_specs(c, o, NULL, &total);
    tr->n_values = total;
    tr->plan = plan;
    const ft_train_plan *pl = &tr->plan;
    size_t sz[N_OTHER];
    other_sizes(c, o, tr->n_params, sz);
    tr->layers = ft_mem_alloc(FT_MEM_OTHER, sz[O_LAYERS]);
    tr->loras = ft_mem_calloc(FT_MEM_OTHER, sz[O_LORAS]);
    tr->set = ft_mem_calloc(FT_MEM_OTHER, sz[O_SET]);
    tr->lg = ft_mem_calloc(FT_MEM_OTHER, sz[O_LG]);
    tr->la = ft_mem_calloc(FT_MEM_OTHER, sz[O_LA]);
    tr->inv_freq = ft_mem_alloc(FT_MEM_OTHER, sz[O_INV_FREQ]);
    tr->idx = ft_mem_alloc(FT_MEM_OTHER, sz[O_IDX]);
    tr->pos0 = ft_mem_alloc(FT_MEM_OTHER, sz[O_POS0]);
    tr->params = ft_mem_calloc(FT_MEM_OTHER, sz[O_PARAMS]);
    if (has_copies(o)) {
        tr->copies = ft_mem_calloc(FT_MEM_OTHER, sz[O_COPIES]);
        tr->copy_arena = tr->be.alloc(&tr->be, FT_MEM_WEIGHTS, pl->copy_bytes);
    }
    /* the four arenas are backend buffers (on the CPU backend: ft_mem_alloc by class) */
    ftune_status pst = FTUNE_OK;
    if (pl->masters_paged) pst = ft_mem_map_paged((void **)&tr->values, pl->trainable_bytes, o->paged_dir);
    else tr->values = tr->be.alloc(&tr->be, FT_MEM_TRAINABLE, pl->trainable_bytes);
    if (pst) {
        ft_trainer_free(tr);
        return ft_err_prefix(pst, "f32 master weights");
    }
    tr->grads = tr->be.alloc(&tr->be, FT_MEM_GRADS, pl->grad_bytes);
    tr->act_arena = tr->be.alloc(&tr->be, FT_MEM_ACTS, pl->activation_bytes);
    tr->scr_arena = tr->be.alloc(&tr->be, FT_MEM_SCRATCH, pl->scratch_bytes);
    if (!tr->layers || !tr->loras || !tr->set || !tr->lg || !tr->la || !tr->inv_freq || !tr->idx || !tr->pos0 || !tr->params ||
        !tr->values || !tr->grads || !tr->act_arena || !tr->scr_arena ||
        (has_copies(o) && (!tr->copies || !tr->copy_arena))) {
        /* the message before the free: pl points into tr */
        ftune_status err = ft_err(FTUNE_ERR_NOMEM,
                                  "out of memory for a trainer: %.1f MiB trainable (x2 with grads), %.1f MiB "
                                  "activations, %.1f MiB scratch",
                                  pl->trainable_bytes / 1048576.0, pl->activation_bytes / 1048576.0,
                                  pl->scratch_bytes / 1048576.0);
        ft_trainer_free(tr);
        return err;
    }
    memcpy(tr->layers, m->layers, (size_t)c->L * sizeof *tr->layers);
    param_specs(c, o, tr->params, &total);
    tr->layer_n = layer_floats(c, o, total);
    tr->lay0 = o->mode == FT_TRAIN_FULL ? (int64_t)c->V * c->C : 0;
    tr->norm_lo = tr->lay0 + c->L * tr->layer_n;
    tr->head_lo = c->tied ? 0 : tr->norm_lo + c->C;
    tr->shard_hooks = (ft_block_hooks){ .layer = shard_layer_hook, .linear_input = shard_linear_hook, .ctx = tr };
    for (int i = 0; i < tr->n_params; i++) {
        const ft_train_param *p = &tr->params[i];
        /* under ZeRO 2/3 a window holds one segment: a block's, or one parameter outside the blocks */
        int64_t seg = p->layer >= 0 ? tr->lay0 + p->layer * tr->layer_n : p->offset;
        tr->params[i].opt.data = tr->values + (o->shard_values ? p->offset - seg : p->offset);
        tr->params[i].opt.grad = tr->grads + (o->shard ? p->offset - seg : p->offset);
    }
    memset(tr->grads, 0, pl->grad_bytes);
    carver ca = { tr->act_arena, 0 }, cs = { tr->scr_arena, 0 };
    carve_acts(tr, &ca, c, o);
    carve_scratch(tr, &cs, c, o, tr->nt);
    for (int l = 0; l < act_slots(c, o); l++) tr->la[l].h = tr->hbuf;
    ft_rope_setup(tr->inv_freq, c, m->rope_freq_factors);
    for (int t = 0; t < o->max_T; t++) tr->idx[t] = t;
    if (o->mode == FT_TRAIN_FULL) bind_full(tr);
    else bind_lora(tr);
    if (tr->step_st) {
        st = tr->step_st;
        ft_trainer_free(tr);
        return st;
    }
    *out = tr;
    return FTUNE_OK;
}

static void free_kv_prefix(ft_trainer *tr) {
    ft_mem_free(FT_MEM_KV, tr->kv_arena, tr->kv_bytes);
    ft_mem_free(FT_MEM_OTHER, tr->pidx, (size_t)tr->o.max_T * sizeof(int));
    tr->kv_arena = NULL; tr->pidx = NULL; tr->kv_bytes = 0;
}

void ft_trainer_free(ft_trainer *tr) {
    if (!tr) return;
    size_t sz[N_OTHER];
    other_sizes(&tr->cfg, &tr->o, tr->n_params, sz);
    const ft_train_plan *pl = &tr->plan;
    ft_mem_free(FT_MEM_OTHER, tr->layers, sz[O_LAYERS]); ft_mem_free(FT_MEM_OTHER, tr->loras, sz[O_LORAS]);
    ft_mem_free(FT_MEM_OTHER, tr->set, sz[O_SET]);
    ft_mem_free(FT_MEM_OTHER, tr->lg, sz[O_LG]); ft_mem_free(FT_MEM_OTHER, tr->la, sz[O_LA]);
    ft_mem_free(FT_MEM_OTHER, tr->inv_freq, sz[O_INV_FREQ]); ft_mem_free(FT_MEM_OTHER, tr->idx, sz[O_IDX]);
    ft_mem_free(FT_MEM_OTHER, tr->pos0, sz[O_POS0]); ft_mem_free(FT_MEM_OTHER, tr->params, sz[O_PARAMS]);
    ft_mem_free(FT_MEM_OTHER, tr->copies, tr->copies ? sz[O_COPIES] : 0);
    tr->be.free(&tr->be, FT_MEM_WEIGHTS, tr->copy_arena, tr->copy_arena ? pl->copy_bytes : 0);
    if (pl->masters_paged) ft_mem_unmap_paged(tr->values, pl->trainable_bytes);
    else tr->be.free(&tr->be, FT_MEM_TRAINABLE, tr->values, pl->trainable_bytes);
    tr->be.free(&tr->be, FT_MEM_GRADS, tr->grads, pl->grad_bytes);
    tr->be.free(&tr->be, FT_MEM_ACTS, tr->act_arena, pl->activation_bytes);
    tr->be.free(&tr->be, FT_MEM_SCRATCH, tr->scr_arena, pl->scratch_bytes);
    free_kv_prefix(tr);
    if (tr->prof) {
        ft_prof_print(tr->prof, tr->prof->calls[FT_PROF_OPTIM], stderr);
        ft_mem_free(FT_MEM_OTHER, tr->prof, sizeof *tr->prof);
    }
    ft_mem_free(FT_MEM_OTHER, tr, sizeof *tr);
}

const ft_train_plan *ft_trainer_get_plan(const ft_trainer *tr) { return &tr->plan; }

void ft_trainer_mem_table(const ft_trainer *tr, ft_mem_table *t) {
    ft_model_mem_plan(tr->m, t);
    ft_train_plan_table(&tr->plan, t);
    t->planned[FT_MEM_KV] += tr->kv_bytes;
    t->planned[FT_MEM_OTHER] += tr->kv_arena ? (size_t)tr->o.max_T * sizeof(int) : 0; /* pidx */
    t->has_plan[FT_MEM_KV] = true;
    ft_mem_table_measure(t);
}

/* ------------------------------------------------------------ accessors */

void ft_trainer_zero_grad(ft_trainer *tr) {
    tr->be.zero(&tr->be, tr->grads, tr->plan.grad_bytes);
    tr->copies_stale = true; /* a new step: the masters may have been written since */
}
int ft_trainer_n_params(const ft_trainer *tr) { return tr->n_params; }
const ft_train_param *ft_trainer_param(const ft_trainer *tr, int i) {
    return i >= 0 && i < tr->n_params ? &tr->params[i] : NULL;
}
int ft_trainer_find_param(const ft_trainer *tr, const char *name) {
    for (int i = 0; i < tr->n_params; i++)
        if (strcmp(tr->params[i].opt.name, name) == 0) return i;
    return -1;
}
float *ft_trainer_values(ft_trainer *tr, int64_t *n) { if (n) *n = tr->n_values; return tr->values; }
float *ft_trainer_grads(ft_trainer *tr, int64_t *n) { if (n) *n = tr->n_values; return tr->grads; }
ft_lora *ft_trainer_lora(ft_trainer *tr, int layer, int target) {
    if (tr->o.mode != FT_TRAIN_LORA || layer < 0 || layer >= tr->cfg.L || target < 0 || target >= FT_N_MODS ||
        !(tr->o.lora.targets & (1u << target)))
        return NULL;
    return &tr->loras[layer * FT_N_MODS + target];
}
uint64_t ft_trainer_get_micro_step(const ft_trainer *tr) { return tr->micro_step; }
void ft_trainer_set_micro_step(ft_trainer *tr, uint64_t step) { tr->micro_step = step; }
const ft_train_opts *ft_trainer_opts(const ft_trainer *tr) { return &tr->o; }

/* ------------------------------------------------------------ the step */

static FTUNE_MUST_USE ftune_status check_batch(const ft_trainer *tr, const ft_batch *b) {
    const ft_config *c = &tr->cfg;
    if (b->B < 1 || b->T < 1 || b->B > tr->o.max_B || b->T > tr->o.max_T)
        return ft_err(FTUNE_ERR_ARG, "batch of %d x %d tokens does not fit the trainer's %d x %d", b->B, b->T,
                      tr->o.max_B, tr->o.max_T);
    if (!b->tokens || !b->targets) return ft_err(FTUNE_ERR_ARG, "batch without tokens or targets");
    if (tr->P > 0 && b->doc)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "packed rows (document ids) with a KV prefix are not supported");
    size_t BT = (size_t)b->B * b->T;
    for (size_t i = 0; i < BT; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->V)
            return ft_err(FTUNE_ERR_ARG, "batch row %zu, column %zu: token id %d is outside the vocabulary (0..%d)",
                          i / b->T, i % b->T, b->tokens[i], c->V - 1);
        if (b->targets[i] >= c->V)
            return ft_err(FTUNE_ERR_ARG, "batch row %zu, column %zu: target %d is outside the vocabulary (0..%d)",
                          i / b->T, i % b->T, b->targets[i], c->V - 1);
        if (b->pos && b->pos[i] < 0)
            return ft_err(FTUNE_ERR_ARG, "batch row %zu, column %zu: negative position %d", i / b->T, i % b->T,
                          b->pos[i]);
    }
    return FTUNE_OK;
}

/* Block l, module k's dropout seed for batch b: a data-parallel rank's
 * share of a batch (b->row0 > 0) gets the masks one process would draw
 * for those rows of the whole batch. */
static uint64_t mask_seed(const ft_trainer *tr, const ft_batch *b, int l, int k) {
    uint64_t s = tr->o.lora.seed ^ (tr->micro_step + 1) * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(l * FT_N_MODS + k + 1) * 0xC2B2AE3D27D4EB4Full;
    return s + (uint64_t)b->row0 * (uint64_t)b->T * FT_DROPOUT_ROW_STEP;
}

void ft_trainer_set_hooks(ft_trainer *tr, const ft_block_hooks *h) { tr->hooks = h; }

ftune_status ft_trainer_set_kv_prefix(ft_trainer *tr, const float *k, const float *v, int P, float *dk, float *dv) {
    const ft_config *c = &tr->cfg;
    free_kv_prefix(tr);
    tr->P = 0;
    tr->pk = tr->pv = NULL; tr->pdk = tr->pdv = NULL;
    if (P == 0) return FTUNE_OK;
    if (P < 0 || P > (1 << 20) || !k || !v)
        return ft_err(FTUNE_ERR_ARG, "KV prefix of %d positions is not valid (1..%d, keys and values given)", P,
                      1 << 20);
    size_t kvd = (size_t)c->NKV * c->HS, n = (((size_t)tr->o.max_B * (P + tr->o.max_T) * kvd) + 15) & ~(size_t)15;
    size_t att = ft_attention_fast_scratch_floats(P + tr->o.max_T, c->HS, tr->nt, true);
    tr->kv_bytes = (4 * n + att) * sizeof(float);
    tr->kv_arena = ft_mem_alloc(FT_MEM_KV, tr->kv_bytes);
    tr->pidx = ft_mem_alloc(FT_MEM_OTHER, (size_t)tr->o.max_T * sizeof(int));
    if (!tr->kv_arena || !tr->pidx) {
        free_kv_prefix(tr);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for a KV prefix of %d positions", P);
    }
    tr->kv_k = tr->kv_arena; tr->kv_v = tr->kv_k + n; tr->dkv_k = tr->kv_v + n; tr->dkv_v = tr->dkv_k + n;
    tr->p_att_scratch = tr->dkv_v + n;
    for (int t = 0; t < tr->o.max_T; t++) tr->pidx[t] = P + t;
    tr->P = P;
    tr->pk = k; tr->pv = v; tr->pdk = dk; tr->pdv = dv;
    return FTUNE_OK;
}

static ft_block_env block_env(const ft_trainer *tr) {
    return (ft_block_env){ .cfg = &tr->cfg, .inv_freq = tr->inv_freq, .be = &tr->be,
                           .lin_scratch = tr->lin_scratch, .att_scratch = tr->P ? tr->p_att_scratch : tr->att_scratch,
                           .hooks = tr->o.shard ? &tr->shard_hooks : tr->hooks, .adapters = tr->set };
}

/* Block l's activations: its own, or checkpointing its slot l % K. */
static layer_acts *acts_slot(const ft_trainer *tr, int l) {
    return &tr->la[tr->o.grad_checkpoint ? l % tr->o.grad_checkpoint : l];
}

/* Block l's input, l = L the last block's output, rows of BTC floats.
 * Checkpointing with K: row s holds segment s's input (block sK), row
 * n_seg the last output, rows n_seg + j (j = 1..K-1) the input of block
 * sK + j of the segment being run. */
static float *block_in(const ft_trainer *tr, int l, size_t BTC) {
    int K = tr->o.grad_checkpoint, L = tr->cfg.L;
    if (!K) return tr->res + (size_t)l * BTC;
    int n_seg = n_segments(&tr->cfg, &tr->o);
    int row = l == L ? n_seg : l % K == 0 ? l / K : n_seg + l % K;
    return tr->res + (size_t)row * BTC;
}

/* Block l's call: its own keys/values (no cache), causal over the row. */
static ft_block_io block_io(const ft_trainer *tr, const ft_batch *b, const int *pos, int l, bool train,
                            uint64_t *seeds) {
    for (int k = 0; k < FT_N_MODS; k++) seeds[k] = mask_seed(tr, b, l, k);
    const layer_acts *a = acts_slot(tr, l);
    ft_block_io io = { .B = b->B, .T = b->T, .pos = pos, .q_pos = tr->idx, .keys = a->k,
                       .values = a->v, .Tk = b->T, .doc = b->doc, .train = train, .mask_seed = seeds };
    if (tr->P > 0) {
        size_t off = (size_t)l * tr->P * tr->cfg.NKV * tr->cfg.HS;
        io.P = tr->P;
        io.q_pos = tr->pidx;
        io.keys = tr->kv_k; io.values = tr->kv_v; io.Tk = tr->P + b->T;
        io.prefix_k = tr->pk + off; io.prefix_v = tr->pv + off;
        io.kv_k = tr->kv_k; io.kv_v = tr->kv_v; io.dkv_k = tr->dkv_k; io.dkv_v = tr->dkv_v;
        io.dprefix_k = tr->pdk ? tr->pdk + off : NULL;
        io.dprefix_v = tr->pdv ? tr->pdv + off : NULL;
    }
    return io;
}

static ft_lm_loss_env lm_env(const ft_trainer *tr) {
    return (ft_lm_loss_env){ .head = &tr->lm_head, .loss = &ft_loss_crossentropy, .chunk_rows = tr->CH,
                             .be = &tr->be, .scratch = tr->lm_scratch, .lin_scratch = tr->lin_scratch };
}

/* Forward of the blocks and the final norm; then the fused lm_head + loss,
 * which with train also backprops into dln (= d lnf) and the head's
 * weight. Returns the summed loss. */
static double forward(ft_trainer *tr, const ft_batch *b, const int *pos, bool train, float dloss_scale,
                      int64_t *n_targets) {
    const ft_config *c = &tr->cfg;
    int BT = b->B * b->T, C = c->C;
    ft_block_env e = block_env(tr);
    const ft_backend *be = &tr->be;
    if (tr->n_copies && (tr->copies_stale || !train)) refresh_copies(tr);
    size_t BTC = (size_t)BT * C;
    bool full = tr->o.mode == FT_TRAIN_FULL;
    int64_t VC = (int64_t)c->V * C;
    if (full) seg_need(tr, 0, VC);
    be->embedding_forward(be, block_in(tr, 0, BTC), b->tokens, &tr->tok_embd, BT);
    for (int l = 0; l < c->L; l++) {
        uint64_t seeds[FT_N_MODS];
        ft_block_io io = block_io(tr, b, pos, l, train, seeds);
        ft_block_acts a = *acts_slot(tr, l);
        if (!train) a.lse = NULL; /* nothing is saved for backward */
        ft_block_forward(&e, &tr->layers[l], l, &a, block_in(tr, l + 1, BTC), block_in(tr, l, BTC), &io);
    }
    if (full) seg_need(tr, tr->norm_lo, C);
    be->rmsnorm_forward(be, tr->lnf, tr->rstdf, block_in(tr, c->L, BTC), tr->out_norm, BT, C, c->norm_eps);
    ft_lm_loss_env le = lm_env(tr);
    if (full) seg_need(tr, tr->head_lo, VC);
    if (!train) return ft_lm_loss_forward(&le, n_targets, tr->lnf, b->targets, BT);
    if (full) seg_zero(tr, VC);
    double loss = ft_lm_loss_backward(&le, tr->dln, tr->d_lm_head, n_targets, tr->lnf, b->targets, BT, dloss_scale);
    if (full) seg_done(tr, tr->head_lo, VC);
    return loss;
}

static void backward(ft_trainer *tr, const ft_batch *b, const int *pos) {
    const ft_config *c = &tr->cfg;
    int BT = b->B * b->T, C = c->C;
    ft_block_env e = block_env(tr);
    const ft_backend *be = &tr->be;
    ft_block_scratch s = { .dln = tr->dln, .dq = tr->dq, .datty = tr->datty, .dk = tr->dk, .dv = tr->dv,
                           .h = tr->hbuf, .dh = tr->dh, .dgate = tr->dgate, .dup = tr->dup };
    size_t BTC = (size_t)BT * C;
    be->zero(be, tr->dres, BTC * sizeof(float));
    bool full = tr->o.mode == FT_TRAIN_FULL;
    if (full) {
        seg_need(tr, tr->norm_lo, C);
        seg_zero(tr, C);
    }
    be->rmsnorm_backward(be, tr->dres, tr->d_out_norm, tr->dln, block_in(tr, c->L, BTC), tr->out_norm, tr->rstdf, BT,
                         C);
    if (full) seg_done(tr, tr->norm_lo, C);
    /* without checkpointing: one segment of L blocks, all saved by forward */
    int K = tr->o.grad_checkpoint ? tr->o.grad_checkpoint : c->L, n_seg = (c->L + K - 1) / K;
    for (int sg = n_seg - 1; sg >= 0; sg--) {
        int l0 = sg * K, l1 = l0 + K < c->L ? l0 + K : c->L;
        /* the segment's forward again (the last one's is still there); the
         * last block's output overwrites the next segment's input, which
         * its backward no longer needs, with the same values */
        if (sg < n_seg - 1)
            for (int l = l0; l < l1; l++) {
                uint64_t seeds[FT_N_MODS];
                ft_block_io io = block_io(tr, b, pos, l, true, seeds);
                ft_block_forward(&e, &tr->layers[l], l, acts_slot(tr, l), block_in(tr, l + 1, BTC),
                                 block_in(tr, l, BTC), &io);
            }
        for (int l = l1 - 1; l >= l0; l--) {
            uint64_t seeds[FT_N_MODS];
            ft_block_io io = block_io(tr, b, pos, l, true, seeds);
            ft_block_backward(&e, &tr->layers[l], l, &tr->lg[l], tr->dres, block_in(tr, l, BTC), acts_slot(tr, l),
                              &io, &s);
        }
    }
    if (tr->d_tok_embd) {
        seg_zero(tr, (int64_t)c->V * C);
        /* FTUNE_ERR_RANGE only for a token outside the vocabulary, which check_batch refused */
        step_keep(tr, be->embedding_backward(be, tr->d_tok_embd, tr->dres, b->tokens, BT, C, c->V));
        seg_done(tr, 0, (int64_t)c->V * C);
    }
}

/* RoPE positions: the batch's, or 0..T-1 per row; shifted by a KV prefix. */
static const int *positions(ft_trainer *tr, const ft_batch *b) {
    if (b->pos && tr->P == 0) return b->pos;
    for (int r = 0; r < b->B; r++)
        for (int t = 0; t < b->T; t++) {
            size_t i = (size_t)r * b->T + t;
            tr->pos0[i] = tr->P + (b->pos ? b->pos[i] : t);
        }
    return tr->pos0;
}

ftune_status ft_trainer_step(ft_trainer *tr, const ft_batch *b, int64_t n_targets_total, double *loss_sum) {
    return ft_trainer_step_scaled(tr, b, n_targets_total, 1.0f, loss_sum);
}

ftune_status ft_trainer_step_scaled(ft_trainer *tr, const ft_batch *b, int64_t n_targets_total, float loss_scale,
                                    double *loss_sum) {
    *loss_sum = 0;
    ftune_status st = check_batch(tr, b);
    if (st) return st;
    if (n_targets_total < 1)
        return ft_err(FTUNE_ERR_ARG, "the loss is normalised by %lld target tokens; it must be at least 1",
                      (long long)n_targets_total);
    const int *pos = positions(tr, b);
    tr->step_st = FTUNE_OK;
    *loss_sum = forward(tr, b, pos, true, (float)((double)loss_scale / (double)n_targets_total), NULL);
    backward(tr, b, pos);
    tr->micro_step++;
    return tr->step_st;
}

void ft_trainer_adamw_step(ft_trainer *tr, ft_adamw *o, double lr) {
    tr->be.adamw_step(&tr->be, o, lr);
    tr->copies_stale = true;
}

ftune_status ft_trainer_eval(ft_trainer *tr, const ft_batch *b, double *loss_sum, int64_t *n_targets) {
    *loss_sum = 0;
    *n_targets = 0;
    ftune_status st = check_batch(tr, b);
    if (st) return st;
    /* validation is not part of a step: the profile (when on) times only steps */
    ft_backend be = tr->be;
    if (tr->prof) tr->be = tr->prof->inner;
    tr->step_st = FTUNE_OK;
    *loss_sum = forward(tr, b, positions(tr, b), false, 0, n_targets);
    tr->be = be;
    return tr->step_st;
}

ftune_status ft_trainer_optim_params(const ft_trainer *tr, bool lora, ft_param **out, int *n, int64_t *n_trainable) {
    int np = ft_trainer_n_params(tr);
    ft_param *ps = ft_calloc((size_t)np, sizeof *ps);
    if (!ps) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    int64_t total = 0;
    for (int i = 0; i < np; i++) {
        ps[i] = tr->params[i].opt;
        ps[i].decay = lora || ps[i].ndim == 2;
        total += ps[i].numel;
    }
    *out = ps;
    *n = np;
    if (n_trainable) *n_trainable = total;
    return FTUNE_OK;
}
