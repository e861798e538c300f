/* test_backend.c — every op of the backend table (backend.h), forward and
 * backward, run through each backend under test on random inputs of awkward
 * sizes and compared with the reference backend (the plain C references,
 * themselves checked against float64 twins and finite differences in
 * test_ops.c). Inputs go to the backend through its alloc + upload and
 * results come back through download, so a device backend is tested as it
 * is used. Adding a backend = adding one line to `backends` below.
 *
 * Error measure: max |got - want| / max |want| over the tensor (normwise),
 * printed for every op and backend. */
#include "nn/backend.h"
#include "optim/optim.h"
#include "check.h"

static ft_backend cpu1(void) { return ft_backend_cpu(1); }
static ft_backend cpu3(void) { return ft_backend_cpu(3); }

static const struct {
    const char *label;
    ft_backend (*make)(void);
} backends[] = {
    { "cpu, 1 thread", cpu1 },
    { "cpu, 3 threads", cpu3 }, /* more threads than the 2 cores: schedules differ, results must not */
};
#define N_BACKENDS (int)(sizeof backends / sizeof backends[0])

/* Float sums of up to K ~ 128 terms in another order than the reference's
 * (which sums in double) are off by about sqrt(K)·2^-24 ≈ 1e-6 of the
 * tensor's scale for random normal inputs; 1e-5 leaves a 10x margin while a
 * missing term, a wrong index or a wrong stride gives errors of order 1e-2
 * or more. */
#define TOL_SUM 1e-5
/* Elementwise ops without reductions (RoPE with its angles in double,
 * SwiGLU, AdamW): a few float operations per element; another backend
 * contracting them into FMAs or using its own exp/sqrt differs by a few
 * ulp, 1e-6 of the scale. */
#define TOL_ELEM 1e-6

static ft_rng rng;

static float *rnd(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * ft_rng_normal(&rng);
    return x;
}
static float *dup_f(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* Backend buffers of one test, freed together. */
typedef struct {
    const ft_backend *be;
    void *p[64];
    size_t n[64];
    int k;
} bufs;

static float *up(bufs *b, const float *host, size_t n) {
    size_t bytes = n * sizeof(float);
    float *d = b->be->alloc(b->be, FT_MEM_SCRATCH, bytes);
    if (!d) { fprintf(stderr, "  %s: alloc of %zu bytes failed\n", b->be->name, bytes); exit(1); }
    if (host) b->be->upload(b->be, d, host, bytes);
    b->p[b->k] = d; b->n[b->k] = bytes; b->k++;
    return d;
}
static void *up_bytes(bufs *b, const void *host, size_t bytes) {
    void *d = b->be->alloc(b->be, FT_MEM_SCRATCH, bytes);
    if (!d) { fprintf(stderr, "  %s: alloc of %zu bytes failed\n", b->be->name, bytes); exit(1); }
    b->be->upload(b->be, d, host, bytes);
    b->p[b->k] = d; b->n[b->k] = bytes; b->k++;
    return d;
}
/* Downloads n floats into a new host array (after sync). */
static float *down(bufs *b, const float *d, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    b->be->sync(b->be);
    b->be->download(b->be, h, d, n * sizeof(float));
    return h;
}
static void free_bufs(bufs *b) {
    for (int i = 0; i < b->k; i++) b->be->free(b->be, FT_MEM_SCRATCH, b->p[i], b->n[i]);
    b->k = 0;
}

static double norm_err(const float *got, const float *want, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (isnan(d)) return INFINITY;
        m = d > m ? d : m;
        s = fabs(want[i]) > s ? fabs(want[i]) : s;
    }
    return s > 0 ? m / s : m;
}

/* Compares, prints the error, frees got. */
static void cmp(const char *be, const char *what, float *got, const float *want, size_t n, double tol) {
    double e = norm_err(got, want, n);
    printf("  %-15s %-34s max rel err %.2e (tol %.0e)\n", be, what, e, tol);
    CHECKF(e <= tol, "%s %s: %.3e > %.0e", be, what, e, tol);
    free(got);
}

/* ------------------------------------------------------------ buffers */

/* A backend fills every entry of the table (a missing one fails here,
 * not as a crash in the middle of a step). */
