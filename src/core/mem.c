/* mem.c — counted allocation by lifetime class, the allocator hook, the
 * registry of weight mappings and the memory table (see mem.h). */
#include "core/mem.h"
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic size_t cur[FT_MEM_N_CLASSES], peak[FT_MEM_N_CLASSES];

void *ft_mem_default_hook(void *ud, ft_mem_class c, void *p, size_t old_n, size_t new_n) {
    (void)ud; (void)c;
    if (new_n == 0) { free(p); return NULL; }
    size_t sz = (new_n + 63) & ~(size_t)63;
    void *q = NULL;
    if (sz < new_n || posix_memalign(&q, 64, sz) != 0) return NULL;
    if (p) {
        memcpy(q, p, old_n < new_n ? old_n : new_n);
        free(p);
    }
    return q;
}

static ft_mem_hook hook = ft_mem_default_hook;
static void *hook_ud;

void ft_mem_set_hook(ft_mem_hook h, void *ud) {
    hook = h ? h : ft_mem_default_hook;
    hook_ud = h ? ud : NULL;
}

static void count_add(ft_mem_class c, size_t n) {
    size_t now = atomic_fetch_add(&cur[c], n) + n;
    size_t pk = atomic_load(&peak[c]);
    while (now > pk && !atomic_compare_exchange_weak(&peak[c], &pk, now)) {}
}

