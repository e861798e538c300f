/* test_formats.c — GGUF and safetensors: the real files in the shared test
 * data parse with the values they are known to hold, both writers round-trip
 * through the readers, and malformed files (truncated at every length, bad
 * magic, lying lengths/counts/offsets, overlaps, holes, duplicates, unknown
 * types) give the right status and a message naming the file and the tensor
 * or key, never a crash. Corrupt inputs are parsed from malloc'd buffers of
 * exactly their length so that a sanitizer build catches any over-read. */
#include "check.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

static char tmp_dir[512];

static const char *tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
    return buf;
}

/* A growable byte buffer for building files in memory. */
typedef struct { uint8_t *p; size_t n, cap; } tb;
static void tb_put(tb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) { fprintf(stderr, "out of memory\n"); exit(2); }
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void tb_u32(tb *b, uint32_t v) { tb_put(b, &v, 4); }  /* the test host is little-endian */
static void tb_u64(tb *b, uint64_t v) { tb_put(b, &v, 8); }
static void tb_str(tb *b, const char *s) { tb_u64(b, strlen(s)); tb_put(b, s, strlen(s)); }
static void tb_zeros(tb *b, size_t n) { for (size_t i = 0; i < n; i++) tb_put(b, "", 1); }
static void tb_pad(tb *b, size_t a) { while (b->n % a) tb_put(b, "", 1); }

static bool contains(const char *hay, const char *needle) { return needle == NULL || strstr(hay, needle) != NULL; }

/* Reads a whole data file; aborts the test binary if the shared data is missing. */
static uint8_t *load_data(const char *rel, size_t *n) {
    char path[1024];
    char *buf = NULL;
    check_data_path(path, sizeof path, rel);
    if (ft_read_file(path, &buf, n) != FTUNE_OK) {
        fprintf(stderr, "cannot read %s: %s\n", path, ftune_last_error());
        return NULL;
    }
    return (uint8_t *)buf;
}

/* Parses the first n bytes of src from an exact-size copy. */
static ftune_status parse_gguf_copy(const char *path, const uint8_t *src, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, src, n);
    gguf_file g;
    ftune_status st = ft_gguf_parse(&g, path, c, n);
    ft_gguf_close(&g);
    free(c);
    return st;
}
static ftune_status parse_st_copy(const char *path, const uint8_t *src, size_t n) {
    uint8_t *c = malloc(n ? n : 1);
    memcpy(c, src, n);
    st_file f;
    ftune_status st = ft_st_parse(&f, path, c, n);
    ft_st_close(&f);
    free(c);
    return st;
}

/* Checks that parsing gives `want` and a message with the path and needle. */
static void expect_gguf(const char *what, const tb *b, ftune_status want, const char *needle) {
    char path[128];
    snprintf(path, sizeof path, "bad-%s.gguf", what);
    ftune_status st = parse_gguf_copy(path, b->p, b->n);
    CHECKF(st == want, "%s: got %s, want %s: %s", what, ftune_status_name(st), ftune_status_name(want), ftune_last_error());
    if (want != FTUNE_OK) {
        CHECKF(contains(ftune_last_error(), path), "%s: message does not name the file: %s", what, ftune_last_error());
        CHECKF(contains(ftune_last_error(), needle), "%s: message lacks \"%s\": %s", what, needle, ftune_last_error());
    }
}

static void expect_st(const char *what, const tb *b, ftune_status want, const char *needle) {
    char path[128];
    snprintf(path, sizeof path, "bad-%s.safetensors", what);
    ftune_status st = parse_st_copy(path, b->p, b->n);
    CHECKF(st == want, "%s: got %s, want %s: %s", what, ftune_status_name(st), ftune_status_name(want), ftune_last_error());
    if (want != FTUNE_OK) {
        CHECKF(contains(ftune_last_error(), path), "%s: message does not name the file: %s", what, ftune_last_error());
        CHECKF(contains(ftune_last_error(), needle), "%s: message lacks \"%s\": %s", what, needle, ftune_last_error());
    }
}

/* ------------------------------------------------------------- real files */

static void test_gguf_stories260k(void) {
    char path[1024];
    gguf_file g;
    CHECK_OK(ft_gguf_open(&g, check_data_path(path, sizeof path, "models/stories260K/stories260K.gguf")));
    if (check_failed_) return;
    CHECK(g.version == 3);
    CHECK(g.n_tensors == 48);
    CHECK(g.n_kv == 19);
    CHECK(g.alignment == 32);
    int64_t v = 0;
    CHECK(ft_gguf_get_i64(&g, "llama.embedding_length", &v) && v == 64);
    CHECK(ft_gguf_get_i64(&g, "llama.block_count", &v) && v == 5);
    CHECK(ft_gguf_get_i64(&g, "llama.attention.head_count", &v) && v == 8);
    CHECK(ft_gguf_get_i64(&g, "llama.attention.head_count_kv", &v) && v == 4);
    CHECK(ft_gguf_get_i64(&g, "llama.feed_forward_length", &v) && v == 172);
    CHECK(ft_gguf_get_i64(&g, "llama.context_length", &v) && v == 2048);
    CHECK(ft_gguf_get_i64(&g, "tokenizer.ggml.bos_token_id", &v) && v == 1);
    CHECK(ft_gguf_get_i64(&g, "tokenizer.ggml.eos_token_id", &v) && v == 2);
    CHECK(!ft_gguf_get_i64(&g, "general.architecture", &v)); /* a string, not an integer */
    double eps = 0;
    /* stored as f32: 1e-5 rounded to float is within 2^-24 relative */
    CHECK(ft_gguf_get_f64(&g, "llama.attention.layer_norm_rms_epsilon", &eps) && fabs(eps - 1e-5) / 1e-5 < 1e-7);
    gguf_str s;
    CHECK(ft_gguf_get_str(&g, "general.architecture", &s) && ft_gguf_str_eq(s, "llama"));
    CHECK(ft_gguf_get_str(&g, "tokenizer.ggml.model", &s) && ft_gguf_str_eq(s, "llama"));
    gguf_str_array toks;
    CHECK_OK(ft_gguf_get_str_array(&g, "tokenizer.ggml.tokens", &toks));
    CHECK(toks.n == 512);
    if (toks.n == 512) CHECK(ft_gguf_str_eq(toks.items[1], "<s>") && ft_gguf_str_eq(toks.items[2], "</s>"));
    free(toks.items);

    uint64_t end = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_info *t = &g.tensors[i];
        CHECK(t->dtype == FT_F32 && t->ggml_type == GGML_TYPE_F32);
        CHECK(t->nbytes == 4 * t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        CHECK(t->data == g.map.data + g.data_offset + t->offset);
        if (t->offset + t->nbytes > end) end = t->offset + t->nbytes;
    }
    CHECK(g.data_offset + end == g.map.size); /* the data ends exactly at EOF */

    /* token_embd.weight holds the same floats as the llama2.c checkpoint's
     * embedding, which follows its 7 x int32 header */
    const gguf_tensor_info *emb = ft_gguf_find_tensor(&g, "token_embd.weight");
    CHECK(emb && emb->n_dims == 2 && emb->ne[0] == 64 && emb->ne[1] == 512);
    size_t bn = 0;
    uint8_t *bin = load_data("models/stories260K/stories260K.bin", &bn);
    CHECK(bin && bn >= 28 + 512 * 64 * 4);
    if (emb && bin && bn >= 28 + 512 * 64 * 4) CHECK(memcmp(emb->data, bin + 28, 512 * 64 * 4) == 0);
    free(bin);
    CHECK(ft_gguf_find_tensor(&g, "no.such.tensor") == NULL);
    ft_gguf_close(&g);
    ft_gguf_close(&g); /* closing twice is harmless */
}