static void test_table_complete(void) {
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        CHECKF(be.name && be.name[0], "%s: no name", backends[bi].label);
#define HAS(f) CHECKF(be.f != NULL, "%s: no %s", backends[bi].label, #f)
        HAS(alloc); HAS(free); HAS(upload); HAS(download); HAS(copy); HAS(zero); HAS(sync);
        HAS(linear_scratch_floats); HAS(attention_scratch_floats);
        HAS(linear_forward); HAS(linear_forward_train); HAS(linear_backward);
        HAS(rmsnorm_forward); HAS(rmsnorm_backward); HAS(rope_forward); HAS(rope_backward);
        HAS(attention_forward); HAS(attention_backward); HAS(swiglu_forward); HAS(swiglu_backward);
        HAS(embedding_forward); HAS(embedding_backward); HAS(add); HAS(crossentropy); HAS(adamw_step);
#undef HAS
    }
}

static void test_buffers(void) {
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        size_t n = 1000 + 3, before = ft_mem_current(FT_MEM_ACTS);
        float *h = rnd(n, 1), *back = calloc(n, sizeof(float));
        float *a = be.alloc(&be, FT_MEM_ACTS, n * sizeof(float)), *b = be.alloc(&be, FT_MEM_ACTS, n * sizeof(float));
        void *z = be.alloc(&be, FT_MEM_ACTS, 0);
        CHECK(a && b && z);
        CHECK(((uintptr_t)a & 63) == 0);
        /* alloc counts the bytes against the class it is given */
        CHECK(ft_mem_current(FT_MEM_ACTS) >= before + 2 * n * sizeof(float));
        be.upload(&be, a, h, n * sizeof(float));
        be.copy(&be, b, a, n * sizeof(float));
        be.sync(&be);
        be.download(&be, back, b, n * sizeof(float));
        CHECK(memcmp(back, h, n * sizeof(float)) == 0);
        /* zero clears exactly the bytes it is given */
        be.zero(&be, b, 7 * sizeof(float));
        be.sync(&be);
        be.download(&be, back, b, n * sizeof(float));
        for (size_t i = 0; i < n; i++) CHECK(back[i] == (i < 7 ? 0.0f : h[i]));
        be.free(&be, FT_MEM_ACTS, a, n * sizeof(float));
        be.free(&be, FT_MEM_ACTS, b, n * sizeof(float));
        be.free(&be, FT_MEM_ACTS, z, 0);
        be.free(&be, FT_MEM_ACTS, NULL, 0);
        CHECK(ft_mem_current(FT_MEM_ACTS) == before);
        free(h); free(back);
    }
}

/* ------------------------------------------------------------ Linear */

typedef struct {
    ft_linear l;
    ft_lora lora;
    ft_adapter_hparams hp;        /* lora's */
    const ft_adapter_inst *ad;    /* &lora.base, or NULL: none */
    float *w32;                   /* (out, in) the f32 values the weight was made from */
} lin_case;

/* A Linear (in -> out) with weight dtype dt, a bias, and an adapter of rank
 * R (0: none) with dropout p and a random (non-zero) B. */
static void make_linear(lin_case *c, ft_dtype dt, int in, int out, int R, float p) {
    memset(c, 0, sizeof *c);
    c->w32 = rnd((size_t)out * in, 0.2f);
    size_t nb = (size_t)ft_dtype_nbytes(dt, (int64_t)out * in);
    void *w = malloc(nb);
    if (dt == FT_F32) memcpy(w, c->w32, nb);
    else ft_types[dt].from_f32(c->w32, w, (int64_t)out * in);
    c->l.w = (ft_tensor){ .dtype = dt, .ndim = 2, .shape = { out, in }, .data = w, .nbytes = nb };
    snprintf(c->l.w.name, sizeof c->l.w.name, "test.%s", ft_types[dt].name);
    c->l.bias = rnd((size_t)out, 0.5f);
    c->l.in = in; c->l.out = out;
    if (R > 0) {
        c->hp = (ft_adapter_hparams){ .r = R, .alpha = 2.0f * R, .dropout = p }; /* scale 2 */
        c->lora = (ft_lora){ .base = { .kind = &ft_lora_kind, .hp = &c->hp }, .A = rnd((size_t)R * in, 0.3f),
                             .B = rnd((size_t)out * R, 0.3f), .dA = rnd((size_t)R * in, 0.1f),
                             .dB = rnd((size_t)out * R, 0.1f) };
        c->ad = &c->lora.base;
    }
}
static void free_linear(lin_case *c) {
    free(c->l.w.data); free(c->l.bias); free(c->w32);
    if (c->ad) { free(c->lora.A); free(c->lora.B); free(c->lora.dA); free(c->lora.dB); }
}
/* c's Linear with every array on the backend (grads copied too). */
static ft_linear linear_on(bufs *b, const lin_case *c, ft_lora *lora, const ft_adapter_inst **ad) {
    ft_linear l = c->l;
    l.w.data = up_bytes(b, c->l.w.data, c->l.w.nbytes);
    l.bias = up(b, c->l.bias, (size_t)l.out);
    *ad = NULL;
    if (c->ad) {
        const ft_lora *a = &c->lora;
        *lora = *a;
        int R = a->base.hp->r;
        lora->A = up(b, a->A, (size_t)R * l.in); lora->B = up(b, a->B, (size_t)l.out * R);
        lora->dA = up(b, a->dA, (size_t)R * l.in); lora->dB = up(b, a->dB, (size_t)l.out * R);
        *ad = &lora->base;
    }
    return l;
}

