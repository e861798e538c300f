/* core.c — error messages, file mappings, atomic writes, small utilities. */
#include "core/core.h"
#include "core/mem.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char err_msg[2048];

const char *ftune_last_error(void) { return err_msg; }

void ft_err_clear(void) { err_msg[0] = 0; }

ftune_status ft_err(ftune_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    return st;
}

ftune_status ft_err_prefix(ftune_status st, const char *fmt, ...) {
    char prefix[1024], old[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    snprintf(err_msg, sizeof err_msg, "%s: %s", prefix, old);
    return st;
}

const char *ftune_status_name(ftune_status st) {
    switch (st) {
    case FTUNE_OK: return "FTUNE_OK";
    case FTUNE_ERR_IO: return "FTUNE_ERR_IO";
    case FTUNE_ERR_FORMAT: return "FTUNE_ERR_FORMAT";
    case FTUNE_ERR_UNSUPPORTED: return "FTUNE_ERR_UNSUPPORTED";
    case FTUNE_ERR_NOMEM: return "FTUNE_ERR_NOMEM";
    case FTUNE_ERR_ARG: return "FTUNE_ERR_ARG";
    case FTUNE_ERR_RANGE: return "FTUNE_ERR_RANGE";
    case FTUNE_ERR_INTERRUPTED: return "FTUNE_ERR_INTERRUPTED";
    }
    return "FTUNE_ERR_?";
}

ftune_status ft_mmap_open(ft_mmap *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ft_err(FTUNE_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return ft_err(FTUNE_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        }
        m->data = p;
        ft_mem_map_add(p, m->size);
    }
    close(fd);
    m->path = ft_strdup(path);
    if (!m->path) { ft_mmap_close(m); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    return FTUNE_OK;
}

void ft_mmap_close(ft_mmap *m) {
    if (m->data && m->size) {
        ft_mem_map_remove(m->data, m->size);
        munmap((void *)m->data, m->size);
    }
    free(m->path);
    memset(m, 0, sizeof *m);
}

ftune_status ft_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); return ft_err(FTUNE_ERR_NOMEM, "out of memory reading %s", path); }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); fclose(f); return ft_err(FTUNE_ERR_NOMEM, "out of memory reading %s", path); }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return ft_err(FTUNE_ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return FTUNE_OK;
}

ftune_status ft_write_file_atomic(const char *path, const void *buf, size_t len) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ftune_status st = ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    const char *p = buf;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            ftune_status st = ft_err(FTUNE_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
            close(fd); unlink(tmp); free(tmp);
            return st;
        }
        p += w; left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        ftune_status st = ft_err(FTUNE_ERR_IO, "%s: fsync/close failed: %s", tmp, strerror(errno));
        unlink(tmp); free(tmp);
        return st;
    }
    if (rename(tmp, path) != 0) {
        ftune_status st = ft_err(FTUNE_ERR_IO, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
        unlink(tmp); free(tmp);
        return st;
    }
    free(tmp);
    return FTUNE_OK;
}

ftune_status ft_write_json_atomic(const char *path, const cJSON *j) {
    char *s = cJSON_Print(j);
    if (!s) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) { free(s); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    t[n] = '\n';
    ftune_status st = ft_write_file_atomic(path, t, n + 1);
    free(t);
    return st;
}

bool ft_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool ft_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int ft_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* fsync of the directory holding path, so that a rename in it is durable */
static void fsync_parent(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
    int fd = open(slash ? (slash == buf ? "/" : buf) : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

ftune_status ft_dir_stage(const char *dir, char *staged, size_t cap) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (snprintf(staged, cap, "%.*s.tmp.%ld", (int)n, dir, (long)getpid()) >= (int)cap)
        return ft_err(FTUNE_ERR_ARG, "%s: path too long", dir);
    if (ft_file_exists(dir) && !ft_is_dir(dir)) return ft_err(FTUNE_ERR_IO, "%s: exists and is not a directory", dir);
    ft_dir_abort(staged); /* one left by an earlier process of this pid */
    if (mkdir(staged, 0755) != 0) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", staged, strerror(errno));
    return FTUNE_OK;
}

ftune_status ft_dir_commit(const char *staged, const char *dir) {
    if (!ft_is_dir(dir) || ft_dir_entries(dir) == 0) {
        if (rename(staged, dir) != 0)
            return ft_err(FTUNE_ERR_IO, "%s: rename to %s failed: %s", staged, dir, strerror(errno));
        fsync_parent(dir);
        return FTUNE_OK;
    }
    DIR *d = opendir(staged);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", staged, strerror(errno));
    ftune_status st = FTUNE_OK;
    char from[4400], to[4400];
    for (struct dirent *e; !st && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(from, sizeof from, "%s/%s", staged, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        if (rename(from, to) != 0) st = ft_err(FTUNE_ERR_IO, "%s: rename to %s failed: %s", from, to, strerror(errno));
    }
    closedir(d);
    if (st) return st;
    snprintf(to, sizeof to, "%s/x", dir);
    fsync_parent(to);
    if (rmdir(staged) != 0) return ft_err(FTUNE_ERR_IO, "%s: cannot remove: %s", staged, strerror(errno));
    return FTUNE_OK;
}

void ft_dir_abort(const char *staged) {
    DIR *d = opendir(staged);
    if (!d) return;
    char path[4400];
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", staged, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(staged);
}

void *ft_malloc(size_t n) { return malloc(n ? n : 1); }
void *ft_calloc(size_t n, size_t size) { return calloc(n ? n : 1, size ? size : 1); }
void *ft_aligned_alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
    return p;
}
char *ft_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

int ft_num_threads(int requested) {
    if (requested > 0) return requested;
    /* the CPUs this process may run on (taskset, cgroup cpusets), else the
     * online ones; OMP_NUM_THREADS is not consulted: no OpenMP here */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

double ft_time_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ft_float_shortest(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) return strtod(buf, NULL);
    }
    return f;
}

int64_t ft_utf8_invalid_at(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return (int64_t)i;
        if (i + len > n) return (int64_t)i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        /* overlong forms, surrogates, beyond U+10FFFF */
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return (int64_t)i;
        i += len;
    }
    return -1;
}

/* splitmix64 seeding + xorshift64* stream */
void ft_rng_seed(ft_rng *r, uint64_t seed) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545F4914F6CDD1Dull;
}
uint32_t ft_rng_u32(ft_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}
float ft_rng_uniform(ft_rng *r) { return (float)(ft_rng_u32(r) >> 8) / 16777216.0f; }
float ft_rng_normal(ft_rng *r) {
    float u1 = ft_rng_uniform(r), u2 = ft_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

ft_tensor ft_tensor_f32_view(const char *name, float *data, int64_t rows, int64_t cols) {
    ft_tensor t = { 0 };
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = FT_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = data;
    t.nbytes = (size_t)(rows * cols) * sizeof(float);
    return t;
}
