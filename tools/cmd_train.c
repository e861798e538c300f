/* cmd_train.c — `ftune train`: fine-tunes a model (LoRA or full) on a
 * dataset through ftune_train_run (the public API only), showing a live progress line on stderr.
 * Ctrl-C (SIGINT), SIGTERM and SIGHUP finish the current step, save a
 * checkpoint and exit non-zero. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static volatile sig_atomic_t g_stop = 0; /* the signal that asked the run to stop, or 0 */
static void on_stop_signal(int sig) { g_stop = sig; }

/* The signals that stop a run with a checkpoint: Ctrl-C, and what schedulers
 * (Slurm, Kubernetes, systemd, timeout) and a closed terminal send. Under
 * mpirun also SIGUSR1 (below). */
static const struct { int sig; const char *name; } stop_signals[] = {
    { SIGINT, "SIGINT" }, { SIGTERM, "SIGTERM" }, { SIGHUP, "SIGHUP" }, { SIGUSR1, "SIGUSR1" },
};
#define N_STOP_SIGNALS (int)(sizeof stop_signals / sizeof stop_signals[0])
static const char *stop_signal_name(int sig) {
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (stop_signals[i].sig == sig) return stop_signals[i].name;
    return NULL;
}

#define SPARK_N 16 /* losses the progress line's sparkline shows */

typedef struct {
    bool quiet, tty, line_open, truncate_end;
    bool spark;                /* a terminal with a UTF-8 locale: the progress line shows a sparkline */
    float hist[SPARK_N];       /* the last losses, oldest first */
    int nhist;
    cli_progress *data;        /* the tokenization line, ended before the first event */
} progress_ctx;

/* The locale's character set is UTF-8, by POSIX's precedence: LC_ALL, then
 * LC_CTYPE, then LANG (the first one set and non-empty decides). */
static bool locale_is_utf8(void) {
    const char *names[] = { "LC_ALL", "LC_CTYPE", "LANG" };
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return strcasestr(v, "utf-8") || strcasestr(v, "utf8");
    }
    return false;
}

/* "  ▁▃▅█…": the last losses scaled between their min and max, one block
 * character each (a non-finite loss is a space); empty before two losses. */
static void sparkline(char *buf, size_t n, const progress_ctx *pc) {
    static const char *bars[8] = { "\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588" };
    buf[0] = 0;
    if (pc->nhist < 2) return;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < pc->nhist; i++)
        if (isfinite(pc->hist[i])) { lo = fminf(lo, pc->hist[i]); hi = fmaxf(hi, pc->hist[i]); }
    size_t at = (size_t)snprintf(buf, n, "  ");
    for (int i = 0; i < pc->nhist && at + 4 < n; i++) {
        float v = pc->hist[i];
        int lv = !isfinite(v) ? -1 : hi > lo ? (int)lrintf(7.0f * (v - lo) / (hi - lo)) : 3;
        at += (size_t)snprintf(buf + at, n - at, "%s", lv < 0 ? " " : bars[lv]);
    }
}

/* Tokenization progress of the training (and validation) data. */
static void on_data_progress(void *ctx, size_t done, size_t total) {
    cli_progress_update(ctx, (double)done, (double)total);
}

static void end_line(progress_ctx *pc) {
    if (pc->line_open) fputc('\n', stderr);
    pc->line_open = false;
}

