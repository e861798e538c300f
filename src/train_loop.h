/* train_loop.h — a whole fine-tuning run as one library call: datasets and
 * the validation split, a trainer (LoRA or full), AdamW with clipping and a
 * learning-rate schedule, gradient accumulation, validation, metrics,
 * checkpoints that resume bit for bit, and the final PEFT adapter or Hugging
 * Face model. `ftune train` is a thin layer over ft_train_run.
 *
 * Files under out_dir:
 *   metrics.jsonl              one object per optimizer step
 *   adapter_config.json, adapter_model.safetensors   (LoRA) the final adapter
 *   adapter.gguf               (LoRA, export_gguf) the same for llama.cpp
 *   config.json, model.safetensors, tokenizer files  (full) the final model
 *   initial/                   (save_initial_adapter) the adapter before step 1
 *   checkpoint-STEP/           every save_every steps and on interruption:
 *       trainer_state.json     step, dropout micro-step, data cursor, run config,
 *                              and an FNV-1a checksum of each file beside it
 *       trainable.safetensors  every trainable tensor (f32, trainer names)
 *       optimizer.safetensors  AdamW moments and step
 *       adapter_config.json, adapter_model.safetensors  (LoRA) usable as is
 *   .ftune.lock                held (flock) while a run writes here
 * A checkpoint is written to checkpoint-STEP.tmp.PID/ and renamed into place,
 * so a failed save leaves every earlier checkpoint as it was. A run refuses
 * an output directory that holds anything but the lock unless it resumes or
 * overwrite is set (which removes the old run's metrics and checkpoints).
 */
#ifndef FT_TRAIN_LOOP_H
#define FT_TRAIN_LOOP_H

#include <signal.h>

#include "data.h"
#include "optim.h"
#include "train.h"

/* Which LoRA settings the caller chose explicitly; the rest are taken from
 * init_adapter when one is given. */
enum { FT_RUN_SET_R = 1, FT_RUN_SET_ALPHA = 2, FT_RUN_SET_TARGETS = 4, FT_RUN_SET_RSLORA = 8 };

typedef struct {
    ftune_model *model;        /* loaded by the caller; must carry no adapter */
    const char *model_path;    /* where it came from (chat template lookup, messages) */
    /* data */
    const char *data_path;
    const char *val_path;      /* a validation file, or NULL to split data_path */
    double val_split;          /* fraction held out when val_path is NULL (0: none) */
    ft_data_format format;
    const char *chat_template; /* a name, or NULL: from the model's tokenizer_config.json */
    bool train_on_prompt, drop_long, pack, shuffle;
    ft_truncate_side truncate; /* what an over-long example loses first */
    const char *prompt_key, *completion_key; /* completion-format field names, NULL: prompt/completion */
    ft_dataset_progress_fn data_progress;    /* tokenization progress (per file), or NULL */
    void *data_progress_ctx;
    int ctx;                   /* T, the sequence length; 0: min(512, the model's context) */
    /* what is trained */
    ft_train_mode mode;
    int lora_r;
    float lora_alpha, lora_dropout;
    unsigned lora_targets;     /* FT_MOD_BIT mask (module.h) */
    bool rslora;
    unsigned lora_set;         /* FT_RUN_SET_* */
    const char *init_adapter;  /* PEFT directory to start the LoRA weights from, or NULL */
    /* optimisation */
    ft_adamw_cfg adamw;
    double lr, min_lr;
    double max_grad_norm;      /* 0: no clipping */
    ft_sched_kind schedule;
    int64_t warmup;
    int64_t steps;             /* optimizer steps; 0: from epochs */
    int epochs;                /* passes over the training set when steps is 0 (0 means 1) */
    int batch_size;            /* B, rows per micro-batch */
    int grad_accum;            /* K, micro-batches per optimizer step */
    uint64_t seed;             /* LoRA init, dropout, shuffling, the validation split */
    int eval_every;            /* steps between validations (0: only before and after) */
    int save_every;            /* steps between checkpoints (0: none) */
    const char *resume;        /* a checkpoint directory to continue from, or NULL */
    /* outputs */
    const char *out_dir;
    bool overwrite;            /* replace a previous run in out_dir instead of refusing */
    bool export_gguf;
    bool save_initial_adapter;
    const char *dump_batches;  /* JSONL of every micro-batch, or NULL */
    int n_threads;             /* 0: all cores */
    /* When *stop becomes non-zero (a signal handler sets it) the run finishes
     * the current step, saves a checkpoint and returns FTUNE_ERR_INTERRUPTED. */
    volatile sig_atomic_t *stop;
} ft_train_run_opts;

