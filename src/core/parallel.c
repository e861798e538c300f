/* parallel.c — ft_parallel_for on a pthread pool of our own (see parallel.h).
 *
 * One pool per calling thread, found through a thread-local pointer. A job is
 * posted by writing its fields, publishing a new generation number and
 * setting each wanted worker's `seq` to it; tasks are then handed out with an
 * atomic counter to whoever asks, the caller included, and the caller returns
 * when the count of finished tasks reaches n_tasks. Correctness never depends
 * on a worker waking up: a late or descheduled worker just finds no task left.
 *
 * Waiting is spin-then-sleep: a waiter polls for SPIN_NS, then sleeps on a
 * futex. The wakers only make the system call when the waiter said it is
 * asleep (the `sleeping` flags; seq_cst on both sides, so a waker either sees
 * the flag or the sleeper's futex sees the new value).
 *
 * A worker reads the job's fields only between incrementing `inside` and
 * decrementing it, and only if `gen` still names the job it was asked to
 * join; the caller sets gen = 0 and waits for inside == 0 before it writes
 * the next job, so no worker ever reads a half-written job. */
#include "core/parallel.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef __linux__
#error "parallel.c uses Linux futexes"
#endif

/* How long an idle thread polls before it sleeps. Long enough to cover the
 * gap between two parallel loops of one forward pass (a few microseconds of
 * serial work) without a system call, short enough that an idle pool gives
 * its cores back to other processes almost at once. */
#define SPIN_NS 50000L
/* Upper bound on workers per pool; n_threads beyond it uses the ones it has. */
#define MAX_WORKERS 1024

typedef struct ft_pool ft_pool;

typedef struct {
    _Alignas(64) atomic_uint seq;   /* generation of the job this worker is asked to join */
    atomic_int sleeping;            /* 1 while in futex_wait on seq */
    int index;                      /* the thread index it runs tasks as (1..) */
    ft_pool *pool;
    pthread_t tid;
} ft_worker;

struct ft_pool {
    ft_worker **w;                  /* (n_workers) */
    int n_workers, cap;
    unsigned last_gen;              /* owner thread only */
    _Alignas(64) atomic_uint gen;   /* the posted job; 0 while one is being written */
    atomic_int inside;              /* workers that may be reading the job */
    atomic_bool stop;
    ft_task_fn fn;                  /* the job: written only while gen == 0 and inside == 0 */
    void *ctx;
    int n_tasks, n_threads;
    _Alignas(64) atomic_llong next; /* next task to hand out (64 bits: late askers overshoot) */
    _Alignas(64) atomic_uint done;  /* tasks finished */
    atomic_int caller_sleeping;
};

static __thread ft_pool *tls_pool;
static __thread int tls_in_task;    /* inside a task, or a worker: nested calls run inline */
static pthread_key_t pool_key;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void futex_wait(atomic_uint *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}
static void futex_wake(void *addr, int n) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Waits until *word != old (spin, then futex) and returns the new value. */
static unsigned wait_change(atomic_uint *word, unsigned old, atomic_int *sleeping) {
    unsigned v;
    long t0 = 0;
    for (int i = 0;; i++) {
        if ((v = atomic_load_explicit(word, memory_order_acquire)) != old) return v;
        if ((i & 127) == 127) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > SPIN_NS) break;
        }
        cpu_relax();
    }
    atomic_store(sleeping, 1);
    while ((v = atomic_load(word)) == old) futex_wait(word, old);
    atomic_store(sleeping, 0);
    return v;
}

/* Takes tasks until none is left. */
static void run_tasks(ft_pool *p, int thread) {
    for (;;) {
        long long t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) return;
        p->fn(p->ctx, (int)t, thread);
        if (atomic_fetch_add(&p->done, 1) + 1 == (unsigned)p->n_tasks && atomic_load(&p->caller_sleeping))
            futex_wake(&p->done, 1);
    }
}

static void *worker_main(void *arg) {
    ft_worker *w = arg;
    ft_pool *p = w->pool;
    tls_in_task = 1;
    unsigned seen = 0;
    for (;;) {
        seen = wait_change(&w->seq, seen, &w->sleeping);
        if (atomic_load(&p->stop)) break;
        atomic_fetch_add(&p->inside, 1);
        if (atomic_load(&p->gen) == seen && w->index < p->n_threads) run_tasks(p, w->index);
        atomic_fetch_sub_explicit(&p->inside, 1, memory_order_release);
    }
    return NULL;
}

