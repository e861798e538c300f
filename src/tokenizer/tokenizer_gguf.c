/* tokenizer_gguf.c — a tokenizer written as GGUF metadata (tokenizer.ggml.*,
 * as llama.cpp reads it), for the model writer's GGUF output from a base that
 * is not GGUF. A byte-level BPE vocabulary needs its merge list and
 * pre-tokenizer name from the files beside it: tokenizer.json, merges.txt,
 * or a tiktoken tokenizer.model, whose merges are made here as llama.cpp's
 * converter makes them. */
#include "tokenizer/tokenizer.h"
#include "formats/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Byte-level BPE (tokenizer.ggml.model "gpt2") needs what the model's
 * tokenizer does not keep as text: the merge list, and the pre-tokenizer
 * under the name llama.cpp gives it. Both come from the Hugging Face base's
 * tokenizer.json (or merges.txt beside vocab.json, GPT-2's layout), or are
 * made from a tiktoken tokenizer.model (Llama 3). */
typedef struct {
    char *buf;               /* the merges, NUL-separated */
    const char **merges;     /* (n) "a b" */
    int n;
    const char *pre;         /* tokenizer.ggml.pre */
    char *tokbuf;            /* tiktoken: token texts in GPT-2's alphabet, NUL-separated */
    const char **tok_text;   /* (n_tok_text) they replace the stored raw bytes, or NULL */
    int n_tok_text;
} bpe_extra;

#define HF_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define HF_RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define HF_RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The split regexes of a tokenizer.json pre_tokenizer, in order; false for
 * a kind this table does not know. */
static bool hf_split_regexes(const cJSON *pt, const char **re, int *n, int cap) {
    if (!pt || cJSON_IsNull(pt)) return true;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(ty)) return false;
    const char *t = ty->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"))
            if (!hf_split_regexes(it, re, n, cap)) return false;
        return true;
    }
    if (*n >= cap) return false;
    if (!strcmp(t, "ByteLevel")) {
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pt, "use_regex"))) return true;
        re[(*n)++] = HF_RE_GPT2;
        return true;
    }
    if (!strcmp(t, "Split")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
        if (!cJSON_IsString(r)) return false;
        re[(*n)++] = r->valuestring;
        return true;
    }
    if (!strcmp(t, "Digits") && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "individual_digits"))) {
        re[(*n)++] = "\\p{N}";
        return true;
    }
    return false;
}

/* llama.cpp's name for a pre-tokenizer (llama-vocab.cpp), or NULL. */
static const char *llama_pre_name(const char *const *re, int n) {
    static const struct { const char *name; int n; const char *re[2]; } known[] = {
        { "llama-bpe", 1, { HF_RE_LLAMA3 } }, { "qwen2", 1, { HF_RE_QWEN2 } },
        { "gpt-2", 1, { HF_RE_GPT2 } },       { "smollm", 2, { "\\p{N}", HF_RE_GPT2 } },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        bool same = known[i].n == n;
        for (int j = 0; same && j < n; j++) same = strcmp(known[i].re[j], re[j]) == 0;
        if (same) return known[i].name;
    }
    return NULL;
}

static void bpe_extra_free(bpe_extra *b) {
    free(b->buf);
    free(b->merges);
    free(b->tokbuf);
    free(b->tok_text);
}

/* GPT-2's byte -> unicode map, UTF-8 encoded: the bytes GGUF and
 * tokenizer.json token texts are written in (printable Latin-1 bytes stand
 * for themselves, the others for U+0100 onwards, in byte order). */
static void gpt2_byte_map(char map[256][3]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = keep ? b : 256 + n++;
        if (cp < 0x80) { map[b][0] = (char)cp; map[b][1] = 0; }
        else { map[b][0] = (char)(0xC0 | (cp >> 6)); map[b][1] = (char)(0x80 | (cp & 0x3F)); map[b][2] = 0; }
    }
}

