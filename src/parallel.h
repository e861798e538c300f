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
 * which thread runs it. Not reentrant from inside a task. */
void ft_parallel_for(int n_threads, int n_tasks, ft_task_fn fn, void *ctx);

#endif
