/* ops.h — the layers of a Llama-family transformer as plain C reference
 * functions, each a forward/backward pair.
 *
 * Argument order: outputs first, then saved statistics, then inputs and
 * weights, then sizes: rmsnorm_forward(out, rstd, inp, w, T, C).
 * Accumulation rule: parameter gradients accumulate (+=, so micro-batches
 * add up); activation gradients overwrite, except on the residual stream,
 * where they accumulate (+=).
 * All tensors are row-major; T rows of width C unless stated.
 */
#ifndef FT_OPS_H
#define FT_OPS_H

#include "core.h"

/* RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * w. rstd (T) may be NULL. */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps);
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int T, int C);

/* Rotary embedding tables: cos/sin (max_T, HS/2) for frequencies theta_i,
 * with optional Llama 3 frequency scaling. */
typedef struct {
    int type;                 /* 0 none, 1 linear, 2 llama3 */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
} ft_rope_scaling;
void rope_freqs(float *inv_freq /* (HS/2) */, int HS, float theta, const ft_rope_scaling *sc);

/* Rotates x (T, nh, HS) in place at positions pos[t]. interleaved: pairs
 * (2i, 2i+1) (Meta/GGUF layout); else pairs (i, i+HS/2) (HF rotate-half). */
void rope_forward(float *x, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved);
/* Backward of a rotation is the inverse rotation, in place on dx. */
void rope_backward(float *dx, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved);

/* SwiGLU: out = silu(gate) * up, all (T, F). */
void swiglu_forward(float *out, const float *gate, const float *up, int T, int F);
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T, int F);

/* Causal attention with grouped-query heads over a key/value cache.
 * q (T, NH*HS) for queries at positions q_pos[t]; k, v (Tk, NKV*HS) hold
 * keys/values for positions 0..Tk-1 (row stride kv_stride floats); query t
 * attends to keys 0..q_pos[t]. doc (Tk) optional: if non-NULL, query t only
 * sees keys with the same doc id (packed sequences). out (T, NH*HS).
 * att (NH, T, Tk) saves the probabilities when non-NULL (for backward);
 * scratch needs Tk floats per thread when att is NULL. */
void attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                       const int *q_pos, const int *doc, int T, int Tk, int NH, int NKV, int HS,
                       int kv_stride, int n_threads);
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                        const float *q, const float *k, const float *v, int T, int Tk, int NH, int NKV, int HS);

/* Softmax of one row in place; returns log-sum-exp. */
float softmax_inplace(float *x, int n);

/* Cross-entropy of logits (T, V) against targets (T; -1 = ignored); returns
 * the summed loss, and writes dlogits = (softmax - onehot) * dloss_scale
 * when dlogits is non-NULL. */
double crossentropy_forward_backward(float *dlogits, const float *logits, const int *targets,
                                     int T, int V, float dloss_scale);

/* out (T, OC) = inp (T, IC) · w^T (w is (OC, IC), f32), + bias (OC) if non-NULL.
 * Plain loops: the reference for the BLAS and quantized paths. */
void matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias, int T, int IC, int OC);
void matmul_backward_ref(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int T, int IC, int OC);

#endif
