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

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks what libftune exports. The library is built with hidden visibility
 * and its archive keeps only these symbols global, so nothing else in it can
 * collide with another library linked into the same program. */
#if defined(__GNUC__) || defined(__clang__)
#define FTUNE_API __attribute__((visibility("default")))
#else
#define FTUNE_API
#endif

/* On every function that returns an ftune_status (the library's own
 * internals too): a caller that drops the status gets a compiler warning.
 * On the declarations, since compilers do not honour it on the enum type. */
#if defined(__GNUC__) || defined(__clang__)
#define FTUNE_MUST_USE __attribute__((warn_unused_result))
#else
#define FTUNE_MUST_USE
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
FTUNE_API const char *ftune_last_error(void);
/* Short name of a status code ("FTUNE_ERR_FORMAT"). */
FTUNE_API const char *ftune_status_name(ftune_status st);

/* ---------------------------------------------------------------- models */

typedef struct ftune_model ftune_model;
typedef struct ftune_tokenizer ftune_tokenizer;

typedef struct {
    const char *tokenizer_path; /* llama2.c tokenizer .bin, or NULL to find one */
    int context_length;         /* override the model's context length; 0 keeps it */
    /* The compute dtype: "f32" (also NULL; the reference), "bf16" or "f16".
     * With bf16/f16 the model's matrices (embedding, Linears, head) are held
     * in it: mapped when the file stores them so, converted once here (RNE,
     * counted as owned weight copies) when stored in another float dtype;
     * quantized ones stay quantized; norms and biases stay f32. Sessions and
     * trainers on the model then compute matrix products with bf16/f16
     * operands summed in f32 (norms, softmax, RoPE, the loss, the optimizer
     * in f32). f16 is refused (FTUNE_ERR_RANGE, naming the tensor) for a
     * model with values beyond f16's range; bf16 has f32's range. On a CPU
     * without BF16 instructions bf16 runs on the widening path (same
     * numbers; see ftune_dtype_is_native). */
    const char *dtype;
    /* NULL keeps the weights as stored; "nf4" quantizes the base weight of
     * every layer's Linears on load (bitsandbytes' NF4 with double
     * quantization, as QLoRA), tensor by tensor from the file; "int8" to
     * int8 with an absmax per row (bitsandbytes' LLM.int8 without outliers) */
    const char *quant;
} ftune_load_opts;

/* Loads a model from a Hugging Face directory (config.json + safetensors),
 * a .gguf file, or a llama2.c .bin checkpoint. Weights whose dtype is the
 * compute dtype stay in the file's read-only mapping. opts may be NULL. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_model_load(ftune_model **out, const char *path, const ftune_load_opts *opts);
FTUNE_API void ftune_model_free(ftune_model *m);
/* The compute dtype m was loaded for: "f32", "bf16" or "f16". */
FTUNE_API const char *ftune_model_dtype(const ftune_model *m);
/* 1 when this CPU (and the kernel level it dispatches on, FTUNE_CPU)
 * multiplies values of compute dtype `dtype` with dedicated instructions
 * (bf16: AVX512_BF16), 0 when it widens them to f32 first (same results,
 * slower) or the name is not a compute dtype; "f32" is always 1. */
FTUNE_API int ftune_dtype_is_native(const char *dtype);
/* The kernel level this process's matrix products run on: "generic",
 * "avx2", "avx512", "avx512bf16" or "amx" (the best this CPU supports,
 * capped by the environment variable FTUNE_CPU). */
FTUNE_API const char *ftune_kernel_level(void);
/* One line, "AMX: ...", on the run-time probe of the AMX tile unit: why the
 * amx level is not available here (not on this CPU, the OS or the kernel
 * refused the tile state, a trial tile product failed) or that it passed. */
FTUNE_API const char *ftune_kernel_note(void);
/* Installs a SIGILL handler for the process (the ftune command calls it
 * first thing) that, should the CPU refuse an instruction of ftune's
 * kernels, writes one line to stderr naming the kernel level, whether the
 * fault was in the amx level's tile code (the tile state refused after
 * the probe passed: a VM or a kernel that takes the tiles away) and the
 * FTUNE_CPU setting that avoids it, and then lets the signal end the
 * process as it would have (files ftune writes are written to a temporary
 * name and renamed, so none is left half written). A library user that has
 * its own SIGILL handler need not call it. */
FTUNE_API void ftune_report_kernel_faults(void);

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
    char rope_scaling[128];/* "none", "linear, factor 2", "llama3, factor 8, low_freq_factor 1, ..." */
} ftune_model_info;

FTUNE_API void ftune_model_get_info(const ftune_model *m, ftune_model_info *info);
FTUNE_API const ftune_tokenizer *ftune_model_tokenizer(const ftune_model *m);

/* ------------------------------------------------------------- tokenizer */

/* Tokenizes UTF-8 text. Special-token strings in the text are parsed as
 * special tokens (as llama.cpp's parse_special=true) only if parse_special.
 * *ids is malloc'd; the caller frees it. Invalid UTF-8 is an error. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_tokenize(const ftune_tokenizer *t, const char *text, size_t len,
                            int add_bos, int parse_special, int32_t **ids, size_t *n_ids);
/* The bytes token `id` decodes to, given the previous token (SentencePiece
 * drops the leading space after BOS). Returns the number of bytes written to
 * buf: the piece, cut at cap bytes if longer; or -1 on a bad id. */