static void linear_case(ft_dtype dt, int T, int in, int out, int R, float p) {
    char what[96];
    lin_case c;
    make_linear(&c, dt, in, out, R, p);
    ft_backend ref = ft_backend_ref();
    size_t ni = (size_t)T * in, no = (size_t)T * out, nu = (size_t)T * (R ? R : 1);
    float *x = rnd(ni, 1), *dout = rnd(no, 1), *dinp0 = rnd(ni, 1);
    float *dw0 = rnd((size_t)out * in, 0.1f), *db0 = rnd((size_t)out, 0.1f);
    uint64_t seed = 0x5eed0000u + (uint64_t)T * 31 + in;
    /* the oracle, on host arrays */
    float *r_out = calloc(no, 4), *r_outt = calloc(no, 4), *r_u = calloc(nu, 4), *r_dinp = dup_f(dinp0, ni);
    float *r_dinp2 = calloc(ni, 4), *r_dw = dup_f(dw0, (size_t)out * in), *r_db = dup_f(db0, (size_t)out);
    float *dA0 = R ? dup_f(c.lora.dA, (size_t)R * in) : NULL, *dB0 = R ? dup_f(c.lora.dB, (size_t)out * R) : NULL;
    ref.linear_forward(&ref, r_out, x, &c.l, c.ad, T, NULL);
    ref.linear_forward_train(&ref, r_outt, R ? r_u : NULL, x, &c.l, c.ad, T, seed, NULL);
    bool f32 = dt == FT_F32;
    ref.linear_backward(&ref, r_dinp, f32 ? r_dw : NULL, r_db, dout, x, R ? r_u : NULL, &c.l, c.ad, T, seed, true, NULL);
    float *r_dA = R ? dup_f(c.lora.dA, (size_t)R * in) : NULL, *r_dB = R ? dup_f(c.lora.dB, (size_t)out * R) : NULL;
    if (R) { memcpy(c.lora.dA, dA0, (size_t)R * in * 4); memcpy(c.lora.dB, dB0, (size_t)out * R * 4); }
    ref.linear_backward(&ref, r_dinp2, NULL, NULL, dout, x, R ? r_u : NULL, &c.l, c.ad, T, seed, false, NULL);
    if (R) { memcpy(c.lora.dA, dA0, (size_t)R * in * 4); memcpy(c.lora.dB, dB0, (size_t)out * R * 4); }
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        const char *bn = backends[bi].label;
        bufs b = { .be = &be };
        ft_lora lora;
        const ft_adapter_inst *ad;
        ft_linear l = linear_on(&b, &c, &lora, &ad);
        float *scr = up(&b, NULL, be.linear_scratch_floats(&be, in, R, T, true));
        float *d_x = up(&b, x, ni), *d_dout = up(&b, dout, no), *d_out = up(&b, NULL, no), *d_u = up(&b, NULL, nu);
        float *d_dinp = up(&b, dinp0, ni), *d_dinp2 = up(&b, dinp0, ni), *d_dw = up(&b, dw0, (size_t)out * in);
        float *d_db = up(&b, db0, (size_t)out);
        const char *dn = ft_types[dt].name;
        be.linear_forward(&be, d_out, d_x, &l, ad, T, scr);
        snprintf(what, sizeof what, "linear fwd %s T%d %dx%d R%d", dn, T, in, out, R);
        cmp(bn, what, down(&b, d_out, no), r_out, no, TOL_SUM);
        be.linear_forward_train(&be, d_out, R ? d_u : NULL, d_x, &l, ad, T, seed, scr);
        snprintf(what, sizeof what, "linear train fwd %s T%d p%.2f", dn, T, p);
        cmp(bn, what, down(&b, d_out, no), r_outt, no, TOL_SUM);
        if (R) cmp(bn, "  u", down(&b, d_u, (size_t)T * R), r_u, (size_t)T * R, TOL_SUM);
        be.linear_backward(&be, d_dinp, f32 ? d_dw : NULL, d_db, d_dout, d_x, R ? d_u : NULL, &l, ad, T, seed, true, scr);
        snprintf(what, sizeof what, "linear bwd %s T%d (+=) dinp", dn, T);
        cmp(bn, what, down(&b, d_dinp, ni), r_dinp, ni, TOL_SUM);
        if (f32) cmp(bn, "  dw", down(&b, d_dw, (size_t)out * in), r_dw, (size_t)out * in, TOL_SUM);
        cmp(bn, "  dbias", down(&b, d_db, (size_t)out), r_db, (size_t)out, TOL_SUM);
        if (R) {
            cmp(bn, "  dA", down(&b, lora.dA, (size_t)R * in), r_dA, (size_t)R * in, TOL_SUM);
            cmp(bn, "  dB", down(&b, lora.dB, (size_t)out * R), r_dB, (size_t)out * R, TOL_SUM);
            be.upload(&be, lora.dA, dA0, (size_t)R * in * 4);
            be.upload(&be, lora.dB, dB0, (size_t)out * R * 4);
        }
        be.linear_backward(&be, d_dinp2, NULL, NULL, d_dout, d_x, R ? d_u : NULL, &l, ad, T, seed, false, scr);
        cmp(bn, "  dinp (overwrite)", down(&b, d_dinp2, ni), r_dinp2, ni, TOL_SUM);
        free_bufs(&b);
    }
    free(x); free(dout); free(dinp0); free(dw0); free(db0); free(r_out); free(r_outt); free(r_u); free(r_dinp);
    free(r_dinp2); free(r_dw); free(r_db); free(dA0); free(dB0); free(r_dA); free(r_dB);
    free_linear(&c);
}

