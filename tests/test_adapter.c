/* test_adapter.c — LoRA adapters as files: PEFT write → read round trip
 * (bit-exact A and B), the q/k row permutation between the interleaved
 * (GGUF) and rotate-half (HF) layouts checked through the logits of the two
 * stories260K models, the GGUF adapter's metadata, shapes and B layout,
 * bad adapters (shape, target module, missing tensor, DoRA, the real GPT-2
 * PEFT adapter) failing with the tensor or field named, and merging:
 * merged weights in memory, written as HF or GGUF and reloaded, and the
 * unmerged base + LoRA forward all give the same logits. */
#include "check.h"
#include "adapter/adapter.h"
#include "core/mem.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[512];
static char hf_path[1024], gguf_path[1024];

#define T_TOK 24
static const int32_t toks[T_TOK] = { 1, 403, 261, 378, 267, 283, 300, 285, 297, 268, 416, 289,
                                     263, 262, 296, 290, 338, 269, 273, 287, 280, 417, 261, 266 };

static const char *tmp(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static ftune_model *load(const char *path) {
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, path, NULL);
    if (st) fprintf(stderr, "  load %s: %s\n", path, ftune_last_error());
    return m;
}

/* Logits (T_TOK, V) of the model on toks run with adapter a (NULL: the
 * model's default adapter, if any), or NULL. */
static float *logits_with(const ftune_model *m, const ft_adapter *a) {
    ftune_session *s = NULL;
    if (ftune_session_new(&s, m, 64, 1)) { fprintf(stderr, "  session: %s\n", ftune_last_error()); return NULL; }
    if (a && ftune_session_set_adapter(s, a)) { ftune_session_free(s); return NULL; }
    float *out = malloc((size_t)T_TOK * m->cfg.V * sizeof(float));
    if (ftune_session_forward(s, toks, T_TOK, out, 1)) {
        fprintf(stderr, "  forward: %s\n", ftune_last_error());
        free(out);
        out = NULL;
    }
    ftune_session_free(s);
    return out;
}
static float *logits(const ftune_model *m) { return logits_with(m, NULL); }

/* Max relative error of logits with the largest reference logit as the
 * floor (so: max |a - b| / max |b|). Float32 rounding of a weight moves
 * every logit by about the same absolute amount, whatever its size. */
static double logit_err(const float *a, const float *b, long n) {
    double mx = 0;
    for (long i = 0; i < n; i++) mx = fmax(mx, fabs((double)b[i]));
    return check_max_rel_err(a, b, n, mx);
}

/* Logits (T_TOK, V) of the HF model dir on toks from scripts/ref_forward.py
 * (float64), its matrices first rounded to quant (the output one to
 * out_quant), or NULL. */
static float *ref_logits(const char *dir, const char *quant, const char *out_quant) {
    char out[600], cmd[4096], arg[T_TOK * 8];
    size_t k = 0, n = 0;
    for (int i = 0; i < T_TOK; i++) k += (size_t)snprintf(arg + k, sizeof arg - k, "%s%d", i ? "," : "", toks[i]);
    snprintf(out, sizeof out, "%s/ref_%s.logits", tmpdir, quant);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 scripts/ref_forward.py --model %s --tokens %s --quantize %s --quantize-output %s --out %s",
             dir, arg, quant, out_quant, out);
    if (system(cmd) != 0) { fprintf(stderr, "  failed: %s\n", cmd); return NULL; }
    char *buf = NULL;
    float *ref = NULL;
    if (ft_read_file(out, &buf, &n) == FTUNE_OK && n >= 12) {
        int32_t hdr[3];
        memcpy(hdr, buf, 12);
        if (hdr[0] == 1 && hdr[1] == T_TOK && n == 12 + (size_t)T_TOK * hdr[2] * 4 && (ref = malloc(n - 12)))
            memcpy(ref, buf + 12, n - 12);
    }
    if (!ref) fprintf(stderr, "  %s: not one sequence of %d logits rows\n", out, T_TOK);
    free(buf);
    return ref;
}

/* Random B (and so a non-trivial adapter): N(0, std²) from a fixed seed. */
static void randomize_b(ft_adapter *a, uint64_t seed, float std) {
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int i = 0; i < a->n; i++) {
        size_t nb = (size_t)a->e[i].lin->out * a->e[i].lora->base.hp->r;
        for (size_t j = 0; j < nb; j++) a->e[i].lora->B[j] = std * ft_rng_normal(&rng);
    }
}

static bool contains(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

/* ------------------------------------------------------------- layout */

static void test_permute_rows(void) {
    /* 2 heads of 4 rows, 1 column: rotate-half rows (a0 a1 b0 b1) <-> interleaved (a0 b0 a1 b1) */
    float w[8] = { 0, 1, 2, 3, 10, 11, 12, 13 };
    CHECK_OK(ft_permute_rope_rows(w, 8, 1, 2, true));
    const float want[8] = { 0, 2, 1, 3, 10, 12, 11, 13 };
    CHECK(memcmp(w, want, sizeof w) == 0);
    CHECK_OK(ft_permute_rope_rows(w, 8, 1, 2, false));
    const float orig[8] = { 0, 1, 2, 3, 10, 11, 12, 13 };
    CHECK(memcmp(w, orig, sizeof w) == 0);
    /* a larger matrix: the inverse undoes it exactly, and it is not the identity */
    float *x = malloc(64 * 3 * sizeof(float)), *y = malloc(64 * 3 * sizeof(float));
    for (int i = 0; i < 64 * 3; i++) x[i] = y[i] = (float)i;
    CHECK_OK(ft_permute_rope_rows(y, 64, 3, 8, true));
    CHECK(memcmp(x, y, 64 * 3 * sizeof(float)) != 0);
    CHECK_OK(ft_permute_rope_rows(y, 64, 3, 8, false));
    CHECK(memcmp(x, y, 64 * 3 * sizeof(float)) == 0);
    CHECK(ft_permute_rope_rows(y, 63, 3, 8, true) == FTUNE_ERR_ARG);
    free(x);
    free(y);
}

/* ------------------------------------------------------------- PEFT */

static void test_peft_round_trip(void) {
    ftune_model *m = load(hf_path);
    if (!m) { CHECK(m != NULL); return; }
    ft_adapter_hparams cfg = { .r = 4, .alpha = 8, .dropout = 0.05f, .targets = FT_MOD_ALL };
    ft_adapter *a = NULL;
    cfg.seed = 42;
    CHECK_OK(ft_adapter_attach(&a, m, &cfg, true));
    if (!a) { ftune_model_free(m); return; }
    CHECK(a->n == 5 * 7);
    CHECK(a->set[2 * 7 + FT_MOD_UP] == &a->e[2 * 7 + FT_MOD_UP].lora->base); /* in the adapter's set (a Linear holds none) */
    CHECK(a->e[0].lora->dA && a->e[0].lora->dB && ft_lora_scale_of(a->e[0].lora) == 2.0f);
    /* PEFT init: A in [-1/sqrt(in), 1/sqrt(in)], B zero */
    float amax = 0;
    for (int j = 0; j < 4 * 64; j++) amax = fmaxf(amax, fabsf(a->e[0].lora->A[j]));
    CHECK(amax > 0.1f && amax <= 0.125f);
    CHECK(a->e[0].lora->B[0] == 0 && a->e[0].lora->B[63 * 4 + 3] == 0);
    /* its trainables, as the optimizer sees them: one AdamW step with every grad 1 moves each value by -lr */
    ft_param *ps = calloc((size_t)2 * a->n, sizeof *ps);
    CHECK_OK(ft_adapter_params(a, ps));
    CHECK(strcmp(ps[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight") == 0);
    CHECK(ps[1].shape[0] == 64 && ps[1].shape[1] == 4 && ps[1].numel == 256 && ps[1].data == a->e[0].lora->B);
    CHECK(ps[12].shape[0] == 4 && ps[12].shape[1] == 172); /* layer 0 down_proj A */
    for (int i = 0; i < 2 * a->n; i++)
        for (int64_t j = 0; j < ps[i].numel; j++) ps[i].grad[j] = 1.0f;
    ft_adamw_cfg oc;
    ft_adamw_defaults(&oc);
    ft_adamw opt;
    CHECK_OK(ft_adamw_init(&opt, ps, 2 * a->n, &oc));
    float a0 = a->e[0].lora->A[0];
    ft_adamw_step(&opt, 1e-3);
    /* first Adam step: m̂/sqrt(v̂) = 1/(1 + 1e-8), so the change is lr to float rounding (1e-7 of 1e-3) */
    CHECK(fabsf(a->e[0].lora->B[7] + 1e-3f) < 1e-9f && fabsf(a->e[0].lora->A[0] - (a0 - 1e-3f)) < 1e-7f);
    ft_adamw_free(&opt);
    memset(a->e[0].lora->B, 0, 256 * sizeof(float));
    free(ps);
    ft_adapter *fz = NULL;
    ft_adapter_hparams one = { .r = 2, .alpha = 2, .targets = FT_MOD_BIT(FT_MOD_Q) };
    ftune_model *m2 = load(hf_path);
    one.seed = 1;
    CHECK_OK(ft_adapter_attach(&fz, m2, &one, false));
    ft_param fp[10];
    CHECK(fz && ft_adapter_params(fz, fp) == FTUNE_ERR_ARG);
    ft_adapter_free(fz);
    ftune_model_free(m2);
    /* a second adapter for the same model is its own: the model is not written */
    ft_adapter *a2 = NULL;
    cfg.seed = 1;
    CHECK_OK(ft_adapter_attach(&a2, m, &cfg, false));
    CHECK(a2 && a2->set[0] != a->set[0]);
    ft_adapter_free(a2);
    randomize_b(a, 7, 0.05f);
    snprintf(a->base_model, sizeof a->base_model, "stories260K-hf");
    char dir[600], p[700];
    tmp(dir, sizeof dir, "peft_hf");
    CHECK_OK(ft_adapter_save_peft(a, dir));
    /* keep copies, then drop the adapter and load the files */
    int n = a->n;
    size_t tot = 0;
    for (int i = 0; i < n; i++) tot += (size_t)4 * (a->e[i].lin->in + a->e[i].lin->out);
    float *copy = malloc(tot * sizeof(float)), *c = copy;
    for (int i = 0; i < n; i++) {
        size_t na = (size_t)4 * a->e[i].lin->in, nb = (size_t)4 * a->e[i].lin->out;
        memcpy(c, a->e[i].lora->A, na * 4); c += na;
        memcpy(c, a->e[i].lora->B, nb * 4); c += nb;
    }
    ft_adapter_free(a);

    ft_peft_config pc;
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    CHECK_OK(ft_peft_config_read(&pc, p));
    CHECK(pc.hp.r == 4 && pc.hp.alpha == 8 && fabsf(pc.hp.dropout - 0.05f) < 1e-7f && !pc.hp.rslora && pc.n_targets == 7);
    CHECK(pc.n_targets == 7 && strcmp(pc.targets[0], "q_proj") == 0 && strcmp(pc.targets[6], "down_proj") == 0);
    CHECK(strcmp(pc.base_model, "stories260K-hf") == 0);
    ft_peft_config_free(&pc);
    char *text = NULL;
    CHECK_OK(ft_read_file(p, &text, NULL));
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    CHECK(j != NULL);
    if (j) {
        CHECK(strcmp(cJSON_GetObjectItem(j, "peft_type")->valuestring, "LORA") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(j, "task_type")->valuestring, "CAUSAL_LM") == 0);
        CHECK(strcmp(cJSON_GetObjectItem(j, "bias")->valuestring, "none") == 0);
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "fan_in_fan_out")));
        CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "inference_mode")));
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "use_rslora")));
        CHECK(cJSON_GetObjectItem(j, "layers_to_transform") == NULL);
    }
    cJSON_Delete(j);
    free(text);
    st_file f;
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    CHECK_OK(ft_st_open(&f, p));
    CHECK(f.n == 2 * n);
    const st_tensor *t = ft_st_find(&f, "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight");
    CHECK(t && t->dtype == FT_F32 && t->ndim == 2 && t->shape[0] == 64 && t->shape[1] == 4);
    t = ft_st_find(&f, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
    CHECK(t && t->shape[0] == 4 && t->shape[1] == 172);
    CHECK(ft_st_meta(&f, "format") && strcmp(ft_st_meta(&f, "format"), "pt") == 0);
    ft_st_close(&f);

    CHECK_OK(ft_adapter_load_peft(&a, m, dir, false));
    if (a) {
        CHECK(a->n == n && a->cfg.r == 4 && a->cfg.alpha == 8 && ft_lora_scale_of(a->e[0].lora) == 2.0f);
        CHECK(a->e[0].lora->dA == NULL);
        c = copy;
        bool same = true;
        for (int i = 0; i < n; i++) {
            size_t na = (size_t)4 * a->e[i].lin->in, nb = (size_t)4 * a->e[i].lin->out;
            same &= memcmp(c, a->e[i].lora->A, na * 4) == 0; c += na;
            same &= memcmp(c, a->e[i].lora->B, nb * 4) == 0; c += nb;
            same &= a->set[a->e[i].layer * FT_N_MODS + a->e[i].mod] == &a->e[i].lora->base;
        }
        CHECK(same);
    }
    ft_adapter_free(a);
    free(copy);
    ftune_model_free(m);
}