FTUNE_API int ftune_token_to_piece(const ftune_tokenizer *t, int32_t prev, int32_t id, char *buf, int cap);
FTUNE_API int32_t ftune_tokenizer_bos(const ftune_tokenizer *t); /* -1 if none */
FTUNE_API int32_t ftune_tokenizer_eos(const ftune_tokenizer *t); /* -1 if none */
FTUNE_API int ftune_tokenizer_is_eog(const ftune_tokenizer *t, int32_t id); /* end of generation */
FTUNE_API int ftune_tokenizer_n_vocab(const ftune_tokenizer *t);
FTUNE_API int ftune_tokenizer_add_bos(const ftune_tokenizer *t); /* the model's default */

/* A conversation, tokenized as the model's chat template renders it: the
 * template named (chatml, llama2, llama3, mistral, zephyr, alpaca), or with
 * template_name NULL the one its files carry (GGUF tokenizer.chat_template,
 * tokenizer_config.json, chat_template.jinja), recognised by its markers,
 * with the system message that template puts first when the conversation
 * has none (Qwen2.5's "You are Qwen, ...", SmolLM2's: the one string literal
 * '<|im_start|>system\n...<|im_end|>' of a ChatML template);
 * FTUNE_ERR_ARG when it has none that ftune renders. add_generation_prompt
 * appends the opening of the assistant's turn. BOS as the model's tokenizer
 * adds it; special-token text in the template is parsed. *ids is malloc'd. */
typedef enum { FTUNE_ROLE_SYSTEM = 0, FTUNE_ROLE_USER, FTUNE_ROLE_ASSISTANT } ftune_chat_role;
typedef struct {
    ftune_chat_role role;
    const char *content;       /* UTF-8, NUL-terminated */
} ftune_chat_msg;
FTUNE_API FTUNE_MUST_USE ftune_status ftune_chat_tokenize(const ftune_model *m, const char *template_name,
                                                          const ftune_chat_msg *msgs, int n, int add_generation_prompt,
                                                          int32_t **ids, size_t *n_ids);
/* The tokenizer alone, without weights: from a .gguf (any architecture, or a
 * vocabulary-only file such as llama.cpp's ggml-vocab-*.gguf), a directory
 * holding tokenizer.json (or vocab.json + merges.txt, tokenizer.model,
 * tokenizer.bin), a tokenizer.json, a tokenizer.model (SentencePiece or
 * tiktoken) or a llama2.c tokenizer .bin. Free it with ftune_tokenizer_free. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_tokenizer_load(ftune_tokenizer **out, const char *path);
FTUNE_API void ftune_tokenizer_free(ftune_tokenizer *t);
FTUNE_API const char *ftune_tokenizer_kind(const ftune_tokenizer *t); /* "spm" or "bpe" */
/* 1 if path holds a tokenizer but no weights: a GGUF without tensors, a
 * directory without config.json or safetensors, a tokenizer file. */
FTUNE_API int ftune_path_is_vocab_only(const char *path);

/* ------------------------------------------------------------- inference */

typedef struct ftune_session ftune_session;

/* A session holds a KV cache of n_ctx positions (0: the model's context
 * length) and runs the forward pass with n_threads (0: all cores), in the
 * model's compute dtype (ftune_load_opts.dtype; the KV cache is f32). */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_session_new(ftune_session **out, const ftune_model *m, int n_ctx, int n_threads);
FTUNE_API void ftune_session_free(ftune_session *s);
/* Number of positions already in the cache. */
FTUNE_API int ftune_session_pos(const ftune_session *s);
/* Clears the KV cache. */
FTUNE_API void ftune_session_reset(ftune_session *s);
/* Runs n tokens through the model at positions pos..pos+n-1 and appends them
 * to the cache. If logits is non-NULL it receives vocab_size floats per
 * token when all_logits, else only the last token's. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_session_forward(ftune_session *s, const int32_t *tokens, int n,
                                   float *logits, int all_logits);
/* Whether one-token forwards (decoding) multiply quantized weights (q8_0,
 * q4_0, q4_1, q5_0, q5_1, iq4_nl, q4_K, q5_K, q6_K, iq4_xs) by the
 * activations quantized to 16-bit integers in integer dot products, instead
 * of widening the weights to f32 (the reference, and what prefill and
 * training always do). In f32 compute only. On by default (FTUNE_INT_DOT=0
 * in the environment turns it off for every session); the held-out
 * perplexity of the two real models moves by under 0.01% (README). */
FTUNE_API void ftune_session_set_int_products(ftune_session *s, int on);

typedef struct {
    float temperature;    /* 0 = greedy */
    int top_k;            /* 0 = off */
    float top_p;          /* 1 = off */
    float min_p;          /* 0 = off */
    float repeat_penalty; /* 1 = off */
    int repeat_last_n;    /* how many recent tokens the penalty looks at */
    uint64_t seed;
} ftune_sampler_params;

/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1,
 * repeat_last_n 64, seed 0. */
FTUNE_API void ftune_sampler_defaults(ftune_sampler_params *p);

