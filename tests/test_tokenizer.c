/* test_tokenizer.c — tokenizers against reference ids: llama.cpp's vocab
 * test vectors (llama-spm, phi-3, gpt-2, falcon), Meta's Llama 3 vectors,
 * llama2.c's tokenizer.bin against the same Llama 2 vocabulary in GGUF, the
 * three stories260K tokenizer files against each other, decode round trips,
 * and bad input. Token ids are exact, so no tolerance appears here. */
#include "check.h"
#include "core/core.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <unistd.h>

static char *data_file(const char *rel, size_t *len) {
    char path[1024];
    char *text = NULL;
    size_t n = 0;
    check_data_path(path, sizeof path, rel);
    if (ft_read_file(path, &text, &n) != FTUNE_OK) {
        fprintf(stderr, "  cannot read %s: %s\n", path, ftune_last_error());
        return NULL;
    }
    if (len) *len = n;
    return text;
}

static ftune_tokenizer *load_tok(const char *rel) {
    char path[1024];
    ftune_tokenizer *t = NULL;
    check_data_path(path, sizeof path, rel);
    ftune_status st = ft_tokenizer_load_path(&t, path);
    CHECKF(st == FTUNE_OK, "%s: %s", rel, ftune_last_error());
    return t;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *label, const int32_t *v, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Decodes ids[from..n) with each token's predecessor; returns a malloc'd string. */
static char *decode(const ftune_tokenizer *t, const int32_t *ids, size_t n, size_t from, size_t *len) {
    int cap = ft_tokenizer_max_piece(t);
    char *out = malloc(n * (size_t)cap + 1), *p = out;
    for (size_t i = from; i < n; i++) {
        int k = ftune_token_to_piece(t, i > 0 ? ids[i - 1] : -1, ids[i], p, cap);
        if (k < 0) { free(out); return NULL; }
        p += k;
    }
    *p = 0;
    *len = (size_t)(p - out);
    return out;
}

/* ------------------------------------------------------------- llama.cpp vocab tests */

typedef struct {
    int n;
    char *inp, *out;       /* file contents, cut in place */
    char *text[64];
    size_t text_len[64];
    int32_t ids[64][256];
    size_t n_ids[64];
} vocab_cases;

/* .inp: cases each followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per case. */
static int read_cases(const char *name, vocab_cases *vc) {
    char rel[256];
    size_t li, lo;
    memset(vc, 0, sizeof *vc);
    snprintf(rel, sizeof rel, "vocab-tests/%s.gguf.inp", name);
    vc->inp = data_file(rel, &li);
    snprintf(rel, sizeof rel, "vocab-tests/%s.gguf.out", name);
    vc->out = data_file(rel, &lo);
    if (!vc->inp || !vc->out) return 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = vc->inp, *q = vc->out;
    for (char *hit; (hit = strstr(p, sep)) != NULL && vc->n < 64; p = hit + strlen(sep)) {
        char *nl = strchr(q, '\n');
        if (!nl) return 0;
        *nl = 0;
        vc->text[vc->n] = p;
        vc->text_len[vc->n] = (size_t)(hit - p);
        for (char *s = q, *end; ; s = end) {
            long v = strtol(s, &end, 10);
            if (end == s) break;
            if (vc->n_ids[vc->n] < 256) vc->ids[vc->n][vc->n_ids[vc->n]++] = (int32_t)v;
        }
        q = nl + 1;
        vc->n++;
    }
    return vc->n;
}

static void free_cases(vocab_cases *vc) { free(vc->inp); free(vc->out); }

/* Tokenizes every case with (add_bos, no special parsing) and compares with
 * the expected ids, BOS prepended when add_bos. */
static int run_cases(const ftune_tokenizer *t, const vocab_cases *vc, int add_bos, const char *label) {
    int pass = 0;
    for (int c = 0; c < vc->n; c++) {
        int32_t *ids = NULL, want[257];
        size_t n = 0, nw = 0;
        if (add_bos) want[nw++] = ftune_tokenizer_bos(t);
        memcpy(want + nw, vc->ids[c], vc->n_ids[c] * sizeof *want);
        nw += vc->n_ids[c];
        ftune_status st = ftune_tokenize(t, vc->text[c], vc->text_len[c], add_bos, 0, &ids, &n);
        if (st == FTUNE_OK && same_ids(ids, n, want, nw)) pass++;
        else {
            fprintf(stderr, "  %s case %d (%.30s...): %s\n", label, c, vc->text[c], st ? ftune_last_error() : "ids differ");
            print_ids("want", want, nw);
            print_ids("got ", ids, n);
        }
        free(ids);
    }
    return pass;
}

/* decode(encode(x)) == x, with BOS for SentencePiece (whose decoder drops the
 * space the encoder added, after BOS). */
static int run_round_trips(const ftune_tokenizer *t, const vocab_cases *vc, const char *label) {
    int pass = 0, bos = ft_tokenizer_kind(t) == FT_TOK_SPM;
    for (int c = 0; c < vc->n; c++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        CHECK_OK(ftune_tokenize(t, vc->text[c], vc->text_len[c], bos, 0, &ids, &n));
        char *back = decode(t, ids, n, (size_t)bos, &len);
        if (back && len == vc->text_len[c] && memcmp(back, vc->text[c], len) == 0) pass++;
        else fprintf(stderr, "  %s round trip case %d: got \"%s\"\n", label, c, back ? back : "(bad id)");
        free(back);
        free(ids);
    }
    return pass;
}

static void test_vocab(const char *name) {
    vocab_cases *vc = malloc(sizeof *vc);
    char rel[256];
    CHECKF(read_cases(name, vc) >= 40, "%s: expected at least 40 cases", name);
    snprintf(rel, sizeof rel, "vocab-tests/%s.gguf", name);
    ftune_tokenizer *t = load_tok(rel);
    if (t && vc->n > 0) {
        int pass = run_cases(t, vc, 0, name);
        int rt = run_round_trips(t, vc, name);
        printf("  vocab %-10s %d/%d cases match llama.cpp, %d/%d round trips\n", name + strlen("ggml-vocab-"), pass, vc->n, rt, vc->n);
        CHECK(pass == vc->n);
        CHECK(rt == vc->n);
    }
    ft_tokenizer_free(t);
    free_cases(vc);
    free(vc);
}

static void test_vocab_llama_spm(void) { test_vocab("ggml-vocab-llama-spm"); }
static void test_vocab_phi3(void) { test_vocab("ggml-vocab-phi-3"); }
static void test_vocab_gpt2(void) { test_vocab("ggml-vocab-gpt-2"); }
static void test_vocab_falcon(void) { test_vocab("ggml-vocab-falcon"); }

/* ------------------------------------------------------------- llama2.c's encode(), restated */

/* An independent, deliberately naive restatement of llama2.c's encode() on
 * its own .bin vocabulary (spaces, not "▁"): a " " prefix token, each UTF-8
 * character looked up or spilled into byte tokens (id = byte + 3), then the
 * pair whose concatenation is the best-scoring token merged, leftmost first,
 * until no pair is a token. */
typedef struct { char **str; float *score; int n; int *sorted; } naive_vocab;

static naive_vocab *g_nv;
static int cmp_sorted(const void *a, const void *b) {
    return strcmp(g_nv->str[*(const int *)a], g_nv->str[*(const int *)b]);
}

static int naive_load(naive_vocab *v, const char *rel) {
    size_t size;
    char *d = data_file(rel, &size);
    if (!d) return 0;
    size_t pos = 4, cap = 64;
    v->n = 0;
    v->str = malloc(cap * sizeof *v->str);
    v->score = malloc(cap * sizeof *v->score);
    while (pos + 8 <= size) {
        int32_t len;
        if (v->n == (int)cap) {
            cap *= 2;
            v->str = realloc(v->str, cap * sizeof *v->str);
            v->score = realloc(v->score, cap * sizeof *v->score);
        }
        memcpy(&v->score[v->n], d + pos, 4);
        memcpy(&len, d + pos + 4, 4);
        if (len < 0 || pos + 8 + (size_t)len > size) break;
        v->str[v->n] = malloc((size_t)len + 1);
        memcpy(v->str[v->n], d + pos + 8, (size_t)len);
        v->str[v->n][len] = 0;
        pos += 8 + (size_t)len;
        v->n++;
    }
    free(d);
    v->sorted = malloc((size_t)v->n * sizeof *v->sorted);
    for (int i = 0; i < v->n; i++) v->sorted[i] = i;
    g_nv = v;
    qsort(v->sorted, (size_t)v->n, sizeof *v->sorted, cmp_sorted);
    return v->n;
}

static void naive_free(naive_vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->str[i]);
    free(v->str); free(v->score); free(v->sorted);
}

