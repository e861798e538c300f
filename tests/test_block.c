/* test_block.c — the shared block and the fused LM head + loss: the fused
 * op against logits + the reference cross-entropy at awkward sizes (masked
 * targets, several chunks, f32 and quantized heads) and bit-identical
 * across thread counts; the block hooks (layer order, each Linear's input
 * is what it got); a KV prefix against running the same tokens through the
 * cache; `ftune eval` (ftune_eval_tokens) against the trainer's validation
 * loss on the same tokens. */
#include "ftune.h"
#include "nn/block.h"
#include "run/run.h"
#include "nn/lm_loss.h"
#include "model/model.h"
#include "ops/ops.h"
#include "train/train.h"
#include "check.h"

#include <stdint.h>

static char stories_hf[512], stories_gguf[512];

static float *randn(ft_rng *rng, size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = ft_rng_normal(rng) * scale;
    return p;
}

/* ------------------------------------------------ fused LM head + loss */

typedef struct {
    float *w;             /* (V, C) f32 values the head holds (dequantized) */
    void *q;              /* the head's own storage */
    ft_linear lin;
} test_head;

static void make_head(test_head *h, ft_dtype dt, int V, int C, ft_rng *rng) {
    float *w = randn(rng, (size_t)V * C, 0.5f);
    int64_t nb = ft_dtype_nbytes(dt, (int64_t)V * C);
    h->q = malloc((size_t)nb);
    ft_types[dt].from_f32(w, h->q, (int64_t)V * C);
    ft_types[dt].to_f32(h->q, w, (int64_t)V * C);
    h->w = w;
    h->lin = (ft_linear){ .w = { .dtype = dt, .ndim = 2, .shape = { V, C }, .data = h->q, .nbytes = (size_t)nb },
                          .in = C, .out = V };
}

typedef struct {
    double loss;
    int64_t count;
    float *dh, *dw;
} lm_result;

static lm_result run_fused(const test_head *hd, const float *h, const int *tg, int n, int CH, int nt, float scale,
                           bool grad_w) {
    int V = hd->lin.out, C = hd->lin.in;
    lm_result r = { 0 };
    float *scr = ft_aligned_alloc(ft_lm_loss_scratch_floats(CH, V, true) * sizeof(float));
    float *ls = ft_aligned_alloc(ft_linear_train_scratch_floats(C, 0, CH, nt) * sizeof(float));
    ft_backend be = ft_backend_cpu(nt);
    ft_lm_loss_env e = { .head = &hd->lin, .loss = &ft_loss_crossentropy, .chunk_rows = CH, .be = &be,
                         .scratch = scr, .lin_scratch = ls };
    r.dh = malloc((size_t)n * C * sizeof(float));
    r.dw = grad_w ? calloc((size_t)V * C, sizeof(float)) : NULL;
    int64_t c2;
    double l2 = ft_lm_loss_forward(&e, &c2, h, tg, n);
    r.loss = ft_lm_loss_backward(&e, r.dh, r.dw, &r.count, h, tg, n, scale);
    /* forward and backward compute the chunk's logits and loss identically */
    CHECKF((l2 == r.loss || (isnan(l2) && isnan(r.loss))) && c2 == r.count, "forward %.17g (%lld) vs backward %.17g (%lld)", l2, (long long)c2, r.loss,
           (long long)r.count);
    free(scr);
    free(ls);
    return r;
}

