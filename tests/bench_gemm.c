/* bench_gemm.c — this machine's peaks and ftune's matrix products on the
 * Linear and LoRA shapes of the llama-110m and llama-3.2-1b presets: fp32
 * FMA and VDPBF16PS peaks (and TDPBF16PS where the amx level's probe
 * passed, with the cost of loading and releasing the tile state once) and
 * read bandwidth on 1 and n threads, then per
 * shape GFLOP/s of ft_gemm (f32 compute, bf16 weights widened), ft_gemm_in
 * in bf16 and, built with DNNL=1, oneDNN's bf16 matmul (bf16 operands,
 * f32 accumulation and output), interleaved round by round; medians.
 * Internal (it calls the kernels directly), so built from tests/ by
 * `make bench-gemm`, not run by the test suite.
 *   build/bench_gemm [THREADS=2] [ROUNDS=3] [SECONDS_PER_MEASURE=0.1] [KINDS: e.g. dw,lora_dB]
 *   build/bench_gemm --dnnl-threads [THREADS=2]   oneDNN on 1 and THREADS threads: same bits?
 * Prints one line per measurement: tab-separated key=value pairs. */
#include "../bench/bench_util.h"
#include "core/parallel.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef FT_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

/* ------------------------------------------------------------ peaks */

#define PEAK_ITERS 20000000L

/* 24 independent chains: enough to cover latency × throughput */
#define CHAINS 24
__attribute__((target("avx512f,fma"))) static double fma_loop(long iters) {
    __m512 a[CHAINS], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 24
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_loop(long iters) {
    __m512 a[CHAINS];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x33803380);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 24
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    return (double)_mm512_reduce_add_ps(s);
}

/* TDPBF16PS on four independent C tiles (16×16 f32 += 16×32 bf16 ·
 * 32×16 bf16: 16384 flops each); only where ft_cpu_has_amx() passed, which
 * also got the process its tile permission. Each thread loads its own
 * tile configuration, as the kernels' threads do. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

__attribute__((target("amx-tile,amx-bf16"))) static double tdpbf16_loop(long iters) {
    tile_cfg cfg = { .palette = 1 };
    for (int t = 0; t < 6; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    uint32_t a[16 * 16], b[16 * 16];
    for (int i = 0; i < 16 * 16; i++) a[i] = 0x3F803F80, b[i] = 0x33803380; /* 1 and 6e-8: the sums stay finite */
    float c[16 * 16];
    __asm__ volatile("" ::: "memory"); /* gcc's tile asm declares no memory read (kernels_amx.c) */
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    for (long it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, c, 64);
    _tile_release();
    return c[0];
}

typedef struct {
    int kind; /* 0 fma, 1 dpbf16, 2 read, 3 tdpbf16 */
    long iters;
    const float *buf;
    size_t n;
    double sink;
} peak_job;

__attribute__((target("avx512f"))) static double read_loop(const float *p, size_t n, long reps) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (long r = 0; r < reps; r++)
        for (size_t i = 0; i + 64 <= n; i += 64) {
            s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
            s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
            s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
            s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
        }
    return (double)_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void *peak_thread(void *v) {
    peak_job *j = v;
    j->sink = j->kind == 0   ? fma_loop(j->iters)
            : j->kind == 1 ? dpbf16_loop(j->iters)
            : j->kind == 3 ? tdpbf16_loop(j->iters)
                           : read_loop(j->buf, j->n, j->iters);
    return NULL;
}

/* GFLOP/s (kind 0, 1, 3) or GB/s (kind 2) of kind on nt threads at once */
static double peak(int kind, int nt, const float *buf, size_t n) {
    pthread_t th[64];
    peak_job jobs[64];
    long iters = kind == 2 ? 4 : kind == 3 ? PEAK_ITERS / 16 : PEAK_ITERS / (kind == 1 ? 2 : 1);
    double t0 = bench_now();
    for (int i = 0; i < nt; i++) {
        /* each thread reads its own part of the buffer */
        jobs[i] = (peak_job){ .kind = kind, .iters = iters, .buf = buf + i * (n / nt), .n = n / nt };
        pthread_create(&th[i], NULL, peak_thread, &jobs[i]);
    }
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    double dt = bench_now() - t0;
    if (kind == 2) return (double)nt * (n / nt) * sizeof(float) * iters / dt * 1e-9;
    if (kind == 3) return (double)nt * iters * 4 * 16384 / dt * 1e-9;
    return (double)nt * iters * CHAINS * (kind == 0 ? 32 : 64) / dt * 1e-9;
}

