/* kernels_amx.h — the tile-unit bf16 micro-kernel (kernels.h's tile16 at
 * the amx level), written once against five tile primitives and included
 * twice: by kernels_amx.c with the real AMX intrinsics, and by
 * kernels_amx_emu.c with a plain C emulation of the tile registers, so the
 * tests run this file's data movement (tiling, the k tail, add, strides)
 * on a CPU without AMX. The including file defines first:
 *   AMX_TARGET            the functions' target attribute (empty: emulated)
 *   AMX_LOADCFG(cfg)      ldtilecfg from a 64-byte amx_cfg
 *   AMX_ZERO(t)           tilezero tmm t
 *   AMX_LOAD(t, p, st)    tileloadd: tmm t's rows from p, st bytes apart
 *   AMX_DP(c, a, b)       tdpbf16ps tmm c += tmm a · tmm b
 *   AMX_STORE(t, p, st)   tilestored: tmm t's rows to p, st bytes apart
 *   AMX_RELEASE()         tilerelease
 *   AMX_WIDE, AMX_NARROW  the names of the two tile16 functions to define
 *   AMX_BEGIN, AMX_END    the names of the tile-state functions to define
 *   AMX_GEMM16            the name of the pair-layout product to define
 * Tile numbers are literals (the instructions encode them).
 *
 * The shapes: mr16 = 32 rows (2 A tiles of 16 rows × 16 pair-words = 32
 * bf16 along k), nr16 = 32 columns (wide: 2 B tiles of 16 pair-rows × 16
 * words, 2×2 C tiles of 16×16 f32: 8 tile registers) or 16 (narrow: 1 B
 * tile, 2 C tiles). The driver pads a panel's rows past M with zeros and a
 * strip's columns past N with zeros, so every call is whole tiles except
 * along k: kp pairs need not be a multiple of 16, and what lies past kp in
 * the panel and the strip is not ours to read as zeros (other data, maybe
 * NaN bits: 0·NaN is NaN). The k tail is copied into zero-padded local
 * tiles, so one fixed configuration (every tile 16 rows × 64 bytes) serves
 * every call.
 * Not a header for anything else to include. */

#include <string.h>

/* The 64-byte ldtilecfg operand, palette 1. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];   /* rows of tile t */
} amx_cfg;
_Static_assert(sizeof(amx_cfg) == 64, "the tile configuration is 64 bytes");

/* Tile state is owned per call, never per thread: AMX_BEGIN loads the one
 * configuration (every tile 16 rows × 64 bytes) and AMX_END releases the
 * tiles (tilerelease: back to their initial state), and the driver brackets
 * each panel task with them (kernels.h's tiles_begin/tiles_end), so no tile
 * instruction of ours runs on a configuration we did not load in the same
 * task. Another tile user in the process (oneDNN ends its kernels with
 * tilerelease; user code, a signal handler) may release or reload the
 * tiles between two calls into us: the next call loads ours again. And we
 * leave the tiles as we found them, released, so a thread of the caller's
 * carries no 8 KiB of tile data through its context switches after we
 * return. One ldtilecfg + tilerelease per task costs about 50 ns
 * (bench_gemm's tile_state_ns, on a Sapphire Rapids-class Xeon), against
 * the tens of microseconds of a task's panels (32 rows × up to 1024
 * columns × up to 1024 of k). Tile instructions are
 * not guarded: cpu.c ran the same sequence (ldtilecfg in a fresh thread,
 * tile loads, tdpbf16ps, tilerelease) before it let the level be chosen;
 * a fault after that (a VM that takes the tiles away) is reported by the
 * command's SIGILL handler, which ft_cpu_in_tiles tells the tile code. */
static const amx_cfg amx_config = {
    .palette = 1,
    .colsb = { 64, 64, 64, 64, 64, 64, 64, 64 },
    .rows = { 16, 16, 16, 16, 16, 16, 16, 16 },
};

AMX_TARGET static void AMX_BEGIN(void) { AMX_LOADCFG(&amx_config); }
AMX_TARGET static void AMX_END(void) { AMX_RELEASE(); }

/* Tiles: C 0 (rows 0-15, cols 0-15), 1 (rows 0-15, cols 16-31), 2 (rows
 * 16-31, cols 0-15), 3 (rows 16-31, cols 16-31); A 4 (rows 0-15), 5 (rows
 * 16-31); B 6 (cols 0-15), 7 (cols 16-31). NB = B tiles (1 or 2). */
