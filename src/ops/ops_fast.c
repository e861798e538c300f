/* ops_fast.c — fast paths for the two ops that dominate a small model's
 * training step: causal attention (a forward tiled over queries and keys
 * with an online softmax that saves the log-sum-exp, and a backward that
 * recomputes the probabilities from it a query tile at a time) and
 * cross-entropy. Tested against the references in ops.c.
 *
 * The kernels are written once with 16-float vectors (GCC vector
 * extensions) in always-inline bodies, and instantiated three times: for
 * AVX-512, for AVX2+FMA and portable, picked at run time from ft_cpu_level().
 * Every output is computed by one thread in a fixed order, so results do
 * not depend on the schedule (bit-exact resume needs that).
 */
/* a·b+c fused where the instruction set has FMA (only the ISA-specific
 * instantiations get it); file-local, not -ffast-math: NaN/Inf stay. */
#pragma GCC optimize("fp-contract=fast")
#pragma GCC diagnostic ignored "-Wpsabi"

#include "ops/ops.h"

#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "core/parallel.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/ops_vec.h"

/* query rows per tile: the probabilities of a tile (BQ × Tk floats) stay
 * in cache while dK/dV accumulate over them */
#define BQ 32
/* keys per tile of the forward (online softmax over key tiles): a (BQ, BK)
 * tile of scores is 32 KiB, in L1/L2 whatever T is; even, so a key tile
 * starts on a bf16 pair of keys */
#define BK 256

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* ------------------------------------------------------------- exp */

INLINE void exp_body(float *y, const float *x, size_t n) {
    size_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf a = vload(x + i);
        vstore(y + i, vexp(&a));
    }
    if (i < n) {
        float buf[VL] = { 0 };
        memcpy(buf, x + i, (n - i) * sizeof(float));
        vf a = vload(buf);
        vstore(buf, vexp(&a));
        memcpy(y + i, buf, (n - i) * sizeof(float));
    }
}
T512 static void exp_avx512(float *y, const float *x, size_t n) { exp_body(y, x, n); }
T256 static void exp_avx2(float *y, const float *x, size_t n) { exp_body(y, x, n); }
static void exp_generic(float *y, const float *x, size_t n) { exp_body(y, x, n); }

void ft_exp_fast(float *y, const float *x, size_t n) {
    int lv = ft_cpu_level();
    if (lv >= FT_CPU_AVX512) exp_avx512(y, x, n);
    else if (lv >= FT_CPU_AVX2) exp_avx2(y, x, n);
    else exp_generic(y, x, n);
}

/* ------------------------------------------------------------- attention */

/* One unit of work: batch row b, kv head kvh, and the query heads that
 * share it. Pointers are already offset to the batch row. */
typedef struct {
    const float *q, *k, *v, *dout, *out;
    const float *lse_in;       /* (NH, T) for backward */
    float *o, *lse, *dq, *dk, *dv;
    const int *q_pos, *doc;
    int T, Tk, NH, NKV, HS, kv_stride, kvh;
    int cmode;                 /* products: ATT_F32, ATT_BF16 (rounded operands, f32 FMA), ATT_DPBF16 */
    const ft_kernel_isa *tiles; /* ATT_DPBF16 with its products on the tile unit (the table's gemm16), or NULL */
    float scale;
} att_unit;

/* How the products run. ATT_F32: f32 operands (today's path, --dtype f32).
 * In bf16 both of the others compute the same maths: every operand of a
 * product (q, k, v, dout; the probabilities P before P·V and dV, the score
 * gradients dS before dQ and dK) rounded to bf16 (RNE), exact products, f32
 * sums, as PyTorch's bf16 SDPA does; the softmax, its lse and
 * D = Σ p·dp stay f32. ATT_BF16 feeds bf16-valued floats to the f32
 * kernels (any level); ATT_DPBF16 (avx512bf16) runs all six products on
 * VDPBF16PS (bf16 pairs along the summed index: d, keys or query rows;
 * DAZ/FTZ as kernels.h says). At the amx level ATT_DPBF16's packed
 * operands go to the tile unit instead (kernels.h's gemm16, u->tiles; not
 * decode's one query row): the same pairs, each output's sum in the same
 * order along the summed index, in 16-pair steps on TDPBF16PS (the same
 * rounding rules, kernels.h). */
enum { ATT_F32, ATT_BF16, ATT_DPBF16 };

/* The pair products on the tiles. rows_t: C (nr × J) = alpha · A·Bt as
 * k_rows_t16 (J the widest row's keys: rows past their own end get scores
 * that the softmax masks, as k_rows_t16's 4-row blocks do); rows_p: O (nr
 * × HSp) = P·Bp over JP pairs of keys as k_rows_p16 (P zero past each
 * row's end); acc_t: Ct (HS × J) += Aᵀ·B as k_acc_t16, A's (nrp × HS)
 * words transposed first into at (HS × nrp; nrp <= BQ/2). */
static void tiles_rows_t(const att_unit *u, float *C, size_t ldc, const uint32_t *A, size_t lda, float alpha,
                         const uint32_t *Bt, size_t ldb, int np, int nr, const int *jr) {
    int J = 0;
    for (int r = 0; r < nr; r++) J = jr[r] > J ? jr[r] : J;
    if (J > 0) u->tiles->gemm16(C, (int64_t)ldc, A, (int64_t)lda, Bt, (int64_t)ldb, nr, J, np, alpha, false);
}
static void tiles_rows_p(const att_unit *u, float *O, size_t ldo, const uint32_t *P, size_t ldp, const uint32_t *Bp,
                         int HSp, int nr, const int *jr) {
    int J = 0;
    for (int r = 0; r < nr; r++) J = jr[r] > J ? jr[r] : J;
    if (J == 0) {
        for (int r = 0; r < nr; r++) memset(O + (size_t)r * ldo, 0, (size_t)HSp * sizeof(float));
        return;
    }
    u->tiles->gemm16(O, (int64_t)ldo, P, (int64_t)ldp, Bp, HSp, nr, HSp, (J + 1) / 2, 1.0f, false);
}
static void tiles_acc_t(const att_unit *u, uint32_t *at, float *Ct, size_t ldc, const uint32_t *A, size_t lda,
                        const uint32_t *B, size_t ldb, int HS, int nrp, int J) {
    if (J == 0 || nrp == 0) return;
    for (int d = 0; d < HS; d++)
        for (int r = 0; r < nrp; r++) at[(size_t)d * nrp + r] = A[(size_t)r * lda + d];
    u->tiles->gemm16(Ct, (int64_t)ldc, at, nrp, B, (int64_t)ldb, HS, J, nrp, 1.0f, true);
}

/* The per-thread scratch, in floats (see attention_fast_scratch_floats). */
typedef struct {
    float *Kt, *Vt;            /* (HS, Tkp) keys/values transposed, zero past Tk */
    float *Kp, *Vp;            /* (Tkp, HSp) rows padded with zeros */
    float *dKt, *dVt;          /* (HS, Tkp) gradient accumulators */
    float *P, *dP;             /* (BQ, Tkp) */
    float *acc;                /* (BQ, HSp) */
    int *docp;                 /* (Tkp) */
    /* bf16 modes: a tile's q and dout rows rounded (BQ, HSp) floats; as
     * bf16 pairs (BQ, HSp/2) words; P or dS as pairs (BQ, Tkp/2) words.
     * ATT_DPBF16 keeps K and V as pairs in Kt/Vt ((HSp/2, Tkp) words:
     * pairs along d) and Kp/Vp ((Tkp/2, HSp) words: pairs along keys). */
    float *qf, *dyf;
    uint32_t *q16, *dy16, *p16;
    uint32_t *at16; /* the tiles' backward: an operand transposed, (HS, BQ/2) words in qf's room (unused there) */
} att_scr;

static size_t scr_floats(int Tk, int HS, bool bwd) {
    size_t Tkp = round16((size_t)(Tk > 0 ? Tk : 1)), HSp = round16((size_t)HS);
    /* forward: the head's keys and values packed, one (BQ, BK) tile of
     * scores, the key tile's output and the running output, the document
     * ids; the bf16 modes' q tile (floats and pairs) and P tile as pairs */
    if (!bwd) return round16((size_t)HS * Tkp + Tkp * HSp + BQ * BK + 2 * BQ * HSp + Tkp + BQ * HSp + BQ * HSp / 2 +
                             BQ * BK / 2);
    size_t n = 2 * (size_t)HS * Tkp + Tkp * HSp + 2 * BQ * Tkp + BQ * HSp + Tkp;
    n += Tkp * HSp + 2 * (size_t)HS * Tkp;
    n += 3 * BQ * HSp + BQ * Tkp / 2; /* the bf16 modes' tiles */
    return round16(n);
}

size_t ft_attention_fast_scratch_floats(int Tk, int HS, int n_threads, bool backward) {
    int nt = n_threads > 1 ? n_threads : 1;
    size_t f = scr_floats(Tk, HS, false), b = backward ? scr_floats(Tk, HS, true) : 0;
    return (size_t)nt * (f > b ? f : b);
}

static att_scr scr_carve(float *base, int Tk, int HS, bool bwd) {
    size_t Tkp = round16((size_t)(Tk > 0 ? Tk : 1)), HSp = round16((size_t)HS);
    att_scr s = { 0 };
    float *p = base;
    if (!bwd) { /* as scr_floats(Tk, HS, false) counts */
        s.Kt = p; p += (size_t)HS * Tkp;
        s.Vp = p; p += Tkp * HSp;
        s.P = p; p += BQ * BK;
        s.dP = p; p += BQ * HSp; /* the key tile's part of the output */
        s.acc = p; p += BQ * HSp;
        s.docp = (int *)p; p += Tkp;
        s.qf = p; p += BQ * HSp;
        s.q16 = (uint32_t *)p; p += BQ * HSp / 2;
        s.p16 = (uint32_t *)p;
        return s;
    }
    s.Kt = p; p += (size_t)HS * Tkp;
    s.Vt = p; p += (size_t)HS * Tkp;
    s.Vp = p; p += Tkp * HSp;
    s.P = p; p += BQ * Tkp;
    s.dP = p; p += BQ * Tkp;
    s.acc = p; p += BQ * HSp;
    s.docp = (int *)p; p += Tkp;
    s.Kp = p; p += Tkp * HSp;
    s.dKt = p; p += (size_t)HS * Tkp;
    s.dVt = p; p += (size_t)HS * Tkp;
    s.qf = p; p += BQ * HSp;
    s.dyf = p; p += BQ * HSp;
    s.q16 = (uint32_t *)p; p += BQ * HSp / 2;
    s.dy16 = (uint32_t *)p; p += BQ * HSp / 2;
    s.p16 = (uint32_t *)p;
    s.at16 = (uint32_t *)s.qf;
    return s;
}

