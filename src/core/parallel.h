/* parallel.h — the one way the library runs work on several threads.
 * Every parallel loop in src/ goes through ft_parallel_for, so the thread
 * count a caller asked for (a session's or trainer's n_threads) is honoured
 * everywhere and no process-global thread state is changed. */
#ifndef FT_PARALLEL_H
#define FT_PARALLEL_H

/* A task body: task in [0, n_tasks), thread in [0, n_threads) names the
 * worker running it (for per-thread scratch). */
typedef void (*ft_task_fn)(void *ctx, int task, int thread);

/* Runs fn for every task on up to n_threads threads (n_threads <= 1 or
 * n_tasks <= 1: on the calling thread, in order) and returns when all are
 * done. Tasks are handed out dynamically, one at a time, so a descheduled
 * thread does not hold up the others; a task's result must not depend on
 * which thread runs it.
 *
 * The calling thread runs tasks too (as thread 0), helped by n_threads - 1
 * workers of its own: each application thread that calls this gets its own
 * pool, created on first use and grown to the largest n_threads it asked for,
 * so two sessions used from two threads never share or wait for each other's
 * workers. Idle workers spin for a few tens of microseconds, then sleep (a
 * futex), so they cost nothing while the caller does serial work and give
 * the cores back on a busy machine. A call from inside a task (nesting) runs
 * all its tasks on that thread, in order, as thread 0. If a worker cannot be
 * started the call uses the threads it has, which changes nothing but speed. */
void ft_parallel_for(int n_threads, int n_tasks, ft_task_fn fn, void *ctx);

/* Stops and joins the calling thread's workers and frees its pool (a later
 * ft_parallel_for starts a new one). A thread's pool is also freed when the
 * thread exits; the main thread's lives until the process ends unless this is
 * called. Must not be called from inside a task. */
void ft_parallel_shutdown(void);

/* Workers currently in the calling thread's pool (0 before first use): for
 * tests and diagnostics. */
int ft_parallel_pool_size(void);

#endif
