/* kernels.h — the one matrix-product driver for Linear's forward, its
 * backward and the LoRA products: C (M, N) = alpha · A (M, K) · B (K, N)
 * (+ C), with either operand in f32 (any strides) or rows of a weight dtype
 * (f32, bf16, f16, q8_0, q4_0), widened exactly to f32 a block at a time.
 *
 * kernels.c holds the driver, written once: K and N chunks, packing, the
 * hand-out of panels to threads (ft_parallel_for), the one-column GEMV path.
 * Each instruction set (kernels_generic.c, kernels_avx2.c,
 * kernels_avx512.c; the amx level's tile micro-kernel in kernels_amx.h,
 * compiled on the tile unit and on an emulation of it) provides only the primitives below: widen a span of a
 * row to f32, dot rows with a vector, and the register-tile micro-kernel
 * (the last two written once in kernels_isa.h and compiled per ISA). The
 * level comes from ft_cpu_level() (cpu.h). Every output is computed by one
 * thread in a fixed order, so results do not depend on the thread count;
 * they differ from a plain reference only in the order of the f32 sums. */
#ifndef FT_KERNELS_H
#define FT_KERNELS_H

#include "core/core.h"

/* An operand. f32: element (i, j) at ((const float *)p)[i·rs + j·cs].
 * Other weight dtypes: rows rs bytes apart from p, read in spans of whole
 * blocks; element (i, j) is element j of row i, or with t element i of
 * row j (cs unused). */
typedef struct {
    const void *p;
    ft_dtype dt;
    int64_t rs, cs;
    bool t;
} ft_mat;

static inline ft_mat ft_mat_f32(const float *p, int64_t rs, int64_t cs) {
    return (ft_mat){ .p = p, .dt = FT_F32, .rs = rs, .cs = cs };
}
/* Rows of `cols` elements of dtype dt, back to back: (rows, cols). */
static inline ft_mat ft_mat_rows(const void *p, ft_dtype dt, int64_t cols) {
    return dt == FT_F32 ? ft_mat_f32(p, cols, 1) : (ft_mat){ .p = p, .dt = dt, .rs = ft_dtype_nbytes(dt, cols), .cs = 1 };
}
/* The same rows seen transposed: (cols, rows). */
static inline ft_mat ft_mat_rows_t(const void *p, ft_dtype dt, int64_t cols) {
    return dt == FT_F32 ? ft_mat_f32(p, 1, cols)
                        : (ft_mat){ .p = p, .dt = dt, .rs = ft_dtype_nbytes(dt, cols), .cs = 1, .t = true };
}

/* The driver's blocking: N is covered FT_GEMM_NC columns at a time (bf16
 * pairs: FT_GEMM_NC16) and K FT_GEMM_KCH at a time (a chunk's sum goes into
 * C before the next chunk starts), the register tile running over
 * FT_GEMM_KC of it at a time. Fixed sizes, so the order of the sums, and
 * with it the result, never depends on the thread count or the scratch
 * given (N's chunking enters no sum at all). */
#define FT_GEMM_KC 256
#define FT_GEMM_KCH 1024
#define FT_GEMM_NC 256
#define FT_GEMM_NC16 1024
/* Floats of scratch ft_gemm needs (the packed chunk of B: KCH × NC f32, or
 * KCH/2 × NC16 words of bf16 pairs, the larger). */
#define FT_GEMM_SCRATCH_FLOATS ((size_t)FT_GEMM_KCH / 2 * FT_GEMM_NC16)

/* C(m, n) at C[m·c_rs + n·c_cs] becomes alpha · Σ_k A(m, k)·B(k, n), plus
 * its old value when accumulate. On n_threads threads (ft_parallel_for);
 * scratch holds scratch_floats floats (FT_GEMM_SCRATCH_FLOATS; none is used
 * on the GEMV path: M = 1 with A's row contiguous and B read along k, or
 * N = 1 with A read along k and B's column contiguous). Returns false,
 * having written nothing, for sizes < 1, a dtype that is not a weight type,
 * a span that is not whole blocks, or too little scratch. */
bool ft_gemm(float *C, int64_t c_rs, int64_t c_cs, const ft_mat *A, const ft_mat *B, int M, int N, int K, float alpha,
             bool accumulate, int n_threads, float *scratch, size_t scratch_floats);