/* C[r][j] = alpha · Σ_d A[r][d]·Bt[d][j] for rows r < nr (A row stride lda)
 * and j < J (a multiple of 16; rows may stop earlier: jr[r]). */
INLINE void k_rows_t(float *C, size_t ldc, const float *A, size_t lda, float alpha, const float *Bt, size_t ldb,
                     int HS, int nr, const int *jr) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        int J = jr[r] > jr[r + 1] ? jr[r] : jr[r + 1];
        J = J > jr[r + 2] ? J : jr[r + 2];
        J = J > jr[r + 3] ? J : jr[r + 3];
        const float *a0 = A + r * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        int j = 0;
        for (; j + 2 * VL <= J; j += 2 * VL) {
            vf c00 = { 0 }, c01 = { 0 }, c10 = { 0 }, c11 = { 0 }, c20 = { 0 }, c21 = { 0 }, c30 = { 0 },
               c31 = { 0 };
            for (int d = 0; d < HS; d++) {
                vf b0 = vload(Bt + d * ldb + j), b1 = vload(Bt + d * ldb + j + VL);
                vf x0 = vset1(a0[d]), x1 = vset1(a1[d]), x2 = vset1(a2[d]), x3 = vset1(a3[d]);
                c00 = x0 * b0 + c00; c01 = x0 * b1 + c01;
                c10 = x1 * b0 + c10; c11 = x1 * b1 + c11;
                c20 = x2 * b0 + c20; c21 = x2 * b1 + c21;
                c30 = x3 * b0 + c30; c31 = x3 * b1 + c31;
            }
            float *c = C + r * ldc + j;
            vstore(c, c00 * alpha); vstore(c + VL, c01 * alpha); c += ldc;
            vstore(c, c10 * alpha); vstore(c + VL, c11 * alpha); c += ldc;
            vstore(c, c20 * alpha); vstore(c + VL, c21 * alpha); c += ldc;
            vstore(c, c30 * alpha); vstore(c + VL, c31 * alpha);
        }
        for (; j < J; j += VL) {
            vf c0 = { 0 }, c1 = { 0 }, c2 = { 0 }, c3 = { 0 };
            for (int d = 0; d < HS; d++) {
                vf b0 = vload(Bt + d * ldb + j);
                c0 = vset1(a0[d]) * b0 + c0; c1 = vset1(a1[d]) * b0 + c1;
                c2 = vset1(a2[d]) * b0 + c2; c3 = vset1(a3[d]) * b0 + c3;
            }
            float *c = C + r * ldc + j;
            vstore(c, c0 * alpha); vstore(c + ldc, c1 * alpha);
            vstore(c + 2 * ldc, c2 * alpha); vstore(c + 3 * ldc, c3 * alpha);
        }
    }
    for (; r < nr; r++) {
        const float *a0 = A + r * lda;
        for (int j = 0; j < jr[r]; j += VL) {
            vf c0 = { 0 };
            for (int d = 0; d < HS; d++) c0 = vset1(a0[d]) * vload(Bt + d * ldb + j) + c0;
            vstore(C + r * ldc + j, c0 * alpha);
        }
    }
}

/* Ct[d][j] += Σ_r A[r][d]·B[r][j] for d < HS, j < J (a multiple of 16). */
INLINE void k_acc_t(float *Ct, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int HS, int nr,
                    int J) {
    int d = 0;
    for (; d + 4 <= HS; d += 4) {
        int j = 0;
        for (; j + 2 * VL <= J; j += 2 * VL) {
            float *c = Ct + d * ldc + j;
            vf c00 = vload(c), c01 = vload(c + VL), c10 = vload(c + ldc), c11 = vload(c + ldc + VL);
            vf c20 = vload(c + 2 * ldc), c21 = vload(c + 2 * ldc + VL), c30 = vload(c + 3 * ldc),
               c31 = vload(c + 3 * ldc + VL);
            for (int r = 0; r < nr; r++) {
                vf b0 = vload(B + r * ldb + j), b1 = vload(B + r * ldb + j + VL);
                const float *a = A + r * lda + d;
                vf x0 = vset1(a[0]), x1 = vset1(a[1]), x2 = vset1(a[2]), x3 = vset1(a[3]);
                c00 = x0 * b0 + c00; c01 = x0 * b1 + c01;
                c10 = x1 * b0 + c10; c11 = x1 * b1 + c11;
                c20 = x2 * b0 + c20; c21 = x2 * b1 + c21;
                c30 = x3 * b0 + c30; c31 = x3 * b1 + c31;
            }
            vstore(c, c00); vstore(c + VL, c01); vstore(c + ldc, c10); vstore(c + ldc + VL, c11);
            vstore(c + 2 * ldc, c20); vstore(c + 2 * ldc + VL, c21);
            vstore(c + 3 * ldc, c30); vstore(c + 3 * ldc + VL, c31);
        }
        for (; j < J; j += VL) {
            float *c = Ct + d * ldc + j;
            vf c0 = vload(c), c1 = vload(c + ldc), c2 = vload(c + 2 * ldc), c3 = vload(c + 3 * ldc);
            for (int r = 0; r < nr; r++) {
                vf b0 = vload(B + r * ldb + j);
                const float *a = A + r * lda + d;
                c0 = vset1(a[0]) * b0 + c0; c1 = vset1(a[1]) * b0 + c1;
                c2 = vset1(a[2]) * b0 + c2; c3 = vset1(a[3]) * b0 + c3;
            }
            vstore(c, c0); vstore(c + ldc, c1); vstore(c + 2 * ldc, c2); vstore(c + 3 * ldc, c3);
        }
    }
    for (; d < HS; d++) {
        for (int j = 0; j < J; j += VL) {
            float *c = Ct + d * ldc + j;
            vf c0 = vload(c);
            for (int r = 0; r < nr; r++) c0 = vset1(A[r * lda + d]) * vload(B + r * ldb + j) + c0;
            vstore(c, c0);
        }
    }
}

/* O[r][:] = Σ_j P[r][j]·Bp[j][:] for rows r < nr over keys j < jr[r]
 * (P is zero from jr[r] up to the block's longest row), HSp/16 vectors. */
INLINE void k_rows_p(float *O, size_t ldo, const float *P, size_t ldp, const float *Bp, int HSp, int nr,
                     const int *jr) {
    int nv = HSp / VL;
    for (int r = 0; r < nr; r += 4) {
        int rr = nr - r < 4 ? nr - r : 4;
        int J = 0;
        for (int i = 0; i < rr; i++) J = jr[r + i] > J ? jr[r + i] : J;
        for (int v0 = 0; v0 < nv; v0 += 4) {
            int vv = nv - v0 < 4 ? nv - v0 : 4;
            vf c[4][4];
            for (int i = 0; i < 4; i++)
                for (int w = 0; w < 4; w++) c[i][w] = (vf){ 0 };
            if (rr == 4 && vv == 4) {
                for (int j = 0; j < J; j++) {
                    const float *b = Bp + (size_t)j * HSp + v0 * VL;
                    vf b0 = vload(b), b1 = vload(b + VL), b2 = vload(b + 2 * VL), b3 = vload(b + 3 * VL);
                    for (int i = 0; i < 4; i++) {
                        vf x = vset1(P[(r + i) * ldp + j]);
                        c[i][0] = x * b0 + c[i][0]; c[i][1] = x * b1 + c[i][1];
                        c[i][2] = x * b2 + c[i][2]; c[i][3] = x * b3 + c[i][3];
                    }
                }
            } else if (rr == 4 && vv == 1) {
                for (int j = 0; j < J; j++) {
                    vf b0 = vload(Bp + (size_t)j * HSp + v0 * VL);
                    for (int i = 0; i < 4; i++) c[i][0] = vset1(P[(r + i) * ldp + j]) * b0 + c[i][0];
                }
            } else {
                for (int j = 0; j < J; j++) {
                    const float *b = Bp + (size_t)j * HSp + v0 * VL;
                    for (int i = 0; i < rr; i++) {
                        vf x = vset1(P[(r + i) * ldp + j]);
                        for (int w = 0; w < vv; w++) c[i][w] = x * vload(b + w * VL) + c[i][w];
                    }
                }
            }
            for (int i = 0; i < rr; i++)
                for (int w = 0; w < vv; w++) vstore(O + (r + i) * ldo + (v0 + w) * VL, c[i][w]);
        }
    }
}

/* x rounded to bf16 (RNE), as a float */
INLINE float bf16r(float x) { return ft_bf16_to_f32(ft_f32_to_bf16(x)); }
/* the bf16 pair (lo, hi) as one word: lo in the low half */
INLINE uint32_t bf16_pair(float lo, float hi) {
    return (uint32_t)ft_f32_to_bf16(lo) | (uint32_t)ft_f32_to_bf16(hi) << 16;
}

static int pack_t_blocks(float *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS);

/* Keys (and values) of one kv head packed: transposed (HS, Tkp) and/or as
 * padded rows (Tkp, HSp); zeros past Tk; rounded to bf16 when rnd. The
 * transpose runs 16 keys at a time in registers where the level has
 * AVX-512 (pack_t_blocks), the rest element by element down the columns. */
INLINE void pack_t(float *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS, bool rnd) {
    int j0 = pack_t_blocks(Xt, x, stride, Tk, Tkp, HS);
    for (int d = 0; d < HS; d++) {
        float *row = Xt + (size_t)d * Tkp;
        for (int j = j0; j < Tk; j++) row[j] = x[(size_t)j * stride + d];
        for (int j = Tk; j < Tkp; j++) row[j] = 0;
        if (rnd)
            for (int j = 0; j < Tk; j++) row[j] = bf16r(row[j]);
    }
}
INLINE void pack_p(float *Xp, const float *x, size_t stride, int Tk, int Tkp, int HS, int HSp, bool rnd) {
    for (int j = 0; j < Tkp; j++) {
        float *row = Xp + (size_t)j * HSp;
        int n = j < Tk ? HS : 0;
        if (n) memcpy(row, x + (size_t)j * stride, (size_t)HS * sizeof(float));
        for (int d = n; d < HSp; d++) row[d] = 0;
        if (rnd)
            for (int d = 0; d < n; d++) row[d] = bf16r(row[d]);
    }
}
/* nr rows of n floats (lda apart) rounded into dst (rows ldd apart) as
 * floats, and/or as bf16 pairs (rows ldw words apart, n padded to even);
 * dst may be a. */
