/* parallel.c — ft_parallel_for on OpenMP (see parallel.h). */
#include "parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void ft_parallel_for(int n_threads, int n_tasks, ft_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (n_threads <= 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    if (n_threads > n_tasks) n_threads = n_tasks;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, omp_get_thread_num());
#else
    for (int t = 0; t < n_tasks; t++) fn(ctx, t, 0);
#endif
}
