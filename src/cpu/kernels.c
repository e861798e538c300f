/* kernels.c — the matrix-product driver of kernels.h, written once for
 * every instruction set: the level's primitives (kernels_<isa>.c) do the
 * arithmetic, this file does the blocking, the packing and the threads.
 *
 * C (M, N) = alpha·A·B (+ C) goes FT_GEMM_NC columns × FT_GEMM_KCH of K at
 * a time: B's chunk is packed once into scratch (f32, nr-column strips,
 * zero-padded), shared by all threads; then tasks of a few mr-row panels of
 * A are handed out (ft_parallel_for): each task packs its panel of A (f32
 * or widened from the weight dtype) FT_GEMM_KC of K at a time and runs the
 * register tile over every strip, accumulating in a local block, then adds alpha·(the chunk's sum) into C. Every output is written
 * by one task per chunk and chunks follow each other in order, so the
 * result does not depend on the thread count. N = 1 with a contiguous B
 * column (Linear's forward on one row: decode) skips the packing: a dot
 * product per row of A, four rows at a time sharing the loads of x. */
#include "cpu/kernels.h"
#include "cpu/cpu.h"
#include "core/parallel.h"

#include <stdlib.h>
#include <string.h>

extern const ft_kernel_isa ft_kernels_generic;
#if defined(__x86_64__)
extern const ft_kernel_isa ft_kernels_avx2, ft_kernels_avx512, ft_kernels_avx512bf16, ft_kernels_amx;
#endif

static const ft_kernel_isa *forced_isa; /* ft_kernels_force's table, or NULL */

void ft_kernels_force(const ft_kernel_isa *isa) { __atomic_store_n(&forced_isa, isa, __ATOMIC_RELAXED); }

const ft_kernel_isa *ft_kernels_current(void) {
    const ft_kernel_isa *isa = __atomic_load_n(&forced_isa, __ATOMIC_RELAXED);
    return isa ? isa : ft_kernels_for_level(ft_cpu_level());
}

const ft_kernel_isa *ft_kernels_for_level(int level) {
#if defined(__x86_64__)
    if (level >= FT_CPU_AMX) return &ft_kernels_amx;
    if (level >= FT_CPU_AVX512BF16) return &ft_kernels_avx512bf16;
    if (level >= FT_CPU_AVX512) return &ft_kernels_avx512;
    if (level >= FT_CPU_AVX2) return &ft_kernels_avx2;
#endif
    return &ft_kernels_generic;
}

/* bounds of every ISA's register tile: f32 (tile), bf16 pairs (tile16;
 * amx's 32 rows) */
#define MR_MAX 16
#define MR16_MAX 32
#define NR16_MAX 32
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
    ft_dtype compute;   /* FT_F32, or the type every operand element is rounded to */
    int n0, nw, k0, kc; /* the current chunk: columns [n0, n0+nw), K [k0, k0+kc) */
    float *bp;          /* B's chunk: strip s at bp + s·kc·nr, (kc, nr) */
    int n_panels, group;
    int kpad; /* bf16 pairs: B's strips hold this many pair rows (the chunk's, or rounded up to 16 with zeros) */
} gemm_ctx;

static const uint8_t *row_at(const ft_mat *m, int64_t i) {
    return m->dt == FT_F32 ? (const uint8_t *)((const float *)m->p + i * m->rs) : (const uint8_t *)m->p + i * m->rs;
}

/* x[0..n) rounded to the compute type (RNE), kept as f32; nothing for f32. */
static void round_to(float *x, int n, ft_dtype compute) {
    if (compute == FT_BF16)
        for (int i = 0; i < n; i++) x[i] = ft_bf16_to_f32(ft_f32_to_bf16(x[i]));
    else if (compute == FT_F16)
        for (int i = 0; i < n; i++) x[i] = ft_f16_to_f32(ft_f32_to_f16(x[i]));
}

/* Whether an operand's elements need rounding: they are not stored in the
 * compute type already. */
static bool needs_round(const ft_mat *m, ft_dtype compute) { return compute != FT_F32 && m->dt != compute; }

/* Whether B is read along k: a transposed weight, or f32 with k contiguous. */
static bool b_along_k(const ft_mat *B) { return B->dt != FT_F32 ? B->t : B->rs == 1 && B->cs != 1; }

/* B's chunk, either one strip per task (B read along k: its rows n
 * widened and dealt out to the strip's lanes) or PACK_ROWS rows of k per
 * task (B read along n, then dealt out to the strips). */