static void test_linear(void) {
    linear_case(FT_F32, 1, 67, 45, 0, 0);       /* one row: the decode path */
    linear_case(FT_F32, 37, 67, 45, 3, 0.25f);  /* LoRA with dropout, bias */
    linear_case(FT_F32, 5, 129, 31, 2, 0);
    linear_case(FT_BF16, 1, 67, 45, 0, 0);
    linear_case(FT_BF16, 23, 67, 45, 4, 0.1f);
    linear_case(FT_Q8_0, 1, 96, 45, 0, 0);      /* q8_0 needs whole blocks of 32 */
    linear_case(FT_Q8_0, 19, 96, 45, 3, 0);
}

/* ------------------------------------------------------------ layers */

static void test_rmsnorm(void) {
    int T = 13, C = 75;
    float eps = 1e-5f;
    ft_backend ref = ft_backend_ref();
    float *x = rnd((size_t)T * C, 2), *w = rnd(C, 1), *dout = rnd((size_t)T * C, 1);
    float *dinp0 = rnd((size_t)T * C, 1), *dw0 = rnd(C, 1);
    float *r_out = calloc((size_t)T * C, 4), *r_rstd = calloc(T, 4);
    float *r_dinp = dup_f(dinp0, (size_t)T * C), *r_dw = dup_f(dw0, C);
    ref.rmsnorm_forward(&ref, r_out, r_rstd, x, w, T, C, eps);
    ref.rmsnorm_backward(&ref, r_dinp, r_dw, dout, x, w, r_rstd, T, C);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        float *d_x = up(&b, x, (size_t)T * C), *d_w = up(&b, w, C), *d_dout = up(&b, dout, (size_t)T * C);
        float *d_out = up(&b, NULL, (size_t)T * C), *d_rstd = up(&b, NULL, T);
        float *d_dinp = up(&b, dinp0, (size_t)T * C), *d_dw = up(&b, dw0, C);
        be.rmsnorm_forward(&be, d_out, d_rstd, d_x, d_w, T, C, eps);
        cmp(backends[bi].label, "rmsnorm fwd out", down(&b, d_out, (size_t)T * C), r_out, (size_t)T * C, TOL_SUM);
        cmp(backends[bi].label, "  rstd", down(&b, d_rstd, T), r_rstd, T, TOL_SUM);
        be.rmsnorm_backward(&be, d_dinp, d_dw, d_dout, d_x, d_w, d_rstd, T, C);
        cmp(backends[bi].label, "rmsnorm bwd dinp (+=)", down(&b, d_dinp, (size_t)T * C), r_dinp, (size_t)T * C,
            TOL_SUM);
        cmp(backends[bi].label, "  dw (+=)", down(&b, d_dw, C), r_dw, C, TOL_SUM);
        free_bufs(&b);
    }
    free(x); free(w); free(dout); free(dinp0); free(dw0); free(r_out); free(r_rstd); free(r_dinp); free(r_dw);
}

