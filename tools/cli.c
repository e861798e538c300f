/* cli.c — option parsing and shared helpers for the ftune subcommands. */
#include <stdio.h>
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void print_default(const cli_opt *o, FILE *f) {
    if (strstr(o->help, "(default:")) return; /* the help says it in words */
    switch (o->kind) {
    case OPT_STR: {
        const char *v = *(const char **)o->dst;
        if (v) fprintf(f, " (default: %s)", v);
        break;
    }
    case OPT_INT: fprintf(f, " (default: %d)", *(int *)o->dst); break;
    case OPT_FLOAT: fprintf(f, " (default: %g)", *(float *)o->dst); break;
    case OPT_U64: fprintf(f, " (default: %llu)", (unsigned long long)*(uint64_t *)o->dst); break;
    case OPT_FLAG: break;
    }
}

void cli_usage(const cli_cmd *cmd, FILE *f) {
    fprintf(f, "usage: ftune %s %s\n\n%s\n\noptions:\n", cmd->name, cmd->synopsis, cmd->about);
    for (const cli_opt *o = cmd->opts; o->lng; o++) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "%s%s%s%s%s", o->shrt ? o->shrt : "", o->shrt ? ", " : "    ", o->lng,
                 o->kind == OPT_FLAG ? "" : " ", o->kind == OPT_FLAG ? "" : o->meta);
        fprintf(f, "  %-28s %s", lhs, o->help);
        print_default(o, f);
        fputc('\n', f);
    }
    fprintf(f, "  %-28s %s\n", "-h, --help", "show this help");
}

bool cli_seen(const cli_cmd *cmd, const char *lng) {
    for (const cli_opt *o = cmd->opts; o->lng; o++)
        if (strcmp(o->lng, lng) == 0) return o->seen;
    return false;
}

static int bad(const cli_cmd *cmd, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "ftune %s: ", cmd->name);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see ftune %s --help)\n", cmd->name);
    return -1;
}

static int set_value(const cli_cmd *cmd, cli_opt *o, const char *name, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case OPT_STR: *(const char **)o->dst = v; break;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (*v == 0 || *end || errno || x < -2147483647L || x > 2147483647L)
            return bad(cmd, "%s expects an integer, got \"%s\"", name, v);
        *(int *)o->dst = (int)x;
        break;
    }
    case OPT_FLOAT: {
        float x = strtof(v, &end);
        if (*v == 0 || *end || errno) return bad(cmd, "%s expects a number, got \"%s\"", name, v);
        if (!isfinite(x)) return bad(cmd, "%s expects a finite number, got \"%s\"", name, v);
        *(float *)o->dst = x;
        break;
    }
    case OPT_U64: {
        if (*v == '-') return bad(cmd, "%s expects a non-negative integer, got \"%s\"", name, v);
        unsigned long long x = strtoull(v, &end, 10);
        if (*v == 0 || *end || errno) return bad(cmd, "%s expects a non-negative integer, got \"%s\"", name, v);
        *(uint64_t *)o->dst = x;
        break;
    }
    case OPT_FLAG: *(bool *)o->dst = true; break;
    }
    o->seen = true;
    return 0;
}

int cli_parse(cli_cmd *cmd, int argc, char **argv) {
    cmd->n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cli_usage(cmd, stdout);
            return 1;
        }
        if (a[0] != '-' || a[1] == 0) {
            if (cmd->n_pos >= cmd->max_pos) return bad(cmd, "unexpected argument \"%s\"%s", a, "");
            cmd->pos[cmd->n_pos++] = a;
            continue;
        }
        /* --name=value */
        char name[64];
        const char *eq = strchr(a, '=');
        const char *val = NULL;
        if (a[1] == '-' && eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else snprintf(name, sizeof name, "%s", a);
        cli_opt *o = NULL;
        for (cli_opt *p = cmd->opts; p->lng && !o; p++)
            if (strcmp(p->lng, name) == 0 || (p->shrt && strcmp(p->shrt, name) == 0)) o = p;
        if (!o) return bad(cmd, "unknown option %s%s", name, "");
        if (o->kind == OPT_FLAG) {
            if (val) return bad(cmd, "%s takes no value%s", name, "");
            *(bool *)o->dst = true;
            o->seen = true;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) return bad(cmd, "%s needs a value (%s)", name, o->meta);
            val = argv[++i];
        }
        if (set_value(cmd, o, name, val)) return -1;
    }
    return 0;
}