/* ------------------------------------------------------------ shapes */

enum { FWD, DX, DW, LORA_U, LORA_OUT, LORA_DA, LORA_DB, LORA_G, LORA_DX };
static const char *kind_names[] = { "fwd", "dx", "dw", "lora_u", "lora_out", "lora_dA", "lora_dB", "lora_g", "lora_dx" };

typedef struct {
    const char *model;
    int in, out, T, kind;
} shape;

#define R 16

/* One product of a shape: C (M, N) = A·B with the operands' layouts as
 * linear.c and lora.c pass them. */
typedef struct {
    int M, N, K;
    ft_mat A, B;
    int64_t crs, ccs;
    bool acc;
    float alpha;
} product;

typedef struct {
    float *x, *dy, *u, *g, *la, *lb, *c;
    uint16_t *w;
} buffers;

static product make_product(const shape *s, const buffers *b) {
    int IC = s->in, OC = s->out, T = s->T;
    product p = { .alpha = 1.0f };
    switch (s->kind) {
    case FWD: {
        bool transposed = (double)T * (IC + OC) < (double)IC * OC; /* as linear.c's base_forward */
        if (transposed)
            p = (product){ OC, T, IC, ft_mat_rows(b->w, FT_BF16, IC), ft_mat_f32(b->x, 1, IC), 1, OC, false, 1 };
        else
            p = (product){ T, OC, IC, ft_mat_f32(b->x, IC, 1), ft_mat_rows_t(b->w, FT_BF16, IC), OC, 1, false, 1 };
        break;
    }
    case DX: p = (product){ T, IC, OC, ft_mat_f32(b->dy, OC, 1), ft_mat_rows(b->w, FT_BF16, IC), IC, 1, false, 1 }; break;
    case DW: p = (product){ OC, IC, T, ft_mat_f32(b->dy, 1, OC), ft_mat_f32(b->x, IC, 1), IC, 1, true, 1 }; break;
    case LORA_U: p = (product){ T, R, IC, ft_mat_f32(b->x, IC, 1), ft_mat_f32(b->la, 1, IC), R, 1, false, 1 }; break;
    case LORA_OUT: p = (product){ T, OC, R, ft_mat_f32(b->u, R, 1), ft_mat_f32(b->lb, 1, R), OC, 1, true, 2 }; break;
    case LORA_DA: p = (product){ R, IC, T, ft_mat_f32(b->g, 1, R), ft_mat_f32(b->x, IC, 1), IC, 1, true, 1 }; break;
    case LORA_DB: p = (product){ OC, R, T, ft_mat_f32(b->dy, 1, OC), ft_mat_f32(b->u, R, 1), R, 1, true, 2 }; break;
    case LORA_G: p = (product){ T, R, OC, ft_mat_f32(b->dy, OC, 1), ft_mat_f32(b->lb, R, 1), R, 1, false, 2 }; break;
    case LORA_DX: p = (product){ T, IC, R, ft_mat_f32(b->g, R, 1), ft_mat_f32(b->la, IC, 1), IC, 1, false, 1 }; break;
    }
    return p;
}

static void run_ours(const product *p, ft_dtype compute, int nt, float *scratch, float *C) {
    if (!ft_gemm_in(compute, C, p->crs, p->ccs, &p->A, &p->B, p->M, p->N, p->K, p->alpha, p->acc, nt, scratch,
                    FT_GEMM_SCRATCH_FLOATS)) {
        fprintf(stderr, "bench_gemm: the kernels declined M=%d N=%d K=%d\n", p->M, p->N, p->K);
        exit(1);
    }
}

#ifdef FT_DNNL
/* oneDNN's matmul on the same shape: A and B as bf16 copies in the same
 * strides (the conversion is not timed), C f32 row-major. */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    uint16_t *ab, *bb;
} dnnl_case;

static dnnl_engine_t eng;
static dnnl_stream_t strm;

