/* cmd_report.c — `ftune report RUN_DIR... -o report.html`: one self-contained
 * HTML page (inline SVG, no script, no network) with the curves of each run's
 * metrics.jsonl side by side, and each run's adapter_config.json as a table
 * with the values that differ between runs highlighted. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* One metrics.jsonl line's numbers; NAN where the line has none (or null,
 * metrics.jsonl's spelling of a non-finite value). */
typedef struct {
    double step, loss, lr, grad_norm, tokens_per_s, peak_rss_mib, val_loss;
} rep_row;

typedef struct {
    const char *dir;
    rep_row *rows;
    int n, cap;
    int bad_lines, first_bad;   /* lines that are not a JSON object with a step */
    char first_bad_why[96];
    cJSON *config;              /* adapter_config.json, or NULL */
    const char *missing;        /* why there are no metrics, or NULL */
} rep_run;

static double num_or_nan(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static void note_bad(rep_run *r, int line, const char *why) {
    fprintf(stderr, "ftune report: %s/metrics.jsonl:%d: %s; line skipped\n", r->dir, line, why);
    if (r->bad_lines++ == 0) {
        r->first_bad = line;
        snprintf(r->first_bad_why, sizeof r->first_bad_why, "%s", why);
    }
}

/* Reads what can be read of DIR/metrics.jsonl: a line that does not parse
 * (a run killed mid-write leaves a truncated last line) is named and skipped. */
static int read_run(rep_run *r) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "ftune report: %s: cannot open: %s\n", path, strerror(errno));
        r->missing = "no metrics.jsonl";
        return 0;
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int ln = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        ln++;
        if (len == 0 || (len == 1 && line[0] == '\n')) continue;
        cJSON *j = cJSON_Parse(line);
        if (!j || !cJSON_IsObject(j)) {
            note_bad(r, ln, line[len - 1] == '\n' ? "not a JSON object" : "not a JSON object (truncated last line)");
            cJSON_Delete(j);
            continue;
        }
        rep_row w = { num_or_nan(j, "step"), num_or_nan(j, "loss"), num_or_nan(j, "lr"), num_or_nan(j, "grad_norm"),
                      num_or_nan(j, "tokens_per_s"), num_or_nan(j, "peak_rss_mib"), num_or_nan(j, "val_loss") };
        cJSON_Delete(j);
        if (!isfinite(w.step)) { note_bad(r, ln, "no numeric \"step\""); continue; }
        if (r->n > 0 && w.step <= r->rows[r->n - 1].step) { note_bad(r, ln, "step not after the previous line's"); continue; }
        if (r->n == r->cap) {
            int nc = r->cap ? 2 * r->cap : 256;
            rep_row *nr = realloc(r->rows, (size_t)nc * sizeof *nr);
            if (!nr) { free(line); fclose(f); fprintf(stderr, "ftune report: out of memory\n"); return -1; }
            r->rows = nr;
            r->cap = nc;
        }
        r->rows[r->n++] = w;
    }
    free(line);
    fclose(f);
    if (r->n == 0 && !r->missing) r->missing = "metrics.jsonl holds no readable step";
    snprintf(path, sizeof path, "%s/adapter_config.json", r->dir);
    f = fopen(path, "r");
    if (f) {
        char buf[1 << 16];
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = 0;
        r->config = cJSON_Parse(buf);
        if (!r->config) fprintf(stderr, "ftune report: %s: not valid JSON; its configuration is left out\n", path);
    }
    return 0;
}

static void html_esc(FILE *o, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", o);
        else if (*s == '>') fputs("&gt;", o);
        else if (*s == '&') fputs("&amp;", o);
        else if (*s == '"') fputs("&quot;", o);
        else fputc(*s, o);
    }
}

static const char *colors[] = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b" };
#define NCOLORS (int)(sizeof colors / sizeof colors[0])

enum { SER_LOSS, SER_LR, SER_GN, SER_TPS, SER_RSS, SER_VAL };
static double field(const rep_row *w, int s) {
    switch (s) {
    case SER_LOSS: return w->loss;
    case SER_LR: return w->lr;
    case SER_GN: return w->grad_norm;
    case SER_TPS: return w->tokens_per_s;
    case SER_RSS: return w->peak_rss_mib;
    default: return w->val_loss;
    }
}

/* Chart geometry: the plot area inside an SVG of W x H. */
#define W 640
#define H 300
#define L 70
#define R 20
#define T 30
#define B 40

/* One chart of series s (and, for the loss, the smoothed loss and the
 * validation loss) of every run. The path of each series has one vertex per
 * finite value; a non-finite value ends the path (a gap, marked by a dashed
 * line at its step). data-ymin/data-ymax: the finite values' range, which
 * spans the plot area's height. */
