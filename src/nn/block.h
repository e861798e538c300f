/* block.h — the one transformer block (rmsnorm, attention, rmsnorm, SwiGLU
 * MLP, two residual adds), forward and backward, and the one RoPE setup.
 * Both users call it: inference sessions (new keys/values go into a KV
 * cache, nothing is saved) and the trainer (every intermediate is saved for
 * backward, keys/values are the batch's own).
 *
 * The caller says where each intermediate goes with an ft_block_acts: the
 * trainer gives each layer its own saved arrays; a session gives scratch
 * buffers that alias where lifetimes allow (ln1/mid, atty/ln2, gate/h) and
 * points k/v at the cache rows of the new tokens. The arithmetic is the
 * same op sequence either way.
 *
 * What comes next builds on this without changing it:
 *  - gradient checkpointing keeps only the block inputs x; before a block's
 *    backward (FT_BLOCK_PRE_BACKWARD) it calls ft_block_forward again on the
 *    saved x with the same ft_block_io (the same mask seeds, so the same
 *    dropout) into one shared ft_block_acts, then ft_block_backward runs on
 *    it unchanged. Forward is a pure function of (x, weights, io).
 *  - bf16 compute keeps the arrays f32 and the calls as they are; the
 *    inputs of Linears (ln1, ln2, atty) may be saved in the compute type
 *    (ft_block_acts.ln1_c, ...).
 *  - every op goes through the env's backend table (backend.h), so another
 *    backend runs this same sequence on its own buffers.
 *  - ZeRO-3 gathers a layer's weights in the pre hooks and frees them in the
 *    post hooks; the block reads the weights only between the two.
 *  - calibration (GPTQ/AWQ/SparseGPT) sees each Linear's input rows through
 *    the observer, exactly as the Linear gets them.
 */
#ifndef FT_BLOCK_H
#define FT_BLOCK_H

#include "nn/backend.h"
#include "nn/layer.h"

/* inv_freq (HS/2) for cfg: rope_freqs with the config's theta and scaling,
 * then divided by GGUF's rope_freqs.weight factors when freq_factors is
 * non-NULL. The one place both sessions and trainers get their RoPE from. */
void ft_rope_setup(float *inv_freq, const ft_config *cfg, const float *freq_factors);

/* Where the block's intermediates go, rows BT = B·T (inference: B = 1). */
typedef struct {
    float *ln1, *rstd1;           /* (BT, C), (BT); rstd1 may be NULL without backward */
    float *q;                     /* (BT, NH*HS) after RoPE */
    float *k, *v;                 /* (BT, NKV*HS) this call's keys (after RoPE) and values */
    float *atty;                  /* (BT, NH*HS) attention output, wo's input */
    float *lse;                   /* (B, NH, T) attention log-sum-exp, or NULL without backward */
    float *mid;                   /* (BT, C) residual after attention */
    float *ln2, *rstd2;           /* (BT, C), (BT); rstd2 may be NULL without backward */
    float *gate, *up;             /* (BT, F) */
    float *h;                     /* (BT, F) SwiGLU output (may be gate without backward) */
    float *u[FT_N_MODS];        /* (BT, R) adapter activations for backward, or NULL */
    /* Saved in the backend's compute type instead (bf16/f16 training), or
     * NULL: ln1, ln2 and atty are then scratch (they may be one buffer),
     * saved here after their Linears read them and restored before their
     * Linears' backward. They feed only matrix products, which round them
     * to the compute type anyway, so this changes no result. */
    void *ln1_c, *ln2_c;          /* (BT, C) */
    void *atty_c;                 /* (BT, NH*HS) */
} ft_block_acts;