static void pack_b(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    const ft_mat *B = g->B;
    int nr = g->nr, kc = g->kc, ns = (g->nw + nr - 1) / nr;
    if (b_along_k(B) || (B->cs != 1 && B->rs != 1)) {
        float tmp[FT_GEMM_KCH];
        float *dst = g->bp + (size_t)task * kc * nr;
        int nl = g->nw - task * nr < nr ? g->nw - task * nr : nr;
        for (int l = 0; l < nr; l++) {
            int n = g->n0 + task * nr + l;
            if (l >= nl) {
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + l] = 0;
            } else if (b_along_k(B)) {
                const uint8_t *row = B->dt == FT_F32 ? (const uint8_t *)((const float *)B->p + (int64_t)n * B->cs)
                                                     : (const uint8_t *)B->p + (int64_t)n * B->rs;
                g->isa->widen(tmp, row, B->dt, g->k0, kc);
                if (needs_round(B, g->compute)) round_to(tmp, kc, g->compute);
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + l] = tmp[k];
            } else { /* f32 with no unit stride */
                const float *src = (const float *)B->p + (int64_t)n * B->cs + (int64_t)g->k0 * B->rs;
                for (int k = 0; k < kc; k++) tmp[k] = src[(int64_t)k * B->rs];
                round_to(tmp, kc, g->compute);
                for (int k = 0; k < kc; k++) dst[(size_t)k * nr + l] = tmp[k];
            }
        }
        return;
    }
    float tmp[FT_GEMM_NC];
    int k1 = (task + 1) * PACK_ROWS < kc ? (task + 1) * PACK_ROWS : kc;
    for (int k = task * PACK_ROWS; k < k1; k++) {
        const float *src = tmp;
        if (B->dt == FT_F32 && !needs_round(B, g->compute)) /* dealt out straight from the row */
            src = (const float *)row_at(B, g->k0 + k) + g->n0;
        else if (B->dt == FT_F32)
            memcpy(tmp, (const float *)row_at(B, g->k0 + k) + g->n0, (size_t)g->nw * sizeof(float));
        else
            g->isa->widen(tmp, row_at(B, g->k0 + k), B->dt, g->n0, g->nw);
        if (needs_round(B, g->compute)) round_to(tmp, g->nw, g->compute);
        for (int s = 0; s < ns; s++) {
            float *dst = g->bp + ((size_t)s * kc + k) * nr;
            int n = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            memcpy(dst, src + s * nr, (size_t)n * sizeof(float));
            memset(dst + n, 0, (size_t)(nr - n) * sizeof(float));
        }
    }
}

/* Rows [m0, m0+mr) of A, K [k0, k0+kc), row r at wp + r·FT_GEMM_KC;
 * rows past M are zero. */
static void pack_a(float *wp, const gemm_ctx *g, int m0, int k0, int kc) {
    const ft_mat *A = g->A;
    if (A->dt == FT_F32 && A->rs == 1 && A->cs != 1) { /* Aᵀ stored (dW, dB): the panel's rows side by side */
        int rows = g->M - m0 < g->mr ? g->M - m0 : g->mr;
        for (int k = 0; k < kc; k++) {
            const float *src = (const float *)A->p + (int64_t)(k0 + k) * A->cs + m0;
            /* each k is another cache line, often another page: the
             * hardware prefetchers do not follow, so ask 8 ahead */
            if (k + 8 < kc) __builtin_prefetch(src + 8 * A->cs);
            for (int r = 0; r < rows; r++) wp[(size_t)r * FT_GEMM_KC + k] = src[r];
        }
        for (int r = 0; r < g->mr; r++) {
            float *dst = wp + (size_t)r * FT_GEMM_KC;
            if (r >= rows) memset(dst, 0, (size_t)kc * sizeof(float));
            else if (needs_round(A, g->compute)) round_to(dst, kc, g->compute);
        }
        return;
    }
    for (int r = 0; r < g->mr; r++) {
        float *dst = wp + (size_t)r * FT_GEMM_KC;
        if (m0 + r >= g->M) {
            memset(dst, 0, (size_t)kc * sizeof(float));
        } else if (A->dt != FT_F32 || A->cs == 1) {
            g->isa->widen(dst, row_at(A, m0 + r), A->dt, k0, kc);
        } else {
            const float *src = (const float *)A->p + (int64_t)(m0 + r) * A->rs + (int64_t)k0 * A->cs;
            for (int k = 0; k < kc; k++) dst[k] = src[(int64_t)k * A->cs];
        }
        if (m0 + r < g->M && needs_round(A, g->compute)) round_to(dst, kc, g->compute);
    }
}

/* C's block (rows, cols) at (m0, n0) gets alpha·cb (cb: rows nr apart),
 * added or overwriting; along whichever of C's strides is 1. */
