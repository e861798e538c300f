/* lm_loss.c — fused LM head + loss in chunks of rows, and for V above
 * FT_LM_LOSS_VSLICE in slices of the vocabulary within each chunk (see
 * lm_loss.h). */
#include "nn/lm_loss.h"
#include "ops/ops.h"

#include <math.h>
#include <string.h>

static double ce_fn(void *ctx, float *dlogits, const float *logits, const int *targets, int r0, int n, int V,
                    float dloss_scale, const ft_backend *be) {
    (void)ctx; (void)r0;
    return be->crossentropy(be, dlogits, logits, targets, n, V, dloss_scale);
}

const ft_loss ft_loss_crossentropy = { ce_fn, NULL, "cross-entropy", true };

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

/* the widest block of logits one chunk row has at a time */
static int slice_width(int V) { return V > FT_LM_LOSS_VSLICE ? FT_LM_LOSS_VSLICE : V; }

int ft_lm_loss_chunk_rows(int V, int max_rows) {
    size_t ch = FT_LM_LOSS_CHUNK_FLOATS / (size_t)(V > 0 ? slice_width(V) : 1);
    if (ch < 1) ch = 1;
    if (max_rows < 1) max_rows = 1;
    return (int)(ch < (size_t)max_rows ? ch : (size_t)max_rows);
}

/* Per-row statistics of a sliced chunk, after its (rows, Vc) logits:
 * m, xy, alpha, lse (floats) and s (doubles). */
static size_t stats_floats(int rows) { return 6 * pad16((size_t)rows); }

size_t ft_lm_loss_scratch_floats(int chunk_rows, int V, bool backward) {
    if (V <= FT_LM_LOSS_VSLICE) {
        size_t n = pad16((size_t)chunk_rows * V);
        return backward ? 2 * n : n;
    }
    /* the sliced cross-entropy: one slice's logits (their gradient is made
     * in place) and the rows' statistics; or, for a loss that needs whole
     * rows, at least one row of logits and its gradient */
    size_t sliced = pad16((size_t)chunk_rows * FT_LM_LOSS_VSLICE) + stats_floats(chunk_rows);
    size_t whole = (backward ? 2 : 1) * pad16((size_t)V);
    return sliced > whole ? sliced : whole;
}

static int64_t count_targets(const int *targets, int n) {
    int64_t k = 0;
    for (int i = 0; i < n; i++) k += targets[i] >= 0;
    return k;
}

/* Whole rows of logits, CH rows at a time: any loss. */
static double run_rows(const ft_lm_loss_env *e, float *dh, float *dw, const float *h, const int *targets, int n,
                       int CH, bool grad, float dloss_scale) {
    const ft_linear *head = e->head;
    int V = head->out, C = head->in;
    float *logits = e->scratch;
    float *dlogits = grad ? e->scratch + pad16((size_t)CH * V) : NULL;
    double loss = 0;
    for (int r0 = 0; r0 < n; r0 += CH) {
        int k = n - r0 < CH ? n - r0 : CH;
        const float *hc = h + (size_t)r0 * C;
        e->be->linear_forward(e->be, logits, hc, head, NULL, k, e->lin_scratch);
        loss += e->loss->fn(e->loss->ctx, dlogits, logits, targets + r0, r0, k, V, dloss_scale, e->be);
        if (grad)
            e->be->linear_backward(e->be, dh + (size_t)r0 * C, dw, NULL, dlogits, hc, NULL, head, NULL, k, 0, false,
                                   e->lin_scratch);
    }
    return loss;
}

/* Rows [v0, v0+W) of the head, as a Linear of its own. */
static ft_linear head_slice(const ft_linear *head, int v0, int W) {
    ft_linear s = *head;
    size_t rb = (size_t)ft_dtype_nbytes(head->w.dtype, head->in);
    s.w.data = (uint8_t *)head->w.data + (size_t)v0 * rb;
    s.w.shape[0] = W;
    s.w.nbytes = (size_t)W * rb;
    s.out = W;
    if (head->bias) s.bias = head->bias + v0;
    return s;
}

/* Cross-entropy with the vocabulary in slices of Vc: a chunk's logits
 * exist Vc columns at a time and the log-sum-exp is carried across the
 * slices (ft_ce_slice_fast). Forward: one pass. Backward with a frozen
 * head (dw NULL): still one pass: dh accumulates e·W_slice, e = exp(x - m)
 * against the running max m, and is rescaled whenever m grows, then
 * multiplied by dloss_scale/S at the end; the target's term (p_y - 1)·w_y
 * is added separately in f32. With a trainable head, dW needs the final
 * probabilities: a first pass gives each row's lse, a second recomputes
 * each slice's logits and forms (softmax - onehot)·scale for dh and dW
 * (one more head GEMM than the unsliced path). */
