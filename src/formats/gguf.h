/* gguf.h — reader and writer for llama.cpp's GGUF container (versions 2 and 3):
 * metadata key/values and tensor infos, validated against the file size
 * before anything is used; the writer streams to path.tmp and renames. */
#ifndef FT_GGUF_H
#define FT_GGUF_H

#include "core/core.h"

typedef enum {
    GGUF_T_U8 = 0, GGUF_T_I8, GGUF_T_U16, GGUF_T_I16, GGUF_T_U32, GGUF_T_I32,
    GGUF_T_F32, GGUF_T_BOOL, GGUF_T_STRING, GGUF_T_ARRAY, GGUF_T_U64, GGUF_T_I64,
    GGUF_T_F64, GGUF_T_COUNT
} gguf_type;

/* ggml tensor type ids that ftune reads (ggml.h numbering). */
enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_I32 = 26, GGML_TYPE_I64 = 27, GGML_TYPE_F64 = 28, GGML_TYPE_BF16 = 30
};

#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const char *ptr; /* points into the mapping; NOT NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_type type;
    /* scalar value: u for U8..U64 and BOOL, i for I8..I64, f for F32/F64 */
    union { uint64_t u; int64_t i; double f; } v;
    gguf_str str;             /* GGUF_T_STRING */
    gguf_type arr_type;       /* GGUF_T_ARRAY: element type */
    uint64_t arr_n;           /* GGUF_T_ARRAY: element count */
    const uint8_t *arr_data;  /* GGUF_T_ARRAY: first element in the mapping (unaligned) */
} gguf_kv;

typedef struct {
    gguf_str name;            /* shorter than FT_NAME_MAX */
    uint32_t n_dims;          /* 1..4 */
    uint64_t ne[4];           /* ggml order: ne[0] is the fastest-varying; unused dims are 1 */
    uint32_t ggml_type;
    uint64_t offset;          /* relative to the data section */
    ft_dtype dtype;           /* its traits row (ft_dtype_is_weight says whether ftune computes with it) */
    uint64_t nbytes;          /* size in the file (known for every accepted ggml type) */
    const uint8_t *data;      /* in the mapping */
} gguf_tensor_info;

typedef struct gguf_file_s {
    ft_mmap map;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor_info *tensors;
    uint64_t alignment;
    uint64_t data_offset;     /* start of the data section, <= the file size (a
                               * file without tensors may end before the padding) */
} gguf_file;

/* Parses a GGUF file already in memory (data, size); path is for messages.
 * Does not take ownership of data. On failure g is left empty (safe to
 * gguf_close). Checks: magic, version 2 or 3, every string/array/count
 * against the bytes left, nested arrays (depth <= 8), duplicate keys and
 * tensor names, no NUL byte inside a key or tensor name, n_dims 1..4, element counts, general.alignment (a power of
 * two), every tensor's offset aligned, data inside the file, no overlaps.
 * Unknown ggml tensor types are FTUNE_ERR_UNSUPPORTED (their size cannot be
 * checked). */
FTUNE_MUST_USE ftune_status ft_gguf_parse(gguf_file *g, const char *path, const uint8_t *data, size_t size);
/* Maps path and parses it. */
FTUNE_MUST_USE ftune_status ft_gguf_open(gguf_file *g, const char *path);
void ft_gguf_close(gguf_file *g);

const gguf_kv *ft_gguf_find(const gguf_file *g, const char *key);
const gguf_tensor_info *ft_gguf_find_tensor(const gguf_file *g, const char *name);
bool ft_gguf_str_eq(gguf_str s, const char *c);
/* Returns a malloc'd NUL-terminated copy (NULL if out of memory). */
char *ft_gguf_str_dup(gguf_str s);
/* Typed getters: return false if the key is missing or of another kind.
 * Integer getters accept any integer type whose value fits; the f64 getter
 * accepts F32, F64 and integers. */
bool ft_gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
bool ft_gguf_get_f64(const gguf_file *g, const char *key, double *out);
bool ft_gguf_get_bool(const gguf_file *g, const char *key, bool *out);
bool ft_gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* All strings of a string array, in one pass (strings in an array are
 * variable-length, so element i is only reachable by walking). items is
 * malloc'd; free it with free(). FTUNE_ERR_ARG if the key is missing,
 * FTUNE_ERR_FORMAT if it is not an array of strings. */
typedef struct { uint64_t n; gguf_str *items; } gguf_str_array;
FTUNE_MUST_USE ftune_status ft_gguf_get_str_array(const gguf_file *g, const char *key, gguf_str_array *out);

/* ggml type id <-> ftune dtype, from the traits. gguf_ggml_type returns -1
 * for a dtype GGUF cannot hold (U8, NF4); gguf_dtype_of returns FT_NTYPES
 * for an id ggml does not have. */
int ft_gguf_ggml_type(ft_dtype t);
ft_dtype ft_gguf_dtype_of(uint32_t ggml_type);
/* Name of a ggml type id ("f32", "q4_K", ...) or "?" */
const char *ft_gguf_ggml_type_name(uint32_t ggml_type);

/* ------------------------------------------------------------- writer */

/* Collects key/values and tensors, then writes a GGUF v3 file atomically
 * (path.tmp, fsync, rename) with alignment 32. Keys and values are copied
 * when added; tensor data is read from the given pointers at write time, so
 * they must stay valid until gguf_writer_write. Tensor data is streamed, so
 * a multi-GB model is never held twice in memory. Adding a key or tensor
 * name twice is FTUNE_ERR_ARG. */
typedef struct gguf_writer_s gguf_writer;

FTUNE_MUST_USE ftune_status ft_gguf_writer_new(gguf_writer **out);
void ft_gguf_writer_free(gguf_writer *w);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_str(gguf_writer *w, const char *key, const char *val);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t val);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t val);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_f32(gguf_writer *w, const char *key, float val);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_bool(gguf_writer *w, const char *key, bool val);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_str_array(gguf_writer *w, const char *key, const char *const *vals, size_t n);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_f32_array(gguf_writer *w, const char *key, const float *vals, size_t n);
FTUNE_MUST_USE ftune_status ft_gguf_writer_set_i32_array(gguf_writer *w, const char *key, const int32_t *vals, size_t n);
/* shape in PyTorch order (shape[0] slowest); it is written reversed as ggml
 * ne. data holds ft_dtype_nbytes(dtype, numel) bytes. The innermost
 * dimension must be a whole number of blocks for quantized types. */
FTUNE_MUST_USE ftune_status ft_gguf_writer_add_tensor(gguf_writer *w, const char *name, ft_dtype dtype,
                                    int ndim, const int64_t *shape, const void *data);
/* The same, with the bytes produced at write time by fill(ctx, index,
 * dtype, dst, offset, n) for consecutive chunks of whole blocks, in order
 * (the callback shape of st_out_tensor.fill), so a merged or converted model
 * is never held in memory whole. */
FTUNE_MUST_USE ftune_status ft_gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, ft_dtype dtype, int ndim,
                                         const int64_t *shape, ft_fill_fn fill, void *ctx, int index);
FTUNE_MUST_USE ftune_status ft_gguf_writer_write(gguf_writer *w, const char *path);

#endif
