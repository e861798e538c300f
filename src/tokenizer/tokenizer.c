/* tokenizer.c — the tokenizer itself: building it from a vocabulary spec,
 * encoding (special-token partition, SentencePiece-style and byte-level BPE
 * merging, regex pre-tokenization) and decoding. The file formats that fill
 * a spec live in tokenizer_load.c. See tokenizer.h for the algorithms. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MERGE_SCORE, MERGE_RANK, MERGE_TOKRANK }; /* pair priority: piece score, merge rank, token rank */
enum { SPLIT_CHARS, SPLIT_BYTES };              /* what a word starts as */

typedef struct {
    uint64_t key;     /* (left id << 32) | right id; UINT64_MAX if empty */
    int32_t rank;
    int32_t result;
} pair_slot;

struct ftune_tokenizer {
    ft_tok_kind kind;
    int n_vocab;
    char *arena;                  /* every string below, back to back */
    uint32_t *st_off, *st_len;    /* (V) text as stored, NUL-terminated */
    uint32_t *key_off, *key_len;  /* (V) bytes matched against input text */
    uint32_t *pc_off, *pc_len;    /* (V) bytes the token decodes to */
    float *score;                 /* (V) SPM scores (0 if none) */
    uint8_t *type;                /* (V) FT_TOKTYPE_* */
    uint8_t *eog;                 /* (V) 1 if the token ends generation */
    uint8_t *strip;               /* (V) bit 0 lstrip, bit 1 rstrip (special tokens), or NULL */
    int32_t *hash;                /* key -> id, open addressing, -1 empty */
    uint32_t hash_mask;
    pair_slot *pairs;             /* (left, right) -> merge, for MERGE_RANK */
    uint32_t pair_mask;
    int merge_mode, split_mode;
    int32_t byte_tok[256];        /* token for a raw byte (SPM: <0xXX>; BPE: the byte itself), -1 if none */
    int32_t *special;             /* ids of control/user-defined/unknown tokens, longest first */
    int n_special;
    uint8_t special_first[256];   /* 1 if some special token starts with this byte */
    uint8_t boundary[256];        /* SPM: ASCII bytes no merge can produce a token with */
    pcre2_code *re[FT_TOK_MAX_REGEX];
    char *re_src[FT_TOK_MAX_REGEX]; /* their patterns, as compiled */
    int n_re;
    int32_t bos, eos, unk, pad, eot;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    int raw_bytes;                /* BPE: normal tokens are raw bytes (tiktoken) */
    int nfc;                      /* input text is put in Unicode NFC first (nfc.c) */
    int max_piece;
    char *chat_template;          /* the model's Jinja chat template, or NULL */
};

/* ------------------------------------------------------------- small helpers */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;               /* FNV-1a */
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ull; }
    return h ^ (h >> 29);
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c >> 5) == 6) return 2;
    if ((c >> 4) == 14) return 3;
    if ((c >> 3) == 30) return 4;
    return 1;
}

/* Decodes one code point from s[0..n); returns its length, or 0 if invalid. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    int len = utf8_len(s[0]);
    if (len == 1) { if (s[0] >= 0x80) return 0; *cp = s[0]; return 1; }
    if ((size_t)len > n) return 0;
    uint32_t c = s[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[k] & 0x3F);
    }
    *cp = c;
    return len;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* GPT-2's byte -> unicode alphabet: printable Latin-1 bytes map to
 * themselves, the other 68 to U+0100.. in byte order. */
static void bytelevel_table(uint16_t b2u[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        b2u[b] = keep ? (uint16_t)b : (uint16_t)(256 + n++);
    }
}

/* Maps a string in the byte alphabet back to raw bytes; returns the length
 * written to out (at most n) or -1 if some character is not in the alphabet. */
static int bytelevel_decode(const int16_t *u2b, const char *s, size_t n, char *out) {
    size_t i = 0;
    int o = 0;
    while (i < n) {
        uint32_t cp;
        int l = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (l == 0 || cp >= 324 || u2b[cp] < 0) return -1;
        out[o++] = (char)u2b[cp];
        i += (size_t)l;
    }
    return o;
}

static void bytelevel_inverse(int16_t u2b[324]) {
    uint16_t b2u[256];
    bytelevel_table(b2u);
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) u2b[b2u[b]] = (int16_t)b;
}

/* "<0x41>" -> 0x41, or -1. */
static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 :
                c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ------------------------------------------------------------- lookups */

static inline const char *tok_key(const ftune_tokenizer *t, int32_t id) { return t->arena + t->key_off[id]; }

static int32_t tok_lookup(const ftune_tokenizer *t, const char *s, size_t n) {
    if (n == 0) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & t->hash_mask;
    for (;;) {
        int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->key_len[id] == n && memcmp(tok_key(t, id), s, n) == 0) return id;
        i = (i + 1) & t->hash_mask;
    }
}

static void hash_insert(ftune_tokenizer *t, int32_t id) {
    size_t n = t->key_len[id];
    if (n == 0 || tok_lookup(t, tok_key(t, id), n) >= 0) return; /* first one wins */
    uint32_t i = (uint32_t)hash_bytes(tok_key(t, id), n) & t->hash_mask;
    while (t->hash[i] >= 0) i = (i + 1) & t->hash_mask;
    t->hash[i] = id;
}

static const pair_slot *pair_find(const ftune_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)mix64(key) & t->pair_mask;
    for (;;) {
        const pair_slot *p = &t->pairs[i];
        if (p->key == UINT64_MAX) return NULL;
        if (p->key == key) return p;
        i = (i + 1) & t->pair_mask;
    }
}

static void pair_insert(ftune_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t result) {
    if (pair_find(t, a, b)) return; /* the lower rank was first */
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)mix64(key) & t->pair_mask;
    while (t->pairs[i].key != UINT64_MAX) i = (i + 1) & t->pair_mask;
    t->pairs[i] = (pair_slot){ key, rank, result };
}