static int naive_find(const naive_vocab *v, const char *s) {
    int lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s, v->str[v->sorted[mid]]);
        if (c == 0) return v->sorted[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return -1;
}

static size_t naive_encode(const naive_vocab *v, const char *text, size_t len, int32_t *out) {
    size_t n = 0;
    char buf[1024];
    out[n++] = 1; /* BOS */
    if (len > 0) out[n++] = naive_find(v, " ");
    for (size_t i = 0; i < len;) {
        size_t cl = 1;
        while (i + cl < len && ((unsigned char)text[i + cl] & 0xC0) == 0x80 && cl < 4) cl++;
        memcpy(buf, text + i, cl);
        buf[cl] = 0;
        int id = naive_find(v, buf);
        if (id >= 0) out[n++] = id;
        else for (size_t k = 0; k < cl; k++) out[n++] = (unsigned char)text[i + k] + 3;
        i += cl;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            snprintf(buf, sizeof buf, "%s%s", v->str[out[i]], v->str[out[i + 1]]);
            int id = naive_find(v, buf);
            if (id >= 0 && v->score[id] > best) { best = v->score[id]; best_id = id; at = i; }
        }
        if (best_id < 0) break;
        out[at] = best_id;
        memmove(out + at + 1, out + at + 2, (n - at - 2) * sizeof *out);
        n--;
    }
    return n;
}

/* llama2.c's tokenizer.bin: the same ids as llama.cpp on the Llama 2 vocab
 * (with BOS), and the same as the restated llama2.c encode(). Also Meta's
 * SentencePiece tokenizer.model. */
