/* train.h — the training forward and backward of a whole Llama-family
 * model: LoRA adapters on any of q,k,v,o,gate,up,down over frozen base
 * weights of any dtype, or full fine-tuning of f32 copies of every weight.
 * A trainer plans its memory once for (max_B, max_T) and allocates it in
 * one arena per lifetime class (trainables, grads, activations, scratch);
 * nothing is allocated inside a step.
 *
 * One optimizer step with gradient accumulation:
 *     ft_trainer_zero_grad(tr);
 *     for each micro-batch b: ft_trainer_step(tr, b, n_targets_of_all_micro_batches, &loss_sum);
 *     update ft_trainer_values() from ft_trainer_grads() (one flat f32 array each)
 * The gradients are those of (summed cross-entropy) / n_targets_total, so
 * the accumulated gradient equals that of one big batch's mean loss.
 */
#ifndef FT_TRAIN_H
#define FT_TRAIN_H

#include "data/data.h"
#include "model/model.h"
#include "optim/optim.h"
#include "nn/adapter_kind.h"
#include "nn/block.h"

typedef enum { FT_TRAIN_LORA = 0, FT_TRAIN_FULL = 1 } ft_train_mode;

/* LoRA targets are FT_MOD_BIT masks of module.h (FT_MOD_ALL: every Linear). */
/* Parses a comma-separated list of "q,k,v,o,gate,up,down" or the PEFT
 * names ("q_proj", ...), or "all" / "all-linear". */
FTUNE_MUST_USE ftune_status ft_lora_targets_parse(const char *s, unsigned *mask);

/* ZeRO 2 and 3 (train_loop.c): the trainables as segments of the flat
 * array, one per block (a block's parameters are contiguous, with the same
 * layout in every block) and one per parameter outside the blocks
 * (embedding, final norm, head). With ft_train_opts.shard set, the trainer
 * keeps its gradients in one window the size of the largest segment,
 * shared by all segments: it zeroes the window before a segment's
 * backward and calls grads(lo, hi, window) once that segment's gradient of
 * the micro-batch is complete there (a tied embedding twice: after the
 * head and after the embedding's backward); the callee sums it where it
 * keeps it (a reduce-scatter). With shard_values too, the values live in
 * another such window: values(lo, hi, window, false) fills it before the
 * trainer reads a segment (before a block's forward and again before its
 * backward, through the block's per-layer hooks; before the embedding, the
 * final norm and the head), and at ft_trainer_new values(..., true) hands
 * each segment's initial values over to be kept. ft_trainer_values() and
 * ft_trainer_grads() then return the windows, and parameters' data/grad
 * point into them (valid only for the segment being run). A callback's
 * error stops nothing at once (the collectives go on in the same order on
 * every rank): the step returns the first one. */
typedef struct {
    FTUNE_MUST_USE ftune_status (*values)(void *ctx, int64_t lo, int64_t hi, float *vals, bool init);
    FTUNE_MUST_USE ftune_status (*grads)(void *ctx, int64_t lo, int64_t hi, float *grad);
    void *ctx;
} ft_train_shard;

typedef struct {
    ft_train_mode mode;
    ft_adapter_hparams lora; /* LoRA mode: r, alpha, rslora, dropout, targets;
                              * seed: adapter initialisation and dropout masks */
    int max_B, max_T;     /* largest micro-batch the arenas are sized for */
    int n_threads;        /* 0: all cores */
    ft_dtype compute;     /* the backend's compute type (backend.h): FT_F32, FT_BF16, FT_F16. The
                           * trainables stay f32 masters; the products read them rounded. FT_F32 on a
                           * model loaded in another compute type is refused (its weights were
                           * rounded at load); FT_F16 checks the base weights' range. */
    bool no_compute_copies; /* full mode in bf16/f16: read the f32 masters rounded in the products
                             * instead of compute copies (the same numbers; for tests) */
    bool f32_acts;        /* bf16/f16: keep the Linears' inputs ln1, ln2, atty saved in f32 instead
                           * of the compute type (the same numbers; for tests) */
    int grad_checkpoint;  /* gradient checkpointing: 0 off; K in 1..L: the blocks run in segments of K
                           * (the last may be shorter), only each segment's input (the residual stream)
                           * is kept, and a segment's forward is run again just before its backward into
                           * one segment's activation buffers. The same ops on the same inputs with the
                           * same dropout seeds: the gradients are bit-identical to K = 0. The last
                           * segment's activations are still live after forward and are not recomputed.
                           * Block hooks (ft_trainer_set_hooks) see the recomputed forward calls too:
                           * FT_BLOCK_PRE/POST_FORWARD again before that segment's backward. */
    const char *paged_dir; /* full mode with compute copies (bf16/f16): the f32 masters, which only the
                            * optimizer and the copies' refresh read, in a file-backed mapping there that
                            * the kernel can page out (ft_mem_map_paged); NULL, or any other mode: in
                            * memory. The same numbers either way. */
    const ft_train_shard *shard; /* ZeRO 2/3: gradients (and with shard_values, values) in one
                                  * segment's window (above), or NULL: whole arrays */
    bool shard_values;          /* ZeRO 3 (needs shard); full mode reads the f32 masters rounded
                                 * (no compute copies: the same numbers) */
    /* The optimizer the trainables get (the trainer does not allocate it; its
     * plan sizes it with ft_optim_state_bytes, as ft_adamw_init does) */
    ft_optim_kind optim;  /* FT_OPTIM_ADAMW */
    int optim_block;      /* ADAMW8BIT's elements per absmax: FT_ADAM8_BLOCK */
    bool paged_optim;     /* its state in a file-backed mapping (FT_MEM_PAGED) */
} ft_train_opts;