INLINE void tile_round(float *dst, size_t ldd, uint32_t *w, size_t ldw, const float *a, size_t lda, int nr, int n) {
    for (int r = 0; r < nr; r++) {
        const float *x = a + (size_t)r * lda;
        float *dr = dst ? dst + (size_t)r * ldd : NULL;
        uint32_t *wr = w ? w + (size_t)r * ldw : NULL;
        int d = 0;
        for (; d + VL <= n; d += VL) {
            vu b = bf16_bits(vload(x + d));
            if (wr) {
                vh h = __builtin_convertvector(b, vh);
                memcpy(wr + d / 2, &h, sizeof h);
            }
            if (dr) vstore(dr + d, (vf)(b << 16));
        }
        for (; d < n; d += 2) {
            float x0 = x[d], x1 = d + 1 < n ? x[d + 1] : 0.0f;
            if (wr) wr[d / 2] = bf16_pair(x0, x1);
            if (dr) {
                dr[d] = bf16r(x0);
                if (d + 1 < n) dr[d + 1] = bf16r(x1);
            }
        }
    }
}
#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/transpose16.h"

#define TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define DP(c, a, b) ((c) = _mm512_dpbf16_ps((c), (a), (b)))
#define LOADBH(p) ((__m512bh)_mm512_loadu_si512(p))
#define SETBH(w) ((__m512bh)_mm512_set1_epi32((int)(w)))

/* k_rows_t on bf16 pairs: C[r][j] = alpha · Σ_p A[r][p]·Bt[p][j] (pair
 * dot products), A (nr, np words, rows lda apart), Bt (np, J words). */
TBF16 static void k_rows_t16(float *C, size_t ldc, const uint32_t *A, size_t lda, float alpha, const uint32_t *Bt,
                             size_t ldb, int np, int nr, const int *jr) {
    __m512 al = _mm512_set1_ps(alpha);
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        int J = jr[r] > jr[r + 1] ? jr[r] : jr[r + 1];
        J = J > jr[r + 2] ? J : jr[r + 2];
        J = J > jr[r + 3] ? J : jr[r + 3];
        const uint32_t *a0 = A + r * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        int j = 0;
        for (; j + 32 <= J; j += 32) {
            __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
                   c31 = c00;
            for (int p = 0; p < np; p++) {
                __m512bh b0 = LOADBH(Bt + p * ldb + j), b1 = LOADBH(Bt + p * ldb + j + 16);
                __m512bh x0 = SETBH(a0[p]), x1 = SETBH(a1[p]), x2 = SETBH(a2[p]), x3 = SETBH(a3[p]);
                DP(c00, x0, b0); DP(c01, x0, b1);
                DP(c10, x1, b0); DP(c11, x1, b1);
                DP(c20, x2, b0); DP(c21, x2, b1);
                DP(c30, x3, b0); DP(c31, x3, b1);
            }
            float *c = C + r * ldc + j;
            _mm512_storeu_ps(c, _mm512_mul_ps(c00, al)); _mm512_storeu_ps(c + 16, _mm512_mul_ps(c01, al)); c += ldc;
            _mm512_storeu_ps(c, _mm512_mul_ps(c10, al)); _mm512_storeu_ps(c + 16, _mm512_mul_ps(c11, al)); c += ldc;
            _mm512_storeu_ps(c, _mm512_mul_ps(c20, al)); _mm512_storeu_ps(c + 16, _mm512_mul_ps(c21, al)); c += ldc;
            _mm512_storeu_ps(c, _mm512_mul_ps(c30, al)); _mm512_storeu_ps(c + 16, _mm512_mul_ps(c31, al));
        }
        for (; j < J; j += 16) {
            __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
            for (int p = 0; p < np; p++) {
                __m512bh b0 = LOADBH(Bt + p * ldb + j);
                DP(c0, SETBH(a0[p]), b0); DP(c1, SETBH(a1[p]), b0);
                DP(c2, SETBH(a2[p]), b0); DP(c3, SETBH(a3[p]), b0);
            }
            float *c = C + r * ldc + j;
            _mm512_storeu_ps(c, _mm512_mul_ps(c0, al)); _mm512_storeu_ps(c + ldc, _mm512_mul_ps(c1, al));
            _mm512_storeu_ps(c + 2 * ldc, _mm512_mul_ps(c2, al)); _mm512_storeu_ps(c + 3 * ldc, _mm512_mul_ps(c3, al));
        }
    }
    for (; r < nr; r++) {
        const uint32_t *a0 = A + r * lda;
        for (int j = 0; j < jr[r]; j += 16) {
            __m512 c0 = _mm512_setzero_ps();
            for (int p = 0; p < np; p++) DP(c0, SETBH(a0[p]), LOADBH(Bt + p * ldb + j));
            _mm512_storeu_ps(C + r * ldc + j, _mm512_mul_ps(c0, al));
        }
    }
}

/* The packers of ATT_DPBF16, converting with VCVTNE(2)PS2BF16 (RNE; it
 * takes subnormal inputs as zero, as VDPBF16PS does with what it is fed).
 * rows_to_pairs16: nr rows of n floats (lda apart) to words of
 * consecutive pairs (rows ldw words apart, an odd n padded with 0).
 * rpairs16: rows in pairs, word (rp, d) = (a[2rp][d], a[2rp+1][d]) (an odd
 * last row paired with 0). */
