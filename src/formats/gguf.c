/* gguf.c — GGUF v2/v3 reader over a read-only mapping, and a streaming
 * atomic GGUF v3 writer.
 *
 * Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv x (string key,
 * u32 type, value), n_tensors x (string name, u32 n_dims, u64 ne[n_dims],
 * u32 ggml type, u64 offset), padding to the alignment, tensor data.
 * Strings are u64 length + bytes; arrays are u32 element type + u64 count +
 * elements. All integers little-endian. Nothing read from the file is used
 * before it has been checked against the bytes that are left. */
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAX_ARRAY_DEPTH 8

/* ------------------------------------------------------------- ggml types */

/* Every ggml type id is a row of the dtype traits (core/dtype.c): its name,
 * block and bytes come from there, so the size of a tensor ftune cannot
 * compute with is still checked against the file. */
const char *ft_gguf_ggml_type_name(uint32_t t) {
    ft_dtype d = ft_dtype_of_ggml(t);
    return d < FT_NTYPES ? ft_types[d].name : "?";
}

ft_dtype ft_gguf_dtype_of(uint32_t t) { return ft_dtype_of_ggml(t); }

int ft_gguf_ggml_type(ft_dtype t) { return t < FT_NTYPES && ft_types[t].in_gguf ? ft_types[t].ggml_type : -1; }

/* Size in bytes of a fixed-size KV value type; 0 for string and array. */
static uint64_t kv_type_size(uint32_t t) {
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

/* ------------------------------------------------------------- reading */

static uint64_t le_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t le_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

typedef struct {
    const uint8_t *d;
    size_t size, pos;
    const char *path;
} reader;

static size_t left(const reader *r) { return r->size - r->pos; }

/* Each returns false when the bytes are not there; the caller reports. */
static bool rd_u32(reader *r, uint32_t *v) {
    if (left(r) < 4) return false;
    *v = le_u32(r->d + r->pos);
    r->pos += 4;
    return true;
}
static bool rd_u64(reader *r, uint64_t *v) {
    if (left(r) < 8) return false;
    *v = le_u64(r->d + r->pos);
    r->pos += 8;
    return true;
}
static bool rd_str(reader *r, gguf_str *s) {
    uint64_t n;
    size_t at = r->pos;
    if (!rd_u64(r, &n)) return false;
    if (n > left(r)) { r->pos = at; return false; }
    s->ptr = (const char *)r->d + r->pos;
    s->len = n;
    r->pos += (size_t)n;
    return true;
}

static FTUNE_MUST_USE ftune_status truncated(const reader *r, const char *what, gguf_str key) {
    if (key.ptr)
        return ft_err(FTUNE_ERR_FORMAT, "%s: truncated or oversized %s of \"%.*s\" at offset %zu (file has %zu bytes)",
                      r->path, what, (int)(key.len > 200 ? 200 : key.len), key.ptr, r->pos, r->size);
    return ft_err(FTUNE_ERR_FORMAT, "%s: truncated or oversized %s at offset %zu (file has %zu bytes)",
                  r->path, what, r->pos, r->size);
}

#define KEYFMT "\"%.*s\""
#define KEYARG(s) (int)((s).len > 200 ? 200 : (s).len), (s).ptr

/* Skips over one array body (element type and count already read),
 * checking every string length and nested array against the bytes left. */
static FTUNE_MUST_USE ftune_status skip_array(reader *r, uint32_t et, uint64_t n, int depth, gguf_str key) {
    uint64_t es = kv_type_size(et);
    if (es) {
        if (n > left(r) / es) return truncated(r, "array", key);
        r->pos += (size_t)(n * es);
        return FTUNE_OK;
    }
    if (et == GGUF_T_STRING) {
        if (n > left(r) / 8) return truncated(r, "string array", key);
        for (uint64_t i = 0; i < n; i++) {
            gguf_str s;
            if (!rd_str(r, &s)) return truncated(r, "string array element", key);
        }
        return FTUNE_OK;
    }
    if (et == GGUF_T_ARRAY) {
        if (depth >= GGUF_MAX_ARRAY_DEPTH)
            return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT ": arrays nested deeper than %d",
                          r->path, KEYARG(key), GGUF_MAX_ARRAY_DEPTH);
        if (n > left(r) / 12) return truncated(r, "nested array", key);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t t2;
            uint64_t n2;
            if (!rd_u32(r, &t2) || !rd_u64(r, &n2)) return truncated(r, "nested array header", key);
            if (t2 >= GGUF_T_COUNT)
                return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT ": nested array element type %u is not a GGUF type",
                              r->path, KEYARG(key), t2);
            ftune_status st = skip_array(r, t2, n2, depth + 1, key);
            if (st) return st;
        }
        return FTUNE_OK;
    }
    return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT ": array element type %u is not a GGUF type",
                  r->path, KEYARG(key), et);
}