/* A GGUF (interleaved) adapter written as PEFT loads onto the HF model and
 * back onto the GGUF one: B round-trips bit-exactly and both merged models
 * give the same logits. */
static void test_qk_layout_across_models(void) {
    ftune_model *g = load(gguf_path), *h = load(hf_path), *g2 = load(gguf_path);
    if (!g || !h || !g2) { CHECK(0); goto out; }
    CHECK(g->cfg.rope_interleaved && !h->cfg.rope_interleaved);
    ft_adapter_hparams cfg = { .r = 4, .alpha = 6, .rslora = true, .targets = FT_MOD_ALL };
    ft_adapter *ag = NULL, *ah = NULL, *ag2 = NULL;
    cfg.seed = 3;
    CHECK_OK(ft_adapter_attach(&ag, g, &cfg, false));
    if (!ag) goto out;
    randomize_b(ag, 11, 0.05f);
    char dir[600], p[700];
    tmp(dir, sizeof dir, "peft_from_gguf");
    CHECK_OK(ft_adapter_save_peft(ag, dir));
    CHECK_OK(ft_adapter_load_peft(&ah, h, dir, false));
    CHECK_OK(ft_adapter_load_peft(&ag2, g2, dir, false));
    if (!ah || !ag2) goto free_adapters;
    /* the file holds q's B in rotate-half order: it differs from the interleaved one, v's does not */
    st_file f;
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    CHECK_OK(ft_st_open(&f, p));
    const st_tensor *bq = ft_st_find(&f, "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
    const st_tensor *bv = ft_st_find(&f, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
    CHECK(bq && memcmp(bq->data, ag->e[7 + FT_MOD_Q].lora->B, 64 * 4 * 4) != 0);
    CHECK(bv && memcmp(bv->data, ag->e[7 + FT_MOD_V].lora->B, 32 * 4 * 4) == 0);
    CHECK(bq && memcmp(bq->data, ah->e[7 + FT_MOD_Q].lora->B, 64 * 4 * 4) == 0);
    ft_st_close(&f);
    bool same = ag2->n == ag->n;
    for (int i = 0; same && i < ag->n; i++) {
        const ft_adapter_entry *x = &ag->e[i], *y = &ag2->e[i];
        same &= memcmp(x->lora->A, y->lora->A, (size_t)4 * x->lin->in * 4) == 0;
        same &= memcmp(x->lora->B, y->lora->B, (size_t)4 * x->lin->out * 4) == 0;
    }
    CHECK(same);
    CHECK(ah->e[0].lora->base.hp->rslora && ft_lora_scale_of(ah->e[0].lora) == 3.0f); /* 6 / sqrt(4) */
    CHECK_OK(ft_merge_lora(g, ag));
    CHECK_OK(ft_merge_lora(h, ah));
    CHECK(g->layers[0].wq.w.dtype == FT_F32);
    float *lg = logits(g), *lh = logits(h);
    if (lg && lh) {
        ft_adapter_free(ag2);
        ag2 = NULL;
        float *lplain = logits(g2); /* g2 without its adapter: the base model */
        long n = (long)T_TOK * g->cfg.V;
        double err = logit_err(lh, lg, n), moved = lplain ? logit_err(lplain, lg, n) : 0;
        printf("  merged HF vs merged GGUF logits: max rel err %.3g (the adapter moves them by %.3g)\n", err, moved);
        /* the same merged rows in two layouts: float32 forwards that differ only in the order of
         * RoPE pairs, so attention scores are summed in float in a different order (measured
         * ~1e-6); a wrong permutation moves logits by ~the adapter's effect (~0.1 or more) */
        CHECKF(err < 1e-5, "%g", err);
        /* the adapter must matter, or the comparison proves nothing */
        CHECKF(moved > 1e-1, "%g", moved);
        free(lplain);
    }
    free(lg); free(lh);
free_adapters:
    ft_adapter_free(ag);
    ft_adapter_free(ah);
    ft_adapter_free(ag2);
out:
    ftune_model_free(g);
    ftune_model_free(h);
    ftune_model_free(g2);
}

/* An adapter over LoRA structs owned elsewhere (as a trainer holds them)
 * writes the same file; partial target sets round-trip through
 * layers_to_transform or a regex. */
static bool same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool same = ft_read_file(a, &x, &nx) == FTUNE_OK && ft_read_file(b, &y, &ny) == FTUNE_OK && nx == ny &&
                memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static void test_wrap_and_partial(void) {
    ftune_model *m = load(hf_path), *m2 = load(hf_path);
    if (!m || !m2) { CHECK(0); ftune_model_free(m); ftune_model_free(m2); return; }
    ft_adapter_hparams cfg = { .r = 2, .alpha = 4, .targets = FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_V) };
    ft_adapter *a = NULL, *w = NULL, *b = NULL;
    cfg.seed = 8;
    CHECK_OK(ft_adapter_attach(&a, m, &cfg, false));
    if (!a) goto out;
    randomize_b(a, 17, 0.05f);
    ft_lora *loras[5 * FT_N_MODS] = { 0 };
    for (int i = 0; i < a->n; i++) loras[a->e[i].layer * FT_N_MODS + a->e[i].mod] = a->e[i].lora;
    CHECK_OK(ft_adapter_wrap(&w, m, loras));
    char d1[600], d2[600], p1[700], p2[700];
    CHECK_OK(ft_adapter_save_peft(a, tmp(d1, sizeof d1, "owned")));
    if (w) {
        CHECK(w->n == a->n && w->cfg.targets == cfg.targets && w->cfg.r == 2);
        CHECK_OK(ft_adapter_save_peft(w, tmp(d2, sizeof d2, "wrapped")));
        snprintf(p1, sizeof p1, "%s/adapter_model.safetensors", d1);
        snprintf(p2, sizeof p2, "%s/adapter_model.safetensors", d2);
        CHECK(same_file(p1, p2));
        snprintf(p1, sizeof p1, "%s/adapter_config.json", d1);
        snprintf(p2, sizeof p2, "%s/adapter_config.json", d2);
        CHECK(same_file(p1, p2));
        ft_adapter_free(w);
        w = NULL;
    }
    CHECK(a->set[0] == &a->e[0].lora->base && a->e[0].lora->B); /* freeing a wrapper leaves the owner's adapters */
    /* structs that disagree on r are refused */
    ft_lora odd = *loras[FT_MOD_Q];
    ft_adapter_hparams odd_hp = *odd.base.hp;
    odd_hp.r = 3;
    odd.base.hp = &odd_hp;
    loras[FT_MOD_V] = &odd;
    CHECK(ft_adapter_wrap(&w, m, loras) == FTUNE_ERR_ARG);
    loras[FT_MOD_V] = a->e[1].lora;
    /* the same modules on a subset of layers: a list and layers_to_transform */
    for (int l = 0; l < 5; l++)
        if (l != 1 && l != 3) loras[l * FT_N_MODS + FT_MOD_Q] = loras[l * FT_N_MODS + FT_MOD_V] = NULL;
    CHECK_OK(ft_adapter_wrap(&w, m, loras));
    if (w) CHECK_OK(ft_adapter_save_peft(w, tmp(d1, sizeof d1, "layers13")));
    ft_adapter_free(w);
    w = NULL;
    ft_peft_config pc;
    snprintf(p1, sizeof p1, "%s/adapter_config.json", d1);
    CHECK_OK(ft_peft_config_read(&pc, p1));
    CHECK(pc.n_targets == 2 && pc.n_layers_to_transform == 2 && pc.layers_to_transform[0] == 1 &&
          pc.layers_to_transform[1] == 3);
    ft_peft_config_free(&pc);
    CHECK_OK(ft_adapter_load_peft(&b, m2, d1, false));
    CHECK(b && b->n == 4 && b->e[0].layer == 1 && b->e[3].layer == 3);
    if (b) CHECK(memcmp(b->e[2].lora->B, loras[3 * FT_N_MODS + FT_MOD_Q]->B, 64 * 2 * 4) == 0);
    ft_adapter_free(b);
    b = NULL;
    /* different modules on different layers: a regex naming each Linear */
    loras[1 * FT_N_MODS + FT_MOD_V] = NULL;
    loras[3 * FT_N_MODS + FT_MOD_Q] = NULL;
    CHECK_OK(ft_adapter_wrap(&w, m, loras));
    if (w) CHECK_OK(ft_adapter_save_peft(w, tmp(d1, sizeof d1, "mixed")));
    ft_adapter_free(w);
    w = NULL;
    snprintf(p1, sizeof p1, "%s/adapter_config.json", d1);
    CHECK_OK(ft_peft_config_read(&pc, p1));
    CHECK(pc.target_regex && strcmp(pc.target_regex, "(model\\.layers\\.1\\.self_attn\\.q_proj|"
                                                     "model\\.layers\\.3\\.self_attn\\.v_proj)") == 0);
    ft_peft_config_free(&pc);
    CHECK_OK(ft_adapter_load_peft(&b, m2, d1, false));
    CHECK(b && b->n == 2 && b->e[0].layer == 1 && b->e[0].mod == FT_MOD_Q && b->e[1].layer == 3 && b->e[1].mod == FT_MOD_V);
    ft_adapter_free(b);
out:
    ft_adapter_free(a);
    ftune_model_free(m);
    ftune_model_free(m2);
}

/* PyTorch applies the PEFT file (written from the GGUF model, so with q/k
 * B permuted back to rotate-half) to the HF model in float64
 * (scripts/ref_peft.py); our GGUF model with the adapter attached, not
 * merged, must give the same logits. */
static void test_peft_vs_torch(void) {
    ftune_model *g = load(gguf_path);
    if (!g) { CHECK(0); return; }
    ft_adapter_hparams cfg = { .r = 4, .alpha = 6, .rslora = true, .targets = FT_MOD_ALL };
    ft_adapter *a = NULL;
    cfg.seed = 31;
    CHECK_OK(ft_adapter_attach(&a, g, &cfg, false));
    float *ours = NULL, *ref = NULL;
    char *buf = NULL;
    if (!a) goto out;
    randomize_b(a, 37, 0.02f);
    char dir[600], out[600], cmd[4096], arg[T_TOK * 8];
    CHECK_OK(ft_adapter_save_peft(a, tmp(dir, sizeof dir, "peft_for_torch")));
    size_t k = 0;
    for (int i = 0; i < T_TOK; i++) k += (size_t)snprintf(arg + k, sizeof arg - k, "%s%d", i ? "," : "", toks[i]);
    tmp(out, sizeof out, "ref_peft.logits");
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/ref_peft.py --model %s --adapter %s --tokens %s --out %s",
             hf_path, dir, arg, out);
    CHECK(system(cmd) == 0);
    size_t n = 0;
    long NV = (long)T_TOK * g->cfg.V;
    CHECK_OK(ft_read_file(out, &buf, &n));
    if (!buf || n != 12 + (size_t)NV * 4) { CHECK(0); goto out; }
    int32_t hdr[3];
    memcpy(hdr, buf, 12);
    CHECK(hdr[0] == 1 && hdr[1] == T_TOK && hdr[2] == g->cfg.V);
    ref = malloc((size_t)NV * 4);
    memcpy(ref, buf + 12, (size_t)NV * 4);
    ours = logits_with(g, a);
    if (ours) {
        double e = logit_err(ours, ref, NV);
        printf("  GGUF base + LoRA (float32) vs PEFT applied by PyTorch to the HF base (float64): max rel err %.3g\n", e);
        /* float32 against float64 through 5 layers: ~1e-6 of the largest logit measured; a q/k B left in the
         * wrong layout moves logits by ~1e-1 */
        CHECKF(e < 1e-5, "%g", e);
    }
out:
    free(buf);
    free(ref);
    free(ours);
    ft_adapter_free(a);
    ftune_model_free(g);
}

