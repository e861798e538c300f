/* optim.h — AdamW with decoupled weight decay (as torch.optim.AdamW), global
 * gradient-norm clipping (as torch.nn.utils.clip_grad_norm_), learning-rate
 * schedules with linear warmup (as Hugging Face transformers' get_*_schedule_
 * with_warmup), and the optimizer state in a safetensors checkpoint. */
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

typedef struct {
    /* doubles, as the Python floats torch computes its scalars from */
    double beta1, beta2;        /* 0.9, 0.999 */
    double eps;                 /* 1e-8 */
    double weight_decay;        /* decoupled: p -= lr * wd * p before the Adam update */
    int n_threads;              /* threads for the update (1 by default; 0: all cores); the
                                 * result is the same bits for any count (elementwise) */
} ft_adamw_cfg;

void ft_adamw_defaults(ft_adamw_cfg *c);

typedef struct {
    ft_adamw_cfg cfg;
    int n;
    ft_param *params;           /* (n) copies of the caller's descriptors */
    float **m, **v;             /* (n) first/second moments, each (numel) */
    float *state;               /* one allocation holding every m and v */
    size_t state_bytes;         /* its size, counted as FT_MEM_OPTIM */
    int64_t step;               /* updates done so far */
} ft_adamw;

/* Allocates zeroed moments for n parameters. Names must be distinct. */
ftune_status ft_adamw_init(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg);
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
ftune_status ft_params_shard(const ft_param *params, int n, const float *base, int64_t lo, int64_t hi, ft_param **out,
                             int *n_out);
/* An optimizer over params whose moments are not its own: m and v of
 * parameter i are m_flat and v_flat at that parameter's offset from base
 * (each flat array as long as the parameters' span). For saving and loading
 * a state gathered from shards with ft_adamw_save / ft_adamw_load; free it
 * with ft_adamw_free (the flat arrays stay the caller's); never step it. */
ftune_status ft_adamw_view(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg, const float *base,
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
ftune_status ft_sched_kind_parse(const char *s, ft_sched_kind *out);
/* Learning rate for the update with 0-based index step (the first update is
 * step 0, so with warmup it uses lr 0, as a LambdaLR-driven HF Trainer). */
double ft_sched_lr(const ft_sched *s, int64_t step);

/* Optimizer state in a safetensors file: tensors "opt.m.<name>" and
 * "opt.v.<name>" (F32, each parameter's shape), metadata "opt.step",
 * "opt.kind" = "adamw" and the hyperparameters. extra_meta (NULL-terminated
 * key,value pairs or NULL) is added to the metadata. */
ftune_status ft_adamw_save(const ft_adamw *o, const char *path, const char *const *extra_meta);
/* Restores step, m and v into an optimizer initialised with the same
 * parameters. Every parameter must have both tensors with its shape and
 * dtype F32, and the file must hold no optimizer tensor for a parameter
 * the optimizer does not have. On failure the optimizer is unchanged. */
ftune_status ft_adamw_load(ft_adamw *o, const char *path);

#endif