static FTUNE_MUST_USE ftune_status read_kv(reader *r, gguf_kv *kv) {
    uint32_t t;
    if (!rd_str(r, &kv->key)) return truncated(r, "key", (gguf_str){ 0 });
    if (kv->key.len && memchr(kv->key.ptr, 0, (size_t)kv->key.len))
        return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT "... at offset %zu contains a NUL byte", r->path,
                      KEYARG(kv->key), r->pos);
    if (!rd_u32(r, &t)) return truncated(r, "type", kv->key);
    if (t >= GGUF_T_COUNT)
        return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT ": value type %u is not a GGUF type", r->path, KEYARG(kv->key), t);
    kv->type = (gguf_type)t;
    const uint8_t *p = r->d + r->pos;
    uint64_t es = kv_type_size(t);
    if (es) {
        if (left(r) < es) return truncated(r, "value", kv->key);
        switch (t) {
        case GGUF_T_U8: case GGUF_T_BOOL: kv->v.u = p[0]; break;
        case GGUF_T_I8: kv->v.i = (int8_t)p[0]; break;
        case GGUF_T_U16: kv->v.u = (uint16_t)(p[0] | p[1] << 8); break;
        case GGUF_T_I16: kv->v.i = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
        case GGUF_T_U32: kv->v.u = le_u32(p); break;
        case GGUF_T_I32: kv->v.i = (int32_t)le_u32(p); break;
        case GGUF_T_U64: kv->v.u = le_u64(p); break;
        case GGUF_T_I64: kv->v.i = (int64_t)le_u64(p); break;
        case GGUF_T_F32: { uint32_t b = le_u32(p); float f; memcpy(&f, &b, 4); kv->v.f = f; break; }
        case GGUF_T_F64: { uint64_t b = le_u64(p); double f; memcpy(&f, &b, 8); kv->v.f = f; break; }
        }
        r->pos += (size_t)es;
        return FTUNE_OK;
    }
    if (t == GGUF_T_STRING) {
        if (!rd_str(r, &kv->str)) return truncated(r, "string value", kv->key);
        return FTUNE_OK;
    }
    uint32_t et;
    if (!rd_u32(r, &et) || !rd_u64(r, &kv->arr_n)) return truncated(r, "array header", kv->key);
    if (et >= GGUF_T_COUNT)
        return ft_err(FTUNE_ERR_FORMAT, "%s: key " KEYFMT ": array element type %u is not a GGUF type",
                      r->path, KEYARG(kv->key), et);
    kv->arr_type = (gguf_type)et;
    kv->arr_data = r->d + r->pos;
    return skip_array(r, et, kv->arr_n, 1, kv->key);
}

