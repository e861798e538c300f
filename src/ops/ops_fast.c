/* ops_fast.c — fast paths for the two ops that dominate a small model's
 * training step: causal attention (a forward tiled over queries and keys
 * with an online softmax that saves the log-sum-exp, and a backward that
 * recomputes the probabilities from it a query tile at a time) and
 * cross-entropy (whole rows, or a slice of the vocabulary at a time). Tested against the references in ops.c.
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
#include "core/parallel.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define VL 16

#define INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__)
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define T256 __attribute__((target("avx2,fma")))
#else
#define T512
#define T256
#endif

/* query rows per tile: the probabilities of a tile (BQ × Tk floats) stay
 * in cache while dK/dV accumulate over them */
#define BQ 32
/* keys per tile of the forward (online softmax over key tiles): a (BQ, BK)
 * tile of scores is 32 KiB, in L1/L2 whatever T is */
#define BK 256

INLINE vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
/* (macros, not functions: passing 64-byte vectors by value draws ABI notes
 * from GCC in the portable instantiation) */
#define vstore(p, v) do { vf vs_ = (v); memcpy((p), &vs_, sizeof vs_); } while (0)
INLINE vf vset1(float x) { return (vf){ 0 } + x; }
#define vsel(m, a, b) ((vf)(((m) & (vi)(a)) | (~(m) & (vi)(b)))) /* m ? a : b */
INLINE float vhmax(const vf *v) {
    float m = (*v)[0];
    for (int i = 1; i < VL; i++) m = (*v)[i] > m ? (*v)[i] : m;
    return m;
}
INLINE double vhsum_d(const vf *v) {
    double s = 0;
    for (int i = 0; i < VL; i++) s += (*v)[i];
    return s;
}
static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* exp(x) for x <= 88.7 (inf above), to ~1 ulp: x = n·ln2 + r with
 * |r| <= ln2/2 (Cody-Waite, ln2 split so n·LN2_HI is exact), a degree-7
 * Taylor polynomial in r (truncation 5e-9 relative), times 2^n formed as
 * 2^a·2^(n-a) so that gradual underflow down to 2^-149 works. Exactly 0
 * below -103.9 (and for -inf); NaN stays NaN. */
INLINE vf vexp(const vf *px) {
    vf x = *px;
    const float LOG2E = 1.44269504088896341f, MAGIC = 12582912.0f; /* 1.5·2^23: round to nearest */
    const float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    vi under = x < -103.9f;
    vi over = x > 88.8f;
    x = vsel(under, vset1(-103.9f), x);
    x = vsel(over, vset1(88.8f), x);
    vf t = x * LOG2E + MAGIC;
    vf n = t - MAGIC;
    vi ni = (vi)t - (vi)vset1(MAGIC);
    vf r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    vf p = vset1(1.0f / 5040);
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi a = ni >> 1, b = ni - a;
    vf pa = (vf)((a + 127) << 23), pb = (vf)((b + 127) << 23);
    vf res = p * pa * pb;
    return (vf)((vi)res & ~under);
}

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
    float scale;
} att_unit;

/* The per-thread scratch, in floats (see attention_fast_scratch_floats). */
typedef struct {
    float *Kt, *Vt;            /* (HS, Tkp) keys/values transposed, zero past Tk */
    float *Kp, *Vp;            /* (Tkp, HSp) rows padded with zeros */
    float *dKt, *dVt;          /* (HS, Tkp) gradient accumulators */
    float *P, *dP;             /* (BQ, Tkp) */
    float *acc;                /* (BQ, HSp) */
    int *docp;                 /* (Tkp) */
} att_scr;

