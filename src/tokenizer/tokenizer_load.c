/* tokenizer_load.c — reads tokenizers from the files models come with:
 * GGUF metadata, Hugging Face tokenizer.json (or vocab.json + merges.txt),
 * llama2.c tokenizer .bin, tiktoken and SentencePiece tokenizer.model. Each
 * fills an ft_vocab_spec (tokenizer.h) and calls ft_tokenizer_build. Every
 * length and count read from a file is checked against the file size. */
#include "tokenizer/tokenizer.h"
#include "formats/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void spec_init(ft_vocab_spec *s, ft_tok_kind kind) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->bos_id = s->eos_id = s->unk_id = s->pad_id = s->eot_id = -1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = ft_malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* A growable byte arena of NUL-terminated strings, addressed by offset. */
typedef struct { char *p; size_t n, cap; } arena_t;

static long arena_add(arena_t *a, const void *s, size_t n) {
    if (a->n + n + 1 > a->cap) {
        size_t nc = a->cap ? a->cap : 4096;
        while (nc < a->n + n + 1) nc *= 2;
        char *np = realloc(a->p, nc);
        if (!np) return -1;
        a->p = np; a->cap = nc;
    }
    long off = (long)a->n;
    if (n) memcpy(a->p + a->n, s, n);
    a->p[a->n + n] = 0;
    a->n += n + 1;
    return off;
}

/* A SentencePiece-kind spec over n pieces held in arena a at offs (the
 * llama2.c tokenizer.bin and tokenizer.model readers): their pointers are
 * written to tok once the arena no longer moves. */
static void spm_spec(ft_vocab_spec *spec, int n, const char **tok, const arena_t *a, const long *offs, int *lens,
                     float *scores, int *types) {
    for (int i = 0; i < n; i++) tok[i] = a->p + offs[i];
    spec_init(spec, FT_TOK_SPM);
    spec->n_vocab = n;
    spec->tokens = tok;
    spec->token_lens = lens;
    spec->scores = scores;
    spec->types = types;
}

/* ------------------------------------------------------------- llama2.c .bin */

ftune_status ft_tokenizer_from_llama2c(ftune_tokenizer **out, const char *path, int n_vocab) {
    if (!out || !path) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_llama2c: NULL argument");
    *out = NULL;
    ft_mmap m;
    ftune_status st = ft_mmap_open(&m, path);
    if (st) return st;
    const uint8_t *d = m.data;
    size_t size = m.size, pos = 4;
    if (size < 4) { ft_mmap_close(&m); return ft_err(FTUNE_ERR_FORMAT, "%s: too short for a tokenizer header", path); }
    /* count the entries (or check that n_vocab of them fit) */
    int n = 0;
    while (n_vocab <= 0 ? pos < size : n < n_vocab) {
        int32_t len;
        if (size - pos < 8) {
            ft_mmap_close(&m);
            return ft_err(FTUNE_ERR_FORMAT, "%s: truncated at token %d (byte %zu of %zu)", path, n, pos, size);
        }
        memcpy(&len, d + pos + 4, 4);
        if (len < 0 || (size_t)len > size - pos - 8) {
            ft_mmap_close(&m);
            return ft_err(FTUNE_ERR_FORMAT, "%s: token %d has length %d, past the end of the file", path, n, (int)len);
        }
        pos += 8 + (size_t)len;
        if (++n > (1 << 24)) { ft_mmap_close(&m); return ft_err(FTUNE_ERR_FORMAT, "%s: too many tokens", path); }
    }
    if (n < 3) { ft_mmap_close(&m); return ft_err(FTUNE_ERR_FORMAT, "%s: %d tokens; need at least unk, BOS and EOS", path, n); }

    const char **tok = ft_calloc((size_t)n, sizeof *tok);
    int *lens = ft_calloc((size_t)n, sizeof *lens);
    float *scores = ft_calloc((size_t)n, sizeof *scores);
    int *types = ft_calloc((size_t)n, sizeof *types);
    arena_t a = {0};
    long *offs = ft_calloc((size_t)n, sizeof *offs);
    char *tmp = NULL;
    size_t tmp_cap = 0;
    st = FTUNE_ERR_NOMEM;
    if (!tok || !lens || !scores || !types || !offs) goto done;
    pos = 4;
    for (int i = 0; i < n; i++) {
        int32_t len;
        memcpy(&scores[i], d + pos, 4);
        memcpy(&len, d + pos + 4, 4);
        const char *s = (const char *)d + pos + 8;
        pos += 8 + (size_t)len;
        /* llama2.c's export wrote SentencePiece's "▁" as a plain space */
        types[i] = i == 0 ? FT_TOKTYPE_UNKNOWN : i <= 2 ? FT_TOKTYPE_CONTROL : FT_TOKTYPE_NORMAL;
        long o;
        if (types[i] == FT_TOKTYPE_NORMAL) {
            if ((size_t)len * 3 > tmp_cap) {
                tmp_cap = (size_t)len * 3 + 64;
                char *nt = realloc(tmp, tmp_cap);
                if (!nt) goto done;
                tmp = nt;
            }
            size_t l = 0;
            for (int k = 0; k < len; k++) {
                if (s[k] == ' ') { memcpy(tmp + l, "\xe2\x96\x81", 3); l += 3; }
                else tmp[l++] = s[k];
            }
            o = arena_add(&a, tmp, l);
            lens[i] = (int)l;
        } else {
            o = arena_add(&a, s, (size_t)len);
            lens[i] = len;
        }
        if (o < 0) goto done;
        offs[i] = o;
    }
    ft_vocab_spec spec;
    spm_spec(&spec, n, tok, &a, offs, lens, scores, types);
    spec.unk_id = 0; spec.bos_id = 1; spec.eos_id = 2;
    spec.add_bos = 1;
    spec.add_space_prefix = 1;
    st = ft_tokenizer_build(out, &spec);
    if (st) ft_err_prefix(st, "%s", path);
done:
    if (st == FTUNE_ERR_NOMEM && !*out) ft_err(st, "%s: out of memory", path);
    free(tok); free(lens); free(scores); free(types); free(offs); free(a.p); free(tmp);
    ft_mmap_close(&m);
    return st;
}

