/* ops.h — the layers of a Llama-family transformer as plain C reference
 * functions, each a forward/backward pair.
 *
 * Argument order: outputs first, then saved statistics, then inputs and
 * weights, then sizes: ft_rmsnorm_forward(out, rstd, inp, w, T, C).
 * Accumulation rule: parameter gradients accumulate (+=, so micro-batches
 * add up); activation gradients overwrite, except on the residual stream,
 * where they accumulate (+=). Concretely, below:
 *   +=         dw, dbias, dwte (parameters); rmsnorm dinp (its input is the
 *              residual stream)
 *   overwrite  matmul dinp, swiglu dgate/dup, attention dq/dk/dv, dlogits
 *   in place   ft_rope_backward (the gradient is rotated back where it lies)
 * All tensors are row-major; T rows of width C unless stated.
 *
 * Every function has a float64 twin named <name>_f64 (declared at the end)
 * compiled from the same source; the tests check those against finite
 * differences and the float versions against them.
 */
#ifndef FT_OPS_H
#define FT_OPS_H

#include "core/core.h"

/* RMSNorm: out = w * (inp * rstd), rstd = 1/sqrt(mean(inp^2) + eps), as
 * Hugging Face's LlamaRMSNorm in float32. rstd (T) may be NULL in forward;
 * backward needs it. dinp accumulates (+=), dw accumulates, dw may be NULL. */
void ft_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps);
void ft_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int T, int C);

/* Rotary embedding frequencies inv_freq[i] = theta^(-2i/HS), i < HS/2, with
 * optional scaling: linear divides every frequency by factor (positions /
 * factor); llama3 keeps high frequencies (wavelength < original_max_pos /
 * high_freq_factor), divides low ones (wavelength > original_max_pos /
 * low_freq_factor) by factor and blends those between, as Hugging Face's
 * _compute_llama3_parameters. Computed in double, rounded once. */
typedef struct {
    int type;                 /* 0 none, 1 linear, 2 llama3 */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
} ft_rope_scaling;
void ft_rope_freqs(float *inv_freq /* (HS/2) */, int HS, float theta, const ft_rope_scaling *sc);

/* Rotates x (T, nh, HS) in place at positions pos[t]: pair i turns by
 * pos[t] * inv_freq[i]. interleaved: pairs (2i, 2i+1) (Meta/GGUF layout);
 * else pairs (i, i+HS/2) (HF rotate-half). The angle pos * inv_freq[i] and
 * its cos/sin are computed in double (Hugging Face uses float32 there, which
 * loses ~pos * 6e-8 rad), then the pair is rotated in float. */
void ft_rope_forward(float *x, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved);
/* Backward of a rotation is the inverse rotation, in place on dx. */
void ft_rope_backward(float *dx, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved);

/* SwiGLU: out = silu(gate) * up, all (T, F), silu(x) = x / (1 + exp(-x)).
 * dgate and dup are overwritten. */
void ft_swiglu_forward(float *out, const float *gate, const float *up, int T, int F);
void ft_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T, int F);

/* The four references above on n_threads threads (ft_parallel_for), bit for
 * bit the same results (rows or spans split, each element computed by the
 * reference's expression in its order; dw's column sums over rows in order):
 * the f32 backends use them. */
void ft_rmsnorm_forward_mt(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps,
                           int n_threads);
void ft_rmsnorm_backward_mt(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const float *rstd, int T, int C, int n_threads);
void ft_swiglu_forward_mt(float *out, const float *gate, const float *up, int T, int F, int n_threads);
void ft_swiglu_backward_mt(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T,
                           int F, int n_threads);

/* Token embedding: out (T, C) = rows tokens[t] of wte (V, C). Backward adds
 * dout rows into dwte (+=). FTUNE_ERR_RANGE if a token is not in [0, V)
 * (backward then changes nothing). */
FTUNE_MUST_USE ftune_status ft_embedding_forward(float *out, const int *tokens, const float *wte, int T, int C, int V);
FTUNE_MUST_USE ftune_status ft_embedding_backward(float *dwte, const float *dout, const int *tokens, int T, int C, int V);

/* Causal attention with grouped-query heads over a key/value cache.
 * q (T, NH*HS) for queries at positions q_pos[t]; k, v (Tk, NKV*HS) hold
 * keys/values for positions 0..Tk-1 (row stride kv_stride floats); query t
 * attends to keys 0..q_pos[t] (q_pos[t] < Tk; larger is clamped to Tk-1).
 * Query head h uses kv head h / (NH/NKV); NH must be a multiple of NKV.
 * Scores are scaled by 1/sqrt(HS). doc (Tk) optional: if non-NULL, query t
 * only sees keys j with doc[j] == doc[q_pos[t]] (packed sequences).
 * out (T, NH*HS). att (NH, T, Tk) saves the probabilities when non-NULL
 * (for backward; masked keys get exactly 0). When att is NULL each row is
 * computed in one pass with an online softmax, so no scratch is needed.
 * n_threads > 1 spreads the (head, query) rows over OpenMP threads. */