/* ------------------------------------------------------------- pre-tokenizer regexes */

/* GPT-2's pattern as written in tokenizer.json ByteLevel (use_regex). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3 / Qwen2: contractions spelled case-insensitively by hand, so that
 * Unicode case folding (e.g. U+017F matching 's') cannot change the split. */
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek LLM's letters: the cased letters (Lu, Ll, Lt) of an older
 * Unicode, as code points (several have singleton decompositions, which a
 * Unicode normalization of this source would silently change). */
#define RE_DEEPSEEK_LETTERS \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}" \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}" \
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}" \
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}" \
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}" \
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-" \
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}" \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}" \
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}" \
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}" \
    "\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}" \
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}" \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}" \
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-" \
    "\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
/* CJK ideographs, U+0800..U+4E00 (as DeepSeek writes it) and Hangul */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* Mistral's Tekken (Nemo, Pixtral): words split at lower->upper case changes */
#define RE_TEKKEN "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|" \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|" \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct { const char *names; const char *re[6]; int ignore_merges; } pre_def;

/* Names as GGUF tokenizer.ggml.pre spells them ('|'-separated aliases). */
static const pre_def pre_defs[] = {
    { "llama3|llama-v3|llama-bpe|falcon3|pixtral", { RE_LLAMA3 }, 1 },
    { "dbrx|smaug-bpe", { RE_LLAMA3 }, 0 },
    { "qwen2|deepseek-r1-qwen|stablelm2|megrez", { RE_QWEN2 }, 0 },
    { "gpt-2|gpt2|phi-2|mpt|olmo|jais|jina-es|jina-de|roberta-bpe|trillion", { RE_GPT2 }, 0 },
    { "smollm|starcoder|refact|command-r|codeshell|exaone|minerva|minerva-7b", { "\\p{N}", RE_GPT2 }, 0 },
    /* The Llama-architecture models whose GGUF names these (llama.cpp's
     * converter): DeepSeek LLM and Coder, Mistral Nemo (tekken), Viking,
     * Seed-Coder; Megrez and Trillion reuse Qwen2's and GPT-2's. Checked
     * against Hugging Face tokenizers (tests/fixtures/pretok). */
    { "deepseek-llm", { "[\r\n]", RE_DEEPSEEK_LETTERS, "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
                        "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+" }, 0 },
    { "deepseek-coder", { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}" }, 0 },
    { "tekken", { RE_TEKKEN }, 1 },
    { "viking", { " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", "\\p{N}" }, 0 },
    { "seed-coder", { RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" }, 0 },
    /* HF Punctuation(contiguous) counts ASCII symbols as punctuation too */
    { "falcon", { "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]" }, 0 },
    { "none", { NULL }, 0 },                          /* the whole text is one word */
    { "default", { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" }, 0 },
};

static const pre_def *find_pre(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++) {
        const char *p = pre_defs[i].names;
        while (*p) {
            const char *e = strchr(p, '|');
            size_t l = e ? (size_t)(e - p) : strlen(p);
            if (l == n && memcmp(p, name, n) == 0) return &pre_defs[i];
            p += l + (e ? 1 : 0);
        }
    }
    return NULL;
}

static FTUNE_MUST_USE ftune_status compile_regex(ftune_tokenizer *t, const char *pattern) {
    if (t->n_re >= FT_TOK_MAX_REGEX)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer: more than %d pre-tokenizer regexes", FT_TOK_MAX_REGEX);
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &errcode, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return ft_err(FTUNE_ERR_FORMAT, "tokenizer: pre-tokenizer regex \"%s\": %s at offset %zu",
                      pattern, (const char *)msg, (size_t)erroff);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    if (!(t->re_src[t->n_re] = ft_strdup(pattern))) {
        pcre2_code_free(re);
        return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->re[t->n_re++] = re;
    return FTUNE_OK;
}

/* ------------------------------------------------------------- build */

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>",
};

typedef struct { uint32_t len; int32_t id; } len_id;

static int cmp_special(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static FTUNE_MUST_USE ftune_status check_id(const char *what, int32_t id, int n) {
    if (id < -1 || id >= n) return ft_err(FTUNE_ERR_FORMAT, "tokenizer: %s %d is outside the vocabulary (%d tokens)", what, id, n);
    return FTUNE_OK;
}

/* SPM merges run over a whole text fragment. A byte that no token built by
 * merging can contain splits the fragment into pieces that merge
 * independently, with the same result and much smaller work queues. A token
 * is built by merging if it is the result of a merge (MERGE_RANK), or
 * (MERGE_SCORE) if it splits into two pieces that are single characters or
 * themselves built by merging. */
static bool spm_boundaries(ftune_tokenizer *t) {
    const int V = t->n_vocab;
    uint8_t *made = ft_calloc((size_t)V, 1);
    if (!made) return false;
    if (t->merge_mode == MERGE_RANK) {
        for (size_t k = 0; k <= t->pair_mask; k++)
            if (t->pairs[k].key != UINT64_MAX) made[t->pairs[k].result] = 1;
    } else {
        uint32_t maxlen = 0;
        for (int i = 0; i < V; i++) if (t->key_len[i] > maxlen) maxlen = t->key_len[i];
        for (uint32_t len = 2; len <= maxlen; len++) /* shorter pieces first */
            for (int i = 0; i < V; i++) {
                if (t->key_len[i] != len || tok_lookup(t, tok_key(t, i), len) != i) continue;
                const char *s = tok_key(t, i);
                for (uint32_t k = (uint32_t)utf8_len((unsigned char)s[0]); k < len; k += (uint32_t)utf8_len((unsigned char)s[k])) {
                    int32_t a = tok_lookup(t, s, k), b = tok_lookup(t, s + k, len - k);
                    bool fa = (uint32_t)utf8_len((unsigned char)s[0]) == k || (a >= 0 && made[a]);
                    bool fb = (uint32_t)utf8_len((unsigned char)s[k]) == len - k || (b >= 0 && made[b]);
                    if (fa && fb) { made[i] = 1; break; }
                }
            }
    }
    for (int b = 0; b < 128; b++) t->boundary[b] = 1;
    for (int i = 0; i < V; i++)
        if (made[i]) {
            const unsigned char *s = (const unsigned char *)tok_key(t, i);
            for (uint32_t k = 0; k < t->key_len[i]; k++) if (s[k] < 128) t->boundary[s[k]] = 0;
        }
    free(made);
    return true;
}

ftune_status ft_tokenizer_build(ftune_tokenizer **out, const ft_vocab_spec *spec) {
    if (!out || !spec) return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_build: NULL argument");
    *out = NULL;
    if (spec->kind != FT_TOK_SPM && spec->kind != FT_TOK_BPE)
        return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_build: unknown tokenizer kind %d", (int)spec->kind);
    const int V = spec->n_vocab;
    if (V <= 0 || V > (1 << 24) || !spec->tokens)
        return ft_err(FTUNE_ERR_FORMAT, "tokenizer: bad vocabulary size %d", V);
    ftune_status st;
    if ((st = check_id("bos id", spec->bos_id, V)) || (st = check_id("eos id", spec->eos_id, V)) ||
        (st = check_id("unk id", spec->unk_id, V)) || (st = check_id("pad id", spec->pad_id, V)) ||
        (st = check_id("eot id", spec->eot_id, V)))
        return st;
    for (int i = 0; i < spec->n_eog_ids; i++)
        if ((st = check_id("end-of-generation id", spec->eog_ids[i], V))) return st;
    if (spec->n_merges < 0 || (spec->n_merges > 0 && !spec->merges))
        return ft_err(FTUNE_ERR_ARG, "ft_tokenizer_build: bad merge list");

    ftune_tokenizer *t = ft_calloc(1, sizeof *t);
    if (!t) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = spec->kind;
    t->n_vocab = V;
    st = FTUNE_ERR_NOMEM;

    size_t total = 0;
    for (int i = 0; i < V; i++) {
        if (!spec->tokens[i]) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer: token %d is missing", i); goto fail; }
        size_t l = spec->token_lens ? (size_t)spec->token_lens[i] : strlen(spec->tokens[i]);
        if (spec->token_lens && spec->token_lens[i] < 0) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer: token %d has a negative length", i); goto fail; }
        total += 3 * l + 1; /* stored + NUL, key, piece (each no longer than stored) */
    }
    if (total >= UINT32_MAX) { st = ft_err(FTUNE_ERR_FORMAT, "tokenizer: vocabulary strings too large"); goto fail; }
    t->arena = ft_malloc(total + 1);
    uint32_t *offs = ft_calloc((size_t)V * 6, sizeof *offs);
    t->score = ft_calloc((size_t)V, sizeof *t->score);
    t->type = ft_calloc((size_t)V, 1);
    t->eog = ft_calloc((size_t)V, 1);
    t->hash_mask = pow2_at_least(2 * (uint64_t)V) - 1;
    t->hash = ft_malloc(((size_t)t->hash_mask + 1) * sizeof *t->hash);
    if (!offs) goto fail;
    t->st_off = offs; t->st_len = offs + V; t->key_off = offs + 2 * V; t->key_len = offs + 3 * V;
    t->pc_off = offs + 4 * V; t->pc_len = offs + 5 * V;
    if (!t->arena || !t->score || !t->type || !t->eog || !t->hash) goto fail;
    memset(t->hash, 0xff, ((size_t)t->hash_mask + 1) * sizeof *t->hash);

    int16_t u2b[324];
    bytelevel_inverse(u2b);
    size_t pos = 0;
    for (int i = 0; i < V; i++) {
        const char *s = spec->tokens[i];
        size_t l = spec->token_lens ? (size_t)spec->token_lens[i] : strlen(s);
        int ty = spec->types ? spec->types[i] : FT_TOKTYPE_NORMAL;
        if (ty < FT_TOKTYPE_NORMAL || ty > FT_TOKTYPE_BYTE) ty = FT_TOKTYPE_NORMAL;
        int bv = parse_byte_token(s, l);
        if (spec->kind == FT_TOK_SPM && ty == FT_TOKTYPE_NORMAL && bv >= 0) ty = FT_TOKTYPE_BYTE;
        if (ty == FT_TOKTYPE_BYTE && bv < 0) ty = FT_TOKTYPE_NORMAL;
        t->type[i] = (uint8_t)ty;
        t->score[i] = spec->scores ? spec->scores[i] : 0.0f;

        t->st_off[i] = (uint32_t)pos; t->st_len[i] = (uint32_t)l;
        memcpy(t->arena + pos, s, l); t->arena[pos + l] = 0; pos += l + 1;

        /* key: what the algorithm matches against text */
        t->key_off[i] = t->st_off[i]; t->key_len[i] = (uint32_t)l;
        if (spec->kind == FT_TOK_BPE && ty == FT_TOKTYPE_NORMAL && !spec->raw_bytes) {
            int m = bytelevel_decode(u2b, s, l, t->arena + pos);
            if (m >= 0) { t->key_off[i] = (uint32_t)pos; t->key_len[i] = (uint32_t)m; pos += (size_t)m; }
        }
        /* piece: what it decodes to */
        t->pc_off[i] = t->key_off[i]; t->pc_len[i] = t->key_len[i];
        if (ty == FT_TOKTYPE_BYTE) {
            t->arena[pos] = (char)bv; t->pc_off[i] = (uint32_t)pos; t->pc_len[i] = 1; pos += 1;
        } else if (spec->kind == FT_TOK_SPM && ty == FT_TOKTYPE_NORMAL) {
            uint32_t o = (uint32_t)pos;
            for (size_t k = 0; k < l; k++) {
                if (k + 3 <= l && memcmp(s + k, "\xe2\x96\x81", 3) == 0) { t->arena[pos++] = ' '; k += 2; }
                else t->arena[pos++] = s[k];
            }
            t->pc_off[i] = o; t->pc_len[i] = (uint32_t)pos - o;
        }
        if ((int)t->pc_len[i] > t->max_piece) t->max_piece = (int)t->pc_len[i];
    }
    /* normal and byte tokens take precedence over others with the same text */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < V; i++) {
            bool plain = t->type[i] == FT_TOKTYPE_NORMAL || t->type[i] == FT_TOKTYPE_BYTE;
            if (plain == (pass == 0)) hash_insert(t, i);
        }

    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    for (int i = 0; i < V; i++) /* SPM-style <0xXX> tokens */
        if (t->type[i] == FT_TOKTYPE_BYTE) {
            int b = (unsigned char)t->arena[t->pc_off[i]];
            if (t->byte_tok[b] < 0) t->byte_tok[b] = i;
        }
    for (int b = 0; b < 256; b++)
        if (t->byte_tok[b] < 0) { char c = (char)b; t->byte_tok[b] = tok_lookup(t, &c, 1); }

    if (spec->kind == FT_TOK_SPM) {
        t->split_mode = SPLIT_CHARS;
        t->merge_mode = spec->n_merges > 0 || spec->strict_merges ? MERGE_RANK : MERGE_SCORE;
    } else {
        t->split_mode = SPLIT_BYTES;
        t->merge_mode = spec->n_merges > 0 || spec->strict_merges ? MERGE_RANK : MERGE_TOKRANK;
    }
    /* (a merge list, even an empty one, is the whole rule: no merges means
     * no merging, as in Hugging Face tokenizers, not merging by score/rank) */
    if (t->merge_mode == MERGE_RANK) {
        t->pair_mask = pow2_at_least(2 * (uint64_t)spec->n_merges) - 1;
        t->pairs = ft_malloc(((size_t)t->pair_mask + 1) * sizeof *t->pairs);
        size_t cap = 0;
        char *buf = NULL;
        if (!t->pairs) goto fail;
        for (size_t k = 0; k <= t->pair_mask; k++) t->pairs[k].key = UINT64_MAX;
        bool decode = spec->kind == FT_TOK_BPE && !spec->raw_bytes;
        for (int r = 0; r < spec->n_merges; r++) {
            const char *a = spec->merges[r], *b;
            size_t la, lb;
            if (!a) continue;
            if (spec->merges_right) {
                b = spec->merges_right[r];
                if (!b) continue;
                la = strlen(a); lb = strlen(b);
            } else {
                const char *sp = a[0] ? strchr(a + 1, ' ') : NULL;
                if (!sp && spec->strict_merges) {
                    free(buf);
                    st = ft_err(FTUNE_ERR_FORMAT, "tokenizer: merge %d \"%.60s\" is not two pieces", r, a);
                    goto fail;
                }
                if (!sp) continue;
                la = (size_t)(sp - a); b = sp + 1; lb = strlen(b);
            }
            if (!buf || 2 * (la + lb) > cap) {
                cap = 2 * (la + lb) + 64;
                char *nb = realloc(buf, cap);
                if (!nb) { free(buf); goto fail; }
                buf = nb;
            }
            int ma = (int)la, mb = (int)lb;
            if (decode) {
                ma = bytelevel_decode(u2b, a, la, buf);
                mb = ma < 0 ? -1 : bytelevel_decode(u2b, b, lb, buf + ma);
                if ((ma < 0 || mb < 0) && !spec->strict_merges) continue;
            } else {
                memcpy(buf, a, la); memcpy(buf + la, b, lb);
            }
            bool ok = ma >= 0 && mb >= 0; /* byte-level text that decodes */
            int32_t ia = ok ? tok_lookup(t, buf, (size_t)ma) : -1, ib = ok ? tok_lookup(t, buf + ma, (size_t)mb) : -1;
            int32_t ir = ok ? tok_lookup(t, buf, (size_t)(ma + mb)) : -1;
            if (spec->strict_merges && (ia < 0 || ib < 0 || ir < 0)) {
                const char *what = ma < 0 || ia < 0 ? "left piece" : mb < 0 || ib < 0 ? "right piece" : "result";
                st = ft_err(FTUNE_ERR_FORMAT, "tokenizer: merge %d (\"%.*s\" \"%.*s\"): the %s is not in the vocabulary",
                            r, (int)(la > 60 ? 60 : la), a, (int)(lb > 60 ? 60 : lb), b, what);
                free(buf);
                goto fail;
            }
            if (ia >= 0 && ib >= 0 && ir >= 0) pair_insert(t, ia, ib, r, ir);
        }
        free(buf);
    }

    if (spec->kind == FT_TOK_SPM && !spm_boundaries(t)) goto fail;

    if (spec->kind == FT_TOK_BPE) {
        if (spec->n_pre_regexes > 0) {
            for (int i = 0; i < spec->n_pre_regexes; i++)
                if ((st = compile_regex(t, spec->pre_regexes[i]))) goto fail;
        } else {
            const char *name = spec->pre && spec->pre[0] ? spec->pre : "default";
            const pre_def *pd = find_pre(name);
            if (!pd) { st = ft_err(FTUNE_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer \"%s\"", name); goto fail; }
            for (int i = 0; i < 6 && pd->re[i]; i++)
                if ((st = compile_regex(t, pd->re[i]))) goto fail;
            if (pd->ignore_merges) t->ignore_merges = 1;
        }
    }
    if (spec->ignore_merges) t->ignore_merges = 1;

    /* from here on a failure is out of memory (compile_regex above may have
     * left st at FTUNE_OK, and fail: must never return OK without a tokenizer) */
    st = FTUNE_ERR_NOMEM;
    /* special tokens, longest first */
    len_id *sp = ft_malloc((size_t)V * sizeof *sp);
    if (!sp) goto fail;
    for (int i = 0; i < V; i++) {
        int ty = t->type[i];
        if ((ty == FT_TOKTYPE_CONTROL || ty == FT_TOKTYPE_USER_DEFINED || ty == FT_TOKTYPE_UNKNOWN) && t->st_len[i] > 0)
            sp[t->n_special++] = (len_id){ t->st_len[i], i };
    }
    qsort(sp, (size_t)t->n_special, sizeof *sp, cmp_special);
    t->special = ft_malloc((size_t)(t->n_special ? t->n_special : 1) * sizeof *t->special);
    if (!t->special) { free(sp); goto fail; }
    for (int i = 0; i < t->n_special; i++) {
        t->special[i] = sp[i].id;
        t->special_first[(unsigned char)t->arena[t->st_off[sp[i].id]]] = 1;
    }
    free(sp);

    if (spec->strip) {
        if (!(t->strip = ft_malloc((size_t)V))) goto fail;
        memcpy(t->strip, spec->strip, (size_t)V);
    }
    t->bos = spec->bos_id; t->eos = spec->eos_id; t->unk = spec->unk_id;
    t->pad = spec->pad_id; t->eot = spec->eot_id;
    t->add_bos = spec->add_bos && t->bos >= 0;
    t->add_eos = spec->add_eos && t->eos >= 0;
    t->add_space_prefix = spec->kind == FT_TOK_SPM && spec->add_space_prefix;
    t->nfc = spec->nfc;
    t->raw_bytes = spec->kind == FT_TOK_BPE && spec->raw_bytes;
    if (spec->chat_template && !(t->chat_template = ft_strdup(spec->chat_template))) { st = FTUNE_ERR_NOMEM; goto fail; }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    for (int i = 0; i < spec->n_eog_ids; i++) if (spec->eog_ids[i] >= 0) t->eog[spec->eog_ids[i]] = 1;
    for (int i = 0; i < V; i++) {
        if (t->type[i] != FT_TOKTYPE_CONTROL && t->type[i] != FT_TOKTYPE_USER_DEFINED) continue;
        for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++)
            if (strcmp(t->arena + t->st_off[i], eog_texts[k]) == 0) t->eog[i] = 1;
    }
    *out = t;
    return FTUNE_OK;
fail:
    if (st == FTUNE_ERR_NOMEM) ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory building a %d-token vocabulary", V);
    ft_tokenizer_free(t);
    return st;
}

void ft_tokenizer_free(ftune_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) { pcre2_code_free(t->re[i]); free(t->re_src[i]); }
    free(t->arena);
    free(t->st_off);
    free(t->score);
    free(t->type);
    free(t->eog);
    free(t->strip);
    free(t->hash);
    free(t->pairs);
    free(t->special);
    free(t->chat_template);
    free(t);
}

const char *ft_tokenizer_chat_template(const ftune_tokenizer *t) { return t ? t->chat_template : NULL; }

/* ------------------------------------------------------------- merging */

typedef struct { int32_t *v; size_t n, cap; } ivec;

static bool ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 256;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return false;
        a->v = nv; a->cap = nc;
    }
    a->v[a->n++] = x;
    return true;
}

