/* ops_elem.c — the fast paths of the elementwise and row ops a mixed-
 * precision (bf16/f16) step runs between its matrix products: RoPE and the
 * f32 <-> bf16 conversions (bit-identical to the references, so any
 * compute type may use them), then SwiGLU and RMSNorm (a vector exp, f32
 * sums: within a few ulps of the references, used only when the compute
 * type is not f32, so that f32 stays the reference bit for bit).
 * Vectorised with ops_vec.h for AVX-512, AVX2+FMA and portable, picked at
 * run time from ft_cpu_level(), and spread over rows (or columns) with
 * ft_parallel_for in fixed chunks: no result depends on the thread count.
 */
#pragma GCC diagnostic ignored "-Wpsabi"
#ifdef __clang__
#pragma clang fp contract(off) /* GCC's default for -std=c11; clang's is "on" */
#endif

#include "ops/ops.h"

#include "core/parallel.h"
#include "cpu/cpu.h"

#include <math.h>

#include "ops/ops_vec.h"

/* Elementwise work below this many elements runs on the calling thread
 * (a decode step's rows): waking a worker costs more than it saves. */
#define PAR_MIN 32768
/* elements per task of the elementwise ops (16 KiB of each operand) */
#define ELEM_CHUNK 4096

static int level3(void) {
    int lv = ft_cpu_level();
    return lv >= FT_CPU_AVX512 ? 2 : lv >= FT_CPU_AVX2 ? 1 : 0;
}
static int threads_for(size_t work, int n_threads) { return work < PAR_MIN ? 1 : n_threads; }

/* ------------------------------------------------------------- bf16 */
/* (no fp-contract here: nothing below is a multiply-add) */

typedef enum { CV_TO_BF16, CV_FROM_BF16, CV_ROUND } cv_kind;

INLINE void convert_body(cv_kind kind, void *dst, const void *src, size_t n) {
    size_t i = 0;
    if (kind == CV_FROM_BF16) {
        const uint16_t *s = src;
        float *d = dst;
        for (; i + VL <= n; i += VL) {
            vh h;
            memcpy(&h, s + i, sizeof h);
            vstore(d + i, (vf)(__builtin_convertvector(h, vu) << 16));
        }
        for (; i < n; i++) d[i] = ft_bf16_to_f32(s[i]);
        return;
    }
    const float *s = src;
    for (; i + VL <= n; i += VL) {
        vu b = bf16_bits(vload(s + i));
        if (kind == CV_TO_BF16) {
            vh h = __builtin_convertvector(b, vh);
            memcpy((uint16_t *)dst + i, &h, sizeof h);
        } else {
            vstore((float *)dst + i, (vf)(b << 16));
        }
    }
    for (; i < n; i++) {
        uint16_t h = ft_f32_to_bf16(s[i]);
        if (kind == CV_TO_BF16) ((uint16_t *)dst)[i] = h;
        else ((float *)dst)[i] = ft_bf16_to_f32(h);
    }
}
T512 static void convert_avx512(cv_kind k, void *d, const void *s, size_t n) { convert_body(k, d, s, n); }
T256 static void convert_avx2(cv_kind k, void *d, const void *s, size_t n) { convert_body(k, d, s, n); }
static void convert_generic(cv_kind k, void *d, const void *s, size_t n) { convert_body(k, d, s, n); }

typedef struct {
    cv_kind kind;
    void *dst;
    const void *src;
    size_t n;
} cv_job;

static void convert_task(void *vctx, int task, int thread) {
    (void)thread;
    const cv_job *j = vctx;
    size_t i0 = (size_t)task * ELEM_CHUNK, n = j->n - i0 < ELEM_CHUNK ? j->n - i0 : ELEM_CHUNK;
    size_t din = j->kind == CV_TO_BF16 ? 2 : 4, sin_ = j->kind == CV_FROM_BF16 ? 2 : 4;
    void *d = (char *)j->dst + i0 * din;
    const void *s = (const char *)j->src + i0 * sin_;
    switch (level3()) {
    case 2: convert_avx512(j->kind, d, s, n); break;
    case 1: convert_avx2(j->kind, d, s, n); break;
    default: convert_generic(j->kind, d, s, n); break;
    }
}

