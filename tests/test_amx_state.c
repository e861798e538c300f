/* test_amx_state.c — the amx level's tile state belongs to each call
 * (kernels.h's tiles_begin/tiles_end), never to a thread: another tile user
 * in the process may release the tiles or load a configuration of its own
 * between two of our products, on the calling thread or on the pool's
 * workers, and the next product must give the same bits as before; and
 * after a product returns, no thread of ours holds tile state (we leave
 * the tiles released, as we found them). Also: a forked child and a thread
 * created after the probe run the level, and a SIGILL in the tile code
 * ends the process with one line naming the level and FTUNE_CPU.
 *
 * Everywhere the avx512bf16 level runs, on the emulated tile unit (whose
 * tilerelease returns the tiles to unconfigured: a tile instruction then
 * aborts, as the real one raises SIGILL); where the AMX probe passed, also
 * on the real one with a raw tilerelease and a foreign ldtilecfg, and,
 * built with DNNL=1 (libdnnl-dev), with a oneDNN bf16 matmul between our
 * products: oneDNN's AMX kernels end with tilerelease. */
#include "check.h"
#include "check_child.h"
#include "core/core.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "ftune.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif
#ifdef FT_DNNL
#include <dnnl.h>
#endif

/* A product the tile16 kernels run: the forward's X·Wᵀ with X f32 and W
 * bf16 rows, off the tile edges (M 70 = 2 panels of 32 + 6, N 50 = a wide
 * and a narrow strip, K 300 = a 256 slice and a tail of 22 pairs). */
enum { M = 70, N = 50, K = 300 };
static float xs[M * K], c_ref[M * N];
static uint16_t ws[N * K];
static float *scratch;

static bool product(const ft_kernel_isa *isa, int n_threads, float *c) {
    ft_kernels_force(isa);
    ft_mat A = ft_mat_f32(xs, K, 1), B = ft_mat_rows_t(ws, FT_BF16, K);
    bool ok = ft_gemm_in(FT_BF16, c, N, 1, &A, &B, M, N, K, 1.0f, false, n_threads, scratch, FT_GEMM_SCRATCH_FLOATS);
    ft_kernels_force(NULL);
    return ok;
}

static bool same_as_ref(const ft_kernel_isa *isa, int n_threads) {
    float c[M * N];
    return product(isa, n_threads, c) && !memcmp(c, c_ref, sizeof c);
}

/* ------------------------------------------------ foreign tile users */

typedef void (*foreign_fn)(void);

#ifdef HAVE_X86
__attribute__((target("amx-tile"))) static void raw_release(void) { _tile_release(); }

/* another configuration left loaded: 4 tiles of 8 rows × 32 bytes */
__attribute__((target("amx-tile"))) static void raw_other_config(void) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (int t = 0; t < 4; t++) cfg[16 + 2 * t] = 32, cfg[48 + t] = 8;
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(cfg);
}

/* whether this thread holds tile state: sttilecfg stores zeros when the
 * tiles are in their initial (released) state */
__attribute__((target("amx-tile"))) static bool raw_tiles_held(void) {
    uint8_t cfg[64] __attribute__((aligned(64)));
    memset(cfg, 0xFF, sizeof cfg);
    _tile_storeconfig(cfg);
    __asm__ volatile("" ::: "memory");
    return cfg[0] != 0;
}
#endif

static void foreign_task(void *ctx, int task, int thread) {
    (void)task, (void)thread;
    (*(foreign_fn *)ctx)();
}

typedef struct {
    bool (*held)(void);
    int held_count;
} held_ctx;

static void held_task(void *ctx, int task, int thread) {
    (void)task, (void)thread;
    held_ctx *h = ctx;
    if (h->held()) __atomic_add_fetch(&h->held_count, 1, __ATOMIC_RELAXED);
}

/* One table against one foreign tile user: a product, the foreign use on
 * this thread, a product; the foreign use on every worker (as many tasks
 * as threads, each a worker's, repeated so each of 3 threads gets some),
 * products on 1 and 3 threads; each the reference bits. Then (held given:
 * the foreign use released the tiles) no thread holds tile state. */
static void foreign_case(const char *what, const ft_kernel_isa *isa, foreign_fn foreign, bool (*held)(void)) {
    CHECKF(same_as_ref(isa, 3), "%s: first product", what);
    foreign();
    CHECKF(same_as_ref(isa, 1), "%s: after a foreign use on this thread", what);
    for (int r = 0; r < 4; r++) ft_parallel_for(3, 12, foreign_task, &foreign);
    CHECKF(same_as_ref(isa, 3), "%s: after a foreign use on the workers", what);
    foreign();
    for (int r = 0; r < 4; r++) ft_parallel_for(3, 12, foreign_task, &foreign);
    CHECKF(same_as_ref(isa, 3), "%s: after foreign uses everywhere", what);
    if (!held) return; /* a foreign configuration left loaded is the foreign user's to release */
    held_ctx h = { .held = held };
    CHECKF(!held(), "%s: this thread still holds tile state after the product", what);
    for (int r = 0; r < 4; r++) ft_parallel_for(3, 12, held_task, &h);
    CHECKF(h.held_count == 0, "%s: %d worker tasks found tile state held after the products", what, h.held_count);
}