static void chart(FILE *o, rep_run *runs, int nr, int s, const char *title, double smooth) {
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < runs[i].n; k++) {
            const rep_row *w = &runs[i].rows[k];
            xmin = fmin(xmin, w->step);
            xmax = fmax(xmax, w->step);
            for (int q = 0; q < 2; q++) {
                double v = field(w, q ? (s == SER_LOSS ? SER_VAL : s) : s);
                if (isfinite(v)) { ymin = fmin(ymin, v); ymax = fmax(ymax, v); }
            }
        }
    if (!isfinite(ymin)) {
        fprintf(o, "<h2>%s</h2><p class=note>no run logged a finite value.</p>\n", title);
        return;
    }
    double xs = xmax > xmin ? xmax - xmin : 1, ys = ymax > ymin ? ymax - ymin : 1;
#define PX(x) (L + ((x) - xmin) / xs * (W - L - R))
#define PY(y) (H - B - ((y) - ymin) / ys * (H - T - B))
    fprintf(o, "<h2>%s</h2>\n%s<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "data-chart=\"%s\" data-ymin=\"%.9g\" data-ymax=\"%.9g\" data-top=\"%d\" data-bottom=\"%d\">\n",
            title, s == SER_LOSS ? "<p class=note>thin: train loss per step; thick: smoothed; dashed: validation loss.</p>\n" : "",
            W, H, title, ymin, ymax, T, H - B);
    fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#999\"/>\n", L, T, W - L - R,
            H - T - B);
    for (int g = 0; g <= 4; g++) {
        double y = ymin + ys * g / 4, x = xmin + xs * g / 4;
        fprintf(o, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.4g</text>\n", L - 4, PY(y) + 4, y);
        fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L, W - R, PY(y), PY(y));
        fprintf(o, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%.0f</text>\n", PX(x), H - B + 16, x);
    }
    fprintf(o, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 6);
    for (int i = 0; i < nr; i++) {
        const char *c = colors[i % NCOLORS];
        int nser = s == SER_LOSS ? 3 : 1;
        for (int q = 0; q < nser; q++) {
            const char *name = q == 0 ? (s == SER_LOSS ? "train-raw" : "value") : q == 1 ? "train-smoothed" : "val";
            fprintf(o, "<path data-run=\"%d\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s d=\"",
                    i, name, c, q == 1 ? "2.2" : q == 2 ? "1.8" : "1", q == 0 && s == SER_LOSS ? " stroke-opacity=\"0.45\"" : q == 2 ? " stroke-dasharray=\"6 3\"" : "");
            bool pen = false;
            double ema = NAN;
            for (int k = 0; k < runs[i].n; k++) {
                const rep_row *w = &runs[i].rows[k];
                double v = field(w, q == 2 ? SER_VAL : s);
                if (q == 1 && isfinite(v)) v = ema = isfinite(ema) ? smooth * ema + (1 - smooth) * v : v;
                if (!isfinite(v)) {
                    /* a training value logged as null is a gap; a step without a validation loss is not */
                    if (q != 2) pen = false;
                    continue;
                }
                fprintf(o, "%s%.2f %.2f", pen ? " L" : (k ? " M" : "M"), PX(w->step), PY(v));
                pen = true;
            }
            fputs("\"/>\n", o);
        }
        for (int k = 0; k < runs[i].n; k++)
            if (!isfinite(field(&runs[i].rows[k], s)))
                fprintf(o, "<line class=\"gap\" data-run=\"%d\" x1=\"%.2f\" x2=\"%.2f\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" "
                        "stroke-dasharray=\"4 3\"><title>step %.0f: not finite</title></line>\n",
                        i, PX(runs[i].rows[k].step), PX(runs[i].rows[k].step), T, H - B, "#c00", runs[i].rows[k].step);
    }
    fputs("</svg>\n", o);
#undef PX
#undef PY
}

static void config_table(FILE *o, rep_run *runs, int nr) {
    bool any = false;
    for (int i = 0; i < nr; i++) any |= runs[i].config != NULL;
    fputs("<h2>Configuration (adapter_config.json)</h2>\n", o);
    if (!any) { fputs("<p class=note>no run directory holds an adapter_config.json.</p>\n", o); return; }
    fputs("<table><tr><th>key</th>", o);
    for (int i = 0; i < nr; i++) { fputs("<th>", o); html_esc(o, runs[i].dir); fputs("</th>", o); }
    fputs("</tr>\n", o);
    /* keys in the order the first run holding each names them */
    for (int i = 0; i < nr; i++) {
        if (!runs[i].config) continue;
        for (cJSON *e = runs[i].config->child; e; e = e->next) {
            bool seen = false;
            for (int p = 0; p < i && !seen; p++)
                seen = runs[p].config && cJSON_GetObjectItemCaseSensitive(runs[p].config, e->string);
            if (seen || !e->string) continue;
            char *v[64] = { 0 };
            bool differ = false;
            for (int p = 0; p < nr && p < 64; p++) {
                const cJSON *x = runs[p].config ? cJSON_GetObjectItemCaseSensitive(runs[p].config, e->string) : NULL;
                v[p] = x ? cJSON_PrintUnformatted(x) : NULL;
                if (p > 0 && ((!v[p]) != (!v[0]) || (v[p] && v[0] && strcmp(v[p], v[0]) != 0))) differ = true;
            }
            fprintf(o, "<tr%s><td>", differ ? " class=diff" : "");
            html_esc(o, e->string);
            fputs("</td>", o);
            for (int p = 0; p < nr && p < 64; p++) {
                fputs("<td>", o);
                html_esc(o, v[p] ? v[p] : "—");
                fputs("</td>", o);
                free(v[p]);
            }
            fputs("</tr>\n", o);
        }
    }
    fputs("</table>\n", o);
}

