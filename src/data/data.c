/* data.c — dataset readers (JSONL, JSON array, plain text), tokenization
 * with loss masks, the validation split, and the batch iterator (seeded
 * epoch order, dynamic padding, packing with per-example positions and
 * document ids). Chat templates live in chat_template.c. */
#include "data/data.h"
#include "core/mem.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TRY(x) do { ftune_status st_ = (x); if (st_) return st_; } while (0)

static FTUNE_MUST_USE ftune_status nomem(void) { return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }

/* ------------------------------------------------------------ segments */

void ft_segments_clear(ft_segments *s) {
    s->len = 0;
    s->n = 0;
    if (s->text) s->text[0] = 0;
}

void ft_segments_free(ft_segments *s) {
    free(s->text);
    free(s->segs);
    memset(s, 0, sizeof *s);
}

static FTUNE_MUST_USE ftune_status seg_push(ft_segments *s, ft_seg g) {
    if (s->n == s->cap_segs) {
        int cap = s->cap_segs ? 2 * s->cap_segs : 16;
        ft_seg *p = realloc(s->segs, (size_t)cap * sizeof *p);
        if (!p) return nomem();
        s->segs = p;
        s->cap_segs = cap;
    }
    s->segs[s->n++] = g;
    return FTUNE_OK;
}

ftune_status ft_segments_text(ft_segments *s, bool train, const char *text, size_t len) {
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + len + 1) cap *= 2;
        char *p = realloc(s->text, cap);
        if (!p) return nomem();
        s->text = p;
        s->cap = cap;
    }
    if (len) memcpy(s->text + s->len, text, len);
    size_t off = s->len;
    s->len += len;
    s->text[s->len] = 0;
    if (len == 0) return FTUNE_OK;
    ft_seg *last = s->n ? &s->segs[s->n - 1] : NULL;
    if (last && last->kind == FT_SEG_TEXT && last->train == train && last->off + last->len == off) {
        last->len += len;
        return FTUNE_OK;
    }
    return seg_push(s, (ft_seg){ .kind = FT_SEG_TEXT, .train = train, .off = off, .len = len });
}

ftune_status ft_segments_str(ft_segments *s, bool train, const char *text) {
    return ft_segments_text(s, train, text, strlen(text));
}

ftune_status ft_segments_special(ft_segments *s, ft_seg_kind kind, bool train) {
    return seg_push(s, (ft_seg){ .kind = kind, .train = train, .off = s->len, .len = 0 });
}

/* A growable (ids, mask) pair. */
typedef struct { int32_t *ids; uint8_t *mask; size_t n, cap; } tokbuf;

static FTUNE_MUST_USE ftune_status tokbuf_push(tokbuf *b, const int32_t *ids, size_t n, bool train) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        int32_t *pi = realloc(b->ids, cap * sizeof *pi);
        if (!pi) return nomem();
        b->ids = pi;
        uint8_t *pm = realloc(b->mask, cap);
        if (!pm) return nomem();
        b->mask = pm;
        b->cap = cap;
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    memset(b->mask + b->n, train ? 1 : 0, n);
    b->n += n;
    return FTUNE_OK;
}

/* Tokens of run's first len bytes: with the previous run as left context
 * when that reproduces the context's own tokens as a prefix, else alone. */
static FTUNE_MUST_USE ftune_status tokenize_run(const ft_data_tokenizer *tk, const char *text, const ft_seg *prev,
                                 const ft_seg *run, size_t len, tokbuf *out) {
    int32_t *full = NULL, *ctx = NULL;
    size_t n_full = 0, n_ctx = 0;
    ftune_status st;
    if (prev) {
        st = tk->tokenize(tk->ctx, text + prev->off, prev->len + len, &full, &n_full);
        if (st) return st;
        st = tk->tokenize(tk->ctx, text + prev->off, prev->len, &ctx, &n_ctx);
        if (st) { free(full); return st; }
        if (n_ctx < n_full && memcmp(ctx, full, n_ctx * sizeof *ctx) == 0) {
            st = tokbuf_push(out, full + n_ctx, n_full - n_ctx, run->train);
            free(full);
            free(ctx);
            return st;
        }
        free(full);
        free(ctx);
        full = NULL;
    }
    st = tk->tokenize(tk->ctx, text + run->off, len, &full, &n_full);
    if (st) return st;
    st = tokbuf_push(out, full, n_full, run->train);
    free(full);
    return st;
}

/* Bounded tokenization. A record is cut to ctx_len tokens anyway, so only
 * a prefix of a long field needs tokenizing. Cutting the text at byte b
 * and tokenizing text[0..b) gives exactly the first tokens of the whole
 * text's tokenization when no token and no pre-tokenizer piece spans b. We
 * cut only where none does for the tokenizers we load:
 *   - just after a '\n' followed by a non-space byte (as plain text's
 *     blocks): the GPT-2/Llama-3 pre-tokenizer patterns end a newline run
 *     there and start a new piece, and SentencePiece vocabularies have no
 *     piece with a newline inside;
 *   - between an ASCII letter and " " + ASCII letter: byte-level BPE
 *     pre-tokenizers start a new piece at " x", and SentencePiece pieces
 *     carry U+2581 (the space) only at their start, so none contains "a b".
 * The cut is at an ASCII byte, so normalizers (NFC/NFKC, the prefix space)
 * treat both sides as they treat the whole. Then the prefix's tokens equal
 * the whole's up to b, and if the prefix already yields enough tokens to
 * exceed the limit the rest cannot change the truncated example, its
 * truncation or drop, or its targets (the caller is told whether any
 * target would follow). Where no safe cut exists the whole run is
 * tokenized. ft_dataset_opts.tokenize_all turns this off; the tests check
 * both paths give identical datasets on real data and tokenizers. */
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static size_t safe_cut(const char *t, size_t len, size_t want) {
    for (size_t i = want < 1 ? 1 : want; i + 1 < len; i++) {
        if (t[i - 1] == '\n' && !isspace((unsigned char)t[i])) return i;
        if (t[i] == ' ' && is_alpha(t[i - 1]) && is_alpha(t[i + 1])) return i;
    }
    return len;
}

/* Tokens of a run, stopping early (on a safe cut) once it has yielded at
 * least need tokens; *cut is set when bytes were left untokenized. */
