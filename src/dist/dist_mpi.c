/* dist_mpi.c — dist.h on MPI (built with MPI=1: mpicc's flags). A process
 * that no launcher started is a one-rank job without MPI_Init, so that
 * plain `ftune train` never needs an MPI runtime (nor, as root, Open MPI's
 * run-as-root permission).
 *
 * Collectives on long f32 buffers run in rounds of at most `chunk`
 * elements in all (a bucket): MPI counts are ints, and a bounded scratch
 * buffer (grown once, kept) packs the ranks' pieces of a round in rank
 * order. Errors return (MPI_ERRORS_RETURN) with the collective's name; a
 * rank that dies is the launcher's to handle: Open MPI's mpirun ends the
 * whole job when one process exits abnormally. */
#include "dist/dist.h"
#include "dist/dist_impl.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    bool init, mpi;
    int rank, world;
    char name[64];
    float *scratch;
    int64_t scratch_n;
    int *cnt, *displ;    /* (world) */
} g = { .world = 1 };

static bool launched(void) {
    const char *names[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return true;
    }
    return false;
}

static FTUNE_MUST_USE ftune_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return ft_err(FTUNE_ERR_IO, "rank %d of %d: %s failed: %s", g.rank, g.world, what, msg);
}
#define MPI_TRY(call, what) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, what); } while (0)

ftune_status ft_dist_init(void) {
    if (g.init) return FTUNE_OK;
    snprintf(g.name, sizeof g.name, "none");
    if (!launched()) {
        g.init = true;
        return FTUNE_OK;
    }
    int flag = 0;
    MPI_Initialized(&flag);
    if (!flag && MPI_Init(NULL, NULL) != MPI_SUCCESS) return ft_err(FTUNE_ERR_IO, "MPI_Init failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.world);
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    ver[strcspn(ver, ",\n")] = 0;
    snprintf(g.name, sizeof g.name, "%s", ver);
    g.cnt = malloc((size_t)g.world * sizeof *g.cnt);
    g.displ = malloc((size_t)g.world * sizeof *g.displ);
    if (!g.cnt || !g.displ) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    g.mpi = g.init = true;
    return FTUNE_OK;
}

void ft_dist_finalize(void) {
    if (g.mpi) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
    }
    free(g.scratch);
    free(g.cnt);
    free(g.displ);
    g.scratch = NULL;
    g.cnt = g.displ = NULL;
    g.scratch_n = 0;
    g.mpi = false;
    g.world = 1;
    g.rank = 0;
}

_Noreturn void ft_dist_abort(int code) {
    if (g.mpi) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

int ft_dist_rank(void) { return g.rank; }
int ft_dist_world(void) { return g.world; }
bool ft_dist_is_mpi(void) { return g.mpi; }
const char *ft_dist_backend_name(void) { return g.mpi ? g.name : "none"; }

static int64_t chunk_of(int64_t chunk) {
    if (chunk <= 0) chunk = FT_DIST_DEFAULT_CHUNK;
    if (chunk > (int64_t)1 << 30) chunk = (int64_t)1 << 30; /* an int count, in any datatype */
    return chunk < g.world ? g.world : chunk;
}

static FTUNE_MUST_USE ftune_status scratch(int64_t n) {
    if (n <= g.scratch_n) return FTUNE_OK;
    float *p = realloc(g.scratch, (size_t)n * sizeof(float));
    if (!p) return ft_err(FTUNE_ERR_NOMEM, "out of memory for a communication bucket of %lld floats", (long long)n);
    g.scratch = p;
    g.scratch_n = n;
    return FTUNE_OK;
}

ftune_status ft_dist_allreduce_sum_f32(float *buf, int64_t n, int64_t chunk) {
    ft_dist_count(FT_DIST_ALLREDUCE, (uint64_t)n * sizeof(float));
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    chunk = chunk_of(chunk);
    for (int64_t i = 0; i < n; i += chunk) {
        int k = (int)(n - i < chunk ? n - i : chunk);
        ft_dist_count_call();
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf + i, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "all-reduce");
    }
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status small(void *buf, int n, MPI_Datatype t, MPI_Op op, const char *what) {
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    ft_dist_count_call();
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, buf, n, t, op, MPI_COMM_WORLD), what);
    return FTUNE_OK;
}
ftune_status ft_dist_allreduce_sum_f64(double *buf, int n) { return small(buf, n, MPI_DOUBLE, MPI_SUM, "all-reduce"); }
ftune_status ft_dist_allreduce_sum_i64(int64_t *buf, int n) { return small(buf, n, MPI_INT64_T, MPI_SUM, "all-reduce"); }
ftune_status ft_dist_allreduce_max_i32(int *buf, int n) { return small(buf, n, MPI_INT, MPI_MAX, "all-reduce (max)"); }

