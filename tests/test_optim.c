/* test_optim.c — AdamW, gradient clipping and the warmup schedules replayed
 * against trajectories that scripts/ref_optim.py computes with
 * torch.optim.AdamW, clip_grad_norm_ and LambdaLR; the schedules' formulas
 * at their edges; the optimizer state's checkpoint (save, load, resume
 * bit-exactly) and its validation of names, shapes and metadata. */
#include "check.h"
#include "optim/optim.h"
#include "formats/safetensors.h"

#include <stdint.h>
#include <unistd.h>

static char tmpdir[512];

/* ------------------------------------------------------------- reference file */

typedef struct {
    int kind, warmup, total, n_steps, n_params;
    double lr, min_lr, beta1, beta2, eps, wd, max_norm;
    int numel[8], decay[8];
    float *init[8];
    double *lr_used, *norm;   /* (n_steps) */
    float **grad, **after;    /* (n_steps * n_params) */
} scen;

typedef struct { const uint8_t *p; size_t n, at; bool bad; } rd;
static void rd_get(rd *r, void *dst, size_t k) {
    if (r->bad || r->at + k > r->n) { r->bad = true; memset(dst, 0, k); return; }
    memcpy(dst, r->p + r->at, k);
    r->at += k;
}
static int32_t rd_i32(rd *r) { int32_t v; rd_get(r, &v, 4); return v; }
static double rd_f64(rd *r) { double v; rd_get(r, &v, 8); return v; }
static float *rd_floats(rd *r, int n) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (n > 0 && n < (1 << 24)) rd_get(r, v, (size_t)n * 4);
    else r->bad = true;
    return v;
}

static int read_ref(const char *path, scen *sc, int max_sc) {
    char *buf;
    size_t n;
    if (ft_read_file(path, &buf, &n)) return -1;
    rd r = { (const uint8_t *)buf, n, 0, false };
    char magic[8];
    rd_get(&r, magic, 8);
    int ns = rd_i32(&r);
    if (memcmp(magic, "FTOPT001", 8) || ns < 1 || ns > max_sc) { free(buf); return -1; }
    for (int s = 0; s < ns && !r.bad; s++) {
        scen *c = &sc[s];
        c->kind = rd_i32(&r); c->warmup = rd_i32(&r); c->total = rd_i32(&r);
        c->n_steps = rd_i32(&r); c->n_params = rd_i32(&r);
        if (c->n_params < 1 || c->n_params > 8 || c->n_steps < 1 || c->n_steps > 1000) { r.bad = true; break; }
        c->lr = rd_f64(&r); c->min_lr = rd_f64(&r); c->beta1 = rd_f64(&r); c->beta2 = rd_f64(&r);
        c->eps = rd_f64(&r); c->wd = rd_f64(&r); c->max_norm = rd_f64(&r);
        for (int p = 0; p < c->n_params; p++) {
            c->numel[p] = rd_i32(&r);
            c->decay[p] = rd_i32(&r);
            c->init[p] = rd_floats(&r, c->numel[p]);
        }
        c->lr_used = malloc((size_t)c->n_steps * sizeof(double));
        c->norm = malloc((size_t)c->n_steps * sizeof(double));
        c->grad = calloc((size_t)c->n_steps * c->n_params, sizeof(float *));
        c->after = calloc((size_t)c->n_steps * c->n_params, sizeof(float *));
        for (int t = 0; t < c->n_steps; t++) {
            c->lr_used[t] = rd_f64(&r);
            c->norm[t] = rd_f64(&r);
            for (int p = 0; p < c->n_params; p++) {
                c->grad[t * c->n_params + p] = rd_floats(&r, c->numel[p]);
                c->after[t * c->n_params + p] = rd_floats(&r, c->numel[p]);
            }
        }
    }
    bool bad = r.bad || r.at != r.n;
    free(buf);
    return bad ? -1 : ns;
}

static scen ref[4];
static int n_ref = 0;