static void on_progress(void *ctx, const ftune_train_progress *p) {
    progress_ctx *pc = ctx;
    if (pc->quiet) return;
    char eta[32], scale[96];
    if (pc->data) cli_progress_end(pc->data);
    switch (p->ev) {
    case FTUNE_TRAIN_START:
        fprintf(stderr, "data: %d training examples (%lld tokens, %lld targets, format %s), %d validation examples\n",
                p->n_train, (long long)p->train_tokens, (long long)p->train_targets, p->data_format, p->n_val);
        if (p->n_truncated)
            fprintf(stderr, "warning: %lld example(s) longer than %d tokens were truncated (--drop-long drops them; "
                    "--ctx sets the length)\n", (long long)p->n_truncated, p->T);
        if (p->n_truncated_empty)
            fprintf(stderr, "warning: %lld of them lost all their target tokens to truncation and were dropped%s\n",
                    (long long)p->n_truncated_empty, pc->truncate_end ? " (--truncate prompt cuts the prompt first)" : "");
        if (p->n_dropped_long) fprintf(stderr, "note: %lld example(s) longer than %d tokens were dropped\n",
                                       (long long)p->n_dropped_long, p->T);
        if (p->n_dropped_empty) fprintf(stderr, "note: %lld example(s) with no tokens to train on were dropped\n",
                                        (long long)p->n_dropped_empty);
        fprintf(stderr, "trainable parameters: %lld\n", (long long)p->n_trainable);
        fprintf(stderr, "steps: %lld (micro-batch %d x %d tokens, %d micro-batch(es) per step)\n",
                (long long)p->total_steps, p->B, p->T, p->K);
        if (p->start_step) fprintf(stderr, "resuming after step %lld\n", (long long)p->start_step);
        if (p->loss_scaling)
            fprintf(stderr, "loss scale: %g (%lld step(s) skipped so far)\n", p->loss_scale, (long long)p->skipped_steps);
        break;
    case FTUNE_TRAIN_STEP:
        cli_fmt_duration(eta, sizeof eta, p->eta_s);
        char spark[4 * SPARK_N + 8] = "";
        if (pc->spark) {
            if (pc->nhist == SPARK_N) memmove(pc->hist, pc->hist + 1, sizeof pc->hist - sizeof pc->hist[0]);
            else pc->nhist++;
            pc->hist[pc->nhist - 1] = (float)p->loss;
            sparkline(spark, sizeof spark, pc);
        }
        scale[0] = 0;
        if (p->loss_scaling)
            snprintf(scale, sizeof scale, "  scale %g  skipped %lld%s", p->loss_scale, (long long)p->skipped_steps,
                     p->skipped ? " (this step: gradients not finite, no update)" : "");
        fprintf(stderr, "%sstep %lld/%lld  loss %.4f%s  lr %.1e  gnorm %.2f  %.0f tok/s  mem %.1f MiB  ETA %s%s%s",
                pc->tty ? "\r" : "", (long long)p->step, (long long)p->total_steps, p->loss, spark, p->lr, p->grad_norm,
                p->tokens_per_s, p->peak_mib, eta, scale, pc->tty ? "\033[K" : "\n");
        /* on a terminal a skipped step stays visible */
        if (p->skipped && pc->tty) { fputc('\n', stderr); pc->line_open = false; break; }
        pc->line_open = pc->tty;
        if (p->has_val_loss) {
            end_line(pc);
            fprintf(stderr, "step %lld: val loss %.4f\n", (long long)p->step, p->val_loss);
        }
        break;
    case FTUNE_TRAIN_EVAL:
        end_line(pc);
        fprintf(stderr, "step %lld: val loss %.4f%s\n", (long long)p->step, p->val_loss,
                p->step == 0 ? " (before training)" : "");
        break;
    case FTUNE_TRAIN_SAVE:
        end_line(pc);
        fprintf(stderr, "saved %s\n", p->path);
        break;
    case FTUNE_TRAIN_DONE:
        end_line(pc);
        fprintf(stderr, "wrote %s\n", p->path);
        break;
    }
    fflush(stderr);
}