static void convert(cv_kind kind, void *dst, const void *src, size_t n, int n_threads) {
    if (!n) return;
    cv_job j = { .kind = kind, .dst = dst, .src = src, .n = n };
    size_t tasks = (n + ELEM_CHUNK - 1) / ELEM_CHUNK;
    ft_parallel_for(threads_for(n, n_threads), (int)tasks, convert_task, &j);
}

void ft_bf16_from_f32_fast(uint16_t *dst, const float *src, size_t n, int n_threads) {
    convert(CV_TO_BF16, dst, src, n, n_threads);
}
void ft_bf16_to_f32_fast(float *dst, const uint16_t *src, size_t n, int n_threads) {
    convert(CV_FROM_BF16, dst, src, n, n_threads);
}
void ft_bf16_round_fast(float *dst, const float *src, size_t n, int n_threads) {
    convert(CV_ROUND, dst, src, n, n_threads);
}

/* ------------------------------------------------------------- rope */

/* The reference's arithmetic (rope_rotate in ops_impl.h) in the same
 * order, without contraction: a' = x0·c - x1·s, b' = x1·c + x0·s, with
 * cos/sin of the double angle rounded to float, a row's table computed
 * once for its heads. Interleaved pairs (2i, 2i+1) use the swapped vector
 * and signed sines: x0·c + x1·(-s) is x0·c - x1·s exactly. */
#define ROPE_HALF_MAX 512 /* HS up to 1024; above, the reference runs */