static int b64_val(int c) {
    return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
         : c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* A tiktoken tokenizer.model (Llama 3's: "base64 rank" per line, ranks
 * 0, 1, 2, ...) has no merge list; it is made as llama.cpp's converter gets
 * it (transformers' TikTokenConverter): for each token in rank order, every
 * split into two tokens, ordered by (left rank, right rank). Merging by
 * these ranks is then tiktoken's lowest-rank-first BPE. */
static FTUNE_MUST_USE ftune_status read_tiktoken_extra(const char *path, bpe_extra *b) {
    char *text = NULL;
    size_t size = 0;
    ftune_status st = ft_read_file(path, &text, &size);
    if (st) return st;
    int n = 0;
    for (size_t i = 0; i < size; i++) n += text[i] == '\n';
    uint8_t *bytes = ft_malloc(size + 1);                  /* every token's bytes, back to back */
    uint32_t *off = ft_calloc((size_t)n + 2, sizeof *off);  /* token i is bytes[off[i] .. off[i+1]) */
    uint32_t hcap = 1;
    while (hcap < 2u * (uint32_t)n + 2) hcap <<= 1;
    int32_t *hash = ft_malloc((size_t)hcap * sizeof *hash);
    int32_t *parts = ft_malloc(256 * 3 * sizeof *parts); /* (left rank, right rank, cut) of each split */
    char map[256][3];
    gpt2_byte_map(map);
    if (!bytes || !off || !hash || !parts) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (uint32_t i = 0; i < hcap; i++) hash[i] = -1;
    int k = 0;
    uint32_t o = 0;
    for (char *line = text, *next; line < text + size && *line; line = next) {
        next = memchr(line, '\n', (size_t)(text + size - line));
        next = next ? next + 1 : text + size;
        char *sp = memchr(line, ' ', (size_t)(next - line));
        long rank = sp ? strtol(sp + 1, NULL, 10) : -1;
        if (!sp || rank != k) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: expected \"base64 %d\"", path, k + 1, k); goto done; }
        off[k] = o;
        uint32_t acc = 0;
        int nbits = 0;
        for (char *c = line; c < sp && *c != '='; c++) {
            int v = b64_val((unsigned char)*c);
            if (v < 0) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: not base64", path, k + 1); goto done; }
            acc = (acc << 6) | (uint32_t)v;
            if ((nbits += 6) >= 8) { nbits -= 8; bytes[o++] = (uint8_t)(acc >> nbits); }
        }
        if (o == off[k] || o - off[k] > 256) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: token of %u bytes", path, k + 1, o - off[k]); goto done; }
        uint64_t h = 0xcbf29ce484222325ull;
        for (uint32_t j = off[k]; j < o; j++) { h ^= bytes[j]; h *= 0x100000001b3ull; }
        uint32_t slot = (uint32_t)h & (hcap - 1);
        while (hash[slot] >= 0) slot = (slot + 1) & (hcap - 1);
        hash[slot] = k;
        k++;
    }
    off[k] = o;
    n = k;
#define RANK_OF(P, L, OUT) do { \
        uint64_t h_ = 0xcbf29ce484222325ull; \
        for (uint32_t j_ = 0; j_ < (L); j_++) { h_ ^= (P)[j_]; h_ *= 0x100000001b3ull; } \
        uint32_t s_ = (uint32_t)h_ & (hcap - 1); (OUT) = -1; \
        for (; hash[s_] >= 0; s_ = (s_ + 1) & (hcap - 1)) \
            if (off[hash[s_] + 1] - off[hash[s_]] == (L) && !memcmp(bytes + off[hash[s_]], (P), (L))) { (OUT) = hash[s_]; break; } \
    } while (0)
    /* token texts (n of them, each byte up to 2 UTF-8 bytes); the merges are counted in a first pass and
     * written in a second */
    size_t tb = 3 * (size_t)o + (size_t)n, mb = 0, mcount = 0;
    b->tokbuf = ft_malloc(tb);
    b->tok_text = ft_calloc((size_t)n, sizeof *b->tok_text);
    if (!b->tokbuf || !b->tok_text) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    size_t to = 0, mo = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            b->buf = ft_malloc(mb ? mb : 1);
            b->merges = ft_calloc(mcount ? mcount : 1, sizeof *b->merges);
            if (!b->buf || !b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        }
        for (int i = 0; i < n; i++) {
            const uint8_t *p = bytes + off[i];
            uint32_t len = off[i + 1] - off[i];
            if (pass == 0) {
                b->tok_text[i] = b->tokbuf + to;
                for (uint32_t j = 0; j < len; j++) to += (size_t)sprintf(b->tokbuf + to, "%s", map[p[j]]);
                b->tokbuf[to++] = 0;
            }
            if (len < 2) continue;
            /* every split into two tokens, by (left rank, right rank) */
            int np = 0;
            for (uint32_t cut = 1; cut < len; cut++) {
                int rl, rr;
                RANK_OF(p, cut, rl);
                RANK_OF(p + cut, len - cut, rr);
                if (rl < 0 || rr < 0) continue;
                int at = np++;
                while (at > 0 && (parts[3 * (at - 1)] > rl || (parts[3 * (at - 1)] == rl && parts[3 * (at - 1) + 1] > rr))) {
                    memcpy(parts + 3 * at, parts + 3 * (at - 1), 3 * sizeof *parts);
                    at--;
                }
                parts[3 * at] = rl;
                parts[3 * at + 1] = rr;
                parts[3 * at + 2] = (int32_t)cut;
            }
            if (np == 0) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: token of rank %d is not two tokens joined", path, i + 1, i);
                goto done;
            }
            if (pass == 0) {
                mcount += (size_t)np;
                for (uint32_t j = 0; j < len; j++) mb += (size_t)np * strlen(map[p[j]]);
                mb += 2 * (size_t)np;
                continue;
            }
            for (int q = 0; q < np; q++) {
                uint32_t cut = (uint32_t)parts[3 * q + 2];
                b->merges[b->n++] = b->buf + mo;
                for (uint32_t j = 0; j < cut; j++) mo += (size_t)sprintf(b->buf + mo, "%s", map[p[j]]);
                b->buf[mo++] = ' ';
                for (uint32_t j = cut; j < len; j++) mo += (size_t)sprintf(b->buf + mo, "%s", map[p[j]]);
                b->buf[mo++] = 0;
            }
        }
    }
