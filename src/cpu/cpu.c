/* cpu.c — run-time detection of the vector instruction sets (cpuid for what
 * the CPU has, xgetbv for what the OS saves on a context switch: a CPU may
 * have AVX-512 while the kernel does not enable the zmm state), and for AMX
 * a real trial of the tile unit (cpuid and XCR0 are not enough: Linux
 * must grant the tile state per process, and a VM may list AMX yet fault). */
#include "cpu/cpu.h"
#include "ftune.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define FT_X86 1
#endif

enum { F_AVX2 = 1, F_AVX512 = 2, F_AVX512BF16 = 4, F_AMX = 8, F_AVX512VNNI = 16, F_DETECTED = 1 << 30 };

__thread volatile sig_atomic_t ft_cpu_tiles_held;

static char amx_note[160] = "AMX: not probed (not an x86-64 build)";

static int features;    /* F_* bits, F_DETECTED once filled in */
static int env_level;   /* $FTUNE_CPU's cap, or -1; set with features */
static int forced = -1; /* ft_cpu_force_level's cap, or -1 */

#ifdef FT_X86
static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* ------------------------------------------------ the AMX probe */

/* The 64-byte tile configuration (palette 1): tiles 0-2 of 16 rows × 64
 * bytes, enough for one C (16×16 f32) += A (16 × 16 bf16 pairs) · B. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_probe_cfg;
_Static_assert(sizeof(amx_probe_cfg) == 64, "the tile configuration is 64 bytes");

static __thread sigjmp_buf *probe_jmp; /* set only while this thread runs the trial */

static void probe_fault(int sig) {
    if (probe_jmp) siglongjmp(*probe_jmp, sig);
    signal(sig, SIG_DFL); /* not ours (another thread's fault during the probe): die as without us */
    raise(sig);
}

/* One tdpbf16ps on known inputs: A(m, pair k) = (m+1, 1), B(pair k, n) =
 * (n+1, k+1), so C(m, n) = Σ_k (m+1)(n+1) + (k+1) = 16(m+1)(n+1) + 136:
 * small integers, exact in bf16 and f32 whatever the order of the sums. */
__attribute__((target("amx-tile,amx-bf16"))) static void probe_tiles(float *c) {
    amx_probe_cfg cfg = { .palette = 1 };
    for (int t = 0; t < 3; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    uint32_t a[16][16], b[16][16];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float lo = (float)(i + 1), one = 1.0f, n1 = (float)(j + 1), k1 = (float)(i + 1);
            uint32_t ulo, uone, un, uk;
            memcpy(&ulo, &lo, 4), memcpy(&uone, &one, 4), memcpy(&un, &n1, 4), memcpy(&uk, &k1, 4);
            a[i][j] = ulo >> 16 | (uone >> 16) << 16;  /* row m = i, pair k = j */
            b[i][j] = un >> 16 | (uk >> 16) << 16;      /* pair row k = i, column n = j */
        }
    /* gcc's ldtilecfg and tileloadd asm declare (almost) no memory read:
     * a compiler barrier so the stores above land first (kernels_amx.c) */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_loadd(1, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, c, 64);
    _tile_release();
}

/* The trial in the calling thread, under a SIGILL and SIGSEGV guard (the
 * old handlers restored); 0, or the signal it raised, or -1 for a wrong
 * result. */
static int probe_trial(void) {
    struct sigaction sa, old_ill, old_segv;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = probe_fault;
    sigemptyset(&sa.sa_mask);
    sigjmp_buf jb;
    float c[16 * 16];
    volatile int rc = 0; /* read after a siglongjmp */
    sigaction(SIGILL, &sa, &old_ill);
    sigaction(SIGSEGV, &sa, &old_segv);
    int sig = sigsetjmp(jb, 1);
    if (sig == 0) {
        probe_jmp = &jb;
        probe_tiles(c);
        for (int m = 0; m < 16 && !rc; m++)
            for (int n = 0; n < 16; n++)
                if (c[m * 16 + n] != (float)(16 * (m + 1) * (n + 1) + 136)) rc = -1;
    } else {
        rc = sig;
    }
    probe_jmp = NULL;
    sigaction(SIGILL, &old_ill, NULL);
    sigaction(SIGSEGV, &old_segv, NULL);
    return rc;
}

