/* sampler.c — picking the next token from logits: repetition penalty, then
 * top-k, top-p, min-p and temperature (llama.cpp's order), or greedy. */
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ftune_sampler {
    ftune_sampler_params p;
    int n_vocab;
    ft_rng rng;
    int *idx;    /* (n_vocab) candidate ids */
    float *prob; /* (n_vocab) */
};

void ftune_sampler_defaults(ftune_sampler_params *p) {
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->seed = 0;
}

ftune_status ftune_sampler_new(ftune_sampler **out, const ftune_sampler_params *p, int n_vocab) {
    *out = NULL;
    if (n_vocab <= 0) return ft_err(FTUNE_ERR_ARG, "sampler: vocabulary size must be positive");
    if (p->temperature < 0 || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) || p->min_p < 0 || p->min_p > 1 ||
        !(p->repeat_penalty > 0) || p->repeat_last_n < 0)
        return ft_err(FTUNE_ERR_ARG, "sampler: invalid parameters (temp >= 0, top-k >= 0, 0 < top-p <= 1, "
                      "0 <= min-p <= 1, repeat-penalty > 0)");
    ftune_sampler *s = calloc(1, sizeof *s);
    if (!s) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->idx = malloc((size_t)n_vocab * sizeof(int));
    s->prob = malloc((size_t)n_vocab * sizeof(float));
    if (!s->idx || !s->prob) { ftune_sampler_free(s); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    ft_rng_seed(&s->rng, p->seed);
    *out = s;
    return FTUNE_OK;
}

void ftune_sampler_free(ftune_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s);
}

/* Is candidate a ranked before b: higher logit, ties to the lower id. */
static inline bool ranks_before(const float *lg, int a, int b) {
    return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
}
static int by_rank(const void *a, const void *b, void *lg) {
    int x = *(const int *)a, y = *(const int *)b;
    return ranks_before(lg, x, y) ? -1 : ranks_before(lg, y, x) ? 1 : 0;
}

/* Min-heap of candidates with the worst at the root. */
static void heap_down(int *h, int n, int i, const float *lg) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(lg, h[w], h[l])) w = l;
        if (r < n && ranks_before(lg, h[w], h[r])) w = r;
        if (w == i) return;
        int t = h[w]; h[w] = h[i]; h[i] = t;
        i = w;
    }
}

/* Puts the k best ids in idx[0..k), best first: O(V log k). */
static void top_k_ids(int *idx, const float *lg, int V, int k) {
    for (int i = 0; i < k; i++) idx[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) heap_down(idx, k, i, lg);
    for (int id = k; id < V; id++)
        if (ranks_before(lg, id, idx[0])) {
            idx[0] = id;
            heap_down(idx, k, 0, lg);
        }
    qsort_r(idx, (size_t)k, sizeof(int), by_rank, (void *)lg);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

int32_t ftune_sampler_sample(ftune_sampler *s, float *logits, const int32_t *history, int n_history) {
    const ftune_sampler_params *p = &s->p;
    int V = s->n_vocab;
    if (p->repeat_penalty != 1.0f && history) {
        int from = n_history > p->repeat_last_n ? n_history - p->repeat_last_n : 0;
        /* each distinct token is penalized once */
        for (int i = from; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= V) continue;
            bool seen = false;
            for (int j = from; j < i && !seen; j++) seen = history[j] == t;
            if (seen) continue;
            logits[t] = logits[t] > 0 ? logits[t] / p->repeat_penalty : logits[t] * p->repeat_penalty;
        }
    }
    if (p->temperature == 0.0f) return argmax(logits, V);

    /* candidates, best first */
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    top_k_ids(s->idx, logits, V, n);
    /* softmax over candidates at temperature */
    float mx = logits[s->idx[0]];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((logits[s->idx[i]] - mx) / p->temperature);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float thr = s->prob[0] * p->min_p;
        int keep = 1;
        while (keep < n && s->prob[keep] >= thr) keep++;
        n = keep;
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += s->prob[i];
    double r = (double)ft_rng_uniform(&s->rng) * total, cum = 0;
    for (int i = 0; i < n; i++) {
        cum += s->prob[i];
        if (r < cum) return s->idx[i];
    }
    return s->idx[n - 1];
}