static void write_back(const gemm_ctx *g, const float *cb, int m0, int rows, int n0, int cols) {
    const float alpha = g->alpha;
    const bool overwrite = g->overwrite;
    const int64_t crs = g->c_rs, ccs = g->c_cs;
    const int nr = g->nr;
    float *restrict C = g->C;
    if (ccs == 1) {
        g->isa->store(C + (int64_t)m0 * crs + n0, crs, cb, nr, rows, cols, alpha, overwrite);
        return;
    }
    if (crs != 1) {
        for (int r = 0; r < rows; r++) {
            float *restrict d = C + (int64_t)(m0 + r) * crs + (int64_t)n0 * ccs;
            const float *c = cb + r * nr;
            for (int l = 0; l < cols; l++) d[l * ccs] = overwrite ? alpha * c[l] : d[l * ccs] + alpha * c[l];
        }
        return;
    }
    /* C transposed: rows are contiguous */
    if (g->isa->store_t) {
        g->isa->store_t(C + (int64_t)n0 * ccs + m0, ccs, cb, nr, rows, cols, alpha, overwrite);
        return;
    }
    for (int l = 0; l < cols; l++) {
        float *restrict d = C + (int64_t)(n0 + l) * ccs + m0;
        if (overwrite)
            for (int r = 0; r < rows; r++) d[r] = alpha * cb[r * nr + l];
        else
            for (int r = 0; r < rows; r++) d[r] += alpha * cb[r * nr + l];
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
        for (int kb = 0; kb < g->kc; kb += FT_GEMM_KC) {
            int kc = g->kc - kb < FT_GEMM_KC ? g->kc - kb : FT_GEMM_KC;
            /* a whole panel of f32 rows is read in place */
            const float *ap = wp;
            int64_t lda = FT_GEMM_KC;
            if (g->A->dt == FT_F32 && g->A->cs == 1 && rows == mr && !needs_round(g->A, g->compute)) {
                ap = (const float *)g->A->p + (int64_t)m0 * g->A->rs + g->k0 + kb;
                lda = g->A->rs;
            } else {
                pack_a(wp, g, m0, g->k0 + kb, kc);
            }
            for (int s = 0; s < ns; s++)
                g->isa->tile[g->shape](cb + (size_t)s * mr * nr, g->bp + ((size_t)s * g->kc + kb) * nr, ap, lda, kc,
                                       kb > 0);
        }
        for (int s = 0; s < ns; s++) {
            int cols = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            write_back(g, cb + (size_t)s * mr * nr, m0, rows, g->n0 + s * nr, cols);
        }
    }
}

/* ------------------------------------------------ bf16 pairs (tile16) */

/* Columns of a chunk of B in pairs: FT_GEMM_NC16, four times f32's. A's
 * panels are packed (an f32 A rounded to bf16, a bf16 one copied) once per
 * chunk of N, so the wider chunk does that a quarter as often: rounding x
 * again for every 256 columns took 17-19% of a training step's forward and
 * dX products at T·B = 2048 (llama-110m), and one thread's forward/dX went
 * from ~155 to ~185 GFLOP/s. The chunk's pairs for one FT_GEMM_KC slice
 * (128 × 1024 words, 512 KiB) stay in L2 across a panel's strips. */
#define NC16 FT_GEMM_NC16

/* Elements [k0, k0+n) of a row of A or B along its contiguous direction,
 * as bf16 bits: copied when stored in bf16, else rounded (RNE) from f32 or
 * from the dtype's exact widening, as round_to does. */
static void span_bf16(uint16_t *dst, const gemm_ctx *g, ft_dtype dt, const uint8_t *row, int k0, int n) {
    if (dt == FT_BF16) {
        memcpy(dst, (const uint16_t *)row + k0, (size_t)n * sizeof(uint16_t));
    } else if (dt == FT_F32) {
        g->isa->to_bf16(dst, (const float *)row + k0, n);
    } else {
        float tmp[FT_GEMM_NC > FT_GEMM_KCH ? FT_GEMM_NC : FT_GEMM_KCH];
        g->isa->widen(tmp, row, dt, k0, n);
        g->isa->to_bf16(dst, tmp, n);
    }
}

/* n f32 elements from p, stride st, as bf16 bits */
static void strided_bf16(uint16_t *dst, const gemm_ctx *g, const float *p, int64_t st, int n) {
    float tmp[FT_GEMM_NC > FT_GEMM_KCH ? FT_GEMM_NC : FT_GEMM_KCH];
    for (int i = 0; i < n; i++) tmp[i] = p[(int64_t)i * st];
    g->isa->to_bf16(dst, tmp, n);
}

