/* model.c — loading dispatch, weight binding with shape/dtype checks, model
 * info and teardown. The format-specific readers are model_hf.c,
 * model_gguf.c and model_llama2c.c. */
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "cpu/cpu.h"

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The owned list's capacity after one more buffer than cap holds. */
int ft_module_rope_heads(const ft_config *c, ft_module mod) {
    return mod == FT_MOD_Q ? c->NH : mod == FT_MOD_K ? c->NKV : 0;
}

static int grown_cap(int cap) { return cap ? cap * 2 : 64; }

size_t ft_model_owned_list_bytes(int n_owned) {
    int cap = 0;
    while (cap < n_owned) cap = grown_cap(cap);
    return (size_t)cap * sizeof(ft_owned);
}

size_t ft_held_bytes(ft_dtype dt, int64_t rows, int64_t cols) {
    return (size_t)rows * (size_t)ft_dtype_nbytes(dt, cols);
}

static bool owned_room(ftune_model *m) {
    if (m->n_owned < m->cap_owned) return true;
    int cap = grown_cap(m->cap_owned);
    ft_owned *n = ft_mem_realloc(FT_MEM_OTHER, m->owned, (size_t)m->cap_owned * sizeof *n, (size_t)cap * sizeof *n);
    if (!n) return false;
    m->owned = n;
    m->cap_owned = cap;
    return true;
}

ftune_status ft_model_own(ftune_model *m, void *p) {
    if (!owned_room(m)) { free(p); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    m->owned[m->n_owned++] = (ft_owned){ p, 0, false };
    return FTUNE_OK;
}

void *ft_model_alloc(ftune_model *m, size_t n) {
    void *p = owned_room(m) ? ft_mem_alloc(FT_MEM_WEIGHTS, n) : NULL;
    if (!p) { ft_err(FTUNE_ERR_NOMEM, "out of memory for %zu bytes of weights", n); return NULL; }
    m->owned[m->n_owned++] = (ft_owned){ p, n, true };
    m->owned_bytes += n;
    return p;
}

void ft_model_mem_plan(const ftune_model *m, ft_mem_table *t) {
    /* weight_bytes counts every bound tensor as stored, the vectors that
     * were copied included: the mapping holds them too */
    /* converted matrices are read from their copies, quantized ones from theirs (owned) */
    int64_t mapped = m->weight_bytes - m->converted_bytes - m->quant_bytes;
    t->planned[FT_MEM_ROW_MAPPED] = mapped > 0 ? (size_t)mapped : 0;
    t->planned[FT_MEM_WEIGHTS] += m->owned_bytes;
    t->planned[FT_MEM_OTHER] += (size_t)m->cap_owned * sizeof *m->owned;
    t->has_plan[FT_MEM_ROW_MAPPED] = t->has_plan[FT_MEM_WEIGHTS] = t->has_plan[FT_MEM_OTHER] = true;
}

static FTUNE_MUST_USE ftune_status check_shape(const ft_tensor *src, int ndim, int64_t d0, int64_t d1) {
    bool ok = src->ndim == ndim && src->shape[0] == d0 && (ndim < 2 || src->shape[1] == d1);
    if (ok) return FTUNE_OK;
    char got[96] = "", want[64];
    for (int i = 0; i < src->ndim; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)src->shape[i]);
    if (ndim == 1) snprintf(want, sizeof want, "%lld", (long long)d0);
    else snprintf(want, sizeof want, "%lld, %lld", (long long)d0, (long long)d1);
    return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": shape [%s] does not match the config (expected [%s])", src->name,
                  got, want);
}

/* The first element of n whose exponent bits are all ones (inf or NaN) in
 * an f32, f16 or bf16 array, or n: integer tests on the stored bits, which
 * vectorize, in blocks with one branch each. */
