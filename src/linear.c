/* linear.c — y = x·Wᵀ + b (+ a LoRA adapter) for a weight W in any dtype,
 * and its backward. The forward first tries the SIMD kernels for this CPU
 * (kernels.h). Otherwise, and in backward: f32 weights go straight to BLAS.
 * Other dtypes: one row of input (decode) uses a fused dequantize-and-dot
 * per output row, in parallel; several rows dequantize W a tile of output
 * rows at a time into f32 and call sgemm, so the f32 copy of W never exists
 * whole (forward and backward to the input alike). */
#include "linear.h"
#include "cpu.h"
#include "kernels.h"
#include "ops.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define TILE_ROWS 128

static void add_bias(float *out, const float *bias, int T, int OC) {
    if (!bias) return;
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OC; o++) out[(size_t)t * OC + o] += bias[o];
}

static float dot_f32(const float *a, const float *b, int n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i]; s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2]; s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* bf16 rows: widen on the fly (a shift) instead of a full dequantize pass. */
static float dot_bf16(const uint16_t *w, const float *x, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += ft_bf16_to_f32(w[i + j]) * x[i + j];
    float r = 0;
    for (int j = 0; j < 8; j++) r += s[j];
    for (; i < n; i++) r += ft_bf16_to_f32(w[i]) * x[i];
    return r;
}

size_t linear_scratch_floats(int in, int n_threads) {
    return (size_t)TILE_ROWS * in + (size_t)n_threads * in;
}

static void gemv_any(float *out, const float *inp, const ft_linear *l, int n_threads, float *scratch) {
    const ft_type_traits *tr = &ft_types[l->w.dtype];
    size_t row_bytes = (size_t)ft_dtype_nbytes(l->w.dtype, l->in);
    const uint8_t *W = l->w.data;
    int IC = l->in;
#pragma omp parallel num_threads(n_threads)
    {
        float *row = scratch + (size_t)omp_get_thread_num() * IC;
#pragma omp for schedule(static)
        for (int o = 0; o < l->out; o++) {
            const uint8_t *wr = W + (size_t)o * row_bytes;
            if (l->w.dtype == FT_BF16) out[o] = dot_bf16((const uint16_t *)wr, inp, IC);
            else {
                tr->to_f32(wr, row, IC);
                out[o] = dot_f32(row, inp, IC);
            }
        }
    }
}

/* Dequantizes rows [o0, o0+nr) of W into tile (nr, in). */
static void dequant_tile(float *tile, const ft_linear *l, int o0, int nr, int n_threads) {
    const ft_type_traits *tr = &ft_types[l->w.dtype];
    size_t row_bytes = (size_t)ft_dtype_nbytes(l->w.dtype, l->in);
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int r = 0; r < nr; r++)
        tr->to_f32((const uint8_t *)l->w.data + (size_t)(o0 + r) * row_bytes, tile + (size_t)r * l->in, l->in);
}

/* The fastest kernels this CPU has (kernels.h); false when none applies and
 * the portable paths below (BLAS for f32) should run. */
static bool fast_forward(float *out, const float *inp, const ft_linear *l, int T, int n_threads, float *scratch) {
    size_t n = linear_scratch_floats(l->in, n_threads);
    int level = ft_cpu_level();
    if (level >= FT_CPU_AVX512 &&
        ft_matmul_avx512(out, inp, l->w.data, l->w.dtype, T, l->in, l->out, n_threads, scratch, n))
        return true;
    return level >= FT_CPU_AVX2 &&
           ft_matmul_avx2(out, inp, l->w.data, l->w.dtype, T, l->in, l->out, n_threads, scratch, n);
}

/* out = inp · W^T + bias, without the adapter. */
static void base_forward(float *out, const float *inp, const ft_linear *l, int T, int n_threads, float *scratch) {
    int IC = l->in, OC = l->out;
    if (fast_forward(out, inp, l, T, n_threads, scratch)) {
    } else if (l->w.dtype == FT_F32) {
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, l->w.data, IC, inp, 1, 0.0f, out, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, IC, 1.0f, inp, IC, l->w.data, IC,
                        0.0f, out, OC);
    } else if (T == 1) {
        gemv_any(out, inp, l, n_threads, scratch);
    } else {
        float *tile = scratch;
        for (int o0 = 0; o0 < OC; o0 += TILE_ROWS) {
            int nr = OC - o0 < TILE_ROWS ? OC - o0 : TILE_ROWS;
            dequant_tile(tile, l, o0, nr, n_threads);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nr, IC, 1.0f, inp, IC, tile, IC, 0.0f,
                        out + o0, OC);
        }
    }
    add_bias(out, l->bias, T, OC);
}

