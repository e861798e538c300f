/* kernels_isa.h — the micro-kernel and the row-dot of kernels.h, written
 * once with GCC vector extensions and included by each kernels_<isa>.c,
 * which defines first:
 *   ISA_TARGET   the target attribute (empty for the portable build)
 *   VL           floats per vector register
 *   VFMA(a,b,c)  a·b + c on vf (fused where the ISA has FMA)
 *   VSET1(x)     x in every lane (not (vf){0} + x: that costs an add, for -0)
 *   HSUM(v)      optional: the sum of v's lanes (else VL must be 4)
 *   MR_W, NV_W   the wide register tile: MR_W rows × NV_W vectors
 *   MR_N, NV_N   the narrow one, for N of at most VL·NV_N
 *   ISA_NAME, ISA_TABLE  the level's name and the ft_kernel_isa to define
 *   ISA_STORE_T          (optional) the table's store_t
 * and its dequantizers (or WIDEN_REFERENCE_ONLY to use dtype.c's):
 *   bf16_vec, f16_vec(const uint16_t *h)   VL values, as a vector
 *   q8_0_block(float *dst, const ft_block_q8_0 *b), q4_0_block(...)  32 values
 *   nf4_block(float *dst, const ft_block_nf4 *b)  64 values
 *   i8_vec(const int8_t *q, float absmax)  VL values of an int8 row
 * and, where it defines ISA_GGML_BLOCKS (avx2, avx512), q4_1/q5_0/q5_1/iq4_nl_block (32
 * values) and q4_K/q5_K/q6_K/iq4_xs_block (256) for ggml's other blocks
 * (the rest, and a level without them, go through dtype.c's reference).
 * A new weight dtype is a traits row in dtype.c (which every level uses
 * until it has its own) plus a case here and a dequantizer per ISA.
 * Not a header for anything else to include. */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <string.h>

typedef float vf __attribute__((vector_size(VL * sizeof(float))));

#define KINLINE static inline __attribute__((always_inline)) ISA_TARGET
#define TILE_MR_MAX (MR_W > MR_N ? MR_W : MR_N)
#define TILE_NV_MAX (NV_W > NV_N ? NV_W : NV_N)

KINLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* the first n < VL floats at p, the rest zero */
KINLINE vf vload_n(const float *p, int n) {
    float buf[VL] = { 0 };
    memcpy(buf, p, (size_t)n * sizeof(float));
    return vload(buf);
}
#define VSTORE(p, v) do { vf vs_ = (v); memcpy((p), &vs_, sizeof vs_); } while (0)

/* The sum of v's lanes as a tree (HSUM: the ISA's; else pairs of the 4
 * lanes): log2(VL) dependent adds instead of VL (a serial sum of 16 lanes
 * per row cost ~10% of decode, where every 4 rows end in four). */
KINLINE float hsum(vf v) {
#ifdef HSUM
    return HSUM(v);
#else
    return (v[0] + v[2]) + (v[1] + v[3]);
#endif
}

/* Elements [k0, k0+n) of a row of dtype dt to f32; what the ISA has no
 * dequantizer for (f32 itself, a ragged end) goes through dtype.c. */
