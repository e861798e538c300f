/* train_state.c — the checkpoint state (trainer_state.json): parsing with
 * every field checked for type and range, and the per-file checksums that
 * resume verifies. Apart from train_loop.c so that a fuzzer can drive the
 * parser without a model. */
#include "train/train_loop.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* FNV-1a, 64 bits. Each byte step h -> (h ^ b) * P is a bijection of h (P
 * is odd, so multiplying by it is invertible mod 2^64), so two inputs that
 * differ in a single byte (any bit flips within it) always hash differently;
 * other damage goes unnoticed with probability 2^-64. */
uint64_t ft_fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

ftune_status ft_file_fnv1a(const char *path, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = ft_malloc(CHUNK);
    if (!buf) { close(fd); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    uint64_t h = FT_FNV0;
    ftune_status st = FTUNE_OK;
    for (;;) {
        ssize_t k = read(fd, buf, CHUNK);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { st = ft_err(FTUNE_ERR_IO, "%s: read: %s", path, strerror(errno)); break; }
        if (k == 0) break;
        h = ft_fnv1a(h, buf, (size_t)k);
    }
    free(buf);
    close(fd);
    *out = h;
    return st;
}

void ft_ckpt_state_free(ft_ckpt_state *s) {
    cJSON_Delete(s->root);
    memset(s, 0, sizeof *s);
}

/* An integral JSON number in [lo, hi]. */
static bool int_in(const cJSON *x, double lo, double hi, int64_t *out) {
    if (!cJSON_IsNumber(x)) return false;
    double v = x->valuedouble;
    if (!(v >= lo && v <= hi) || v != floor(v)) return false;
    *out = (int64_t)v;
    return true;
}

/* The files a checkpoint may hold; a checksum for anything else (a path
 * with '/', say) is refused. */
static const char *const ckpt_files[] = { "trainable.safetensors", "optimizer.safetensors", "adapter_model.safetensors",
                                          "adapter_config.json" };

void ft_ckpt_shard_name(char *out, int rank, int world) { snprintf(out, 64, "shard-%d-of-%d.safetensors", rank, world); }

/* A checkpoint file, or in a sharded one (world > 0) one of its shards. */
static bool known_file(const char *name, int world) {
    for (size_t i = 0; i < sizeof ckpt_files / sizeof ckpt_files[0]; i++)
        if (strcmp(name, ckpt_files[i]) == 0) return true;
    for (int r = 0; r < world; r++) {
        char sn[64];
        ft_ckpt_shard_name(sn, r, world);
        if (strcmp(name, sn) == 0) return true;
    }
    return false;
}

static bool parse_hex64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    int n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0 || n >= 16) return false;
        v = v << 4 | (uint64_t)d;
    }
    if (n != 16) return false;
    *out = v;
    return true;
}

/* trainer_state.json's own checksum (version 4): "state_checksum", the
 * file's last field, is FNV-1a 64 of the file's bytes with its 16 hex digits
 * read as '0's. Over the bytes as written, so no re-serialisation (cJSON's
 * number printing) has to agree between the writer and the reader. */
#define STATE_KEY "\"state_checksum\""

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Where the 16 digits of the trailing "state_checksum": "<hex>" are, or -1
 * when the file does not end with that field (then the root object). */
static long state_sum_at(const char *t, size_t n) {
    size_t i = n;
    while (i > 0 && is_ws(t[i - 1])) i--;
    if (i == 0 || t[--i] != '}') return -1;
    while (i > 0 && is_ws(t[i - 1])) i--;
    if (i < 18 || t[i - 1] != '"' || t[i - 18] != '"') return -1;
    size_t digits = i - 17;
    i -= 18;
    while (i > 0 && is_ws(t[i - 1])) i--;
    if (i == 0 || t[--i] != ':') return -1;
    while (i > 0 && is_ws(t[i - 1])) i--;
    size_t k = sizeof STATE_KEY - 1;
    if (i < k || memcmp(t + i - k, STATE_KEY, k) != 0) return -1;
    return (long)digits;
}

