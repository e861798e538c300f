/* mem.c — counted allocation by lifetime class (see mem.h). */
#include "mem.h"

#include <stdatomic.h>
#include <stdlib.h>

static _Atomic size_t cur[FT_MEM_N_CLASSES], peak[FT_MEM_N_CLASSES];

void *ft_mem_alloc(ft_mem_class c, size_t n) {
    void *p = NULL;
    size_t sz = (n + 63) & ~(size_t)63;
    if (sz < n || posix_memalign(&p, 64, sz ? sz : 64) != 0) return NULL;
    size_t now = atomic_fetch_add(&cur[c], n) + n;
    size_t pk = atomic_load(&peak[c]);
    while (now > pk && !atomic_compare_exchange_weak(&peak[c], &pk, now)) {}
    return p;
}

void ft_mem_free(ft_mem_class c, void *p, size_t n) {
    if (!p) return;
    atomic_fetch_sub(&cur[c], n);
    free(p);
}

size_t ft_mem_current(ft_mem_class c) { return atomic_load(&cur[c]); }
size_t ft_mem_peak(ft_mem_class c) { return atomic_load(&peak[c]); }

const char *ft_mem_class_name(ft_mem_class c) {
    static const char *names[FT_MEM_N_CLASSES] = {
        [FT_MEM_WEIGHTS] = "weights", [FT_MEM_TRAINABLE] = "trainables", [FT_MEM_GRADS] = "gradients",
        [FT_MEM_OPTIM] = "optimizer state", [FT_MEM_ACTS] = "activations", [FT_MEM_SCRATCH] = "scratch",
        [FT_MEM_KV] = "KV cache", [FT_MEM_DATA] = "data", [FT_MEM_OTHER] = "other",
    };
    return (unsigned)c < FT_MEM_N_CLASSES ? names[c] : "?";
}
