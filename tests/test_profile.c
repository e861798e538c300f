/* test_profile.c — FTUNE_PROFILE (the timing backend of nn/backend_profile.c)
 * changes no number: three trainer steps of stories260K give bit-identical
 * losses with it and without it, for LoRA (with dropout) and full
 * fine-tuning, in f32 and bf16; and an inference session's decode steps
 * (one-token forwards, which it times) give bit-identical logits. Its
 * tables go to stderr. */
#include "ftune.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

static char stories_hf[4096];

static void losses(double out[3], const char *dtype, ftune_train_mode mode, int profile) {
    if (profile) setenv("FTUNE_PROFILE", "1", 1); else unsetenv("FTUNE_PROFILE");
    ftune_model *m = NULL;
    ftune_load_opts lo = { .dtype = dtype };
    CHECK_OK(ftune_model_load(&m, stories_hf, &lo));
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    o.mode = mode;
    o.lora_dropout = 0.1f;
    o.batch_size = 2;
    o.ctx = 33;          /* awkward: not a multiple of any tile */
    o.n_threads = 2;
    o.max_grad_norm = 1.0;
    o.seed = 7;
    ftune_trainer *tr = NULL;
    CHECK_OK(ftune_trainer_new(&tr, m, &o));
    int32_t tok[66], tgt[66];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 66; i++) tok[i] = (i * 37 + s * 11) % 512, tgt[i] = (i * 53 + s) % 512;
        CHECK_OK(ftune_trainer_step(tr, tok, tgt, 2, 33, 1e-2, &out[s]));
    }
    ftune_trainer_free(tr);
    ftune_model_free(m);
    unsetenv("FTUNE_PROFILE");
}

static void test_same_numbers(void) {
    const char *dts[] = { "f32", "bf16" };
    for (int d = 0; d < 2; d++)
        for (int mode = 0; mode < 2; mode++) {
            double a[3], b[3];
            losses(a, dts[d], mode ? FTUNE_TRAIN_FULL : FTUNE_TRAIN_LORA, 0);
            losses(b, dts[d], mode ? FTUNE_TRAIN_FULL : FTUNE_TRAIN_LORA, 1);
            /* exact: the profiled backend calls the same functions on the same data in the same order */
            for (int s = 0; s < 3; s++)
                CHECKF(a[s] == b[s], "%s %s step %d: loss %.17g without the profile, %.17g with it", dts[d],
                       mode ? "full" : "lora", s, a[s], b[s]);
            CHECK(a[2] != a[0]); /* the steps trained something */
        }
}

/* A prefill of 5 tokens, then 4 decode steps: every step's logits. */
static void decode_logits(float *out, int V, const char *dtype, int profile) {
    if (profile) setenv("FTUNE_PROFILE", "1", 1); else unsetenv("FTUNE_PROFILE");
    ftune_model *m = NULL;
    ftune_load_opts lo = { .dtype = dtype };
    CHECK_OK(ftune_model_load(&m, stories_hf, &lo));
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, 16, 2));
    int32_t tok[9] = { 1, 40, 300, 7, 99, 12, 260, 5, 511 };
    CHECK_OK(ftune_session_forward(s, tok, 5, out, 0));
    for (int i = 5; i < 9; i++) CHECK_OK(ftune_session_forward(s, tok + i, 1, out + (size_t)(i - 4) * V, 0));
    ftune_session_free(s);
    ftune_model_free(m);
    unsetenv("FTUNE_PROFILE");
}

static void test_same_decode(void) {
    enum { V = 512 }; /* stories260K's vocabulary */
    const char *dts[] = { "f32", "bf16" };
    static float a[5 * V], b[5 * V];
    for (int d = 0; d < 2; d++) {
        decode_logits(a, V, dts[d], 0);
        decode_logits(b, V, dts[d], 1);
        /* exact, as for training */
        CHECKF(!memcmp(a, b, sizeof a), "%s: decode logits differ with the profile", dts[d]);
        CHECK(memcmp(a + V, a + 2 * V, V * sizeof(float))); /* the steps see different tokens */
    }
}

int main(void) {
    check_data_path(stories_hf, sizeof stories_hf, "models/stories260K-hf");
    RUN(test_same_numbers);
    RUN(test_same_decode);
    CHECK_EXIT();
}
