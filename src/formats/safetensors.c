/* safetensors.c — safetensors reader (validating, over a read-only mapping),
 * streaming atomic writer, and the atomic file helper the GGUF writer uses.
 *
 * Layout: u64 little-endian header length N, N bytes of UTF-8 JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *  ..., "__metadata__": {"k": "v"}}, then the byte buffer; offsets are
 * relative to the buffer, and the tensors tile it exactly. */
#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------- dtypes */

static const struct { const char *name; int size; ft_dtype dtype; } st_dtypes[] = {
    { "F32", 4, FT_F32 },  { "F16", 2, FT_F16 },  { "BF16", 2, FT_BF16 },
    { "I32", 4, FT_I32 },  { "I64", 8, FT_I64 },  { "U8", 1, FT_U8 },
    { "F64", 8, FT_F64 },  { "I8", 1, FT_I8 },
    /* kept by name, not computed with */
    { "I16", 2, FT_NTYPES }, { "U16", 2, FT_NTYPES },
    { "U32", 4, FT_NTYPES }, { "U64", 8, FT_NTYPES }, { "BOOL", 1, FT_NTYPES },
    { "F8_E4M3", 1, FT_NTYPES }, { "F8_E5M2", 1, FT_NTYPES }, { "F8_E8M0", 1, FT_NTYPES },
    { "C64", 8, FT_NTYPES },
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

int ft_st_dtype_size(const char *name) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return st_dtypes[i].size;
    return 0;
}

ft_dtype ft_st_dtype_from_name(const char *name) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return st_dtypes[i].dtype;
    return FT_NTYPES;
}

const char *ft_st_dtype_name(ft_dtype t) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].dtype == t && t != FT_NTYPES) return st_dtypes[i].name;
    return NULL;
}

/* ------------------------------------------------------------- reader */

/* A JSON number that is a whole number in [0, 2^53] (exact in a double). */
static bool json_u53(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return false;
    double v = it->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v) return false;
    *out = (uint64_t)v;
    return true;
}

static int cmp_cstrp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static FTUNE_MUST_USE ftune_status parse_tensor(st_tensor *t, const cJSON *e, const char *path, uint64_t buf_size) {
    const char *name = e->string;
    if (strlen(name) >= sizeof t->name)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor name of %zu bytes is too long (max %zu): \"%.60s...\"", path,
                      strlen(name), sizeof t->name - 1, name);
    strcpy(t->name, name);
    if (!cJSON_IsObject(e)) return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": entry is not a JSON object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": missing or non-string \"dtype\"", path, name);
    if (!cJSON_IsArray(sh)) return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": missing or non-array \"shape\"", path, name);
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": \"data_offsets\" must be an array [begin, end]", path, name);
    int es = ft_st_dtype_size(dt->valuestring);
    if (!es)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": unknown dtype \"%.32s\"", path, name, dt->valuestring);
    strcpy(t->dtype_name, dt->valuestring); /* known names are < 16 bytes */
    t->dtype = ft_st_dtype_from_name(dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > FT_MAX_DIMS)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": %d dimensions (at most %d supported)", path, name, nd,
                      FT_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sh) {
        uint64_t v;
        if (!json_u53(it, &v))
            return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", path, name, d);
        if (v && numel > (uint64_t)INT64_MAX / v)
            return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": element count overflows", path, name);
        numel *= v;
        t->shape[d++] = (int64_t)v;
    }
    uint64_t b, en;
    if (!json_u53(cJSON_GetArrayItem(of, 0), &b) || !json_u53(cJSON_GetArrayItem(of, 1), &en))
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": data_offsets are not non-negative integers", path, name);
    if (b > en)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%" PRIu64 ",%" PRIu64 "] end before they begin",
                      path, name, b, en);
    if (en > buf_size)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%" PRIu64 ",%" PRIu64 "] past end of buffer (%"
                      PRIu64 " bytes)", path, name, b, en, buf_size);
    if (numel > UINT64_MAX / (uint64_t)es || en - b != numel * (uint64_t)es) {
        char shs[128];
        int k = snprintf(shs, sizeof shs, "[");
        for (int i = 0; i < nd && k < (int)sizeof shs; i++)
            k += snprintf(shs + k, sizeof shs - k, "%s%" PRId64, i ? "," : "", t->shape[i]);
        if (k < (int)sizeof shs) snprintf(shs + k, sizeof shs - k, "]");
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape %s of %s needs %" PRIu64 " x %d bytes but data_offsets [%"
                      PRIu64 ",%" PRIu64 "] span %" PRIu64, path, name, shs, t->dtype_name, numel, es, b, en, en - b);
    }
    t->begin = b;
    t->end = en;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status parse_metadata(st_file *f, const cJSON *m, const char *path) {
    if (!cJSON_IsObject(m)) return ft_err(FTUNE_ERR_FORMAT, "%s: __metadata__ is not a JSON object", path);
    int n = cJSON_GetArraySize(m);
    f->meta_keys = ft_calloc((size_t)n, sizeof(char *));
    f->meta_values = ft_calloc((size_t)n, sizeof(char *));
    if (!f->meta_keys || !f->meta_values) return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        if (!cJSON_IsString(it))
            return ft_err(FTUNE_ERR_FORMAT, "%s: __metadata__ key \"%.100s\": value is not a string", path, it->string);
        char *k = ft_strdup(it->string), *v = ft_strdup(it->valuestring);
        f->meta_keys[f->n_meta] = k;
        f->meta_values[f->n_meta] = v;
        f->n_meta++;
        if (!k || !v) return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path);
    }
    return FTUNE_OK;
}