void ft_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                       const int *q_pos, const int *doc, int T, int Tk, int NH, int NKV, int HS,
                       int kv_stride, int n_threads);
/* Backward from the saved att. k, v, dk, dv are (Tk, NKV*HS) with rows
 * packed (stride NKV*HS). dq, dk, dv are overwritten; dk/dv sum over the
 * query heads sharing a kv head and over the queries that saw the key. */
void ft_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                        const float *q, const float *k, const float *v, int T, int Tk, int NH, int NKV, int HS);

/* Softmax of one row in place; returns log-sum-exp. */
float ft_softmax_inplace(float *x, int n);

/* Cross-entropy of logits (T, V) against targets (T); a negative target
 * (-1, or PyTorch's -100) is ignored; a target >= V makes the loss NaN.
 * Returns the summed loss over non-ignored rows, and writes (overwrites)
 * dlogits = (softmax - onehot) * dloss_scale when dlogits is non-NULL (zero
 * rows for ignored targets). Sums are in double. */
double ft_crossentropy_forward_backward(float *dlogits, const float *logits, const int *targets,
                                     int T, int V, float dloss_scale);

/* out (T, OC) = inp (T, IC) · w^T (w is (OC, IC), f32), + bias (OC) if non-NULL.
 * Plain loops (dot products summed in double): the reference for the BLAS
 * and quantized paths. Backward: dinp (T, IC) is overwritten, dw and dbias
 * accumulate; any of the three may be NULL. */
void ft_matmul_forward_ref(float *out, const float *inp, const float *w, const float *bias, int T, int IC, int OC);
void ft_matmul_backward_ref(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int T, int IC, int OC);

/* ------------------------------------------------ fast paths (ops_fast.c)
 * The same maths as the references above in float32, vectorised (AVX-512,
 * AVX2 or portable, picked by ft_cpu_level()) and spread over n_threads;
 * results differ from the references only in the order of float sums and
 * do not depend on the thread schedule. */

/* y = exp(x) elementwise for x <= 88.7 (inf above), within ~2 ulp; exactly
 * 0 below -103.9; NaN stays NaN. y may be x. */
void ft_exp_fast(float *y, const float *x, size_t n);

/* Floats of scratch ft_attention_forward_fast (backward false) or
 * ft_attention_backward_fast (true; also enough for the forward) need for
 * Tk keys on n_threads threads. The forward is tiled over keys: beyond
 * the kv head's packed keys, values and document ids, its scratch does
 * not grow with Tk. */
size_t ft_attention_fast_scratch_floats(int Tk, int HS, int n_threads, bool backward);

/* attention_forward over B independent batch rows: row b's queries are
 * q + b·T·NH·HS, its keys/values k, v + b·Tk·kv_stride, its doc ids
 * doc + b·Tk, its output out + b·T·NH·HS; q_pos (T) is shared by the rows.
 * lse (B, NH, T), when non-NULL, gets each query's log-sum-exp of scaled
 * scores (what backward needs instead of the probabilities). Work is split
 * over (batch row, kv head), each on one thread. */
void ft_attention_forward_fast(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                            int kv_stride, int n_threads, float *scratch);
/* attention_backward over B batch rows, recomputing each probability as
 * exp(score - lse) from the forward's lse. k, v, dk, dv rows are packed
 * (stride NKV·HS); dq, dk, dv are overwritten. */
void ft_attention_backward_fast(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                             const float *k, const float *v, const int *q_pos, const int *doc, int B, int T, int Tk,
                             int NH, int NKV, int HS, int n_threads, float *scratch);

/* The same two in a compute type: FT_F32 is exactly the two above; FT_BF16
 * rounds every operand of the attention's products to bf16 (RNE: q, k, v
 * and dout; the probabilities before P·V and dV; the score gradients before
 * dQ and dK), multiplies exactly and sums in f32, as PyTorch's bf16 SDPA
 * does (on VDPBF16PS at the avx512bf16 level, which treats subnormal bf16
 * as zero; the plain f32 kernels on the rounded values below it). The
 * softmax, the lse and the backward's Σ p·dp stay f32. Other types: f32. */
void ft_attention_forward_fast_in(ft_dtype compute, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                                  int NKV, int HS, int kv_stride, int n_threads, float *scratch);
void ft_attention_backward_fast_in(ft_dtype compute, float *dq, float *dk, float *dv, const float *dout,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                                   int n_threads, float *scratch);

/* crossentropy_forward_backward on n_threads threads: exp once per logit
 * (float), the log-sum-exp in double per row, rows summed in order. */
double ft_crossentropy_fast(float *dlogits, const float *logits, const int *targets, int T, int V, float dloss_scale,
                         int n_threads);

/* ------------------------------------------------ elementwise and row ops (ops_elem.c)
 * Vectorised and spread over n_threads in fixed chunks (results do not
 * depend on the thread count). */

/* RoPE as ft_rope_forward / ft_rope_backward, bit for bit (the same float
 * operations in the same order, no contraction), a row's cos/sin computed
 * once for all its heads. */
void ft_rope_forward_fast(float *x, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved,
                          int n_threads);