static double run_sliced(const ft_lm_loss_env *e, float *dh, float *dw, const float *h, const int *targets, int n,
                         bool grad, float dloss_scale) {
    const ft_linear *head = e->head;
    const ft_backend *be = e->be;
    int V = head->out, C = head->in, CH = e->chunk_rows, Vc = FT_LM_LOSS_VSLICE, nt = be->n_threads;
    float *x = e->scratch, *st = e->scratch + pad16((size_t)CH * Vc);
    size_t P = pad16((size_t)CH);
    float *m = st, *xy = st + P, *alpha = st + 2 * P, *lse = st + 3 * P;
    double *s = (double *)(st + 4 * P);
    bool online = grad && !dw, two_pass = grad && dw;
    double loss = 0;
    for (int r0 = 0; r0 < n; r0 += CH) {
        int k = n - r0 < CH ? n - r0 : CH;
        const int *tg = targets + r0;
        const float *hc = h + (size_t)r0 * C;
        float *dhc = grad ? dh + (size_t)r0 * C : NULL;
        for (int v0 = 0; v0 < V; v0 += Vc) {
            int W = V - v0 < Vc ? V - v0 : Vc;
            ft_linear hs = head_slice(head, v0, W);
            be->linear_forward(be, x, hc, &hs, NULL, k, e->lin_scratch);
            ft_ce_slice_fast(online ? FT_CE_SLICE_EXP : FT_CE_SLICE_STATS, x, m, s, xy, alpha, NULL, tg, k, W, v0, V,
                             v0 == 0, 0, nt);
            if (!online) continue;
            if (v0 > 0)
                for (int r = 0; r < k; r++)
                    if (alpha[r] != 1.0f)
                        for (int c = 0; c < C; c++) dhc[(size_t)r * C + c] *= alpha[r];
            be->linear_backward(be, dhc, NULL, NULL, x, hc, NULL, &hs, NULL, k, 0, v0 > 0, e->lin_scratch);
        }
        for (int r = 0; r < k; r++) {
            int y = tg[r];
            if (y < 0) continue;
            if (y >= V) { loss = NAN; continue; }
            double l = (double)m[r] + log(s[r]);
            lse[r] = (float)l;
            loss += l - xy[r];
        }
        if (online) {
            /* the buffer of logits is free now: w_y rows are widened into it */
            float *wy = x;
            for (int r = 0; r < k; r++) {
                float *d = dhc + (size_t)r * C;
                int y = tg[r];
                if (y < 0 || y >= V) { memset(d, 0, (size_t)C * sizeof(float)); continue; }
                float f = (float)(dloss_scale / s[r]);
                float g = (float)((exp((double)xy[r] - ((double)m[r] + log(s[r]))) - 1.0) * dloss_scale);
                ft_tensor_row_f32(&head->w, y, wy);
                for (int c = 0; c < C; c++) d[c] = d[c] * f + g * wy[c];
            }
        }
        if (two_pass)
            for (int v0 = 0; v0 < V; v0 += Vc) {
                int W = V - v0 < Vc ? V - v0 : Vc;
                ft_linear hs = head_slice(head, v0, W);
                be->linear_forward(be, x, hc, &hs, NULL, k, e->lin_scratch);
                ft_ce_slice_fast(FT_CE_SLICE_GRAD, x, m, s, xy, NULL, lse, tg, k, W, v0, V, false, dloss_scale, nt);
                be->linear_backward(be, dhc, dw + (size_t)v0 * C, NULL, x, hc, NULL, &hs, NULL, k, 0, v0 > 0,
                                    e->lin_scratch);
            }
    }
    return loss;
}

static double run(const ft_lm_loss_env *e, float *dh, float *dw, int64_t *n_targets, const float *h,
                  const int *targets, int n, bool grad, float dloss_scale) {
    const ft_linear *head = e->head;
    int V = head->out, C = head->in, CH = e->chunk_rows;
    double loss;
    /* the widened target rows of the online backward reuse the slice buffer */
    if (V > FT_LM_LOSS_VSLICE && e->loss->sliceable && (size_t)C <= (size_t)CH * FT_LM_LOSS_VSLICE)
        loss = run_sliced(e, dh, dw, h, targets, n, grad, dloss_scale);
    else {
        /* whole rows: as many as the scratch holds (at least one) */
        int rows = CH;
        if (V > FT_LM_LOSS_VSLICE) {
            size_t have = ft_lm_loss_scratch_floats(CH, V, grad);
            while (rows > 1 && (grad ? 2 : 1) * pad16((size_t)rows * V) > have) rows--;
        }
        loss = run_rows(e, dh, dw, h, targets, n, rows, grad, dloss_scale);
    }
    if (n_targets) *n_targets = count_targets(targets, n);
    return loss;
}

double ft_lm_loss_forward(const ft_lm_loss_env *e, int64_t *n_targets, const float *h, const int *targets, int n) {
    return run(e, NULL, NULL, n_targets, h, targets, n, false, 0);
}

double ft_lm_loss_backward(const ft_lm_loss_env *e, float *dh, float *dw, int64_t *n_targets, const float *h,
                           const int *targets, int n, float dloss_scale) {
    return run(e, dh, dw, n_targets, h, targets, n, true, dloss_scale);
}
