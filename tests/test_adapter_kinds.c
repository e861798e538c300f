/* test_adapter_kinds.c — the adapter-kind ops table (nn/adapter_kind.h):
 * a LoRA instance's forward, training forward, backward and merge row
 * called through ft_lora_kind equal lora.c's plain-loop references on
 * random inputs of awkward sizes, with and without dropout; and the kind's
 * parameter list names, shapes and holds exactly the tensors the PEFT
 * export writes; and the PEFT and GGUF files of a fixed adapter are, byte
 * for byte, those the writers made before they read the kind's table. */
#include "check.h"
#include "adapter/adapter.h"
#include "cpu/kernels.h"
#include "formats/safetensors.h"
#include "nn/linear.h"
#include "train/train_loop.h"

#include <unistd.h>

static float *rnd(ft_rng *rng, size_t n, float std) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = std * ft_rng_normal(rng);
    return p;
}
static float *dup_f(const float *x, size_t n) {
    float *p = malloc(n * sizeof(float));
    memcpy(p, x, n * sizeof(float));
    return p;
}

static double worst_fwd, worst_bwd, worst_merge;

/* One (T, IC, OC, R, dropout) case on n_threads threads. */
static void kind_case(int T, int IC, int OC, int R, float p, int n_threads) {
    ft_rng rng;
    ft_rng_seed(&rng, 1000u + (uint64_t)T * 7 + IC * 3 + OC + R);
    size_t nA = (size_t)R * IC, nB = (size_t)OC * R;
    float *A = malloc(nA * 4), *B = malloc(nB * 4), *dA = malloc(nA * 4), *dB = malloc(nB * 4);
    ft_lora lo;
    ft_adapter_hparams hp = { .r = R, .alpha = 1.5f * R, .dropout = p };
    ft_lora_init(&lo, &hp, A, B, dA, dB, IC, OC, &rng);
    for (size_t i = 0; i < nB; i++) B[i] = 0.3f * ft_rng_normal(&rng);
    const ft_adapter_inst *ad = &lo.base;
    const ft_adapter_kind *k = ad->kind;
    CHECK(k == &ft_lora_kind && strcmp(k->name, "lora") == 0 && k->saved_floats(ad) == R);

    float *x = rnd(&rng, (size_t)T * IC, 1), *dout = rnd(&rng, (size_t)T * OC, 1);
    float *out0 = rnd(&rng, (size_t)T * OC, 1); /* forward adds to what is there */
    float *scratch = malloc(FT_GEMM_SCRATCH_FLOATS * sizeof(float));
    float *xd = malloc((size_t)T * IC * 4), *g = malloc((size_t)T * R * 4);
    float *u = malloc((size_t)T * R * 4), *ur = malloc((size_t)T * R * 4);
    uint64_t seed = 0xabc0u + (uint64_t)T;

    /* the reference: dropout applied by hand, then lora.c's plain loops */
    float *xr = dup_f(x, (size_t)T * IC);
    if (p > 0) ft_lora_dropout(xr, x, p, seed, T, IC, 1);
    float *yr = dup_f(out0, (size_t)T * OC);
    ft_lora_forward(yr, ur, xr, &lo, T, IC, OC);

    /* training forward through the table */
    float *y = dup_f(out0, (size_t)T * OC);
    k->forward_train(FT_F32, y, u, x, ad, T, IC, OC, seed, xd, n_threads, scratch);
    /* T·R and OC·R products of O(1) terms summed in another order (the
     * kernels' blocking): ~IC·2^-24 relative, with a floor of 1 */
    double e = fmax(check_max_rel_err(y, yr, (long)T * OC, 1.0), check_max_rel_err(u, ur, (long)T * R, 1.0));
    CHECKF(e < 2e-5, "T%d %dx%d R%d p%.1f: forward_train off by %.3g", T, IC, OC, R, p, e);
    worst_fwd = fmax(worst_fwd, e);
    /* the double reference through the table agrees too */
    float *yd = dup_f(out0, (size_t)T * OC), *ud = malloc((size_t)T * R * 4);
    CHECK(k->forward_train_ref(FT_F32, yd, ud, x, ad, T, IC, OC, seed));
    e = check_max_rel_err(yd, yr, (long)T * OC, 1.0);
    CHECKF(e < 2e-5, "T%d %dx%d R%d p%.1f: forward_train_ref off by %.3g", T, IC, OC, R, p, e);
    /* inference forward: no dropout */
    if (p == 0) {
        float *yi = dup_f(out0, (size_t)T * OC);
        k->forward(FT_F32, yi, u, x, ad, T, IC, OC, n_threads, scratch);
        e = check_max_rel_err(yi, yr, (long)T * OC, 1.0);
        CHECKF(e < 2e-5, "T%d %dx%d R%d: forward off by %.3g", T, IC, OC, R, e);
        worst_fwd = fmax(worst_fwd, e);
        free(yi);
    }

    /* backward through the table, dinp added to; the reference: lora.c's
     * plain backward on the dropped-out input, dx back through the mask */
    float *dA0 = rnd(&rng, nA, 0.1f), *dB0 = rnd(&rng, nB, 0.1f), *din0 = rnd(&rng, (size_t)T * IC, 1);
    memcpy(dA, dA0, nA * 4); memcpy(dB, dB0, nB * 4);
    float *dx_ref = malloc((size_t)T * IC * 4), *gr = malloc((size_t)T * R * 4);
    ft_lora_backward(dx_ref, dout, xr, ur, &lo, T, IC, OC, gr);
    if (p > 0) ft_lora_dropout(dx_ref, dx_ref, p, seed, T, IC, 1);
    for (size_t i = 0; i < (size_t)T * IC; i++) dx_ref[i] += din0[i];
    float *dA_ref = dup_f(dA, nA), *dB_ref = dup_f(dB, nB);
    memcpy(dA, dA0, nA * 4); memcpy(dB, dB0, nB * 4);
    float *din = dup_f(din0, (size_t)T * IC);
    k->backward(FT_F32, din, dout, x, ur, ad, T, IC, OC, seed, xd, g, n_threads, scratch);
    /* dA, dB sum up to T = 129 products of terms up to ~3 (g = 1.5·dout·B)
     * in the kernels' order vs the loops' order: the float rounding of such
     * a sum is ~sqrt(T)·2^-24·sum|terms| ~ 1e-5 of a result floored at 1
     * (measured: 1.8e-5), so 1e-4 */
    e = fmax(check_max_rel_err(din, dx_ref, (long)T * IC, 1.0),
             fmax(check_max_rel_err(dA, dA_ref, (long)nA, 1.0), check_max_rel_err(dB, dB_ref, (long)nB, 1.0)));
    CHECKF(e < 1e-4, "T%d %dx%d R%d p%.1f: backward off by %.3g", T, IC, OC, R, p, e);
    worst_bwd = fmax(worst_bwd, e);
    /* and the double reference through the table */
    memcpy(dA, dA0, nA * 4); memcpy(dB, dB0, nB * 4);
    memcpy(din, din0, (size_t)T * IC * 4);
    CHECK(k->backward_ref(FT_F32, din, dout, x, ur, ad, T, IC, OC, seed));
    e = fmax(check_max_rel_err(din, dx_ref, (long)T * IC, 1.0), check_max_rel_err(dA, dA_ref, (long)nA, 1.0));
    CHECKF(e < 1e-4, "T%d %dx%d R%d p%.1f: backward_ref off by %.3g", T, IC, OC, R, p, e);

    /* merge row o: row + scale · B[o,:] · A, against a sum in double */
    float *row = rnd(&rng, (size_t)IC, 1);
    for (int o = 0; o < OC; o += OC > 3 ? OC / 3 : 1) {
        float *r = dup_f(row, (size_t)IC);
        k->merge_row(r, ad, o, IC);
        float *want = malloc((size_t)IC * 4);
        for (int j = 0; j < IC; j++) {
            double s = 0;
            for (int q = 0; q < R; q++) s += (double)B[(size_t)o * R + q] * A[(size_t)q * IC + j];
            want[j] = (float)(row[j] + ft_lora_scale_of(&lo) * s);
        }
        /* R float multiply-adds onto O(1) values: R·2^-24 relative, floor 1 */
        e = check_max_rel_err(r, want, IC, 1.0);
        CHECKF(e < 1e-6, "merge row %d of %dx%d R%d off by %.3g", o, IC, OC, R, e);
        worst_merge = fmax(worst_merge, e);
        free(r); free(want);
    }

    /* the parameter list: A (R, IC) then B (OC, R), with their gradients */
    CHECK(k->n_params == 2);
    ft_adapter_param pa, pb;
    k->param(&pa, ad, 0, IC, OC);
    k->param(&pb, ad, 1, IC, OC);
    CHECK(strcmp(pa.def->peft, "lora_A.weight") == 0 && strcmp(pa.def->gguf, "lora_a") == 0 && !pa.def->out_rows &&
          pa.shape[0] == R && pa.shape[1] == IC && pa.data == A && pa.grad == dA);
    CHECK(strcmp(pb.def->peft, "lora_B.weight") == 0 && strcmp(pb.def->gguf, "lora_b") == 0 && pb.def->out_rows &&
          pb.shape[0] == OC && pb.shape[1] == R && pb.data == B && pb.grad == dB);
    /* the shapes before any instance exists, and the rank dimension of each */
    for (int i = 0; i < 2; i++) {
        int64_t sh[2];
        const ft_adapter_param *q = i ? &pb : &pa;
        k->param_shape(sh, &hp, i, IC, OC);
        CHECK(sh[0] == q->shape[0] && sh[1] == q->shape[1] && k->defs[i].r_dim >= 0 && sh[k->defs[i].r_dim] == R);
    }
    /* bind re-points a parameter (and its gradient) */
    ft_lora lb = lo;
    k->bind(&lb.base, 1, A, NULL);
    CHECK(lb.B == A && lb.dB == NULL && lb.A == A && lb.dA == dA);

    free(A); free(B); free(dA); free(dB); free(x); free(dout); free(out0); free(scratch); free(xd); free(g);
    free(u); free(ur); free(xr); free(yr); free(y); free(yd); free(ud); free(dA0); free(dB0); free(din0);
    free(dx_ref); free(gr); free(dA_ref); free(dB_ref); free(din); free(row);
}

