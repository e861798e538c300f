/* session.c — inference: the forward pass over a KV cache, batched over the
 * tokens of a chunk (prefill) or one token at a time (decode), and
 * evaluation of next-token loss in context-length windows through the
 * fused LM head + loss (the same op the trainer's validation uses).
 * All buffers are allocated once, when the session is created. */
#include "run/run.h"
#include "adapter/adapter.h"
#include "nn/backend_profile.h"
#include "nn/lm_loss.h"
#include "cpu/kernels.h" /* ft_gemm_set_int_dot: decode's integer products (a backend option to be) */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 128 /* tokens per batched pass; bounds the scratch memory */

struct ftune_session {
    const ftune_model *m;
    int n_ctx, n_threads, pos;
    ft_backend be;            /* every op of the forward runs through it (the CPU's, in the model's compute type) */
    ft_prof *prof;            /* FTUNE_PROFILE: decode steps (one-token forwards) run on be_prof, which times
                               * be's ops (the table is printed at free); else NULL */
    ft_backend be_prof;
    int n_prefix;             /* KV prefix rows pinned at the cache's start (ft_session_set_kv_prefix) */
    const ft_block_hooks *hooks;
    bool int_dot;             /* decode's products on quantized weights in integers (ft_gemm_set_int_dot) */
    const ft_adapter *adapter; /* the session's adapter (borrowed): the model's default at creation, or
                              * ftune_session_set_adapter's; NULL: the base model alone */
    float *k_cache, *v_cache; /* (L, n_ctx, NKV*HS) */
    float *inv_freq;          /* (HS/2) */
    float *x;                 /* (CHUNK, C) residual stream */
    float *xb, *xb2;          /* (CHUNK, max(C, NH*HS)) */
    float *q;                 /* (CHUNK, NH*HS) */
    float *hb, *hb2;          /* (CHUNK, F) */
    float *scratch;           /* linear_forward's tile + per-thread rows */
    float *att_scratch;       /* ft_attention_fast_scratch_floats(n_ctx, HS, n_threads, false) */
    int *qpos;                /* (CHUNK) */
    float *lm_scratch;        /* ft_lm_loss_scratch_floats(CHUNK rows, V, false), made on first eval */
    size_t sz[12];            /* bytes of each buffer above, in the order of session_sizes */
    size_t lm_bytes;          /* of lm_scratch, 0 until the first eval */
};

/* The session's buffers in one size table, used both for the plan and for
 * the allocation: k_cache, v_cache (KV), inv_freq, qpos (other), the rest
 * scratch. */
enum { S_K, S_V, S_INV_FREQ, S_QPOS, S_X, S_XB, S_XB2, S_Q, S_HB, S_HB2, S_SCRATCH, S_ATT, S_N };
_Static_assert(S_N == 12, "sz[] holds every buffer");
static ft_mem_class session_class(int i) {
    return i <= S_V ? FT_MEM_KV : i <= S_QPOS ? FT_MEM_OTHER : FT_MEM_SCRATCH;
}

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static void session_sizes(const ft_config *c, int n_ctx, int nt, size_t sz[S_N]) {
    size_t kv = (size_t)c->L * n_ctx * c->NKV * c->HS, qd = (size_t)c->NH * c->HS;
    size_t wide = max3((size_t)c->C, qd, 1);
    size_t max_in = max3((size_t)c->C, (size_t)c->F, qd);
    sz[S_K] = sz[S_V] = kv * sizeof(float);
    sz[S_INV_FREQ] = (size_t)c->HS / 2 * sizeof(float);
    sz[S_QPOS] = CHUNK * sizeof(int);
    sz[S_X] = (size_t)CHUNK * c->C * sizeof(float);
    sz[S_XB] = sz[S_XB2] = (size_t)CHUNK * wide * sizeof(float);
    sz[S_Q] = (size_t)CHUNK * qd * sizeof(float);
    sz[S_HB] = sz[S_HB2] = (size_t)CHUNK * c->F * sizeof(float);
    sz[S_SCRATCH] = ft_linear_scratch_floats((int)max_in, nt) * sizeof(float);
    sz[S_ATT] = ft_attention_fast_scratch_floats(n_ctx, c->HS, nt, false) * sizeof(float);
}

