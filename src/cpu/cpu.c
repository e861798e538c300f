/* cpu.c — run-time detection of the vector instruction sets (cpuid for what
 * the CPU has, xgetbv for what the OS saves on a context switch: a CPU may
 * have AVX-512 while the kernel does not enable the zmm state). */
#include "cpu/cpu.h"
#include "ftune.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FT_X86 1
#endif

enum { F_AVX2 = 1, F_AVX512 = 2, F_AVX512BF16 = 4, F_DETECTED = 1 << 30 };

static int features;    /* F_* bits, F_DETECTED once filled in */
static int env_level;   /* $FTUNE_CPU's cap, or -1; set with features */
static int forced = -1; /* ft_cpu_force_level's cap, or -1 */

#ifdef FT_X86
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static int detect(void) {
    unsigned a, b, c, d;
    int f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    bool osxsave = c >> 27 & 1, avx = c >> 28 & 1, fma = c >> 12 & 1, f16c = c >> 29 & 1;
    if (!osxsave || !avx) return 0;
    unsigned long long xcr0 = xgetbv0();
    bool ymm_os = (xcr0 & 0x6) == 0x6;   /* SSE and AVX state */
    bool zmm_os = (xcr0 & 0xE6) == 0xE6; /* + opmask, upper zmm0-15, zmm16-31 */
    unsigned max_leaf = __get_cpuid_max(0, 0);
    if (max_leaf < 7 || !ymm_os) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    bool avx2 = b >> 5 & 1, avx512f = b >> 16 & 1, avx512dq = b >> 17 & 1;
    bool avx512bw = b >> 30 & 1, avx512vl = b >> 31 & 1;
    unsigned sub_leaves = a;
    if (avx2 && fma && f16c) f |= F_AVX2;
    if ((f & F_AVX2) && zmm_os && avx512f && avx512dq && avx512bw && avx512vl) f |= F_AVX512;
    if ((f & F_AVX512) && sub_leaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (a >> 5 & 1) f |= F_AVX512BF16;
    }
    return f;
}
#else
static int detect(void) { return 0; }
#endif

/* $FTUNE_CPU (generic, avx2, avx512, avx512bf16) caps the level for a whole run, to
 * compare paths without rebuilding; ft_cpu_force_level overrides it. Read
 * once, with the features (the env write is ordered before the features
 * store that publishes it). */
static int env_cap(void) {
    const char *e = getenv("FTUNE_CPU");
    if (!e || !*e) return -1;
    for (int lv = FT_CPU_GENERIC; lv <= FT_CPU_TOP; lv++)
        if (!strcmp(e, ft_cpu_level_name(lv))) return lv;
    return -1;
}

/* Detection is idempotent, so threads racing here store the same value. */
static int cpu_features(void) {
    int f = __atomic_load_n(&features, __ATOMIC_RELAXED);
    if (!(f & F_DETECTED)) {
        __atomic_store_n(&env_level, env_cap(), __ATOMIC_RELAXED);
        f = detect() | F_DETECTED;
        __atomic_store_n(&features, f, __ATOMIC_RELAXED);
    }
    return f;
}

bool ft_cpu_has_avx2(void) { return cpu_features() & F_AVX2; }
bool ft_cpu_has_avx512f(void) { return cpu_features() & F_AVX512; }
bool ft_cpu_has_avx512bf16(void) { return cpu_features() & F_AVX512BF16; }

int ft_cpu_level(void) {
    int f = cpu_features();
    int level = f & F_AVX512BF16 ? FT_CPU_AVX512BF16
              : f & F_AVX512     ? FT_CPU_AVX512
              : f & F_AVX2       ? FT_CPU_AVX2
                                 : FT_CPU_GENERIC;
    int cap = __atomic_load_n(&forced, __ATOMIC_RELAXED);
    if (cap < 0) cap = __atomic_load_n(&env_level, __ATOMIC_RELAXED);
    return cap >= 0 && cap < level ? cap : level;
}

void ft_cpu_force_level(int level) { __atomic_store_n(&forced, level < 0 ? -1 : level, __ATOMIC_RELAXED); }

const char *ft_cpu_level_name(int level) {
    switch (level) {
    case FT_CPU_GENERIC: return "generic";
    case FT_CPU_AVX2: return "avx2";
    case FT_CPU_AVX512: return "avx512";
    case FT_CPU_AVX512BF16: return "avx512bf16";
    default: return "?";
    }
}

FTUNE_API const char *ftune_kernel_level(void) { return ft_cpu_level_name(ft_cpu_level()); }