static FTUNE_MUST_USE ftune_status tokenize_run_bounded(const ft_data_tokenizer *tk, const char *text, const ft_seg *prev,
                                         const ft_seg *run, size_t need, tokbuf *out, bool *cut) {
    *cut = false;
    /* bytes to try first: generous for a few bytes per token; grows 4x */
    size_t want = need > ((size_t)1 << 40) ? run->len : 64 * need + 256;
    while (want < run->len) {
        size_t b = safe_cut(text + run->off, run->len, want);
        if (b >= run->len) break;
        size_t n0 = out->n;
        TRY(tokenize_run(tk, text, prev, run, b, out));
        if (out->n - n0 >= need) { *cut = true; return FTUNE_OK; }
        out->n = n0;
        want = b * 4;
    }
    return tokenize_run(tk, text, prev, run, run->len, out);
}

/* limit: stop once the tokens (or with by_targets, the tokens trained on)
 * exceed it; SIZE_MAX tokenizes everything. *more_targets: whether a token
 * trained on would have followed where it stopped. */
static FTUNE_MUST_USE ftune_status segments_tokenize(const ft_segments *s, const ft_data_tokenizer *tk, size_t limit, bool by_targets,
                                      int32_t **ids, uint8_t **mask, size_t *n, bool *more_targets) {
    *ids = NULL;
    *mask = NULL;
    *n = 0;
    *more_targets = false;
    tokbuf b = {0};
    ftune_status st = FTUNE_OK;
    size_t n_train = 0;
    int i = 0;
    for (; i < s->n && !st; i++) {
        size_t have = by_targets ? n_train : b.n;
        if (limit != SIZE_MAX && have > limit) break;
        const ft_seg *g = &s->segs[i];
        size_t n0 = b.n;
        if (g->kind == FT_SEG_TEXT) {
            if (g->len == 0) continue;
            const ft_seg *prev = NULL;
            if (i > 0 && s->segs[i - 1].kind == FT_SEG_TEXT && s->segs[i - 1].len > 0 &&
                s->segs[i - 1].off + s->segs[i - 1].len == g->off)
                prev = &s->segs[i - 1];
            bool cut = false;
            if (limit == SIZE_MAX || (by_targets && !g->train)) st = tokenize_run(tk, s->text, prev, g, g->len, &b);
            else st = tokenize_run_bounded(tk, s->text, prev, g, limit + 1 - have, &b, &cut);
            if (cut && g->train) *more_targets = true;
        } else {
            int32_t id = g->kind == FT_SEG_BOS ? tk->bos_id : tk->eos_id;
            if (id >= 0) st = tokbuf_push(&b, &id, 1, g->train);
        }
        if (g->train) n_train += b.n - n0;
    }
    for (; i < s->n && !*more_targets; i++) {
        const ft_seg *g = &s->segs[i];
        int32_t id = g->kind == FT_SEG_BOS ? tk->bos_id : tk->eos_id;
        *more_targets = g->train && (g->kind == FT_SEG_TEXT ? g->len > 0 : id >= 0);
    }
    if (st) { free(b.ids); free(b.mask); return st; }
    *ids = b.ids;
    *mask = b.mask;
    *n = b.n;
    return FTUNE_OK;
}

ftune_status ft_segments_tokenize(const ft_segments *s, const ft_data_tokenizer *tk,
                                  int32_t **ids, uint8_t **mask, size_t *n) {
    bool more;
    return segments_tokenize(s, tk, SIZE_MAX, false, ids, mask, n, &more);
}

/* ------------------------------------------------------------ formats */

static const char *const format_names[] = {
    [FT_FMT_AUTO] = "auto", [FT_FMT_TEXT] = "text", [FT_FMT_COMPLETION] = "completion",
    [FT_FMT_ALPACA] = "alpaca", [FT_FMT_CHAT] = "chat", [FT_FMT_PLAIN] = "plain",
};

const char *ft_data_format_name(ft_data_format f) {
    return (f >= FT_FMT_AUTO && f <= FT_FMT_PLAIN) ? format_names[f] : "?";
}

ftune_status ft_data_format_from_name(ft_data_format *out, const char *name) {
    for (int f = FT_FMT_AUTO; f <= FT_FMT_PLAIN; f++)
        if (name && strcasecmp(name, format_names[f]) == 0) { *out = (ft_data_format)f; return FTUNE_OK; }
    return ft_err(FTUNE_ERR_ARG, "unknown data format \"%s\" (expected auto, text, completion, alpaca, chat, plain)",
                  name ? name : "");
}

void ft_dataset_opts_default(ft_dataset_opts *o) {
    memset(o, 0, sizeof *o);
    o->format = FT_FMT_AUTO;
    o->ctx_len = 512;
}

/* ------------------------------------------------------------ dataset storage */

void ft_dataset_free(ft_dataset *ds) {
    if (!ds) return;
    free(ds->path);
    ft_mem_free(FT_MEM_DATA, ds->tokens, (size_t)ds->cap_tok * sizeof *ds->tokens);
    ft_mem_free(FT_MEM_DATA, ds->mask, (size_t)ds->cap_tok);
    free(ds->off);
    free(ds->line);
    free(ds);
}

static FTUNE_MUST_USE ftune_status dataset_new(ft_dataset **out, const char *name) {
    ft_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return nomem();
    ds->path = ft_strdup(name ? name : "");
    ds->off = calloc(1, sizeof *ds->off);
    if (!ds->path || !ds->off) { ft_dataset_free(ds); return nomem(); }
    *out = ds;
    return FTUNE_OK;
}

static int64_t count_targets(const uint8_t *mask, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 1; i < n; i++) c += mask[i];
    return c;
}

