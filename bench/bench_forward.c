/* bench_forward.c — ftune's side of the inference benchmark: prefill (one
 * batched forward of N tokens, last-position logits) and decode (one token
 * at a time with the KV cache) tokens/s for a model, plus the machine's
 * memory read bandwidth, so decode can be reported as bytes of weights
 * streamed per second against it. Prints one JSON line. */
#include "ftune.h"
#include "bench_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Read bandwidth: sum a 1 GiB buffer as 64-bit integers (integer adds may
 * be reordered, so the loop vectorises and is limited by memory, not by a
 * chain of dependent float adds), best of 3 passes, on n threads. */
static double read_bandwidth(int threads) {
    size_t n = (size_t)1 << 27; /* 1 GiB of uint64 */
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf) return 0;
#pragma omp parallel for num_threads(threads)
    for (size_t i = 0; i < n; i++) buf[i] = i & 255;
    double best = 0;
    uint64_t sink = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = bench_now();
        uint64_t s = 0;
        /* four streams per thread, as a GEMV reads several weight rows at
         * once: one stream alone does not reach a core's bandwidth */
        size_t q = n / 4;
#pragma omp parallel for num_threads(threads) reduction(+ : s)
        for (size_t i = 0; i < q; i++) s += buf[i] + buf[q + i] + buf[2 * q + i] + buf[3 * q + i];
        double gbs = n * sizeof *buf / (bench_now() - t0) / 1e9;
        sink += s;
        if (gbs > best) best = gbs;
    }
    free(buf);
    return sink == 1 ? 0 : best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_forward MODEL [prefill=128] [decode=64] [threads=0] [runs=5] "
                        "[quant: nf4|int8|none] [dtype: f32|bf16|f16]\n");
        return 2;
    }
    int n_prefill = argc > 2 ? atoi(argv[2]) : 128, n_decode = argc > 3 ? atoi(argv[3]) : 64;
    int threads = argc > 4 ? atoi(argv[4]) : 0, runs = argc > 5 ? atoi(argv[5]) : 5;
    ftune_model *m = NULL;
    ftune_load_opts lo = { .quant = argc > 6 && strcmp(argv[6], "none") ? argv[6] : NULL,
                           .dtype = argc > 7 ? argv[7] : NULL }; /* the compute dtype; NULL: f32 */
    if (ftune_model_load(&m, argv[1], &lo)) {
        fprintf(stderr, "bench_forward: %s\n", ftune_last_error());
        return 1;
    }
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    ftune_session *s = NULL;
    if (ftune_session_new(&s, m, n_prefill + n_decode + 1, threads)) {
        fprintf(stderr, "bench_forward: %s\n", ftune_last_error());
        return 1;
    }
    int32_t *ids = malloc((size_t)(n_prefill + n_decode) * sizeof *ids);
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    for (int i = 0; i < n_prefill + n_decode; i++) ids[i] = (int32_t)((i * 7919 + 13) % info.vocab_size);
    double *pre = malloc((size_t)runs * sizeof *pre), *dec = malloc((size_t)runs * sizeof *dec);
    /* one warm-up run, then the timed ones */
    for (int r = -1; r < runs; r++) {
        ftune_session_reset(s);
        double t0 = bench_now();
        ftune_status st = ftune_session_forward(s, ids, n_prefill, logits, 0);
        double t1 = bench_now();
        for (int i = 0; i < n_decode && !st; i++) st = ftune_session_forward(s, ids + n_prefill + i, 1, logits, 0);
        double t2 = bench_now();
        if (st) { /* a failed pass would time nothing */
            fprintf(stderr, "bench_forward: %s\n", ftune_last_error());
            return 1;
        }
        if (r >= 0) { pre[r] = n_prefill / (t1 - t0); dec[r] = n_decode / (t2 - t1); }
    }
    double p = bench_median(pre, runs), d = bench_median(dec, runs);
    double bw = read_bandwidth(threads > 0 ? threads : 2);
    printf("{\"engine\":\"ftune\",\"model\":\"%s\",\"compute\":\"%s\",\"dtypes\":\"%s\",\"prefill\":%d,"
           "\"decode\":%d,\"params\":%lld,\"weight_bytes\":%lld,"
           "\"prefill_tok_s\":%.2f,\"decode_tok_s\":%.2f,\"decode_weight_gb_s\":%.2f,\"read_bw_gb_s\":%.2f}\n",
           argv[1], ftune_model_dtype(m), info.dtypes, n_prefill, n_decode, (long long)info.n_params,
           (long long)info.weight_bytes, p, d,
           d * (double)info.weight_bytes / 1e9, bw);
    free(ids); free(logits); free(pre); free(dec);
    ftune_session_free(s);
    ftune_model_free(m);
    return 0;
}