TBF16 static void rows_to_pairs16(uint32_t *w, size_t ldw, const float *a, size_t lda, int nr, int n) {
    for (int r = 0; r < nr; r++) {
        const float *x = a + (size_t)r * lda;
        uint32_t *wr = w + (size_t)r * ldw;
        int d = 0;
        for (; d + 32 <= n; d += 32)
            _mm512_storeu_si512(wr + d / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + d + 16),
                                                                          _mm512_loadu_ps(x + d)));
        if (d < n) {
            int m = n - d;
            __m512 lo = _mm512_maskz_loadu_ps((__mmask16)(m >= 16 ? 0xFFFF : (1u << m) - 1), x + d);
            __m512 hi = m > 16 ? _mm512_maskz_loadu_ps((__mmask16)((1u << (m - 16)) - 1), x + d + 16)
                               : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(wr + d / 2, (__mmask16)((1u << ((m + 1) / 2)) - 1),
                                     (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}
TBF16 static void rpairs16(uint32_t *w, size_t ldw, const float *a, size_t lda, int nr, int n) {
    /* word i of the result: bf16 i (row 2rp) low, bf16 16 + i (row 2rp + 1) high */
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int rp = 0; rp < (nr + 1) / 2; rp++) {
        const float *x0 = a + (size_t)(2 * rp) * lda, *x1 = 2 * rp + 1 < nr ? x0 + lda : NULL;
        uint32_t *row = w + (size_t)rp * ldw;
        for (int d = 0; d < n; d += 16) {
            /* both rows' 16 floats in one conversion (x0's to the low
             * half), then interleaved by one word permutation */
            __mmask16 m = (__mmask16)(n - d >= 16 ? 0xFFFF : (1u << (n - d)) - 1);
            __m512 f1 = x1 ? _mm512_maskz_loadu_ps(m, x1 + d) : _mm512_setzero_ps();
            __m512i h = (__m512i)_mm512_cvtne2ps_pbh(f1, _mm512_maskz_loadu_ps(m, x0 + d));
            _mm512_mask_storeu_epi32(row + d, m, _mm512_permutexvar_epi16(pairs, h));
        }
    }
}

/* pack_t's copy for the keys [0, 16·floor(Tk/16)) at the AVX-512 levels
 * (0 keys below them): 16 keys × 16 floats of d loaded (a ragged end of d
 * masked), transposed in registers and stored as 16 rows of Xt, instead of
 * reading each column of the cache with a stride (decode repacks every
 * cached key of every head per token). A copy: the same bits. */
__attribute__((target("avx512f"))) static int pack_t_blocks_avx512(float *Xt, const float *x, size_t stride, int Tk,
                                                                  int Tkp, int HS) {
    int J = Tk / 16 * 16;
    for (int j0 = 0; j0 < J; j0 += 16)
        for (int d = 0; d < HS; d += 16) {
            int m = HS - d < 16 ? HS - d : 16;
            __mmask16 mk = (__mmask16)(m == 16 ? 0xFFFF : (1u << m) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi32(mk, x + (size_t)(j0 + i) * stride + d);
            ft_transpose16(r);
            for (int p = 0; p < m; p++) _mm512_storeu_si512(Xt + (size_t)(d + p) * Tkp + j0, r[p]);
        }
    return J;
}
static int pack_t_blocks(float *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    return ft_cpu_level() >= FT_CPU_AVX512 ? pack_t_blocks_avx512(Xt, x, stride, Tk, Tkp, HS) : 0;
}

/* Keys j0..j0+15's elements [d, d+m) (m <= 32) as 16 pair words each,
 * converted as rows_to_pairs16 converts them (one VCVTNE2PS2BF16 on the
 * same masked loads; a key from Tk on as zeros), then transposed: r[p] is
 * pair p of the 16 keys. */
TBF16 static inline __attribute__((always_inline)) void key_pairs_block(__m512i r[16], const float *x, size_t stride, int Tk, int j0, int d, int m) {
    __mmask16 mlo = (__mmask16)(m >= 16 ? 0xFFFF : (1u << m) - 1);
    __mmask16 mhi = (__mmask16)(m >= 32 ? 0xFFFF : m > 16 ? (1u << (m - 16)) - 1 : 0);
    for (int i = 0; i < 16; i++) {
        const float *xi = x + (size_t)(j0 + i) * stride + d;
        r[i] = j0 + i < Tk ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(mhi, xi + 16),
                                                          _mm512_maskz_loadu_ps(mlo, xi))
                           : _mm512_setzero_si512();
    }
    ft_transpose16(r);
}

/* pack_pairs_t's words for the keys [0, 16·floor(Tk/16)), 16 keys at a
 * time: each key's 32 floats of d converted to 16 pair words as
 * rows_to_pairs16 converts them (the same instruction on the same
 * operands, a ragged end of d masked the same way), the 16×16 block of
 * words transposed in registers and stored as 16 rows of Xt, instead of
 * 16 scattered words per key (decode packs every cached key of every head
 * per token: the scattered stores took most of its attention's time).
 * Returns the keys done. */
TBF16 static int pack_pairs_t_blocks(uint32_t *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    int J = Tk / 16 * 16;
    for (int j0 = 0; j0 < J; j0 += 16)
        for (int d = 0; d < HS; d += 32) {
            int m = HS - d < 32 ? HS - d : 32;
            __m512i r[16];
            key_pairs_block(r, x, stride, Tk, j0, d, m);
            for (int p = 0; p < (m + 1) / 2; p++) _mm512_storeu_si512(Xt + (size_t)(d / 2 + p) * Tkp + j0, r[p]);
        }
    return J;
}

/* Decode (one query row) without packing: k_rows_t16's scores for the
 * keys [0, J) (J a multiple of 16) from the f32 cache, each 16-key block
 * converted and transposed in registers as pack_pairs_t_blocks does (keys
 * from Tk on as zero words, as the packed layout has them) and fed to the
 * same VDPBF16PS chain, pair by pair in order; S[j] = alpha · score. */
TBF16 static void dec_scores16(float *S, const uint32_t *q, const float *k, size_t stride, int Tk, int J, int HS,
                               float alpha) {
    __m512 al = _mm512_set1_ps(alpha);
    for (int j0 = 0; j0 < J; j0 += 16) {
        __m512 c0 = _mm512_setzero_ps();
        for (int d = 0; d < HS; d += 32) {
            int m = HS - d < 32 ? HS - d : 32;
            __m512i r[16];
            key_pairs_block(r, k, stride, Tk, j0, d, m);
            for (int p = 0; p < (m + 1) / 2; p++) DP(c0, SETBH(q[d / 2 + p]), (__m512bh)r[p]);
        }
        _mm512_storeu_ps(S + j0, _mm512_mul_ps(c0, al));
    }
}

/* Decode's P·V without packing: k_rows_p16 on one row, O[d] = Σ_jp
 * P[jp]·(pair jp of the keys j0 + 2jp, j0 + 2jp + 1) over the first n keys
 * of the tile, each value pair formed from the f32 cache as rpairs16 forms
 * it (a key from Tk on, and d from HS on, as zeros) and fed to the same
 * VDPBF16PS chain per 16 lanes of d, pair by pair in order. */
TBF16 static void dec_pv16(float *O, const uint32_t *P, const float *v, size_t stride, int Tk, int j0, int n, int HS,
                           int HSp) {
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int nv = HSp / 16, JP = (n + 1) / 2;
    for (int v0 = 0; v0 < nv; v0 += 4) {
        int vv = nv - v0 < 4 ? nv - v0 : 4;
        __m512 c[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps() };
        for (int jp = 0; jp < JP; jp++) {
            __m512bh x = SETBH(P[jp]);
            const float *x0 = v + (size_t)(j0 + 2 * jp) * stride, *x1 = j0 + 2 * jp + 1 < Tk ? x0 + stride : NULL;
            for (int w = 0; w < vv; w++) {
                int d = (v0 + w) * 16;
                __mmask16 m = (__mmask16)(d >= HS ? 0 : HS - d >= 16 ? 0xFFFF : (1u << (HS - d)) - 1);
                __m512 f1 = x1 ? _mm512_maskz_loadu_ps(m, x1 + d) : _mm512_setzero_ps();
                __m512i h = (__m512i)_mm512_cvtne2ps_pbh(f1, _mm512_maskz_loadu_ps(m, x0 + d));
                DP(c[w], x, (__m512bh)_mm512_permutexvar_epi16(pairs, h));
            }
        }
        for (int w = 0; w < vv; w++) _mm512_storeu_ps(O + (v0 + w) * 16, c[w]);
    }
}
#define HAVE_DEC16 1

/* k_acc_t on bf16 pairs of rows: Ct[d][j] += Σ_rp A[rp][d]·B[rp][j] for
 * d < HS, j < J (a multiple of 16); A (nrp, HS words), B (nrp, J words). */
TBF16 static void k_acc_t16(float *Ct, size_t ldc, const uint32_t *A, size_t lda, const uint32_t *B, size_t ldb, int HS,
                            int nrp, int J) {
    int d = 0;
    for (; d + 4 <= HS; d += 4) {
        int j = 0;
        for (; j + 32 <= J; j += 32) {
            float *c = Ct + d * ldc + j;
            __m512 c00 = _mm512_loadu_ps(c), c01 = _mm512_loadu_ps(c + 16), c10 = _mm512_loadu_ps(c + ldc),
                   c11 = _mm512_loadu_ps(c + ldc + 16), c20 = _mm512_loadu_ps(c + 2 * ldc),
                   c21 = _mm512_loadu_ps(c + 2 * ldc + 16), c30 = _mm512_loadu_ps(c + 3 * ldc),
                   c31 = _mm512_loadu_ps(c + 3 * ldc + 16);
            for (int r = 0; r < nrp; r++) {
                __m512bh b0 = LOADBH(B + r * ldb + j), b1 = LOADBH(B + r * ldb + j + 16);
                const uint32_t *a = A + r * lda + d;
                __m512bh x0 = SETBH(a[0]), x1 = SETBH(a[1]), x2 = SETBH(a[2]), x3 = SETBH(a[3]);
                DP(c00, x0, b0); DP(c01, x0, b1);
                DP(c10, x1, b0); DP(c11, x1, b1);
                DP(c20, x2, b0); DP(c21, x2, b1);
                DP(c30, x3, b0); DP(c31, x3, b1);
            }
            _mm512_storeu_ps(c, c00); _mm512_storeu_ps(c + 16, c01);
            _mm512_storeu_ps(c + ldc, c10); _mm512_storeu_ps(c + ldc + 16, c11);
            _mm512_storeu_ps(c + 2 * ldc, c20); _mm512_storeu_ps(c + 2 * ldc + 16, c21);
            _mm512_storeu_ps(c + 3 * ldc, c30); _mm512_storeu_ps(c + 3 * ldc + 16, c31);
        }
        for (; j < J; j += 16) {
            float *c = Ct + d * ldc + j;
            __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + ldc), c2 = _mm512_loadu_ps(c + 2 * ldc),
                   c3 = _mm512_loadu_ps(c + 3 * ldc);
            for (int r = 0; r < nrp; r++) {
                __m512bh b0 = LOADBH(B + r * ldb + j);
                const uint32_t *a = A + r * lda + d;
                DP(c0, SETBH(a[0]), b0); DP(c1, SETBH(a[1]), b0);
                DP(c2, SETBH(a[2]), b0); DP(c3, SETBH(a[3]), b0);
            }
            _mm512_storeu_ps(c, c0); _mm512_storeu_ps(c + ldc, c1);
            _mm512_storeu_ps(c + 2 * ldc, c2); _mm512_storeu_ps(c + 3 * ldc, c3);
        }
    }
    for (; d < HS; d++) {
        for (int j = 0; j < J; j += 16) {
            float *c = Ct + d * ldc + j;
            __m512 c0 = _mm512_loadu_ps(c);
            for (int r = 0; r < nrp; r++) DP(c0, SETBH(A[r * lda + d]), LOADBH(B + r * ldb + j));
            _mm512_storeu_ps(c, c0);
        }
    }
}

/* k_rows_p on bf16 pairs: O[r][:] = Σ_jp P[r][jp]·Bp[jp][:] over the pairs
 * of keys below jr[r] (P zero past a row's end), HSp/16 vectors. */
TBF16 static void k_rows_p16(float *O, size_t ldo, const uint32_t *P, size_t ldp, const uint32_t *Bp, int HSp, int nr,
                             const int *jr) {
    int nv = HSp / 16;
    for (int r = 0; r < nr; r += 4) {
        int rr = nr - r < 4 ? nr - r : 4;
        int J = 0;
        for (int i = 0; i < rr; i++) J = jr[r + i] > J ? jr[r + i] : J;
        int JP = (J + 1) / 2;
        for (int v0 = 0; v0 < nv; v0 += 4) {
            int vv = nv - v0 < 4 ? nv - v0 : 4;
            __m512 c[4][4];
            for (int i = 0; i < 4; i++)
                for (int w = 0; w < 4; w++) c[i][w] = _mm512_setzero_ps();
            if (rr == 4 && vv == 4) {
                for (int jp = 0; jp < JP; jp++) {
                    const uint32_t *b = Bp + (size_t)jp * HSp + v0 * 16;
                    __m512bh b0 = LOADBH(b), b1 = LOADBH(b + 16), b2 = LOADBH(b + 32), b3 = LOADBH(b + 48);
                    for (int i = 0; i < 4; i++) {
                        __m512bh x = SETBH(P[(r + i) * ldp + jp]);
                        DP(c[i][0], x, b0); DP(c[i][1], x, b1); DP(c[i][2], x, b2); DP(c[i][3], x, b3);
                    }
                }
            } else {
                for (int jp = 0; jp < JP; jp++) {
                    const uint32_t *b = Bp + (size_t)jp * HSp + v0 * 16;
                    for (int i = 0; i < rr; i++) {
                        __m512bh x = SETBH(P[(r + i) * ldp + jp]);
                        for (int w = 0; w < vv; w++) DP(c[i][w], x, LOADBH(b + w * 16));
                    }
                }
            }
            for (int i = 0; i < rr; i++)
                for (int w = 0; w < vv; w++) _mm512_storeu_ps(O + (r + i) * ldo + (v0 + w) * 16, c[i][w]);
        }
    }
}
#else
/* the same pair products in plain C, for a build without the intrinsics
 * (ATT_DPBF16 is only chosen at the avx512bf16 level, so unused there) */
