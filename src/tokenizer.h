/* tokenizer.h — private construction of tokenizers. A tokenizer is built
 * from a vocabulary spec, which each file format (tokenizer.json, GGUF
 * metadata, llama2.c tokenizer .bin, tiktoken tokenizer.model) fills in. */
#ifndef FT_TOKENIZER_H
#define FT_TOKENIZER_H

#include "core.h"

struct gguf_file_s;

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
    int n_merges;             /* BPE merges "a b", in rank order; may be 0 for SPM */
    const char **merges;
    const char *pre;          /* pre-tokenizer name: "default", "llama3", "gpt-2", "qwen2", "falcon", ... */
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 if none */
    int32_t eot_id;           /* extra end-of-generation token (e.g. <|eot_id|>), -1 if none */
    int add_bos, add_eos;     /* defaults from the model's files */
    int add_space_prefix;     /* SPM: prepend "▁" (true for Llama 2) */
} ft_vocab_spec;

/* Builds a tokenizer; copies everything it needs from spec. */
ftune_status ft_tokenizer_build(ftune_tokenizer **out, const ft_vocab_spec *spec);
void ft_tokenizer_free(ftune_tokenizer *t);

/* Loaders for each file kind (they fill a spec and call ft_tokenizer_build). */
ftune_status ft_tokenizer_from_hf_dir(ftune_tokenizer **out, const char *dir); /* tokenizer.json + tokenizer_config.json + generation_config.json */
ftune_status ft_tokenizer_from_gguf(ftune_tokenizer **out, const struct gguf_file_s *g);
ftune_status ft_tokenizer_from_llama2c(ftune_tokenizer **out, const char *path, int n_vocab);
ftune_status ft_tokenizer_from_tiktoken(ftune_tokenizer **out, const char *path); /* Llama 3 tokenizer.model */

/* Token string as stored (for tests and debugging). */
const char *ft_tokenizer_token(const ftune_tokenizer *t, int32_t id);

#endif