/* ------------------------------------------------------------- tiktoken */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard base64 (with optional '=' padding); returns the length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *outb) {
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    long o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; outb[o++] = (unsigned char)(acc >> bits); }
    }
    return o;
}

/* Llama 3's special tokens, ids 128000.. (meta-llama/llama-models tokenizer.py). */
static const char *const llama3_specials[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
};
#define LLAMA3_N_BASE 128000
#define LLAMA3_N_SPECIAL 256
/* tiktoken's pattern for Llama 3, as Meta's tokenizer.py gives it */
static const char *const llama3_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

ftune_status ft_tokenizer_from_tiktoken(ftune_tokenizer **out, const char *path) {
    if (!out || !path) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_tiktoken: NULL argument");
    *out = NULL;
    char *text;
    size_t size;
    ftune_status st = ft_read_file(path, &text, &size);
    if (st) return st;
    int n_lines = 0;
    for (size_t i = 0; i < size; i++) n_lines += text[i] == '\n';
    n_lines += 1;
    int cap = n_lines + LLAMA3_N_SPECIAL;
    const char **tok = ft_calloc((size_t)cap, sizeof *tok);
    int *lens = ft_calloc((size_t)cap, sizeof *lens);
    int *types = ft_calloc((size_t)cap, sizeof *types);
    unsigned char *bytes = ft_malloc(size + 1);   /* decoded tokens, shorter than their base64 */
    char *names = NULL;
    st = FTUNE_ERR_NOMEM;
    if (!tok || !lens || !types || !bytes) { st = ft_err(st, "%s: out of memory", path); goto done; }
    size_t bo = 0;
    int n_base = 0, line = 0;
    for (size_t p = 0; p < size;) {
        size_t e = p;
        while (e < size && text[e] != '\n') e++;
        line++;
        size_t le = e;
        if (le > p && text[le - 1] == '\r') le--;
        if (le > p) {
            const char *sp = memchr(text + p, ' ', le - p);
            char *end;
            long rank = sp ? strtol(sp + 1, &end, 10) : -1;
            long bl = sp ? b64_decode(text + p, (size_t)(sp - (text + p)), bytes + bo) : -1;
            if (!sp || bl < 0 || end != text + le || rank < 0 || rank >= n_lines) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: expected \"<base64> <rank>\"", path, line);
                goto done;
            }
            if (tok[rank]) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: rank %ld appears twice", path, line, rank); goto done; }
            tok[rank] = (const char *)bytes + bo;
            lens[rank] = (int)bl;
            types[rank] = FT_TOKTYPE_NORMAL;
            bo += (size_t)bl;
            n_base++;
        }
        p = e + 1;
    }
    for (int i = 0; i < n_base; i++)
        if (!tok[i]) { st = ft_err(FTUNE_ERR_FORMAT, "%s: ranks are not 0..%d: %d is missing", path, n_base - 1, i); goto done; }
    if (n_base != LLAMA3_N_BASE) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: %d tokens; only Llama 3's tiktoken file (%d) has known special tokens",
                    path, n_base, LLAMA3_N_BASE);
        goto done;
    }
    names = ft_malloc(LLAMA3_N_SPECIAL * 40);
    if (!names) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    int n_named = (int)(sizeof llama3_specials / sizeof llama3_specials[0]);
    for (int i = 0; i < LLAMA3_N_SPECIAL; i++) {
        char *nm = names + 40 * i;
        if (i < n_named) snprintf(nm, 40, "%s", llama3_specials[i]);
        else snprintf(nm, 40, "<|reserved_special_token_%d|>", 2 + i - n_named);
        tok[n_base + i] = nm;
        lens[n_base + i] = (int)strlen(nm);
        types[n_base + i] = FT_TOKTYPE_CONTROL;
    }
    ft_vocab_spec spec;
    spec_init(&spec, FT_TOK_BPE);
    spec.n_vocab = n_base + LLAMA3_N_SPECIAL;
    spec.tokens = tok;
    spec.token_lens = lens;
    spec.types = types;
    spec.raw_bytes = 1;
    spec.ignore_merges = 1;
    spec.pre_regexes = &llama3_pattern;
    spec.n_pre_regexes = 1;
    spec.bos_id = n_base + 0;
    spec.eos_id = n_base + 1;
    spec.eot_id = n_base + 9;
    int32_t eom = n_base + 8;
    spec.eog_ids = &eom;
    spec.n_eog_ids = 1;
    spec.add_bos = 1;
    st = ft_tokenizer_build(out, &spec);
    if (st) ft_err_prefix(st, "%s", path);
done:
    free(tok); free(lens); free(types); free(bytes); free(names); free(text);
    return st;
}

/* ------------------------------------------------------------- SentencePiece .model */

typedef struct { const uint8_t *p, *end; } pb_t;

static bool pb_varint(pb_t *b, uint64_t *v) {
    uint64_t x = 0;
    for (int sh = 0; sh < 64; sh += 7) {
        if (b->p >= b->end) return false;
        uint8_t c = *b->p++;
        x |= (uint64_t)(c & 0x7F) << sh;
        if (!(c & 0x80)) { *v = x; return true; }
    }
    return false;
}