static float pair_dot(uint32_t a, uint32_t b) {
    return ft_bf16_to_f32((uint16_t)a) * ft_bf16_to_f32((uint16_t)b) +
           ft_bf16_to_f32((uint16_t)(a >> 16)) * ft_bf16_to_f32((uint16_t)(b >> 16));
}
static void k_rows_t16(float *C, size_t ldc, const uint32_t *A, size_t lda, float alpha, const uint32_t *Bt,
                       size_t ldb, int np, int nr, const int *jr) {
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < jr[r]; j++) {
            float c = 0;
            for (int p = 0; p < np; p++) c += pair_dot(A[r * lda + p], Bt[p * ldb + j]);
            C[r * ldc + j] = c * alpha;
        }
}
static void rows_to_pairs16(uint32_t *w, size_t ldw, const float *a, size_t lda, int nr, int n) {
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < n; d += 2) w[r * ldw + d / 2] = bf16_pair(a[r * lda + d], d + 1 < n ? a[r * lda + d + 1] : 0.0f);
}
static void rpairs16(uint32_t *w, size_t ldw, const float *a, size_t lda, int nr, int n) {
    for (int rp = 0; rp < (nr + 1) / 2; rp++)
        for (int d = 0; d < n; d++)
            w[rp * ldw + d] = bf16_pair(a[2 * rp * lda + d], 2 * rp + 1 < nr ? a[(2 * rp + 1) * lda + d] : 0.0f);
}
static int pack_pairs_t_blocks(uint32_t *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    (void)Xt, (void)x, (void)stride, (void)Tk, (void)Tkp, (void)HS;
    return 0; /* pack_pairs_t converts every key itself */
}
static int pack_t_blocks(float *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    (void)Xt, (void)x, (void)stride, (void)Tk, (void)Tkp, (void)HS;
    return 0; /* pack_t copies every key itself */
}
#define HAVE_DEC16 0 /* decode packs, as every other shape does */
static void k_acc_t16(float *Ct, size_t ldc, const uint32_t *A, size_t lda, const uint32_t *B, size_t ldb, int HS,
                      int nrp, int J) {
    for (int d = 0; d < HS; d++)
        for (int j = 0; j < J; j++) {
            float c = Ct[d * ldc + j];
            for (int r = 0; r < nrp; r++) c += pair_dot(A[r * lda + d], B[r * ldb + j]);
            Ct[d * ldc + j] = c;
        }
}
static void k_rows_p16(float *O, size_t ldo, const uint32_t *P, size_t ldp, const uint32_t *Bp, int HSp, int nr,
                       const int *jr) {
    for (int r = 0; r < nr; r++)
        for (int d = 0; d < HSp; d++) {
            float c = 0;
            for (int jp = 0; jp < (jr[r] + 1) / 2; jp++) c += pair_dot(P[r * ldp + jp], Bp[(size_t)jp * HSp + d]);
            O[r * ldo + d] = c;
        }
}
#endif

/* K or V of one kv head as bf16 pairs along d, word (p, j) = (x[j][2p],
 * x[j][2p+1]) in (HSp/2, Tkp): blocks of 16 keys transposed in registers
 * where the level has them, then each remaining key's row converted and
 * its words dealt down a column; zeros past Tk. */
static void pack_pairs_t(uint32_t *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    int HSh = (HS + 1) / 2;
    uint32_t tmp[256];
    for (int j = pack_pairs_t_blocks(Xt, x, stride, Tk, Tkp, HS); j < Tk; j++)
        for (int d0 = 0; d0 < HS; d0 += 512) {
            int n = HS - d0 < 512 ? HS - d0 : 512;
            rows_to_pairs16(tmp, 0, x + (size_t)j * stride + d0, 0, 1, n);
            for (int p = 0; p < (n + 1) / 2; p++) Xt[(size_t)(d0 / 2 + p) * Tkp + j] = tmp[p];
        }
    for (int p = 0; p < HSh; p++)
        for (int j = Tk; j < Tkp; j++) Xt[(size_t)p * Tkp + j] = 0;
}
/* As bf16 pairs along keys, word (jp, d) = (x[2jp][d], x[2jp+1][d]) in
 * (Tkp/2, HSp); zeros past Tk and HS. */
static void pack_pairs_p(uint32_t *Xp, const float *x, size_t stride, int Tk, int Tkp, int HS, int HSp) {
    rpairs16(Xp, HSp, x, stride, Tk, HS);
    for (int jp = 0; jp < Tkp / 2; jp++)
        for (int d = jp < (Tk + 1) / 2 ? HS : 0; d < HSp; d++) Xp[(size_t)jp * HSp + d] = 0;
}

/* The visible key count of query t: keys 0..last, last = min(q_pos, Tk-1). */
INLINE int n_keys(const att_unit *u, int t) {
    int last = u->q_pos[t] < u->Tk ? u->q_pos[t] : u->Tk - 1;
    return last + 1 > 0 ? last + 1 : 0;
}

/* Scores of a tile's rows already in s->P (scaled); masks keys past the
 * causal limit and other documents to -inf over [0, jr[r]), then turns
 * each row into probabilities: with lse_in given, p = exp(s - lse);
 * otherwise the softmax (max, exp once, sum in double), writing lse.
 * Rows are zero from their own end up to Jmax. */
INLINE void tile_softmax(const att_unit *u, att_scr *s, size_t Tkp, int t0, int nq, const int *nk, const int *jr,
                         int Jmax, const float *lse_in, float *lse_out) {
    for (int r = 0; r < nq; r++) {
        float *p = s->P + r * Tkp;
        int n = nk[r];
        if (n == 0) {
            memset(p, 0, (size_t)Jmax * sizeof(float));
            if (lse_out) lse_out[t0 + r] = -INFINITY;
            continue;
        }
        vi qdoc = (vi){ 0 } + (u->doc ? s->docp[n - 1] : 0);
        vf mx = vset1(-INFINITY);
        for (int j = 0; j < jr[r]; j += VL) {
            vi idx = (vi){ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 } + j;
            vi bad = idx >= n;
            if (u->doc) {
                vi dj;
                memcpy(&dj, s->docp + j, sizeof dj);
                bad |= dj != qdoc;
            }
            vf x = vsel(bad, vset1(-INFINITY), vload(p + j));
            vstore(p + j, x);
            mx = vsel((x > mx) | (x != x), x, mx); /* a NaN score sticks */
        }
        float sub;
        if (lse_in) {
            sub = lse_in[t0 + r];
        } else {
            sub = vhmax(&mx);
        }
        vf vs = vset1(sub);
        vf sumv = { 0 };
        double sum = 0;
        for (int j = 0; j < jr[r]; j += VL) {
            vf a = vload(p + j) - vs, e = vexp(&a);
            vstore(p + j, e);
            sumv += e;
            if ((j / VL) % 64 == 63) { sum += vhsum_d(&sumv); sumv = (vf){ 0 }; }
        }
        if (jr[r] < Jmax) memset(p + jr[r], 0, (size_t)(Jmax - jr[r]) * sizeof(float));
        if (lse_in) continue;
        sum += vhsum_d(&sumv);
        if (lse_out) lse_out[t0 + r] = sub + (float)log(sum);
        vf inv = vset1((float)(1.0 / sum));
        for (int j = 0; j < jr[r]; j += VL) vstore(p + j, vload(p + j) * inv);
    }
}

INLINE void tile_rows(const att_unit *u, int t0, int nq, int Tkp, int *nk, int *jr, int *Jmax) {
    *Jmax = 0;
    for (int r = 0; r < nq; r++) {
        nk[r] = n_keys(u, t0 + r);
        jr[r] = (int)round16((size_t)nk[r]);
        if (jr[r] > *Jmax) *Jmax = jr[r];
    }
    (void)Tkp;
}

/* The forward's softmax over one key tile [j0, j0 + jw[r]) of each row,
 * online: the tile's scores (in s->P, rows BK apart) masked as
 * tile_softmax does, m (running max) and l (running sum of exp(s - m), in
 * double) updated, the scores replaced by exp(s - m_new) (zero from jw[r]
 * up to Jw), and alpha = exp(m_old - m_new), by which the output so far is
 * rescaled. */
INLINE void tile_online(const att_unit *u, att_scr *s, int j0, int nq, const int *nk, const int *jw, int Jw,
                        float *m, double *l, float *alpha) {
    for (int r = 0; r < nq; r++) {
        float *p = s->P + (size_t)r * BK;
        int n = nk[r];
        alpha[r] = 1.0f;
        if (jw[r] == 0) { memset(p, 0, (size_t)Jw * sizeof(float)); continue; }
        vi qdoc = (vi){ 0 } + (u->doc ? s->docp[n - 1] : 0);
        vf mx = vset1(-INFINITY);
        for (int j = 0; j < jw[r]; j += VL) {
            vi idx = (vi){ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 } + (j0 + j);
            vi bad = idx >= n;
            if (u->doc) {
                vi dj;
                memcpy(&dj, s->docp + j0 + j, sizeof dj);
                bad |= dj != qdoc;
            }
            vf x = vsel(bad, vset1(-INFINITY), vload(p + j));
            vstore(p + j, x);
            mx = vsel((x > mx) | (x != x), x, mx); /* a NaN score sticks */
        }
        float tm = vhmax(&mx), mn = (tm > m[r] || tm != tm) ? tm : m[r]; /* NaN in, NaN out */
        if (mn == -INFINITY) { memset(p, 0, (size_t)Jw * sizeof(float)); continue; } /* all masked so far */
        vf vs = vset1(mn), sumv = { 0 };
        double sum = 0;
        for (int j = 0; j < jw[r]; j += VL) {
            vf a = vload(p + j) - vs, e = vexp(&a);
            vstore(p + j, e);
            sumv += e;
        }
        sum += vhsum_d(&sumv); /* at most BK/VL = 16 terms a lane: no long float sum */
        if (jw[r] < Jw) memset(p + jw[r], 0, (size_t)(Jw - jw[r]) * sizeof(float));
        double a = m[r] == -INFINITY ? 0.0 : exp((double)m[r] - mn);
        l[r] = l[r] * a + sum;
        m[r] = mn;
        alpha[r] = (float)a;
    }
}

/* The bf16 modes' second pass over a key tile: with the row's final max m
 * and inv = 1/l known, the tile's scores masked as above and replaced by
 * the probabilities exp(s - m)·inv (zero from jw[r] up to Jw), as
 * tile_softmax forms them, so that they are rounded to bf16 normalised. */
INLINE void tile_probs(const att_unit *u, att_scr *s, int j0, int nq, const int *nk, const int *jw, int Jw,
                       const float *m, const float *inv) {
    for (int r = 0; r < nq; r++) {
        float *p = s->P + (size_t)r * BK;
        int n = nk[r];
        if (jw[r] == 0 || m[r] == -INFINITY) { memset(p, 0, (size_t)Jw * sizeof(float)); continue; }
        vi qdoc = (vi){ 0 } + (u->doc ? s->docp[n - 1] : 0);
        vf vs = vset1(m[r]), vinv = vset1(inv[r]);
        for (int j = 0; j < jw[r]; j += VL) {
            vi idx = (vi){ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 } + (j0 + j);
            vi bad = idx >= n;
            if (u->doc) {
                vi dj;
                memcpy(&dj, s->docp + j0 + j, sizeof dj);
                bad |= dj != qdoc;
            }
            vf a = vsel(bad, vset1(-INFINITY), vload(p + j)) - vs, e = vexp(&a);
            vstore(p + j, e * vinv);
        }
        if (jw[r] < Jw) memset(p + jw[r], 0, (size_t)(Jw - jw[r]) * sizeof(float));
    }
}