static void test_gguf_vocab_gpt2(void) {
    char path[1024];
    gguf_file g;
    CHECK_OK(ft_gguf_open(&g, check_data_path(path, sizeof path, "vocab-tests/ggml-vocab-gpt-2.gguf")));
    if (check_failed_) return;
    CHECK(g.n_tensors == 0);
    CHECK(g.data_offset <= g.map.size);
    gguf_str s;
    CHECK(ft_gguf_get_str(&g, "tokenizer.ggml.model", &s) && ft_gguf_str_eq(s, "gpt2"));
    gguf_str_array toks, merges;
    CHECK_OK(ft_gguf_get_str_array(&g, "tokenizer.ggml.tokens", &toks));
    CHECK(toks.n == 50257);
    if (toks.n == 50257) CHECK(ft_gguf_str_eq(toks.items[50256], "<|endoftext|>"));
    CHECK_OK(ft_gguf_get_str_array(&g, "tokenizer.ggml.merges", &merges));
    CHECK(merges.n > 0);
    /* every merge is "left right" */
    for (uint64_t i = 0; i < merges.n; i++) {
        if (!memchr(merges.items[i].ptr, ' ', merges.items[i].len)) { CHECKF(0, "merge %llu has no space", (unsigned long long)i); break; }
    }
    free(toks.items);
    free(merges.items);
    const gguf_kv *kv = ft_gguf_find(&g, "tokenizer.ggml.token_type");
    CHECK(kv && kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_I32 && kv->arr_n == 50257);
    gguf_str_array bad;
    CHECK(ft_gguf_get_str_array(&g, "tokenizer.ggml.token_type", &bad) == FTUNE_ERR_FORMAT);
    CHECK(ft_gguf_get_str_array(&g, "no.such.key", &bad) == FTUNE_ERR_ARG);
    ft_gguf_close(&g);
}

static void test_st_stories260k_hf(void) {
    char path[1024];
    st_file f;
    CHECK_OK(ft_st_open(&f, check_data_path(path, sizeof path, "models/stories260K-hf/model.safetensors")));
    if (check_failed_) return;
    CHECK(f.n == 9 * 5 + 2); /* 9 weights per layer x 5 layers + embedding + final norm (tied head) */
    const st_tensor *e = ft_st_find(&f, "model.embed_tokens.weight");
    CHECK(e && e->dtype == FT_F32 && e->ndim == 2 && e->shape[0] == 512 && e->shape[1] == 64);
    size_t bn = 0;
    uint8_t *bin = load_data("models/stories260K/stories260K.bin", &bn);
    if (e && bin && bn >= 28 + 512 * 64 * 4) CHECK(memcmp(e->data, bin + 28, 512 * 64 * 4) == 0);
    free(bin);
    const st_tensor *q = ft_st_find(&f, "model.layers.4.self_attn.k_proj.weight");
    CHECK(q && q->shape[0] == 32 && q->shape[1] == 64); /* 4 kv heads x head size 8, width 64 */
    CHECK(f.data_start % 8 == 0);
    ft_st_close(&f);
}