void ft_session_plan(const ft_config *c, int n_ctx, int n_threads, ft_mem_table *t) {
    size_t sz[S_N];
    if (n_ctx <= 0) n_ctx = c->max_T;
    session_sizes(c, n_ctx, ft_num_threads(n_threads), sz);
    t->planned[FT_MEM_OTHER] += sizeof(struct ftune_session);
    for (int i = 0; i < S_N; i++) {
        t->planned[session_class(i)] += sz[i];
        t->has_plan[session_class(i)] = true;
    }
}

void ft_session_mem_table(const ftune_session *s, ft_mem_table *t) {
    ft_model_mem_plan(s->m, t);
    t->planned[FT_MEM_OTHER] += sizeof *s;
    for (int i = 0; i < S_N; i++) {
        t->planned[session_class(i)] += s->sz[i];
        t->has_plan[session_class(i)] = true;
    }
    t->planned[FT_MEM_SCRATCH] += s->lm_bytes;
    ft_mem_table_measure(t);
}

ftune_status ftune_session_new(ftune_session **out, const ftune_model *m, int n_ctx, int n_threads) {
    *out = NULL;
    const ft_config *c = &m->cfg;
    if (n_ctx <= 0) n_ctx = c->max_T;
    if (n_ctx <= 0) return ft_err(FTUNE_ERR_ARG, "context length must be positive");
    ftune_session *s = ft_mem_calloc(FT_MEM_OTHER, sizeof *s);
    if (!s) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    s->m = m;
    s->adapter = m->adapter;
    s->n_ctx = n_ctx;
    s->n_threads = ft_num_threads(n_threads);
    s->be = ft_backend_cpu_in(m->compute, s->n_threads);
    const char *idot = getenv("FTUNE_INT_DOT");
    s->int_dot = !(idot && strcmp(idot, "0") == 0); /* on unless FTUNE_INT_DOT=0 */
    const char *prof = getenv("FTUNE_PROFILE");
    if (prof && *prof && strcmp(prof, "0") && (s->prof = ft_mem_calloc(FT_MEM_OTHER, sizeof *s->prof))) {
        s->prof->inner = s->be;
        s->prof->head = &m->lm_head;
        s->be_prof = ft_backend_profiled(s->prof);
    }
    size_t kv = (size_t)c->L * n_ctx * c->NKV * c->HS;
    session_sizes(c, n_ctx, s->n_threads, s->sz);
    void **slot[S_N] = { [S_K] = (void **)&s->k_cache, [S_V] = (void **)&s->v_cache,
                         [S_INV_FREQ] = (void **)&s->inv_freq, [S_QPOS] = (void **)&s->qpos,
                         [S_X] = (void **)&s->x, [S_XB] = (void **)&s->xb, [S_XB2] = (void **)&s->xb2,
                         [S_Q] = (void **)&s->q, [S_HB] = (void **)&s->hb, [S_HB2] = (void **)&s->hb2,
                         [S_SCRATCH] = (void **)&s->scratch, [S_ATT] = (void **)&s->att_scratch };
    for (int i = 0; i < S_N; i++) *slot[i] = s->be.alloc(&s->be, session_class(i), s->sz[i]);
    if (!s->k_cache || !s->v_cache || !s->inv_freq || !s->x || !s->xb || !s->xb2 || !s->q || !s->hb || !s->hb2 ||
        !s->scratch || !s->att_scratch || !s->qpos) {
        ftune_session_free(s);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for a session of %d positions (KV cache %.1f MiB)", n_ctx,
                      2.0 * kv * 4 / 1048576.0);
    }
    ft_rope_setup(s->inv_freq, c, m->rope_freq_factors);
    *out = s;
    return FTUNE_OK;
}

void ftune_session_free(ftune_session *s) {
    if (!s) return;
    void *p[S_N] = { [S_K] = s->k_cache, [S_V] = s->v_cache, [S_INV_FREQ] = s->inv_freq, [S_QPOS] = s->qpos,
                     [S_X] = s->x, [S_XB] = s->xb, [S_XB2] = s->xb2, [S_Q] = s->q, [S_HB] = s->hb,
                     [S_HB2] = s->hb2, [S_SCRATCH] = s->scratch, [S_ATT] = s->att_scratch };
    for (int i = 0; i < S_N; i++) s->be.free(&s->be, session_class(i), p[i], s->sz[i]);
    ft_mem_free(FT_MEM_SCRATCH, s->lm_scratch, s->lm_bytes);
    if (s->prof) {
        ft_prof_print_per(s->prof, s->prof->calls[FT_PROF_EMBED], "decode token", stderr);
        ft_mem_free(FT_MEM_OTHER, s->prof, sizeof *s->prof);
    }
    ft_mem_free(FT_MEM_OTHER, s, sizeof *s);
}

