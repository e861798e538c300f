/* helper_decode_ppl.c — perplexity of a text through the decode path: the
 * model reads the text one token at a time, as generation does, and every
 * next-token log-probability is taken from those one-token forwards (in
 * double). Run twice, with decode's integer products on and off
 * (ftune_session_set_int_products), for tests/cli_int_dot.sh.
 *   helper_decode_ppl MODEL TEXT_FILE N_TOKENS THREADS
 * prints "tokens N ppl_int P ppl_f32 P rel D". */
#include "ftune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ppl(ftune_model *m, const int32_t *ids, int n, int threads, int int_dot, double *out) {
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    ftune_session *s;
    if (ftune_session_new(&s, m, n + 1, threads)) return 1;
    ftune_session_set_int_products(s, int_dot);
    float *logits = malloc((size_t)info.vocab_size * sizeof(float));
    double nll = 0;
    for (int i = 0; i + 1 < n; i++) {
        if (ftune_session_forward(s, ids + i, 1, logits, 0)) { free(logits); ftune_session_free(s); return 1; }
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < info.vocab_size; v++) mx = fmax(mx, logits[v]);
        for (int v = 0; v < info.vocab_size; v++) z += exp((double)logits[v] - mx);
        nll += mx + log(z) - logits[ids[i + 1]];
    }
    *out = exp(nll / (n - 1));
    free(logits);
    ftune_session_free(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: helper_decode_ppl MODEL TEXT N THREADS\n"); return 2; }
    ftune_model *m;
    ftune_load_opts lo = { 0 };
    if (ftune_model_load(&m, argv[1], &lo)) { fprintf(stderr, "%s\n", ftune_last_error()); return 1; }
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    int32_t *ids;
    size_t n;
    const ftune_tokenizer *tok = ftune_model_tokenizer(m);
    if (ftune_tokenize(tok, text, len, ftune_tokenizer_add_bos(tok), 0, &ids, &n)) { fprintf(stderr, "%s\n", ftune_last_error()); return 1; }
    int N = atoi(argv[3]), threads = atoi(argv[4]);
    if ((int)n < N) N = (int)n;
    double pi, pf;
    if (ppl(m, ids, N, threads, 1, &pi) || ppl(m, ids, N, threads, 0, &pf)) { fprintf(stderr, "%s\n", ftune_last_error()); return 1; }
    printf("tokens %d ppl_int %.6f ppl_f32 %.6f rel %.3e\n", N, pi, pf, fabs(pi - pf) / pf);
    free(ids);
    ftune_model_free(m);
    return 0;
}
