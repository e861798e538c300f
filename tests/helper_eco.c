/* helper_eco.c — the ftune side of the ecosystem tests (tests/cli_eco_*.sh):
 * logits of a model (+ adapter) and token ids of a corpus, written to files
 * that scripts/eco_*.py compare with transformers, PEFT and tokenizers.
 *
 *   helper_eco logits MODEL ADAPTER_DIR|- "1,2,3;1,5" OUT
 *       OUT has ref_forward.py's layout: int32 n_seqs, then per sequence
 *       int32 T, int32 V, T*V float32 (row t predicts token t+1).
 *   helper_eco greedy MODEL "1,2,3;1,5" N OUT.json
 *       the N tokens greedy decoding picks after each sequence, as `ftune
 *       generate --temp 0` does (the prompt in one batched pass, then one
 *       token at a time with the KV cache) but not stopping at an
 *       end-of-generation token: OUT is [[id, ...], ...].
 *   helper_eco chat MODEL TEMPLATE|- CONVS.json OUT.json
 *       each conversation of CONVS ([{"messages": [{"role", "content"}, ...],
 *       "add_generation_prompt": bool}, ...]) through ftune_chat_tokenize
 *       with the model's own template (-) or the named one: OUT is
 *       [[id, ...], ...].
 *   helper_eco nfc CORPUS.json OUT.json
 *       each string of CORPUS (a JSON array) in Unicode NFC by ft_nfc, as a
 *       JSON array of hex strings.
 *   helper_eco tokenize TOKENIZER CORPUS.json OUT.json
 *       TOKENIZER: a tokenizer.json, a directory holding one (or vocab.json +
 *       merges.txt), or anything ft_tokenizer_load_path takes. CORPUS is a
 *       JSON array of strings; OUT is {"ids": [[...], ...], "ids_special":
 *       [[...], ...], "decoded_hex": ["...", ...], "add_bos": 0|1, "bos": id,
 *       "n_vocab": ids}:
 *       "ids" without BOS and with special-token text left as text,
 *       "ids_special" with special-token text parsed as special tokens,
 *       "decoded_hex" the bytes "ids" decode to, in hex.
 *   helper_eco write-hf TOKENIZER DIR
 *       TOKENIZER (anything ft_tokenizer_load_path takes) written into the
 *       existing DIR as tokenizer.json + tokenizer_config.json by
 *       ft_tokenizer_to_hf, as the model writer writes it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ftune.h"
#include "tokenizer/tokenizer.h"

static int fail(const char *what, ftune_status st) {
    fprintf(stderr, "helper_eco: %s: %s: %s\n", what, ftune_status_name(st), ftune_last_error());
    return 1;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "helper_eco: %s: cannot read\n", path);
        free(buf); fclose(f); return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* Writes text to path.tmp and renames it to path. */
static int write_atomic(const char *path, const void *data, size_t n) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}

/* "1,2,3;4,5" -> sequences (each malloc'd) */
static int parse_seqs(const char *s, int32_t **seq, int *len, int max_seqs) {
    int n = 0;
    while (*s && n < max_seqs) {
        int cap = 16, k = 0;
        int32_t *v = malloc(sizeof *v * cap);
        while (*s && *s != ';') {
            char *end;
            long x = strtol(s, &end, 10);
            if (end == s) { fprintf(stderr, "helper_eco: bad token list at \"%s\"\n", s); exit(2); }
            if (k == cap) v = realloc(v, sizeof *v * (cap *= 2));
            v[k++] = (int32_t)x;
            s = end;
            if (*s == ',') s++;
        }
        if (*s == ';') s++;
        seq[n] = v;
        len[n++] = k;
    }
    return n;
}