typedef struct { int32_t start, n, prev, next, id; } sym_t;
typedef struct { double key; int32_t left, right, size, id; } cand_t; /* lower key merges first */

typedef struct {
    const ftune_tokenizer *t;
    ivec *out;
    sym_t *sym; size_t sym_cap;
    cand_t *heap; size_t heap_n, heap_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    char *buf; size_t buf_cap;   /* SPM: the escaped text */
    bool oom;
} work_t;

static inline bool cand_better(const cand_t *a, const cand_t *b) {
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(work_t *w, cand_t c) {
    if (w->heap_n == w->heap_cap) {
        size_t nc = w->heap_cap ? 2 * w->heap_cap : 256;
        cand_t *nh = realloc(w->heap, nc * sizeof *nh);
        if (!nh) { w->oom = true; return; }
        w->heap = nh; w->heap_cap = nc;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_better(&c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static cand_t heap_pop(work_t *w) {
    cand_t top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const cand_t *bc = &last;
        if (l < n && cand_better(&w->heap[l], bc)) { best = l; bc = &w->heap[l]; }
        if (l + 1 < n && cand_better(&w->heap[l + 1], bc)) best = l + 1;
        if (best == i) break;
        w->heap[i] = w->heap[best];
        i = best;
    }
    if (n > 0) w->heap[i] = last;
    return top;
}

static inline int32_t lookup_normal(const ftune_tokenizer *t, const char *s, size_t n) {
    int32_t id = tok_lookup(t, s, n);
    return id >= 0 && t->type[id] == FT_TOKTYPE_NORMAL ? id : -1;
}

static void try_pair(work_t *w, const char *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const ftune_tokenizer *t = w->t;
    const sym_t *a = &w->sym[l], *b = &w->sym[r];
    cand_t c = { 0, l, r, a->n + b->n, -1 };
    switch (t->merge_mode) {
    case MERGE_SCORE:
        c.id = tok_lookup(t, s + a->start, (size_t)c.size);
        if (c.id < 0) return;
        c.key = -(double)t->score[c.id];
        break;
    case MERGE_TOKRANK:
        c.id = lookup_normal(t, s + a->start, (size_t)c.size);
        if (c.id < 0) return;
        c.key = c.id;
        break;
    default: {
        if (a->id < 0 || b->id < 0) return;
        const pair_slot *p = pair_find(t, a->id, b->id);
        if (!p) return;
        c.key = p->rank;
        c.id = p->result;
    }
    }
    heap_push(w, c);
}

static void emit_bytes(work_t *w, const char *s, int32_t n) {
    const ftune_tokenizer *t = w->t;
    for (int32_t k = 0; k < n; k++) {
        int32_t bt = t->byte_tok[(unsigned char)s[k]];
        if (bt < 0 && t->kind == FT_TOK_SPM) bt = t->unk;
        if (bt >= 0 && !ivec_push(w->out, bt)) w->oom = true;
    }
}

static bool grow_syms(work_t *w, size_t n) {
    if (n <= w->sym_cap) return true;
    size_t nc = w->sym_cap ? w->sym_cap : 64;
    while (nc < n) nc *= 2;
    sym_t *ns = realloc(w->sym, nc * sizeof *ns);
    if (!ns) { w->oom = true; return false; }
    w->sym = ns; w->sym_cap = nc;
    return true;
}

/* Merges one word s[0..n) and appends its tokens. */
static void merge_word(work_t *w, const char *s, int32_t n) {
    const ftune_tokenizer *t = w->t;
    if (n <= 0) return;
    if (t->ignore_merges) {
        int32_t id = lookup_normal(t, s, (size_t)n);
        if (id >= 0) { if (!ivec_push(w->out, id)) w->oom = true; return; }
    }
    if (!grow_syms(w, (size_t)n)) return;
    int32_t ns = 0;
    if (t->split_mode == SPLIT_BYTES) {
        for (int32_t i = 0; i < n; i++)
            w->sym[ns++] = (sym_t){ i, 1, 0, 0, t->byte_tok[(unsigned char)s[i]] };
    } else {
        for (int32_t i = 0; i < n;) {
            int32_t cl = utf8_len((unsigned char)s[i]);
            if (cl > n - i) cl = n - i;
            if (t->merge_mode == MERGE_RANK) {
                int32_t id = tok_lookup(t, s + i, (size_t)cl);
                if (id >= 0) w->sym[ns++] = (sym_t){ i, cl, 0, 0, id };
                else for (int32_t k = 0; k < cl; k++) /* byte fallback pieces merge like any other */
                    w->sym[ns++] = (sym_t){ i + k, 1, 0, 0, t->byte_tok[(unsigned char)s[i + k]] };
            } else {
                w->sym[ns++] = (sym_t){ i, cl, 0, 0, -1 };
            }
            i += cl;
        }
    }
    for (int32_t i = 0; i < ns; i++) { w->sym[i].prev = i - 1; w->sym[i].next = i + 1 < ns ? i + 1 : -1; }

    w->heap_n = 0;
    for (int32_t i = 1; i < ns; i++) try_pair(w, s, i - 1, i);
    while (w->heap_n > 0) {
        cand_t c = heap_pop(w);
        sym_t *a = &w->sym[c.left], *b = &w->sym[c.right];
        if (a->n == 0 || b->n == 0 || a->n + b->n != c.size) continue; /* stale */
        a->n += b->n;
        a->id = c.id;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0) w->sym[b->next].prev = c.left;
        try_pair(w, s, a->prev, c.left);
        try_pair(w, s, c.left, a->next);
    }
    for (int32_t i = 0; i >= 0; i = w->sym[i].next) {
        const sym_t *y = &w->sym[i];
        int32_t id = y->id;
        if (t->merge_mode == MERGE_SCORE) id = tok_lookup(t, s + y->start, (size_t)y->n);
        else if (t->merge_mode == MERGE_TOKRANK) id = lookup_normal(t, s + y->start, (size_t)y->n);
        if (id >= 0) { if (!ivec_push(w->out, id)) w->oom = true; }
        else emit_bytes(w, s + y->start, y->n);
    }
}

/* ------------------------------------------------------------- pre-tokenization */

/* Splits s[0..n) with regex `level` into matches and the gaps between them,
 * and passes each piece on to the next regex; the last level merges words. */
static FTUNE_MUST_USE ftune_status split_level(work_t *w, int level, const char *s, size_t n) {
    const ftune_tokenizer *t = w->t;
    if (n == 0) return FTUNE_OK;
    if (level == t->n_re) {
        if (n > INT32_MAX) return ft_err(FTUNE_ERR_RANGE, "tokenize: a %zu-byte word", n);
        merge_word(w, s, (int32_t)n);
        return w->oom ? ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory") : FTUNE_OK;
    }
    size_t pos = 0, last = 0;
    while (pos < n) {
        int rc = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, w->md, w->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ft_err(FTUNE_ERR_RANGE, "tokenize: pre-tokenizer regex %d failed: %s", level, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* empty match: no piece, step one character */
            pos = ms + (size_t)utf8_len((unsigned char)s[ms]);
            continue;
        }
        ftune_status st;
        if (ms > last && (st = split_level(w, level + 1, s + last, ms - last))) return st;
        if ((st = split_level(w, level + 1, s + ms, me - ms))) return st;
        last = pos = me;
    }
    if (last < n) return split_level(w, level + 1, s + last, n - last);
    return FTUNE_OK;
}

/* ------------------------------------------------------------- encode */

typedef struct { size_t off, len; int32_t id; } frag_t; /* id >= 0: a special token */

typedef struct { frag_t *v; size_t n, cap; } fvec;

static bool fvec_push(fvec *a, frag_t f) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 16;
        frag_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return false;
        a->v = nv; a->cap = nc;
    }
    a->v[a->n++] = f;
    return true;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Cuts special tokens out of the text, one token at a time, longest first;
 * a token with lstrip/rstrip takes the whitespace beside it along. */
static FTUNE_MUST_USE ftune_status partition_specials(const ftune_tokenizer *t, const char *text, size_t len,
                                       int parse_special, fvec *frags) {
    if (!fvec_push(frags, (frag_t){ 0, len, -1 })) return ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory");
    if (t->n_special == 0) return FTUNE_OK;
    /* which special tokens occur at all: most texts contain none */
    uint8_t *present = ft_calloc((size_t)t->n_special, 1);
    if (!present) return ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory");
    bool any = false;
    for (int c = 0; c < 256; c++) {
        if (!t->special_first[c]) continue;
        for (const char *p = memchr(text, c, len); p; p = memchr(p + 1, c, len - (size_t)(p + 1 - text))) {
            size_t left = len - (size_t)(p - text);
            for (int k = 0; k < t->n_special; k++) {
                int32_t id = t->special[k];
                if (t->st_len[id] <= left && (unsigned char)t->arena[t->st_off[id]] == c &&
                    memcmp(p, t->arena + t->st_off[id], t->st_len[id]) == 0) { present[k] = 1; any = true; }
            }
            if (p + 1 >= text + len) break;
        }
    }
    if (!any) { free(present); return FTUNE_OK; }
    fvec next = {0};
    ftune_status st = FTUNE_OK;
    for (int k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        int ty = t->type[id];
        if (!parse_special && (ty == FT_TOKTYPE_CONTROL || ty == FT_TOKTYPE_UNKNOWN)) continue;
        const char *sp = t->arena + t->st_off[id];
        size_t sl = t->st_len[id];
        if (!present[k]) continue;
        next.n = 0;
        for (size_t f = 0; f < frags->n; f++) {
            frag_t fr = frags->v[f];
            if (fr.id >= 0) { if (!fvec_push(&next, fr)) goto oom; continue; }
            size_t off = fr.off, end = fr.off + fr.len;
            int strip = t->strip ? t->strip[id] : 0;
            for (;;) {
                const char *m = memmem(text + off, end - off, sp, sl);
                if (!m) break;
                size_t mo = (size_t)(m - text), left = mo;
                if (strip & 1) while (left > off && is_space(text[left - 1])) left--;
                if (left > off && !fvec_push(&next, (frag_t){ off, left - off, -1 })) goto oom;
                if (!fvec_push(&next, (frag_t){ mo, sl, id })) goto oom;
                off = mo + sl;
                if (strip & 2) while (off < end && is_space(text[off])) off++;
            }
            if (off < end && !fvec_push(&next, (frag_t){ off, end - off, -1 })) goto oom;
        }
        fvec tmp = *frags; *frags = next; next = tmp;
    }
    free(next.v);
    free(present);
    return st;
oom:
    free(next.v);
    free(present);
    return ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory");
}

/* SPM: escape spaces as "▁" (with the prefix) and merge the whole fragment. */
static FTUNE_MUST_USE ftune_status spm_fragment(work_t *w, const char *s, size_t n, bool prefix) {
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    size_t need = n + 2 * spaces + (prefix ? 3 : 0);
    if (need > INT32_MAX) return ft_err(FTUNE_ERR_RANGE, "tokenize: text of %zu bytes is too long", n);
    if (need > w->buf_cap) {
        char *nb = realloc(w->buf, need);
        if (!nb) return ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory");
        w->buf = nb; w->buf_cap = need;
    }
    size_t o = 0;
    if (prefix) { memcpy(w->buf, "\xe2\x96\x81", 3); o = 3; }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(w->buf + o, "\xe2\x96\x81", 3); o += 3; }
        else w->buf[o++] = s[i];
    }
    size_t start = 0;
    for (size_t i = 0; i < o; i++)
        if (w->t->boundary[(unsigned char)w->buf[i]]) {
            merge_word(w, w->buf + start, (int32_t)(i - start));
            merge_word(w, w->buf + i, 1);
            start = i + 1;
        }
    merge_word(w, w->buf + start, (int32_t)(o - start));
    return w->oom ? ft_err(FTUNE_ERR_NOMEM, "tokenize: out of memory") : FTUNE_OK;
}

