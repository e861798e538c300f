/* kernels.c — the matrix-product driver of kernels.h, written once for
 * every instruction set: the level's primitives (kernels_<isa>.c) do the
 * arithmetic, this file does the blocking, the packing and the threads.
 *
 * C (M, N) = alpha·A·B (+ C) goes FT_GEMM_NC columns × FT_GEMM_KC of K at a
 * time: B's chunk is packed once into scratch (f32, nr-column strips,
 * zero-padded), shared by all threads; then tasks of a few mr-row panels of
 * A are handed out (ft_parallel_for): each task packs its panel of A (f32
 * or widened from the weight dtype) and runs the register tile over every
 * strip, then adds alpha·(the chunk's sum) into C. Every output is written
 * by one task per chunk and chunks follow each other in order, so the
 * result does not depend on the thread count. N = 1 with a contiguous B
 * column (Linear's forward on one row: decode) skips the packing: a dot
 * product per row of A, four rows at a time sharing the loads of x. */
#include "kernels.h"
#include "cpu.h"
#include "parallel.h"

#include <string.h>

extern const ft_kernel_isa ft_kernels_generic;
#if defined(__x86_64__)
extern const ft_kernel_isa ft_kernels_avx2, ft_kernels_avx512;
#endif

const ft_kernel_isa *ft_kernels_for_level(int level) {
#if defined(__x86_64__)
    if (level >= FT_CPU_AVX512) return &ft_kernels_avx512;
    if (level >= FT_CPU_AVX2) return &ft_kernels_avx2;
#endif
    return &ft_kernels_generic;
}

/* bounds of every ISA's register tile */
#define MR_MAX 16
/* rows of B's chunk one packing task widens */
#define PACK_ROWS 16
/* GEMV: output rows per task */
#define GEMV_ROWS 64

typedef struct {
    const ft_kernel_isa *isa;
    int shape, mr, nr;
    float *C;
    int64_t c_rs, c_cs;
    const ft_mat *A, *B;
    int M, N, K;
    float alpha;
    bool overwrite; /* this chunk's sum replaces C instead of adding to it */
    int n0, nw, k0, kc; /* the current chunk: columns [n0, n0+nw), K [k0, k0+kc) */
    float *bp;          /* B's chunk: strip s at bp + s·kc·nr, (kc, nr) */
    int n_panels, group;
} gemm_ctx;

static const uint8_t *row_at(const ft_mat *m, int64_t i) {
    return m->dt == FT_F32 ? (const uint8_t *)((const float *)m->p + i * m->rs) : (const uint8_t *)m->p + i * m->rs;
}

/* B's chunk, either one strip (B read along k: a transposed f32 B) or
 * PACK_ROWS rows of k (B read along n: f32 or widened from a weight
 * dtype, then dealt out to the strips). */
static void pack_b(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    const ft_mat *B = g->B;
    int nr = g->nr, kc = g->kc, ns = (g->nw + nr - 1) / nr;
    if (B->dt == FT_F32 && B->cs != 1) {
        float *dst = g->bp + (size_t)task * kc * nr;
        int nl = g->nw - task * nr < nr ? g->nw - task * nr : nr;
        for (int l = 0; l < nr; l++) {
            if (l >= nl) {
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + l] = 0;
                continue;
            }
            const float *src = (const float *)B->p + (int64_t)(g->n0 + task * nr + l) * B->cs + (int64_t)g->k0 * B->rs;
            for (int k = 0; k < kc; k++) dst[(size_t)k * nr + l] = src[(int64_t)k * B->rs];
        }
        return;
    }
    float tmp[FT_GEMM_NC];
    int k1 = (task + 1) * PACK_ROWS < kc ? (task + 1) * PACK_ROWS : kc;
    for (int k = task * PACK_ROWS; k < k1; k++) {
        g->isa->widen(tmp, row_at(B, g->k0 + k), B->dt, g->n0, g->nw);
        for (int s = 0; s < ns; s++) {
            float *dst = g->bp + ((size_t)s * kc + k) * nr;
            int n = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            memcpy(dst, tmp + s * nr, (size_t)n * sizeof(float));
            memset(dst + n, 0, (size_t)(nr - n) * sizeof(float));
        }
    }
}

/* Rows [m0, m0+mr) of A over the chunk's K, row r at wp + r·FT_GEMM_KC;
 * rows past M are zero. */
static void pack_a(float *wp, const gemm_ctx *g, int m0) {
    const ft_mat *A = g->A;
    for (int r = 0; r < g->mr; r++) {
        float *dst = wp + (size_t)r * FT_GEMM_KC;
        if (m0 + r >= g->M) {
            memset(dst, 0, (size_t)g->kc * sizeof(float));
        } else if (A->dt != FT_F32 || A->cs == 1) {
            g->isa->widen(dst, row_at(A, m0 + r), A->dt, g->k0, g->kc);
        } else {
            const float *src = (const float *)A->p + (int64_t)(m0 + r) * A->rs + (int64_t)g->k0 * A->cs;
            for (int k = 0; k < g->kc; k++) dst[k] = src[(int64_t)k * A->cs];
        }
    }
}

