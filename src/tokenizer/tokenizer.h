/* tokenizer.h — private construction of tokenizers. A tokenizer is built
 * from a vocabulary spec, which each file format (tokenizer.json, GGUF
 * metadata, llama2.c tokenizer .bin, tiktoken tokenizer.model) fills in.
 *
 * Two algorithms, both "merge the best adjacent pair until none is left":
 *   SPM  text is normalized (" " -> "▁", a "▁" prefix when add_space_prefix),
 *        split into UTF-8 characters; the pair priority is the merged
 *        piece's score (GGUF, llama2.c .bin) or the merge rank (tokenizer.json);
 *        characters not in the vocabulary fall back to <0xXX> byte tokens.
 *   BPE  text is split into words by the pre-tokenizer regexes (PCRE2, UTF +
 *        Unicode properties), each word into bytes; the pair priority is the
 *        merge rank, or for tiktoken files (no merge list) the merged token's
 *        rank. Normal tokens of byte-level files are stored in GPT-2's
 *        byte->unicode alphabet and are mapped back to raw bytes on build.
 * Ties go to the leftmost pair. Special tokens (control, user-defined,
 * unknown) are cut out of the text first, longest first (as llama.cpp does);
 * control and unknown ones only when parse_special. */
#ifndef FT_TOKENIZER_H
#define FT_TOKENIZER_H

#include "core/core.h"

struct gguf_file_s;
struct gguf_writer_s;

typedef enum {
    FT_TOK_SPM = 1, /* SentencePiece-style BPE with byte fallback (Llama 2) */
    FT_TOK_BPE,     /* byte-level BPE with regex pre-tokenization (GPT-2, Llama 3) */
} ft_tok_kind;

/* Token types, as in GGUF tokenizer.ggml.token_type. */
enum {
    FT_TOKTYPE_NORMAL = 1, FT_TOKTYPE_UNKNOWN = 2, FT_TOKTYPE_CONTROL = 3,
    FT_TOKTYPE_USER_DEFINED = 4, FT_TOKTYPE_UNUSED = 5, FT_TOKTYPE_BYTE = 6,
};

typedef struct {
    ft_tok_kind kind;
    int n_vocab;
    const char **tokens;      /* n_vocab strings (as stored: "▁the", "Ġthe", "<0x0A>") */
    const int *token_lens;    /* their byte lengths, or NULL for NUL-terminated */
    const float *scores;      /* SPM merge scores, or NULL */
    const int *types;         /* FT_TOKTYPE_*, or NULL (all normal) */
    const uint8_t *strip;     /* special tokens: bit 0 eats the whitespace before them (lstrip),
                               * bit 1 the whitespace after them (rstrip); or NULL */
    int n_merges;             /* merges in rank order; may be 0 for SPM (scores) and tiktoken */
    const char **merges;      /* "a b" (split at the first space after the first byte) */
    const char **merges_right;/* or NULL; else merges[i] is the left piece, merges_right[i] the right */
    const char *pre;          /* pre-tokenizer name: "default", "llama3", "gpt-2", "qwen2", "falcon", ... */
    const char *const *pre_regexes; /* or explicit regexes (tokenizer.json), applied in order */
    int n_pre_regexes;
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 if none */
    int32_t eot_id;           /* extra end-of-generation token (e.g. <|eot_id|>), -1 if none */
    const int32_t *eog_ids;   /* more end-of-generation ids (generation_config.json), or NULL */
    int n_eog_ids;
    int add_bos, add_eos;     /* defaults from the model's files */
    int add_space_prefix;     /* SPM: prepend "▁" (true for Llama 2) */
    int ignore_merges;        /* BPE: a word that is itself a token is not merged (Llama 3) */
    int raw_bytes;            /* BPE: normal tokens are raw bytes (tiktoken), not GPT-2's alphabet */
    int strict_merges;        /* a merge naming a piece (or making a result) that is not a token is an
                               * error, as in Hugging Face tokenizers; else it is skipped, as llama.cpp does */
    int nfc;                  /* normalize input text to Unicode NFC first: tokenizer.json's NFC
                               * normalizer, and Qwen2's GGUF ('qwen2' pre-tokenizer), whose
                               * tokenizer.json has it (llama.cpp does not normalize) */
    const char *chat_template;/* the model's Jinja chat template (GGUF tokenizer.chat_template,
                               * tokenizer_config.json's chat_template), or NULL */
} ft_vocab_spec;

