/* dist_one.c — dist.h for a build without MPI: a one-rank job, where every
 * collective leaves its buffers as the one rank's sum, gather or copy. */
#include "dist/dist.h"
#include "dist/dist_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A launcher's size variable: more than one rank means mpirun started
 * this build, which cannot take part in the job. */
static long launcher_size(void) {
    const char *names[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return strtol(v, NULL, 10);
    }
    return 1;
}

ftune_status ft_dist_init(void) {
    long n = launcher_size();
    if (n > 1)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "this ftune was built without MPI (make MPI=0 or no mpicc), but a launcher "
                      "started it as one of %ld ranks: each would train alone and write the same files. Rebuild with "
                      "MPI (apt-get install libopenmpi-dev; make MPI=1) or run it without mpirun", n);
    return FTUNE_OK;
}

void ft_dist_finalize(void) {}
/* kept for the caller's save and restore: one rank never waits */
static double g_timeout;
double ft_dist_set_timeout(double seconds) { double t = g_timeout; g_timeout = seconds; return t; }
void ft_dist_set_phase(const char *fmt, ...) { (void)fmt; }
_Noreturn void ft_dist_abort(int code) { exit(code); }
int ft_dist_rank(void) { return 0; }
int ft_dist_world(void) { return 1; }
bool ft_dist_is_mpi(void) { return false; }
const char *ft_dist_backend_name(void) { return "none"; }

ftune_status ft_dist_allreduce_sum_f32(float *buf, int64_t n, int64_t chunk) {
    (void)buf; (void)chunk;
    ft_dist_count(FT_DIST_ALLREDUCE, (uint64_t)n * sizeof(float));
    return FTUNE_OK;
}
ftune_status ft_dist_allreduce_sum_f64(double *buf, int n) { (void)buf; (void)n; return FTUNE_OK; }
ftune_status ft_dist_allreduce_sum_i64(int64_t *buf, int n) { (void)buf; (void)n; return FTUNE_OK; }
ftune_status ft_dist_allreduce_max_i32(int *buf, int n) { (void)buf; (void)n; return FTUNE_OK; }

ftune_status ft_dist_reduce_scatter_sum_f32(float *buf, const int64_t *off, int64_t chunk) {
    (void)buf; (void)chunk;
    ft_dist_count(FT_DIST_REDUCE_SCATTER, (uint64_t)off[1] * sizeof(float));
    return FTUNE_OK;
}
ftune_status ft_dist_allgather_f32(float *buf, const int64_t *off, int64_t chunk) {
    (void)buf; (void)chunk;
    ft_dist_count(FT_DIST_ALLGATHER, (uint64_t)off[1] * sizeof(float));
    return FTUNE_OK;
}
ftune_status ft_dist_gather_f32(float *full, const float *mine, const int64_t *off, int root, int64_t chunk) {
    (void)root; (void)chunk;
    if (full != mine) memmove(full, mine, (size_t)off[1] * sizeof(float));
    return FTUNE_OK;
}
ftune_status ft_dist_scatter_f32(const float *full, float *mine, const int64_t *off, int root, int64_t chunk) {
    (void)root; (void)chunk;
    if (full != mine) memmove(mine, full, (size_t)off[1] * sizeof(float));
    return FTUNE_OK;
}
ftune_status ft_dist_bcast(void *buf, size_t bytes, int root) { (void)buf; (void)bytes; (void)root; return FTUNE_OK; }

ftune_status ft_dist_ireduce_scatter_sum_f32(const float *send, float *recv, const int64_t *off, ft_dist_req **req) {
    ft_dist_count(FT_DIST_REDUCE_SCATTER, (uint64_t)off[1] * sizeof(float));
    if (recv != send) memmove(recv, send, (size_t)off[1] * sizeof(float));
    *req = NULL;
    return FTUNE_OK;
}
ftune_status ft_dist_test(ft_dist_req *req) { (void)req; return FTUNE_OK; }
ftune_status ft_dist_wait(ft_dist_req *req) { (void)req; return FTUNE_OK; }
