/* backend_ref.c — the reference backend: the plain C references of ops.c
 * (and linear_forward_ref, and plain loops with sums in double for the
 * training Linear and the adapter), single-threaded. It is the oracle
 * tests/test_backend.c compares every other backend against; it is slow
 * and allocates its own temporaries per call (scratch arguments are
 * ignored). If a temporary cannot be allocated the op's outputs are filled
 * with NaN, so a test fails instead of passing on stale data. */
#include "nn/backend.h"
#include "optim/optim.h"

#include <math.h>
#include <string.h>

static void fill_nan(float *p, size_t n) {
    if (!p) return;
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static void *ref_alloc(const ft_backend *be, ft_mem_class c, size_t bytes) {
    (void)be;
    return ft_mem_alloc(c, bytes);
}
static void ref_free(const ft_backend *be, ft_mem_class c, void *p, size_t bytes) {
    (void)be;
    ft_mem_free(c, p, bytes);
}
static void ref_memcpy(const ft_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}
static void ref_zero(const ft_backend *be, void *p, size_t bytes) {
    (void)be;
    if (bytes) memset(p, 0, bytes);
}
static void ref_sync(const ft_backend *be) { (void)be; }

/* No scratch: the reference allocates its own temporaries. */
static size_t ref_linear_scratch(const ft_backend *be, int in, int R, int T, bool train) {
    (void)be; (void)in; (void)R; (void)T; (void)train;
    return 0;
}
static size_t ref_attention_scratch(const ft_backend *be, int Tk, int HS, bool backward) {
    (void)be; (void)Tk; (void)HS; (void)backward;
    return 0;
}

/* ------------------------------------------------------------- Linear */

static void ref_linear_forward(const ft_backend *be, float *out, const float *inp, const ft_linear *l,
                               const ft_adapter_inst *ad, int T, float *scratch) {
    (void)scratch;
    ft_linear_forward_ref_in(be->compute, out, inp, l, ad, T);
}

static void ref_linear_forward_train(const ft_backend *be, float *out, float *u, const float *inp,
                                     const ft_linear *l, const ft_adapter_inst *a, int T, uint64_t mask_seed,
                                     float *scratch) {
    (void)scratch;
    ft_linear_forward_ref_in(be->compute, out, inp, l, NULL, T);
    if (!a) return;
    int IC = l->in, OC = l->out;
    if (!a->kind->forward_train_ref(be->compute, out, u, inp, a, T, IC, OC, mask_seed)) {
        fill_nan(out, (size_t)T * OC);
        fill_nan(u, (size_t)T * a->kind->saved_floats(a));
    }
}

/* In a compute type, W, dout and inp are rounded copies (the reference
 * products are then exactly ft_gemm_in's); dbias sums dout unrounded. The
 * weight gradient is computed for W of any dtype. */
static void ref_linear_backward(const ft_backend *be, float *dinp, float *dw, float *dbias, const float *dout,
                                const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *a,
                                int T, uint64_t mask_seed, bool accumulate, float *scratch) {
    (void)scratch;
    ft_dtype cp = be->compute;
    int IC = l->in, OC = l->out;
    bool rnd = cp != FT_F32;
    size_t nw = (size_t)OC * IC * sizeof(float), nx = (size_t)T * IC * sizeof(float);
    size_t no = rnd ? (size_t)T * OC * sizeof(float) : 0, nr = rnd ? nx : 0;
    float *w = ft_mem_alloc(FT_MEM_SCRATCH, nw), *dx = ft_mem_alloc(FT_MEM_SCRATCH, nx);
    float *dor = rnd ? ft_mem_alloc(FT_MEM_SCRATCH, no) : NULL, *xr = rnd ? ft_mem_alloc(FT_MEM_SCRATCH, nr) : NULL;
    if (!w || !dx || (rnd && (!dor || !xr))) {
        ft_mem_free(FT_MEM_SCRATCH, w, w ? nw : 0); ft_mem_free(FT_MEM_SCRATCH, dx, dx ? nx : 0);
        ft_mem_free(FT_MEM_SCRATCH, dor, dor ? no : 0); ft_mem_free(FT_MEM_SCRATCH, xr, xr ? nr : 0);
        fill_nan(dinp, (size_t)T * IC);
        return;
    }
    for (int o = 0; o < OC; o++) ft_tensor_row_f32(&l->w, o, w + (size_t)o * IC);
    if (rnd) {
        ft_round_array_in(cp, w, w, (size_t)OC * IC);
        ft_round_array_in(cp, dor, dout, (size_t)T * OC);
        ft_round_array_in(cp, xr, inp, (size_t)T * IC);
    }
    /* dx (T, IC) = dout · W (overwritten); dw, dbias accumulate */
    ft_matmul_backward_ref(dinp ? dx : NULL, dw, rnd ? NULL : dbias, rnd ? dor : dout, rnd ? xr : inp, w, T, IC, OC);
    if (rnd && dbias)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)t * OC + o];
    if (dinp)
        for (size_t i = 0; i < (size_t)T * IC; i++) dinp[i] = accumulate ? dinp[i] + dx[i] : dx[i];
    if (a && !a->kind->backward_ref(cp, dinp, dout, inp, u, a, T, IC, OC, mask_seed)) fill_nan(dinp, (size_t)T * IC);
    ft_mem_free(FT_MEM_SCRATCH, w, nw);
    ft_mem_free(FT_MEM_SCRATCH, dx, nx);
    ft_mem_free(FT_MEM_SCRATCH, dor, no);
    ft_mem_free(FT_MEM_SCRATCH, xr, nr);
}

