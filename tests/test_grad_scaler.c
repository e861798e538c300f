/* test_grad_scaler.c — loss scaling with PyTorch GradScaler semantics: the
 * scaler's update rule (backoff, growth, its f32 bound) and its unscale
 * check on hand-made gradients; the trainer's scaled seed; and whole runs
 * of ftune_train_run on stories260K (LoRA with dropout, 2 micro-batches per
 * step, one thread), where every comparison is bit for bit:
 *   - dynamic scaling in f32 without overflow equals no scaling (scaling by
 *     a power of two is exact in f32);
 *   - an injected inf gradient skips exactly that step and halves the
 *     scale, and the run equals one whose step was skipped by hand (which,
 *     for the scales to agree too, also backs the scaler off);
 *   - the scale grows after growth_interval finite steps;
 *   - a resumed run continues the scale, its growth tracker and the
 *     skipped count; a version 2 checkpoint resumes with the initial scale;
 *     a checkpoint of another loss-scale mode is refused;
 *   - without scaling or with a fixed scale an overflow stops the run, and
 *     so does a dynamic scale that backs off below f32's normal range. */
#include "ftune.h"
#include "check.h"
#include "core/core.h"
#include "train/grad_scaler.h"
#include "train/train.h"
#include "train/train_loop.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <unistd.h>

static char stories_hf[4096], tmpdir[256], data_path[512];

/* ------------------------------------------------------------ the scaler alone */

static void test_update_rule(void) {
    ft_grad_scaler s;
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, 0, 3));
    CHECK(s.scale == 65536.0f && s.growth_tracker == 0 && s.growth_interval == 3);
    CHECK(!ft_grad_scaler_update(&s, false) && s.scale == 65536.0f && s.growth_tracker == 1);
    CHECK(!ft_grad_scaler_update(&s, false) && s.scale == 65536.0f && s.growth_tracker == 2);
    /* the third finite step in a row: grows, the tracker restarts */
    CHECK(!ft_grad_scaler_update(&s, false) && s.scale == 131072.0f && s.growth_tracker == 0);
    CHECK(!ft_grad_scaler_update(&s, false) && s.growth_tracker == 1);
    /* an overflow: skip, halve, restart */
    CHECK(ft_grad_scaler_update(&s, true) && s.scale == 65536.0f && s.growth_tracker == 0);
    CHECK(ft_grad_scaler_update(&s, true) && s.scale == 32768.0f && s.growth_tracker == 0);
    /* growth never overflows f32: at 2^127 the scale stays, the tracker restarts */
    s.scale = ldexpf(1.0f, 127);
    s.growth_tracker = 2;
    CHECK(!ft_grad_scaler_update(&s, false) && s.scale == ldexpf(1.0f, 127) && s.growth_tracker == 0);
    /* the default interval is PyTorch's 2000 */
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, 1024, 0));
    CHECK(s.scale == 1024.0f && s.growth_interval == 2000);
    for (int i = 0; i < 1999; i++) ft_grad_scaler_update(&s, false);
    CHECK(s.scale == 1024.0f && s.growth_tracker == 1999);
    ft_grad_scaler_update(&s, false);
    CHECK(s.scale == 2048.0f && s.growth_tracker == 0);
    /* a fixed scale never changes nor skips; none is scale 1 */
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_FIXED, 128, 0));
    CHECK(!ft_grad_scaler_update(&s, true) && s.scale == 128.0f);
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_NONE, 0, 0));
    CHECK(!ft_grad_scaler_on(&s) && s.scale == 1.0f && !ft_grad_scaler_update(&s, true));
    /* scales that are no f32, or not positive, are refused */
    CHECK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_FIXED, 0.1, 0) == FTUNE_ERR_ARG);
    CHECK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_FIXED, -4, 0) == FTUNE_ERR_ARG);
    CHECK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, 1e39, 0) == FTUNE_ERR_ARG);
    CHECK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, NAN, 0) == FTUNE_ERR_ARG);
    CHECK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, 0, -1) == FTUNE_ERR_ARG);
}