/* Appends an example as is (no length policy). */
static FTUNE_MUST_USE ftune_status dataset_append(ft_dataset *ds, const int32_t *ids, const uint8_t *mask, int64_t n, int line) {
    if (ds->n == ds->cap_ex) {
        int cap = ds->cap_ex ? 2 * ds->cap_ex : 64;
        int64_t *po = realloc(ds->off, (size_t)(cap + 1) * sizeof *po);
        if (!po) return nomem();
        ds->off = po;
        int *pl = realloc(ds->line, (size_t)cap * sizeof *pl);
        if (!pl) return nomem();
        ds->line = pl;
        ds->cap_ex = cap;
    }
    int64_t used = ds->off[ds->n];
    if (used + n > ds->cap_tok) {
        int64_t cap = ds->cap_tok ? ds->cap_tok : 4096;
        while (cap < used + n) cap *= 2;
        /* both or neither: the counted sizes follow cap_tok */
        int32_t *pt = ft_mem_alloc(FT_MEM_DATA, (size_t)cap * sizeof *pt);
        uint8_t *pm = ft_mem_alloc(FT_MEM_DATA, (size_t)cap);
        if (!pt || !pm) {
            ft_mem_free(FT_MEM_DATA, pt, (size_t)cap * sizeof *pt);
            ft_mem_free(FT_MEM_DATA, pm, (size_t)cap);
            return nomem();
        }
        if (used) { memcpy(pt, ds->tokens, (size_t)used * sizeof *pt); memcpy(pm, ds->mask, (size_t)used); }
        ft_mem_free(FT_MEM_DATA, ds->tokens, (size_t)ds->cap_tok * sizeof *ds->tokens);
        ft_mem_free(FT_MEM_DATA, ds->mask, (size_t)ds->cap_tok);
        ds->tokens = pt;
        ds->mask = pm;
        ds->cap_tok = cap;
    }
    memcpy(ds->tokens + used, ids, (size_t)n * sizeof *ids);
    memcpy(ds->mask + used, mask, (size_t)n);
    ds->line[ds->n] = line;
    ds->off[++ds->n] = used + n;
    ds->stats.n_tokens += n;
    ds->stats.n_targets += count_targets(mask, n);
    if (n > ds->stats.max_len) ds->stats.max_len = (int)n;
    return FTUNE_OK;
}

/* Cuts an example of n > T tokens to T in place, by o->truncate; returns T. */
static int64_t truncate_example(const ft_dataset_opts *o, int32_t bos_id, int32_t *ids, uint8_t *mask, int64_t n) {
    int64_t T = o->ctx_len;
    if (o->truncate == FT_TRUNC_PROMPT) {
        int64_t excess = n - T, w = 0;
        for (int64_t i = 0; i < n; i++) {
            /* a prompt token goes while there is excess, except a leading BOS */
            bool drop = excess > 0 && !mask[i] && !(i == 0 && bos_id >= 0 && ids[0] == bos_id);
            if (drop) { excess--; continue; }
            ids[w] = ids[i];
            mask[w] = mask[i];
            w++;
        }
        n = w;
    }
    return n > T ? T : n;
}

/* Applies the length policy (truncate or drop), drops examples without a
 * target, and appends. ids and mask may be changed. */
static FTUNE_MUST_USE ftune_status dataset_add(ft_dataset *ds, const ft_dataset_opts *o, int32_t bos_id, int32_t *ids,
                                uint8_t *mask, int64_t n, bool more_targets, int line) {
    int64_t before = count_targets(mask, n);
    if (before == 0 && !more_targets) { ds->stats.n_dropped_empty++; return FTUNE_OK; }
    if (n > o->ctx_len) {
        if (o->drop_long) { ds->stats.n_dropped_long++; return FTUNE_OK; }
        ds->stats.n_truncated++;
        n = truncate_example(o, bos_id, ids, mask, n);
        int64_t after = count_targets(mask, n);
        if (after == 0) { ds->stats.n_truncated_empty++; return FTUNE_OK; }
    }
    return dataset_append(ds, ids, mask, n, line);
}

/* ------------------------------------------------------------ JSON records */

static const char *json_type(const cJSON *x) {
    if (!x) return "nothing";
    if (cJSON_IsString(x)) return "a string";
    if (cJSON_IsNumber(x)) return "a number";
    if (cJSON_IsBool(x)) return "a boolean";
    if (cJSON_IsNull(x)) return "null";
    if (cJSON_IsArray(x)) return "an array";
    if (cJSON_IsObject(x)) return "an object";
    return "an invalid value";
}

/* The string field `name` of rec; optional fields may be absent or null. */
static FTUNE_MUST_USE ftune_status get_str(const cJSON *rec, const char *name, bool optional, const char **out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(rec, name);
    *out = NULL;
    if (!x || (optional && cJSON_IsNull(x))) {
        if (optional) return FTUNE_OK;
        return ft_err(FTUNE_ERR_FORMAT, "field \"%s\" missing", name);
    }
    if (!cJSON_IsString(x)) return ft_err(FTUNE_ERR_FORMAT, "field \"%s\": expected a string, got %s", name, json_type(x));
    *out = x->valuestring;
    return FTUNE_OK;
}

static bool has(const cJSON *rec, const char *name) { return cJSON_GetObjectItemCaseSensitive(rec, name) != NULL; }

static const char *prompt_key(const ft_dataset_opts *o) { return o->prompt_key ? o->prompt_key : "prompt"; }
static const char *completion_key(const ft_dataset_opts *o) { return o->completion_key ? o->completion_key : "completion"; }

static ft_data_format detect_format(const cJSON *rec, const ft_dataset_opts *o) {
    if (has(rec, "messages")) return FT_FMT_CHAT;
    if (has(rec, "instruction") && has(rec, "output")) return FT_FMT_ALPACA;
    if (has(rec, prompt_key(o)) && has(rec, completion_key(o))) return FT_FMT_COMPLETION;
    if (has(rec, "text")) return FT_FMT_TEXT;
    return FT_FMT_AUTO;
}

/* State shared by the readers. */
typedef struct {
    ft_dataset *ds;
    const ft_data_tokenizer *tk;
    ft_dataset_opts o;
    ft_segments seg;
    ft_chat_msg *msgs;
    int cap_msgs;
    size_t total;            /* input bytes, for progress */
} loader;

/* A prompt/completion record in the chat format: one user turn and one
 * assistant turn (GSM8K's question/answer with --format chat). */
