/* backend_cpu.c — the CPU backend: each table entry calls the function the
 * block, LM head, embedding and optimizer called before the table existed
 * (BLAS Linears, ops_fast.c's attention and cross-entropy, the ops.c layers
 * that have no faster twin), on be->n_threads threads. Backend pointers are
 * host pointers, so upload/download/copy are memcpy and sync does nothing. */
#include "nn/backend.h"
#include "optim/optim.h"

#include <string.h>

static void *cpu_alloc(const ft_backend *be, ft_mem_class c, size_t bytes) {
    (void)be;
    return ft_mem_alloc(c, bytes);
}
static void cpu_free(const ft_backend *be, ft_mem_class c, void *p, size_t bytes) {
    (void)be;
    ft_mem_free(c, p, bytes);
}
static void cpu_memcpy(const ft_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}
static void cpu_zero(const ft_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}
static void cpu_sync(const ft_backend *be) { (void)be; }

static size_t cpu_linear_scratch(const ft_backend *be, int in, int R, int T, bool train) {
    return train ? ft_linear_train_scratch_floats(in, R, T, be->n_threads) : ft_linear_scratch_floats(in, be->n_threads);
}
static size_t cpu_attention_scratch(const ft_backend *be, int Tk, int HS, bool backward) {
    return ft_attention_fast_scratch_floats(Tk, HS, be->n_threads, backward);
}

static void cpu_linear_forward(const ft_backend *be, float *out, const float *inp, const ft_linear *l,
                               const ft_adapter_inst *ad, int T, float *scratch) {
    ft_linear_forward_in(be->compute, out, inp, l, ad, T, be->n_threads, scratch);
}
static void cpu_linear_forward_train(const ft_backend *be, float *out, float *u, const float *inp,
                                     const ft_linear *l, const ft_adapter_inst *ad, int T, uint64_t mask_seed,
                                     float *scratch) {
    ft_linear_forward_train_in(be->compute, out, u, inp, l, ad, T, mask_seed, be->n_threads, scratch);
}
static void cpu_linear_backward(const ft_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *ad,
                                int T, uint64_t mask_seed, bool accumulate, float *scratch) {
    ft_linear_backward_in(be->compute, dinp, dw, dbias, dout, inp, u, l, ad, T, mask_seed, accumulate, be->n_threads,
                          scratch);
}

