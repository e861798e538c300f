/* session.c — inference: the forward pass over a KV cache, batched over the
 * tokens of a chunk (prefill) or one token at a time (decode), and
 * evaluation of next-token cross-entropy in context-length windows.
 * All buffers are allocated once, when the session is created. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 128 /* tokens per batched pass; bounds the scratch memory */

struct ftune_session {
    const ftune_model *m;
    int n_ctx, n_threads, pos;
    float *k_cache, *v_cache; /* (L, n_ctx, NKV*HS) */
    float *inv_freq;          /* (HS/2) */
    float *x;                 /* (CHUNK, C) residual stream */
    float *xb, *xb2;          /* (CHUNK, max(C, NH*HS)) */
    float *q;                 /* (CHUNK, NH*HS) */
    float *hb, *hb2;          /* (CHUNK, F) */
    float *scratch;           /* linear_forward's tile + per-thread rows */
    float *att_scratch;       /* attention_fast_scratch_floats(n_ctx, HS, n_threads, false) */
    int *qpos;                /* (CHUNK) */
};

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

ftune_status ftune_session_new(ftune_session **out, const ftune_model *m, int n_ctx, int n_threads) {
    *out = NULL;
    const ft_config *c = &m->cfg;
    if (n_ctx <= 0) n_ctx = c->max_T;
    if (n_ctx <= 0) return ft_err(FTUNE_ERR_ARG, "context length must be positive");
    ftune_session *s = calloc(1, sizeof *s);
    if (!s) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    s->m = m;
    s->n_ctx = n_ctx;
    s->n_threads = ft_num_threads(n_threads);
    size_t kv = (size_t)c->L * n_ctx * c->NKV * c->HS, qd = (size_t)c->NH * c->HS;
    size_t wide = max3((size_t)c->C, qd, 1);
    size_t max_in = max3((size_t)c->C, (size_t)c->F, qd);
    s->k_cache = ft_aligned_alloc(kv * sizeof(float));
    s->v_cache = ft_aligned_alloc(kv * sizeof(float));
    s->inv_freq = malloc((size_t)c->HS / 2 * sizeof(float));
    s->x = ft_aligned_alloc((size_t)CHUNK * c->C * sizeof(float));
    s->xb = ft_aligned_alloc((size_t)CHUNK * wide * sizeof(float));
    s->xb2 = ft_aligned_alloc((size_t)CHUNK * wide * sizeof(float));
    s->q = ft_aligned_alloc((size_t)CHUNK * qd * sizeof(float));
    s->hb = ft_aligned_alloc((size_t)CHUNK * c->F * sizeof(float));
    s->hb2 = ft_aligned_alloc((size_t)CHUNK * c->F * sizeof(float));
    s->scratch = ft_aligned_alloc(linear_scratch_floats((int)max_in, s->n_threads) * sizeof(float));
    s->att_scratch =
        ft_aligned_alloc(attention_fast_scratch_floats(n_ctx, c->HS, s->n_threads, false) * sizeof(float));
    s->qpos = malloc(CHUNK * sizeof(int));
    if (!s->k_cache || !s->v_cache || !s->inv_freq || !s->x || !s->xb || !s->xb2 || !s->q || !s->hb || !s->hb2 ||
        !s->scratch || !s->att_scratch || !s->qpos) {
        ftune_session_free(s);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for a session of %d positions (KV cache %.1f MiB)", n_ctx,
                      2.0 * kv * 4 / 1048576.0);
    }
    rope_freqs(s->inv_freq, c->HS, c->rope_theta, &c->rope_scaling);
    if (m->rope_freq_factors)
        for (int i = 0; i < c->HS / 2; i++) s->inv_freq[i] /= m->rope_freq_factors[i];
    *out = s;
    return FTUNE_OK;
}

void ftune_session_free(ftune_session *s) {
    if (!s) return;
    free(s->k_cache); free(s->v_cache); free(s->inv_freq); free(s->x); free(s->xb); free(s->xb2);
    free(s->q); free(s->hb); free(s->hb2); free(s->scratch); free(s->att_scratch); free(s->qpos);
    free(s);
}

int ftune_session_pos(const ftune_session *s) { return s->pos; }
void ftune_session_reset(ftune_session *s) { s->pos = 0; }

/* One batched pass over n ≤ CHUNK tokens at positions s->pos.. ; writes the
 * final-norm hidden states of the rows [first_row, n) to logits via lm_head. */