ftune_status ft_tokenize_ex(const ftune_tokenizer *t, const char *text, size_t len,
                            int add_bos, int add_eos, int parse_special,
                            int32_t **ids, size_t *n_ids) {
    if (!t || !ids || !n_ids || (!text && len)) return ft_err(FTUNE_ERR_ARG, "ftune_tokenize: NULL argument");
    *ids = NULL; *n_ids = 0;
    if (len > INT32_MAX) return ft_err(FTUNE_ERR_RANGE, "ftune_tokenize: text of %zu bytes is too long", len);
    int64_t bad = len ? ft_utf8_invalid_at(text, len) : -1;
    if (bad >= 0) return ft_err(FTUNE_ERR_ARG, "ftune_tokenize: invalid UTF-8 at byte offset %lld", (long long)bad);
    char *nfc = NULL; /* the text in NFC, when the tokenizer normalizes and it changes */
    size_t nfc_len = 0;
    if (t->nfc && len > 0) {
        ftune_status sn = ft_nfc(text, len, &nfc, &nfc_len);
        if (sn) return sn;
        if (nfc) { text = nfc; len = nfc_len; }
    }

    ivec out = {0};
    work_t w = { .t = t, .out = &out };
    fvec frags = {0};
    ftune_status st = FTUNE_OK;
    if (add_bos && t->bos >= 0 && !ivec_push(&out, t->bos)) goto oom;
    if (len > 0 && (st = partition_specials(t, text, len, parse_special, &frags))) goto done;
    if (t->kind == FT_TOK_BPE && frags.n > 0) {
        w.md = pcre2_match_data_create(16, NULL);
        w.mctx = pcre2_match_context_create(NULL);
        w.jit = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, NULL);
        if (!w.md || !w.mctx || !w.jit) goto oom;
        pcre2_jit_stack_assign(w.mctx, NULL, w.jit);
    }
    bool prev_special = true; /* SPM: the first fragment gets the "▁" prefix */
    for (size_t f = 0; f < frags.n; f++) {
        frag_t fr = frags.v[f];
        if (fr.id >= 0) {
            if (!ivec_push(&out, fr.id)) goto oom;
            prev_special = true;
        } else if (t->kind == FT_TOK_SPM) {
            if ((st = spm_fragment(&w, text + fr.off, fr.len, t->add_space_prefix && prev_special))) goto done;
            prev_special = false;
        } else {
            if ((st = split_level(&w, 0, text + fr.off, fr.len))) goto done;
        }
    }
    if (add_eos && t->eos >= 0 && !ivec_push(&out, t->eos)) goto oom;
    goto done;