static void test_rope(void) {
    int T = 11, NH = 3, HS = 14;
    ft_backend ref = ft_backend_ref();
    float inv[7];
    ft_rope_freqs(inv, HS, 10000.0f, NULL);
    int pos[11];
    for (int t = 0; t < T; t++) pos[t] = 3 * t + (t % 4) * 100; /* not monotone, some far positions */
    for (int il = 0; il < 2; il++) {
        size_t n = (size_t)T * NH * HS;
        float *x = rnd(n, 1), *r_f = dup_f(x, n), *r_b = dup_f(x, n);
        ref.rope_forward(&ref, r_f, pos, inv, T, NH, HS, il);
        ref.rope_backward(&ref, r_b, pos, inv, T, NH, HS, il);
        for (int bi = 0; bi < N_BACKENDS; bi++) {
            ft_backend be = backends[bi].make();
            bufs b = { .be = &be };
            float *d_inv = up(&b, inv, HS / 2), *d_x = up(&b, x, n);
            be.rope_forward(&be, d_x, pos, d_inv, T, NH, HS, il);
            cmp(backends[bi].label, il ? "rope fwd (interleaved)" : "rope fwd (rotate-half)", down(&b, d_x, n), r_f,
                n, TOL_ELEM);
            be.upload(&be, d_x, x, n * 4);
            be.rope_backward(&be, d_x, pos, d_inv, T, NH, HS, il);
            cmp(backends[bi].label, "  bwd", down(&b, d_x, n), r_b, n, TOL_ELEM);
            free_bufs(&b);
        }
        free(x); free(r_f); free(r_b);
    }
}

static void test_swiglu(void) {
    int T = 9, F = 83;
    size_t n = (size_t)T * F;
    ft_backend ref = ft_backend_ref();
    float *g = rnd(n, 3), *u = rnd(n, 1), *dout = rnd(n, 1);
    float *r_out = calloc(n, 4), *r_dg = calloc(n, 4), *r_du = calloc(n, 4);
    ref.swiglu_forward(&ref, r_out, g, u, T, F);
    ref.swiglu_backward(&ref, r_dg, r_du, dout, g, u, T, F);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        float *d_g = up(&b, g, n), *d_u = up(&b, u, n), *d_dout = up(&b, dout, n);
        float *d_out = up(&b, NULL, n), *d_dg = up(&b, NULL, n), *d_du = up(&b, NULL, n);
        be.swiglu_forward(&be, d_out, d_g, d_u, T, F);
        cmp(backends[bi].label, "swiglu fwd", down(&b, d_out, n), r_out, n, TOL_ELEM);
        be.swiglu_backward(&be, d_dg, d_du, d_dout, d_g, d_u, T, F);
        cmp(backends[bi].label, "  bwd dgate", down(&b, d_dg, n), r_dg, n, TOL_ELEM);
        cmp(backends[bi].label, "  bwd dup", down(&b, d_du, n), r_du, n, TOL_ELEM);
        free_bufs(&b);
    }
    free(g); free(u); free(dout); free(r_out); free(r_dg); free(r_du);
}

/* B rows of T queries over Tk keys; q_pos[t] = Tk - T + t (a cache, or
 * Tk = T in training); doc ids split every row into documents. */