static void test_unscale(void) {
    enum { N1 = 37, N2 = 5 };
    float g1[N1], g2[N2], want1[N1];
    ft_param ps[2] = { { .grad = g1, .numel = N1 }, { .grad = g2, .numel = N2 } };
    ft_grad_scaler s;
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_FIXED, 3, 0)); /* not a power of two: rounding shows */
    float inv = (float)(1.0 / 3.0);
    for (int i = 0; i < N1; i++) { g1[i] = (float)(i - 18) * 0.37f + 1e-3f; want1[i] = g1[i] * inv; }
    for (int i = 0; i < N2; i++) g2[i] = FLT_MAX * (i % 2 ? 1 : -1);
    CHECK(!ft_grad_scaler_unscale(&s, ps, 2));
    for (int i = 0; i < N1; i++) CHECKF(g1[i] == want1[i], "%d: %g vs %g", i, g1[i], want1[i]);
    /* checked before the multiply, as PyTorch: FLT_MAX is finite */
    CHECK(g2[0] == -FLT_MAX * inv);
    /* inf and NaN anywhere are found */
    g2[3] = INFINITY;
    CHECK(ft_grad_scaler_unscale(&s, ps, 2));
    g2[3] = 0;
    g1[N1 - 1] = NAN;
    CHECK(ft_grad_scaler_unscale(&s, ps, 2));
    /* scale 1 multiplies nothing; none makes no pass at all */
    g1[N1 - 1] = 1.5f;
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_DYNAMIC, 1, 0));
    CHECK(!ft_grad_scaler_unscale(&s, ps, 2) && g1[N1 - 1] == 1.5f);
    CHECK_OK(ft_grad_scaler_init(&s, FT_LOSS_SCALE_NONE, 0, 0));
    g1[0] = NAN;
    CHECK(!ft_grad_scaler_unscale(&s, ps, 2) && isnan(g1[0]));
}

static void test_parse(void) {
    ftune_loss_scale_mode m;
    double v;
    CHECK_OK(ftune_loss_scale_parse("dynamic", &m, &v));
    CHECK(m == FTUNE_LOSS_SCALE_DYNAMIC && v == 0);
    CHECK_OK(ftune_loss_scale_parse("none", &m, &v));
    CHECK(m == FTUNE_LOSS_SCALE_NONE);
    CHECK_OK(ftune_loss_scale_parse("1024", &m, &v));
    CHECK(m == FTUNE_LOSS_SCALE_FIXED && v == 1024);
    const char *bad[] = { "", "Dynamic", "0", "-8", "inf", "nan", "12x" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECKF(ftune_loss_scale_parse(bad[i], &m, &v) == FTUNE_ERR_ARG, "\"%s\" accepted", bad[i]);
        CHECKF(strstr(ftune_last_error(), "--loss-scale"), "%s", ftune_last_error());
    }
}

/* ------------------------------------------------------------ the scaled seed */

static void test_trainer_seed_exact(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.lora.r = 4;
    o.lora.seed = 3;
    o.max_B = 2;
    o.max_T = 24;
    o.n_threads = 1;
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    ft_batch b;
    CHECK_OK(ft_batch_init(&b, 2, 24));
    b.B = 2;
    b.T = 24;
    b.pos = NULL;
    b.doc = NULL;
    int64_t nt = 0;
    for (int i = 0; i < 48; i++) {
        b.tokens[i] = (i * 37 + 5) % m->cfg.V;
        b.targets[i] = i % 7 == 2 ? -1 : (i * 11 + 1) % m->cfg.V;
        nt += b.targets[i] >= 0;
    }
    b.n_targets = nt;
    if (tr) {
        /* B is zero at init: one update makes every gradient non-zero */
        int64_t n;
        float *g = ft_trainer_grads(tr, &n), *v = ft_trainer_values(tr, &n);
        for (int64_t i = 0; i < n; i++) v[i] += 1e-3f * (float)((i * 7919) % 13 - 6);
        float *ref = malloc((size_t)n * sizeof *ref);
        double l1, l2;
        ft_trainer_zero_grad(tr);
        CHECK_OK(ft_trainer_step(tr, &b, nt, &l1));
        memcpy(ref, g, (size_t)n * sizeof *ref);
        ft_trainer_set_micro_step(tr, 0); /* the same dropout masks */
        ft_trainer_zero_grad(tr);
        CHECK_OK(ft_trainer_step_scaled(tr, &b, nt, 65536.0f, &l2));
        CHECKF(l1 == l2, "the loss is not scaled: %.17g vs %.17g", l1, l2);
        int64_t bad = 0, nonzero = 0;
        for (int64_t i = 0; i < n; i++) {
            bad += g[i] != ref[i] * 65536.0f;
            nonzero += ref[i] != 0;
        }
        /* a power-of-two scale is exact in f32: every gradient bit for bit */
        CHECKF(bad == 0, "%lld of %lld gradients are not exactly 65536 times the unscaled ones", (long long)bad, (long long)n);
        CHECKF(nonzero > n / 2, "only %lld of %lld gradients are non-zero", (long long)nonzero, (long long)n);
        free(ref);
    }
    ft_batch_free(&b);
    ft_trainer_free(tr);
    ftune_model_free(m);
}