static void test_llama2_bin_and_model(void) {
    vocab_cases *vc = malloc(sizeof *vc);
    CHECK(read_cases("ggml-vocab-llama-spm", vc) >= 40);
    ftune_tokenizer *bin = load_tok("tokenizers/llama2/tokenizer.bin");
    ftune_tokenizer *model = load_tok("tokenizers/llama2/tokenizer.model");
    naive_vocab nv;
    CHECK(naive_load(&nv, "tokenizers/llama2/tokenizer.bin") == 32000);
    if (bin && model && vc->n > 0) {
        CHECK(ftune_tokenizer_n_vocab(bin) == 32000 && ftune_tokenizer_bos(bin) == 1 && ftune_tokenizer_eos(bin) == 2);
        CHECK(ftune_tokenizer_add_bos(bin) && ftune_tokenizer_add_bos(model));
        int pb = run_cases(bin, vc, 1, "tokenizer.bin");
        int pm = run_cases(model, vc, 1, "tokenizer.model");
        int pn = 0;
        for (int c = 0; c < vc->n; c++) {
            int32_t *ids = NULL, ref[1024];
            size_t n = 0;
            size_t nr = naive_encode(&nv, vc->text[c], vc->text_len[c], ref);
            CHECK_OK(ftune_tokenize(bin, vc->text[c], vc->text_len[c], 1, 0, &ids, &n));
            if (same_ids(ids, n, ref, nr)) pn++;
            else { fprintf(stderr, "  llama2.c encode() differs on case %d\n", c); print_ids("llama2.c", ref, nr); print_ids("ftune", ids, n); }
            free(ids);
        }
        printf("  llama2 tokenizer.bin: %d/%d match llama.cpp, %d/%d match llama2.c's encode(); tokenizer.model: %d/%d\n",
               pb, vc->n, pn, vc->n, pm, vc->n);
        CHECK(pb == vc->n && pn == vc->n && pm == vc->n);
    }
    naive_free(&nv);
    ft_tokenizer_free(bin);
    ft_tokenizer_free(model);
    free_cases(vc);
    free(vc);
}

/* ------------------------------------------------------------- Llama 3 */

static int json_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) if (n < cap) out[n++] = (int32_t)it->valuedouble;
    return n;
}

/* Renders one message the way Llama 3's chat format does. */
static void render_message(char *buf, size_t cap, const cJSON *msg) {
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>",
             cJSON_GetObjectItem(msg, "role")->valuestring, cJSON_GetObjectItem(msg, "content")->valuestring);
}

static void test_llama3(void) {
    char *js = data_file("tokenizers/llama3/test_vectors.json", NULL);
    cJSON *j = js ? cJSON_Parse(js) : NULL;
    ftune_tokenizer *t = load_tok("tokenizers/llama3/tokenizer.model");
    CHECK(j != NULL);
    if (!j || !t) goto out;
    CHECK(ftune_tokenizer_n_vocab(t) == 128256);
    /* the special tokens where the vectors say they are */
    const cJSON *sp = cJSON_GetObjectItem(j, "special_tokens"), *it;
    int n_sp = 0;
    cJSON_ArrayForEach(it, sp) {
        if (!cJSON_IsNumber(it)) continue;
        CHECKF(ft_tokenizer_find(t, it->string, strlen(it->string)) == (int32_t)it->valuedouble, "%s", it->string);
        n_sp++;
    }
    for (int i = 0; i < 244; i++) {
        char name[64];
        snprintf(name, sizeof name, "<|reserved_special_token_%d|>", 2 + i);
        CHECKF(ft_tokenizer_find(t, name, strlen(name)) == 128012 + i, "%s", name);
    }
    CHECK(n_sp == 12);
    int32_t bos = ft_tokenizer_find(t, "<|begin_of_text|>", 17), eot = ft_tokenizer_find(t, "<|eot_id|>", 10);
    CHECK(ftune_tokenizer_bos(t) == bos && ftune_tokenizer_add_bos(t));
    CHECK(ftune_tokenizer_is_eog(t, ftune_tokenizer_eos(t)) && ftune_tokenizer_is_eog(t, eot));
    CHECK(!ftune_tokenizer_is_eog(t, bos));

    int n_cases = 0, pass = 0;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "cases")) {
        int32_t want[256], *ids = NULL;
        int nw = 0;
        size_t n = 0;
        const cJSON *text = cJSON_GetObjectItem(it, "text"), *dec = cJSON_GetObjectItem(it, "decode_ids");
        const cJSON *msg = cJSON_GetObjectItem(it, "chat_message"), *dialog = cJSON_GetObjectItem(it, "chat_dialog");
        int ok = 0;
        n_cases++;
        if (dec) { /* decode */
            nw = json_ids(dec, want, 256);
            size_t len;
            char *s = decode(t, want, (size_t)nw, 0, &len);
            ok = s && strcmp(s, text->valuestring) == 0;
            if (!ok) fprintf(stderr, "  llama3 decode: got \"%s\"\n", s ? s : "(bad id)");
            free(s);
        } else {
            char buf[4096] = "";
            int add_bos = 0, add_eos = 0, special = 1;
            nw = json_ids(cJSON_GetObjectItem(it, "ids"), want, 256);
            if (msg) render_message(buf, sizeof buf, msg);
            else if (dialog) { /* BOS, every message, then the assistant header */
                const cJSON *m;
                strcpy(buf, "<|begin_of_text|>");
                cJSON_ArrayForEach(m, dialog) render_message(buf, sizeof buf, m);
                strcat(buf, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            } else {
                snprintf(buf, sizeof buf, "%s", text->valuestring);
                add_bos = cJSON_IsTrue(cJSON_GetObjectItem(it, "bos"));
                add_eos = cJSON_IsTrue(cJSON_GetObjectItem(it, "eos"));
                special = 0;
            }
            CHECK_OK(ft_tokenize_ex(t, buf, strlen(buf), add_bos, add_eos, special, &ids, &n));
            ok = same_ids(ids, n, want, (size_t)nw);
            if (!ok) { print_ids("want", want, (size_t)nw); print_ids("got ", ids, n); }
            free(ids);
        }
        pass += ok;
    }
    printf("  llama3 tiktoken: %d/%d cases\n", pass, n_cases);
    CHECK(n_cases == 4 && pass == n_cases);

    /* special tokens only when asked */
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ftune_tokenize(t, "<|eot_id|>", 10, 0, 0, &ids, &n));
    CHECK(n > 1 && ids[0] != eot);
    free(ids);
    CHECK_OK(ftune_tokenize(t, "<|eot_id|>", 10, 0, 1, &ids, &n));
    CHECK(n == 1 && ids[0] == eot);
    free(ids);