ISA_TARGET static void widen(float *dst, const uint8_t *row, ft_dtype dt, int k0, int n) {
    int k = 0;
#ifndef WIDEN_REFERENCE_ONLY
    const uint16_t *h = (const uint16_t *)row + k0;
    switch (dt) {
    case FT_BF16:
        for (; k + VL <= n; k += VL) VSTORE(dst + k, (vf)bf16_vec(h + k));
        break;
    case FT_F16:
        for (; k + VL <= n; k += VL) VSTORE(dst + k, (vf)f16_vec(h + k));
        break;
    case FT_Q8_0:
        for (const ft_block_q8_0 *b = (const ft_block_q8_0 *)row + k0 / FT_QK; k < n; k += FT_QK, b++)
            q8_0_block(dst + k, b);
        break;
    case FT_Q4_0:
        for (const ft_block_q4_0 *b = (const ft_block_q4_0 *)row + k0 / FT_QK; k < n; k += FT_QK, b++)
            q4_0_block(dst + k, b);
        break;
#ifdef ISA_GGML_BLOCKS
#define WIDEN_BLOCKS(T, QKB, fn)                                                                          \
    case T:                                                                                             \
        for (const void *b = row + (size_t)(k0 / (QKB)) * ft_types[T].block_bytes; k + (QKB) <= n;        \
             k += (QKB), b = (const uint8_t *)b + ft_types[T].block_bytes)                              \
            fn(dst + k, b);                                                                             \
        break;
        WIDEN_BLOCKS(FT_Q4_1, FT_QK, q4_1_block)
        WIDEN_BLOCKS(FT_Q5_0, FT_QK, q5_0_block)
        WIDEN_BLOCKS(FT_Q5_1, FT_QK, q5_1_block)
        WIDEN_BLOCKS(FT_IQ4_NL, FT_QK, iq4_nl_block)
        WIDEN_BLOCKS(FT_Q4_K, FT_QK_K, q4_K_block)
        WIDEN_BLOCKS(FT_Q5_K, FT_QK_K, q5_K_block)
        WIDEN_BLOCKS(FT_Q6_K, FT_QK_K, q6_K_block)
        WIDEN_BLOCKS(FT_IQ4_XS, FT_QK_K, iq4_xs_block)
#undef WIDEN_BLOCKS
#endif
    case FT_NF4: /* whole blocks here; a row's padded last block through dtype.c */
        for (const ft_block_nf4 *b = (const ft_block_nf4 *)row + k0 / FT_QK_NF4; k + FT_QK_NF4 <= n;
             k += FT_QK_NF4, b++)
            nf4_block(dst + k, b);
        break;
    case FT_I8ROW: { /* the row's absmax, then its int8 */
        float a;
        memcpy(&a, row, sizeof a);
        const int8_t *q = (const int8_t *)(row + 4) + k0;
        for (; k + VL <= n; k += VL) VSTORE(dst + k, (vf)i8_vec(q + k, a));
        break;
    }
    default:
        break;
    }
#endif
    if (k < n) ft_dtype_span_to_f32(dt, row, k0 + k, dst + k, n - k);
}

/* cb (MR, VL·NV) (+)= ap (MR, kc) · bp (kc, VL·NV): a broadcast element of A
 * times NV vectors of B's row k, MR·NV accumulators in registers. */
