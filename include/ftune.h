/* ftune.h — the public interface of libftune, a C engine for running and
 * fine-tuning open LLMs (Llama family) on limited hardware.
 *
 * Conventions: every function that can fail returns an ftune_status; on
 * failure ftune_last_error() gives a message that names the file, tensor or
 * line at fault. Every _load/_new has a _free that accepts NULL. Handles are
 * opaque. The library never exits the process.
 */
#ifndef FTUNE_H
#define FTUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FTUNE_OK = 0,
    FTUNE_ERR_IO,          /* a file could not be opened, read or written */
    FTUNE_ERR_FORMAT,      /* a file is malformed, truncated or inconsistent */
    FTUNE_ERR_UNSUPPORTED, /* a valid file uses something ftune does not implement */
    FTUNE_ERR_NOMEM,       /* an allocation failed */
    FTUNE_ERR_ARG,         /* a caller-supplied argument is invalid */
    FTUNE_ERR_RANGE,       /* a size or index is out of range (e.g. context full) */
    FTUNE_ERR_INTERRUPTED, /* the operation was interrupted (e.g. by a signal) */
} ftune_status;

/* Message for the most recent failure on this thread ("" if none). */
const char *ftune_last_error(void);
/* Short name of a status code ("FTUNE_ERR_FORMAT"). */
const char *ftune_status_name(ftune_status st);

/* ---------------------------------------------------------------- models */

typedef struct ftune_model ftune_model;
typedef struct ftune_tokenizer ftune_tokenizer;

typedef struct {
    const char *tokenizer_path; /* llama2.c tokenizer .bin, or NULL to find one */
    int context_length;         /* override the model's context length; 0 keeps it */
} ftune_load_opts;

/* Loads a model from a Hugging Face directory (config.json + safetensors),
 * a .gguf file, or a llama2.c .bin checkpoint. Weights whose dtype is the
 * compute dtype stay in the file's read-only mapping. opts may be NULL. */
ftune_status ftune_model_load(ftune_model **out, const char *path, const ftune_load_opts *opts);
void ftune_model_free(ftune_model *m);

typedef struct {
    char arch[32];         /* "llama", "qwen2", "mistral", ... */
    char format[16];       /* "hf", "gguf", "llama2c" */
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size;
    int context_length;
    float rope_theta, norm_eps;
    int tied_embeddings, qkv_bias;
    int64_t n_params;      /* parameters, counting a tied matrix once */
    int64_t weight_bytes;  /* bytes of weights as stored */
    char dtypes[64];       /* dtypes present, e.g. "f32,bf16" */
    char tokenizer[32];    /* "spm", "bpe", ... */
    int n_vocab_tokens;
} ftune_model_info;

void ftune_model_get_info(const ftune_model *m, ftune_model_info *info);
const ftune_tokenizer *ftune_model_tokenizer(const ftune_model *m);

/* ------------------------------------------------------------- tokenizer */

/* Tokenizes UTF-8 text. Special-token strings in the text are parsed as
 * special tokens (as llama.cpp's parse_special=true) only if parse_special.
 * *ids is malloc'd; the caller frees it. Invalid UTF-8 is an error. */
ftune_status ftune_tokenize(const ftune_tokenizer *t, const char *text, size_t len,
                            int add_bos, int parse_special, int32_t **ids, size_t *n_ids);
/* The bytes token `id` decodes to, given the previous token (SentencePiece
 * drops the leading space after BOS). Returns the number of bytes written to
 * buf (at most cap), or -1 on a bad id. */
int ftune_token_to_piece(const ftune_tokenizer *t, int32_t prev, int32_t id, char *buf, int cap);
int32_t ftune_tokenizer_bos(const ftune_tokenizer *t); /* -1 if none */
int32_t ftune_tokenizer_eos(const ftune_tokenizer *t); /* -1 if none */
int ftune_tokenizer_is_eog(const ftune_tokenizer *t, int32_t id); /* end of generation */
int ftune_tokenizer_n_vocab(const ftune_tokenizer *t);
int ftune_tokenizer_add_bos(const ftune_tokenizer *t); /* the model's default */
/* The tokenizer alone, without weights: from a .gguf (any architecture, or a
 * vocabulary-only file such as llama.cpp's ggml-vocab-*.gguf), a directory
 * holding tokenizer.json (or vocab.json + merges.txt, tokenizer.model,
 * tokenizer.bin), a tokenizer.json, a tokenizer.model (SentencePiece or
 * tiktoken) or a llama2.c tokenizer .bin. Free it with ftune_tokenizer_free. */