/* Column n of B over the chunk's K as bf16, h[kc] = 0 (an odd kc's pad) */
static void column_bf16(uint16_t *h, const gemm_ctx *g, const ft_mat *B, int n, int kc) {
    if (b_along_k(B) && B->dt != FT_F32)
        span_bf16(h, g, B->dt, (const uint8_t *)B->p + (int64_t)n * B->rs, g->k0, kc);
    else if (b_along_k(B))
        span_bf16(h, g, FT_F32, (const uint8_t *)((const float *)B->p + (int64_t)n * B->cs), g->k0, kc);
    else
        strided_bf16(h, g, (const float *)B->p + (int64_t)n * B->cs + (int64_t)g->k0 * B->rs, B->rs, kc);
    h[kc] = 0;
}

/* B's chunk in pairs: strip s at bp + s·kp·nr words, (kp, nr), kp =
 * ceil(kc/2); tasks as in pack_b (a strip, or PACK_ROWS rows of k). */
static void pack_b16(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    const ft_mat *B = g->B;
    int nr = g->nr, kc = g->kc, kp = (kc + 1) / 2, ns = (g->nw + nr - 1) / nr;
    uint32_t *bp = (uint32_t *)g->bp;
    if (b_along_k(B) || (B->cs != 1 && B->rs != 1)) {
        uint16_t h[FT_GEMM_KCH + 2];
        uint32_t *dst = bp + (size_t)task * g->kpad * nr;
        int nl = g->nw - task * nr < nr ? g->nw - task * nr : nr;
        if (g->isa->pack_cols16 && nr % 16 == 0) { /* 16 columns' pairs, then one transpose per 16 pairs */
            uint16_t hs[16][FT_GEMM_KCH + 2] __attribute__((aligned(64)));
            for (int l0 = 0; l0 < nr; l0 += 16) {
                int nc = nl - l0 < 16 ? (nl - l0 > 0 ? nl - l0 : 0) : 16;
                for (int j = 0; j < nc; j++) {
                    int n = g->n0 + task * nr + l0 + j;
                    column_bf16(hs[j], g, B, n, kc);
                }
                g->isa->pack_cols16(dst + l0, nr, (const uint32_t *)hs[0], (FT_GEMM_KCH + 2) / 2, nc, kp);
            }
            return;
        }
        for (int l = 0; l < nr; l++) {
            int n = g->n0 + task * nr + l;
            if (l >= nl) {
                for (int p = 0; p < kp; p++) dst[(size_t)p * nr + l] = 0;
                continue;
            }
            column_bf16(h, g, B, n, kc);
            for (int p = 0; p < kp; p++) dst[(size_t)p * nr + l] = (uint32_t)h[2 * p] | (uint32_t)h[2 * p + 1] << 16;
        }
        return;
    }
    uint16_t h0[NC16], h1[NC16];
    int p1 = (task + 1) * PACK_ROWS / 2 < kp ? (task + 1) * PACK_ROWS / 2 : kp;
    const bool f32 = B->dt == FT_F32; /* f32 rows are rounded straight into pairs; others through h0, h1 */
    for (int p = task * PACK_ROWS / 2; p < p1; p++) {
        const float *r0 = NULL, *r1 = NULL;
        if (f32) {
            r0 = (const float *)row_at(B, g->k0 + 2 * p) + g->n0;
            if (2 * p + 1 < kc) r1 = (const float *)row_at(B, g->k0 + 2 * p + 1) + g->n0;
        } else {
            span_bf16(h0, g, B->dt, row_at(B, g->k0 + 2 * p), g->n0, g->nw);
            if (2 * p + 1 < kc) span_bf16(h1, g, B->dt, row_at(B, g->k0 + 2 * p + 1), g->n0, g->nw);
            else memset(h1, 0, sizeof h1);
        }
        for (int s = 0; s < ns; s++) {
            uint32_t *dst = bp + ((size_t)s * g->kpad + p) * nr;
            int n = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            if (f32) g->isa->pair_rows16_f32(dst, r0 + s * nr, r1 ? r1 + s * nr : NULL, n);
            else g->isa->pair_rows16(dst, h0 + s * nr, h1 + s * nr, n);
            for (int l = n; l < nr; l++) dst[l] = 0;
        }
    }
}

/* Rows [m0, m0+mr) of A, K [k0, k0+kc), in pairs: row r at wp + r·ld
 * words; rows past M are zero. */