static bool json_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* data holds the whole file of size bytes, or (header_only) only its
 * first 8 + header length bytes: the tensors then get no data pointer. */
static FTUNE_MUST_USE ftune_status parse(st_file *f, const char *path, const uint8_t *data, size_t size, bool header_only) {
    memset(f, 0, sizeof *f);
    if (!path) path = "(safetensors)";
    if (!data && size) return ft_err(FTUNE_ERR_ARG, "%s: no data", path);
    if (size < 8) return ft_err(FTUNE_ERR_FORMAT, "%s: too short for a safetensors file (%zu bytes)", path, size);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | data[i];
    if (hl > ST_MAX_HEADER)
        return ft_err(FTUNE_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the %u-byte limit (not a safetensors file?)",
                      path, hl, ST_MAX_HEADER);
    if (hl > size - 8)
        return ft_err(FTUNE_ERR_FORMAT, "%s: header length %" PRIu64 " past end of file (%zu bytes)", path, hl, size);
    const char *hdr = (const char *)data + 8;
    if (hl < 2 || hdr[0] != '{')
        return ft_err(FTUNE_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file?)", path);
    int64_t bad = ft_utf8_invalid_at(hdr, (size_t)hl);
    if (bad >= 0) return ft_err(FTUNE_ERR_FORMAT, "%s: header is not valid UTF-8 at byte %" PRId64, path, 8 + bad);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hl, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hl ? (size_t)(end - hdr) : 0;
        return ft_err(FTUNE_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of the file)", path, 8 + at);
    }
    ftune_status st = FTUNE_OK;
    const char **names = NULL;
    st_tensor **order = NULL;
    for (const char *p = end; p < hdr + hl; p++)
        if (!json_space((uint8_t)*p)) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: unexpected bytes after the JSON header at byte %zu", path,
                        (size_t)(8 + (p - hdr)));
            goto done;
        }
    if (!cJSON_IsObject(root)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: header is not a JSON object", path); goto done; }
    f->data_start = 8 + (size_t)hl;
    uint64_t buf_size = size - f->data_start;

    int n_all = cJSON_GetArraySize(root), n = 0;
    names = ft_malloc((size_t)n_all * sizeof *names);
    f->tensors = ft_calloc((size_t)n_all, sizeof *f->tensors);
    if (!names || !f->tensors) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) names[k++] = e->string;
    qsort(names, (size_t)n_all, sizeof *names, cmp_cstrp);
    for (int i = 1; i < n_all; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: duplicate entry \"%.200s\" in the header", path, names[i]);
            goto done;
        }
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            st = parse_metadata(f, e, path);
        } else {
            st = parse_tensor(&f->tensors[n], e, path, buf_size);
            if (!st) {
                f->tensors[n].data = header_only ? NULL : data + f->data_start + f->tensors[n].begin;
                n++;
            }
        }
        if (st) goto done;
    }
    f->n = n;

    /* The tensors must tile the buffer: sorted by offset, each begins where
     * the previous ended, and the last ends at the end of the file. */
    order = ft_malloc((size_t)n * sizeof *order);
    if (!order) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    for (int i = 0; i < n; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const st_tensor *t = order[i];
        if (t->begin < at) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%" PRIu64 ",%" PRIu64 "] overlap tensor \"%s\"",
                        path, t->name, t->begin, t->end, order[i - 1]->name);
            goto done;
        }
        if (t->begin > at) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": hole of %" PRIu64 " bytes before data_offsets [%" PRIu64
                        ",%" PRIu64 "]", path, t->name, t->begin - at, t->begin, t->end);
            goto done;
        }
        at = t->end;
    }
    if (at != buf_size) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: %" PRIu64 " bytes after the last tensor are not covered by any tensor",
                    path, buf_size - at);
        goto done;
    }