/* The compute type for ftune_train_opts.dtype: NULL the model's, else
 * the name parsed ("--dtype" in the message). */
FTUNE_MUST_USE ftune_status ft_train_compute_of(const ftune_model *m, const char *dtype, ft_dtype *out);

/* r 8, alpha 16, no dropout, all seven targets, seed 0, max_B 1,
 * max_T 512, LoRA mode, all cores, f32 compute. */
void ft_train_opts_default(ft_train_opts *o);

/* A trainable tensor: a view into the trainer's flat value and gradient
 * arrays. Names are what PEFT (LoRA) or Hugging Face (full) call them:
 * "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight",
 * "model.layers.3.mlp.up_proj.weight", "model.embed_tokens.weight". With a
 * tied head there is no "lm_head.weight": the embedding gets both
 * gradient contributions. For models loaded from GGUF or llama2.c
 * (rope_interleaved), the rows of q_proj/k_proj weights (full) and of their
 * lora_B (LoRA) are in that file's interleaved order: exporters to Hugging
 * Face layout must permute them back. */
typedef struct {
    ft_param opt;         /* name, data, grad, numel, ndim, shape, decay: the optimizer's
                           * descriptor of the tensor (ft_trainer_optim_params hands these out) */
    int64_t offset;       /* of opt.data in ft_trainer_values(), in floats */
    int layer;            /* block index, or -1 (embedding, final norm, head) */
    int target;           /* the Linear's ft_module, or -1 */
} ft_train_param;

/* Memory a trainer needs, in bytes, by lifetime class: exactly what
 * ft_trainer_new allocates (optim_bytes: what ft_adamw_init allocates for
 * these trainables with opts' optim, optim_block and paged_optim, from
 * ft_optim_state_bytes over their sizes). Weights and a KV prefix are not
 * in it: ft_trainer_mem_table adds them. */
typedef struct {
    int64_t n_trainable;  /* floats */
    size_t trainable_bytes, grad_bytes, activation_bytes, scratch_bytes;
    size_t optim_bytes;
    size_t attention_scratch_bytes, loss_scratch_bytes; /* of scratch_bytes: attention's workspace and the
                                                          * LM head + loss chunk's logits and their gradient */
    size_t other_bytes;   /* the trainer's bookkeeping (layer views, parameter list) */
    size_t copy_bytes;    /* full mode in bf16/f16: compute copies of the Linears' and an untied
                           * head's masters (FT_MEM_WEIGHTS), refreshed from them before a
                           * forward that follows an optimizer step or zero_grad; else 0 */
    bool masters_paged;   /* trainable_bytes are FT_MEM_PAGED (opts paged_dir with compute copies) */
    bool optim_paged;     /* optim_bytes are FT_MEM_PAGED (opts paged_optim) */
} ft_train_plan;

typedef struct ft_trainer ft_trainer;

/* Sizes a trainer for cfg without building it (for `ftune plan`). */
FTUNE_MUST_USE ftune_status ft_trainer_plan(const ft_config *cfg, const ft_train_opts *o, ft_train_plan *plan);
/* ZeRO 2/3's segments (the flat trainables' split the windows follow):
 * block l's segment is [lay0 + l layer_n, + layer_n); full mode adds the
 * embedding's [0, V C), the final norm's C and an untied head's V C. What
 * `ftune plan` counts the collectives of (o as for ft_trainer_plan). */
void ft_trainer_segments(const ft_config *cfg, const ft_train_opts *o, int64_t *lay0, int64_t *layer_n);

/* Builds a trainer on m, which must outlive it and is not modified: base
 * weights stay where the model has them (shared, never copied in LoRA
 * mode); the trainer holds its own view of the layers with adapters
 * attached. LoRA adapters are initialised as PEFT does (A Kaiming-uniform
 * from opts->seed, B zero); full mode copies every weight to f32. */
