/* tensorboard.h — TensorBoard event files written by the trainer: TFRecord
 * framing (length, masked CRC-32C of it, data, masked CRC-32C of the data)
 * around Event protobufs encoded by hand (wall_time = 1, step = 2,
 * file_version = 3, summary = 5; Summary.value = 1; Value.tag = 1,
 * Value.simple_value = 2). Only what scalars need.
 *
 * Files in the directory: events.out.tfevents.<unix time>.<hostname>[.N],
 * the first record of each an Event with file_version "brain.Event:2".
 * One Event per optimizer step holds every scalar of that step, appended
 * as one record with one write(2) and fdatasync'd: a reader sees a step
 * whole or not at all (a record still being written fails its length or
 * CRC, and TensorBoard's reader waits for the rest). The files are not
 * rewritten per flush (a temp + rename would cost the whole file per step
 * and leave a reader that holds the old file, as TensorFlow's does, on a
 * file that no longer grows); they are rewritten, through a temporary and a
 * rename, only when a run resumes: ft_tb_open cuts every step after the
 * checkpoint's (and a record a crash left torn) from every events file of
 * the directory, so no step is in the run twice. */
#ifndef FT_TENSORBOARD_H
#define FT_TENSORBOARD_H

#include "core/core.h"

#define FT_TB_VERSION "brain.Event:2"
#define FT_TB_PREFIX "events.out.tfevents."
#define FT_TB_TAG_MAX 64 /* the longest tag, with its NUL */

typedef struct {
    int fd;            /* the events file, O_APPEND; -1 when closed */
    char path[4300];
    uint8_t *ev;       /* the Event being built (cap bytes), its record header before it */
    size_t len, cap;   /* of ev */
    size_t sum_at;     /* where the summary's values start in ev */
    int n_values, max_values;
} ft_tb_writer;

/* Whether a directory entry is an events file TensorBoard reads. */
bool ft_tb_is_events_file(const char *name);

/* The masked CRC-32C of a TFRecord: ((c >> 15) | (c << 17)) + 0xa282ead8. */
uint32_t ft_tb_masked_crc(const void *p, size_t n);
/* The TFRecord of n bytes of data into out (n + 16 bytes); returns n + 16. */
size_t ft_tb_frame(uint8_t *out, const void *data, size_t n);
/* The next record of buf[*off, len) into *data, *n, advancing *off; false
 * at the end, or at a record that is short or fails a CRC (*torn then
 * says which: false at a clean end). */
bool ft_tb_next_record(const uint8_t *buf, size_t len, size_t *off, const uint8_t **data, size_t *n, bool *torn);
/* The step field of an encoded Event (0 when absent); false if it does not
 * parse as a protobuf message. */
bool ft_tb_event_step(const uint8_t *ev, size_t n, int64_t *step);

/* Opens the run's events in dir (which exists) for up to max_values scalars
 * a step. keep_step < 0: a new run, a new file (dir holds no events files:
 * the caller has checked). keep_step >= 0: a resumed run: every events file
 * in dir is cut to its records up to keep_step, the newest is appended to
 * (a new file if there is none). Errors name the file. */
FTUNE_MUST_USE ftune_status ft_tb_open(ft_tb_writer *w, const char *dir, int64_t keep_step, int max_values);
/* Starts the Event of a step, then adds its scalars (tags of at most
 * FT_TB_TAG_MAX - 1 bytes; past max_values they are dropped, an error of
 * ours), then writes it as one record. */
void ft_tb_begin(ft_tb_writer *w, double wall_time, int64_t step);
void ft_tb_scalar(ft_tb_writer *w, const char *tag, float v);
FTUNE_MUST_USE ftune_status ft_tb_flush(ft_tb_writer *w);
/* Closes the file; a writer never opened (zeroed, or fd -1) too. */
void ft_tb_close(ft_tb_writer *w);
/* Removes every events file in dir (--overwrite). */
FTUNE_MUST_USE ftune_status ft_tb_remove_all(const char *dir);
/* How many events files dir holds (-1 when it cannot be read). */
int ft_tb_count_files(const char *dir);

#endif
