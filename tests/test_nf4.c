/* test_nf4.c — bitsandbytes' NF4 with double quantization: the
 * quantization (formats/bnb.c, dtype.c) bit for bit against an independent
 * implementation of bitsandbytes' algorithm (tests/nf4_ref.py, torch) on
 * random tensors of awkward sizes; ft's per-row NF4 rows (a padded last
 * block) against bitsandbytes' dequantization of the same row; every
 * level's widening against dtype.c; and the Linear's forward and dX on NF4
 * weights, which dequantize a tile at a time inside the kernels, against
 * the same products on the weight dequantized to f32 beforehand. The same
 * for int8 rows (bitsandbytes' row-wise LLM.int8, without outliers). */
#include "check.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "formats/bnb.h"
#include "nn/linear.h"

#include <unistd.h>

static char tmpdir[256];

static bool bits_equal(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* One tensor of n N(0, scale) values, with block 1 zero when n > 128. */
static float *random_tensor(int64_t n, float scale, ft_rng *rng) {
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = scale * ft_rng_normal(rng);
    if (n > 128) memset(x + 64, 0, 64 * sizeof(float));
    return x;
}

static void test_nf4_matches_bitsandbytes(void) {
    /* awkward sizes: single elements, odd lengths, partial 64-blocks, a
     * partial last 256-block of the nested level (770 blocks) */
    static const int64_t sizes[] = { 1, 2, 63, 64, 65, 127, 130, 4129, 49252, 64 * 256 };
    static const float scales[] = { 1.0f, 0.02f, 37.0f, 1e-4f, 1.0f, 0.5f, 3.0f, 0.02f, 0.05f, 1.0f };
    enum { NT = sizeof sizes / sizeof sizes[0] };
    char in[512], out[512], cmd[1400];
    snprintf(in, sizeof in, "%s/nf4.in", tmpdir);
    snprintf(out, sizeof out, "%s/nf4.out", tmpdir);
    ft_rng rng;
    ft_rng_seed(&rng, 11);
    float *x[NT];
    FILE *f = fopen(in, "wb");
    int32_t count = NT;
    fwrite(&count, 4, 1, f);
    for (int t = 0; t < NT; t++) {
        x[t] = random_tensor(sizes[t], scales[t], &rng);
        fwrite(&sizes[t], 8, 1, f);
        fwrite(x[t], sizeof(float), (size_t)sizes[t], f);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/nf4_ref.py %s %s", in, out);
    CHECK(system(cmd) == 0);
    f = fopen(out, "rb");
    CHECK(f != NULL);
    if (!f) return;
    for (int t = 0; t < NT; t++) {
        int64_t n = sizes[t], nb = (n + 63) / 64, nb2 = (nb + 255) / 256, pb = (n + 1) / 2;
        uint8_t *packed = malloc((size_t)pb), *rpacked = malloc((size_t)pb), *qa = malloc((size_t)nb),
                *rqa = malloc((size_t)nb);
        float *absmax = malloc((size_t)nb * 4), *rabsmax = malloc((size_t)nb * 4), *a2 = malloc((size_t)nb2 * 4),
              *ra2 = malloc((size_t)nb2 * 4), *deq = malloc((size_t)n * 4), *rdeq = malloc((size_t)n * 4),
              *dabs = malloc((size_t)nb * 4), roff;
        CHECK(fread(rpacked, 1, (size_t)pb, f) == (size_t)pb && fread(rabsmax, 4, (size_t)nb, f) == (size_t)nb &&
              fread(rqa, 1, (size_t)nb, f) == (size_t)nb && fread(ra2, 4, (size_t)nb2, f) == (size_t)nb2 &&
              fread(&roff, 4, 1, f) == 1 && fread(rdeq, 4, (size_t)n, f) == (size_t)n);
        ft_bnb_quantize_nf4(packed, absmax, x[t], n);
        float off = ft_bnb_double_quant(qa, a2, absmax, nb);
        float code2[256];
        ft_bnb_dynamic_map(code2);
        ft_bnb_double_dequant(dabs, qa, a2, code2, off, nb);
        ft_bnb_dequantize_nf4(deq, packed, dabs, n);
        CHECKF(bits_equal(packed, rpacked, (size_t)pb), "n=%lld: packed codes differ", (long long)n);
        CHECKF(bits_equal(absmax, rabsmax, (size_t)nb * 4), "n=%lld: absmax differs", (long long)n);
        CHECKF(bits_equal(&off, &roff, 4), "n=%lld: offset %.9g vs %.9g", (long long)n, off, roff);
        CHECKF(bits_equal(qa, rqa, (size_t)nb), "n=%lld: nested codes differ", (long long)n);
        CHECKF(bits_equal(a2, ra2, (size_t)nb2 * 4), "n=%lld: nested absmax differs", (long long)n);
        CHECKF(bits_equal(deq, rdeq, (size_t)n * 4), "n=%lld: dequantized values differ", (long long)n);
        free(packed); free(rpacked); free(qa); free(rqa); free(absmax); free(rabsmax); free(a2); free(ra2);
        free(deq); free(rdeq); free(dabs); free(x[t]);
    }
    /* the dynamic map: torch's f32 linspace rounds by the vector width it
     * was built for, so another torch may differ by an ulp in some
     * entries; the one here gave ours, so equal here */
    float rmap[256], map[256];
    CHECK(fread(rmap, 4, 256, f) == 256);
    fclose(f);
    ft_bnb_dynamic_map(map);
    int equal = 0, within_ulp = 0;
    for (int i = 0; i < 256; i++) {
        equal += map[i] == rmap[i];
        within_ulp += map[i] == rmap[i] || nextafterf(map[i], rmap[i]) == rmap[i];
    }
    printf("  dynamic map: %d of 256 entries equal to torch's create_dynamic_map here\n", equal);
    CHECK(within_ulp == 256);
    CHECK(equal == 256);
}

/* ft's rows: each row its own blocks, the last one padded; each row's
 * values are bitsandbytes' dequantization of that row quantized alone. */
static void test_nf4_rows(void) {
    static const int widths[] = { 1, 63, 64, 65, 172, 320 };
    ft_rng rng;
    ft_rng_seed(&rng, 5);
    for (int w = 0; w < (int)(sizeof widths / sizeof widths[0]); w++) {
        int n = widths[w], nb = (n + 63) / 64;
        CHECK(ft_dtype_nbytes(FT_NF4, n) == (int64_t)nb * 36);
        float *x = random_tensor(n, 0.1f, &rng), *y = malloc((size_t)n * 4), *r = malloc((size_t)n * 4),
              *am = malloc((size_t)nb * 4);
        ft_block_nf4 *b = malloc((size_t)nb * sizeof *b);
        uint8_t *packed = malloc((size_t)(n + 1) / 2);
        ft_types[FT_NF4].from_f32(x, b, n);
        ft_types[FT_NF4].to_f32(b, y, n);
        ft_bnb_quantize_nf4(packed, am, x, n);
        ft_bnb_dequantize_nf4(r, packed, am, n);
        CHECKF(bits_equal(y, r, (size_t)n * 4), "width %d", n);
        /* the padding past the row's end is code 7, an exact zero */
        for (int j = n; j < nb * 64; j++) CHECK((j & 1 ? b[nb - 1].qs[(j % 64) / 2] & 15 : b[nb - 1].qs[(j % 64) / 2] >> 4) == 7);
        free(x); free(y); free(r); free(am); free(b); free(packed);
    }
}

static int levels[FT_CPU_NLEVELS], n_levels;

/* every level's widen is dtype.c's to_f32, bit for bit, on spans of whole
 * blocks and on a row's ragged end */
static void test_nf4_widen(void) {
    ft_rng rng;
    ft_rng_seed(&rng, 9);
    enum { N = 64 * 9 + 23 };
    float *x = random_tensor(N, 1.0f, &rng), ref[N], got[N];
    ft_block_nf4 b[(N + 63) / 64];
    ft_types[FT_NF4].from_f32(x, b, N);
    for (int l = 0; l < n_levels; l++) {
        const ft_kernel_isa *isa = ft_kernels_for_level(levels[l]);
        for (int k0 = 0; k0 < N; k0 += 64)
            for (int n = 1; k0 + n <= N; n += n < 64 ? 63 : 64) {
                int len = k0 + n == N ? n : (n + 63) / 64 * 64;
                if (k0 + len > N) len = N - k0;
                ft_dtype_span_to_f32(FT_NF4, b, k0, ref, len);
                memset(got, 0xFF, sizeof got);
                isa->widen(got, (const uint8_t *)b, FT_NF4, k0, len);
                CHECKF(bits_equal(got, ref, (size_t)len * 4), "%s: span [%d, %d)", isa->name, k0, k0 + len);
            }
    }
    free(x);
}

/* Forward (one row: the GEMV path; several: the packed GEMM) and dX of a
 * Linear on NF4 weights, against the same Linear on the weights
 * dequantized to f32: the kernels widen a tile of the NF4 rows to exactly
 * those f32 values and sum in the same order, so the results are equal to
 * the bit (a looser match would hide a wrong tile). */
static void check_linear(ft_dtype qt) {
    static const int shapes[][3] = { { 70, 172, 1 }, { 70, 172, 37 }, { 33, 320, 5 }, { 130, 64, 1 }, { 129, 1100, 19 } };
    ft_rng rng;
    ft_rng_seed(&rng, 3);
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int OC = shapes[s][0], IC = shapes[s][1], T = shapes[s][2];
        size_t rb = (size_t)ft_dtype_nbytes(qt, IC);
        uint8_t *q = malloc(rb * OC);
        float *w = random_tensor((int64_t)OC * IC, 0.05f, &rng), *wd = malloc((size_t)OC * IC * 4);
        for (int o = 0; o < OC; o++) {
            ft_types[qt].from_f32(w + (size_t)o * IC, q + rb * o, IC);
            ft_types[qt].to_f32(q + rb * o, wd + (size_t)o * IC, IC);
        }
        float *x = random_tensor((int64_t)T * IC, 1.0f, &rng), *dy = random_tensor((int64_t)T * OC, 1.0f, &rng);
        float *y = malloc((size_t)T * OC * 4), *yr = malloc((size_t)T * OC * 4), *dx = malloc((size_t)T * IC * 4),
              *dxr = malloc((size_t)T * IC * 4);
        ft_linear lq = { .w = { .dtype = qt, .ndim = 2, .shape = { OC, IC }, .data = q, .nbytes = rb * OC },
                         .in = IC, .out = OC };
        ft_linear lf = { .w = { .dtype = FT_F32, .ndim = 2, .shape = { OC, IC }, .data = wd,
                                .nbytes = (size_t)OC * IC * 4 }, .in = IC, .out = OC };
        for (int l = 0; l < n_levels; l++) {
            ft_cpu_force_level(levels[l]);
            for (int nt = 1; nt <= 2; nt++) {
                float *scr = ft_aligned_alloc(ft_linear_train_scratch_floats(IC, 0, T, nt) * sizeof(float));
                ft_linear_forward(y, x, &lq, NULL, T, nt, scr);
                ft_linear_forward(yr, x, &lf, NULL, T, nt, scr);
                CHECKF(bits_equal(y, yr, (size_t)T * OC * 4), "%s %s forward (%d, %d) T=%d", ft_types[qt].name,
                       ft_cpu_level_name(levels[l]), OC, IC, T);
                ft_linear_backward(dx, NULL, NULL, dy, x, NULL, &lq, NULL, T, 0, false, nt, scr);
                ft_linear_backward(dxr, NULL, NULL, dy, x, NULL, &lf, NULL, T, 0, false, nt, scr);
                CHECKF(bits_equal(dx, dxr, (size_t)T * IC * 4), "%s %s dX (%d, %d) T=%d", ft_types[qt].name,
                       ft_cpu_level_name(levels[l]), OC, IC, T);
                free(scr);
            }
        }
        ft_cpu_force_level(FT_CPU_TOP);
        /* and against the plain reference (dequantize, then plain loops):
         * only the order of the f32 sums differs, by up to ~IC·2^-24 of
         * the sum of |terms| (6.6e-5 at IC = 1100; seen: 2.4e-5). The
         * outputs have a std of 0.05·sqrt(IC) >= 0.4, so a floor of 0.1
         * measures against the output's scale; 1e-4 is that bound, far
         * below a wrong code or block (~1e-2) */
        ft_linear_forward_ref(yr, x, &lq, NULL, T);
        double e = check_max_rel_err(y, yr, (long)T * OC, 0.1);
        printf("  %s (%d, %d) T=%d: forward vs reference max rel err %.3g\n", ft_types[qt].name, OC, IC, T, e);
        CHECKF(e < 1e-4, "forward vs reference: max rel err %.3g", e);
        free(q); free(w); free(wd); free(x); free(dy); free(y); free(yr); free(dx); free(dxr);
    }
}

/* int8 rows against tests/nf4_ref.py's torch implementation of
 * bitsandbytes' int8_vectorwise_quant/dequant: absmax, codes and values
 * bit for bit, on awkward shapes, a zero row included */
static void test_int8_matches_bitsandbytes(void) {
    static const int shapes[][2] = { { 1, 1 }, { 3, 17 }, { 64, 172 }, { 5, 1000 }, { 130, 64 }, { 400, 333 } };
    enum { NS = sizeof shapes / sizeof shapes[0] };
    char in[512], out[512], cmd[1400];
    snprintf(in, sizeof in, "%s/i8.in", tmpdir);
    snprintf(out, sizeof out, "%s/i8.out", tmpdir);
    ft_rng rng;
    ft_rng_seed(&rng, 21);
    float *x[NS];
    FILE *f = fopen(in, "wb");
    int32_t count = NS;
    fwrite(&count, 4, 1, f);
    for (int s = 0; s < NS; s++) {
        int64_t rc[2] = { shapes[s][0], shapes[s][1] }, n = rc[0] * rc[1];
        x[s] = random_tensor(n, s == 3 ? 40.0f : 0.05f, &rng);
        if (rc[0] > 2) memset(x[s] + rc[1], 0, (size_t)rc[1] * 4); /* row 1 all zero */
        /* rows of values near the halfway points k+0.5 of the code grid,
         * where the rounding of the scale (bitsandbytes' (1/absmax)·127,
         * not 127/absmax) decides the code */
        for (int64_t r = 2; r < rc[0] && rc[1] > 1; r += 3) {
            float *row = x[s] + r * rc[1], amax = 0.01f + 0.001f * (float)r;
            row[0] = amax;
            for (int64_t j = 1; j < rc[1]; j++) row[j] = ((float)(j % 127) + 0.5f) / 127.0f * amax;
        }
        fwrite(rc, 8, 2, f);
        fwrite(x[s], 4, (size_t)n, f);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/nf4_ref.py int8 %s %s", in, out);
    CHECK(system(cmd) == 0);
    f = fopen(out, "rb");
    CHECK(f != NULL);
    if (!f) return;
    for (int s = 0; s < NS; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t rb = (size_t)ft_dtype_nbytes(FT_I8ROW, cols), n = (size_t)rows * cols;
        CHECK(rb == 4 + (size_t)cols);
        uint8_t *q = malloc(rb * rows);
        float *rs = malloc((size_t)rows * 4), *deq = malloc(n * 4), *y = malloc(n * 4);
        int8_t *rq = malloc(n);
        CHECK(fread(rs, 4, (size_t)rows, f) == (size_t)rows && fread(rq, 1, n, f) == n && fread(deq, 4, n, f) == n);
        bool ok = true;
        for (int r = 0; r < rows; r++) {
            ft_types[FT_I8ROW].from_f32(x[s] + (size_t)r * cols, q + rb * r, cols);
            ft_types[FT_I8ROW].to_f32(q + rb * r, y + (size_t)r * cols, cols);
            ok = ok && bits_equal(q + rb * r, rs + r, 4) && bits_equal(q + rb * r + 4, rq + (size_t)r * cols, (size_t)cols);
        }
        CHECKF(ok, "(%d, %d): absmax or codes differ", rows, cols);
        CHECKF(bits_equal(y, deq, n * 4), "(%d, %d): dequantized values differ", rows, cols);
        /* every level's widen on spans of the last row */
        for (int l = 0; l < n_levels; l++) {
            const ft_kernel_isa *isa = ft_kernels_for_level(levels[l]);
            for (int k0 = 0; k0 < cols; k0 += 7) {
                int len = cols - k0 < 40 ? cols - k0 : 40;
                float a[40], b[40];
                ft_dtype_span_to_f32(FT_I8ROW, q + rb * (rows - 1), k0, a, len);
                isa->widen(b, q + rb * (rows - 1), FT_I8ROW, k0, len);
                CHECKF(bits_equal(a, b, (size_t)len * 4) && bits_equal(a, y + (size_t)(rows - 1) * cols + k0, (size_t)len * 4),
                       "%s int8 span [%d, %d)", isa->name, k0, k0 + len);
            }
        }
        free(q); free(rs); free(deq); free(y); free(rq); free(x[s]);
    }
    fclose(f);
}

static void test_nf4_linear(void) { check_linear(FT_NF4); }
static void test_int8_linear(void) { check_linear(FT_I8ROW); }

/* The 4.127 bits per parameter of FORMATS.md §4.2, from the sizes of the
 * tensors double quantization produces for a 4096 × 4096 weight. */
static void test_nf4_bits(void) {
    int64_t n = 4096LL * 4096, nb = n / 64, nb2 = (nb + 255) / 256;
    double bits = ft_bnb_nf4_bits_per_param(n);
    double by_size = 8.0 * (double)(n / 2 + nb * 1 + nb2 * 4 + 4) / (double)n;
    printf("  nf4 + double quant: %.4f bits per parameter\n", bits);
    CHECK(bits == by_size);
    CHECK(fabs(bits - 4.127) < 5e-4);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ftune_test_nf4_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    ft_cpu_force_level(FT_CPU_TOP);
    int best = ft_cpu_level();
    for (int lv = FT_CPU_GENERIC; lv <= best; lv++) levels[n_levels++] = lv;
    RUN(test_nf4_matches_bitsandbytes);
    RUN(test_nf4_rows);
    RUN(test_nf4_widen);
    RUN(test_nf4_linear);
    RUN(test_nf4_bits);
    RUN(test_int8_matches_bitsandbytes);
    RUN(test_int8_linear);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {}
    CHECK_EXIT();
}