oom:
    st = ft_err(FTUNE_ERR_NOMEM, "ftune_tokenize: out of memory");
done:
    free(nfc);
    free(frags.v);
    free(w.sym);
    free(w.heap);
    free(w.buf);
    if (w.md) pcre2_match_data_free(w.md);
    if (w.mctx) pcre2_match_context_free(w.mctx);
    if (w.jit) pcre2_jit_stack_free(w.jit);
    if (st) { free(out.v); return st; }
    if (!out.v) { out.v = ft_malloc(sizeof *out.v); if (!out.v) return ft_err(FTUNE_ERR_NOMEM, "ftune_tokenize: out of memory"); }
    *ids = out.v;
    *n_ids = out.n;
    return FTUNE_OK;
}

ftune_status ftune_tokenize(const ftune_tokenizer *t, const char *text, size_t len,
                            int add_bos, int parse_special, int32_t **ids, size_t *n_ids) {
    return ft_tokenize_ex(t, text, len, add_bos, 0, parse_special, ids, n_ids);
}

/* ------------------------------------------------------------- decode and queries */

int ftune_token_to_piece(const ftune_tokenizer *t, int32_t prev, int32_t id, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab || cap < 0 || (!buf && cap > 0)) return -1;
    const char *p = t->arena + t->pc_off[id];
    int n = (int)t->pc_len[id];
    /* SentencePiece drops the space its prefix added, after BOS (as llama2.c does) */
    if (t->add_space_prefix && prev >= 0 && prev == t->bos && n > 0 && p[0] == ' ') { p++; n--; }
    if (n > cap) n = cap;
    if (n > 0) memcpy(buf, p, (size_t)n);
    return n;
}

