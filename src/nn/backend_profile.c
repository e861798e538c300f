/* backend_profile.c — the timing backend of backend_profile.h: every op of
 * the wrapped backend between two clock reads, its time added to a class. */
#include "nn/backend_profile.h"

#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#define P(be) ((ft_prof *)(be)->ctx)
#define IN(be) (&P(be)->inner)

static double tick(const ft_backend *be) {
    double t = now();
    if (P(be)->first == 0) P(be)->first = t;
    return t;
}
static void tock(const ft_backend *be, int k, double t0) {
    ft_prof *p = P(be);
    double t = now();
    p->sec[k] += t - t0;
    p->calls[k]++;
    p->last = t;
}
#define TIMED(k, call) do { double t0_ = tick(be); call; tock(be, k, t0_); } while (0)

static void *pr_alloc(const ft_backend *be, ft_mem_class c, size_t bytes) { return IN(be)->alloc(IN(be), c, bytes); }
static void pr_free(const ft_backend *be, ft_mem_class c, void *p, size_t bytes) { IN(be)->free(IN(be), c, p, bytes); }
static void pr_upload(const ft_backend *be, void *dst, const void *src, size_t bytes) {
    IN(be)->upload(IN(be), dst, src, bytes);
}
static void pr_download(const ft_backend *be, void *dst, const void *src, size_t bytes) {
    IN(be)->download(IN(be), dst, src, bytes);
}
static void pr_copy(const ft_backend *be, void *dst, const void *src, size_t bytes) {
    TIMED(FT_PROF_ELEMWISE, IN(be)->copy(IN(be), dst, src, bytes));
}
static void pr_zero(const ft_backend *be, void *p, size_t bytes) {
    TIMED(FT_PROF_ELEMWISE, IN(be)->zero(IN(be), p, bytes));
}
static void pr_sync(const ft_backend *be) { IN(be)->sync(IN(be)); }
static size_t pr_linear_scratch(const ft_backend *be, int in, int R, int T, bool train) {
    return IN(be)->linear_scratch_floats(IN(be), in, R, T, train);
}
static size_t pr_attention_scratch(const ft_backend *be, int Tk, int HS, bool backward) {
    return IN(be)->attention_scratch_floats(IN(be), Tk, HS, backward);
}

static bool is_head(const ft_backend *be, const ft_linear *l, const ft_adapter_inst *ad) {
    const ft_linear *h = P(be)->head;
    const uint8_t *w = l->w.data, *h0 = h ? h->w.data : NULL;
    return !ad && h0 && w >= h0 && w < h0 + h->w.nbytes;
}

/* linear.c's order: the base product, then the adapter on the same scratch
 * (inference: its u in the tile area, training: xd after the Linear's
 * scratch). The inference forward is timed whole (the adapter runs in row
 * chunks inside it). */
static void pr_linear_forward(const ft_backend *be, float *out, const float *inp, const ft_linear *l,
                              const ft_adapter_inst *ad, int T, float *scratch) {
    TIMED(is_head(be, l, ad) ? FT_PROF_HEAD_FWD : FT_PROF_LINEAR_FWD,
          IN(be)->linear_forward(IN(be), out, inp, l, ad, T, scratch));
}
static void pr_linear_forward_train(const ft_backend *be, float *out, float *u, const float *inp,
                                    const ft_linear *l, const ft_adapter_inst *ad, int T, uint64_t mask_seed,
                                    float *scratch) {
    TIMED(is_head(be, l, ad) ? FT_PROF_HEAD_FWD : FT_PROF_LINEAR_FWD,
          IN(be)->linear_forward_train(IN(be), out, u, inp, l, NULL, T, mask_seed, scratch));
    if (!ad) return;
    int nt = IN(be)->n_threads;
    float *xd = scratch + ft_linear_scratch_floats(l->in, nt);
    TIMED(FT_PROF_LORA_FWD,
          ad->kind->forward_train(IN(be)->compute, out, u, inp, ad, T, l->in, l->out, mask_seed, xd, nt, scratch));
}
static void pr_linear_backward(const ft_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                               const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *ad,
                               int T, uint64_t mask_seed, bool accumulate, float *scratch) {
    bool head = is_head(be, l, ad);
    if (dinp)
        TIMED(head ? FT_PROF_HEAD_BWD : FT_PROF_LINEAR_DX,
              IN(be)->linear_backward(IN(be), dinp, NULL, NULL, dout, inp, u, l, NULL, T, mask_seed, accumulate,
                                      scratch));
    if (dw || dbias)
        TIMED(head ? FT_PROF_HEAD_BWD : FT_PROF_LINEAR_DW,
              IN(be)->linear_backward(IN(be), NULL, dw, dbias, dout, inp, u, l, NULL, T, mask_seed, accumulate,
                                      scratch));
    if (!ad) return;
    int nt = IN(be)->n_threads;
    float *xd = scratch + ft_linear_scratch_floats(l->in, nt), *g = xd + (size_t)T * l->in;
    TIMED(FT_PROF_LORA_BWD, ad->kind->backward(IN(be)->compute, dinp, dout, inp, u, ad, T, l->in, l->out, mask_seed,
                                               xd, g, nt, scratch));
}

