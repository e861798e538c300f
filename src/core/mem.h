/* mem.h — where the library's memory comes from: every long-lived buffer
 * (owned weight copies, trainables, gradients, optimizer state, activations,
 * scratch, KV cache, data) is allocated through ft_mem_alloc with its
 * lifetime class, so the bytes held per class can be read back (the memory
 * table) and compared with what a planner predicted. Weights that stay in a
 * file mapping are counted apart: bytes mapped, and pages resident.
 * Every allocation goes through one hook (Lua's lua_Alloc style), which a
 * test can replace to make the Nth allocation fail. Thread-safe. */
#ifndef FT_MEM_H
#define FT_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "ftune.h" /* ftune_status */

typedef enum {
    FT_MEM_WEIGHTS,   /* model weights the library owns (converted or dequantized copies) */
    FT_MEM_TRAINABLE, /* trainable parameters (LoRA A/B, or full-model master weights) */
    FT_MEM_GRADS,     /* their gradients */
    FT_MEM_OPTIM,     /* optimizer state (AdamW m, v) */
    FT_MEM_PAGED,     /* paged: optimizer state (and full mode's f32 masters) in a file-backed mapping */
    FT_MEM_ACTS,      /* activations saved for backward */
    FT_MEM_SCRATCH,   /* per-step workspaces */
    FT_MEM_KV,        /* KV caches */
    FT_MEM_DATA,      /* tokenized datasets and batches */
    FT_MEM_OTHER,     /* small bookkeeping (layer views, parameter lists) */
    FT_MEM_N_CLASSES
} ft_mem_class;

/* n bytes, 64-byte aligned, counted against class c; NULL on failure
 * (callers report FTUNE_ERR_NOMEM). n = 0 gives a valid pointer. */
void *ft_mem_alloc(ft_mem_class c, size_t n);
/* ft_mem_alloc, zero-filled. */
void *ft_mem_calloc(ft_mem_class c, size_t n);
/* Grows or shrinks p (NULL, or from ft_mem_alloc(c, old_n)) to new_n bytes,
 * keeping the first min(old_n, new_n); on failure returns NULL and p is
 * untouched and still counted as old_n. */
void *ft_mem_realloc(ft_mem_class c, void *p, size_t old_n, size_t new_n);
/* Frees p (may be NULL) that ft_mem_alloc(c, n) returned, with the same c and n. */
void ft_mem_free(ft_mem_class c, void *p, size_t n);
/* n zeroed bytes (page-aligned) in a MAP_SHARED mapping of a temporary
 * file in dir, unlinked at once, so that under memory pressure the kernel
 * writes the pages back to the file and drops them instead of keeping them
 * in RAM; counted as FT_MEM_PAGED. The file's blocks are reserved up front
 * where the file system can, so that a full disk is an error here rather
 * than a SIGBUS later. FTUNE_ERR_IO names dir. Free with ft_mem_unmap_paged. */
FTUNE_MUST_USE ftune_status ft_mem_map_paged(void **out, size_t n, const char *dir);
void ft_mem_unmap_paged(void *p, size_t n);
/* Bytes currently held, and the most ever held at once, in class c. */
size_t ft_mem_current(ft_mem_class c);
size_t ft_mem_peak(ft_mem_class c);
/* Sets every class's peak to its current value (to measure one phase). */
void ft_mem_reset_peaks(void);
/* Short name of a class ("activations"). */
const char *ft_mem_class_name(ft_mem_class c);

/* The hook every allocation goes through, as lua_Alloc: new_n = 0 frees p
 * (returns NULL); p = NULL allocates new_n bytes, 64-byte aligned; else
 * resizes p from old_n to new_n bytes (returning NULL leaves p valid).
 * Counting is done around the hook, only for what it grants. */
typedef void *(*ft_mem_hook)(void *ud, ft_mem_class c, void *p, size_t old_n, size_t new_n);
/* Installs hook (NULL: the default, posix_memalign/free). Not to be
 * changed while other threads allocate. */
void ft_mem_set_hook(ft_mem_hook hook, void *ud);
/* The default hook, for hooks that wrap it. */
void *ft_mem_default_hook(void *ud, ft_mem_class c, void *p, size_t old_n, size_t new_n);

/* File mappings holding weights "as stored": registered by ft_mmap_open,
 * removed by ft_mmap_close. */
void ft_mem_map_add(const void *addr, size_t n);
void ft_mem_map_remove(const void *addr, size_t n);
/* Bytes mapped now, and of those the bytes resident in this process (the
 * pages it touched, from /proc/self/smaps Rss; 0 where that is unreadable). */
size_t ft_mem_mapped(void);
size_t ft_mem_mapped_resident(void);

/* The process's resident set, now and at its peak (VmRSS, VmHWM of
 * /proc/self/status), in bytes; false where unreadable. */
bool ft_mem_rss(size_t *now, size_t *peak);
/* Resets the peak (VmHWM) to the current RSS (Linux clear_refs 5); false
 * where the kernel does not allow it. */
bool ft_mem_rss_reset_peak(void);

/* One memory table: a row per term, what the plan predicts next to what
 * the allocator counted. Row FT_MEM_ROW_MAPPED is the weights as stored:
 * planned = bytes of weights in the mapped files, current = peak = bytes
 * of the mappings resident now. The other rows are the classes. */
#define FT_MEM_ROW_MAPPED FT_MEM_N_CLASSES
#define FT_MEM_N_ROWS (FT_MEM_N_CLASSES + 1)
typedef struct {
    size_t planned[FT_MEM_N_ROWS];
    size_t current[FT_MEM_N_ROWS];
    size_t peak[FT_MEM_N_ROWS];
    bool has_plan[FT_MEM_N_ROWS]; /* false: the planner does not predict this row */
} ft_mem_table;

/* Fills current and peak of every row from the counters and the mappings;
 * planned is left as the caller (a trainer's or session's planner) set it. */
void ft_mem_table_measure(ft_mem_table *t);
/* Sum of the planned rows, and of the counted peaks (an upper bound of
 * what was held at once). */
size_t ft_mem_table_planned_total(const ft_mem_table *t);
size_t ft_mem_table_peak_total(const ft_mem_table *t);
/* Name of row r ("weights as stored (mapped)", "trainables", ...). */
const char *ft_mem_row_name(int r);
/* Writes the table as aligned text lines (MiB), with totals; returns the
 * length it needed, as snprintf. */
int ft_mem_table_format(const ft_mem_table *t, char *buf, size_t n);

#endif