static void panels(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    float wp[MR_MAX * FT_GEMM_KC] __attribute__((aligned(64)));
    float cb[MR_MAX * FT_GEMM_NC] __attribute__((aligned(64))); /* strip s at cb + s·mr·nr, (mr, nr) */
    int mr = g->mr, nr = g->nr, ns = (g->nw + nr - 1) / nr;
    int p1 = (task + 1) * g->group < g->n_panels ? (task + 1) * g->group : g->n_panels;
    for (int p = task * g->group; p < p1; p++) {
        int m0 = p * mr, rows = g->M - m0 < mr ? g->M - m0 : mr;
        pack_a(wp, g, m0);
        for (int s = 0; s < ns; s++)
            g->isa->tile[g->shape](cb + (size_t)s * mr * nr, g->bp + (size_t)s * g->kc * nr, wp, g->kc);
        for (int s = 0; s < ns; s++) {
            int cols = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            const float *c = cb + (size_t)s * mr * nr;
            for (int r = 0; r < rows; r++) {
                float *dst = g->C + (int64_t)(m0 + r) * g->c_rs + (int64_t)(g->n0 + s * nr) * g->c_cs;
                for (int l = 0; l < cols; l++) {
                    float v = g->alpha * c[r * nr + l];
                    float *d = dst + (int64_t)l * g->c_cs;
                    *d = g->overwrite ? v : *d + v;
                }
            }
        }
    }
}

static void gemv(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    const ft_mat *A = g->A;
    size_t rb = A->dt == FT_F32 ? (size_t)A->rs * sizeof(float) : (size_t)A->rs;
    int m1 = (task + 1) * GEMV_ROWS < g->M ? (task + 1) * GEMV_ROWS : g->M;
    for (int m = task * GEMV_ROWS; m < m1; m += 4) {
        int n = m1 - m < 4 ? m1 - m : 4;
        float out[4];
        g->isa->dot_rows(out, g->B->p, row_at(A, m), rb, A->dt, g->K, n);
        for (int r = 0; r < n; r++) {
            float v = g->alpha * out[r], *d = g->C + (int64_t)(m + r) * g->c_rs;
            *d = g->overwrite ? v : *d + v;
        }
    }
}

/* A weight-dtype operand is read along its rows in whole blocks. */
static bool operand_ok(const ft_mat *m, int along) {
    if (m->dt >= FT_NTYPES || !ft_types[m->dt].is_float) return false;
    if (m->dt == FT_F32) return true;
    return m->cs == 1 && along % ft_types[m->dt].block == 0;
}

bool ft_gemm(float *C, int64_t c_rs, int64_t c_cs, const ft_mat *A, const ft_mat *B, int M, int N, int K, float alpha,
             bool accumulate, int n_threads, float *scratch, size_t scratch_floats) {
    if (M < 1 || N < 1 || K < 1 || !operand_ok(A, K) || !operand_ok(B, N)) return false;
    if (n_threads < 1) n_threads = 1;
    gemm_ctx g = { .isa = ft_kernels_for_level(ft_cpu_level()), .C = C, .c_rs = c_rs, .c_cs = c_cs, .A = A, .B = B,
                   .M = M, .N = N, .K = K, .alpha = alpha, .overwrite = !accumulate };
    if (N == 1 && B->dt == FT_F32 && B->rs == 1 && (A->dt != FT_F32 || A->cs == 1)) {
        ft_parallel_for(n_threads, (M + GEMV_ROWS - 1) / GEMV_ROWS, gemv, &g);
        return true;
    }
    if (!scratch || scratch_floats < FT_GEMM_SCRATCH_FLOATS) return false;
    g.shape = N <= g.isa->nr[1];
    g.mr = g.isa->mr[g.shape];
    g.nr = g.isa->nr[g.shape];
    g.bp = scratch;
    g.n_panels = (M + g.mr - 1) / g.mr;
    /* a few tasks per thread, so a descheduled thread's share goes to the
     * others (the grouping does not change any output's sums) */
    int n_tasks = 4 * n_threads < g.n_panels ? 4 * n_threads : g.n_panels;
    g.group = (g.n_panels + n_tasks - 1) / n_tasks;
    n_tasks = (g.n_panels + g.group - 1) / g.group;
    for (g.n0 = 0; g.n0 < N; g.n0 += FT_GEMM_NC) {
        g.nw = N - g.n0 < FT_GEMM_NC ? N - g.n0 : FT_GEMM_NC;
        for (g.k0 = 0; g.k0 < K; g.k0 += FT_GEMM_KC) {
            g.kc = K - g.k0 < FT_GEMM_KC ? K - g.k0 : FT_GEMM_KC;
            g.overwrite = !accumulate && g.k0 == 0;
            int pack_tasks = B->dt == FT_F32 && B->cs != 1 ? (g.nw + g.nr - 1) / g.nr : (g.kc + PACK_ROWS - 1) / PACK_ROWS;
            ft_parallel_for(n_threads, pack_tasks, pack_b, &g);
            ft_parallel_for(n_threads, n_tasks, panels, &g);
        }
    }
    return true;
}