ftune_status ft_mem_map_paged(void **out, size_t n, const char *dir) {
    *out = NULL;
    if (!dir || !*dir) return ft_err(FTUNE_ERR_ARG, "paged memory: no directory given for its file");
    char path[4200];
    if (snprintf(path, sizeof path, "%s/.ftune-paged-XXXXXX", dir) >= (int)sizeof path)
        return ft_err(FTUNE_ERR_ARG, "%s: path too long", dir);
    long pg = sysconf(_SC_PAGESIZE);
    size_t ps = pg > 0 ? (size_t)pg : 4096, len = (n + ps - 1) / ps * ps;
    if (!len) len = ps;
    int fd = mkstemp(path);
    if (fd < 0) return ft_err(FTUNE_ERR_IO, "paged memory: cannot create a file in %s: %s", dir, strerror(errno));
    unlink(path);
    int e = posix_fallocate(fd, 0, (off_t)len);
    if (e == EINVAL || e == EOPNOTSUPP) e = ftruncate(fd, (off_t)len) == 0 ? 0 : errno;
    if (e) {
        close(fd);
        return ft_err(FTUNE_ERR_IO, "paged memory: cannot reserve %.1f MiB in %s: %s", len / 1048576.0, dir, strerror(e));
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    close(fd); /* the mapping keeps the file */
    if (p == MAP_FAILED)
        return ft_err(FTUNE_ERR_IO, "paged memory: cannot map %.1f MiB of a file in %s: %s", len / 1048576.0, dir, strerror(e));
    count_add(FT_MEM_PAGED, n);
    *out = p; /* a new file reads as zeros */
    return FTUNE_OK;
}

void ft_mem_unmap_paged(void *p, size_t n) {
    if (!p) return;
    long pg = sysconf(_SC_PAGESIZE);
    size_t ps = pg > 0 ? (size_t)pg : 4096, len = (n + ps - 1) / ps * ps;
    munmap(p, len ? len : ps);
    atomic_fetch_sub(&cur[FT_MEM_PAGED], n);
}

/* The hook sees at least one byte: n = 0 still gives a distinct pointer. */
void *ft_mem_alloc(ft_mem_class c, size_t n) {
    if ((unsigned)c >= FT_MEM_N_CLASSES) return NULL;
    void *p = hook(hook_ud, c, NULL, 0, n ? n : 1);
    if (p) count_add(c, n);
    return p;
}

void *ft_mem_calloc(ft_mem_class c, size_t n) {
    void *p = ft_mem_alloc(c, n);
    if (p) memset(p, 0, n);
    return p;
}

void *ft_mem_realloc(ft_mem_class c, void *p, size_t old_n, size_t new_n) {
    if (!p) return ft_mem_alloc(c, new_n);
    if ((unsigned)c >= FT_MEM_N_CLASSES) return NULL;
    void *q = hook(hook_ud, c, p, old_n ? old_n : 1, new_n ? new_n : 1);
    if (!q) return NULL;
    /* both sizes are held for a moment while the hook copies */
    count_add(c, new_n);
    atomic_fetch_sub(&cur[c], old_n);
    return q;
}

void ft_mem_free(ft_mem_class c, void *p, size_t n) {
    if (!p || (unsigned)c >= FT_MEM_N_CLASSES) return;
    atomic_fetch_sub(&cur[c], n);
    hook(hook_ud, c, p, n ? n : 1, 0);
}

size_t ft_mem_current(ft_mem_class c) { return (unsigned)c < FT_MEM_N_CLASSES ? atomic_load(&cur[c]) : 0; }
size_t ft_mem_peak(ft_mem_class c) { return (unsigned)c < FT_MEM_N_CLASSES ? atomic_load(&peak[c]) : 0; }

void ft_mem_reset_peaks(void) {
    for (int c = 0; c < FT_MEM_N_CLASSES; c++) atomic_store(&peak[c], atomic_load(&cur[c]));
}

const char *ft_mem_class_name(ft_mem_class c) {
    static const char *names[FT_MEM_N_CLASSES] = {
        [FT_MEM_WEIGHTS] = "weights", [FT_MEM_TRAINABLE] = "trainables", [FT_MEM_GRADS] = "gradients",
        [FT_MEM_OPTIM] = "optimizer state", [FT_MEM_PAGED] = "paged (file-backed)",
        [FT_MEM_ACTS] = "activations", [FT_MEM_SCRATCH] = "scratch",
        [FT_MEM_KV] = "KV cache", [FT_MEM_DATA] = "data", [FT_MEM_OTHER] = "other",
    };
    return (unsigned)c < FT_MEM_N_CLASSES ? names[c] : "?";
}

/* ------------------------------------------------------------ mappings */

typedef struct { uintptr_t addr; size_t n; } map_range;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static map_range *maps;
static int n_maps, cap_maps;
static size_t mapped_bytes;

/* The registry's own array is bookkeeping, not a class: plain realloc. A
 * mapping that cannot be registered is still counted in bytes mapped. */
void ft_mem_map_add(const void *addr, size_t n) {
    if (!addr || !n) return;
    pthread_mutex_lock(&map_lock);
    mapped_bytes += n;
    if (n_maps == cap_maps) {
        int cap = cap_maps ? 2 * cap_maps : 16;
        map_range *m = realloc(maps, (size_t)cap * sizeof *m);
        if (m) { maps = m; cap_maps = cap; }
    }
    if (n_maps < cap_maps) maps[n_maps++] = (map_range){ (uintptr_t)addr, n };
    pthread_mutex_unlock(&map_lock);
}

void ft_mem_map_remove(const void *addr, size_t n) {
    if (!addr || !n) return;
    pthread_mutex_lock(&map_lock);
    mapped_bytes -= n;
    for (int i = 0; i < n_maps; i++)
        if (maps[i].addr == (uintptr_t)addr) { maps[i] = maps[--n_maps]; break; }
    pthread_mutex_unlock(&map_lock);
}

size_t ft_mem_mapped(void) {
    pthread_mutex_lock(&map_lock);
    size_t n = mapped_bytes;
    pthread_mutex_unlock(&map_lock);
    return n;
}

size_t ft_mem_mapped_resident(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), total = 0;
    bool inside = false;
    char line[512];
    pthread_mutex_lock(&map_lock);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        size_t kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = false;
            for (int i = 0; i < n_maps; i++) {
                uintptr_t end = maps[i].addr + ((maps[i].n + page - 1) / page) * page;
                if (lo >= maps[i].addr && hi <= end) inside = true;
            }
        } else if (inside && sscanf(line, "Rss: %zu kB", &kb) == 1) {
            total += kb * 1024;
        }
    }
    pthread_mutex_unlock(&map_lock);
    fclose(f);
    return total;
}