static void test_lora_through_the_table(void) {
    /* awkward sizes: primes, a single row, rank 1, sizes around the kernels' tiles */
    static const int cases[][4] = { { 1, 7, 5, 1 }, { 3, 17, 31, 2 }, { 13, 64, 33, 4 }, { 37, 129, 65, 8 },
                                    { 70, 45, 200, 3 }, { 129, 96, 17, 16 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++)
            for (int th = 1; th <= 2; th++)
                kind_case(cases[i][0], cases[i][1], cases[i][2], cases[i][3], d ? 0.3f : 0.0f, th);
    printf("  max rel err vs the plain LoRA reference: forward %.3g, backward %.3g, merge row %.3g\n", worst_fwd,
           worst_bwd, worst_merge);
}

/* Every parameter the kind lists, for every entry of an attached adapter,
 * is a tensor of the PEFT export with that name and shape, and the export
 * has no other tensor. Values are compared for the modules the writer does
 * not permute (q and k lora_B rows may change RoPE layout on write). */
static void test_params_match_peft_export(void) {
    char hf[1024], dir[600];
    check_data_path(hf, sizeof hf, "models/stories260K-hf");
    ftune_model *m = NULL;
    CHECK_OK(ftune_model_load(&m, hf, NULL));
    if (!m) return;
    ft_adapter_hparams cfg = { .r = 3, .alpha = 6, .dropout = 0.0f, .targets = FT_MOD_ALL };
    ft_adapter *a = NULL;
    cfg.seed = 5;
    CHECK_OK(ft_adapter_attach(&a, m, &cfg, true));
    if (!a) { ftune_model_free(m); return; }
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    for (int i = 0; i < a->n; i++)
        for (size_t j = 0; j < (size_t)a->e[i].lin->out * 3; j++) a->e[i].lora->B[j] = ft_rng_normal(&rng);
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ftune-test-kinds-XXXXXX", base && *base ? base : "/tmp");
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(ft_adapter_save_peft(a, dir));
    char path[700];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_file f;
    memset(&f, 0, sizeof f);
    CHECK_OK(ft_st_open(&f, path));
    int listed = 0, bad = 0;
    for (int i = 0; i < a->n; i++) {
        const ft_adapter_entry *e = &a->e[i];
        const ft_adapter_inst *ad = &e->lora->base;
        CHECK(a->set[e->layer * FT_N_MODS + e->mod] == ad);
        for (int pi = 0; pi < ad->kind->n_params; pi++, listed++) {
            ft_adapter_param p;
            ad->kind->param(&p, ad, pi, e->lin->in, e->lin->out);
            char name[FT_NAME_MAX * 2];
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s", e->layer, ft_module_path(e->mod),
                     p.def->peft);
            const st_tensor *t = ft_st_find(&f, name);
            if (!t || t->dtype != FT_F32 || t->ndim != 2 || t->shape[0] != p.shape[0] || t->shape[1] != p.shape[1]) {
                fprintf(stderr, "  %s: missing or of another shape in the export\n", name);
                bad++;
                continue;
            }
            CHECK(p.grad != NULL); /* attached trainable: every listed parameter has its gradient */
            bool permuted = e->mod == FT_MOD_Q || e->mod == FT_MOD_K;
            if (!permuted && memcmp(t->data, p.data, (size_t)(p.shape[0] * p.shape[1]) * 4) != 0) {
                fprintf(stderr, "  %s: values differ from the parameter's\n", name);
                bad++;
            }
        }
    }
    CHECKF(bad == 0, "%d of %d listed parameters do not match the export", bad, listed);
    CHECKF(f.n == listed, "the export has %d tensors, the kind lists %d", f.n, listed);
    ft_st_close(&f);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    ft_adapter_free(a);
    ftune_model_free(m);
}