static void forward_chunk(ftune_session *s, const int32_t *tokens, int n, float *logits, int first_row) {
    const ftune_model *m = s->m;
    const ft_config *c = &m->cfg;
    int C = c->C, HS = c->HS, NH = c->NH, NKV = c->NKV, F = c->F, nt = s->n_threads;
    int kvd = NKV * HS, p0 = s->pos;
    for (int t = 0; t < n; t++) {
        ft_tensor_row_f32(&m->tok_embd, tokens[t], s->x + (size_t)t * C);
        s->qpos[t] = p0 + t;
    }
    for (int l = 0; l < c->L; l++) {
        const ft_layer *ly = &m->layers[l];
        float *kc = s->k_cache + (size_t)l * s->n_ctx * kvd, *vc = s->v_cache + (size_t)l * s->n_ctx * kvd;
        rmsnorm_forward(s->xb, NULL, s->x, ly->attn_norm, n, C, c->norm_eps);
        linear_forward(s->q, s->xb, &ly->wq, n, nt, s->scratch);
        linear_forward(kc + (size_t)p0 * kvd, s->xb, &ly->wk, n, nt, s->scratch);
        linear_forward(vc + (size_t)p0 * kvd, s->xb, &ly->wv, n, nt, s->scratch);
        rope_forward(s->q, s->qpos, s->inv_freq, n, NH, HS, c->rope_interleaved);
        rope_forward(kc + (size_t)p0 * kvd, s->qpos, s->inv_freq, n, NKV, HS, c->rope_interleaved);
        attention_forward_fast(s->xb2, NULL, s->q, kc, vc, s->qpos, NULL, 1, n, p0 + n, NH, NKV, HS, kvd, nt,
                               s->att_scratch);
        linear_forward(s->xb, s->xb2, &ly->wo, n, nt, s->scratch);
        for (size_t i = 0; i < (size_t)n * C; i++) s->x[i] += s->xb[i];
        rmsnorm_forward(s->xb, NULL, s->x, ly->ffn_norm, n, C, c->norm_eps);
        linear_forward(s->hb, s->xb, &ly->w_gate, n, nt, s->scratch);
        linear_forward(s->hb2, s->xb, &ly->w_up, n, nt, s->scratch);
        swiglu_forward(s->hb, s->hb, s->hb2, n, F);
        linear_forward(s->xb, s->hb, &ly->w_down, n, nt, s->scratch);
        for (size_t i = 0; i < (size_t)n * C; i++) s->x[i] += s->xb[i];
    }
    s->pos += n;
    if (!logits || first_row >= n) return;
    int rows = n - first_row;
    rmsnorm_forward(s->xb, NULL, s->x + (size_t)first_row * C, m->out_norm, rows, C, c->norm_eps);
    linear_forward(logits, s->xb, &m->lm_head, rows, nt, s->scratch);
}

ftune_status ftune_session_forward(ftune_session *s, const int32_t *tokens, int n, float *logits, int all_logits) {
    const ft_config *c = &s->m->cfg;
    if (n < 0) return ft_err(FTUNE_ERR_ARG, "negative token count");
    if (s->pos + n > s->n_ctx)
        return ft_err(FTUNE_ERR_RANGE, "context full: %d positions used + %d new tokens > context length %d", s->pos,
                      n, s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->V)
            return ft_err(FTUNE_ERR_ARG, "token id %d at index %d is outside the vocabulary (0..%d)", tokens[i], i,
                          c->V - 1);
    for (int i0 = 0; i0 < n; i0 += CHUNK) {
        int k = n - i0 < CHUNK ? n - i0 : CHUNK;
        bool last = i0 + k == n;
        float *dst = NULL;
        int first = k;
        if (logits && all_logits) { dst = logits + (size_t)i0 * c->V; first = 0; }
        else if (logits && last) { dst = logits; first = k - 1; }
        forward_chunk(s, tokens + i0, k, dst, first);
    }
    return FTUNE_OK;
}

/* Cross-entropy of rows of logits against targets, summed in double. */
static double ce_sum(const float *logits, const int32_t *targets, int n, int V) {
    double sum = 0;
    for (int t = 0; t < n; t++) {
        const float *row = logits + (size_t)t * V;
        float mx = row[0];
        for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
        double se = 0;
        for (int i = 0; i < V; i++) se += exp((double)row[i] - mx);
        sum += log(se) + mx - row[targets[t]];
    }
    return sum;
}

ftune_status ftune_eval_tokens(ftune_session *s, const int32_t *tokens, size_t n, ftune_eval_result *acc) {
    int V = s->m->cfg.V, W = s->n_ctx;
    if (W < 2) return ft_err(FTUNE_ERR_ARG, "context length %d is too short to evaluate", W);
    float *logits = malloc((size_t)CHUNK * V * sizeof(float));
    if (!logits) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    /* windows [w0, w0+W) with w0 advancing by W-1: each token after the first
     * is predicted exactly once, from at most W-1 tokens of context */
    for (size_t w0 = 0; w0 + 1 < n; w0 += (size_t)W - 1) {
        size_t wn = n - w0 < (size_t)W ? n - w0 : (size_t)W;
        ftune_session_reset(s);
        for (size_t i = 0; i + 1 < wn; i += CHUNK) {
            int k = (int)(wn - 1 - i < CHUNK ? wn - 1 - i : CHUNK);
            ftune_status st = ftune_session_forward(s, tokens + w0 + i, k, logits, 1);
            if (st) { free(logits); return st; }
            acc->loss_sum += ce_sum(logits, tokens + w0 + i + 1, k, V);
            acc->n_predicted += k;
        }
    }
    free(logits);
    return FTUNE_OK;
}
