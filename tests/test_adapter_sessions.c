/* test_adapter_sessions.c — adapters are carried by sessions, never written
 * into the shared model: two sessions on one model with two different
 * adapters, run concurrently in two threads, each give exactly the logits
 * of a single-session run with its adapter, and the model's weights and
 * Linear structs are byte-identical before and after. Also the public
 * ftune_adapter_load / ftune_session_set_adapter and the model's default
 * adapter. */
#include "adapter/adapter.h"
#include "check.h"

#include <pthread.h>
#include <unistd.h>

enum { T_TOK = 12, N_DECODE = 4, REPS = 8 };
static const int32_t toks[T_TOK + N_DECODE] = { 1, 403, 261, 378, 267, 283, 300, 285, 297, 268, 416, 289,
                                                 300, 261, 283, 268 };
static char tmpdir[512];

/* Everything of the model the forward reads, as bytes: embeddings, norms,
 * every Linear's weight, bias and struct (so its lora pointer too). */
typedef struct { unsigned char *p; size_t n, cap; } bytes;
static void put(bytes *b, const void *p, size_t n) {
    if (!p || !n) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static bytes snapshot(ftune_model *m) {
    bytes b = { 0 };
    const ft_config *c = &m->cfg;
    put(&b, m->tok_embd.data, m->tok_embd.nbytes);
    put(&b, m->out_norm, (size_t)c->C * sizeof(float));
    put(&b, &m->lm_head, sizeof m->lm_head);
    for (int l = 0; l < c->L; l++) {
        put(&b, m->layers[l].attn_norm, (size_t)c->C * sizeof(float));
        put(&b, m->layers[l].ffn_norm, (size_t)c->C * sizeof(float));
        for (int k = 0; k < FT_N_MODS; k++) {
            const ft_linear *lin = ft_model_linear(m, l, k);
            put(&b, lin, sizeof *lin);
            put(&b, lin->w.data, lin->w.nbytes);
            put(&b, lin->bias, lin->bias ? (size_t)lin->out * sizeof(float) : 0);
        }
    }
    return b;
}

/* Logits of toks: (T_TOK, V) of the prefill, then one row per decoded
 * token (prefill and decode take different kernel paths), on a fresh
 * session of m with adapter a (NULL: none set, the model's default). */
static size_t n_logits(const ftune_model *m) { return (size_t)(T_TOK + N_DECODE) * m->cfg.V; }
static ftune_status run_session(const ftune_model *m, const ftune_adapter *a, bool set, float *out) {
    ftune_session *s = NULL;
    ftune_status st = ftune_session_new(&s, m, 64, 1);
    if (!st && set) st = ftune_session_set_adapter(s, a);
    if (!st) st = ftune_session_forward(s, toks, T_TOK, out, 1);
    for (int i = 0; i < N_DECODE && !st; i++)
        st = ftune_session_forward(s, &toks[T_TOK + i], 1, out + (size_t)(T_TOK + i) * m->cfg.V, 0);
    ftune_session_free(s);
    return st;
}

typedef struct {
    const ftune_model *m;
    const ftune_adapter *a;
    const float *want;
    float *got;
    int mismatches;
    ftune_status st;
} job;

static void *worker(void *vp) {
    job *j = vp;
    for (int r = 0; r < REPS && !j->st; r++) {
        j->st = run_session(j->m, j->a, true, j->got);
        if (!j->st && memcmp(j->got, j->want, n_logits(j->m) * sizeof(float)) != 0) j->mismatches++;
    }
    return NULL;
}

/* Two adapters of different ranks and targets, written as PEFT and as a
 * GGUF adapter, read back through the public loader. */
static bool make_adapters(ftune_model *m, char *p1, char *p2, size_t cap) {
    ft_adapter_hparams c1 = { .r = 4, .alpha = 8, .targets = FT_MOD_ALL };
    ft_adapter_hparams c2 = { .r = 2, .alpha = 6, .targets = FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_V) | FT_MOD_BIT(FT_MOD_DOWN) };
    ft_adapter *a1 = NULL, *a2 = NULL;
    c1.seed = 1; c2.seed = 2;
    bool ok = ft_adapter_attach(&a1, m, &c1, false) == FTUNE_OK && ft_adapter_attach(&a2, m, &c2, false) == FTUNE_OK;
    ft_rng rng;
    ft_rng_seed(&rng, 77);
    for (int k = 0; ok && k < 2; k++) {
        ft_adapter *a = k ? a2 : a1;
        for (int i = 0; i < a->n; i++)
            for (size_t j = 0; j < (size_t)a->e[i].lin->out * a->e[i].lora->base.hp->r; j++)
                a->e[i].lora->B[j] = 0.05f * ft_rng_normal(&rng);
    }
    snprintf(p1, cap, "%s/peft1", tmpdir);
    snprintf(p2, cap, "%s/lora2.gguf", tmpdir);
    ok = ok && ft_adapter_save_peft(a1, p1) == FTUNE_OK && ft_adapter_save_gguf(a2, p2) == FTUNE_OK;
    ft_adapter_free(a1);
    ft_adapter_free(a2);
    return ok;
}