static void attention_case(int B, int T, int Tk, int NH, int NKV, int HS, bool docs, int pad) {
    char what[96];
    ft_backend ref = ft_backend_ref();
    size_t qd = (size_t)NH * HS, kvd = (size_t)NKV * HS, stride = kvd + pad;
    size_t nq = (size_t)B * T * qd, nk = (size_t)B * Tk * kvd, nl = (size_t)B * NH * T;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *dout = rnd(nq, 1);
    float *ks = rnd((size_t)B * Tk * stride, 1), *vs = rnd((size_t)B * Tk * stride, 1); /* strided copies */
    for (size_t r = 0; r < (size_t)B * Tk; r++) {
        memcpy(ks + r * stride, k + r * kvd, kvd * 4);
        memcpy(vs + r * stride, v + r * kvd, kvd * 4);
    }
    int *q_pos = malloc(T * sizeof(int)), *doc = malloc((size_t)B * Tk * sizeof(int));
    for (int t = 0; t < T; t++) q_pos[t] = Tk - T + t;
    for (int bb = 0; bb < B; bb++)
        for (int j = 0; j < Tk; j++) doc[bb * Tk + j] = (j + bb) / 4;
    const int *dc = docs ? doc : NULL;
    float *r_out = calloc(nq, 4), *r_lse = calloc(nl, 4), *r_dq = calloc(nq, 4), *r_dk = calloc(nk, 4);
    float *r_dv = calloc(nk, 4);
    ref.attention_forward(&ref, r_out, r_lse, q, ks, vs, q_pos, dc, B, T, Tk, NH, NKV, HS, (int)stride, NULL);
    ref.attention_backward(&ref, r_dq, r_dk, r_dv, dout, r_lse, q, k, v, q_pos, dc, B, T, Tk, NH, NKV, HS, NULL);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        const char *bn = backends[bi].label;
        bufs b = { .be = &be };
        float *scr = up(&b, NULL, be.attention_scratch_floats(&be, Tk, HS, true));
        float *d_q = up(&b, q, nq), *d_k = up(&b, k, nk), *d_v = up(&b, v, nk), *d_dout = up(&b, dout, nq);
        float *d_ks = up(&b, ks, (size_t)B * Tk * stride), *d_vs = up(&b, vs, (size_t)B * Tk * stride);
        float *d_out = up(&b, NULL, nq), *d_lse = up(&b, NULL, nl);
        float *d_dq = up(&b, NULL, nq), *d_dk = up(&b, NULL, nk), *d_dv = up(&b, NULL, nk);
        be.attention_forward(&be, d_out, d_lse, d_q, d_ks, d_vs, q_pos, dc, B, T, Tk, NH, NKV, HS, (int)stride, scr);
        snprintf(what, sizeof what, "attention fwd B%d T%d Tk%d %d/%d HS%d%s", B, T, Tk, NH, NKV, HS,
                 docs ? " docs" : "");
        cmp(bn, what, down(&b, d_out, nq), r_out, nq, TOL_SUM);
        cmp(bn, "  lse", down(&b, d_lse, nl), r_lse, nl, TOL_SUM);
        /* backward from this backend's own forward statistics, packed keys */
        be.attention_forward(&be, d_out, d_lse, d_q, d_k, d_v, q_pos, dc, B, T, Tk, NH, NKV, HS, (int)kvd, scr);
        be.attention_backward(&be, d_dq, d_dk, d_dv, d_dout, d_lse, d_q, d_k, d_v, q_pos, dc, B, T, Tk, NH, NKV, HS,
                              scr);
        cmp(bn, "  bwd dq", down(&b, d_dq, nq), r_dq, nq, TOL_SUM);
        cmp(bn, "  bwd dk", down(&b, d_dk, nk), r_dk, nk, TOL_SUM);
        cmp(bn, "  bwd dv", down(&b, d_dv, nk), r_dv, nk, TOL_SUM);
        free_bufs(&b);
    }
    free(q); free(k); free(v); free(dout); free(ks); free(vs); free(q_pos); free(doc);
    free(r_out); free(r_lse); free(r_dq); free(r_dk); free(r_dv);
}

static void test_attention(void) {
    attention_case(2, 7, 7, 4, 2, 10, false, 0);  /* training: own keys */
    attention_case(3, 9, 9, 6, 2, 12, true, 0);   /* packed documents */
    attention_case(1, 5, 13, 4, 4, 8, false, 5);  /* a cache: strided rows, queries late in it */
    attention_case(2, 1, 17, 2, 1, 16, false, 0); /* decode: one query */
}