typedef struct ftune_sampler ftune_sampler;
FTUNE_API FTUNE_MUST_USE ftune_status ftune_sampler_new(ftune_sampler **out, const ftune_sampler_params *p, int n_vocab);
FTUNE_API void ftune_sampler_free(ftune_sampler *s);
/* Picks the next token. logits (n_vocab) is modified in place; history is
 * the tokens so far (for the repetition penalty). */
FTUNE_API int32_t ftune_sampler_sample(ftune_sampler *s, float *logits, const int32_t *history, int n_history);

/* Mean next-token cross-entropy over tokens[1..n-1] predicted from their
 * prefixes, in windows of the session's context length (each window starts
 * fresh, predicted positions are counted once). */
typedef struct { double loss_sum; int64_t n_predicted; } ftune_eval_result;
FTUNE_API FTUNE_MUST_USE ftune_status ftune_eval_tokens(ftune_session *s, const int32_t *tokens, size_t n, ftune_eval_result *acc);

/* ------------------------------------------------------------ model init */

/* Writes a model with random weights in Hugging Face layout (config.json +
 * model.safetensors) to out_dir: matrices and embeddings normal(0, 0.02)
 * from seed, norm weights ones, biases zeros. Exactly one of preset (one of
 * ftune_init_presets(): "stories260K", "llama-110m", "smollm2-360m",
 * "llama-3.2-1b", "llama-2-7b", "qwen2-0.5b") or config_json (the path of a
 * config.json giving the shape; it is parsed and written out again) is
 * given, else FTUNE_ERR_ARG. dtype: "f32" (also NULL), "bf16" or "f16".
 * The config is validated before anything is written; an out_dir that
 * exists and is not empty is refused (FTUNE_ERR_ARG) unless overwrite, when
 * its config.json and model.safetensors are replaced. The files are written
 * into a sibling staging directory and moved into out_dir at the end, so a
 * failure leaves out_dir as it was. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_init_model(const char *out_dir, const char *preset, const char *config_json,
                              const char *dtype, uint64_t seed, int overwrite);
/* Names of the presets, NULL-terminated. */
FTUNE_API const char *const *ftune_init_presets(void);

/* -------------------------------------------------------------- adapters */

typedef struct ftune_adapter ftune_adapter;

/* Loads a LoRA adapter for m: a PEFT directory (adapter_config.json +
 * adapter_model.safetensors) or a llama.cpp GGUF adapter file. Its targets
 * and every shape must match the model. The model is not changed: the
 * adapter is used where it is given (ftune_session_set_adapter), so
 * sessions on one model may each run their own, concurrently. It must
 * outlive the sessions using it and not outlive m. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_adapter_load(ftune_adapter **out, const ftune_model *m, const char *path);
FTUNE_API void ftune_adapter_free(ftune_adapter *a);
/* Runs s with adapter a (NULL: the base model alone) from now on; the
 * session is reset (its cache was computed with the previous adapter).
 * FTUNE_ERR_ARG if a was loaded for another model. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_session_set_adapter(ftune_session *s, const ftune_adapter *a);

/* Loads a LoRA adapter (as ftune_adapter_load) as m's default adapter:
 * sessions created afterwards start with it, and evaluation and
 * ftune_model_save_merged include it. The weights are not written. The
 * model owns the adapter and frees it in ftune_model_free; a model carries
 * at most one. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_model_load_adapter(ftune_model *m, const char *dir);

/* Writes m with its adapter (if any) folded into the base weights, in f32
 * whatever the compute dtype (a model loaded for bf16/f16 folds into its
 * rounded matrices: load it in f32, as `ftune merge` does, to fold into
 * the weights as stored): a path
 * ending in ".gguf" gets a GGUF file (from any base), any other path
 * a Hugging Face directory (config.json, model.safetensors, the base's
 * tokenizer files; from a GGUF or llama2.c base its tokenizer written as
 * tokenizer.json, tokenizer_config.json and generation_config.json, or
 * FTUNE_ERR_UNSUPPORTED before anything is written for a vocabulary
 * tokenizer.json cannot express as it tokenizes). dtype "f32", "bf16",
 * "f16", or NULL to keep each weight's own; a GGUF output also takes
 * llama.cpp's file types (mixes) "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
 * "q6_K", "q4_k_s", "q4_k_m" (or "q4_K"), "q5_k_s", "q5_k_m" (or "q5_K"),
 * each tensor's type chosen as llama.cpp's quantize chooses it, and "same"
 * (each tensor's type as the GGUF input stores it; FTUNE_ERR_ARG for
 * another input). */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_model_save_merged(const ftune_model *m, const char *path, const char *dtype);

/* Writes m (its default adapter, if any, folded in) as a Hugging Face
 * bitsandbytes checkpoint in dir, as transformers saves one, with
 * quantization_config in config.json; the embedding, LM head and norms as
 * stored. type "nf4": every layer Linear in NF4 with double quantization,
 * bit for bit bitsandbytes' quantize_4bit (weight, weight.absmax,
 * weight.quant_map, weight.nested_absmax, weight.nested_quant_map,
 * weight.quant_state.bitsandbytes__nf4); "int8": LLM.int8's row-wise int8
 * (weight I8, SCB, weight_format). FTUNE_ERR_ARG for another type or a
 * model that is already quantized. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_model_save_bnb(const ftune_model *m, const char *dir, const char *type);

typedef struct {
    const char *dtype;     /* as ftune_model_save_merged's; NULL keeps each weight's own; for a
                            * directory also "nf4" or "int8": merged in f32, then quantized as
                            * ftune_model_save_bnb */
    const char *tokenizer; /* for a .gguf output from a model without a tokenizer (ftune init's):
                            * a tokenizer file or directory to write into it; NULL: none.
                            * Given for a model with a tokenizer, or for a Hugging Face
                            * output, it is FTUNE_ERR_ARG. */
    /* Called now and then from the calling thread with the elements of the
     * tensors computed so far (folded, converted, quantized) and their
     * total; NULL: none. */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
} ftune_merge_opts;

