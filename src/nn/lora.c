/* lora.c — the LoRA adapter of a Linear, and the only place its maths
 * lives: PEFT initialisation, input dropout with masks regenerated from a
 * seed, the low-rank forward and backward on the kernels of kernels.h (the
 * _fast functions), in plain float loops and in double (the references
 * the tests and the reference backend use), and the fold into a weight row
 * (merge). linear.c combines these with the frozen base weight. */
#include "nn/linear.h"
#include "cpu/kernels.h"
#include "core/parallel.h"
#include "core/mem.h"

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
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    for (int r = 0; r < R; r++) {
        float s = scale * a->B[(size_t)o * R + r];
        const float *ar = a->A + (size_t)r * in;
        for (int j = 0; j < in; j++) row[j] += s * ar[j];
    }
}

void ft_lora_bind(ft_lora *a, const ft_adapter_hparams *hp) {
    a->base.kind = &ft_lora_kind;
    a->base.hp = hp;
}

void ft_lora_init(ft_lora *a, const ft_adapter_hparams *hp, float *A, float *B, float *dA, float *dB, int in, int out,
                  ft_rng *rng) {
    ft_lora_bind(a, hp);
    a->A = A; a->B = B; a->dA = dA; a->dB = dB;
    ft_lora_kind.init(&a->base, in, out, rng);
    if (dA) memset(dA, 0, (size_t)hp->r * in * sizeof(float));
    if (dB) memset(dB, 0, (size_t)out * hp->r * sizeof(float));
}

typedef struct {
    float *xd;
    const float *inp;
    float inv;
    uint32_t keep24;         /* an element is kept when its uniform's 24 bits are below this */
    uint64_t mask_seed;
    int in, T;
    bool add; /* xd += the masked inp, instead of xd = */
} dropout_ctx;

/* Rows go in blocks of DROP_ROWS whose xorshift streams are stepped side by
 * side: each row's stream is one serial chain of shifts and a multiply, and
 * interleaving rows lets the core run eight chains at once (1.7x the speed
 * of one row at a time, T 1024 x 576, one thread). Row t still draws exactly the
 * numbers ft_rng_seed/ft_rng_uniform give it, so masks do not depend on the
 * blocking or the threads. */
#define DROP_ROWS 8

static void dropout_rows(void *vctx, int blk, int thread) {
    (void)thread;
    const dropout_ctx *c = vctx;
    int t0 = blk * DROP_ROWS, nr = c->T - t0 < DROP_ROWS ? c->T - t0 : DROP_ROWS;
    uint64_t st[DROP_ROWS];
    for (int r = 0; r < nr; r++) {
        ft_rng rng;
        ft_rng_seed(&rng, c->mask_seed + (uint64_t)(t0 + r + 1) * FT_DROPOUT_ROW_STEP);
        st[r] = rng.s;
    }
    const float *x = c->inp + (size_t)t0 * c->in;
    float *y = c->xd + (size_t)t0 * c->in;
    const size_t in = (size_t)c->in;
    const uint32_t keep24 = c->keep24;
    const float inv = c->inv;
    const bool add = c->add;
    if (nr == DROP_ROWS) {
        for (size_t i = 0; i < in; i++)
            for (int r = 0; r < DROP_ROWS; r++) {
                uint64_t z = st[r];
                z ^= z >> 12; z ^= z << 25; z ^= z >> 27;
                st[r] = z;
                uint32_t u = (uint32_t)((z * 0x2545F4914F6CDD1Dull) >> 32); /* ft_rng_u32 */
                float v = (u >> 8) < keep24 ? x[r * in + i] * inv : 0.0f;
                y[r * in + i] = add ? y[r * in + i] + v : v;
            }
        return;
    }
    for (int r = 0; r < nr; r++) {
        ft_rng rng = { st[r] };
        for (size_t i = 0; i < in; i++) {
            float v = (ft_rng_u32(&rng) >> 8) < keep24 ? x[r * in + i] * inv : 0.0f;
            y[r * in + i] = add ? y[r * in + i] + v : v;
        }
    }
}