INLINE void rope_row_body(float *xt, const int pos, const float *inv_freq, int nh, int HS, bool interleaved,
                          int sign) {
    int half = HS / 2;
    float c[2 * ROPE_HALF_MAX], s[2 * ROPE_HALF_MAX];
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * (double)inv_freq[i];
        float ci = (float)cos(angle), si = (float)(sign * sin(angle));
        if (interleaved) {
            c[2 * i] = c[2 * i + 1] = ci;
            s[2 * i] = -si;
            s[2 * i + 1] = si;
        } else {
            c[i] = ci;
            s[i] = si;
        }
    }
    for (int h = 0; h < nh; h++) {
        float *x = xt + (size_t)h * HS;
        int i = 0;
        if (interleaved) {
            for (; i + VL <= 2 * half; i += VL) {
                vf v = vload(x + i), cv = vload(c + i), sv = vload(s + i);
                vf sw = __builtin_shuffle(v, (vi){ 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14 });
                vstore(x + i, v * cv + sw * sv);
            }
            for (; i < 2 * half; i += 2) {
                float x0 = x[i], x1 = x[i + 1];
                x[i] = x0 * c[i] - x1 * s[i + 1];
                x[i + 1] = x1 * c[i] + x0 * s[i + 1];
            }
        } else {
            for (; i + VL <= half; i += VL) {
                vf a = vload(x + i), b = vload(x + i + half), cv = vload(c + i), sv = vload(s + i);
                vstore(x + i, a * cv - b * sv);
                vstore(x + i + half, b * cv + a * sv);
            }
            for (; i < half; i++) {
                float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * c[i] - x1 * s[i];
                x[i + half] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}
T512 static void rope_row_avx512(float *x, int p, const float *f, int nh, int HS, bool il, int sg) {
    rope_row_body(x, p, f, nh, HS, il, sg);
}
T256 static void rope_row_avx2(float *x, int p, const float *f, int nh, int HS, bool il, int sg) {
    rope_row_body(x, p, f, nh, HS, il, sg);
}
static void rope_row_generic(float *x, int p, const float *f, int nh, int HS, bool il, int sg) {
    rope_row_body(x, p, f, nh, HS, il, sg);
}

#define ROPE_ROWS 8 /* rows per task */

typedef struct {
    float *x;
    const int *pos;
    const float *inv_freq;
    int T, nh, HS, sign;
    bool interleaved;
} rope_job;

static void rope_task(void *vctx, int task, int thread) {
    (void)thread;
    const rope_job *j = vctx;
    int lv = level3();
    for (int t = task * ROPE_ROWS; t < j->T && t < (task + 1) * ROPE_ROWS; t++) {
        float *x = j->x + (size_t)t * j->nh * j->HS;
        if (lv == 2) rope_row_avx512(x, j->pos[t], j->inv_freq, j->nh, j->HS, j->interleaved, j->sign);
        else if (lv == 1) rope_row_avx2(x, j->pos[t], j->inv_freq, j->nh, j->HS, j->interleaved, j->sign);
        else rope_row_generic(x, j->pos[t], j->inv_freq, j->nh, j->HS, j->interleaved, j->sign);
    }
}

static void rope_fast(float *x, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved,
                      int sign, int n_threads) {
    if (HS / 2 > ROPE_HALF_MAX) {
        if (sign > 0) ft_rope_forward(x, pos, inv_freq, T, nh, HS, interleaved);
        else ft_rope_backward(x, pos, inv_freq, T, nh, HS, interleaved);
        return;
    }
    rope_job j = { .x = x, .pos = pos, .inv_freq = inv_freq, .T = T, .nh = nh, .HS = HS, .sign = sign,
                   .interleaved = interleaved };
    /* the cos/sin per row cost as much as a few heads' rotations: count both */
    size_t work = (size_t)T * ((size_t)nh * HS + 16 * (size_t)HS);
    ft_parallel_for(threads_for(work, n_threads), (T + ROPE_ROWS - 1) / ROPE_ROWS, rope_task, &j);
}

void ft_rope_forward_fast(float *x, const int *pos, const float *inv_freq, int T, int nh, int HS, bool interleaved,
                          int n_threads) {
    rope_fast(x, pos, inv_freq, T, nh, HS, interleaved, 1, n_threads);
}
void ft_rope_backward_fast(float *dx, const int *pos, const float *inv_freq, int T, int nh, int HS,
                           bool interleaved, int n_threads) {
    rope_fast(dx, pos, inv_freq, T, nh, HS, interleaved, -1, n_threads);
}

/* ------------------------------------------------------------- swiglu */
/* From here on a·b+c is fused where the ISA has FMA (as in ops_fast.c):
 * these paths are not bit-identical to the references anyway. Functions
 * are instantiated from the bodies after this point, so the pragma covers
 * them. */
#pragma GCC optimize("fp-contract=fast")
#ifdef __clang__
#pragma clang fp contract(fast)
#endif

/* out = g / (1 + exp(-g)) · up; for g below -88.8 exp(-g) is inf and the
 * quotient -0, as in the reference. */
INLINE void swiglu_fwd_body(float *out, const float *gate, const float *up, size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf g = vload(gate + i), ng = -g, e = vexp(&ng);
        vstore(out + i, g / (1.0f + e) * vload(up + i));
    }
    if (i < n) {
        float bg[VL] = { 0 }, bu[VL] = { 0 };
        memcpy(bg, gate + i, (n - i) * sizeof(float));
        memcpy(bu, up + i, (n - i) * sizeof(float));
        vf g = vload(bg), ng = -g, e = vexp(&ng);
        vstore(bg, g / (1.0f + e) * vload(bu));
        memcpy(out + i, bg, (n - i) * sizeof(float));
    }
}

/* sig = 1 / (1 + exp(-g)); dgate = dout·up·sig·(1 + g·(1 - sig)),
 * dup = dout·g·sig: the reference's formulas. */
INLINE void swiglu_bwd_vec(float *dgate, float *dup, const float *dout, const float *gate, const float *up) {
    vf g = vload(gate), ng = -g, e = vexp(&ng), dy = vload(dout);
    vf sig = 1.0f / (1.0f + e);
    vstore(dgate, dy * vload(up) * sig * (1.0f + g * (1.0f - sig)));
    vstore(dup, dy * (g * sig));
}
INLINE void swiglu_bwd_body(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                            size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) swiglu_bwd_vec(dgate + i, dup + i, dout + i, gate + i, up + i);
    if (i < n) {
        float bg[VL] = { 0 }, bu[VL] = { 0 }, bd[VL] = { 0 }, og[VL], ou[VL];
        size_t r = (n - i) * sizeof(float);
        memcpy(bg, gate + i, r);
        memcpy(bu, up + i, r);
        memcpy(bd, dout + i, r);
        swiglu_bwd_vec(og, ou, bd, bg, bu);
        memcpy(dgate + i, og, r);
        memcpy(dup + i, ou, r);
    }
}
T512 static void swiglu_fwd_avx512(float *o, const float *g, const float *u, size_t n) { swiglu_fwd_body(o, g, u, n); }
T256 static void swiglu_fwd_avx2(float *o, const float *g, const float *u, size_t n) { swiglu_fwd_body(o, g, u, n); }
static void swiglu_fwd_generic(float *o, const float *g, const float *u, size_t n) { swiglu_fwd_body(o, g, u, n); }
T512 static void swiglu_bwd_avx512(float *dg, float *du, const float *dy, const float *g, const float *u, size_t n) {
    swiglu_bwd_body(dg, du, dy, g, u, n);
}
T256 static void swiglu_bwd_avx2(float *dg, float *du, const float *dy, const float *g, const float *u, size_t n) {
    swiglu_bwd_body(dg, du, dy, g, u, n);
}
static void swiglu_bwd_generic(float *dg, float *du, const float *dy, const float *g, const float *u, size_t n) {
    swiglu_bwd_body(dg, du, dy, g, u, n);
}