/* ftune_model_save_merged with options (o may be NULL). summary (may be
 * NULL) receives, for a GGUF output, one line saying what was written:
 * general.file_type, the matrices per weight type, the output matrix's
 * type, and how many kept their type; "" otherwise. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_model_merge(const ftune_model *m, const char *path, const ftune_merge_opts *o,
                                         char *summary, size_t summary_cap);

/* -------------------------------------------------------------- training */

/* A whole fine-tuning run is one call, ftune_train_run: the datasets and the
 * validation split, a trainer (LoRA or full), AdamW with gradient clipping
 * and a learning-rate schedule, gradient accumulation, validation, metrics,
 * checkpoints that resume bit for bit, and the final adapter or model.
 * `ftune train` is a thin layer over it.
 *
 * Files under out_dir:
 *   metrics.jsonl              one object per optimizer step
 *   events.out.tfevents.*      (tensorboard, unless tensorboard_dir is elsewhere) the same numbers
 *                              for TensorBoard
 *   adapter_config.json, adapter_model.safetensors   (LoRA) the final PEFT adapter
 *   adapter.gguf               (LoRA, export_gguf) the same for llama.cpp
 *   config.json, model.safetensors, tokenizer files  (full) the final model (the tokenizer
 *                              as ftune_model_save_merged writes it; one it would refuse
 *                              is refused before the first step)
 *   initial/                   (save_initial_adapter) the adapter before step 1
 *   checkpoint-STEP/           every save_every steps and on interruption:
 *       trainer_state.json, trainable.safetensors, optimizer.safetensors,
 *       and (LoRA) the adapter as it is at that step, usable as is
 *   .ftune.lock                held (flock) while a run writes here
 * A checkpoint is written to a temporary directory and renamed into place. A
 * run refuses an out_dir that holds anything but the lock unless it resumes
 * or overwrite is set. */

/* The checkpoint format version written into trainer_state.json (4: the
 * file's own checksum, "state_checksum"; 3: the skipped-step count and the
 * loss scaler's state). Versions 2 and 3 still resume, their step, micro-step
 * and data cursor cross-checked against each other and the optimizer's step
 * (a version 2 one with the loss scaler at its initial state), except a
 * version 3 one holding a dynamic loss scaler, whose state nothing checks. */
#define FTUNE_CHECKPOINT_VERSION 4

typedef enum {
    FTUNE_DATA_AUTO = 0,    /* from the file: .txt is plain, else the first record's fields */
    FTUNE_DATA_TEXT,        /* JSONL {"text"}: loss on every token, EOS appended */
    FTUNE_DATA_COMPLETION,  /* {"prompt", "completion"} (field names: prompt_key, completion_key) */
    FTUNE_DATA_ALPACA,      /* {"instruction", "input"?, "output"} */
    FTUNE_DATA_CHAT,        /* {"messages": [{"role", "content"}, ...]} through a chat template */
    FTUNE_DATA_PLAIN,       /* plain text, cut into rows of ctx tokens */
} ftune_data_format;

typedef enum {
    FTUNE_TRAIN_LORA = 0,   /* LoRA adapters over frozen base weights of any dtype */
    FTUNE_TRAIN_FULL = 1,   /* every weight, as an f32 copy */
} ftune_train_mode;

/* LoRA target modules, a bit mask, named after the PEFT modules. */
enum {
    FTUNE_LORA_Q_PROJ = 1 << 0, FTUNE_LORA_K_PROJ = 1 << 1, FTUNE_LORA_V_PROJ = 1 << 2,
    FTUNE_LORA_O_PROJ = 1 << 3, FTUNE_LORA_GATE_PROJ = 1 << 4, FTUNE_LORA_UP_PROJ = 1 << 5,
    FTUNE_LORA_DOWN_PROJ = 1 << 6,
    FTUNE_LORA_ALL = 0x7f,
};

/* The learning rate after a linear warmup from 0 over `warmup` steps. */
typedef enum {
    FTUNE_SCHED_CONSTANT = 0, /* stays at lr */
    FTUNE_SCHED_LINEAR,       /* linear decay to min_lr at the last step */
    FTUNE_SCHED_COSINE,       /* half-cosine decay to min_lr at the last step */
} ftune_schedule;

/* What an example longer than ctx loses (unless drop_long drops it). */
typedef enum {
    FTUNE_TRUNCATE_END = 0,   /* its end (often the response) */
    FTUNE_TRUNCATE_PROMPT,    /* prompt tokens first (after a leading BOS), then the end */
} ftune_truncate;