static size_t scr_floats(int Tk, int HS, bool bwd) {
    size_t Tkp = round16((size_t)(Tk > 0 ? Tk : 1)), HSp = round16((size_t)HS);
    /* forward: the head's keys and values packed, one (BQ, BK) tile of
     * scores, the tile's output and the running output */
    if (!bwd) return round16((size_t)HS * Tkp + Tkp * HSp + BQ * BK + 2 * BQ * HSp + Tkp);
    size_t n = 2 * (size_t)HS * Tkp + Tkp * HSp + 2 * BQ * Tkp + BQ * HSp + Tkp;
    n += Tkp * HSp + 2 * (size_t)HS * Tkp;
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
    if (!bwd) {
        s.Kt = p; p += (size_t)HS * Tkp;
        s.Vp = p; p += Tkp * HSp;
        s.P = p; p += BQ * BK;
        s.dP = p; p += BQ * HSp; /* the key tile's part of the output */
        s.acc = p; p += BQ * HSp;
        s.docp = (int *)p;
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
    s.dVt = p;
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

/* Keys (and values) of one kv head packed: transposed (HS, Tkp) and/or as
 * padded rows (Tkp, HSp); zeros past Tk. */
INLINE void pack_t(float *Xt, const float *x, size_t stride, int Tk, int Tkp, int HS) {
    for (int d = 0; d < HS; d++) {
        float *row = Xt + (size_t)d * Tkp;
        for (int j = 0; j < Tk; j++) row[j] = x[(size_t)j * stride + d];
        for (int j = Tk; j < Tkp; j++) row[j] = 0;
    }
}
INLINE void pack_p(float *Xp, const float *x, size_t stride, int Tk, int Tkp, int HS, int HSp) {
    for (int j = 0; j < Tkp; j++) {
        float *row = Xp + (size_t)j * HSp;
        int n = j < Tk ? HS : 0;
        if (n) memcpy(row, x + (size_t)j * stride, (size_t)HS * sizeof(float));
        for (int d = n; d < HSp; d++) row[d] = 0;
    }
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
            mx = vsel(x > mx, x, mx);
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
 * online: scores masked as tile_softmax does, m (running max) and l
 * (running sum of exp(s - m), double) updated, the tile's scores replaced
 * by exp(s - m_new) (zero up to Jw), and alpha = exp(m_old - m_new), by
 * which the output so far is rescaled. */
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
            mx = vsel(x > mx, x, mx);
        }
        float tm = vhmax(&mx), mn = tm > m[r] ? tm : m[r];
        if (mn == -INFINITY) { memset(p, 0, (size_t)Jw * sizeof(float)); continue; } /* all masked so far */
        vf vs = vset1(mn), sumv = { 0 };
        double sum = 0;
        for (int j = 0; j < jw[r]; j += VL) {
            vf a = vload(p + j) - vs, e = vexp(&a);
            vstore(p + j, e);
            sumv += e;
            if ((j / VL) % 64 == 63) { sum += vhsum_d(&sumv); sumv = (vf){ 0 }; }
        }
        sum += vhsum_d(&sumv);
        if (jw[r] < Jw) memset(p + jw[r], 0, (size_t)(Jw - jw[r]) * sizeof(float));
        double a = m[r] == -INFINITY ? 0.0 : exp((double)m[r] - mn);
        l[r] = l[r] * a + sum;
        m[r] = mn;
        alpha[r] = (float)a;
    }
}

/* Forward, tiled over queries (BQ) and keys (BK) with an online softmax:
 * scratch past the packed keys and values is a (BQ, BK) tile, whatever T. */