int ftune_session_pos(const ftune_session *s) { return s->pos; }
void ftune_session_reset(ftune_session *s) { s->pos = s->n_prefix; }
void ft_session_set_hooks(ftune_session *s, const ft_block_hooks *h) { s->hooks = h; }

ftune_status ftune_session_set_adapter(ftune_session *s, const ftune_adapter *a) {
    if (!s) return ft_err(FTUNE_ERR_ARG, "ftune_session_set_adapter: no session");
    if (a && a->m != s->m) return ft_err(FTUNE_ERR_ARG, "ftune_session_set_adapter: the adapter was loaded for another model");
    s->adapter = a;
    /* the cached keys/values were computed with the previous adapter */
    ftune_session_reset(s);
    return FTUNE_OK;
}

ftune_status ft_session_set_kv_prefix(ftune_session *s, const float *k, const float *v, int P) {
    const ft_config *c = &s->m->cfg;
    if (P < 0 || P >= s->n_ctx)
        return ft_err(FTUNE_ERR_RANGE, "KV prefix of %d positions leaves no room in a context of %d", P, s->n_ctx);
    if (P > 0 && (!k || !v)) return ft_err(FTUNE_ERR_ARG, "KV prefix of %d positions without keys or values", P);
    size_t kvd = (size_t)c->NKV * c->HS;
    for (int l = 0; l < c->L && P > 0; l++) {
        memcpy(s->k_cache + (size_t)l * s->n_ctx * kvd, k + (size_t)l * P * kvd, (size_t)P * kvd * sizeof(float));
        memcpy(s->v_cache + (size_t)l * s->n_ctx * kvd, v + (size_t)l * P * kvd, (size_t)P * kvd * sizeof(float));
    }
    s->n_prefix = P;
    s->pos = P;
    return FTUNE_OK;
}

ftune_status ft_session_get_kv(const ftune_session *s, int l, int n, float *k, float *v) {
    const ft_config *c = &s->m->cfg;
    if (l < 0 || l >= c->L || n < 0 || n > s->pos)
        return ft_err(FTUNE_ERR_RANGE, "cache rows [0, %d) of layer %d: the cache holds %d rows of %d layers", n, l,
                      s->pos, c->L);
    size_t kvd = (size_t)c->NKV * c->HS;
    memcpy(k, s->k_cache + (size_t)l * s->n_ctx * kvd, (size_t)n * kvd * sizeof(float));
    memcpy(v, s->v_cache + (size_t)l * s->n_ctx * kvd, (size_t)n * kvd * sizeof(float));
    return FTUNE_OK;
}

/* The backend a forward of n tokens runs on: the timed one for a decode
 * step when profiling (the same functions: bit-identical results). */
static const ft_backend *backend_for(const ftune_session *s, int n) {
    return s->prof && n == 1 ? &s->be_prof : &s->be;
}

/* One batched pass over n <= CHUNK tokens at positions s->pos.. ; writes
 * the final-norm hidden states of the rows [first_row, n) to s->xb and
 * returns them (NULL when first_row >= n). Buffers alias where lifetimes
 * allow: ln1 and mid share xb, atty and ln2 xb2, SwiGLU runs in place. */
static const float *forward_chunk(ftune_session *s, const int32_t *tokens, int n, int first_row) {
    const ftune_model *m = s->m;
    const ft_config *c = &m->cfg;
    const ft_backend *be = backend_for(s, n);
    int C = c->C, kvd = c->NKV * c->HS, p0 = s->pos;
    be->embedding_forward(be, s->x, tokens, &m->tok_embd, n);
    for (int t = 0; t < n; t++) s->qpos[t] = p0 + t;
    ft_block_env e = { .cfg = c, .inv_freq = s->inv_freq, .be = be, .lin_scratch = s->scratch,
                       .att_scratch = s->att_scratch, .hooks = s->hooks,
                       .adapters = s->adapter ? s->adapter->set : NULL };
    for (int l = 0; l < c->L; l++) {
        float *kc = s->k_cache + (size_t)l * s->n_ctx * kvd, *vc = s->v_cache + (size_t)l * s->n_ctx * kvd;
        ft_block_acts a = { .ln1 = s->xb, .q = s->q, .k = kc + (size_t)p0 * kvd, .v = vc + (size_t)p0 * kvd,
                            .atty = s->xb2, .mid = s->xb, .ln2 = s->xb2, .gate = s->hb, .up = s->hb2, .h = s->hb };
        ft_block_io io = { .B = 1, .T = n, .pos = s->qpos, .q_pos = s->qpos, .keys = kc, .values = vc, .Tk = p0 + n };
        ft_block_forward(&e, &m->layers[l], l, &a, s->x, s->x, &io);
    }
    s->pos += n;
    if (first_row >= n) return NULL;
    be->rmsnorm_forward(be, s->xb, NULL, s->x + (size_t)first_row * C, m->out_norm, n - first_row, C, c->norm_eps);
    return s->xb;
}

