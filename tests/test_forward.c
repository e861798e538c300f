/* test_forward.c — the forward pass against the PyTorch reference
 * (scripts/ref_forward.py, computed in float64): stories260K from all three
 * formats, a random Qwen2-shaped model (BF16, sharded, q/k/v biases, untied
 * head) and a Llama 3-shaped one (F16, llama3 RoPE scaling); batched prefill
 * against one-token-at-a-time decode; the linear fast paths against the
 * reference on every dtype. */
#include "ftune.h"
#include "nn/linear.h"
#include "model/model.h"
#include "check.h"

#include <stdint.h>
#include <unistd.h>

static char tmpdir[256];

static int run(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "  command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Reads ref_forward.py's output: n_seqs, then per sequence T, V, logits. */
static float *read_ref(const char *path, int seq, int *T, int *V) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    int32_t n, t, v;
    float *out = NULL;
    if (fread(&n, 4, 1, f) != 1) goto done;
    for (int i = 0; i < n; i++) {
        if (fread(&t, 4, 1, f) != 1 || fread(&v, 4, 1, f) != 1) goto done;
        if (i == seq) {
            out = malloc((size_t)t * v * sizeof(float));
            if (fread(out, sizeof(float), (size_t)t * v, f) != (size_t)t * v) { free(out); out = NULL; }
            *T = t; *V = v;
            goto done;
        }
        fseek(f, (long)t * v * 4, SEEK_CUR);
    }
done:
    fclose(f);
    return out;
}

/* A deterministic token sequence of length T below V, starting with BOS 1. */
static void make_tokens(int32_t *ids, int T, int V, uint32_t seed, int bos) {
    uint32_t x = seed * 2654435761u + 1;
    for (int t = 0; t < T; t++) {
        x = x * 1664525u + 1013904223u;
        ids[t] = (int32_t)((x >> 8) % (uint32_t)V);
    }
    if (bos >= 0) ids[0] = bos;
}

static void write_tokens_arg(char *buf, size_t cap, const int32_t *ids, int T) {
    size_t n = 0;
    for (int t = 0; t < T && n + 12 < cap; t++) n += (size_t)snprintf(buf + n, cap - n, "%s%d", t ? "," : "", ids[t]);
}

/* Logits of model for ids, either in one batched call or one token at a time. */
static float *ftune_logits(const ftune_model *m, const int32_t *ids, int T, int V, bool one_by_one) {
    ftune_session *s = NULL;
    if (ftune_session_new(&s, m, 0, 2)) return NULL;
    float *out = malloc((size_t)T * V * sizeof(float));
    ftune_status st = FTUNE_OK;
    if (one_by_one)
        for (int t = 0; t < T && !st; t++) st = ftune_session_forward(s, ids + t, 1, out + (size_t)t * V, 0);
    else st = ftune_session_forward(s, ids, T, out, 1);
    ftune_session_free(s);
    if (st) { fprintf(stderr, "  forward: %s\n", ftune_last_error()); free(out); return NULL; }
    return out;
}

/* Max over elements of |ours - ref| / max(|ref|, 1% of max |ref|): the
 * floor keeps logits that happen to be near zero from turning float32
 * rounding into a huge "relative" error, while scaling with the logits
 * (random-weight models have logits of ~0.1, trained ones of ~10). */
static double logit_err(const float *ours, const float *ref, long n) {
    double mx = 0;
    for (long i = 0; i < n; i++) mx = fmax(mx, fabs((double)ref[i]));
    return check_max_rel_err(ours, ref, n, 0.01 * mx);
}

/* Compares a model's logits with the reference of an HF directory. */
static double compare(const char *model_path, const char *ref_dir, const char *tag, int T, int bos, bool also_decode) {
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, model_path, NULL);
    if (st) { fprintf(stderr, "  load %s: %s\n", model_path, ftune_last_error()); return INFINITY; }
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    int V = info.vocab_size;
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    make_tokens(ids, T, V, (uint32_t)T, bos);
    char *arg = malloc((size_t)T * 12 + 16), cmd[4096 + 1024], out[512];
    write_tokens_arg(arg, (size_t)T * 12 + 16, ids, T);
    snprintf(out, sizeof out, "%s/%s.logits", tmpdir, tag);
    char *full = malloc(strlen(arg) + 1024);
    sprintf(full, "/usr/bin/python3 scripts/ref_forward.py --model %s --tokens '%s' --out %s", ref_dir, arg, out);
    double err = INFINITY;
    if (run(full) == 0) {
        int rT, rV;
        float *ref = read_ref(out, 0, &rT, &rV);
        float *ours = ftune_logits(m, ids, T, V, false);
        if (ref && ours && rT == T && rV == V) {
            err = logit_err(ours, ref, (long)T * V);
            printf("  %-24s T=%d V=%d  batched max rel err %.3g\n", tag, T, V, err);
            if (also_decode) {
                float *dec = ftune_logits(m, ids, T, V, true);
                double e2 = dec ? logit_err(dec, ref, (long)T * V) : INFINITY;
                printf("  %-24s one token at a time max rel err %.3g\n", tag, e2);
                if (e2 > err) err = e2;
                free(dec);
            }
        }
        free(ref);
        free(ours);
    }
    (void)cmd;
    free(full);
    free(arg);
    free(ids);
    ftune_model_free(m);
    return err;
}

