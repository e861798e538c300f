/* tokenizer_hf.c — a tokenizer written as Hugging Face files (tokenizer.json,
 * tokenizer_config.json), for the model writer's Hugging Face output from a
 * base whose tokenizer has no such files (GGUF metadata, a llama2.c .bin).
 * The structure is the one transformers' GGUF conversion builds
 * (integrations/ggml.py: GGUFLlamaConverter, GGUFGPTConverter): a
 * SentencePiece-style vocabulary becomes a BPE with byte fallback whose
 * merges are made from the scores, a byte-level one a BPE with its merge list
 * and the pre-tokenizer's regexes. What tokenizer.json cannot express as the
 * tokenizer merges is refused, never written approximately. */
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* The tokenizer as it will be written: token texts, a text -> id index, and
 * the merge list in rank order. */
typedef struct {
    const ftune_tokenizer *t;
    int V;
    bool spm;
    const char **text;        /* (V) as written: stored; llama2.c's "\n<s>\n" as "<s>" */
    int32_t *hash;            /* text -> id, open addressing, -1 empty */
    uint32_t mask;
    int32_t *merges;          /* (n_merges) triples: left, right, result */
    int n_merges;
    bool pair_merges;         /* a piece holds a space: merges as [a, b], not "a b" */
    ft_tokenizer_specials sp;
    ft_tokenizer_rules rules;
} hf_tok;

static uint32_t text_hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 0x100000001b3ull; }
    return (uint32_t)(h ^ (h >> 32));
}

static int32_t find(const hf_tok *h, const char *s, size_t n) {
    for (uint32_t i = text_hash(s, n) & h->mask;; i = (i + 1) & h->mask) {
        int32_t id = h->hash[i];
        if (id < 0) return -1;
        if (strlen(h->text[id]) == n && memcmp(h->text[id], s, n) == 0) return id;
    }
}

static int utf8_char_len(unsigned char c) {
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

static bool is_added(int type) {
    return type == FT_TOKTYPE_CONTROL || type == FT_TOKTYPE_UNKNOWN || type == FT_TOKTYPE_USER_DEFINED;
}

static const char *kind_name(const hf_tok *h) {
    return h->spm ? "SentencePiece-style BPE (GGUF tokenizer.ggml.model \"llama\", llama2.c tokenizer.bin)"
                  : "byte-level BPE (GGUF tokenizer.ggml.model \"gpt2\")";
}

/* ------------------------------------------------------------- SPM merges from scores */

typedef struct {
    int32_t tok, left, right, cut;  /* token = left + right, cut at byte cut */
    float score, sl, sr;            /* the scores of the three */
    int32_t len_r;                  /* bytes of right */
    bool run;                       /* tok is in a group of runs of one character with one score */
} split_t;

static int cmp_split(const void *a, const void *b) {
    const split_t *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->run && y->run) { /* longer left parts first: the run grows from its left end */
        if (x->cut != y->cut) return x->cut > y->cut ? -1 : 1;
        if (x->len_r != y->len_r) return x->len_r > y->len_r ? -1 : 1;
    }
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    if (x->sl != y->sl) return x->sl > y->sl ? -1 : 1;
    if (x->sr != y->sr) return x->sr > y->sr ? -1 : 1;
    return x->cut < y->cut ? -1 : x->cut > y->cut;
}