static void dropout_run(float *xd, const float *inp, float p, uint64_t mask_seed, int T, int in, int n_threads,
                        bool add) {
    /* ft_rng_uniform(r) < keep is (u >> 8) / 2^24 < keep, and (u >> 8) is an
     * integer below 2^24: the same as (u >> 8) < ceil(keep · 2^24), exactly */
    float keep = 1.0f - p;
    dropout_ctx c = { .xd = xd, .inp = inp, .inv = 1.0f / keep, .keep24 = (uint32_t)ceilf(keep * 16777216.0f),
                      .mask_seed = mask_seed, .in = in, .T = T, .add = add };
    /* small inputs are not worth waking the threads for */
    ft_parallel_for((size_t)T * in > 65536 ? n_threads : 1, (T + DROP_ROWS - 1) / DROP_ROWS, dropout_rows, &c);
}

void ft_lora_dropout(float *xd, const float *inp, float p, uint64_t mask_seed, int T, int in, int n_threads) {
    dropout_run(xd, inp, p, mask_seed, T, in, n_threads, false);
}

/* The products below are all in the compute type (f32 masters A, B and
 * f32 activations, rounded by ft_gemm_in as it reads them: numerically the
 * same as bf16 "compute copies" refreshed after every step, without the
 * copies) with sizes the callers have checked: ft_gemm_in declining one is
 * our bug. */
static void gemm_checked(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "ftune: internal error: the kernels declined the LoRA product %s\n", what);
    abort();
}
#define GEMM(what, C, crs, ccs, A, B, M, N, K, alpha, acc) \
    gemm_checked(ft_gemm_in(compute, C, crs, ccs, A, B, M, N, K, alpha, acc, n_threads, scratch, \
                            FT_GEMM_SCRATCH_FLOATS), what)

void ft_lora_forward_fast(ft_dtype compute, float *out, float *u, const float *x, const ft_lora *a, int T, int in,
                          int OC, int n_threads, float *scratch) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    ft_mat X = ft_mat_f32(x, in, 1), At = ft_mat_f32(a->A, 1, in);
    ft_mat U = ft_mat_f32(u, R, 1), Bt = ft_mat_f32(a->B, 1, R);
    GEMM("u = x·Aᵀ", u, R, 1, &X, &At, T, R, in, 1.0f, false);
    GEMM("out += scale·u·Bᵀ", out, OC, 1, &U, &Bt, T, OC, R, scale, true);
}

void ft_lora_backward_fast(ft_dtype compute, float *dx, bool dx_add, const float *dout, const float *x, const float *u,
                           const ft_lora *a, int T, int in, int OC, float *g, int n_threads, float *scratch) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    ft_mat D = ft_mat_f32(dout, OC, 1), Dt = ft_mat_f32(dout, 1, OC);
    ft_mat U = ft_mat_f32(u, R, 1), Bm = ft_mat_f32(a->B, R, 1);
    ft_mat G = ft_mat_f32(g, R, 1), Gt = ft_mat_f32(g, 1, R);
    ft_mat X = ft_mat_f32(x, in, 1), Am = ft_mat_f32(a->A, in, 1);
    /* In a compute type dB is computed as its transpose, uᵀ·dout written
     * into dB column-wise: doutᵀ as the product's A operand is packed by
     * a scalar transpose of all T·OC elements (45% of a bf16 LoRA
     * backward), uᵀ only T·R. f32 keeps its order of sums (its bits). */
    ft_mat Ut = ft_mat_f32(u, 1, R);
    if (a->dB && compute != FT_F32) GEMM("dBᵀ += scale·uᵀ·dout", a->dB, 1, R, &Ut, &D, R, OC, T, scale, true);
    else if (a->dB) GEMM("dB += scale·doutᵀ·u", a->dB, R, 1, &Dt, &U, OC, R, T, scale, true);
    if (!a->dA && !dx) return;
    GEMM("g = scale·dout·B", g, R, 1, &D, &Bm, T, R, OC, scale, false);
    if (a->dA) GEMM("dA += gᵀ·x", a->dA, in, 1, &Gt, &X, R, in, T, 1.0f, true);
    if (dx) GEMM("dx (+)= g·A", dx, in, 1, &G, &Am, T, in, R, 1.0f, dx_add);
}

