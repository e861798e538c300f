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
 * whole job when one process exits abnormally.
 *
 * Every collective is MPI's non-blocking one, completed by wait_for's
 * polling loop, so that a rank can stop waiting (ft_dist_set_timeout). The
 * side channel a timed-out rank asks the others on is a duplicate of the
 * world communicator, so its messages never match the collectives'. */
#include "dist/dist.h"
#include "dist/dist_impl.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_S 0.02       /* a wait polls busily this long, then sleeps between polls */
#define NAP_MAX_S 1e-3    /* the longest sleep between two polls */
#define ANSWER_S 2.0      /* how long a timed-out rank waits for the others' answers */

/* A side-channel message: a timed-out rank's query and verdict, the
 * others' answers (where they wait). Well under every transport's eager
 * limit, so that a send never waits for its receiver. */
enum { TAG_QUERY = 1, TAG_ANSWER = 2, TAG_VERDICT = 3 };
typedef struct {
    int32_t rank;
    int64_t seq;           /* the collective call this rank is in (1-based) */
    double waited;         /* seconds in it */
    char what[32], phase[96];
    char text[1024];       /* TAG_VERDICT: the timed-out rank's finding */
} side_msg;

static struct {
    bool init, mpi;
    int rank, world;
    char name[64];
    float *scratch;
    int64_t scratch_n;
    float *tmp;          /* a ring step's received segment */
    int tmp_n;
    int *cnt, *displ;    /* (world) */
    MPI_Comm side;       /* the side channel (world > 1) */
    double timeout;      /* seconds; 0: none */
    int64_t seq;         /* collective calls started */
    char phase[96];
    bool broken;         /* a collective timed out: requests are in flight, the job must end */
    side_msg out;        /* what this rank last sent without waiting (its buffer stays valid) */
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
#define TRY(x) do { ftune_status st_ = (x); if (st_) return st_; } while (0)
#define MPI_TRY(call, what) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, what); } while (0)

double ft_dist_set_timeout(double seconds) {
    double t = g.timeout;
    g.timeout = seconds > 0 ? seconds : 0;
    return t;
}

void ft_dist_set_phase(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.phase, sizeof g.phase, fmt, ap);
    va_end(ap);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double s) {
    struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)(s * 1e9) };
    nanosleep(&ts, NULL);
}

static void where(side_msg *m, const char *what, double waited) {
    memset(m, 0, sizeof *m);
    m->rank = g.rank;
    m->seq = g.seq;
    m->waited = waited;
    snprintf(m->what, sizeof m->what, "%s", what);
    snprintf(m->phase, sizeof m->phase, "%s", g.phase[0] ? g.phase : "the start");
}

/* Answers every rank that timed out and asks where this one is. */
static void answer_queries(const char *what, double waited) {
    for (;;) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, g.side, &flag, &s) != MPI_SUCCESS || !flag) return;
        side_msg q, a;
        if (MPI_Recv(&q, sizeof q, MPI_BYTE, s.MPI_SOURCE, TAG_QUERY, g.side, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        where(&a, what, waited);
        if (MPI_Send(&a, sizeof a, MPI_BYTE, s.MPI_SOURCE, TAG_ANSWER, g.side) != MPI_SUCCESS) return;
    }
}

/* While waiting: answers the queries; a verdict (a timed-out rank's
 * finding) ends this wait with the same error. */
static FTUNE_MUST_USE ftune_status serve_side(const char *what, double waited) {
    answer_queries(what, waited);
    int flag = 0;
    MPI_Status s;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_VERDICT, g.side, &flag, &s) == MPI_SUCCESS && flag) {
        side_msg v;
        if (MPI_Recv(&v, sizeof v, MPI_BYTE, s.MPI_SOURCE, TAG_VERDICT, g.side, MPI_STATUS_IGNORE) == MPI_SUCCESS) {
            g.broken = true;
            v.text[sizeof v.text - 1] = 0;
            return ft_err(FTUNE_ERR_IO, "rank %d: stopped waiting in %s (collective call %lld, %s) after %.1f s, as "
                          "rank %d timed out: %s", g.rank, what, (long long)g.seq, g.phase[0] ? g.phase : "the start",
                          waited, v.rank, v.text);
        }
    }
    return FTUNE_OK;
}

/* The timeout: asks every other rank where it is, waits ANSWER_S for the
 * answers, names the ranks this one waited for (those that did not answer:
 * not in any collective), where the others wait (a call later: their part
 * of this one was done; the same call in another collective: the ranks'
 * schedules differ), tells the ranks that answered, and fails. The request
 * stays in flight (MPI may still write its buffers): the job must end. */