/* Forward, tiled over queries (BQ) and keys (BK) with an online softmax:
 * scratch past the packed keys and values is a (BQ, BK) tile, whatever T.
 * Per key tile, the scores and P·V run in the mode's arithmetic. f32: one
 * pass, the running output rescaled by alpha, divided by l at the end. The
 * bf16 modes round the normalised probabilities before P·V (as PyTorch's
 * bf16 attention and the backward do; rounding exp(s - m_running) instead,
 * as FlashAttention does, moves the output by a bf16 rounding of P, as far
 * as the f32 path is from the bf16 maths): a first pass over the key tiles
 * finds each row's max and sum, a second recomputes the scores and runs
 * P·V on the probabilities, so QKᵀ runs twice there. */
INLINE void unit_fwd_body(const att_unit *u, float *scratch) {
    int HS = u->HS, Tk = u->Tk, group = u->NH / u->NKV;
    int Tkp = (int)round16((size_t)(Tk > 0 ? Tk : 1)), HSp = (int)round16((size_t)HS);
    size_t qs = (size_t)u->NH * HS;
    att_scr s = scr_carve(scratch, Tk, HS, false);
    const float *kh = u->k + (size_t)u->kvh * HS, *vh = u->v + (size_t)u->kvh * HS;
    const int cm = u->cmode, HSh = (HS + 1) / 2;
    /* one query row (decode) on VDPBF16PS: the products read the cache
     * directly (dec_scores16, dec_pv16: the same words, the same chains),
     * the scores computed once into Kt's room, for both passes */
    const bool dec = HAVE_DEC16 && cm == ATT_DPBF16 && u->T == 1;
    float *dec_s = s.Kt;
    if (dec) {
    } else if (cm == ATT_DPBF16) {
        pack_pairs_t((uint32_t *)s.Kt, kh, u->kv_stride, Tk, Tkp, HS);
        pack_pairs_p((uint32_t *)s.Vp, vh, u->kv_stride, Tk, Tkp, HS, HSp);
    } else {
        pack_t(s.Kt, kh, u->kv_stride, Tk, Tkp, HS, cm == ATT_BF16);
        pack_p(s.Vp, vh, u->kv_stride, Tk, Tkp, HS, HSp, cm == ATT_BF16);
    }
    if (u->doc) {
        memcpy(s.docp, u->doc, (size_t)Tk * sizeof(int));
        for (int j = Tk; j < Tkp; j++) s.docp[j] = 0;
    }
    int nk[BQ], jr[BQ], Jmax, jw[BQ], nkw[BQ];
    float m[BQ], alpha[BQ], inv[BQ];
    double l[BQ];
    for (int h = u->kvh * group; h < (u->kvh + 1) * group; h++) {
        for (int t0 = 0; t0 < u->T; t0 += BQ) {
            int nq = u->T - t0 < BQ ? u->T - t0 : BQ;
            tile_rows(u, t0, nq, Tkp, nk, jr, &Jmax);
            const float *qt = u->q + (size_t)t0 * qs + (size_t)h * HS;
            if (cm == ATT_BF16) tile_round(s.qf, HSp, NULL, 0, qt, qs, nq, HS);
            else if (cm == ATT_DPBF16) rows_to_pairs16(s.q16, HSh, qt, qs, nq, HS);
#if HAVE_DEC16
            if (dec) dec_scores16(dec_s, s.q16, kh, u->kv_stride, Tk, Jmax, HS, u->scale);
#endif
            for (int r = 0; r < nq; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(s.acc, 0, (size_t)nq * HSp * sizeof(float));
            /* pass 0 (bf16 modes only): the rows' max and sum; pass 1: P·V */
            for (int pass = cm == ATT_F32; pass < 2; pass++) {
                for (int j0 = 0; j0 < Jmax; j0 += BK) {
                    int Jw = 0;
                    for (int r = 0; r < nq; r++) {
                        int a = jr[r] - j0, b = nk[r] - j0;
                        jw[r] = a < 0 ? 0 : a > BK ? BK : a;
                        nkw[r] = b < 0 ? 0 : b > BK ? BK : b;
                        Jw = jw[r] > Jw ? jw[r] : Jw;
                    }
                    if (cm == ATT_F32) {
                        k_rows_t(s.P, BK, qt, qs, u->scale, s.Kt + j0, Tkp, HS, nq, jw);
                    } else if (cm == ATT_BF16) {
                        k_rows_t(s.P, BK, s.qf, HSp, u->scale, s.Kt + j0, Tkp, HS, nq, jw);
                    } else if (dec) {
                        memcpy(s.P, dec_s + j0, (size_t)Jw * sizeof(float));
                    } else if (u->tiles) {
                        tiles_rows_t(u, s.P, BK, s.q16, HSh, u->scale, (const uint32_t *)s.Kt + j0, Tkp, HSh, nq, jw);
                    } else {
                        k_rows_t16(s.P, BK, s.q16, HSh, u->scale, (const uint32_t *)s.Kt + j0, Tkp, HSh, nq, jw);
                    }
                    if (pass == 0) {
                        tile_online(u, &s, j0, nq, nk, jw, Jw, m, l, alpha);
                        continue;
                    }
                    if (cm == ATT_F32) tile_online(u, &s, j0, nq, nk, jw, Jw, m, l, alpha);
                    else tile_probs(u, &s, j0, nq, nk, jw, Jw, m, inv);
                    if (cm == ATT_F32) {
                        k_rows_p(s.dP, HSp, s.P, BK, s.Vp + (size_t)j0 * HSp, HSp, nq, nkw);
                    } else if (cm == ATT_BF16) {
                        tile_round(s.P, BK, NULL, 0, s.P, BK, nq, Jw);
                        k_rows_p(s.dP, HSp, s.P, BK, s.Vp + (size_t)j0 * HSp, HSp, nq, nkw);
                    } else {
                        rows_to_pairs16(s.p16, BK / 2, s.P, BK, nq, Jw);
#if HAVE_DEC16
                        if (dec)
                            dec_pv16(s.dP, s.p16, vh, u->kv_stride, Tk, j0, nkw[0], HS, HSp);
                        else
#endif
                        if (u->tiles)
                            tiles_rows_p(u, s.dP, HSp, s.p16, BK / 2, (const uint32_t *)s.Vp + (size_t)(j0 / 2) * HSp,
                                         HSp, nq, nkw);
                        else
                            k_rows_p16(s.dP, HSp, s.p16, BK / 2, (const uint32_t *)s.Vp + (size_t)(j0 / 2) * HSp, HSp,
                                       nq, nkw);
                    }
                    for (int r = 0; r < nq; r++) {
                        float *o = s.acc + (size_t)r * HSp;
                        const float *d = s.dP + (size_t)r * HSp;
                        vf va = vset1(cm == ATT_F32 ? alpha[r] : 1.0f);
                        for (int e = 0; e < HSp; e += VL) vstore(o + e, vload(o + e) * va + vload(d + e));
                    }
                }
                for (int r = 0; r < nq; r++) inv[r] = (l[r] > 0 || l[r] != l[r]) ? (float)(1.0 / l[r]) : 0.0f;
            }
            for (int r = 0; r < nq; r++) {
                float *o = u->o + (size_t)(t0 + r) * qs + (size_t)h * HS;
                const float *a = s.acc + (size_t)r * HSp;
                float sc = cm == ATT_F32 ? inv[r] : 1.0f; /* the bf16 modes' P is normalised */
                for (int e = 0; e < HS; e++) o[e] = a[e] * sc;
                if (u->lse) u->lse[(size_t)h * u->T + t0 + r] = (l[r] > 0 || l[r] != l[r]) ? m[r] + (float)log(l[r]) : -INFINITY;
            }
        }
    }
}

INLINE void unit_bwd_body(const att_unit *u, float *scratch) {
    int HS = u->HS, Tk = u->Tk, group = u->NH / u->NKV;
    int Tkp = (int)round16((size_t)(Tk > 0 ? Tk : 1)), HSp = (int)round16((size_t)HS);
    size_t qs = (size_t)u->NH * HS, ks = (size_t)u->NKV * HS;
    att_scr s = scr_carve(scratch, Tk, HS, true);
    const float *kh = u->k + (size_t)u->kvh * HS, *vh = u->v + (size_t)u->kvh * HS;
    const int cm = u->cmode, HSh = (HS + 1) / 2, Tkh = Tkp / 2;
    if (cm == ATT_DPBF16) {
        pack_pairs_t((uint32_t *)s.Kt, kh, ks, Tk, Tkp, HS);
        pack_pairs_t((uint32_t *)s.Vt, vh, ks, Tk, Tkp, HS);
        pack_pairs_p((uint32_t *)s.Kp, kh, ks, Tk, Tkp, HS, HSp);
    } else {
        pack_t(s.Kt, kh, ks, Tk, Tkp, HS, cm == ATT_BF16);
        pack_t(s.Vt, vh, ks, Tk, Tkp, HS, cm == ATT_BF16);
        pack_p(s.Kp, kh, ks, Tk, Tkp, HS, HSp, cm == ATT_BF16);
    }
    memset(s.dKt, 0, (size_t)HS * Tkp * sizeof(float));
    memset(s.dVt, 0, (size_t)HS * Tkp * sizeof(float));
    if (u->doc) {
        memcpy(s.docp, u->doc, (size_t)Tk * sizeof(int));
        for (int j = Tk; j < Tkp; j++) s.docp[j] = 0;
    }
    int nk[BQ], jr[BQ], Jmax;
    for (int h = u->kvh * group; h < (u->kvh + 1) * group; h++) {
        for (int t0 = 0; t0 < u->T; t0 += BQ) {
            int nq = u->T - t0 < BQ ? u->T - t0 : BQ;
            tile_rows(u, t0, nq, Tkp, nk, jr, &Jmax);
            const float *qt = u->q + (size_t)t0 * qs + (size_t)h * HS;
            const float *dy = u->dout + (size_t)t0 * qs + (size_t)h * HS;
            /* the A operands of the products below: qa, dya (rows lda apart) */
            const float *qa = qt, *dya = dy;
            size_t lda = qs;
            if (cm == ATT_F32) {
                k_rows_t(s.P, Tkp, qt, qs, u->scale, s.Kt, Tkp, HS, nq, jr);
            } else if (cm == ATT_BF16) {
                tile_round(s.qf, HSp, NULL, 0, qt, qs, nq, HS);
                tile_round(s.dyf, HSp, NULL, 0, dy, qs, nq, HS);
                qa = s.qf, dya = s.dyf, lda = HSp;
                k_rows_t(s.P, Tkp, qa, lda, u->scale, s.Kt, Tkp, HS, nq, jr);
            } else {
                rows_to_pairs16(s.q16, HSh, qt, qs, nq, HS);
                rows_to_pairs16(s.dy16, HSh, dy, qs, nq, HS);
                if (u->tiles) tiles_rows_t(u, s.P, Tkp, s.q16, HSh, u->scale, (const uint32_t *)s.Kt, Tkp, HSh, nq, jr);
                else k_rows_t16(s.P, Tkp, s.q16, HSh, u->scale, (const uint32_t *)s.Kt, Tkp, HSh, nq, jr);
            }
            tile_softmax(u, &s, Tkp, t0, nq, nk, jr, Jmax, u->lse_in + (size_t)h * u->T, NULL);
            /* dp_j = dy·v_j; ds_j = p_j (dp_j - Σ_i p_i dp_i) · scale */
            if (u->tiles) tiles_rows_t(u, s.dP, Tkp, s.dy16, HSh, 1.0f, (const uint32_t *)s.Vt, Tkp, HSh, nq, jr);
            else if (cm == ATT_DPBF16) k_rows_t16(s.dP, Tkp, s.dy16, HSh, 1.0f, (const uint32_t *)s.Vt, Tkp, HSh, nq, jr);
            else k_rows_t(s.dP, Tkp, dya, lda, 1.0f, s.Vt, Tkp, HS, nq, jr);
            for (int r = 0; r < nq; r++) {
                float *p = s.P + r * Tkp, *dp = s.dP + r * Tkp;
                vf acc = { 0 };
                for (int j = 0; j < jr[r]; j += VL) acc = vload(p + j) * vload(dp + j) + acc;
                vf D = vset1((float)vhsum_d(&acc));
                for (int j = 0; j < jr[r]; j += VL) vstore(dp + j, vload(p + j) * (vload(dp + j) - D) * u->scale);
                if (jr[r] < Jmax) memset(dp + jr[r], 0, (size_t)(Jmax - jr[r]) * sizeof(float));
            }
            if (cm == ATT_DPBF16) {
                /* dQ = dS·K over pairs of keys; then dV += Pᵀ·dout and
                 * dK += dSᵀ·q over pairs of query rows, each operand
                 * re-packed into the buffers the previous product is done with */
                int nqh = (nq + 1) / 2;
                rows_to_pairs16(s.p16, Tkh, s.dP, Tkp, nq, Jmax);
                if (u->tiles) tiles_rows_p(u, s.acc, HSp, s.p16, Tkh, (const uint32_t *)s.Kp, HSp, nq, nk);
                else k_rows_p16(s.acc, HSp, s.p16, Tkh, (const uint32_t *)s.Kp, HSp, nq, nk);
                rpairs16(s.q16, HS, qt, qs, nq, HS);
                rpairs16(s.dy16, HS, dy, qs, nq, HS);
                rpairs16(s.p16, Jmax, s.P, Tkp, nq, Jmax);
                if (u->tiles) tiles_acc_t(u, s.at16, s.dVt, Tkp, s.dy16, HS, s.p16, Jmax, HS, nqh, Jmax);
                else k_acc_t16(s.dVt, Tkp, s.dy16, HS, s.p16, Jmax, HS, nqh, Jmax);
                rpairs16(s.p16, Jmax, s.dP, Tkp, nq, Jmax);
                if (u->tiles) tiles_acc_t(u, s.at16, s.dKt, Tkp, s.q16, HS, s.p16, Jmax, HS, nqh, Jmax);
                else k_acc_t16(s.dKt, Tkp, s.q16, HS, s.p16, Jmax, HS, nqh, Jmax);
            } else {
                if (cm == ATT_BF16) { /* P and dS as the products see them */
                    tile_round(s.P, Tkp, NULL, 0, s.P, Tkp, nq, Jmax);
                    tile_round(s.dP, Tkp, NULL, 0, s.dP, Tkp, nq, Jmax);
                }
                k_acc_t(s.dVt, Tkp, dya, lda, s.P, Tkp, HS, nq, Jmax);
                k_acc_t(s.dKt, Tkp, qa, lda, s.dP, Tkp, HS, nq, Jmax);
                k_rows_p(s.acc, HSp, s.dP, Tkp, s.Kp, HSp, nq, nk);
            }
            for (int r = 0; r < nq; r++)
                memcpy(u->dq + (size_t)(t0 + r) * qs + (size_t)h * HS, s.acc + (size_t)r * HSp,
                       (size_t)HS * sizeof(float));
        }
    }
    /* dK, dV back from (HS, Tkp) to rows, 16 keys at a time: each d reads
     * one cache line of a row and the 16 rows' lines stay in cache */
    for (int j0 = 0; j0 < Tk; j0 += 16) {
        int j1 = j0 + 16 < Tk ? j0 + 16 : Tk;
        for (int d = 0; d < HS; d++)
            for (int j = j0; j < j1; j++) {
                size_t o = (size_t)j * ks + (size_t)u->kvh * HS + d;
                u->dk[o] = s.dKt[(size_t)d * Tkp + j];
                u->dv[o] = s.dVt[(size_t)d * Tkp + j];
            }
    }
}

T512 static void unit_fwd_avx512(const att_unit *u, float *scr) { unit_fwd_body(u, scr); }
T256 static void unit_fwd_avx2(const att_unit *u, float *scr) { unit_fwd_body(u, scr); }
static void unit_fwd_generic(const att_unit *u, float *scr) { unit_fwd_body(u, scr); }
T512 static void unit_bwd_avx512(const att_unit *u, float *scr) { unit_bwd_body(u, scr); }
T256 static void unit_bwd_avx2(const att_unit *u, float *scr) { unit_bwd_body(u, scr); }
static void unit_bwd_generic(const att_unit *u, float *scr) { unit_bwd_body(u, scr); }

typedef void (*unit_fn)(const att_unit *, float *);

/* One task per (batch row, kv head) unit: each writes only its own outputs,
 * so the result does not depend on which thread runs it. */
typedef struct {
    unit_fn fn;
    att_unit proto;     /* the fields every unit shares */
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *lse_in;
    const int *doc;
    size_t per, qd, kvs; /* scratch floats per thread; q and k/v row strides */
    float *scratch;
} att_job;

static void att_fwd_task(void *vctx, int i, int thread) {
    const att_job *j = vctx;
    int T = j->proto.T, Tk = j->proto.Tk, NKV = j->proto.NKV, NH = j->proto.NH, b = i / NKV;
    att_unit u = j->proto;
    u.q = j->q + (size_t)b * T * j->qd;
    u.k = j->k + (size_t)b * Tk * j->kvs;
    u.v = j->v + (size_t)b * Tk * j->kvs;
    u.o = j->out + (size_t)b * T * j->qd;
    u.lse = j->lse ? j->lse + (size_t)b * NH * T : NULL;
    u.doc = j->doc ? j->doc + (size_t)b * Tk : NULL;
    u.kvh = i % NKV;
    if (u.tiles) u.tiles->tiles_begin(); /* the tile state is this task's (kernels.h) */
    j->fn(&u, j->scratch + (size_t)thread * j->per);
    if (u.tiles) u.tiles->tiles_end();
}

static void att_bwd_task(void *vctx, int i, int thread) {
    const att_job *j = vctx;
    int T = j->proto.T, Tk = j->proto.Tk, NKV = j->proto.NKV, NH = j->proto.NH, b = i / NKV;
    att_unit u = j->proto;
    u.q = j->q + (size_t)b * T * j->qd;
    u.k = j->k + (size_t)b * Tk * j->kvs;
    u.v = j->v + (size_t)b * Tk * j->kvs;
    u.dout = j->dout + (size_t)b * T * j->qd;
    u.lse_in = j->lse_in + (size_t)b * NH * T;
    u.dq = j->dq + (size_t)b * T * j->qd;
    u.dk = j->dk + (size_t)b * Tk * j->kvs;
    u.dv = j->dv + (size_t)b * Tk * j->kvs;
    u.doc = j->doc ? j->doc + (size_t)b * Tk : NULL;
    u.kvh = i % NKV;
    if (u.tiles) u.tiles->tiles_begin(); /* the tile state is this task's (kernels.h) */
    j->fn(&u, j->scratch + (size_t)thread * j->per);
    if (u.tiles) u.tiles->tiles_end();
}

/* the product mode for a compute type at this CPU's level */
static int att_cmode(ft_dtype compute) {
    if (compute != FT_BF16) return ATT_F32;
    return ft_cpu_level() >= FT_CPU_AVX512BF16 ? ATT_DPBF16 : ATT_BF16;
}

/* ATT_DPBF16's products on the tile unit where the kernels' table has it
 * (the amx level, or the table ft_kernels_force chose), T query rows > 1 */
static const ft_kernel_isa *att_tiles(int cmode, int T) {
    const ft_kernel_isa *isa = ft_kernels_current();
    return cmode == ATT_DPBF16 && T > 1 && isa->gemm16 ? isa : NULL;
}

void ft_attention_forward_fast(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                            int kv_stride, int n_threads, float *scratch) {
    ft_attention_forward_fast_in(FT_F32, out, lse, q, k, v, q_pos, doc, B, T, Tk, NH, NKV, HS, kv_stride, n_threads,
                                 scratch);
}

void ft_attention_forward_fast_in(ft_dtype compute, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int *q_pos, const int *doc, int B, int T, int Tk, int NH,
                                  int NKV, int HS, int kv_stride, int n_threads, float *scratch) {
    int lv = ft_cpu_level();
    att_job j = { .fn = lv >= FT_CPU_AVX512 ? unit_fwd_avx512 : lv >= FT_CPU_AVX2 ? unit_fwd_avx2 : unit_fwd_generic,
                  .proto = { .q_pos = q_pos, .T = T, .Tk = Tk, .NH = NH, .NKV = NKV, .HS = HS,
                             .cmode = att_cmode(compute), .tiles = att_tiles(att_cmode(compute), T),
                             .kv_stride = kv_stride, .scale = (float)(1.0 / sqrt((double)HS)) },
                  .out = out, .lse = lse, .q = q, .k = k, .v = v, .doc = doc,
                  .per = scr_floats(Tk, HS, false), .qd = (size_t)NH * HS, .kvs = (size_t)kv_stride,
                  .scratch = scratch };
    ft_parallel_for(n_threads, B * NKV, att_fwd_task, &j);
}

void ft_attention_backward_fast(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                             const float *k, const float *v, const int *q_pos, const int *doc, int B, int T, int Tk,
                             int NH, int NKV, int HS, int n_threads, float *scratch) {
    ft_attention_backward_fast_in(FT_F32, dq, dk, dv, dout, lse, q, k, v, q_pos, doc, B, T, Tk, NH, NKV, HS, n_threads,
                                  scratch);
}

void ft_attention_backward_fast_in(ft_dtype compute, float *dq, float *dk, float *dv, const float *dout,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                                   int n_threads, float *scratch) {
    int lv = ft_cpu_level();
    size_t kvd = (size_t)NKV * HS;
    att_job j = { .fn = lv >= FT_CPU_AVX512 ? unit_bwd_avx512 : lv >= FT_CPU_AVX2 ? unit_bwd_avx2 : unit_bwd_generic,
                  .proto = { .q_pos = q_pos, .T = T, .Tk = Tk, .NH = NH, .NKV = NKV, .HS = HS,
                             .cmode = att_cmode(compute), .tiles = att_tiles(att_cmode(compute), T),
                             .kv_stride = (int)kvd, .scale = (float)(1.0 / sqrt((double)HS)) },
                  .dq = dq, .dk = dk, .dv = dv, .dout = dout, .lse_in = lse, .q = q, .k = k, .v = v, .doc = doc,
                  .per = scr_floats(Tk, HS, true), .qd = (size_t)NH * HS, .kvs = kvd, .scratch = scratch };
    ft_parallel_for(n_threads, B * NKV, att_bwd_task, &j);
}

/* ------------------------------------------------------------- cross-entropy */

/* The largest of x[0..n). */
INLINE float row_max(const float *x, int n) {
    vf mx = vset1(-INFINITY);
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vf a = vload(x + i);
        mx = vsel(a > mx, a, mx);
    }
    float m = vhmax(&mx);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The sum in double of exp(x[i] - m) over [0, n) (vector partial sums
 * folded into the double every 64 vectors), each term stored in e[i] when
 * e is non-NULL (e may be x). */
INLINE double exp_sum(float *e, const float *x, int n, float m) {
    double sum = 0;
    vf vm = vset1(m), sv = { 0 };
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vf a = vload(x + i) - vm, ev = vexp(&a);
        if (e) vstore(e + i, ev);
        sv += ev;
        if ((i / VL) % 64 == 63) { sum += vhsum_d(&sv); sv = (vf){ 0 }; }
    }
    sum += vhsum_d(&sv);
    if (i < n) {
        float buf[VL];
        for (int j = 0; j < VL; j++) buf[j] = i + j < n ? x[i + j] - m : -INFINITY;
        vf a = vload(buf);
        vstore(buf, vexp(&a));
        for (int j = 0; i + j < n; j++) {
            if (e) e[i + j] = buf[j];
            sum += buf[j];
        }
    }
    return sum;
}