/* ------------------------------------------------------------ references */

void ft_lora_forward(float *out, float *u, const float *x, const ft_lora *a, int T, int in, int OC) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
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
            out[(size_t)t * OC + o] += scale * s;
        }
}

void ft_lora_backward(float *dx, const float *dout, const float *x, const float *u, const ft_lora *a, int T, int in,
                   int OC, float *g) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    if (a->dB)
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < R; k++) {
                float s = 0;
                for (int t = 0; t < T; t++) s += dout[(size_t)t * OC + o] * u[(size_t)t * R + k];
                a->dB[(size_t)o * R + k] += scale * s;
            }
    if (!a->dA && !dx) return;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < R; k++) {
            float s = 0;
            for (int o = 0; o < OC; o++) s += dout[(size_t)t * OC + o] * a->B[(size_t)o * R + k];
            g[(size_t)t * R + k] = scale * s;
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

/* Operands as the compute type sees them: RNE-rounded to it (exact in f32). */
#define RD(x) ((double)ft_round_in(compute, (x)))

void ft_lora_forward_f64(ft_dtype compute, float *out, float *u, const float *x, const ft_lora *a, int T, int IC,
                         int OC) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < R; k++) {
            double s = 0;
            for (int i = 0; i < IC; i++) s += RD(a->A[(size_t)k * IC + i]) * RD(x[(size_t)t * IC + i]);
            u[(size_t)t * R + k] = (float)s;
        }
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int k = 0; k < R; k++) s += RD(u[(size_t)t * R + k]) * RD(a->B[(size_t)o * R + k]);
            out[(size_t)t * OC + o] += (float)(scale * s);
        }
    }
}

void ft_lora_backward_f64(ft_dtype compute, float *dx, const float *dout, const float *x, const float *u,
                          const ft_lora *a, int T, int IC, int OC, float *g) {
    int R = a->base.hp->r;
    float scale = ft_lora_scale_of(a);
    /* g (T, R) = scale · dout · B */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < R; k++) {
            double s = 0;
            for (int o = 0; o < OC; o++) s += RD(dout[(size_t)t * OC + o]) * RD(a->B[(size_t)o * R + k]);
            g[(size_t)t * R + k] = (float)(scale * s);
        }
    if (a->dB) /* dB (OC, R) += scale · dout^T · u */
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < R; k++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += RD(dout[(size_t)t * OC + o]) * RD(u[(size_t)t * R + k]);
                a->dB[(size_t)o * R + k] += (float)(scale * s);
            }
    if (a->dA) /* dA (R, IC) += g^T · x */
        for (int k = 0; k < R; k++)
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += RD(g[(size_t)t * R + k]) * RD(x[(size_t)t * IC + i]);
                a->dA[(size_t)k * IC + i] += (float)s;
            }
    if (dx) /* dx = g · A */
        for (int t = 0; t < T; t++)
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int k = 0; k < R; k++) s += RD(g[(size_t)t * R + k]) * RD(a->A[(size_t)k * IC + i]);
                dx[(size_t)t * IC + i] = (float)s;
            }
}
#undef RD

/* xd = dropout(x) as the products see x: in bf16/f16 x is rounded to the
 * compute type first (then the mask's 1/(1-p) scaling, then the product's
 * own rounding), so that an input saved for backward in the compute type
 * (train_model.c) gives backward exactly the forward's xd. */
