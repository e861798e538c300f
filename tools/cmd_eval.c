/* cmd_eval.c — `ftune eval`: mean next-token cross-entropy and perplexity of
 * a model on a text file (one document) or a JSONL file (one document per
 * line, from its "text" field), BOS prepended to each document where the
 * model's tokenizer adds one. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (n + 1 == cap) {
            char *b2 = realloc(buf, cap *= 2);
            if (!b2) free(buf);
            buf = b2;
        }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* Evaluates one document in windows of W tokens, one ftune_eval_tokens
 * call per window: the same windows (w0 advancing by W-1, each starting
 * fresh) and the same order of additions as one call over the whole
 * document, so the result is identical, and progress can be shown between
 * windows. The progress is the bytes before this document plus this
 * document's bytes in proportion to its windows done. */
static int eval_doc(ftune_session *s, const ftune_tokenizer *tok, const char *text, size_t len, bool add_bos, int W,
                    ftune_eval_result *acc, const char *where, cli_progress *pr, double done_bytes, double total_bytes) {
    int32_t *ids = NULL;
    size_t n = 0;
    ftune_status st = ftune_tokenize(tok, text, len, add_bos, 0, &ids, &n);
    if (st) {
        cli_progress_end(pr);
        fprintf(stderr, "ftune eval: error: %s: %s\n", where, ftune_last_error());
        return 1;
    }
    size_t step = W > 1 ? (size_t)W - 1 : 1;
    for (size_t w0 = 0; w0 + 1 < n && !st; w0 += step) {
        size_t wn = n - w0 < (size_t)W ? n - w0 : (size_t)W;
        st = ftune_eval_tokens(s, ids + w0, wn, acc);
        cli_progress_update(pr, done_bytes + (double)len * (double)(w0 + wn) / (double)n, total_bytes);
    }
    free(ids);
    if (st) {
        cli_progress_end(pr);
        fprintf(stderr, "ftune eval: error: %s: %s\n", where, ftune_last_error());
        return 1;
    }
    return 0;
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *dtype = NULL, *quant = NULL, *text_path = NULL, *jsonl_path = NULL, *tokenizer = NULL, *field = "text";
    const char *adapter = NULL;
    int threads = 0, ctx = 0;
    bool json = false, no_bos = false, progress = false;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--adapter", OPT_STR, &adapter, "DIR", "apply a LoRA adapter: PEFT directory or llama.cpp .gguf" },
        { NULL, "--text", OPT_STR, &text_path, "FILE", "evaluate a plain text file as one document" },
        { NULL, "--jsonl", OPT_STR, &jsonl_path, "FILE", "evaluate each line's text field as a document" },
        { NULL, "--field", OPT_STR, &field, "NAME", "the JSONL field holding the text" },
        { NULL, "--json", OPT_FLAG, &json, "", "print {\"loss\":...,\"ppl\":...,\"tokens\":...} on stdout" },
        { "-c", "--ctx-size", OPT_INT, &ctx, "N", "window length, at most the model's context length; 0 = that length" },
        { NULL, "--ctx", OPT_INT, &ctx, "N", "the same as --ctx-size" },
        { NULL, "--progress", OPT_FLAG, &progress, "",
          "show progress and ETA on stderr even when it is not a terminal" },
        { "-t", "--threads", OPT_INT, &threads, "N", "threads; 0 = all cores" },
        { NULL, "--dtype", OPT_STR, &dtype, "T", "compute dtype of the matrix products: f32 (reference), bf16 or f16 (bf16/f16 inputs, f32 sums)" },
        { NULL, "--quant", OPT_STR, &quant, "TYPE", "quantize the layers' Linear weights on load: nf4 (bitsandbytes NF4 + double quantization) or int8 (row-wise)" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { NULL, "--no-bos", OPT_FLAG, &no_bos, "", "do not prepend BOS to each document (prepended only where the "
          "model's tokenizer adds one)" },
        { 0 },
    };
    cli_cmd cmd = { "eval", "-m MODEL (--text FILE | --jsonl FILE) [--json]",
                    "Mean next-token cross-entropy (nats) over every predicted position, and perplexity.\n"
                    "Documents longer than the context are evaluated in windows of the context length; each\n"
                    "window starts with the previous window's last token, so every token is predicted once.",
                    opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (!text_path == !jsonl_path) {
        fprintf(stderr, "ftune eval: give exactly one of --text FILE or --jsonl FILE\n");
        return 2;
    }
    if (ctx < 0 || ctx == 1) {
        fprintf(stderr, "ftune eval: -c must be 0 (the model's context length) or at least 2\n");
        return 2;
    }
    if (threads < 0) {
        fprintf(stderr, "ftune eval: -t must be at least 0 (0 = all cores)\n");
        return 2;
    }
    if (cli_seen(&cmd, "--ctx") && cli_seen(&cmd, "--ctx-size")) {
        fprintf(stderr, "ftune eval: give --ctx-size (-c) or --ctx, not both\n");
        return 2;
    }
    const char *path = text_path ? text_path : jsonl_path;
    size_t len;
    char *data = slurp(path, &len);
    if (!data) { fprintf(stderr, "ftune eval: error: %s: cannot read\n", path); return 1; }
    ftune_model *m = cli_load_model_with("eval", model, tokenizer, 0, true, dtype, quant);
    if (!m) { free(data); return 1; }
    if (cli_check_ctx("eval", m, ctx)) { ftune_model_free(m); free(data); return 1; }
    if (adapter) {
        ftune_status sa = ftune_model_load_adapter(m, adapter);
        if (sa) { cli_fail("eval", sa); ftune_model_free(m); free(data); return 1; }
    }
    const ftune_tokenizer *tok = ftune_model_tokenizer(m);
    ftune_session *s = NULL;
    ftune_eval_result acc = { 0, 0 };
    cli_progress pr = { 0 };
    int rc = 1;
    ftune_status st = ftune_session_new(&s, m, ctx, threads);
    if (st) { cli_fail("eval", st); goto out; }
    bool bos = !no_bos && ftune_tokenizer_add_bos(tok);
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    int W = ctx > 0 ? ctx : info.context_length;
    char label[4200];
    snprintf(label, sizeof label, "eval %s", path);
    cli_progress_begin(&pr, label, progress);
    double t0 = ft_cli_time();
    if (text_path) {
        if (eval_doc(s, tok, data, len, bos, W, &acc, path, &pr, 0, (double)len)) goto out;
    } else {
        char *line = data, where[4200];
        for (long ln = 1; line < data + len; ln++) {
            char *nl = memchr(line, '\n', (size_t)(data + len - line));
            if (nl) *nl = 0;
            snprintf(where, sizeof where, "%s:%ld", path, ln);
            char *p = line;
            while (*p == ' ' || *p == '\t' || *p == '\r') p++;
            if (*p) {
                /* the line is NUL-terminated at its end; a NUL before that (raw or \u0000) would cut the text */
                size_t ll = (size_t)((nl ? nl : data + len) - line);
                int64_t nul = ftune_json_nul_at(line, ll);
                if (nul >= 0) {
                    cli_progress_end(&pr);
                    fprintf(stderr, "ftune eval: error: %s: a NUL character in the record (column %lld); text may not "
                            "contain NUL\n", where, (long long)nul + 1);
                    goto out;
                }
                cJSON *j = cJSON_Parse(line);
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, field);
                if (!j) {
                    cli_progress_end(&pr);
                    fprintf(stderr, "ftune eval: error: %s: not valid JSON\n", where);
                    goto out;
                }
                if (!cJSON_IsString(t)) {
                    cli_progress_end(&pr);
                    fprintf(stderr, "ftune eval: error: %s: no string field \"%s\"\n", where, field);
                    cJSON_Delete(j);
                    goto out;
                }
                int e = eval_doc(s, tok, t->valuestring, strlen(t->valuestring), bos, W, &acc, where, &pr,
                                 (double)(line - data), (double)len);
                cJSON_Delete(j);
                if (e) goto out;
            }
            if (!nl) break;
            line = nl + 1;
        }
    }
    cli_progress_update(&pr, (double)len, (double)len);
    cli_progress_end(&pr);
    double t1 = ft_cli_time();
    if (acc.n_predicted == 0) {
        fprintf(stderr, "ftune eval: error: %s: no tokens to predict\n", path);
        goto out;
    }
    double loss = acc.loss_sum / (double)acc.n_predicted;
    if (json) { /* JSON has no inf or NaN: null (a NaN loss, or a perplexity beyond a double) */
        char l[32] = "null", p[32] = "null";
        if (isfinite(loss)) snprintf(l, sizeof l, "%.6f", loss);
        if (isfinite(exp(loss))) snprintf(p, sizeof p, "%.6f", exp(loss));
        printf("{\"loss\":%s,\"ppl\":%s,\"tokens\":%lld}\n", l, p, (long long)acc.n_predicted);
    }
    else printf("loss %.6f  ppl %.4f  tokens %lld\n", loss, exp(loss), (long long)acc.n_predicted);
    fprintf(stderr, "%.1f tokens/s\n", (double)acc.n_predicted / (t1 - t0));
    rc = 0;
out:
    cli_progress_end(&pr);
    ftune_session_free(s);
    ftune_model_free(m);
    free(data);
    return rc;
}