static FTUNE_MUST_USE ftune_status pair_as_chat(loader *L, const cJSON *rec) {
    const char *p, *c;
    TRY(get_str(rec, prompt_key(&L->o), false, &p));
    TRY(get_str(rec, completion_key(&L->o), false, &c));
    if (L->cap_msgs < 2) {
        ft_chat_msg *m = realloc(L->msgs, 2 * sizeof *m);
        if (!m) return nomem();
        L->msgs = m;
        L->cap_msgs = 2;
    }
    L->msgs[0] = (ft_chat_msg){ .role = FT_ROLE_USER, .content = p };
    L->msgs[1] = (ft_chat_msg){ .role = FT_ROLE_ASSISTANT, .content = c };
    if (L->tk->add_bos && !ft_chat_template_has_bos(L->o.chat_template))
        TRY(ft_segments_special(&L->seg, FT_SEG_BOS, false));
    return ft_chat_render(&L->seg, L->o.chat_template, L->o.chat_system, L->msgs, 2, false, L->o.train_on_prompt);
}

static FTUNE_MUST_USE ftune_status chat_segments(loader *L, const cJSON *rec) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(rec, "messages");
    if (!arr && has(rec, prompt_key(&L->o)) && has(rec, completion_key(&L->o))) return pair_as_chat(L, rec);
    if (!arr)
        return ft_err(FTUNE_ERR_FORMAT, "field \"messages\" missing (nor \"%s\"/\"%s\" to make a user and an assistant turn of)",
                      prompt_key(&L->o), completion_key(&L->o));
    if (!cJSON_IsArray(arr))
        return ft_err(FTUNE_ERR_FORMAT, "field \"messages\": expected an array, got %s", json_type(arr));
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return ft_err(FTUNE_ERR_FORMAT, "field \"messages\": empty list");
    if (n > L->cap_msgs) {
        ft_chat_msg *p = realloc(L->msgs, (size_t)n * sizeof *p);
        if (!p) return nomem();
        L->msgs = p;
        L->cap_msgs = n;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        if (!cJSON_IsObject(m))
            return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d]: expected an object, got %s", i, json_type(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!role) return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d].role missing", i);
        if (!cJSON_IsString(role))
            return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d].role: expected a string, got %s", i, json_type(role));
        int r = ft_chat_role_parse(role->valuestring);
        if (r < 0)
            return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d].role: unknown role \"%.64s\" (expected system, user, assistant)",
                          i, role->valuestring);
        if (!content) return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d].content missing", i);
        if (!cJSON_IsString(content))
            return ft_err(FTUNE_ERR_FORMAT, "field \"messages\"[%d].content: expected a string, got %s", i,
                          json_type(content));
        L->msgs[i].role = (ft_chat_role)r;
        L->msgs[i].content = content->valuestring;
        i++;
    }
    if (L->tk->add_bos && !ft_chat_template_has_bos(L->o.chat_template))
        TRY(ft_segments_special(&L->seg, FT_SEG_BOS, false));
    return ft_chat_render(&L->seg, L->o.chat_template, L->o.chat_system, L->msgs, n, false, L->o.train_on_prompt);
}

/* Renders one record of the dataset's format into L->seg. */
static FTUNE_MUST_USE ftune_status record_segments(loader *L, const cJSON *rec) {
    ft_segments *s = &L->seg;
    bool all = L->o.train_on_prompt;
    if (!cJSON_IsObject(rec)) return ft_err(FTUNE_ERR_FORMAT, "expected a JSON object, got %s", json_type(rec));
    if (L->ds->format == FT_FMT_CHAT) return chat_segments(L, rec);
    const char *a = NULL, *b = NULL, *c = NULL;
    switch (L->ds->format) {
    case FT_FMT_TEXT: TRY(get_str(rec, "text", false, &a)); break;
    case FT_FMT_COMPLETION:
        TRY(get_str(rec, prompt_key(&L->o), false, &a));
        TRY(get_str(rec, completion_key(&L->o), false, &b));
        break;
    case FT_FMT_ALPACA:
        TRY(get_str(rec, "instruction", false, &a));
        TRY(get_str(rec, "input", true, &b));
        TRY(get_str(rec, "output", false, &c));
        break;
    default: return ft_err(FTUNE_ERR_ARG, "format %s is not a JSON record format", ft_data_format_name(L->ds->format));
    }
    if (L->tk->add_bos) TRY(ft_segments_special(s, FT_SEG_BOS, false));
    switch (L->ds->format) {
    case FT_FMT_TEXT: TRY(ft_segments_str(s, true, a)); break;
    case FT_FMT_COMPLETION:
        TRY(ft_segments_str(s, all, a));
        TRY(ft_segments_str(s, true, b));
        break;
    default: /* alpaca */
        TRY(ft_alpaca_prompt(s, all, a, b));
        TRY(ft_segments_str(s, true, c));
        break;
    }
    return ft_segments_special(s, FT_SEG_EOS, true);
}

/* Resolves the format from the first record, renders, tokenizes and adds
 * one record; errors get the "path:line: " prefix. */
static FTUNE_MUST_USE ftune_status add_record(loader *L, const cJSON *rec, int line) {
    ftune_status st = FTUNE_OK;
    L->ds->stats.n_records++;
    if (L->ds->format == FT_FMT_AUTO) {
        if (!cJSON_IsObject(rec))
            return ft_err(FTUNE_ERR_FORMAT, "%s:%d: expected a JSON object, got %s", L->ds->path, line, json_type(rec));
        L->ds->format = detect_format(rec, &L->o);
        if (L->ds->format == FT_FMT_AUTO)
            return ft_err(FTUNE_ERR_FORMAT,
                          "%s:%d: record has none of the known fields (\"text\", \"%s\"/\"%s\", "
                          "\"instruction\"/\"output\", \"messages\")",
                          L->ds->path, line, prompt_key(&L->o), completion_key(&L->o));
    }
    if (L->ds->format == FT_FMT_CHAT && L->o.chat_template == FT_CHAT_NONE)
        return ft_err(FTUNE_ERR_ARG, "%s: chat data needs a chat template (chatml, llama2, llama3, mistral, zephyr, alpaca)",
                      L->ds->path);
    ft_segments_clear(&L->seg);
    st = record_segments(L, rec);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    bool more = false;
    /* bounded by the context: see tokenize_run_bounded; with prompt-first
     * truncation the prompt's end matters, so only trained runs are bounded,
     * by the count of trained tokens (once there are more than ctx_len of
     * them every prompt token goes and the end is cut within them) */
    size_t limit = L->o.tokenize_all ? SIZE_MAX : (size_t)L->o.ctx_len;
    bool by_targets = L->o.truncate == FT_TRUNC_PROMPT;
    if (!st) st = segments_tokenize(&L->seg, L->tk, limit, by_targets, &ids, &mask, &n, &more);
    if (!st) st = dataset_add(L->ds, &L->o, L->tk->bos_id, ids, mask, (int64_t)n, more, line);
    free(ids);
    free(mask);
    if (st && st != FTUNE_ERR_NOMEM) return ft_err_prefix(st, "%s:%d", L->ds->path, line);
    return st;
}