static void dropout_in(ft_dtype compute, float *xd, const float *x, float p, uint64_t seed, int T, int IC, int nt) {
    if (compute != FT_F32) {
        ft_round_array_in(compute, xd, x, (size_t)T * IC);
        x = xd;
    }
    ft_lora_dropout(xd, x, p, seed, T, IC, nt);
}

/* The adapter's input as the products see it: x without dropout (p 0),
 * else dropout_in's xd. */
static const float *dropped_in(ft_dtype compute, float *xd, const float *x, float p, uint64_t seed, int T, int IC,
                               int nt) {
    if (!(p > 0)) return x;
    dropout_in(compute, xd, x, p, seed, T, IC, nt);
    return xd;
}

/* dinp (T, IC) += dx sent back through the dropout mask of seed (dx is
 * overwritten): the adapter's input gradient, in both backwards. */
static void add_through_mask(float *dinp, float *dx, float p, uint64_t seed, int T, int IC, int nt) {
    if (p > 0) { /* masked and added in one pass (on the threads): the bits of masking dx, then adding it */
        dropout_run(dinp, dx, p, seed, T, IC, nt, true);
        return;
    }
    for (size_t i = 0; i < (size_t)T * IC; i++) dinp[i] += dx[i];
}

/* ------------------------------------------------ the kind's ops table */

/* Every instance handed to these has kind == &ft_lora_kind, so it is an ft_lora. */
#define LORA(inst) ((const ft_lora *)(inst))

static int kind_saved_floats(const ft_adapter_inst *a) { return a->hp->r; }

static void kind_forward(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T,
                         int IC, int OC, int n_threads, float *scratch) {
    ft_lora_forward_fast(compute, out, u, x, LORA(a), T, IC, OC, n_threads, scratch);
}

static void kind_forward_ref(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T,
                             int IC, int OC) {
    ft_lora_forward_f64(compute, out, u, x, LORA(a), T, IC, OC);
}

static void kind_forward_train(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a, int T,
                               int IC, int OC, uint64_t mask_seed, float *xd, int n_threads, float *scratch) {
    x = dropped_in(compute, xd, x, a->hp->dropout, mask_seed, T, IC, n_threads);
    ft_lora_forward_fast(compute, out, u, x, LORA(a), T, IC, OC, n_threads, scratch);
}

/* Scratch for the references, counted as the reference backend's scratch. */
static float *ref_buf(size_t n) { return ft_mem_alloc(FT_MEM_SCRATCH, n * sizeof(float)); }
static void ref_free(float *p, size_t n) { ft_mem_free(FT_MEM_SCRATCH, p, p ? n * sizeof(float) : 0); }

static bool kind_forward_train_ref(ft_dtype compute, float *out, float *u, const float *x, const ft_adapter_inst *a,
                                   int T, int IC, int OC, uint64_t mask_seed) {
    size_t nx = (size_t)T * IC;
    float *xd = a->hp->dropout > 0 ? ref_buf(nx) : NULL;
    if (a->hp->dropout > 0 && !xd) return false;
    ft_lora_forward_f64(compute, out, u, dropped_in(compute, xd, x, a->hp->dropout, mask_seed, T, IC, 1), LORA(a), T,
                        IC, OC);
    ref_free(xd, nx);
    return true;
}

static void kind_backward(ft_dtype compute, float *dinp, const float *dout, const float *inp, const float *u,
                          const ft_adapter_inst *a, int T, int IC, int OC, uint64_t mask_seed, float *xd, float *g,
                          int n_threads, float *scratch) {
    const float *x = dropped_in(compute, xd, inp, a->hp->dropout, mask_seed, T, IC, n_threads);
    if (!(a->hp->dropout > 0)) {
        /* no mask: the product adds dx into dinp itself (dinp + 1·s, the
         * bits of writing dx and adding it after), one pass over dinp
         * instead of three */
        ft_lora_backward_fast(compute, dinp, true, dout, x, u, LORA(a), T, IC, OC, g, n_threads, scratch);
        return;
    }
    /* the adapter's dx lands in xd (lora_backward writes it last, after x
     * was read), then goes back through the same mask */
    ft_lora_backward_fast(compute, dinp ? xd : NULL, false, dout, x, u, LORA(a), T, IC, OC, g, n_threads, scratch);
    if (dinp) add_through_mask(dinp, xd, a->hp->dropout, mask_seed, T, IC, n_threads);
}