static void pool_free(ft_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    for (int i = 0; i < p->n_workers; i++) {
        atomic_fetch_add(&p->w[i]->seq, 1);
        futex_wake(&p->w[i]->seq, 1);
    }
    for (int i = 0; i < p->n_workers; i++) {
        pthread_join(p->w[i]->tid, NULL);
        free(p->w[i]);
    }
    free(p->w);
    free(p);
}

static void pool_key_destroy(void *p) { pool_free(p); }

/* In a forked child the workers do not exist: forget the pool (its memory
 * is not freed, the threads it names are gone). */
static void forget_pool_in_child(void) {
    tls_pool = NULL;
    pthread_setspecific(pool_key, NULL);
}

static void pool_init_once(void) {
    pthread_key_create(&pool_key, pool_key_destroy);
    pthread_atfork(NULL, NULL, forget_pool_in_child);
}

/* The calling thread's pool with at least nw workers if they can be started
 * (fewer if not); NULL if not even the pool could be allocated. */
static ft_pool *get_pool(int nw) {
    pthread_once(&pool_once, pool_init_once);
    ft_pool *p = tls_pool;
    if (!p) {
        if (!(p = calloc(1, sizeof *p))) return NULL;
        tls_pool = p;
        pthread_setspecific(pool_key, p);
    }
    if (nw > MAX_WORKERS) nw = MAX_WORKERS;
    if (p->n_workers >= nw) return p;
    if (nw > p->cap) {
        ft_worker **w = realloc(p->w, (size_t)nw * sizeof *w);
        if (!w) return p;
        p->w = w;
        p->cap = nw;
    }
    /* workers take no signals: the application's handlers run on its threads */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (p->n_workers < nw) {
        ft_worker *w = aligned_alloc(64, sizeof(ft_worker));
        if (!w) break;
        *w = (ft_worker){ .index = p->n_workers + 1, .pool = p };
        atomic_init(&w->seq, 0);
        atomic_init(&w->sleeping, 0);
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            free(w);
            break;
        }
        p->w[p->n_workers++] = w;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

static void run_inline(int n_tasks, ft_task_fn fn, void *ctx) {
    int outer = tls_in_task;
    tls_in_task = 1;
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    tls_in_task = outer;
}

void ft_parallel_for(int n_threads, int n_tasks, ft_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (n_threads > n_tasks) n_threads = n_tasks;
    if (n_threads <= 1 || tls_in_task) {
        run_inline(n_tasks, fn, ctx);
        return;
    }
    ft_pool *p = get_pool(n_threads - 1);
    int nw = p ? (p->n_workers < n_threads - 1 ? p->n_workers : n_threads - 1) : 0;
    if (nw == 0) {
        run_inline(n_tasks, fn, ctx);
        return;
    }

    /* retire the previous job: no worker may be reading it when it changes */
    atomic_store(&p->gen, 0);
    for (int i = 0; atomic_load_explicit(&p->inside, memory_order_acquire) != 0; i++) {
        if (i > 1000) sched_yield(); /* a worker was descheduled between two instructions */
        else cpu_relax();
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    p->n_threads = nw + 1;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    unsigned g = ++p->last_gen;
    if (g == 0) g = ++p->last_gen;
    atomic_store(&p->gen, g);
    for (int i = 0; i < nw; i++) {
        atomic_store(&p->w[i]->seq, g);
        if (atomic_load(&p->w[i]->sleeping)) futex_wake(&p->w[i]->seq, 1);
    }

    tls_in_task = 1;
    run_tasks(p, 0);
    tls_in_task = 0;

    /* wait for the tasks other threads still run: spin briefly, then sleep */
    long t0 = 0;
    unsigned n = (unsigned)n_tasks;
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) != n; i++) {
        if ((i & 127) == 127) {
            long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > SPIN_NS) break;
        }
        cpu_relax();
    }
    unsigned d;
    if (atomic_load(&p->done) != n) {
        atomic_store(&p->caller_sleeping, 1);
        while ((d = atomic_load(&p->done)) != n) futex_wait(&p->done, d);
        atomic_store(&p->caller_sleeping, 0);
    }
    atomic_thread_fence(memory_order_acquire);
}

void ft_parallel_shutdown(void) {
    if (tls_in_task || !tls_pool) return;
    ft_pool *p = tls_pool;
    tls_pool = NULL;
    pthread_setspecific(pool_key, NULL);
    pool_free(p);
}

int ft_parallel_pool_size(void) { return tls_pool ? tls_pool->n_workers : 0; }