#define AMX_STEP(a0, a1, ast, b, bst, NB)                                                                              \
    do {                                                                                                           \
        AMX_LOAD(4, (a0), (ast));                                                                                  \
        AMX_LOAD(5, (a1), (ast));                                                                                  \
        AMX_LOAD(6, (b), (bst));                                                                                   \
        AMX_DP(0, 4, 6);                                                                                           \
        AMX_DP(2, 5, 6);                                                                                           \
        if ((NB) == 2) {                                                                                           \
            AMX_LOAD(7, (b) + 16, (bst));                                                                          \
            AMX_DP(1, 4, 7);                                                                                       \
            AMX_DP(3, 5, 7);                                                                                       \
        }                                                                                                          \
    } while (0)

/* cb (32, 16·NB; row-major) (+)= ap (32 rows lda words apart, kp pair
 * words) · bp (kp pair rows × 16·NB words) */
AMX_TARGET static inline __attribute__((always_inline)) void amx_body(float *cb, const uint32_t *bp,
                                                                      const uint32_t *ap, int64_t lda, int kp,
                                                                      bool add, const int NB) {
    const int NR = 16 * NB;
    const int64_t cst = (int64_t)NR * sizeof(float), ast = lda * (int64_t)sizeof(uint32_t);
    const int64_t bst = (int64_t)NR * sizeof(uint32_t);
    if (add) {
        AMX_LOAD(0, cb, cst);
        AMX_LOAD(2, cb + 16 * NR, cst);
        if (NB == 2) {
            AMX_LOAD(1, cb + 16, cst);
            AMX_LOAD(3, cb + 16 * NR + 16, cst);
        }
    } else {
        AMX_ZERO(0);
        AMX_ZERO(2);
        if (NB == 2) {
            AMX_ZERO(1);
            AMX_ZERO(3);
        }
    }
    int p = 0;
    for (; p + 16 <= kp; p += 16) AMX_STEP(ap + p, ap + 16 * lda + p, ast, bp + (size_t)p * NR, bst, NB);
    if (p < kp) { /* the k tail: kt < 16 pairs, zero-padded to a whole tile */
        const int kt = kp - p;
        uint32_t at[32 * 16] __attribute__((aligned(64)));
        uint32_t bt[16 * 32] __attribute__((aligned(64)));
        for (int r = 0; r < 32; r++) {
            memcpy(at + r * 16, ap + r * lda + p, (size_t)kt * sizeof(uint32_t));
            memset(at + r * 16 + kt, 0, (size_t)(16 - kt) * sizeof(uint32_t));
        }
        memcpy(bt, bp + (size_t)p * NR, (size_t)kt * NR * sizeof(uint32_t));
        memset(bt + kt * NR, 0, (size_t)(16 - kt) * NR * sizeof(uint32_t));
        AMX_STEP(at, at + 16 * 16, 16 * (int64_t)sizeof(uint32_t), bt, bst, NB);
    }
    AMX_STORE(0, cb, cst);
    AMX_STORE(2, cb + 16 * NR, cst);
    if (NB == 2) {
        AMX_STORE(1, cb + 16, cst);
        AMX_STORE(3, cb + 16 * NR + 16, cst);
    }
}

/* the driver's panels are rows FT_GEMM_KC/2 (or, one strip's whole chunk, FT_GEMM_KCH/2) words apart: constant strides */
AMX_TARGET void AMX_WIDE(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add) {
    if (lda == FT_GEMM_KC / 2) amx_body(cb, bp, ap, FT_GEMM_KC / 2, kp, add, 2);
    else if (lda == FT_GEMM_KCH / 2) amx_body(cb, bp, ap, FT_GEMM_KCH / 2, kp, add, 2);
    else amx_body(cb, bp, ap, lda, kp, add, 2);
}
AMX_TARGET void AMX_NARROW(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add) {
    if (lda == FT_GEMM_KC / 2) amx_body(cb, bp, ap, FT_GEMM_KC / 2, kp, add, 1);
    else if (lda == FT_GEMM_KCH / 2) amx_body(cb, bp, ap, FT_GEMM_KCH / 2, kp, add, 1);
    else amx_body(cb, bp, ap, lda, kp, add, 1);
}

/* ------------------------------------------------ any-shape pair products */

/* One 16 × 16-word tile of a (rows × cols words, ld words apart) operand
 * at (r0, c0): loaded in place when whole, else copied with zeros past the
 * operand's edge into a local tile (what lies past it is not ours to read). */