static int line_of(const char *buf, const char *p) {
    int line = 1;
    for (const char *q = buf; q < p; q++) line += *q == '\n';
    return line;
}

static bool all_space(const char *p, const char *end) {
    for (; p < end; p++)
        if (!isspace((unsigned char)*p)) return false;
    return true;
}

/* The offset of the first NUL the JSON text p[0..n) would put in a string
 * (a raw 0 byte anywhere, or a \u0000 escape inside a string), or -1.
 * cJSON's strings are C strings, so such a string would be cut short. */
int64_t ft_json_nul_at(const char *p, size_t n) {
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == 0) return (int64_t)i;
        if (!in_str) { in_str = c == '"'; continue; }
        if (c == '"') in_str = false;
        else if (c == '\\' && i + 1 < n) {
            if (p[i + 1] == 'u' && i + 6 <= n && memcmp(p + i + 2, "0000", 4) == 0) return (int64_t)i;
            i++; /* the escaped character (a quote, a backslash, ...) */
        }
    }
    return -1;
}

static void report_progress(loader *L, size_t done) {
    if (L->o.progress) L->o.progress(L->o.progress_ctx, done, L->total);
}

static FTUNE_MUST_USE ftune_status load_jsonl(loader *L, const char *buf, size_t len) {
    const char *p = buf, *end = buf + len;
    int line = 0;
    while (p < end) {
        line++;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (!all_space(p, le)) {
            int64_t nul = ft_json_nul_at(p, (size_t)(le - p));
            if (nul >= 0)
                return ft_err(FTUNE_ERR_FORMAT, "%s:%d: a NUL character in the record (column %lld); text may not "
                              "contain NUL", L->ds->path, line, (long long)nul + 1);
            const char *parse_end = NULL;
            cJSON *rec = cJSON_ParseWithLengthOpts(p, (size_t)(le - p), &parse_end, 0);
            if (!rec) {
                long col = parse_end && parse_end >= p && parse_end <= le ? (long)(parse_end - p) + 1 : 1;
                return ft_err(FTUNE_ERR_FORMAT, "%s:%d: not valid JSON (column %ld)", L->ds->path, line, col);
            }
            if (parse_end && !all_space(parse_end, le)) {
                cJSON_Delete(rec);
                return ft_err(FTUNE_ERR_FORMAT, "%s:%d: text after the JSON value (column %ld); JSONL needs one object per line",
                              L->ds->path, line, (long)(parse_end - p) + 1);
            }
            ftune_status st = add_record(L, rec, line);
            cJSON_Delete(rec);
            if (st) return st;
            report_progress(L, (size_t)(le - buf));
        }
        p = le + 1;
    }
    return FTUNE_OK;
}

/* Line numbers of the top-level elements of a JSON array text (already
 * known to parse), in order. */
static FTUNE_MUST_USE ftune_status array_element_lines(const char *buf, size_t len, int **lines, int *n) {
    int cap = 64, k = 0, line = 1, depth = 0;
    int *out = malloc((size_t)cap * sizeof *out);
    if (!out) return nomem();
    bool in_str = false, esc = false, want = false;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '\n') line++;
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
            continue;
        }
        if (isspace((unsigned char)c)) continue;
        if (depth == 1 && want && c != ']') {
            if (k == cap) {
                int *q = realloc(out, (size_t)(cap *= 2) * sizeof *q);
                if (!q) { free(out); return nomem(); }
                out = q;
            }
            out[k++] = line;
            want = false;
        }
        if (c == '"') in_str = true;
        else if (c == '[' || c == '{') { depth++; if (depth == 1) want = true; }
        else if (c == ']' || c == '}') depth--;
        else if (c == ',' && depth == 1) want = true;
    }
    *lines = out;
    *n = k;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status load_json_array(loader *L, const char *buf, size_t len) {
    int64_t nul = ft_json_nul_at(buf, len);
    if (nul >= 0)
        return ft_err(FTUNE_ERR_FORMAT, "%s:%d: a NUL character in a record; text may not contain NUL", L->ds->path,
                      line_of(buf, buf + nul));
    const char *parse_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &parse_end, 0);
    if (!root) {
        int line = parse_end && parse_end >= buf && parse_end <= buf + len ? line_of(buf, parse_end) : 1;
        return ft_err(FTUNE_ERR_FORMAT, "%s:%d: not valid JSON", L->ds->path, line);
    }
    if (parse_end && !all_space(parse_end, buf + len)) {
        int line = line_of(buf, parse_end);
        cJSON_Delete(root);
        return ft_err(FTUNE_ERR_FORMAT, "%s:%d: text after the JSON array", L->ds->path, line);
    }
    int *lines = NULL, n_lines = 0;
    ftune_status st = array_element_lines(buf, len, &lines, &n_lines);
    if (st) { cJSON_Delete(root); return st; }
    int i = 0;
    const cJSON *rec;
    cJSON_ArrayForEach(rec, root) {
        int line = i < n_lines ? lines[i] : 1;
        st = add_record(L, rec, line);
        if (st) break;
        i++;
        report_progress(L, (size_t)len * (size_t)i / (size_t)(n_lines ? n_lines : 1));
    }
    free(lines);
    cJSON_Delete(root);
    return st;
}

/* Where to cut plain text into tokenization blocks: just after a newline
 * that is followed by a non-space byte, so that neither side's
 * pre-tokenization would have joined across the cut. */
static size_t plain_block_end(const char *buf, size_t start, size_t len, size_t want) {
    if (len - start <= want) return len;
    for (size_t i = start + want; i + 1 < len; i++)
        if (buf[i] == '\n' && !isspace((unsigned char)buf[i + 1])) return i + 1;
    return len;
}

/* Plain text: one token stream cut into examples of ctx_len tokens that
 * overlap by one token (or start with BOS), so each token after the first
 * is a target exactly once. */
