/* lora.c — the LoRA adapter of a Linear: PEFT initialisation, input
 * dropout with masks regenerated from a seed, and the low-rank forward and
 * backward (all small GEMMs through BLAS). linear.c combines these with the
 * frozen base weight. */
#include "linear.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

float lora_scale(float alpha, int r, bool rslora) {
    return rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
}

void lora_init(ft_lora *a, int r, float alpha, bool rslora, float dropout, float *A, float *B, float *dA, float *dB,
               int in, int out, ft_rng *rng) {
    a->r = r;
    a->alpha = alpha;
    a->rslora = rslora;
    a->scale = lora_scale(alpha, r, rslora);
    a->dropout = dropout;
    a->A = A; a->B = B; a->dA = dA; a->dB = dB;
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/in) = 1/sqrt(in) */
    float bound = 1.0f / sqrtf((float)in);
    for (size_t i = 0; i < (size_t)r * in; i++) A[i] = (2.0f * ft_rng_uniform(rng) - 1.0f) * bound;
    memset(B, 0, (size_t)out * r * sizeof(float));
    if (dA) memset(dA, 0, (size_t)r * in * sizeof(float));
    if (dB) memset(dB, 0, (size_t)out * r * sizeof(float));
}

void lora_dropout(float *xd, const float *inp, float p, uint64_t mask_seed, int T, int in, int n_threads) {
    float keep = 1.0f - p, inv = 1.0f / keep;
    int nt = n_threads > 1 ? n_threads : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1 && (size_t)T * in > 65536) schedule(static)
    for (int t = 0; t < T; t++) {
        ft_rng rng;
        ft_rng_seed(&rng, mask_seed ^ ((uint64_t)(t + 1) * 0xD1B54A32D192ED03ull));
        const float *x = inp + (size_t)t * in;
        float *y = xd + (size_t)t * in;
        for (int i = 0; i < in; i++) y[i] = ft_rng_uniform(&rng) < keep ? x[i] * inv : 0.0f;
    }
}

void lora_forward(float *out, float *u, const float *x, const ft_lora *a, int T, int in, int OC) {
    int R = a->r;
    /* u (T, R) = x (T, in) · A^T;  out (T, OC) += scale · u · B^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, R, in, 1.0f, x, in, a->A, in, 0.0f, u, R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OC, R, a->scale, u, R, a->B, R, 1.0f, out, OC);
}

void lora_backward(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T, int in,
                   int OC, float *g) {
    int R = a->r;
    /* dB (OC, R) += scale · dout^T (OC, T) · u (T, R) */
    if (a->dB)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, R, T, a->scale, dout, OC, u, R, 1.0f, a->dB, R);
    if (!a->dA && !dx) return;
    /* g (T, R) = scale · dout · B */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, R, OC, a->scale, dout, OC, a->B, R, 0.0f, g, R);
    /* dA (R, in) += g^T · x */
    if (a->dA)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, in, T, 1.0f, g, R, x, in, 1.0f, a->dA, in);
    /* dx (T, in) = g · A */
    if (dx) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, R, 1.0f, g, R, a->A, in, 0.0f, dx, in);
}