/* ------------------------------------------------------------ whole runs */

enum { MAXS = 16 };
typedef struct {
    int n;
    double loss[MAXS + 1], lr[MAXS + 1], gnorm[MAXS + 1], scale[MAXS + 1];
    int64_t skipped_steps[MAXS + 1];
    bool skipped[MAXS + 1], scaling;
    double start_scale;
} trace;

static void on_progress(void *ctx, const ftune_train_progress *p) {
    trace *t = ctx;
    if (p->ev == FTUNE_TRAIN_START) { t->scaling = p->loss_scaling; t->start_scale = p->loss_scale; }
    if (p->ev != FTUNE_TRAIN_STEP || p->step < 1 || p->step > MAXS) return;
    int s = (int)p->step;
    t->loss[s] = p->loss;
    t->lr[s] = p->lr;
    t->gnorm[s] = p->grad_norm;
    t->scale[s] = p->loss_scale;
    t->skipped_steps[s] = p->skipped_steps;
    t->skipped[s] = p->skipped;
    t->n = s;
}

typedef struct {
    ftune_loss_scale_mode mode;
    double init_scale;         /* 0: the default */
    int growth_interval;
    int64_t steps, save_every;
    const char *resume;        /* a checkpoint name under the output directory */
    ft_train_hooks hooks;
} run_cfg;

/* One run into tmpdir/name; the adapter bytes in *adapter (malloc'd). */
static ftune_status run(const char *name, const run_cfg *c, trace *t, ftune_train_result *res, char **adapter,
                        size_t *adapter_len) {
    static ftune_model *m;
    if (!m) CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    memset(t, 0, sizeof *t);
    char out[512], resume[600];
    snprintf(out, sizeof out, "%s/%s", tmpdir, name);
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    o.model = m;
    o.data_path = data_path;
    o.out_dir = out;
    o.overwrite = !c->resume;
    o.val_split = 0;
    o.ctx = 24;
    o.batch_size = 2;
    o.grad_accum = 2;
    o.lora_r = 4;
    o.lora_dropout = 0.1f;
    o.lr = 5e-3;
    o.warmup = 2;
    o.seed = 11;
    o.steps = c->steps;
    o.save_every = (int)c->save_every;
    o.n_threads = 1;
    o.loss_scale_mode = c->mode;
    o.loss_scale = c->init_scale;
    o.loss_scale_growth_interval = c->growth_interval;
    if (c->resume) {
        snprintf(resume, sizeof resume, "%s/%s", out, c->resume);
        o.resume = resume;
    }
    ftune_status st = ft_train_run_hooked(&o, &c->hooks, on_progress, t, res);
    if (adapter) {
        *adapter = NULL;
        char p[600];
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", out);
        if (!st) CHECK_OK(ft_read_file(p, adapter, adapter_len));
    }
    return st;
}

static bool same_bytes(const char *a, size_t na, const char *b, size_t nb) {
    return a && b && na == nb && memcmp(a, b, na) == 0;
}

/* Steps 1..n of two traces have bit-identical losses, learning rates and
 * (where both are finite: not an overflowed step) gradient norms. */
static void check_same_run(const trace *a, const trace *b, int n, const char *what) {
    CHECKF(a->n >= n && b->n >= n, "%s: %d and %d steps, expected %d", what, a->n, b->n, n);
    for (int s = 1; s <= n && s <= MAXS; s++) {
        CHECKF(a->loss[s] == b->loss[s], "%s: step %d loss %.17g vs %.17g", what, s, a->loss[s], b->loss[s]);
        CHECKF(a->lr[s] == b->lr[s], "%s: step %d lr %.17g vs %.17g", what, s, a->lr[s], b->lr[s]);
        if (isfinite(a->gnorm[s]) && isfinite(b->gnorm[s]))
            CHECKF(a->gnorm[s] == b->gnorm[s], "%s: step %d grad norm %.17g vs %.17g", what, s, a->gnorm[s], b->gnorm[s]);
    }
}