typedef struct { int32_t len, id; } len_id;
static int cmp_len(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

typedef struct { float score; int32_t id; } score_id;
static int cmp_score(const void *a, const void *b) {
    const score_id *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Whether the n made tokens g, which share a score, are exactly the runs
 * c^2 .. c^M of one character c, with no longer run of it a token up to
 * c^2M (Llama 2's "▁▁" .. sixteen "▁", all at -1e9). On a run of c the
 * leftmost-first rule then grows one piece from the left until it is c^M
 * (or the run ends), then the next: ranking the group's merges by the
 * length of their left part, longest first, does the same, as (c, c) is
 * the lowest of them and the leftmost (c, c) starts each piece. */
static bool run_group(const hf_tok *h, const score_id *g, int n) {
    const char *c = h->text[g[0].id];
    size_t cl = (size_t)utf8_char_len((unsigned char)c[0]);
    int M = 0;
    uint8_t seen[64] = { 0 };
    for (int i = 0; i < n; i++) {
        const char *s = h->text[g[i].id];
        size_t L = strlen(s);
        if (L % cl != 0 || L / cl < 2 || L / cl >= 64) return false;
        for (size_t k = 0; k < L; k += cl)
            if (memcmp(s + k, c, cl) != 0) return false;
        int r = (int)(L / cl);
        if (seen[r]) return false;
        seen[r] = 1;
        if (r > M) M = r;
    }
    if (n != M - 1) return false; /* every length 2 .. M */
    char buf[2 * 64 * 4 + 1];
    for (int r = M + 1; r <= 2 * M; r++) {
        size_t L = 0;
        for (int k = 0; k < r && L + cl < sizeof buf; k++, L += cl) memcpy(buf + L, c, cl);
        if (find(h, buf, L) >= 0) return false;
    }
    return true;
}

/* A SentencePiece-style tokenizer merges, within a text, the adjacent pair
 * whose joined text is the token of the highest score (the leftmost of
 * equals). A token is made that way when it splits into two parts that are
 * each one character or a token made that way. tokenizer.json's BPE merges
 * pairs of tokens by rank instead; the two agree when every made token's
 * parts are tokens (a character that is no token only ever becomes byte
 * tokens there), no part is a byte token (byte fallback's tokens would merge
 * there), and no two made tokens share a score (equals go leftmost here, by
 * rank there; run_group is the one shape of equals written). The merges are
 * then every split of every made token, ordered as transformers orders them
 * (GGUFTokenizerSkeleton): by the token's score, then by the parts' scores. */
static FTUNE_MUST_USE ftune_status spm_merges(hf_tok *h) {
    const ftune_tokenizer *t = h->t;
    const int V = h->V;
    len_id *order = ft_malloc((size_t)V * sizeof *order);
    uint8_t *made = ft_calloc((size_t)V, 1);
    size_t cap = 1024, n = 0;
    split_t *sp = ft_malloc(cap * sizeof *sp);
    score_id *ms = NULL;
    ftune_status st = FTUNE_OK;
    if (!order || !made || !sp) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (int i = 0; i < V; i++) order[i] = (len_id){ (int32_t)strlen(h->text[i]), i };
    qsort(order, (size_t)V, sizeof *order, cmp_len); /* the parts of a token are shorter: made first */
    for (int oi = 0; oi < V; oi++) {
        int32_t id = order[oi].id;
        const char *s = h->text[id];
        int L = order[oi].len;
        if (L == 0 || utf8_char_len((unsigned char)s[0]) >= L) continue; /* one character: never made */
        for (int k = utf8_char_len((unsigned char)s[0]); k < L; k += utf8_char_len((unsigned char)s[k])) {
            int32_t a = find(h, s, (size_t)k), b = find(h, s + k, (size_t)(L - k));
            bool a_char = utf8_char_len((unsigned char)s[0]) == k, b_char = utf8_char_len((unsigned char)s[k]) == L - k;
            bool a_ok = a_char || (a >= 0 && made[a]), b_ok = b_char || (b >= 0 && made[b]);
            if (!a_ok || !b_ok) continue;
            made[id] = 1;
            if (a < 0 || b < 0) {
                st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: token %d \"%s\" is made from the character \"%.*s\", which is "
                            "not a token: tokenizer.json's merges cannot make it so; no tokenizer.json is written "
                            "(a .gguf output keeps the vocabulary as it is)",
                            kind_name(h), id, s, a < 0 ? k : L - k, a < 0 ? s : s + k);
                goto done;
            }
            if (ft_tokenizer_type(t, a) == FT_TOKTYPE_BYTE || ft_tokenizer_type(t, b) == FT_TOKTYPE_BYTE) {
                st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: token %d \"%s\" is made from the byte token \"%s\": in "
                            "tokenizer.json byte fallback's tokens would merge too; no tokenizer.json is written "
                            "(a .gguf output keeps the vocabulary as it is)",
                            kind_name(h), id, s, h->text[ft_tokenizer_type(t, a) == FT_TOKTYPE_BYTE ? a : b]);
                goto done;
            }
            if (n == cap) {
                split_t *ns = realloc(sp, 2 * cap * sizeof *sp);
                if (!ns) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
                sp = ns;
                cap *= 2;
            }
            sp[n++] = (split_t){ id, a, b, k, ft_tokenizer_score(t, id), ft_tokenizer_score(t, a), ft_tokenizer_score(t, b),
                                 L - k, false };
            if (strchr(h->text[a], ' ') || strchr(h->text[b], ' ')) h->pair_merges = true;
        }
    }
    /* made tokens with equal scores: refused, but for one shape, Llama 2's 15 runs of "▁" */
    int n_made = 0;
    for (int i = 0; i < V; i++) n_made += made[i];
    if (!(ms = ft_malloc((size_t)(n_made ? n_made : 1) * sizeof *ms))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    n_made = 0;
    for (int i = 0; i < V; i++) if (made[i]) ms[n_made++] = (score_id){ ft_tokenizer_score(t, i), i };
    qsort(ms, (size_t)n_made, sizeof *ms, cmp_score);
    for (int i = 0, j; i < n_made; i = j) {
        for (j = i + 1; j < n_made && ms[j].score == ms[i].score; j++) {}
        if (j - i < 2) continue;
        if (run_group(h, ms + i, j - i)) {
            for (int k = i; k < j; k++) made[ms[k].id] = 2;
            continue;
        }
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: the SentencePiece scores of tokens %d \"%s\" and %d \"%s\" are both %g: "
                    "equal scores merge leftmost first, which tokenizer.json's ranked merges cannot express; no "
                    "tokenizer.json is written (a .gguf output keeps the vocabulary as it is)", kind_name(h),
                    ms[i].id, h->text[ms[i].id], ms[i + 1].id, h->text[ms[i + 1].id], (double)ms[i].score);
        goto done;
    }
    for (size_t i = 0; i < n; i++) sp[i].run = made[sp[i].tok] == 2;
    qsort(sp, n, sizeof *sp, cmp_split);
    if (!(h->merges = ft_malloc((n ? n : 1) * 3 * sizeof *h->merges))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < n; i++) {
        h->merges[3 * i] = sp[i].left;
        h->merges[3 * i + 1] = sp[i].right;
        h->merges[3 * i + 2] = sp[i].tok;
    }
    h->n_merges = (int)n;
done:
    free(order);
    free(made);
    free(sp);
    free(ms);
    return st;
}

/* ------------------------------------------------------------- checks */

static void hf_free(hf_tok *h) {
    free(h->text);
    free(h->hash);
    free(h->merges);
}

/* Fills h from t, or refuses what tokenizer.json cannot hold as t has it. */
static FTUNE_MUST_USE ftune_status hf_prepare(hf_tok *h, const ftune_tokenizer *t) {
    memset(h, 0, sizeof *h);
    if (!t) return ft_err(FTUNE_ERR_ARG, "the model has no tokenizer to write as tokenizer.json");
    h->t = t;
    h->V = ftune_tokenizer_n_vocab(t);
    h->spm = ft_tokenizer_kind(t) == FT_TOK_SPM;
    ft_tokenizer_special(t, &h->sp);
    ft_tokenizer_get_rules(t, &h->rules);
    if (h->rules.raw_bytes)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "a tiktoken tokenizer (raw-byte BPE) is not written as tokenizer.json here");
    if (!h->spm && h->rules.merge_rule != FT_MERGES_BY_RANK)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s without a merge list (merging by token rank) is not written as "
                      "tokenizer.json here", kind_name(h));
    h->mask = 16;
    while (h->mask < 2u * (uint32_t)h->V) h->mask <<= 1;
    h->mask--;
    h->text = ft_calloc((size_t)h->V, sizeof *h->text);
    h->hash = ft_malloc(((size_t)h->mask + 1) * sizeof *h->hash);
    if (!h->text || !h->hash) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    memset(h->hash, 0xff, ((size_t)h->mask + 1) * sizeof *h->hash);
    for (int i = 0; i < h->V; i++) {
        const char *s = ft_tokenizer_token(t, i);
        size_t n = (size_t)ft_tokenizer_token_len(t, i);
        if (strlen(s) != n)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: token %d holds a NUL byte, which tokenizer.json cannot hold", kind_name(h), i);
        if (ft_utf8_invalid_at(s, n) >= 0)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: token %d is not valid UTF-8, which tokenizer.json cannot hold", kind_name(h), i);
        /* llama2.c's .bin stores BOS and EOS as "\n<s>\n" and "\n</s>\n"; written as llama.cpp's converter
         * and transformers name them */
        if (ft_tokenizer_type(t, i) != FT_TOKTYPE_NORMAL && (!strcmp(s, "\n<s>\n") || !strcmp(s, "\n</s>\n")))
            s = s[2] == 's' ? "<s>" : "</s>";
        h->text[i] = s;
        n = strlen(s);
        int32_t dup = find(h, s, n);
        if (dup >= 0)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tokens %d and %d are both \"%s\": tokenizer.json's vocab maps a "
                          "text to one id", kind_name(h), dup, i, s);
        uint32_t k = text_hash(s, n) & h->mask;
        while (h->hash[k] >= 0) k = (k + 1) & h->mask;
        h->hash[k] = i;
    }
    if (h->spm) {
        /* byte fallback: tokenizer.json looks up "<0xXX>" as written, and for a character not in the
         * vocabulary gives one unknown token where ftune gives a token per byte */
        for (int b = 0; b < 256; b++) {
            char bt[8];
            snprintf(bt, sizeof bt, "<0x%02X>", b);
            int32_t id = find(h, bt, 6);
            if (id < 0 || ft_tokenizer_type(t, id) != FT_TOKTYPE_BYTE)
                return ft_err(FTUNE_ERR_UNSUPPORTED, "%s without the byte token %s (byte fallback needs all 256): "
                              "tokenizer.json would give <unk> where ftune gives bytes", kind_name(h), bt);
        }
        if (h->rules.merge_rule == FT_MERGES_BY_SCORE) return spm_merges(h);
    }
    /* a merge list (byte-level BPE, or SentencePiece-style from a tokenizer.json): written as it applies */
    ftune_status st = ft_tokenizer_merge_list(t, &h->merges, &h->n_merges);
    if (st) return st;
    size_t maxlen = 0;
    for (int i = 0; i < h->V; i++) if (strlen(h->text[i]) > maxlen) maxlen = strlen(h->text[i]);
    char *buf = ft_malloc(2 * maxlen + 1);
    if (!buf) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int i = 0; i < h->n_merges && !st; i++) {
        const char *a = h->text[h->merges[3 * i]], *b = h->text[h->merges[3 * i + 1]];
        size_t la = strlen(a), lb = strlen(b);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        if (find(h, buf, la + lb) != h->merges[3 * i + 2])
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: merge \"%s\" \"%s\" makes token %d \"%s\", whose text is not the two "
                        "joined: tokenizer.json names merges by text", kind_name(h), a, b, h->merges[3 * i + 2],
                        h->text[h->merges[3 * i + 2]]);
        if (strchr(a, ' ') || strchr(b, ' ')) h->pair_merges = true;
    }
    free(buf);
    return st;
}