FTUNE_MUST_USE ftune_status ft_trainer_new(ft_trainer **out, const ftune_model *m, const ft_train_opts *o);
void ft_trainer_free(ft_trainer *tr);
/* The plan tr was allocated with. */
const ft_train_plan *ft_trainer_get_plan(const ft_trainer *tr);
/* The trainer's memory table: planned rows from its plan and its model
 * (weights mapped and owned, KV prefix), measured rows from the counters
 * of the whole process (ft_mem_table_measure). */
void ft_trainer_mem_table(const ft_trainer *tr, ft_mem_table *t);

/* Forward and backward of one micro-batch (B <= max_B rows of T <= max_T;
 * targets -1 ignored; pos NULL means 0..T-1 per row; doc NULL means one
 * document per row). Adds the gradient of sum(loss) / n_targets_total to
 * the grads and returns the summed (unnormalised) loss of this batch in
 * *loss_sum. Draws fresh dropout masks each call. */
FTUNE_MUST_USE ftune_status ft_trainer_step(ft_trainer *tr, const ft_batch *b, int64_t n_targets_total, double *loss_sum);
/* The same with the loss multiplied by loss_scale before backward (loss
 * scaling, train/grad_scaler.h): the gradient seed is the f32 of
 * loss_scale / n_targets_total, which for a power-of-two scale is exactly
 * loss_scale times ft_trainer_step's, so that in f32 every gradient is
 * exactly loss_scale times as large unless it overflows. *loss_sum is not
 * scaled. ft_trainer_step is this with loss_scale 1. */
FTUNE_MUST_USE ftune_status ft_trainer_step_scaled(ft_trainer *tr, const ft_batch *b, int64_t n_targets_total, float loss_scale,
                                    double *loss_sum);
/* Forward only, no dropout, grads untouched: summed loss and the number of
 * targets (for validation loss). */
FTUNE_MUST_USE ftune_status ft_trainer_eval(ft_trainer *tr, const ft_batch *b, double *loss_sum, int64_t *n_targets);
void ft_trainer_zero_grad(ft_trainer *tr);
/* One AdamW update (ft_adamw_step) of o, whose parameters are this
 * trainer's values and grads, on the trainer's backend (full mode in
 * bf16/f16: the compute copies are refreshed before the next forward). */
void ft_trainer_adamw_step(ft_trainer *tr, ft_adamw *o, double lr);

int ft_trainer_n_params(const ft_trainer *tr);
const ft_train_param *ft_trainer_param(const ft_trainer *tr, int i);
/* The optimizer's view of tr's parameters (calloc'd, the caller frees):
 * names, shapes and data/grad pointers, weight decay on matrices only
 * (none on norms and biases, as Hugging Face's Trainer) or on every LoRA
 * tensor; *n_trainable counts their elements. */
FTUNE_MUST_USE ftune_status ft_trainer_optim_params(const ft_trainer *tr, bool lora, ft_param **out, int *n, int64_t *n_trainable);
/* Index of the parameter named name, or -1. */
int ft_trainer_find_param(const ft_trainer *tr, const char *name);
/* All trainable values and their gradients, each one flat f32 array of *n
 * floats in parameter order (for the optimizer, all-reduce, checkpoints). */
float *ft_trainer_values(ft_trainer *tr, int64_t *n);
float *ft_trainer_grads(ft_trainer *tr, int64_t *n);
/* The adapter on Linear `target` (an ft_module, ft_modules
 * order) of block `layer`, or NULL (not targeted, full mode, out of range).
 * Its A/B/dA/dB point into ft_trainer_values()/ft_trainer_grads(); the
 * model's own Linears never see it (wrap these to export or sample). */
ft_lora *ft_trainer_lora(ft_trainer *tr, int layer, int target);
/* The micro-step counter that seeds dropout masks (save it in checkpoints
 * and restore it to replay the same masks). */
uint64_t ft_trainer_get_micro_step(const ft_trainer *tr);
void ft_trainer_set_micro_step(ft_trainer *tr, uint64_t step);
const ft_train_opts *ft_trainer_opts(const ft_trainer *tr);

/* The block hooks every block call of the trainer's steps sees (NULL removes them). */
void ft_trainer_set_hooks(ft_trainer *tr, const ft_block_hooks *h);
/* KV prefix for a trainer: k, v (L, P, NKV*HS) as for a session (keys
 * rotated for positions 0..P-1, run/run.h), seen by every batch row before
 * its own tokens, whose positions shift by P. dk, dv (L, P, NKV*HS), when
 * non-NULL, accumulate the gradient of the step's loss (prefix tuning
 * trains them). The arrays must outlive the trainer's use of them; P = 0
 * removes the prefix. Batches with doc ids (packed rows) are refused while
 * a prefix is set. Allocates its scratch here, not in the step. */
FTUNE_MUST_USE ftune_status ft_trainer_set_kv_prefix(ft_trainer *tr, const float *k, const float *v, int P, float *dk, float *dv);

#endif