static uint64_t state_sum(const char *t, size_t n, size_t digits) {
    uint64_t h = ft_fnv1a(FT_FNV0, t, digits);
    h = ft_fnv1a(h, "0000000000000000", 16);
    return ft_fnv1a(h, t + digits + 16, n - digits - 16);
}

ftune_status ft_ckpt_state_text(const struct cJSON *j, char **out, size_t *out_len) {
    *out = NULL;
    char *body = cJSON_Print(j);
    if (!body) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    size_t n = strlen(body);
    while (n > 0 && body[n - 1] != '}') n--;
    if (n < 2) { free(body); return ft_err(FTUNE_ERR_ARG, "trainer state: not a JSON object"); }
    size_t cap = n + 64;
    char *t = ft_malloc(cap);
    if (!t) { free(body); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    /* the body without its closing brace, then the field, the brace and a newline */
    size_t m = n - 1;
    while (m > 0 && is_ws(body[m - 1])) m--;
    int k = snprintf(t, cap, "%.*s,\n\t%s:\t\"0000000000000000\"\n}\n", (int)m, body, STATE_KEY);
    free(body);
    size_t len = (size_t)k;
    long at = state_sum_at(t, len);
    if (at < 0) { free(t); return ft_err(FTUNE_ERR_ARG, "trainer state: cannot place its checksum"); }
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)state_sum(t, len, (size_t)at));
    memcpy(t + at, hex, 16);
    *out = t;
    *out_len = len;
    return FTUNE_OK;
}

ftune_status ft_ckpt_state_parse(ft_ckpt_state *s, const char *text, size_t len, const char *path) {
    memset(s, 0, sizeof *s);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) return ft_err(FTUNE_ERR_FORMAT, "%s: not valid JSON (byte %ld)", path,
                          end && end >= text && end <= text + len ? (long)(end - text) : 0L);
    s->root = j;
    ftune_status st = FTUNE_OK;