/* Loss scaling with the semantics of PyTorch's GradScaler, for f16
 * compute (bf16 has f32's exponent range and needs none; in f32 a
 * power-of-two scale changes no bit unless a gradient overflows). The loss
 * of every micro-batch is multiplied by the scale before backward; the
 * gradients are multiplied by 1/scale and checked for inf/NaN once per
 * optimizer step, before clipping. */
typedef enum {
    FTUNE_LOSS_SCALE_NONE = 0, /* no scaling; a non-finite loss or gradient stops the run (FTUNE_ERR_RANGE) */
    FTUNE_LOSS_SCALE_DYNAMIC,  /* GradScaler: a step with a non-finite gradient is skipped (no AdamW update,
                                * and, as in Hugging Face's Trainer, the schedule does not advance, while the
                                * batch is consumed and the step counts towards steps) and halves the scale;
                                * loss_scale_growth_interval finite steps in a row double it */
    FTUNE_LOSS_SCALE_FIXED,    /* a constant scale (not a GradScaler feature, as Apex's and DeepSpeed's static
                                * scales): nothing is skipped, a non-finite gradient stops the run */
} ftune_loss_scale_mode;

/* Parses `--loss-scale`: "none", "dynamic", or a number N > 0 (FIXED at N,
 * *scale = N; else *scale = 0). FTUNE_ERR_ARG names the bad value. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_loss_scale_parse(const char *s, ftune_loss_scale_mode *mode, double *scale);

/* Bits of ftune_train_opts.lora_set: which LoRA settings the caller chose
 * explicitly. With init_adapter, the others are taken from that adapter and
 * a chosen one that differs from it is an FTUNE_ERR_ARG. */
enum { FTUNE_SET_LORA_R = 1, FTUNE_SET_LORA_ALPHA = 2, FTUNE_SET_LORA_TARGETS = 4, FTUNE_SET_RSLORA = 8 };

/* Tokenization progress: done of total input bytes of one data file. */
typedef void (*ftune_data_progress_fn)(void *ctx, size_t done, size_t total);

/* The optimizer's state: FTUNE_OPTIM_ADAMW keeps AdamW's m and v in f32
 * (8 bytes per trainable); FTUNE_OPTIM_ADAMW8BIT as bitsandbytes'
 * AdamW8bit, blockwise 8-bit m and v (about 2 bytes per trainable; tensors
 * of fewer than 4096 elements keep f32 state). */
typedef enum { FTUNE_OPTIM_ADAMW = 0, FTUNE_OPTIM_ADAMW8BIT = 1 } ftune_optim;
/* Parses "adamw" or "adamw8bit" (FTUNE_ERR_ARG otherwise). */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_optim_parse(const char *s, ftune_optim *out);

/* A training run. Fill it with ftune_train_opts_default, then set model,
 * data_path and out_dir (required) and whatever else differs. The defaults
 * are those of `ftune train --help`; they are given after each field. */
