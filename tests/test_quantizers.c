/* test_quantizers.c — the traits' from_f32 of every GGUF weight type ftune
 * writes (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K; ggml's reference
 * quantizers, dtype.c and dtype_ggml.c) on awkward rows: zeros, constants,
 * one spike, all of one sign, huge, tiny, f32-subnormal, and blocks whose
 * f16 scale underflows. Each value read back (to_f32) lies within the
 * type's bound of the input (why each bound is that: bound_of), and
 * quantizing the read-back values again is stable: it reads back within
 * the same bound of them, and for the min-max types q8_0, q4_1, q5_1 (whose
 * grid the read-back values lie on) to the same bytes where the block's f16
 * scale is normal (a subnormal one has too few bits to land on itself
 * again). NaN and inf in, every quantizer returns without undefined
 * behaviour (the writer refuses such rows before). Byte equality with
 * llama.cpp's own quantizers is checked outside this binary (the README's
 * quantize section says where). */
#include "check.h"
#include "core/core.h"

static const ft_dtype types[] = { FT_Q8_0, FT_Q4_0, FT_Q4_1, FT_Q5_0, FT_Q5_1, FT_Q4_K, FT_Q5_K, FT_Q6_K };
#define NT (int)(sizeof types / sizeof types[0])
#define N 1024 /* elements per test row: 4 super-blocks */

/* The largest |x - x̂| a block may have, over its values x[0..n):
 * A = max|x|, R = max(x, 0) - min(x, 0) (the K types' grids include 0).
 * The f16 scale rounds with relative error <= 2^-11 for a normal f16; a
 * subnormal one is off by up to 2^-25 absolute, times the largest code
 * product (codes x sub-block scale), the last term.
 * q8_0: d = A/127, rounding: d/2 = A/254.
 * q4_0, q5_0: d = -max/8 (/16) and the code range is -8..7 (-16..15): the
 *   value opposite the signed max clips a whole step, A/8 (A/16).
 * q4_1, q5_1: d = (max-min)/15 (/31), rounding: half a step; m in f16
 *   adds |min|·2^-11.
 * q4_K, q5_K, q6_K: each sub-block's grid (15, 31 steps from its min;
 *   63 around 0 for q6_K) is fitted by weighted least squares over grids of
 *   slightly more and fewer steps across its range, which may clip the
 *   extremes; the sub-block scales (and mins) are then stored in 6 bits
 *   (q6_K: int8) against the largest and the codes re-rounded on the stored
 *   grid. Half a step for the rounding, up to half a step for the clip and
 *   the stored scale, and a quarter step of margin, as the least-squares
 *   fit bounds its clip only loosely: 1.25 steps, R/12, R/25, A/25.6. */
static double bound_of(ft_dtype t, const float *x, int n) {
    double A = 0, lo = 0, hi = 0;
    for (int i = 0; i < n; i++) {
        A = fmax(A, fabs(x[i]));
        lo = fmin(lo, x[i]);
        hi = fmax(hi, x[i]);
    }
    double R = hi - lo, sub = ldexp(1, -25), f16 = ldexp(1, -10);
    switch (t) {
    case FT_Q8_0: return A / 254 + A * f16 + 127 * sub;
    case FT_Q4_0: return A / 8 + A * f16 + 8 * sub;
    case FT_Q5_0: return A / 16 + A * f16 + 16 * sub;
    case FT_Q4_1: return R / 30 + (R + A) * f16 + 16 * sub;
    case FT_Q5_1: return R / 62 + (R + A) * f16 + 32 * sub;
    case FT_Q4_K: return R / 12 + (R + A) * f16 + 2 * 63 * 15 * sub;
    case FT_Q5_K: return R / 25 + (R + A) * f16 + 2 * 63 * 31 * sub;
    case FT_Q6_K: return A / 25.6 + A * f16 + 128 * 32 * sub;
    default: return 0;
    }
}

/* row kinds: what each is for is in its comment */
#define NKIND 12
static void make_row(float *x, int kind, ft_rng *r) {
    for (int i = 0; i < N; i++) {
        float g = ft_rng_normal(r);
        switch (kind) {
        case 0: x[i] = 0.02f * g; break;                                 /* a weight's usual spread */
        case 1: x[i] = 0; break;                                         /* all zero */
        case 2: x[i] = 0.75f; break;                                     /* constant, positive */
        case 3: x[i] = -3.5f; break;                                     /* constant, negative */
        case 4: x[i] = i % 97 == 5 ? 40.0f : 0.01f * g; break;           /* one spike per block */
        case 5: x[i] = 0.1f + fabsf(g); break;                           /* all positive, offset from 0 */
        case 6: x[i] = -0.1f - fabsf(g); break;                          /* all negative */
        case 7: x[i] = 2000.0f * g; break;                               /* huge (f16 scales near their top) */
        case 8: x[i] = 1e-6f * g; break;                                 /* tiny: f16 scales subnormal */
        case 9: x[i] = 1e-40f * g; break;                                /* f32-subnormal: f16 scales round to 0 */
        case 10: x[i] = ldexpf(g, -(i / 256) * 6 - 4); break;            /* super-blocks of 2^-4 .. 2^-22 */
        case 11: x[i] = (i / 32) % 2 ? 0 : g * ldexpf(1, (i / 64) % 8 - 4); break; /* zero sub-blocks beside others */
        }
    }
}

