/* lora.c — the LoRA adapter of a Linear, and the only place its maths
 * lives: PEFT initialisation, input dropout with masks regenerated from a
 * seed, the low-rank forward and backward on the kernels of kernels.h (the
 * _fast functions), in plain float loops and in double (the references
 * the tests and the reference backend use), and the fold into a weight row
 * (merge). linear.c combines these with the frozen base weight. */
#include "nn/linear.h"
#include "cpu/kernels.h"
#include "core/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float ft_lora_scale(float alpha, int r, bool rslora) {
    return rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
}

void ft_lora_init_A(float *A, int r, int in, ft_rng *rng) {
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/in) = 1/sqrt(in) */
    float bound = 1.0f / sqrtf((float)in);
    for (size_t i = 0; i < (size_t)r * in; i++) A[i] = (2.0f * ft_rng_uniform(rng) - 1.0f) * bound;
}

void ft_lora_merge_row(float *row, const ft_lora *a, int o, int in) {
    for (int r = 0; r < a->r; r++) {
        float s = a->scale * a->B[(size_t)o * a->r + r];
        const float *ar = a->A + (size_t)r * in;
        for (int j = 0; j < in; j++) row[j] += s * ar[j];
    }
}

void ft_lora_init(ft_lora *a, int r, float alpha, bool rslora, float dropout, float *A, float *B, float *dA, float *dB,
               int in, int out, ft_rng *rng) {
    a->r = r;
    a->alpha = alpha;
    a->rslora = rslora;
    a->scale = ft_lora_scale(alpha, r, rslora);
    a->dropout = dropout;
    a->A = A; a->B = B; a->dA = dA; a->dB = dB;
    ft_lora_init_A(A, r, in, rng);
    memset(B, 0, (size_t)out * r * sizeof(float));
    if (dA) memset(dA, 0, (size_t)r * in * sizeof(float));
    if (dB) memset(dB, 0, (size_t)out * r * sizeof(float));
}

typedef struct {
    float *xd;
    const float *inp;
    float keep, inv;
    uint64_t mask_seed;
    int in;
} dropout_ctx;

static void dropout_row(void *vctx, int t, int thread) {
    (void)thread;
    const dropout_ctx *c = vctx;
    ft_rng rng;
    ft_rng_seed(&rng, c->mask_seed ^ ((uint64_t)(t + 1) * 0xD1B54A32D192ED03ull));
    const float *x = c->inp + (size_t)t * c->in;
    float *y = c->xd + (size_t)t * c->in;
    for (int i = 0; i < c->in; i++) y[i] = ft_rng_uniform(&rng) < c->keep ? x[i] * c->inv : 0.0f;
}

void ft_lora_dropout(float *xd, const float *inp, float p, uint64_t mask_seed, int T, int in, int n_threads) {
    dropout_ctx c = { .xd = xd, .inp = inp, .keep = 1.0f - p, .inv = 1.0f / (1.0f - p), .mask_seed = mask_seed, .in = in };
    /* small inputs are not worth waking the threads for */
    ft_parallel_for((size_t)T * in > 65536 ? n_threads : 1, T, dropout_row, &c);
}

/* The products below are all f32 with sizes the callers have checked:
 * ft_gemm declining one is our bug. */
static void gemm_checked(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "ftune: internal error: the kernels declined the LoRA product %s\n", what);
    abort();
}
#define GEMM(what, C, crs, ccs, A, B, M, N, K, alpha, acc) \
    gemm_checked(ft_gemm(C, crs, ccs, A, B, M, N, K, alpha, acc, n_threads, scratch, FT_GEMM_SCRATCH_FLOATS), what)

void ft_lora_forward_fast(float *out, float *u, const float *x, const ft_lora *a, int T, int in, int OC, int n_threads,
                       float *scratch) {
    int R = a->r;
    ft_mat X = ft_mat_f32(x, in, 1), At = ft_mat_f32(a->A, 1, in);
    ft_mat U = ft_mat_f32(u, R, 1), Bt = ft_mat_f32(a->B, 1, R);
    GEMM("u = x·Aᵀ", u, R, 1, &X, &At, T, R, in, 1.0f, false);
    GEMM("out += scale·u·Bᵀ", out, OC, 1, &U, &Bt, T, OC, R, a->scale, true);
}

