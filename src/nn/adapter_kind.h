/* adapter_kind.h — an adapter kind as an ops table: what the Linear, the
 * merge, the trainer and the PEFT files need from an adapter, so that a
 * new kind (DoRA, AdaLoRA) is one new file filling the same table. LoRA
 * (lora.c, ft_lora_kind) is the first kind. An instance is any struct that
 * starts with an ft_adapter_inst naming its kind. */
#ifndef FT_ADAPTER_KIND_H
#define FT_ADAPTER_KIND_H

#include "core/core.h"

typedef struct ft_adapter_kind ft_adapter_kind;

/* An adapter's hyper-parameters: the one struct the trainer's options,
 * the adapter objects (attach, PEFT and GGUF load) and the PEFT config
 * writer use. Kinds read the fields they have (LoRA: all). */
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
} ft_adapter_inst;

/* One trainable tensor of an instance: what the trainer, optimizer,
 * checkpoints and PEFT export enumerate. */
typedef struct {
    const char *peft_suffix;  /* PEFT tensor name after the module: "lora_A.weight" */
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
    /* The instance's trainable tensors for a Linear (IC -> OC), in PEFT's
     * order; n_params of them. */
    int n_params;
    void (*param)(ft_adapter_param *p, const ft_adapter_inst *a, int i, int IC, int OC);
};

extern const ft_adapter_kind ft_lora_kind;

#endif