static void pr_rmsnorm_forward(const ft_backend *be, float *out, float *rstd, const float *inp, const float *w,
                               int T, int C, float eps) {
    TIMED(FT_PROF_NORM, IN(be)->rmsnorm_forward(IN(be), out, rstd, inp, w, T, C, eps));
}
static void pr_rmsnorm_backward(const ft_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                const float *w, const float *rstd, int T, int C) {
    TIMED(FT_PROF_NORM, IN(be)->rmsnorm_backward(IN(be), dinp, dw, dout, inp, w, rstd, T, C));
}
static void pr_rope_forward(const ft_backend *be, float *x, const int *pos, const float *inv_freq, int T, int nh,
                            int HS, bool interleaved) {
    TIMED(FT_PROF_ROPE, IN(be)->rope_forward(IN(be), x, pos, inv_freq, T, nh, HS, interleaved));
}
static void pr_rope_backward(const ft_backend *be, float *dx, const int *pos, const float *inv_freq, int T, int nh,
                             int HS, bool interleaved) {
    TIMED(FT_PROF_ROPE, IN(be)->rope_backward(IN(be), dx, pos, inv_freq, T, nh, HS, interleaved));
}
static void pr_attention_forward(const ft_backend *be, float *out, float *lse, const float *q, const float *k,
                                 const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                                 int NKV, int HS, int kv_stride, float *scratch) {
    TIMED(FT_PROF_ATTN_FWD, IN(be)->attention_forward(IN(be), out, lse, q, k, v, q_pos, doc, B, T, Tk, NH, NKV, HS,
                                                      kv_stride, scratch));
}
static void pr_attention_backward(const ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                  const float *lse, const float *q, const float *k, const float *v, const int *q_pos,
                                  const int *doc, int B, int T, int Tk, int NH, int NKV, int HS, float *scratch) {
    TIMED(FT_PROF_ATTN_BWD, IN(be)->attention_backward(IN(be), dq, dk, dv, dout, lse, q, k, v, q_pos, doc, B, T, Tk,
                                                       NH, NKV, HS, scratch));
}
static void pr_swiglu_forward(const ft_backend *be, float *out, const float *gate, const float *up, int T, int F) {
    TIMED(FT_PROF_SWIGLU, IN(be)->swiglu_forward(IN(be), out, gate, up, T, F));
}
static void pr_swiglu_backward(const ft_backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, int T, int F) {
    TIMED(FT_PROF_SWIGLU, IN(be)->swiglu_backward(IN(be), dgate, dup, dout, gate, up, T, F));
}
static void pr_embedding_forward(const ft_backend *be, float *out, const int32_t *tokens, const ft_tensor *wte, int T) {
    TIMED(FT_PROF_EMBED, IN(be)->embedding_forward(IN(be), out, tokens, wte, T));
}
static FTUNE_MUST_USE ftune_status pr_embedding_backward(const ft_backend *be, float *dwte, const float *dout, const int32_t *tokens,
                                          int T, int C, int V) {
    ftune_status st;
    TIMED(FT_PROF_EMBED, st = IN(be)->embedding_backward(IN(be), dwte, dout, tokens, T, C, V));
    return st;
}
static void pr_to_compute(const ft_backend *be, void *dst, const float *src, size_t n) {
    TIMED(FT_PROF_CONVERT, IN(be)->to_compute(IN(be), dst, src, n));
}
static void pr_from_compute(const ft_backend *be, float *dst, const void *src, size_t n) {
    TIMED(FT_PROF_CONVERT, IN(be)->from_compute(IN(be), dst, src, n));
}
static void pr_add(const ft_backend *be, float *y, const float *x, size_t n) {
    TIMED(FT_PROF_ELEMWISE, IN(be)->add(IN(be), y, x, n));
}
static double pr_crossentropy(const ft_backend *be, float *dlogits, const float *logits, const int *targets, int T,
                              int V, float dloss_scale) {
    double r;
    TIMED(FT_PROF_LOSS, r = IN(be)->crossentropy(IN(be), dlogits, logits, targets, T, V, dloss_scale));
    return r;
}
static void pr_adamw_step(const ft_backend *be, ft_adamw *o, double lr) {
    TIMED(FT_PROF_OPTIM, IN(be)->adamw_step(IN(be), o, lr));
}