/* The same product in a compute type: FT_F32 (ft_gemm), FT_BF16 or FT_F16.
 * In bf16/f16 every element of A and B is first rounded to the compute
 * type (round to nearest even; exact for an operand already stored in it;
 * f16 overflows to inf), then multiplied exactly and summed in f32: what a
 * mixed-precision matrix unit (AMX, VDPBF16PS) computes, up to the order of
 * the f32 sums. At the avx512bf16 level bf16 products run on VDPBF16PS
 * (at the amx level on TDPBF16PS, the same rules per tile element),
 * which sums pairs of products along k and treats subnormal bf16 inputs
 * and f32 results as zero (DAZ/FTZ, whatever MXCSR says): results then
 * differ from the plain semantics also for magnitudes below 1.2e-38. The same conditions and thread-count independence as
 * ft_gemm; on the GEMV path an f32 vector is rounded into a copy (in the
 * scratch when given, so the GEMV path may then use it). False for any
 * other compute type. */
bool ft_gemm_in(ft_dtype compute, float *C, int64_t c_rs, int64_t c_cs, const ft_mat *A, const ft_mat *B, int M, int N,
                int K, float alpha, bool accumulate, int n_threads, float *scratch, size_t scratch_floats);

/* Integer products on the GEMV path, set per calling thread (off at
 * first): when on, a GEMV (M = 1 or N = 1, f32 compute) against weight rows
 * whose dtype has a vec_dot (ft_types[dt].vec_dot: q8_0, q4_0, q4_1, q5_0,
 * q5_1, iq4_nl, q4_K, q5_K, q6_K, iq4_xs) quantizes the f32 vector once to
 * 16-bit integers (the dtype's activation type, a16 or a16_K) and takes
 * integer dot products with it (kernels_a16.c); otherwise, and for every
 * other product, rows are widened exactly to f32 (the reference). The
 * results then differ from the widened product by the activations'
 * rounding to 16 bits (2^-16 of each block's largest); they still do not
 * depend on the thread count. Returns the previous setting. */
bool ft_gemm_set_int_dot(bool on);
/* out[r] = ft_types[dt].vec_dot(row r, act, K) for r < nrows, rows rb
 * bytes apart: the reference, and AVX2 integer sums (vpmaddwd; equal to it
 * bit for bit; the kernel of every x86 level from avx2 up) */
void ft_idot_rows_ref(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows);
void ft_idot_rows_avx2(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows);
/* the same with AVX-512 VNNI (kernels_a16_avx512.c; needs ft_cpu_has_avx512vnni) */
void ft_idot_rows_avx512(float *out, const void *act, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows);

/* ------------------------------------------------ per-ISA primitives */

