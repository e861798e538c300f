/* safetensors.h — reader and writer for Hugging Face's safetensors format
 * (8-byte little-endian header length, JSON header, byte buffer). */
#ifndef FT_SAFETENSORS_H
#define FT_SAFETENSORS_H

#include "core.h"

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
} st_file;

/* Parses an in-memory safetensors file; path is for messages. Checks every
 * offset against the size, rejects overlaps, duplicates and shape/size
 * mismatches. */
ftune_status st_parse(st_file *f, const char *path, const uint8_t *data, size_t size);
ftune_status st_open(st_file *f, const char *path);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);

/* Writer: collect tensors, then write atomically. Data is copied at write
 * time from the given pointers, which must stay valid until st_write. */
typedef struct {
    const char *name;
    ft_dtype dtype;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    const void *data;
} st_out_tensor;

/* metadata: NULL-terminated key,value,... string pairs or NULL. */
ftune_status st_write(const char *path, const st_out_tensor *ts, int n, const char *const *metadata);

#endif
