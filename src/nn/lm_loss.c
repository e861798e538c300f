/* lm_loss.c — fused LM head + loss in chunks of rows (see lm_loss.h). */
#include "nn/lm_loss.h"

static double ce_fn(void *ctx, float *dlogits, const float *logits, const int *targets, int r0, int n, int V,
                    float dloss_scale, const ft_backend *be) {
    (void)ctx; (void)r0;
    return be->crossentropy(be, dlogits, logits, targets, n, V, dloss_scale);
}

const ft_loss ft_loss_crossentropy = { ce_fn, NULL, "cross-entropy" };

int ft_lm_loss_chunk_rows(int V, int max_rows) {
    size_t ch = FT_LM_LOSS_CHUNK_FLOATS / (size_t)(V > 0 ? V : 1);
    if (ch < 1) ch = 1;
    if (max_rows < 1) max_rows = 1;
    return (int)(ch < (size_t)max_rows ? ch : (size_t)max_rows);
}

size_t ft_lm_loss_scratch_floats(int chunk_rows, int V, bool backward) {
    size_t n = ((size_t)chunk_rows * V + 15) & ~(size_t)15;
    return backward ? 2 * n : n;
}

static int64_t count_targets(const int *targets, int n) {
    int64_t k = 0;
    for (int i = 0; i < n; i++) k += targets[i] >= 0;
    return k;
}

static double run(const ft_lm_loss_env *e, float *dh, float *dw, int64_t *n_targets, const float *h,
                  const int *targets, int n, bool grad, float dloss_scale) {
    const ft_linear *head = e->head;
    int V = head->out, C = head->in, CH = e->chunk_rows;
    float *logits = e->scratch;
    float *dlogits = grad ? e->scratch + (((size_t)CH * V + 15) & ~(size_t)15) : NULL;
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