static void test_st_adapter(void) {
    char path[1024];
    st_file f;
    CHECK_OK(ft_st_open(&f, check_data_path(path, sizeof path, "adapters/gpt2-lora-tigrinya/adapter_model.safetensors")));
    if (check_failed_) return;
    CHECK(f.n == 72);
    for (int i = 0; i < f.n; i++) CHECK(f.tensors[i].dtype == FT_F32 && strcmp(f.tensors[i].dtype_name, "F32") == 0);
    const char *fmt = ft_st_meta(&f, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0);
    const st_tensor *a = ft_st_find(&f, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    const st_tensor *b = ft_st_find(&f, "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
    CHECK(a && a->ndim == 2 && a->shape[0] == 8 && a->shape[1] == 768);
    CHECK(b && b->ndim == 2 && b->shape[0] == 2304 && b->shape[1] == 8);
    uint64_t end = 0;
    for (int i = 0; i < f.n; i++) if (f.tensors[i].end > end) end = f.tensors[i].end;
    CHECK(f.data_start + end == f.map.size);
    ft_st_close(&f);
}

/* ------------------------------------------------------------- round trips */

/* A generated tensor: element i of an I32 tensor is i * 3 + index. */
static ftune_status gen_i32(void *ctx, int index, ft_dtype dtype, void *dst, uint64_t offset, size_t n) {
    (void)ctx;
    (void)dtype;
    for (size_t k = 0; k < n / 4; k++) {
        int32_t v = (int32_t)((offset / 4 + k) * 3 + (uint64_t)index);
        memcpy((uint8_t *)dst + 4 * k, &v, 4);
    }
    return FTUNE_OK;
}

/* A generator that fails once past its first chunk's start, as merge's does
 * on a value the dtype cannot hold. */
static ftune_status gen_fail(void *ctx, int index, ft_dtype dtype, void *dst, uint64_t offset, size_t n) {
    (void)ctx;
    (void)index;
    (void)dtype;
    memset(dst, 0, n);
    return ft_err(FTUNE_ERR_RANGE, "gen_fail: refused at byte %llu", (unsigned long long)offset);
}

/* path and path.tmp are not there */
static bool no_file(const char *path) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    return access(path, F_OK) != 0 && access(tmp, F_OK) != 0;
}

static void test_st_roundtrip(void) {
    char path[1024];
    tmp_path(path, sizeof path, "rt.safetensors");
    float a[15];
    uint16_t bf[7];
    int64_t ids[3] = { -1, 0, INT64_MAX };
    uint8_t u[5] = { 1, 2, 3, 4, 5 };
    double sc = 3.25;
    for (int i = 0; i < 15; i++) a[i] = (float)i * 0.5f - 3.0f;
    for (int i = 0; i < 7; i++) bf[i] = ft_f32_to_bf16((float)i + 0.25f);
    st_out_tensor ts[] = {
        { .name = "w.a \"quoted\\\"", .dtype = FT_F32, .ndim = 2, .shape = { 3, 5 }, .data = a },
        { .name = "u8", .dtype = FT_U8, .ndim = 1, .shape = { 5 }, .data = u },
        { .name = "bf", .dtype = FT_BF16, .ndim = 1, .shape = { 7 }, .data = bf },
        { .name = "ids", .dtype = FT_I64, .ndim = 1, .shape = { 3 }, .data = ids },
        { .name = "scalar", .dtype = FT_F64, .ndim = 0, .data = &sc },
        { .name = "empty", .dtype = FT_F32, .ndim = 2, .shape = { 0, 4 }, .data = NULL },
        { .name = "gen", .dtype = FT_I32, .ndim = 2, .shape = { 3, 4 }, .fill = gen_i32, .fill_index = 5 },
    };
    const int n = (int)(sizeof ts / sizeof ts[0]);
    const char *meta[] = { "note", "line\nbreak", NULL };
    CHECK_OK(ft_st_write(path, ts, n, meta));
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0); /* renamed away */
    st_file f;
    CHECK_OK(ft_st_open(&f, path));
    if (check_failed_) return;
    CHECK(f.n == n);
    CHECK(f.data_start % 8 == 0);
    CHECK(ft_st_meta(&f, "format") && strcmp(ft_st_meta(&f, "format"), "pt") == 0);
    CHECK(ft_st_meta(&f, "note") && strcmp(ft_st_meta(&f, "note"), "line\nbreak") == 0);
    for (int i = 0; i < n; i++) {
        const st_tensor *t = ft_st_find(&f, ts[i].name);
        CHECKF(t != NULL, "tensor %s missing", ts[i].name);
        if (!t) continue;
        CHECK(t->dtype == ts[i].dtype && t->ndim == ts[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) { CHECK(t->shape[d] == ts[i].shape[d]); numel *= t->shape[d]; }
        size_t nb = (size_t)ft_dtype_nbytes(t->dtype, numel);
        CHECK(t->end - t->begin == nb);
        CHECK((uintptr_t)(t->data - f.map.data) % ft_types[t->dtype].block_bytes == 0); /* aligned to its element */
        if (nb && ts[i].data) CHECKF(memcmp(t->data, ts[i].data, nb) == 0, "tensor %s bytes differ", ts[i].name);
        if (ts[i].fill)
            for (int64_t k = 0; k < numel; k++) {
                int32_t x;
                memcpy(&x, t->data + 4 * k, 4);
                CHECKF(x == (int32_t)k * 3 + 5, "gen[%lld] = %d", (long long)k, x);
            }
    }
    ft_st_close(&f);

    /* writer argument errors leave no file behind */
    char bad[1100];
    tmp_path(bad, sizeof bad, "bad.safetensors");
    st_out_tensor dup[] = { ts[0], ts[0] };
    CHECK(ft_st_write(bad, dup, 2, NULL) == FTUNE_ERR_ARG && contains(ftune_last_error(), ts[0].name));
    uint8_t q[34] = { 0 };
    st_out_tensor qt = { .name = "q", .dtype = FT_Q8_0, .ndim = 1, .shape = { 32 }, .data = q };
    CHECK(ft_st_write(bad, &qt, 1, NULL) == FTUNE_ERR_UNSUPPORTED && contains(ftune_last_error(), "\"q\""));
    CHECK(access(bad, F_OK) != 0);
    snprintf(tmp, sizeof tmp, "%s.tmp", bad);
    CHECK(access(tmp, F_OK) != 0);
    CHECK(ft_st_write("/nonexistent-dir/x.safetensors", ts, 1, NULL) == FTUNE_ERR_IO);
    /* a generator's failure stops the write: its status, no file */
    st_out_tensor failing[] = { ts[0], { .name = "f", .dtype = FT_F32, .ndim = 1, .shape = { 8 }, .fill = gen_fail } };
    CHECK(ft_st_write(bad, failing, 2, NULL) == FTUNE_ERR_RANGE && contains(ftune_last_error(), "gen_fail"));
    CHECK(no_file(bad));
}

static void test_gguf_writer_roundtrip(void) {
    char path[1024];
    tmp_path(path, sizeof path, "rt.gguf");
    gguf_writer *w;
    CHECK_OK(ft_gguf_writer_new(&w));
    if (check_failed_) return;
    const char *strs[] = { "a", "", "\xe1\x88\x80 unicode", "<s>" };
    float fa[] = { 1.5f, -2.0f, 1e-30f };
    int32_t ia[] = { -7, 0, INT32_MAX };
    CHECK_OK(ft_gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK_OK(ft_gguf_writer_set_u32(w, "llama.block_count", 3));
    CHECK_OK(ft_gguf_writer_set_i32(w, "some.neg", -12));
    CHECK_OK(ft_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    CHECK_OK(ft_gguf_writer_set_bool(w, "some.flag", true));
    CHECK_OK(ft_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", strs, 4));
    CHECK_OK(ft_gguf_writer_set_f32_array(w, "tokenizer.ggml.scores", fa, 3));
    CHECK_OK(ft_gguf_writer_set_i32_array(w, "tokenizer.ggml.token_type", ia, 3));
    CHECK(ft_gguf_writer_set_u32(w, "llama.block_count", 4) == FTUNE_ERR_ARG);
    CHECK(contains(ftune_last_error(), "llama.block_count"));

    float m[3 * 5], v[7];
    for (int i = 0; i < 15; i++) m[i] = (float)i - 7.0f;
    for (int i = 0; i < 7; i++) v[i] = 0.125f * (float)i;
    float qsrc[2 * 64];
    for (int i = 0; i < 128; i++) qsrc[i] = sinf((float)i);
    uint8_t q8[2 * 2 * 34];
    ft_types[FT_Q8_0].from_f32(qsrc, q8, 128);
    uint16_t bf[4] = { 0x3f80, 0xbf80, 0x4000, 0 };
    int64_t s2[] = { 3, 5 }, s1[] = { 7 }, sq[] = { 2, 64 }, sb[] = { 1, 1, 2, 2 };
    CHECK_OK(ft_gguf_writer_add_tensor(w, "m.weight", FT_F32, 2, s2, m));
    CHECK_OK(ft_gguf_writer_add_tensor(w, "v", FT_F32, 1, s1, v));
    CHECK_OK(ft_gguf_writer_add_tensor(w, "q.weight", FT_Q8_0, 2, sq, q8));
    CHECK_OK(ft_gguf_writer_add_tensor(w, "b4", FT_BF16, 4, sb, bf));
    int64_t sg[] = { 2, 6 };
    CHECK_OK(ft_gguf_writer_add_tensor_fill(w, "gen", FT_I32, 2, sg, gen_i32, NULL, 2));
    CHECK(ft_gguf_writer_add_tensor(w, "v", FT_F32, 1, s1, v) == FTUNE_ERR_ARG);
    int64_t sbad[] = { 2, 33 };
    CHECK(ft_gguf_writer_add_tensor(w, "qbad", FT_Q8_0, 2, sbad, q8) == FTUNE_ERR_ARG && contains(ftune_last_error(), "qbad"));
    CHECK(ft_gguf_writer_add_tensor(w, "u", FT_U8, 1, s1, v) == FTUNE_ERR_UNSUPPORTED);
    CHECK_OK(ft_gguf_writer_write(w, path));
    ft_gguf_writer_free(w);
    ft_gguf_writer_free(NULL);
    /* a generator's failure stops the write: its status, no file */
    char bad[1024];
    tmp_path(bad, sizeof bad, "bad.gguf");
    CHECK_OK(ft_gguf_writer_new(&w));
    if (check_failed_) return;
    CHECK_OK(ft_gguf_writer_add_tensor(w, "m.weight", FT_F32, 2, s2, m));
    CHECK_OK(ft_gguf_writer_add_tensor_fill(w, "f", FT_F32, 2, sg, gen_fail, NULL, 0));
    CHECK(ft_gguf_writer_write(w, bad) == FTUNE_ERR_RANGE && contains(ftune_last_error(), "gen_fail"));
    CHECK(no_file(bad));
    ft_gguf_writer_free(w);

    gguf_file g;
    CHECK_OK(ft_gguf_open(&g, path));
    if (check_failed_) return;
    CHECK(g.version == 3 && g.n_kv == 8 && g.n_tensors == 5 && g.alignment == 32);
    int64_t iv;
    double dv;
    bool bv;
    gguf_str s;
    CHECK(ft_gguf_get_str(&g, "general.architecture", &s) && ft_gguf_str_eq(s, "llama"));
    CHECK(ft_gguf_get_i64(&g, "llama.block_count", &iv) && iv == 3 && ft_gguf_find(&g, "llama.block_count")->type == GGUF_T_U32);
    CHECK(ft_gguf_get_i64(&g, "some.neg", &iv) && iv == -12);
    CHECK(ft_gguf_get_f64(&g, "llama.rope.freq_base", &dv) && dv == 10000.0);
    CHECK(ft_gguf_get_bool(&g, "some.flag", &bv) && bv);
    gguf_str_array sa;
    CHECK_OK(ft_gguf_get_str_array(&g, "tokenizer.ggml.tokens", &sa));
    CHECK(sa.n == 4);
    for (uint64_t i = 0; i < sa.n && i < 4; i++) CHECK(ft_gguf_str_eq(sa.items[i], strs[i]));
    free(sa.items);
    const gguf_kv *kf = ft_gguf_find(&g, "tokenizer.ggml.scores"), *ki = ft_gguf_find(&g, "tokenizer.ggml.token_type");
    CHECK(kf && kf->arr_type == GGUF_T_F32 && kf->arr_n == 3 && memcmp(kf->arr_data, fa, sizeof fa) == 0);
    CHECK(ki && ki->arr_type == GGUF_T_I32 && ki->arr_n == 3 && memcmp(ki->arr_data, ia, sizeof ia) == 0);

    const gguf_tensor_info *t = ft_gguf_find_tensor(&g, "m.weight");
    CHECK(t && t->n_dims == 2 && t->ne[0] == 5 && t->ne[1] == 3 && t->dtype == FT_F32 && memcmp(t->data, m, sizeof m) == 0);
    t = ft_gguf_find_tensor(&g, "v");
    CHECK(t && t->n_dims == 1 && t->ne[0] == 7 && memcmp(t->data, v, sizeof v) == 0);
    t = ft_gguf_find_tensor(&g, "q.weight");
    CHECK(t && t->ggml_type == GGML_TYPE_Q8_0 && t->ne[0] == 64 && t->ne[1] == 2 && t->nbytes == sizeof q8 &&
          memcmp(t->data, q8, sizeof q8) == 0);
    t = ft_gguf_find_tensor(&g, "b4");
    CHECK(t && t->n_dims == 4 && t->ne[0] == 2 && t->ne[1] == 2 && t->ne[2] == 1 && t->ne[3] == 1 && t->dtype == FT_BF16 &&
          memcmp(t->data, bf, sizeof bf) == 0);
    t = ft_gguf_find_tensor(&g, "gen");
    CHECK(t && t->dtype == FT_I32 && t->ne[0] == 6 && t->ne[1] == 2);
    for (int k = 0; t && k < 12; k++) {
        int32_t x;
        memcpy(&x, t->data + 4 * k, 4);
        CHECKF(x == k * 3 + 2, "gen[%d] = %d", k, x);
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) CHECK((g.data_offset + g.tensors[i].offset) % 32 == 0);
    ft_gguf_close(&g);
}

/* ------------------------------------------------------------- truncation */

static void test_gguf_truncated(void) {
    size_t n = 0;
    uint8_t *d = load_data("models/stories260K/stories260K.gguf", &n);
    CHECK(d != NULL);
    if (!d) return;
    /* every length through the header and first KVs, then a spread of
     * longer ones up to one byte short (the last tensor ends at EOF) */
    size_t lens[700];
    int nl = 0;
    for (size_t l = 0; l <= 500; l++) lens[nl++] = l;
    for (int k = 1; k < 150; k++) lens[nl++] = 500 + (n - 501) * (size_t)k / 150;
    lens[nl++] = n - 1;
    int bad = 0;
    for (int i = 0; i < nl; i++) {
        ftune_status st = parse_gguf_copy("cut.gguf", d, lens[i]);
        if (st != FTUNE_ERR_FORMAT || !contains(ftune_last_error(), "cut.gguf")) {
            if (bad++ < 5) CHECKF(0, "length %zu: %s: %s", lens[i], ftune_status_name(st), ftune_last_error());
        }
    }
    CHECK(bad == 0);
    CHECK(parse_gguf_copy("full.gguf", d, n) == FTUNE_OK);
    free(d);
}

static void test_st_truncated(void) {
    /* a small written file at every length, then the real adapter at a spread of lengths */
    char path[1024];
    tmp_path(path, sizeof path, "cut.safetensors");
    float a[6] = { 1, 2, 3, 4, 5, 6 };
    uint16_t h[3] = { 1, 2, 3 };
    st_out_tensor ts[] = { { .name = "a", .dtype = FT_F32, .ndim = 2, .shape = { 2, 3 }, .data = a },
                           { .name = "h", .dtype = FT_F16, .ndim = 1, .shape = { 3 }, .data = h } };
    CHECK_OK(ft_st_write(path, ts, 2, NULL));
    char *small = NULL;
    size_t sn = 0;
    CHECK_OK(ft_read_file(path, &small, &sn));
    if (!small) return;
    int bad = 0;
    for (size_t l = 0; l < sn; l++) {
        ftune_status st = parse_st_copy("cut.safetensors", (uint8_t *)small, l);
        if (st != FTUNE_ERR_FORMAT || !contains(ftune_last_error(), "cut.safetensors"))
            if (bad++ < 5) CHECKF(0, "length %zu: %s: %s", l, ftune_status_name(st), ftune_last_error());
    }
    CHECK(parse_st_copy("cut.safetensors", (uint8_t *)small, sn) == FTUNE_OK);
    free(small);

    size_t n = 0;
    uint8_t *d = load_data("adapters/gpt2-lora-tigrinya/adapter_model.safetensors", &n);
    CHECK(d != NULL);
    if (!d) return;
    for (int k = 0; k <= 100; k++) {
        size_t l = k == 100 ? n - 1 : (n - 1) * (size_t)k / 100;
        ftune_status st = parse_st_copy("cut2.safetensors", d, l);
        if (st != FTUNE_ERR_FORMAT || !contains(ftune_last_error(), "cut2.safetensors"))
            if (bad++ < 5) CHECKF(0, "length %zu: %s: %s", l, ftune_status_name(st), ftune_last_error());
    }
    CHECK(bad == 0);
    free(d);
}

/* ------------------------------------------------------------- bad GGUF */

typedef struct { const char *name; uint32_t n_dims; uint64_t ne[4]; uint32_t type; uint64_t offset; } tinfo;

/* A GGUF with one string KV, the given tensor infos, padding to 32 and
 * data_bytes of zeros. */
static tb build_gguf(uint32_t version, const tinfo *ts, int nt, size_t data_bytes) {
    tb b = { 0 };
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, version);
    tb_u64(&b, (uint64_t)nt);
    tb_u64(&b, 1);
    tb_str(&b, "general.architecture");
    tb_u32(&b, GGUF_T_STRING);
    tb_str(&b, "llama");
    for (int i = 0; i < nt; i++) {
        tb_str(&b, ts[i].name);
        tb_u32(&b, ts[i].n_dims);
        for (uint32_t d = 0; d < ts[i].n_dims; d++) tb_u64(&b, d < 4 ? ts[i].ne[d] : 1);
        tb_u32(&b, ts[i].type);
        tb_u64(&b, ts[i].offset);
    }
    tb_pad(&b, 32);
    tb_zeros(&b, data_bytes);
    return b;
}

/* The header of a GGUF with n_kv KVs; the caller appends them. */
static tb gguf_head(uint64_t n_tensors, uint64_t n_kv) {
    tb b = { 0 };
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, 3);
    tb_u64(&b, n_tensors);
    tb_u64(&b, n_kv);
    return b;
}

static void test_gguf_bad(void) {
    tb b;
    const tinfo ok2[] = { { "a", 2, { 4, 2 }, GGML_TYPE_F32, 0 }, { "b", 1, { 8 }, GGML_TYPE_F32, 32 } };
    b = build_gguf(3, ok2, 2, 64);
    expect_gguf("ok", &b, FTUNE_OK, NULL);
    b.p[0] = 'X';
    expect_gguf("magic", &b, FTUNE_ERR_FORMAT, "not a GGUF file");
    free(b.p);
    b = build_gguf(2, ok2, 2, 64);
    expect_gguf("v2", &b, FTUNE_OK, NULL);
    free(b.p);
    b = build_gguf(1, ok2, 2, 64);
    expect_gguf("v1", &b, FTUNE_ERR_UNSUPPORTED, "version 1");
    free(b.p);
    b = build_gguf(4, ok2, 2, 64);
    expect_gguf("v4", &b, FTUNE_ERR_UNSUPPORTED, "version 4");
    free(b.p);

    const tinfo mis[] = { { "misaligned.w", 1, { 4 }, GGML_TYPE_F32, 4 } };
    b = build_gguf(3, mis, 1, 64);
    expect_gguf("misaligned", &b, FTUNE_ERR_FORMAT, "\"misaligned.w\"");
    free(b.p);
    const tinfo past[] = { { "past.w", 2, { 64, 4 }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, past, 1, 1023); /* needs 1024 */
    expect_gguf("past-eof", &b, FTUNE_ERR_FORMAT, "\"past.w\"");
    free(b.p);
    const tinfo ovl[] = { { "first", 1, { 16 }, GGML_TYPE_F32, 0 }, { "second", 1, { 8 }, GGML_TYPE_F32, 32 } };
    b = build_gguf(3, ovl, 2, 128);
    expect_gguf("overlap", &b, FTUNE_ERR_FORMAT, "overlap");
    CHECK(contains(ftune_last_error(), "\"first\"") && contains(ftune_last_error(), "\"second\""));
    free(b.p);
    const tinfo dup[] = { { "same", 1, { 8 }, GGML_TYPE_F32, 0 }, { "same", 1, { 8 }, GGML_TYPE_F32, 32 } };
    b = build_gguf(3, dup, 2, 64);
    expect_gguf("dup-tensor", &b, FTUNE_ERR_FORMAT, "\"same\"");
    free(b.p);
    const tinfo nd5[] = { { "five.d", 5, { 1, 1, 1, 1 }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, nd5, 1, 32);
    expect_gguf("ndims5", &b, FTUNE_ERR_FORMAT, "\"five.d\"");
    free(b.p);
    const tinfo nd0[] = { { "zero.d", 0, { 0 }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, nd0, 1, 32);
    expect_gguf("ndims0", &b, FTUNE_ERR_FORMAT, "\"zero.d\"");
    free(b.p);
    const tinfo nul[] = { { "nul", 1, { 8 }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, nul, 1, 32);
    memcpy(memmem(b.p, b.n, "nul", 3), "n\0l", 3); /* a name that C strings would cut short */
    expect_gguf("nul-name", &b, FTUNE_ERR_FORMAT, "NUL");
    free(b.p);
    const tinfo unk[] = { { "odd.type", 1, { 32 }, 4, 0 } };
    b = build_gguf(3, unk, 1, 256);
    expect_gguf("unknown-type", &b, FTUNE_ERR_UNSUPPORTED, "\"odd.type\"");
    free(b.p);
    const tinfo blk[] = { { "q.partial", 1, { 33 }, GGML_TYPE_Q8_0, 0 } };
    b = build_gguf(3, blk, 1, 256);
    expect_gguf("partial-block", &b, FTUNE_ERR_FORMAT, "\"q.partial\"");
    free(b.p);
    const tinfo big[] = { { "huge.ne", 4, { 1ull << 20, 1ull << 20, 1ull << 20, 1ull << 20 }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, big, 1, 32);
    expect_gguf("ne-overflow", &b, FTUNE_ERR_FORMAT, "\"huge.ne\"");
    free(b.p);
    const tinfo neg[] = { { "neg.ne", 1, { UINT64_MAX }, GGML_TYPE_F32, 0 } };
    b = build_gguf(3, neg, 1, 32);
    expect_gguf("ne-negative", &b, FTUNE_ERR_FORMAT, "\"neg.ne\"");
    free(b.p);
    const tinfo k_quant[] = { { "k.quant", 1, { 256 }, 12, 0 } }; /* q4_K: its traits row, bounds-checked */
    b = build_gguf(3, k_quant, 1, 144);
    gguf_file g;
    CHECK_OK(ft_gguf_parse(&g, "kq.gguf", b.p, b.n));
    CHECK(g.n_tensors == 1 && g.tensors[0].dtype == FT_Q4_K && g.tensors[0].nbytes == 144);
    ft_gguf_close(&g);
    const tinfo i_quant[] = { { "i.quant", 1, { 256 }, 16, 0 } }; /* iq2_xxs: described, not computed with */
    free(b.p);
    b = build_gguf(3, i_quant, 1, 66);
    CHECK_OK(ft_gguf_parse(&g, "iq.gguf", b.p, b.n));
    CHECK(g.n_tensors == 1 && g.tensors[0].dtype == FT_IQ2_XXS && !ft_dtype_is_weight(g.tensors[0].dtype) &&
          g.tensors[0].nbytes == 66);
    ft_gguf_close(&g);
    free(b.p);
    b = build_gguf(3, k_quant, 1, 144);
    CHECK_OK(ft_gguf_parse(&g, "kq.gguf", b.p, b.n));
    ft_gguf_close(&g);
    b.n -= 1;
    expect_gguf("k-quant-short", &b, FTUNE_ERR_FORMAT, "\"k.quant\"");
    free(b.p);

    /* counts and lengths that would allocate or read far beyond the file */
    b = gguf_head(1ull << 40, 0);
    expect_gguf("huge-tensor-count", &b, FTUNE_ERR_FORMAT, "tensor count");
    free(b.p);
    b = gguf_head(0, UINT64_MAX);
    expect_gguf("huge-kv-count", &b, FTUNE_ERR_FORMAT, "kv count");
    free(b.p);
    b = gguf_head(0, 1);
    tb_u64(&b, 1ull << 62); /* key length */
    tb_put(&b, "key", 3);
    tb_zeros(&b, 16);
    expect_gguf("huge-key", &b, FTUNE_ERR_FORMAT, "key");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "big.string");
    tb_u32(&b, GGUF_T_STRING);
    tb_u64(&b, UINT64_MAX - 3);
    tb_zeros(&b, 16);
    expect_gguf("huge-string", &b, FTUNE_ERR_FORMAT, "\"big.string\"");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "big.array");
    tb_u32(&b, GGUF_T_ARRAY);
    tb_u32(&b, GGUF_T_U64);
    tb_u64(&b, 1ull << 61); /* x 8 bytes wraps around 2^64 */
    tb_zeros(&b, 16);
    expect_gguf("huge-array", &b, FTUNE_ERR_FORMAT, "\"big.array\"");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "big.strarr");
    tb_u32(&b, GGUF_T_ARRAY);
    tb_u32(&b, GGUF_T_STRING);
    tb_u64(&b, 3);
    tb_str(&b, "x");
    tb_str(&b, "y");
    tb_u64(&b, 100); /* third string runs past EOF */
    tb_put(&b, "z", 1);
    expect_gguf("strarr-past-eof", &b, FTUNE_ERR_FORMAT, "\"big.strarr\"");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "bad.type");
    tb_u32(&b, 13);
    tb_zeros(&b, 8);
    expect_gguf("kv-type", &b, FTUNE_ERR_FORMAT, "\"bad.type\"");
    free(b.p);
    b = gguf_head(0, 2);
    for (int i = 0; i < 2; i++) { tb_str(&b, "twice"); tb_u32(&b, GGUF_T_U8); tb_put(&b, "x", 1); }
    expect_gguf("dup-key", &b, FTUNE_ERR_FORMAT, "\"twice\"");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "general.alignment");
    tb_u32(&b, GGUF_T_U32);
    tb_u32(&b, 24);
    expect_gguf("alignment", &b, FTUNE_ERR_FORMAT, "general.alignment");
    free(b.p);

    /* nested arrays: [[1,2],[3]] parses; nesting 9 deep does not */
    b = gguf_head(0, 1);
    tb_str(&b, "nested");
    tb_u32(&b, GGUF_T_ARRAY);
    tb_u32(&b, GGUF_T_ARRAY);
    tb_u64(&b, 2);
    tb_u32(&b, GGUF_T_U32); tb_u64(&b, 2); tb_u32(&b, 1); tb_u32(&b, 2);
    tb_u32(&b, GGUF_T_U32); tb_u64(&b, 1); tb_u32(&b, 3);
    CHECK_OK(ft_gguf_parse(&g, "nested.gguf", b.p, b.n));
    CHECK(g.n_kv == 1 && g.kv[0].arr_type == GGUF_T_ARRAY && g.kv[0].arr_n == 2);
    ft_gguf_close(&g);
    b.n -= 1;
    expect_gguf("nested-short", &b, FTUNE_ERR_FORMAT, "\"nested\"");
    free(b.p);
    b = gguf_head(0, 1);
    tb_str(&b, "deep");
    tb_u32(&b, GGUF_T_ARRAY);
    for (int i = 0; i < 9; i++) { tb_u32(&b, GGUF_T_ARRAY); tb_u64(&b, 1); }
    tb_u32(&b, GGUF_T_U8); tb_u64(&b, 0);
    expect_gguf("deep", &b, FTUNE_ERR_FORMAT, "\"deep\"");
    free(b.p);
}

/* ------------------------------------------------------------- bad safetensors */

/* A safetensors file from a header string and `buf` bytes of data. */
static tb st_build(const char *header, size_t buf) {
    tb b = { 0 };
    tb_u64(&b, strlen(header));
    tb_put(&b, header, strlen(header));
    tb_zeros(&b, buf);
    return b;
}

static void st_case(const char *what, const char *header, size_t buf, ftune_status want, const char *needle) {
    tb b = st_build(header, buf);
    expect_st(what, &b, want, needle);
    free(b.p);
}

static void test_st_bad(void) {
    const char *A = "model.layers.0.mlp.up_proj.weight";
    st_case("ok", "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}  ", 16,
            FTUNE_OK, NULL);
    st_case("empty", "{}", 0, FTUNE_OK, NULL);
    st_case("f8-kept", "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3, FTUNE_OK, NULL);

    tb b = { 0 };
    tb_u64(&b, 1ull << 40);
    tb_put(&b, "{}", 2);
    expect_st("huge-header", &b, FTUNE_ERR_FORMAT, "header length");
    free(b.p);
    b = (tb){ 0 };
    tb_u64(&b, 100);
    tb_put(&b, "{\"a\":1}", 7);
    expect_st("header-past-eof", &b, FTUNE_ERR_FORMAT, "past end of file");
    free(b.p);
    st_case("not-object", "[1,2]", 0, FTUNE_ERR_FORMAT, "'{'");
    st_case("unterminated", "{\"a\":{\"dtype\":\"F32\"", 0, FTUNE_ERR_FORMAT, "JSON");
    st_case("invalid-json", "{\"a\" 5}", 0, FTUNE_ERR_FORMAT, "JSON");
    st_case("trailing", "{} x", 0, FTUNE_ERR_FORMAT, "after the JSON");
    st_case("bad-utf8", "{\"\xff\":1}", 0, FTUNE_ERR_FORMAT, "UTF-8");

    char h[512];
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", A);
    st_case("past-end", h, 8, FTUNE_ERR_FORMAT, "data_offsets [0,16] past end of buffer (8 bytes)");
    CHECK(contains(ftune_last_error(), A));
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", A);
    st_case("reversed", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", A);
    st_case("size-mismatch", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"Q9\",\"shape\":[4],\"data_offsets\":[0,16]}}", A);
    st_case("unknown-dtype", h, 16, FTUNE_ERR_UNSUPPORTED, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", A);
    st_case("5-dims", h, 16, FTUNE_ERR_UNSUPPORTED, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", A);
    st_case("neg-shape", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16.5]}}", A);
    st_case("frac-offset", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"shape\":[4],\"data_offsets\":[0,16]}}", A);
    st_case("no-dtype", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0]}}", A);
    st_case("one-offset", h, 16, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":[1]}", A);
    st_case("not-entry", h, 0, FTUNE_ERR_FORMAT, A);
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,16]}}", A);
    st_case("numel-overflow", h, 16, FTUNE_ERR_FORMAT, A);

    st_case("overlap",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, FTUNE_ERR_FORMAT, "overlap");
    st_case("hole",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, FTUNE_ERR_FORMAT, "\"y\": hole");
    st_case("tail", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, FTUNE_ERR_FORMAT, "after the last");
    st_case("duplicate",
            "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, FTUNE_ERR_FORMAT, "duplicate entry \"x\"");
    st_case("meta-not-string", "{\"__metadata__\":{\"format\":1}}", 0, FTUNE_ERR_FORMAT, "\"format\"");
    st_case("meta-not-object", "{\"__metadata__\":\"pt\"}", 0, FTUNE_ERR_FORMAT, "__metadata__");
}
/* ------------------------------------------------------------- model loading */

