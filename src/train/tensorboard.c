/* tensorboard.c — the trainer's TensorBoard event files (tensorboard.h):
 * the TFRecord framing, the few protobuf fields an Event of scalars needs,
 * and the cut a resumed run makes. */
#include "train/tensorboard.h"

#include "core/crc32c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ev's head: the record header (length, its CRC) and the Event's fields
 * before the summary's values, written right-aligned against HEAD at flush
 * when the summary's length is known: wall_time (1 + 8), step (1 + up to
 * 10), the summary's key and length (1 + up to 5) */
#define REC_HEAD 12
#define HEAD (REC_HEAD + 9 + 11 + 6)
#define VALUE_MAX (2 + 2 + (FT_TB_TAG_MAX - 1) + 5) /* Summary.value key + length, Value.tag, simple_value */

bool ft_tb_is_events_file(const char *name) { return strncmp(name, FT_TB_PREFIX, strlen(FT_TB_PREFIX)) == 0; }

uint32_t ft_tb_masked_crc(const void *p, size_t n) {
    uint32_t c = ft_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t get_u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* the record header of an n-byte record at out (12 bytes) */
static void rec_head(uint8_t *out, size_t n) {
    put_u64(out, (uint64_t)n);
    put_u32(out + 8, ft_tb_masked_crc(out, 8));
}

size_t ft_tb_frame(uint8_t *out, const void *data, size_t n) {
    rec_head(out, n);
    memcpy(out + REC_HEAD, data, n);
    put_u32(out + REC_HEAD + n, ft_tb_masked_crc(data, n));
    return n + 16;
}

bool ft_tb_next_record(const uint8_t *buf, size_t len, size_t *off, const uint8_t **data, size_t *n, bool *torn) {
    size_t o = *off, left = len - o;
    *torn = left > 0;
    if (left < REC_HEAD) return false;
    uint64_t k = get_u64(buf + o);
    if (left < REC_HEAD + 4 || get_u32(buf + o + 8) != ft_tb_masked_crc(buf + o, 8) || k > left - REC_HEAD - 4) return false;
    if (get_u32(buf + o + REC_HEAD + k) != ft_tb_masked_crc(buf + o + REC_HEAD, (size_t)k)) return false;
    *data = buf + o + REC_HEAD;
    *n = (size_t)k;
    *off = o + REC_HEAD + (size_t)k + 4;
    *torn = false;
    return true;
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

static bool get_varint(const uint8_t *p, size_t n, size_t *o, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *o < n; shift += 7) {
        uint8_t b = p[(*o)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return true;
    }
    return false;
}

bool ft_tb_event_step(const uint8_t *ev, size_t n, int64_t *step) {
    *step = 0;
    for (size_t o = 0; o < n;) {
        uint64_t key, v;
        if (!get_varint(ev, n, &o, &key)) return false;
        switch (key & 7) {
        case 0:
            if (!get_varint(ev, n, &o, &v)) return false;
            if (key >> 3 == 2) *step = (int64_t)v;
            break;
        case 1: if (n - o < 8) return false; o += 8; break;
        case 5: if (n - o < 4) return false; o += 4; break;
        case 2:
            if (!get_varint(ev, n, &o, &v) || v > n - o) return false;
            o += (size_t)v;
            break;
        default: return false;
        }
    }
    return true;
}

/* Writes all n bytes at p to fd, then fdatasync. */
static FTUNE_MUST_USE ftune_status write_all(int fd, const void *p, size_t n, const char *path) {
    const char *s = p;
    while (n > 0) {
        ssize_t k = write(fd, s, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ft_err(FTUNE_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        s += k;
        n -= (size_t)k;
    }
    if (fdatasync(fd) != 0) return ft_err(FTUNE_ERR_IO, "%s: fdatasync failed: %s", path, strerror(errno));
    return FTUNE_OK;
}

/* The first record of a file: an Event with the wall time and file_version. */
static FTUNE_MUST_USE ftune_status write_version(ft_tb_writer *w) {
    uint8_t ev[64], rec[80];
    size_t n = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double wall = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    uint64_t bits;
    memcpy(&bits, &wall, 8);
    ev[n++] = 0x09;
    put_u64(ev + n, bits);
    n += 8;
    ev[n++] = 0x1a;
    ev[n++] = (uint8_t)strlen(FT_TB_VERSION);
    memcpy(ev + n, FT_TB_VERSION, strlen(FT_TB_VERSION));
    n += strlen(FT_TB_VERSION);
    return write_all(w->fd, rec, ft_tb_frame(rec, ev, n), w->path);
}

/* A new events.out.tfevents.<time>.<host>[.N] in dir, its version record written. */
static FTUNE_MUST_USE ftune_status create_file(ft_tb_writer *w, const char *dir) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long t = (long)time(NULL);
    for (int k = 0; k < 1000; k++) {
        char sfx[16] = "";
        if (k) snprintf(sfx, sizeof sfx, ".%d", k);
        snprintf(w->path, sizeof w->path, "%s/" FT_TB_PREFIX "%ld.%s%s", dir, t, host, sfx);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (w->fd >= 0) return write_version(w);
        if (errno != EEXIST) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
    }
    return ft_err(FTUNE_ERR_IO, "%s: cannot create: too many events files of second %ld", w->path, t);
}

/* Cuts the events file at path to its whole records of steps <= keep_step
 * (through a temporary and a rename, only if anything goes); *records
 * receives how many stay. */
static FTUNE_MUST_USE ftune_status cut_file(const char *dir, const char *path, int64_t keep_step, int *records) {
    char *text;
    size_t len;
    ftune_status st = ft_read_file(path, &text, &len);
    if (st) return st;
    const uint8_t *buf = (const uint8_t *)text;
    uint8_t *keep = malloc(len + 1);
    if (!keep) {
        free(text);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for %s", path);
    }
    size_t off = 0, nkeep = 0, at = 0;
    const uint8_t *data;
    size_t n;
    bool torn;
    *records = 0;
    while (ft_tb_next_record(buf, len, &off, &data, &n, &torn)) {
        int64_t step;
        if (ft_tb_event_step(data, n, &step) && step <= keep_step) {
            memcpy(keep + nkeep, buf + at, off - at);
            nkeep += off - at;
            ++*records;
        }
        at = off;
    }
    free(text);
    if (nkeep < len) {
        /* the temporary's name has no "tfevents": TensorBoard reads every file whose name does */
        char tmp[4400];
        snprintf(tmp, sizeof tmp, "%s/.ftune-events-cut.tmp.%ld", dir, (long)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) st = ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        else {
            st = write_all(fd, keep, nkeep, tmp);
            if (close(fd) != 0 && !st) st = ft_err(FTUNE_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
            if (!st && rename(tmp, path) != 0)
                st = ft_err(FTUNE_ERR_IO, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
            if (st) unlink(tmp);
        }
    }
    free(keep);
    return st;
}

ftune_status ft_tb_open(ft_tb_writer *w, const char *dir, int64_t keep_step, int max_values) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->max_values = max_values;
    w->cap = HEAD + (size_t)max_values * VALUE_MAX + 4;
    w->ev = malloc(w->cap);
    if (!w->ev) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    w->len = w->sum_at = HEAD;
    if (keep_step < 0) return create_file(w, dir);
    DIR *d = opendir(dir);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", dir, strerror(errno));
    char newest[256] = "";
    int newest_records = 0;
    ftune_status st = FTUNE_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        if (!ft_tb_is_events_file(e->d_name) || strlen(e->d_name) >= sizeof newest) continue;
        char path[4400];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        int records;
        st = cut_file(dir, path, keep_step, &records);
        if (!st && strcmp(e->d_name, newest) > 0) {
            snprintf(newest, sizeof newest, "%s", e->d_name);
            newest_records = records;
        }
    }
    closedir(d);
    if (st) return st;
    if (!*newest) return create_file(w, dir);
    snprintf(w->path, sizeof w->path, "%s/%s", dir, newest);
    w->fd = open(w->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (w->fd < 0) return ft_err(FTUNE_ERR_IO, "%s: cannot open: %s", w->path, strerror(errno));
    return newest_records ? FTUNE_OK : write_version(w);
}

void ft_tb_begin(ft_tb_writer *w, double wall_time, int64_t step) {
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    w->len = HEAD;
    w->n_values = 0;
    /* wall_time and step go in at flush, before the summary; keep them in the head's room */
    put_u64(w->ev, bits);
    put_u64(w->ev + 8, (uint64_t)step);
}

void ft_tb_scalar(ft_tb_writer *w, const char *tag, float v) {
    size_t t = strlen(tag);
    if (w->n_values >= w->max_values || t >= FT_TB_TAG_MAX) return;
    uint8_t *p = w->ev + w->len;
    size_t n = 0;
    p[n++] = 0x0a;                   /* Summary.value */
    p[n++] = (uint8_t)(2 + t + 5);   /* its length (< 128) */
    p[n++] = 0x0a;                   /* Value.tag */
    p[n++] = (uint8_t)t;
    memcpy(p + n, tag, t);
    n += t;
    p[n++] = 0x15;                   /* Value.simple_value, a float */
    uint32_t bits;
    memcpy(&bits, &v, 4);
    put_u32(p + n, bits);
    n += 4;
    w->len += n;
    w->n_values++;
}

ftune_status ft_tb_flush(ft_tb_writer *w) {
    uint64_t wall = get_u64(w->ev), step = get_u64(w->ev + 8);
    uint8_t head[HEAD - REC_HEAD];
    size_t h = 0;
    head[h++] = 0x09;                /* Event.wall_time, a double */
    put_u64(head + h, wall);
    h += 8;
    head[h++] = 0x10;                /* Event.step, a varint */
    h += put_varint(head + h, step);
    head[h++] = 0x2a;                /* Event.summary */
    h += put_varint(head + h, (uint64_t)(w->len - HEAD));
    size_t start = HEAD - h, n = w->len - start;
    memcpy(w->ev + start, head, h);
    rec_head(w->ev + start - REC_HEAD, n);
    put_u32(w->ev + w->len, ft_tb_masked_crc(w->ev + start, n));
    return write_all(w->fd, w->ev + start - REC_HEAD, n + 16, w->path);
}

void ft_tb_close(ft_tb_writer *w) {
    if (w->ev && w->fd >= 0) close(w->fd);
    free(w->ev);
    w->ev = NULL;
    w->fd = -1;
}

ftune_status ft_tb_remove_all(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", dir, strerror(errno));
    ftune_status st = FTUNE_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        if (!ft_tb_is_events_file(e->d_name)) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) st = ft_err(FTUNE_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    closedir(d);
    return st;
}

int ft_tb_count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += ft_tb_is_events_file(e->d_name);
    closedir(d);
    return n;
}