/* Reads one field: its number, wire type, and value (varint/fixed) or bytes. */
static bool pb_field(pb_t *b, uint32_t *field, int *wt, uint64_t *v, pb_t *sub) {
    uint64_t key;
    if (!pb_varint(b, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return pb_varint(b, v);
    case 1: if (b->end - b->p < 8) return false; memcpy(v, b->p, 8); b->p += 8; return true;
    case 5: { uint32_t x; if (b->end - b->p < 4) return false; memcpy(&x, b->p, 4); b->p += 4; *v = x; return true; }
    case 2:
        if (!pb_varint(b, v) || *v > (uint64_t)(b->end - b->p)) return false;
        sub->p = b->p; sub->end = b->p + *v; b->p += *v;
        return true;
    default: return false;
    }
}

ftune_status ft_tokenizer_from_spm_model(ftune_tokenizer **out, const char *path) {
    if (!out || !path) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_spm_model: NULL argument");
    *out = NULL;
    ft_mmap m;
    ftune_status st = ft_mmap_open(&m, path);
    if (st) return st;
    pb_t b = { m.data, m.data + m.size }, sub;
    uint32_t f;
    int wt;
    uint64_t v;
    int n = 0;
    while (b.p < b.end) { /* count the pieces */
        if (!pb_field(&b, &f, &wt, &v, &sub)) { ft_mmap_close(&m); return ft_err(FTUNE_ERR_FORMAT, "%s: not a SentencePiece model (bad protobuf)", path); }
        if (f == 1 && wt == 2) n++;
    }
    if (n < 1 || n > (1 << 24)) { ft_mmap_close(&m); return ft_err(FTUNE_ERR_FORMAT, "%s: %d pieces", path, n); }
    const char **tok = ft_calloc((size_t)n, sizeof *tok);
    int *lens = ft_calloc((size_t)n, sizeof *lens);
    float *scores = ft_calloc((size_t)n, sizeof *scores);
    int *types = ft_calloc((size_t)n, sizeof *types);
    long *offs = ft_calloc((size_t)n, sizeof *offs);
    arena_t a = {0};
    int model_type = 1, add_prefix = 1;
    int64_t ids[4] = { 0, 1, 2, -1 }; /* unk, bos, eos, pad: SentencePiece's defaults */
    st = FTUNE_ERR_NOMEM;
    if (!tok || !lens || !scores || !types || !offs) goto done;
    b.p = m.data;
    int i = 0;
    while (b.p < b.end) {
        pb_field(&b, &f, &wt, &v, &sub); /* checked above */
        if (f == 1 && wt == 2) {
            pb_t q = sub;
            types[i] = FT_TOKTYPE_NORMAL;
            long o = -1;
            while (q.p < q.end) {
                uint32_t g; int w2; uint64_t x; pb_t s2;
                if (!pb_field(&q, &g, &w2, &x, &s2)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: piece %d is malformed", path, i); goto done; }
                if (g == 1 && w2 == 2) { o = arena_add(&a, s2.p, (size_t)x); if (o < 0) goto done; lens[i] = (int)x; }
                else if (g == 2 && w2 == 5) { uint32_t u = (uint32_t)x; memcpy(&scores[i], &u, 4); }
                else if (g == 3 && w2 == 0) types[i] = (int)x;
            }
            if (o < 0) { st = ft_err(FTUNE_ERR_FORMAT, "%s: piece %d has no text", path, i); goto done; }
            offs[i++] = o;
        } else if ((f == 2 || f == 3) && wt == 2) { /* trainer spec, normalizer spec */
            pb_t q = sub;
            while (q.p < q.end) {
                uint32_t g; int w2; uint64_t x; pb_t s2;
                if (!pb_field(&q, &g, &w2, &x, &s2)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: malformed spec", path); goto done; }
                if (w2 != 0) continue;
                if (f == 2 && g == 3) model_type = (int)x;
                else if (f == 2 && g >= 40 && g <= 43) ids[g - 40] = (int64_t)(int32_t)(uint32_t)x;
                else if (f == 3 && g == 3) add_prefix = x != 0;
            }
        }
    }
    if (model_type != 2) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: SentencePiece model type %d; only BPE (2) is supported", path, model_type);
        goto done;
    }
    ft_vocab_spec spec;
    spm_spec(&spec, n, tok, &a, offs, lens, scores, types);
    int32_t *dst[4] = { &spec.unk_id, &spec.bos_id, &spec.eos_id, &spec.pad_id };
    for (int k = 0; k < 4; k++) *dst[k] = ids[k] >= 0 && ids[k] < n ? (int32_t)ids[k] : -1;
    spec.add_bos = spec.bos_id >= 0;
    spec.add_space_prefix = add_prefix;
    st = ft_tokenizer_build(out, &spec);
    if (st) ft_err_prefix(st, "%s", path);
done:
    if (st == FTUNE_ERR_NOMEM && !*out) ft_err(st, "%s: out of memory", path);
    free(tok); free(lens); free(scores); free(types); free(offs); free(a.p);
    ft_mmap_close(&m);
    return st;
}

/* ------------------------------------------------------------- GGUF */

static int32_t gguf_id(const gguf_file *g, const char *key, int32_t dflt, int n) {
    int64_t v;
    if (ft_gguf_get_i64(g, key, &v)) return v >= 0 && v < n ? (int32_t)v : -1;
    return dflt >= 0 && dflt < n ? dflt : -1;
}

/* A numeric array of at least n elements: F32 or I32 read as float/int. */
static FTUNE_MUST_USE ftune_status gguf_num_array(const gguf_file *g, const char *key, int n, float *fout, int *iout) {
    const gguf_kv *kv = ft_gguf_find(g, key);
    if (!kv) return FTUNE_OK;
    if (kv->type != GGUF_T_ARRAY || (kv->arr_type != GGUF_T_F32 && kv->arr_type != GGUF_T_I32) || kv->arr_n < (uint64_t)n)
        return ft_err(FTUNE_ERR_FORMAT, "%s: expected an f32/i32 array of at least %d elements", key, n);
    for (int i = 0; i < n; i++) {
        const uint8_t *p = kv->arr_data + 4 * (size_t)i;
        if (kv->arr_type == GGUF_T_F32) {
            float x; memcpy(&x, p, 4);
            if (fout) fout[i] = x;
            if (iout) iout[i] = (int)x;
        } else {
            int32_t x; memcpy(&x, p, 4);
            if (fout) fout[i] = (float)x;
            if (iout) iout[i] = x;
        }
    }
    return FTUNE_OK;
}

ftune_status ft_tokenizer_from_gguf(ftune_tokenizer **out, const struct gguf_file_s *g) {
    if (!out || !g) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_gguf: NULL argument");
    *out = NULL;
    gguf_str model;
    if (!ft_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return ft_err(FTUNE_ERR_FORMAT, "no tokenizer.ggml.model string");
    ft_tok_kind kind;
    if (ft_gguf_str_eq(model, "llama")) kind = FT_TOK_SPM;
    else if (ft_gguf_str_eq(model, "gpt2")) kind = FT_TOK_BPE;
    else return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.ggml.model \"%.*s\" (supported: llama, gpt2)",
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);
    gguf_str_array toks = {0}, merges = {0};
    ftune_status st = ft_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks);
    if (st) return ft_err_prefix(st, "tokenizer.ggml.tokens");
    int n = (int)toks.n;
    const char **tok = NULL, **mer = NULL;
    int *lens = NULL, *types = NULL;
    float *scores = NULL;
    char *pre = NULL, *mbuf = NULL, *tmpl = NULL;
    if (toks.n == 0 || toks.n > (1 << 24)) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens", (unsigned long long)toks.n); goto done; }
    tok = ft_calloc((size_t)n, sizeof *tok);
    lens = ft_calloc((size_t)n, sizeof *lens);
    types = ft_calloc((size_t)n, sizeof *types);
    scores = ft_calloc((size_t)n, sizeof *scores);
    if (!tok || !lens || !types || !scores) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        if (toks.items[i].len > (1u << 20)) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer.ggml.tokens[%d]: %llu bytes", i, (unsigned long long)toks.items[i].len); goto done; }
        tok[i] = toks.items[i].ptr;
        lens[i] = (int)toks.items[i].len;
        types[i] = FT_TOKTYPE_NORMAL;
    }
    if ((st = gguf_num_array(g, "tokenizer.ggml.scores", n, scores, NULL))) goto done;
    if ((st = gguf_num_array(g, "tokenizer.ggml.token_type", n, NULL, types))) goto done;

    ft_vocab_spec spec;
    spec_init(&spec, kind);
    gguf_str s;
    pre = ft_gguf_get_str(g, "tokenizer.ggml.pre", &s) ? ft_gguf_str_dup(s) : ft_strdup("default");
    if (!pre) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    if (kind == FT_TOK_BPE) {
        if ((st = ft_gguf_get_str_array(g, "tokenizer.ggml.merges", &merges))) { ft_err_prefix(st, "tokenizer.ggml.merges"); goto done; }
        if (merges.n > (1u << 24)) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer.ggml.merges: too many"); goto done; }
        size_t total = 0;
        for (uint64_t i = 0; i < merges.n; i++) total += merges.items[i].len + 1;
        mer = ft_calloc(merges.n ? merges.n : 1, sizeof *mer);
        mbuf = ft_malloc(total + 1);
        if (!mer || !mbuf) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
        size_t o = 0;
        for (uint64_t i = 0; i < merges.n; i++) {
            mer[i] = mbuf + o;
            memcpy(mbuf + o, merges.items[i].ptr, merges.items[i].len);
            o += merges.items[i].len;
            mbuf[o++] = 0;
        }
        spec.merges = mer;
        spec.n_merges = (int)merges.n;
        spec.pre = pre;
        spec.nfc = strcmp(pre, "qwen2") == 0; /* Qwen2's tokenizer.json has an NFC normalizer */
        spec.add_bos = strcmp(pre, "llama3") == 0 || strcmp(pre, "llama-v3") == 0 || strcmp(pre, "llama-bpe") == 0 ||
                       strcmp(pre, "falcon3") == 0 || strcmp(pre, "pixtral") == 0 || strcmp(pre, "tekken") == 0; /* as llama.cpp */
    } else {
        spec.add_bos = 1;
        spec.add_space_prefix = 1;
    }
    spec.n_vocab = n;
    spec.tokens = tok;
    spec.token_lens = lens;
    spec.scores = scores;
    spec.types = types;
    bool spm = kind == FT_TOK_SPM;
    if (ft_gguf_get_str(g, "tokenizer.chat_template", &s) && !(tmpl = ft_gguf_str_dup(s))) {
        st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    spec.chat_template = tmpl;
    spec.bos_id = gguf_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
    spec.eos_id = gguf_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
    spec.unk_id = gguf_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
    spec.pad_id = gguf_id(g, "tokenizer.ggml.padding_token_id", -1, n);
    spec.eot_id = gguf_id(g, "tokenizer.ggml.eot_token_id", -1, n);
    int32_t eom = gguf_id(g, "tokenizer.ggml.eom_token_id", -1, n);
    if (eom >= 0) { spec.eog_ids = &eom; spec.n_eog_ids = 1; }
    bool bv;
    if (ft_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv)) spec.add_bos = bv;
    if (ft_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &bv)) spec.add_eos = bv;
    if (ft_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bv)) spec.add_space_prefix = bv;
    st = ft_tokenizer_build(out, &spec);
