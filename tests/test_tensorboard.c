/* test_tensorboard.c — the event files' bytes against known vectors: CRC-32C
 * (RFC 3720's and the usual check value), the masked CRC and the TFRecord
 * framing as TensorBoard's own reader computes them, an Event as protobuf's
 * own encoder writes it (the bytes below are event_pb2.Event(wall_time=1.5,
 * step=300, summary=...).SerializeToString()), the reader's view of a torn
 * or damaged record, and a resumed writer's cut of the steps after its
 * checkpoint. TensorBoard reading whole runs is tests/cli_tensorboard.sh. */
#include "ftune.h"
#include "check.h"
#include "core/core.h"
#include "core/crc32c.h"
#include "train/tensorboard.h"

#include <dirent.h>
#include <unistd.h>

static char tmpdir[256];

static void test_crc32c_vectors(void) {
    CHECK(ft_crc32c(0, "123456789", 9) == 0xe3069283u);
    CHECK(ft_crc32c(0, "", 0) == 0);
    uint8_t b[32];
    memset(b, 0, sizeof b);
    CHECK(ft_crc32c(0, b, 32) == 0x8a9136aau);   /* RFC 3720 B.4: 32 bytes of zeros */
    memset(b, 0xff, sizeof b);
    CHECK(ft_crc32c(0, b, 32) == 0x62a8ab43u);   /* 32 bytes of 0xff */
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    CHECK(ft_crc32c(0, b, 32) == 0x46dd794eu);   /* 0, 1, ..., 31 */
    CHECK(ft_crc32c(ft_crc32c(0, "1234", 4), "56789", 5) == 0xe3069283u); /* continued */
}

static void test_tfrecord_framing(void) {
    CHECK(ft_tb_masked_crc("123456789", 9) == 0xc78ab0e5u);
    static const uint8_t want[] = { 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xea, 0xb2, 0x04, 0x3e, 0x68,
                                    0x65, 0x6c, 0x6c, 0x6f, 0xbb, 0x1f, 0x1c, 0x19 };
    uint8_t rec[64];
    CHECK(ft_tb_frame(rec, "hello", 5) == sizeof want);
    CHECK(memcmp(rec, want, sizeof want) == 0);
    size_t off = 0, n;
    const uint8_t *data;
    bool torn;
    CHECK(ft_tb_next_record(rec, sizeof want, &off, &data, &n, &torn) && n == 5 && memcmp(data, "hello", 5) == 0);
    CHECK(!ft_tb_next_record(rec, sizeof want, &off, &data, &n, &torn) && !torn); /* a clean end */
    for (size_t cut = 1; cut < sizeof want; cut++) {    /* every short read is torn, never a record */
        off = 0;
        CHECKF(!ft_tb_next_record(rec, cut, &off, &data, &n, &torn) && torn && off == 0, "cut %zu", cut);
    }
    for (size_t i = 0; i < sizeof want; i++) {          /* every damaged byte fails a CRC */
        rec[i] ^= 0x10;
        off = 0;
        CHECKF(!ft_tb_next_record(rec, sizeof want, &off, &data, &n, &torn) && torn, "byte %zu", i);
        rec[i] ^= 0x10;
    }
}

/* the records of path: their steps into steps (at most cap), the count, -1 if one is torn */
static int read_steps(const char *path, int64_t *steps, int cap, uint8_t *last, size_t *last_n) {
    char *text;
    size_t len;
    if (ft_read_file(path, &text, &len)) return -1;
    size_t off = 0, n;
    const uint8_t *data;
    bool torn;
    int k = 0;
    while (ft_tb_next_record((const uint8_t *)text, len, &off, &data, &n, &torn) && k < cap) {
        if (!ft_tb_event_step(data, n, &steps[k++])) k = -1000;
        if (last && n <= 256) { memcpy(last, data, n); *last_n = n; }
    }
    free(text);
    return torn ? -1 : k;
}

/* the one events file in tmpdir into path */
static int events_path(char *path, size_t cap) {
    DIR *d = opendir(tmpdir);
    int k = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (ft_tb_is_events_file(e->d_name) && ++k) snprintf(path, cap, "%s/%s", tmpdir, e->d_name);
    if (d) closedir(d);
    return k;
}

