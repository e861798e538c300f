/* kernels_amx_emu.c — kernels_amx.h's micro-kernel on a plain C emulation
 * of the tile unit, for tests on CPUs without AMX: eight 1 KiB tile
 * registers per thread, a configuration that must be loaded (in this
 * thread, and again after each tilerelease, which returns the tiles to
 * their initial state: unconfigured and zero) before any tile instruction, loads and stores of exactly the
 * configured rows and bytes, and TDPBF16PS as Intel documents it (SDM vol.
 * 2, "TDPBF16PS — Dot Product of BF16 Tiles Accumulated into Packed Single
 * Precision Tile"): for each row m of dst, pair k of a's row and column n,
 *     tmp.fp32[n] += fp32(a.row[m].bf16[2k])   · fp32(b.row[k].bf16[2n])
 *     tmp.fp32[n] += fp32(a.row[m].bf16[2k+1]) · fp32(b.row[k].bf16[2n+1])
 * with "round to nearest even ... when doing each accumulation of the FMA.
 * Output denormals are always flushed to zero and input denormals are
 * always treated as zero. MXCSR is not consulted nor updated." Here each
 * accumulation is one fmaf (one RNE rounding) with subnormal bf16 inputs
 * read as 0 and a subnormal sum flushed to 0. The shape rules it checks
 * (a's columns = b's rows, dst's rows and bytes = a's rows and b's bytes)
 * are the instruction's #UD conditions; a violation aborts (our bug).
 * This tests our data movement and tile discipline, not Intel's silicon:
 * the real unit's results and speed are tested only where it exists. */
#include "cpu/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} emu_cfg;

static __thread struct {
    bool configured;
    emu_cfg cfg;
    uint8_t t[8][16][64];
} emu;

static void emu_fail(const char *what, int t) {
    fprintf(stderr, "emulated AMX: %s (tile %d)\n", what, t);
    abort();
}

static void emu_check(int t) {
    if (!emu.configured) emu_fail("tile instruction before ldtilecfg in this thread", t);
    if (t < 0 || t > 7 || !emu.cfg.rows[t] || !emu.cfg.colsb[t]) emu_fail("tile not configured", t);
}

static void emu_loadcfg(const void *p) {
    memcpy(&emu.cfg, p, sizeof emu.cfg);
    if (emu.cfg.palette != 1) emu_fail("palette is not 1", -1);
    for (int t = 0; t < 8; t++)
        if (emu.cfg.rows[t] > 16 || emu.cfg.colsb[t] > 64 || emu.cfg.colsb[t] % 4) emu_fail("bad shape", t);
    memset(emu.t, 0, sizeof emu.t); /* ldtilecfg zeroes the tiles */
    emu.configured = true;
}

static void emu_release(void) {
    memset(&emu, 0, sizeof emu);
}

static void emu_zero(int t) {
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
}

static void emu_load(int t, const void *p, long st) {
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy(emu.t[t][r], (const uint8_t *)p + r * st, emu.cfg.colsb[t]);
}

static void emu_store(int t, void *p, long st) {
    emu_check(t);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy((uint8_t *)p + r * st, emu.t[t][r], emu.cfg.colsb[t]);
}

/* a bf16 as f32, a subnormal (exponent 0) as a zero of its sign */
static float bf16_daz(uint16_t h) {
    uint32_t u = (uint32_t)((h & 0x7F80) ? h : h & 0x8000) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float ftz(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

static void emu_dp(int c, int a, int b) {
    emu_check(c), emu_check(a), emu_check(b);
    const emu_cfg *g = &emu.cfg;
    int K = g->colsb[a] / 4, N = g->colsb[c] / 4;
    if (g->rows[b] != K || g->rows[c] != g->rows[a] || g->colsb[c] != g->colsb[b]) emu_fail("tdpbf16ps shapes", c);
    for (int m = 0; m < g->rows[c]; m++) {
        float tmp[16];
        memcpy(tmp, emu.t[c][m], sizeof tmp);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                for (int h = 0; h < 2; h++) {
                    uint16_t x, y;
                    memcpy(&x, &emu.t[a][m][4 * k + 2 * h], 2);
                    memcpy(&y, &emu.t[b][k][4 * n + 2 * h], 2);
                    tmp[n] = ftz(fmaf(bf16_daz(x), bf16_daz(y), tmp[n]));
                }
        memcpy(emu.t[c][m], tmp, sizeof tmp);
    }
}

#define AMX_TARGET
#define AMX_LOADCFG(cfg) emu_loadcfg(cfg)
#define AMX_ZERO(t) emu_zero(t)
#define AMX_LOAD(t, p, st) emu_load(t, (const void *)(p), (long)(st))
#define AMX_DP(c, a, b) emu_dp(c, a, b)
#define AMX_STORE(t, p, st) emu_store(t, (void *)(p), (long)(st))
#define AMX_RELEASE() emu_release()
#define AMX_WIDE ft_amx_emu_tile16_wide
#define AMX_NARROW ft_amx_emu_tile16_narrow
#define AMX_GEMM16 ft_amx_emu_gemm16
#define AMX_BEGIN emu_tiles_begin
#define AMX_END emu_tiles_end

void ft_amx_emu_tile16_wide(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_emu_tile16_narrow(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_emu_gemm16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M,
                       int N, int kp, float alpha, bool acc);
void ft_amx_emu_tiles_begin(void);
void ft_amx_emu_tiles_end(void);
static void emu_tiles_begin(void);
static void emu_tiles_end(void);

#include "cpu/kernels_amx.h"

void ft_amx_emu_tiles_begin(void) { emu_tiles_begin(); }
void ft_amx_emu_tiles_end(void) { emu_tiles_end(); }
/* For tests: a tilerelease in this thread that is not ours (another
 * library's, between two of our calls) */
void ft_amx_emu_foreign_release(void) { emu_release(); }
bool ft_amx_emu_tiles_held(void) { return emu.configured; }
