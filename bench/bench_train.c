/* bench_train.c — ftune's side of the LoRA training benchmark: a trainer
 * with rank-8 LoRA on all seven Linears (dropout 0) and AdamW over the
 * adapters, timed on optimizer steps over random (B, T) token batches whose
 * targets are the next tokens. A step is zero-grad, forward + backward,
 * global-norm clipping to 1 and the AdamW update, as one step of
 * `ftune train` with no accumulation. Prints one JSON line: median step
 * time, tokens/s = B·T / step, peak RSS. bench/torch_train_bench.py does
 * the same in PyTorch. */
#include "ftune.h"
#include "bench_util.h"
#include "model.h"
#include "optim.h"
#include "train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* OpenBLAS's name for the kernels it picked for this CPU ("Prescott" when it
 * does not recognise the CPU and falls back to SSE3); weak, so another BLAS
 * links too. */
extern char *openblas_get_corename(void) __attribute__((weak));
static const char *blas_core(void) { return openblas_get_corename ? openblas_get_corename() : "unknown"; }

/* B rows of T+1 random tokens: inputs are the first T, targets the last T. */
static void random_batch(ft_batch *b, int B, int T, int V, ft_rng *rng) {
    b->B = B;
    b->T = T;
    for (int r = 0; r < B; r++) {
        int32_t *tok = b->tokens + (size_t)r * T;
        int *tgt = b->targets + (size_t)r * T;
        int32_t prev = (int32_t)(ft_rng_u32(rng) % (uint32_t)V);
        for (int t = 0; t < T; t++) {
            int32_t next = (int32_t)(ft_rng_u32(rng) % (uint32_t)V);
            tok[t] = prev;
            tgt[t] = next;
            prev = next;
        }
    }
    b->pos = NULL;
    b->doc = NULL;
    b->n_targets = (int64_t)B * T;
    b->n_examples = B;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_train: %s: %s\n", what, ftune_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_train MODEL [B=4] [T=128] [steps=5] [threads=0] [warmup=1]\n"
                        "       bench_train --blas-core   (prints the OpenBLAS kernel set in use)\n");
        return 2;
    }
    if (strcmp(argv[1], "--blas-core") == 0) {
        printf("%s\n", blas_core());
        return 0;
    }
    int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 128;
    int steps = argc > 4 ? atoi(argv[4]) : 5, threads = argc > 5 ? atoi(argv[5]) : 0;
    int warmup = argc > 6 ? atoi(argv[6]) : 1;
    if (B < 1 || T < 1 || steps < 1 || threads < 0 || warmup < 0) {
        fprintf(stderr, "bench_train: B, T and steps must be positive, threads and warmup not negative\n");
        return 2;
    }
    ftune_model *m = NULL;
    if (ftune_model_load(&m, argv[1], NULL)) return fail(argv[1]);
    const ft_config *c = &m->cfg;

    ft_train_opts o;
    ft_train_opts_default(&o); /* LoRA r 8, alpha 16, dropout 0, all seven targets */
    o.max_B = B;
    o.max_T = T;
    o.n_threads = threads;
    ft_trainer *tr = NULL;
    if (ft_trainer_new(&tr, m, &o)) return fail("trainer");

    int np = ft_trainer_n_params(tr);
    ft_param *ps = calloc((size_t)np, sizeof *ps);
    if (!ps) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
    for (int i = 0; i < np; i++) {
        const ft_train_param *tp = ft_trainer_param(tr, i);
        snprintf(ps[i].name, sizeof ps[i].name, "%s", tp->name);
        ps[i].data = tp->data;
        ps[i].grad = tp->grad;
        ps[i].numel = tp->numel;
        ps[i].ndim = tp->ndim;
        ps[i].shape[0] = tp->shape[0];
        ps[i].shape[1] = tp->shape[1];
        ps[i].decay = true;
    }
    ft_adamw_cfg ac;
    ft_adamw_defaults(&ac); /* betas 0.9/0.999, eps 1e-8, weight decay 0 */
    ft_adamw opt;
    if (ft_adamw_init(&opt, ps, np, &ac)) return fail("optimizer");

    ft_batch b;
    if (ft_batch_init(&b, B, T)) return fail("batch");
    ft_rng rng;
    ft_rng_seed(&rng, 1234);
    double *dt = malloc((size_t)steps * sizeof *dt), first_loss = 0, last_loss = 0;
    if (!dt) { fprintf(stderr, "bench_train: out of memory\n"); return 1; }
    for (int s = -warmup; s < steps; s++) {
        random_batch(&b, B, T, c->V, &rng);
        double loss, t0 = bench_now();
        ft_trainer_zero_grad(tr);
        if (ft_trainer_step(tr, &b, b.n_targets, &loss)) return fail("step");
        ft_clip_grad_norm(ps, np, 1.0);
        ft_adamw_step(&opt, 1e-3);
        double t1 = bench_now();
        if (s == -warmup) first_loss = loss / (double)b.n_targets;
        last_loss = loss / (double)b.n_targets;
        if (s >= 0) dt[s] = t1 - t0;
    }
    double step_s = bench_median(dt, steps);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    int64_t n_trainable;
    ft_trainer_values(tr, &n_trainable);
    printf("{\"engine\":\"ftune\",\"model\":\"%s\",\"B\":%d,\"T\":%d,\"steps\":%d,\"threads\":%d,"
           "\"n_trainable\":%lld,\"step_s\":%.4f,\"tok_s\":%.2f,\"peak_rss_mb\":%.1f,"
           "\"first_loss\":%.4f,\"last_loss\":%.4f,\"blas_core\":\"%s\"}\n",
           argv[1], B, T, steps, ft_num_threads(threads), (long long)n_trainable, step_s,
           (double)B * T / step_s, ru.ru_maxrss / 1024.0, first_loss, last_loss, blas_core());
    free(dt);
    ft_batch_free(&b);
    ft_adamw_free(&opt);
    free(ps);
    ft_trainer_free(tr);
    ftune_model_free(m);
    return 0;
}
