/* linear.h — a Linear layer whose frozen base weight may be in any dtype
 * (f32, bf16, f16, q8_0, q4_0), the one place where adapters will meet the
 * model. Fast paths: BLAS sgemm for f32, dequantize-in-tiles + sgemm for
 * other dtypes with several rows, fused dequant-dot for one row (decode). */
#ifndef FT_LINEAR_H
#define FT_LINEAR_H

#include "core.h"

/* A LoRA adapter on a Linear: y += scale · B·A·dropout(x).
 * PEFT's layout and initialisation: A Kaiming-uniform, B zero. */
typedef struct {
    int r;
    float alpha;
    float scale;        /* alpha / r, or alpha / sqrt(r) with rsLoRA */
    bool rslora;
    float dropout;      /* probability; 0 = off */
    float *A;           /* (r, in) */
    float *B;           /* (out, r) */
    float *dA, *dB;     /* gradients, same shapes; NULL when frozen */
} ft_lora;

typedef struct {
    ft_tensor w;        /* (out, in) in any weight dtype */
    float *bias;        /* (out) or NULL */
    int in, out;
    ft_lora *lora;      /* NULL when the layer carries no adapter */
} ft_linear;

/* Floats of scratch that linear_forward needs for a weight with `in`
 * columns (a tile of dequantized rows, and one row per thread). */
size_t linear_scratch_floats(int in, int n_threads);
/* out (T, out) = inp (T, in) · W^T + bias, with BLAS and n_threads. */
void linear_forward(float *out, const float *inp, const ft_linear *l, int T, int n_threads, float *scratch);
/* Reference: dequantize W to f32 and use matmul_forward_ref. For tests. */
void linear_forward_ref(float *out, const float *inp, const ft_linear *l, int T);

#endif
