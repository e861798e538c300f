/* test_optim8.c — 8-bit AdamW and paged optimizer state: the dynamic maps,
 * quantization and several 8-bit steps bit for bit against an independent
 * torch implementation of bitsandbytes' blockwise AdamW (tests/adam8_ref.py);
 * the table-driven quantizer and the step (portable and AVX-512) against
 * their plain references;
 * thread counts; small tensors on f32 state; the state's size formula;
 * paged state bit-identical to unpaged and file-backed (/proc/self/maps);
 * checkpoints of 8-bit state resuming bit for bit, and their errors. */
#include "check.h"
#include "core/mem.h"
#include "cpu/cpu.h"
#include "formats/bnb.h"
#include "formats/safetensors.h"
#include "optim/optim.h"

#include <stdint.h>
#include <unistd.h>

static char tmpdir[512];

static bool bits_equal(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* sizes: f32 state (4095), exactly the 8-bit minimum (4096 = 16 blocks),
 * one element into a new block (4097), a partial last block (5000), and
 * enough blocks for several tasks (70001) */
static const int64_t SIZES[] = { 4095, 4096, 4097, 5000, 70001 };
enum { NT = sizeof SIZES / sizeof SIZES[0], STEPS = 6 };

typedef struct {
    float *w[NT], *g[NT][STEPS];
    double lr[STEPS];
} problem;

/* Random weights and gradients with awkward features: a block of zero
 * gradients (absmax 0 on the first steps), a block a thousand times
 * larger, and a tensor of tiny gradients (m, v near the map's bottom). */
static void make_problem(problem *p, uint64_t seed) {
    ft_rng rng;
    ft_rng_seed(&rng, seed);
    for (int t = 0; t < NT; t++) {
        int64_t n = SIZES[t];
        p->w[t] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) p->w[t][k] = 0.1f * ft_rng_normal(&rng);
        for (int s = 0; s < STEPS; s++) {
            float *g = p->g[t][s] = malloc((size_t)n * sizeof(float));
            float scale = t == 3 ? 1e-6f : 0.01f;
            for (int64_t k = 0; k < n; k++) g[k] = scale * ft_rng_normal(&rng);
            if (n > 2048)
                for (int64_t k = 256; k < 512; k++) g[k] = s < 3 ? 0.0f : g[k];
            if (n > 4096)
                for (int64_t k = 1024; k < 1280; k++) g[k] *= 1000.0f;
        }
    }
    for (int s = 0; s < STEPS; s++) p->lr[s] = 1e-3 * (s + 1) / STEPS;
}

static void free_problem(problem *p) {
    for (int t = 0; t < NT; t++) {
        free(p->w[t]);
        for (int s = 0; s < STEPS; s++) free(p->g[t][s]);
    }
}

typedef struct { float *w[NT], *grad[NT]; ft_param ps[NT]; } run_params;

static void params_from(run_params *r, const problem *p) {
    for (int t = 0; t < NT; t++) {
        int64_t n = SIZES[t];
        r->w[t] = malloc((size_t)n * sizeof(float));
        r->grad[t] = malloc((size_t)n * sizeof(float));
        memcpy(r->w[t], p->w[t], (size_t)n * sizeof(float));
        ft_param *q = &r->ps[t];
        memset(q, 0, sizeof *q);
        snprintf(q->name, sizeof q->name, "t%d", t);
        q->data = r->w[t];
        q->grad = r->grad[t];
        q->numel = n;
        q->ndim = 1;
        q->shape[0] = n;
        q->decay = t != 2;
    }
}

static void params_free(run_params *r) {
    for (int t = 0; t < NT; t++) { free(r->w[t]); free(r->grad[t]); }
}

static void steps(ft_adamw *o, run_params *r, const problem *p, int s0, int s1) {
    for (int s = s0; s < s1; s++) {
        for (int t = 0; t < NT; t++) memcpy(r->grad[t], p->g[t][s], (size_t)SIZES[t] * sizeof(float));
        ft_adamw_step(o, p->lr[s]);
    }
}

static ft_adamw_cfg cfg8(void) {
    ft_adamw_cfg c;
    ft_adamw_defaults(&c);
    c.kind = FT_OPTIM_ADAMW8BIT;
    c.weight_decay = 0.1;
    return c;
}

/* The whole state of o as bytes (its one allocation). */
static bool same_state(const ft_adamw *a, const ft_adamw *b) {
    return a->state_bytes == b->state_bytes && bits_equal(a->state, b->state, a->state_bytes);
}