/* One row: max, e = exp(x - max) once into dx (float), the sum in double,
 * then dx = (e / sum - onehot) · scale. Returns the row's loss. */
INLINE double ce_row_body(float *dx, const float *x, int y, int V, float dloss_scale) {
    float m = row_max(x, V);
    float *e = dx;
    double sum = exp_sum(e, x, V, m);
    double lse = m + log(sum);
    if (dx) {
        vf f = vset1((float)(dloss_scale / sum));
        int i = 0;
        for (; i + VL <= V; i += VL) vstore(dx + i, vload(dx + i) * f);
        for (; i < V; i++) dx[i] *= f[0];
        dx[y] -= dloss_scale;
    }
    return lse - x[y];
}

typedef double (*ce_fn)(float *, const float *, int, int, float);
T512 static double ce_row_avx512(float *dx, const float *x, int y, int V, float s) { return ce_row_body(dx, x, y, V, s); }
T256 static double ce_row_avx2(float *dx, const float *x, int y, int V, float s) { return ce_row_body(dx, x, y, V, s); }
static double ce_row_generic(float *dx, const float *x, int y, int V, float s) { return ce_row_body(dx, x, y, V, s); }

/* rows per block whose losses are kept, then summed in row order */
#define CE_BLOCK 512
/* rows per task: enough work per hand-out at small V */
#define CE_TASK_ROWS 4