/* ------------------------------------------------------------- GGUF adapter */

static void test_gguf_adapter(void) {
    ftune_model *h = load(hf_path), *g = load(gguf_path);
    if (!h || !g) { CHECK(0); goto out; }
    ft_adapter_hparams cfg = { .r = 4, .alpha = 8, .rslora = true, .targets = FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_K) |
                                                                     FT_MOD_BIT(FT_MOD_V) | FT_MOD_BIT(FT_MOD_DOWN) };
    ft_adapter *ah = NULL, *ag = NULL;
    cfg.seed = 5;
    CHECK_OK(ft_adapter_attach(&ah, h, &cfg, false));
    if (!ah) goto out;
    randomize_b(ah, 13, 0.05f);
    char p[600], dir[600];
    tmp(p, sizeof p, "from_hf.gguf");
    CHECK_OK(ft_adapter_save_gguf(ah, p));
    /* the same adapter as PEFT, loaded onto the GGUF model: its B is in the interleaved layout llama.cpp uses */
    tmp(dir, sizeof dir, "peft_qkvd");
    CHECK_OK(ft_adapter_save_peft(ah, dir));
    CHECK_OK(ft_adapter_load_peft(&ag, g, dir, false));
    gguf_file gf;
    CHECK_OK(ft_gguf_open(&gf, p));
    gguf_str s;
    double alpha = 0;
    CHECK(ft_gguf_get_str(&gf, "general.architecture", &s) && ft_gguf_str_eq(s, "llama"));
    CHECK(ft_gguf_get_str(&gf, "general.type", &s) && ft_gguf_str_eq(s, "adapter"));
    CHECK(ft_gguf_get_str(&gf, "adapter.type", &s) && ft_gguf_str_eq(s, "lora"));
    const gguf_kv *kv = ft_gguf_find(&gf, "adapter.lora.alpha");
    CHECK(kv && kv->type == GGUF_T_F32);
    CHECK(ft_gguf_get_f64(&gf, "adapter.lora.alpha", &alpha) && alpha == 16.0); /* rsLoRA: 8·sqrt(4), so 16/4 = 8/sqrt(4) */
    CHECK(gf.n_tensors == (uint64_t)2 * 4 * 5);
    const gguf_tensor_info *ta = ft_gguf_find_tensor(&gf, "blk.2.attn_q.weight.lora_a");
    const gguf_tensor_info *tb = ft_gguf_find_tensor(&gf, "blk.2.attn_q.weight.lora_b");
    const gguf_tensor_info *tk = ft_gguf_find_tensor(&gf, "blk.2.attn_k.weight.lora_b");
    const gguf_tensor_info *tv = ft_gguf_find_tensor(&gf, "blk.2.attn_v.weight.lora_b");
    const gguf_tensor_info *td = ft_gguf_find_tensor(&gf, "blk.4.ffn_down.weight.lora_a");
    CHECK(ta && ta->n_dims == 2 && ta->ne[0] == 64 && ta->ne[1] == 4 && ta->ggml_type == GGML_TYPE_F32);
    CHECK(tb && tb->n_dims == 2 && tb->ne[0] == 4 && tb->ne[1] == 64);
    CHECK(td && td->ne[0] == 172 && td->ne[1] == 4);
    CHECK(ft_gguf_find_tensor(&gf, "blk.0.attn_output.weight.lora_a") == NULL);
    if (ta && tb && tk && tv && ag) {
        const ft_adapter_entry *hq = &ah->e[2 * 4 + 0], *gq = &ag->e[2 * 4 + 0];
        const ft_adapter_entry *gk = &ag->e[2 * 4 + 1], *hv = &ah->e[2 * 4 + 2];
        CHECK(hq->layer == 2 && hq->mod == FT_MOD_Q && gq->mod == FT_MOD_Q && gk->mod == FT_MOD_K);
        CHECK(memcmp(ta->data, hq->lora->A, 4 * 64 * 4) == 0);               /* A as it is */
        CHECK(memcmp(tb->data, gq->lora->B, 64 * 4 * 4) == 0);               /* q's B permuted, with 8 heads */
        CHECK(memcmp(tb->data, hq->lora->B, 64 * 4 * 4) != 0);
        CHECK(memcmp(tk->data, gk->lora->B, 32 * 4 * 4) == 0);               /* k's B permuted, with 4 heads */
        CHECK(memcmp(tv->data, hv->lora->B, 32 * 4 * 4) == 0);               /* v's B untouched */
        /* and an explicit permutation of the HF B gives the same bytes */
        float bq[64 * 4];
        memcpy(bq, hq->lora->B, sizeof bq);
        CHECK_OK(ft_permute_rope_rows(bq, 64, 4, 8, true));
        CHECK(memcmp(tb->data, bq, sizeof bq) == 0);
    }
    ft_gguf_close(&gf);
    /* written from the GGUF model, B is stored as the model holds it */
    if (ag) {
        tmp(p, sizeof p, "from_gguf.gguf");
        CHECK_OK(ft_adapter_save_gguf(ag, p));
        CHECK_OK(ft_gguf_open(&gf, p));
        tb = ft_gguf_find_tensor(&gf, "blk.3.attn_q.weight.lora_b");
        CHECK(tb && memcmp(tb->data, ag->e[3 * 4].lora->B, 64 * 4 * 4) == 0);
        ft_gguf_close(&gf);
    }
    /* a GGUF adapter is not a model */
    ftune_model *bad = NULL;
    tmp(p, sizeof p, "from_hf.gguf");
    CHECK(ftune_model_load(&bad, p, NULL) != FTUNE_OK);
    CHECK(contains(ftune_last_error(), "adapter"));
    ft_adapter_free(ah);
    ft_adapter_free(ag);