static void test_lm_loss_vs_reference(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 11);
    struct { ft_dtype dt; int n, C, V, CH; } cases[] = {
        { FT_F32, 37, 19, 1003, 5 }, { FT_F32, 1, 64, 77, 1 }, { FT_F32, 130, 33, 515, 128 },
        { FT_BF16, 23, 40, 301, 7 }, { FT_Q8_0, 29, 64, 211, 6 }, { FT_Q4_0, 17, 96, 97, 17 },
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int n = cases[ci].n, C = cases[ci].C, V = cases[ci].V, CH = cases[ci].CH;
        ft_dtype dt = cases[ci].dt;
        test_head hd;
        make_head(&hd, dt, V, C, &rng);
        float *h = randn(&rng, (size_t)n * C, 1.0f);
        int *tg = malloc((size_t)n * sizeof(int));
        int64_t want = 0;
        for (int i = 0; i < n; i++) {
            tg[i] = i % 4 == 1 ? -100 : i % 7 == 2 ? -1 : (int)(ft_rng_u32(&rng) % (uint32_t)V);
            want += tg[i] >= 0;
        }
        float scale = 1.0f / 13;
        bool gw = dt == FT_F32;
        /* reference: all logits, then the plain cross-entropy */
        float *lg = malloc((size_t)n * V * sizeof(float)), *dlg = malloc((size_t)n * V * sizeof(float));
        float *rdh = malloc((size_t)n * C * sizeof(float)), *rdw = calloc((size_t)V * C, sizeof(float));
        ft_matmul_forward_ref(lg, h, hd.w, NULL, n, C, V);
        double rl = ft_crossentropy_forward_backward(dlg, lg, tg, n, V, scale);
        ft_matmul_backward_ref(rdh, rdw, NULL, dlg, h, hd.w, n, C, V);
        lm_result r = run_fused(&hd, h, tg, n, CH, 2, scale, gw);
        CHECKF(r.count == want, "count %lld, want %lld", (long long)r.count, (long long)want);
        /* float32 logits (a C-term sum in another order, a few ulps) and
         * exp in float (~2 ulp) against double: 1e-6 of a loss that is a
         * sum of positive terms */
        double le = fabs(r.loss - rl) / fabs(rl);
        CHECKF(le < 1e-6, "%s n=%d C=%d V=%d: loss %.10g, reference %.10g (rel %.3g)", ft_types[dt].name, n, C, V,
               r.loss, rl, le);
        /* gradients: dh is a V-term sum of (p - onehot)·w, dw an n-term
         * sum; each term carries float rounding of a few ulps, so 1e-5
         * relative to the largest entry (floor: sums near zero have no
         * relative scale) */
        float mh = 0, mw = 0;
        for (long i = 0; i < (long)n * C; i++) mh = fmaxf(mh, fabsf(rdh[i]));
        for (long i = 0; i < (long)V * C; i++) mw = fmaxf(mw, fabsf(rdw[i]));
        double eh = check_max_rel_err(r.dh, rdh, (long)n * C, mh);
        double ew = gw ? check_max_rel_err(r.dw, rdw, (long)V * C, mw) : 0;
        printf("  %s n=%d C=%d V=%d chunk=%d: loss rel err %.2e, dh %.2e, dw %.2e\n", ft_types[dt].name, n, C, V, CH,
               le, eh, ew);
        CHECKF(eh < 1e-5, "dh rel err %.3g", eh);
        CHECKF(ew < 1e-5, "dw rel err %.3g", ew);
        /* the same result on 1, 3 and 2 threads, bit for bit */
        for (int nt = 1; nt <= 3; nt += 2) {
            lm_result s = run_fused(&hd, h, tg, n, CH, nt, scale, gw);
            CHECKF(s.loss == r.loss, "%d threads: loss %.17g vs %.17g", nt, s.loss, r.loss);
            CHECK(memcmp(s.dh, r.dh, (size_t)n * C * sizeof(float)) == 0);
            if (gw) CHECK(memcmp(s.dw, r.dw, (size_t)V * C * sizeof(float)) == 0);
            free(s.dh); free(s.dw);
        }
        free(r.dh); free(r.dw); free(lg); free(dlg); free(rdh); free(rdw); free(h); free(tg);
        free(hd.w); free(hd.q);
    }
}

/* A target >= V is not a class: the loss is NaN, never a read past the row. */
static void test_lm_loss_bad_target(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 3);
    test_head hd;
    make_head(&hd, FT_F32, 50, 8, &rng);
    float *h = randn(&rng, 3 * 8, 1.0f);
    int tg[3] = { 1, 50, 2 };
    lm_result r = run_fused(&hd, h, tg, 3, 2, 1, 1.0f, false);
    CHECK(isnan(r.loss));
    free(r.dh); free(h); free(hd.w); free(hd.q);
}

/* ------------------------------------------------ hooks */

#define MAXEV 256
typedef struct {
    int n_ev;
    ft_block_event ev[MAXEV];
    int layer[MAXEV];
    float *rows[MAXEV];           /* copies of what each layer hook saw */
    int n_rows[MAXEV];
    int n_obs;
    int obs_layer[MAXEV], obs_which[MAXEV], obs_n[MAXEV], obs_in[MAXEV];
    float *obs[MAXEV];            /* copies of each Linear's input */
} recorder;

static float *dup_rows(const float *p, size_t n) {
    float *c = malloc(n * sizeof(float));
    memcpy(c, p, n * sizeof(float));
    return c;
}

static void rec_layer(void *ctx, ft_block_event ev, int layer, const float *rows, int n, int C) {
    recorder *r = ctx;
    if (r->n_ev >= MAXEV) return;
    r->ev[r->n_ev] = ev;
    r->layer[r->n_ev] = layer;
    r->rows[r->n_ev] = dup_rows(rows, (size_t)n * C);
    r->n_rows[r->n_ev] = n;
    r->n_ev++;
}

static void rec_linear(void *ctx, int layer, int which, const float *inp, int n, int in) {
    recorder *r = ctx;
    if (r->n_obs >= MAXEV) return;
    int i = r->n_obs++;
    r->obs_layer[i] = layer;
    r->obs_which[i] = which;
    r->obs_n[i] = n;
    r->obs_in[i] = in;
    r->obs[i] = dup_rows(inp, (size_t)n * in);
}

static void rec_free(recorder *r) {
    for (int i = 0; i < r->n_ev; i++) free(r->rows[i]);
    for (int i = 0; i < r->n_obs; i++) free(r->obs[i]);
    memset(r, 0, sizeof *r);
}

static const float *observed(const recorder *r, int layer, int which) {
    for (int i = 0; i < r->n_obs; i++)
        if (r->obs_layer[i] == layer && r->obs_which[i] == which) return r->obs[i];
    return NULL;
}

/* The session's hooks: pre/post per layer in order; post(l) == pre(l+1);
 * q/k/v see rmsnorm(x, attn_norm) of the pre-hook's x; wo's input through
 * wo plus x, normed, is what gate/up see; gate/up's input through the MLP
 * (its h is what down sees) plus the residual is the post-hook's output;
 * the last output through the final norm and head is the logits. Each
 * comparison is bitwise: the hooks must see exactly what the block used. */