static void test_f32_dynamic_equals_none(void) {
    trace a, b;
    ftune_train_result ra, rb;
    char *wa, *wb;
    size_t na, nb;
    CHECK_OK(run("none", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_NONE, .steps = 8 }, &a, &ra, &wa, &na));
    CHECK_OK(run("dyn", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .steps = 8 }, &b, &rb, &wb, &nb));
    check_same_run(&a, &b, 8, "dynamic vs none");
    CHECK(same_bytes(wa, na, wb, nb));
    CHECK(!a.scaling && b.scaling && b.start_scale == 65536);
    for (int s = 1; s <= 8; s++) CHECK(b.scale[s] == 65536 && !b.skipped[s] && b.skipped_steps[s] == 0);
    CHECK(ra.skipped_steps == 0 && ra.loss_scale == 1 && rb.loss_scale == 65536);
    /* a fixed power of two too */
    trace c;
    char *wc;
    size_t nc;
    CHECK_OK(run("fixed", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_FIXED, .steps = 8 }, &c, NULL, &wc, &nc));
    check_same_run(&a, &c, 8, "fixed vs none");
    CHECK(same_bytes(wa, na, wc, nc));
    free(wa);
    free(wb);
    free(wc);
}

static void test_injected_overflow(void) {
    enum { K = 3, S = 8 };
    trace inj, hand, hand_none, plain;
    ftune_train_result ri, rh;
    char *wi, *wh, *wn, *wp;
    size_t ni, nh, nn, np;
    CHECK_OK(run("inj", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .steps = S, .hooks.inf_grad_step = K }, &inj, &ri, &wi, &ni));
    CHECK_OK(run("hand", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .steps = S, .hooks.skip_step = K }, &hand, &rh, &wh, &nh));
    CHECK_OK(run("hand_none", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_NONE, .steps = S, .hooks.skip_step = K }, &hand_none, NULL, &wn, &nn));
    CHECK_OK(run("plain", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .steps = S }, &plain, NULL, &wp, &np));
    /* exactly step K is skipped and halves the scale */
    for (int s = 1; s <= S; s++) {
        CHECKF(inj.skipped[s] == (s == K), "step %d skipped %d", s, inj.skipped[s]);
        CHECKF(inj.scale[s] == (s < K ? 65536 : 32768), "step %d scale %g", s, inj.scale[s]);
        CHECKF(inj.skipped_steps[s] == (s < K ? 0 : 1), "step %d skipped count %lld", s, (long long)inj.skipped_steps[s]);
    }
    CHECK(!isfinite(inj.gnorm[K]));
    CHECK(ri.skipped_steps == 1 && ri.loss_scale == 32768 && ri.steps_done == S);
    /* bit for bit the run skipped by hand; the scales agree because the hand
     * skip backs the scaler off too; and without any scaler */
    check_same_run(&inj, &hand, S, "injected vs by hand");
    for (int s = 1; s <= S; s++) CHECK(inj.scale[s] == hand.scale[s] && inj.skipped[s] == hand.skipped[s]);
    CHECK(same_bytes(wi, ni, wh, nh));
    check_same_run(&inj, &hand_none, S, "injected vs by hand without scaling");
    CHECK(same_bytes(wi, ni, wn, nn));
    CHECK(rh.skipped_steps == 1 && rh.loss_scale == 32768);
    /* before K the run is the plain one; the step after K has the plain
     * run's step K learning rate (the schedule did not advance) and the
     * batch of step K+1 (the skipped batch was consumed) */
    check_same_run(&inj, &plain, K - 1, "before the overflow");
    CHECKF(inj.loss[K] == plain.loss[K], "step %d loss %.17g vs %.17g", K, inj.loss[K], plain.loss[K]);
    CHECKF(inj.lr[K + 1] == plain.lr[K], "lr after the skip %.17g, the plain run's step %d %.17g", inj.lr[K + 1], K, plain.lr[K]);
    CHECKF(inj.loss[K + 1] != plain.loss[K + 1], "the skip changed nothing: %.17g", inj.loss[K + 1]);
    CHECK(!same_bytes(wi, ni, wp, np));
    free(wi);
    free(wh);
    free(wn);
    free(wp);
}

static void test_growth(void) {
    trace t;
    ftune_train_result r;
    /* interval 3: grows after steps 3 and 6; an overflow at 8 restarts the count */
    CHECK_OK(run("grow", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .growth_interval = 3, .steps = 12,
                                     .hooks.inf_grad_step = 8 }, &t, &r, NULL, NULL));
    const double want[13] = { 0, 65536, 65536, 131072, 131072, 131072, 262144, 262144, 131072, 131072, 131072, 262144, 262144 };
    for (int s = 1; s <= 12; s++) CHECKF(t.scale[s] == want[s], "step %d: scale %g, expected %g", s, t.scale[s], want[s]);
    CHECK(r.skipped_steps == 1 && t.skipped[8]);
}