static int cmp_str(gguf_str a, gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

/* qsort has no context argument: sort pointers to the strings instead. */
static int cmp_strp(const void *a, const void *b) {
    return cmp_str(**(gguf_str *const *)a, **(gguf_str *const *)b);
}

/* Finds a duplicate among n strings (each at base + i*stride); returns its
 * index or -1. -2 if out of memory. */
static int64_t find_duplicate(const void *base, size_t stride, uint64_t n) {
    if (n < 2) return -1;
    const gguf_str **v = ft_malloc((size_t)n * sizeof *v);
    if (!v) return -2;
    for (uint64_t i = 0; i < n; i++) v[i] = (const gguf_str *)((const char *)base + i * stride);
    qsort(v, (size_t)n, sizeof *v, cmp_strp);
    int64_t dup = -1;
    for (uint64_t i = 1; i < n && dup < 0; i++)
        if (cmp_str(*v[i - 1], *v[i]) == 0) dup = (int64_t)(((const char *)v[i] - (const char *)base) / stride);
    free(v);
    return dup;
}

static int cmp_offset(const void *a, const void *b) {
    const gguf_tensor_info *x = *(gguf_tensor_info *const *)a, *y = *(gguf_tensor_info *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* a*b, false on uint64 overflow */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a && b > UINT64_MAX / a) return false;
    *out = a * b;
    return true;
}

static FTUNE_MUST_USE ftune_status read_tensor_info(reader *r, gguf_tensor_info *ti) {
    uint32_t nd;
    if (!rd_str(r, &ti->name)) return truncated(r, "tensor name", (gguf_str){ 0 });
    if (ti->name.len >= FT_NAME_MAX)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor name of %llu bytes at offset %zu is too long (max %d): " KEYFMT,
                      r->path, (unsigned long long)ti->name.len, r->pos, FT_NAME_MAX - 1, KEYARG(ti->name));
    if (ti->name.len && memchr(ti->name.ptr, 0, (size_t)ti->name.len))
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor name " KEYFMT "... at offset %zu contains a NUL byte", r->path,
                      KEYARG(ti->name), r->pos);
    if (!rd_u32(r, &nd)) return truncated(r, "n_dims of tensor", ti->name);
    if (nd < 1 || nd > 4)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": n_dims %u not in 1..4", r->path, KEYARG(ti->name), nd);
    ti->n_dims = nd;
    for (int i = 0; i < 4; i++) ti->ne[i] = 1;
    for (uint32_t i = 0; i < nd; i++)
        if (!rd_u64(r, &ti->ne[i])) return truncated(r, "shape of tensor", ti->name);
    if (!rd_u32(r, &ti->ggml_type) || !rd_u64(r, &ti->offset)) return truncated(r, "type/offset of tensor", ti->name);
    ft_dtype dt = ft_dtype_of_ggml(ti->ggml_type);
    if (dt == FT_NTYPES)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor " KEYFMT ": unknown ggml type %u", r->path, KEYARG(ti->name),
                      ti->ggml_type);
    const ft_type_traits *tr = &ft_types[dt];
    uint64_t numel = 1;
    for (int i = 0; i < 4; i++)
        if (ti->ne[i] > (uint64_t)INT64_MAX || !mul_ok(numel, ti->ne[i], &numel) || numel > (uint64_t)INT64_MAX)
            return ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": element count overflows (ne = %llu x %llu x %llu x %llu)",
                          r->path, KEYARG(ti->name), (unsigned long long)ti->ne[0], (unsigned long long)ti->ne[1],
                          (unsigned long long)ti->ne[2], (unsigned long long)ti->ne[3]);
    if (ti->ne[0] % (uint64_t)tr->block)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": ne[0] = %llu is not a multiple of the %s block size %d",
                      r->path, KEYARG(ti->name), (unsigned long long)ti->ne[0], tr->name, tr->block);
    if (!mul_ok(numel / (uint64_t)tr->block, tr->block_bytes, &ti->nbytes))
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": byte size overflows", r->path, KEYARG(ti->name));
    ti->dtype = dt;
    return FTUNE_OK;
}