int32_t ftune_tokenizer_bos(const ftune_tokenizer *t) { return t ? t->bos : -1; }
int32_t ftune_tokenizer_eos(const ftune_tokenizer *t) { return t ? t->eos : -1; }
int ftune_tokenizer_is_eog(const ftune_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && t->eog[id];
}
int ftune_tokenizer_n_vocab(const ftune_tokenizer *t) { return t ? t->n_vocab : 0; }
int ftune_tokenizer_add_bos(const ftune_tokenizer *t) { return t ? t->add_bos : 0; }

const char *ft_tokenizer_token(const ftune_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->arena + t->st_off[id];
}
ft_tok_kind ft_tokenizer_kind(const ftune_tokenizer *t) { return t->kind; }
int ft_tokenizer_token_len(const ftune_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab ? (int)t->st_len[id] : -1;
}
int ft_tokenizer_type(const ftune_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab ? t->type[id] : 0;
}
int32_t ft_tokenizer_find(const ftune_tokenizer *t, const char *s, size_t n) {
    if (!t || !s) return -1;
    for (int i = 0; i < t->n_vocab; i++)
        if (t->st_len[i] == n && memcmp(t->arena + t->st_off[i], s, n) == 0) return i;
    return -1;
}
int ft_tokenizer_max_piece(const ftune_tokenizer *t) { return t ? t->max_piece : 0; }