/* Parameter descriptors over freshly allocated data/grad buffers. */
static void make_params(const scen *c, ft_param *ps, const char *prefix) {
    for (int p = 0; p < c->n_params; p++) {
        memset(&ps[p], 0, sizeof ps[p]);
        snprintf(ps[p].name, sizeof ps[p].name, "%s.%d.weight", prefix, p);
        ps[p].numel = c->numel[p];
        ps[p].ndim = 1;
        ps[p].shape[0] = c->numel[p];
        ps[p].decay = c->decay[p];
        ps[p].data = malloc((size_t)c->numel[p] * sizeof(float));
        ps[p].grad = malloc((size_t)c->numel[p] * sizeof(float));
        memcpy(ps[p].data, c->init[p], (size_t)c->numel[p] * sizeof(float));
    }
}
static void free_params(ft_param *ps, int n) {
    for (int p = 0; p < n; p++) { free(ps[p].data); free(ps[p].grad); }
}
static void cfg_of(const scen *c, ft_adamw_cfg *cfg, ft_sched *s) {
    ft_adamw_defaults(cfg);
    cfg->beta1 = c->beta1; cfg->beta2 = c->beta2; cfg->eps = c->eps; cfg->weight_decay = c->wd;
    memset(s, 0, sizeof *s);
    s->kind = (ft_sched_kind)c->kind;
    s->lr = c->lr; s->min_lr = c->min_lr; s->warmup_steps = c->warmup; s->total_steps = c->total;
}

/* One training step as the HF Trainer orders it: clip, update with this
 * step's scheduled learning rate. Returns the pre-clip norm. */
static double replay_step(const scen *c, ft_adamw *o, const ft_sched *s, ft_param *ps, int t) {
    for (int p = 0; p < c->n_params; p++)
        memcpy(ps[p].grad, c->grad[t * c->n_params + p], (size_t)c->numel[p] * sizeof(float));
    double norm = ft_clip_grad_norm(ps, c->n_params, c->max_norm);
    ft_adamw_step(o, ft_sched_lr(s, t));
    return norm;
}

static void test_adamw_matches_torch(void) {
    CHECK(n_ref == 3);
    for (int si = 0; si < n_ref; si++) {
        const scen *c = &ref[si];
        ft_param ps[8];
        make_params(c, ps, "p");
        ft_adamw_cfg cfg;
        ft_sched s;
        cfg_of(c, &cfg, &s);
        ft_adamw o;
        CHECK_OK(ft_adamw_init(&o, ps, c->n_params, &cfg));
        double max_lr = 0, max_norm = 0, max_p = 0;
        int clipped = 0;
        for (int t = 0; t < c->n_steps; t++) {
            double lr = ft_sched_lr(&s, t);
            max_lr = fmax(max_lr, fabs(lr - c->lr_used[t]) / fmax(c->lr_used[t], 1e-300));
            double norm = replay_step(c, &o, &s, ps, t);
            max_norm = fmax(max_norm, fabs(norm - c->norm[t]) / c->norm[t]);
            if (c->max_norm > 0 && norm > c->max_norm) clipped++;
            for (int p = 0; p < c->n_params; p++)
                /* floor 0.01: the values are O(1), so an error below 1e-8 absolute on a value near zero is rounding */
                max_p = fmax(max_p, check_max_rel_err(ps[p].data, c->after[t * c->n_params + p], c->numel[p], 0.01));
        }
        printf("  scenario %d (schedule %d, %d steps, %d clipped): lr rel err %.2g, norm rel err %.2g, params max rel err %.2g\n",
               si, c->kind, c->n_steps, clipped, max_lr, max_norm, max_p);
        /* lr: the same double formula as the Python one; only libm's cos may differ in the last bits */
        CHECKF(max_lr <= 1e-12, "scenario %d lr rel err %g", si, max_lr);
        /* norm: torch accumulates it in float32, we in double: float32 rounding of a sum of ~300 squares */
        CHECKF(max_norm <= 1e-5, "scenario %d norm rel err %g", si, max_norm);
        /* params: float32 arithmetic in the same order as torch; a few ulps (1.2e-7 each) over 10 steps */
        CHECKF(max_p <= 1e-6, "scenario %d params rel err %g", si, max_p);
        CHECK(o.step == c->n_steps);
        if (c->max_norm > 0) CHECKF(clipped > 0 && clipped < c->n_steps, "scenario %d clipped %d", si, clipped);
        ft_adamw_free(&o);
        free_params(ps, c->n_params);
    }
}