/* ------------------------------------------------------------ RSS */

bool ft_mem_rss(size_t *now, size_t *pk) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return false;
    char line[256];
    size_t kb;
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1) { if (now) *now = kb * 1024; got |= 1; }
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) { if (pk) *pk = kb * 1024; got |= 2; }
    }
    fclose(f);
    return got == 3;
}

bool ft_mem_rss_reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* ------------------------------------------------------------ the table */

const char *ft_mem_row_name(int r) {
    if (r == FT_MEM_ROW_MAPPED) return "weights as stored (mapped)";
    if (r == FT_MEM_WEIGHTS) return "weights, owned copies";
    return r >= 0 && r < FT_MEM_N_CLASSES ? ft_mem_class_name((ft_mem_class)r) : "?";
}

void ft_mem_table_measure(ft_mem_table *t) {
    for (int c = 0; c < FT_MEM_N_CLASSES; c++) {
        t->current[c] = ft_mem_current((ft_mem_class)c);
        t->peak[c] = ft_mem_peak((ft_mem_class)c);
    }
    t->current[FT_MEM_ROW_MAPPED] = t->peak[FT_MEM_ROW_MAPPED] = ft_mem_mapped_resident();
}

size_t ft_mem_table_planned_total(const ft_mem_table *t) {
    size_t s = 0;
    for (int r = 0; r < FT_MEM_N_ROWS; r++) s += t->planned[r];
    return s;
}

size_t ft_mem_table_peak_total(const ft_mem_table *t) {
    size_t s = 0;
    for (int r = 0; r < FT_MEM_N_ROWS; r++) s += t->peak[r];
    return s;
}

int ft_mem_table_format(const ft_mem_table *t, char *buf, size_t n) {
    const double M = 1048576.0;
    int len = 0, w;
#define PUT(...)                                                                              \
    do {                                                                                      \
        w = snprintf(buf && len < (int)n ? buf + len : NULL, buf && len < (int)n ? n - (size_t)len : 0, \
                     __VA_ARGS__);                                                            \
        if (w < 0) return w;                                                                  \
        len += w;                                                                             \
    } while (0)
    PUT("%-28s %12s %12s %12s\n", "memory (MiB)", "planned", "now", "peak");
    static const int order[FT_MEM_N_ROWS] = { FT_MEM_ROW_MAPPED, FT_MEM_WEIGHTS, FT_MEM_TRAINABLE, FT_MEM_GRADS,
                                              FT_MEM_OPTIM, FT_MEM_PAGED, FT_MEM_ACTS, FT_MEM_SCRATCH, FT_MEM_KV, FT_MEM_DATA,
                                              FT_MEM_OTHER };
    for (int i = 0; i < FT_MEM_N_ROWS; i++) {
        int r = order[i];
        /* the paged row only for a run that pages */
        if (r == FT_MEM_PAGED && !t->planned[r] && !t->current[r] && !t->peak[r]) continue;
        if (t->has_plan[r]) PUT("%-28s %12.1f %12.1f %12.1f\n", ft_mem_row_name(r), t->planned[r] / M, t->current[r] / M, t->peak[r] / M);
        else PUT("%-28s %12s %12.1f %12.1f\n", ft_mem_row_name(r), "-", t->current[r] / M, t->peak[r] / M);
    }
    size_t now = 0;
    for (int r = 0; r < FT_MEM_N_ROWS; r++) now += t->current[r];
    PUT("%-28s %12.1f %12.1f %12.1f\n", "total", ft_mem_table_planned_total(t) / M, now / M,
        ft_mem_table_peak_total(t) / M);
#undef PUT
    return len;
}
