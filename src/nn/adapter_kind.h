/* adapter_kind.h — an adapter kind as an ops table: what the Linear, the
 * merge, the trainer and the PEFT and GGUF files need from an adapter
 * (maths, parameters with their shapes and file names), so that a new kind
 * (DoRA, AdaLoRA) is one new file filling the same table. LoRA (lora.c,
 * ft_lora_kind) is the first kind. An instance is any struct that starts
 * with an ft_adapter_inst naming its kind and its hyper-parameters. */
#ifndef FT_ADAPTER_KIND_H
#define FT_ADAPTER_KIND_H

#include "core/core.h"

typedef struct ft_adapter_kind ft_adapter_kind;

/* An adapter's hyper-parameters: the one struct the trainer's options,
 * the adapter objects (attach, PEFT and GGUF load), every instance (by
 * pointer: ft_adapter_inst.hp) and the PEFT config writer use. Kinds read
 * the fields they have (LoRA: all). */
typedef struct {
    int r;              /* rank R */
    float alpha;        /* LoRA scale alpha / r (alpha / sqrt(r) with rslora) */
    bool rslora;
    float dropout;      /* probability of dropping an adapter input element; 0 = off */
    unsigned targets;   /* module.h FT_MOD_BIT mask of the adapted Linears */
    uint64_t seed;      /* initialisation (and, in training, dropout masks) */
} ft_adapter_hparams;

/* The head of every adapter instance (the first member of ft_lora). */
typedef struct {
    const ft_adapter_kind *kind;
    const ft_adapter_hparams *hp; /* its owner's (an ft_adapter's cfg, a trainer's options), never a
                                   * copy: it must outlive the instance */
} ft_adapter_inst;

/* One of a kind's trainable tensors, the same for every instance: its
 * names in the two adapter file formats. A new tensor (DoRA's magnitude)
 * is one more row of the kind's table; the readers and writers loop over
 * the table. */
typedef struct {
    const char *peft;         /* PEFT key after the module: "lora_A.weight" */
    const char *gguf;         /* llama.cpp's after "blk.{i}.<tensor>.weight.": "lora_a" */
    bool out_rows;            /* its rows are the Linear's output rows, so q/k's are permuted
                               * between RoPE layouts (adapter.h) */
    int r_dim;                /* the dimension of its shape that is the rank r, or -1 (files that
                               * do not state r: GGUF; checks that a module's tensors agree) */
} ft_adapter_param_def;

/* The most parameters a kind may have per adapted Linear. */
#define FT_ADAPTER_MAX_PARAMS 4

/* One trainable tensor of an instance: what the trainer, optimizer,
 * checkpoints and PEFT export enumerate. */
typedef struct {
    const ft_adapter_param_def *def;
    int64_t shape[2];         /* row-major (rows, cols) */
    float *data;              /* the instance's values */
    float *grad;              /* its gradient, or NULL when frozen */
} ft_adapter_param;

struct ft_adapter_kind {
    const char *name;         /* "lora" (PEFT's peft_type, lower case) */
    /* Floats per row of the state forward_train saves for backward (LoRA: R). */
    int (*saved_floats)(const ft_adapter_inst *a);
    /* Every op takes the compute type of its products first (FT_F32, FT_BF16,
     * FT_F16: ft_gemm_in's contract, operands rounded to it, f32 sums); the
     * parameters themselves stay f32 masters. */
    /* out (T, OC) += the adapter's contribution for input x (T, IC), without
     * dropout; u (T, saved_floats) is written. On the kernels with n_threads
     * and scratch (FT_GEMM_SCRATCH_FLOATS floats). */
    void (*forward)(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T, int IC,
                    int OC, int n_threads, float *scratch);
    /* The same with every sum in double (operands rounded to compute as
     * they are read): the reference backend's oracle. */
    void (*forward_ref)(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T,
                        int IC, int OC);
    /* Training forward: as forward on dropout(x) with the mask of mask_seed;
     * xd (T, IC) is scratch for the dropped-out input. */
    void (*forward_train)(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T,
                          int IC, int OC, uint64_t mask_seed, float *xd, int n_threads, float *scratch);
    /* The same in double on one thread (it allocates its dropout buffer;
     * false when out of memory). */
    bool (*forward_train_ref)(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a,
                              int T, int IC, int OC, uint64_t mask_seed);
    /* Backward of forward_train with the same mask_seed and saved u: the
     * parameters' gradients accumulate; when dinp is non-NULL the adapter's
     * input gradient is ADDED to dinp. xd (T, IC) and g (T, saved_floats)
     * are scratch. */
    void (*backward)(ft_dtype compute, float *dinp, const float *dout, const float *x, const float *u,
                     const ft_adapter_inst *a, int T, int IC, int OC, uint64_t mask_seed, float *xd, float *g,
                     int n_threads, float *scratch);
    /* The same with the sums in double (it allocates its temporaries;
     * false when out of memory). */
    bool (*backward_ref)(ft_dtype compute, float *dinp, const float *dout, const float *x, const float *u,
                         const ft_adapter_inst *a, int T, int IC, int OC, uint64_t mask_seed);
    /* row (IC) += the adapter's part of weight row o, in f32 (merge). */
    void (*merge_row)(float *row, const ft_adapter_inst *a, int o, int IC);
    /* The trainable tensors of an instance on a Linear (IC -> OC): n_params
     * of them, defs[i] naming each, in PEFT's order. */
    int n_params;
    const ft_adapter_param_def *defs;
    /* Parameter i's shape for hyper-parameters hp, before any instance
     * exists (to size memory and check a file's tensors). */
    void (*param_shape)(int64_t shape[2], const ft_adapter_hparams *hp, int i, int IC, int OC);
    /* The instance's parameter i: shape, values and gradient. */
    void (*param)(ft_adapter_param *p, const ft_adapter_inst *a, int i, int IC, int OC);
    /* Points parameter i at data (and its gradient at grad, or NULL: frozen). */
    void (*bind)(ft_adapter_inst *a, int i, float *data, float *grad);
    /* Fresh values as PEFT initialises them, drawn from rng (LoRA: A
     * Kaiming-uniform, B zero). */
    void (*init)(ft_adapter_inst *a, int IC, int OC, ft_rng *rng);
};

extern const ft_adapter_kind ft_lora_kind;

#endif