static void test_event_bytes(void) {
    static const uint8_t want[] = { 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, 0x10, 0xac, 0x02, 0x2a, 0x13,
                                    0x0a, 0x11, 0x0a, 0x0a, 0x74, 0x72, 0x61, 0x69, 0x6e, 0x2f, 0x6c, 0x6f, 0x73, 0x73,
                                    0x15, 0x00, 0x00, 0x20, 0x40 };
    int64_t step;
    CHECK(ft_tb_event_step(want, sizeof want, &step) && step == 300);
    CHECK(!ft_tb_event_step(want, sizeof want - 1, &step)); /* a field cut short */
    ft_tb_writer w;
    CHECK_OK(ft_tb_open(&w, tmpdir, -1, 4));
    ft_tb_begin(&w, 1.5, 300);
    ft_tb_scalar(&w, "train/loss", 2.5f);
    CHECK_OK(ft_tb_flush(&w));
    ft_tb_close(&w);
    char path[4400];
    CHECK(events_path(path, sizeof path) == 1);
    int64_t steps[4];
    uint8_t last[256];
    size_t last_n = 0;
    CHECK(read_steps(path, steps, 4, last, &last_n) == 2 && steps[0] == 0 && steps[1] == 300);
    CHECK(last_n == sizeof want && memcmp(last, want, sizeof want) == 0);
    /* the first record: wall_time, file_version "brain.Event:2" */
    char *text;
    size_t len;
    CHECK_OK(ft_read_file(path, &text, &len));
    CHECK(len > 12 + 9 + 2 + 13 && text[12] == 0x09 && text[21] == 0x1a && text[22] == 13 &&
          memcmp(text + 23, FT_TB_VERSION, 13) == 0);
    free(text);
    CHECK_OK(ft_tb_remove_all(tmpdir));
    CHECK(ft_tb_count_files(tmpdir) == 0);
}

/* steps 1..5, a torn record after them; a writer resumed at step 3 keeps
 * the version record and steps 1..3, then appends to the same file */
static void test_resume_cut(void) {
    ft_tb_writer w;
    CHECK_OK(ft_tb_open(&w, tmpdir, -1, 2));
    for (int s = 1; s <= 5; s++) {
        ft_tb_begin(&w, 1000.0 + s, s);
        ft_tb_scalar(&w, "train/loss", (float)s);
        ft_tb_scalar(&w, "eval/loss", (float)-s);
        ft_tb_scalar(&w, "dropped/past_max_values", 0);
        CHECK_OK(ft_tb_flush(&w));
    }
    CHECK(write(w.fd, "\x20\0\0\0\0\0\0\0\1\2", 10) == 10); /* a crash part-way through a record */
    ft_tb_close(&w);
    char path[4400];
    int64_t steps[16];
    CHECK(events_path(path, sizeof path) == 1);
    CHECK(read_steps(path, steps, 16, NULL, NULL) == -1);
    CHECK_OK(ft_tb_open(&w, tmpdir, 3, 2));
    ft_tb_begin(&w, 2000.0, 4);
    ft_tb_scalar(&w, "train/loss", 4.5f);
    CHECK_OK(ft_tb_flush(&w));
    ft_tb_close(&w);
    char again[4400];
    CHECK(events_path(again, sizeof again) == 1 && strcmp(again, path) == 0);
    int k = read_steps(path, steps, 16, NULL, NULL);
    CHECKF(k == 5 && steps[0] == 0 && steps[1] == 1 && steps[2] == 2 && steps[3] == 3 && steps[4] == 4, "%d records", k);
    /* resumed at step 0 of an empty directory: a new file with its version record */
    CHECK_OK(ft_tb_remove_all(tmpdir));
    CHECK_OK(ft_tb_open(&w, tmpdir, 0, 2));
    ft_tb_close(&w);
    CHECK(events_path(path, sizeof path) == 1 && read_steps(path, steps, 16, NULL, NULL) == 1);
    CHECK_OK(ft_tb_remove_all(tmpdir));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune_test_tb_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    RUN(test_crc32c_vectors);
    RUN(test_tfrecord_framing);
    RUN(test_event_bytes);
    RUN(test_resume_cut);
    rmdir(tmpdir);
    CHECK_EXIT();
}