static void pack_a16_rows(uint32_t *wp, int64_t ld, const gemm_ctx *g, int m0, int k0, int kc) {
    const ft_mat *A = g->A;
    int kp = (kc + 1) / 2;
    if (A->dt == FT_F32 && A->rs == 1 && A->cs != 1) { /* Aᵀ stored: read along m, 16 rows a register transpose */
        int rows = g->M - m0 < g->mr ? g->M - m0 : g->mr;
        const float *src = (const float *)A->p + (int64_t)k0 * A->cs + m0;
        for (int r0 = 0; r0 < rows; r0 += 16)
            g->isa->pack_at16(wp + (size_t)r0 * ld, ld, src + r0, A->cs,
                              rows - r0 < 16 ? rows - r0 : 16, kc);
        for (int r = rows; r < g->mr; r++) memset(wp + (size_t)r * ld, 0, (size_t)kp * sizeof(uint32_t));
        return;
    }
    for (int r = 0; r < g->mr; r++) {
        uint32_t *dst = wp + (size_t)r * ld;
        if (m0 + r >= g->M) {
            memset(dst, 0, (size_t)kp * sizeof(uint32_t));
            continue;
        }
        uint16_t *h = (uint16_t *)dst;
        if (A->dt != FT_F32 || A->cs == 1)
            span_bf16(h, g, A->dt, row_at(A, m0 + r), k0, kc);
        else
            strided_bf16(h, g, (const float *)A->p + (int64_t)(m0 + r) * A->rs + (int64_t)k0 * A->cs, A->cs, kc);
        if (kc % 2) h[kc] = 0;
    }
}

/* The same, each row's pairs zero from kp up to kp16 (the tile unit's
 * whole 16-pair steps: kpad below) */
static void pack_a16(uint32_t *wp, int64_t ld, const gemm_ctx *g, int m0, int k0, int kc, int kp16) {
    pack_a16_rows(wp, ld, g, m0, k0, kc);
    int kp = (kc + 1) / 2;
    if (kp16 > kp)
        for (int r = 0; r < g->mr; r++) memset(wp + (size_t)r * ld + kp, 0, (size_t)(kp16 - kp) * 4);
}

/* The pairs of the K slice [kb, kb + kc) of the chunk that the tiles run:
 * the last slice's rounded up to the zeros past it where kpad has them */
static inline int slice_pairs(const gemm_ctx *g, int kb, int kc) {
    return kb + FT_GEMM_KC >= g->kc ? g->kpad - kb / 2 : (kc + 1) / 2;
}

static void panels16(void *vctx, int task, int thread) {
    (void)thread;
    const gemm_ctx *g = vctx;
    uint32_t wp[MR16_MAX * FT_GEMM_KC / 2] __attribute__((aligned(64)));
    /* strip s at cb + s·mr·nr, (mr, nr); or, for one strip on the tiles,
     * the whole chunk's A panel (rows FT_GEMM_KCH/2 words apart) */
    union {
        float cb[MR16_MAX * NC16];
        uint32_t wide[MR16_MAX * FT_GEMM_KCH / 2];
    } u __attribute__((aligned(64)));
    float *cb = u.cb;
    float c1[MR16_MAX * NR16_MAX] __attribute__((aligned(64)));
    const uint32_t *bp = (const uint32_t *)g->bp;
    int mr = g->mr, nr = g->nr, ns = (g->nw + nr - 1) / nr;
    int p1 = (task + 1) * g->group < g->n_panels ? (task + 1) * g->group : g->n_panels;
    if (g->isa->tiles_begin) g->isa->tiles_begin(); /* the tile state is this task's (kernels.h) */
    if (ns == 1 && g->isa->tiles_begin) {
        /* One strip (N <= 32: LoRA's u = x·Aᵀ and g = dY·B): the panel is
         * used once, so it is packed over the whole chunk and one call runs
         * it with the accumulators in the tiles throughout, instead of C
         * stored and loaded again every 256 of k (the same sums in the same
         * order: the same bits) */
        for (int p = task * g->group; p < p1; p++) {
            int m0 = p * mr, rows = g->M - m0 < mr ? g->M - m0 : mr;
            for (int kb = 0; kb < g->kc; kb += FT_GEMM_KC) {
                int kc = g->kc - kb < FT_GEMM_KC ? g->kc - kb : FT_GEMM_KC;
                int kp = slice_pairs(g, kb, kc);
                pack_a16(u.wide + kb / 2, FT_GEMM_KCH / 2, g, m0, g->k0 + kb, kc, kp);
            }
            g->isa->tile16[g->shape](c1, bp, u.wide, FT_GEMM_KCH / 2, g->kpad, false);
            write_back(g, c1, m0, rows, g->n0, g->nw);
        }
        g->isa->tiles_end();
        return;
    }
    for (int p = task * g->group; p < p1; p++) {
        int m0 = p * mr, rows = g->M - m0 < mr ? g->M - m0 : mr;
        for (int kb = 0; kb < g->kc; kb += FT_GEMM_KC) {
            int kc = g->kc - kb < FT_GEMM_KC ? g->kc - kb : FT_GEMM_KC;
            int kp = slice_pairs(g, kb, kc);
            pack_a16(wp, FT_GEMM_KC / 2, g, m0, g->k0 + kb, kc, kp);
            for (int s = 0; s < ns; s++)
                g->isa->tile16[g->shape](cb + (size_t)s * mr * nr, bp + ((size_t)s * g->kpad + kb / 2) * nr, wp,
                                         FT_GEMM_KC / 2, kp, kb > 0);
        }
        for (int s = 0; s < ns; s++) {
            int cols = g->nw - s * nr < nr ? g->nw - s * nr : nr;
            write_back(g, cb + (size_t)s * mr * nr, m0, rows, g->n0 + s * nr, cols);
        }
    }
    if (g->isa->tiles_end) g->isa->tiles_end();
}