done:
    free(toks.items); free(merges.items);
    free(tok); free(lens); free(types); free(scores); free(mer); free(mbuf); free(pre); free(tmpl);
    return st;
}

/* ------------------------------------------------------------- Hugging Face */

static cJSON *read_json(const char *path, ftune_status *st) {
    char *text;
    size_t n;
    *st = ft_read_file(path, &text, &n);
    if (*st) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, n);
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        long off = e && e >= text && e <= text + n ? (long)(e - text) : -1;
        *st = ft_err(FTUNE_ERR_FORMAT, "%s: invalid JSON near byte %ld", path, off);
    }
    free(text);
    return j;
}

/* Token text of tokenizer_config.json's "bos_token" etc.: a string or {"content": ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static bool json_type_is(const cJSON *o, const char *type) {
    const char *t = json_str(o, "type");
    return t && strcmp(t, type) == 0;
}

/* Does the tree of normalizers / pre-tokenizers / decoders contain `type`? */
static const cJSON *json_find_type(const cJSON *o, const char *type) {
    if (!cJSON_IsObject(o)) return NULL;
    if (json_type_is(o, type)) return o;
    static const char *const lists[] = { "normalizers", "pretokenizers", "decoders", "processors" };
    for (size_t k = 0; k < 4; k++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, lists[k]), *it;
        cJSON_ArrayForEach(it, arr) {
            const cJSON *r = json_find_type(it, type);
            if (r) return r;
        }
    }
    return NULL;
}