typedef struct {
    float *out, *dgate, *dup;
    const float *gate, *up, *dout;
    size_t n;
} swiglu_job;

static void swiglu_task(void *vctx, int task, int thread) {
    (void)thread;
    const swiglu_job *j = vctx;
    size_t i0 = (size_t)task * ELEM_CHUNK, n = j->n - i0 < ELEM_CHUNK ? j->n - i0 : ELEM_CHUNK;
    int lv = level3();
    if (j->out) {
        if (lv == 2) swiglu_fwd_avx512(j->out + i0, j->gate + i0, j->up + i0, n);
        else if (lv == 1) swiglu_fwd_avx2(j->out + i0, j->gate + i0, j->up + i0, n);
        else swiglu_fwd_generic(j->out + i0, j->gate + i0, j->up + i0, n);
    } else {
        if (lv == 2) swiglu_bwd_avx512(j->dgate + i0, j->dup + i0, j->dout + i0, j->gate + i0, j->up + i0, n);
        else if (lv == 1) swiglu_bwd_avx2(j->dgate + i0, j->dup + i0, j->dout + i0, j->gate + i0, j->up + i0, n);
        else swiglu_bwd_generic(j->dgate + i0, j->dup + i0, j->dout + i0, j->gate + i0, j->up + i0, n);
    }
}

static void swiglu_run(swiglu_job *j, int n_threads) {
    if (!j->n) return;
    ft_parallel_for(threads_for(j->n, n_threads), (int)((j->n + ELEM_CHUNK - 1) / ELEM_CHUNK), swiglu_task, j);
}

void ft_swiglu_forward_fast(float *out, const float *gate, const float *up, int T, int F, int n_threads) {
    swiglu_job j = { .out = out, .gate = gate, .up = up, .n = (size_t)T * F };
    swiglu_run(&j, n_threads);
}
void ft_swiglu_backward_fast(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int T,
                             int F, int n_threads) {
    swiglu_job j = { .dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up, .n = (size_t)T * F };
    swiglu_run(&j, n_threads);
}

/* ------------------------------------------------------------- rmsnorm */

/* Sums of a row's 16 lanes in float (16 partial sums of C/16 terms each),
 * the lanes added in double. */
INLINE double row_sumsq(const float *x, int C) {
    vf a = { 0 };
    int i = 0;
    for (; i + VL <= C; i += VL) {
        vf v = vload(x + i);
        a = v * v + a;
    }
    double s = vhsum_d(&a);
    for (; i < C; i++) s += (double)x[i] * x[i];
    return s;
}

/* out = w·(x·r), r = 1/sqrt(mean(x²) + eps) with the mean rounded to float
 * first, as the reference. */
INLINE void rms_fwd_row(float *o, float *rstd, const float *x, const float *w, int C, float eps) {
    float r = 1 / sqrtf((float)(row_sumsq(x, C) / C) + eps);
    vf rv = vset1(r);
    int i = 0;
    for (; i + VL <= C; i += VL) vstore(o + i, vload(w + i) * (vload(x + i) * rv));
    for (; i < C; i++) o[i] = w[i] * (x[i] * r);
    if (rstd) *rstd = r;
}

/* dx += r·(dy·w - xhat·m), m = mean(dy·w·xhat), xhat = x·r */
INLINE void rms_bwd_row(float *dx, const float *dy, const float *x, const float *w, float r, int C) {
    vf rv = vset1(r), a = { 0 };
    int i = 0;
    for (; i + VL <= C; i += VL) a = vload(dy + i) * vload(w + i) * (vload(x + i) * rv) + a;
    double dot = vhsum_d(&a);
    for (; i < C; i++) dot += (double)dy[i] * w[i] * (x[i] * r);
    float m = (float)(dot / C);
    vf mv = vset1(m);
    for (i = 0; i + VL <= C; i += VL) {
        vf xhat = vload(x + i) * rv;
        vstore(dx + i, vload(dx + i) + rv * (vload(dy + i) * vload(w + i) - xhat * mv));
    }
    for (; i < C; i++) dx[i] += r * (dy[i] * w[i] - x[i] * r * m);
}