/* Attaches a fixed adapter (r 3, rsLoRA, q, k, v, down; A from seed 7, B
 * a fixed pattern of exact binary fractions) to the model at model_path,
 * writes it as PEFT and as a GGUF LoRA into dir, and returns the FNV-1a
 * hash and size of adapter_model.safetensors (0) and adapter.gguf (1). */
static bool adapter_file_hashes(const char *model_path, const char *dir, uint64_t h[2], size_t sz[2]) {
    ftune_model *m = NULL;
    if (ftune_model_load(&m, model_path, NULL) != FTUNE_OK) return false;
    ft_adapter_hparams cfg = { .r = 3, .alpha = 5, .rslora = true, .dropout = 0.125f,
                               .targets = FT_MOD_BIT(FT_MOD_Q) | FT_MOD_BIT(FT_MOD_K) | FT_MOD_BIT(FT_MOD_V) |
                                          FT_MOD_BIT(FT_MOD_DOWN) };
    cfg.seed = 7;
    ft_adapter *a = NULL;
    bool ok = ft_adapter_attach(&a, m, &cfg, false) == FTUNE_OK;
    for (int i = 0; ok && i < a->n; i++)
        for (size_t j = 0; j < (size_t)a->e[i].lin->out * cfg.r; j++)
            a->e[i].lora->B[j] = (float)((int)((j * 37 + (size_t)i * 11) % 23) - 11) * 0.0625f;
    char p[2][800];
    snprintf(p[0], sizeof p[0], "%s/adapter_model.safetensors", dir);
    snprintf(p[1], sizeof p[1], "%s/adapter.gguf", dir);
    ok = ok && ft_adapter_save_peft(a, dir) == FTUNE_OK && ft_adapter_save_gguf(a, p[1]) == FTUNE_OK;
    for (int k = 0; ok && k < 2; k++) {
        char *bytes = NULL;
        ok = ft_read_file(p[k], &bytes, &sz[k]) == FTUNE_OK;
        if (ok) h[k] = ft_fnv1a(FT_FNV0, bytes, sz[k]);
        free(bytes);
    }
    ft_adapter_free(a);
    ftune_model_free(m);
    return ok;
}

