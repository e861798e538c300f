/* test_bnb.c — Hugging Face `*-bnb-4bit` checkpoints: stories260K written
 * in transformers' serialized bitsandbytes layout (tests/bnb_write.py,
 * from the documented layout with tests/nf4_ref.py's bitsandbytes
 * algorithm) loads with every 4-bit Linear dequantized bit for bit as
 * bitsandbytes does: its logits equal, to the bit, those of the same model
 * with the Linears dequantized to f32 in Python. The file's tensor sizes
 * are the double-quantized NF4 sizes. Unsupported quant types, block
 * sizes, missing parts, wrong shapes and quant_state JSON that is not
 * strictly JSON (trailing bytes, leading zeros) are errors naming the tensor. */
#include "ftune.h"
#include "formats/bnb.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "check.h"

#include <unistd.h>

static char tmpdir[256];

static bool write_ckpt(const char *bnb, const char *f32, const char *brk) {
    char src[512], cmd[2048];
    check_data_path(src, sizeof src, "models/stories260K-hf");
    snprintf(cmd, sizeof cmd, ".venv/bin/python tests/bnb_write.py %s %s %s%s%s", src, bnb, f32, brk ? " --break " : "",
             brk ? brk : "");
    return system(cmd) == 0;
}

static void logits(ftune_model *m, const int32_t *ids, int T, float *out, int V) {
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, 0, 1));
    if (!s) return;
    CHECK_OK(ftune_session_forward(s, ids, T, out, 1));
    ftune_session_reset(s);
    for (int t = 0; t < T; t++) CHECK_OK(ftune_session_forward(s, ids + t, 1, out + (size_t)(T + t) * V, 0));
    ftune_session_free(s);
}

static void test_bnb_load(void) {
    char bnb[512], f32[512], p[600];
    snprintf(bnb, sizeof bnb, "%s/bnb", tmpdir);
    snprintf(f32, sizeof f32, "%s/f32", tmpdir);
    CHECK(write_ckpt(bnb, f32, NULL));
    ftune_model *q = NULL, *r = NULL;
    CHECK_OK(ftune_model_load(&q, bnb, NULL));
    CHECK_OK(ftune_model_load(&r, f32, NULL));
    if (!q || !r) { ftune_model_free(q); ftune_model_free(r); return; }
    ftune_model_info info;
    ftune_model_get_info(q, &info);
    CHECKF(strstr(info.dtypes, "nf4") != NULL, "dtypes %s", info.dtypes);
    /* in = 64 rows are nf4; down_proj (in = 172) is held in f32, exact */
    CHECK(q->layers[0].wq.w.dtype == FT_NF4 && q->layers[0].w_down.w.dtype == FT_F32);
    CHECK(q->quantized && q->quant == FT_NF4);
    enum { T = 40 };
    int V = info.vocab_size;
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = t == 0 ? 1 : (int32_t)((t * 7919 + 13) % V);
    float *a = calloc((size_t)2 * T * V, sizeof(float)), *b = calloc((size_t)2 * T * V, sizeof(float));
    logits(q, ids, T, a, V);
    logits(r, ids, T, b, V);
    /* the same f32 weight values and the same kernels: equal to the bit */
    CHECK(memcmp(a, b, (size_t)2 * T * V * sizeof(float)) == 0);
    free(a); free(b);
    /* --quant on a checkpoint that is already quantized */
    ftune_model *qq = NULL;
    ftune_load_opts o = { .quant = "nf4" };
    CHECK(ftune_model_load(&qq, bnb, &o) == FTUNE_ERR_ARG);
    CHECKF(strstr(ftune_last_error(), "already quantized") != NULL, "%s", ftune_last_error());
    ftune_model_free(q);
    ftune_model_free(r);
    /* the file's sizes: every 4-bit Linear takes the bytes of double-
     * quantized NF4 (4 bits + 8 per 64 + 32 per 64·256 + the offset) */
    st_file f;
    snprintf(p, sizeof p, "%s/model.safetensors", bnb);
    CHECK_OK(ft_st_open(&f, p));
    int n_lin = 0;
    for (int i = 0; i < f.n; i++) {
        const char *nm = f.tensors[i].name;
        size_t len = strlen(nm);
        if (len < 7 || strcmp(nm + len - 7, ".weight") != 0 || f.tensors[i].dtype != FT_U8) continue;
        char k[512];
        int64_t bytes = (int64_t)(f.tensors[i].end - f.tensors[i].begin), numel = 2 * bytes;
        const char *sfx[] = { ".absmax", ".nested_absmax" };
        for (int s = 0; s < 2; s++) {
            snprintf(k, sizeof k, "%s%s", nm, sfx[s]);
            const st_tensor *t = ft_st_find(&f, k);
            CHECK(t != NULL);
            if (t) bytes += (int64_t)(t->end - t->begin);
        }
        bytes += 4; /* nested_offset, an f32 in the JSON */
        CHECKF(8.0 * (double)bytes / (double)numel == ft_bnb_nf4_bits_per_param(numel), "%s: %.4f bits", nm,
               8.0 * (double)bytes / (double)numel);
        n_lin++;
    }
    CHECK(n_lin == 35);
    ft_st_close(&f);
}

/* Each broken variant names the tensor and what is unsupported. */
static void test_bnb_errors(void) {
    static const struct { const char *brk; ftune_status st; const char *msg; } cases[] = {
        { "fp4", FTUNE_ERR_UNSUPPORTED, "quant type fp4 is not supported (only nf4)" },
        { "blocksize", FTUNE_ERR_UNSUPPORTED, "blocksize 128 is not supported (only 64)" },
        { "nested_blocksize", FTUNE_ERR_UNSUPPORTED, "nested_blocksize other than 256 is not supported" },
        { "no_nested_absmax", FTUNE_ERR_FORMAT, "nested_absmax\": missing" },
        { "shape", FTUNE_ERR_FORMAT, "\"shape\" is not [32, 64]" },
        /* parsed strictly (cJSON alone accepts both, with the values changed or ignored) */
        { "trailing", FTUNE_ERR_FORMAT, "bytes after the JSON object" },
        { "leading_zero", FTUNE_ERR_FORMAT, "a number with a leading zero" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char bnb[512], f32[512];
        snprintf(bnb, sizeof bnb, "%s/bad-%s", tmpdir, cases[c].brk);
        snprintf(f32, sizeof f32, "%s/bad-%s-f32", tmpdir, cases[c].brk);
        CHECK(write_ckpt(bnb, f32, cases[c].brk));
        ftune_model *m = NULL;
        ftune_status st = ftune_model_load(&m, bnb, NULL);
        const char *e = ftune_last_error();
        CHECKF(st == cases[c].st && m == NULL, "%s: status %s", cases[c].brk, ftune_status_name(st));
        CHECKF(strstr(e, cases[c].msg) && strstr(e, "model.layers.1.self_attn.k_proj.weight"), "%s: \"%s\"",
               cases[c].brk, e);
        ftune_model_free(m);
    }
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune-test-bnb-XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    RUN(test_bnb_load);
    RUN(test_bnb_errors);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {}
    CHECK_EXIT();
}