static void test_hooks_session(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    const ft_config *c = &m->cfg;
    int T = 13, C = c->C, F = c->F, qd = c->NH * c->HS, V = c->V;
    int32_t ids[13];
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 37 + 1) % V);
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, 32, 2));
    if (!s) { ftune_model_free(m); return; }
    float *ref = malloc((size_t)T * V * sizeof(float)), *lg = malloc((size_t)T * V * sizeof(float));
    CHECK_OK(ftune_session_forward(s, ids, T, ref, 1));
    ftune_session_reset(s);
    recorder r = { 0 };
    ft_block_hooks hk = { .layer = rec_layer, .linear_input = rec_linear, .ctx = &r };
    ft_session_set_hooks(s, &hk);
    CHECK_OK(ftune_session_forward(s, ids, T, lg, 1));
    ft_session_set_hooks(s, NULL);
    /* the hooks change nothing */
    CHECK(memcmp(lg, ref, (size_t)T * V * sizeof(float)) == 0);
    CHECKF(r.n_ev == 2 * c->L && r.n_obs == FT_N_MODS * c->L, "%d layer events, %d observations", r.n_ev, r.n_obs);
    if (r.n_ev != 2 * c->L || r.n_obs != FT_N_MODS * c->L) goto out;
    for (int l = 0; l < c->L; l++) {
        CHECK(r.ev[2 * l] == FT_BLOCK_PRE_FORWARD && r.layer[2 * l] == l);
        CHECK(r.ev[2 * l + 1] == FT_BLOCK_POST_FORWARD && r.layer[2 * l + 1] == l);
        for (int k = 0; k < FT_N_MODS; k++) {
            int i = l * FT_N_MODS + k;
            CHECK(r.obs_layer[i] == l && r.obs_which[i] == k && r.obs_n[i] == T);
            CHECK(r.obs_in[i] == ft_layer_linear(&m->layers[l], k)->in);
        }
    }
    size_t nC = (size_t)T * C;
    float *a = malloc(nC * 4), *mid = malloc(nC * 4), *g = malloc((size_t)T * F * 4), *u = malloc((size_t)T * F * 4);
    float *scr = malloc(ft_linear_scratch_floats(F > qd ? (F > C ? F : C) : (qd > C ? qd : C), 2) * 4);
    int bad = 0;
    for (int l = 0; l < c->L; l++) {
        ft_layer *ly = &m->layers[l];
        const float *x = r.rows[2 * l], *out = r.rows[2 * l + 1];
        if (l + 1 < c->L) bad += memcmp(out, r.rows[2 * l + 2], nC * 4) != 0;
        ft_rmsnorm_forward(a, NULL, x, ly->attn_norm, T, C, c->norm_eps);
        for (int k = FT_MOD_Q; k <= FT_MOD_V; k++) bad += memcmp(observed(&r, l, k), a, nC * 4) != 0;
        ft_linear_forward(mid, observed(&r, l, FT_MOD_O), &ly->wo, NULL, T, 2, scr);
        for (size_t i = 0; i < nC; i++) mid[i] += x[i];
        ft_rmsnorm_forward(a, NULL, mid, ly->ffn_norm, T, C, c->norm_eps);
        bad += memcmp(observed(&r, l, FT_MOD_GATE), a, nC * 4) != 0;
        bad += memcmp(observed(&r, l, FT_MOD_UP), a, nC * 4) != 0;
        ft_linear_forward(g, a, &ly->w_gate, NULL, T, 2, scr);
        ft_linear_forward(u, a, &ly->w_up, NULL, T, 2, scr);
        ft_swiglu_forward(g, g, u, T, F);
        bad += memcmp(observed(&r, l, FT_MOD_DOWN), g, (size_t)T * F * 4) != 0;
        ft_linear_forward(a, g, &ly->w_down, NULL, T, 2, scr);
        for (size_t i = 0; i < nC; i++) a[i] += mid[i];
        bad += memcmp(out, a, nC * 4) != 0;
    }
    ft_rmsnorm_forward(a, NULL, r.rows[2 * c->L - 1], m->out_norm, T, C, c->norm_eps);
    ft_linear_forward(lg, a, &m->lm_head, NULL, T, 2, scr);
    bad += memcmp(lg, ref, (size_t)T * V * 4) != 0;
    CHECKF(bad == 0, "%d of the rows the hooks saw differ from what the block computed", bad);
    free(a); free(mid); free(g); free(u); free(scr);
out:
    rec_free(&r);
    free(ref); free(lg);
    ftune_session_free(s);
    ftune_model_free(m);
}

/* The trainer's hooks: forward 0..L-1 then backward L-1..0; q's input is
 * rmsnorm of the block input; the block output is the next block's input;
 * backward's d(output) of block l is the d(input) of block l+1; the hooks
 * leave loss and gradients unchanged. */