done:
    cJSON_Delete(root);
    free(names);
    free(order);
    if (st) ft_st_close(f);
    return st;
}

ftune_status ft_st_parse(st_file *f, const char *path, const uint8_t *data, size_t size) {
    return parse(f, path, data, size, false);
}

ftune_status ft_st_open_header(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t len8[8];
    uint8_t *buf = NULL;
    ftune_status st = FTUNE_OK;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0) { st = ft_err(FTUNE_ERR_IO, "%s: cannot stat: %s", path, strerror(errno)); goto done; }
    size_t size = (size_t)sb.st_size;
    if (size < 8 || fread(len8, 1, 8, fp) != 8) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: too short for a safetensors file (%zu bytes)", path, size);
        goto done;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
    /* what parse() checks first, before the header is read into memory */
    if (hl > ST_MAX_HEADER || hl > size - 8) { st = parse(f, path, len8, 8, true); goto done; }
    buf = ft_malloc(8 + (size_t)hl);
    if (!buf) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    memcpy(buf, len8, 8);
    if (fread(buf + 8, 1, (size_t)hl, fp) != hl) { st = ft_err(FTUNE_ERR_IO, "%s: read failed", path); goto done; }
    st = parse(f, path, buf, size, true);
done:
    free(buf);
    fclose(fp);
    return st;
}

ftune_status ft_st_open(st_file *f, const char *path) {
    ft_mmap m;
    memset(f, 0, sizeof *f);
    ftune_status st = ft_mmap_open(&m, path);
    if (st) return st;
    st = ft_st_parse(f, path, m.data, m.size);
    if (st) { ft_mmap_close(&m); return st; }
    f->map = m;
    return FTUNE_OK;
}

void ft_st_close(st_file *f) {
    if (!f) return;
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    ft_mmap_close(&f->map);
    memset(f, 0, sizeof *f);
}

