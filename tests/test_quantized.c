/* test_quantized.c — GGUF models with Q8_0 / Q4_0 weights: stories260K is
 * quantized (ft_model_write with a dtype), loaded back, and its logits are
 * compared with the PyTorch reference run on the same weights dequantized
 * (written as a Hugging Face directory in f32). This checks the quantized
 * load and matmul paths (prefill, decode widened, decode in integers), not
 * the quality of quantization. */
#include "ftune.h"
#include "model/model.h"
#include "check.h"

#include <unistd.h>

static char tmpdir[256];

static float *read_ref(const char *path, int *T, int *V) {
    FILE *f = fopen(path, "rb");
    int32_t n, t, v;
    float *out = NULL;
    if (f && fread(&n, 4, 1, f) == 1 && n >= 1 && fread(&t, 4, 1, f) == 1 && fread(&v, 4, 1, f) == 1) {
        out = malloc((size_t)t * v * sizeof(float));
        if (fread(out, sizeof(float), (size_t)t * v, f) != (size_t)t * v) { free(out); out = NULL; }
        *T = t; *V = v;
    }
    if (f) fclose(f);
    return out;
}

static void check_dtype(const char *dtype) {
    char src[512], q[512], deq[512], out[512], cmd[2048];
    check_data_path(src, sizeof src, "models/stories260K/stories260K.gguf");
    snprintf(q, sizeof q, "%s/%s.gguf", tmpdir, dtype);
    snprintf(deq, sizeof deq, "%s/%s-dequantized", tmpdir, dtype);
    snprintf(out, sizeof out, "%s/%s.logits", tmpdir, dtype);
    ftune_model *base = NULL, *qm = NULL;
    CHECK_OK(ftune_model_load(&base, src, NULL));
    if (!base) return;
    ft_model_write_opts o = { .dtype = dtype };
    CHECK_OK(ft_model_write(base, q, &o));
    ftune_model_free(base);
    CHECK_OK(ftune_model_load(&qm, q, NULL));
    if (!qm) return;
    ftune_model_info info;
    ftune_model_get_info(qm, &info);
    CHECKF(strstr(info.dtypes, dtype) != NULL, "dtypes %s lack %s", info.dtypes, dtype);
    /* the same weights, dequantized to f32, in HF layout for the reference */
    ft_model_write_opts f32 = { .dtype = "f32" };
    CHECK_OK(ft_model_write(qm, deq, &f32));
    enum { T = 48 };
    int32_t ids[T];
    char toks[T * 8] = "";
    for (int t = 0; t < T; t++) {
        ids[t] = t == 0 ? 1 : (int32_t)((t * 7919 + 13) % info.vocab_size);
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%s%d", t ? "," : "", ids[t]);
    }
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/ref_forward.py --model %s --tokens '%s' --out %s", deq, toks, out);
    CHECK(system(cmd) == 0);
    int rT = 0, rV = 0;
    float *ref = read_ref(out, &rT, &rV);
    CHECK(ref && rT == T && rV == info.vocab_size);
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, qm, 0, 2));
    float *ours = malloc((size_t)T * info.vocab_size * sizeof(float));
    /* batched (dequantized tiles + sgemm), one token at a time with the rows
     * widened (fused dot), and one at a time with integer products (16-bit
     * activations, the default) */
    for (int pass = 0; pass < 3 && s && ref; pass++) {
        ftune_session_reset(s);
        ftune_session_set_int_products(s, pass == 2);
        if (pass == 0) CHECK_OK(ftune_session_forward(s, ids, T, ours, 1));
        else
            for (int t = 0; t < T; t++) CHECK_OK(ftune_session_forward(s, ids + t, 1, ours + (size_t)t * info.vocab_size, 0));
        double mx = 0, dmax = 0;
        for (long i = 0; i < (long)T * info.vocab_size; i++) {
            mx = fmax(mx, fabs(ref[i]));
            dmax = fmax(dmax, fabs(ours[i] - ref[i]));
        }
        double e = check_max_rel_err(ours, ref, (long)T * info.vocab_size, 0.01 * mx);
        printf("  %s %s: max rel err %.3g (largest difference %.3g of the largest logit) vs PyTorch on the dequantized weights\n",
               dtype, pass == 0 ? "prefill" : pass == 1 ? "decode" : "decode, integer products", e, dmax / mx);
        if (pass < 2) {
            /* same tolerance and reason as test_forward: float32 vs float64 */
            CHECKF(e <= 1e-4, "%s: max rel err %.3g", dtype, e);
        } else {
            /* the activations rounded to 16 bits: 2^-16 of each block's
             * largest value, which stories260K's 64-wide states carry
             * through 5 layers to 5e-5 of the largest logit (measured,
             * q8_0 and q4_0); 1e-3 leaves room for other inputs */
            CHECKF(dmax <= 1e-3 * mx, "%s: integer decode off by %.3g of the largest logit", dtype, dmax / mx);
        }
    }
    free(ours);
    free(ref);
    ftune_session_free(s);
    ftune_model_free(qm);
}

static void test_q8_0(void) { check_dtype("q8_0"); }
static void test_q4_0(void) { check_dtype("q4_0"); }
static void test_bf16_gguf(void) { check_dtype("bf16"); }

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune-test-quant-XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    RUN(test_q8_0);
    RUN(test_q4_0);
    RUN(test_bf16_gguf);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {}
    CHECK_EXIT();
}