/* ------------------------------------------------------------- JSON */

static cJSON *obj_type(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o) cJSON_AddStringToObject(o, "type", type);
    return o;
}

static cJSON *byte_level(bool use_regex) {
    cJSON *o = obj_type("ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", false);
    cJSON_AddBoolToObject(o, "trim_offsets", true);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

/* The pre-tokenizer regexes as Hugging Face pre-tokenizers: GPT-2's pattern
 * last is ByteLevel's own regex, "\p{N}" is Digits(individual_digits), any
 * other a Split(Isolated); then ByteLevel without a regex. */
static cJSON *bpe_pre_tokenizer(const hf_tok *h) {
    int n = h->rules.n_re;
    bool last_gpt2 = n > 0 && strcmp(h->rules.re[n - 1], HF_RE_GPT2) == 0;
    if (n == 1 && last_gpt2) return byte_level(true);
    cJSON *seq = obj_type("Sequence"), *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    for (int i = 0; i < n - (last_gpt2 ? 1 : 0); i++) {
        cJSON *p;
        if (!strcmp(h->rules.re[i], "\\p{N}")) {
            p = obj_type("Digits");
            cJSON_AddBoolToObject(p, "individual_digits", true);
        } else {
            p = obj_type("Split");
            cJSON *pat = cJSON_AddObjectToObject(p, "pattern");
            cJSON_AddStringToObject(pat, "Regex", h->rules.re[i]);
            cJSON_AddStringToObject(p, "behavior", "Isolated");
            cJSON_AddBoolToObject(p, "invert", false);
        }
        cJSON_AddItemToArray(list, p);
    }
    cJSON_AddItemToArray(list, byte_level(last_gpt2));
    return seq;
}

static cJSON *special_piece(const char *text, int type_id) {
    cJSON *o = cJSON_CreateObject(), *s = cJSON_AddObjectToObject(o, "SpecialToken");
    cJSON_AddStringToObject(s, "id", text);
    cJSON_AddNumberToObject(s, "type_id", type_id);
    return o;
}

static cJSON *sequence_piece(const char *id, int type_id) {
    cJSON *o = cJSON_CreateObject(), *s = cJSON_AddObjectToObject(o, "Sequence");
    cJSON_AddStringToObject(s, "id", id);
    cJSON_AddNumberToObject(s, "type_id", type_id);
    return o;
}

/* BOS / EOS around each sequence, as the tokenizer adds them (transformers'
 * LlamaConverter's template); none: a byte-level file's ByteLevel processor. */
static cJSON *post_processor(const hf_tok *h) {
    bool bos = h->sp.add_bos && h->sp.bos >= 0, eos = h->sp.add_eos && h->sp.eos >= 0;
    if (!bos && !eos) {
        if (h->spm) return cJSON_CreateNull();
        cJSON *o = obj_type("ByteLevel");
        cJSON_AddBoolToObject(o, "add_prefix_space", true);
        cJSON_AddBoolToObject(o, "trim_offsets", false);
        cJSON_AddBoolToObject(o, "use_regex", true);
        return o;
    }
    cJSON *o = obj_type("TemplateProcessing");
    cJSON *single = cJSON_AddArrayToObject(o, "single"), *pair = cJSON_AddArrayToObject(o, "pair");
    const char *bt = bos ? h->text[h->sp.bos] : NULL, *et = eos ? h->text[h->sp.eos] : NULL;
    if (bt) cJSON_AddItemToArray(single, special_piece(bt, 0));
    cJSON_AddItemToArray(single, sequence_piece("A", 0));
    if (et) cJSON_AddItemToArray(single, special_piece(et, 0));
    if (bt) cJSON_AddItemToArray(pair, special_piece(bt, 0));
    cJSON_AddItemToArray(pair, sequence_piece("A", 0));
    if (et) cJSON_AddItemToArray(pair, special_piece(et, 0));
    if (bt) cJSON_AddItemToArray(pair, special_piece(bt, 1));
    cJSON_AddItemToArray(pair, sequence_piece("B", 1));
    if (et) cJSON_AddItemToArray(pair, special_piece(et, 1));
    cJSON *sts = cJSON_AddObjectToObject(o, "special_tokens");
    for (int k = 0; k < 2; k++) {
        const char *txt = k == 0 ? bt : et;
        int32_t id = k == 0 ? h->sp.bos : h->sp.eos;
        if (!txt || cJSON_GetObjectItemCaseSensitive(sts, txt)) continue;
        cJSON *e = cJSON_AddObjectToObject(sts, txt);
        cJSON_AddStringToObject(e, "id", txt);
        cJSON_AddItemToObject(e, "ids", cJSON_CreateIntArray(&id, 1));
        cJSON_AddItemToObject(e, "tokens", cJSON_CreateStringArray(&txt, 1));
    }
    return o;
}

static cJSON *added_token(const hf_tok *h, int32_t id, bool with_id) {
    int ty = ft_tokenizer_type(h->t, id), strip = ft_tokenizer_strip(h->t, id);
    cJSON *o = cJSON_CreateObject();
    if (with_id) cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddStringToObject(o, "content", h->text[id]);
    cJSON_AddBoolToObject(o, "single_word", false);
    cJSON_AddBoolToObject(o, "lstrip", (strip & 1) != 0);
    cJSON_AddBoolToObject(o, "rstrip", (strip & 2) != 0);
    cJSON_AddBoolToObject(o, "normalized", false);
    cJSON_AddBoolToObject(o, "special", ty != FT_TOKTYPE_USER_DEFINED);
    return o;
}

static cJSON *tokenizer_json(const hf_tok *h) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    for (int i = 0; i < h->V; i++)
        if (is_added(ft_tokenizer_type(h->t, i))) cJSON_AddItemToArray(added, added_token(h, i, true));
    if (h->spm) { /* " " -> "▁", with a "▁" in front of the text when the tokenizer adds one */
        cJSON *norm = obj_type("Sequence"), *list = cJSON_AddArrayToObject(norm, "normalizers");
        if (h->sp.add_space_prefix) {
            cJSON *p = obj_type("Prepend");
            cJSON_AddStringToObject(p, "prepend", "\xe2\x96\x81");
            cJSON_AddItemToArray(list, p);
        }
        cJSON *r = obj_type("Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", " ");
        cJSON_AddStringToObject(r, "content", "\xe2\x96\x81");
        cJSON_AddItemToArray(list, r);
        cJSON_AddItemToObject(j, "normalizer", norm);
        cJSON_AddNullToObject(j, "pre_tokenizer");
    } else {
        cJSON_AddItemToObject(j, "normalizer", h->rules.nfc ? obj_type("NFC") : cJSON_CreateNull());
        cJSON_AddItemToObject(j, "pre_tokenizer", bpe_pre_tokenizer(h));
    }
    cJSON_AddItemToObject(j, "post_processor", post_processor(h));
    if (h->spm) { /* LlamaConverter's decoder */
        cJSON *dec = obj_type("Sequence"), *list = cJSON_AddArrayToObject(dec, "decoders");
        cJSON *r = obj_type("Replace");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "pattern"), "String", "\xe2\x96\x81");
        cJSON_AddStringToObject(r, "content", " ");
        cJSON_AddItemToArray(list, r);
        cJSON_AddItemToArray(list, obj_type("ByteFallback"));
        cJSON_AddItemToArray(list, obj_type("Fuse"));
        if (h->sp.add_space_prefix) {
            cJSON *s = obj_type("Strip");
            cJSON_AddStringToObject(s, "content", " ");
            cJSON_AddNumberToObject(s, "start", 1);
            cJSON_AddNumberToObject(s, "stop", 0);
            cJSON_AddItemToArray(list, s);
        }
        cJSON_AddItemToObject(j, "decoder", dec);
    } else {
        cJSON *d = obj_type("ByteLevel");
        cJSON_AddBoolToObject(d, "add_prefix_space", true);
        cJSON_AddBoolToObject(d, "trim_offsets", true);
        cJSON_AddBoolToObject(d, "use_regex", true);
        cJSON_AddItemToObject(j, "decoder", d);
    }
    cJSON *m = cJSON_AddObjectToObject(j, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    if (h->spm && h->sp.unk >= 0) cJSON_AddStringToObject(m, "unk_token", h->text[h->sp.unk]);
    else cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", h->spm);
    cJSON_AddBoolToObject(m, "byte_fallback", h->spm);
    cJSON_AddBoolToObject(m, "ignore_merges", h->rules.ignore_merges != 0);
    cJSON *vocab = cJSON_AddObjectToObject(m, "vocab");
    for (int i = 0; i < h->V; i++) cJSON_AddNumberToObject(vocab, h->text[i], i);
    cJSON *mer = cJSON_AddArrayToObject(m, "merges");
    char *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < h->n_merges; i++) {
        const char *a = h->text[h->merges[3 * i]], *b = h->text[h->merges[3 * i + 1]];
        if (h->pair_merges) {
            const char *ab[2] = { a, b };
            cJSON_AddItemToArray(mer, cJSON_CreateStringArray(ab, 2));
            continue;
        }
        size_t n = strlen(a) + strlen(b) + 2;
        if (n > cap) {
            char *nb = realloc(buf, cap = 2 * n);
            if (!nb) { free(buf); cJSON_Delete(j); return NULL; }
            buf = nb;
        }
        snprintf(buf, cap, "%s %s", a, b);
        cJSON_AddItemToArray(mer, cJSON_CreateString(buf));
    }
    free(buf);
    if (cJSON_GetArraySize(vocab) != h->V || cJSON_GetArraySize(mer) != h->n_merges) { cJSON_Delete(j); return NULL; }
    return j;
}