#undef RANK_OF
    b->n_tok_text = n;
    b->pre = "llama-bpe"; /* Llama 3's pattern, the only tiktoken file ftune reads */
done:
    free(text);
    free(bytes);
    free(off);
    free(hash);
    free(parts);
    return st;
}


static FTUNE_MUST_USE ftune_status read_bpe_extra(const char *bdir, bpe_extra *b) {
    memset(b, 0, sizeof *b);
    if (!bdir)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "merge: a byte-level BPE tokenizer is written to GGUF only from a Hugging "
                      "Face directory's tokenizer.json or merges.txt");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", bdir);
    bool json = ft_file_exists(path);
    if (!json) snprintf(path, sizeof path, "%s/merges.txt", bdir);
    if (!json && !ft_file_exists(path)) {
        snprintf(path, sizeof path, "%s/tokenizer.model", bdir);
        if (ft_file_exists(path)) return read_tiktoken_extra(path, b);
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: no tokenizer.json, merges.txt or tiktoken tokenizer.model: the BPE "
                      "merges cannot be written to GGUF", bdir);
    }
    char *text = NULL;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *root = NULL;
    size_t total = 0;
    int cap = 0;
    if (json) {
        root = cJSON_Parse(text);
        const cJSON *mer = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "merges");
        if (!cJSON_IsArray(mer)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: no model.merges list", path); goto done; }
        const char *re[8];
        int nre = 0;
        if (!hf_split_regexes(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), re, &nre, 8) ||
            !(b->pre = llama_pre_name(re, nre))) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: the pre_tokenizer is not one llama.cpp names here (Llama 3, "
                        "Qwen2, GPT-2 or SmolLM regexes); tokenizer.ggml.pre would be wrong", path);
            goto done;
        }
        cap = cJSON_GetArraySize(mer);
        const cJSON *it;
        cJSON_ArrayForEach(it, mer) {
            if (cJSON_IsString(it)) total += strlen(it->valuestring) + 1;
            else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                     cJSON_IsString(cJSON_GetArrayItem(it, 1)))
                total += strlen(cJSON_GetArrayItem(it, 0)->valuestring) + strlen(cJSON_GetArrayItem(it, 1)->valuestring) + 2;
            else { st = ft_err(FTUNE_ERR_FORMAT, "%s: model.merges[%d] is not \"a b\" or [a, b]", path, b->n); goto done; }
            b->n++;
        }
        b->buf = ft_malloc(total + 1);
        b->merges = ft_calloc((size_t)(cap ? cap : 1), sizeof *b->merges);
        if (!b->buf || !b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        size_t o = 0;
        int i = 0;
        cJSON_ArrayForEach(it, mer) {
            b->merges[i++] = b->buf + o;
            if (cJSON_IsString(it)) o += (size_t)sprintf(b->buf + o, "%s", it->valuestring) + 1;
            else o += (size_t)sprintf(b->buf + o, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring,
                                      cJSON_GetArrayItem(it, 1)->valuestring) + 1;
        }
    } else { /* merges.txt: "#version" line, then "a b" per line; vocab.json files use GPT-2's regex */
        b->pre = "gpt-2";
        for (char *p = text; *p; p++) cap += *p == '\n';
        b->merges = ft_calloc((size_t)cap + 1, sizeof *b->merges);
        if (!b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        for (char *line = text, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            size_t l = strlen(line);
            if (l && line[l - 1] == '\r') line[--l] = 0;
            if (!l || !strncmp(line, "#version", 8)) continue;
            b->merges[b->n++] = line;
        }
        b->buf = text; /* the merges point into it */
        text = NULL;
    }
done:
    cJSON_Delete(root);
    free(text);
    if (st) bpe_extra_free(b);
    return st;
}

/* tokenizer.ggml.* from the model's tokenizer, as llama.cpp reads them:
 * SentencePiece-style ("llama": tokens, scores, types) or byte-level BPE
 * ("gpt2": tokens, types, merges, pre). SPM scores: the file's own (GGUF, llama2.c .bin, tokenizer.model); a
 * tokenizer.json has none, and its vocabulary (converted from
 * SentencePiece) is in score order, so normal token k-th in id order gets
 * -k, as SentencePiece's BPE trainer scores pieces. bdir: the Hugging Face
 * base directory (for the BPE merges as the files spell them), or NULL. */