/* ------------------------------------------------------------- layers */

static void ref_rmsnorm_forward(const ft_backend *be, float *out, float *rstd, const float *inp, const float *w,
                                int T, int C, float eps) {
    (void)be;
    ft_rmsnorm_forward(out, rstd, inp, w, T, C, eps);
}
static void ref_rmsnorm_backward(const ft_backend *be, float *dinp, float *dw, const float *dout, const float *inp,
                                 const float *w, const float *rstd, int T, int C) {
    (void)be;
    ft_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, T, C);
}
static void ref_rope_forward(const ft_backend *be, float *x, const int *pos, const float *inv_freq, int T, int nh,
                             int HS, bool interleaved) {
    (void)be;
    ft_rope_forward(x, pos, inv_freq, T, nh, HS, interleaved);
}
static void ref_rope_backward(const ft_backend *be, float *dx, const int *pos, const float *inv_freq, int T, int nh,
                              int HS, bool interleaved) {
    (void)be;
    ft_rope_backward(dx, pos, inv_freq, T, nh, HS, interleaved);
}

/* lse (NH, T) of one batch row: log-sum-exp of the scaled scores over the
 * keys attention_forward lets query t see, in double. */
static void row_lse(float *lse, const float *q, const float *k, const int *q_pos, const int *doc, int T, int Tk,
                    int NH, int NKV, int HS, int kv_stride) {
    int group = NH / NKV;
    double scale = 1.0 / sqrt((double)HS);
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++) {
            const float *qt = q + (size_t)t * NH * HS + (size_t)h * HS;
            const float *kh = k + (size_t)(h / group) * HS;
            int last = q_pos[t] < Tk ? q_pos[t] : Tk - 1;
            int qdoc = doc && last >= 0 ? doc[last] : 0;
            double m = -INFINITY, sum = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int j = 0; j <= last; j++) {
                    if (doc && doc[j] != qdoc) continue;
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += (double)qt[d] * kh[(size_t)j * kv_stride + d];
                    s *= scale;
                    if (pass == 0) m = s > m ? s : m;
                    else sum += exp(s - m);
                }
            lse[(size_t)h * T + t] = (float)(m + log(sum));
        }
}

static void ref_attention_forward(const ft_backend *be, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                                  int NKV, int HS, int kv_stride, float *scratch) {
    (void)be; (void)scratch;
    size_t qd = (size_t)NH * HS;
    for (int b = 0; b < B; b++) {
        const float *qb = q + (size_t)b * T * qd, *kb = k + (size_t)b * Tk * kv_stride;
        const float *vb = v + (size_t)b * Tk * kv_stride;
        const int *db = doc ? doc + (size_t)b * Tk : NULL;
        ft_attention_forward(out + (size_t)b * T * qd, NULL, qb, kb, vb, q_pos, db, T, Tk, NH, NKV, HS, kv_stride, 1);
        if (lse) row_lse(lse + (size_t)b * NH * T, qb, kb, q_pos, db, T, Tk, NH, NKV, HS, kv_stride);
    }
}

/* The reference backward takes the probabilities, so they are recomputed
 * here by the reference forward (lse is not used). */