#define DNNL_CHECK(x)                                                                                                  \
    do {                                                                                                               \
        dnnl_status_t st_ = (x);                                                                                       \
        if (st_ != dnnl_success) {                                                                                     \
            fprintf(stderr, "bench_gemm: %s failed (%d)\n", #x, (int)st_);                                             \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* a bf16 copy of operand m (rows × cols) with element (i, j) at i·rs + j·cs */
static uint16_t *bf16_copy(const ft_mat *m, int rows, int cols, dnnl_dims_t strides) {
    uint16_t *d = malloc((size_t)rows * cols * 2);
    if (m->dt == FT_BF16) { /* weight rows: (rows, cols) or transposed */
        memcpy(d, m->p, (size_t)rows * cols * 2);
        strides[0] = m->t ? 1 : cols;
        strides[1] = m->t ? rows : 1;
        return d;
    }
    const float *f = m->p;
    int64_t rs = m->rs, cs = m->cs;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            int64_t o = i * rs + j * cs;
            d[o] = ft_f32_to_bf16(f[o]);
        }
    strides[0] = rs;
    strides[1] = cs;
    return d;
}

static void dnnl_case_new(dnnl_case *d, const product *p0, float *C) {
    /* C stored transposed (the forward on few rows): oneDNN's matmul wants
     * C row-major, so it computes Cᵀ = Bᵀ·Aᵀ, PyTorch's form of the forward */
    product pt = *p0;
    if (p0->ccs != 1) {
        pt = (product){ p0->N, p0->M, p0->K, p0->B, p0->A, p0->ccs, p0->crs, p0->acc, p0->alpha };
        pt.A.t = !p0->B.t, pt.B.t = !p0->A.t;
        if (pt.A.dt == FT_F32) { int64_t t = pt.A.rs; pt.A.rs = pt.A.cs; pt.A.cs = t; }
        if (pt.B.dt == FT_F32) { int64_t t = pt.B.rs; pt.B.rs = pt.B.cs; pt.B.cs = t; }
    }
    const product *p = &pt;
    dnnl_dims_t as, bs, ad = { p->M, p->K }, bd = { p->K, p->N }, cd = { p->M, p->N }, cs = { p->crs, p->ccs };
    d->ab = bf16_copy(&p->A, p->M, p->K, as);
    d->bb = bf16_copy(&p->B, p->K, p->N, bs);
    dnnl_memory_desc_t amd, bmd, cmd;
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs));
    dnnl_matmul_desc_t md;
    DNNL_CHECK(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    DNNL_CHECK(dnnl_primitive_create(&d->prim, pd));
    dnnl_primitive_desc_destroy(pd);
    DNNL_CHECK(dnnl_memory_create(&d->a, &amd, eng, d->ab));
    DNNL_CHECK(dnnl_memory_create(&d->b, &bmd, eng, d->bb));
    DNNL_CHECK(dnnl_memory_create(&d->c, &cmd, eng, C));
}

static void dnnl_case_run(dnnl_case *d) {
    dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, d->a }, { DNNL_ARG_WEIGHTS, d->b }, { DNNL_ARG_DST, d->c } };
    DNNL_CHECK(dnnl_primitive_execute(d->prim, strm, 3, args));
    DNNL_CHECK(dnnl_stream_wait(strm));
}

static void dnnl_case_free(dnnl_case *d) {
    dnnl_primitive_destroy(d->prim);
    dnnl_memory_destroy(d->a);
    dnnl_memory_destroy(d->b);
    dnnl_memory_destroy(d->c);
    free(d->ab);
    free(d->bb);
}
#endif

/* seconds per call of engine e on p: calls repeated for at least secs */
static double time_engine(int e, const product *p, int nt, float *scratch, float *C, double secs, void *dn) {
    double t0 = bench_now(), t;
    int calls = 0;
    do {
        if (e == 0) run_ours(p, FT_F32, nt, scratch, C);
        else if (e == 1) run_ours(p, FT_BF16, nt, scratch, C);
#ifdef FT_DNNL
        else dnnl_case_run(dn);
#else
        (void)dn;
#endif
        calls++;
        t = bench_now() - t0;
    } while (t < secs);
    return t / calls;
}

static void fill(float *p, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) p[i] = (float)bench_rand_u32(seed) / 4294967296.0f - 0.5f;
}

#ifdef FT_DNNL
/* Whether oneDNN's result depends on its thread count: the product made
 * and run on 1 and on nt OpenMP threads, compared bit for bit. */