void ft_rope_backward_fast(float *dx, const int *pos, const float *inv_freq, int T, int nh, int HS,
                           bool interleaved, int n_threads);
/* n floats to bf16 (RNE, NaN kept quiet: ft_f32_to_bf16 bit for bit), bf16
 * to f32, and f32 rounded to bf16 kept as f32 (dst may be src). */
void ft_bf16_from_f32_fast(uint16_t *dst, const float *src, size_t n, int n_threads);
void ft_bf16_to_f32_fast(float *dst, const uint16_t *src, size_t n, int n_threads);
void ft_bf16_round_fast(float *dst, const float *src, size_t n, int n_threads);
/* RMSNorm as ft_rmsnorm_forward / _backward (dinp and dw accumulate) with
 * float sums in 16 lanes and fused multiply-adds: within a few ulps of the
 * references (the mixed-precision backends use it); rows spread over the
 * threads, then dw's columns (each summed over the rows in order). */
void ft_rmsnorm_forward_fast(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps,
                             int n_threads);
void ft_rmsnorm_backward_fast(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                              const float *rstd, int T, int C, int n_threads);
/* SwiGLU as ft_swiglu_forward / _backward with the vector exp of
 * ft_exp_fast and fused multiply-adds: within a few ulps of the
 * references, not bit-identical (the mixed-precision backends use it). */
void ft_swiglu_forward_fast(float *out, const float *gate, const float *up, int T, int F, int n_threads);
void ft_swiglu_backward_fast(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T,
                             int F, int n_threads);

/* Cross-entropy a vocabulary slice at a time (the fused LM loss, lm_loss.c,
 * for V above its slice width): x (n, W) holds the logits of classes
 * [v0, v0+W) of n rows whose targets (n) are in [0, V) (other rows are
 * skipped; their x is zeroed unless STATS). Per row, m (running max),
 * s (running sum of exp(logit - m), double) and xy (the target's logit,
 * set by the slice holding it) carry the online log-sum-exp over slices;
 * first starts them. Modes:
 *   STATS: update m, s, xy; x is left as it is.
 *   EXP:   the same, and x = exp(x - m_new) with the target's entry 0;
 *          alpha (n) = exp(m_old - m_new), by which the caller rescales
 *          what it accumulated from earlier slices' e (1 when first).
 *   GRAD:  x = (exp(x - lse) - onehot) · dloss_scale, lse (n) given.
 * Rows are independent, each on one thread: no dependence on n_threads. */
typedef enum { FT_CE_SLICE_STATS, FT_CE_SLICE_EXP, FT_CE_SLICE_GRAD } ft_ce_slice_mode;
void ft_ce_slice_fast(ft_ce_slice_mode mode, float *x, float *m, double *s, float *xy, float *alpha, const float *lse,
                      const int *targets, int n, int W, int v0, int V, bool first, float dloss_scale, int n_threads);

/* ------------------------------------------------ float64 twins (tests) */

void ft_rmsnorm_forward_f64(double *out, double *rstd, const double *inp, const double *w, int T, int C, double eps);
void ft_rmsnorm_backward_f64(double *dinp, double *dw, const double *dout, const double *inp, const double *w,
                          const double *rstd, int T, int C);
void ft_rope_freqs_f64(double *inv_freq, int HS, double theta, const ft_rope_scaling *sc);
void ft_rope_forward_f64(double *x, const int *pos, const double *inv_freq, int T, int nh, int HS, bool interleaved);
void ft_rope_backward_f64(double *dx, const int *pos, const double *inv_freq, int T, int nh, int HS, bool interleaved);
void ft_swiglu_forward_f64(double *out, const double *gate, const double *up, int T, int F);
void ft_swiglu_backward_f64(double *dgate, double *dup, const double *dout, const double *gate, const double *up,
                         int T, int F);
FTUNE_MUST_USE ftune_status ft_embedding_forward_f64(double *out, const int *tokens, const double *wte, int T, int C, int V);
FTUNE_MUST_USE ftune_status ft_embedding_backward_f64(double *dwte, const double *dout, const int *tokens, int T, int C, int V);
void ft_attention_forward_f64(double *out, double *att, const double *q, const double *k, const double *v,
                           const int *q_pos, const int *doc, int T, int Tk, int NH, int NKV, int HS,
                           int kv_stride, int n_threads);
void ft_attention_backward_f64(double *dq, double *dk, double *dv, const double *dout, const double *att,
                            const double *q, const double *k, const double *v, int T, int Tk, int NH, int NKV,
                            int HS);
double ft_softmax_inplace_f64(double *x, int n);
double ft_crossentropy_forward_backward_f64(double *dlogits, const double *logits, const int *targets,
                                         int T, int V, double dloss_scale);
void ft_matmul_forward_ref_f64(double *out, const double *inp, const double *w, const double *bias,
                            int T, int IC, int OC);
void ft_matmul_backward_ref_f64(double *dinp, double *dw, double *dbias, const double *dout, const double *inp,
                             const double *w, int T, int IC, int OC);

#endif