ftune_status ft_tokenizer_to_gguf(gguf_writer *w, const ftune_tokenizer *t, int V, const char *bdir) {
    if (!t) return ft_err(FTUNE_ERR_ARG, "merge: the model has no tokenizer to write into the GGUF (give one: --tokenizer FILE)");
    bool spm = ft_tokenizer_kind(t) == FT_TOK_SPM;
    bpe_extra bpe = { 0 };
    ftune_status st = spm ? FTUNE_OK : read_bpe_extra(bdir, &bpe);
    if (st) return st;
    int n = ftune_tokenizer_n_vocab(t);
    const char **toks = ft_calloc((size_t)V, sizeof *toks);
    char *pads = ft_malloc((size_t)(V - n + 1) * 24);
    float *scores = ft_calloc((size_t)V, sizeof *scores);
    int32_t *types = ft_calloc((size_t)V, sizeof *types);
    if (n > V) { st = ft_err(FTUNE_ERR_FORMAT, "merge: the tokenizer has %d tokens, more than the model's %d embedding rows", n, V); goto done; }
    if (!toks || !pads || !scores || !types) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    ft_tokenizer_specials sp;
    ft_tokenizer_special(t, &sp);
    bool have_scores = false;
    for (int i = 0; i < n; i++) have_scores |= ft_tokenizer_score(t, i) != 0.0f;
    int k = 0;
    for (int i = 0; i < V; i++) {
        if (i < n) {
            toks[i] = i < bpe.n_tok_text ? bpe.tok_text[i] : ft_tokenizer_token(t, i);
            types[i] = ft_tokenizer_type(t, i) ? ft_tokenizer_type(t, i) : FT_TOKTYPE_NORMAL;
            if (i == sp.unk) types[i] = FT_TOKTYPE_UNKNOWN; /* tokenizer.json lists <unk> among the special tokens */
            /* llama2.c's .bin stores "\n<s>\n" and "\n</s>\n"; llama.cpp's llama2.c converter names them so */
            if (!strcmp(toks[i], "\n<s>\n") || !strcmp(toks[i], "\n</s>\n")) toks[i] = toks[i][2] == 's' ? "<s>" : "</s>";
            scores[i] = have_scores ? ft_tokenizer_score(t, i) : types[i] == FT_TOKTYPE_NORMAL ? -(float)k++ : 0.0f;
        } else { /* embedding rows past the vocabulary, named as llama.cpp's converter pads them */
            char *p = pads + (size_t)(i - n) * 24;
            snprintf(p, 24, "[PAD%d]", i);
            toks[i] = p;
            types[i] = FT_TOKTYPE_UNUSED;
        }
    }
    if ((st = ft_gguf_writer_set_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2")) ||
        (st = ft_gguf_writer_set_str(w, "tokenizer.ggml.pre", spm ? "default" : bpe.pre)) ||
        (st = ft_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, (size_t)V)) ||
        (st = ft_gguf_writer_set_i32_array(w, "tokenizer.ggml.token_type", types, (size_t)V)))
        goto done;
    if (spm ? (st = ft_gguf_writer_set_f32_array(w, "tokenizer.ggml.scores", scores, (size_t)V)) != FTUNE_OK
            : (st = ft_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", bpe.merges, (size_t)bpe.n)) != FTUNE_OK)
        goto done;
    struct { const char *key; int32_t id; } ids[] = {
        { "tokenizer.ggml.bos_token_id", sp.bos }, { "tokenizer.ggml.eos_token_id", sp.eos },
        { "tokenizer.ggml.unknown_token_id", sp.unk }, { "tokenizer.ggml.padding_token_id", sp.pad },
        { "tokenizer.ggml.eot_token_id", sp.eot },
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0] && !st; i++)
        if (ids[i].id >= 0) st = ft_gguf_writer_set_u32(w, ids[i].key, (uint32_t)ids[i].id);
    if (st || (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", sp.add_bos != 0)) ||
        (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", sp.add_eos != 0)) ||
        (spm && (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", sp.add_space_prefix != 0))))
        goto done;
    /* the template the tokenizer was loaded with: tokenizer_config.json's (a
     * string or the "default" of a list) or transformers 5's chat_template.jinja */
    const char *ct = ft_tokenizer_chat_template(t);
    if (ct) st = ft_gguf_writer_set_str(w, "tokenizer.chat_template", ct);
done:
    bpe_extra_free(&bpe);
    free(toks);
    free(pads);
    free(scores);
    free(types);
    return st;
}