static void max_err(const float *x, const float *y, int n, int block, ft_dtype t, double *worst_ratio, int *fail_at) {
    for (int b = 0; b < n; b += block) {
        double bound = bound_of(t, x + b, block);
        for (int i = b; i < b + block; i++) {
            double e = fabs((double)x[i] - (double)y[i]);
            if (!isfinite(y[i]) || e > bound) { if (*fail_at < 0) *fail_at = i; }
            else if (bound > 0 && e / bound > *worst_ratio) *worst_ratio = e / bound;
        }
    }
}

static void test_bounds_and_stability(void) {
    ft_rng r;
    ft_rng_seed(&r, 7);
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
    uint8_t *q = malloc(N * 4), *q2 = malloc(N * 4);
    for (int ti = 0; ti < NT; ti++) {
        ft_dtype t = types[ti];
        const ft_type_traits *tr = &ft_types[t];
        CHECKF(tr->from_f32 && tr->to_f32, "%s has no quantizer", tr->name);
        if (!tr->from_f32) continue;
        size_t nb = (size_t)ft_dtype_nbytes(t, N);
        double worst = 0, worst2 = 0;
        int same = 0;
        for (int kind = 0; kind < NKIND; kind++)
            for (int rep = 0; rep < 4; rep++) {
                make_row(x, kind, &r);
                tr->from_f32(x, q, N);
                tr->to_f32(q, y, N);
                int at = -1;
                max_err(x, y, N, tr->block, t, &worst, &at);
                CHECKF(at < 0, "%s, row kind %d: element %d is %g, read back %g (bound %g)", tr->name, kind, at,
                       at >= 0 ? x[at] : 0, at >= 0 ? y[at] : 0, at >= 0 ? bound_of(t, x + at / tr->block * tr->block, tr->block) : 0);
                /* quantized again, the read-back values stay within the bound of themselves */
                tr->from_f32(y, q2, N);
                tr->to_f32(q2, z, N);
                at = -1;
                max_err(y, z, N, tr->block, t, &worst2, &at);
                CHECKF(at < 0, "%s, row kind %d, re-quantized: element %d: %g -> %g", tr->name, kind, at,
                       at >= 0 ? y[at] : 0, at >= 0 ? z[at] : 0);
                bool eq = memcmp(q, q2, nb) == 0;
                same += eq;
                if ((t == FT_Q8_0 || t == FT_Q4_1 || t == FT_Q5_1) && kind != 8 && kind != 9 && kind != 10)
                    CHECKF(eq, "%s, row kind %d: re-quantizing its own read-back changed the bytes", tr->name, kind);
                /* an all-zero row reads back as zeros in every type */
                if (kind == 1)
                    for (int i = 0; i < N; i++) CHECKF(y[i] == 0, "%s: zero row read back %g at %d", tr->name, y[i], i);
            }
        printf("  %-5s worst error %.3f of its bound (re-quantized %.3f); %d of %d rows re-quantize to the same bytes\n",
               tr->name, worst, worst2, same, NKIND * 4);
    }
    free(x); free(y); free(z); free(q); free(q2);
}

/* NaN and inf never reach a quantizer from the writer (check_row refuses
 * the row first, naming the tensor: tests/cli_kquant.sh), but a quantizer
 * given them still returns, with no undefined behaviour (make debug's
 * UBSan), and its block reads back non-finite or finite, never faulting */
static void test_nonfinite_inputs(void) {
    float x[FT_QK_K], y[FT_QK_K];
    uint8_t q[FT_QK_K * 4];
    for (int i = 0; i < FT_QK_K; i++) x[i] = i % 7 == 0 ? NAN : i % 11 == 0 ? INFINITY : i % 13 == 0 ? -INFINITY : 0.1f * (float)i;
    for (int ti = 0; ti < NT; ti++) {
        ft_types[types[ti]].from_f32(x, q, FT_QK_K);
        ft_types[types[ti]].to_f32(q, y, FT_QK_K);
    }
}

int main(void) {
    RUN(test_bounds_and_stability);
    RUN(test_nonfinite_inputs);
    CHECK_EXIT();
}