static int parse_num(const char *name, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) {
        fprintf(stderr, "ftune train: %s expects a number, got \"%s\"\n(see ftune train --help)\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Whether s is a whole (signed) decimal integer. */
static bool is_int_arg(const char *s) {
    if (*s == '-' || *s == '+') s++;
    if (!*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* --grad-checkpoint takes an optional K: a bare one (followed by another
 * option or by nothing) becomes --grad-checkpoint=1 for the parser. */
static void default_grad_checkpoint(int argc, char **argv) {
    static char one[] = "--grad-checkpoint=1";
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--grad-checkpoint") == 0 && (i + 1 >= argc || !is_int_arg(argv[i + 1]))) argv[i] = one;
}

/* MemAvailable of /proc/meminfo in MiB; 0 where unreadable. */
static double mem_available_mib(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb / 1024.0;
}

/* *together: the run failed the same way on every rank (an interruption they
 * agreed on), so the job can end without MPI_Abort. plan_only: `ftune plan`,
 * the same arguments, only the memory plan printed. */
static int train_main(int argc, char **argv, const char *me, int rank, bool *together, bool plan_only) {
    ftune_train_opts o;
    ftune_train_opts_default(&o);
    const char *model = NULL, *tokenizer = NULL, *format = "auto", *targets = "q,k,v,o,gate,up,down";
    const char *val_split = "0.05", *lora_alpha = "16", *lora_dropout = "0.05", *lr = "2e-4", *wd = "0.0";
    const char *beta1 = "0.9", *beta2 = "0.999", *eps = "1e-8", *max_norm = "1.0", *schedule = "cosine", *min_lr = "0";
    int warmup = 0, steps = 0, epochs = 0;
    bool full = false, quiet = false, no_shuffle = false, progress = false, profile = false, no_tensorboard = false;
    const char *truncate = "end", *bucket_mb = "16", *dist_timeout = "300", *loss_scale = NULL, *quant = NULL, *optim = "adamw";
    const char *preset = NULL, *preset_dtype = NULL, *memory_limit = NULL, *net_gbps = NULL, *net_latency = NULL;
    int plan_world = 0;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "base model: Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--data", OPT_STR, &o.data_path, "FILE", "training data: JSONL, JSON array, or .txt" },
        { "-o", "--output", OPT_STR, &o.out_dir, "DIR", "where the adapter (or model), metrics and checkpoints go" },
        { NULL, "--val", OPT_STR, &o.val_path, "FILE", "validation data (instead of --val-split)" },
        { NULL, "--val-split", OPT_STR, &val_split, "F", "fraction of --data held out for validation; 0 = none" },
        { NULL, "--format", OPT_STR, &format, "NAME", "auto, text, prompt-completion, alpaca, chat (messages; or prompt/completion records as a user and an assistant turn), txt" },
        { NULL, "--chat-template", OPT_STR, &o.chat_template, "NAME",
          "chatml, llama2, llama3, mistral, zephyr, alpaca (default: the model's own, from its GGUF, tokenizer_config.json or chat_template.jinja)" },
        { NULL, "--train-on-prompt", OPT_FLAG, &o.train_on_prompt, "", "train on prompt tokens too" },
        { NULL, "--drop-long", OPT_FLAG, &o.drop_long, "", "drop examples longer than --ctx instead of truncating" },
        { NULL, "--pack", OPT_FLAG, &o.pack, "", "pack several examples per row (they never attend to each other)" },
        { "-c", "--ctx-size", OPT_INT, &o.ctx, "N", "sequence length; 0 = min(512, the model's context)" },
        { NULL, "--ctx", OPT_INT, &o.ctx, "N", "the same as --ctx-size" },
        { NULL, "--truncate", OPT_STR, &truncate, "SIDE",
          "what an example longer than --ctx loses: end, or prompt (prompt tokens first, then the end)" },
        { NULL, "--prompt-key", OPT_STR, &o.prompt_key, "NAME", "the prompt field of prompt-completion data "
          "(default: prompt; e.g. question for gsm8k)" },
        { NULL, "--completion-key", OPT_STR, &o.completion_key, "NAME", "the completion field (default: completion; "
          "e.g. answer)" },
        { NULL, "--full", OPT_FLAG, &full, "", "full fine-tuning (every weight, f32 masters) instead of LoRA" },
        { NULL, "--lora-r", OPT_INT, &o.lora_r, "R", "LoRA rank" },
        { NULL, "--lora-alpha", OPT_STR, &lora_alpha, "A", "LoRA alpha (scale alpha/r)" },
        { NULL, "--lora-dropout", OPT_STR, &lora_dropout, "P", "dropout on the LoRA input" },
        { NULL, "--lora-targets", OPT_STR, &targets, "LIST", "Linears to adapt: q,k,v,o,gate,up,down or all" },
        { NULL, "--rslora", OPT_FLAG, &o.rslora, "", "rank-stabilised scale alpha/sqrt(r)" },
        { NULL, "--init-adapter", OPT_STR, &o.init_adapter, "DIR", "start LoRA from this PEFT adapter" },
        { NULL, "--lr", OPT_STR, &lr, "LR", "peak learning rate" },
        { NULL, "--weight-decay", OPT_STR, &wd, "W", "AdamW decoupled weight decay" },
        { NULL, "--beta1", OPT_STR, &beta1, "B", "AdamW beta1" },
        { NULL, "--beta2", OPT_STR, &beta2, "B", "AdamW beta2" },
        { NULL, "--adam-eps", OPT_STR, &eps, "E", "AdamW epsilon" },
        { NULL, "--max-grad-norm", OPT_STR, &max_norm, "N", "clip the global gradient norm; 0 = off" },
        { NULL, "--optim", OPT_STR, &optim, "NAME", "adamw (f32 m and v, 8 bytes per trainable) or adamw8bit "
          "(bitsandbytes' blockwise 8-bit m and v, about 2 bytes; tensors under 4096 elements keep f32 state)" },
        { NULL, "--paged-optim", OPT_FLAG, &o.paged_optim, "", "keep the optimizer state (and, in --full with "
          "--dtype bf16/f16, the f32 master weights) in a file-backed mapping (an unlinked file in --paged-dir) that "
          "the kernel can page out under memory pressure; same results" },
        { NULL, "--paged-dir", OPT_STR, &o.paged_dir, "DIR", "where --paged-optim makes its file (default: OUT_DIR)" },
        { NULL, "--loss-scale", OPT_STR, &loss_scale, "MODE",
          "none, dynamic (PyTorch GradScaler: starts at 65536, a step with inf/NaN gradients is skipped and halves "
          "it, 2000 finite steps double it), or N (a fixed scale; inf/NaN stops the run). Default: dynamic with "
          "--dtype f16, none otherwise (bf16 and f32 need no scaler)" },
        { NULL, "--schedule", OPT_STR, &schedule, "NAME", "cosine, linear or constant (after warmup)" },
        { NULL, "--warmup", OPT_INT, &warmup, "N", "linear warmup steps" },
        { NULL, "--min-lr", OPT_STR, &min_lr, "LR", "learning rate at the end of the decay" },
        { NULL, "--steps", OPT_INT, &steps, "N", "optimizer steps; 0 = from --epochs" },
        { NULL, "--epochs", OPT_INT, &epochs, "N", "passes over the training data when --steps is 0 (0 = 1)" },
        { NULL, "--batch-size", OPT_INT, &o.batch_size, "B", "rows per micro-batch" },
        { NULL, "--grad-accum", OPT_INT, &o.grad_accum, "K", "micro-batches per optimizer step" },
        { NULL, "--seed", OPT_U64, &o.seed, "S", "LoRA init, dropout, shuffling and the validation split" },
        { NULL, "--no-shuffle", OPT_FLAG, &no_shuffle, "", "keep the file's order in every epoch" },
        { NULL, "--eval-every", OPT_INT, &o.eval_every, "N", "validate every N steps; 0 = before and after only" },
        { NULL, "--save-every", OPT_INT, &o.save_every, "N", "write OUT/checkpoint-STEP every N steps; 0 = never" },
        { NULL, "--resume", OPT_STR, &o.resume, "DIR", "continue from OUT/checkpoint-STEP (a checkpoint of -o's own run)" },
        { NULL, "--overwrite", OPT_FLAG, &o.overwrite, "",
          "replace the run already in OUT_DIR (what a run writes is removed: metrics, adapter or model files, "
          "initial/, ftune's checkpoints; other files stay); without it a non-empty OUT_DIR is refused" },
        { NULL, "--export-gguf", OPT_FLAG, &o.export_gguf, "", "also write OUT/adapter.gguf (llama.cpp LoRA)" },
        { NULL, "--save-initial-adapter", OPT_FLAG, &o.save_initial_adapter, "",
          "write OUT/initial/ (the PEFT adapter before step 1)" },
        { NULL, "--dump-batches", OPT_STR, &o.dump_batches, "FILE", "write every micro-batch as a JSON line" },
        { NULL, "--tensorboard", OPT_STR, &o.tensorboard_dir, "DIR", "write the TensorBoard event files "
          "(metrics.jsonl's numbers per step: train/loss, eval/loss, ...) into DIR (default: OUT_DIR)" },
        { NULL, "--no-tensorboard", OPT_FLAG, &no_tensorboard, "", "write no TensorBoard event files" },
        { "-t", "--threads", OPT_INT, &o.n_threads, "N", "threads; 0 = all cores (per rank: under mpirun give "
          "cores / ranks per host)" },
        { NULL, "--zero", OPT_INT, &o.zero, "S", "under mpirun: ZeRO stage, 0 = every rank keeps the whole optimizer "
          "state, 1 = each keeps and updates its shard, 2 = and keeps only its shard of the gradients, 3 = and of "
          "the trainable values (gathered a layer at a time)" },
        { NULL, "--overlap", OPT_FLAG, &o.overlap, "", "under mpirun, --zero 2/3: non-blocking gradient "
          "reduce-scatters overlapped with the backward (two segment buffers more per rank)" },
        { NULL, "--consolidate", OPT_FLAG, &o.consolidate, "", "under mpirun, --zero 1-3, --full: checkpoints "
          "gathered whole to rank 0 (they resume on any number of ranks) instead of a shard per rank" },
        { NULL, "--bucket-mb", OPT_STR, &bucket_mb, "MB", "under mpirun: the most MiB one collective call moves" },
        { NULL, "--dist-timeout", OPT_STR, &dist_timeout, "S", "under mpirun: a rank that waits S seconds in one "
          "collective for the others gives up, says which rank(s) it waited for, and the job ends; 0 = wait forever "
          "(waits for a checkpoint's disk writes are not timed)" },
        { NULL, "--dtype", OPT_STR, &o.dtype, "T", "compute dtype: f32 (reference), bf16 or f16: bf16/f16 matrix "
          "inputs summed in f32, f32 master weights, norms, loss and optimizer. bf16 needs no loss scaling (f32's "
          "range); f16 would underflow without it and turns on --loss-scale dynamic. A checkpoint resumes only in its own "
          "dtype" },
        { NULL, "--grad-checkpoint", OPT_INT, &o.grad_checkpoint, "[K]",
          "gradient checkpointing: keep only every K-th block's input and recompute each segment of K blocks "
          "before its backward (K omitted: 1, every block, as Hugging Face's gradient_checkpointing). Less "
          "activation memory for about one more forward; bit-identical results; 0 = off" },
        { NULL, "--profile", OPT_FLAG, &profile, "", "print, at the end, the time per optimizer step in each op class "
          "(Linear forward/dX/dW, LoRA, attention, norms, loss, AdamW) to stderr; the same as FTUNE_PROFILE=1" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { NULL, "--quant", OPT_STR, &quant, "TYPE",
          "nf4: quantize the frozen base weights on load (NF4 + double quantization, QLoRA); int8: row-wise int8; "
          "LoRA only" },
        { NULL, "--memory-limit", OPT_STR, &memory_limit, "MIB", "refuse to start when the memory plan's total is "
          "above MIB (default: MemAvailable of /proc/meminfo)" },
        { NULL, "--preset", OPT_STR, &preset, "NAME", "ftune plan only: plan ftune init's preset NAME instead of -m "
          "(stories260K, llama-110m, smollm2-360m, llama-3.2-1b, llama-2-7b, qwen2-0.5b)" },
        { NULL, "--preset-dtype", OPT_STR, &preset_dtype, "T", "ftune plan only: the preset's weights as stored: f32, "
          "bf16 or f16 (default f32, as ftune init writes them)" },
        { NULL, "--world", OPT_INT, &plan_world, "N", "ftune plan only: plan one rank of N (default: this job's size) "
          "with --zero, and the bytes each rank sends per step" },
        { NULL, "--net-gbps", OPT_STR, &net_gbps, "G", "ftune plan only: a link of G Gbit/s: the communication time "
          "per step (ring model)" },
        { NULL, "--net-latency-us", OPT_STR, &net_latency, "L", "ftune plan only, with --net-gbps: the latency per "
          "message in microseconds (default 0)" },
        { NULL, "--quiet", OPT_FLAG, &quiet, "", "no progress output" },
        { NULL, "--progress", OPT_FLAG, &progress, "", "show the tokenization progress even when stderr is not a terminal" },
        { 0 },
    };
    cli_cmd cmd = { "train", "-m MODEL --data FILE -o OUT_DIR [options]",
                    "Fine-tunes a model with LoRA (default) or fully. Writes OUT_DIR/adapter_config.json and\n"
                    "adapter_model.safetensors (a PEFT adapter), or with --full a Hugging Face model; and\n"
                    "OUT_DIR/metrics.jsonl with one line per optimizer step. The loss of a step is normalised\n"
                    "by the target tokens of all its micro-batches. Ctrl-C, SIGTERM and SIGHUP save a checkpoint and stop.\n"
                    "Under mpirun -np N, the N ranks train together: --batch-size is the global batch, split\n"
                    "over the ranks; only rank 0 writes to OUT_DIR.",
                    opts, NULL, 0, 0 };
    if (plan_only) {
        cmd.name = "plan";
        cmd.synopsis = "(-m MODEL | --preset NAME) [the options of ftune train]";
        cmd.about = "Prints the memory a `ftune train` with the same arguments would hold at its peak, term by\n"
                    "term (weights by dtype as held, mapped or owned; trainables, gradients, optimizer state,\n"
                    "activations, scratch, data, the process itself), and what each switch would save. Reads\n"
                    "only config.json and the safetensors headers (no weights), and the data files' sizes.\n"
                    "--data and -o are optional here.";
    }
    default_grad_checkpoint(argc, argv);
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (cli_seen(&cmd, "--grad-checkpoint") && o.grad_checkpoint < 1) {
        fprintf(stderr, "ftune train: --grad-checkpoint %d: K must be at least 1 (keep every K-th block's input, up "
                "to the model's layer count; without the option checkpointing is off)\n", o.grad_checkpoint);
        return 2;
    }
    double v;
    struct { const char *name, *s; double *d; float *f; } nums[] = {
        { "--val-split", val_split, &o.val_split, NULL }, { "--lora-alpha", lora_alpha, NULL, &o.lora_alpha },
        { "--lora-dropout", lora_dropout, NULL, &o.lora_dropout }, { "--lr", lr, &o.lr, NULL },
        { "--weight-decay", wd, &o.weight_decay, NULL }, { "--beta1", beta1, &o.beta1, NULL },
        { "--beta2", beta2, &o.beta2, NULL }, { "--adam-eps", eps, &o.adam_eps, NULL },
        { "--max-grad-norm", max_norm, &o.max_grad_norm, NULL }, { "--min-lr", min_lr, &o.min_lr, NULL },
        { "--bucket-mb", bucket_mb, &o.bucket_mb, NULL }, { "--dist-timeout", dist_timeout, &o.dist_timeout, NULL },
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        if (parse_num(nums[i].name, nums[i].s, &v)) return 2;
        if (nums[i].d) *nums[i].d = v;
        else *nums[i].f = (float)v;
    }
    if (!plan_only && (preset || preset_dtype)) {
        fprintf(stderr, "ftune train: --preset and --preset-dtype are for ftune plan (train a model made with ftune init "
                "--preset NAME DIR)\n");
        return 2;
    }
    double limit_mib = 0;
    if (memory_limit && (parse_num("--memory-limit", memory_limit, &limit_mib) || limit_mib <= 0)) {
        if (limit_mib <= 0) fprintf(stderr, "%s: --memory-limit %s: expected MiB > 0\n", me, memory_limit);
        return 2;
    }
    if (!plan_only && (!o.data_path || !o.out_dir)) {
        fprintf(stderr, "ftune train: --data FILE and -o OUT_DIR are required\n(see ftune train --help)\n");
        return 2;
    }
    if (strcmp(format, "prompt-completion") == 0) format = "completion";
    else if (strcmp(format, "txt") == 0) format = "plain";
    ftune_status st;
    if ((st = ftune_data_format_parse(format, &o.format))) return cli_fail(me, st);
    if ((st = ftune_lora_targets_parse(targets, &o.lora_targets))) return cli_fail(me, st);
    if ((st = ftune_schedule_parse(schedule, &o.schedule))) return cli_fail(me, st);
    if ((st = ftune_optim_parse(optim, &o.optim))) return cli_fail(me, st);
    if (o.paged_dir && !o.paged_optim) {
        fprintf(stderr, "ftune train: --paged-dir %s: it is where --paged-optim puts its file; give --paged-optim too\n",
                o.paged_dir);
        return 2;
    }
    /* f16's range is too small for the gradients unscaled (PyTorch pairs
     * f16 autocast with GradScaler the same way); bf16 and f32 have f32's */
    if (!loss_scale) loss_scale = o.dtype && strcmp(o.dtype, "f16") == 0 ? "dynamic" : "none";
    if ((st = ftune_loss_scale_parse(loss_scale, &o.loss_scale_mode, &o.loss_scale))) return cli_fail(me, st);
    if (strcmp(truncate, "end") == 0) o.truncate = FTUNE_TRUNCATE_END;
    else if (strcmp(truncate, "prompt") == 0) o.truncate = FTUNE_TRUNCATE_PROMPT;
    else {
        fprintf(stderr, "ftune train: --truncate expects end or prompt, got \"%s\"\n", truncate);
        return 2;
    }
    if (cli_seen(&cmd, "--ctx") && cli_seen(&cmd, "--ctx-size")) {
        fprintf(stderr, "ftune train: give --ctx-size (-c) or --ctx, not both\n");
        return 2;
    }
    o.mode = full ? FTUNE_TRAIN_FULL : FTUNE_TRAIN_LORA;
    o.warmup = warmup;
    o.steps = steps;
    o.epochs = epochs;
    o.shuffle = !no_shuffle;
    o.tensorboard = !no_tensorboard;
    if (o.tensorboard_dir && no_tensorboard) {
        fprintf(stderr, "ftune train: give --tensorboard DIR or --no-tensorboard, not both\n");
        return 2;
    }
    o.lora_set = (cli_seen(&cmd, "--lora-r") ? FTUNE_SET_LORA_R : 0) | (cli_seen(&cmd, "--lora-alpha") ? FTUNE_SET_LORA_ALPHA : 0) |
                 (cli_seen(&cmd, "--lora-targets") ? FTUNE_SET_LORA_TARGETS : 0) |
                 (cli_seen(&cmd, "--rslora") ? FTUNE_SET_RSLORA : 0);
    if (cli_seen(&cmd, "--val") && cli_seen(&cmd, "--val-split")) {
        fprintf(stderr, "ftune train: give --val FILE or --val-split F, not both\n");
        return 2;
    }

    /* the memory plan, before anything is loaded or written */
    ftune_plan_opts po = { .preset = preset, .preset_dtype = preset_dtype, .quant = quant, .tokenizer = tokenizer,
                           .world = plan_world };
    if (net_latency && !net_gbps) {
        fprintf(stderr, "ftune %s: --net-latency-us needs --net-gbps (the link's rate)\n", plan_only ? "plan" : "train");
        return 2;
    }
    if (!plan_only && (plan_world || net_gbps)) {
        fprintf(stderr, "ftune train: --world and --net-gbps are ftune plan's (mpirun -np N sets a run's size)\n");
        return 2;
    }
    if (plan_world < 0) {
        fprintf(stderr, "ftune plan: --world %d: expected at least 1\n", plan_world);
        return 2;
    }
    if (net_gbps) {
        char *e1, *e2;
        po.net_gbps = strtod(net_gbps, &e1);
        const char *lat = net_latency ? net_latency : "0";
        po.net_latency_us = strtod(lat, &e2);
        if (*e1 || e1 == net_gbps || !(po.net_gbps > 0) || *e2 || e2 == lat || !(po.net_latency_us >= 0)) {
            fprintf(stderr, "ftune plan: --net-gbps %s --net-latency-us %s: expected a positive rate and a latency of "
                    "at least 0\n", net_gbps, lat);
            return 2;
        }
    }
    ftune_train_plan_result plan;
    if (plan_only && !model && !preset) {
        fprintf(stderr, "ftune plan: give -m MODEL or --preset NAME\n(see ftune plan --help)\n");
        return 2;
    }
    st = ftune_train_plan(model, &o, &po, &plan);
    if (plan_only) {
        if (st) return cli_fail(me, st);
        printf("%s", plan.table);
        double avail = limit_mib > 0 ? limit_mib : mem_available_mib();
        if (avail > 0)
            printf("%s: %.1f MiB planned, %.1f MiB %s\n", plan.total_mib <= avail ? "fits" : "does not fit",
                   plan.total_mib, avail, limit_mib > 0 ? "--memory-limit" : "available (MemAvailable)");
        return 0;
    }
    bool planned = st == FTUNE_OK;
    /* a planning error is the load's or the run's too, which report it below (a bad option:
     * the run checks it the same way); should the load succeed after another kind of
     * error, the run goes on without the check and says why */
    char plan_error[512] = "";
    if (!planned && st != FTUNE_ERR_ARG) snprintf(plan_error, sizeof plan_error, "%s", ftune_last_error());
    if (planned) {
        double avail = limit_mib > 0 ? limit_mib : mem_available_mib();
        /* the ranks mpirun started on this host share its memory, and their file mappings' pages */
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        int local = ls && atoi(ls) > 1 ? atoi(ls) : 1;
        double need = plan.mapped_mib + local * (plan.total_mib - plan.mapped_mib);
        if (avail > 0 && need > avail) {
            char ranks[64] = "";
            if (local > 1) snprintf(ranks, sizeof ranks, " (%d ranks on this host)", local);
            fprintf(stderr, "ftune %s: error: the run would need about %.1f MiB at its peak%s but %.1f MiB is %s: "
                    "nothing was loaded or written. The largest term is %s (%.1f MiB)", me, need, ranks, avail,
                    limit_mib > 0 ? "the --memory-limit" : "available (MemAvailable)", plan.largest, plan.largest_mib);
            if (plan.best_switch[0])
                fprintf(stderr, "; %s would save the most (%.1f MiB)", plan.best_switch, plan.best_saving_mib);
            fprintf(stderr, ". `ftune plan` with these arguments shows every term.\n");
            return 1;
        }
        if (!quiet && rank == 0)
            fprintf(stderr, "memory plan: %.1f MiB at the peak (largest term: %s, %.1f MiB; `ftune plan` shows all)\n",
                    plan.total_mib, plan.largest, plan.largest_mib);
    }

    /* full fine-tuning starts its f32 masters from the weights as stored:
     * the model is loaded in f32 and only the products round (ftune_train_opts.dtype) */
    ftune_model *m = cli_load_model_with(me, model, tokenizer, 0, true, full ? NULL : o.dtype, quant);
    if (profile) setenv("FTUNE_PROFILE", "1", 1); /* read when the trainer is made */
    if (full) cli_note_dtype(o.dtype);
    if (!m) return 1;
    if (plan_error[0] && !quiet && rank == 0) fprintf(stderr, "note: no memory plan (no fit check): %s\n", plan_error);
    o.model = m;
    o.model_path = model;
    o.stop = &g_stop;
    struct sigaction sa, old_sa[N_STOP_SIGNALS];
    bool handled[N_STOP_SIGNALS] = { false };
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C (SIGTERM, SIGHUP) stops at once */
    sigemptyset(&sa.sa_mask);
    /* Under mpirun, Ctrl-C ends the job at once (mpirun sends SIGTERM, then
     * SIGKILL a second later); mpirun forwards SIGUSR1 to every rank, so
     * `kill -USR1 <mpirun's pid>` is the job's Ctrl-C: all ranks stop after
     * the same step and rank 0 saves a checkpoint. SIGTERM asks the same,
     * in the time mpirun gives before SIGKILL. A SIGHUP or SIGTERM that was
     * ignored when ftune started (nohup) stays ignored; SIGINT is always
     * handled, as a background job of a script starts with it ignored. */
    for (int i = 0; i < N_STOP_SIGNALS; i++) {
        int sig = stop_signals[i].sig;
        if (sig == SIGUSR1 && ftune_dist_world() <= 1) continue;
        if (sigaction(sig, NULL, &old_sa[i]) != 0) continue;
        if ((sig == SIGHUP || sig == SIGTERM) && old_sa[i].sa_handler == SIG_IGN) continue;
        handled[i] = sigaction(sig, &sa, NULL) == 0;
    }
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a write error, not a kill */

    cli_progress dp;
    quiet |= rank != 0; /* rank 0 speaks for the job; every rank reports its own error */
    progress_ctx pc = { .quiet = quiet, .tty = isatty(2), .spark = isatty(2) && locale_is_utf8(), .truncate_end = o.truncate == FTUNE_TRUNCATE_END, .data = &dp };
    cli_progress_begin(&dp, "tokenizing the data", progress);
    if (!quiet && dp.on) {
        o.data_progress = on_data_progress;
        o.data_progress_ctx = &dp;
    }
    ftune_train_result res;
    st = ftune_train_run(&o, on_progress, &pc, &res);
    cli_progress_end(&dp);
    end_line(&pc);
    for (int i = 0; i < N_STOP_SIGNALS; i++)
        if (handled[i]) sigaction(stop_signals[i].sig, &old_sa[i], NULL);
    int rc = 0;
    if (st == FTUNE_ERR_INTERRUPTED) {
        *together = true;
        rc = 1;
        /* the same message on every rank: once; it names the signal when this rank had one */
        const char *sig = stop_signal_name(g_stop);
        if (rank == 0 && sig) fprintf(stderr, "ftune %s: error: %s; the signal was %s\n", me, ftune_last_error(), sig);
        else if (rank == 0) cli_fail(me, st);
    } else if (st) rc = cli_fail(me, st);
    else if (!quiet) {
        if (res.memory_table[0]) fprintf(stderr, "%speak RSS %.1f MiB", res.memory_table, res.peak_rss_mib);
        if (res.memory_table[0] && planned)
            fprintf(stderr, " (planned %.1f MiB: %+.1f%%)", plan.total_mib, 100 * (plan.total_mib / res.peak_rss_mib - 1));
        if (res.memory_table[0]) fputc('\n', stderr);
        if (res.comm_calls && res.comm_steps)
            fprintf(stderr, "communication per step and rank: %.1f MB sent (ring model; %.0f bytes), %.0f collective calls\n",
                    (double)res.comm_bytes / 1e6 / (double)res.comm_steps,
                    (double)res.comm_bytes / (double)res.comm_steps, (double)res.comm_calls / (double)res.comm_steps);
        if (res.skipped_steps)
            fprintf(stderr, "%lld step(s) skipped for non-finite gradients; final loss scale %g\n",
                    (long long)res.skipped_steps, res.loss_scale);
        if (res.has_val)
            fprintf(stderr, "val loss: %.4f before, %.4f after %lld steps\n", res.val_loss_first, res.val_loss_last,
                    (long long)res.steps_done);
        ftune_model_info info;
        ftune_model_get_info(m, &info);
        if (full && strcmp(info.format, "hf") != 0)
            fprintf(stderr, "note: the base is not a Hugging Face directory, so %s has no tokenizer files; copy "
                    "them in (or pass the base's tokenizer) to use it\n", o.out_dir);
    }
    ftune_model_free(m);
    return rc;
}

/* The job: every rank runs the same command; one that fails ends them all
 * (MPI_Abort), so that no rank waits forever in a collective for it. */
int cmd_train(int argc, char **argv) {
    ftune_status st = ftune_dist_init();
    if (st) return cli_fail("train", st);
    int rank = ftune_dist_rank(), world = ftune_dist_world();
    char me[64] = "train";
    if (world > 1) snprintf(me, sizeof me, "train [rank %d of %d]", rank, world);
    bool together = false;
    int rc = train_main(argc, argv, me, rank, &together, false);
    if (rc != 0 && world > 1 && !together && !ftune_dist_failed_together()) {
        fflush(NULL);
        ftune_dist_abort(rc);
    }
    ftune_dist_finalize();
    return rc;
}

/* `ftune plan`: train's arguments and parser, the plan printed, nothing run. */
int cmd_plan(int argc, char **argv) { bool together; return train_main(argc, argv, "plan", 0, &together, true); }
