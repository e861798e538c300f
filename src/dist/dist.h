/* dist.h — the communication seam of data-parallel training: this
 * process's rank in the job, the job's size, and the few collectives the
 * trainer needs on f32 (and small integer / double) buffers. Two
 * implementations with one interface: dist_mpi.c (Open MPI, when the build
 * has MPI and the process was started by mpirun or srun) and dist_one.c
 * (a build without MPI: every collective is the identity of a one-rank job).
 * A process not started by a launcher is a one-rank job in either build, so
 * `ftune train` and `mpirun -np 1 ftune train` run the same code.
 *
 * MPI's world is per process, so this state is too (not a context): it is
 * set up once by ft_dist_init and read everywhere else.
 *
 * Ownership of a flat array of n elements split over W ranks: rank r owns
 * [off[r], off[r+1]) with off from ft_dist_shard (contiguous, in rank
 * order, sizes differing by at most one).
 *
 * Every collective counts the bytes it hands to the network per rank as a
 * ring algorithm moves them (ft_dist_counters): all-reduce 2(W-1)/W of the
 * buffer, reduce-scatter and all-gather (W-1)/W, broadcast the buffer once;
 * with W = 1 nothing moves. */
#ifndef FT_DIST_H
#define FT_DIST_H

#include "core/core.h"

/* Joins the job if a launcher started this process (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMIx or Slurm's PMI variables) and the build has
 * MPI; otherwise a one-rank job. A launcher's variables in a build without
 * MPI, with more than one rank, are an error (each process would train
 * alone and write the same files). Idempotent. */
FTUNE_MUST_USE ftune_status ft_dist_init(void);
/* Leaves the job (MPI_Finalize); the one-rank case does nothing. */
void ft_dist_finalize(void);
/* Ends every rank of the job with code (MPI_Abort): used after a rank has
 * reported an error that the others cannot know of, so that none of them
 * waits for it forever. The one-rank case exits. */
_Noreturn void ft_dist_abort(int code);
/* Marks (and tells) that every rank has seen the current failure: see
 * ftune_dist_failed_together. */
void ft_dist_set_failed_together(void);
bool ft_dist_failed_together(void);

int ft_dist_rank(void);
int ft_dist_world(void);
/* Whether the job is an MPI job (even of one rank). */
bool ft_dist_is_mpi(void);
/* "Open MPI 4.1.4" or "none". */
const char *ft_dist_backend_name(void);

/* off (world + 1 entries): rank r owns [off[r], off[r+1]) of n elements. */
void ft_dist_shard(int64_t n, int world, int64_t *off);

/* The collective timeout: a rank that has waited seconds in one collective
 * for the others gives up (0: waits forever, the default). It then asks
 * the other ranks, over a side channel, where they are: a rank waiting in a
 * collective answers with the call it is in, one that computes, is stopped
 * or is stuck does not. The collective returns FTUNE_ERR_IO naming the
 * collective, the phase (ft_dist_set_phase), the seconds and the ranks it
 * waited for; the ranks that answered return the same finding. The job
 * cannot go on (requests are left in flight, later collectives fail at
 * once): the caller ends it with ft_dist_abort. While it waits a rank
 * polls MPI_Test, busily for the first 20 ms (as a blocking collective
 * does) and then with sleeps growing to 1 ms between polls. Returns the
 * previous timeout. */
double ft_dist_set_timeout(double seconds);
/* What the caller is doing ("step 5", "checkpoint-4"), named in a
 * timeout's message (printf format; at most 95 characters are kept). */
void ft_dist_set_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Collectives: every rank calls each with the same sizes, in the same order.
 * chunk: the most elements one call to MPI moves (a bucket; <= 0 means the
 * default 4M). Errors (a failed MPI call) name the collective. */
FTUNE_MUST_USE ftune_status ft_dist_allreduce_sum_f32(float *buf, int64_t n, int64_t chunk);
FTUNE_MUST_USE ftune_status ft_dist_allreduce_sum_f64(double *buf, int n);
FTUNE_MUST_USE ftune_status ft_dist_allreduce_sum_i64(int64_t *buf, int n);
FTUNE_MUST_USE ftune_status ft_dist_allreduce_max_i32(int *buf, int n);
/* buf (off[world]) on every rank: afterwards buf[off[rank] .. off[rank+1])
 * holds the sum over ranks of that range; the rest of buf is unspecified. */
FTUNE_MUST_USE ftune_status ft_dist_reduce_scatter_sum_f32(float *buf, const int64_t *off, int64_t chunk);
/* buf (off[world]): each rank's own range is sent to all; afterwards every
 * rank's buf holds every range. */
FTUNE_MUST_USE ftune_status ft_dist_allgather_f32(float *buf, const int64_t *off, int64_t chunk);
/* Root's full (off[world]) receives each rank's mine (off[r+1] - off[r]);
 * full is only read on root (NULL elsewhere). */
FTUNE_MUST_USE ftune_status ft_dist_gather_f32(float *full, const float *mine, const int64_t *off, int root, int64_t chunk);
/* The reverse: root's full is split into each rank's mine. */
FTUNE_MUST_USE ftune_status ft_dist_scatter_f32(const float *full, float *mine, const int64_t *off, int root, int64_t chunk);
FTUNE_MUST_USE ftune_status ft_dist_bcast(void *buf, size_t bytes, int root);

/* A non-blocking reduce-scatter in one call (no rounds: off[world] must fit
 * an int): recv (off[rank+1] - off[rank]) gets the sum over ranks of that
 * range of send (off[world]); neither may be touched until ft_dist_wait.
 * Every rank starts its non-blocking and blocking collectives in the same
 * order. ft_dist_test lets MPI progress it (Open MPI moves a non-blocking
 * collective only inside MPI calls); the one-rank case copies at once. */
typedef struct ft_dist_req ft_dist_req;
FTUNE_MUST_USE ftune_status ft_dist_ireduce_scatter_sum_f32(const float *send, float *recv, const int64_t *off, ft_dist_req **req);
FTUNE_MUST_USE ftune_status ft_dist_test(ft_dist_req *req);
/* Waits for req and frees it (NULL: nothing). A wait that fails or times
 * out leaves req in flight and not freed: neither may its buffers be. */
FTUNE_MUST_USE ftune_status ft_dist_wait(ft_dist_req *req);

typedef struct {
    uint64_t allreduce_bytes, reduce_scatter_bytes, allgather_bytes, other_bytes; /* sent by this rank (ring model) */
    uint64_t payload_bytes; /* the buffers handed to the collectives, whatever they move */
    uint64_t calls;         /* MPI calls made */
} ft_dist_counters;

void ft_dist_get_counters(ft_dist_counters *c);
void ft_dist_reset_counters(void);

#endif
