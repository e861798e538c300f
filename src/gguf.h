/* gguf.h — reader for llama.cpp's GGUF container: metadata key/values and
 * tensor infos, validated against the file size before anything is used. */
#ifndef FT_GGUF_H
#define FT_GGUF_H

#include "core.h"

typedef enum {
    GGUF_T_U8 = 0, GGUF_T_I8, GGUF_T_U16, GGUF_T_I16, GGUF_T_U32, GGUF_T_I32,
    GGUF_T_F32, GGUF_T_BOOL, GGUF_T_STRING, GGUF_T_ARRAY, GGUF_T_U64, GGUF_T_I64,
    GGUF_T_F64, GGUF_T_COUNT
} gguf_type;

typedef struct {
    const char *ptr; /* points into the mapping; NOT NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_type type;
    /* scalar value (for numbers and bool) */
    union { uint64_t u; int64_t i; double f; } v;
    gguf_str str;             /* GGUF_T_STRING */
    gguf_type arr_type;       /* GGUF_T_ARRAY: element type */
    uint64_t arr_n;           /* GGUF_T_ARRAY: element count */
    const uint8_t *arr_data;  /* GGUF_T_ARRAY: first element in the mapping */
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];           /* ggml order: ne[0] is the fastest-varying */
    uint32_t ggml_type;
    uint64_t offset;          /* relative to the data section */
    ft_dtype dtype;           /* FT_NTYPES if the ggml type is not supported */
    uint64_t nbytes;
    const uint8_t *data;      /* in the mapping */
} gguf_tensor_info;

typedef struct gguf_file_s {
    ft_mmap map;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor_info *tensors;
    uint64_t alignment;
    uint64_t data_offset;
} gguf_file;

/* Parses a GGUF file already in memory (data, size); path is for messages.
 * Does not take ownership of data. */
ftune_status gguf_parse(gguf_file *g, const char *path, const uint8_t *data, size_t size);
/* Maps path and parses it. */
ftune_status gguf_open(gguf_file *g, const char *path);
void gguf_close(gguf_file *g);

const gguf_kv *gguf_find(const gguf_file *g, const char *key);
const gguf_tensor_info *gguf_find_tensor(const gguf_file *g, const char *name);
bool gguf_str_eq(gguf_str s, const char *c);
/* Returns a malloc'd NUL-terminated copy. */
char *gguf_str_dup(gguf_str s);
/* Typed getters: return false if the key is missing or of another kind.
 * Integer getters accept any integer type whose value fits. */
bool gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
bool gguf_get_f64(const gguf_file *g, const char *key, double *out);
bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* Array element i of a string array (caller checks i < arr_n). Strings in an
 * array are variable-length, so this walks from the start: use
 * gguf_str_array_index for repeated access. */
typedef struct { uint64_t n; gguf_str *items; } gguf_str_array;
ftune_status gguf_get_str_array(const gguf_file *g, const char *key, gguf_str_array *out); /* items malloc'd */

#endif