static void dnnl_thread_check(const shape *shapes, int ns, const buffers *b, int nt) {
    size_t nc = (size_t)8192 * 2048;
    float *c1 = ft_aligned_alloc(nc * 4), *c2 = ft_aligned_alloc(nc * 4);
    if (!c1 || !c2) exit(1);
    for (int i = 0; i < ns; i++) {
        product p = make_product(&shapes[i], b);
        size_t n = (size_t)p.M * p.N;
        float *cs[2] = { c1, c2 };
        for (int j = 0; j < 2; j++) {
            omp_set_num_threads(j ? nt : 1);
            memset(cs[j], 0, n * 4);
            dnnl_case d;
            dnnl_case_new(&d, &p, cs[j]);
            dnnl_case_run(&d);
            dnnl_case_free(&d);
        }
        size_t diff = 0;
        for (size_t k = 0; k < n; k++) diff += memcmp(&c1[k], &c2[k], 4) != 0;
        printf("dnnl_threads\tmodel=%s\tkind=%s\tT=%d\tin=%d\tout=%d\tthreads=1,%d\tdiffering=%zu/%zu\n",
               shapes[i].model, kind_names[shapes[i].kind], shapes[i].T, shapes[i].in, shapes[i].out, nt, diff, n);
    }
    free(c1);
    free(c2);
}
#endif