static int64_t first_non_finite(ft_dtype dt, const void *data, int64_t n) {
    const int64_t blk = 4096;
    for (int64_t i0 = 0; i0 < n; i0 += blk) {
        int64_t i1 = i0 + blk < n ? i0 + blk : n;
        unsigned bad = 0;
        if (dt == FT_F32) {
            const uint32_t *u = (const uint32_t *)data;
            for (int64_t i = i0; i < i1; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
        } else {
            const uint16_t *h = (const uint16_t *)data;
            uint16_t e = dt == FT_F16 ? 0x7c00u : 0x7f80u;
            for (int64_t i = i0; i < i1; i++) bad |= (uint16_t)(h[i] & e) == e;
        }
        if (!bad) continue;
        float v[1];
        for (int64_t i = i0; i < i1; i++) {
            ft_types[dt].to_f32((const uint8_t *)data + (size_t)i * ft_types[dt].block_bytes, v, 1);
            if (!isfinite(v[0])) return i;
        }
    }
    return n;
}

/* A weight stored as f32, f16 or bf16 holds no inf or NaN: one would reach
 * every output as NaN (or be trained from), far from its cause. Quantized
 * types are not read here (their blocks' scales are checked by no one yet). */
static FTUNE_MUST_USE ftune_status check_finite(const ft_tensor *t) {
    if (t->dtype != FT_F32 && t->dtype != FT_F16 && t->dtype != FT_BF16) return FTUNE_OK;
    int64_t n = ft_tensor_numel(t), i = first_non_finite(t->dtype, t->data, n);
    if (i == n) return FTUNE_OK;
    float v;
    ft_types[t->dtype].to_f32((const uint8_t *)t->data + (size_t)i * ft_types[t->dtype].block_bytes, &v, 1);
    int64_t cols = t->ndim == 2 ? t->shape[1] : n;
    char at[48];
    if (t->ndim == 2) snprintf(at, sizeof at, "[%lld, %lld]", (long long)(i / cols), (long long)(i % cols));
    else snprintf(at, sizeof at, "[%lld]", (long long)i);
    return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": element %s is %s: a model's weights must be finite", t->name, at,
                  isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf");
}

static void count(ftune_model *m, const ft_tensor *t) {
    m->n_params += ft_tensor_numel(t);
    m->weight_bytes += (int64_t)t->nbytes;
    m->dtype_mask |= 1ull << t->dtype;
}

ftune_status ft_model_bind_vec(ftune_model *m, float **dst, const ft_tensor *src, int64_t n) {
    ftune_status st = check_shape(src, 1, n, 0);
    if (st) return st;
    if (!ft_types[src->dtype].is_float || ft_types[src->dtype].block != 1)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s not supported for a vector", src->name,
                      ft_types[src->dtype].name);
    if ((st = check_finite(src))) return st;
    float *v = ft_model_alloc(m, ft_held_bytes(FT_F32, 1, n));
    if (!v) return ft_err(FTUNE_ERR_NOMEM, "out of memory for tensor \"%s\"", src->name);
    ft_types[src->dtype].to_f32(src->data, v, n);
    count(m, src);
    *dst = v;
    return FTUNE_OK;
}

ftune_status ft_model_bind_linear(ftune_model *m, ft_linear *dst, const ft_tensor *src, int out, int in) {
    ftune_status st = check_shape(src, 2, out, in);
    if (st) return st;
    if (!ft_types[src->dtype].is_float)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": dtype %s cannot be a weight", src->name,
                      ft_types[src->dtype].name);
    if (in % ft_types[src->dtype].block && !ft_types[src->dtype].pad_rows)
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": row of %d is not a whole number of %s blocks", src->name, in,
                      ft_types[src->dtype].name);
    if ((st = check_finite(src))) return st;
    dst->w = *src;
    dst->in = in;
    dst->out = out;
    count(m, src);
    return FTUNE_OK;
}

ftune_status ft_compute_parse(const char *name, const char *what, ft_dtype *out) {
    *out = FT_F32;
    if (!name) return FTUNE_OK;
    ft_dtype t = ft_dtype_by_name(name);
    if (t != FT_F32 && t != FT_BF16 && t != FT_F16)
        return ft_err(FTUNE_ERR_ARG, "%s \"%s\" is not one of f32, bf16, f16", what, name);
    *out = t;
    return FTUNE_OK;
}