void linear_forward(float *out, const float *inp, const ft_linear *l, int T, int n_threads, float *scratch) {
    base_forward(out, inp, l, T, n_threads, scratch);
    const ft_lora *a = l->lora;
    if (!a) return;
    /* the adapter's u = x·A^T goes through the (now free) tile area of the
     * scratch, a chunk of rows at a time: 128·in floats hold 128·in/R rows */
    int rows = (int)((size_t)TILE_ROWS * l->in / (size_t)a->r);
    if (rows < 1) rows = 1;
    for (int t0 = 0; t0 < T; t0 += rows) {
        int n = T - t0 < rows ? T - t0 : rows;
        lora_forward(out + (size_t)t0 * l->out, scratch, inp + (size_t)t0 * l->in, a, n, l->in, l->out);
    }
}

void linear_forward_ref(float *out, const float *inp, const ft_linear *l, int T) {
    int IC = l->in, OC = l->out;
    float *w = malloc((size_t)OC * IC * sizeof(float));
    if (!w) return;
    for (int o = 0; o < OC; o++) ft_tensor_row_f32(&l->w, o, w + (size_t)o * IC);
    matmul_forward_ref(out, inp, w, l->bias, T, IC, OC);
    free(w);
    const ft_lora *a = l->lora;
    if (!a) return;
    for (int t = 0; t < T; t++) {
        const float *x = inp + (size_t)t * IC;
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int k = 0; k < a->r; k++) {
                double u = 0;
                for (int i = 0; i < IC; i++) u += (double)a->A[(size_t)k * IC + i] * x[i];
                s += u * a->B[(size_t)o * a->r + k];
            }
            out[(size_t)t * OC + o] += (float)(a->scale * s);
        }
    }
}

/* Training scratch layout: [tile + per-thread rows | xd (T, in) | g (T, R)] */
size_t linear_train_scratch_floats(int in, int R, int T, int n_threads) {
    return linear_scratch_floats(in, n_threads) + (size_t)T * in + (size_t)T * R;
}

void linear_forward_train(float *out, float *u, const float *inp, const ft_linear *l, int T, uint64_t mask_seed,
                          int n_threads, float *scratch) {
    base_forward(out, inp, l, T, n_threads, scratch);
    const ft_lora *a = l->lora;
    if (!a) return;
    const float *x = inp;
    if (a->dropout > 0) {
        float *xd = scratch + linear_scratch_floats(l->in, n_threads);
        lora_dropout(xd, inp, a->dropout, mask_seed, T, l->in, n_threads);
        x = xd;
    }
    lora_forward(out, u, x, a, T, l->in, l->out);
}

void linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *u,
                     const ft_linear *l, int T, uint64_t mask_seed, bool accumulate, int n_threads, float *scratch) {
    int IC = l->in, OC = l->out;
    if (dinp) {
        float beta = accumulate ? 1.0f : 0.0f;
        if (l->w.dtype == FT_F32) {
            /* dinp (T, IC) = dout (T, OC) · W (OC, IC) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IC, OC, 1.0f, dout, OC, l->w.data, IC, beta,
                        dinp, IC);
        } else {
            for (int o0 = 0; o0 < OC; o0 += TILE_ROWS) {
                int nr = OC - o0 < TILE_ROWS ? OC - o0 : TILE_ROWS;
                dequant_tile(scratch, l, o0, nr, n_threads);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IC, nr, 1.0f, dout + o0, OC, scratch, IC,
                            o0 == 0 ? beta : 1.0f, dinp, IC);
            }
        }
    }
    if (dw && l->w.dtype == FT_F32) /* dw (OC, IC) += dout^T · inp */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, T, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)t * OC + o];
    const ft_lora *a = l->lora;
    if (!a) return;
    float *xd = scratch + linear_scratch_floats(IC, n_threads), *g = xd + (size_t)T * IC;
    const float *x = inp;
    if (a->dropout > 0) {
        lora_dropout(xd, inp, a->dropout, mask_seed, T, IC, n_threads);
        x = xd;
    }
    /* the adapter's dx lands in xd (lora_backward writes it last, after x
     * was read), then goes back through the same mask */
    lora_backward(dinp ? xd : NULL, dout, x, u, a, T, IC, OC, g);
    if (!dinp) return;
    if (a->dropout > 0) lora_dropout(xd, xd, a->dropout, mask_seed, T, IC, n_threads);
    for (size_t i = 0; i < (size_t)T * IC; i++) dinp[i] += xd[i];
}
