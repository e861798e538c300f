/* linear.c — y = x·Wᵀ + b (+ a LoRA adapter) for a weight W in any dtype,
 * and its backward. Every product goes through the one driver in
 * kernels.h (W widened or dequantized a block at a time, never whole):
 * forward W·xᵀ, dX = dY·W, dW += dYᵀ·X (for any dtype of W: the gradient
 * does not depend on it), and the adapter's part through its kind's ops
 * table (adapter_kind.h). Every product is in the caller's compute type
 * (ft_gemm_in: f32, or bf16/f16 operands with f32 sums). */
#include "nn/linear.h"
#include "cpu/kernels.h"
#include "ops/ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the u = x·Aᵀ area of the scratch holds TILE_ROWS·in floats */
#define TILE_ROWS 128

static void add_bias(float *out, const float *bias, int T, int OC) {
    if (!bias) return;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OC; o++) out[(size_t)t * OC + o] += bias[o];
}

/* ft_gemm declines only sizes, dtypes or scratch that the callers here
 * never pass for a layer the loaders accepted: our bug, not bad input. */
static void gemm_checked(bool ok, const ft_linear *l, const char *what) {
    if (ok) return;
    fprintf(stderr, "ftune: internal error: %s of %s (%s, %d -> %d) was declined by the kernels\n", what, l->w.name,
            ft_types[l->w.dtype].name, l->in, l->out);
    abort();
}

/* Scratch layout: [ft_gemm's packing | u area: TILE_ROWS·in] */
size_t ft_linear_scratch_floats(int in, int n_threads) {
    (void)n_threads;
    return FT_GEMM_SCRATCH_FLOATS + (size_t)TILE_ROWS * in;
}

/* out = inp · W^T + bias, without the adapter; W, in any dtype, is read
 * along its rows either way. Few rows: as its transpose W · inpᵀ, W the
 * broadcast operand widened panel by panel and out written transposed
 * (a scalar store per output per 1024 of IC); many rows: inp as the
 * broadcast operand and Wᵀ packed once (a scalar store per weight).
 * Those costs per multiply-add are ~1/IC + 1/OC and ~1/T. */
