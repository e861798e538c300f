/* ops.c — the plain C reference for every transformer op: each a
 * forward/backward pair, in float (the library) and in double (the _f64
 * twins the tests check against finite differences). The code is written
 * once, in ops_impl.h, and compiled here for both types. Fast paths live in
 * other files and are tested against these functions.
 */
#include "ops/ops.h"
#include "core/parallel.h"

#include <string.h>
#include <tgmath.h>

/* The references run on the calling thread, except attention_forward, which
 * takes a thread count (through ft_parallel_for) for the inference path, and
 * the _mt wrappers at the end, which split them over threads unchanged. */

#define real float
#define FN(name) ft_##name
#include "ops/ops_impl.h"
#undef real
#undef FN

#define real double
#define FN(name) ft_##name##_f64
#include "ops/ops_impl.h"
#undef real
#undef FN

/* ------------------------------------------------ the references, threaded */
/* ft_parallel_for over whole rows (RMSNorm) or fixed spans (SwiGLU), each
 * task calling the reference on its part: every element is the same
 * expression in the same order, so the bits are the reference's whatever
 * the thread count. RMSNorm's dw sums over rows, so backward makes it a
 * second pass over column spans, each summing its rows in order, as the
 * reference's single loop does. Work under MT_MIN elements stays on the
 * calling thread (a decode row: waking a worker costs more). */
#define MT_MIN 32768
#define MT_ROWS 16     /* RMSNorm rows per task */
#define MT_SPAN 8192   /* SwiGLU elements per task */
#define MT_COLS 256    /* RMSNorm dw columns per task */

typedef struct {
    float *a, *b;
    const float *x, *y, *z, *w, *r;
    int T, C;
    float eps;
    size_t n;
} mt_job;

static int mt_threads(size_t work, int n_threads) { return work < MT_MIN ? 1 : n_threads; }

static void rms_fwd_task(void *vctx, int task, int thread) {
    (void)thread;
    const mt_job *j = vctx;
    int t0 = task * MT_ROWS, rows = j->T - t0 < MT_ROWS ? j->T - t0 : MT_ROWS;
    size_t o = (size_t)t0 * j->C;
    ft_rmsnorm_forward(j->a + o, j->b ? j->b + t0 : NULL, j->x + o, j->w, rows, j->C, j->eps);
}

void ft_rmsnorm_forward_mt(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps,
                           int n_threads) {
    mt_job j = { .a = out, .b = rstd, .x = inp, .w = w, .T = T, .C = C, .eps = eps };
    ft_parallel_for(mt_threads((size_t)T * C, n_threads), (T + MT_ROWS - 1) / MT_ROWS, rms_fwd_task, &j);
}

static void rms_bwd_task(void *vctx, int task, int thread) {
    (void)thread;
    const mt_job *j = vctx;
    int t0 = task * MT_ROWS, rows = j->T - t0 < MT_ROWS ? j->T - t0 : MT_ROWS;
    size_t o = (size_t)t0 * j->C;
    ft_rmsnorm_backward(j->a + o, NULL, j->y + o, j->x + o, j->w, j->r + t0, rows, j->C);
}

/* dw[i] += dy[t][i] · (x[t][i] · r[t]) for t in order: the reference's term */
static void rms_dw_task(void *vctx, int task, int thread) {
    (void)thread;
    const mt_job *j = vctx;
    int c0 = task * MT_COLS, c1 = j->C - c0 < MT_COLS ? j->C : c0 + MT_COLS;
    for (int t = 0; t < j->T; t++) {
        const float *x = j->x + (size_t)t * j->C, *dy = j->y + (size_t)t * j->C;
        float r = j->r[t];
        for (int i = c0; i < c1; i++) {
            float xhat = x[i] * r;
            j->b[i] += dy[i] * xhat;
        }
    }
}

void ft_rmsnorm_backward_mt(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const float *rstd, int T, int C, int n_threads) {
    mt_job j = { .a = dinp, .b = dw, .x = inp, .y = dout, .w = w, .r = rstd, .T = T, .C = C };
    int nt = mt_threads((size_t)T * C, n_threads);
    ft_parallel_for(nt, (T + MT_ROWS - 1) / MT_ROWS, rms_bwd_task, &j);
    if (dw) ft_parallel_for(nt, (C + MT_COLS - 1) / MT_COLS, rms_dw_task, &j);
}

static void swiglu_fwd_task(void *vctx, int task, int thread) {
    (void)thread;
    const mt_job *j = vctx;
    size_t i0 = (size_t)task * MT_SPAN, n = j->n - i0 < MT_SPAN ? j->n - i0 : MT_SPAN;
    ft_swiglu_forward(j->a + i0, j->x + i0, j->y + i0, 1, (int)n);
}

void ft_swiglu_forward_mt(float *out, const float *gate, const float *up, int T, int F, int n_threads) {
    size_t n = (size_t)T * F;
    mt_job j = { .a = out, .x = gate, .y = up, .n = n };
    ft_parallel_for(mt_threads(n, n_threads), (int)((n + MT_SPAN - 1) / MT_SPAN), swiglu_fwd_task, &j);
}

static void swiglu_bwd_task(void *vctx, int task, int thread) {
    (void)thread;
    const mt_job *j = vctx;
    size_t i0 = (size_t)task * MT_SPAN, n = j->n - i0 < MT_SPAN ? j->n - i0 : MT_SPAN;
    ft_swiglu_backward(j->a + i0, j->b + i0, j->z + i0, j->x + i0, j->y + i0, 1, (int)n);
}

void ft_swiglu_backward_mt(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T,
                           int F, int n_threads) {
    size_t n = (size_t)T * F;
    mt_job j = { .a = dgate, .b = dup, .z = dout, .x = gate, .y = up, .n = n };
    ft_parallel_for(mt_threads(n, n_threads), (int)((n + MT_SPAN - 1) / MT_SPAN), swiglu_bwd_task, &j);
}