/* Builds a tokenizer; copies everything it needs from spec. */
FTUNE_MUST_USE ftune_status ft_tokenizer_build(ftune_tokenizer **out, const ft_vocab_spec *spec);
void ft_tokenizer_free(ftune_tokenizer *t);

/* text (len bytes, valid UTF-8) in Unicode Normalization Form C: *out is
 * malloc'd (*out_n bytes, NUL-terminated), or NULL when the text is already
 * NFC by the quick check (no code point from U+0300 up). */
FTUNE_MUST_USE ftune_status ft_nfc(const char *text, size_t len, char **out, size_t *out_n);

/* Loaders for each file kind (they fill a spec and call ft_tokenizer_build). */
FTUNE_MUST_USE ftune_status ft_tokenizer_from_hf_dir(ftune_tokenizer **out, const char *dir); /* tokenizer.json (or vocab.json + merges.txt) + tokenizer_config.json + generation_config.json */
/* tokenizer.json's len bytes alone, already in memory (name is for messages). */
FTUNE_MUST_USE ftune_status ft_tokenizer_from_hf_json(ftune_tokenizer **out, const char *text, size_t len, const char *name);
FTUNE_MUST_USE ftune_status ft_tokenizer_from_gguf(ftune_tokenizer **out, const struct gguf_file_s *g);
/* llama2.c tokenizer .bin; n_vocab <= 0 reads every entry up to the end of the file. */
FTUNE_MUST_USE ftune_status ft_tokenizer_from_llama2c(ftune_tokenizer **out, const char *path, int n_vocab);
FTUNE_MUST_USE ftune_status ft_tokenizer_from_tiktoken(ftune_tokenizer **out, const char *path); /* Llama 3 tokenizer.model */
/* SentencePiece tokenizer.model (protobuf, BPE type: Llama 2, TinyLlama). */
FTUNE_MUST_USE ftune_status ft_tokenizer_from_spm_model(ftune_tokenizer **out, const char *path);
/* Any of the above by path: a .gguf file, a tokenizer.json or a directory
 * holding one, a tokenizer.model (tiktoken or SentencePiece), or a llama2.c .bin. */
FTUNE_MUST_USE ftune_status ft_tokenizer_load_path(ftune_tokenizer **out, const char *path);

/* ftune_tokenize with an explicit add_eos. */
FTUNE_MUST_USE ftune_status ft_tokenize_ex(const ftune_tokenizer *t, const char *text, size_t len,
                            int add_bos, int add_eos, int parse_special,
                            int32_t **ids, size_t *n_ids);

/* Token string as stored (for tests and debugging). */
const char *ft_tokenizer_token(const ftune_tokenizer *t, int32_t id);
/* Its length in bytes (it may hold a NUL), or -1 for a bad id. */
int ft_tokenizer_token_len(const ftune_tokenizer *t, int32_t id);
/* FT_TOK_SPM or FT_TOK_BPE. */
ft_tok_kind ft_tokenizer_kind(const ftune_tokenizer *t);
/* Token type (FT_TOKTYPE_*), or 0 for a bad id. */
int ft_tokenizer_type(const ftune_tokenizer *t, int32_t id);
/* Id of the token whose stored text is s[0..n), or -1. */
int32_t ft_tokenizer_find(const ftune_tokenizer *t, const char *s, size_t n);
/* The longest piece ftune_token_to_piece can return, in bytes. */
int ft_tokenizer_max_piece(const ftune_tokenizer *t);
/* SPM merge score of a token (0 when the file had none, or for a bad id). */
float ft_tokenizer_score(const ftune_tokenizer *t, int32_t id);
/* Special ids (-1 if none) and the encoding defaults, for writing GGUF metadata. */
typedef struct {
    int32_t bos, eos, unk, pad, eot;
    int add_bos, add_eos, add_space_prefix;
} ft_tokenizer_specials;
void ft_tokenizer_special(const ftune_tokenizer *t, ft_tokenizer_specials *out);
/* The model's Jinja chat template as its files hold it, or NULL when they
 * have none (data/chat_template.c maps it to one of the templates ftune
 * renders). */
