/* optim.h — AdamW with decoupled weight decay (as torch.optim.AdamW) and its
 * 8-bit form (as bitsandbytes' AdamW8bit: blockwise dynamic-map m and v),
 * the state optionally in a file-backed mapping the kernel can page out,
 * global gradient-norm clipping (as torch.nn.utils.clip_grad_norm_),
 * learning-rate schedules with linear warmup (as Hugging Face transformers'
 * get_*_schedule_with_warmup), and the optimizer state in a safetensors
 * checkpoint. */
#ifndef FT_OPTIM_H
#define FT_OPTIM_H

#include "core/core.h"
#include "core/mem.h"

/* One trainable tensor. data and grad are caller-owned and must outlive the
 * optimizer; name and shape identify its state in a checkpoint. */
typedef struct {
    char name[FT_NAME_MAX * 2];
    float *data;                /* (numel) */
    float *grad;                /* (numel) */
    int64_t numel;
    int ndim;
    int64_t shape[FT_MAX_DIMS]; /* product == numel */
    bool decay;                 /* weight decay applies (false for biases, norms) */
} ft_param;

/* What holds AdamW's moments. ADAMW: f32 m and v. ADAMW8BIT: as
 * bitsandbytes' blockwise 8-bit AdamW, for each parameter of at least
 * FT_ADAM8_MIN_SIZE elements m is one byte per element into the signed
 * dynamic map and v into the unsigned one, each block of `block` elements
 * (counted from the parameter's first) with one f32 absmax; every step
 * dequantizes a block, updates it in f32 exactly as ADAMW does, and
 * requantizes it to the nearest map entry (no stochastic rounding, as
 * bitsandbytes' optimizers). Smaller parameters keep f32 m and v, as
 * bitsandbytes' min_8bit_size. */
typedef enum { FT_OPTIM_ADAMW = 0, FT_OPTIM_ADAMW8BIT = 1 } ft_optim_kind;
#define FT_ADAM8_MIN_SIZE 4096   /* bitsandbytes' min_8bit_size */
#define FT_ADAM8_BLOCK 256       /* bitsandbytes' blockwise optimizers since 0.44 (2048 before) */
#define FT_ADAM8_MAX_BLOCK 4096

/* Parses "adamw" or "adamw8bit"; the name of a kind. */
FTUNE_MUST_USE ftune_status ft_optim_kind_parse(const char *s, ft_optim_kind *out);
const char *ft_optim_kind_name(ft_optim_kind k);

/* The 256 entries of bitsandbytes' create_dynamic_map(signed) (sorted, in
 * [-1, 1] or [0, 1]). */
const float *ft_dynamic_map(bool is_signed);
/* Index of the map entry nearest x (clamped to [-1, 1]) as torch.bucketize
 * over the midpoints of neighbours: a tie goes to the lower entry. The
 * plain version counts the midpoints below x; the fast one (what the
 * optimizer uses, also as AVX-512 gathers) looks it up in a table over x's
 * float bits. */
uint8_t ft_dynamic_quantize_ref(bool is_signed, float x);
uint8_t ft_dynamic_quantize(bool is_signed, float x);
/* Whether the fast path's tables checked out when built (else it counts). */
bool ft_dynamic_quantize_fast_ok(void);

typedef struct {
    /* doubles, as the Python floats torch computes its scalars from */
    double beta1, beta2;        /* 0.9, 0.999 */
    double eps;                 /* 1e-8 */
    double weight_decay;        /* decoupled: p -= lr * wd * p before the Adam update */
    int n_threads;              /* threads for the update (1 by default; 0: all cores); the
                                 * result is the same bits for any count (elementwise) */
    ft_optim_kind kind;         /* FT_OPTIM_ADAMW */
    int block;                  /* ADAMW8BIT: elements per absmax, a power of two in 64..4096;
                                 * FT_ADAM8_BLOCK */
    bool reference;             /* ADAMW8BIT: quantize with ft_dynamic_quantize_ref (for tests) */
    /* paged: the state lives in a MAP_SHARED mapping of an unlinked temporary
     * file in paged_dir (ft_mem_map_paged), so that under memory pressure the
     * kernel writes its pages back to the file and drops them instead of
     * holding them in RAM. The numbers are the same bits as unpaged. */
    bool paged;
    const char *paged_dir;      /* required when paged */
} ft_adamw_cfg;

/* Bytes of optimizer state for n parameters of numel[i] elements: what
 * ft_adamw_init allocates (paged: rounded up to whole pages). For planners
 * (`ftune plan`): ADAMW 8 bytes per element; ADAMW8BIT 2 bytes per element
 * plus 8 per block of `block` of each parameter of at least
 * FT_ADAM8_MIN_SIZE, 8 bytes per element of the smaller ones. */
size_t ft_optim_state_bytes(const int64_t *numel, int n, ft_optim_kind kind, int block, bool paged);

void ft_adamw_defaults(ft_adamw_cfg *c);