ftune_status ft_gguf_parse(gguf_file *g, const char *path, const uint8_t *data, size_t size) {
    memset(g, 0, sizeof *g);
    if (!path) path = "(gguf)";
    if (!data && size) return ft_err(FTUNE_ERR_ARG, "%s: no data", path);
    reader r = { .d = data, .size = size, .pos = 0, .path = path };
    uint32_t magic, version;
    if (!rd_u32(&r, &magic)) return ft_err(FTUNE_ERR_FORMAT, "%s: too short for a GGUF file (%zu bytes)", path, size);
    if (magic != 0x46554747u) /* "GGUF" */
        return ft_err(FTUNE_ERR_FORMAT, "%s: not a GGUF file (magic %02x %02x %02x %02x)", path, data[0], data[1],
                      data[2], data[3]);
    if (!rd_u32(&r, &version)) return truncated(&r, "version", (gguf_str){ 0 });
    if (version == 1)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (convert it with a newer llama.cpp)", path);
    if (version != 2 && version != 3)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported%s", path, version,
                      (version & 0xffff) == 0 ? " (a big-endian file?)" : "");
    g->version = version;
    uint64_t nt, nkv;
    if (!rd_u64(&r, &nt) || !rd_u64(&r, &nkv)) return truncated(&r, "tensor/kv counts", (gguf_str){ 0 });
    /* Cap the counts by the bytes left before allocating: a KV takes at
     * least 13 bytes (key length, type, one-byte value), a tensor info at
     * least 32 (name length, n_dims, one ne, type, offset). */
    if (nkv > left(&r) / 13)
        return ft_err(FTUNE_ERR_FORMAT, "%s: kv count %llu cannot fit in the %zu bytes left", path,
                      (unsigned long long)nkv, left(&r));
    if (nt > left(&r) / 32)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor count %llu cannot fit in the %zu bytes left", path,
                      (unsigned long long)nt, left(&r));
    g->kv = ft_calloc((size_t)nkv, sizeof *g->kv);
    g->tensors = ft_calloc((size_t)nt, sizeof *g->tensors);
    if (!g->kv || !g->tensors) { ft_gguf_close(g); return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); }

    ftune_status st = FTUNE_OK;
    for (uint64_t i = 0; i < nkv && !st; i++, g->n_kv++) st = read_kv(&r, &g->kv[i]);
    if (st) goto fail;
    int64_t dup = find_duplicate(g->kv, sizeof *g->kv, g->n_kv);
    if (dup == -2) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    if (dup >= 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: duplicate key " KEYFMT, path, KEYARG(g->kv[dup].key));
        goto fail;
    }

    for (uint64_t i = 0; i < nt && !st; i++, g->n_tensors++) st = read_tensor_info(&r, &g->tensors[i]);
    if (st) goto fail;
    dup = find_duplicate(&g->tensors[0].name, sizeof *g->tensors, g->n_tensors);
    if (dup == -2) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    if (dup >= 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: duplicate tensor name " KEYFMT, path, KEYARG(g->tensors[dup].name));
        goto fail;
    }

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = ft_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_T_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)))
            { st = ft_err(FTUNE_ERR_FORMAT, "%s: general.alignment must be a u32 power of two", path); goto fail; }
        g->alignment = al->v.u;
    }
    g->data_offset = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors && g->data_offset > size) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: data section starts at %llu, past the end of the file (%zu bytes)", path,
                    (unsigned long long)g->data_offset, size);
        goto fail;
    }
    /* Files without tensors (vocab-only) may end before the padding. */
    if (g->data_offset > size) g->data_offset = size;
    uint64_t avail = size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_info *ti = &g->tensors[i];
        if (ti->offset % g->alignment) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": data offset %llu is not a multiple of the alignment %llu",
                        path, KEYARG(ti->name), (unsigned long long)ti->offset, (unsigned long long)g->alignment);
            goto fail;
        }
        if (ti->offset > avail || ti->nbytes > avail - ti->offset) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor " KEYFMT ": data [%llu, +%llu) past the end of the data section (%llu bytes)",
                        path, KEYARG(ti->name), (unsigned long long)ti->offset, (unsigned long long)ti->nbytes,
                        (unsigned long long)avail);
            goto fail;
        }
        ti->data = data + g->data_offset + ti->offset;
    }
    if (g->n_tensors > 1) {
        gguf_tensor_info **v = ft_malloc((size_t)g->n_tensors * sizeof *v);
        if (!v) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto fail; }
        for (uint64_t i = 0; i < g->n_tensors; i++) v[i] = &g->tensors[i];
        qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_offset);
        for (uint64_t i = 1; i < g->n_tensors && !st; i++)
            if (v[i - 1]->offset + v[i - 1]->nbytes > v[i]->offset)
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensors " KEYFMT " and " KEYFMT " overlap", path,
                            KEYARG(v[i - 1]->name), KEYARG(v[i]->name));
        free(v);
        if (st) goto fail;
    }
    return FTUNE_OK;
fail:
    ft_gguf_close(g);
    return st;
}

ftune_status ft_gguf_open(gguf_file *g, const char *path) {
    ft_mmap m;
    memset(g, 0, sizeof *g);
    ftune_status st = ft_mmap_open(&m, path);
    if (st) return st;
    st = ft_gguf_parse(g, path, m.data, m.size);
    if (st) { ft_mmap_close(&m); return st; }
    g->map = m;
    return FTUNE_OK;
}

void ft_gguf_close(gguf_file *g) {
    if (!g) return;
    free(g->kv);
    free(g->tensors);
    ft_mmap_close(&g->map);
    memset(g, 0, sizeof *g);
}

bool ft_gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

char *ft_gguf_str_dup(gguf_str s) {
    char *d = ft_malloc((size_t)s.len + 1);
    if (!d) return NULL;
    if (s.len) memcpy(d, s.ptr, (size_t)s.len);
    d[s.len] = 0;
    return d;
}