static void cpu_rmsnorm_forward(const ft_backend *be, float *out, float *rstd, const float *inp, const float *w,
                                int T, int C, float eps) {
    /* f32: the reference (threaded), bit for bit; a compute type: float sums, FMA */
    if (be->compute == FT_F32) ft_rmsnorm_forward_mt(out, rstd, inp, w, T, C, eps, be->n_threads);
    else ft_rmsnorm_forward_fast(out, rstd, inp, w, T, C, eps, be->n_threads);
}
static void cpu_rmsnorm_backward(const ft_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                 const float *w, const float *rstd, int T, int C) {
    if (be->compute == FT_F32) ft_rmsnorm_backward_mt(dinp, dw, dout, inp, w, rstd, T, C, be->n_threads);
    else ft_rmsnorm_backward_fast(dinp, dw, dout, inp, w, rstd, T, C, be->n_threads);
}
static void cpu_rope_forward(const ft_backend *be, float *x, const int *pos, const float *inv_freq, int T, int nh,
                             int HS, bool interleaved) {
    ft_rope_forward_fast(x, pos, inv_freq, T, nh, HS, interleaved, be->n_threads);
}
static void cpu_rope_backward(const ft_backend *be, float *dx, const int *pos, const float *inv_freq, int T, int nh,
                              int HS, bool interleaved) {
    ft_rope_backward_fast(dx, pos, inv_freq, T, nh, HS, interleaved, be->n_threads);
}
static void cpu_attention_forward(const ft_backend *be, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                                  int NKV, int HS, int kv_stride, float *scratch) {
    ft_attention_forward_fast_in(be->compute, out, lse, q, k, v, q_pos, doc, B, T, Tk, NH, NKV, HS, kv_stride,
                                 be->n_threads, scratch);
}
static void cpu_attention_backward(const ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                                   float *scratch) {
    ft_attention_backward_fast_in(be->compute, dq, dk, dv, dout, lse, q, k, v, q_pos, doc, B, T, Tk, NH, NKV, HS,
                                  be->n_threads, scratch);
}
static void cpu_swiglu_forward(const ft_backend *be, float *out, const float *gate, const float *up, int T, int F) {
    /* f32: the reference (threaded), bit for bit; a compute type: the vector exp */
    if (be->compute == FT_F32) ft_swiglu_forward_mt(out, gate, up, T, F, be->n_threads);
    else ft_swiglu_forward_fast(out, gate, up, T, F, be->n_threads);
}
static void cpu_swiglu_backward(const ft_backend *be, float *dgate, float *dup, const float *dout,
                                const float *gate, const float *up, int T, int F) {
    if (be->compute == FT_F32) ft_swiglu_backward_mt(dgate, dup, dout, gate, up, T, F, be->n_threads);
    else ft_swiglu_backward_fast(dgate, dup, dout, gate, up, T, F, be->n_threads);
}
static void cpu_embedding_forward(const ft_backend *be, float *out, const int32_t *tokens, const ft_tensor *wte,
                                  int T) {
    size_t C = (size_t)wte->shape[1];
    for (int t = 0; t < T; t++) ft_tensor_row_f32(wte, tokens[t], out + (size_t)t * C);
    if (be->compute == FT_BF16 && wte->dtype != be->compute) ft_bf16_round_fast(out, out, (size_t)T * C, be->n_threads);
    else if (be->compute != FT_F32 && wte->dtype != be->compute) ft_round_array_in(be->compute, out, out, (size_t)T * C);
}
static FTUNE_MUST_USE ftune_status cpu_embedding_backward(const ft_backend *be, float *dwte, const float *dout,
                                           const int32_t *tokens, int T, int C, int V) {
    (void)be;
    return ft_embedding_backward(dwte, dout, (const int *)tokens, T, C, V);
}
/* bf16: vectorised and threaded, the same bits as the dtype's converters */
static void cpu_to_compute(const ft_backend *be, void *dst, const float *src, size_t n) {
    if (be->compute == FT_BF16) ft_bf16_from_f32_fast(dst, src, n, be->n_threads);
    else ft_types[be->compute].from_f32(src, dst, (int64_t)n);
}
static void cpu_from_compute(const ft_backend *be, float *dst, const void *src, size_t n) {
    if (be->compute == FT_BF16) ft_bf16_to_f32_fast(dst, src, n, be->n_threads);
    else ft_types[be->compute].to_f32(src, dst, (int64_t)n);
}
static void cpu_add(const ft_backend *be, float *y, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
static double cpu_crossentropy(const ft_backend *be, float *dlogits, const float *logits, const int *targets, int T,
                               int V, float dloss_scale) {
    return ft_crossentropy_fast(dlogits, logits, targets, T, V, dloss_scale, be->n_threads);
}
static void cpu_adamw_step(const ft_backend *be, ft_adamw *o, double lr) {
    (void)be;
    ft_adamw_step(o, lr);
}

ft_backend ft_backend_cpu(int n_threads) { return ft_backend_cpu_in(FT_F32, n_threads); }

ft_backend ft_backend_cpu_in(ft_dtype compute, int n_threads) {
    return (ft_backend){
        .name = "cpu",
        .n_threads = n_threads,
        .compute = compute,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .upload = cpu_memcpy,
        .download = cpu_memcpy,
        .copy = cpu_memcpy,
        .zero = cpu_zero,
        .sync = cpu_sync,
        .linear_scratch_floats = cpu_linear_scratch,
        .attention_scratch_floats = cpu_attention_scratch,
        .linear_forward = cpu_linear_forward,
        .linear_forward_train = cpu_linear_forward_train,
        .linear_backward = cpu_linear_backward,
        .rmsnorm_forward = cpu_rmsnorm_forward,
        .rmsnorm_backward = cpu_rmsnorm_backward,
        .rope_forward = cpu_rope_forward,
        .rope_backward = cpu_rope_backward,
        .attention_forward = cpu_attention_forward,
        .attention_backward = cpu_attention_backward,
        .swiglu_forward = cpu_swiglu_forward,
        .swiglu_backward = cpu_swiglu_backward,
        .embedding_forward = cpu_embedding_forward,
        .embedding_backward = cpu_embedding_backward,
        .to_compute = cpu_to_compute,
        .from_compute = cpu_from_compute,
        .add = cpu_add,
        .crossentropy = cpu_crossentropy,
        .adamw_step = cpu_adamw_step,
    };
}