typedef struct ft_adamw {
    ft_adamw_cfg cfg;
    int n;
    ft_param *params;           /* (n) copies of the caller's descriptors */
    float **m, **v;             /* (n) first/second moments, each (numel); NULL where 8-bit */
    uint8_t **qm, **qv;         /* (n) ADAMW8BIT: codes of m and v, each (numel); NULL where f32 */
    float **am, **av;           /* (n) ADAMW8BIT: their absmax per block, each (ceil(numel / block)) */
    void *state;                /* one allocation holding all of it: the f32 parts, then the codes */
    size_t state_bytes;         /* its size, counted as FT_MEM_OPTIM (paged: FT_MEM_PAGED) */
    int64_t step;               /* updates done so far */
} ft_adamw;

/* Allocates zeroed moments for n parameters. Names must be distinct. Paged:
 * FTUNE_ERR_IO naming paged_dir when the file or its mapping cannot be made. */
FTUNE_MUST_USE ftune_status ft_adamw_init(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg);
void ft_adamw_free(ft_adamw *o);
/* One update of every parameter from its grad with learning rate lr (the
 * schedule's value for this step); increments step. Grads are not zeroed. */
void ft_adamw_step(ft_adamw *o, double lr);

/* Scales every grad by min(1, max_norm / (norm + 1e-6)) where norm is the L2
 * norm over all grads together, accumulated in double. Returns that norm
 * before clipping. A non-finite norm leaves the grads untouched (the caller
 * should skip the step); max_norm <= 0 only measures. */
double ft_clip_grad_norm(const ft_param *params, int n, double max_norm);

/* The two halves of ft_clip_grad_norm, for gradients spread over ranks:
 * the sum of squares (double, per parameter then over parameters) of a
 * rank's part, and the scaling of that part by the global norm. */
double ft_grad_sumsq(const ft_param *params, int n);
void ft_clip_grad_by_norm(const ft_param *params, int n, double norm, double max_norm);

/* ZeRO: the parts of params (whose data lie in one flat array starting at
 * base, grads likewise) inside the flat range [lo, hi): 1-D pieces with
 * their parameter's name and decay flag, in order (calloc'd, the caller
 * frees; *n_out may be 0). AdamW on the pieces updates exactly those
 * elements as AdamW on the whole list would. */
FTUNE_MUST_USE ftune_status ft_params_shard(const ft_param *params, int n, const float *base, int64_t lo, int64_t hi, ft_param **out,
                             int *n_out);
/* An optimizer over params whose moments are not its own: m and v of
 * parameter i are m_flat and v_flat at that parameter's offset from base
 * (each flat array as long as the parameters' span). For saving and loading
 * a state gathered from shards with ft_adamw_save / ft_adamw_load; free it
 * with ft_adamw_free (the flat arrays stay the caller's); never step it. */
FTUNE_MUST_USE ftune_status ft_adamw_view(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg, const float *base,
                           float *m_flat, float *v_flat);

/* Learning-rate schedules: linear warmup from 0 over warmup_steps, then
 * constant, linear or half-cosine decay to min_lr at total_steps. */
typedef enum { FT_SCHED_CONSTANT = 0, FT_SCHED_LINEAR, FT_SCHED_COSINE } ft_sched_kind;

typedef struct {
    ft_sched_kind kind;
    double lr;                  /* peak learning rate */
    double min_lr;              /* floor reached at total_steps (0: decay to 0) */
    int64_t warmup_steps;
    int64_t total_steps;
} ft_sched;

/* Parses "constant", "linear" or "cosine". */
FTUNE_MUST_USE ftune_status ft_sched_kind_parse(const char *s, ft_sched_kind *out);
/* Learning rate for the update with 0-based index step (the first update is
 * step 0, so with warmup it uses lr 0, as a LambdaLR-driven HF Trainer). */
double ft_sched_lr(const ft_sched *s, int64_t step);

/* Optimizer state in a safetensors file: tensors "opt.m.<name>" and
 * "opt.v.<name>" (F32, each parameter's shape) for f32 moments; for 8-bit
 * ones "opt.m8.<name>" and "opt.v8.<name>" (U8, the parameter's shape) with
 * "opt.m8.absmax.<name>" and "opt.v8.absmax.<name>" (F32, one per block);
 * metadata "opt.step", "opt.kind" ("adamw", "adamw8bit"), "opt.block"
 * (adamw8bit) and the hyperparameters. extra_meta (NULL-terminated
 * key,value pairs or NULL) is added to the metadata. */
FTUNE_MUST_USE ftune_status ft_adamw_save(const ft_adamw *o, const char *path, const char *const *extra_meta);
/* Restores step, m and v into an optimizer initialised with the same
 * parameters, kind and block. Every parameter must have its tensors with
 * its shape and dtype, and the file must hold no optimizer tensor for a
 * parameter the optimizer does not have; another kind is FTUNE_ERR_ARG
 * naming both. On failure the optimizer is unchanged. */
FTUNE_MUST_USE ftune_status ft_adamw_load(ft_adamw *o, const char *path);

#endif
