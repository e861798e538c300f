/* mem.h — where the library's memory comes from: every long-lived buffer
 * (owned weight copies, trainables, gradients, optimizer state, activations,
 * scratch, KV cache, data) is allocated through ft_mem_alloc with its
 * lifetime class, so the bytes held per class can be read back (the memory
 * table) and compared with what a planner predicted. Thread-safe. */
#ifndef FT_MEM_H
#define FT_MEM_H

#include <stddef.h>

typedef enum {
    FT_MEM_WEIGHTS,   /* model weights the library owns (converted or dequantized copies) */
    FT_MEM_TRAINABLE, /* trainable parameters (LoRA A/B, or full-model master weights) */
    FT_MEM_GRADS,     /* their gradients */
    FT_MEM_OPTIM,     /* optimizer state (AdamW m, v) */
    FT_MEM_ACTS,      /* activations saved for backward */
    FT_MEM_SCRATCH,   /* per-step workspaces */
    FT_MEM_KV,        /* KV caches */
    FT_MEM_DATA,      /* tokenized datasets and batches */
    FT_MEM_OTHER,
    FT_MEM_N_CLASSES
} ft_mem_class;

/* n bytes, 64-byte aligned, counted against class c; NULL on failure
 * (callers report FTUNE_ERR_NOMEM). n = 0 gives a valid pointer. */
void *ft_mem_alloc(ft_mem_class c, size_t n);
/* Frees p (may be NULL) that ft_mem_alloc(c, n) returned, with the same c and n. */
void ft_mem_free(ft_mem_class c, void *p, size_t n);
/* Bytes currently held, and the most ever held at once, in class c. */
size_t ft_mem_current(ft_mem_class c);
size_t ft_mem_peak(ft_mem_class c);
/* Short name of a class ("activations"). */
const char *ft_mem_class_name(ft_mem_class c);

#endif