/* The defaults of `ftune train --help`. */
void ft_train_run_opts_default(ft_train_run_opts *o);

typedef enum {
    FT_RUN_START,   /* data loaded, trainer built: counts below */
    FT_RUN_STEP,    /* an optimizer step finished */
    FT_RUN_EVAL,    /* a validation finished (step 0: before training) */
    FT_RUN_SAVE,    /* a checkpoint was written to path */
    FT_RUN_DONE,    /* final outputs written to path */
} ft_run_event;

typedef struct {
    ft_run_event ev;
    /* FT_RUN_START */
    int n_train, n_val;
    int64_t train_tokens, train_targets, val_tokens;
    int64_t n_truncated, n_dropped_long, n_dropped_empty; /* over both sets */
    int64_t n_truncated_empty; /* truncated examples left without a target (dropped) */
    int64_t n_trainable;       /* trainable parameters */
    int T, B, K;
    const char *data_format;   /* the format used ("text", "chat", ...) */
    /* every event */
    int64_t step, total_steps, start_step;
    /* FT_RUN_STEP */
    double loss, lr, grad_norm, tokens_per_s, elapsed_s, eta_s;
    double peak_mib;           /* peak resident memory so far */
    /* FT_RUN_EVAL (and STEP when this step was also evaluated) */
    bool has_val_loss;
    double val_loss;
    const char *path;          /* FT_RUN_SAVE, FT_RUN_DONE */
} ft_train_progress;

typedef void (*ft_train_progress_fn)(void *ctx, const ft_train_progress *p);

typedef struct {
    int64_t steps_done, total_steps;
    double last_loss;
    bool has_val;
    double val_loss_first, val_loss_last; /* before training (or at resume) and at the end */
    char checkpoint[4096];     /* the last checkpoint written, or "" */
    ft_mem_table mem;          /* planned and counted memory of the run (ft_trainer_mem_table) */
} ft_train_result;

/* Runs the training described by o. progress (may be NULL) is called from
 * the calling thread. res may be NULL. Errors name the file, line, tensor
 * or option at fault; an interruption is FTUNE_ERR_INTERRUPTED after the
 * checkpoint is saved. */
ftune_status ft_train_run(const ft_train_run_opts *o, ft_train_progress_fn progress, void *ctx, ft_train_result *res);

/* ------------------------------------------------------------ checkpoint state */

#define FT_CKPT_FORMAT "ftune-checkpoint"
#define FT_CKPT_VERSION 2          /* 2: per-file checksums */
#define FT_CKPT_MAX_FILES 8
#define FT_FNV0 0xcbf29ce484222325ull

struct cJSON;
/* trainer_state.json, parsed; every field checked for type and range. */
typedef struct {
    int64_t step;              /* optimizer steps done, >= 1 */
    uint64_t micro_step;       /* micro-batches trained (seeds dropout) */
    int64_t data_epoch, data_index; /* the batch iterator's cursor */
    const struct cJSON *config;/* the run configuration (owned by root) */
    int n_files;
    struct { char name[64]; uint64_t fnv; } files[FT_CKPT_MAX_FILES]; /* FNV-1a of each file */
    struct cJSON *root;
} ft_ckpt_state;

/* Parses len bytes of a trainer_state.json (path names it in errors);
 * FTUNE_ERR_FORMAT names the bad field, FTUNE_ERR_UNSUPPORTED another
 * version. On success free with ft_ckpt_state_free. */
ftune_status ft_ckpt_state_parse(ft_ckpt_state *s, const char *text, size_t len, const char *path);
void ft_ckpt_state_free(ft_ckpt_state *s);
/* FNV-1a 64 of n bytes, continuing from h (FT_FNV0 to start). */
uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n);
/* FNV-1a 64 of a whole file, read in chunks. */
ftune_status ft_file_fnv1a(const char *path, uint64_t *out);

/* Peak resident memory of this process, in MiB (getrusage). */
double ft_peak_rss_mib(void);

#endif