/* What a GGUF writer needs beyond the token strings and types (tokenizer_gguf.c). */
float ft_tokenizer_score(const ftune_tokenizer *t, int32_t id) {
    return t && t->score && id >= 0 && id < t->n_vocab ? t->score[id] : 0.0f;
}
void ft_tokenizer_special(const ftune_tokenizer *t, ft_tokenizer_specials *out) {
    *out = (ft_tokenizer_specials){ .bos = t->bos, .eos = t->eos, .unk = t->unk, .pad = t->pad, .eot = t->eot,
                                    .add_bos = t->add_bos, .add_eos = t->add_eos,
                                    .add_space_prefix = t->add_space_prefix };
}

/* What a tokenizer.json writer needs beyond the tokens (tokenizer_hf.c). */
void ft_tokenizer_get_rules(const ftune_tokenizer *t, ft_tokenizer_rules *out) {
    memset(out, 0, sizeof *out);
    out->merge_rule = t->merge_mode == MERGE_SCORE ? FT_MERGES_BY_SCORE
                    : t->merge_mode == MERGE_TOKRANK ? FT_MERGES_BY_TOKEN_RANK : FT_MERGES_BY_RANK;
    out->ignore_merges = t->ignore_merges;
    out->nfc = t->nfc;
    out->raw_bytes = t->raw_bytes;
    out->n_re = t->n_re;
    for (int i = 0; i < t->n_re; i++) out->re[i] = t->re_src[i];
}