/* A shared data file's absolute path (a link target must not be relative to the working directory). */
static const char *data_abs(char *buf, size_t cap, const char *rel) {
    char p[1024];
    if (!realpath(check_data_path(p, sizeof p, rel), buf)) snprintf(buf, cap, "%s", p);
    return buf;
}

/* A directory holding `config` (a stories260K-hf config.json with one key
 * set to the JSON value `val`, or removed when val is NULL), and links to the
 * real model.safetensors and a tokenizer.json (`tok_json` text, or a link to
 * the real one when NULL). */
static const char *hf_variant(char *dir, size_t cap, const char *key, const char *val, const char *tok_json) {
    static int k;
    char p[1024], src[1024];
    snprintf(dir, cap, "%s/hf%d", tmp_dir, k++);
    if (mkdir(dir, 0755)) { perror("mkdir"); return NULL; }
    size_t n;
    char *text = (char *)load_data("models/stories260K-hf/config.json", &n);
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    if (!j) return NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    if (val) cJSON_AddItemToObject(j, key, cJSON_Parse(val));
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (f) { fputs(out, f); fclose(f); }
    free(out);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (symlink(data_abs(src, sizeof src, "models/stories260K-hf/model.safetensors"), p)) perror("symlink");
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    if (!tok_json) {
        if (symlink(data_abs(src, sizeof src, "models/stories260K-hf/tokenizer.json"), p)) perror("symlink");
    } else if ((f = fopen(p, "w"))) { fputs(tok_json, f); fclose(f); }
    return dir;
}