static void test_hooks_trainer(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    const ft_config *c = &m->cfg;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.max_B = 2; o.max_T = 9; o.n_threads = 2;
    ft_trainer *t1 = NULL, *t2 = NULL;
    CHECK_OK(ft_trainer_new(&t1, m, &o));
    CHECK_OK(ft_trainer_new(&t2, m, &o));
    if (!t1 || !t2) goto done;
    int32_t tok[18];
    int tg[18];
    for (int i = 0; i < 18; i++) { tok[i] = (int32_t)((i * 53 + 7) % c->V); tg[i] = i % 3 ? (i * 11) % c->V : -1; }
    ft_batch b = { .B = 2, .T = 9, .B_max = 2, .T_max = 9, .tokens = tok, .targets = tg };
    double l1, l2;
    CHECK_OK(ft_trainer_step(t1, &b, 12, &l1));
    recorder r = { 0 };
    ft_block_hooks hk = { .layer = rec_layer, .linear_input = rec_linear, .ctx = &r };
    ft_trainer_set_hooks(t2, &hk);
    CHECK_OK(ft_trainer_step(t2, &b, 12, &l2));
    ft_trainer_set_hooks(t2, NULL);
    CHECK(l1 == l2);
    int64_t n;
    float *g1 = ft_trainer_grads(t1, &n), *g2 = ft_trainer_grads(t2, &n);
    CHECK(memcmp(g1, g2, (size_t)n * sizeof(float)) == 0);
    int L = c->L, BT = 18, C = c->C;
    CHECKF(r.n_ev == 4 * L, "%d layer events for %d layers", r.n_ev, L);
    if (r.n_ev == 4 * L) {
        int bad = 0;
        for (int l = 0; l < L; l++) {
            CHECK(r.ev[2 * l] == FT_BLOCK_PRE_FORWARD && r.layer[2 * l] == l);
            CHECK(r.ev[2 * l + 1] == FT_BLOCK_POST_FORWARD && r.layer[2 * l + 1] == l);
            int j = 2 * L + 2 * (L - 1 - l);
            CHECK(r.ev[j] == FT_BLOCK_PRE_BACKWARD && r.layer[j] == l);
            CHECK(r.ev[j + 1] == FT_BLOCK_POST_BACKWARD && r.layer[j + 1] == l);
            if (l + 1 < L) bad += memcmp(r.rows[2 * l + 1], r.rows[2 * l + 2], (size_t)BT * C * 4) != 0;
            if (l > 0) bad += memcmp(r.rows[j + 1], r.rows[j + 2], (size_t)BT * C * 4) != 0;
            float *a = malloc((size_t)BT * C * 4);
            ft_rmsnorm_forward(a, NULL, r.rows[2 * l], m->layers[l].attn_norm, BT, C, c->norm_eps);
            const float *q = observed(&r, l, FT_MOD_Q);
            bad += !q || memcmp(q, a, (size_t)BT * C * 4) != 0;
            free(a);
        }
        CHECKF(bad == 0, "%d hook rows differ from what the block used", bad);
    }
    rec_free(&r);
done:
    ft_trainer_free(t1);
    ft_trainer_free(t2);
    ftune_model_free(m);
}

/* ------------------------------------------------ recompute */

/* What gradient checkpointing relies on: ft_block_forward is a pure
 * function of (x, weights, io), so a block recomputed from its saved input
 * into other memory (here pre-filled with garbage) saves bit-identical
 * activations, and backward from either gives bit-identical gradients. A
 * layer of stories260K with a LoRA adapter (random B, dropout 0.1) on q
 * and down, in training mode. */