/* trainer_state.json of a checkpoint, parsed (NULL if unreadable). */
static cJSON *read_state(const char *name, const char *ck) {
    char p[700], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/%s/%s/trainer_state.json", tmpdir, name, ck);
    if (ft_read_file(p, &text, &len)) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

static void write_state(const char *name, const char *ck, const cJSON *j) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s/%s/trainer_state.json", tmpdir, name, ck);
    char *s = cJSON_PrintUnformatted(j);
    CHECK_OK(ft_write_file_atomic(p, s, strlen(s)));
    free(s);
}

static void test_resume(void) {
    enum { S = 10 };
    run_cfg c = { .mode = FTUNE_LOSS_SCALE_DYNAMIC, .growth_interval = 3, .steps = S, .save_every = 4, .hooks.inf_grad_step = 2 };
    trace full, part, res;
    char *wf, *wr;
    size_t nf, nr;
    ftune_train_result rf, rr;
    CHECK_OK(run("full", &c, &full, &rf, &wf, &nf));
    /* at step 4: skipped 1 (step 2: 65536 -> 32768), 2 finite steps since */
    cJSON *j = read_state("full", "checkpoint-4");
    CHECK(j != NULL);
    if (j) {
        const cJSON *ls = cJSON_GetObjectItem(j, "loss_scaler");
        CHECK(cJSON_GetObjectItem(j, "version")->valuedouble == FTUNE_CHECKPOINT_VERSION);
        CHECK(cJSON_GetObjectItem(j, "skipped_steps")->valuedouble == 1);
        CHECK(ls && cJSON_GetObjectItem(ls, "scale")->valuedouble == 32768);
        CHECK(ls && cJSON_GetObjectItem(ls, "growth_tracker")->valuedouble == 2);
        CHECK(ls && strcmp(cJSON_GetObjectItem(ls, "mode")->valuestring, "dynamic") == 0);
        cJSON_Delete(j);
    }
    /* the same run, resumed from step 4 (no hook: its step is behind); the
     * restored tracker makes the scale grow at step 5 as in the full run */
    CHECK_OK(run("part", &(run_cfg){ .mode = c.mode, .growth_interval = 3, .steps = S, .save_every = 4,
                                     .hooks.inf_grad_step = 2 }, &part, NULL, NULL, NULL));
    CHECK_OK(run("part", &(run_cfg){ .mode = c.mode, .growth_interval = 3, .steps = S, .resume = "checkpoint-4" },
                 &res, &rr, &wr, &nr));
    CHECK(res.start_scale == 32768 && full.scale[5] == 65536);
    for (int s = 5; s <= S; s++) {
        CHECKF(res.loss[s] == full.loss[s], "step %d loss %.17g vs %.17g", s, res.loss[s], full.loss[s]);
        CHECKF(res.lr[s] == full.lr[s], "step %d lr", s);
        CHECKF(res.scale[s] == full.scale[s], "step %d scale %g vs %g", s, res.scale[s], full.scale[s]);
        CHECKF(res.skipped_steps[s] == 1, "step %d skipped %lld", s, (long long)res.skipped_steps[s]);
    }
    CHECK(same_bytes(wf, nf, wr, nr));
    CHECK(rr.skipped_steps == 1 && rr.loss_scale == rf.loss_scale);
    free(wr);
    /* another mode or interval is refused, naming it */
    CHECK(run("part", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_NONE, .steps = S, .resume = "checkpoint-4" }, &res, NULL, NULL,
              NULL) == FTUNE_ERR_ARG);
    CHECKF(strstr(ftune_last_error(), "--loss-scale dynamic"), "%s", ftune_last_error());
    CHECK(run("part", &(run_cfg){ .mode = c.mode, .growth_interval = 4, .steps = S, .resume = "checkpoint-4" }, &res, NULL,
              NULL, NULL) == FTUNE_ERR_ARG);
    CHECKF(strstr(ftune_last_error(), "every 3 finite steps"), "%s", ftune_last_error());
    /* a version 2 checkpoint (no skipped steps) resumes with the scaler at its
     * initial state: made from an unskipped run's by removing the fields */
    run_cfg nos = { .mode = c.mode, .growth_interval = 3, .steps = S, .save_every = 4 };
    trace nfull, v2;
    char *wnf, *wv2;
    size_t nnf, nv2;
    CHECK_OK(run("v2", &nos, &nfull, NULL, &wnf, &nnf));
    j = read_state("v2", "checkpoint-4");
    if (j) {
        cJSON_SetNumberValue(cJSON_GetObjectItem(j, "version"), 2);
        cJSON_DeleteItemFromObject(j, "skipped_steps");
        cJSON_DeleteItemFromObject(j, "loss_scaler");
        cJSON_DeleteItemFromObject(j, "state_checksum");
        write_state("v2", "checkpoint-4", j);
        cJSON_Delete(j);
    }
    CHECK_OK(run("v2", &(run_cfg){ .mode = c.mode, .growth_interval = 3, .steps = S, .resume = "checkpoint-4" }, &v2,
                 NULL, &wv2, &nv2));
    /* the scale restarts at 65536 with the tracker at 0 (the full run had
     * grown to 131072 after step 3), which in f32 changes no bit */
    CHECK(v2.start_scale == 65536 && nfull.scale[4] == 131072);
    CHECK(v2.scale[5] == 65536 && v2.scale[6] == 65536 && v2.scale[7] == 131072);
    for (int s = 5; s <= S; s++) CHECKF(v2.loss[s] == nfull.loss[s], "v2 resume: step %d loss", s);
    CHECK(same_bytes(wnf, nnf, wv2, nv2));
    /* a version 2 checkpoint with version 3 fields is refused */
    j = read_state("v2", "checkpoint-4");
    if (j) {
        cJSON_AddNumberToObject(j, "skipped_steps", 0);
        write_state("v2", "checkpoint-4", j);
        cJSON_Delete(j);
    }
    CHECK(run("v2", &(run_cfg){ .mode = c.mode, .growth_interval = 3, .steps = S, .resume = "checkpoint-4" }, &v2, NULL,
              NULL, NULL) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "unknown field \"skipped_steps\""), "%s", ftune_last_error());
    free(wf);
    free(wnf);
    free(wv2);
}

