/* kernels_amx.c — kernels_amx.h's micro-kernel on the real tile unit
 * (ldtilecfg, tilezero, tileloadd, tdpbf16ps, tilestored through gcc's
 * intrinsics). The functions carry the target attribute (no global -march),
 * so this compiles everywhere and runs only where cpu.c's probe passed. */
#include "cpu/kernels.h"
#include "cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* gcc 12's tileloadd asm takes only the address as an input and declares
 * no memory read, and its ldtilecfg reads 8 of the configuration's 64
 * bytes as far as the compiler knows: stores into what they read (the k
 * tail's local tiles, the configuration, C before an add) could be dropped
 * or moved past them. A compiler barrier before each makes them land
 * first; it costs no instruction. (tilestored declares its memory write.) */
#define AMX_FENCE() __asm__ volatile("" ::: "memory")
/* (avx512f too: the amx level has it, and gemm16's edge loops vectorize) */
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))
#define AMX_LOADCFG(cfg) do { AMX_FENCE(); _tile_loadconfig(cfg); } while (0)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, p, st) do { AMX_FENCE(); _tile_loadd(t, (const void *)(p), (long)(st)); } while (0)
#define AMX_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_STORE(t, p, st) _tile_stored(t, (void *)(p), (long)(st))
#define AMX_RELEASE() _tile_release()
#define AMX_WIDE ft_amx_tile16_wide
#define AMX_NARROW ft_amx_tile16_narrow
#define AMX_GEMM16 ft_amx_gemm16
#define AMX_BEGIN amx_load_config
#define AMX_END amx_release

void ft_amx_tile16_wide(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_tile16_narrow(float *cb, const uint32_t *bp, const uint32_t *ap, int64_t lda, int kp, bool add);
void ft_amx_gemm16(float *C, int64_t ldc, const uint32_t *A, int64_t lda, const uint32_t *B, int64_t ldb, int M, int N,
                   int kp, float alpha, bool acc);
void ft_amx_tiles_begin(void);
void ft_amx_tiles_end(void);
static void amx_load_config(void);
static void amx_release(void);

#include "cpu/kernels_amx.h"

/* the flag brackets the tile state, for the SIGILL report (cpu.h) */
void ft_amx_tiles_begin(void) {
    ft_cpu_tiles_held = 1;
    amx_load_config();
}
void ft_amx_tiles_end(void) {
    amx_release();
    ft_cpu_tiles_held = 0;
}

#endif