out:
    ft_tokenizer_free(t);
    cJSON_Delete(j);
    free(js);
}

/* ------------------------------------------------------------- stories260K */

static const char *const stories_text[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "
    "One day, she saw a big, red ball in the park.",
    "\"Can I play with you?\" asked Tom. Lily smiled and said, \"Yes! Let's play together.\"\n"
    "They played all day until the sun went down.",
    "  Two leading spaces, tabs\tand\nnew lines, numbers 1234567, caf\xc3\xa9, na\xc3\xafve, \xe2\x9c\x85 and \xf0\x9f\xa6\x99.",
    "",
};

/* tok512.bin, stories260K.gguf and the Hugging Face tokenizer.json agree,
 * and tok512.bin agrees with the restated llama2.c encode(). */
static void test_stories260k(void) {
    ftune_tokenizer *bin = load_tok("models/stories260K/tok512.bin");
    ftune_tokenizer *gg = load_tok("models/stories260K/stories260K.gguf");
    ftune_tokenizer *hf = load_tok("models/stories260K-hf");
    naive_vocab nv;
    CHECK(naive_load(&nv, "models/stories260K/tok512.bin") == 512);
    size_t shk_len = 0;
    char *shk = data_file("text/tinyshakespeare/input.txt", &shk_len);
    if (!bin || !gg || !hf || !shk) goto out;
    CHECK(ftune_tokenizer_n_vocab(hf) == 512 && ftune_tokenizer_bos(hf) == 1 && ftune_tokenizer_add_bos(hf));
    CHECK(ftune_tokenizer_is_eog(gg, 2) && ftune_tokenizer_is_eog(hf, 2) && ftune_tokenizer_is_eog(bin, 2));
    int n = (int)(sizeof stories_text / sizeof stories_text[0]) + 1, pass = 0;
    for (int c = 0; c < n; c++) {
        const char *s = c < n - 1 ? stories_text[c] : shk;
        size_t len = c < n - 1 ? strlen(s) : 3000; /* the first 3000 bytes of Shakespeare */
        int32_t *a = NULL, *b = NULL, *h = NULL, *ref = malloc((2 * len + 4) * sizeof *ref);
        size_t na = 0, nb = 0, nh = 0, rl;
        CHECK_OK(ftune_tokenize(bin, s, len, 1, 0, &a, &na));
        CHECK_OK(ftune_tokenize(gg, s, len, 1, 0, &b, &nb));
        CHECK_OK(ftune_tokenize(hf, s, len, 1, 0, &h, &nh));
        rl = naive_encode(&nv, s, len, ref);
        size_t dl = 0;
        char *back = decode(bin, a, na, 1, &dl);
        int ok = same_ids(a, na, b, nb) && same_ids(a, na, h, nh) && same_ids(a, na, ref, rl) &&
                 back && dl == len && memcmp(back, s, len) == 0;
        if (!ok) {
            fprintf(stderr, "  stories260K case %d disagrees\n", c);
            print_ids("tok512.bin", a, na); print_ids("gguf", b, nb); print_ids("tokenizer.json", h, nh); print_ids("llama2.c", ref, rl);
        }
        pass += ok;
        free(a); free(b); free(h); free(ref); free(back);
    }
    printf("  stories260K: tok512.bin, .gguf, tokenizer.json and llama2.c's encode() agree on %d/%d texts\n", pass, n);
    CHECK(pass == n);
    /* llama2.c prints control tokens as stored: tok512's BOS is "\n<s>\n" */
    char piece[64];
    int k = ftune_token_to_piece(bin, -1, 1, piece, sizeof piece);
    CHECK(k == 5 && memcmp(piece, "\n<s>\n", 5) == 0);
    k = ftune_token_to_piece(gg, -1, 1, piece, sizeof piece);
    CHECK(k == 3 && memcmp(piece, "<s>", 3) == 0);
    CHECK(ftune_token_to_piece(bin, -1, 512, piece, sizeof piece) == -1);
    CHECK(ftune_token_to_piece(bin, -1, -1, piece, sizeof piece) == -1);
out:
    naive_free(&nv);
    free(shk);
    ft_tokenizer_free(bin); ft_tokenizer_free(gg); ft_tokenizer_free(hf);
}