int main(int argc, char **argv) {
    bool thread_check = argc > 1 && !strcmp(argv[1], "--dnnl-threads");
    if (thread_check) argv++, argc--;
    /* --peaks-only: the peaks alone (make bench measures them in its own run) */
    bool peaks_only = argc > 1 && !strcmp(argv[1], "--peaks-only");
    if (peaks_only) argv++, argc--;
    int nt = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 3;
    double secs = argc > 3 ? atof(argv[3]) : 0.1;
    if (nt < 1 || nt > 64 || rounds < 1 || secs <= 0) {
        fprintf(stderr, "usage: bench_gemm [--peaks-only] [THREADS] [ROUNDS] [SECONDS]\n");
        return 2;
    }
    printf("cpu\tlevel=%s\tavx512bf16=%d\tamx=%d\n", ft_cpu_level_name(ft_cpu_level()), ft_cpu_has_avx512bf16(),
           ft_cpu_has_amx());
#ifndef FT_DNNL
    if (thread_check) {
        fprintf(stderr, "bench_gemm: --dnnl-threads needs a build with DNNL=1\n");
        return 2;
    }
#endif
    /* peaks, interleaved over rounds: 1 and nt threads */
    size_t nbuf = thread_check ? 64 : (size_t)64 << 20; /* 256 MiB: far past every cache */
    float *buf = ft_aligned_alloc(nbuf * sizeof(float));
    if (!buf) return 1;
    for (size_t i = 0; i < nbuf; i++) buf[i] = 1.0f;
    const char *pk[] = { "fma_f32_gflops", "dpbf16_gflops", "read_gbs", "tdpbf16_gflops" };
    for (int r = 0; r < rounds && !thread_check; r++)
        for (int k = 0; k < 4; k++) {
            if (k == 1 && !ft_cpu_has_avx512bf16()) continue;
            if (k == 3 && !ft_cpu_has_amx()) continue;
            if (k < 2 && !ft_cpu_has_avx512f()) continue;
            for (int t = 1; t <= nt; t += nt > 1 ? nt - 1 : 1)
                printf("peak\t%s\tthreads=%d\tround=%d\tvalue=%.1f\n", pk[k], t, r, peak(k, t, buf, nbuf));
        }
    free(buf);
    /* what owning the tile state per task costs: one ldtilecfg + tilerelease
     * (kernels.h's tiles_begin/tiles_end), in ns, against a task's panels */
    for (int r = 0; r < rounds && !thread_check && ft_cpu_has_amx(); r++) {
        const ft_kernel_isa *amx = ft_kernels_for_level(FT_CPU_AMX);
        enum { PAIRS = 200000 };
        double t0 = bench_now();
        for (int i = 0; i < PAIRS; i++) amx->tiles_begin(), amx->tiles_end();
        printf("peak\ttile_state_ns\tthreads=1\tround=%d\tvalue=%.1f\n", r, (bench_now() - t0) / PAIRS * 1e9);
    }
    fflush(stdout);
    if (peaks_only) return 0;

    shape shapes[64];
    int ns = 0;
    struct { const char *name; int C, F; } models[] = { { "llama-110m", 768, 2048 }, { "llama-3.2-1b", 2048, 8192 } };
    int Ts[] = { 1, 128, 512, 2048 };
    for (int m = 0; m < 2; m++) {
        for (int ti = 0; ti < 4; ti++) {
            for (int dir = 0; dir < 2; dir++) { /* up (C -> F) and down (F -> C) */
                int in = dir ? models[m].F : models[m].C, out = dir ? models[m].C : models[m].F;
                shapes[ns++] = (shape){ models[m].name, in, out, Ts[ti], FWD };
                if (Ts[ti] > 1) {
                    shapes[ns++] = (shape){ models[m].name, in, out, Ts[ti], DX };
                    shapes[ns++] = (shape){ models[m].name, in, out, Ts[ti], DW };
                }
            }
        }
        for (int k = LORA_U; k <= LORA_DX; k++) shapes[ns++] = (shape){ models[m].name, models[m].C, models[m].F, 512, k };
    }
    size_t maxio = 8192, maxT = 2048;
    buffers b = { 0 };
    uint64_t seed = 1;
    b.x = ft_aligned_alloc(maxT * maxio * 4);
    b.dy = ft_aligned_alloc(maxT * maxio * 4);
    b.u = ft_aligned_alloc(maxT * R * 4);
    b.g = ft_aligned_alloc(maxT * R * 4);
    b.la = ft_aligned_alloc(R * maxio * 4);
    b.lb = ft_aligned_alloc(R * maxio * 4);
    b.w = ft_aligned_alloc(maxio * maxio / 4 * 2 * 2); /* 2048·8192 bf16 */
    float *C = ft_aligned_alloc(maxio * maxio / 4 * 4), *scratch = ft_aligned_alloc(FT_GEMM_SCRATCH_FLOATS * 4);
    if (!b.x || !b.dy || !b.u || !b.g || !b.la || !b.lb || !b.w || !C || !scratch) return 1;
    fill(b.x, maxT * maxio, &seed);
    fill(b.dy, maxT * maxio, &seed);
    fill(b.u, maxT * R, &seed);
    fill(b.g, maxT * R, &seed);
    fill(b.la, R * maxio, &seed);
    fill(b.lb, R * maxio, &seed);
    for (size_t i = 0; i < maxio * maxio / 4; i++) b.w[i] = ft_f32_to_bf16((float)bench_rand_u32(&seed) / 4e9f - 0.5f);
    memset(C, 0, maxio * maxio / 4 * 4);
#ifdef FT_DNNL
    omp_set_num_threads(nt);
    DNNL_CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    if (thread_check) {
        dnnl_thread_check(shapes, ns, &b, nt);
        return 0;
    }
    const int n_engines = 3;
#else
    const int n_engines = 2;
#endif
    /* an optional 4th argument keeps only the products whose kind it names (e.g. "dw,lora_dB") */
    const char *only = argc > 4 ? argv[4] : NULL;
    const char *engine_names[] = { "ours_f32", "ours_bf16", "onednn_bf16" };
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < ns; i++) {
            if (only) {
                const char *k = kind_names[shapes[i].kind], *f = strstr(only, k);
                size_t kl = strlen(k);
                if (!f || (f[kl] != 0 && f[kl] != ',')) continue;
            }
            product p = make_product(&shapes[i], &b);
            void *dn = NULL;
#ifdef FT_DNNL
            dnnl_case dc;
            dnnl_case_new(&dc, &p, C);
            dn = &dc;
#endif
            double flops = 2.0 * p.M * p.N * p.K;
            /* the engine that goes first rotates with the round */
            for (int j = 0; j < n_engines; j++) {
                int e = (j + r) % n_engines;
                time_engine(e, &p, nt, scratch, C, secs / 5, dn); /* warm up: caches, pool, oneDNN's JIT */
                double t = time_engine(e, &p, nt, scratch, C, secs, dn);
                printf("gemm\tmodel=%s\tkind=%s\tT=%d\tin=%d\tout=%d\tM=%d\tN=%d\tK=%d\tthreads=%d\tround=%d\t"
                       "engine=%s\tgflops=%.2f\n",
                       shapes[i].model, kind_names[shapes[i].kind], shapes[i].T, shapes[i].in, shapes[i].out, p.M, p.N,
                       p.K, nt, r, engine_names[e], flops / t * 1e-9);
            }
            fflush(stdout);
#ifdef FT_DNNL
            dnnl_case_free(&dc);
#endif
        }
    ft_parallel_shutdown();
    return 0;
}