/* Exact: a row copy (bf16 widens to f32 exactly); backward adds at most a
 * few rows into one, in token order on both backends, but a device backend
 * may add them in another order: with |rows| ~ 1 and at most 4 repeats,
 * that moves the sum by < 4·2^-24 ≈ 2.4e-7 of the scale, so 1e-6. */
static void test_embedding(void) {
    int V = 29, C = 19, T = 23;
    ft_backend ref = ft_backend_ref();
    int32_t tok[23];
    for (int t = 0; t < T; t++) tok[t] = (t * 7 + 3) % V; /* some tokens repeat */
    float *w32 = rnd((size_t)V * C, 1), *dout = rnd((size_t)T * C, 1), *dw0 = rnd((size_t)V * C, 1);
    uint16_t *w16 = malloc((size_t)V * C * 2);
    ft_types[FT_BF16].from_f32(w32, w16, (int64_t)V * C);
    ft_tensor t32 = { .dtype = FT_F32, .ndim = 2, .shape = { V, C }, .data = w32, .nbytes = (size_t)V * C * 4 };
    ft_tensor t16 = { .dtype = FT_BF16, .ndim = 2, .shape = { V, C }, .data = w16, .nbytes = (size_t)V * C * 2 };
    float *r32 = calloc((size_t)T * C, 4), *r16 = calloc((size_t)T * C, 4), *r_dw = dup_f(dw0, (size_t)V * C);
    ref.embedding_forward(&ref, r32, tok, &t32, T);
    ref.embedding_forward(&ref, r16, tok, &t16, T);
    CHECK(ref.embedding_backward(&ref, r_dw, dout, tok, T, C, V) == FTUNE_OK);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        ft_tensor d32 = t32, d16 = t16;
        d32.data = up_bytes(&b, w32, t32.nbytes);
        d16.data = up_bytes(&b, w16, t16.nbytes);
        float *d_out = up(&b, NULL, (size_t)T * C), *d_dout = up(&b, dout, (size_t)T * C);
        float *d_dw = up(&b, dw0, (size_t)V * C);
        be.embedding_forward(&be, d_out, tok, &d32, T);
        cmp(backends[bi].label, "embedding fwd f32", down(&b, d_out, (size_t)T * C), r32, (size_t)T * C, 0);
        be.embedding_forward(&be, d_out, tok, &d16, T);
        cmp(backends[bi].label, "embedding fwd bf16", down(&b, d_out, (size_t)T * C), r16, (size_t)T * C, 0);
        CHECK(be.embedding_backward(&be, d_dw, d_dout, tok, T, C, V) == FTUNE_OK);
        cmp(backends[bi].label, "embedding bwd (+=)", down(&b, d_dw, (size_t)V * C), r_dw, (size_t)V * C, 1e-6);
        /* a token outside the vocabulary is refused and changes nothing */
        int32_t bad[2] = { 1, V };
        CHECK(be.embedding_backward(&be, d_dw, d_dout, bad, 2, C, V) == FTUNE_ERR_RANGE);
        cmp(backends[bi].label, "  unchanged by a bad token", down(&b, d_dw, (size_t)V * C), r_dw, (size_t)V * C,
            1e-6);
        free_bufs(&b);
    }
    free(w32); free(w16); free(dout); free(dw0); free(r32); free(r16); free(r_dw);
}

/* Exact: one float addition per element, on every backend. */
static void test_add(void) {
    size_t n = 1000 + 17;
    float *y = rnd(n, 1), *x = rnd(n, 1), *want = dup_f(y, n);
    ft_backend ref = ft_backend_ref();
    ref.add(&ref, want, x, n);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        float *d_y = up(&b, y, n), *d_x = up(&b, x, n);
        be.add(&be, d_y, d_x, n);
        cmp(backends[bi].label, "add (residual)", down(&b, d_y, n), want, n, 0);
        free_bufs(&b);
    }
    free(y); free(x); free(want);
}

/* The loss sums rows in double; each row's log-sum-exp is in double from
 * exps the fast path takes in float within ~2 ulp: relative error ~1e-7 per
 * row, so 1e-6 for the summed loss. dlogits = (softmax - onehot)·scale with
 * the same float exps: within a few ulp of the scale, so TOL_ELEM. */