int ft_tokenizer_strip(const ftune_tokenizer *t, int32_t id) {
    return t && t->strip && id >= 0 && id < t->n_vocab ? t->strip[id] : 0;
}

static int cmp_rank(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

ftune_status ft_tokenizer_merge_list(const ftune_tokenizer *t, int32_t **merges, int *n) {
    *merges = NULL;
    *n = 0;
    if (t->merge_mode != MERGE_RANK) return FTUNE_OK;
    size_t cnt = 0;
    for (size_t k = 0; k <= t->pair_mask; k++) cnt += t->pairs[k].key != UINT64_MAX;
    int32_t *v = ft_malloc((cnt ? cnt : 1) * 4 * sizeof *v); /* (rank, left, right, result) */
    if (!v) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory");
    size_t i = 0;
    for (size_t k = 0; k <= t->pair_mask; k++) {
        const pair_slot *p = &t->pairs[k];
        if (p->key == UINT64_MAX) continue;
        v[4 * i] = p->rank;
        v[4 * i + 1] = (int32_t)(p->key >> 32);
        v[4 * i + 2] = (int32_t)(uint32_t)p->key;
        v[4 * i + 3] = p->result;
        i++;
    }
    qsort(v, cnt, 4 * sizeof *v, cmp_rank); /* ranks are distinct: one pair per rank */
    for (i = 0; i < cnt; i++) { v[3 * i] = v[4 * i + 1]; v[3 * i + 1] = v[4 * i + 2]; v[3 * i + 2] = v[4 * i + 3]; }
    *merges = v;
    *n = (int)cnt;
    return FTUNE_OK;
}