/* Round j of a chunked collective over shards off: each rank's piece is
 * [off[r] + j*S, +cnt[r]) of the flat array; displ packs them in order.
 * Returns false when no rank has anything left. */
static bool round_layout(const int64_t *off, int64_t S, int64_t j) {
    bool any = false;
    int d = 0;
    for (int r = 0; r < g.world; r++) {
        int64_t len = off[r + 1] - off[r] - j * S;
        g.cnt[r] = (int)(len <= 0 ? 0 : len < S ? len : S);
        g.displ[r] = d;
        d += g.cnt[r];
        any |= g.cnt[r] > 0;
    }
    return any;
}

ftune_status ft_dist_reduce_scatter_sum_f32(float *buf, const int64_t *off, int64_t chunk) {
    ft_dist_count(FT_DIST_REDUCE_SCATTER, (uint64_t)off[g.world] * sizeof(float));
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    chunk = chunk_of(chunk);
    int64_t S = chunk / g.world;
    if (scratch(chunk)) return FTUNE_ERR_NOMEM;
    for (int64_t j = 0; round_layout(off, S, j); j++) {
        for (int r = 0; r < g.world; r++)
            memcpy(g.scratch + g.displ[r], buf + off[r] + j * S, (size_t)g.cnt[r] * sizeof(float));
        ft_dist_count_call();
        MPI_TRY(MPI_Reduce_scatter(MPI_IN_PLACE, g.scratch, g.cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "reduce-scatter");
        memcpy(buf + off[g.rank] + j * S, g.scratch, (size_t)g.cnt[g.rank] * sizeof(float));
    }
    return FTUNE_OK;
}

ftune_status ft_dist_allgather_f32(float *buf, const int64_t *off, int64_t chunk) {
    ft_dist_count(FT_DIST_ALLGATHER, (uint64_t)off[g.world] * sizeof(float));
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    chunk = chunk_of(chunk);
    int64_t S = chunk / g.world;
    if (scratch(chunk)) return FTUNE_ERR_NOMEM;
    for (int64_t j = 0; round_layout(off, S, j); j++) {
        memcpy(g.scratch + g.displ[g.rank], buf + off[g.rank] + j * S, (size_t)g.cnt[g.rank] * sizeof(float));
        ft_dist_count_call();
        MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g.scratch, g.cnt, g.displ, MPI_FLOAT, MPI_COMM_WORLD),
                "all-gather");
        for (int r = 0; r < g.world; r++)
            if (r != g.rank) memcpy(buf + off[r] + j * S, g.scratch + g.displ[r], (size_t)g.cnt[r] * sizeof(float));
    }
    return FTUNE_OK;
}

ftune_status ft_dist_gather_f32(float *full, const float *mine, const int64_t *off, int root, int64_t chunk) {
    ft_dist_count(FT_DIST_OTHER, (uint64_t)(off[g.rank + 1] - off[g.rank]) * sizeof(float));
    if (!g.mpi || g.world == 1) {
        if (full != mine) memmove(full, mine, (size_t)off[1] * sizeof(float));
        return FTUNE_OK;
    }
    chunk = chunk_of(chunk);
    int64_t S = chunk / g.world;
    if (scratch(chunk)) return FTUNE_ERR_NOMEM;
    for (int64_t j = 0; round_layout(off, S, j); j++) {
        ft_dist_count_call();
        MPI_TRY(MPI_Gatherv(mine + j * S, g.cnt[g.rank], MPI_FLOAT, g.scratch, g.cnt, g.displ, MPI_FLOAT, root,
                            MPI_COMM_WORLD), "gather");
        if (g.rank == root)
            for (int r = 0; r < g.world; r++)
                memcpy(full + off[r] + j * S, g.scratch + g.displ[r], (size_t)g.cnt[r] * sizeof(float));
    }
    return FTUNE_OK;
}