const char *ft_tokenizer_chat_template(const ftune_tokenizer *t);

/* How a tokenizer merges and splits, for writing it as tokenizer.json. */
#define FT_TOK_MAX_REGEX 8 /* pre-tokenizer regexes a tokenizer holds at most */
typedef enum {
    FT_MERGES_BY_SCORE = 1,   /* SPM: the merged piece's score (GGUF "llama", llama2.c .bin, tokenizer.model) */
    FT_MERGES_BY_RANK,        /* a merge list (tokenizer.json, GGUF "gpt2") */
    FT_MERGES_BY_TOKEN_RANK,  /* BPE without a merge list: the merged token's rank (tiktoken) */
} ft_merge_rule;
typedef struct {
    ft_merge_rule merge_rule;
    int ignore_merges, nfc, raw_bytes; /* as in ft_vocab_spec */
    int n_re;
    const char *re[FT_TOK_MAX_REGEX]; /* BPE: the pre-tokenizer regexes, in order (the tokenizer's own strings) */
} ft_tokenizer_rules;
void ft_tokenizer_get_rules(const ftune_tokenizer *t, ft_tokenizer_rules *out);
/* The lstrip (bit 0) / rstrip (bit 1) flags of a special token, or 0. */
int ft_tokenizer_strip(const ftune_tokenizer *t, int32_t id);
/* FT_MERGES_BY_RANK: the merges that apply, in rank order, as *n triples
 * (left id, right id, result id) in *merges (malloc'd); else *n = 0. */
FTUNE_MUST_USE ftune_status ft_tokenizer_merge_list(const ftune_tokenizer *t, int32_t **merges, int *n);

/* Writes t as a GGUF's tokenizer.ggml.* keys into w (tokenizer_gguf.c), as
 * llama.cpp's converter does: SentencePiece-style ("llama": tokens, scores,
 * types) or byte-level BPE ("gpt2": tokens, types, merges, pre), padded to
 * V entries (the model's embedding rows) with [PAD<i>] tokens. dir: the
 * directory of its files (tokenizer.json, merges.txt or a tiktoken
 * tokenizer.model give a BPE vocabulary's merges; tokenizer_config.json its
 * chat_template), or NULL. FTUNE_ERR_ARG for t NULL. */
FTUNE_MUST_USE ftune_status ft_tokenizer_to_gguf(struct gguf_writer_s *w, const ftune_tokenizer *t, int V, const char *dir);

/* Writes t as a Hugging Face tokenizer: tokenizer.json and
 * tokenizer_config.json in dir (tokenizer_hf.c), as transformers' own GGUF
 * conversion builds them (SentencePiece-style: Prepend/Replace normalizer,
 * BPE with byte fallback, merges made from the scores; byte-level: the
 * pre-tokenizer regexes, ByteLevel, the merge list), so that Hugging Face
 * tokenizers and ftune both tokenize as t does. model_max_length > 0 is
 * written to tokenizer_config.json. A tokenizer tokenizer.json cannot
 * express faithfully is refused (FTUNE_ERR_UNSUPPORTED, naming what), and
 * then nothing is written. ft_tokenizer_hf_check makes the same checks and
 * writes nothing. */
FTUNE_MUST_USE ftune_status ft_tokenizer_to_hf(const ftune_tokenizer *t, const char *dir, int model_max_length);
FTUNE_MUST_USE ftune_status ft_tokenizer_hf_check(const ftune_tokenizer *t);

#endif