#define BAD(...) do { st = ft_err(FTUNE_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)
    if (!cJSON_IsObject(j)) BAD("%s: not an ftune checkpoint state (expected a JSON object)", path);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FT_CKPT_FORMAT) != 0)
        BAD("%s: not an ftune checkpoint state (\"format\" is not \"%s\")", path, FT_CKPT_FORMAT);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (!cJSON_IsNumber(ver) || !(ver->valuedouble >= FT_CKPT_VERSION_MIN && ver->valuedouble <= FT_CKPT_VERSION) ||
        ver->valuedouble != floor(ver->valuedouble)) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: checkpoint version %s (this ftune reads versions %d to %d)", path,
                    cJSON_IsNumber(ver) ? (ver->valuedouble == 1 ? "1, which has no checksums" : "unknown") : "missing",
                    FT_CKPT_VERSION_MIN, FT_CKPT_VERSION);
        goto fail;
    }
    s->version = (int)ver->valuedouble;
    /* every field known, so a misspelt or foreign one is not silently ignored;
     * skipped_steps and loss_scaler are version 3's, state_checksum 4's */
    const char *const keys[] = { "format", "version", "step", "micro_step", "data_epoch", "data_index",
                                 "model_path", "config", "checksums", "shards", "skipped_steps", "loss_scaler",
                                 "state_checksum" };
    size_t n_keys = sizeof keys / sizeof keys[0] - (s->version >= 4 ? 0 : s->version >= 3 ? 1 : 3);
    const cJSON *x;
    cJSON_ArrayForEach(x, j) {
        bool ok = false;
        for (size_t i = 0; i < n_keys && !ok; i++) ok = x->string && strcmp(x->string, keys[i]) == 0;
        if (!ok) BAD("%s: unknown field \"%.64s\"%s", path, x->string ? x->string : "",
                     s->version < 4 ? (s->version < 3 ? " (in a version 2 checkpoint)" : " (in a version 3 checkpoint)") : "");
        /* cJSON would read the first of two, a reader of the text maybe the other */
        for (const cJSON *y = x->next; y; y = y->next)
            if (x->string && y->string && strcmp(x->string, y->string) == 0) BAD("%s: field \"%.64s\" twice", path, x->string);
    }
    /* 2^53: the largest range a JSON number holds exactly */
    const double MAXI = 9007199254740992.0;
    if (!int_in(cJSON_GetObjectItemCaseSensitive(j, "step"), 1, MAXI, &s->step))
        BAD("%s: \"step\" must be an integer >= 1", path);
    if (!int_in(cJSON_GetObjectItemCaseSensitive(j, "data_epoch"), 0, MAXI, &s->data_epoch))
        BAD("%s: \"data_epoch\" must be an integer >= 0", path);
    if (!int_in(cJSON_GetObjectItemCaseSensitive(j, "data_index"), 0, 2147483647.0, &s->data_index))
        BAD("%s: \"data_index\" must be an integer in [0, 2^31)", path);
    /* micro_step is a decimal string (a uint64 does not fit a JSON number):
     * digits only, no sign, no overflow */
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "micro_step");
    if (!cJSON_IsString(ms)) BAD("%s: \"micro_step\" must be a string of decimal digits", path);
    {
        const char *p = ms->valuestring;
        uint64_t v = 0;
        int n = 0;
        for (; p[n]; n++) {
            if (p[n] < '0' || p[n] > '9') BAD("%s: \"micro_step\" \"%.32s\" is not a non-negative integer", path, p);
            uint64_t d = (uint64_t)(p[n] - '0');
            if (v > (UINT64_MAX - d) / 10) BAD("%s: \"micro_step\" \"%.32s\" is out of range", path, p);
            v = v * 10 + d;
        }
        if (n == 0) BAD("%s: \"micro_step\" is empty", path);
        s->micro_step = v;
    }
    if (s->version >= 3) {
        if (!int_in(cJSON_GetObjectItemCaseSensitive(j, "skipped_steps"), 0, (double)s->step, &s->skipped_steps))
            BAD("%s: \"skipped_steps\" must be an integer in [0, step %lld]", path, (long long)s->step);
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(j, "loss_scaler");
        if (ls) {
            if (!cJSON_IsObject(ls)) BAD("%s: \"loss_scaler\" must be an object", path);
            const char *const lkeys[] = { "mode", "scale", "growth_tracker", "growth_interval" };
            cJSON_ArrayForEach(x, ls) {
                bool ok = false;
                for (size_t i = 0; i < sizeof lkeys / sizeof lkeys[0] && !ok; i++)
                    ok = x->string && strcmp(x->string, lkeys[i]) == 0;
                if (!ok) BAD("%s: \"loss_scaler\": unknown field \"%.64s\"", path, x->string ? x->string : "");
            }
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(ls, "mode");
            if (cJSON_IsString(m) && strcmp(m->valuestring, "dynamic") == 0) s->scaler_mode = FT_LOSS_SCALE_DYNAMIC;
            else if (cJSON_IsString(m) && strcmp(m->valuestring, "fixed") == 0) s->scaler_mode = FT_LOSS_SCALE_FIXED;
            else BAD("%s: \"loss_scaler\".\"mode\" must be \"dynamic\" or \"fixed\"", path);
            /* the scale is an f32: a positive normal one, held exactly */
            const cJSON *sc = cJSON_GetObjectItemCaseSensitive(ls, "scale");
            if (!cJSON_IsNumber(sc) || !(sc->valuedouble >= FLT_MIN && sc->valuedouble <= FLT_MAX) ||
                (double)(float)sc->valuedouble != sc->valuedouble)
                BAD("%s: \"loss_scaler\".\"scale\" must be a positive finite f32", path);
            s->scale = (float)sc->valuedouble;
            int64_t gi, gt;
            if (!int_in(cJSON_GetObjectItemCaseSensitive(ls, "growth_interval"), 1, 2147483647.0, &gi))
                BAD("%s: \"loss_scaler\".\"growth_interval\" must be an integer in [1, 2^31)", path);
            if (!int_in(cJSON_GetObjectItemCaseSensitive(ls, "growth_tracker"), 0, (double)gi - 1, &gt))
                BAD("%s: \"loss_scaler\".\"growth_tracker\" must be an integer in [0, growth_interval %lld)", path,
                    (long long)gi);
            s->growth_interval = (int32_t)gi;
            s->growth_tracker = (int32_t)gt;
            s->has_scaler = true;
        }
    }
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(j, "model_path");
    if (mp && !cJSON_IsString(mp)) BAD("%s: \"model_path\" must be a string", path);
    s->config = cJSON_GetObjectItemCaseSensitive(j, "config");
    if (!cJSON_IsObject(s->config)) BAD("%s: \"config\" must be an object", path);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shards");
    if (sh) {
        int64_t w, os;
        cJSON_ArrayForEach(x, sh)
            if (!x->string || (strcmp(x->string, "world") && strcmp(x->string, "opt_step")))
                BAD("%s: \"shards\": unknown field \"%.64s\"", path, x->string ? x->string : "");
        if (!cJSON_IsObject(sh) || !int_in(cJSON_GetObjectItemCaseSensitive(sh, "world"), 1, FT_CKPT_MAX_SHARDS, &w))
            BAD("%s: \"shards\".\"world\" must be an integer in [1, %d]", path, FT_CKPT_MAX_SHARDS);
        if (!int_in(cJSON_GetObjectItemCaseSensitive(sh, "opt_step"), 0, (double)s->step, &os))
            BAD("%s: \"shards\".\"opt_step\" must be an integer in [0, step %lld]", path, (long long)s->step);
        s->shard_world = (int)w;
        s->shard_opt_step = os;
    }
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(j, "checksums");
    if (!cJSON_IsObject(cs)) BAD("%s: \"checksums\" must be an object of file name -> FNV-1a hex", path);
    cJSON_ArrayForEach(x, cs) {
        if (!x->string || !known_file(x->string, s->shard_world))
            BAD("%s: \"checksums\": \"%.64s\" is not a checkpoint file", path, x->string ? x->string : "");
        if (s->n_files == FT_CKPT_MAX_FILES) BAD("%s: \"checksums\": too many entries", path);
        for (int i = 0; i < s->n_files; i++)
            if (strcmp(s->files[i].name, x->string) == 0) BAD("%s: \"checksums\": \"%s\" twice", path, x->string);
        if (!cJSON_IsString(x) || !parse_hex64(x->valuestring, &s->files[s->n_files].fnv))
            BAD("%s: \"checksums\".\"%s\" must be 16 lowercase hex digits", path, x->string);
        snprintf(s->files[s->n_files].name, sizeof s->files[0].name, "%s", x->string);
        s->n_files++;
    }
    /* whole: the trainables and the optimizer; sharded: every shard */
    for (int k = 0; k < (s->shard_world ? s->shard_world : 2); k++) {
        char want[64];
        if (s->shard_world) ft_ckpt_shard_name(want, k, s->shard_world);
        else snprintf(want, sizeof want, "%s", ckpt_files[k]);
        bool found = false;
        for (int i = 0; i < s->n_files; i++) found |= strcmp(s->files[i].name, want) == 0;
        if (!found) BAD("%s: \"checksums\" has no entry for %s", path, want);
    }
    /* last, so that a field that is malformed is named as such: the file's own checksum */
    if (s->version >= 4) {
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "state_checksum");
        uint64_t want;
        if (!cJSON_IsString(sc) || !parse_hex64(sc->valuestring, &want))
            BAD("%s: \"state_checksum\" must be 16 lowercase hex digits", path);
        long at = state_sum_at(text, len);
        if (at < 0) BAD("%s: \"state_checksum\" must be the file's last field", path);
        uint64_t h = state_sum(text, len, (size_t)at);
        if (h != want)
            BAD("%s: the file is damaged (its checksum is %016llx, \"state_checksum\" records %016llx): the step, "
                "data cursor or settings it holds cannot be trusted", path, (unsigned long long)h,
                (unsigned long long)want);
        s->state_checked = true;
    }
#undef BAD
    return FTUNE_OK;
fail:
    ft_ckpt_state_free(s);
    return st;
}