static void emu_release(void) { ft_amx_emu_foreign_release(); }

/* the emulated table's reference: a first product on fresh threads */
static void test_foreign_release_emulated(void) {
    if (!ft_cpu_has_avx512bf16()) {
        check_skip(CHECK_HARDWARE, NULL, "no avx512bf16, which the amx tables' other kernels need");
        return;
    }
    CHECK(product(&ft_kernels_amx_emulated, 1, c_ref));
    foreign_case("emulated tiles, tilerelease", &ft_kernels_amx_emulated, emu_release, ft_amx_emu_tiles_held);
    printf("  emulated tile unit: a tilerelease between products, on this thread and on 3 workers: same bits\n");
}

#ifdef FT_DNNL
/* a oneDNN bf16 matmul, 64 × 64 × 64 (its AMX kernel where oneDNN has one
 * for this CPU: it loads its own tile configuration and releases it) */
static void onednn_matmul(void) {
    static dnnl_engine_t eng;
    static dnnl_stream_t strm;
    static dnnl_primitive_t prim;
    static dnnl_memory_t a, b, c;
    static uint16_t ab[64 * 64], bb[64 * 64];
    static float cb[64 * 64];
    if (!prim) {
        for (int i = 0; i < 64 * 64; i++) ab[i] = bb[i] = ft_f32_to_bf16((float)(i % 7) - 3.0f);
        dnnl_dims_t d = { 64, 64 };
        dnnl_memory_desc_t md16, md32;
        bool ok = dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success &&
                  dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) == dnnl_success &&
                  dnnl_memory_desc_init_by_tag(&md16, 2, d, dnnl_bf16, dnnl_ab) == dnnl_success &&
                  dnnl_memory_desc_init_by_tag(&md32, 2, d, dnnl_f32, dnnl_ab) == dnnl_success;
        dnnl_matmul_desc_t mm;
        dnnl_primitive_desc_t pd;
        ok = ok && dnnl_matmul_desc_init(&mm, &md16, &md16, NULL, &md32) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &mm, NULL, eng, NULL) == dnnl_success &&
             dnnl_primitive_create(&prim, pd) == dnnl_success && dnnl_primitive_desc_destroy(pd) == dnnl_success &&
             dnnl_memory_create(&a, &md16, eng, ab) == dnnl_success &&
             dnnl_memory_create(&b, &md16, eng, bb) == dnnl_success &&
             dnnl_memory_create(&c, &md32, eng, cb) == dnnl_success;
        if (!ok) {
            CHECKF(0, "oneDNN: could not set up a bf16 matmul");
            return;
        }
    }
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, a }, { DNNL_ARG_WEIGHTS, b }, { DNNL_ARG_DST, c } };
    CHECK(dnnl_primitive_execute(prim, strm, 3, args) == dnnl_success && dnnl_stream_wait(strm) == dnnl_success);
    float want = 0;
    for (int k = 0; k < 64; k++) want += ((float)(k % 7) - 3.0f) * ((float)((k * 64) % 7) - 3.0f);
    CHECKF(cb[0] == want, "oneDNN's matmul gave %g, want %g", cb[0], want);
}
#endif

static void test_foreign_release_real(void) {
#ifdef HAVE_X86
    if (!ft_cpu_has_amx()) {
        check_skip(CHECK_HARDWARE, NULL, "%s: the real tile unit is not usable here", ft_cpu_amx_note());
        return;
    }
    const ft_kernel_isa *isa = ft_kernels_for_level(FT_CPU_AMX);
    CHECK(product(isa, 1, c_ref));
    foreign_case("real tiles, raw tilerelease", isa, raw_release, raw_tiles_held);
    foreign_case("real tiles, another configuration", isa, raw_other_config, NULL);
    raw_release();
#ifdef FT_DNNL
    foreign_case("real tiles, a oneDNN bf16 matmul", isa, onednn_matmul, raw_tiles_held);
    printf("  real tile unit: a raw tilerelease, another tile configuration and a oneDNN bf16 matmul between "
           "products: same bits, no tile state left held\n");
#else
    printf("  real tile unit: a raw tilerelease and another tile configuration between products: same bits, no tile "
           "state left held\n");
    check_skip(CHECK_TOOL, "onednn_between_products",
               "built without oneDNN (DNNL=0; scripts/setup.sh installs libdnnl-dev): the oneDNN matmul between "
               "products did not run");
#endif
#else
    check_skip(CHECK_HARDWARE, NULL, "not an x86-64 build");
#endif
}

/* ------------------------------------------------ fork, a new thread */

static const ft_kernel_isa *level_tables[2];
static float level_refs[2][M * N]; /* each table's own bits: the real unit's sums need not be its emulation's */
static int n_level_tables;

static void child_products(void *arg) {
    (void)arg;
    for (int i = 0; i < n_level_tables; i++) {
        float c[M * N];
        CHECK(product(level_tables[i], 1, c) && !memcmp(c, level_refs[i], sizeof c));
        CHECK(product(level_tables[i], 2, c) && !memcmp(c, level_refs[i], sizeof c));
    }
}