static void ref_attention_backward(const ft_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                                   float *scratch) {
    (void)be; (void)lse; (void)scratch;
    size_t qd = (size_t)NH * HS, kvd = (size_t)NKV * HS;
    size_t na = (size_t)NH * T * Tk * sizeof(float), no = (size_t)T * qd * sizeof(float);
    float *att = ft_mem_alloc(FT_MEM_SCRATCH, na), *tmp = ft_mem_alloc(FT_MEM_SCRATCH, no);
    if (!att || !tmp) {
        fill_nan(dq, (size_t)B * T * qd); fill_nan(dk, (size_t)B * Tk * kvd); fill_nan(dv, (size_t)B * Tk * kvd);
    } else {
        for (int b = 0; b < B; b++) {
            const float *qb = q + (size_t)b * T * qd, *kb = k + (size_t)b * Tk * kvd, *vb = v + (size_t)b * Tk * kvd;
            ft_attention_forward(tmp, att, qb, kb, vb, q_pos, doc ? doc + (size_t)b * Tk : NULL, T, Tk, NH, NKV, HS,
                              (int)kvd, 1);
            ft_attention_backward(dq + (size_t)b * T * qd, dk + (size_t)b * Tk * kvd, dv + (size_t)b * Tk * kvd,
                               dout + (size_t)b * T * qd, att, qb, kb, vb, T, Tk, NH, NKV, HS);
        }
    }
    ft_mem_free(FT_MEM_SCRATCH, att, att ? na : 0);
    ft_mem_free(FT_MEM_SCRATCH, tmp, tmp ? no : 0);
}

static void ref_swiglu_forward(const ft_backend *be, float *out, const float *gate, const float *up, int T, int F) {
    (void)be;
    ft_swiglu_forward(out, gate, up, T, F);
}
static void ref_swiglu_backward(const ft_backend *be, float *dgate, float *dup, const float *dout,
                                const float *gate, const float *up, int T, int F) {
    (void)be;
    ft_swiglu_backward(dgate, dup, dout, gate, up, T, F);
}
static void ref_embedding_forward(const ft_backend *be, float *out, const int32_t *tokens, const ft_tensor *wte,
                                  int T) {
    int C = (int)wte->shape[1], V = (int)wte->shape[0];
    if (wte->dtype == FT_F32) {
        if (ft_embedding_forward(out, (const int *)tokens, wte->data, T, C, V)) fill_nan(out, (size_t)T * C);
    } else {
        for (int t = 0; t < T; t++) ft_tensor_row_f32(wte, tokens[t], out + (size_t)t * C);
    }
    if (be->compute != FT_F32) ft_round_array_in(be->compute, out, out, (size_t)T * C);
}
static FTUNE_MUST_USE ftune_status ref_embedding_backward(const ft_backend *be, float *dwte, const float *dout,
                                           const int32_t *tokens, int T, int C, int V) {
    (void)be;
    return ft_embedding_backward(dwte, dout, (const int *)tokens, T, C, V);
}
static void ref_to_compute(const ft_backend *be, void *dst, const float *src, size_t n) {
    ft_types[be->compute].from_f32(src, dst, (int64_t)n);
}
static void ref_from_compute(const ft_backend *be, float *dst, const void *src, size_t n) {
    ft_types[be->compute].to_f32(src, dst, (int64_t)n);
}
static void ref_add(const ft_backend *be, float *y, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
static double ref_crossentropy(const ft_backend *be, float *dlogits, const float *logits, const int *targets, int T,
                               int V, float dloss_scale) {
    (void)be;
    return ft_crossentropy_forward_backward(dlogits, logits, targets, T, V, dloss_scale);
}
/* ft_adamw_step is itself a plain elementwise loop (torch's rounding
 * order); its own oracle is torch (tests/test_optim.c). */
static void ref_adamw_step(const ft_backend *be, ft_adamw *o, double lr) {
    (void)be;
    ft_adamw_step(o, lr);
}

ft_backend ft_backend_ref(void) { return ft_backend_ref_in(FT_F32); }

ft_backend ft_backend_ref_in(ft_dtype compute) {
    return (ft_backend){
        .name = "ref",
        .n_threads = 1,
        .compute = compute,
        .alloc = ref_alloc,
        .free = ref_free,
        .upload = ref_memcpy,
        .download = ref_memcpy,
        .copy = ref_memcpy,
        .zero = ref_zero,
        .sync = ref_sync,
        .linear_scratch_floats = ref_linear_scratch,
        .attention_scratch_floats = ref_attention_scratch,
        .linear_forward = ref_linear_forward,
        .linear_forward_train = ref_linear_forward_train,
        .linear_backward = ref_linear_backward,
        .rmsnorm_forward = ref_rmsnorm_forward,
        .rmsnorm_backward = ref_rmsnorm_backward,
        .rope_forward = ref_rope_forward,
        .rope_backward = ref_rope_backward,
        .attention_forward = ref_attention_forward,
        .attention_backward = ref_attention_backward,
        .swiglu_forward = ref_swiglu_forward,
        .swiglu_backward = ref_swiglu_backward,
        .embedding_forward = ref_embedding_forward,
        .embedding_backward = ref_embedding_backward,
        .to_compute = ref_to_compute,
        .from_compute = ref_from_compute,
        .add = ref_add,
        .crossentropy = ref_crossentropy,
        .adamw_step = ref_adamw_step,
    };
}