void ft_round_array_in(ft_dtype compute, float *dst, const float *src, size_t n) {
    if (compute == FT_F32) {
        if (dst != src) memmove(dst, src, n * sizeof(float));
        return;
    }
    if (compute == FT_BF16) { /* vectorised, the same bits */
        ft_bf16_round_fast(dst, src, n, 1);
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = ft_round_in(compute, src[i]);
}

static void base_forward(ft_dtype compute, float *out, const float *inp, const ft_linear *l, int T, int n_threads,
                         float *scratch) {
    int IC = l->in, OC = l->out;
    bool transposed = (double)T * (IC + OC) < (double)IC * OC;
    ft_mat X = ft_mat_f32(inp, IC, 1), Xt = ft_mat_f32(inp, 1, IC);
    ft_mat W = ft_mat_rows(l->w.data, l->w.dtype, IC), Wt = ft_mat_rows_t(l->w.data, l->w.dtype, IC);
    bool ok = transposed ? ft_gemm_in(compute, out, 1, OC, &W, &Xt, OC, T, IC, 1.0f, false, n_threads, scratch,
                                      FT_GEMM_SCRATCH_FLOATS)
                         : ft_gemm_in(compute, out, OC, 1, &X, &Wt, T, OC, IC, 1.0f, false, n_threads, scratch,
                                      FT_GEMM_SCRATCH_FLOATS);
    gemm_checked(ok, l, "the forward");
    add_bias(out, l->bias, T, OC);
}

void ft_linear_forward(float *out, const float *inp, const ft_linear *l, const ft_adapter_inst *a, int T,
                       int n_threads, float *scratch) {
    ft_linear_forward_in(FT_F32, out, inp, l, a, T, n_threads, scratch);
}

void ft_linear_forward_in(ft_dtype compute, float *out, const float *inp, const ft_linear *l,
                          const ft_adapter_inst *a, int T, int n_threads, float *scratch) {
    base_forward(compute, out, inp, l, T, n_threads, scratch);
    if (!a) return;
    /* the adapter's u goes through the (now free) tile area of the
     * scratch, a chunk of rows at a time: 128·in floats hold 128·in/R rows */
    float *u = scratch + FT_GEMM_SCRATCH_FLOATS;
    int rows = (int)((size_t)TILE_ROWS * l->in / (size_t)a->kind->saved_floats(a));
    if (rows < 1) rows = 1;
    for (int t0 = 0; t0 < T; t0 += rows) {
        int n = T - t0 < rows ? T - t0 : rows;
        a->kind->forward(compute, out + (size_t)t0 * l->out, u, inp + (size_t)t0 * l->in, a, n, l->in, l->out,
                         n_threads, scratch);
    }
}

void ft_linear_forward_ref(float *out, const float *inp, const ft_linear *l, const ft_adapter_inst *a, int T) {
    ft_linear_forward_ref_in(FT_F32, out, inp, l, a, T);
}

void ft_linear_forward_ref_in(ft_dtype compute, float *out, const float *inp, const ft_linear *l,
                              const ft_adapter_inst *a, int T) {
    int IC = l->in, OC = l->out;
    float *w = malloc((size_t)OC * IC * sizeof(float));
    float *xr = compute != FT_F32 ? malloc((size_t)T * IC * sizeof(float)) : NULL;
    if (!w || (compute != FT_F32 && !xr)) { free(w); free(xr); return; }
    for (int o = 0; o < OC; o++) ft_tensor_row_f32(&l->w, o, w + (size_t)o * IC);
    if (xr) {
        ft_round_array_in(compute, w, w, (size_t)OC * IC);
        ft_round_array_in(compute, xr, inp, (size_t)T * IC);
    }
    ft_matmul_forward_ref(out, xr ? xr : inp, w, l->bias, T, IC, OC);
    free(w);
    free(xr);
    if (!a) return;
    float *u = malloc((size_t)T * a->kind->saved_floats(a) * sizeof(float));
    if (!u) return;
    a->kind->forward_ref(compute, out, u, inp, a, T, IC, OC);
    free(u);
}

/* Training scratch layout: [linear_scratch_floats | xd (T, in) | g (T, R)] */
size_t ft_linear_train_scratch_floats(int in, int R, int T, int n_threads) {
    return ft_linear_scratch_floats(in, n_threads) + (size_t)T * in + (size_t)T * R;
}

void ft_linear_forward_train(float *out, float *u, const float *inp, const ft_linear *l, const ft_adapter_inst *a,
                             int T, uint64_t mask_seed, int n_threads, float *scratch) {
    ft_linear_forward_train_in(FT_F32, out, u, inp, l, a, T, mask_seed, n_threads, scratch);
}

void ft_linear_forward_train_in(ft_dtype compute, float *out, float *u, const float *inp, const ft_linear *l,
                                const ft_adapter_inst *a, int T, uint64_t mask_seed, int n_threads, float *scratch) {
    base_forward(compute, out, inp, l, T, n_threads, scratch);
    if (!a) return;
    float *xd = scratch + ft_linear_scratch_floats(l->in, n_threads);
    a->kind->forward_train(compute, out, u, inp, a, T, l->in, l->out, mask_seed, xd, n_threads, scratch);
}

void ft_linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *u,
                        const ft_linear *l, const ft_adapter_inst *a, int T, uint64_t mask_seed, bool accumulate,
                        int n_threads, float *scratch) {
    ft_linear_backward_in(FT_F32, dinp, dw, dbias, dout, inp, u, l, a, T, mask_seed, accumulate, n_threads, scratch);
}

void ft_linear_backward_in(ft_dtype compute, float *dinp, float *dw, float *dbias, const float *dout,
                           const float *inp, const float *u, const ft_linear *l, const ft_adapter_inst *a, int T,
                           uint64_t mask_seed, bool accumulate, int n_threads, float *scratch) {
    int IC = l->in, OC = l->out;
    ft_mat D = ft_mat_f32(dout, OC, 1);
    if (dinp) { /* dinp (T, IC) = dout (T, OC) · W (OC, IC): W read along its rows, widened a block at a time */
        ft_mat W = ft_mat_rows(l->w.data, l->w.dtype, IC);
        gemm_checked(ft_gemm_in(compute, dinp, IC, 1, &D, &W, T, IC, OC, 1.0f, accumulate, n_threads, scratch,
                                FT_GEMM_SCRATCH_FLOATS), l, "the input gradient");
    }
    if (dw) { /* dw (OC, IC) += doutᵀ · inp */
        ft_mat Dt = ft_mat_f32(dout, 1, OC), X = ft_mat_f32(inp, IC, 1);
        gemm_checked(ft_gemm_in(compute, dw, IC, 1, &Dt, &X, OC, IC, T, 1.0f, true, n_threads, scratch,
                                FT_GEMM_SCRATCH_FLOATS), l, "the weight gradient");
    }
    if (dbias)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)t * OC + o];
    if (!a) return;
    float *xd = scratch + ft_linear_scratch_floats(IC, n_threads), *g = xd + (size_t)T * IC;
    a->kind->backward(compute, dinp, dout, inp, u, a, T, IC, OC, mask_seed, xd, g, n_threads, scratch);
}
