/* linear.c — y = x·Wᵀ + b for a frozen weight W in any dtype.
 * f32 weights go straight to BLAS. Other dtypes: one row of input (decode)
 * uses a fused dequantize-and-dot per output row, in parallel; several rows
 * dequantize W a tile of output rows at a time into f32 and call sgemm, so
 * the f32 copy of W never exists whole. */
#include "linear.h"
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

void linear_forward(float *out, const float *inp, const ft_linear *l, int T, int n_threads, float *scratch) {
    int IC = l->in, OC = l->out;
    if (l->w.dtype == FT_F32) {
        if (T == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, IC, 1.0f, l->w.data, IC, inp, 1, 0.0f, out, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, IC, 1.0f, inp, IC, l->w.data, IC,
                        0.0f, out, OC);
    } else if (T == 1) {
        gemv_any(out, inp, l, n_threads, scratch);
    } else {
        const ft_type_traits *tr = &ft_types[l->w.dtype];
        size_t row_bytes = (size_t)ft_dtype_nbytes(l->w.dtype, IC);
        float *tile = scratch;
        for (int o0 = 0; o0 < OC; o0 += TILE_ROWS) {
            int nr = OC - o0 < TILE_ROWS ? OC - o0 : TILE_ROWS;
#pragma omp parallel for num_threads(n_threads) schedule(static)
            for (int r = 0; r < nr; r++)
                tr->to_f32((const uint8_t *)l->w.data + (size_t)(o0 + r) * row_bytes, tile + (size_t)r * IC, IC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nr, IC, 1.0f, inp, IC, tile, IC, 0.0f,
                        out + o0, OC);
        }
    }
    add_bias(out, l->bias, T, OC);
}

void linear_forward_ref(float *out, const float *inp, const ft_linear *l, int T) {
    float *w = malloc((size_t)l->out * l->in * sizeof(float));
    for (int o = 0; o < l->out; o++) ft_tensor_row_f32(&l->w, o, w + (size_t)o * l->in);
    matmul_forward_ref(out, inp, w, l->bias, T, l->in, l->out);
    free(w);
}