const gguf_kv *ft_gguf_find(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (ft_gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor_info *ft_gguf_find_tensor(const gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (ft_gguf_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

bool ft_gguf_get_i64(const gguf_file *g, const char *key, int64_t *out) {
    const gguf_kv *kv = ft_gguf_find(g, key);
    if (!kv) return false;
    switch (kv->type) {
    case GGUF_T_U8: case GGUF_T_U16: case GGUF_T_U32: case GGUF_T_U64:
        if (kv->v.u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)kv->v.u;
        return true;
    case GGUF_T_I8: case GGUF_T_I16: case GGUF_T_I32: case GGUF_T_I64:
        *out = kv->v.i;
        return true;
    default: return false;
    }
}

bool ft_gguf_get_f64(const gguf_file *g, const char *key, double *out) {
    const gguf_kv *kv = ft_gguf_find(g, key);
    if (!kv) return false;
    switch (kv->type) {
    case GGUF_T_F32: case GGUF_T_F64: *out = kv->v.f; return true;
    case GGUF_T_U8: case GGUF_T_U16: case GGUF_T_U32: case GGUF_T_U64: *out = (double)kv->v.u; return true;
    case GGUF_T_I8: case GGUF_T_I16: case GGUF_T_I32: case GGUF_T_I64: *out = (double)kv->v.i; return true;
    default: return false;
    }
}

bool ft_gguf_get_bool(const gguf_file *g, const char *key, bool *out) {
    const gguf_kv *kv = ft_gguf_find(g, key);
    if (!kv || kv->type != GGUF_T_BOOL) return false;
    *out = kv->v.u != 0;
    return true;
}

bool ft_gguf_get_str(const gguf_file *g, const char *key, gguf_str *out) {
    const gguf_kv *kv = ft_gguf_find(g, key);
    if (!kv || kv->type != GGUF_T_STRING) return false;
    *out = kv->str;
    return true;
}

ftune_status ft_gguf_get_str_array(const gguf_file *g, const char *key, gguf_str_array *out) {
    out->n = 0;
    out->items = NULL;
    const gguf_kv *kv = ft_gguf_find(g, key);
    const char *path = g->map.path ? g->map.path : "(gguf)";
    if (!kv) return ft_err(FTUNE_ERR_ARG, "%s: no key \"%s\"", path, key);
    if (kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING)
        return ft_err(FTUNE_ERR_FORMAT, "%s: key \"%s\" is not an array of strings", path, key);
    gguf_str *items = ft_malloc((size_t)kv->arr_n * sizeof *items);
    if (!items) return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory for %llu strings of \"%s\"", path,
                              (unsigned long long)kv->arr_n, key);
    /* The lengths were checked by gguf_parse; the strings end where the
     * next KV (or the tensor infos) begin, at most at the end of the data. */
    const uint8_t *p = kv->arr_data;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t n = le_u64(p);
        items[i].ptr = (const char *)p + 8;
        items[i].len = n;
        p += 8 + n;
    }
    out->n = kv->arr_n;
    out->items = items;
    return FTUNE_OK;
}

/* ------------------------------------------------------------- writer */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void wb_u32(wbuf *b, uint32_t v) {
    uint8_t x[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
    wb_put(b, x, 4);
}
static void wb_u64(wbuf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    wb_put(b, x, 8);
}
static void wb_str(wbuf *b, const char *s) {
    size_t n = strlen(s);
    wb_u64(b, n);
    wb_put(b, s, n);
}

typedef struct {
    char *name;
    uint32_t ggml_type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
    ft_dtype dtype;
    const void *data;
    ft_fill_fn fill;
    void *fill_ctx;
    int fill_index;
} wtensor;

struct gguf_writer_s {
    wbuf kv;          /* serialized key/values */
    uint64_t n_kv;
    char **keys;      /* for duplicate checks */
    size_t keys_cap;
    wtensor *t;
    size_t n_t, t_cap;
    uint64_t alignment;
};

ftune_status ft_gguf_writer_new(gguf_writer **out) {
    *out = ft_calloc(1, sizeof **out);
    if (!*out) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return FTUNE_OK;
}

void ft_gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    free(w->kv.p);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

/* Checks the key is new, remembers it and writes key + type. */
static FTUNE_MUST_USE ftune_status begin_kv(gguf_writer *w, const char *key, gguf_type type) {
    if (!key) return ft_err(FTUNE_ERR_ARG, "gguf writer: NULL key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return ft_err(FTUNE_ERR_ARG, "gguf writer: key \"%s\" set twice", key);
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? 2 * w->keys_cap : 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *k = ft_strdup(key);
    if (!k) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    w->keys[w->n_kv++] = k;
    wb_str(&w->kv, key);
    wb_u32(&w->kv, type);
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status end_kv(gguf_writer *w) {
    return w->kv.oom ? ft_err(FTUNE_ERR_NOMEM, "gguf writer: out of memory") : FTUNE_OK;
}

ftune_status ft_gguf_writer_set_str(gguf_writer *w, const char *key, const char *val) {
    if (!val) return ft_err(FTUNE_ERR_ARG, "gguf writer: NULL value for \"%s\"", key ? key : "");
    ftune_status st = begin_kv(w, key, GGUF_T_STRING);
    if (st) return st;
    wb_str(&w->kv, val);
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t val) {
    if (key && strcmp(key, "general.alignment") == 0) {
        if (val == 0 || (val & (val - 1))) return ft_err(FTUNE_ERR_ARG, "gguf writer: alignment %u is not a power of two", val);
    }
    ftune_status st = begin_kv(w, key, GGUF_T_U32);
    if (st) return st;
    if (strcmp(key, "general.alignment") == 0) w->alignment = val;
    wb_u32(&w->kv, val);
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t val) {
    ftune_status st = begin_kv(w, key, GGUF_T_I32);
    if (st) return st;
    wb_u32(&w->kv, (uint32_t)val);
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_f32(gguf_writer *w, const char *key, float val) {
    ftune_status st = begin_kv(w, key, GGUF_T_F32);
    if (st) return st;
    uint32_t b;
    memcpy(&b, &val, 4);
    wb_u32(&w->kv, b);
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_bool(gguf_writer *w, const char *key, bool val) {
    ftune_status st = begin_kv(w, key, GGUF_T_BOOL);
    if (st) return st;
    uint8_t b = val ? 1 : 0;
    wb_put(&w->kv, &b, 1);
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_str_array(gguf_writer *w, const char *key, const char *const *vals, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!vals[i]) return ft_err(FTUNE_ERR_ARG, "gguf writer: \"%s\"[%zu] is NULL", key ? key : "", i);
    ftune_status st = begin_kv(w, key, GGUF_T_ARRAY);
    if (st) return st;
    wb_u32(&w->kv, GGUF_T_STRING);
    wb_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) wb_str(&w->kv, vals[i]);
    return end_kv(w);
}

static FTUNE_MUST_USE ftune_status set_arr32(gguf_writer *w, const char *key, gguf_type et, const void *vals, size_t n) {
    ftune_status st = begin_kv(w, key, GGUF_T_ARRAY);
    if (st) return st;
    wb_u32(&w->kv, et);
    wb_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, (const uint8_t *)vals + 4 * i, 4);
        wb_u32(&w->kv, b);
    }
    return end_kv(w);
}

ftune_status ft_gguf_writer_set_f32_array(gguf_writer *w, const char *key, const float *vals, size_t n) {
    return set_arr32(w, key, GGUF_T_F32, vals, n);
}

ftune_status ft_gguf_writer_set_i32_array(gguf_writer *w, const char *key, const int32_t *vals, size_t n) {
    return set_arr32(w, key, GGUF_T_I32, vals, n);
}

static FTUNE_MUST_USE ftune_status add_tensor(gguf_writer *w, const char *name, ft_dtype dtype, int ndim, const int64_t *shape,
                               const void *data, bool has_fill) {
    if (!name || !*name) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor without a name");
    if (strlen(name) >= FT_NAME_MAX) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor name \"%s\" too long", name);
    int gt = ft_gguf_ggml_type(dtype);
    if (gt < 0) return ft_err(FTUNE_ERR_UNSUPPORTED, "gguf writer: tensor \"%s\": dtype %s has no ggml type", name,
                              dtype < FT_NTYPES ? ft_types[dtype].name : "?");
    if (ndim < 1 || ndim > 4) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": ndim %d not in 1..4", name, ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && numel > INT64_MAX / shape[i]))
            return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": bad shape", name);
        numel *= shape[i];
    }
    if (shape[ndim - 1] % ft_types[dtype].block)
        return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": last dim %lld is not a multiple of the %s block %d", name,
                      (long long)shape[ndim - 1], ft_types[dtype].name, ft_types[dtype].block);
    int64_t nb = ft_dtype_nbytes(dtype, numel);
    if (nb < 0) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": bad size", name);
    if (nb > 0 && !data && !has_fill) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": NULL data", name);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\" added twice", name);
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? 2 * w->t_cap : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        w->t = t;
        w->t_cap = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = ft_strdup(name);
    if (!t->name) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    t->ggml_type = (uint32_t)gt;
    t->n_dims = (uint32_t)ndim;
    for (int i = 0; i < 4; i++) t->ne[i] = i < ndim ? (uint64_t)shape[ndim - 1 - i] : 1;
    t->nbytes = (uint64_t)nb;
    t->dtype = dtype;
    t->data = data;
    w->n_t++;
    return FTUNE_OK;
}