/* The GEMV path: out[i·os] (+)= alpha · (row i of R) · v for the n rows
 * of R (rb bytes apart, dtype dt, K elements each). */
typedef struct {
    const ft_kernel_isa *isa;
    const uint8_t *R;
    size_t rb;
    ft_dtype dt;
    const float *v;
    float *out;
    int64_t os;
    int n, K;
    float alpha;
    bool overwrite;
    const uint32_t *v16; /* bf16 rows on dot_rows16: v as bf16 pairs, else NULL */
    const void *vq;      /* integer products: v quantized to ft_types[dt].act, else NULL */
    void (*idot)(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows);
} gemv_ctx;

static _Thread_local bool int_dot_on;

bool ft_gemm_set_int_dot(bool on) {
    bool was = int_dot_on;
    int_dot_on = on;
    return was;
}

static void gemv(void *vctx, int task, int thread) {
    (void)thread;
    const gemv_ctx *g = vctx;
    int i1 = (task + 1) * GEMV_ROWS < g->n ? (task + 1) * GEMV_ROWS : g->n;
    const int step = g->vq ? 16 : 4; /* integer products take 16 rows a call (kernels_a16_avx512.c) */
    for (int i = task * GEMV_ROWS; i < i1; i += step) {
        int n = i1 - i < step ? i1 - i : step;
        float out[16];
        if (g->vq) g->idot(out, g->vq, g->R + (size_t)i * g->rb, g->rb, g->dt, g->K, n);
        else if (g->v16) g->isa->dot_rows16(out, g->v16, g->R + (size_t)i * g->rb, g->rb, g->K, n);
        else g->isa->dot_rows(out, g->v, g->R + (size_t)i * g->rb, g->rb, g->dt, g->K, n);
        for (int r = 0; r < n; r++) {
            float v = g->alpha * out[r], *d = g->out + (int64_t)(i + r) * g->os;
            *d = g->overwrite ? v : *d + v;
        }
    }
}

/* Rows along k of an operand (A's rows, or B's columns when read along
 * k), as (pointer, row bytes); false when it has none. */
static bool rows_along_k(const ft_mat *m, bool is_b, const uint8_t **p, size_t *rb) {
    *p = m->p;
    if (m->dt != FT_F32) {
        *rb = (size_t)m->rs;
        return m->t == is_b;
    }
    int64_t unit = is_b ? m->rs : m->cs, other = is_b ? m->cs : m->rs;
    *rb = (size_t)other * sizeof(float);
    return unit == 1;
}

/* A weight-dtype operand is read along its rows in whole blocks (a
 * pad_rows dtype, nf4, may end inside its zero-padded last block). */
static bool operand_ok(const ft_mat *m, int rows_len, bool may_t) {
    if (m->dt >= FT_NTYPES || !ft_types[m->dt].is_float) return false;
    if (m->dt == FT_F32) return true;
    return (!m->t || may_t) && (rows_len % ft_types[m->dt].block == 0 || ft_types[m->dt].pad_rows);
}

/* The GEMV path in a compute type: the vector is rounded into a copy (the
 * rows are already stored in the compute type) held in the scratch when
 * there is room, else on the stack or the heap; false when none is had. */