typedef struct {
    ce_fn fn;
    float *dlogits;
    const float *logits;
    const int *targets;
    int t0, n, V;
    float dloss_scale;
    double *rl;         /* (n) each row's loss */
} ce_job;

static void ce_task(void *vctx, int task, int thread) {
    const ce_job *j = vctx;
    int V = j->V, r1 = (task + 1) * CE_TASK_ROWS < j->n ? (task + 1) * CE_TASK_ROWS : j->n;
    for (int r = task * CE_TASK_ROWS; r < r1; r++) {
        int t = j->t0 + r, y = j->targets[t];
        float *dx = j->dlogits ? j->dlogits + (size_t)t * V : NULL;
        if (y < 0 || y >= V) {
            j->rl[r] = y >= V ? NAN : 0;
            if (dx) memset(dx, 0, (size_t)V * sizeof(float));
            continue;
        }
        j->rl[r] = j->fn(dx, j->logits + (size_t)t * V, y, V, j->dloss_scale);
    }
}

double ft_crossentropy_fast(float *dlogits, const float *logits, const int *targets, int T, int V, float dloss_scale,
                         int n_threads) {
    int lv = ft_cpu_level();
    double loss = 0, rl[CE_BLOCK];
    ce_job j = { .fn = lv >= FT_CPU_AVX512 ? ce_row_avx512 : lv >= FT_CPU_AVX2 ? ce_row_avx2 : ce_row_generic,
                 .dlogits = dlogits, .logits = logits, .targets = targets, .V = V, .dloss_scale = dloss_scale,
                 .rl = rl };
    for (int t0 = 0; t0 < T; t0 += CE_BLOCK) {
        j.t0 = t0;
        j.n = T - t0 < CE_BLOCK ? T - t0 : CE_BLOCK;
        /* below 64K logits a block is not worth waking a thread for */
        int nt = (double)j.n * V > 65536.0 ? n_threads : 1;
        ft_parallel_for(nt, (j.n + CE_TASK_ROWS - 1) / CE_TASK_ROWS, ce_task, &j);
        for (int r = 0; r < j.n; r++) loss += rl[r];
    }
    return loss;
}

/* ------------------------------------------- cross-entropy by vocabulary slices */

/* One row of one slice (see ft_ce_slice_fast): the slice's max, the sum
 * of exp(x - m_new) in double, e stored when asked. */
INLINE void ce_slice_row(float *x, float *m, double *s, float *alpha, int y, int W, int v0, bool first,
                         bool store) {
    float ms = row_max(x, W);
    float mo = first ? -INFINITY : *m, mn = ms > mo ? ms : mo;
    double sum = exp_sum(store ? x : NULL, x, W, mn);
    /* the target's own term is left out of e (the caller adds (p_y - 1)·w_y
     * itself): in a GEMM whose operands are rounded to bf16, e_y/S·w_y - w_y
     * would cancel to noise when p_y is near 1 */
    if (store && y >= v0 && y < v0 + W) x[y - v0] = 0;
    /* rescaling the sum so far (and the caller's dh) to the new max */
    double a = first ? 0 : exp((double)mo - mn);
    *s = first ? sum : *s * a + sum;
    *m = mn;
    if (alpha) *alpha = first ? 1.0f : (float)a;
}

INLINE void ce_slice_grad_row(float *x, float lse, int y, int W, int v0, float scale) {
    vf vl = vset1(lse), vs = vset1(scale);
    int i = 0;
    for (; i + VL <= W; i += VL) {
        vf a = vload(x + i) - vl;
        vstore(x + i, vexp(&a) * vs);
    }
    if (i < W) {
        float buf[VL];
        for (int j = 0; j < VL; j++) buf[j] = i + j < W ? x[i + j] - lse : -INFINITY;
        vf a = vload(buf);
        vstore(buf, vexp(&a));
        for (int j = 0; i + j < W; j++) x[i + j] = buf[j] * scale;
    }
    if (y >= v0 && y < v0 + W) x[y - v0] -= scale;
}

typedef struct {
    float *x, *m, *xy, *alpha;
    double *s;
    const float *lse;
    const int *targets;
    int n, W, v0, V;
    ft_ce_slice_mode mode;
    bool first;
    float scale;
} ces_job;

#define CES_BODY(NAME)                                                                                              \
    static void NAME(const ces_job *j, int r) {                                                                     \
        int y = j->targets[r], W = j->W, v0 = j->v0;                                                                \
        float *x = j->x + (size_t)r * W;                                                                            \
        if (y < 0 || y >= j->V) {                                                                                   \
            if (j->mode != FT_CE_SLICE_STATS) memset(x, 0, (size_t)W * sizeof(float));                              \
            if (j->alpha) j->alpha[r] = 1.0f;                                                                       \
            return;                                                                                                 \
        }                                                                                                           \
        if (j->mode == FT_CE_SLICE_GRAD) { ce_slice_grad_row(x, j->lse[r], y, W, v0, j->scale); return; }          \
        if (y >= v0 && y < v0 + W) j->xy[r] = x[y - v0];                                                            \
        ce_slice_row(x, j->m + r, j->s + r, j->alpha ? j->alpha + r : NULL, y, W, v0, j->first,          \
                     j->mode == FT_CE_SLICE_EXP);                                                                   \
    }
T512 CES_BODY(ces_row_avx512)
T256 CES_BODY(ces_row_avx2)
CES_BODY(ces_row_generic)

typedef struct {
    const ces_job *j;
    void (*fn)(const ces_job *, int);
} ces_task_ctx;

static void ces_task(void *vctx, int task, int thread) {
    (void)thread;
    const ces_task_ctx *c = vctx;
    int r1 = (task + 1) * CE_TASK_ROWS < c->j->n ? (task + 1) * CE_TASK_ROWS : c->j->n;
    for (int r = task * CE_TASK_ROWS; r < r1; r++) c->fn(c->j, r);
}

void ft_ce_slice_fast(ft_ce_slice_mode mode, float *x, float *m, double *s, float *xy, float *alpha, const float *lse,
                      const int *targets, int n, int W, int v0, int V, bool first, float dloss_scale, int n_threads) {
    int lv = ft_cpu_level();
    ces_job j = { .x = x, .m = m, .xy = xy, .alpha = alpha, .s = s, .lse = lse, .targets = targets, .n = n, .W = W,
                  .v0 = v0, .V = V, .mode = mode, .first = first, .scale = dloss_scale };
    ces_task_ctx c = { &j, lv >= FT_CPU_AVX512 ? ces_row_avx512 : lv >= FT_CPU_AVX2 ? ces_row_avx2 : ces_row_generic };
    int nt = (double)n * W > 65536.0 ? n_threads : 1;
    ft_parallel_for(nt, (n + CE_TASK_ROWS - 1) / CE_TASK_ROWS, ces_task, &c);
}
