/* train_loop.h — the internals of ftune_train_run (its options, progress
 * and result are public, in ftune.h): the checkpoint state reader and the
 * helpers train_loop.c and train_state.c share.
 *
 * Files under out_dir:
 *   metrics.jsonl              one object per optimizer step
 *   events.out.tfevents.*      (tensorboard, unless tensorboard_dir) the same numbers for
 *                              TensorBoard, one Event per step (tensorboard.h)
 *   adapter_config.json, adapter_model.safetensors   (LoRA) the final adapter
 *   adapter.gguf               (LoRA, export_gguf) the same for llama.cpp
 *   config.json, model.safetensors, tokenizer files  (full) the final model
 *   initial/                   (save_initial_adapter) the adapter before step 1
 *   checkpoint-STEP/           every save_every steps and on interruption:
 *       trainer_state.json     step, dropout micro-step, data cursor, run config,
 *                              skipped steps, the loss scaler (scale, growth
 *                              tracker) when scaling is on,
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

#include "data/data.h"
#include "train/grad_scaler.h"
#include "optim/optim.h"
#include "train/train.h"

/* ------------------------------------------------------------ checkpoint state */

#define FT_CKPT_FORMAT "ftune-checkpoint"
#define FT_CKPT_VERSION FTUNE_CHECKPOINT_VERSION /* 2: per-file checksums; 3: skipped steps, loss scaler;
                                                  * 4: trainer_state.json's own checksum */
#define FT_CKPT_VERSION_MIN 2                     /* the oldest version that resumes */
#define FT_CKPT_MAX_SHARDS 256              /* ranks of a sharded checkpoint (more: --consolidate) */
#define FT_CKPT_MAX_FILES (8 + FT_CKPT_MAX_SHARDS)
#define FT_FNV0 0xcbf29ce484222325ull

struct cJSON;
/* trainer_state.json, parsed; every field checked for type and range. */
typedef struct {
    int64_t step;              /* optimizer steps done, >= 1 */
    uint64_t micro_step;       /* micro-batches trained (seeds dropout) */
    int64_t data_epoch, data_index; /* the batch iterator's cursor */
    const struct cJSON *config;/* the run configuration (owned by root) */
    int version;               /* FT_CKPT_VERSION_MIN .. FT_CKPT_VERSION */
    int64_t skipped_steps;     /* steps whose update was skipped, in [0, step]; 0 in version 2 */
    /* "loss_scaler" (version 3, only from a run with loss scaling) */
    bool has_scaler;
    ft_loss_scale_mode scaler_mode; /* DYNAMIC or FIXED */
    float scale;               /* a positive finite f32 */
    int32_t growth_tracker;    /* in [0, growth_interval) */
    int32_t growth_interval;   /* >= 1 */
    /* "shards" (a sharded checkpoint, ZeRO >= 1 without --consolidate): rank r's
     * values and AdamW moments of its flat range are in shard-r-of-W.safetensors
     * (ft_ckpt_shard_name) instead of trainable/optimizer.safetensors; 0: whole */
    int shard_world;
    int64_t shard_opt_step;    /* AdamW's step (the shards hold only tensors and their range) */
    bool state_checked;        /* version 4: "state_checksum" matched the file's bytes */
    int n_files;
    struct { char name[64]; uint64_t fnv; } files[FT_CKPT_MAX_FILES]; /* FNV-1a of each file */
    struct cJSON *root;
} ft_ckpt_state;

/* Parses len bytes of a trainer_state.json (path names it in errors);
 * FTUNE_ERR_FORMAT names the bad field, FTUNE_ERR_UNSUPPORTED another
 * version. On success free with ft_ckpt_state_free. */
FTUNE_MUST_USE ftune_status ft_ckpt_state_parse(ft_ckpt_state *s, const char *text, size_t len, const char *path);
void ft_ckpt_state_free(ft_ckpt_state *s);
/* The text of trainer_state.json for the object j (without "state_checksum"):
 * j as cJSON prints it, then "state_checksum", the FNV-1a of that text with
 * the field's digits read as '0's, as the file's last field. *out is
 * malloc'd (*out_len bytes, ending in a newline). */
FTUNE_MUST_USE ftune_status ft_ckpt_state_text(const struct cJSON *j, char **out, size_t *out_len);
/* "shard-<rank>-of-<world>.safetensors" into out (64 bytes). */
void ft_ckpt_shard_name(char *out, int rank, int world);
/* FNV-1a 64 of n bytes, continuing from h (FT_FNV0 to start). */
uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n);
/* FNV-1a 64 of a whole file, read in chunks. */
FTUNE_MUST_USE ftune_status ft_file_fnv1a(const char *path, uint64_t *out);

/* ------------------------------------------------------------ test hooks */

/* Faults a test program injects into a run through ft_train_run_hooked
 * (never reachable from the public API or the CLI). Steps are 1-based; 0:
 * none. */
typedef struct {
    int64_t inf_grad_step;     /* after backward of this step, one gradient element becomes +inf */
    int64_t skip_step;         /* this step's update is skipped by hand, as a skipped step is: no
                                * AdamW update, the schedule does not advance, it counts as skipped,
                                * and a dynamic scaler backs off as after an overflow */
} ft_train_hooks;

/* ftune_train_run with hooks (NULL: none). */
FTUNE_MUST_USE ftune_status ft_train_run_hooked(const ftune_train_opts *o, const ft_train_hooks *hooks, ftune_train_progress_fn progress,
                                 void *ctx, ftune_train_result *res);

/* Peak resident memory of this process, in MiB (getrusage). */
double ft_peak_rss_mib(void);

/* ------------------------------------------------------------ planning (train_plan.c) */

/* The trainer options ftune_train_run builds from o for a rank's B_rank
 * rows of T tokens in compute: ftune_train_plan sizes the same ones. */
void ft_train_topts_of(const ftune_train_opts *o, int B_rank, int T, ft_dtype compute, ft_train_opts *t);
/* The run's sequence length: o->ctx, or min(512, the model's context);
 * FTUNE_ERR_ARG when longer than the model's context. */
FTUNE_MUST_USE ftune_status ft_train_seq_len(const ft_config *c, const ftune_train_opts *o, int *T);

#endif