typedef struct {
    ftune_model *model;        /* loaded by the caller, no adapter loaded; required */
    const char *model_path;    /* where it came from (chat template lookup, messages); NULL */
    /* data */
    const char *data_path;     /* JSONL, JSON array or .txt; required */
    const char *val_path;      /* a validation file; NULL: split val_split off data_path */
    double val_split;          /* fraction held out when val_path is NULL, in [0, 1); 0.05 */
    ftune_data_format format;  /* FTUNE_DATA_AUTO */
    const char *chat_template; /* "chatml", "llama2", "llama3", "mistral", "zephyr", "alpaca";
                                * NULL: the one the model's files carry, with its default
                                * system message (as ftune_chat_tokenize) */
    bool train_on_prompt;      /* loss on prompt tokens too; false */
    bool drop_long;            /* drop examples longer than ctx instead of truncating; false */
    bool pack;                 /* several examples per row (they never attend to each other); false */
    bool shuffle;              /* reshuffle the examples every epoch (seeded); true */
    ftune_truncate truncate;   /* FTUNE_TRUNCATE_END */
    const char *prompt_key;    /* completion-format field names; NULL: "prompt" */
    const char *completion_key;/*   and "completion" */
    ftune_data_progress_fn data_progress; /* called while each file is tokenized; NULL */
    void *data_progress_ctx;
    int ctx;                   /* T, the sequence length, >= 2; 0: min(512, the model's context) */
    /* what is trained */
    ftune_train_mode mode;     /* FTUNE_TRAIN_LORA */
    int lora_r;                /* LoRA rank; 8 */
    float lora_alpha;          /* scale alpha / r; 16 */
    float lora_dropout;        /* dropout on the LoRA input; 0.05 */
    unsigned lora_targets;     /* FTUNE_LORA_* mask; FTUNE_LORA_ALL */
    bool rslora;               /* scale alpha / sqrt(r) instead; false */
    unsigned lora_set;         /* FTUNE_SET_* bits; 0 */
    const char *init_adapter;  /* a PEFT directory to start the LoRA weights from; NULL */
    /* optimisation: AdamW with decoupled weight decay (none on norms and
     * biases in full mode), the global gradient norm clipped first */
    double lr;                 /* peak learning rate; 2e-4 */
    double min_lr;             /* the learning rate at the end of the decay; 0 */
    double weight_decay;       /* 0 */
    double beta1, beta2;       /* 0.9, 0.999 */
    double adam_eps;           /* 1e-8 */
    double max_grad_norm;      /* 0: no clipping; 1 */
    ftune_optim optim;         /* FTUNE_OPTIM_ADAMW */
    bool paged_optim;          /* optimizer state (and in full mode with a bf16/f16 dtype the f32 masters,
                                * which only the optimizer reads) in a file-backed mapping the kernel
                                * can page out; the same numbers; false */
    const char *paged_dir;     /* where that file is made (unlinked at once); NULL: out_dir */
    ftune_schedule schedule;   /* FTUNE_SCHED_COSINE */
    int64_t warmup;            /* warmup steps; 0 */
    ftune_loss_scale_mode loss_scale_mode; /* FTUNE_LOSS_SCALE_NONE */
    double loss_scale;         /* FIXED: the scale; DYNAMIC: the initial scale; 0: 65536 (2^16). An f32 value */
    int loss_scale_growth_interval; /* DYNAMIC: finite steps in a row before the scale doubles; 0: 2000 */
    int64_t steps;             /* optimizer steps; 0: from epochs */
    int epochs;                /* passes over the training set when steps is 0 (0 means 1) */
    int batch_size;            /* B, rows per micro-batch; 1 */
    int grad_accum;            /* K, micro-batches per optimizer step; 1 */
    uint64_t seed;             /* LoRA init, dropout, shuffling, the validation split; 0 */
    int eval_every;            /* steps between validations; 0: only before and after */
    int save_every;            /* steps between checkpoints; 0: none */
    const char *resume;        /* a checkpoint-STEP directory of out_dir to continue from (another run's
                                * is refused: out_dir must be its parent); NULL */
    /* outputs */
    const char *out_dir;       /* required; created if missing */
    bool overwrite;            /* replace a previous run in out_dir instead of refusing: what a run writes is
                                * removed (metrics, adapter or model files, initial/, ftune's checkpoints),
                                * other files stay; false */
    bool export_gguf;          /* also write adapter.gguf (LoRA only); false */
    bool save_initial_adapter; /* write initial/ (LoRA only); false */
    const char *dump_batches;  /* a JSONL file receiving every micro-batch; NULL */
    bool tensorboard;          /* TensorBoard event files (events.out.tfevents.*) with one Event per step
                                * holding the step's scalars (train/loss, train/learning_rate,
                                * train/grad_norm, train/tokens_per_second, memory/peak_rss in MiB,
                                * eval/loss, train/loss_scale with loss scaling, dist/step_time_s/rank_R
                                * under MPI: metrics.jsonl's numbers); written by rank 0, each step's
                                * Event appended whole; a resumed run first cuts the steps after its
                                * checkpoint's from them; true */
    const char *tensorboard_dir; /* where they go (created if missing; one that holds events files is
                                * refused unless resuming, removed with overwrite); NULL: out_dir */
    int n_threads;             /* 0: all cores */
    /* The compute dtype of the matrix products: "f32", "bf16", "f16", or
     * NULL: the model's (ftune_load_opts.dtype). Trainable parameters (LoRA
     * A/B, or every weight in full mode) are f32 master copies that the
     * optimizer updates; the products read them rounded to the compute
     * dtype. bf16 needs no loss scaling (f32's range); f16 gradients can
     * underflow without it. bf16/f16 on a model loaded in f32 computes the
     * same numbers without the memory saving; f32 on a model loaded in
     * bf16/f16 is FTUNE_ERR_ARG (its weights were rounded at load). A run
     * resumes only in the dtype its checkpoint was trained in. NULL */
    const char *dtype;
    /* Gradient checkpointing: 0 off; K (1 ..the model's layers): keep only
     * every K-th block's input and run each segment of K blocks forward
     * again just before its backward, so activation memory holds one
     * segment's blocks instead of all of them, for about one more forward
     * of compute. Gradients, losses and results are bit-identical to 0
     * (the same ops, dropout masks and compute dtype). K outside 0..layers
     * is FTUNE_ERR_ARG. 0 */
    int grad_checkpoint;
    /* data parallelism (a job of ftune_dist_world() ranks; one rank: no effect) */
    int zero;                  /* ZeRO stage: 0 every rank keeps the whole optimizer state,
                                * 1 each rank keeps and updates its shard of it, 2 and of the
                                * gradients, 3 and of the trainable values; 0 */
    bool overlap;              /* ZeRO 2/3: start each segment's gradient reduce-scatter without
                                * waiting (MPI_Ireduce_scatter, two in flight, each on a copy of
                                * the window) and wait for it when its buffer is next needed or
                                * the micro-batch ends; false: blocking */
    bool consolidate;          /* ZeRO >= 1, full fine-tuning: checkpoints gathered whole to rank 0
                                * (they resume on any number of ranks) instead of one shard per
                                * rank (which resume on the same number only); LoRA's are always
                                * whole; false */
    double bucket_mb;          /* the most MiB one collective call moves; 0: 16 */
    double dist_timeout;       /* seconds a rank waits in one collective for the others before it gives
                                * up: it then asks them where they are (a rank waiting in a collective
                                * answers) and fails with FTUNE_ERR_IO naming the collective, the step
                                * and the ranks it waited for; the caller ends the job
                                * (ftune_dist_abort). Waits for another rank's checkpoint writes or
                                * reads are not timed (the disk's time). 0: wait forever; 300 */
    /* When *stop becomes non-zero (a signal handler may set it) the run
     * finishes the current step, saves a checkpoint and returns
     * FTUNE_ERR_INTERRUPTED. NULL: never. */
    volatile sig_atomic_t *stop;
} ftune_train_opts;