static void expect_load(const char *what, const char *path, ftune_status want, const char *n1, const char *n2) {
    ftune_model *m = NULL;
    ftune_status st = path ? ftune_model_load(&m, path, NULL) : FTUNE_ERR_IO;
    CHECKF(st == want, "%s: got %s, want %s: %s", what, ftune_status_name(st), ftune_status_name(want), ftune_last_error());
    if (want != FTUNE_OK && st != FTUNE_OK) {
        CHECKF(contains(ftune_last_error(), n1), "%s: message lacks \"%s\": %s", what, n1, ftune_last_error());
        CHECKF(contains(ftune_last_error(), n2), "%s: message lacks \"%s\": %s", what, n2, ftune_last_error());
    }
    CHECK((st == FTUNE_OK) == (m != NULL));
    ftune_model_free(m);
}

/* config.json: every key that is present must have the right type and a
 * valid value; a wrong one is an error naming the key and the file, not a
 * default. The weights must all be used. */
static void test_hf_config_checks(void) {
    char d[1024];
    expect_load("unchanged", hf_variant(d, sizeof d, "rope_scaling", "null", NULL), FTUNE_OK, NULL, NULL);
    expect_load("absent keys take defaults", hf_variant(d, sizeof d, "max_position_embeddings", NULL, NULL), FTUNE_OK, NULL, NULL);
    expect_load("eos id list", hf_variant(d, sizeof d, "eos_token_id", "[2, 0]", NULL), FTUNE_OK, NULL, NULL);
    expect_load("no bos id", hf_variant(d, sizeof d, "bos_token_id", "null", NULL), FTUNE_OK, NULL, NULL);
    static const struct { const char *key, *val; } bad[] = {
        { "max_position_embeddings", "\"4096\"" }, { "max_position_embeddings", "0" },
        { "max_position_embeddings", "1e12" },     { "max_position_embeddings", "512.5" },
        { "max_position_embeddings", "null" },     { "rms_norm_eps", "\"1e-5\"" },
        { "rms_norm_eps", "-1e-5" },               { "rms_norm_eps", "1e-60" }, /* 0 as a float */
        { "rms_norm_eps", "1e999" },               /* inf */
        { "rope_theta", "\"10000\"" },             { "tie_word_embeddings", "\"true\"" },
        { "tie_word_embeddings", "1" },            { "attention_bias", "\"false\"" },
        { "num_key_value_heads", "4.5" },          { "head_dim", "-8" },
        { "sliding_window", "\"4096\"" },        { "eos_token_id", "512" },
        { "eos_token_id", "[2, \"3\"]" },         { "bos_token_id", "1.5" },
        { "bos_token_id", "[]" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s = %s", bad[i].key, bad[i].val);
        const char *dir = hf_variant(d, sizeof d, bad[i].key, bad[i].val, NULL);
        expect_load(what, dir, FTUNE_ERR_FORMAT, bad[i].key, "config.json");
    }
    /* fewer layers than the file holds: the extra ones are named, not ignored */
    expect_load("4 of 5 layers", hf_variant(d, sizeof d, "num_hidden_layers", "4", NULL), FTUNE_ERR_FORMAT,
                "model.layers.4.", "not used");
    expect_load("6 of 5 layers", hf_variant(d, sizeof d, "num_hidden_layers", "6", NULL), FTUNE_ERR_FORMAT,
                "model.layers.5.", "missing");
}

/* The tokenizer may have fewer ids than the embedding has rows (padded
 * vocabularies), never more, and never none. */
static void test_hf_tokenizer_vocab(void) {
    size_t n;
    char *text = (char *)load_data("models/stories260K-hf/tokenizer.json", &n);
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    CHECK(j != NULL);
    if (!j) return;
    /* 100 more added tokens: 612 ids on a 512-row embedding */
    cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    for (int i = 512; i < 612; i++) {
        char c[32];
        snprintf(c, sizeof c, "<extra_%d>", i);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", i);
        cJSON_AddStringToObject(t, "content", c);
        cJSON_AddBoolToObject(t, "special", true);
        cJSON_AddItemToArray(added, t);
    }
    char *big = cJSON_PrintUnformatted(j);
    char d[1024];
    expect_load("612 tokens, 512 rows", hf_variant(d, sizeof d, "rope_scaling", "null", big), FTUNE_ERR_FORMAT, "612 tokens",
                "512 rows");
    /* and vocab_size 612 with the 512-row file is a shape error */
    expect_load("vocab_size 612", hf_variant(d, sizeof d, "vocab_size", "612", big), FTUNE_ERR_FORMAT,
                "model.embed_tokens.weight", "612");
    free(big);
    cJSON_Delete(j);
    /* an empty model.vocab (only the three added special tokens left) */
    text = (char *)load_data("models/stories260K-hf/tokenizer.json", &n);
    j = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    if (!j) return;
    cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    cJSON_ReplaceItemInObjectCaseSensitive(model, "vocab", cJSON_CreateObject());
    cJSON_ReplaceItemInObjectCaseSensitive(model, "merges", cJSON_CreateArray());
    char *empty = cJSON_PrintUnformatted(j);
    expect_load("empty vocab", hf_variant(d, sizeof d, "rope_scaling", "null", empty), FTUNE_ERR_FORMAT, "vocab",
                "empty");
    free(empty);
    cJSON_Delete(j);
}

/* Rewrites stories260K.gguf with metadata key `key` replaced by what set()
 * writes (removed when set is NULL; added when the file lacks it), tensors whose name starts with
 * `drop_prefix` left out, and `extra_tokens` more tokens. */
typedef ftune_status (*gguf_set_fn)(gguf_writer *w, const char *key);
static const char *gguf_variant(char *out, size_t cap, const char *key, gguf_set_fn set, int extra_tokens) {
    static int k;
    char src[1024];
    snprintf(out, cap, "%s/v%d.gguf", tmp_dir, k++);
    gguf_file g;
    if (ft_gguf_open(&g, check_data_path(src, sizeof src, "models/stories260K/stories260K.gguf"))) return NULL;
    gguf_writer *w;
    ftune_status st = ft_gguf_writer_new(&w);
    char **strs = NULL;
    bool replaced = false;
    for (uint64_t i = 0; !st && i < g.n_kv; i++) {
        const gguf_kv *kv = &g.kv[i];
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)kv->key.len, kv->key.ptr);
        if (key && strcmp(name, key) == 0) { st = set ? set(w, name) : FTUNE_OK; replaced = true; continue; }
        if (kv->type == GGUF_T_STRING) {
            char *v = ft_gguf_str_dup(kv->str);
            st = ft_gguf_writer_set_str(w, name, v);
            free(v);
        } else if (kv->type == GGUF_T_U32) st = ft_gguf_writer_set_u32(w, name, (uint32_t)kv->v.u);
        else if (kv->type == GGUF_T_I32) st = ft_gguf_writer_set_i32(w, name, (int32_t)kv->v.i);
        else if (kv->type == GGUF_T_F32) st = ft_gguf_writer_set_f32(w, name, (float)kv->v.f);
        else if (kv->type == GGUF_T_BOOL) st = ft_gguf_writer_set_bool(w, name, kv->v.u != 0);
        else if (kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_STRING) {
            gguf_str_array a;
            if ((st = ft_gguf_get_str_array(&g, name, &a))) break;
            size_t n = a.n + (size_t)extra_tokens;
            strs = calloc(n, sizeof *strs);
            for (size_t t = 0; t < n; t++) {
                char b[32];
                snprintf(b, sizeof b, "<extra_%zu>", t);
                strs[t] = t < a.n ? ft_gguf_str_dup(a.items[t]) : strdup(b);
            }
            st = ft_gguf_writer_set_str_array(w, name, (const char *const *)strs, n);
            for (size_t t = 0; t < n; t++) free(strs[t]);
            free(strs);
            free(a.items);
        } else if (kv->type == GGUF_T_ARRAY && (kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_I32)) {
            size_t n = kv->arr_n + (size_t)extra_tokens;
            int32_t *v = calloc(n, 4);
            memcpy(v, kv->arr_data, kv->arr_n * 4);
            for (size_t t = kv->arr_n; t < n; t++) v[t] = kv->arr_type == GGUF_T_I32 ? 1 : 0; /* normal, score 0.0f */
            st = kv->arr_type == GGUF_T_F32 ? ft_gguf_writer_set_f32_array(w, name, (const float *)v, n)
                                            : ft_gguf_writer_set_i32_array(w, name, v, n);
            free(v);
        } else {
            fprintf(stderr, "  gguf_variant: key %s has type %d\n", name, kv->type);
            st = FTUNE_ERR_UNSUPPORTED;
        }
    }
    if (!st && key && set && !replaced) st = set(w, key);
    for (uint64_t i = 0; !st && i < g.n_tensors; i++) {
        const gguf_tensor_info *t = &g.tensors[i];
        char name[FT_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (key && key[0] == '!' && strncmp(name, key + 1, strlen(key + 1)) == 0) continue;
        int64_t shape[4];
        for (uint32_t d = 0; d < t->n_dims; d++) shape[d] = (int64_t)t->ne[t->n_dims - 1 - d];
        st = ft_gguf_writer_add_tensor(w, name, t->dtype, (int)t->n_dims, shape, t->data);
    }
    if (!st) st = ft_gguf_writer_write(w, out);
    ft_gguf_writer_free(w);
    ft_gguf_close(&g);
    CHECKF(st == FTUNE_OK, "gguf_variant %s: %s", key ? key : "", ftune_last_error());
    return st ? NULL : out;
}
static ftune_status set_ctx_str(gguf_writer *w, const char *key) { return ft_gguf_writer_set_str(w, key, "2048"); }
static ftune_status set_inf(gguf_writer *w, const char *key) { return ft_gguf_writer_set_f32(w, key, INFINITY); }
static ftune_status set_nan(gguf_writer *w, const char *key) { return ft_gguf_writer_set_f32(w, key, NAN); }
static ftune_status set_4(gguf_writer *w, const char *key) { return ft_gguf_writer_set_u32(w, key, 4); }
static ftune_status set_zero(gguf_writer *w, const char *key) { return ft_gguf_writer_set_u32(w, key, 0); }
static ftune_status set_yarn(gguf_writer *w, const char *key) {
    ftune_status st = ft_gguf_writer_set_str(w, key, "yarn");
    return st ? st : ft_gguf_writer_set_f32(w, "llama.rope.scaling.factor", 4.0f);
}