static void forward_logits(ftune_session *s, const int32_t *tokens, int n, float *logits, int first_row) {
    const float *h = forward_chunk(s, tokens, n, logits ? first_row : n);
    const ft_backend *be = backend_for(s, n);
    if (h) be->linear_forward(be, logits, h, &s->m->lm_head, NULL, n - first_row, s->scratch);
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
    bool was = ft_gemm_set_int_dot(s->int_dot);
    for (int i0 = 0; i0 < n; i0 += CHUNK) {
        int k = n - i0 < CHUNK ? n - i0 : CHUNK;
        bool last = i0 + k == n;
        float *dst = NULL;
        int first = k;
        if (logits && all_logits) { dst = logits + (size_t)i0 * c->V; first = 0; }
        else if (logits && last) { dst = logits; first = k - 1; }
        if (s->prof && k == 1) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            forward_logits(s, tokens + i0, k, dst, first);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            s->prof->wall += (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        } else {
            forward_logits(s, tokens + i0, k, dst, first);
        }
    }
    ft_gemm_set_int_dot(was);
    return FTUNE_OK;
}

void ftune_session_set_int_products(ftune_session *s, int on) {
    if (s) s->int_dot = on != 0;
}

static FTUNE_MUST_USE ftune_status check_tokens(const ftune_session *s, const int32_t *tokens, size_t n) {
    int V = s->m->cfg.V;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return ft_err(FTUNE_ERR_ARG, "token id %d at index %zu is outside the vocabulary (0..%d)", tokens[i], i,
                          V - 1);
    return FTUNE_OK;
}

ftune_status ftune_eval_tokens(ftune_session *s, const int32_t *tokens, size_t n, ftune_eval_result *acc) {
    const ft_config *c = &s->m->cfg;
    int V = c->V, P = s->n_prefix, W = s->n_ctx - P;
    if (W < 2) return ft_err(FTUNE_ERR_ARG, "context length %d (after a KV prefix of %d) is too short to evaluate", W, P);
    ftune_status st = check_tokens(s, tokens, n);
    if (st) return st;
    int CH = ft_lm_loss_chunk_rows(V, CHUNK);
    if (!s->lm_scratch) {
        size_t nb = ft_lm_loss_scratch_floats(CH, V, false) * sizeof(float);
        s->lm_scratch = ft_mem_alloc(FT_MEM_SCRATCH, nb);
        if (s->lm_scratch) s->lm_bytes = nb;
        if (!s->lm_scratch) return ft_err(FTUNE_ERR_NOMEM, "out of memory for %d rows of %d logits", CH, V);
    }
    ft_lm_loss_env le = { .head = &s->m->lm_head, .loss = &ft_loss_crossentropy, .chunk_rows = CH,
                          .be = &s->be, .scratch = s->lm_scratch, .lin_scratch = s->scratch };
    int targets[CHUNK];
    /* windows [w0, w0+W) with w0 advancing by W-1: each token after the first
     * is predicted exactly once, from at most W-1 tokens of context */
    for (size_t w0 = 0; w0 + 1 < n; w0 += (size_t)W - 1) {
        size_t wn = n - w0 < (size_t)W ? n - w0 : (size_t)W;
        ftune_session_reset(s);
        for (size_t i = 0; i + 1 < wn; i += CHUNK) {
            int k = (int)(wn - 1 - i < CHUNK ? wn - 1 - i : CHUNK);
            const float *h = forward_chunk(s, tokens + w0 + i, k, 0);
            for (int t = 0; t < k; t++) targets[t] = tokens[w0 + i + 1 + t];
            int64_t nt;
            acc->loss_sum += ft_lm_loss_forward(&le, &nt, h, targets, k);
            acc->n_predicted += nt;
        }
    }
    return FTUNE_OK;
}