/* The files of adapter_file_hashes as the writers made them before they
 * went through the kind's table (names, shapes, which rows RoPE permutes):
 * the hashes were taken from that build's output. Every value in them is
 * exact (A from the integer RNG and sqrtf, B binary fractions), so any
 * machine writes the same bytes. The HF model writes B in rotate-half
 * order as it is; the GGUF model (interleaved q/k rows) permutes q and k's
 * B for PEFT, and keeps them for the llama-arch GGUF. */
static void test_files_unchanged(void) {
    static const struct { const char *model; size_t st_size, gguf_size; uint64_t st_hash, gguf_hash; } want[] = {
        { "models/stories260K-hf", 38352, 36288, 0x6b27f05de0530bd0ull, 0xedc8b0baafd89fdbull },
        { "models/stories260K/stories260K.gguf", 38352, 36288, 0x0279cd7f99b8a1b0ull, 0xb87efc9f6a9d30ebull },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char model[1024], dir[600];
        check_data_path(model, sizeof model, want[i].model);
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/ftune-test-kinds-XXXXXX", base && *base ? base : "/tmp");
        CHECK(mkdtemp(dir) != NULL);
        uint64_t h[2] = { 0, 0 };
        size_t sz[2] = { 0, 0 };
        CHECKF(adapter_file_hashes(model, dir, h, sz), "%s: %s", want[i].model, ftune_last_error());
        CHECKF(sz[0] == want[i].st_size && h[0] == want[i].st_hash, "%s: adapter_model.safetensors %zu bytes, hash "
               "0x%016llx (want %zu, 0x%016llx)", want[i].model, sz[0], (unsigned long long)h[0], want[i].st_size,
               (unsigned long long)want[i].st_hash);
        CHECKF(sz[1] == want[i].gguf_size && h[1] == want[i].gguf_hash, "%s: adapter.gguf %zu bytes, hash 0x%016llx "
               "(want %zu, 0x%016llx)", want[i].model, sz[1], (unsigned long long)h[1], want[i].gguf_size,
               (unsigned long long)want[i].gguf_hash);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
}

int main(void) {
    RUN(test_lora_through_the_table);
    RUN(test_params_match_peft_export);
    RUN(test_files_unchanged);
    CHECK_EXIT();
}