int cmd_report(int argc, char **argv) {
    const char *out = NULL;
    float smooth = 0.9f;
    const char *pos[64];
    cli_opt opts[] = {
        { "-o", "--output", OPT_STR, &out, "FILE", "the HTML file to write" },
        { NULL, "--smooth", OPT_FLOAT, &smooth, "A",
          "weight of the smoothed loss's history: s = A*s + (1-A)*loss, as TensorBoard's smoothing (0 <= A < 1)" },
        { 0 },
    };
    cli_cmd cmd = { "report", "RUN_DIR [RUN_DIR...] -o report.html",
                    "One self-contained HTML page (inline SVG, no script, no network) of the runs' metrics.jsonl:\n"
                    "train loss raw and smoothed with the validation loss, learning rate, grad norm, tokens/s and\n"
                    "peak RSS against the step, and each run's adapter_config.json with the differences highlighted.",
                    opts, pos, 64, 0 };
    int rc = cli_parse(&cmd, argc, argv);
    if (rc) return rc > 0 ? 0 : 2;
    if (cmd.n_pos == 0) { fprintf(stderr, "ftune report: give at least one RUN_DIR\n"); return 2; }
    if (!out) { fprintf(stderr, "ftune report: give -o FILE, the HTML file to write\n"); return 2; }
    if (!(smooth >= 0 && smooth < 1)) { fprintf(stderr, "ftune report: --smooth must be in [0, 1), not %g\n", smooth); return 2; }
    rep_run runs[64] = { 0 };
    int nr = cmd.n_pos, readable = 0;
    for (int i = 0; i < nr; i++) {
        runs[i].dir = pos[i];
        if (read_run(&runs[i]) != 0) return 1;
        readable += runs[i].n > 0;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *o = fopen(tmp, "w");
    if (!o) { fprintf(stderr, "ftune report: %s: cannot write: %s\n", tmp, strerror(errno)); return 1; }
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ftune report</title>\n<style>"
          "body{font-family:sans-serif;margin:20px;background:#fafafa}svg{background:#fff;margin:4px}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}"
          "tr.diff td{background:#fff3b0;font-weight:bold}.note{color:#555}.bad{color:#b00}</style></head><body>\n"
          "<h1>ftune report</h1>\n<ul>\n", o);
    for (int i = 0; i < nr; i++) {
        fprintf(o, "<li><span style=\"color:%s\">&#9632;</span> ", colors[i % NCOLORS]);
        html_esc(o, runs[i].dir);
        fprintf(o, ": %d steps", runs[i].n);
        if (runs[i].missing) fprintf(o, " <span class=bad>(%s)</span>", runs[i].missing);
        if (runs[i].bad_lines)
            fprintf(o, " <span class=bad>(%d unreadable line(s) of metrics.jsonl skipped; the first, line %d: %s)</span>",
                    runs[i].bad_lines, runs[i].first_bad, runs[i].first_bad_why);
        fputs("</li>\n", o);
    }
    fprintf(o, "</ul>\n<p class=note>x axis: the optimizer step (metrics.jsonl does not record the tokens seen, so runs "
            "with different batch sizes are compared per step, not per token). Smoothed loss: exponential moving "
            "average with weight %.3g. A dashed red line marks a step whose value was not finite (logged as null).</p>\n",
            smooth);
    if (readable > 0) {
        chart(o, runs, nr, SER_LOSS, "loss", smooth);
        chart(o, runs, nr, SER_LR, "learning rate", smooth);
        chart(o, runs, nr, SER_GN, "grad norm", smooth);
        chart(o, runs, nr, SER_TPS, "tokens per second", smooth);
        chart(o, runs, nr, SER_RSS, "peak RSS (MiB)", smooth);
    }
    config_table(o, runs, nr);
    fputs("</body></html>\n", o);
    bool werr = fflush(o) != 0 || ferror(o) != 0 || fsync(fileno(o)) != 0;
    if (fclose(o) != 0 || werr || rename(tmp, out) != 0) {
        fprintf(stderr, "ftune report: %s: write failed: %s\n", out, strerror(errno));
        remove(tmp);
        return 1;
    }
    for (int i = 0; i < nr; i++) { free(runs[i].rows); cJSON_Delete(runs[i].config); }
    printf("%s\n", out);
    if (readable == 0) { fprintf(stderr, "ftune report: no run has a readable step (report written: %s)\n", out); return 1; }
    return 0;
}