static FTUNE_MUST_USE ftune_status load_plain(loader *L, const char *buf, size_t len) {
    const ft_data_tokenizer *tk = L->tk;
    int T = L->o.ctx_len;
    bool bos = tk->add_bos && tk->bos_id >= 0;
    tokbuf all = {0}, chunk = {0};
    ftune_status st = FTUNE_OK;
    for (size_t start = 0; start < len && !st;) {
        size_t stop = plain_block_end(buf, start, len, 1 << 16);
        int32_t *ids = NULL;
        size_t n = 0;
        st = tk->tokenize(tk->ctx, buf + start, stop - start, &ids, &n);
        if (st) {
            st = ft_err_prefix(st, "%s:%d", L->ds->path, line_of(buf, buf + start));
            break;
        }
        st = tokbuf_push(&all, ids, n, true);
        free(ids);
        start = stop;
        report_progress(L, stop);
    }
    L->ds->stats.n_records = 1;
    int64_t stride = T - 1, chunk_no = 0;
    for (int64_t s = 0; !st && s < (int64_t)all.n; s += stride) {
        int64_t take = bos ? stride : T;
        if (s + take > (int64_t)all.n) take = (int64_t)all.n - s;
        if (!bos && take < 2) break; /* the last token already was a target */
        chunk.n = 0;
        if (bos) st = tokbuf_push(&chunk, &tk->bos_id, 1, false);
        if (!st) st = tokbuf_push(&chunk, all.ids + s, (size_t)take, true);
        if (!st) st = dataset_add(L->ds, &L->o, tk->bos_id, chunk.ids, chunk.mask, (int64_t)chunk.n, false, (int)++chunk_no);
        if (s + take >= (int64_t)all.n) break;
    }
    free(all.ids);
    free(all.mask);
    free(chunk.ids);
    free(chunk.mask);
    return st;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcasecmp(s + a - b, suf) == 0;
}

ftune_status ft_dataset_load_buffer(ft_dataset **out, const char *name, const char *buf, size_t len,
                                    const ft_data_tokenizer *tk, const ft_dataset_opts *opts) {
    *out = NULL;
    if (!tk || !tk->tokenize) return ft_err(FTUNE_ERR_ARG, "%s: no tokenizer", name);
    loader L = { .tk = tk, .total = len };
    if (opts) L.o = *opts;
    else ft_dataset_opts_default(&L.o);
    if (L.o.ctx_len < 2) return ft_err(FTUNE_ERR_ARG, "%s: context length %d is too short (need at least 2)", name, L.o.ctx_len);
    if (L.o.format < FT_FMT_AUTO || L.o.format > FT_FMT_PLAIN) return ft_err(FTUNE_ERR_ARG, "%s: bad format %d", name, (int)L.o.format);
    TRY(dataset_new(&L.ds, name));
    int64_t bad = ft_utf8_invalid_at(buf, len);
    ftune_status st = FTUNE_OK;
    if (bad >= 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: invalid UTF-8 (byte %lld)", name, line_of(buf, buf + bad), (long long)bad);
    } else {
        size_t skip = (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) ? 3 : 0; /* a UTF-8 byte-order mark */
        buf += skip;
        len -= skip;
        size_t i = 0;
        while (i < len && isspace((unsigned char)buf[i])) i++;
        bool plain = L.o.format == FT_FMT_PLAIN || (L.o.format == FT_FMT_AUTO && ends_with(name, ".txt"));
        L.ds->format = L.o.format;
        if (plain) {
            L.ds->format = FT_FMT_PLAIN;
            st = load_plain(&L, buf, len);
        } else if (i < len && buf[i] == '[') {
            st = load_json_array(&L, buf, len);
        } else {
            st = load_jsonl(&L, buf, len);
        }
    }
    if (!st && L.ds->n == 0) {
        const ft_dataset_stats *S = &L.ds->stats;
        st = ft_err(FTUNE_ERR_FORMAT,
                    "%s: no examples (%lld records; %lld dropped as longer than %d tokens, %lld with no tokens to train "
                    "on, %lld whose target tokens were all cut by truncation%s)",
                    name, (long long)S->n_records, (long long)S->n_dropped_long, L.o.ctx_len,
                    (long long)S->n_dropped_empty, (long long)S->n_truncated_empty,
                    S->n_truncated_empty && L.o.truncate == FT_TRUNC_END ? ": truncating the prompt first may keep them" : "");
    }
    ft_segments_free(&L.seg);
    free(L.msgs);
    if (st) { ft_dataset_free(L.ds); return st; }
    *out = L.ds;
    return FTUNE_OK;
}

ftune_status ft_dataset_load(ft_dataset **out, const char *path, const ft_data_tokenizer *tk,
                             const ft_dataset_opts *opts) {
    *out = NULL;
    char *buf;
    size_t len;
    TRY(ft_read_file(path, &buf, &len));
    ftune_status st = ft_dataset_load_buffer(out, path, buf, len, tk, opts);
    free(buf);
    return st;
}

/* ------------------------------------------------------------ validation split */

static void recompute_stats(ft_dataset *ds) {
    ds->stats.n_tokens = ds->off[ds->n];
    ds->stats.n_targets = 0;
    ds->stats.max_len = 0;
    for (int i = 0; i < ds->n; i++) {
        int64_t l = ds->off[i + 1] - ds->off[i];
        ds->stats.n_targets += count_targets(ds->mask + ds->off[i], l);
        if (l > ds->stats.max_len) ds->stats.max_len = (int)l;
    }
}