static void test_crossentropy(void) {
    int T = 9, V = 1003;
    ft_backend ref = ft_backend_ref();
    float *lg = rnd((size_t)T * V, 3);
    int tg[9] = { 5, -1, 1002, 0, -100, 77, 500, 3, 999 };
    float *r_d = calloc((size_t)T * V, 4);
    float scale = 1.0f / 7;
    double r_loss = ref.crossentropy(&ref, r_d, lg, tg, T, V, scale);
    double r_loss2 = ref.crossentropy(&ref, NULL, lg, tg, T, V, scale);
    CHECK(r_loss == r_loss2);
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        float *d_lg = up(&b, lg, (size_t)T * V), *d_d = up(&b, NULL, (size_t)T * V);
        double loss = be.crossentropy(&be, d_d, d_lg, tg, T, V, scale);
        double loss_f = be.crossentropy(&be, NULL, d_lg, tg, T, V, scale);
        double e = fabs(loss - r_loss) / fabs(r_loss), ef = fabs(loss_f - r_loss) / fabs(r_loss);
        printf("  %-15s %-34s rel err %.2e, without dlogits %.2e (tol 1e-06)\n", backends[bi].label,
               "crossentropy loss", e, ef);
        CHECKF(e <= 1e-6 && ef <= 1e-6, "loss %.9g vs %.9g", loss, r_loss);
        cmp(backends[bi].label, "  dlogits", down(&b, d_d, (size_t)T * V), r_d, (size_t)T * V, TOL_ELEM);
        free_bufs(&b);
    }
    free(lg); free(r_d);
}

/* ------------------------------------------------------------ optimizer */

static void test_adamw(void) {
    int64_t n0 = 1001, n1 = 70001; /* the second takes the threaded loop (> 65536) */
    float *w0 = rnd(n0, 1), *w1 = rnd(n1, 1), *g0 = rnd(n0, 1), *g1 = rnd(n1, 0.01f);
    ft_adamw_cfg cfg;
    ft_adamw_defaults(&cfg);
    cfg.weight_decay = 0.1;
    /* the oracle on host copies */
    ft_param p[2] = { { .name = "a", .data = dup_f(w0, n0), .grad = g0, .numel = n0, .ndim = 1, .shape = { n0 },
                        .decay = true },
                      { .name = "b", .data = dup_f(w1, n1), .grad = g1, .numel = n1, .ndim = 1, .shape = { n1 },
                        .decay = false } };
    ft_backend ref = ft_backend_ref();
    ft_adamw ro;
    CHECK_OK(ft_adamw_init(&ro, p, 2, &cfg));
    for (int s = 0; s < 3; s++) ref.adamw_step(&ref, &ro, 1e-2 / (s + 1));
    for (int bi = 0; bi < N_BACKENDS; bi++) {
        ft_backend be = backends[bi].make();
        bufs b = { .be = &be };
        ft_param q[2] = { p[0], p[1] };
        q[0].data = up(&b, w0, n0); q[0].grad = up(&b, g0, n0);
        q[1].data = up(&b, w1, n1); q[1].grad = up(&b, g1, n1);
        ft_adamw o;
        CHECK_OK(ft_adamw_init(&o, q, 2, &cfg));
        for (int s = 0; s < 3; s++) be.adamw_step(&be, &o, 1e-2 / (s + 1));
        CHECK(o.step == 3);
        cmp(backends[bi].label, "adamw 3 steps: weights (decay)", down(&b, q[0].data, n0), ro.params[0].data, n0,
            TOL_ELEM);
        cmp(backends[bi].label, "  weights (no decay)", down(&b, q[1].data, n1), ro.params[1].data, n1, TOL_ELEM);
        /* ft_adamw_init keeps m and v in host memory: a device backend will
         * need them as backend buffers (then download them here) */
        cmp(backends[bi].label, "  m", dup_f(o.m[1], n1), ro.m[1], n1, TOL_ELEM);
        cmp(backends[bi].label, "  v", dup_f(o.v[0], n0), ro.v[0], n0, TOL_ELEM);
        ft_adamw_free(&o);
        free_bufs(&b);
    }
    ft_adamw_free(&ro);
    free(p[0].data); free(p[1].data); free(w0); free(w1); free(g0); free(g1);
}

int main(void) {
    ft_rng_seed(&rng, 20261201);
    RUN(test_table_complete);
    RUN(test_buffers);
    RUN(test_linear);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_attention);
    RUN(test_embedding);
    RUN(test_add);
    RUN(test_crossentropy);
    RUN(test_adamw);
    CHECK_EXIT();
}