static void test_overflow_errors(void) {
    trace t;
    ftune_status st = run("fixov", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_FIXED, .steps = 4, .hooks.inf_grad_step = 2 }, &t,
                          NULL, NULL, NULL);
    CHECK(st == FTUNE_ERR_RANGE);
    CHECKF(strstr(ftune_last_error(), "step 2") && strstr(ftune_last_error(), "fixed loss scale 65536"), "%s",
           ftune_last_error());
    st = run("noneov", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_NONE, .steps = 4, .hooks.inf_grad_step = 2 }, &t, NULL, NULL,
             NULL);
    CHECK(st == FTUNE_ERR_RANGE);
    /* a dynamic scale that backs off below f32's normal range stops the run
     * instead of skipping forever */
    st = run("under", &(run_cfg){ .mode = FTUNE_LOSS_SCALE_DYNAMIC, .init_scale = FLT_MIN, .steps = 4,
                                  .hooks.inf_grad_step = 1 }, &t, NULL, NULL, NULL);
    CHECK(st == FTUNE_ERR_RANGE);
    CHECKF(strstr(ftune_last_error(), "step 1: the gradients are not finite even at loss scale 1.17549e-38"), "%s",
           ftune_last_error());
}

static int rm_tree(const char *p) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    return system(cmd);
}

int main(void) {
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune_gscale_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    snprintf(data_path, sizeof data_path, "%s/d.jsonl", tmpdir);
    const char *text =
        "{\"text\": \"Once upon a time, there was a little cat named Tom. Tom liked to play with his red ball.\"}\n"
        "{\"text\": \"The sun was hot. Lily went to the park with her mom. She saw a big dog and said hello.\"}\n"
        "{\"text\": \"Ben had a toy car. He drove it around the room. The car was fast and blue.\"}\n"
        "{\"text\": \"One day, a bird sat on a tree. The bird sang a happy song for all the kids.\"}\n"
        "{\"text\": \"Sara wanted a cake. Her dad made a big cake with red cherries. Sara was very happy.\"}\n";
    CHECK_OK(ft_write_file_atomic(data_path, text, strlen(text)));
    RUN(test_update_rule);
    RUN(test_unscale);
    RUN(test_parse);
    RUN(test_trainer_seed_exact);
    RUN(test_f32_dynamic_equals_none);
    RUN(test_injected_overflow);
    RUN(test_growth);
    RUN(test_resume);
    RUN(test_overflow_errors);
    rm_tree(tmpdir);
    CHECK_EXIT();
}