/* GPT-2 from vocab.json + merges.txt gives the ids of llama.cpp's gpt-2 vocab. */
static void test_gpt2_hf_files(void) {
    vocab_cases *vc = malloc(sizeof *vc);
    CHECK(read_cases("ggml-vocab-gpt-2", vc) >= 40);
    ftune_tokenizer *t = load_tok("tokenizers/gpt2");
    if (t && vc->n > 0) {
        int pass = run_cases(t, vc, 0, "gpt2 vocab.json");
        printf("  gpt2 vocab.json + merges.txt: %d/%d\n", pass, vc->n);
        CHECK(pass == vc->n);
        CHECK(ftune_tokenizer_eos(t) == 50256 && ftune_tokenizer_is_eog(t, 50256));
    }
    ft_tokenizer_free(t);
    free_cases(vc);
    free(vc);
}

/* ------------------------------------------------------------- special tokens */

/* A hand-made byte vocabulary (raw bytes, no merges) with special tokens:
 * they are cut out longest first over the whole text (as llama.cpp does),
 * user-defined ones even without parse_special, and lstrip/rstrip take the
 * neighbouring whitespace. */
static void test_special_partition(void) {
    enum { NB = 256 };
    const char *tokens[NB + 5];
    int lens[NB + 5], types[NB + 5];
    uint8_t strip[NB + 5] = {0};
    char bytes[NB];
    for (int i = 0; i < NB; i++) { bytes[i] = (char)i; tokens[i] = bytes + i; lens[i] = 1; types[i] = FT_TOKTYPE_NORMAL; }
    const char *sp[5] = { "ab", "bcd", "<u>", "<r>", "<l>" };
    int sp_type[5] = { FT_TOKTYPE_CONTROL, FT_TOKTYPE_CONTROL, FT_TOKTYPE_USER_DEFINED, FT_TOKTYPE_CONTROL, FT_TOKTYPE_CONTROL };
    for (int k = 0; k < 5; k++) { tokens[NB + k] = sp[k]; lens[NB + k] = (int)strlen(sp[k]); types[NB + k] = sp_type[k]; }
    strip[NB + 3] = 2; /* <r> eats the spaces after it */
    strip[NB + 4] = 1; /* <l> eats the spaces before it */
    ft_vocab_spec spec = { .kind = FT_TOK_BPE, .n_vocab = NB + 5, .tokens = tokens, .token_lens = lens, .types = types,
                           .strip = strip, .pre = "gpt-2", .raw_bytes = 1,
                           .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1, .eot_id = -1 };
    ftune_tokenizer *t = NULL;
    CHECK_OK(ft_tokenizer_build(&t, &spec));
    if (!t) return;
    struct { const char *text; int special; int32_t want[8]; int nw; } cases[] = {
        { "abcd", 1, { 'a', NB + 1 }, 2 },                   /* "bcd" is longer than "ab", so it goes first */
        { "abcd", 0, { 'a', 'b', 'c', 'd' }, 4 },            /* control tokens only with parse_special */
        { "x<u>y", 0, { 'x', NB + 2, 'y' }, 3 },             /* user-defined ones always */
        { "a<r>  b", 1, { 'a', NB + 3, 'b' }, 3 },
        { "a  <l>b", 1, { 'a', NB + 4, 'b' }, 3 },
        { "a <u> b", 1, { 'a', ' ', NB + 2, ' ', 'b' }, 5 },  /* no strip: spaces stay */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ftune_tokenize(t, cases[c].text, strlen(cases[c].text), 0, cases[c].special, &ids, &n));
        CHECKF(same_ids(ids, n, cases[c].want, (size_t)cases[c].nw), "case \"%s\" special=%d", cases[c].text, cases[c].special);
        if (!same_ids(ids, n, cases[c].want, (size_t)cases[c].nw)) print_ids("got", ids, n);
        free(ids);
    }
    CHECK(ftune_tokenizer_bos(t) == -1 && !ftune_tokenizer_add_bos(t));
    ft_tokenizer_free(t);
    /* ids outside the vocabulary are refused */
    spec.eos_id = NB + 5;
    CHECK(ft_tokenizer_build(&t, &spec) == FTUNE_ERR_FORMAT && t == NULL);
    spec.eos_id = -1;
    spec.pre = "no-such-pre";
    CHECK(ft_tokenizer_build(&t, &spec) == FTUNE_ERR_UNSUPPORTED && t == NULL);
}

/* ------------------------------------------------------------- bad input */

static void expect_bad_utf8(const ftune_tokenizer *t, const char *s, size_t len, long offset) {
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    char want[64];
    CHECK(ftune_tokenize(t, s, len, 1, 0, &ids, &n) == FTUNE_ERR_ARG);
    CHECK(ids == NULL && n == 0);
    snprintf(want, sizeof want, "offset %ld", offset);
    CHECKF(strstr(ftune_last_error(), want) != NULL, "message \"%s\" lacks \"%s\"", ftune_last_error(), want);
}

static void test_invalid_utf8(void) {
    ftune_tokenizer *spm = load_tok("models/stories260K/tok512.bin");
    ftune_tokenizer *bpe = load_tok("vocab-tests/ggml-vocab-gpt-2.gguf");
    const ftune_tokenizer *ts[2] = { spm, bpe };
    for (int k = 0; k < 2; k++) {
        if (!ts[k]) continue;
        expect_bad_utf8(ts[k], "abc\xff" "def", 7, 3);          /* not a lead byte */
        expect_bad_utf8(ts[k], "ok \xe2\x82", 5, 3);             /* truncated at the end */
        expect_bad_utf8(ts[k], "\xc0\xaf", 2, 0);                /* overlong '/' */
        expect_bad_utf8(ts[k], "x\xed\xa0\x80", 4, 1);           /* a surrogate */
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ftune_tokenize(ts[k], "", 0, 0, 0, &ids, &n)); /* empty is fine */
        CHECK(n == 0);
        free(ids);
    }
    ft_tokenizer_free(spm);
    ft_tokenizer_free(bpe);
}