static int cmd_logits(const char *model, const char *adapter, const char *tokens, const char *out) {
    enum { MAX_SEQS = 64 };
    int32_t *seq[MAX_SEQS];
    int len[MAX_SEQS], max_len = 0;
    int n = parse_seqs(tokens, seq, len, MAX_SEQS);
    for (int i = 0; i < n; i++) if (len[i] > max_len) max_len = len[i];
    if (n == 0 || max_len == 0) { fprintf(stderr, "helper_eco: no tokens\n"); return 2; }
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, model, NULL);
    if (st) return fail(model, st);
    if (strcmp(adapter, "-") != 0 && (st = ftune_model_load_adapter(m, adapter)))
        return fail(adapter, st);
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    ftune_session *s = NULL;
    if ((st = ftune_session_new(&s, m, max_len, 1))) return fail("session", st);
    size_t V = (size_t)info.vocab_size, total = sizeof(int32_t);
    for (int i = 0; i < n; i++) total += 2 * sizeof(int32_t) + (size_t)len[i] * V * sizeof(float);
    char *buf = malloc(total), *p = buf;
    int32_t n32 = n;
    memcpy(p, &n32, 4); p += 4;
    for (int i = 0; i < n; i++) {
        int32_t hdr[2] = { len[i], (int32_t)V };
        memcpy(p, hdr, 8); p += 8;
        ftune_session_reset(s);
        if ((st = ftune_session_forward(s, seq[i], len[i], (float *)(void *)p, 1))) return fail("forward", st);
        p += (size_t)len[i] * V * sizeof(float);
        free(seq[i]);
    }
    int rc = write_atomic(out, buf, total);
    free(buf);
    ftune_session_free(s);
    ftune_model_free(m);
    return rc;
}

static int cmd_greedy(const char *model, const char *tokens, int n_new, const char *out) {
    enum { MAX_SEQS = 64 };
    int32_t *seq[MAX_SEQS];
    int len[MAX_SEQS], max_len = 0;
    int n = parse_seqs(tokens, seq, len, MAX_SEQS);
    for (int i = 0; i < n; i++) if (len[i] > max_len) max_len = len[i];
    if (n == 0 || max_len == 0 || n_new < 1) { fprintf(stderr, "helper_eco: no tokens\n"); return 2; }
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, model, NULL);
    if (st) return fail(model, st);
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    ftune_session *s = NULL;
    if ((st = ftune_session_new(&s, m, max_len + n_new, 0))) return fail("session", st);
    ftune_sampler_params sp;
    ftune_sampler_defaults(&sp);
    sp.temperature = 0;
    ftune_sampler *smp = NULL;
    if ((st = ftune_sampler_new(&smp, &sp, info.vocab_size))) return fail("sampler", st);
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    int32_t *hist = malloc((size_t)(max_len + n_new) * sizeof *hist);
    cJSON *res = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        ftune_session_reset(s);
        memcpy(hist, seq[i], (size_t)len[i] * sizeof *hist);
        int n_hist = len[i];
        if ((st = ftune_session_forward(s, seq[i], len[i], logits, 0))) return fail("forward", st);
        cJSON *ids = cJSON_CreateArray();
        for (int k = 0; k < n_new; k++) {
            int32_t next = ftune_sampler_sample(smp, logits, hist, n_hist);
            hist[n_hist++] = next;
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(next));
            if (k + 1 < n_new && (st = ftune_session_forward(s, &next, 1, logits, 0))) return fail("forward", st);
        }
        cJSON_AddItemToArray(res, ids);
        free(seq[i]);
    }
    char *js = cJSON_PrintUnformatted(res);
    int rc = write_atomic(out, js, strlen(js));
    free(js);
    cJSON_Delete(res);
    free(hist);
    free(logits);
    ftune_sampler_free(smp);
    ftune_session_free(s);
    ftune_model_free(m);
    return rc;
}