int cli_fail(const char *cmd, ftune_status st) {
    fprintf(stderr, "ftune %s: error: %s\n", cmd, ftune_last_error()[0] ? ftune_last_error() : ftune_status_name(st));
    return 1;
}

void cli_note_dtype(const char *dtype) {
    if (dtype && !ftune_dtype_is_native(dtype))
        fprintf(stderr, "note: this CPU has no %s multiply instructions%s: --dtype %s runs on the widening path "
                "(the same numbers, computed in f32 from %s-rounded operands)\n", dtype,
                strcmp(dtype, "bf16") == 0 ? " (AVX512_BF16)" : "", dtype, dtype);
}

ftune_model *cli_load_model(const char *cmd, const char *path, const char *tokenizer, int ctx, bool need_tokenizer) {
    return cli_load_model_with(cmd, path, tokenizer, ctx, need_tokenizer, NULL, NULL);
}

ftune_model *cli_load_model_dtype(const char *cmd, const char *path, const char *tokenizer, int ctx,
                                  bool need_tokenizer, const char *dtype) {
    return cli_load_model_with(cmd, path, tokenizer, ctx, need_tokenizer, dtype, NULL);
}

ftune_model *cli_load_model_quant(const char *cmd, const char *path, const char *tokenizer, int ctx, bool need_tokenizer,
                                  const char *quant) {
    return cli_load_model_with(cmd, path, tokenizer, ctx, need_tokenizer, NULL, quant);
}

ftune_model *cli_load_model_with(const char *cmd, const char *path, const char *tokenizer, int ctx,
                                 bool need_tokenizer, const char *dtype, const char *quant) {
    if (!path) {
        fprintf(stderr, "ftune %s: no model given (-m MODEL: a Hugging Face directory, .gguf or llama2.c .bin)\n", cmd);
        return NULL;
    }
    ftune_load_opts o = { .tokenizer_path = tokenizer, .context_length = ctx, .dtype = dtype, .quant = quant };
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, path, &o);
    if (st) { cli_fail(cmd, st); return NULL; }
    cli_note_dtype(dtype);
    if (need_tokenizer && !ftune_model_tokenizer(m)) {
        fprintf(stderr, "ftune %s: error: %s: no tokenizer (a Hugging Face directory needs tokenizer.json)\n", cmd, path);
        ftune_model_free(m);
        return NULL;
    }
    return m;
}

int cli_check_ctx(const char *cmd, const ftune_model *m, int ctx) {
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    if (ctx <= info.context_length) return 0;
    fprintf(stderr, "ftune %s: error: -c %d is longer than the model's context length %d\n", cmd, ctx,
            info.context_length);
    return 1;
}

void cli_print_piece(FILE *f, const char *piece, int n) {
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)piece[i];
        if (c < 0x20 && !isspace(c)) continue;
        if (c == 0x7F) continue;
        fputc(c, f);
    }
}

void cli_fmt_duration(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 1e8) { snprintf(buf, cap, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
}

void cli_progress_begin(cli_progress *p, const char *label, bool force) {
    p->tty = isatty(2);
    p->on = force || p->tty;
    p->drawn = false;
    p->label = label;
    p->t0 = ft_cli_time();
    p->last = -1;
}

void cli_progress_update(cli_progress *p, double done, double total) {
    if (!p->on) return;
    double now = ft_cli_time();
    if (p->last >= 0 && now - p->last < (p->tty ? 0.25 : 1.0) && done < total) return;
    p->last = now;
    double frac = total > 0 ? done / total : 1;
    char eta[32];
    cli_fmt_duration(eta, sizeof eta, frac > 0 ? (now - p->t0) * (1 - frac) / frac : -1);
    if (p->tty) fprintf(stderr, "\r%s  %3.0f%%  ETA %s\033[K", p->label, 100 * frac, eta);
    else fprintf(stderr, "%s  %3.0f%%  ETA %s\n", p->label, 100 * frac, eta);
    fflush(stderr);
    p->drawn = true;
}

void cli_progress_end(cli_progress *p) {
    if (p->drawn && p->tty) fputc('\n', stderr);
    p->drawn = false;
}

double ft_cli_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