ft_backend ft_backend_profiled(ft_prof *p) {
    ft_backend b = p->inner;
    b.name = "profile";
    b.ctx = p;
    b.alloc = pr_alloc; b.free = pr_free; b.upload = pr_upload; b.download = pr_download;
    b.copy = pr_copy; b.zero = pr_zero; b.sync = pr_sync;
    b.linear_scratch_floats = pr_linear_scratch; b.attention_scratch_floats = pr_attention_scratch;
    b.linear_forward = pr_linear_forward; b.linear_forward_train = pr_linear_forward_train;
    b.linear_backward = pr_linear_backward;
    b.rmsnorm_forward = pr_rmsnorm_forward; b.rmsnorm_backward = pr_rmsnorm_backward;
    b.rope_forward = pr_rope_forward; b.rope_backward = pr_rope_backward;
    b.attention_forward = pr_attention_forward; b.attention_backward = pr_attention_backward;
    b.swiglu_forward = pr_swiglu_forward; b.swiglu_backward = pr_swiglu_backward;
    b.embedding_forward = pr_embedding_forward; b.embedding_backward = pr_embedding_backward;
    b.to_compute = pr_to_compute; b.from_compute = pr_from_compute; b.add = pr_add;
    b.crossentropy = pr_crossentropy; b.adamw_step = pr_adamw_step;
    return b;
}

void ft_prof_print(const ft_prof *p, long long steps, FILE *f) {
    ft_prof_print_per(p, steps, "optimizer step", f);
}

void ft_prof_print_per(const ft_prof *p, long long steps, const char *unit, FILE *f) {
    static const char *const names[FT_PROF_N] = {
        [FT_PROF_LINEAR_FWD] = "Linear forward", [FT_PROF_LINEAR_DX] = "Linear dX", [FT_PROF_LINEAR_DW] = "Linear dW",
        [FT_PROF_LORA_FWD] = "LoRA forward", [FT_PROF_LORA_BWD] = "LoRA backward",
        [FT_PROF_HEAD_FWD] = "LM head forward", [FT_PROF_HEAD_BWD] = "LM head backward",
        [FT_PROF_LOSS] = "cross-entropy", [FT_PROF_ATTN_FWD] = "attention forward",
        [FT_PROF_ATTN_BWD] = "attention backward", [FT_PROF_NORM] = "RMSNorm", [FT_PROF_ROPE] = "RoPE",
        [FT_PROF_SWIGLU] = "SwiGLU", [FT_PROF_EMBED] = "embedding", [FT_PROF_CONVERT] = "to/from compute type",
        [FT_PROF_ELEMWISE] = "add/copy/zero", [FT_PROF_OPTIM] = "AdamW",
    };
    if (steps < 1) steps = 1;
    double sum = 0, span = p->wall > 0 ? p->wall : p->last > p->first ? p->last - p->first : 0;
    for (int k = 0; k < FT_PROF_N; k++) sum += p->sec[k];
    bool step = !strcmp(unit, "optimizer step");
    fprintf(f, "profile: %lld %s%s%s, %s compute, %d threads\n", steps, unit, steps == 1 ? "" : "s",
            step ? " (warm-up included, validation not)" : "", ft_types[p->inner.compute].name,
            p->inner.n_threads);
    fprintf(f, "  %-22s %10s %6s %8s\n", "op", step ? "ms/step" : "ms/token", "%", "calls");
    for (int k = 0; k < FT_PROF_N; k++)
        if (p->calls[k])
            fprintf(f, step ? "  %-22s %10.1f %5.1f%% %8lld\n" : "  %-22s %10.3f %5.1f%% %8lld\n", names[k],
                    1e3 * p->sec[k] / steps,
                    span > 0 ? 100 * p->sec[k] / span : 0, p->calls[k] / steps);
    fprintf(f, step ? "  %-22s %10.1f %5.1f%%\n" : "  %-22s %10.3f %5.1f%%\n", "ops total", 1e3 * sum / steps,
            span > 0 ? 100 * sum / span : 0);
    fprintf(f, step ? "  %-22s %10.1f %5.1f%%\n" : "  %-22s %10.3f %5.1f%%\n", "outside the ops",
            1e3 * (span - sum) / steps,
            span > 0 ? 100 * (span - sum) / span : 0); /* clipping, the caller's loop; a session's checks */
}