/* 1e-4: float32 rounding through a few layers, against a float64
 * reference, measures 1e-5..5e-5 here; a real mistake (a wrong RoPE pair,
 * a missing bias, a norm epsilon off) shows up at 1e-2 or more. */
#define LOGIT_TOL 1e-4

static char stories_hf[512];

static void test_stories260k_hf(void) {
    /* T = 200 spans two prefill chunks of 128 */
    double e = compare(stories_hf, stories_hf, "stories260K-hf", 200, 1, true);
    CHECKF(e <= LOGIT_TOL, "max rel err %.3g", e);
}

static void test_stories260k_gguf(void) {
    char p[512];
    double e = compare(check_data_path(p, sizeof p, "models/stories260K/stories260K.gguf"), stories_hf,
                       "stories260K.gguf", 64, 1, false);
    CHECKF(e <= LOGIT_TOL, "max rel err %.3g", e);
}

static void test_stories260k_llama2c(void) {
    char p[512];
    double e = compare(check_data_path(p, sizeof p, "models/stories260K/stories260K.bin"), stories_hf,
                       "stories260K.bin", 64, 1, true);
    CHECKF(e <= LOGIT_TOL, "max rel err %.3g", e);
}

static void test_qwen2_bf16_sharded(void) {
    char dir[512], cmd[1024];
    snprintf(dir, sizeof dir, "%s/qwen2", tmpdir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/make_fixture.py --kind qwen2 --out %s", dir);
    CHECK(run(cmd) == 0);
    /* the reference reads the same BF16 values, widened exactly */
    double e = compare(dir, dir, "qwen2-bf16-sharded", 40, -1, true);
    CHECKF(e <= LOGIT_TOL, "max rel err %.3g", e);
}

static void test_llama3_f16_rope_scaling(void) {
    char dir[512], cmd[1024];
    snprintf(dir, sizeof dir, "%s/llama3", tmpdir);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/make_fixture.py --kind llama3 --out %s", dir);
    CHECK(run(cmd) == 0);
    /* T = 150 goes past original_max_position_embeddings (64), where the
     * llama3 scaling changes the low frequencies */
    double e = compare(dir, dir, "llama3-f16", 150, -1, false);
    CHECKF(e <= LOGIT_TOL, "max rel err %.3g", e);
}

/* Every dtype's fast linear path against the dequantize + plain-loop
 * reference, on awkward sizes, for T = 1 (decode) and T > 1 (tiles). */
static void test_linear_fast_paths(void) {
    ft_dtype types[] = { FT_F32, FT_F16, FT_BF16, FT_Q8_0, FT_Q4_0 };
    int outs[] = { 1, 37, 200 }, ins[] = { 64, 96 }, Ts[] = { 1, 3, 17 };
    ft_rng rng;
    ft_rng_seed(&rng, 7);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int oi = 0; oi < 3; oi++)
            for (int ii = 0; ii < 2; ii++)
                for (int k = 0; k < 3; k++) {
                    int OC = outs[oi], IC = ins[ii], T = Ts[k];
                    float *w = malloc((size_t)OC * IC * 4), *x = malloc((size_t)T * IC * 4), *b = malloc((size_t)OC * 4);
                    for (int i = 0; i < OC * IC; i++) w[i] = ft_rng_normal(&rng);
                    for (int i = 0; i < T * IC; i++) x[i] = ft_rng_normal(&rng);
                    for (int i = 0; i < OC; i++) b[i] = ft_rng_normal(&rng);
                    int64_t nb = ft_dtype_nbytes(types[ti], (int64_t)OC * IC);
                    void *q = malloc((size_t)nb);
                    ft_types[types[ti]].from_f32(w, q, (int64_t)OC * IC);
                    ft_linear l = { .w = { .dtype = types[ti], .ndim = 2, .shape = { OC, IC }, .data = q, .nbytes = (size_t)nb },
                                    .bias = k == 1 ? b : NULL, .in = IC, .out = OC };
                    float *y = malloc((size_t)T * OC * 4), *yr = malloc((size_t)T * OC * 4);
                    float *scratch = malloc(ft_linear_scratch_floats(IC, 2) * 4);
                    ft_linear_forward(y, x, &l, NULL, T, 2, scratch);
                    ft_linear_forward_ref(yr, x, &l, NULL, T);
                    /* same dequantized weights, only the summation order
                     * differs: a few ulps of a sum of IC ~ N(0, IC) terms;
                     * floor 1 since sums near zero have no relative scale */
                    double e = check_max_rel_err(y, yr, (long)T * OC, 1.0);
                    CHECKF(e < 1e-5, "%s OC=%d IC=%d T=%d: max rel err %.3g", ft_types[types[ti]].name, OC, IC, T, e);
                    free(w); free(x); free(b); free(q); free(y); free(yr); free(scratch);
                }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune-test-forward-XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    RUN(test_linear_fast_paths);
    RUN(test_stories260k_hf);
    RUN(test_stories260k_gguf);
    RUN(test_stories260k_llama2c);
    RUN(test_qwen2_bf16_sharded);
    RUN(test_llama3_f16_rope_scaling);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {}
    CHECK_EXIT();
}
