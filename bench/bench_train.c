/* bench_train.c — ftune's side of the training benchmark: a trainer with
 * rank-R LoRA on all seven Linears (dropout 0) and AdamW over the adapters,
 * or full fine-tuning (AdamW over every weight), in a compute dtype (f32,
 * bf16: the model is loaded for it), timed on optimizer steps over random
 * (B, T) token batches whose targets are the next tokens. A step is zero-grad, forward + backward,
 * global-norm clipping to 1 and the AdamW update, as one step of
 * `ftune train` with no accumulation. Prints one JSON line: median step
 * time, tokens/s = B·T / step, peak RSS. bench/torch_train_bench.py does
 * the same in PyTorch. It uses only the public API: ftune_trainer_step is
 * exactly such a step (it also copies and range-checks the B·T tokens, a
 * negligible part of a step). */
#include "ftune.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* B rows of T+1 random tokens: inputs are the first T, targets the last T. */
static void random_batch(int32_t *tok, int32_t *tgt, int B, int T, int V, uint64_t *rng) {
    for (int r = 0; r < B; r++) {
        int32_t prev = (int32_t)(bench_rand_u32(rng) % (uint32_t)V);
        for (int t = 0; t < T; t++) {
            int32_t next = (int32_t)(bench_rand_u32(rng) % (uint32_t)V);
            tok[(size_t)r * T + t] = prev;
            tgt[(size_t)r * T + t] = next;
            prev = next;
        }
    }
}

static int fail(const char *what) {
    fprintf(stderr, "bench_train: %s: %s\n", what, ftune_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_train MODEL [B=4] [T=128] [steps=5] [threads=0] [warmup=1] [dtype=f32] "
                        "[mode=lora|full] [R=16] [optim=adamw|adamw8bit]\n");
        return 2;
    }
    int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 128;
    int steps = argc > 4 ? atoi(argv[4]) : 5, threads = argc > 5 ? atoi(argv[5]) : 0;
    int warmup = argc > 6 ? atoi(argv[6]) : 1;
    const char *dtype = argc > 7 ? argv[7] : "f32", *mode = argc > 8 ? argv[8] : "lora";
    int R = argc > 9 ? atoi(argv[9]) : 16;
    const char *optim = argc > 10 ? argv[10] : "adamw";
    if (B < 1 || T < 1 || steps < 1 || threads < 0 || warmup < 0 || R < 1) {
        fprintf(stderr, "bench_train: B, T, steps and R must be positive, threads and warmup not negative\n");
        return 2;
    }
    if (strcmp(mode, "lora") && strcmp(mode, "full")) {
        fprintf(stderr, "bench_train: mode must be lora or full, not \"%s\"\n", mode);
        return 2;
    }
    ftune_model *m = NULL;
    ftune_load_opts lo = { .dtype = dtype };
    if (ftune_model_load(&m, argv[1], &lo)) return fail(argv[1]);
    ftune_model_info info;
    ftune_model_get_info(m, &info);

    ftune_train_opts o;
    ftune_train_opts_default(&o); /* LoRA, alpha 16, all seven targets, AdamW 0.9/0.999/1e-8, clip 1 */
    o.mode = strcmp(mode, "full") ? FTUNE_TRAIN_LORA : FTUNE_TRAIN_FULL;
    o.lora_r = R;
    o.dtype = dtype;
    o.lora_dropout = 0;
    o.weight_decay = 0;
    o.max_grad_norm = 1.0;
    o.batch_size = B;
    o.ctx = T;
    o.n_threads = threads;
    if (ftune_optim_parse(optim, &o.optim)) return fail("optim");
    ftune_trainer *tr = NULL;
    if (ftune_trainer_new(&tr, m, &o)) return fail("trainer");

    int32_t *tok = malloc((size_t)B * T * sizeof *tok), *tgt = malloc((size_t)B * T * sizeof *tgt);
    double *dt = malloc((size_t)steps * sizeof *dt), first_loss = 0, last_loss = 0;
    if (!tok || !tgt || !dt) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
    uint64_t rng = 1234;
    for (int s = -warmup; s < steps; s++) {
        random_batch(tok, tgt, B, T, info.vocab_size, &rng);
        double loss, t0 = bench_now();
        if (ftune_trainer_step(tr, tok, tgt, B, T, 1e-3, &loss)) return fail("step");
        double t1 = bench_now();
        if (s == -warmup) first_loss = loss;
        last_loss = loss;
        if (s >= 0) dt[s] = t1 - t0;
    }
    double step_s = bench_median(dt, steps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"engine\":\"ftune\",\"model\":\"%s\",\"dtype\":\"%s\",\"mode\":\"%s\",\"lora_r\":%d,"
           "\"B\":%d,\"T\":%d,\"steps\":%d,\"threads\":%d,"
           "\"n_trainable\":%lld,\"step_s\":%.4f,\"tok_s\":%.2f,\"peak_rss_mb\":%.1f,"
           "\"first_loss\":%.4f,\"last_loss\":%.4f,\"optim\":\"%s\"}\n",
           argv[1], ftune_model_dtype(m), mode, o.mode == FTUNE_TRAIN_LORA ? R : 0, B, T, steps,
           ftune_trainer_n_threads(tr), (long long)ftune_trainer_n_trainable(tr), step_s,
           (double)B * T / step_s, ru.ru_maxrss / 1024.0, first_loss, last_loss, optim);
    free(dt);
    free(tok);
    free(tgt);
    ftune_trainer_free(tr);
    ftune_model_free(m);
    return 0;
}