static char *write_tmp(const void *data, size_t n, const char *suffix) {
    char *path = malloc(256);
    snprintf(path, 256, "%s/ftune_tok_%d%s", P_tmpdir, (int)getpid(), suffix);
    FILE *f = fopen(path, "wb");
    if (!f) { free(path); return NULL; }
    fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

/* Truncated and corrupt tokenizer files are FORMAT errors, not crashes. */
static void test_bad_files(void) {
    size_t n;
    char *bin = data_file("models/stories260K/tok512.bin", &n);
    if (!bin) { CHECK(bin != NULL); return; }
    ftune_tokenizer *t = NULL;
    size_t cuts[] = { 0, 3, 4, 10, n / 2, n - 1 };
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        char *p = write_tmp(bin, cuts[k], ".bin");
        ftune_status st = ft_tokenizer_from_llama2c(&t, p, 512);
        CHECKF(st == FTUNE_ERR_FORMAT && t == NULL, "cut at %zu: %s", cuts[k], ftune_status_name(st));
        unlink(p); free(p);
    }
    int32_t huge = 1 << 30; /* a token length past the end of the file */
    memcpy(bin + 8, &huge, 4);
    char *p = write_tmp(bin, n, ".bin");
    CHECK(ft_tokenizer_from_llama2c(&t, p, 512) == FTUNE_ERR_FORMAT && t == NULL);
    CHECK(strstr(ftune_last_error(), "token 0") != NULL);
    unlink(p); free(p);
    const char *tk = "IQ== 0\nIg== 0\n"; /* rank 0 twice */
    p = write_tmp(tk, strlen(tk), ".tiktoken");
    CHECK(ft_tokenizer_from_tiktoken(&t, p) == FTUNE_ERR_FORMAT && t == NULL);
    unlink(p); free(p);
    const char *garbage = "\x0a\xff\xff\xff\xff\x0f";
    p = write_tmp(garbage, 6, ".model");
    CHECK(ft_tokenizer_load_path(&t, p) == FTUNE_ERR_FORMAT && t == NULL);
    unlink(p); free(p);
    free(bin);
}

/* Pre-tokenizers that no shared data file uses, by their GGUF name: the
 * GPT-2 vocabulary of ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre set to
 * the name must give the ids Hugging Face tokenizers gives for the same
 * vocabulary with the pre-tokenizer written as the models' tokenizer.json
 * files write it (fixture written by scripts/make_pretok_fixture.py). */
static void test_named_pretokenizers(void) {
    char *text = NULL;
    size_t n = 0;
    if (ft_read_file("tests/fixtures/pretok/gpt2_pretok.json", &text, &n) != FTUNE_OK) {
        CHECKF(0, "%s", ftune_last_error());
        return;
    }
    cJSON *fx = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *texts = cJSON_GetObjectItemCaseSensitive(fx, "texts");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(fx, "ids"), *per;
    CHECK(cJSON_GetArraySize(texts) > 40 && cJSON_GetArraySize(all) >= 5);
    char path[1024];
    gguf_file g;
    CHECK_OK(ft_gguf_open(&g, check_data_path(path, sizeof path, "vocab-tests/ggml-vocab-gpt-2.gguf")));
    gguf_kv *pre = (gguf_kv *)ft_gguf_find(&g, "tokenizer.ggml.pre");
    CHECK(pre && pre->type == GGUF_T_STRING);
    cJSON_ArrayForEach(per, all) {
        if (!pre || check_failed_) break;
        pre->str = (gguf_str){ per->string, strlen(per->string) }; /* the same file, renamed pre-tokenizer */
        ftune_tokenizer *t = NULL;
        CHECK_OK(ft_tokenizer_from_gguf(&t, &g));
        if (!t) continue;
        int pass = 0, total = 0;
        for (int i = 0; i < cJSON_GetArraySize(texts); i++) {
            const char *s = cJSON_GetArrayItem(texts, i)->valuestring;
            const cJSON *want = cJSON_GetArrayItem(per, i), *w;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            CHECK_OK(ftune_tokenize(t, s, strlen(s), 0, 0, &ids, &n_ids));
            bool same = (size_t)cJSON_GetArraySize(want) == n_ids;
            size_t k = 0;
            cJSON_ArrayForEach(w, want) if (same && ids[k++] != w->valueint) same = false;
            total++;
            if (same) pass++;
            else if (total - pass <= 2) {
                fprintf(stderr, "  %s: text %d \"%.60s\"\n", per->string, i, s);
                print_ids("ours", ids, n_ids);
            }
            free(ids);
        }
        printf("  pre-tokenizer %-15s %d/%d texts match Hugging Face tokenizers\n", per->string, pass, total);
        CHECK(pass == total);
        ft_tokenizer_free(t);
    }
    ft_gguf_close(&g);
    cJSON_Delete(fx);
}

/* tokenizer.json's model section against what Hugging Face tokenizers
 * (0.23) does with the same file: what it rejects is rejected here; where it
 * silently keeps one of two entries (two tokens with one id, one token
 * twice), ftune rejects too, since encode and decode would disagree. */