typedef struct { float *p[60]; int n; } allocs;
/* max |a - b| / max |b| */
static double norm_err(const float *a, const float *b, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        m = d > m ? d : m;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    return s > 0 ? m / s : m;
}
static float *take(allocs *al, size_t n, float fill) {
    float *p = ft_aligned_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = fill;
    al->p[al->n++] = p;
    return p;
}
static ft_block_acts make_acts(allocs *al, const ft_config *c, int BT, int B, int R, float fill) {
    size_t C = c->C, F = c->F, qd = (size_t)c->NH * c->HS, kvd = (size_t)c->NKV * c->HS;
    ft_block_acts a = { .ln1 = take(al, BT * C, fill), .rstd1 = take(al, BT, fill), .q = take(al, BT * qd, fill),
                        .k = take(al, BT * kvd, fill), .v = take(al, BT * kvd, fill), .atty = take(al, BT * qd, fill),
                        .lse = take(al, (size_t)BT * c->NH, fill), .mid = take(al, BT * C, fill),
                        .ln2 = take(al, BT * C, fill), .rstd2 = take(al, BT, fill), .gate = take(al, BT * F, fill),
                        .up = take(al, BT * F, fill), .h = take(al, BT * F, fill) };
    a.u[FT_MOD_Q] = take(al, (size_t)BT * R, fill);
    a.u[FT_MOD_DOWN] = take(al, (size_t)BT * R, fill);
    (void)B;
    return a;
}
static void test_block_recompute(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    const ft_config *c = &m->cfg;
    enum { B = 2, T = 11, R = 3 };
    int BT = B * T, C = c->C, F = c->F, qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    ft_layer ly = m->layers[0];
    ft_lora lo[2];
    ft_adapter_hparams hp = { .r = R, .alpha = 6, .dropout = 0.1f };
    const ft_adapter_inst *set[FT_N_MODS] = { 0 }; /* layer 0's adapter set, bound by the block through its env */
    float *ad[2][4];
    int tg[2] = { FT_MOD_Q, FT_MOD_DOWN };
    for (int j = 0; j < 2; j++) {
        ft_linear *lin = ft_layer_linear(&ly, tg[j]);
        ad[j][0] = malloc((size_t)R * lin->in * 4); ad[j][1] = malloc((size_t)lin->out * R * 4);
        ad[j][2] = malloc((size_t)R * lin->in * 4); ad[j][3] = malloc((size_t)lin->out * R * 4);
        ft_lora_init(&lo[j], &hp, ad[j][0], ad[j][1], ad[j][2], ad[j][3], lin->in, lin->out, &rng);
        for (int i = 0; i < lin->out * R; i++) ad[j][1][i] = ft_rng_normal(&rng) * 0.1f;
        set[tg[j]] = &lo[j].base;
    }
    int pos[B * T], idx[T];
    for (int i = 0; i < BT; i++) pos[i] = i % T;
    for (int t = 0; t < T; t++) idx[t] = t;
    uint64_t seeds[FT_N_MODS] = { 11, 12, 13, 14, 15, 16, 17 };
    allocs al = { 0 };
    float *x = take(&al, (size_t)BT * C, 0);
    for (int i = 0; i < BT * C; i++) x[i] = ft_rng_normal(&rng);
    ft_block_acts a1 = make_acts(&al, c, BT, B, R, 0), a2 = make_acts(&al, c, BT, B, R, NAN);
    ft_block_acts a3 = make_acts(&al, c, BT, B, R, NAN);
    size_t lin_f = ft_linear_train_scratch_floats(F > qd ? (F > C ? F : C) : (qd > C ? qd : C), R, BT, 2);
    float *ls = ft_aligned_alloc(lin_f * 4);
    float *as = ft_aligned_alloc(ft_attention_fast_scratch_floats(T, c->HS, 2, true) * 4);
    ft_backend be = ft_backend_cpu(2);
    ft_block_env e = { .cfg = c, .inv_freq = NULL, .be = &be, .lin_scratch = ls, .att_scratch = as, .adapters = set };
    float *inv = take(&al, (size_t)c->HS / 2, 0);
    ft_rope_setup(inv, c, m->rope_freq_factors);
    e.inv_freq = inv;
    float *o1 = malloc((size_t)BT * C * 4), *o2 = malloc((size_t)BT * C * 4), *o3 = malloc((size_t)BT * C * 4);
    ft_block_io io1 = { .B = B, .T = T, .pos = pos, .q_pos = idx, .keys = a1.k, .values = a1.v, .Tk = T,
                        .train = true, .mask_seed = seeds };
    ft_block_io io2 = io1;
    io2.keys = a2.k; io2.values = a2.v;
    ft_block_io io3 = io1;
    io3.keys = a3.k; io3.values = a3.v;
    /* the same block through the reference backend: every op goes through
     * the env's table, so the result moves, but only by the order of float
     * sums: each op is within ~1e-6 of its reference (test_backend.c) and
     * the ~15 ops of a block compound that to a few 1e-6 at most, hence
     * 1e-5 normwise (max err / max |cpu|) */
    ft_backend ref = ft_backend_ref();
    ft_block_env e_ref = e;
    e_ref.be = &ref;
    ft_block_forward(&e, &ly, 0, &a1, o1, x, &io1);
    ft_block_forward(&e, &ly, 0, &a2, o2, x, &io2);
    ft_block_forward(&e_ref, &ly, 0, &a3, o3, x, &io3);
    double eo = norm_err(o3, o1, (size_t)BT * C);
    printf("  block forward, reference vs cpu backend: max rel err %.2e\n", eo);
    CHECKF(eo <= 1e-5, "block output through the reference backend: %.3e", eo);
    CHECK(memcmp(o3, o1, (size_t)BT * C * 4) != 0); /* it did run other arithmetic */
    int bad = memcmp(o1, o2, (size_t)BT * C * 4) != 0;
    const float *s1[] = { a1.ln1, a1.rstd1, a1.q, a1.k, a1.v, a1.atty, a1.lse, a1.mid, a1.ln2, a1.rstd2, a1.gate,
                          a1.up, a1.u[FT_MOD_Q], a1.u[FT_MOD_DOWN] };
    const float *s2[] = { a2.ln1, a2.rstd1, a2.q, a2.k, a2.v, a2.atty, a2.lse, a2.mid, a2.ln2, a2.rstd2, a2.gate,
                          a2.up, a2.u[FT_MOD_Q], a2.u[FT_MOD_DOWN] };
    size_t sz[] = { (size_t)BT * C, BT, (size_t)BT * qd, (size_t)BT * kvd, (size_t)BT * kvd, (size_t)BT * qd,
                    (size_t)BT * c->NH, (size_t)BT * C, (size_t)BT * C, BT, (size_t)BT * F, (size_t)BT * F,
                    (size_t)BT * R, (size_t)BT * R };
    for (int i = 0; i < 14; i++) bad += memcmp(s1[i], s2[i], sz[i] * 4) != 0;
    CHECKF(bad == 0, "%d saved arrays differ between the two forwards", bad);
    /* backward from each: the same adapter gradients, the same d(x) */
    float *grads[3][3];
    for (int rep = 0; rep < 3; rep++) {
        ft_block_scratch sc = { .dln = malloc((size_t)BT * C * 4), .dq = malloc((size_t)BT * qd * 4),
                                .datty = malloc((size_t)BT * qd * 4), .dk = malloc((size_t)BT * kvd * 4),
                                .dv = malloc((size_t)BT * kvd * 4), .h = malloc((size_t)BT * F * 4),
                                .dh = malloc((size_t)BT * F * 4), .dgate = malloc((size_t)BT * F * 4),
                                .dup = malloc((size_t)BT * F * 4) };
        float *dres = malloc((size_t)BT * C * 4);
        ft_rng r2;
        ft_rng_seed(&r2, 77);
        for (int i = 0; i < BT * C; i++) dres[i] = ft_rng_normal(&r2);
        for (int j = 0; j < 2; j++) {
            ft_linear *lin = ft_layer_linear(&ly, tg[j]);
            memset(ad[j][2], 0, (size_t)R * lin->in * 4);
            memset(ad[j][3], 0, (size_t)lin->out * R * 4);
        }
        ft_block_grads g = { 0 };
        if (rep < 2) ft_block_backward(&e, &ly, 0, &g, dres, x, rep ? &a2 : &a1, rep ? &io2 : &io1, &sc);
        else ft_block_backward(&e_ref, &ly, 0, &g, dres, x, &a3, &io3, &sc);
        grads[rep][0] = dres;
        grads[rep][1] = malloc((size_t)R * C * 4);
        memcpy(grads[rep][1], ad[0][2], (size_t)R * C * 4);
        grads[rep][2] = malloc((size_t)C * R * 4);
        memcpy(grads[rep][2], ad[1][3], (size_t)C * R * 4);
        free(sc.dln); free(sc.dq); free(sc.datty); free(sc.dk); free(sc.dv); free(sc.h); free(sc.dh);
        free(sc.dgate); free(sc.dup);
    }
    CHECK(memcmp(grads[0][0], grads[1][0], (size_t)BT * C * 4) == 0);
    CHECK(memcmp(grads[0][1], grads[1][1], (size_t)R * C * 4) == 0);
    CHECK(memcmp(grads[0][2], grads[1][2], (size_t)C * R * 4) == 0);
    float gm = 0;
    for (int i = 0; i < R * C; i++) gm = fmaxf(gm, fabsf(grads[0][1][i]));
    CHECK(gm > 0);
    double ed = norm_err(grads[2][0], grads[0][0], (size_t)BT * C);
    double ea = norm_err(grads[2][1], grads[0][1], (size_t)R * C);
    double eb = norm_err(grads[2][2], grads[0][2], (size_t)C * R);
    printf("  block backward, reference vs cpu backend: dx %.2e, dA(q) %.2e, dB(down) %.2e\n", ed, ea, eb);
    CHECKF(ed <= 1e-5 && ea <= 1e-5 && eb <= 1e-5, "block gradients through the reference backend");
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < 3; i++) free(grads[rep][i]);
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < 4; i++) free(ad[j][i]);
    for (int i = 0; i < al.n; i++) free(al.p[i]);
    free(ls); free(as); free(o1); free(o2); free(o3);
    ftune_model_free(m);
}