static bool gemv_run(gemv_ctx *v, ft_dtype compute, int n_threads, float *scratch, size_t scratch_floats) {
    float stack[1024], *vr = NULL;
    const ft_type_traits *tt = &ft_types[v->dt];
    if (compute == FT_F32 && int_dot_on && tt->vec_dot && v->K % ft_types[tt->act].block == 0) {
        /* the vector quantized once (2.25 bytes an element) */
        size_t bytes = ft_dtype_nbytes(tt->act, v->K), fl = (bytes + sizeof(float) - 1) / sizeof(float);
        vr = scratch && scratch_floats >= fl ? scratch : fl <= 1024 ? stack : ft_malloc(fl * sizeof(float));
        if (!vr) return false;
        ft_types[tt->act].quantize_act(v->v, vr, v->K);
        v->vq = vr;
#if defined(__x86_64__)
        v->idot = v->isa == &ft_kernels_generic ? ft_idot_rows_ref
                  : v->isa != &ft_kernels_avx2 && ft_cpu_has_avx512vnni() ? ft_idot_rows_avx512
                                                                             : ft_idot_rows_avx2;
#else
        v->idot = ft_idot_rows_ref;
#endif
    } else if (compute == FT_BF16 && v->dt == FT_BF16 && v->isa->dot_rows16) { /* v as bf16 pairs: K/2 + 1 floats' room */
        size_t words = (size_t)v->K / 2 + 1;
        vr = scratch && scratch_floats >= words ? scratch : words <= 1024 ? stack : ft_malloc(words * sizeof(float));
        if (!vr) return false;
        uint16_t *h = (uint16_t *)vr;
        v->isa->to_bf16(h, v->v, v->K);
        h[v->K] = 0;
        v->v16 = (const uint32_t *)vr;
    } else if (compute != FT_F32) {
        vr = scratch && scratch_floats >= (size_t)v->K ? scratch
             : v->K <= 1024                            ? stack
                                                       : ft_malloc((size_t)v->K * sizeof(float));
        if (!vr) return false;
        memcpy(vr, v->v, (size_t)v->K * sizeof(float));
        round_to(vr, v->K, compute);
        v->v = vr;
    }
    ft_parallel_for(n_threads, (v->n + GEMV_ROWS - 1) / GEMV_ROWS, gemv, v);
    if (vr && vr != stack && vr != scratch) free(vr);
    return true;
}

bool ft_gemm(float *C, int64_t c_rs, int64_t c_cs, const ft_mat *A, const ft_mat *B, int M, int N, int K, float alpha,
             bool accumulate, int n_threads, float *scratch, size_t scratch_floats) {
    return ft_gemm_in(FT_F32, C, c_rs, c_cs, A, B, M, N, K, alpha, accumulate, n_threads, scratch, scratch_floats);
}