static void test_tokenizer_json_rejects(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/ftune_tokjson_XXXXXX", P_tmpdir);
    if (!mkdtemp(dir)) { CHECK(0); return; }
    static const struct { const char *what, *vocab, *merges; ftune_status want; const char *needle; } cases[] = {
        { "valid", "{\"a\":0,\"b\":1,\"ab\":2}", "[\"a b\"]", FTUNE_OK, NULL },
        { "valid pairs", "{\"a\":0,\"b\":1,\"ab\":2}", "[[\"a\",\"b\"]]", FTUNE_OK, NULL },
        { "no merges", "{\"a\":0,\"b\":1,\"ab\":2}", "[]", FTUNE_OK, NULL },
        /* HF: "Token `c` out of vocabulary" */
        { "unknown right piece", "{\"a\":0,\"b\":1,\"ab\":2}", "[\"a c\"]", FTUNE_ERR_FORMAT, "right piece" },
        { "unknown left piece", "{\"a\":0,\"b\":1,\"ab\":2}", "[[\"c\",\"b\"]]", FTUNE_ERR_FORMAT, "left piece" },
        /* HF panics ("range end index 2 out of range") */
        { "unknown result", "{\"a\":0,\"b\":1}", "[\"a b\"]", FTUNE_ERR_FORMAT, "result" },
        /* HF: "Merges text file invalid at line 1" */
        { "3-part merge", "{\"a\":0,\"b\":1,\"ab\":2}", "[\"a b c\"]", FTUNE_ERR_FORMAT, "two pieces" },
        { "1-part merge", "{\"a\":0,\"b\":1,\"ab\":2}", "[\"ab\"]", FTUNE_ERR_FORMAT, "two pieces" },
        { "two spaces", "{\"a\":0,\"b\":1,\"ab\":2}", "[\"a  b\"]", FTUNE_ERR_FORMAT, "two pieces" },
        /* HF: "data did not match any variant of untagged enum MergeType" */
        { "3-part pair", "{\"a\":0,\"b\":1,\"ab\":2}", "[[\"a\",\"b\",\"c\"]]", FTUNE_ERR_FORMAT, "merge 0" },
        { "merges null", "{\"a\":0,\"b\":1,\"ab\":2}", "null", FTUNE_ERR_FORMAT, "merges" },
        { "merge not a string", "{\"a\":0,\"b\":1,\"ab\":2}", "[1]", FTUNE_ERR_FORMAT, "merge 0" },
        /* HF: "Missing vocab/merges" */
        { "merges missing", "{\"a\":0,\"b\":1,\"ab\":2}", NULL, FTUNE_ERR_FORMAT, "merges is missing" },
        /* HF: "invalid value: integer `-1`, expected u32" */
        { "negative id", "{\"a\":-1,\"b\":1,\"ab\":2}", "[\"a b\"]", FTUNE_ERR_FORMAT, "bad id" },
        { "fractional id", "{\"a\":0.5,\"b\":1,\"ab\":2}", "[\"a b\"]", FTUNE_ERR_FORMAT, "bad id" },
        /* HF makes a vocabulary of 9000001 with holes; a fuzzer found that it costs
         * seconds and hundreds of MB: refused (real vocabularies are dense) */
        { "sparse ids", "{\"a\":0,\"b\":1,\"ab\":9000000}", "[\"a b\"]", FTUNE_ERR_FORMAT, "expected to be dense" },
        /* HF keeps one of them (vocab size 3 for 4 entries) */
        { "duplicate id", "{\"a\":0,\"b\":1,\"ab\":1}", "[]", FTUNE_ERR_FORMAT, "same id 1" },
        { "duplicate token", "{\"a\":0,\"b\":1,\"ab\":2,\"a\":3}", "[]", FTUNE_ERR_FORMAT, "\"a\" appears twice" },
        /* HF loads it (vocab size 0); nothing but <unk> could come out */
        { "empty vocab", "{}", "[]", FTUNE_ERR_FORMAT, "vocab is empty" },
    };
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        if (!f) { CHECK(f != NULL); break; }
        fprintf(f, "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
                   "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                   "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":%s%s%s}}",
                cases[i].vocab, cases[i].merges ? ",\"merges\":" : "", cases[i].merges ? cases[i].merges : "");
        fclose(f);
        ftune_tokenizer *t = NULL;
        ftune_status st = ft_tokenizer_from_hf_dir(&t, dir);
        CHECKF(st == cases[i].want, "%s: got %s: %s", cases[i].what, ftune_status_name(st), ftune_last_error());
        if (st && cases[i].needle)
            CHECKF(strstr(ftune_last_error(), cases[i].needle) && strstr(ftune_last_error(), "tokenizer.json"),
                   "%s: message lacks \"%s\" or the file: %s", cases[i].what, cases[i].needle, ftune_last_error());
        if (!st) { /* "abab": HF gives [2, 2] with the merge, [0, 1, 0, 1] without (even though "ab" is a token) */
            int32_t *ids = NULL;
            size_t n = 0;
            bool merged = strcmp(cases[i].merges, "[]") != 0;
            CHECK_OK(ftune_tokenize(t, "abab", 4, 0, 0, &ids, &n));
            CHECKF(merged ? n == 2 && ids[0] == 2 && ids[1] == 2 : n == 4 && ids[0] == 0 && ids[1] == 1 && ids[2] == 0,
                   "%s: abab gave %zu ids", cases[i].what, n);
            free(ids);
        }
        CHECK((st == FTUNE_OK) == (t != NULL));
        ft_tokenizer_free(t);
    }
    unlink(path);
    rmdir(dir);
}

