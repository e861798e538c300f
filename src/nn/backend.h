/* backend.h — the ops the transformer block, the LM head + loss, the
 * embedding and the optimizer step need, behind one table (in the spirit of
 * ggml's backend interface, much smaller), plus the buffer calls. Callers
 * (block.c, lm_loss.c, session.c, train_model.c) hold one const ft_backend *
 * and call only through it, so another backend (CUDA) is one new file that
 * fills the same table and passes the same op tests (tests/test_backend.c).
 *
 * Two backends exist:
 *  - ft_backend_cpu: today's fast CPU functions (BLAS Linears, the fused
 *    attention and cross-entropy of ops_fast.c) on n_threads threads.
 *  - ft_backend_ref: the plain C references (ops.c, linear_forward_ref and
 *    plain loops for the training Linear), single-threaded: the oracle the
 *    op tests compare every backend against. Slow; for tests.
 *
 * Memory: every float * passed to an op is a backend pointer (from alloc,
 * or filled by upload). On both CPU backends backend pointers ARE host
 * pointers: upload/download are memcpy and sync returns at once, so host
 * arrays (the model's mapped weights, the caller's buffers) may be passed
 * directly. Integer index arrays (tokens, positions, doc ids) and ft_linear
 * / ft_adamw descriptors are host structures whose data pointers are backend
 * pointers. Argument order and the accumulation rule are ops.h's: outputs
 * first; parameter gradients accumulate, activation gradients overwrite,
 * except rmsnorm's dinp (the residual stream), which accumulates.
 *
 * Compute type: a property of the backend instance (be->compute). FT_F32
 * is the reference; with FT_BF16 or FT_F16 the Linear ops (forward, dX, dW
 * and the adapter's products) compute as ft_gemm_in does (kernels.h): every
 * operand element rounded to the compute type, exact products, f32 sums;
 * and the embedding's output rows are rounded to it (the table is a frozen
 * weight held in the compute type; rounding here gives the same numbers
 * whether the model converted it at load or not). Norms, RoPE, SwiGLU,
 * the softmax, the loss and the optimizer run in f32 (on the CPU backend
 * in a compute type, SwiGLU and RMSNorm take the vector paths of
 * ops_elem.c: f32 maths within a few ulps of the references; with FT_F32
 * they are the references bit for bit). The CPU backend's attention
 * products in FT_BF16 round their operands as the Linears do
 * (ft_attention_forward_fast_in, ops.h); the reference backend's attention
 * stays f32, so the two differ there by the bf16 roundings.
 * The element type of every argument stays f32; weights may be stored in
 * any dtype.
 */
#ifndef FT_BACKEND_H
#define FT_BACKEND_H

#include "nn/linear.h"
#include "core/mem.h"
#include "ops/ops.h"

typedef struct ft_backend ft_backend;
typedef struct ft_adamw ft_adamw; /* optim/optim.h: the optimizer op takes one, the table needs only its name */

struct ft_backend {
    const char *name;             /* "cpu", "ref" */
    void *ctx;                    /* the backend's own state (NULL for both CPU backends) */
    int n_threads;                /* threads a CPU backend uses; others may ignore it */
    ft_dtype compute;             /* FT_F32, FT_BF16 or FT_F16: see "Compute type" above */