typedef struct {
    char *re[8];
    int n;
} regex_list;

static FTUNE_MUST_USE ftune_status add_regex(regex_list *l, const char *re) {
    if (l->n >= 8) return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.json: more than 8 pre-tokenizer splits");
    if (!(l->re[l->n] = ft_strdup(re))) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
    l->n++;
    return FTUNE_OK;
}

/* Collects the regexes of a byte-level pre-tokenizer (Split, ByteLevel,
 * Digits, Punctuation, in a Sequence). */
static FTUNE_MUST_USE ftune_status hf_pre_regexes(const cJSON *pt, regex_list *l) {
    if (!pt || cJSON_IsNull(pt)) return FTUNE_OK;
    const char *type = json_str(pt, "type");
    if (!type) return ft_err(FTUNE_ERR_FORMAT, "tokenizer.json: pre_tokenizer without a type");
    ftune_status st;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"))
            if ((st = hf_pre_regexes(it, l))) return st;
        return FTUNE_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "add_prefix_space")))
            return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.json: ByteLevel add_prefix_space");
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        if (ur && cJSON_IsFalse(ur)) return FTUNE_OK;
        return add_regex(l, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
    }
    if (strcmp(type, "Split") == 0) {
        const char *beh = json_str(pt, "behavior");
        if (!beh || strcmp(beh, "Isolated") != 0 || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "invert")))
            return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.json: Split with behavior \"%s\"%s", beh ? beh : "?",
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "invert")) ? " (inverted)" : "");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const char *re = json_str(pat, "Regex"), *lit = json_str(pat, "String");
        if (re) return add_regex(l, re);
        if (!lit) return ft_err(FTUNE_ERR_FORMAT, "tokenizer.json: Split without a pattern");
        size_t n = strlen(lit);
        char *q = ft_malloc(n + 8);
        if (!q) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
        snprintf(q, n + 8, "\\Q%s\\E", lit);
        st = strstr(lit, "\\E") ? ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.json: Split string containing \\E") : add_regex(l, q);
        free(q);
        return st;
    }
    if (strcmp(type, "Digits") == 0)
        return add_regex(l, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "individual_digits")) ? "\\p{N}" : "\\p{N}+");
    if (strcmp(type, "Punctuation") == 0) {
        const char *beh = json_str(pt, "behavior");
        bool contiguous = beh && strcmp(beh, "Contiguous") == 0;
        return add_regex(l, contiguous ? "[\\p{P}\\$\\+<=>\\^~\\|`]+" : "[\\p{P}\\$\\+<=>\\^~\\|`]");
    }
    return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer type \"%s\"", type);
}

static int32_t find_text(const char **tok, int n, const char *s) {
    if (!s) return -1;
    for (int i = 0; i < n; i++) if (tok[i] && strcmp(tok[i], s) == 0) return i;
    return -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Reads a GPT-2 style merges.txt into "a b" lines. */
static FTUNE_MUST_USE ftune_status read_merges_txt(const char *path, char **buf, const char ***lines, int *n) {
    size_t size;
    ftune_status st = ft_read_file(path, buf, &size);
    if (st) return st;
    int cap = 1;
    for (size_t i = 0; i < size; i++) cap += (*buf)[i] == '\n';
    *lines = ft_calloc((size_t)cap, sizeof **lines);
    if (!*lines) return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path);
    *n = 0;
    char *p = *buf;
    while (p < *buf + size) {
        char *e = memchr(p, '\n', (size_t)(*buf + size - p));
        if (!e) e = *buf + size;
        *e = 0;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        if (*p && strncmp(p, "#version", 8) != 0) (*lines)[(*n)++] = p;
        p = e + 1;
    }
    return FTUNE_OK;
}

/* A present file beside tokenizer.json (never when parsing from memory). */
static bool have(const char *dir, const char *path) { return dir && ft_file_exists(path); }

/* From the files in dir, or (dir NULL) from tokenizer.json text alone,
 * `name` naming it in messages. */