static FTUNE_MUST_USE ftune_status timed_out(const char *what, double waited) {
    g.broken = true;
    int W = g.world;
    side_msg *ans = calloc((size_t)W, sizeof *ans);
    MPI_Request *rr = calloc((size_t)W, sizeof *rr);
    bool *got = calloc((size_t)W, sizeof *got);
    if (!ans || !rr || !got) {
        free(ans); free(rr); free(got);
        return ft_err(FTUNE_ERR_IO, "rank %d: timed out after %.0f s in %s (collective call %lld, %s) waiting for the "
                      "other ranks", g.rank, waited, what, (long long)g.seq, g.phase[0] ? g.phase : "the start");
    }
    where(&g.out, what, waited);
    for (int p = 0; p < W; p++) {
        rr[p] = MPI_REQUEST_NULL;
        if (p == g.rank) continue;
        MPI_Request sr;
        if (MPI_Irecv(&ans[p], sizeof ans[p], MPI_BYTE, p, TAG_ANSWER, g.side, &rr[p]) != MPI_SUCCESS) rr[p] = MPI_REQUEST_NULL;
        if (MPI_Isend(&g.out, sizeof g.out, MPI_BYTE, p, TAG_QUERY, g.side, &sr) == MPI_SUCCESS) MPI_Request_free(&sr);
    }
    int left = W - 1;
    for (double t0 = now_s(); left > 0 && now_s() - t0 < ANSWER_S; nap(NAP_MAX_S)) {
        for (int p = 0; p < W; p++) {
            int done = 0;
            if (got[p] || rr[p] == MPI_REQUEST_NULL) continue;
            if (MPI_Test(&rr[p], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) { got[p] = true; left--; }
        }
        answer_queries(what, waited); /* another rank that timed out meanwhile: this one waits too */
    }
    /* the answers that did not come: cancelled, so that a late one never lands in freed memory */
    for (int p = 0; p < W; p++)
        if (!got[p] && rr[p] != MPI_REQUEST_NULL && MPI_Cancel(&rr[p]) == MPI_SUCCESS) MPI_Wait(&rr[p], MPI_STATUS_IGNORE);
    /* the finding: the ranks waited for, then those elsewhere and those waiting alike */
    char text[1024], silent[256] = "", other[512] = "", same[256] = "";
    int n_silent = 0, n_other = 0, n_same = 0;
    for (int p = 0; p < W; p++) {
        if (p == g.rank) continue;
        size_t k;
        if (!got[p]) {
            k = strlen(silent);
            snprintf(silent + k, sizeof silent - k, "%s%d", n_silent++ ? ", " : "", p);
        } else if (ans[p].seq != g.seq || strcmp(ans[p].what, what) != 0) {
            /* ahead: that rank's part of this call was done (it moved on); behind: its part of
             * an earlier one is not (a root finishes a broadcast before the others); another
             * collective in the same call: the ranks' schedules differ */
            ans[p].what[sizeof ans[p].what - 1] = ans[p].phase[sizeof ans[p].phase - 1] = 0;
            k = strlen(other);
            snprintf(other + k, sizeof other - k, "%srank %d is in %s (collective call %lld, %s%s)", n_other++ ? "; " : "",
                     p, ans[p].what, (long long)ans[p].seq, ans[p].phase,
                     ans[p].seq > g.seq ? ": past this call, its part of it done"
                     : ans[p].seq < g.seq ? ": still in an earlier call" : ": the ranks' collectives differ");
        } else {
            k = strlen(same);
            snprintf(same + k, sizeof same - k, "%s%d", n_same++ ? ", " : "", p);
        }
    }
    int n = snprintf(text, sizeof text, "rank %d timed out after %.0f s in %s (collective call %lld, %s)", g.rank, waited,
                     what, (long long)g.seq, g.phase[0] ? g.phase : "the start");
    if (n_silent)
        n += snprintf(text + n, sizeof text - (size_t)n, ", waiting for rank%s %s, which did not answer within %.0f s "
                      "(not in any collective: computing, stopped or stuck)", n_silent > 1 ? "s" : "", silent, ANSWER_S);
    if (n_other && n < (int)sizeof text)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s %s", n_silent ? ";" : ":", other);
    if (n_same && n < (int)sizeof text)
        n += snprintf(text + n, sizeof text - (size_t)n, "; rank%s %s waited in the same call", n_same > 1 ? "s" : "",
                      same);
    if (n < (int)sizeof text)
        snprintf(text + n, sizeof text - (size_t)n, " (--dist-timeout sets the limit; 0 waits forever)");
    /* the ranks that answered end with this finding; they get a moment to say so before this
     * rank's caller ends the job */
    side_msg v;
    where(&v, what, waited);
    snprintf(v.text, sizeof v.text, "%s", text);
    for (int p = 0; p < W; p++)
        if (got[p]) MPI_Send(&v, sizeof v, MPI_BYTE, p, TAG_VERDICT, g.side); /* a failure: that rank times out itself */
    if (n_same || n_other) nap(0.5);
    free(ans);
    free(rr);
    free(got);
    return ft_err(FTUNE_ERR_IO, "%s", text);
}

/* Completes the n requests of what (a collective this rank started),
 * polling so that the timeout can end the wait. */
static FTUNE_MUST_USE ftune_status wait_all(MPI_Request *req, int n, const char *what) {
    double t0 = now_s(), nap_s = 5e-5;
    for (;;) {
        int done = 0;
        MPI_TRY(MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE), what);
        if (done) return FTUNE_OK;
        double waited = now_s() - t0;
        if (waited < SPIN_S) continue;
        ftune_status st = serve_side(what, waited);
        if (st) return st;
        if (g.timeout > 0 && waited >= g.timeout) return timed_out(what, waited);
        nap(nap_s);
        if (nap_s < NAP_MAX_S) nap_s *= 2;
    }
}