    /* ------------------------------------------------ buffers */
    /* bytes of backend memory counted against lifetime class c (CPU:
     * ft_mem_alloc), 64-byte aligned; NULL on failure. */
    void *(*alloc)(const ft_backend *be, ft_mem_class c, size_t bytes);
    /* Frees p (may be NULL) from alloc(c, bytes), same c and bytes. */
    void (*free)(const ft_backend *be, ft_mem_class c, void *p, size_t bytes);
    /* host -> backend, backend -> host, backend -> backend (CPU: memcpy). */
    void (*upload)(const ft_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(const ft_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(const ft_backend *be, void *dst, const void *src, size_t bytes);
    /* bytes of backend memory at p set to 0 (CPU: memset). */
    void (*zero)(const ft_backend *be, void *p, size_t bytes);
    /* Returns when every op issued so far has finished (CPU: at once). */
    void (*sync)(const ft_backend *be);

    /* Floats of scratch (a backend buffer) the ops below need: the Linear
     * ops for a weight with `in` columns, an adapter of rank R (0: none) and
     * up to T rows (train false: linear_forward only; true: also the
     * training pair); attention for Tk keys (backward true: both
     * directions). CPU: linear_scratch_floats / linear_train_scratch_floats
     * and attention_fast_scratch_floats with be->n_threads; reference: 0. */
    size_t (*linear_scratch_floats)(const ft_backend *be, int in, int R, int T, bool train);
    size_t (*attention_scratch_floats)(const ft_backend *be, int Tk, int HS, bool backward);

    /* ------------------------------------------------ Linear (linear.h) */
    /* ad: the adapter of this call (any kind), or NULL */
    void (*linear_forward)(const ft_backend *be, float *out, const float *inp, const ft_linear *l,
                           const ft_adapter_inst *ad, int T, float *scratch);
    void (*linear_forward_train)(const ft_backend *be, float *out, float *u, const float *inp, const ft_linear *l,
                                 const ft_adapter_inst *ad, int T, uint64_t mask_seed, float *scratch);
    void (*linear_backward)(const ft_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *ad, int T,
                            uint64_t mask_seed, bool accumulate, float *scratch);

    /* ------------------------------------------------ layers (ops.h) */
    void (*rmsnorm_forward)(const ft_backend *be, float *out, float *rstd, const float *inp, const float *w, int T,
                            int C, float eps);
    void (*rmsnorm_backward)(const ft_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int T, int C);
    void (*rope_forward)(const ft_backend *be, float *x, const int *pos, const float *inv_freq, int T, int nh,
                         int HS, bool interleaved);
    void (*rope_backward)(const ft_backend *be, float *dx, const int *pos, const float *inv_freq, int T, int nh,
                          int HS, bool interleaved);
    /* As attention_forward_fast / ft_attention_backward_fast (B batch rows,
     * lse (B, NH, T) instead of probabilities). */
    void (*attention_forward)(const ft_backend *be, float *out, float *lse, const float *q, const float *k,
                              const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                              int NKV, int HS, int kv_stride, float *scratch);
    void (*attention_backward)(const ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *lse, const float *q, const float *k, const float *v, const int *q_pos,
                               const int *doc, int B, int T, int Tk, int NH, int NKV, int HS, float *scratch);
    void (*swiglu_forward)(const ft_backend *be, float *out, const float *gate, const float *up, int T, int F);
    void (*swiglu_backward)(const ft_backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, int T, int F);
    /* out (T, wte->shape[1]) = rows tokens[t] of wte (V, C) in any weight
     * dtype, converted to f32. Tokens must already be checked to be < V. */
    void (*embedding_forward)(const ft_backend *be, float *out, const int32_t *tokens, const ft_tensor *wte, int T);
    /* dwte (V, C) += dout rows; FTUNE_ERR_RANGE (nothing changed) if a token is outside [0, V). */
    FTUNE_MUST_USE ftune_status (*embedding_backward)(const ft_backend *be, float *dwte, const float *dout, const int32_t *tokens,
                                       int T, int C, int V);
    /* dst (n elements of be->compute, RNE) = src (n floats), and back:
     * activations saved for backward in the compute type (train_model.c). */
    void (*to_compute)(const ft_backend *be, void *dst, const float *src, size_t n);
    void (*from_compute)(const ft_backend *be, float *dst, const void *src, size_t n);
    /* y (n) += x (n): the residual stream. */
    void (*add)(const ft_backend *be, float *y, const float *x, size_t n);
    /* crossentropy_forward_backward: summed loss, dlogits overwritten when non-NULL. */
    double (*crossentropy)(const ft_backend *be, float *dlogits, const float *logits, const int *targets, int T,
                           int V, float dloss_scale);

    /* ------------------------------------------------ optimizer (optim/optim.h) */
    /* One ft_adamw_step of every parameter of o (data, grad, m, v are backend pointers). */
    void (*adamw_step)(const ft_backend *be, ft_adamw *o, double lr);
};

/* The CPU backend on n_threads threads (as given: call ft_num_threads first),
 * computing in f32 / in compute (FT_F32, FT_BF16, FT_F16). */
ft_backend ft_backend_cpu(int n_threads);
ft_backend ft_backend_cpu_in(ft_dtype compute, int n_threads);
/* The reference backend (single-threaded plain C), in f32 / in compute: its
 * Linears round their operands to the compute type and then run the plain
 * f32 references (products of two bf16 or two f16 values are exact in f32). */
ft_backend ft_backend_ref(void);
ft_backend ft_backend_ref_in(ft_dtype compute);

#endif