static void *thread_products(void *arg) {
    *(bool *)arg = true;
    for (int i = 0; i < n_level_tables; i++) {
        float c[M * N];
        if (!product(level_tables[i], 1, c) || memcmp(c, level_refs[i], sizeof c)) *(bool *)arg = false;
    }
    return NULL;
}

/* the probe ran in the parent before the fork and before the thread */
static void test_fork_and_new_thread(void) {
    n_level_tables = 0;
    if (ft_cpu_has_avx512bf16()) level_tables[n_level_tables++] = &ft_kernels_amx_emulated;
    if (ft_cpu_has_amx()) level_tables[n_level_tables++] = ft_kernels_for_level(FT_CPU_AMX);
    if (!n_level_tables) {
        check_skip(CHECK_HARDWARE, NULL, "no avx512bf16: no amx table runs here");
        return;
    }
    for (int i = 0; i < n_level_tables; i++) CHECK(product(level_tables[i], 1, level_refs[i]));
    in_child(child_products, NULL);
    pthread_t th;
    bool ok = false;
    CHECK(pthread_create(&th, NULL, thread_products, &ok) == 0 && pthread_join(th, NULL) == 0);
    CHECKF(ok, "a thread created after the probe gave other bits");
    printf("  %s: a forked child and a thread created after the probe give the same bits\n",
           n_level_tables == 2 ? "emulated and real tiles" : "emulated tiles");
}

/* ------------------------------------------------ the SIGILL report */

/* A child with the report installed faults inside the tile code (the real
 * unit: a tile instruction after a foreign tilerelease, between our
 * tiles_begin and the kernel; elsewhere SIGILL raised while the flag says
 * the thread holds tiles, and once outside them): it must die by SIGILL
 * with the one line on stderr. */
static void fault_child(int real, int in_tiles, char *out, size_t cap, int *status) {
    int fd[2];
    out[0] = 0;
    if (pipe(fd) != 0) {
        CHECK(0);
        return;
    }
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], STDERR_FILENO);
        close(fd[0]);
        ftune_report_kernel_faults();
        if (real) {
#ifdef HAVE_X86
            const ft_kernel_isa *isa = ft_kernels_for_level(FT_CPU_AMX);
            float cb[32 * 32];
            uint32_t ab[32 * 128], bb[128 * 32];
            memset(ab, 0, sizeof ab), memset(bb, 0, sizeof bb);
            isa->tiles_begin();
            raw_release(); /* the tiles taken away after our begin: the next tile instruction faults */
            isa->tile16[0](cb, bb, ab, 128, 16, false);
#endif
        } else {
            ft_cpu_tiles_held = in_tiles;
            raise(SIGILL);
        }
        _exit(0); /* not reached: the report lets SIGILL end the process */
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(fd[0]);
    CHECK(waitpid(pid, status, 0) == pid);
}

static void test_sigill_report(void) {
    char out[512];
    int st = 0;
    int lv = ft_cpu_level();
    char want_level[64];
    snprintf(want_level, sizeof want_level, "at kernel level %s", ft_cpu_level_name(lv));
    fault_child(0, 0, out, sizeof out, &st);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGILL, "status 0x%x", st);
    const char *nl = strchr(out, '\n');
    CHECKF(strstr(out, "SIGILL") && strstr(out, want_level) && nl && !nl[1] &&
               (lv == FT_CPU_GENERIC || strstr(out, "FTUNE_CPU=")),
           "outside the tiles: \"%s\"", out);
    fault_child(0, 1, out, sizeof out, &st);
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGILL, "status 0x%x", st);
    CHECKF(strstr(out, "tile instruction") && strstr(out, "FTUNE_CPU=avx512bf16"), "in the tiles: \"%s\"", out);
    printf("  raised SIGILL: \"%.*s\"\n", (int)strcspn(out, "\n"), out);
    if (ft_cpu_has_amx()) {
        fault_child(1, 1, out, sizeof out, &st);
        CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGILL, "status 0x%x", st);
        CHECKF(strstr(out, "tile instruction") && strstr(out, "FTUNE_CPU=avx512bf16"), "real tile fault: \"%s\"", out);
        printf("  a real tile fault (tiles released under the kernel): the same line, killed by SIGILL\n");
    } else {
        check_skip(CHECK_HARDWARE, "real_tile_fault", "%s: no real tile fault to provoke", ft_cpu_amx_note());
    }
}

int main(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    for (int i = 0; i < M * K; i++) xs[i] = ft_rng_normal(&rng);
    for (int i = 0; i < N * K; i++) ws[i] = ft_f32_to_bf16(ft_rng_normal(&rng));
    scratch = ft_aligned_alloc(FT_GEMM_SCRATCH_FLOATS * sizeof(float));
    if (!scratch) return 1;
    printf("  %s\n", ft_cpu_amx_note());
    RUN(test_foreign_release_emulated);
    RUN(test_foreign_release_real);
    RUN(test_fork_and_new_thread);
    RUN(test_sigill_report);
    free(scratch);
    CHECK_EXIT();
}
