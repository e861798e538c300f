/* safetensors.h — reader and writer for Hugging Face's safetensors format
 * (8-byte little-endian header length, JSON header, byte buffer), and the
 * streaming atomic file writer that the safetensors and GGUF writers share. */
#ifndef FT_SAFETENSORS_H
#define FT_SAFETENSORS_H

#include "core/core.h"

typedef struct {
    char name[FT_NAME_MAX * 2];
    ft_dtype dtype;           /* FT_NTYPES for a dtype we do not read (e.g. F8) */
    char dtype_name[16];      /* as written in the header */
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    uint64_t begin, end;      /* offsets into the byte buffer */
    const uint8_t *data;      /* in the mapping */
} st_tensor;

typedef struct {
    ft_mmap map;
    int n;
    st_tensor *tensors;
    size_t data_start;        /* 8 + header length */
    int n_meta;               /* __metadata__ entries, in file order */
    char **meta_keys, **meta_values;
} st_file;

/* Parses an in-memory safetensors file; path is for messages. Checks: the
 * header length is within the file and at most ST_MAX_HEADER, the header is
 * a JSON object (trailing spaces allowed), every offset lies in the buffer,
 * end - begin == numel * element size, the tensors tile the buffer with no
 * overlap and no hole, no duplicate names, __metadata__ maps strings to
 * strings. Dtypes ftune does not compute with (F8_E4M3, BOOL, I8, ...) are
 * kept with dtype FT_NTYPES; an unknown dtype name is
 * FTUNE_ERR_UNSUPPORTED. Tensors with more than FT_MAX_DIMS dimensions are
 * FTUNE_ERR_UNSUPPORTED. On failure f is left empty (safe to st_close). */
#define ST_MAX_HEADER (100u << 20)
FTUNE_MUST_USE ftune_status ft_st_parse(st_file *f, const char *path, const uint8_t *data, size_t size);
FTUNE_MUST_USE ftune_status ft_st_open(st_file *f, const char *path);
/* Reads and checks only the header (the checks of ft_st_parse, offsets
 * against the file's size): tensors get no data (NULL) and nothing is
 * mapped. For planning memory without touching the weights. */
FTUNE_MUST_USE ftune_status ft_st_open_header(st_file *f, const char *path);
void ft_st_close(st_file *f);
const st_tensor *ft_st_find(const st_file *f, const char *name);
/* Value of a __metadata__ key, or NULL. */
const char *ft_st_meta(const st_file *f, const char *key);
/* Element size of a safetensors dtype name ("F32" -> 4, "F8_E4M3" -> 1),
 * 0 if unknown; and the ftune dtype it maps to (FT_NTYPES if none). */
int ft_st_dtype_size(const char *name);
ft_dtype ft_st_dtype_from_name(const char *name);
/* The safetensors name of an ftune dtype ("F32", "BF16"), NULL if it has none. */
const char *ft_st_dtype_name(ft_dtype t);

/* Writer: collect tensors, then write atomically. Data is copied at write
 * time from the given pointers, which must stay valid until st_write; it is
 * streamed to the file, never gathered in memory. Tensors are stored by
 * element size (largest first), then by name, so every tensor starts at an
 * offset aligned to its element size; the header is padded with spaces so
 * the data starts at a multiple of 8. */
typedef struct {
    const char *name;
    ft_dtype dtype;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    const void *data;
    /* Instead of data: a generator called for consecutive chunks of the
     * tensor's bytes (offset, n bytes, whole elements), in order. */
    ft_fill_fn fill;
    void *fill_ctx;
    int fill_index;
} st_out_tensor;

/* metadata: NULL-terminated key,value,... string pairs or NULL; "format":
 * "pt" is added unless metadata sets "format". */
FTUNE_MUST_USE ftune_status ft_st_write(const char *path, const st_out_tensor *ts, int n, const char *const *metadata);

/* Streaming atomic writer: bytes go to path.tmp; commit fsyncs it, renames
 * it over path and fsyncs the directory; abort removes path.tmp. After a
 * failed write call abort. */
typedef struct {
    int fd;
    char *path, *tmp;
    uint64_t written;
} st_atomic;

FTUNE_MUST_USE ftune_status ft_st_atomic_open(st_atomic *a, const char *path);
FTUNE_MUST_USE ftune_status ft_st_atomic_write(st_atomic *a, const void *buf, size_t n);
FTUNE_MUST_USE ftune_status ft_st_atomic_commit(st_atomic *a);
void ft_st_atomic_abort(st_atomic *a);

#endif
