/* linear.h — a Linear layer whose base weight may be in any dtype (f32,
 * bf16, f16, q8_0, q4_0), the one place where adapters meet the model.
 * Forward for inference and for training (saving what backward needs), and
 * backward to the input, to the base weight (full fine-tuning; an f32
 * gradient whatever W's dtype) and to a LoRA adapter. Every product runs on
 * the kernels of kernels.h, for any dtype of W. The LoRA pieces themselves
 * live in lora.c. */
#ifndef FT_LINEAR_H
#define FT_LINEAR_H

#include "core/core.h"
#include "nn/adapter_kind.h"

/* A LoRA adapter on a Linear (in -> out): y += scale · B·A·dropout(x).
 * PEFT's layout and initialisation: A Kaiming-uniform, B zero. A, B, dA,
 * dB point into memory the owner (a trainer, an adapter loader) manages;
 * r, alpha, rslora and dropout are the owner's hyper-parameters, read
 * through base.hp (ft_lora_init / ft_lora_bind set it). */
typedef struct {
    ft_adapter_inst base; /* kind = &ft_lora_kind; hp: R = hp->r, alpha, rslora, dropout */
    float *A;           /* (R, in) */
    float *B;           /* (out, R) */
    float *dA, *dB;     /* gradients, same shapes; NULL when frozen */
} ft_lora;

typedef struct {
    ft_tensor w;        /* (out, in) in any weight dtype */
    float *bias;        /* (out) or NULL */
    int in, out;
} ft_linear;

/* The compute type of a Linear's products (ft_gemm_in, kernels.h): FT_F32,
 * or FT_BF16 / FT_F16, where every operand element (W, the input, dout,
 * the adapter's matrices and intermediates) is rounded to it (RNE) and the
 * products are summed in f32; the outputs and gradients are f32. The _in
 * functions take it first; the others are the f32 ones. */

/* x as the compute type sees it: RNE-rounded to bf16/f16 (f16 overflows to
 * inf), exactly representable in f32; x itself for FT_F32. */
static inline float ft_round_in(ft_dtype compute, float x) {
    return compute == FT_BF16 ? ft_bf16_to_f32(ft_f32_to_bf16(x))
           : compute == FT_F16 ? ft_f16_to_f32(ft_f32_to_f16(x))
                               : x;
}
/* dst[i] = ft_round_in(compute, src[i]) for i < n; dst may be src. */
void ft_round_array_in(ft_dtype compute, float *dst, const float *src, size_t n);
/* Whether a compute type is one the Linears take (f32, bf16, f16). */
static inline bool ft_compute_ok(ft_dtype compute) {
    return compute == FT_F32 || compute == FT_BF16 || compute == FT_F16;
}

/* Every Linear op takes the adapter of this call (`ad`, any kind, or NULL:
 * none) as an argument: the Linear never holds one, so a model's Linears
 * stay read-only after load and each caller runs its own adapter set. */

/* ------------------------------------------------------------ inference */

/* Floats of scratch that linear_forward needs for a weight with `in`
 * columns (the kernels' packing area, and room for the adapter's u). */
size_t ft_linear_scratch_floats(int in, int n_threads);
/* out (T, out) = inp (T, in) · W^T + bias (+ the adapter ad, without
 * dropout, when non-NULL), on n_threads threads. */
void ft_linear_forward(float *out, const float *inp, const ft_linear *l, const ft_adapter_inst *ad, int T,
                       int n_threads, float *scratch);
void ft_linear_forward_in(ft_dtype compute, float *out, const float *inp, const ft_linear *l,
                          const ft_adapter_inst *ad, int T, int n_threads, float *scratch);
/* Reference: dequantize W to f32 and use ft_matmul_forward_ref (plus the
 * adapter in plain loops). For tests. */
void ft_linear_forward_ref(float *out, const float *inp, const ft_linear *l, const ft_adapter_inst *ad, int T);
/* The same in a compute type: W and inp rounded to it first (products of
 * two bf16 or two f16 values are exact in f32, so the f32 reference then
 * computes exactly ft_gemm_in's products), the adapter by its forward_ref. */
void ft_linear_forward_ref_in(ft_dtype compute, float *out, const float *inp, const ft_linear *l,
                              const ft_adapter_inst *ad, int T);

/* ------------------------------------------------------------- training */

/* Floats of scratch that linear_forward_train / linear_backward need for up
 * to T rows, `in` columns and an adapter of rank R (0 if none). */
size_t ft_linear_train_scratch_floats(int in, int R, int T, int n_threads);
/* Training forward: as linear_forward, but the adapter sees dropout(x) with
 * the mask drawn from mask_seed, and u = dropout(x)·A^T (T, R) is saved for
 * backward (u may be NULL when ad is NULL). */
void ft_linear_forward_train(float *out, float *u, const float *inp, const ft_linear *l, const ft_adapter_inst *ad,
                             int T, uint64_t mask_seed, int n_threads, float *scratch);
void ft_linear_forward_train_in(ft_dtype compute, float *out, float *u, const float *inp, const ft_linear *l,
                                const ft_adapter_inst *ad, int T, uint64_t mask_seed, int n_threads, float *scratch);