bool ft_gemm_in(ft_dtype compute, float *C, int64_t c_rs, int64_t c_cs, const ft_mat *A, const ft_mat *B, int M, int N,
                int K, float alpha, bool accumulate, int n_threads, float *scratch, size_t scratch_floats) {
    if (compute != FT_F32 && compute != FT_BF16 && compute != FT_F16) return false;
    /* a weight A is read along its rows (K), a weight B along n or, seen
     * transposed, along k */
    if (M < 1 || N < 1 || K < 1 || !operand_ok(A, K, false) || !operand_ok(B, B->t ? K : N, true)) return false;
    if (n_threads < 1) n_threads = 1;
    const ft_kernel_isa *isa = __atomic_load_n(&forced_isa, __ATOMIC_RELAXED);
    gemm_ctx g = { .isa = isa ? isa : ft_kernels_for_level(ft_cpu_level()), .C = C, .c_rs = c_rs, .c_cs = c_cs, .A = A, .B = B,
                   .M = M, .N = N, .K = K, .alpha = alpha, .overwrite = !accumulate, .compute = compute };
    const uint8_t *rp;
    size_t rb;
    if (M == 1 && A->dt == FT_F32 && A->cs == 1 && !needs_round(B, compute) && rows_along_k(B, true, &rp, &rb)) {
        gemv_ctx v = { .isa = g.isa, .R = rp, .rb = rb, .dt = B->dt, .v = A->p, .out = C, .os = c_cs, .n = N, .K = K,
                       .alpha = alpha, .overwrite = !accumulate };
        return gemv_run(&v, compute, n_threads, scratch, scratch_floats);
    }
    if (N == 1 && B->dt == FT_F32 && B->rs == 1 && !needs_round(A, compute) && rows_along_k(A, false, &rp, &rb)) {
        gemv_ctx v = { .isa = g.isa, .R = rp, .rb = rb, .dt = A->dt, .v = B->p, .out = C, .os = c_rs, .n = M, .K = K,
                       .alpha = alpha, .overwrite = !accumulate };
        return gemv_run(&v, compute, n_threads, scratch, scratch_floats);
    }
    if (!scratch || scratch_floats < FT_GEMM_SCRATCH_FLOATS) return false;
    /* Few rows against many columns (the LoRA dA += gᵀ·x: R rows): as
     * Cᵀ = Bᵀ·Aᵀ, so the narrow tile runs down the long side and the packed
     * operand is the small one; B's weight rows along n cannot become A */
    ft_mat At, Bt;
    bool pairs = compute == FT_BF16 && g.isa->tile16[0];
    if (M <= 16 && N >= 4 * M && (B->dt == FT_F32 || B->t) && !pairs) {
        At = *B, Bt = *A;
        if (At.dt == FT_F32) At.rs = B->cs, At.cs = B->rs;
        else At.t = false;
        if (Bt.dt == FT_F32) Bt.rs = A->cs, Bt.cs = A->rs;
        else Bt.t = true;
        return ft_gemm_in(compute, C, c_cs, c_rs, &At, &Bt, N, M, K, alpha, accumulate, n_threads, scratch,
                          scratch_floats);
    }
    /* bf16 pairs, few columns against many rows with A stored k-major (the
     * LoRA dB += s·dYᵀ·u): as Cᵀ = Bᵀ·Aᵀ, so the long operand is packed from
     * its rows (k), read in order, instead of gathered a 64-byte piece of a
     * row of k at a time (that gather took 74% of the product). Every
     * output's sum is the same pairs in the same order: the same bits. */
    if (pairs && N <= g.isa->nr16[1] && M >= 4 * N && A->dt == FT_F32 && A->rs == 1 && A->cs != 1 &&
        B->dt == FT_F32) {
        At = (ft_mat){ .p = B->p, .dt = FT_F32, .rs = B->cs, .cs = B->rs };
        Bt = (ft_mat){ .p = A->p, .dt = FT_F32, .rs = A->cs, .cs = A->rs };
        return ft_gemm_in(compute, C, c_cs, c_rs, &At, &Bt, N, M, K, alpha, accumulate, n_threads, scratch,
                          scratch_floats);
    }
    /* bf16 in pairs on VDPBF16PS where the level has it; the chunk of B
     * then takes half the scratch. The narrow tile for few columns, or for
     * rows the narrow tile covers in one panel where the wide one needs
     * two (the LoRA dA += gᵀ·x: 16 rows, one panel of 16 rather than 12 + 4) */
    g.shape = N <= (pairs ? g.isa->nr16[1] : g.isa->nr[1]) ||
              (pairs && M > g.isa->mr16[0] && M <= g.isa->mr16[1]);
    g.mr = pairs ? g.isa->mr16[g.shape] : g.isa->mr[g.shape];
    g.nr = pairs ? g.isa->nr16[g.shape] : g.isa->nr[g.shape];
    g.bp = scratch;
    g.n_panels = (M + g.mr - 1) / g.mr;
    /* a few tasks per thread, so a descheduled thread's share goes to the
     * others (the grouping does not change any output's sums) */
    int n_tasks = 4 * n_threads < g.n_panels ? 4 * n_threads : g.n_panels;
    g.group = (g.n_panels + n_tasks - 1) / n_tasks;
    n_tasks = (g.n_panels + g.group - 1) / g.group;
    const int nc = pairs ? NC16 : FT_GEMM_NC;
    for (g.n0 = 0; g.n0 < N; g.n0 += nc) {
        g.nw = N - g.n0 < nc ? N - g.n0 : nc;
        for (g.k0 = 0; g.k0 < K; g.k0 += FT_GEMM_KCH) {
            g.kc = K - g.k0 < FT_GEMM_KCH ? K - g.k0 : FT_GEMM_KCH;
            g.overwrite = !accumulate && g.k0 == 0;
            bool strips = b_along_k(B) || (B->cs != 1 && B->rs != 1);
            int pack_tasks = strips ? (g.nw + g.nr - 1) / g.nr : (g.kc + PACK_ROWS - 1) / PACK_ROWS;
            /* the tile unit steps 16 pairs at a time: its strips end in zero
             * rows up to a multiple of 16, so that the k tail is read from
             * them, not copied into local tiles at every call (LoRA's K = r
             * products are all tail); the same zeros the copy added */
            int kp = (g.kc + 1) / 2;
            g.kpad = pairs && g.isa->tiles_begin ? (kp + 15) / 16 * 16 : kp;
            ft_parallel_for(n_threads, pack_tasks, pairs ? pack_b16 : pack_b, &g);
            if (g.kpad > kp)
                for (int s = 0; s < (g.nw + g.nr - 1) / g.nr; s++)
                    memset((uint32_t *)g.bp + ((size_t)s * g.kpad + kp) * g.nr, 0,
                           (size_t)(g.kpad - kp) * g.nr * sizeof(uint32_t));
            ft_parallel_for(n_threads, n_tasks, pairs ? panels16 : panels, &g);
        }
    }
    return true;
}