/* ------------------------------------------------------------- against torch */

static void test_matches_torch_reference(void) {
    problem p;
    make_problem(&p, 5);
    ft_adamw_cfg c = cfg8();
    /* probes: every midpoint between map entries and its float neighbours
     * (ties go down), ±0, ±1, beyond ±1, the smallest entries' region */
    const float *sm = ft_dynamic_map(true), *um = ft_dynamic_map(false);
    enum { NP = 2 * 255 * 3 + 10 };
    float probe[NP];
    int np = 0;
    for (int s = 0; s < 2; s++) {
        const float *m = s ? sm : um;
        for (int i = 0; i < 255; i++) {
            float mid = (m[i] + m[i + 1]) / 2.0f;
            probe[np++] = mid;
            probe[np++] = nextafterf(mid, -2.0f);
            probe[np++] = nextafterf(mid, 2.0f);
        }
    }
    const float extra[] = { 0.0f, -0.0f, 1.0f, -1.0f, 1.5f, -7.0f, 1e-7f, -1e-7f, 3e-38f, 0.99f };
    for (int i = 0; i < 10; i++) probe[np++] = extra[i];
    char in[600], out[600], cmd[1400];
    snprintf(in, sizeof in, "%s/adam8.in", tmpdir);
    snprintf(out, sizeof out, "%s/adam8.out", tmpdir);
    FILE *f = fopen(in, "wb");
    int32_t hdr[3] = { NT, STEPS, c.block };
    double hp[4] = { c.beta1, c.beta2, c.eps, c.weight_decay };
    fwrite(hdr, 4, 3, f);
    fwrite(hp, 8, 4, f);
    fwrite(p.lr, 8, STEPS, f);
    int32_t npr = np;
    fwrite(&npr, 4, 1, f);
    fwrite(probe, 4, (size_t)np, f);
    for (int t = 0; t < NT; t++) {
        int32_t decay = t != 2;
        fwrite(&SIZES[t], 8, 1, f);
        fwrite(&decay, 4, 1, f);
        fwrite(p.w[t], 4, (size_t)SIZES[t], f);
        for (int s = 0; s < STEPS; s++) fwrite(p.g[t][s], 4, (size_t)SIZES[t], f);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/adam8_ref.py %s %s", in, out);
    CHECK(system(cmd) == 0);
    f = fopen(out, "rb");
    CHECK(f != NULL);
    if (!f) { free_problem(&p); return; }

    /* the maps: bit for bit torch's (torch's f32 linspace is the one
     * rounding that could differ between builds; here it does not), and
     * the signed one is the table formats/bnb.c carries for NF4's nested
     * absmax */
    float rmap[2][256], bnb[256];
    CHECK(fread(rmap[1], 4, 256, f) == 256 && fread(rmap[0], 4, 256, f) == 256);
    CHECK(bits_equal(sm, rmap[1], sizeof rmap[1]));
    CHECK(bits_equal(um, rmap[0], sizeof rmap[0]));
    ft_bnb_dynamic_map(bnb);
    CHECK(bits_equal(sm, bnb, sizeof bnb));
    uint8_t rq[2][NP];
    CHECK(fread(rq[1], 1, (size_t)np, f) == (size_t)np && fread(rq[0], 1, (size_t)np, f) == (size_t)np);
    int bad = 0;
    for (int i = 0; i < np; i++)
        for (int s = 0; s < 2; s++) {
            uint8_t a = ft_dynamic_quantize(s, probe[i]), b = ft_dynamic_quantize_ref(s, probe[i]);
            if (a != rq[s][i] || b != rq[s][i]) {
                if (bad++ < 5) fprintf(stderr, "  probe %.9g %s: fast %d, reference %d, torch %d\n", probe[i],
                                       s ? "signed" : "unsigned", a, b, rq[s][i]);
            }
        }
    CHECKF(bad == 0, "%d of %d probe codes differ from torch's bucketize", bad, 2 * np);

    run_params r;
    params_from(&r, &p);
    ft_adamw o;
    CHECK_OK(ft_adamw_init(&o, r.ps, NT, &c));
    steps(&o, &r, &p, 0, STEPS);
    for (int t = 0; t < NT; t++) {
        int64_t n = SIZES[t], nb = (n + c.block - 1) / c.block;
        float *rw = malloc((size_t)n * 4);
        CHECK(fread(rw, 4, (size_t)n, f) == (size_t)n);
        CHECKF(bits_equal(rw, r.w[t], (size_t)n * 4), "n=%lld: weights differ (max rel err %.3g)", (long long)n,
               check_max_rel_err(r.w[t], rw, (long)n, 1e-30));
        if (n >= FT_ADAM8_MIN_SIZE) {
            CHECK(o.qm[t] && !o.m[t]);
            uint8_t *rc = malloc((size_t)n);
            float *ra = malloc((size_t)nb * 4);
            for (int k = 0; k < 2; k++) {
                CHECK(fread(rc, 1, (size_t)n, f) == (size_t)n);
                CHECKF(bits_equal(rc, k ? o.qv[t] : o.qm[t], (size_t)n), "n=%lld: codes of %c differ", (long long)n,
                       k ? 'v' : 'm');
            }
            for (int k = 0; k < 2; k++) {
                CHECK(fread(ra, 4, (size_t)nb, f) == (size_t)nb);
                CHECKF(bits_equal(ra, k ? o.av[t] : o.am[t], (size_t)nb * 4), "n=%lld: absmax of %c differs",
                       (long long)n, k ? 'v' : 'm');
            }
            free(rc);
            free(ra);
        } else {
            CHECK(o.m[t] && !o.qm[t]); /* bitsandbytes' min_8bit_size: f32 state */
            float *rm = malloc((size_t)n * 4);
            for (int k = 0; k < 2; k++) {
                CHECK(fread(rm, 4, (size_t)n, f) == (size_t)n);
                CHECKF(bits_equal(rm, k ? o.v[t] : o.m[t], (size_t)n * 4), "n=%lld: f32 %c differs", (long long)n,
                       k ? 'v' : 'm');
            }
            free(rm);
        }
        free(rw);
    }
    char extra_byte;
    CHECK(fread(&extra_byte, 1, 1, f) == 0);
    fclose(f);
    ft_adamw_free(&o);
    params_free(&r);
    free_problem(&p);
}

/* ------------------------------------------------------------- fast vs plain */

static void test_fast_quantizer_is_the_reference(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    long bad = 0, n = 0;
    for (int s = 0; s < 2; s++) {
        const float *m = ft_dynamic_map(s);
        /* every float near every midpoint and entry, and random values over
         * the whole range and in every decade */
        for (int i = 0; i < 256; i++) {
            float c[2] = { m[i], i < 255 ? (m[i] + m[i + 1]) / 2.0f : m[i] };
            for (int k = 0; k < 2; k++) {
                float x = c[k];
                for (int d = 0; d < 40; d++) x = nextafterf(x, -2.0f);
                for (int d = 0; d < 81; d++, x = nextafterf(x, 2.0f), n++)
                    bad += ft_dynamic_quantize(s, x) != ft_dynamic_quantize_ref(s, x);
            }
        }
        for (int i = 0; i < 400000; i++, n++) {
            float x = (2.0f * ft_rng_uniform(&rng) - (s ? 1.0f : 0.0f)) * powf(10.0f, -8.0f * ft_rng_uniform(&rng));
            bad += ft_dynamic_quantize(s, x) != ft_dynamic_quantize_ref(s, x);
        }
    }
    CHECKF(bad == 0, "%ld of %ld values quantize differently", bad, n);
    CHECK(ft_dynamic_quantize_fast_ok()); /* else the "fast" path was the count itself */
}

/* The step on the plain quantizer against the one the CPU dispatches to
 * (AVX-512 where there is one), the portable fast path, and 3 threads. */
static void test_step_fast_is_reference_any_threads(void) {
    enum { NV = 4 };
    static const char *const what[NV] = { "reference", "dispatched", "dispatched, 3 threads", "portable fast path" };
    problem p;
    make_problem(&p, 6);
    ft_adamw o[NV];
    run_params r[NV];
    for (int v = 0; v < NV; v++) {
        ft_adamw_cfg c = cfg8();
        c.reference = v == 0;
        c.n_threads = v == 2 ? 3 : 1;
        params_from(&r[v], &p);
        CHECK_OK(ft_adamw_init(&o[v], r[v].ps, NT, &c));
        if (v == 3) ft_cpu_force_level(FT_CPU_GENERIC);
        steps(&o[v], &r[v], &p, 0, STEPS);
        ft_cpu_force_level(-1);
    }
    printf("  dispatched at cpu level %s\n", ft_cpu_level_name(ft_cpu_level()));
    for (int v = 1; v < NV; v++) {
        CHECKF(same_state(&o[0], &o[v]), "%s: state differs from the reference step", what[v]);
        for (int t = 0; t < NT; t++)
            CHECKF(bits_equal(r[0].w[t], r[v].w[t], (size_t)SIZES[t] * 4), "%s: tensor %d's weights differ", what[v], t);
    }
    for (int v = 0; v < NV; v++) { ft_adamw_free(&o[v]); params_free(&r[v]); }
    free_problem(&p);
}

/* 8-bit AdamW follows f32 AdamW: the tensors on f32 state are
 * bit-identical, and the 8-bit ones stay within 10% of the largest update
 * (measured here: 3% to 6%). The state's error feeds the update directly:
 * the dynamic map's entries are 1.5% apart near 1 and up to 10% apart at a
 * decade's bottom, and a v below 1e-6 of its block's absmax flushes to 0
 * (its history is lost: that element's next step divides by this step's
 * (1 - beta2) g^2 alone, up to a few times the f32 update). */
static void test_close_to_f32_adamw(void) {
    problem p;
    make_problem(&p, 7);
    ft_adamw o8, o32;
    run_params r8, r32;
    ft_adamw_cfg c = cfg8(), c32 = cfg8();
    c32.kind = FT_OPTIM_ADAMW;
    params_from(&r8, &p);
    params_from(&r32, &p);
    CHECK_OK(ft_adamw_init(&o8, r8.ps, NT, &c));
    CHECK_OK(ft_adamw_init(&o32, r32.ps, NT, &c32));
    steps(&o8, &r8, &p, 0, STEPS);
    steps(&o32, &r32, &p, 0, STEPS);
    for (int t = 0; t < NT; t++) {
        double md = 0, mu = 0;
        for (int64_t k = 0; k < SIZES[t]; k++) {
            md = fmax(md, fabs((double)r8.w[t][k] - r32.w[t][k]));
            mu = fmax(mu, fabs((double)r32.w[t][k] - p.w[t][k]));
        }
        printf("  n=%lld: max |w8 - w32| %.3g (max update %.3g)\n", (long long)SIZES[t], md, mu);
        if (SIZES[t] < FT_ADAM8_MIN_SIZE) CHECK(md == 0);
        else CHECKF(md < 0.1 * mu, "n=%lld: %.3g of %.3g", (long long)SIZES[t], md, mu);
    }
    ft_adamw_free(&o8);
    ft_adamw_free(&o32);
    params_free(&r8);
    params_free(&r32);
    free_problem(&p);
}

static void test_state_bytes(void) {
    int64_t ne[] = { 4095, 4096, 4097, 1, 0 };
    /* f32: 8 per element; 8-bit: 2 per element + 2 absmax per 256-block */
    size_t f32 = 8 * (4095 + 4096 + 4097 + 1);
    size_t b8 = 8 * 4095 + (2 * 4096 + 8 * 16) + (2 * 4097 + 8 * 17) + 8 * 1;
    CHECK(ft_optim_state_bytes(ne, 5, FT_OPTIM_ADAMW, FT_ADAM8_BLOCK, false) == f32);
    CHECK(ft_optim_state_bytes(ne, 5, FT_OPTIM_ADAMW8BIT, FT_ADAM8_BLOCK, false) == b8);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    CHECK(ft_optim_state_bytes(ne, 5, FT_OPTIM_ADAMW8BIT, FT_ADAM8_BLOCK, true) == (b8 + pg - 1) / pg * pg);
    /* what init allocates and counts */
    problem p;
    make_problem(&p, 8);
    run_params r;
    params_from(&r, &p);
    int64_t sz[NT];
    for (int t = 0; t < NT; t++) sz[t] = SIZES[t];
    for (int k = 0; k < 2; k++) {
        ft_adamw_cfg c = cfg8();
        c.kind = k ? FT_OPTIM_ADAMW8BIT : FT_OPTIM_ADAMW;
        size_t before = ft_mem_current(FT_MEM_OPTIM);
        ft_adamw o;
        CHECK_OK(ft_adamw_init(&o, r.ps, NT, &c));
        CHECK(o.state_bytes == ft_optim_state_bytes(sz, NT, c.kind, c.block, false));
        CHECK(ft_mem_current(FT_MEM_OPTIM) - before == o.state_bytes);
        ft_adamw_free(&o);
    }
    /* a block size that is not a power of two in 64..4096 */
    ft_adamw_cfg c = cfg8();
    c.block = 1000;
    ft_adamw o;
    CHECK(ft_adamw_init(&o, r.ps, NT, &c) == FTUNE_ERR_ARG);
    ft_optim_kind kk;
    CHECK(ft_optim_kind_parse("adamw8bit", &kk) == FTUNE_OK && kk == FT_OPTIM_ADAMW8BIT);
    CHECK(ft_optim_kind_parse("adam8", &kk) == FTUNE_ERR_ARG && strstr(ftune_last_error(), "adam8"));
    params_free(&r);
    free_problem(&p);
}

/* ------------------------------------------------------------- paged */

/* The /proc/self/maps line of the mapping holding addr, or "". */
static void maps_line(const void *addr, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[1024];
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) {
            snprintf(out, cap, "%s", line);
            break;
        }
    }
    fclose(f);
}