void ft_lora_backward_fast(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T, int in,
                        int OC, float *g, int n_threads, float *scratch) {
    int R = a->r;
    ft_mat D = ft_mat_f32(dout, OC, 1), Dt = ft_mat_f32(dout, 1, OC);
    ft_mat U = ft_mat_f32(u, R, 1), Bm = ft_mat_f32(a->B, R, 1);
    ft_mat G = ft_mat_f32(g, R, 1), Gt = ft_mat_f32(g, 1, R);
    ft_mat X = ft_mat_f32(x, in, 1), Am = ft_mat_f32(a->A, in, 1);
    if (a->dB) GEMM("dB += scale·doutᵀ·u", a->dB, R, 1, &Dt, &U, OC, R, T, a->scale, true);
    if (!a->dA && !dx) return;
    GEMM("g = scale·dout·B", g, R, 1, &D, &Bm, T, R, OC, a->scale, false);
    if (a->dA) GEMM("dA += gᵀ·x", a->dA, in, 1, &Gt, &X, R, in, T, 1.0f, true);
    if (dx) GEMM("dx = g·A", dx, in, 1, &G, &Am, T, in, R, 1.0f, false);
}

/* ------------------------------------------------------------ references */

void ft_lora_forward(float *out, float *u, const float *x, const ft_lora *a, int T, int in, int OC) {
    int R = a->r;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < R; k++) {
            float s = 0;
            for (int i = 0; i < in; i++) s += x[(size_t)t * in + i] * a->A[(size_t)k * in + i];
            u[(size_t)t * R + k] = s;
        }
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OC; o++) {
            float s = 0;
            for (int k = 0; k < R; k++) s += u[(size_t)t * R + k] * a->B[(size_t)o * R + k];
            out[(size_t)t * OC + o] += a->scale * s;
        }
}

void ft_lora_backward(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T, int in,
                   int OC, float *g) {
    int R = a->r;
    if (a->dB)
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < R; k++) {
                float s = 0;
                for (int t = 0; t < T; t++) s += dout[(size_t)t * OC + o] * u[(size_t)t * R + k];
                a->dB[(size_t)o * R + k] += a->scale * s;
            }
    if (!a->dA && !dx) return;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < R; k++) {
            float s = 0;
            for (int o = 0; o < OC; o++) s += dout[(size_t)t * OC + o] * a->B[(size_t)o * R + k];
            g[(size_t)t * R + k] = a->scale * s;
        }
    if (a->dA)
        for (int k = 0; k < R; k++)
            for (int i = 0; i < in; i++) {
                float s = 0;
                for (int t = 0; t < T; t++) s += g[(size_t)t * R + k] * x[(size_t)t * in + i];
                a->dA[(size_t)k * in + i] += s;
            }
    if (dx)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < in; i++) {
                float s = 0;
                for (int k = 0; k < R; k++) s += g[(size_t)t * R + k] * a->A[(size_t)k * in + i];
                dx[(size_t)t * in + i] = s;
            }
}

/* ----------------------------------------------- references in double */

void ft_lora_forward_f64(float *out, float *u, const float *x, const ft_lora *a, int T, int IC, int OC) {
    int R = a->r;
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < R; k++) {
            double s = 0;
            for (int i = 0; i < IC; i++) s += (double)a->A[(size_t)k * IC + i] * x[(size_t)t * IC + i];
            u[(size_t)t * R + k] = (float)s;
        }
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int k = 0; k < R; k++) s += (double)u[(size_t)t * R + k] * a->B[(size_t)o * R + k];
            out[(size_t)t * OC + o] += (float)(a->scale * s);
        }
    }
}

void ft_lora_backward_f64(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T,
                       int IC, int OC, float *g) {
    int R = a->r;
    /* g (T, R) = scale · dout · B */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < R; k++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += (double)dout[(size_t)t * OC + o] * a->B[(size_t)o * R + k];
            g[(size_t)t * R + k] = (float)(a->scale * s);
        }
    if (a->dB) /* dB (OC, R) += scale · dout^T · u */
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < R; k++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += (double)dout[(size_t)t * OC + o] * u[(size_t)t * R + k];
                a->dB[(size_t)o * R + k] += (float)(a->scale * s);
            }
    if (a->dA) /* dA (R, IC) += g^T · x */
        for (int k = 0; k < R; k++)
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += (double)g[(size_t)t * R + k] * x[(size_t)t * IC + i];
                a->dA[(size_t)k * IC + i] += (float)s;
            }
    if (dx) /* dx = g · A */
        for (int t = 0; t < T; t++)
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int k = 0; k < R; k++) s += (double)g[(size_t)t * R + k] * a->A[(size_t)k * IC + i];
                dx[(size_t)t * IC + i] = (float)s;
            }
}