static FTUNE_MUST_USE ftune_status wait_for(MPI_Request *req, const char *what) { return wait_all(req, 1, what); }

/* Before a collective: one that timed out has left the job unable to go
 * on; else the call is counted (the side channel's "collective call"). */
static FTUNE_MUST_USE ftune_status begin(const char *what) {
    if (g.broken) return ft_err(FTUNE_ERR_IO, "rank %d: no %s after a collective timed out (the job must end)", g.rank, what);
    g.seq++;
    return FTUNE_OK;
}

/* After starting a non-blocking collective (rc its return code): waits for it. */
static FTUNE_MUST_USE ftune_status finish(int rc, MPI_Request *req, const char *what) {
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
    return wait_for(req, what);
}

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
    g.side = MPI_COMM_NULL;
    if (g.world > 1) {
        if (MPI_Comm_dup(MPI_COMM_WORLD, &g.side) != MPI_SUCCESS) return ft_err(FTUNE_ERR_IO, "MPI_Comm_dup failed");
        MPI_Comm_set_errhandler(g.side, MPI_ERRORS_RETURN);
    }
    g.cnt = malloc((size_t)g.world * sizeof *g.cnt);
    g.displ = malloc((size_t)g.world * sizeof *g.displ);
    if (!g.cnt || !g.displ) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    g.mpi = g.init = true;
    return FTUNE_OK;
}

void ft_dist_finalize(void) {
    if (g.broken) return; /* requests are in flight on the scratch buffer and the side channel: the job must end */
    if (g.mpi) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && g.side != MPI_COMM_NULL) MPI_Comm_free(&g.side);
        if (!fin) MPI_Finalize();
    }
    free(g.scratch);
    free(g.tmp);
    free(g.cnt);
    free(g.displ);
    g.scratch = NULL;
    g.cnt = g.displ = NULL;
    g.scratch_n = 0;
    g.tmp = NULL;
    g.tmp_n = 0;
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

/* segments of at least 1024 floats (4 KiB) go round the ring (bandwidth-bound); below,
 * MPI's own collectives (latency-bound: log2 W steps, not 2(W-1)) */
#define RING_MIN_SEG 1024

/* A reduce-scatter (and with gather, an all-reduce) of buf over point-to-
 * point messages in a ring: segment q of buf is [g.displ[q], + g.cnt[q]).
 * W - 1 steps in which each rank adds the segment its left neighbour sends
 * to its own copy and passes it on, so that rank r ends with segment r
 * summed; then, to all-reduce, W - 1 steps passing the summed segments on.
 * Each rank sends (W-1)/W of the buffer per half, all ranks at once, as
 * Open MPI's blocking collectives do on large buffers; its non-blocking
 * ones (libnbc) on 2 or 3 ranks, or in place, reduce to one rank and
 * broadcast or scatter back: on 2 ranks (Open MPI 4.1, shared memory) its
 * all-reduce took 1.3-2x as long as the blocking one from 16 K floats up,
 * this ring about as long (as long as it below 16 K floats, faster above).
 * Every rank ends with the same bits: each segment is summed on one rank,
 * in ring order, and copied to the others. */