static FTUNE_MUST_USE ftune_status hf_load(ftune_tokenizer **out, const char *dir, const char *text, size_t text_len,
                            const char *name) {
    *out = NULL;
    ftune_status st = FTUNE_OK;
    const char *d = dir ? dir : ".";
    char *p_tok = dir ? path_join(d, "tokenizer.json") : ft_strdup(name), *p_cfg = path_join(d, "tokenizer_config.json");
    char *p_gen = path_join(d, "generation_config.json"), *p_vocab = path_join(d, "vocab.json");
    char *p_merges = path_join(d, "merges.txt"), *p_stm = path_join(d, "special_tokens_map.json");
    cJSON *tj = NULL, *cfg = NULL, *gen = NULL, *vj = NULL, *stm = NULL;
    const char **tok = NULL, **mer = NULL, **mer_r = NULL;
    int *types = NULL, n = 0, n_mer = 0;
    uint8_t *strip = NULL;
    char *merges_buf = NULL;
    regex_list rl = {0};
    int32_t eog[16];
    int n_eog = 0;
    char **placeholders = NULL, *jinja = NULL;
    if (!p_tok || !p_cfg || !p_gen || !p_vocab || !p_merges || !p_stm) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }

    ft_vocab_spec spec;
    spec_init(&spec, FT_TOK_BPE);
    const cJSON *vocab, *model = NULL;
    const char *src;
    if (!dir || ft_file_exists(p_tok)) {
        src = p_tok;
        if (!dir) {
            if (!(tj = cJSON_ParseWithLength(text, text_len))) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: invalid JSON", p_tok);
                goto done;
            }
        } else if (!(tj = read_json(p_tok, &st))) goto done;
        model = cJSON_GetObjectItemCaseSensitive(tj, "model");
        const char *mt = json_str(model, "type");
        if (!cJSON_IsObject(model) || (mt && strcmp(mt, "BPE") != 0)) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: model type \"%s\" (only BPE is supported)", p_tok, mt ? mt : "?");
            goto done;
        }
        vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    } else if (have(dir, p_vocab) && have(dir, p_merges)) {
        src = p_vocab;
        if (!(vj = read_json(p_vocab, &st))) goto done;
        vocab = vj;
    } else {
        st = ft_err(FTUNE_ERR_IO, "%s: no tokenizer.json (nor vocab.json + merges.txt)", dir);
        goto done;
    }
    if (!cJSON_IsObject(vocab)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: no vocab object", src); goto done; }
    /* added tokens alone (specials) cannot encode text: every piece would be <unk> */
    int n_vocab_entries = cJSON_GetArraySize(vocab);
    if (n_vocab_entries == 0) { st = ft_err(FTUNE_ERR_FORMAT, "%s: the vocab is empty", src); goto done; }
    if (have(dir, p_cfg) && !(cfg = read_json(p_cfg, &st))) goto done;
    if (have(dir, p_gen) && !(gen = read_json(p_gen, &st))) goto done;
    if (!cfg && have(dir, p_stm) && !(stm = read_json(p_stm, &st))) goto done;

    /* vocabulary size: the largest id in vocab and added tokens */
    const cJSON *it, *added = tj ? cJSON_GetObjectItemCaseSensitive(tj, "added_tokens") : NULL;
    const cJSON *added_dec = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL;
    long max_id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (1 << 24) || it->valuedouble != (double)(long)it->valuedouble) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: vocab entry \"%.40s\" has a bad id", src, it->string ? it->string : "");
            goto done;
        }
        if ((long)it->valuedouble > max_id) max_id = (long)it->valuedouble;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 24) || !json_str(it, "content")) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: bad added_tokens entry", src);
            goto done;
        }
        if ((long)id->valuedouble > max_id) max_id = (long)id->valuedouble;
    }
    cJSON_ArrayForEach(it, added_dec) {
        char *end;
        long id = it->string ? strtol(it->string, &end, 10) : -1;
        if (id < 0 || id >= (1 << 24) || *end || !json_str(it, "content")) continue;
        if (id > max_id) max_id = id;
    }
    n = (int)max_id + 1;
    if (n <= 0) { st = ft_err(FTUNE_ERR_FORMAT, "%s: empty vocabulary", src); goto done; }
    /* ids between the named ones become placeholders; a file whose largest
     * id leaves most of the range unnamed is damaged (real vocabularies
     * are dense, with at most a few hundred unnamed ids), and would cost
     * memory and time in proportion to that id */
    long n_named = (long)n_vocab_entries + cJSON_GetArraySize(added) + cJSON_GetArraySize(added_dec);
    if ((long)n > 2 * n_named + 1024) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: the largest token id is %ld, but only %ld tokens are named: ids are expected "
                    "to be dense (0..%ld)", src, max_id, n_named, n_named - 1);
        goto done;
    }
    tok = ft_calloc((size_t)n, sizeof *tok);
    types = ft_calloc((size_t)n, sizeof *types);
    placeholders = ft_calloc((size_t)n, sizeof *placeholders);
    strip = ft_calloc((size_t)n, 1);
    if (!tok || !types || !placeholders || !strip) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    /* Two tokens with one id, or one token with two ids, make encode and
     * decode disagree. Hugging Face tokenizers keeps one of them silently;
     * here that is an error naming both. */
    cJSON_ArrayForEach(it, vocab) {
        int id = (int)it->valuedouble;
        if (tok[id]) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: vocab entries \"%.40s\" and \"%.40s\" have the same id %d", src, tok[id],
                        it->string, id);
            goto done;
        }
        tok[id] = it->string;
        types[id] = FT_TOKTYPE_NORMAL;
    }
    if (n_vocab_entries > 1) {
        const char **sorted = ft_calloc((size_t)n_vocab_entries, sizeof *sorted);
        if (!sorted) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
        int k = 0;
        cJSON_ArrayForEach(it, vocab) sorted[k++] = it->string;
        qsort(sorted, (size_t)k, sizeof *sorted, cmp_str);
        for (int i = 1; i < k; i++)
            if (strcmp(sorted[i - 1], sorted[i]) == 0) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: vocab entry \"%.40s\" appears twice", src, sorted[i]);
                break;
            }
        free(sorted);
        if (st) goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *list = pass == 0 ? added_dec : added;
        cJSON_ArrayForEach(it, list) {
            long id;
            if (pass == 0) { char *end; id = it->string ? strtol(it->string, &end, 10) : -1; if (id < 0 || id >= n || *end) continue; }
            else id = (long)cJSON_GetObjectItemCaseSensitive(it, "id")->valuedouble;
            const char *content = json_str(it, "content");
            if (!content) continue;
            tok[id] = content;
            types[id] = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(it, "special")) ? FT_TOKTYPE_USER_DEFINED : FT_TOKTYPE_CONTROL;
            strip[id] = (uint8_t)(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "lstrip")) |
                                  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "rstrip")) << 1);
        }
    }
    for (int i = 0; i < n; i++)
        if (!tok[i]) { /* a hole in the ids: a token that never matches */
            char b[32];
            snprintf(b, sizeof b, "[UNUSED_%d]", i);
            if (!(placeholders[i] = ft_strdup(b))) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
            tok[i] = placeholders[i];
            types[i] = FT_TOKTYPE_UNUSED;
        }

    /* merges */
    if (model) {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(model, "merges");
        if (!cJSON_IsArray(ms)) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: model.merges is %s", src, ms ? "not a list" : "missing");
            goto done;
        }
        int cnt = cJSON_GetArraySize(ms);
        mer = ft_calloc((size_t)(cnt > 0 ? cnt : 1), sizeof *mer);
        mer_r = ft_calloc((size_t)(cnt > 0 ? cnt : 1), sizeof *mer_r);
        if (!mer || !mer_r) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
        bool pairs = false;
        cJSON_ArrayForEach(it, ms) {
            if (cJSON_IsString(it)) { /* "a b": exactly two pieces, as Hugging Face splits it */
                const char *sp = strchr(it->valuestring, ' ');
                if (!sp || sp == it->valuestring || !sp[1] || strchr(sp + 1, ' ')) {
                    st = ft_err(FTUNE_ERR_FORMAT, "%s: merge %d \"%.60s\" is not two pieces separated by one space",
                                src, n_mer, it->valuestring);
                    goto done;
                }
                mer[n_mer++] = it->valuestring;
                continue;
            }
            const cJSON *l = cJSON_GetArrayItem(it, 0), *r = cJSON_GetArrayItem(it, 1);
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !cJSON_IsString(l) || !cJSON_IsString(r)) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", src, n_mer);
                goto done;
            }
            mer[n_mer] = l->valuestring; mer_r[n_mer++] = r->valuestring;
            pairs = true;
        }
        if (pairs) for (int i = 0; i < n_mer; i++) if (!mer_r[i]) { st = ft_err(FTUNE_ERR_FORMAT, "%s: mixed merge formats", src); goto done; }
        spec.merges_right = pairs ? mer_r : NULL;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"))) spec.ignore_merges = 1;
    } else {
        if ((st = read_merges_txt(p_merges, &merges_buf, &mer, &n_mer))) goto done;
    }
    spec.merges = mer;
    spec.n_merges = n_mer;
    spec.strict_merges = 1;

    /* byte-level or SentencePiece-style? */
    if (tj) {
        const cJSON *norm = cJSON_GetObjectItemCaseSensitive(tj, "normalizer");
        spec.nfc = json_find_type(norm, "NFC") != NULL;
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer");
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(tj, "decoder");
        bool bytelevel = json_find_type(pt, "ByteLevel") || json_find_type(dec, "ByteLevel");
        const cJSON *meta = json_find_type(pt, "Metaspace");
        const cJSON *prep = json_find_type(norm, "Prepend");
        const cJSON *repl = json_find_type(norm, "Replace");
        if (bytelevel) {
            if ((st = hf_pre_regexes(pt, &rl))) { ft_err_prefix(st, "%s", src); goto done; }
            spec.pre_regexes = (const char *const *)rl.re;
            spec.n_pre_regexes = rl.n;
            if (rl.n == 0) spec.pre = "none";
        } else if (meta || repl || prep || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
            spec.kind = FT_TOK_SPM;
            const char *pp = prep ? json_str(prep, "prepend") : NULL;
            const char *scheme = meta ? json_str(meta, "prepend_scheme") : NULL;
            spec.add_space_prefix = (pp && strcmp(pp, "\xe2\x96\x81") == 0) ||
                                    (meta && (scheme ? strcmp(scheme, "never") != 0
                                                     : !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(meta, "add_prefix_space"))));
        } else {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: neither a byte-level nor a SentencePiece-style BPE", src);
            goto done;
        }
        spec.unk_id = find_text(tok, n, json_str(model, "unk_token"));
    } else {
        spec.pre = "gpt-2";
    }

    /* special tokens and defaults */
    const cJSON *names = cfg ? cfg : stm;
    if (names) {
        static const char *const keys[] = { "bos_token", "eos_token", "unk_token", "pad_token" };
        int32_t *dst[] = { &spec.bos_id, &spec.eos_id, &spec.unk_id, &spec.pad_id };
        for (int k = 0; k < 4; k++) {
            int32_t id = find_text(tok, n, config_token(names, keys[k]));
            if (id < 0) continue;
            *dst[k] = id;
            if (types[id] == FT_TOKTYPE_NORMAL && !tj) types[id] = FT_TOKTYPE_CONTROL; /* vocab.json has no added tokens */
        }
    }
    const cJSON *ab = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") : NULL;
    const cJSON *ae = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token") : NULL;
    if (cJSON_IsBool(ab)) spec.add_bos = cJSON_IsTrue(ab);
    else if (tj) { /* else what the post-processor template adds */
        const cJSON *tp = json_find_type(cJSON_GetObjectItemCaseSensitive(tj, "post_processor"), "TemplateProcessing");
        const cJSON *first = tp ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tp, "single"), 0) : NULL;
        const cJSON *stk = first ? cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") : NULL;
        int32_t id = stk ? find_text(tok, n, json_str(stk, "id")) : -1;
        if (id >= 0) { spec.add_bos = 1; if (spec.bos_id < 0) spec.bos_id = id; }
    }
    if (cJSON_IsBool(ae)) spec.add_eos = cJSON_IsTrue(ae);
    if (gen) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(gen, "bos_token_id");
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id");
        if (cJSON_IsNumber(b) && spec.bos_id < 0 && b->valuedouble >= 0 && b->valuedouble < n) spec.bos_id = (int32_t)b->valuedouble;
        if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < n) eog[n_eog++] = (int32_t)e->valuedouble;
        const cJSON *elist = cJSON_IsArray(e) ? e : NULL;
        cJSON_ArrayForEach(it, elist)
            if (cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < n && n_eog < 16) eog[n_eog++] = (int32_t)it->valuedouble;
        if (spec.eos_id < 0 && n_eog > 0) spec.eos_id = eog[0];
        spec.eog_ids = eog;
        spec.n_eog_ids = n_eog;
    }
    /* the chat template: tokenizer_config.json's (a string, or a list of
     * named ones: "default"), else chat_template.jinja (transformers 5 saves it there) */
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (cJSON_IsString(ct)) {
        spec.chat_template = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        cJSON_ArrayForEach(it, ct) {
            const char *tn = json_str(it, "name"), *tt = json_str(it, "template");
            if (!tt) continue;
            if (!spec.chat_template || (tn && strcmp(tn, "default") == 0)) spec.chat_template = tt;
        }
    }
    if (!spec.chat_template && dir) {
        char *p_jinja = path_join(d, "chat_template.jinja");
        if (!p_jinja) { st = ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
        size_t jl;
        if (ft_file_exists(p_jinja) && (st = ft_read_file(p_jinja, &jinja, &jl))) { free(p_jinja); goto done; }
        free(p_jinja);
        spec.chat_template = jinja;
    }
    spec.n_vocab = n;
    spec.tokens = tok;
    spec.types = types;
    spec.strip = strip;
    st = ft_tokenizer_build(out, &spec);
    if (st) ft_err_prefix(st, "%s", src);
done:
    for (int i = 0; i < rl.n; i++) free(rl.re[i]);
    if (placeholders) for (int i = 0; i < n; i++) free(placeholders[i]);
    free(placeholders);
    free(tok); free(types); free(strip); free(mer); free(mer_r); free(merges_buf); free(jinja);
    cJSON_Delete(tj); cJSON_Delete(cfg); cJSON_Delete(gen); cJSON_Delete(vj); cJSON_Delete(stm);
    free(p_tok); free(p_cfg); free(p_gen); free(p_vocab); free(p_merges); free(p_stm);
    return st;
}