static void test_gguf_model_checks(void) {
    char p[1024];
    expect_load("unchanged", gguf_variant(p, sizeof p, NULL, NULL, 0), FTUNE_OK, NULL, NULL);
    expect_load("no context_length: default", gguf_variant(p, sizeof p, "llama.context_length", NULL, 0), FTUNE_OK, NULL, NULL);
    expect_load("context_length string", gguf_variant(p, sizeof p, "llama.context_length", set_ctx_str, 0),
                FTUNE_ERR_FORMAT, "llama.context_length", ".gguf");
    expect_load("context_length 0", gguf_variant(p, sizeof p, "llama.context_length", set_zero, 0),
                FTUNE_ERR_FORMAT, "llama.context_length", ".gguf");
    expect_load("eps inf", gguf_variant(p, sizeof p, "llama.attention.layer_norm_rms_epsilon", set_inf, 0),
                FTUNE_ERR_FORMAT, "layer_norm_rms_epsilon", ".gguf");
    expect_load("eps nan", gguf_variant(p, sizeof p, "llama.attention.layer_norm_rms_epsilon", set_nan, 0),
                FTUNE_ERR_FORMAT, "layer_norm_rms_epsilon", ".gguf");
    expect_load("rope theta inf", gguf_variant(p, sizeof p, "llama.rope.freq_base", set_inf, 0),
                FTUNE_ERR_FORMAT, "rope.freq_base", ".gguf");
    expect_load("rope scaling yarn", gguf_variant(p, sizeof p, "llama.rope.scaling.type", set_yarn, 0),
                FTUNE_ERR_UNSUPPORTED, "yarn", ".gguf");
    expect_load("4 of 5 blocks", gguf_variant(p, sizeof p, "llama.block_count", set_4, 0), FTUNE_ERR_FORMAT,
                "blk.4.", "not used");
    expect_load("612 tokens, 512 rows", gguf_variant(p, sizeof p, NULL, NULL, 100), FTUNE_ERR_FORMAT, "612 tokens",
                "512 rows");
    expect_load("no output_norm", gguf_variant(p, sizeof p, "!output_norm", NULL, 0), FTUNE_ERR_FORMAT,
                "output_norm.weight", "missing");
}