ftune_status ft_gguf_writer_add_tensor(gguf_writer *w, const char *name, ft_dtype dtype, int ndim, const int64_t *shape,
                                    const void *data) {
    return add_tensor(w, name, dtype, ndim, shape, data, false);
}

ftune_status ft_gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, ft_dtype dtype, int ndim,
                                         const int64_t *shape, ft_fill_fn fill, void *ctx, int index) {
    if (!fill) return ft_err(FTUNE_ERR_ARG, "gguf writer: tensor \"%s\": NULL fill", name ? name : "");
    ftune_status st = add_tensor(w, name, dtype, ndim, shape, NULL, true);
    if (st) return st;
    wtensor *t = &w->t[w->n_t - 1];
    t->fill = fill;
    t->fill_ctx = ctx;
    t->fill_index = index;
    return FTUNE_OK;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

ftune_status ft_gguf_writer_write(gguf_writer *w, const char *path) {
    wbuf h = { 0 };
    wb_u32(&h, 0x46554747u);
    wb_u32(&h, 3);
    wb_u64(&h, w->n_t);
    wb_u64(&h, w->n_kv);
    wb_put(&h, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        wb_str(&h, t->name);
        wb_u32(&h, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wb_u64(&h, t->ne[d]);
        wb_u32(&h, t->ggml_type);
        wb_u64(&h, off);
        off = align_up(off + t->nbytes, w->alignment);
    }
    static const uint8_t zeros[256];
    size_t pad = (size_t)(align_up(h.n, w->alignment) - h.n);
    while (pad > 0 && !h.oom) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        wb_put(&h, zeros, k);
        pad -= k;
    }
    if (h.oom) { free(h.p); return ft_err(FTUNE_ERR_NOMEM, "%s: out of memory building the GGUF header", path); }

    st_atomic a;
    ftune_status st = ft_st_atomic_open(&a, path);
    if (!st) st = ft_st_atomic_write(&a, h.p, h.n);
    free(h.p);
    uint8_t *gen = NULL;
    for (size_t i = 0; i < w->n_t && !st; i++) {
        const wtensor *t = &w->t[i];
        if (!t->fill) {
            st = ft_st_atomic_write(&a, t->data, (size_t)t->nbytes);
        } else {
            /* 4 MiB chunks of whole blocks */
            size_t bb = ft_types[t->dtype].block_bytes, chunk = ((size_t)4 << 20) / bb * bb;
            if (!gen && !(gen = ft_malloc((size_t)4 << 20))) st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path);
            for (uint64_t at = 0; at < t->nbytes && !st; at += chunk) {
                size_t k = t->nbytes - at < chunk ? (size_t)(t->nbytes - at) : chunk;
                st = t->fill(t->fill_ctx, t->fill_index, t->dtype, gen, at, k);
                if (!st) st = ft_st_atomic_write(&a, gen, k);
            }
        }
        if (st) break;
        /* pad every tensor, including the last, as ggml does */
        pad = (size_t)(align_up(t->nbytes, w->alignment) - t->nbytes);
        while (pad > 0 && !st) {
            size_t k = pad < sizeof zeros ? pad : sizeof zeros;
            st = ft_st_atomic_write(&a, zeros, k);
            pad -= k;
        }
    }
    free(gen);
    if (st) { ft_st_atomic_abort(&a); return st; }
    return ft_st_atomic_commit(&a);
}