static FTUNE_MUST_USE ftune_status ring(float *buf, bool gather, const char *what) {
    int W = g.world, r = g.rank, right = (r + 1) % W, left = (r + W - 1) % W, most = 0;
    for (int q = 0; q < W; q++) most = g.cnt[q] > most ? g.cnt[q] : most;
    if (most + 1 > g.tmp_n) {
        float *p = realloc(g.tmp, (size_t)(most + 1) * sizeof(float));
        if (!p) return ft_err(FTUNE_ERR_NOMEM, "out of memory for a communication segment of %d floats", most);
        g.tmp = p;
        g.tmp_n = most + 1;
    }
    for (int s = 0; s < (gather ? 2 : 1) * (W - 1); s++) {
        bool reduce = s < W - 1;
        int t = reduce ? s : s - (W - 1);
        int send = reduce ? (r - t - 1 + 2 * W) % W : (r - t + W) % W;
        int recv = reduce ? (r - t - 2 + 3 * W) % W : (r - t - 1 + 2 * W) % W;
        MPI_Request q[2];
        MPI_TRY(MPI_Irecv(reduce ? g.tmp : buf + g.displ[recv], g.cnt[recv], MPI_FLOAT, left, 0, MPI_COMM_WORLD, &q[0]),
                what);
        int rc = MPI_Isend(buf + g.displ[send], g.cnt[send], MPI_FLOAT, right, 0, MPI_COMM_WORLD, &q[1]);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what); /* the receive stays posted: the job ends */
        TRY(wait_all(q, 2, what));
        if (reduce) {
            float *dst = buf + g.displ[recv];
            for (int j = 0; j < g.cnt[recv]; j++) dst[j] += g.tmp[j];
        }
    }
    return FTUNE_OK;
}

ftune_status ft_dist_allreduce_sum_f32(float *buf, int64_t n, int64_t chunk) {
    ft_dist_count(FT_DIST_ALLREDUCE, (uint64_t)n * sizeof(float));
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    chunk = chunk_of(chunk);
    for (int64_t i = 0; i < n; i += chunk) {
        int k = (int)(n - i < chunk ? n - i : chunk);
        ft_dist_count_call();
        TRY(begin("all-reduce"));
        if (k / g.world >= RING_MIN_SEG) {
            for (int q = 0, d = 0; q < g.world; q++) {
                g.cnt[q] = k / g.world + (q < k % g.world ? 1 : 0);
                g.displ[q] = d;
                d += g.cnt[q];
            }
            TRY(ring(buf + i, true, "all-reduce"));
            continue;
        }
        MPI_Request q;
        TRY(finish(MPI_Iallreduce(MPI_IN_PLACE, buf + i, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q), &q, "all-reduce"));
    }
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status small(void *buf, int n, MPI_Datatype t, MPI_Op op, const char *what) {
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    ft_dist_count_call();
    MPI_Request q;
    TRY(begin(what));
    return finish(MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, MPI_COMM_WORLD, &q), &q, what);
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
        TRY(begin("reduce-scatter"));
        if ((g.displ[g.world - 1] + g.cnt[g.world - 1]) / g.world >= RING_MIN_SEG) {
            TRY(ring(g.scratch, false, "reduce-scatter")); /* this rank's sum where its piece is */
            memcpy(buf + off[g.rank] + j * S, g.scratch + g.displ[g.rank], (size_t)g.cnt[g.rank] * sizeof(float));
            continue;
        }
        MPI_Request q;
        TRY(finish(MPI_Ireduce_scatter(MPI_IN_PLACE, g.scratch, g.cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q), &q,
                   "reduce-scatter"));
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
        MPI_Request q;
        TRY(begin("all-gather"));
        TRY(finish(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g.scratch, g.cnt, g.displ, MPI_FLOAT,
                                   MPI_COMM_WORLD, &q), &q, "all-gather"));
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
        MPI_Request q;
        TRY(begin("gather"));
        TRY(finish(MPI_Igatherv(mine + j * S, g.cnt[g.rank], MPI_FLOAT, g.scratch, g.cnt, g.displ, MPI_FLOAT, root,
                                MPI_COMM_WORLD, &q), &q, "gather"));
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
        MPI_Request q;
        TRY(begin("scatter"));
        TRY(finish(MPI_Iscatterv(g.scratch, g.cnt, g.displ, MPI_FLOAT, mine + j * S, g.cnt[g.rank], MPI_FLOAT, root,
                                 MPI_COMM_WORLD, &q), &q, "scatter"));
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
    TRY(begin("non-blocking reduce-scatter"));
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
    /* a wait that failed or timed out leaves req in flight (MPI may still read cnt): not freed */
    TRY(wait_for(&req->r, "non-blocking reduce-scatter (wait)"));
    free(req->cnt);
    free(req);
    return FTUNE_OK;
}

ftune_status ft_dist_bcast(void *buf, size_t bytes, int root) {
    ft_dist_count(FT_DIST_OTHER, g.rank == root ? (uint64_t)bytes : 0);
    if (!g.mpi || g.world == 1) return FTUNE_OK;
    for (size_t i = 0; i < bytes || i == 0; i += (size_t)1 << 30) {
        size_t k = bytes - i < ((size_t)1 << 30) ? bytes - i : (size_t)1 << 30;
        ft_dist_count_call();
        MPI_Request q;
        TRY(begin("broadcast"));
        TRY(finish(MPI_Ibcast((char *)buf + i, (int)k, MPI_BYTE, root, MPI_COMM_WORLD, &q), &q, "broadcast"));
        if (bytes == 0) break;
    }
    return FTUNE_OK;
}