static void add_token_name(cJSON *j, const hf_tok *h, const char *key, int32_t id) {
    if (id >= 0) cJSON_AddStringToObject(j, key, h->text[id]);
    else cJSON_AddNullToObject(j, key);
}

static cJSON *tokenizer_config(const hf_tok *h, int model_max_length) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "add_bos_token", h->sp.add_bos != 0);
    cJSON_AddBoolToObject(j, "add_eos_token", h->sp.add_eos != 0);
    cJSON *dec = cJSON_AddObjectToObject(j, "added_tokens_decoder");
    char key[16];
    for (int i = 0; i < h->V; i++)
        if (is_added(ft_tokenizer_type(h->t, i))) {
            snprintf(key, sizeof key, "%d", i);
            cJSON_AddItemToObject(dec, key, added_token(h, i, false));
        }
    add_token_name(j, h, "bos_token", h->sp.bos);
    add_token_name(j, h, "eos_token", h->sp.eos);
    add_token_name(j, h, "unk_token", h->sp.unk);
    add_token_name(j, h, "pad_token", h->sp.pad);
    const char *ct = ft_tokenizer_chat_template(h->t);
    if (ct) cJSON_AddStringToObject(j, "chat_template", ct);
    cJSON_AddBoolToObject(j, "clean_up_tokenization_spaces", false);
    if (h->spm) cJSON_AddBoolToObject(j, "legacy", true); /* the Prepend/Replace normalizer above */
    if (model_max_length > 0) cJSON_AddNumberToObject(j, "model_max_length", model_max_length);
    /* LlamaTokenizerFast rebuilds the BOS/EOS template from add_bos_token/add_eos_token, as written */
    cJSON_AddStringToObject(j, "tokenizer_class", h->spm ? "LlamaTokenizerFast" : "PreTrainedTokenizerFast");
    return j;
}

ftune_status ft_tokenizer_hf_check(const ftune_tokenizer *t) {
    hf_tok h;
    ftune_status st = hf_prepare(&h, t);
    hf_free(&h);
    return st;
}

ftune_status ft_tokenizer_to_hf(const ftune_tokenizer *t, const char *dir, int model_max_length) {
    if (!dir) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_to_hf: no directory");
    hf_tok h;
    ftune_status st = hf_prepare(&h, t);
    cJSON *tj = NULL, *tc = NULL;
    if (st) goto done;
    tj = tokenizer_json(&h);
    tc = tokenizer_config(&h, model_max_length);
    if (!tj || !tc) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((st = ft_write_json_atomic(path, tj))) goto done;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    st = ft_write_json_atomic(path, tc);
done:
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    hf_free(&h);
    return st;
}