static void test_paged_is_unpaged(void) {
    problem p;
    make_problem(&p, 10);
    for (int k = 0; k < 2; k++) {
        ft_adamw o[2];
        run_params r[2];
        for (int v = 0; v < 2; v++) {
            ft_adamw_cfg c = cfg8();
            c.kind = k ? FT_OPTIM_ADAMW8BIT : FT_OPTIM_ADAMW;
            c.paged = v == 1;
            c.paged_dir = tmpdir;
            params_from(&r[v], &p);
            size_t before = ft_mem_current(FT_MEM_PAGED);
            CHECK_OK(ft_adamw_init(&o[v], r[v].ps, NT, &c));
            if (v == 1) CHECK(ft_mem_current(FT_MEM_PAGED) - before == o[v].state_bytes);
            steps(&o[v], &r[v], &p, 0, STEPS);
        }
        /* the same bytes (the paged mapping is page-rounded: its tail is zeros) */
        CHECK(o[1].state_bytes >= o[0].state_bytes);
        CHECK(bits_equal(o[0].state, o[1].state, o[0].state_bytes));
        for (int t = 0; t < NT; t++) CHECK(bits_equal(r[0].w[t], r[1].w[t], (size_t)SIZES[t] * 4));
        /* file-backed and shared: the unlinked file in the directory given */
        char line[1024];
        maps_line(o[1].state, line, sizeof line);
        CHECKF(strstr(line, ".ftune-paged-") && strstr(line, tmpdir) && strstr(line, "(deleted)") &&
               strstr(line, "rw-s"), "maps line \"%s\"", line);
        maps_line(o[0].state, line, sizeof line);
        CHECK(!strstr(line, ".ftune-paged-"));
        size_t before = ft_mem_current(FT_MEM_PAGED);
        size_t nb = o[1].state_bytes;
        for (int v = 0; v < 2; v++) { ft_adamw_free(&o[v]); params_free(&r[v]); }
        CHECK(before - ft_mem_current(FT_MEM_PAGED) == nb);
    }
    /* a directory where no file can be made: a clear error naming it */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-dir", tmpdir);
    run_params r;
    params_from(&r, &p);
    ft_adamw_cfg c = cfg8();
    c.paged = true;
    c.paged_dir = missing;
    ft_adamw o;
    CHECK(ft_adamw_init(&o, r.ps, NT, &c) == FTUNE_ERR_IO);
    CHECKF(strstr(ftune_last_error(), missing) != NULL, "%s", ftune_last_error());
    c.paged_dir = NULL;
    CHECK(ft_adamw_init(&o, r.ps, NT, &c) == FTUNE_ERR_ARG);
    params_free(&r);
    free_problem(&p);
}