static bool kind_backward_ref(ft_dtype compute, float *dinp, const float *dout, const float *inp, const float *u,
                              const ft_adapter_inst *a, int T, int IC, int OC, uint64_t mask_seed) {
    size_t nx = (size_t)T * IC, ng = (size_t)T * a->hp->r;
    float *dx = ref_buf(nx), *xd = a->hp->dropout > 0 ? ref_buf(nx) : NULL, *g = ref_buf(ng);
    bool ok = dx && g && (xd || a->hp->dropout <= 0);
    if (ok) {
        const float *x = dropped_in(compute, xd, inp, a->hp->dropout, mask_seed, T, IC, 1);
        /* dx = scale · (dout·B) · A, then back through the same dropout mask */
        ft_lora_backward_f64(compute, dinp ? dx : NULL, dout, x, u, LORA(a), T, IC, OC, g);
        if (dinp) add_through_mask(dinp, dx, a->hp->dropout, mask_seed, T, IC, 1);
    }
    ref_free(dx, nx); ref_free(xd, nx); ref_free(g, ng);
    return ok;
}

static void kind_merge_row(float *row, const ft_adapter_inst *a, int o, int IC) {
    ft_lora_merge_row(row, LORA(a), o, IC);
}

/* PEFT's order and names; B's rows are the Linear's outputs */
static const ft_adapter_param_def lora_defs[2] = {
    { .peft = "lora_A.weight", .gguf = "lora_a", .out_rows = false, .r_dim = 0 },
    { .peft = "lora_B.weight", .gguf = "lora_b", .out_rows = true, .r_dim = 1 },
};
_Static_assert(sizeof lora_defs / sizeof lora_defs[0] <= FT_ADAPTER_MAX_PARAMS, "LoRA has too many parameters");

static void kind_param_shape(int64_t shape[2], const ft_adapter_hparams *hp, int i, int IC, int OC) {
    shape[0] = i == 0 ? hp->r : OC; /* A (R, IC), B (OC, R) */
    shape[1] = i == 0 ? IC : hp->r;
}

static void kind_param(ft_adapter_param *p, const ft_adapter_inst *a, int i, int IC, int OC) {
    const ft_lora *lo = LORA(a);
    p->def = &lora_defs[i];
    kind_param_shape(p->shape, a->hp, i, IC, OC);
    p->data = i == 0 ? lo->A : lo->B;
    p->grad = i == 0 ? lo->dA : lo->dB;
}

static void kind_bind(ft_adapter_inst *a, int i, float *data, float *grad) {
    ft_lora *lo = (ft_lora *)a;
    if (i == 0) { lo->A = data; lo->dA = grad; }
    else { lo->B = data; lo->dB = grad; }
}

static void kind_init(ft_adapter_inst *a, int IC, int OC, ft_rng *rng) {
    ft_lora *lo = (ft_lora *)a;
    ft_lora_init_A(lo->A, a->hp->r, IC, rng);
    memset(lo->B, 0, (size_t)OC * a->hp->r * sizeof(float));
}

const ft_adapter_kind ft_lora_kind = {
    .name = "lora",
    .saved_floats = kind_saved_floats,
    .forward = kind_forward,
    .forward_ref = kind_forward_ref,
    .forward_train = kind_forward_train,
    .forward_train_ref = kind_forward_train_ref,
    .backward = kind_backward,
    .backward_ref = kind_backward_ref,
    .merge_row = kind_merge_row,
    .n_params = 2,
    .defs = lora_defs,
    .param_shape = kind_param_shape,
    .param = kind_param,
    .bind = kind_bind,
    .init = kind_init,
};