/* The matrices a compute type applies to, in a fixed order: the
 * embedding, each layer's seven Linears, the head when untied. */
static int n_matrices(const ftune_model *m) { return 1 + m->cfg.L * FT_N_MODS + (m->cfg.tied ? 0 : 1); }
static ft_tensor *matrix(ftune_model *m, int i) {
    if (i == 0) return &m->tok_embd;
    i--;
    if (i < m->cfg.L * FT_N_MODS) return &ft_layer_linear(&m->layers[i / FT_N_MODS], (ft_module)(i % FT_N_MODS))->w;
    return &m->lm_head.w;
}
static bool plain_float(ft_dtype dt) { return ft_types[dt].is_float && ft_types[dt].block == 1; }

ftune_status ft_model_check_range(const ftune_model *m, ft_dtype compute) {
    if (compute != FT_F16) return FTUNE_OK;
    ftune_model *mm = (ftune_model *)m; /* matrix() only reads here */
    for (int i = 0; i < n_matrices(m); i++) {
        const ft_tensor *t = matrix(mm, i);
        if (t->dtype == FT_F16 || !ft_types[t->dtype].is_float || t->ndim != 2) continue;
        int64_t rows = t->shape[0], cols = t->shape[1];
        float *row = malloc((size_t)cols * sizeof(float));
        if (!row) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        for (int64_t r = 0; r < rows; r++) {
            ft_tensor_row_f32(t, r, row);
            for (int64_t j = 0; j < cols; j++)
                if (!(fabsf(row[j]) <= 65504.0f)) {
                    float v = row[j];
                    free(row);
                    return ft_err(FTUNE_ERR_RANGE, "tensor \"%s\": value %g at [%lld, %lld] is outside f16's range "
                                  "(largest 65504): --dtype f16 would make it inf. Use --dtype bf16 (f32's range)",
                                  t->name, (double)v, (long long)r, (long long)j);
                }
        }
        free(row);
    }
    return FTUNE_OK;
}

/* After t's values were converted to an owned copy: drops the pages of the
 * file mapping that lie wholly inside t's old bytes from the resident set
 * (a read-only file mapping: they are only re-read from the file if
 * touched again, which nothing does), so that the process does not hold
 * both the file's f32 and the copy's bf16. Never for bytes in an owned
 * buffer (DONTNEED would zero them). */
static bool in_owned(const ftune_model *m, const void *data) {
    const uint8_t *p = data;
    for (int k = 0; k < m->n_owned; k++) {
        const uint8_t *o = m->owned[k].p;
        if (p >= o && p < o + (m->owned[k].counted ? m->owned[k].n : 1)) return true;
        if (!m->owned[k].counted && p == o) return true;
    }
    return false;
}