ftune_status ft_dist_scatter_f32(const float *full, float *mine, const int64_t *off, int root, int64_t chunk) {
    ft_dist_count(FT_DIST_OTHER, (uint64_t)(off[g.rank + 1] - off[g.rank]) * sizeof(float));
    if (!g.mpi || g.world == 1) {
        if (full != mine) memmove(mine, full, (size_t)off[1] * sizeof(float));
        return FTUNE_OK;
    }
    chunk = chunk_of(chunk);
    int64_t S = chunk / g.world;
    if (scratch(chunk)) return FTUNE_ERR_NOMEM;
    for (int64_t j = 0; round_layout(off, S, j); j++) {
        if (g.rank == root)
            for (int r = 0; r < g.world; r++)
                memcpy(g.scratch + g.displ[r], full + off[r] + j * S, (size_t)g.cnt[r] * sizeof(float));
        ft_dist_count_call();
        MPI_TRY(MPI_Scatterv(g.scratch, g.cnt, g.displ, MPI_FLOAT, mine + j * S, g.cnt[g.rank], MPI_FLOAT, root,
                             MPI_COMM_WORLD), "scatter");
    }
    return FTUNE_OK;
}

struct ft_dist_req {
    MPI_Request r;
    int *cnt;          /* (world) the counts MPI reads until the request completes */
};

ftune_status ft_dist_ireduce_scatter_sum_f32(const float *send, float *recv, const int64_t *off, ft_dist_req **req) {
    *req = NULL;
    ft_dist_count(FT_DIST_REDUCE_SCATTER, (uint64_t)off[g.world] * sizeof(float));
    if (!g.mpi || g.world == 1) {
        if (recv != send) memmove(recv, send, (size_t)off[1] * sizeof(float));
        return FTUNE_OK;
    }
    if (off[g.world] > INT32_MAX)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "a non-blocking reduce-scatter of %lld floats (at most 2^31 - 1)",
                      (long long)off[g.world]);
    ft_dist_req *q = calloc(1, sizeof *q);
    int *cnt = q ? malloc((size_t)g.world * sizeof *cnt) : NULL;
    if (!q || !cnt) { free(q); free(cnt); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    for (int r = 0; r < g.world; r++) cnt[r] = (int)(off[r + 1] - off[r]);
    q->cnt = cnt;
    ft_dist_count_call();
    int rc = MPI_Ireduce_scatter(send, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q->r);
    if (rc != MPI_SUCCESS) { free(cnt); free(q); return mpi_fail(rc, "non-blocking reduce-scatter"); }
    *req = q;
    return FTUNE_OK;
}

ftune_status ft_dist_test(ft_dist_req *req) {
    if (!req) return FTUNE_OK;
    int done = 0;
    MPI_TRY(MPI_Test(&req->r, &done, MPI_STATUS_IGNORE), "non-blocking reduce-scatter (test)");
    return FTUNE_OK;
}

ftune_status ft_dist_wait(ft_dist_req *req) {
    if (!req) return FTUNE_OK;
    int rc = MPI_Wait(&req->r, MPI_STATUS_IGNORE);
    free(req->cnt);
    free(req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "non-blocking reduce-scatter (wait)");
    return FTUNE_OK;
}

ftune_status ft_dist_bcast(void *buf, size_t bytes, int root) {
    ft_dist_count(FT_DIST_OTHER, g.rank == root ? (uint64_t)bytes : 0);
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    for (size_t i = 0; i < bytes || i == 0; i += (size_t)1 << 30) {
        size_t k = bytes - i < ((size_t)1 << 30) ? bytes - i : (size_t)1 << 30;
        ft_dist_count_call();
        MPI_TRY(MPI_Bcast((char *)buf + i, (int)k, MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
        if (bytes == 0) break;
    }
    return FTUNE_OK;
}