FTUNE_API void ftune_train_opts_default(ftune_train_opts *o);

/* Data parallelism. A process that mpirun (or srun) started as one of N
 * ranks trains one run together with the others: ftune_train_run splits
 * every global batch (batch_size rows) into N disjoint shards, sums the
 * gradients of the global batch's mean loss across ranks, and only rank 0
 * writes metrics, checkpoints and the final adapter or model. Any other
 * process is a one-rank job (also in a build without MPI). Call
 * ftune_dist_init once before training and ftune_dist_finalize at the end. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_dist_init(void);
FTUNE_API void ftune_dist_finalize(void);
FTUNE_API int ftune_dist_rank(void);
FTUNE_API int ftune_dist_world(void);
/* Ends every rank of the job with exit code code (after this rank has
 * reported an error the others may not share), so that none of them waits
 * for it forever. */
FTUNE_API _Noreturn void ftune_dist_abort(int code);
/* True once a run has failed by a decision every rank took together (rank 0
 * could not resume from or save a checkpoint, and told the others): each
 * rank returns the error and reaches ftune_dist_finalize, so none needs
 * ftune_dist_abort, which could end rank 0 before it has said why. */
FTUNE_API bool ftune_dist_failed_together(void);

/* Parsers for the names `ftune train` accepts; FTUNE_ERR_ARG names the bad
 * one. Data formats: "auto", "text", "completion", "alpaca", "chat",
 * "plain". Targets: a comma-separated list of q,k,v,o,gate,up,down or the
 * PEFT names (q_proj, ...), or "all" / "all-linear". Schedules: "cosine",
 * "linear", "constant". */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_data_format_parse(const char *name, ftune_data_format *out);
FTUNE_API FTUNE_MUST_USE ftune_status ftune_lora_targets_parse(const char *list, unsigned *mask);
FTUNE_API FTUNE_MUST_USE ftune_status ftune_schedule_parse(const char *name, ftune_schedule *out);

typedef enum {
    FTUNE_TRAIN_START,   /* data loaded, trainer built: the counts below */
    FTUNE_TRAIN_STEP,    /* an optimizer step finished */
    FTUNE_TRAIN_EVAL,    /* a validation finished (step 0: before training) */
    FTUNE_TRAIN_SAVE,    /* a checkpoint was written to path */
    FTUNE_TRAIN_DONE,    /* the final outputs were written to path */
} ftune_train_event;

typedef struct {
    ftune_train_event ev;
    /* FTUNE_TRAIN_START */
    int n_train, n_val;        /* examples */
    int64_t train_tokens, train_targets, val_tokens;
    int64_t n_truncated, n_dropped_long, n_dropped_empty; /* over both sets */
    int64_t n_truncated_empty; /* truncated examples left without a target (dropped) */
    int64_t n_trainable;       /* trainable parameters */
    int T, B, K;
    const char *data_format;   /* the format used ("text", "chat", ...) */
    /* every event */
    int64_t step, total_steps, start_step; /* start_step: where a resumed run began */
    /* FTUNE_TRAIN_STEP */
    double loss, lr, grad_norm, tokens_per_s, elapsed_s, eta_s;
    double peak_mib;           /* the process's peak resident memory so far */
    /* FTUNE_TRAIN_START and STEP, with loss scaling (loss_scaling true):
     * the scale the next step uses (after this step's backoff or growth),
     * the steps skipped so far, and whether this one was */
    bool loss_scaling;
    double loss_scale;
    int64_t skipped_steps;
    bool skipped;              /* STEP: non-finite gradients, no update (grad_norm is then inf or NaN) */
    /* FTUNE_TRAIN_EVAL (and STEP when this step was also validated) */
    bool has_val_loss;
    double val_loss;
    const char *path;          /* FTUNE_TRAIN_SAVE, FTUNE_TRAIN_DONE */
} ftune_train_progress;

typedef void (*ftune_train_progress_fn)(void *ctx, const ftune_train_progress *p);

typedef struct {
    int64_t steps_done, total_steps;
    double last_loss;
    bool has_val;
    double val_loss_first, val_loss_last; /* before training (or at resume) and at the end */
    double loss_scale;         /* the loss scale at the end (1 without scaling) */
    int64_t skipped_steps;     /* steps skipped for non-finite gradients (dynamic loss scaling) */
    char checkpoint[4096];     /* the last checkpoint written, or "" */
    /* The run's memory table as text lines (MiB): per lifetime class
     * (weights as stored and touched, owned copies, trainables, gradients,
     * optimizer state, activations, scratch, KV, data) what the plan
     * predicted and what the allocator counted, with totals; "" if the
     * trainer was never built. */
    char memory_table[2048];
    double peak_rss_mib;       /* peak resident memory of the process at the end */
    /* data parallelism: what this rank's collectives sent during the steps of this run (the
     * ring model of each collective's bytes; checkpoints and the final gather excluded) */
    uint64_t comm_bytes, comm_calls, comm_steps;
} ftune_train_result;