static void release_mapped(const ftune_model *m, const void *data, size_t n) {
    const uint8_t *p = data;
    if (in_owned(m, data)) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
              b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

ftune_status ft_model_set_compute(ftune_model *m, ft_dtype compute) {
    if (compute == FT_F32) { m->compute = FT_F32; return FTUNE_OK; }
    if (compute != FT_BF16 && compute != FT_F16)
        return ft_err(FTUNE_ERR_ARG, "compute dtype %s is not f32, bf16 or f16", ft_types[compute].name);
    ftune_status st = ft_model_check_range(m, compute);
    if (st) return st;
    for (int i = 0; i < n_matrices(m); i++) {
        ft_tensor *t = matrix(m, i);
        if (t->dtype == compute || !plain_float(t->dtype) || t->ndim != 2) continue;
        int64_t rows = t->shape[0], cols = t->shape[1];
        size_t rb = ft_dtype_nbytes(compute, cols);
        uint8_t *dst = ft_model_alloc(m, ft_held_bytes(compute, rows, cols));
        float *row = malloc((size_t)cols * sizeof(float));
        if (!dst || !row) {
            free(row);
            return ft_err(FTUNE_ERR_NOMEM, "out of memory converting \"%s\" to %s", t->name, ft_types[compute].name);
        }
        for (int64_t r = 0; r < rows; r++) {
            ft_tensor_row_f32(t, r, row);
            ft_types[compute].from_f32(row, dst + (size_t)r * rb, cols);
        }
        free(row);
        /* a tied head shares these bytes: it is re-pointed below, before any use */
        /* from the mapping: its pages go; from an owned buffer (a bitsandbytes weight held
         * in f32), that buffer stays counted as owned and the mapping never held it */
        if (!in_owned(m, t->data)) m->converted_bytes += (int64_t)t->nbytes;
        release_mapped(m, t->data, t->nbytes);
        t->data = dst;
        t->dtype = compute;
        t->nbytes = rb * (size_t)rows;
    }
    /* a tied head is the embedding's matrix, in its new dtype */
    if (m->cfg.tied) m->lm_head.w = m->tok_embd;
    m->compute = compute;
    return FTUNE_OK;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Every id the tokenizer can produce must index a row of the embedding. An
 * embedding with MORE rows than the tokenizer has ids is legal (vocabularies
 * padded to a multiple of 64, e.g. 32000 tokens in 32064 rows). */
static FTUNE_MUST_USE ftune_status check_vocab(const ftune_model *m, const char *path) {
    int n = ftune_tokenizer_n_vocab(m->tok);
    if (n <= 0) return ft_err(FTUNE_ERR_FORMAT, "%s: the tokenizer has no tokens", path);
    if (n > m->cfg.V)
        return ft_err(FTUNE_ERR_FORMAT, "%s: the tokenizer has %d tokens but the token embedding has %d rows "
                      "(vocab_size): ids %d..%d would have no embedding", path, n, m->cfg.V, m->cfg.V, n - 1);
    return FTUNE_OK;
}

ftune_status ftune_model_load(ftune_model **out, const char *path, const ftune_load_opts *opts) {
    *out = NULL;
    ftune_model *m = calloc(1, sizeof *m);
    if (!m) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st;
    if (ft_is_dir(path)) st = ft_load_hf(m, path);
    else if (!ft_file_exists(path)) st = ft_err(FTUNE_ERR_IO, "%s: no such file or directory", path);
    else if (ends_with(path, ".gguf")) st = ft_load_gguf(m, path);
    else if (ends_with(path, ".safetensors") || ends_with(path, "config.json")) {
        /* a file inside a HF directory: load the directory */
        char *dir = ft_strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = 0;
        st = dir ? ft_load_hf(m, slash ? dir : ".") : ft_err(FTUNE_ERR_NOMEM, "out of memory");
        free(dir);
    } else st = ft_load_llama2c(m, path, opts ? opts->tokenizer_path : NULL);
    if (st == FTUNE_OK && m->tok) st = check_vocab(m, path);
    if (st == FTUNE_OK && opts && opts->context_length > 0) m->cfg.max_T = opts->context_length;
    /* quantize first: the compute conversion then leaves the quantized Linears as they are */
    if (st == FTUNE_OK && opts && opts->quant) {
        ft_dtype q;
        st = ft_quant_from_name(opts->quant, &q);
        if (st == FTUNE_OK) st = ft_model_quantize(m, q);
        if (st) ft_err_prefix(st, "%s: --quant %s", path, opts->quant);
    }
    ft_dtype compute = FT_F32;
    if (st == FTUNE_OK) st = ft_compute_parse(opts ? opts->dtype : NULL, "dtype", &compute);
    if (st == FTUNE_OK && compute != FT_F32) st = ft_model_set_compute(m, compute);
    if (st != FTUNE_OK) {
        ftune_model_free(m);
        return st;
    }
    *out = m;
    return FTUNE_OK;
}

int ftune_path_is_vocab_only(const char *path) {
    if (!path) return 0;
    if (ft_is_dir(path)) {
        static const char *const weights[] = { "config.json", "model.safetensors", "model.safetensors.index.json" };
        char p[4096];
        for (int k = 0; k < 3; k++) {
            snprintf(p, sizeof p, "%s/%s", path, weights[k]);
            if (ft_file_exists(p)) return 0;
        }
        static const char *const toks[] = { "tokenizer.json", "vocab.json", "tokenizer.model", "tokenizer.bin" };
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "%s/%s", path, toks[k]);
            if (ft_file_exists(p)) return 1;
        }
        return 0;
    }
    if (!ft_file_exists(path)) return 0;
    if (ends_with(path, ".gguf")) {
        gguf_file g;
        if (ft_gguf_open(&g, path)) return 0;
        int r = g.n_tensors == 0 && ft_gguf_find(&g, "tokenizer.ggml.tokens") != NULL;
        ft_gguf_close(&g);
        return r;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return ends_with(path, "tokenizer.json") || strcmp(base, "tokenizer.model") == 0;
}

void ftune_model_free(ftune_model *m) {
    if (!m) return;
    if (m->adapter && m->free_adapter) m->free_adapter(m->adapter);
    ft_tokenizer_free(m->tok);
    for (int i = 0; i < m->n_owned; i++) {
        if (m->owned[i].counted) ft_mem_free(FT_MEM_WEIGHTS, m->owned[i].p, m->owned[i].n);
        else free(m->owned[i].p);
    }
    ft_mem_free(FT_MEM_OTHER, m->owned, (size_t)m->cap_owned * sizeof *m->owned);
    for (int i = 0; i < m->n_shards; i++) ft_st_close(&m->shards[i]);
    free(m->shards);
    if (m->gguf) { ft_gguf_close(m->gguf); free(m->gguf); }
    ft_mmap_close(&m->bin);
    free(m->layers);
    free(m);
}

const ftune_tokenizer *ftune_model_tokenizer(const ftune_model *m) { return m->tok; }
const char *ftune_model_dtype(const ftune_model *m) { return ft_types[m->compute].name; }

int ftune_dtype_is_native(const char *dtype) {
    ft_dtype c;
    if (ft_compute_parse(dtype, "dtype", &c)) { ft_err_clear(); return 0; }
    if (c == FT_F32) return 1;
    /* f16: no AVX512_FP16 / AMX-FP16 kernels exist here (AVX512-FP16 sums in f16 and has no f16
     * dot product into f32, which f16 compute needs); F16C only widens */
    return c == FT_BF16 && ft_cpu_has_avx512bf16() && ft_cpu_level() >= FT_CPU_AVX512BF16;
}

void ftune_model_get_info(const ftune_model *m, ftune_model_info *info) {
    memset(info, 0, sizeof *info);
    const ft_config *c = &m->cfg;
    snprintf(info->arch, sizeof info->arch, "%s", c->arch);
    snprintf(info->format, sizeof info->format, "%s", m->format);
    info->dim = c->C; info->hidden_dim = c->F; info->n_layers = c->L; info->n_heads = c->NH;
    info->n_kv_heads = c->NKV; info->head_dim = c->HS; info->vocab_size = c->V;
    info->context_length = c->max_T;
    info->rope_theta = c->rope_theta; info->norm_eps = c->norm_eps;
    ft_rope_scaling_text(&c->rope_scaling, info->rope_scaling, sizeof info->rope_scaling);
    info->tied_embeddings = c->tied; info->qkv_bias = c->qkv_bias;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    for (int t = 0; t < FT_NTYPES; t++)
        if (m->dtype_mask & (1ull << t))
            snprintf(info->dtypes + strlen(info->dtypes), sizeof info->dtypes - strlen(info->dtypes), "%s%s",
                     info->dtypes[0] ? "," : "", ft_types[t].name);
    if (m->tok) {
        snprintf(info->tokenizer, sizeof info->tokenizer, "%s", m->tok_kind);
        info->n_vocab_tokens = ftune_tokenizer_n_vocab(m->tok);
    }
}
