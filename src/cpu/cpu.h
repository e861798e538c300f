/* cpu.h — which vector instruction sets this CPU and OS support, detected
 * once at run time (cpuid + xgetbv), so one binary runs everywhere and picks
 * its fastest kernels. Tests can cap the level to exercise every path. */
#ifndef FT_CPU_H
#define FT_CPU_H

#include <signal.h>
#include <stdbool.h>

/* Kernel levels, each including the ones below it. */
enum {
    FT_CPU_GENERIC = 0, /* portable C */
    FT_CPU_AVX2 = 1,    /* AVX2 + FMA + F16C */
    FT_CPU_AVX512 = 2,  /* AVX-512 F, BW, VL, DQ (+ AVX2, FMA, F16C) */
    FT_CPU_AVX512BF16 = 3, /* + AVX512_BF16: vdpbf16ps for products in bf16 */
    FT_CPU_AMX = 4,        /* + AMX-TILE, AMX-BF16: bf16 products on the tile unit (tdpbf16ps),
                            * only once a trial tile product ran right (ft_cpu_has_amx) */
};
#define FT_CPU_NLEVELS 5
#define FT_CPU_TOP (FT_CPU_NLEVELS - 1) /* a cap that caps nothing */

bool ft_cpu_has_avx2(void);       /* AVX2, FMA and F16C, with the OS saving ymm state */
bool ft_cpu_has_avx512f(void);    /* AVX-512 F, BW, VL, DQ, with the OS saving zmm state */
bool ft_cpu_has_avx512bf16(void); /* AVX512_BF16 (vdpbf16ps) on top of ft_cpu_has_avx512f */
bool ft_cpu_has_avx512vnni(void); /* AVX512_VNNI (vpdpwssd) on top of ft_cpu_has_avx512f */
/* AMX-TILE and AMX-BF16 on top of ft_cpu_has_avx512bf16, the OS saving the
 * tile state (XCR0), Linux granting this process the tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM), and a trial ldtilecfg + tdpbf16ps on
 * known inputs giving the known result, under a SIGILL/SIGSEGV guard, in
 * the calling thread and in a thread of its own (as ft_parallel_for's
 * workers are: each loads its own tile configuration). Probed once. */
bool ft_cpu_has_amx(void);
/* One line on why the level is not amx ("AMX: not on this CPU (cpuid ...)",
 * "AMX: the kernel refused tile permission (arch_prctl: ...)", ...) or
 * that the probe passed, for verbose output. */
const char *ft_cpu_amx_note(void);

/* The level kernels dispatch on: the best the CPU supports, capped by
 * ft_cpu_force_level or else by the environment variable FTUNE_CPU
 * (generic, avx2, avx512, avx512bf16 or amx; a level above the CPU's caps
 * nothing: FTUNE_CPU=amx without working tiles runs the best level, and
 * ft_cpu_amx_note says why). */
int ft_cpu_level(void);
/* Caps the dispatch level at `level` (FT_CPU_GENERIC forces the portable
 * path; a level above the CPU's lifts FTUNE_CPU's cap); a negative level
 * goes back to FTUNE_CPU's cap, if any. For tests and benchmarks; not
 * meant to be changed while kernels run on other threads. */
void ft_cpu_force_level(int level);
/* "generic", "avx2", "avx512", "avx512bf16" or "amx". */
const char *ft_cpu_level_name(int level);

/* Nonzero while this thread holds tile state of ours: set by the amx
 * level's tiles_begin, cleared by its tiles_end (kernels.h), read by the
 * SIGILL report (ftune_report_kernel_faults) to say a fault came from the
 * tile code. */
extern __thread volatile sig_atomic_t ft_cpu_tiles_held;

#endif