/* Runs the training o describes. progress (may be NULL) is called on the
 * calling thread with ctx. res may be NULL. FTUNE_ERR_ARG names the option at
 * fault (in `ftune train`'s spelling); data, model and checkpoint errors name
 * the file, line or tensor; FTUNE_ERR_RANGE is a non-finite loss; an
 * interruption through o->stop is FTUNE_ERR_INTERRUPTED after the checkpoint
 * is saved. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_train_run(const ftune_train_opts *o, ftune_train_progress_fn progress, void *ctx,
                                       ftune_train_result *res);

/* The memory a training run will hold, planned before anything is loaded
 * (`ftune plan`, and `ftune train`'s fit check): from the model's
 * config.json and safetensors headers only (no weights read or mapped), a
 * GGUF or llama2.c file's header (below), or
 * from an `ftune init` preset, with the sizes the loader, the trainer,
 * AdamW and the batches allocate. o is what ftune_train_run would get
 * (o->model is not used; o->data_path, o->val_path may be NULL); quant is
 * --quant (NULL: none). The process's own resident set now (code,
 * libraries) is one of the rows. One rank's share. */
typedef struct {
    const char *preset;        /* plan ftune init's preset NAME instead of model_path's files; NULL */
    const char *preset_dtype;  /* the preset's weights as stored: "f32" (NULL), "bf16", "f16" */
    const char *quant;         /* "nf4", "int8" or NULL */
    const char *tokenizer;     /* a llama2.c model's tokenizer .bin (as ftune_load_opts.tokenizer_path); NULL */
    int world;                 /* plan one rank of a job of this many ranks (with o->zero); 0: this job's size */
    double net_gbps;           /* > 0: the link's Gbit/s, for the communication time per step (ring model) */
    double net_latency_us;     /* the link's latency per message, with net_gbps */
} ftune_plan_opts;

typedef struct {
    double total_mib;          /* the planned peak */
    double process_mib;        /* of it: this process's resident set when planned */
    double mapped_mib;         /* of it: weights in the file mappings (shared by the processes of one host) */
    char largest[64];          /* the largest term ("weights (mapped, bf16)", "activations", ...) */
    double largest_mib;
    char best_switch[64];      /* the switch that would save most ("--quant nf4"), "" if none helps */
    double best_saving_mib;
    char table[4096];          /* the plan and what each switch would save, as text lines */
    double comm_bytes;         /* bytes one rank sends per optimizer step (the ring model of ftune_train_result.comm_bytes) */
    double comm_s;             /* with net_gbps: the time they take per step */
} ftune_train_plan_result;

/* A GGUF or llama2.c model is loaded as stored to be planned (its file
 * mapped, only the header and the norms read). The errors ftune_model_load
 * and ftune_train_run would give for a missing model or bad options. */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_train_plan(const char *model_path, const ftune_train_opts *o, const ftune_plan_opts *po,
                                        ftune_train_plan_result *res);

/* A trainer driven step by step on the caller's token batches (benchmarks,
 * custom loops): the trainer and AdamW of ftune_train_run without data,
 * schedule, validation or files. From opts it uses mode, the lora_* fields
 * (lora_set and init_adapter must be unset), seed, batch_size (the most
 * rows a step may have), ctx (the longest row; 0: min(512, the model's
 * context)), weight_decay, beta1, beta2, adam_eps, max_grad_norm,
 * dtype, grad_checkpoint, n_threads, optim, paged_optim and paged_dir (required when paged); the model must outlive the trainer and is not modified. */
typedef struct ftune_trainer ftune_trainer;
FTUNE_API FTUNE_MUST_USE ftune_status ftune_trainer_new(ftune_trainer **out, const ftune_model *m, const ftune_train_opts *opts);
FTUNE_API void ftune_trainer_free(ftune_trainer *tr);
/* One optimizer step on one micro-batch of B rows (B <= batch_size) of T
 * tokens (T <= ctx): zero the gradients, forward and backward of the mean
 * cross-entropy of targets (-1: ignored) given tokens, clip, one AdamW
 * update with learning rate lr. tokens and targets are (B, T) row-major; each
 * row is one document at positions 0..T-1. *loss gets the mean loss before
 * the update. FTUNE_ERR_ARG: a size, token or target out of range, or no
 * target; FTUNE_ERR_RANGE: the loss or gradient norm is not finite (nothing
 * was updated). */
FTUNE_API FTUNE_MUST_USE ftune_status ftune_trainer_step(ftune_trainer *tr, const int32_t *tokens, const int32_t *targets, int B, int T,
                                          double lr, double *loss);
/* Trainable parameters (floats). */
FTUNE_API int64_t ftune_trainer_n_trainable(const ftune_trainer *tr);
/* The threads it runs on (n_threads, or all cores for 0). */
FTUNE_API int ftune_trainer_n_threads(const ftune_trainer *tr);

/* ----------------------------------------------------------------- JSON */

/* The offset of the first NUL that the JSON text p[0..n) would put into a
 * string (a raw 0 byte, or a \u0000 escape inside a string), or -1. JSON
 * readers built on C strings would cut such text short silently. */
FTUNE_API int64_t ftune_json_nul_at(const char *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