/* ------------------------------------------------------------- random text */

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) { o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63)); return 3; }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* decode(encode(x)) == x on random text mixing scripts, digits, spaces,
 * combining marks, emoji and rare characters (never U+2581, which
 * SentencePiece reads as a space); for Llama 3 also with special tokens. */
static void test_random_round_trips(void) {
    static const uint32_t pool[] = {
        ' ', ' ', ' ', '\n', '\t', '\r', 'a', 'e', 'z', 'Q', '0', '7', '\'', '.', ',', '!', '<', '|', '>', '$',
        0xE9, 0xDF, 0xA0, 0x436, 0x6211, 0xD55C, 0xE01, 0x639, 0x663, 0x301, 0x200D, 0x3000, 0x1F999, 0x1F600,
        0x10FFFF, 0xFFFD, 0x2028, 0x17F,
    };
    const char *rels[] = { "vocab-tests/ggml-vocab-llama-spm.gguf", "vocab-tests/ggml-vocab-gpt-2.gguf",
                           "vocab-tests/ggml-vocab-falcon.gguf", "tokenizers/llama3/tokenizer.model" };
    static const char *const specials[] = { "<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>" };
    ft_rng rng;
    ft_rng_seed(&rng, 1234);
    char text[1024];
    for (int v = 0; v < 4; v++) {
        ftune_tokenizer *t = load_tok(rels[v]);
        if (!t) continue;
        int spm = ft_tokenizer_kind(t) == FT_TOK_SPM, pass = 0, n_cases = 300;
        for (int c = 0; c < n_cases; c++) {
            int parse = v == 3 && c % 2; /* Llama 3: every other text with special tokens */
            size_t len = 0, nch = ft_rng_u32(&rng) % 80;
            for (size_t k = 0; k < nch; k++) {
                if (parse && ft_rng_u32(&rng) % 16 == 0) {
                    const char *sp = specials[ft_rng_u32(&rng) % 3];
                    memcpy(text + len, sp, strlen(sp));
                    len += strlen(sp);
                } else {
                    len += put_utf8(text + len, pool[ft_rng_u32(&rng) % (sizeof pool / sizeof pool[0])]);
                }
            }
            int32_t *ids = NULL;
            size_t n = 0, bl = 0;
            CHECK_OK(ftune_tokenize(t, text, len, spm, parse, &ids, &n));
            char *back = decode(t, ids, n, (size_t)spm, &bl);
            if (back && bl == len && memcmp(back, text, len) == 0) pass++;
            else if (pass + 3 > c) fprintf(stderr, "  %s: round trip of \"%.*s\" gave \"%s\"\n", rels[v], (int)len, text, back ? back : "(bad id)");
            free(back);
            free(ids);
        }
        printf("  random round trips %-40s %d/%d\n", rels[v], pass, n_cases);
        CHECK(pass == n_cases);
        ft_tokenizer_free(t);
    }
}

/* ------------------------------------------------------------- speed */

/* 1.1 MB of Shakespeare with a 32k SentencePiece and the 128k Llama 3
 * vocabulary, and back. */
static void test_speed_shakespeare(void) {
    size_t len;
    char *text = data_file("text/tinyshakespeare/input.txt", &len);
    ftune_tokenizer *spm = load_tok("vocab-tests/ggml-vocab-llama-spm.gguf");
    ftune_tokenizer *l3 = load_tok("tokenizers/llama3/tokenizer.model");
    const ftune_tokenizer *ts[2] = { spm, l3 };
    const char *names[2] = { "llama-spm 32k", "llama3 128k" };
    for (int k = 0; k < 2 && text; k++) {
        if (!ts[k]) continue;
        int32_t *ids = NULL;
        size_t n = 0, back_len = 0;
        double t0 = ft_time_s();
        CHECK_OK(ftune_tokenize(ts[k], text, len, 1, 0, &ids, &n));
        double t1 = ft_time_s();
        char *back = decode(ts[k], ids, n, 1, &back_len);
        CHECK(back && back_len == len && memcmp(back, text, len) == 0);
        printf("  %s: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", names[k], len, n, t1 - t0, len / 1e6 / (t1 - t0));
        /* the target is well under 1-2 s; 10 s leaves room for a loaded shared machine or a sanitizer build */
        CHECK(t1 - t0 < 10.0);
        free(back);
        free(ids);
    }
    ft_tokenizer_free(spm);
    ft_tokenizer_free(l3);
    free(text);
}

int main(void) {
    RUN(test_vocab_llama_spm);
    RUN(test_vocab_phi3);
    RUN(test_vocab_gpt2);
    RUN(test_vocab_falcon);
    RUN(test_llama2_bin_and_model);
    RUN(test_llama3);
    RUN(test_stories260k);
    RUN(test_gpt2_hf_files);
    RUN(test_special_partition);
    RUN(test_invalid_utf8);
    RUN(test_bad_files);
    RUN(test_tokenizer_json_rejects);
    RUN(test_named_pretokenizers);
    RUN(test_random_round_trips);
    RUN(test_speed_shakespeare);
    CHECK_EXIT();
}