const st_tensor *ft_st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *ft_st_meta(const st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (f->meta_keys[i] && strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ------------------------------------------------------------- atomic file */

ftune_status ft_st_atomic_open(st_atomic *a, const char *path) {
    memset(a, 0, sizeof *a);
    a->fd = -1;
    a->path = ft_strdup(path);
    size_t pl = strlen(path);
    a->tmp = ft_malloc(pl + 5);
    if (!a->path || !a->tmp) { ft_st_atomic_abort(a); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    memcpy(a->tmp, path, pl);
    memcpy(a->tmp + pl, ".tmp", 5);
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (a->fd < 0) {
        ftune_status st = ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", a->tmp, strerror(errno));
        free(a->path);
        free(a->tmp);
        a->path = a->tmp = NULL;
        return st;
    }
    return FTUNE_OK;
}

ftune_status ft_st_atomic_write(st_atomic *a, const void *buf, size_t n) {
    if (a->fd < 0) return ft_err(FTUNE_ERR_ARG, "write to a closed file");
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(a->fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return ft_err(FTUNE_ERR_IO, "%s: write failed after %" PRIu64 " bytes: %s", a->tmp, a->written, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        a->written += (uint64_t)w;
    }
    return FTUNE_OK;
}

ftune_status ft_st_atomic_commit(st_atomic *a) {
    if (a->fd < 0) return ft_err(FTUNE_ERR_ARG, "commit of a closed file");
    ftune_status st = FTUNE_OK;
    if (fsync(a->fd) != 0) st = ft_err(FTUNE_ERR_IO, "%s: fsync failed: %s", a->tmp, strerror(errno));
    if (close(a->fd) != 0 && !st) st = ft_err(FTUNE_ERR_IO, "%s: close failed: %s", a->tmp, strerror(errno));
    a->fd = -1;
    if (!st && rename(a->tmp, a->path) != 0)
        st = ft_err(FTUNE_ERR_IO, "%s: rename to %s failed: %s", a->tmp, a->path, strerror(errno));
    if (st) {
        unlink(a->tmp);
    } else {
        /* make the rename itself durable */
        char *slash = strrchr(a->path, '/');
        if (slash) *slash = 0;
        int dfd = open(slash ? (slash == a->path ? "/" : a->path) : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    free(a->path);
    free(a->tmp);
    a->path = a->tmp = NULL;
    return st;
}

void ft_st_atomic_abort(st_atomic *a) {
    if (a->fd >= 0) close(a->fd);
    if (a->tmp) unlink(a->tmp);
    free(a->path);
    free(a->tmp);
    a->fd = -1;
    a->path = a->tmp = NULL;
}

/* ------------------------------------------------------------- writer */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_cat(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || k >= (int)sizeof tmp) { b->oom = true; return; }
    sb_put(b, tmp, (size_t)k);
}
/* JSON string literal; s is valid UTF-8 (checked by the caller). */
static void sb_json_str(sbuf *b, const char *s) {
    sb_cat(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"') sb_cat(b, "\\\"");
        else if (*p == '\\') sb_cat(b, "\\\\");
        else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
        else sb_put(b, (const char *)p, 1);
    }
    sb_cat(b, "\"");
}

typedef struct {
    const st_out_tensor *t;
    int es;
    uint64_t nbytes;
} wt;

static int cmp_wt(const void *a, const void *b) {
    const wt *x = a, *y = b;
    if (x->es != y->es) return y->es - x->es;
    return strcmp(x->t->name, y->t->name);
}

static FTUNE_MUST_USE ftune_status check_utf8(const char *s, const char *path, const char *what) {
    if (ft_utf8_invalid_at(s, strlen(s)) >= 0)
        return ft_err(FTUNE_ERR_ARG, "%s: %s \"%.100s\" is not valid UTF-8", path, what, s);
    return FTUNE_OK;
}

ftune_status ft_st_write(const char *path, const st_out_tensor *ts, int n, const char *const *metadata) {
    if (n < 0 || (n > 0 && !ts)) return ft_err(FTUNE_ERR_ARG, "%s: bad tensor list", path);
    wt *v = ft_calloc((size_t)n, sizeof *v);
    if (!v) return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path);
    ftune_status st = FTUNE_OK;
    uint8_t *gen_buf = NULL;
    sbuf h = { 0 };
    for (int i = 0; i < n && !st; i++) {
        const st_out_tensor *t = &ts[i];
        v[i].t = t;
        if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0) {
            st = ft_err(FTUNE_ERR_ARG, "%s: tensor %d has no usable name", path, i);
            break;
        }
        if (strlen(t->name) >= FT_NAME_MAX * 2) {
            st = ft_err(FTUNE_ERR_ARG, "%s: tensor \"%.60s...\": name too long", path, t->name);
            break;
        }
        if ((st = check_utf8(t->name, path, "tensor name"))) break;
        const char *dn = t->dtype < FT_NTYPES ? ft_st_dtype_name(t->dtype) : NULL;
        if (!dn) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype %s has no safetensors equivalent", path, t->name,
                        t->dtype < FT_NTYPES ? ft_types[t->dtype].name : "?");
            break;
        }
        if (t->ndim < 0 || t->ndim > FT_MAX_DIMS) {
            st = ft_err(FTUNE_ERR_ARG, "%s: tensor \"%s\": ndim %d", path, t->name, t->ndim);
            break;
        }
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (t->shape[d] && numel > INT64_MAX / 8 / t->shape[d])) {
                st = ft_err(FTUNE_ERR_ARG, "%s: tensor \"%s\": bad shape", path, t->name);
                break;
            }
            numel *= t->shape[d];
        }
        if (st) break;
        v[i].es = ft_st_dtype_size(dn);
        v[i].nbytes = (uint64_t)numel * (uint64_t)v[i].es;
        if (v[i].nbytes && !t->data && !t->fill) st = ft_err(FTUNE_ERR_ARG, "%s: tensor \"%s\": NULL data", path, t->name);
    }
    if (st) goto done;
    qsort(v, (size_t)n, sizeof *v, cmp_wt);
    for (int i = 1; i < n; i++)
        if (strcmp(v[i - 1].t->name, v[i].t->name) == 0) {
            st = ft_err(FTUNE_ERR_ARG, "%s: tensor \"%s\" given twice", path, v[i].t->name);
            goto done;
        }

    sb_cat(&h, "{\"__metadata__\":{");
    bool has_format = false;
    for (int i = 0; metadata && metadata[i]; i += 2) {
        if (!metadata[i + 1]) { st = ft_err(FTUNE_ERR_ARG, "%s: metadata key \"%s\" has no value", path, metadata[i]); goto done; }
        if ((st = check_utf8(metadata[i], path, "metadata key")) || (st = check_utf8(metadata[i + 1], path, "metadata value")))
            goto done;
        for (int j = 0; j < i; j += 2)
            if (strcmp(metadata[i], metadata[j]) == 0) {
                st = ft_err(FTUNE_ERR_ARG, "%s: metadata key \"%s\" given twice", path, metadata[i]);
                goto done;
            }
        if (strcmp(metadata[i], "format") == 0) has_format = true;
        if (i) sb_cat(&h, ",");
        sb_json_str(&h, metadata[i]);
        sb_cat(&h, ":");
        sb_json_str(&h, metadata[i + 1]);
    }
    if (!has_format) sb_cat(&h, metadata && metadata[0] ? ",\"format\":\"pt\"" : "\"format\":\"pt\"");
    sb_cat(&h, "}");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_out_tensor *t = v[i].t;
        sb_cat(&h, ",");
        sb_json_str(&h, t->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", ft_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(&h, "%s%" PRId64, d ? "," : "", t->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + v[i].nbytes);
        off += v[i].nbytes;
    }
    sb_cat(&h, "}");
    while ((8 + h.n) % 8) sb_cat(&h, " ");
    if (h.oom) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory building the header", path); goto done; }
    if (h.n > ST_MAX_HEADER) { st = ft_err(FTUNE_ERR_ARG, "%s: header of %zu bytes is too large", path, h.n); goto done; }

    st_atomic a;
    if ((st = ft_st_atomic_open(&a, path))) goto done;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    st = ft_st_atomic_write(&a, len8, 8);
    if (!st) st = ft_st_atomic_write(&a, h.p, h.n);
    for (int i = 0; i < n && !st; i++) {
        const st_out_tensor *t = v[i].t;
        if (!t->fill) { st = ft_st_atomic_write(&a, t->data, (size_t)v[i].nbytes); continue; }
        /* generated tensors: 4 MiB chunks of whole elements */
        size_t chunk = (size_t)4 << 20, esz = ft_types[t->dtype].block_bytes;
        chunk -= chunk % esz;
        if (!gen_buf && !(gen_buf = malloc(chunk))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); break; }
        for (uint64_t at = 0; at < v[i].nbytes && !st; at += chunk) {
            size_t k = v[i].nbytes - at < chunk ? (size_t)(v[i].nbytes - at) : chunk;
            st = t->fill(t->fill_ctx, t->fill_index, t->dtype, gen_buf, at, k);
            if (!st) st = ft_st_atomic_write(&a, gen_buf, k);
        }
    }
    free(gen_buf);
    if (st) ft_st_atomic_abort(&a);
    else st = ft_st_atomic_commit(&a);
done:
    free(v);
    free(h.p);
    return st;
}