static cJSON *ids_json(const int32_t *ids, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* The bytes ids decode to (ftune_token_to_piece of each, the first one
 * after BOS, as generation sees them), as a hex string: they need not be
 * valid UTF-8 on their own. */
static cJSON *decode_hex(const ftune_tokenizer *t, const int32_t *ids, size_t n) {
    int cap = ft_tokenizer_max_piece(t) + 1;
    char *piece = malloc((size_t)cap), *hex = malloc(1), *p;
    size_t len = 0;
    hex[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int k = ftune_token_to_piece(t, i ? ids[i - 1] : ftune_tokenizer_bos(t), ids[i], piece, cap);
        if (k < 0) { fprintf(stderr, "helper_eco: token_to_piece failed on %d\n", ids[i]); exit(1); }
        hex = realloc(hex, len + 2 * (size_t)k + 1);
        p = hex + len;
        for (int j = 0; j < k; j++) p += sprintf(p, "%02x", (unsigned char)piece[j]);
        len += 2 * (size_t)k;
    }
    cJSON *s = cJSON_CreateString(hex);
    free(piece);
    free(hex);
    return s;
}

static int cmd_chat(const char *model, const char *tmpl, const char *convs, const char *out) {
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, model, NULL);
    if (st) return fail(model, st);
    size_t len;
    char *text = read_file(convs, &len);
    if (!text) return 1;
    cJSON *in = cJSON_Parse(text), *res = cJSON_CreateArray();
    if (!cJSON_IsArray(in)) { fprintf(stderr, "helper_eco: %s: not a JSON array\n", convs); return 1; }
    int k = 0;
    for (cJSON *c = in->child; c; c = c->next, k++) {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "messages");
        int n = cJSON_GetArraySize(ms), i = 0;
        ftune_chat_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
        for (const cJSON *e = ms ? ms->child : NULL; e; e = e->next, i++) {
            const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "role"));
            msgs[i].role = !role ? -1 : !strcmp(role, "system") ? FTUNE_ROLE_SYSTEM
                         : !strcmp(role, "user") ? FTUNE_ROLE_USER : !strcmp(role, "assistant") ? FTUNE_ROLE_ASSISTANT : -1;
            msgs[i].content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "content"));
        }
        int gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if ((st = ftune_chat_tokenize(m, strcmp(tmpl, "-") ? tmpl : NULL, msgs, n, gen, &ids, &n_ids))) {
            char what[64];
            snprintf(what, sizeof what, "%s conversation %d", convs, k);
            return fail(what, st);
        }
        cJSON_AddItemToArray(res, ids_json(ids, n_ids));
        free(ids);
        free(msgs);
    }
    char *js = cJSON_PrintUnformatted(res);
    int rc = write_atomic(out, js, strlen(js));
    free(js);
    cJSON_Delete(res);
    cJSON_Delete(in);
    free(text);
    ftune_model_free(m);
    return rc;
}

static int cmd_nfc(const char *corpus, const char *out) {
    size_t len;
    char *text = read_file(corpus, &len);
    if (!text) return 1;
    cJSON *docs = cJSON_Parse(text), *res = cJSON_CreateArray();
    if (!cJSON_IsArray(docs)) { fprintf(stderr, "helper_eco: %s: not a JSON array\n", corpus); return 1; }
    for (cJSON *d = docs->child; d; d = d->next) {
        const char *s = cJSON_GetStringValue(d);
        if (!s) { fprintf(stderr, "helper_eco: %s: not a string\n", corpus); return 1; }
        char *o = NULL;
        size_t on = 0;
        ftune_status st = ft_nfc(s, strlen(s), &o, &on);
        if (st) return fail("nfc", st);
        const char *r = o ? o : s;
        size_t rn = o ? on : strlen(s);
        char *hex = malloc(2 * rn + 1);
        for (size_t i = 0; i < rn; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)r[i]);
        hex[2 * rn] = 0;
        cJSON_AddItemToArray(res, cJSON_CreateString(hex));
        free(hex);
        free(o);
    }
    char *js = cJSON_PrintUnformatted(res);
    int rc = write_atomic(out, js, strlen(js));
    free(js);
    cJSON_Delete(res);
    cJSON_Delete(docs);
    free(text);
    return rc;
}