static void test_two_sessions_two_adapters(void) {
    char path[1024], p1[700], p2[700];
    ftune_model *m = NULL, *other = NULL;
    CHECK_OK(ftune_model_load(&m, check_data_path(path, sizeof path, "models/stories260K-hf"), NULL));
    CHECK_OK(ftune_model_load(&other, path, NULL));
    if (!m || !other) { ftune_model_free(m); ftune_model_free(other); return; }
    bool made = make_adapters(m, p1, p2, sizeof p1);
    CHECK(made);
    ftune_adapter *a1 = NULL, *a2 = NULL, *ao = NULL;
    if (made) {
        CHECK_OK(ftune_adapter_load(&a1, m, p1));
        CHECK_OK(ftune_adapter_load(&a2, m, p2));
        CHECK_OK(ftune_adapter_load(&ao, other, p1));
    }
    ftune_adapter *bad = NULL;
    CHECK(ftune_adapter_load(&bad, m, tmpdir) != FTUNE_OK && bad == NULL); /* a directory without adapter_config.json */
    bytes before = snapshot(m);
    size_t n = n_logits(m);
    float *l0 = malloc(n * 4), *l1 = malloc(n * 4), *l2 = malloc(n * 4), *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    if (!a1 || !a2 || !ao) goto out;
    /* single-session references, one after the other */
    CHECK_OK(run_session(m, NULL, false, l0));
    CHECK_OK(run_session(m, a1, true, l1));
    CHECK_OK(run_session(m, a2, true, l2));
    double d1 = 0, d2 = 0, d12 = 0;
    for (size_t i = 0; i < n; i++) {
        d1 = fmax(d1, fabs(l1[i] - l0[i]));
        d2 = fmax(d2, fabs(l2[i] - l0[i]));
        d12 = fmax(d12, fabs(l1[i] - l2[i]));
    }
    printf("  max |logit change|: adapter 1 %.3g, adapter 2 %.3g, between them %.3g\n", d1, d2, d12);
    /* each adapter must matter (B ~ N(0, 0.05²) moves logits by ~1e-1), or equality proves nothing */
    CHECKF(d1 > 1e-2 && d2 > 1e-2 && d12 > 1e-2, "%g %g %g", d1, d2, d12);
    /* concurrently: two threads, each its own session and adapter, several times over */
    job j1 = { .m = m, .a = a1, .want = l1, .got = g1 }, j2 = { .m = m, .a = a2, .want = l2, .got = g2 };
    pthread_t t1, t2;
    bool th = pthread_create(&t1, NULL, worker, &j1) == 0;
    CHECK(th);
    CHECK(pthread_create(&t2, NULL, worker, &j2) == 0);
    if (th) pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(j1.st);
    CHECK_OK(j2.st);
    /* bit-identical: the same ops on the same inputs, only in another thread */
    CHECKF(j1.mismatches == 0 && j2.mismatches == 0, "%d and %d of %d runs differ", j1.mismatches, j2.mismatches, REPS);
    /* an adapter loaded for another model is refused; NULL returns to the base model */
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, 64, 1));
    if (s) {
        CHECK(ftune_session_set_adapter(s, ao) == FTUNE_ERR_ARG);
        CHECK_OK(ftune_session_set_adapter(s, a1));
        CHECK_OK(ftune_session_forward(s, toks, 3, NULL, 0));
        CHECK_OK(ftune_session_set_adapter(s, NULL));
        CHECK(ftune_session_pos(s) == 0); /* the cache held keys of the other adapter */
        CHECK_OK(ftune_session_forward(s, toks, T_TOK, g1, 1));
        CHECK(memcmp(g1, l0, (size_t)T_TOK * m->cfg.V * 4) == 0);
        ftune_session_free(s);
    }
    /* the model's default adapter: new sessions start with it, and it is not written into the model either */
    CHECK_OK(ftune_model_load_adapter(m, p1));
    CHECK_OK(run_session(m, NULL, false, g1));
    CHECK(memcmp(g1, l1, n * 4) == 0);
    CHECK_OK(run_session(m, NULL, true, g2)); /* set to none: the base model */
    CHECK(memcmp(g2, l0, n * 4) == 0);
    bytes after = snapshot(m);
    CHECK(before.n == after.n && memcmp(before.p, after.p, before.n) == 0);
    free(after.p);
out:
    free(before.p);
    free(l0); free(l1); free(l2); free(g1); free(g2);
    ftune_adapter_free(a1);
    ftune_adapter_free(a2);
    ftune_adapter_free(ao);
    ftune_adapter_free(NULL);
    ftune_model_free(m);
    ftune_model_free(other);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune-test-adapter-sessions-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    RUN(test_two_sessions_two_adapters);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