static void test_schedule_edges(void) {
    ft_sched s = { .kind = FT_SCHED_COSINE, .lr = 1.0, .min_lr = 0.0, .warmup_steps = 4, .total_steps = 12 };
    /* HF: warmup factor step/warmup, so step 0 has lr 0 */
    CHECK(ft_sched_lr(&s, 0) == 0.0);
    CHECK(fabs(ft_sched_lr(&s, 2) - 0.5) < 1e-15);        /* exact in binary; 1e-15 allows one rounding */
    CHECK(fabs(ft_sched_lr(&s, 4) - 1.0) < 1e-15);        /* peak at the end of warmup */
    CHECK(fabs(ft_sched_lr(&s, 8) - 0.5) < 1e-15);        /* half way through the cosine: cos(pi/2) = 6e-17 */
    CHECK(fabs(ft_sched_lr(&s, 12)) < 1e-15);             /* reaches 0 at total_steps */
    CHECK(fabs(ft_sched_lr(&s, 20)) < 1e-15);             /* and stays there (HF's cosine would rise again) */
    s.min_lr = 0.1;
    CHECK(fabs(ft_sched_lr(&s, 12) - 0.1) < 1e-15);       /* the floor */
    CHECK(fabs(ft_sched_lr(&s, 8) - 0.55) < 1e-15);       /* 0.5·(1 - 0.1) + 0.1 */
    s.kind = FT_SCHED_LINEAR;
    s.min_lr = 0;
    CHECK(fabs(ft_sched_lr(&s, 8) - 0.5) < 1e-15);        /* (12 - 8) / (12 - 4) */
    CHECK(ft_sched_lr(&s, 13) == 0.0);
    s.kind = FT_SCHED_CONSTANT;
    CHECK(fabs(ft_sched_lr(&s, 1) - 0.25) < 1e-15);
    CHECK(ft_sched_lr(&s, 100) == 1.0);
    s.warmup_steps = 0;
    CHECK(ft_sched_lr(&s, 0) == 1.0);                     /* no warmup: full lr from the first step */
    ft_sched_kind k;
    CHECK_OK(ft_sched_kind_parse("cosine", &k));
    CHECK(k == FT_SCHED_COSINE);
    CHECK(ft_sched_kind_parse("cosin", &k) == FTUNE_ERR_ARG);
    CHECK(strstr(ftune_last_error(), "cosin") != NULL);
}

static void test_clip_nonfinite(void) {
    float d[3] = { 0 }, g[3] = { 1, NAN, 2 };
    ft_param p = { .name = "x", .data = d, .grad = g, .numel = 3, .ndim = 1, .shape = { 3 } };
    double n = ft_clip_grad_norm(&p, 1, 1.0);
    CHECK(isnan(n));
    CHECK(g[0] == 1 && g[2] == 2); /* left alone so the caller can skip the step */
    float g2[2] = { 3, 4 };
    ft_param q = { .name = "y", .data = d, .grad = g2, .numel = 2, .ndim = 1, .shape = { 2 } };
    CHECK(ft_clip_grad_norm(&q, 1, 0) == 5.0); /* measure only */
    CHECK(g2[0] == 3 && g2[1] == 4);
    CHECK(ft_clip_grad_norm(&q, 1, 1.0) == 5.0);
    /* scaled by 1/(5 + 1e-6): 0.6 and 0.8 to float rounding (6e-8 relative) */
    CHECK(fabs(g2[0] - 0.6) < 1e-6 && fabs(g2[1] - 0.8) < 1e-6);
}

/* Runs 4 steps, saves, continues in a fresh optimizer loaded from the file:
 * the result equals an uninterrupted run bit for bit. */