INLINE void unit_fwd_body(const att_unit *u, float *scratch) {
    int HS = u->HS, Tk = u->Tk, group = u->NH / u->NKV;
    int Tkp = (int)round16((size_t)(Tk > 0 ? Tk : 1)), HSp = (int)round16((size_t)HS);
    size_t qs = (size_t)u->NH * HS;
    att_scr s = scr_carve(scratch, Tk, HS, false);
    const float *kh = u->k + (size_t)u->kvh * HS, *vh = u->v + (size_t)u->kvh * HS;
    pack_t(s.Kt, kh, u->kv_stride, Tk, Tkp, HS);
    pack_p(s.Vp, vh, u->kv_stride, Tk, Tkp, HS, HSp);
    if (u->doc) {
        memcpy(s.docp, u->doc, (size_t)Tk * sizeof(int));
        for (int j = Tk; j < Tkp; j++) s.docp[j] = 0;
    }
    int nk[BQ], jr[BQ], Jmax, jw[BQ], nkw[BQ];
    float m[BQ], alpha[BQ];
    double l[BQ];
    for (int h = u->kvh * group; h < (u->kvh + 1) * group; h++) {
        for (int t0 = 0; t0 < u->T; t0 += BQ) {
            int nq = u->T - t0 < BQ ? u->T - t0 : BQ;
            tile_rows(u, t0, nq, Tkp, nk, jr, &Jmax);
            const float *qt = u->q + (size_t)t0 * qs + (size_t)h * HS;
            for (int r = 0; r < nq; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(s.acc, 0, (size_t)nq * HSp * sizeof(float));
            for (int j0 = 0; j0 < Jmax; j0 += BK) {
                int Jw = 0;
                for (int r = 0; r < nq; r++) {
                    int a = jr[r] - j0, b = nk[r] - j0;
                    jw[r] = a < 0 ? 0 : a > BK ? BK : a;
                    nkw[r] = b < 0 ? 0 : b > BK ? BK : b;
                    Jw = jw[r] > Jw ? jw[r] : Jw;
                }
                k_rows_t(s.P, BK, qt, qs, u->scale, s.Kt + j0, Tkp, HS, nq, jw);
                tile_online(u, &s, j0, nq, nk, jw, Jw, m, l, alpha);
                k_rows_p(s.dP, HSp, s.P, BK, s.Vp + (size_t)j0 * HSp, HSp, nq, nkw);
                for (int r = 0; r < nq; r++) {
                    float *o = s.acc + (size_t)r * HSp;
                    const float *d = s.dP + (size_t)r * HSp;
                    vf va = vset1(alpha[r]);
                    for (int e = 0; e < HSp; e += VL) vstore(o + e, vload(o + e) * va + vload(d + e));
                }
            }
            for (int r = 0; r < nq; r++) {
                float *o = u->o + (size_t)(t0 + r) * qs + (size_t)h * HS;
                const float *a = s.acc + (size_t)r * HSp;
                float inv = l[r] > 0 ? (float)(1.0 / l[r]) : 0.0f;
                for (int e = 0; e < HS; e++) o[e] = a[e] * inv;
                if (u->lse) u->lse[(size_t)h * u->T + t0 + r] = l[r] > 0 ? m[r] + (float)log(l[r]) : -INFINITY;
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
    pack_t(s.Kt, kh, ks, Tk, Tkp, HS);
    pack_t(s.Vt, vh, ks, Tk, Tkp, HS);
    pack_p(s.Kp, kh, ks, Tk, Tkp, HS, HSp);
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
            k_rows_t(s.P, Tkp, qt, qs, u->scale, s.Kt, Tkp, HS, nq, jr);
            tile_softmax(u, &s, Tkp, t0, nq, nk, jr, Jmax, u->lse_in + (size_t)h * u->T, NULL);
            /* dp_j = dy·v_j; ds_j = p_j (dp_j - Σ_i p_i dp_i) · scale */
            k_rows_t(s.dP, Tkp, dy, qs, 1.0f, s.Vt, Tkp, HS, nq, jr);
            for (int r = 0; r < nq; r++) {
                float *p = s.P + r * Tkp, *dp = s.dP + r * Tkp;
                vf acc = { 0 };
                for (int j = 0; j < jr[r]; j += VL) acc = vload(p + j) * vload(dp + j) + acc;
                vf D = vset1((float)vhsum_d(&acc));
                for (int j = 0; j < jr[r]; j += VL) vstore(dp + j, vload(p + j) * (vload(dp + j) - D) * u->scale);
                if (jr[r] < Jmax) memset(dp + jr[r], 0, (size_t)(Jmax - jr[r]) * sizeof(float));
            }
            k_acc_t(s.dVt, Tkp, dy, qs, s.P, Tkp, HS, nq, Jmax);
            k_acc_t(s.dKt, Tkp, qt, qs, s.dP, Tkp, HS, nq, Jmax);
            k_rows_p(s.acc, HSp, s.dP, Tkp, s.Kp, HSp, nq, nk);
            for (int r = 0; r < nq; r++)
                memcpy(u->dq + (size_t)(t0 + r) * qs + (size_t)h * HS, s.acc + (size_t)r * HSp,
                       (size_t)HS * sizeof(float));
        }
    }
    for (int j = 0; j < Tk; j++) {
        float *dkj = u->dk + (size_t)j * ks + (size_t)u->kvh * HS, *dvj = u->dv + (size_t)j * ks + (size_t)u->kvh * HS;
        for (int d = 0; d < HS; d++) {
            dkj[d] = s.dKt[(size_t)d * Tkp + j];
            dvj[d] = s.dVt[(size_t)d * Tkp + j];
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
    j->fn(&u, j->scratch + (size_t)thread * j->per);
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
    j->fn(&u, j->scratch + (size_t)thread * j->per);
}

void ft_attention_forward_fast(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int *q_pos, const int *doc, int B, int T, int Tk, int NH, int NKV, int HS,
                            int kv_stride, int n_threads, float *scratch) {
    int lv = ft_cpu_level();
    att_job j = { .fn = lv >= FT_CPU_AVX512 ? unit_fwd_avx512 : lv >= FT_CPU_AVX2 ? unit_fwd_avx2 : unit_fwd_generic,
                  .proto = { .q_pos = q_pos, .T = T, .Tk = Tk, .NH = NH, .NKV = NKV, .HS = HS,
                             .kv_stride = kv_stride, .scale = (float)(1.0 / sqrt((double)HS)) },
                  .out = out, .lse = lse, .q = q, .k = k, .v = v, .doc = doc,
                  .per = scr_floats(Tk, HS, false), .qd = (size_t)NH * HS, .kvs = (size_t)kv_stride,
                  .scratch = scratch };
    ft_parallel_for(n_threads, B * NKV, att_fwd_task, &j);
}

void ft_attention_backward_fast(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                             const float *k, const float *v, const int *q_pos, const int *doc, int B, int T, int Tk,
                             int NH, int NKV, int HS, int n_threads, float *scratch) {
    int lv = ft_cpu_level();
    size_t kvd = (size_t)NKV * HS;
    att_job j = { .fn = lv >= FT_CPU_AVX512 ? unit_bwd_avx512 : lv >= FT_CPU_AVX2 ? unit_bwd_avx2 : unit_bwd_generic,
                  .proto = { .q_pos = q_pos, .T = T, .Tk = Tk, .NH = NH, .NKV = NKV, .HS = HS,
                             .kv_stride = (int)kvd, .scale = (float)(1.0 / sqrt((double)HS)) },
                  .dq = dq, .dk = dk, .dv = dv, .dout = dout, .lse_in = lse, .q = q, .k = k, .v = v, .doc = doc,
                  .per = scr_floats(Tk, HS, true), .qd = (size_t)NH * HS, .kvs = kvd, .scratch = scratch };
    ft_parallel_for(n_threads, B * NKV, att_bwd_task, &j);
}

/* ------------------------------------------------------------- cross-entropy */

/* One row: max, e = exp(x - max) once into dx (float), the sum in double,
 * then dx = (e / sum - onehot) · scale. Returns the row's loss. */
INLINE double ce_row_body(float *dx, const float *x, int y, int V, float dloss_scale) {
    vf mx = vset1(-INFINITY);
    int i = 0;
    for (; i + VL <= V; i += VL) {
        vf a = vload(x + i);
        mx = vsel(a > mx, a, mx);
    }
    float m = vhmax(&mx);
    for (; i < V; i++) m = x[i] > m ? x[i] : m;
    float *e = dx;
    double sum = 0;
    vf vm = vset1(m);
    i = 0;
    if (dx) {
        vf sv = { 0 };
        for (; i + VL <= V; i += VL) {
            vf a = vload(x + i) - vm, ev = vexp(&a);
            vstore(e + i, ev);
            sv += ev;
            if ((i / VL) % 64 == 63) { sum += vhsum_d(&sv); sv = (vf){ 0 }; }
        }
        sum += vhsum_d(&sv);
    } else {
        /* loss only: exp a chunk at a time into the small buffer */
        vf sv = { 0 };
        for (; i + VL <= V; i += VL) {
            vf a = vload(x + i) - vm;
            sv += vexp(&a);
            if ((i / VL) % 64 == 63) { sum += vhsum_d(&sv); sv = (vf){ 0 }; }
        }
        sum += vhsum_d(&sv);
    }
    if (i < V) {
        float buf[VL];
        for (int j = 0; j < VL; j++) buf[j] = i + j < V ? x[i + j] - m : -INFINITY;
        vf a = vload(buf);
        vstore(buf, vexp(&a));
        for (int j = 0; i + j < V; j++) {
            if (dx) e[i + j] = buf[j];
            sum += buf[j];
        }
    }
    double lse = m + log(sum);
    if (dx) {
        vf f = vset1((float)(dloss_scale / sum));
        for (i = 0; i + VL <= V; i += VL) vstore(dx + i, vload(dx + i) * f);
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
    vf mx = vset1(-INFINITY);
    int i = 0;
    for (; i + VL <= W; i += VL) {
        vf a = vload(x + i);
        mx = vsel(a > mx, a, mx);
    }
    float ms = vhmax(&mx);
    for (; i < W; i++) ms = x[i] > ms ? x[i] : ms;
    float mo = first ? -INFINITY : *m, mn = ms > mo ? ms : mo;
    double sum = 0;
    vf vm = vset1(mn), sv = { 0 };
    for (i = 0; i + VL <= W; i += VL) {
        vf a = vload(x + i) - vm, ev = vexp(&a);
        if (store) vstore(x + i, ev);
        sv += ev;
        if ((i / VL) % 64 == 63) { sum += vhsum_d(&sv); sv = (vf){ 0 }; }
    }
    sum += vhsum_d(&sv);
    if (i < W) {
        float buf[VL];
        for (int j = 0; j < VL; j++) buf[j] = i + j < W ? x[i + j] - mn : -INFINITY;
        vf a = vload(buf);
        vstore(buf, vexp(&a));
        for (int j = 0; i + j < W; j++) {
            if (store) x[i + j] = buf[j];
            sum += buf[j];
        }
    }
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