#define AMX_LOAD_EDGE(t, base, ld, r0, c0, rows_all, cols_all, tmp)                                                    \
    do {                                                                                                               \
        int rr_ = (rows_all) - (r0) < 16 ? (rows_all) - (r0) : 16, cc_ = (cols_all) - (c0) < 16 ? (cols_all) - (c0) : 16; \
        if (rr_ == 16 && cc_ == 16) {                                                                                  \
            AMX_LOAD(t, (base) + (size_t)(r0) * (ld) + (c0), (ld) * (int64_t)sizeof(uint32_t));                        \
        } else {                                                                                                       \
            memset((tmp), 0, 16 * 16 * sizeof(uint32_t));                                                              \
            for (int r_ = 0; r_ < rr_; r_++)                                                                           \
                memcpy((tmp) + r_ * 16, (base) + (size_t)((r0) + r_) * (ld) + (c0), (size_t)cc_ * sizeof(uint32_t));   \
            AMX_LOAD(t, (tmp), 16 * (int64_t)sizeof(uint32_t));                                                        \
        }                                                                                                              \
    } while (0)

/* C (M × N f32, rows ldc apart) = alpha · A·B, or C += alpha · A·B when
 * acc, for A (M × kp words, rows lda apart) and B (kp × N words, rows ldb
 * apart), each word a pair of bf16 along the summed index, any M, N, kp
 * >= 1: attention's products (kernels.h's gemm16). Blocks of 32 × 32 on
 * the 2 × 2 C tiles (fewer at the edges), k 16 pairs a step, each output's
 * pairs summed in order; the caller holds the tile state (tiles_begin). */
AMX_TARGET void AMX_GEMM16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M,
                           int N, int kp, float alpha, bool acc) {
    uint32_t ta[2][16 * 16] __attribute__((aligned(64))), tb[2][16 * 16] __attribute__((aligned(64)));
    float cb[32 * 32] __attribute__((aligned(64)));
    for (int m0 = 0; m0 < M; m0 += 32) {
        const int mr = M - m0 < 32 ? M - m0 : 32;
        for (int n0 = 0; n0 < N; n0 += 32) {
            const int nc = N - n0 < 32 ? N - n0 : 32;
            const bool a2 = mr > 16, b2 = nc > 16;
            /* a whole block with alpha 1: C's own rows in and out of the tiles */
            const bool direct = mr == 32 && nc == 32 && alpha == 1.0f;
            float *cd = C + (size_t)m0 * ldc + n0;
            const int64_t cst = ldc * (int64_t)sizeof(float);
            if (direct && acc) {
                AMX_LOAD(0, cd, cst);
                AMX_LOAD(1, cd + 16, cst);
                AMX_LOAD(2, cd + 16 * ldc, cst);
                AMX_LOAD(3, cd + 16 * ldc + 16, cst);
            } else {
                AMX_ZERO(0);
                AMX_ZERO(1);
                AMX_ZERO(2);
                AMX_ZERO(3);
            }
            for (int p = 0; p < kp; p += 16) {
                AMX_LOAD_EDGE(4, A, lda, m0, p, M, kp, ta[0]);
                AMX_LOAD_EDGE(6, B, ldb, p, n0, kp, N, tb[0]);
                AMX_DP(0, 4, 6);
                if (b2) {
                    AMX_LOAD_EDGE(7, B, ldb, p, n0 + 16, kp, N, tb[1]);
                    AMX_DP(1, 4, 7);
                }
                if (a2) {
                    AMX_LOAD_EDGE(5, A, lda, m0 + 16, p, M, kp, ta[1]);
                    AMX_DP(2, 5, 6);
                    if (b2) AMX_DP(3, 5, 7);
                }
            }
            if (direct) {
                AMX_STORE(0, cd, cst);
                AMX_STORE(1, cd + 16, cst);
                AMX_STORE(2, cd + 16 * ldc, cst);
                AMX_STORE(3, cd + 16 * ldc + 16, cst);
                continue;
            }
            AMX_STORE(0, cb, 32 * sizeof(float));
            AMX_STORE(1, cb + 16, 32 * sizeof(float));
            AMX_STORE(2, cb + 16 * 32, 32 * sizeof(float));
            AMX_STORE(3, cb + 16 * 32 + 16, 32 * sizeof(float));
            for (int r = 0; r < mr; r++) {
                float *c = C + (size_t)(m0 + r) * ldc + n0;
                const float *x = cb + r * 32;
                if (acc)
                    for (int j = 0; j < nc; j++) c[j] += alpha * x[j];
                else
                    for (int j = 0; j < nc; j++) c[j] = alpha * x[j];
            }
        }
    }
}