/* The token layout of one call. */
typedef struct {
    int B, T;
    const int *pos;               /* (BT) RoPE positions */
    const int *q_pos;             /* (T) index among the keys of each query (causal limit) */
    const float *keys, *values;   /* (B, Tk, NKV*HS): every key/value visible; acts.k/v lie inside */
    int Tk;
    const int *doc;               /* (B, Tk) document ids (packed rows), or NULL */
    bool train;                   /* linear_forward_train: adapter dropout, u saved */
    const uint64_t *mask_seed;    /* (FT_N_MODS) dropout mask seed of each Linear (train) */
    /* KV prefix (prefix tuning) in training: every batch row sees P keys
     * (already rotated) and values before its own. With P > 0 the block
     * assembles keys/values = kv_k/kv_v (B, P+T, NKV*HS) from the prefix
     * and acts.k/v (forward, and again in backward: kv_k/kv_v are scratch
     * that later layers overwrite), Tk must be P+T and q_pos[t] = P + t.
     * A session's prefix is instead the first P rows of its cache (P = 0 here). */
    int P;
    const float *prefix_k, *prefix_v; /* (P, NKV*HS) this layer's */
    float *kv_k, *kv_v;           /* (B, P+T, NKV*HS) scratch */
    float *dprefix_k, *dprefix_v; /* (P, NKV*HS) backward accumulates (+=) into them, or NULL */
    float *dkv_k, *dkv_v;         /* (B, P+T, NKV*HS) backward scratch */
} ft_block_io;

typedef enum {
    FT_BLOCK_PRE_FORWARD,         /* rows: the block input x */
    FT_BLOCK_POST_FORWARD,        /* rows: the block output */
    FT_BLOCK_PRE_BACKWARD,        /* rows: d(block output) */
    FT_BLOCK_POST_BACKWARD,       /* rows: d(block input) */
} ft_block_event;

/* Hooks; any member may be NULL. Called on the calling thread. */
typedef struct {
    /* Around each block call: rows is (n, C) as listed for ev. */
    void (*layer)(void *ctx, ft_block_event ev, int layer, const float *rows, int n, int C);
    /* Before each Linear runs, with exactly the input it gets, (n, in). */
    void (*linear_input)(void *ctx, int layer, int which, const float *inp, int n, int in);
    void *ctx;
} ft_block_hooks;

/* What every block call shares. */
typedef struct {
    const ft_config *cfg;
    const float *inv_freq;        /* (HS/2) from ft_rope_setup */
    const ft_backend *be;         /* every op runs through it (threads: be->n_threads) */
    float *lin_scratch;           /* ft_linear_scratch_floats (inference) or linear_train_scratch_floats */
    float *att_scratch;           /* ft_attention_fast_scratch_floats(Tk, HS, n_threads, backward) */
    const ft_block_hooks *hooks;  /* or NULL */
    /* The caller's adapter set: adapters[l * FT_N_MODS + k] for block l,
     * Linear k (any adapter kind), or NULL (no adapter there; the whole set
     * may be NULL). The block passes it to each Linear op, so the model's
     * Linears are never written: two sessions (or a session and a trainer)
     * on one model each run their own adapters, concurrently. */
    const ft_adapter_inst *const *adapters;
} ft_block_env;

/* out (BT, C) = block(x (BT, C)). out may be x (in place: x is last read
 * before out is written). Queries see io->keys/values rows 0..q_pos[t]. */
void ft_block_forward(const ft_block_env *e, const ft_layer *ly, int layer, const ft_block_acts *a, float *out,
                      const float *x, const ft_block_io *io);

/* Gradients of one block's parameters; NULL members are not trained
 * (LoRA mode: adapters carry their own dA/dB). All accumulate (+=). */
typedef struct {
    float *attn_norm, *ffn_norm;  /* (C) */
    float *w[FT_N_MODS];        /* (out, in) */
    float *b[FT_N_MODS];        /* (out) */
} ft_block_grads;

/* Backward scratch, rows BT. */
typedef struct {
    float *dln;                   /* (BT, C) */
    float *dq, *datty;            /* (BT, NH*HS) */
    float *dk, *dv;               /* (BT, NKV*HS) */
    float *h, *dh, *dgate, *dup;  /* (BT, F) */
} ft_block_scratch;

/* Backward of ft_block_forward(io with keys/values = a->k/v, Tk = T, or a
 * KV prefix as described at ft_block_io) from its saved acts: dres (BT, C) holds d(out) on entry and d(x) on return;
 * parameter and adapter gradients accumulate. Attention probabilities come
 * from the saved lse, the SwiGLU output is recomputed into s->h. */
void ft_block_backward(const ft_block_env *e, const ft_layer *ly, int layer, const ft_block_grads *g, float *dres,
                       const float *x, const ft_block_acts *a, const ft_block_io *io, const ft_block_scratch *s);

#endif