static void test_checkpoint_resume(void) {
    const scen *c = &ref[0];
    ft_param a[8], b[8];
    make_params(c, a, "base_model.model.layers");
    make_params(c, b, "base_model.model.layers");
    /* 2-D shapes for the state file */
    a[0].ndim = b[0].ndim = 2;
    a[0].shape[0] = b[0].shape[0] = 4;
    a[0].shape[1] = b[0].shape[1] = c->numel[0] / 4;
    ft_adamw_cfg cfg;
    ft_sched s;
    cfg_of(c, &cfg, &s);
    ft_adamw oa, ob;
    CHECK_OK(ft_adamw_init(&oa, a, c->n_params, &cfg));
    CHECK_OK(ft_adamw_init(&ob, b, c->n_params, &cfg));
    for (int t = 0; t < c->n_steps; t++) replay_step(c, &oa, &s, a, t);
    for (int t = 0; t < 4; t++) replay_step(c, &ob, &s, b, t);
    char path[600];
    snprintf(path, sizeof path, "%s/opt.safetensors", tmpdir);
    const char *extra[] = { "train.seed", "7", NULL };
    CHECK_OK(ft_adamw_save(&ob, path, extra));
    ft_adamw_free(&ob);
    CHECK_OK(ft_adamw_init(&ob, b, c->n_params, &cfg));
    CHECK(ob.step == 0);
    CHECK_OK(ft_adamw_load(&ob, path));
    CHECK(ob.step == 4);
    for (int t = 4; t < c->n_steps; t++) replay_step(c, &ob, &s, b, t);
    for (int p = 0; p < c->n_params; p++) {
        CHECK(memcmp(a[p].data, b[p].data, (size_t)c->numel[p] * 4) == 0);
        CHECK(memcmp(oa.m[p], ob.m[p], (size_t)c->numel[p] * 4) == 0);
        CHECK(memcmp(oa.v[p], ob.v[p], (size_t)c->numel[p] * 4) == 0);
    }
    st_file f;
    CHECK_OK(ft_st_open(&f, path));
    const st_tensor *t = ft_st_find(&f, "opt.m.base_model.model.layers.0.weight");
    CHECK(t && t->ndim == 2 && t->shape[0] == 4 && t->dtype == FT_F32);
    CHECK(ft_st_find(&f, "opt.v.base_model.model.layers.2.weight") != NULL);
    CHECK(ft_st_meta(&f, "opt.step") && strcmp(ft_st_meta(&f, "opt.step"), "4") == 0);
    CHECK(ft_st_meta(&f, "train.seed") && strcmp(ft_st_meta(&f, "train.seed"), "7") == 0);
    ft_st_close(&f);

    /* a different parameter set: the file's names do not match */
    ft_param d[8];
    make_params(c, d, "other");
    ft_adamw od;
    CHECK_OK(ft_adamw_init(&od, d, c->n_params, &cfg));
    CHECK(ft_adamw_load(&od, path) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.m.base_model.model.layers.0.weight") &&
           strstr(ftune_last_error(), "not being trained"), "%s", ftune_last_error());
    ft_adamw_free(&od);
    /* fewer parameters in the optimizer than in the file */
    CHECK_OK(ft_adamw_init(&od, b, 2, &cfg));
    CHECK(ft_adamw_load(&od, path) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "layers.2.weight"), "%s", ftune_last_error());
    ft_adamw_free(&od);
    /* a shape that differs: message names the tensor and both shapes */
    b[0].shape[0] = 2;
    b[0].shape[1] = c->numel[0] / 2;
    CHECK_OK(ft_adamw_init(&od, b, c->n_params, &cfg));
    float before = od.m[0][0] = 42.0f;
    CHECK(ft_adamw_load(&od, path) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.m.base_model.model.layers.0.weight") &&
           strstr(ftune_last_error(), "[4, 37]") && strstr(ftune_last_error(), "[2, 74]"), "%s", ftune_last_error());
    CHECK(od.m[0][0] == before && od.step == 0); /* unchanged on failure */
    ft_adamw_free(&od);
    b[0].shape[0] = 4;
    b[0].shape[1] = c->numel[0] / 4;

    /* a missing tensor and a bad step, written by hand */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", tmpdir);
    st_out_tensor ts[2] = {
        { .name = "opt.m.base_model.model.layers.0.weight", .dtype = FT_F32, .ndim = 2, .shape = { 4, 37 }, .data = oa.m[0] },
        { .name = "opt.v.base_model.model.layers.0.weight", .dtype = FT_F32, .ndim = 2, .shape = { 4, 37 }, .data = oa.v[0] },
    };
    const char *meta_ok[] = { "opt.kind", "adamw", "opt.step", "3", NULL };
    const char *meta_bad[] = { "opt.kind", "adamw", "opt.step", "-3", NULL };
    CHECK_OK(ft_st_write(bad, ts, 1, meta_ok));
    CHECK_OK(ft_adamw_init(&od, b, 1, &cfg));
    CHECK(ft_adamw_load(&od, bad) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.v.base_model.model.layers.0.weight\" is missing"), "%s", ftune_last_error());
    CHECK_OK(ft_st_write(bad, ts, 2, meta_bad));
    CHECK(ft_adamw_load(&od, bad) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.step"), "%s", ftune_last_error());
    CHECK_OK(ft_st_write(bad, ts, 2, meta_ok));
    CHECK_OK(ft_adamw_load(&od, bad));
    CHECK(od.step == 3);
    ft_adamw_free(&od);
    CHECK(ft_adamw_load(&od, "/nonexistent/opt.safetensors") == FTUNE_ERR_IO);

    /* duplicate names are refused at init */
    ft_param dup[2] = { a[0], a[0] };
    CHECK(ft_adamw_init(&od, dup, 2, &cfg) == FTUNE_ERR_ARG);
    ft_adamw_free(&oa);
    ft_adamw_free(&ob);
    free_params(a, c->n_params);
    free_params(b, c->n_params);
    free_params(d, c->n_params);
}