static void *probe_thread(void *arg) {
    *(int *)arg = probe_trial();
    return NULL;
}

static void trial_note(int rc, const char *where) {
    if (rc == -1)
        snprintf(amx_note, sizeof amx_note, "AMX: a trial tile product in %s gave wrong numbers; using avx512bf16", where);
    else
        snprintf(amx_note, sizeof amx_note, "AMX: a trial tile product in %s raised %s; using avx512bf16", where,
                 rc == SIGILL ? "SIGILL" : "SIGSEGV");
}

/* cpuid said AMX-TILE and AMX-BF16: does the rest hold? (amx_note says
 * which step failed.) Neither the permission nor the trial can be undone,
 * and neither needs to be: the permission only lets this process use the
 * tile state, and tilerelease leaves the thread's tiles as they were. */
static bool amx_usable(unsigned long long xcr0, unsigned max_leaf) {
    unsigned a, b, c, d;
    if (max_leaf < 0xD) {
        snprintf(amx_note, sizeof amx_note, "AMX: cpuid has no leaf 0xD (state components); using avx512bf16");
        return false;
    }
    __cpuid_count(0xD, 0, a, b, c, d);
    if ((a >> 17 & 3) != 3) {
        snprintf(amx_note, sizeof amx_note, "AMX: cpuid leaf 0xD lists no XTILECFG/XTILEDATA state; using avx512bf16");
        return false;
    }
    if ((xcr0 >> 17 & 3) != 3) {
        snprintf(amx_note, sizeof amx_note, "AMX: the OS does not enable the tile state (XCR0 = %#llx); using avx512bf16",
                 xcr0);
        return false;
    }
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux 5.16+
     * refuses tile data to a process that did not ask (SIGILL at the first
     * tile load); the grant is per process, for every thread */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        snprintf(amx_note, sizeof amx_note, "AMX: the kernel refused tile permission (arch_prctl: %s); using avx512bf16",
                 strerror(errno));
        return false;
    }
    int rc = probe_trial();
    if (rc) {
        trial_note(rc, "the main thread");
        return false;
    }
    /* again in a thread of its own, as the workers will run it (a VM that
     * faulted at a worker's first tile load is why) */
    int trc = 0;
    pthread_t th;
    if (pthread_create(&th, NULL, probe_thread, &trc) != 0) {
        snprintf(amx_note, sizeof amx_note, "AMX: could not start a thread for the tile trial; using avx512bf16");
        return false;
    }
    pthread_join(th, NULL);
    if (trc) {
        trial_note(trc, "a second thread");
        return false;
    }
    snprintf(amx_note, sizeof amx_note, "AMX: tile permission granted, trial tdpbf16ps right in two threads");
    return true;
}

static int detect(void) {
    unsigned a, b, c, d;
    int f = 0;
    snprintf(amx_note, sizeof amx_note, "AMX: not on this CPU (no AVX state or no cpuid leaf 7)");
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
    bool amx_tile = d >> 24 & 1, amx_bf16 = d >> 22 & 1; /* EDX */
    unsigned sub_leaves = a;
    if (avx2 && fma && f16c) f |= F_AVX2;
    if ((f & F_AVX2) && zmm_os && avx512f && avx512dq && avx512bw && avx512vl) f |= F_AVX512;
    if ((f & F_AVX512) && (c >> 11 & 1)) f |= F_AVX512VNNI; /* ECX bit 11 */
    if ((f & F_AVX512) && sub_leaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (a >> 5 & 1) f |= F_AVX512BF16;
    }
    if (!amx_tile || !amx_bf16) {
        snprintf(amx_note, sizeof amx_note, "AMX: not on this CPU (cpuid leaf 7: AMX-TILE %d, AMX-BF16 %d)", amx_tile,
                 amx_bf16);
    } else if (!(f & F_AVX512BF16)) { /* the amx level keeps avx512bf16's other kernels */
        snprintf(amx_note, sizeof amx_note, "AMX: the CPU has tiles but not AVX512_BF16 (or the OS saves no zmm state)");
    } else if (amx_usable(xcr0, max_leaf)) {
        f |= F_AMX;
    }
    return f;
}
#else
static int detect(void) { return 0; }
#endif