/* ------------------------------------------------ KV prefix */

/* A prefix of P cache rows taken from running P tokens, given to a fresh
 * session, gives bit for bit the logits of running those P tokens first;
 * reset returns to P; and it does change the result (against no prefix). */
static void test_kv_prefix(void) {
    const char *paths[2] = { stories_hf, stories_gguf };
    for (int pi = 0; pi < 2; pi++) {
        ftune_model *m = NULL;
        CHECK_OK(ftune_model_load(&m, paths[pi], NULL));
        if (!m) return;
        const ft_config *c = &m->cfg;
        int P = 7, T = 140, V = c->V, L = c->L;
        size_t kvd = (size_t)c->NKV * c->HS;
        int32_t ids[147];
        for (int i = 0; i < P + T; i++) ids[i] = (int32_t)((i * 97 + 3) % V);
        ftune_session *a = NULL, *b = NULL;
        CHECK_OK(ftune_session_new(&a, m, 160, 2));
        CHECK_OK(ftune_session_new(&b, m, 160, 2));
        float *la = malloc((size_t)T * V * 4), *lb = malloc((size_t)T * V * 4);
        float *k = malloc((size_t)L * P * kvd * 4), *v = malloc((size_t)L * P * kvd * 4);
        if (a && b && la && lb && k && v) {
            CHECK_OK(ftune_session_forward(a, ids, P, NULL, 0));
            for (int l = 0; l < L; l++) CHECK_OK(ft_session_get_kv(a, l, P, k + l * P * kvd, v + l * P * kvd));
            CHECK_OK(ftune_session_forward(a, ids + P, T, la, 1));
            CHECK_OK(ft_session_set_kv_prefix(b, k, v, P));
            CHECK(ftune_session_pos(b) == P);
            CHECK_OK(ftune_session_forward(b, ids + P, T, lb, 1));
            CHECK(memcmp(la, lb, (size_t)T * V * 4) == 0);
            ftune_session_reset(b);
            CHECK(ftune_session_pos(b) == P);
            CHECK_OK(ftune_session_forward(b, ids + P, 5, lb, 1));
            CHECK(memcmp(la, lb, (size_t)5 * V * 4) == 0);
            /* eval in windows after the prefix: the same as the plain
             * session's loss on the tokens after the prefix, predicted
             * with the prefix's tokens in context */
            ftune_eval_result eb = { 0 };
            CHECK_OK(ftune_eval_tokens(b, ids + P, T, &eb));
            CHECK(eb.n_predicted == T - 1);
            double want = 0;
            for (int t = 0; t + 1 < T; t++) {
                const float *row = la + (size_t)t * V;
                int y = ids[P + t + 1];
                want += ft_crossentropy_forward_backward(NULL, row, &y, 1, V, 0);
            }
            /* the same logits; crossentropy_fast against the double
             * reference: exp in float, ~2 ulp per term */
            CHECKF(fabs(eb.loss_sum - want) <= 1e-6 * want, "eval with prefix %.9g, want %.9g", eb.loss_sum, want);
            CHECK_OK(ft_session_set_kv_prefix(b, k, v, 0));
            CHECK(ftune_session_pos(b) == 0);
            CHECK_OK(ftune_session_forward(b, ids + P, 3, lb, 1));
            CHECK(memcmp(la, lb, (size_t)3 * V * 4) != 0);
            CHECK(ft_session_set_kv_prefix(b, k, v, 160) == FTUNE_ERR_RANGE);
            CHECK(ft_session_set_kv_prefix(b, NULL, v, 2) == FTUNE_ERR_ARG);
            CHECK(ft_session_get_kv(b, L, 1, k, v) == FTUNE_ERR_RANGE);
        }
        free(la); free(lb); free(k); free(v);
        ftune_session_free(a);
        ftune_session_free(b);
        ftune_model_free(m);
    }
}

