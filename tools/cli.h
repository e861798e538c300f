/* cli.h — the ftune command's shared pieces: a table-driven option parser
 * whose --help lists every option with its default, and helpers used by
 * several subcommands. */
#ifndef FT_CLI_H
#define FT_CLI_H

#include "ftune.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum { OPT_STR, OPT_INT, OPT_FLOAT, OPT_FLAG, OPT_U64 } opt_kind;

typedef struct {
    const char *shrt;    /* "-m" or NULL */
    const char *lng;     /* "--model" */
    opt_kind kind;
    void *dst;           /* const char **, int *, float *, bool *, uint64_t * */
    const char *meta;    /* "FILE", "N" (shown in --help) */
    const char *help;
    bool seen;           /* set by the parser */
} cli_opt;

typedef struct {
    const char *name;    /* "generate" */
    const char *synopsis;/* "-m MODEL [-p PROMPT] [options]" */
    const char *about;   /* one paragraph */
    cli_opt *opts;       /* terminated by an entry with lng == NULL */
    const char **pos;    /* positional arguments collected here */
    int max_pos, n_pos;
} cli_cmd;

/* Parses argv (after the subcommand). Returns 0 to continue, 1 if --help
 * was printed (exit 0), -1 on a usage error (message printed, exit 2). */
int cli_parse(cli_cmd *cmd, int argc, char **argv);
void cli_usage(const cli_cmd *cmd, FILE *f);
bool cli_seen(const cli_cmd *cmd, const char *lng);

/* Prints "ftune CMD: <library error>" to stderr and returns 1. */
int cli_fail(const char *cmd, ftune_status st);
/* Loads a model, printing the error on failure; need_tokenizer makes a
 * model without a tokenizer an error. */
ftune_model *cli_load_model(const char *cmd, const char *path, const char *tokenizer, int ctx, bool need_tokenizer);
/* The same for compute dtype dtype ("f32", "bf16", "f16"; NULL: f32),
 * noting once on stderr when this CPU widens it instead of multiplying
 * it natively. */
/* The note cli_load_model_dtype prints for dtype (nothing for NULL, f32 or
 * a dtype this CPU multiplies natively). */
void cli_note_dtype(const char *dtype);
ftune_model *cli_load_model_dtype(const char *cmd, const char *path, const char *tokenizer, int ctx,
                                  bool need_tokenizer, const char *dtype);
/* The same with the base weights quantized on load (quant: NULL or "nf4"). */
ftune_model *cli_load_model_quant(const char *cmd, const char *path, const char *tokenizer, int ctx, bool need_tokenizer,
                                  const char *quant);
/* Both: compute dtype dtype and base weights quantized on load (either NULL). */
ftune_model *cli_load_model_with(const char *cmd, const char *path, const char *tokenizer, int ctx,
                                 bool need_tokenizer, const char *dtype, const char *quant);
/* -c N of eval and generate: refused (a message, 1) when longer than the
 * model's context length, as train refuses its --ctx; 0 when it fits. */
int cli_check_ctx(const char *cmd, const ftune_model *m, int ctx);
/* Writes the bytes of a token piece to f, dropping control bytes other than
 * whitespace (as llama2.c does). */
void cli_print_piece(FILE *f, const char *piece, int n);
/* Monotonic seconds. */
double ft_cli_time(void);

/* A progress line on stderr ("tokenizing x.jsonl  45%  ETA 12s"), redrawn
 * in place at most 4 times a second; only when stderr is a terminal or
 * forced (a --progress flag; then, off a terminal, one line a second and
 * the last), so logs and --json output stay clean. */
typedef struct {
    bool on, tty, drawn;
    const char *label;
    double t0, last;
} cli_progress;
void cli_progress_begin(cli_progress *p, const char *label, bool force);
void cli_progress_update(cli_progress *p, double done, double total);
/* Ends the line (if one was drawn). */
void cli_progress_end(cli_progress *p);
/* "12s", "3m05s", "1h02m"; "?" when unknown. */
void cli_fmt_duration(char *buf, size_t cap, double s);

int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

#endif