/* llama2.c: vocab_size INT32_MIN has no absolute value (negating it was
 * undefined behaviour, caught by the sanitizer build). */
static void test_llama2c_vocab_int_min(void) {
    int32_t h[7] = { 64, 172, 5, 8, 4, INT32_MIN, 512 };
    char p[1024];
    tmp_path(p, sizeof p, "intmin.bin");
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fwrite(h, sizeof h, 1, f);
    fwrite(h, sizeof h, 1, f);
    fclose(f);
    expect_load("vocab INT32_MIN", p, FTUNE_ERR_FORMAT, "vocabulary size", "intmin.bin");
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/ftune-test-formats-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) { perror("mkdtemp"); return 2; }
    RUN(test_gguf_stories260k);
    RUN(test_gguf_vocab_gpt2);
    RUN(test_st_stories260k_hf);
    RUN(test_st_adapter);
    RUN(test_st_roundtrip);
    RUN(test_gguf_writer_roundtrip);
    RUN(test_gguf_truncated);
    RUN(test_st_truncated);
    RUN(test_gguf_bad);
    RUN(test_st_bad);
    RUN(test_hf_config_checks);
    RUN(test_hf_tokenizer_vocab);
    RUN(test_gguf_model_checks);
    RUN(test_llama2c_vocab_int_min);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
    CHECK_EXIT();
}