/* Backward of linear_forward_train, with the same mask_seed and the saved u.
 * dinp (T, in) = dout · W (+ the adapter's path through the same dropout
 * mask); it is overwritten, or added to when accumulate; it may be NULL.
 * dw (out, in) and dbias (out) accumulate when non-NULL, for W of any dtype.
 * The adapter's dA, dB accumulate when non-NULL. */
void ft_linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *u,
                        const ft_linear *l, const ft_adapter_inst *ad, int T, uint64_t mask_seed, bool accumulate,
                        int n_threads, float *scratch);
/* In a compute type: dinp = dout·W and dw += doutᵀ·inp with the operands
 * rounded (dbias sums dout unrounded, in f32). */
void ft_linear_backward_in(ft_dtype compute, float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *ad, int T,
                           uint64_t mask_seed, bool accumulate, int n_threads, float *scratch);

/* ------------------------------------------------------------ LoRA (lora.c) */

/* alpha / r, or alpha / sqrt(r) with rsLoRA. */
float ft_lora_scale(float alpha, int r, bool rslora);
/* The scale of adapter a, from its hyper-parameters. */
static inline float ft_lora_scale_of(const ft_lora *a) {
    return ft_lora_scale(a->base.hp->alpha, a->base.hp->r, a->base.hp->rslora);
}
/* A (R, in) ~ U(-1/sqrt(in), 1/sqrt(in)) drawn row-major from rng: PEFT's
 * kaiming_uniform_(a = sqrt(5)). */
void ft_lora_init_A(float *A, int r, int in, ft_rng *rng);
/* Makes a a LoRA instance with hyper-parameters hp (which must outlive it),
 * for a struct whose matrices are filled by hand. */
void ft_lora_bind(ft_lora *a, const ft_adapter_hparams *hp);
/* row (in) += scale · B[o, :] · A: the adapter's part of weight row o, in
 * f32 (merge: W' = W + scale·B·A one row at a time). */
void ft_lora_merge_row(float *row, const ft_lora *a, int o, int in);
/* ft_lora_bind, then points a at caller-owned A (R, in), B (out, R) and
 * grads (either may be NULL: frozen) and initialises as PEFT: A ~
 * U(-1/sqrt(in), 1/sqrt(in)) (Kaiming-uniform with a = sqrt(5)) drawn
 * row-major from rng, B = 0, grads 0. */
void ft_lora_init(ft_lora *a, const ft_adapter_hparams *hp, float *A, float *B, float *dA, float *dB, int in, int out,
                  ft_rng *rng);
/* xd (T, in) = inp with each element dropped with probability p (zero) or
 * kept and scaled by 1/(1-p); the mask of row t depends only on (mask_seed,
 * t), so backward regenerates it instead of storing it. xd may be inp.
 * Row t is seeded with mask_seed + (t + 1) · FT_DROPOUT_ROW_STEP, so rows
 * [r0, r0 + T) of a larger batch get that batch's masks from
 * mask_seed + r0 · FT_DROPOUT_ROW_STEP (a data-parallel rank's share). */
#define FT_DROPOUT_ROW_STEP 0xD1B54A32D192ED03ull
void ft_lora_dropout(float *xd, const float *inp, float p, uint64_t mask_seed, int T, int in, int n_threads);
/* out (T, OC) += scale · u · B^T with u (T, R) = x · A^T, where x is the
 * (already dropped-out) input. u is written. On the kernels of kernels.h
 * with n_threads and scratch (FT_GEMM_SCRATCH_FLOATS floats). */
void ft_lora_forward_fast(ft_dtype compute, float *out, float *u, const float *x, const ft_lora *a, int T, int IC,
                          int OC, int n_threads, float *scratch);
/* The same in plain loops on one thread, without scratch: the reference. */
void ft_lora_forward(float *out, float *u, const float *x, const ft_lora *a, int T, int IC, int OC);
/* Backward of lora_forward for the same x (already dropped out) and saved
 * u: dA += scale · (dout·B)^T · x, dB += scale · dout^T · u (each skipped
 * when NULL); dx (T, in) = scale · (dout·B) · A is written when non-NULL,
 * or added to it when dx_add (the caller applies any dropout mask); it is
 * written last, so dx may be the same buffer as x. g (T, R) is scratch;
 * the kernels' packing area is `scratch` (FT_GEMM_SCRATCH_FLOATS floats),
 * on n_threads threads. */
void ft_lora_backward_fast(ft_dtype compute, float *dx, bool dx_add, const float *dout, const float *x, const float *u,
                           const ft_lora *a, int T, int IC, int OC, float *g, int n_threads, float *scratch);
/* The same in plain loops on one thread, without scratch: the reference. */
void ft_lora_backward(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T, int IC,
                   int OC, float *g);

/* lora_forward and lora_backward with every sum in double (u rounded to
 * float as it is stored, every operand rounded to compute as it is read):
 * the oracle of the reference backend and linear_forward_ref. lora_backward_f64 writes g (T, R) and, when dx is
 * non-NULL, dx (T, in); dA, dB accumulate when non-NULL. */
void ft_lora_forward_f64(ft_dtype compute, float *out, float *u, const float *x, const ft_lora *a, int T, int IC,
                         int OC);
void ft_lora_backward_f64(ft_dtype compute, float *dx, const float *dout, const float *x, const float *u,
                          const ft_lora *a, int T, int IC, int OC, float *g);

#endif