/* The update on 1 and on 3 threads: the same bits (it is elementwise, split
 * into chunks), for a tensor large enough to be split (70001 floats, an
 * awkward size) next to a small one, with and without weight decay. */
static void test_adamw_threads(void) {
    enum { NB = 70001, NS = 37 };
    float *w[2][2], *g[2];
    uint32_t seed = 1;
    for (int k = 0; k < 2; k++) g[k] = malloc((k ? NS : NB) * sizeof(float));
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++) w[r][k] = malloc((k ? NS : NB) * sizeof(float));
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < (k ? NS : NB); i++) {
            seed = seed * 1664525u + 1013904223u;
            w[0][k][i] = w[1][k][i] = (float)(seed >> 8) / (1 << 24) - 0.5f;
            seed = seed * 1664525u + 1013904223u;
            g[k][i] = ((float)(seed >> 8) / (1 << 24) - 0.5f) * 1e-2f;
        }
    ft_adamw o[2];
    for (int r = 0; r < 2; r++) {
        ft_param ps[2] = { { .name = "big", .data = w[r][0], .grad = g[0], .numel = NB, .ndim = 1, .shape = { NB },
                             .decay = true },
                           { .name = "small", .data = w[r][1], .grad = g[1], .numel = NS, .ndim = 1, .shape = { NS } } };
        ft_adamw_cfg cfg;
        ft_adamw_defaults(&cfg);
        cfg.weight_decay = 0.1;
        cfg.n_threads = r ? 3 : 1;
        CHECK_OK(ft_adamw_init(&o[r], ps, 2, &cfg));
        for (int t = 0; t < 3; t++) ft_adamw_step(&o[r], 1e-3 * (t + 1));
    }
    for (int k = 0; k < 2; k++) {
        size_t n = (k ? NS : NB) * sizeof(float);
        CHECK(memcmp(w[0][k], w[1][k], n) == 0);
        CHECK(memcmp(o[0].m[k], o[1].m[k], n) == 0 && memcmp(o[0].v[k], o[1].v[k], n) == 0);
    }
    /* and the update did something */
    CHECK(o[0].m[0][0] != 0);
    ft_adamw_cfg bad;
    ft_adamw_defaults(&bad);
    bad.n_threads = -1;
    ft_adamw ob;
    ft_param one = { .name = "x", .data = w[0][1], .grad = g[1], .numel = NS, .ndim = 1, .shape = { NS } };
    CHECK(ft_adamw_init(&ob, &one, 1, &bad) == FTUNE_ERR_ARG);
    for (int r = 0; r < 2; r++) {
        ft_adamw_free(&o[r]);
        for (int k = 0; k < 2; k++) free(w[r][k]);
    }
    for (int k = 0; k < 2; k++) free(g[k]);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune-test-optim-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    char cmd[1200], path[600];
    snprintf(path, sizeof path, "%s/ref_optim.bin", tmpdir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/ref_optim.py --out %s", path);
    if (system(cmd) != 0 || (n_ref = read_ref(path, ref, 4)) < 0) {
        printf("FAIL reference: scripts/ref_optim.py did not produce a readable %s\n", path);
        return 1;
    }
    RUN(test_adamw_matches_torch);
    RUN(test_schedule_edges);
    RUN(test_clip_nonfinite);
    RUN(test_checkpoint_resume);
    RUN(test_adamw_threads);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