ftune_status ft_dataset_split(ft_dataset *ds, double frac, uint64_t seed, ft_dataset **val) {
    *val = NULL;
    if (!(frac >= 0 && frac < 1)) return ft_err(FTUNE_ERR_ARG, "validation fraction %g is not in [0, 1)", frac);
    if (frac == 0) return FTUNE_OK;
    if (ds->n < 2) return ft_err(FTUNE_ERR_ARG, "%s: cannot split %d example(s) into train and validation", ds->path, ds->n);
    int n_val = (int)lround(frac * ds->n);
    if (n_val < 1) n_val = 1;
    if (n_val > ds->n - 1) n_val = ds->n - 1;
    int *order = malloc((size_t)ds->n * sizeof *order);
    uint8_t *pick = calloc((size_t)ds->n, 1);
    ftune_status st = (order && pick) ? FTUNE_OK : nomem();
    ft_dataset *v = NULL;
    if (!st) st = dataset_new(&v, ds->path);
    if (!st) {
        /* a stream of its own, distinct from the epoch orders of the same seed */
        ft_batch_epoch_order(order, ds->n, seed ^ 0x5EEDF00DCAFEull, -1, true);
        for (int i = 0; i < n_val; i++) pick[order[i]] = 1;
        v->format = ds->format;
        for (int i = 0; i < ds->n && !st; i++)
            if (pick[i]) st = dataset_append(v, ds->tokens + ds->off[i], ds->mask + ds->off[i], ds->off[i + 1] - ds->off[i], ds->line[i]);
    }
    if (!st) {
        /* compact the training part in place, keeping its order */
        int k = 0;
        int64_t w = 0;
        for (int i = 0; i < ds->n; i++) {
            if (pick[i]) continue;
            int64_t a = ds->off[i], l = ds->off[i + 1] - a;
            memmove(ds->tokens + w, ds->tokens + a, (size_t)l * sizeof *ds->tokens);
            memmove(ds->mask + w, ds->mask + a, (size_t)l);
            ds->line[k] = ds->line[i];
            ds->off[k] = w;
            w += l;
            k++;
        }
        ds->n = k;
        ds->off[k] = w;
        recompute_stats(ds);
        v->stats.n_records = v->n;
        *val = v;
        v = NULL;
    }
    ft_dataset_free(v);
    free(order);
    free(pick);
    return st;
}

/* ------------------------------------------------------------ batches */

size_t ft_batch_bytes(int B_max, int T_max) {
    return 4 * (size_t)B_max * (size_t)T_max * sizeof(int32_t);
}

ftune_status ft_batch_init(ft_batch *b, int B_max, int T_max) {
    memset(b, 0, sizeof *b);
    if (B_max < 1 || T_max < 2) return ft_err(FTUNE_ERR_ARG, "batch of %d x %d: need B >= 1 and T >= 2", B_max, T_max);
    size_t n = (size_t)B_max * (size_t)T_max;
    b->B_max = B_max; /* before allocating: ft_batch_free sizes the arrays by it */
    b->T_max = T_max;
    b->tokens = ft_mem_alloc(FT_MEM_DATA, n * sizeof *b->tokens);
    b->targets = ft_mem_alloc(FT_MEM_DATA, n * sizeof *b->targets);
    b->pos = ft_mem_alloc(FT_MEM_DATA, n * sizeof *b->pos);
    b->doc = ft_mem_alloc(FT_MEM_DATA, n * sizeof *b->doc);
    if (!b->tokens || !b->targets || !b->pos || !b->doc) { ft_batch_free(b); return nomem(); }
    return FTUNE_OK;
}

void ft_batch_free(ft_batch *b) {
    if (!b) return;
    size_t n = (size_t)b->B_max * (size_t)b->T_max;
    ft_mem_free(FT_MEM_DATA, b->tokens, n * sizeof *b->tokens);
    ft_mem_free(FT_MEM_DATA, b->targets, n * sizeof *b->targets);
    ft_mem_free(FT_MEM_DATA, b->pos, n * sizeof *b->pos);
    ft_mem_free(FT_MEM_DATA, b->doc, n * sizeof *b->doc);
    memset(b, 0, sizeof *b);
}

void ft_batch_shard(ft_batch *view, const ft_batch *b, int rank, int world) {
    int r0 = (int)((int64_t)b->B * rank / world), r1 = (int)((int64_t)b->B * (rank + 1) / world);
    size_t o = (size_t)r0 * b->T, n = (size_t)(r1 - r0) * b->T;
    *view = (ft_batch){ .B = r1 - r0, .T = b->T, .B_max = r1 - r0, .T_max = b->T_max, .row0 = b->row0 + r0, .tokens = b->tokens + o,
                        .targets = b->targets + o, .pos = b->pos + o, .doc = b->doc + o };
    /* an example's tokens are contiguous within one row */
    int last = -1;
    for (size_t i = 0; i < n; i++) {
        view->n_targets += view->targets[i] >= 0;
        if (view->doc[i] >= 0 && view->doc[i] != last) view->n_examples++;
        if (view->doc[i] >= 0) last = view->doc[i];
    }
}