KINLINE void tile_body(float *cb, const float *bp, const float *ap, int64_t lda, int kc, bool add, const int MR,
                       const int NV) {
    const int NR = VL * NV;
    vf acc[TILE_MR_MAX][TILE_NV_MAX];
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) acc[r][j] = add ? vload(cb + r * NR + VL * j) : (vf){ 0 };
    for (int k = 0; k < kc; k++) {
        vf xv[TILE_NV_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) xv[j] = vload(bp + (size_t)k * NR + VL * j);
#pragma GCC unroll 16
        for (int r = 0; r < MR; r++) {
            vf b = VSET1(ap[r * lda + k]);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[r][j] = VFMA(b, xv[j], acc[r][j]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) VSTORE(cb + r * NR + VL * j, acc[r][j]);
}

/* A packed panel (lda = FT_GEMM_KC) gets its own copy, so its row offsets
 * are constants: a run-time lda costs a register per row, one more than
 * the wide tile has (a spill and a reload per k, measured ~8% of prefill). */
ISA_TARGET static void tile_wide(float *cb, const float *bp, const float *ap, int64_t lda, int kc, bool add) {
    if (lda == FT_GEMM_KC) tile_body(cb, bp, ap, FT_GEMM_KC, kc, add, MR_W, NV_W);
    else tile_body(cb, bp, ap, lda, kc, add, MR_W, NV_W);
}
ISA_TARGET static void tile_narrow(float *cb, const float *bp, const float *ap, int64_t lda, int kc, bool add) {
    if (lda == FT_GEMM_KC) tile_body(cb, bp, ap, FT_GEMM_KC, kc, add, MR_N, NV_N);
    else tile_body(cb, bp, ap, lda, kc, add, MR_N, NV_N);
}

ISA_TARGET static void store(float *C, int64_t ldc, const float *cb, int nr, int rows, int cols, float alpha,
                             bool overwrite) {
    for (int r = 0; r < rows; r++) {
        float *d = C + r * ldc;
        const float *c = cb + r * nr;
        int l = 0;
        if (overwrite)
            for (; l + VL <= cols; l += VL) VSTORE(d + l, vload(c + l) * alpha);
        else
            for (; l + VL <= cols; l += VL) VSTORE(d + l, vload(d + l) + vload(c + l) * alpha);
        for (; l < cols; l++) d[l] = overwrite ? alpha * c[l] : d[l] + alpha * c[l];
    }
}

/* out[r] = row r · x for r < NRW: each row widened a K-chunk at a time
 * into L1 (f32 rows read in place), two accumulators per row. */
KINLINE void dot_body(float *out, const float *x, const uint8_t *w, size_t rb, ft_dtype dt, int K, const int NRW) {
    float buf[4][FT_GEMM_KC] __attribute__((aligned(64)));
    vf acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) acc[r][0] = acc[r][1] = (vf){ 0 };
    for (int k0 = 0; k0 < K; k0 += FT_GEMM_KC) {
        int kc = K - k0 < FT_GEMM_KC ? K - k0 : FT_GEMM_KC;
        const float *p[4];
#pragma GCC unroll 4
        for (int r = 0; r < NRW; r++) {
            if (dt == FT_F32) {
                p[r] = (const float *)(w + r * rb) + k0;
            } else {
                widen(buf[r], w + r * rb, dt, k0, kc);
                p[r] = buf[r];
            }
        }
        const float *xk = x + k0;
        int k = 0;
        for (; k + 2 * VL <= kc; k += 2 * VL) {
            vf x0 = vload(xk + k), x1 = vload(xk + k + VL);
#pragma GCC unroll 4
            for (int r = 0; r < NRW; r++) {
                acc[r][0] = VFMA(vload(p[r] + k), x0, acc[r][0]);
                acc[r][1] = VFMA(vload(p[r] + k + VL), x1, acc[r][1]);
            }
        }
        for (; k < kc; k += VL) {
            int n = kc - k < VL ? kc - k : VL;
            vf x0 = vload_n(xk + k, n);
#pragma GCC unroll 4
            for (int r = 0; r < NRW; r++) acc[r][0] = VFMA(vload_n(p[r] + k, n), x0, acc[r][0]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) {
        out[r] = hsum(acc[r][0] + acc[r][1]);
    }
}

#ifndef WIDEN_REFERENCE_ONLY
/* The same for bf16/f16 rows, widened in registers (decode is bound by
 * reading the weights; a round trip through L1 costs ~30% there). */
KINLINE void dot_body_h16(float *out, const float *x, const uint8_t *w, size_t rb, int K, const ft_dtype dt,
                          const int NRW) {
    vf acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) acc[r][0] = acc[r][1] = (vf){ 0 };
    int k = 0;
    for (; k + 2 * VL <= K; k += 2 * VL) {
        vf x0 = vload(x + k), x1 = vload(x + k + VL);
#pragma GCC unroll 4
        for (int r = 0; r < NRW; r++) {
            const uint16_t *h = (const uint16_t *)(w + r * rb) + k;
            acc[r][0] = VFMA(dt == FT_BF16 ? (vf)bf16_vec(h) : (vf)f16_vec(h), x0, acc[r][0]);
            acc[r][1] = VFMA(dt == FT_BF16 ? (vf)bf16_vec(h + VL) : (vf)f16_vec(h + VL), x1, acc[r][1]);
        }
    }
    for (; k < K; k += VL) {
        int n = K - k < VL ? K - k : VL;
        vf x0 = vload_n(x + k, n);
#pragma GCC unroll 4
        for (int r = 0; r < NRW; r++) {
            float buf[VL] = { 0 };
            widen(buf, w + r * rb, dt, k, n);
            acc[r][0] = VFMA(vload(buf), x0, acc[r][0]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NRW; r++) {
        out[r] = hsum(acc[r][0] + acc[r][1]);
    }
}
#endif

ISA_TARGET static void dot_rows(float *out, const float *x, const uint8_t *w, size_t rb, ft_dtype dt, int K,
                                int nrows) {
#ifndef WIDEN_REFERENCE_ONLY
    if (dt == FT_BF16 || dt == FT_F16) {
        for (int r = 0; r < nrows; r += 4) {
            int n = nrows - r;
            if (n >= 4 && dt == FT_BF16) dot_body_h16(out + r, x, w + r * rb, rb, K, FT_BF16, 4);
            else if (n >= 4) dot_body_h16(out + r, x, w + r * rb, rb, K, FT_F16, 4);
            else
                for (int i = 0; i < n; i++) {
                    if (dt == FT_BF16) dot_body_h16(out + r + i, x, w + (r + i) * rb, rb, K, FT_BF16, 1);
                    else dot_body_h16(out + r + i, x, w + (r + i) * rb, rb, K, FT_F16, 1);
                }
        }
        return;
    }
#endif
    if (nrows == 4) {
        dot_body(out, x, w, rb, dt, K, 4);
        return;
    }
    for (int r = 0; r < nrows; r++) dot_body(out + r, x, w + r * rb, rb, dt, K, 1);
}

const ft_kernel_isa ISA_TABLE = {
    .name = ISA_NAME,
    .mr = { MR_W, MR_N },
    .nr = { VL * NV_W, VL * NV_N },
    .tile = { tile_wide, tile_narrow },
    .widen = widen,
    .store = store,
#ifdef ISA_STORE_T
    .store_t = ISA_STORE_T,
#endif
    .dot_rows = dot_rows,
};