/* A trainer's KV prefix: the validation loss with P prefix keys/values
 * (taken from a session's cache after P tokens) equals the session's loss
 * on the same rows after the same prefix, and the loss of a trainer without
 * a prefix on [prefix tokens; row] with the prefix's targets masked; the
 * step's gradient into the prefix matches central finite differences of
 * the validation loss; doc ids are refused while a prefix is set. */
static void test_kv_prefix_trainer(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    const ft_config *c = &m->cfg;
    enum { P = 4, T = 9, B = 2 };
    int V = c->V, L = c->L;
    size_t kvd = (size_t)c->NKV * c->HS, np = (size_t)L * P * kvd;
    int32_t pre[P], tok[B * T], cat[B * (P + T)];
    int tg[B * T], ctg[B * (P + T)];
    for (int i = 0; i < P; i++) pre[i] = (int32_t)((i * 29 + 2) % V);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 71 + 13) % V);
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++)
            tg[r * T + t] = t + 1 < T && t != 4 ? tok[r * T + t + 1] : -1;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < P + T; t++) {
            cat[r * (P + T) + t] = t < P ? pre[t] : tok[r * T + t - P];
            ctg[r * (P + T) + t] = t < P ? -1 : tg[r * T + t - P];
        }
    float *k = malloc(np * 4), *v = malloc(np * 4), *dk = calloc(np, 4), *dv = calloc(np, 4);
    float *lg = malloc((size_t)T * V * 4);
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, 32, 2));
    double want = 0;
    if (s) {
        CHECK_OK(ftune_session_forward(s, pre, P, NULL, 0));
        for (int l = 0; l < L; l++) CHECK_OK(ft_session_get_kv(s, l, P, k + l * P * kvd, v + l * P * kvd));
        for (int r = 0; r < B; r++) {
            CHECK_OK(ft_session_set_kv_prefix(s, k, v, P));
            CHECK_OK(ftune_session_forward(s, tok + r * T, T, lg, 1));
            want += ft_crossentropy_forward_backward(NULL, lg, tg + r * T, T, V, 0);
        }
    }
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.max_B = B; o.max_T = P + T; o.n_threads = 2;
    ft_trainer *tr = NULL, *tc = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    CHECK_OK(ft_trainer_new(&tc, m, &o));
    if (!tr || !tc || !s) goto done;
    ft_batch b = { .B = B, .T = T, .B_max = B, .T_max = T, .tokens = tok, .targets = tg };
    ft_batch bc = { .B = B, .T = P + T, .B_max = B, .T_max = P + T, .tokens = cat, .targets = ctg };
    double lp, lc;
    int64_t np_, nc;
    CHECK_OK(ft_trainer_set_kv_prefix(tr, k, v, P, dk, dv));
    CHECK_OK(ft_trainer_eval(tr, &b, &lp, &np_));
    CHECK_OK(ft_trainer_eval(tc, &bc, &lc, &nc));
    CHECK(np_ == nc);
    double e1 = fabs(lp - want) / want, e2 = fabs(lp - lc) / lc;
    printf("  prefix P=%d: validation %.10g, session %.10g (rel %.2e), whole sequence %.10g (rel %.2e)\n", P, lp,
           want, e1, lc, e2);
    /* float32 forwards over the same keys in other call shapes (and the
     * reference cross-entropy against the float one): 1e-6 of the sum */
    CHECKF(e1 < 1e-6 && e2 < 1e-6, "rel diffs %.3g %.3g", e1, e2);
    double ls;
    CHECK_OK(ft_trainer_step(tr, &b, 1, &ls));
    CHECKF(ls == lp, "step loss %.17g, validation %.17g", ls, lp);
    /* central differences at a few prefix entries of the first and the last
     * layer, and at lora_B entries of k_proj (its gradient flows through the
     * prefix-assembled keys' own rows). The ~265 loss in float32 carries
     * ~3e-5 of rounding, i.e. ~2e-3 in a difference over 2e-2: tolerance
     * 2e-2 of the largest gradient + 5e-3 */
    float gmax = 0;
    for (size_t i = 0; i < np; i++) gmax = fmaxf(gmax, fmaxf(fabsf(dk[i]), fabsf(dv[i])));
    double worst = 0;
    int ib0 = ft_trainer_find_param(tr, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight");
    CHECK(ib0 >= 0);
    if (ib0 < 0) goto done;
    const ft_param *pb = &ft_trainer_param(tr, ib0)->opt;
    float *pts[14], *gs[14];
    size_t at[6] = { 0, 5, kvd + 3, (size_t)(L - 1) * P * kvd + 1, (size_t)(L - 1) * P * kvd + 2 * kvd + 7, np - 1 };
    for (int j = 0; j < 6; j++) { pts[j] = k + at[j]; gs[j] = dk + at[j]; pts[6 + j] = v + at[j]; gs[6 + j] = dv + at[j]; }
    pts[12] = pb->data + 3; gs[12] = pb->grad + 3;
    pts[13] = pb->data + pb->numel - 2; gs[13] = pb->grad + pb->numel - 2;
    CHECK(*gs[12] != 0 && *gs[13] != 0); /* not a vacuous comparison of zeros */
    for (int j = 0; j < 14; j++) {
        float x0 = *pts[j];
        double lplus, lminus;
        int64_t n_;
        *pts[j] = x0 + 1e-2f;
        CHECK_OK(ft_trainer_eval(tr, &b, &lplus, &n_));
        *pts[j] = x0 - 1e-2f;
        CHECK_OK(ft_trainer_eval(tr, &b, &lminus, &n_));
        *pts[j] = x0;
        double fd = (lplus - lminus) / (2e-2), g = *gs[j];
        double err = fabs(fd - g);
        if (err > worst) worst = err;
        CHECKF(err <= 2e-2 * gmax + 5e-3, "point %d: gradient %.6g, finite difference %.6g", j, g, fd);
    }
    printf("  prefix gradient vs finite differences: max abs err %.2e (largest gradient %.3g)\n", worst, gmax);
    CHECK(gmax > 0);
    int doc[B * T] = { 0 };
    b.doc = doc;
    CHECK(ft_trainer_eval(tr, &b, &ls, &np_) == FTUNE_ERR_UNSUPPORTED);
    CHECK(ft_trainer_set_kv_prefix(tr, k, v, -1, NULL, NULL) == FTUNE_ERR_ARG);
    CHECK_OK(ft_trainer_set_kv_prefix(tr, NULL, NULL, 0, NULL, NULL));
    b.doc = NULL;
    CHECK_OK(ft_trainer_eval(tr, &b, &ls, &np_));
    CHECK(ls != lp);
done:
    ftune_session_free(s);
    ft_trainer_free(tr);
    ft_trainer_free(tc);
    free(k); free(v); free(dk); free(dv); free(lg);
    ftune_model_free(m);
}