out:
    ftune_model_free(h);
    ftune_model_free(g);
}

/* A GGUF adapter read back gives the same logits as the PEFT one (on the
 * HF model, whose q/k rows are in the other layout, and on the GGUF model);
 * bad GGUF adapters fail naming the file and what is wrong. */
static void test_gguf_adapter_load(void) {
    ftune_model *h = load(hf_path), *g = load(gguf_path);
    if (!h || !g) { CHECK(0); goto out; }
    char pg[600], dir[600];
    tmp(pg, sizeof pg, "from_hf.gguf");   /* written by test_gguf_adapter: rsLoRA r=4 alpha=8 on q, k, v, down */
    tmp(dir, sizeof dir, "peft_qkvd");    /* the same adapter as PEFT */
    ftune_model *models[2] = { h, g };
    for (int i = 0; i < 2; i++) {
        ftune_model *m = models[i];
        CHECK_OK(ftune_model_load_adapter(m, dir));
        float *l_peft = logits(m);
        m->free_adapter(m->adapter);
        m->adapter = NULL;
        CHECK_OK(ftune_model_load_adapter(m, pg));
        float *l_gguf = logits(m);
        const ft_adapter *a = m->adapter;
        CHECK(a && a->n == 4 * 5 && a->cfg.r == 4 && ft_lora_scale_of(a->e[0].lora) == 4.0f);
        if (l_peft && l_gguf) {
            double e = logit_err(l_gguf, l_peft, (long)T_TOK * m->cfg.V);
            printf("  %s model: GGUF adapter vs the same PEFT adapter, logits max rel err %.3g\n", i ? "GGUF" : "HF", e);
            CHECKF(e == 0, "%g", e); /* the same A, B (permuted twice: a copy) and scale 16/4 = 8/sqrt(4) */
        } else CHECK(0);
        free(l_peft);
        free(l_gguf);
    }
    g->free_adapter(g->adapter);
    g->adapter = NULL;
    /* merge reads it too: the same file as merging the PEFT adapter */
    char m1[600], m2[600];
    tmp(m1, sizeof m1, "merged_gguf_adapter.gguf");
    CHECK_OK(ft_merge_write(h, m1, NULL, NULL)); /* the default adapter */
    h->free_adapter(h->adapter);
    h->adapter = NULL;
    CHECK_OK(ftune_model_load_adapter(h, dir));
    tmp(m2, sizeof m2, "merged_peft_adapter.gguf");
    CHECK_OK(ft_merge_write(h, m2, NULL, NULL));
    char *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK_OK(ft_read_file(m1, &b1, &n1));
    CHECK_OK(ft_read_file(m2, &b2, &n2));
    CHECK(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1);
    free(b2);
    h->free_adapter(h->adapter);
    h->adapter = NULL;

    /* bad adapters */
    struct { const char *name, *arch, *type, *atype; bool alpha; int a_in, r_b; const char *extra, *expect; } bad[] = {
        { "arch", "qwen2", "adapter", "lora", true, 64, 4, NULL, "architecture" },
        { "shape", "llama", "adapter", "lora", true, 32, 4, NULL, "shape" },
        { "rank", "llama", "adapter", "lora", true, 64, 8, NULL, "r=4" },
        { "alpha", "llama", "adapter", "lora", false, 64, 4, NULL, "adapter.lora.alpha" },
        { "type", "llama", "model", "lora", true, 64, 4, NULL, "not a LoRA adapter" },
        { "atype", "llama", "adapter", "control_vector", true, 64, 4, NULL, "only LoRA" },
        { "tensor", "llama", "adapter", "lora", true, 64, 4, "token_embd.weight", "not a LoRA tensor" },
        { "partner", "llama", "adapter", "lora", true, 64, 4, "blk.1.attn_v.weight.lora_a", "is missing" },
    };
    static float zeros[172 * 8];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gguf_writer *w = NULL;
        char p[600], nm[64];
        snprintf(nm, sizeof nm, "bad_%s.gguf", bad[i].name);
        tmp(p, sizeof p, nm);
        CHECK_OK(ft_gguf_writer_new(&w));
        if (!w) continue;
        CHECK_OK(ft_gguf_writer_set_str(w, "general.architecture", bad[i].arch));
        CHECK_OK(ft_gguf_writer_set_str(w, "general.type", bad[i].type));
        CHECK_OK(ft_gguf_writer_set_str(w, "adapter.type", bad[i].atype));
        if (bad[i].alpha) CHECK_OK(ft_gguf_writer_set_f32(w, "adapter.lora.alpha", 8));
        int64_t sa[2] = { 4, bad[i].a_in }, sb[2] = { 64, bad[i].r_b }, sx[2] = { 4, 64 };
        CHECK_OK(ft_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", FT_F32, 2, sa, zeros));
        CHECK_OK(ft_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_b", FT_F32, 2, sb, zeros));
        if (bad[i].extra) CHECK_OK(ft_gguf_writer_add_tensor(w, bad[i].extra, FT_F32, 2, sx, zeros));
        CHECK_OK(ft_gguf_writer_write(w, p));
        ft_gguf_writer_free(w);
        ftune_status st = ftune_model_load_adapter(g, p);
        const char *msg = ftune_last_error();
        CHECKF(st != FTUNE_OK && contains(msg, nm) && contains(msg, bad[i].expect), "%s: %s", bad[i].name, msg);
        printf("  expected error: %s\n", msg);
        CHECK(g->adapter == NULL);
    }
    /* a quantized LoRA tensor (llama.cpp writes them as f32, f16 or bf16) */
    {
        gguf_writer *w = NULL;
        char p[600];
        tmp(p, sizeof p, "bad_q8.gguf");
        CHECK_OK(ft_gguf_writer_new(&w));
        int64_t sa[2] = { 4, 64 }, sb[2] = { 64, 4 };
        if (w) {
            CHECK_OK(ft_gguf_writer_set_str(w, "general.architecture", "llama"));
            CHECK_OK(ft_gguf_writer_set_str(w, "general.type", "adapter"));
            CHECK_OK(ft_gguf_writer_set_str(w, "adapter.type", "lora"));
            CHECK_OK(ft_gguf_writer_set_f32(w, "adapter.lora.alpha", 8));
            CHECK_OK(ft_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", FT_Q8_0, 2, sa, zeros));
            CHECK_OK(ft_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_b", FT_F32, 2, sb, zeros));
            CHECK_OK(ft_gguf_writer_write(w, p));
            ft_gguf_writer_free(w);
        }
        CHECK(ftune_model_load_adapter(g, p) != FTUNE_OK && contains(ftune_last_error(), "q8_0"));
        printf("  expected error: %s\n", ftune_last_error());
    }
    /* a model GGUF is not an adapter */
    CHECK(ftune_model_load_adapter(g, gguf_path) != FTUNE_OK && contains(ftune_last_error(), "general.type"));
    printf("  expected error: %s\n", ftune_last_error());
    /* nor a file of another kind */
    char hf_st[1200];
    snprintf(hf_st, sizeof hf_st, "%s/model.safetensors", hf_path);
    CHECK(ftune_model_load_adapter(g, hf_st) != FTUNE_OK && contains(ftune_last_error(), "model.safetensors"));
    printf("  expected error: %s\n", ftune_last_error());
out:
    ftune_model_free(h);
    ftune_model_free(g);
}

/* ------------------------------------------------------------- bad input */

static void write_text(const char *path, const char *text) {
    if (ft_write_file_atomic(path, text, strlen(text)) != FTUNE_OK) fprintf(stderr, "  cannot write %s\n", path);
}

/* A PEFT directory with the given config and lora pairs on layer 0 (shape of
 * each A and B given), values 0.01. */
typedef struct { const char *module; int a0, a1, b0, b1; } pair_spec;
static void make_peft(const char *dir, const char *config, const pair_spec *ps, int n) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fprintf(stderr, "  mkdir %s failed\n", dir);
    char p[700];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    write_text(p, config);
    st_out_tensor ts[16];
    char names[16][128];
    static float vals[256 * 256];
    for (int i = 0; i < 256 * 256; i++) vals[i] = 0.01f;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) {
            snprintf(names[2 * i + k], 128, "base_model.model.model.layers.0.%s.lora_%c.weight", ps[i].module, k ? 'B' : 'A');
            ts[2 * i + k] = (st_out_tensor){ .name = names[2 * i + k], .dtype = FT_F32, .ndim = 2,
                                             .shape = { k ? ps[i].b0 : ps[i].a0, k ? ps[i].b1 : ps[i].a1 }, .data = vals };
        }
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    if (ft_st_write(p, ts, 2 * n, NULL) != FTUNE_OK) fprintf(stderr, "  st_write: %s\n", ftune_last_error());
}

static ftune_status try_load(ftune_model *m, const char *dir) {
    ft_adapter *a = NULL;
    ftune_status st = ft_adapter_load_peft(&a, m, dir, false);
    ft_adapter_free(a);
    if (st) printf("  expected error: %s\n", ftune_last_error());
    return st;
}

static void test_bad_adapters(void) {
    ftune_model *m = load(hf_path);
    if (!m) { CHECK(0); return; }
    char dir[600];
    const char *cfg_q = "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":[\"q_proj\"],"
                        "\"layers_to_transform\":[0]}";
    /* a good one first, so the failures below are about what they change */
    pair_spec good[] = { { "self_attn.q_proj", 4, 64, 64, 4 } };
    make_peft(tmp(dir, sizeof dir, "good"), cfg_q, good, 1);
    CHECK_OK(try_load(m, dir));
    /* B with 32 rows for a q_proj with 64 outputs */
    pair_spec bad_b[] = { { "self_attn.q_proj", 4, 64, 32, 4 } };
    make_peft(tmp(dir, sizeof dir, "bad_shape"), cfg_q, bad_b, 1);
    CHECK(try_load(m, dir) == FTUNE_ERR_FORMAT);
    CHECKF(contains(ftune_last_error(), "q_proj.lora_B.weight\": shape [32, 4] but the model's layer 0 q_proj has 64 "
                    "outputs and r=4"), "%s", ftune_last_error());
    /* r in the tensors differs from the config's */
    pair_spec bad_r[] = { { "self_attn.q_proj", 8, 64, 64, 8 } };
    make_peft(tmp(dir, sizeof dir, "bad_r"), cfg_q, bad_r, 1);
    CHECK(try_load(m, dir) == FTUNE_ERR_FORMAT);
    CHECKF(contains(ftune_last_error(), "q_proj.lora_A.weight\": shape [8, 64]") && contains(ftune_last_error(), "r=4"),
           "%s", ftune_last_error());
    /* a target module a Llama model does not have */
    make_peft(tmp(dir, sizeof dir, "bad_target"),
              "{\"peft_type\":\"LORA\",\"r\":4,\"target_modules\":[\"q_proj\",\"c_attn\"]}", good, 1);
    CHECK(try_load(m, dir) == FTUNE_ERR_UNSUPPORTED);
    CHECKF(contains(ftune_last_error(), "\"c_attn\" does not exist"), "%s", ftune_last_error());
    /* v_proj is targeted but has no tensors */
    make_peft(tmp(dir, sizeof dir, "missing"),
              "{\"peft_type\":\"LORA\",\"r\":4,\"target_modules\":[\"q_proj\",\"v_proj\"],\"layers_to_transform\":0}",
              good, 1);
    CHECK(try_load(m, dir) == FTUNE_ERR_FORMAT);
    CHECKF(contains(ftune_last_error(), "model.layers.0.self_attn.v_proj.lora_A.weight\" is missing"), "%s",
           ftune_last_error());
    /* tensors for a module the config does not target */
    pair_spec qv[] = { { "self_attn.q_proj", 4, 64, 64, 4 }, { "self_attn.v_proj", 4, 64, 32, 4 } };
    make_peft(tmp(dir, sizeof dir, "untargeted"), cfg_q, qv, 2);
    CHECK(try_load(m, dir) == FTUNE_ERR_FORMAT);
    CHECKF(contains(ftune_last_error(), "v_proj.lora_A.weight\" adapts"), "%s", ftune_last_error());
    /* DoRA */
    make_peft(tmp(dir, sizeof dir, "dora"),
              "{\"peft_type\":\"LORA\",\"r\":4,\"use_dora\":true,\"target_modules\":[\"q_proj\"]}", good, 1);
    CHECK(try_load(m, dir) == FTUNE_ERR_UNSUPPORTED);
    CHECKF(contains(ftune_last_error(), "use_dora"), "%s", ftune_last_error());
    /* a DoRA magnitude among the tensors (config not saying so) */
    make_peft(tmp(dir, sizeof dir, "dora_tensor"), cfg_q, good, 1);
    {
        char p[700];
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
        static float v[64 * 64];
        st_out_tensor ts[3] = {
            { .name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", .dtype = FT_F32, .ndim = 2, .shape = { 4, 64 }, .data = v },
            { .name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", .dtype = FT_F32, .ndim = 2, .shape = { 64, 4 }, .data = v },
            { .name = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", .dtype = FT_F32, .ndim = 1, .shape = { 64 }, .data = v },
        };
        CHECK_OK(ft_st_write(p, ts, 3, NULL));
        CHECK(try_load(m, dir) == FTUNE_ERR_UNSUPPORTED);
        CHECKF(contains(ftune_last_error(), "lora_magnitude_vector\" is a DoRA magnitude"), "%s", ftune_last_error());
        /* a full tensor (modules_to_save / resized embedding) */
        ts[2] = (st_out_tensor){ .name = "base_model.model.lm_head.weight", .dtype = FT_F32, .ndim = 2, .shape = { 8, 64 }, .data = v };
        CHECK_OK(ft_st_write(p, ts, 3, NULL));
        CHECK(try_load(m, dir) == FTUNE_ERR_UNSUPPORTED);
        CHECKF(contains(ftune_last_error(), "lm_head.weight\" is not a lora_A/lora_B weight"), "%s", ftune_last_error());
    }
    /* BF16 tensors are widened on load */
    {
        char p[700];
        make_peft(tmp(dir, sizeof dir, "bf16"), cfg_q, good, 1);
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
        static uint16_t one[64 * 4];
        for (int i = 0; i < 64 * 4; i++) one[i] = 0x3F80; /* 1.0 */
        one[5] = 0xBFC0;                                  /* -1.5 */
        st_out_tensor ts[2] = {
            { .name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", .dtype = FT_BF16, .ndim = 2, .shape = { 4, 64 }, .data = one },
            { .name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", .dtype = FT_BF16, .ndim = 2, .shape = { 64, 4 }, .data = one },
        };
        CHECK_OK(ft_st_write(p, ts, 2, NULL));
        ft_adapter *a16 = NULL;
        CHECK_OK(ft_adapter_load_peft(&a16, m, dir, false));
        CHECK(a16 && a16->e[0].lora->A[0] == 1.0f && a16->e[0].lora->A[5] == -1.5f && a16->e[0].lora->B[5] == -1.5f);
        ft_adapter_free(a16);
    }
    /* a regex selecting q and v of layers 0 and 1 (PEFT matches the whole module name) */
    pair_spec qv01[] = { { "self_attn.q_proj", 4, 64, 64, 4 }, { "self_attn.v_proj", 4, 64, 32, 4 } };
    make_peft(tmp(dir, sizeof dir, "regex"),
              "{\"peft_type\":\"LORA\",\"r\":4,\"target_modules\":\"model\\\\.layers\\\\.0\\\\.self_attn\\\\.(q|v)_proj\"}",
              qv01, 2);
    ft_adapter *a = NULL;
    CHECK_OK(ft_adapter_load_peft(&a, m, dir, false));
    CHECK(a && a->n == 2 && a->e[0].mod == FT_MOD_Q && a->e[1].mod == FT_MOD_V);
    ft_adapter_free(a);
    /* not a directory with a config; a truncated tensor file */
    CHECK(try_load(m, tmpdir) == FTUNE_ERR_IO);
    make_peft(tmp(dir, sizeof dir, "trunc"), cfg_q, good, 1);
    char p[700];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    CHECK(truncate(p, 100) == 0);
    CHECK(try_load(m, dir) == FTUNE_ERR_FORMAT);
    CHECKF(contains(ftune_last_error(), "adapter_model.safetensors"), "%s", ftune_last_error());
    CHECK(m->adapter == NULL); /* nothing stays attached after a failure */
    ftune_model_free(m);
}

/* The real PEFT adapter for GPT-2: its config and tensors parse, and a
 * Llama model refuses it because GPT-2's modules are not there. */
static void test_gpt2_adapter(void) {
    char dir[1024], p[1100];
    check_data_path(dir, sizeof dir, "adapters/gpt2-lora-tigrinya");
    ft_peft_config pc;
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    CHECK_OK(ft_peft_config_read(&pc, p));
    CHECK(pc.hp.r == 8 && pc.hp.alpha == 32 && fabsf(pc.hp.dropout - 0.05f) < 1e-7f && pc.fan_in_fan_out && !pc.hp.rslora);
    CHECK(pc.n_targets == 2 && strcmp(pc.targets[0], "c_attn") == 0 && strcmp(pc.targets[1], "c_proj") == 0);
    CHECK(strcmp(pc.base_model, "gpt2") == 0);
    ft_peft_config_free(&pc);
    st_file f;
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    CHECK_OK(ft_st_open(&f, p));
    ft_peft_module *pairs = NULL;
    int n = 0;
    CHECK_OK(ft_peft_scan(&f, &ft_lora_kind, &pairs, &n));
    CHECK(n == 36);
    int c_attn = 0;
    for (int i = 0; i < n; i++) {
        CHECK(pairs[i].t[0]->shape[0] == 8 && pairs[i].t[1]->shape[1] == 8);
        if (strcmp(pairs[i].module, "transformer.h.5.attn.c_attn") == 0) {
            c_attn++;
            CHECK(pairs[i].t[0]->shape[1] == 768 && pairs[i].t[1]->shape[0] == 2304);
        }
    }
    CHECK(c_attn == 1);
    free(pairs);
    ft_st_close(&f);
    ftune_model *m = load(hf_path);
    if (!m) { CHECK(0); return; }
    ft_adapter *a = NULL;
    CHECK(ft_adapter_load_peft(&a, m, dir, false) == FTUNE_ERR_UNSUPPORTED);
    printf("  expected error: %s\n", ftune_last_error());
    CHECKF(contains(ftune_last_error(), "\"c_attn\" does not exist in a llama model"), "%s", ftune_last_error());
    CHECK(a == NULL);
    ftune_model_free(m);
}

/* ------------------------------------------------------------- merge */

static void test_merge(void) {
    char bin_path[1024];
    check_data_path(bin_path, sizeof bin_path, "models/stories260K/stories260K.bin");
    const char *bases[3] = { hf_path, gguf_path, bin_path };
    for (int b = 0; b < 3; b++) {
        ftune_model *m = load(bases[b]), *ref = load(bases[b]);
        if (!m || !ref) { CHECK(0); ftune_model_free(m); ftune_model_free(ref); continue; }
        ft_adapter_hparams cfg = { .r = 8, .alpha = 16, .targets = FT_MOD_ALL & ~FT_MOD_BIT(FT_MOD_UP) };
        ft_adapter *a = NULL, *ar = NULL;
        cfg.seed = 21;
        CHECK_OK(ft_adapter_attach(&a, m, &cfg, false));
        CHECK_OK(ft_adapter_attach(&ar, ref, &cfg, false));
        if (!a || !ar) { ftune_model_free(m); ftune_model_free(ref); continue; }
        randomize_b(a, 99, 0.01f);
        randomize_b(ar, 99, 0.01f);
        long n = (long)T_TOK * m->cfg.V;
        float *l_lora = logits_with(m, a); /* base + LoRA, unmerged (Linear applies the adapter) */
        char out[600], out_gguf[600];
        snprintf(out, sizeof out, "%s/merged_%s", tmpdir, (const char *[]){ "from_hf", "from_gguf", "from_bin" }[b]);
        snprintf(out_gguf, sizeof out_gguf, "%s/merged.gguf", tmpdir);
        CHECK_OK(ft_merge_write(m, out, a, NULL));
        CHECK_OK(ft_merge_write(m, out_gguf, a, NULL)); /* from every base (HF: its tokenizer written as GGUF metadata) */
        CHECK(ft_merge_write(m, bases[b], a, NULL) == FTUNE_ERR_ARG); /* never over the files being read */
        CHECK(ft_merge_write(m, out, ar, NULL) == FTUNE_ERR_ARG); /* an adapter made for another model */
        CHECK_OK(ft_merge_lora(ref, ar)); /* merged in memory */
        float *l_mem = logits(ref);
        ftune_model *w = load(out);
        float *l_file = w ? logits(w) : NULL;
        if (w) {
            CHECK(strcmp(w->format, "hf") == 0 && !w->cfg.rope_interleaved && w->cfg.tied == (b != 1));
            CHECK(w->layers[0].wq.w.dtype == FT_F32);
        }
        if (l_lora && l_mem && l_file) {
            double e_file = logit_err(l_file, l_mem, n), e_lora = logit_err(l_lora, l_mem, n);
            printf("  %s base: merged+written+reloaded vs merged in memory %.3g; base+LoRA vs merged %.3g\n",
                   (const char *[]){ "HF", "GGUF", "llama2.c" }[b], e_file, e_lora);
            /* the same f32 rows written and read back; for the GGUF and llama2.c bases in the other
             * RoPE layout, so attention scores are summed in float in another order (measured
             * 1.15e-6, as in test_qk_layout_across_models); a wrong row order moves them by ~0.1 */
            CHECKF(e_file < (b == 0 ? 1e-6 : 1e-5), "%g", e_file);
            /* (W + sBA)x vs Wx + s·B(Ax) in float32: W + sBA rounds W by an ulp (6e-8), which 5 layers
             * turn into ~2e-6 of the largest logit; the adapter itself moves them by > 1e-2 */
            CHECKF(e_lora < 1e-5, "%g", e_lora);
        } else CHECK(0);
        {
            ftune_model *wg = load(out_gguf);
            float *l_g = wg ? logits(wg) : NULL;
            if (l_g && l_mem) {
                double e = logit_err(l_g, l_mem, n);
                printf("  %s base: merged GGUF written and reloaded vs merged in memory %.3g\n",
                       (const char *[]){ "HF", "GGUF", "llama2.c" }[b], e);
                /* the same f32 weights, the same forward; from HF in the other RoPE layout (see above) */
                CHECKF(e < (b == 0 ? 1e-5 : 1e-6), "%g", e);
            } else CHECK(0);
            if (wg) CHECK(strcmp(wg->format, "gguf") == 0 && wg->tok != NULL && wg->cfg.rope_interleaved);
            free(l_g);
            ftune_model_free(wg);
        }
        /* bf16 output: config says so and tensors are BF16 */
        if (b == 0) {
            char out16[600];
            snprintf(out16, sizeof out16, "%s/merged_bf16", tmpdir);
            ft_model_write_opts o = { .dtype = "bf16" };
            CHECK_OK(ft_merge_write(m, out16, a, &o));
            ftune_model *w16 = load(out16);
            CHECK(w16 && w16->layers[1].w_down.w.dtype == FT_BF16 && w16->tok != NULL);
            ftune_model_free(w16);
            char cfgp[700], *text = NULL;
            snprintf(cfgp, sizeof cfgp, "%s/config.json", out16);
            CHECK_OK(ft_read_file(cfgp, &text, NULL));
            CHECK(text && contains(text, "\"torch_dtype\":\t\"bfloat16\""));
            free(text);
            o.dtype = "q4";
            CHECK(ft_merge_write(m, out16, a, &o) == FTUNE_ERR_ARG);
        }
        free(l_lora);
        free(l_mem);
        free(l_file);
        ftune_model_free(w);
        ft_adapter_free(a);
        ft_adapter_free(ar);
        ftune_model_free(m);
        ftune_model_free(ref);
    }
}

/* ------------------------------------------------------------- GGUF writing */

static uint32_t file_type_of(const char *path) {
    gguf_file g;
    int64_t v = -1;
    if (ft_gguf_open(&g, path) == FTUNE_OK) {
        if (!ft_gguf_get_i64(&g, "general.file_type", &v)) v = -1;
        ft_gguf_close(&g);
    }
    return (uint32_t)v;
}

static uint32_t ggml_type_of(const char *path, const char *tensor) {
    gguf_file g;
    uint32_t t = 999;
    if (ft_gguf_open(&g, path) == FTUNE_OK) {
        const gguf_tensor_info *ti = ft_gguf_find_tensor(&g, tensor);
        if (ti) t = ti->ggml_type;
        ft_gguf_close(&g);
    }
    return t;
}

/* Hugging Face → GGUF: the same logits as the HF directory, the same
 * tensors, vocabulary, scores and token types as the reference GGUF of the
 * same model (converted from llama2.c by llama.cpp's tools), the same
 * tokenization; llama.cpp's file type for each --dtype; every matrix
 * converted by f32; q4_0 quantizing the tied embedding (as q8_0). */
static void test_gguf_write(void) {
    ftune_model *h = load(hf_path), *g = load(gguf_path);
    if (!h || !g) { CHECK(0); goto out; }
    char p[600];
    tmp(p, sizeof p, "hf.gguf");
    ft_model_write_report rep;
    ft_model_write_opts o = { .report = &rep };
    CHECK_OK(ft_model_write(h, p, &o));
    CHECK(rep.file_type == 0 && rep.tied && rep.n_mat[FT_F32] == 1 + 5 * 7 && rep.n_vec == 1 + 5 * 2);
    ftune_model *w = load(p);
    float *lh = logits(h), *lw = w ? logits(w) : NULL;
    if (lh && lw) {
        double e = logit_err(lw, lh, (long)T_TOK * h->cfg.V);
        printf("  HF dir vs the GGUF written from it: logits max rel err %.3g\n", e);
        CHECKF(e < 1e-5, "%g", e); /* the same weights in the other RoPE layout (see test_qk_layout_across_models) */
    } else CHECK(0);
    if (w) {
        CHECK(w->cfg.rope_interleaved && w->cfg.tied && w->cfg.max_T == 512 && w->cfg.NKV == 4);
        const char *text = "Once upon a time, Lily saw a big dog. \"Hi!\" she said.";
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK_OK(ftune_tokenize(ftune_model_tokenizer(h), text, strlen(text), 1, 1, &a, &na));
        CHECK_OK(ftune_tokenize(ftune_model_tokenizer(w), text, strlen(text), 1, 1, &b, &nb));
        CHECK(na > 10 && na == nb && a && b && memcmp(a, b, na * sizeof *a) == 0);
        free(a);
        free(b);
    }
    gguf_file gw, gr;
    CHECK_OK(ft_gguf_open(&gw, p));
    CHECK_OK(ft_gguf_open(&gr, gguf_path));
    /* every reference tensor, bit for bit (its output.weight is a copy of the tied embedding) */
    for (uint64_t i = 0; i < gr.n_tensors; i++) {
        const gguf_tensor_info *r = &gr.tensors[i];
        char nm[FT_NAME_MAX];
        snprintf(nm, sizeof nm, "%.*s", (int)r->name.len, r->name.ptr);
        const gguf_tensor_info *t = ft_gguf_find_tensor(&gw, strcmp(nm, "output.weight") ? nm : "token_embd.weight");
        CHECKF(t && t->nbytes == r->nbytes && t->ne[0] == r->ne[0] && t->ne[1] == r->ne[1] &&
               memcmp(t->data, r->data, r->nbytes) == 0, "%s", nm);
    }
    CHECK(ft_gguf_find_tensor(&gw, "output.weight") == NULL && gw.n_tensors == gr.n_tensors - 1);
    /* the vocabulary metadata, value for value */
    static const char *const same[] = { "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                                        "tokenizer.ggml.model", "general.architecture", "llama.embedding_length",
                                        "llama.feed_forward_length", "llama.block_count", "llama.attention.head_count",
                                        "llama.attention.head_count_kv", "llama.rope.dimension_count",
                                        "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.bos_token_id",
                                        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id" };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const gguf_kv *a = ft_gguf_find(&gw, same[i]), *b = ft_gguf_find(&gr, same[i]);
        bool eq = a && b && a->type == b->type;
        if (eq && a->type == GGUF_T_STRING) eq = a->str.len == b->str.len && !memcmp(a->str.ptr, b->str.ptr, a->str.len);
        else if (eq && a->type == GGUF_T_ARRAY) {
            eq = a->arr_type == b->arr_type && a->arr_n == b->arr_n;
            if (eq && a->arr_type != GGUF_T_STRING) eq = !memcmp(a->arr_data, b->arr_data, a->arr_n * 4);
            if (eq && a->arr_type == GGUF_T_STRING) {
                gguf_str_array x = { 0 }, y = { 0 };
                eq = !ft_gguf_get_str_array(&gw, same[i], &x) && !ft_gguf_get_str_array(&gr, same[i], &y) && x.n == y.n;
                for (uint64_t j = 0; eq && j < x.n; j++)
                    eq = x.items[j].len == y.items[j].len && !memcmp(x.items[j].ptr, y.items[j].ptr, x.items[j].len);
                free(x.items);
                free(y.items);
            }
        } else if (eq) eq = a->v.u == b->v.u;
        CHECKF(eq, "%s", same[i]);
    }
    int64_t v;
    CHECK(ft_gguf_get_i64(&gw, "general.file_type", &v) && v == 0);
    CHECK(ft_gguf_get_i64(&gw, "llama.context_length", &v) && v == 512); /* the HF config's (the reference says 2048) */
    ft_gguf_close(&gw);
    ft_gguf_close(&gr);

    /* general.file_type as llama.cpp numbers them, and the types of the embedding/output */
    struct { const char *dtype; uint32_t ftype; uint32_t embd_untied, out, embd_tied, q; } cases[] = {
        { "f32", 0, GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32, GGML_TYPE_F32 },
        { "f16", 1, GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_F16 },
        { "bf16", 32, GGML_TYPE_BF16, GGML_TYPE_BF16, GGML_TYPE_BF16, GGML_TYPE_BF16 },
        { "q8_0", 7, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 },
        { "q4_0", 2, GGML_TYPE_Q4_0, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 },
    };
    char pq[600], p32[600];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o.dtype = cases[i].dtype;
        tmp(pq, sizeof pq, "q.gguf");
        CHECK_OK(ft_model_write(g, pq, &o)); /* GGUF base: untied */
        CHECKF(file_type_of(pq) == cases[i].ftype, "%s", cases[i].dtype);
        CHECKF(ggml_type_of(pq, "token_embd.weight") == cases[i].embd_untied, "%s", cases[i].dtype);
        CHECKF(ggml_type_of(pq, "output.weight") == cases[i].out, "%s", cases[i].dtype);
        CHECKF(ggml_type_of(pq, "blk.1.attn_k.weight") == cases[i].q, "%s", cases[i].dtype);
        /* 172 columns are not whole 32-element blocks: ffn_down keeps f32, and is counted */
        CHECKF(ggml_type_of(pq, "blk.1.ffn_down.weight") == (cases[i].q == GGML_TYPE_Q8_0 || cases[i].q == GGML_TYPE_Q4_0
                                                                 ? GGML_TYPE_F32 : cases[i].q), "%s", cases[i].dtype);
        CHECK(rep.n_kept == (cases[i].ftype == 2 || cases[i].ftype == 7 ? 5 : 0) && !rep.tied);
        CHECK(ggml_type_of(pq, "blk.1.ffn_norm.weight") == GGML_TYPE_F32);
        CHECK_OK(ft_model_write(h, pq, &o)); /* HF base: tied */
        CHECKF(file_type_of(pq) == cases[i].ftype, "%s", cases[i].dtype);
        CHECKF(ggml_type_of(pq, "token_embd.weight") == cases[i].embd_tied, "%s", cases[i].dtype);
        CHECK(rep.tied && ft_gguf_ggml_type(rep.output_dtype) == (int)cases[i].embd_tied);
        if (cases[i].ftype == 2 || cases[i].ftype == 7) {
            /* The quantized model runs on exactly the weights ggml's reference quantizer makes of
             * the HF ones: its logits against the float64 reference on the HF weights rounded by
             * ref_forward.py --quantize (a numpy port of quantize_row_q8_0/q4_0_ref, the output
             * matrix in q8_0 as the writer puts it). 1e-5 as for the PEFT reference above:
             * float32 against float64 through 5 layers, measured 9e-7 (q4_0) and 1e-6 (q8_0). The
             * distance to the HF logits is all quantization, printed: 0.36 for q4_0 (8% RMS
             * error per weight of a 64-wide row, 0.5% for q8_0, whose logits move 0.031) -- a
             * size no bound on the HF logits alone could tell from a wrong rounding. */
            ftune_model *wq = load(pq);
            float *lq = wq ? logits(wq) : NULL;
            float *lr = ref_logits(hf_path, cases[i].dtype, "q8_0");
            if (lq && lh && lr) {
                long n = (long)T_TOK * h->cfg.V;
                double e = logit_err(lq, lr, n), eh = logit_err(lq, lh, n);
                printf("  %s GGUF from HF vs the float64 reference on the same rounding: logits max rel err %.3g "
                       "(vs HF %.3g)\n", cases[i].dtype, e, eh);
                CHECKF(e < 1e-5, "%s: %g", cases[i].dtype, e);
            } else CHECK(0);
            free(lq);
            free(lr);
            ftune_model_free(wq);
        }
        if (strcmp(cases[i].dtype, "q4_0") == 0) {
            /* and --dtype f32 from the q4_0 file converts every matrix, embedding included */
            ftune_model *q = load(pq);
            o.dtype = "f32";
            tmp(p32, sizeof p32, "back32.gguf");
            if (q) CHECK_OK(ft_model_write(q, p32, &o));
            CHECK(ggml_type_of(p32, "token_embd.weight") == GGML_TYPE_F32 && file_type_of(p32) == 0);
            CHECK(ggml_type_of(p32, "blk.0.attn_q.weight") == GGML_TYPE_F32);
            ftune_model_free(q);
        }
    }
    o.dtype = NULL;

    /* Llama 3 RoPE scaling: rope_freqs.weight, the same logits as the HF directory */
    char d3[600], src[1200], dst[1200];
    tmp(d3, sizeof d3, "hf_llama3");
    mkdir(d3, 0755);
    static const char *const files[] = { "model.safetensors", "tokenizer.json", "tokenizer_config.json" };
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/%s", hf_path, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", d3, files[i]);
        char *buf;
        size_t nb;
        CHECK_OK(ft_read_file(src, &buf, &nb));
        if (buf) CHECK_OK(ft_write_file_atomic(dst, buf, nb));
        free(buf);
    }
    snprintf(src, sizeof src, "%s/config.json", hf_path);
    char *cfgt = NULL;
    CHECK_OK(ft_read_file(src, &cfgt, NULL));
    cJSON *cj = cfgt ? cJSON_Parse(cfgt) : NULL;
    free(cfgt);
    if (cj) {
        cJSON_DeleteItemFromObject(cj, "rope_scaling");
        cJSON *rs = cJSON_AddObjectToObject(cj, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", 8);
        cJSON_AddNumberToObject(rs, "low_freq_factor", 1);
        cJSON_AddNumberToObject(rs, "high_freq_factor", 4);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 64); /* so that all three bands occur with HS = 8 */
        snprintf(dst, sizeof dst, "%s/config.json", d3);
        CHECK_OK(ft_write_json_atomic(dst, cj));
        cJSON_Delete(cj);
    } else CHECK(0);
    /* and a chat template, which llama.cpp reads from tokenizer.chat_template */
    static const char tmpl[] = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}";
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", d3);
    char *tct = NULL;
    CHECK_OK(ft_read_file(dst, &tct, NULL));
    cJSON *tcj = tct ? cJSON_Parse(tct) : NULL;
    free(tct);
    if (tcj) {
        cJSON_AddStringToObject(tcj, "chat_template", tmpl);
        CHECK_OK(ft_write_json_atomic(dst, tcj));
        cJSON_Delete(tcj);
    } else CHECK(0);
    ftune_model *h3 = load(d3);
    tmp(p, sizeof p, "llama3.gguf");
    if (h3) CHECK_OK(ft_model_write(h3, p, NULL));
    gguf_file g3;
    if (h3 && ft_gguf_open(&g3, p) == FTUNE_OK) {
        gguf_str ct;
        CHECK(ft_gguf_get_str(&g3, "tokenizer.chat_template", &ct) && ct.len == strlen(tmpl) && !memcmp(ct.ptr, tmpl, ct.len));
        CHECK(ft_gguf_find_tensor(&g3, "rope_freqs.weight") != NULL);
        ft_gguf_close(&g3);
    } else CHECK(0);
    ftune_model *w3 = h3 ? load(p) : NULL;
    float *l3 = h3 ? logits(h3) : NULL, *lw3 = w3 ? logits(w3) : NULL;
    if (l3 && lw3 && lh) {
        double e = logit_err(lw3, l3, (long)T_TOK * h->cfg.V), moved = logit_err(l3, lh, (long)T_TOK * h->cfg.V);
        printf("  Llama 3 RoPE: HF vs its GGUF (rope_freqs) %.3g; the scaling moves logits by %.3g\n", e, moved);
        CHECKF(w3->rope_freq_factors != NULL && e < 1e-5 && moved > 1e-3, "%g %g", e, moved); /* layout tolerance */
    } else CHECK(0);
    free(l3);
    free(lw3);
    ftune_model_free(h3);
    ftune_model_free(w3);
    free(lh);
    free(lw);
    ftune_model_free(w);
out:
    ftune_model_free(h);
    ftune_model_free(g);
}

/* An adapter's memory is in the memory table: its values as trainables
 * (attached as trainable) or owned weights (frozen), its gradients as
 * gradients, its arrays as "other"; every count returns to where it was
 * when the adapter is freed, a wrapper included. */
static void test_adapter_memory_counted(void) {
    ftune_model *m = load(hf_path);
    if (!m) { CHECK(0); return; }
    size_t before[FT_MEM_N_CLASSES];
    for (int c = 0; c < FT_MEM_N_CLASSES; c++) before[c] = ft_mem_current((ft_mem_class)c);
    ft_adapter_hparams cfg = { .r = 4, .alpha = 8, .targets = FT_MOD_ALL };
    for (int trainable = 0; trainable < 2; trainable++) {
        ft_adapter *a = NULL, *w = NULL;
        CHECK_OK(ft_adapter_attach(&a, m, &cfg, trainable));
        if (!a) continue;
        size_t values = 0; /* r (in + out) per Linear */
        for (int i = 0; i < a->n; i++) values += (size_t)4 * (a->e[i].lin->in + a->e[i].lin->out) * sizeof(float);
        ft_mem_class vc = trainable ? FT_MEM_TRAINABLE : FT_MEM_WEIGHTS;
        CHECK(ft_mem_current(vc) - before[vc] == values);
        CHECK(ft_mem_current(FT_MEM_GRADS) - before[FT_MEM_GRADS] == (trainable ? values : 0));
        size_t other = ft_mem_current(FT_MEM_OTHER) - before[FT_MEM_OTHER];
        CHECK(other >= sizeof *a + (size_t)a->n * (sizeof *a->e + sizeof *a->loras));
        ft_lora *loras[5 * FT_N_MODS] = { 0 };
        for (int i = 0; i < a->n; i++) loras[a->e[i].layer * FT_N_MODS + a->e[i].mod] = a->e[i].lora;
        CHECK_OK(ft_adapter_wrap(&w, m, loras));
        CHECK(ft_mem_current(FT_MEM_OTHER) - before[FT_MEM_OTHER] > other && ft_mem_current(vc) - before[vc] == values);
        ft_adapter_free(w);
        CHECK(ft_mem_current(FT_MEM_OTHER) - before[FT_MEM_OTHER] == other);
        ft_adapter_free(a);
        for (int c = 0; c < FT_MEM_N_CLASSES; c++)
            CHECKF(ft_mem_current((ft_mem_class)c) == before[c], "%s: %zu bytes held after free, %zu before",
                   ft_mem_class_name((ft_mem_class)c), ft_mem_current((ft_mem_class)c), before[c]);
    }
    ftune_model_free(m);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune-test-adapter-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    check_data_path(hf_path, sizeof hf_path, "models/stories260K-hf");
    check_data_path(gguf_path, sizeof gguf_path, "models/stories260K/stories260K.gguf");
    RUN(test_permute_rows);
    RUN(test_peft_round_trip);
    RUN(test_adapter_memory_counted);
    RUN(test_qk_layout_across_models);
    RUN(test_peft_vs_torch);
    RUN(test_wrap_and_partial);
    RUN(test_gguf_adapter);
    RUN(test_gguf_adapter_load);
    RUN(test_bad_adapters);
    RUN(test_gpt2_adapter);
    RUN(test_merge);
    RUN(test_gguf_write);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