/* $FTUNE_CPU (generic, avx2, avx512, avx512bf16, amx) caps the level for a whole run, to
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

/* Once per process (pthread_once: the AMX probe installs signal handlers
 * and must not race itself); later calls read the published value. */
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static void detect_all(void) {
    __atomic_store_n(&env_level, env_cap(), __ATOMIC_RELAXED);
    __atomic_store_n(&features, detect() | F_DETECTED, __ATOMIC_RELEASE);
}

static int cpu_features(void) {
    int f = __atomic_load_n(&features, __ATOMIC_ACQUIRE);
    if (!(f & F_DETECTED)) {
        pthread_once(&detect_once, detect_all);
        f = __atomic_load_n(&features, __ATOMIC_ACQUIRE);
    }
    return f;
}

bool ft_cpu_has_avx2(void) { return cpu_features() & F_AVX2; }
bool ft_cpu_has_avx512f(void) { return cpu_features() & F_AVX512; }
bool ft_cpu_has_avx512bf16(void) { return cpu_features() & F_AVX512BF16; }
bool ft_cpu_has_amx(void) { return cpu_features() & F_AMX; }
bool ft_cpu_has_avx512vnni(void) { return cpu_features() & F_AVX512VNNI; }

const char *ft_cpu_amx_note(void) {
    cpu_features();
    return amx_note;
}

int ft_cpu_level(void) {
    int f = cpu_features();
    int level = f & F_AMX          ? FT_CPU_AMX
              : f & F_AVX512BF16 ? FT_CPU_AVX512BF16
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
    case FT_CPU_AMX: return "amx";
    default: return "?";
    }
}

FTUNE_API const char *ftune_kernel_level(void) { return ft_cpu_level_name(ft_cpu_level()); }
FTUNE_API const char *ftune_kernel_note(void) { return ft_cpu_amx_note(); }

/* ------------------------------------------------ the SIGILL report */

/* Everything the handler writes is made before any fault: a signal handler
 * may call only async-signal-safe functions (write, raise, sigaction), so
 * it picks one of these lines and formats nothing. */
static char fault_line[FT_CPU_NLEVELS][2][200];

static void on_kernel_fault(int sig) {
    int lv = ft_cpu_level(); /* detected at install: atomic loads only */
    const char *m = fault_line[lv][ft_cpu_tiles_held ? 1 : 0];
    size_t n = 0;
    while (m[n]) n++;
    ssize_t w = write(STDERR_FILENO, m, n);
    (void)w;
    raise(sig); /* SA_RESETHAND | SA_NODEFER: the default action now, in this thread */
}

FTUNE_API void ftune_report_kernel_faults(void) {
    cpu_features(); /* the level is known before any fault: the handler only reads it */
    for (int lv = 0; lv < FT_CPU_NLEVELS; lv++) {
        const char *lower = lv == FT_CPU_AMX ? "avx512bf16" : lv > FT_CPU_GENERIC ? ft_cpu_level_name(lv - 1) : NULL;
        snprintf(fault_line[lv][0], sizeof fault_line[lv][0],
                 "ftune: fatal: illegal instruction (SIGILL) at kernel level %s%s%s%s\n", ft_cpu_level_name(lv),
                 lower ? "; FTUNE_CPU=" : "", lower ? lower : "", lower ? " runs the level below it" : "");
        snprintf(fault_line[lv][1], sizeof fault_line[lv][1],
                 "ftune: fatal: the CPU refused a tile instruction (SIGILL) in the amx kernel level after its probe "
                 "passed (the tile state was taken away); FTUNE_CPU=avx512bf16 runs without the tiles\n");
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_kernel_fault;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGILL, &sa, NULL);
}