/* dw[c0, c1) += Σ_t dy[t]·(x[t]·r[t]), the rows in order */
INLINE void rms_dw_cols(float *dw, const float *dout, const float *inp, const float *rstd, int T, int C, int c0,
                        int c1) {
    int i = c0;
    for (; i + VL <= c1; i += VL) {
        vf acc = vload(dw + i);
        for (int t = 0; t < T; t++)
            acc = vload(dout + (size_t)t * C + i) * (vload(inp + (size_t)t * C + i) * rstd[t]) + acc;
        vstore(dw + i, acc);
    }
    for (; i < c1; i++) {
        float acc = dw[i];
        for (int t = 0; t < T; t++) acc += dout[(size_t)t * C + i] * (inp[(size_t)t * C + i] * rstd[t]);
        dw[i] = acc;
    }
}

typedef struct {
    float *out, *rstd, *dinp, *dw;
    const float *inp, *w, *dout, *rstd_in;
    int T, C;
    float eps;
} rms_job;

#define RMS_ROWS 4     /* rows per task */
#define RMS_DW_COLS 64 /* dw columns per task */

#define RMS_ISA(sfx, TGT)                                                                                      \
    TGT static void rms_rows_##sfx(const rms_job *j, int t0, int t1) {                                         \
        size_t C = (size_t)j->C;                                                                                \
        for (int t = t0; t < t1; t++) {                                                                         \
            if (j->out)                                                                                         \
                rms_fwd_row(j->out + t * C, j->rstd ? j->rstd + t : NULL, j->inp + t * C, j->w, j->C, j->eps); \
            else                                                                                                \
                rms_bwd_row(j->dinp + t * C, j->dout + t * C, j->inp + t * C, j->w, j->rstd_in[t], j->C);     \
        }                                                                                                       \
    }                                                                                                           \
    TGT static void rms_dw_##sfx(const rms_job *j, int c0, int c1) {                                           \
        rms_dw_cols(j->dw, j->dout, j->inp, j->rstd_in, j->T, j->C, c0, c1);                                   \
    }
RMS_ISA(avx512, T512)
RMS_ISA(avx2, T256)
RMS_ISA(generic, )

static void rms_rows_task(void *vctx, int task, int thread) {
    (void)thread;
    const rms_job *j = vctx;
    int t0 = task * RMS_ROWS, t1 = t0 + RMS_ROWS < j->T ? t0 + RMS_ROWS : j->T;
    switch (level3()) {
    case 2: rms_rows_avx512(j, t0, t1); break;
    case 1: rms_rows_avx2(j, t0, t1); break;
    default: rms_rows_generic(j, t0, t1); break;
    }
}
static void rms_dw_task(void *vctx, int task, int thread) {
    (void)thread;
    const rms_job *j = vctx;
    int c0 = task * RMS_DW_COLS, c1 = c0 + RMS_DW_COLS < j->C ? c0 + RMS_DW_COLS : j->C;
    switch (level3()) {
    case 2: rms_dw_avx512(j, c0, c1); break;
    case 1: rms_dw_avx2(j, c0, c1); break;
    default: rms_dw_generic(j, c0, c1); break;
    }
}

void ft_rmsnorm_forward_fast(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps,
                             int n_threads) {
    rms_job j = { .out = out, .rstd = rstd, .inp = inp, .w = w, .T = T, .C = C, .eps = eps };
    int nt = threads_for((size_t)T * C, n_threads);
    ft_parallel_for(nt, (T + RMS_ROWS - 1) / RMS_ROWS, rms_rows_task, &j);
}

void ft_rmsnorm_backward_fast(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                              const float *rstd, int T, int C, int n_threads) {
    rms_job j = { .dinp = dinp, .dw = dw, .dout = dout, .inp = inp, .w = w, .rstd_in = rstd, .T = T, .C = C };
    int nt = threads_for((size_t)T * C, n_threads);
    ft_parallel_for(nt, (T + RMS_ROWS - 1) / RMS_ROWS, rms_rows_task, &j);
    if (dw) ft_parallel_for(nt, (C + RMS_DW_COLS - 1) / RMS_DW_COLS, rms_dw_task, &j);
}