void ft_batch_epoch_order(int *order, int n, uint64_t seed, int64_t epoch, bool shuffle) {
    for (int i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    ft_rng r;
    ft_rng_seed(&r, seed ^ ((uint64_t)epoch * 0x9E3779B97F4A7C15ull));
    for (int i = n - 1; i > 0; i--) {
        uint64_t x = ((uint64_t)ft_rng_u32(&r) << 32) | ft_rng_u32(&r);
        int j = (int)(x % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

typedef struct { int ex, row, col; } placement;

struct ft_batch_iter {
    const ft_dataset *ds;
    ft_batch_opts o;
    int *order;          /* (n) order of order_epoch */
    int64_t order_epoch;
    ft_data_cursor cur;
    placement *plan;     /* (cap_plan) where each example of a batch goes */
    int cap_plan;
};

/* Plans the batch that starts at order[start]: which examples, in which row
 * and column. Returns the count placed; *rows and *T are the rows used and
 * the longest row. */
static int plan_batch(const ft_batch_iter *it, const int *order, int64_t start, placement *plan, int *rows, int *T) {
    const ft_dataset *ds = it->ds;
    int B = it->o.B, Tmax = it->o.T, k = 0, row = 0, col = 0, longest = 0;
    for (int64_t i = start; i < ds->n; i++) {
        int e = order[i], len = ft_dataset_len(ds, e);
        if (!it->o.pack) {
            if (k == B) break;
            row = k;
            col = 0;
        } else if (col + len > Tmax) {
            if (row + 1 == B) break;
            row++;
            col = 0;
        }
        plan[k++] = (placement){ e, row, col };
        col += len;
        if (col > longest) longest = col;
    }
    *rows = k ? row + 1 : 0;
    *T = longest;
    return k;
}

ftune_status ft_batch_iter_new(ft_batch_iter **out, const ft_dataset *ds, const ft_batch_opts *o) {
    *out = NULL;
    if (!ds || ds->n < 1) return ft_err(FTUNE_ERR_ARG, "batch iterator: empty dataset");
    if (o->B < 1 || o->T < 2) return ft_err(FTUNE_ERR_ARG, "batch iterator: need B >= 1 and T >= 2 (got %d, %d)", o->B, o->T);
    if (ds->stats.max_len > o->T)
        return ft_err(FTUNE_ERR_ARG, "%s: an example has %d tokens, more than the batch length T = %d",
                      ds->path, ds->stats.max_len, o->T);
    ft_batch_iter *it = calloc(1, sizeof *it);
    if (!it) return nomem();
    it->ds = ds;
    it->o = *o;
    it->order = malloc((size_t)ds->n * sizeof *it->order);
    /* every example has at least 2 tokens, so a row holds at most T/2 */
    it->cap_plan = o->pack ? o->B * (o->T / 2 + 1) : o->B;
    it->plan = malloc((size_t)it->cap_plan * sizeof *it->plan);
    if (!it->order || !it->plan) { ft_batch_iter_free(it); return nomem(); }
    ft_batch_epoch_order(it->order, ds->n, o->seed, 0, o->shuffle);
    it->order_epoch = 0;
    *out = it;
    return FTUNE_OK;
}

void ft_batch_iter_free(ft_batch_iter *it) {
    if (!it) return;
    free(it->order);
    free(it->plan);
    free(it);
}

ft_data_cursor ft_batch_iter_cursor(const ft_batch_iter *it) { return it->cur; }

ftune_status ft_batch_iter_seek(ft_batch_iter *it, ft_data_cursor c) {
    if (c.epoch < 0 || c.index < 0 || c.index > it->ds->n)
        return ft_err(FTUNE_ERR_RANGE, "data cursor (epoch %lld, index %lld) out of range for %d examples",
                      (long long)c.epoch, (long long)c.index, it->ds->n);
    it->cur = c;
    return FTUNE_OK;
}

ftune_status ft_batch_iter_next(ft_batch_iter *it, ft_batch *b) {
    const ft_dataset *ds = it->ds;
    if (b->B_max < it->o.B || b->T_max < it->o.T)
        return ft_err(FTUNE_ERR_ARG, "batch of %d x %d is smaller than the iterator's %d x %d", b->B_max, b->T_max,
                      it->o.B, it->o.T);
    if (it->cur.index >= ds->n) {
        it->cur.epoch++;
        it->cur.index = 0;
    }
    if (it->order_epoch != it->cur.epoch) {
        ft_batch_epoch_order(it->order, ds->n, it->o.seed, it->cur.epoch, it->o.shuffle);
        it->order_epoch = it->cur.epoch;
    }
    int rows, T;
    int k = plan_batch(it, it->order, it->cur.index, it->plan, &rows, &T);
    b->B = rows;
    b->T = T;
    b->n_examples = k;
    size_t n = (size_t)rows * (size_t)T;
    for (size_t i = 0; i < n; i++) {
        b->tokens[i] = it->o.pad_id;
        b->targets[i] = -1;
        b->pos[i] = 0;
        b->doc[i] = -1;
    }
    int64_t n_targets = 0;
    for (int j = 0; j < k; j++) {
        const placement *p = &it->plan[j];
        int len = ft_dataset_len(ds, p->ex);
        const int32_t *tok = ds->tokens + ds->off[p->ex];
        const uint8_t *mask = ds->mask + ds->off[p->ex];
        size_t base = (size_t)p->row * (size_t)T + (size_t)p->col;
        for (int t = 0; t < len; t++) {
            b->tokens[base + t] = tok[t];
            b->pos[base + t] = t;
            b->doc[base + t] = j;
            if (t + 1 < len && mask[t + 1]) {
                b->targets[base + t] = tok[t + 1];
                n_targets++;
            }
        }
    }
    b->n_targets = n_targets;
    it->cur.index += k;
    return FTUNE_OK;
}

ftune_status ft_batch_iter_cursor_after(const ft_batch_iter *it, uint64_t n, ft_data_cursor *out) {
    *out = (ft_data_cursor){ 0, 0 };
    if (n == 0) return FTUNE_OK;
    const ft_dataset *ds = it->ds;
    if (!it->o.pack) {
        uint64_t nb = ((uint64_t)ds->n + (uint64_t)it->o.B - 1) / (uint64_t)it->o.B;
        uint64_t e = (n - 1) / nb, k = n - e * nb; /* k in [1, nb] batches into epoch e */
        if (e > INT64_MAX) return ft_err(FTUNE_ERR_RANGE, "data cursor: %llu batches is out of range", (unsigned long long)n);
        uint64_t idx = k * (uint64_t)it->o.B;
        *out = (ft_data_cursor){ (int64_t)e, idx < (uint64_t)ds->n ? (int64_t)idx : ds->n };
        return FTUNE_OK;
    }
    int *order = malloc((size_t)ds->n * sizeof *order);
    placement *plan = malloc((size_t)it->cap_plan * sizeof *plan);
    if (!order || !plan) { free(order); free(plan); return nomem(); }
    for (int64_t e = 0; n > 0; e++) {
        ft_batch_epoch_order(order, ds->n, it->o.seed, e, it->o.shuffle);
        for (int64_t i = 0; i < ds->n && n > 0; n--) {
            int rows, T;
            i += plan_batch(it, order, i, plan, &rows, &T);
            *out = (ft_data_cursor){ e, i };
        }
    }
    free(order);
    free(plan);
    return FTUNE_OK;
}

ftune_status ft_batch_iter_epoch_batches(const ft_batch_iter *it, int64_t epoch, int64_t *out) {
    *out = 0;
    const ft_dataset *ds = it->ds;
    if (!it->o.pack) {
        *out = (ds->n + it->o.B - 1) / it->o.B;
        return FTUNE_OK;
    }
    int *order = malloc((size_t)ds->n * sizeof *order);
    placement *plan = malloc((size_t)it->cap_plan * sizeof *plan);
    if (!order || !plan) { free(order); free(plan); return nomem(); }
    ft_batch_epoch_order(order, ds->n, it->o.seed, epoch, it->o.shuffle);
    int64_t count = 0;
    for (int64_t i = 0; i < ds->n; count++) {
        int rows, T;
        i += plan_batch(it, order, i, plan, &rows, &T);
    }
    free(order);
    free(plan);
    *out = count;
    return FTUNE_OK;
}