ftune_status ftune_tokenizer_load(ftune_tokenizer **out, const char *path);
void ftune_tokenizer_free(ftune_tokenizer *t);
const char *ftune_tokenizer_kind(const ftune_tokenizer *t); /* "spm" or "bpe" */
/* 1 if path holds a tokenizer but no weights: a GGUF without tensors, a
 * directory without config.json or safetensors, a tokenizer file. */
int ftune_path_is_vocab_only(const char *path);

/* ------------------------------------------------------------- inference */

typedef struct ftune_session ftune_session;

/* A session holds a KV cache of n_ctx positions (0: the model's context
 * length) and runs the forward pass with n_threads (0: all cores). */
ftune_status ftune_session_new(ftune_session **out, const ftune_model *m, int n_ctx, int n_threads);
void ftune_session_free(ftune_session *s);
/* Number of positions already in the cache. */
int ftune_session_pos(const ftune_session *s);
/* Clears the KV cache. */
void ftune_session_reset(ftune_session *s);
/* Runs n tokens through the model at positions pos..pos+n-1 and appends them
 * to the cache. If logits is non-NULL it receives vocab_size floats per
 * token when all_logits, else only the last token's. */
ftune_status ftune_session_forward(ftune_session *s, const int32_t *tokens, int n,
                                   float *logits, int all_logits);

typedef struct {
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off */
    int repeat_last_n;    /* how many recent tokens the penalty looks at */
    uint64_t seed;
} ftune_sampler_params;

void ftune_sampler_defaults(ftune_sampler_params *p);

typedef struct ftune_sampler ftune_sampler;
ftune_status ftune_sampler_new(ftune_sampler **out, const ftune_sampler_params *p, int n_vocab);
void ftune_sampler_free(ftune_sampler *s);
/* Picks the next token. logits (n_vocab) is modified in place; history is
 * the tokens so far (for the repetition penalty). */
int32_t ftune_sampler_sample(ftune_sampler *s, float *logits, const int32_t *history, int n_history);

/* Mean next-token cross-entropy over tokens[1..n-1] predicted from their
 * prefixes, in windows of the session's context length (each window starts
 * fresh, predicted positions are counted once). */
typedef struct { double loss_sum; int64_t n_predicted; } ftune_eval_result;
ftune_status ftune_eval_tokens(ftune_session *s, const int32_t *tokens, size_t n, ftune_eval_result *acc);

/* ------------------------------------------------------------ model init */

/* Writes a model with random weights (normal, std 0.02, seeded) in Hugging
 * Face layout (config.json + model.safetensors) to out_dir. preset names:
 * "stories260K", "llama-110m", "smollm2-360m", "llama-3.2-1b", "llama-2-7b",
 * "qwen2-tiny"; or config_json is a path to a config.json to copy.
 * dtype: "f32", "bf16" or "f16". */
ftune_status ftune_init_model(const char *out_dir, const char *preset, const char *config_json,
                              const char *dtype, uint64_t seed);
/* Names of the presets, NULL-terminated. */
const char *const *ftune_init_presets(void);

/* -------------------------------------------------------------- adapters */

typedef struct ftune_adapter ftune_adapter;

/* Loads a LoRA adapter for m: a PEFT directory (adapter_config.json +
 * adapter_model.safetensors) or a llama.cpp GGUF adapter file. Its targets
 * and every shape must match the model. The model is not changed: the
 * adapter is used where it is given (ftune_session_set_adapter), so
 * sessions on one model may each run their own, concurrently. It must
 * outlive the sessions using it and not outlive m. */
ftune_status ftune_adapter_load(ftune_adapter **out, const ftune_model *m, const char *path);
void ftune_adapter_free(ftune_adapter *a);
/* Runs s with adapter a (NULL: the base model alone) from now on; the
 * session is reset (its cache was computed with the previous adapter).
 * FTUNE_ERR_ARG if a was loaded for another model. */
ftune_status ftune_session_set_adapter(ftune_session *s, const ftune_adapter *a);

/* Loads a LoRA adapter (as ftune_adapter_load) as m's default adapter:
 * sessions created afterwards start with it, and evaluation and
 * ftune_model_save_merged include it. The weights are not written. The
 * model owns the adapter and frees it in ftune_model_free; a model carries
 * at most one. */
ftune_status ftune_model_load_adapter(ftune_model *m, const char *dir);

/* Writes m with its adapter (if any) folded into the base weights: a path
 * ending in ".gguf" gets a GGUF file (from any base), any other path
 * a Hugging Face directory (config.json, model.safetensors, the base's
 * tokenizer files). dtype "f32", "bf16", "f16" (GGUF also "q8_0", "q4_0"),
 * or NULL to keep each weight's own. */
ftune_status ftune_model_save_merged(const ftune_model *m, const char *path, const char *dtype);

#ifdef __cplusplus
}
#endif
#endif