ftune_status ft_tokenizer_from_hf_dir(ftune_tokenizer **out, const char *dir) {
    if (!out || !dir) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_hf_dir: NULL argument");
    return hf_load(out, dir, NULL, 0, NULL);
}

ftune_status ft_tokenizer_from_hf_json(ftune_tokenizer **out, const char *text, size_t len, const char *name) {
    if (!out || !text || !name) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_from_hf_json: NULL argument");
    return hf_load(out, NULL, text, len, name);
}

/* ------------------------------------------------------------- by path */

/* tiktoken files are lines of "<base64> <rank>"; SentencePiece ones are protobuf. */
static bool looks_like_tiktoken(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char line[512];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return false;
    char *sp = strchr(line, ' ');
    if (!sp || sp == line) return false;
    for (char *p = line; p < sp; p++) if (b64_value((unsigned char)*p) < 0 && *p != '=') return false;
    char *p = sp + 1;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') p++;
    return *p == '\n' || *p == '\r' || *p == 0;
}

ftune_status ft_tokenizer_load_path(ftune_tokenizer **out, const char *path) {
    if (!out || !path) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_load_path: NULL argument");
    *out = NULL;
    if (ft_is_dir(path)) {
        static const char *const names[] = { "tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer.bin" };
        for (int k = 0; k < 4; k++) {
            char *p = path_join(path, names[k]);
            if (!p) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
            bool ex = ft_file_exists(p);
            ftune_status st = FTUNE_OK;
            if (ex) st = k < 2 ? ft_tokenizer_from_hf_dir(out, path) : ft_tokenizer_load_path(out, p);
            free(p);
            if (ex) return st;
        }
        return ft_err(FTUNE_ERR_IO, "%s: no tokenizer.json, vocab.json, tokenizer.model or tokenizer.bin", path);
    }
    if (!ft_file_exists(path)) return ft_err(FTUNE_ERR_IO, "%s: no such file", path);
    if (ends_with(path, ".gguf")) {
        gguf_file g;
        ftune_status st = ft_gguf_open(&g, path);
        if (st) return st;
        st = ft_tokenizer_from_gguf(out, &g);
        if (st) ft_err_prefix(st, "%s", path);
        ft_gguf_close(&g);
        return st;
    }
    if (ends_with(path, ".json")) {
        char *dir = ft_strdup(path);
        if (!dir) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else strcpy(dir, ".");
        ftune_status st = ft_tokenizer_from_hf_dir(out, dir);
        free(dir);
        return st;
    }
    if (ends_with(path, ".bin")) return ft_tokenizer_from_llama2c(out, path, 0);
    if (looks_like_tiktoken(path)) return ft_tokenizer_from_tiktoken(out, path);
    return ft_tokenizer_from_spm_model(out, path);
}

ftune_status ftune_tokenizer_load(ftune_tokenizer **out, const char *path) {
    return ft_tokenizer_load_path(out, path);
}
void ftune_tokenizer_free(ftune_tokenizer *t) { ft_tokenizer_free(t); }
const char *ftune_tokenizer_kind(const ftune_tokenizer *t) { return ft_tokenizer_kind(t) == FT_TOK_SPM ? "spm" : "bpe"; }