static int cmd_tokenize(const char *tokpath, const char *corpus, const char *out) {
    ftune_tokenizer *t = NULL;
    ftune_status st = ft_tokenizer_load_path(&t, tokpath);
    if (st) return fail(tokpath, st);
    size_t len;
    char *text = read_file(corpus, &len);
    if (!text) return 1;
    cJSON *docs = cJSON_Parse(text);
    if (!cJSON_IsArray(docs)) { fprintf(stderr, "helper_eco: %s: not a JSON array\n", corpus); return 1; }
    cJSON *res = cJSON_CreateObject(), *plain = cJSON_CreateArray(), *special = cJSON_CreateArray();
    cJSON *decoded = cJSON_CreateArray();
    int k = 0;
    for (cJSON *d = docs->child; d; d = d->next, k++) {
        if (!cJSON_IsString(d)) { fprintf(stderr, "helper_eco: %s: item %d is not a string\n", corpus, k); return 1; }
        const char *s = d->valuestring;
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if ((st = ftune_tokenize(t, s, strlen(s), 0, sp, &ids, &n))) {
                char what[64];
                snprintf(what, sizeof what, "%s item %d", corpus, k);
                return fail(what, st);
            }
            cJSON_AddItemToArray(sp ? special : plain, ids_json(ids, n));
            if (!sp) cJSON_AddItemToArray(decoded, decode_hex(t, ids, n));
            free(ids);
        }
    }
    cJSON_AddItemToObject(res, "ids", plain);
    cJSON_AddItemToObject(res, "ids_special", special);
    cJSON_AddItemToObject(res, "decoded_hex", decoded);
    cJSON_AddNumberToObject(res, "add_bos", ftune_tokenizer_add_bos(t));
    cJSON_AddNumberToObject(res, "bos", ftune_tokenizer_bos(t));
    cJSON_AddNumberToObject(res, "n_vocab", ftune_tokenizer_n_vocab(t));
    char *js = cJSON_PrintUnformatted(res);
    int rc = write_atomic(out, js, strlen(js));
    free(js);
    cJSON_Delete(res);
    cJSON_Delete(docs);
    free(text);
    ft_tokenizer_free(t);
    return rc;
}

static int cmd_write_hf(const char *path, const char *dir) {
    ftune_tokenizer *t = NULL;
    ftune_status st = ft_tokenizer_load_path(&t, path);
    if (st) return fail(path, st);
    st = ft_tokenizer_to_hf(t, dir, 0);
    ft_tokenizer_free(t);
    return st ? fail(dir, st) : 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "logits")) return cmd_logits(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 6 && !strcmp(argv[1], "greedy")) return cmd_greedy(argv[2], argv[3], atoi(argv[4]), argv[5]);
    if (argc == 6 && !strcmp(argv[1], "chat")) return cmd_chat(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 4 && !strcmp(argv[1], "nfc")) return cmd_nfc(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "tokenize")) return cmd_tokenize(argv[2], argv[3], argv[4]);
    if (argc == 4 && !strcmp(argv[1], "write-hf")) return cmd_write_hf(argv[2], argv[3]);
    fprintf(stderr, "usage: helper_eco logits MODEL ADAPTER_DIR|- \"1,2,3;4,5\" OUT\n"
                    "       helper_eco greedy MODEL \"1,2,3;4,5\" N OUT.json\n"
                    "       helper_eco chat MODEL TEMPLATE|- CONVS.json OUT.json\n"
                    "       helper_eco nfc CORPUS.json OUT.json\n"
                    "       helper_eco write-hf TOKENIZER DIR\n"
                    "       helper_eco tokenize TOKENIZER CORPUS.json OUT.json\n");
    return 2;
}