/* ------------------------------------------------------------- checkpoints */

static void test_checkpoint_resume(void) {
    problem p;
    make_problem(&p, 12);
    char path[700];
    snprintf(path, sizeof path, "%s/opt8.safetensors", tmpdir);
    ft_adamw_cfg c = cfg8();
    /* uninterrupted */
    run_params ra, rb;
    params_from(&ra, &p);
    ft_adamw a;
    CHECK_OK(ft_adamw_init(&a, ra.ps, NT, &c));
    steps(&a, &ra, &p, 0, STEPS);
    /* half, saved, loaded into a new (paged) optimizer, the other half */
    params_from(&rb, &p);
    ft_adamw b;
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &c));
    steps(&b, &rb, &p, 0, STEPS / 2);
    CHECK_OK(ft_adamw_save(&b, path, NULL));
    ft_adamw_free(&b);
    ft_adamw_cfg cp = c;
    cp.paged = true;
    cp.paged_dir = tmpdir;
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &cp));
    CHECK_OK(ft_adamw_load(&b, path));
    CHECK(b.step == STEPS / 2);
    steps(&b, &rb, &p, STEPS / 2, STEPS);
    CHECK(bits_equal(a.state, b.state, a.state_bytes));
    for (int t = 0; t < NT; t++) CHECK(bits_equal(ra.w[t], rb.w[t], (size_t)SIZES[t] * 4));
    ft_adamw_free(&b);

    /* another kind, another block: clear errors, the optimizer unchanged */
    ft_adamw_cfg c32 = c;
    c32.kind = FT_OPTIM_ADAMW;
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &c32));
    CHECK(ft_adamw_load(&b, path) == FTUNE_ERR_ARG);
    CHECKF(strstr(ftune_last_error(), "--optim adamw8bit") && strstr(ftune_last_error(), "--optim adamw"), "%s",
           ftune_last_error());
    CHECK(b.step == 0);
    char p32[700];
    snprintf(p32, sizeof p32, "%s/opt32.safetensors", tmpdir);
    CHECK_OK(ft_adamw_save(&b, p32, NULL));
    ft_adamw_free(&b);
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &c));
    CHECK(ft_adamw_load(&b, p32) == FTUNE_ERR_ARG);
    CHECKF(strstr(ftune_last_error(), "saved by --optim adamw,") != NULL, "%s", ftune_last_error());
    ft_adamw_free(&b);
    ft_adamw_cfg c2k = c;
    c2k.block = 2048;
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &c2k));
    CHECK(ft_adamw_load(&b, path) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.block") != NULL, "%s", ftune_last_error());
    ft_adamw_free(&b);

    /* a damaged absmax (NaN) and a missing code tensor are refused by name */
    st_file f;
    CHECK_OK(ft_st_open(&f, path));
    st_out_tensor ts[4 * NT];
    int n = 0, skip = -1;
    float *nan_abs = NULL;
    for (int i = 0; i < f.n && n < 4 * NT; i++) {
        const st_tensor *t = &f.tensors[i];
        ts[n] = (st_out_tensor){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = (void *)t->data };
        memcpy(ts[n].shape, t->shape, sizeof ts[n].shape);
        if (!nan_abs && strcmp(t->name, "opt.v8.absmax.t4") == 0) {
            nan_abs = malloc((size_t)t->shape[0] * 4);
            memcpy(nan_abs, t->data, (size_t)t->shape[0] * 4);
            nan_abs[3] = NAN;
            ts[n].data = nan_abs;
        }
        if (strcmp(t->name, "opt.m8.t1") == 0) skip = n;
        n++;
    }
    const char *meta[] = { "opt.kind", "adamw8bit", "opt.step", "3", "opt.block", "256", NULL };
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad8.safetensors", tmpdir);
    CHECK_OK(ft_st_write(bad, ts, n, meta));
    CHECK_OK(ft_adamw_init(&b, rb.ps, NT, &c));
    CHECK(ft_adamw_load(&b, bad) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "opt.v8.absmax.t4") != NULL, "%s", ftune_last_error());
    if (skip >= 0) {
        ts[skip] = ts[n - 1];
        ts[n - 1] = (st_out_tensor){ 0 };
        for (int i = 0; i < n - 1; i++)
            if (strcmp(ts[i].name, "opt.v8.absmax.t4") == 0) ts[i].data = NULL;
        /* restore the good absmax so that only the missing tensor is wrong */
        for (int i = 0; i < n - 1; i++)
            if (ts[i].data == NULL) ts[i].data = (void *)ft_st_find(&f, "opt.v8.absmax.t4")->data;
        CHECK_OK(ft_st_write(bad, ts, n - 1, meta));
        CHECK(ft_adamw_load(&b, bad) == FTUNE_ERR_FORMAT);
        CHECKF(strstr(ftune_last_error(), "opt.m8.t1") && strstr(ftune_last_error(), "missing"), "%s", ftune_last_error());
    }
    CHECK(b.step == 0);
    ft_adamw_free(&b);
    ft_st_close(&f);
    free(nan_abs);
    ft_adamw_free(&a);
    params_free(&ra);
    params_free(&rb);
    free_problem(&p);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune-test-optim8-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    RUN(test_matches_torch_reference);
    RUN(test_fast_quantizer_is_the_reference);
    RUN(test_step_fast_is_reference_any_threads);
    RUN(test_close_to_f32_adamw);
    RUN(test_state_bytes);
    RUN(test_paged_is_unpaged);
    RUN(test_checkpoint_resume);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