/* What one instruction set provides to the driver. */
typedef struct {
    const char *name;
    /* register tiles, [0] wide and [1] narrow (for N <= nr[1]): mr rows of
     * A by nr columns of B */
    int mr[2], nr[2];
    /* cb (mr, nr; row-major) = ap (mr, kc; rows lda apart) · bp (kc, nr;
     * row-major), kc <= FT_GEMM_KC; plus cb's old value when add */
    void (*tile[2])(float *cb, const float *bp, const float *ap, int64_t lda, int kc, bool add);
    /* dst[0..n) = elements [k0, k0+n) of a row of dtype dt, as the dtype's
     * to_f32 gives them */
    void (*widen)(float *dst, const uint8_t *row, ft_dtype dt, int k0, int n);
    /* C's rows (rows, cols; ldc apart, contiguous) = alpha · cb (rows nr
     * apart), or += when !overwrite */
    void (*store)(float *C, int64_t ldc, const float *cb, int nr, int rows, int cols, float alpha, bool overwrite);
    /* the same into C stored transposed: element (r, l) at C[l·ldc + r]
     * (NULL: the driver's scalar loop; the same bits) */
    void (*store_t)(float *C, int64_t ldc, const float *cb, int nr, int rows, int cols, float alpha, bool overwrite);
    /* out[r] = row r · x (K elements) for r < nrows <= 4, rows rb bytes apart */
    void (*dot_rows)(float *out, const float *x, const uint8_t *w, size_t rb, ft_dtype dt, int K, int nrows);

    /* Products in bf16 (VDPBF16PS, or tdpbf16ps at the amx level: 32 × 32
     * and 32 × 16 tiles; NULL below the avx512bf16 level, where
     * bf16 compute rounds while packing f32 and uses tile). Operands are
     * packed as 32-bit words, each a pair of bf16 along k (element 2p in
     * the low half, 2p+1 in the high half, an odd K padded with a zero):
     * tile16 is tile with ap (mr, kp words; rows lda words apart) and bp
     * (kp, nr words), kp = pairs <= FT_GEMM_KC/2 (at the amx level up to
     * FT_GEMM_KCH/2: a product of one strip runs its whole K chunk in one
     * call); mr16/nr16 its tiles. */
    int mr16[2], nr16[2];
    void (*tile16[2])(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
    /* out[r] = row r (K bf16, rows rb bytes apart) · x (K bf16 as pairs,
     * zero-padded to an even count), r < nrows <= 4 */
    void (*dot_rows16)(float *out, const uint32_t *x, const uint8_t *w, size_t rb, int K, int nrows);
    /* dst[0..n) = src rounded to bf16 as ft_f32_to_bf16 does (RNE, NaN kept) */
    void (*to_bf16)(uint16_t *dst, const float *src, int n);
    /* Packing for tile16 (with it, or NULL): dst[l] = lo[l] | hi[l] << 16,
     * two bf16 rows of k as pair words; and an A panel stored k-major
     * (element (m, k) at src[k·cs + m]) as rows r < rows <= 16 of wp, ld
     * words apart, each the kc elements of k rounded to bf16 in pairs (an
     * odd kc's last pair's high half zero) */
    void (*pair_rows16)(uint32_t *dst, const uint16_t *lo, const uint16_t *hi, int n);
    /* the same from two f32 rows, rounded as to_bf16 (hi NULL: zeros) */
    void (*pair_rows16_f32)(uint32_t *dst, const float *lo, const float *hi, int n);
    void (*pack_at16)(uint32_t *wp, int64_t ld, const float *src, int64_t cs, int rows, int kc);
    /* 16 columns of a strip (nr words wide, nr a multiple of 16) from their
     * pair words: column j's kp words at src + j·ld for j < ncols (the
     * rest zero) to dst[p·nr + j] */
    void (*pack_cols16)(uint32_t *dst, int nr, const uint32_t *src, int ld, int ncols, int kp);
    /* Where tile16 needs state of its own (the amx level: a tile
     * configuration): tiles_begin loads it and tiles_end releases it, in
     * the calling thread; the driver brackets every task that calls tile16
     * with them, so nothing is assumed to survive between tasks (another
     * tile user may release the tiles between our calls) and nothing is
     * left held when we return. NULL where tile16 needs none. */
    void (*tiles_begin)(void);
    void (*tiles_end)(void);
    /* C (M × N f32, rows ldc apart) = alpha · A·B, or C += alpha · A·B
     * when acc: A (M × kp pair words, rows lda apart), B (kp × N words,
     * rows ldb apart), any M, N, kp >= 1; between tiles_begin and
     * tiles_end. Attention's products on the tile unit; NULL below amx. */
    void (*gemm16)(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                   int kp, float alpha, bool acc);
} ft_kernel_isa;

/* The kernel set for a level (FT_CPU_*), falling back to the best one
 * compiled in below it. */
const ft_kernel_isa *ft_kernels_for_level(int level);

/* The table every ft_gemm_in of this thread uses now: ft_kernels_force's,
 * or the level's. */
const ft_kernel_isa *ft_kernels_current(void);

/* The amx level's kernels with the tile unit emulated in plain C
 * (kernels_amx_emu.c): the real micro-kernel's tiling, tails and strides,
 * runnable where the avx512bf16 level is. Not a level: only tests reach it,
 * through ft_kernels_force. */
extern const ft_kernel_isa ft_kernels_amx_emulated;
/* For tests: release the emulated tiles of this thread as another library's
 * tilerelease would (the next tile instruction without a tiles_begin then
 * aborts, as the real one raises SIGILL). */
void ft_amx_emu_foreign_release(void);
/* For tests: whether this thread's emulated tiles are configured (not
 * released) */
bool ft_amx_emu_tiles_held(void);
/* For tests: every ft_gemm_in uses `isa` from now on whatever the level
 * (NULL: the level's again). Not meant to be changed while kernels run. */
void ft_kernels_force(const ft_kernel_isa *isa);

#endif