/* ------------------------------------------------ eval = validation */

/* ftune_eval_tokens (what `ftune eval` runs) and ft_trainer_eval (the
 * trainer's validation) on the same tokens: one window, targets the next
 * tokens. Both run the same block and the same fused loss; the session
 * goes through its KV cache 128 tokens at a time. */
static void test_eval_equals_validation(void) {
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, stories_hf, NULL));
    if (!m) return;
    int V = m->cfg.V;
    int ns[2] = { 100, 250 };
    for (int ni = 0; ni < 2; ni++) {
        int n = ns[ni];
        int32_t *ids = malloc((size_t)n * 4);
        int *tg = malloc((size_t)n * sizeof(int));
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 131 + 5) % V);
        for (int i = 0; i + 1 < n; i++) tg[i] = ids[i + 1];
        ftune_session *s = NULL;
        CHECK_OK(ftune_session_new(&s, m, n, 2));
        ftune_eval_result ev = { 0 };
        if (s) CHECK_OK(ftune_eval_tokens(s, ids, (size_t)n, &ev));
        for (int mode = 0; mode < 2; mode++) {
            ft_train_opts o;
            ft_train_opts_default(&o);
            o.mode = mode ? FT_TRAIN_FULL : FT_TRAIN_LORA;
            o.max_B = 1; o.max_T = n - 1; o.n_threads = 2;
            ft_trainer *tr = NULL;
            CHECK_OK(ft_trainer_new(&tr, m, &o));
            if (!tr) continue;
            ft_batch b = { .B = 1, .T = n - 1, .B_max = 1, .T_max = n - 1, .tokens = ids, .targets = tg };
            double vl;
            int64_t vn;
            CHECK_OK(ft_trainer_eval(tr, &b, &vl, &vn));
            double rel = fabs(vl - ev.loss_sum) / ev.loss_sum;
            printf("  n=%d %s: eval %.12g (%lld), validation %.12g (%lld), rel diff %.2e\n", n,
                   mode ? "full" : "lora", ev.loss_sum, (long long)ev.n_predicted, vl, (long long)vn, rel);
            CHECK(vn == ev.n_predicted && vn == n - 1);
            /* one chunk (n - 1 <= 128): the same calls on the same rows, bit
             * for bit. More: the session's KV-cache chunks and the batch
             * differ in BLAS call shapes and in attention's key tiles only,
             * float32 summation order: 1e-6 of the summed loss */
            if (n - 1 <= 128) CHECKF(vl == ev.loss_sum, "validation %.17g, eval %.17g", vl, ev.loss_sum);
            else CHECKF(rel < 1e-6, "rel diff %.3g", rel);
            ft_trainer_free(tr);
        }
        ftune_session_free(s);
        free(ids); free(tg);
    }
    ftune_model_free(m);
}

int main(void) {
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    check_data_path(stories_gguf, sizeof stories_gguf, "models/stories260K/stories260K.gguf");
    RUN(test_lm_loss_vs_reference);
    RUN(test_lm_loss_bad_target);
    RUN(test_hooks_session);
    RUN(test_hooks_trainer);
    RUN(test_block_recompute);
    RUN(test_kv_prefix);
    RUN(test_kv_prefix_trainer);
    RUN(test_eval_equals_validation);
    CHECK_EXIT();
}
