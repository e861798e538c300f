/* model_write.c — a model written as a new model file, with an adapter set
 * folded in (W' = W + the adapter's part, in f32) or none: a Hugging Face
 * directory streamed one row at a time through the safetensors writer's fill
 * callback, or a GGUF file streamed the same way through the GGUF writer's,
 * from any base: a GGUF base's metadata is copied, a Hugging Face or llama2.c
 * base's is written as llama.cpp's converter writes it (architecture keys;
 * the vocabulary: tokenizer/tokenizer_gguf.c); a Hugging Face directory
 * from a GGUF or llama2.c base gets its tokenizer as tokenizer.json
 * (tokenizer/tokenizer_hf.c). */
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

/* The adapter of Linear mod in block l that a write folds in: opts->adapters',
 * else the model's default adapter's, else none. */
static const ft_adapter_inst *merged_adapter(const ftune_model *m, const ft_model_write_opts *opts, int l, ft_module mod) {
    const ft_adapter_inst *const *set = opts && opts->adapters ? opts->adapters
                                      : m->adapter && m->adapter_set ? m->adapter_set(m->adapter) : NULL;
    return set ? set[l * FT_N_MODS + mod] : NULL;
}

void ft_merged_row(float *row, const ft_tensor *t, const ft_adapter_inst *ad, int o, int cols) {
    ft_tensor_row_f32(t, o, row);
    if (ad) ad->kind->merge_row(row, ad, o, cols);
}

/* ------------------------------------------------------------- row sources */

/* Where the rows of one output tensor come from. */
typedef struct {
    const char *name;         /* the output tensor's, for messages */
    const ft_tensor *t;       /* a 2-D weight in any dtype, or NULL */
    const ft_adapter_inst *ad; /* added to t's rows (any adapter kind), or NULL */
    const float *vec;         /* a 1-D f32 vector (norms, biases), or NULL */
    int rows, cols;           /* 1 row for a vector */
    int perm_heads;           /* > 0: rows are permuted head by head between the RoPE layouts */
    bool to_interleaved;      /* the output is interleaved, the source rotate-half (else the reverse) */
} row_src;

/* The source row of output row R. */
static int src_row(const row_src *s, int R) {
    if (s->perm_heads <= 0) return R;
    int HS = s->rows / s->perm_heads, half = HS / 2, h = R / HS, j = R % HS;
    if (s->to_interleaved) return h * HS + (j % 2) * half + j / 2;
    return h * HS + 2 * (j % half) + j / half;
}

/* Row R of the output in f32. */
static void make_row(const row_src *s, int R, float *row) {
    if (s->vec) {
        if (s->perm_heads > 0) /* a q/k bias: one row of `rows` elements, permuted likewise */
            for (int i = 0; i < s->cols; i++) {
                row_src one = { .rows = s->cols, .perm_heads = s->perm_heads, .to_interleaved = s->to_interleaved };
                row[i] = s->vec[src_row(&one, i)];
            }
        else memcpy(row, s->vec, (size_t)s->cols * sizeof(float));
        return;
    }
    ft_merged_row(row, s->t, s->ad, src_row(s, R), s->cols);
}

typedef struct {
    row_src *src;
    float *row;               /* (max cols) f32 */
    uint8_t *bytes;           /* (max cols) in the output dtype */
    float *back;              /* (max cols) f32: bytes read back, to check that the dtype held the row */
    int cached_index, cached_row;
    void (*progress)(void *, uint64_t, uint64_t); /* ft_model_write_opts.progress, or NULL */
    void *progress_ctx;
    uint64_t done, total;     /* elements of computed rows: made so far, in all */
} fill_state;

static void progress_init(fill_state *fs, const ft_model_write_opts *opts) {
    fs->progress = opts ? opts->progress : NULL;
    fs->progress_ctx = opts ? opts->progress_ctx : NULL;
}

/* The largest magnitude a dtype holds, as its message puts it, or NULL. */
static const char *dtype_range(ft_dtype t) {
    switch (t) {
    case FT_F16: return "f16 holds magnitudes up to 65504";
    case FT_BF16: return "bf16 holds magnitudes up to 3.39e38";
    case FT_Q8_0: return "q8_0's f16 block scale (the block's largest magnitude / 127) holds up to 65504, so "
                         "magnitudes up to 8.3e6";
    case FT_Q4_0: return "q4_0's f16 block scale (the block's largest magnitude / 8) holds up to 65504, so "
                         "magnitudes up to 5.2e5";
    default: return ft_types[t].block > 1 ? "its f16 block scales hold up to 65504" : NULL;
    }
}

/* Whether the row written as dtype (fs->bytes, made from fs->row) reads back
 * finite: a value beyond the dtype's range (f16's, or a block's f16 scale)
 * would be written as inf or NaN, which no reader can tell from the
 * model's own. An error names the tensor, row, column and value. */
static FTUNE_MUST_USE ftune_status check_row(fill_state *fs, const row_src *s, ft_dtype dtype, int R) {
    const float *x = fs->row;
    for (int j = 0; j < s->cols; j++)
        if (!isfinite(x[j]))
            return ft_err(FTUNE_ERR_RANGE, "%s: row %d, column %d is %g after the merge (the base or the "
                          "adapter holds a value that is not finite); nothing was written", s->name, R, j, (double)x[j]);
    if (dtype == FT_F32 || !ft_types[dtype].to_f32) return FTUNE_OK;
    ft_types[dtype].to_f32(fs->bytes, fs->back, s->cols);
    for (int j = 0; j < s->cols; j++) {
        if (isfinite(fs->back[j])) continue;
        /* the value that overflowed: the element, or its block's largest */
        int b = ft_types[dtype].block, j0 = j / b * b, j1 = j0 + b < s->cols ? j0 + b : s->cols, at = j;
        for (int i = j0; i < j1; i++)
            if (fabsf(x[i]) > fabsf(x[at])) at = i;
        const char *range = dtype_range(dtype);
        return ft_err(FTUNE_ERR_RANGE, "%s: row %d, column %d is %g, which %s cannot hold (%s): it would be "
                      "written as %s; nothing was written: give --dtype f32 (or bf16)", s->name, R, at, (double)x[at],
                      ft_types[dtype].name, range ? range : "beyond its range", isnan(fs->back[j]) ? "NaN" : "inf");
    }
    return FTUNE_OK;
}

/* st_write's generator: bytes [offset, offset+n) of tensor `index`, built
 * row by row (a row may straddle two calls; the last one is cached). */
static ftune_status fill_rows(void *ctx, int index, ft_dtype dtype, void *dst, uint64_t offset, size_t n) {
    fill_state *fs = ctx;
    const row_src *s = &fs->src[index];
    size_t row_bytes = (size_t)ft_dtype_nbytes(dtype, s->cols); /* whole blocks: checked when the tensor was added */
    uint8_t *out = dst;
    while (n > 0) {
        int R = (int)(offset / row_bytes);
        size_t in_row = (size_t)(offset % row_bytes), k = row_bytes - in_row < n ? row_bytes - in_row : n;
        if (fs->cached_index != index || fs->cached_row != R) {
            make_row(s, R, fs->row);
            ft_types[dtype].from_f32(fs->row, fs->bytes, s->cols);
            ftune_status st = check_row(fs, s, dtype, R);
            if (st) return st;
            fs->cached_index = index;
            fs->cached_row = R;
            fs->done += (uint64_t)s->cols;
            if (fs->progress) fs->progress(fs->progress_ctx, fs->done < fs->total ? fs->done : fs->total, fs->total);
        }
        memcpy(out, fs->bytes + in_row, k);
        out += k;
        offset += k;
        n -= k;
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------- Hugging Face */

static bool st_storable(ft_dtype t) { return t == FT_F32 || t == FT_F16 || t == FT_BF16; }

static FTUNE_MUST_USE ftune_status parse_dtype(const char *s, ft_dtype *out) {
    *out = ft_dtype_by_name(s);
    if (st_storable(*out)) return FTUNE_OK;
    if (ft_model_gguf_type_known(s))
        return ft_err(FTUNE_ERR_ARG, "merge: dtype \"%s\" is written to GGUF: give an output path ending in .gguf", s);
    return ft_err(FTUNE_ERR_ARG, "merge: dtype \"%s\" is not one of %s, %s, %s (or for a bitsandbytes directory %s, %s)",
                  s, ft_types[FT_F32].name, ft_types[FT_BF16].name, ft_types[FT_F16].name, ft_types[FT_NF4].name,
                  ft_types[FT_I8ROW].name);
}

static const char *torch_dtype_name(ft_dtype t) { return st_storable(t) ? ft_types[t].torch_name : ft_types[FT_F32].torch_name; }

/* Directory of an HF base (where its config.json and tokenizer files are). */
static char *base_dir(const ftune_model *m) {
    if (strcmp(m->format, "hf") != 0 || m->n_shards < 1 || !m->shards[0].map.path) return NULL;
    char *d = ft_strdup(m->shards[0].map.path);
    if (!d) return NULL;
    char *slash = strrchr(d, '/');
    if (slash) *slash = 0;
    else strcpy(d, ".");
    return d;
}

/* dtype of a 1-D tensor as the HF base stores it (f32 for other bases). */
static ft_dtype base_vec_dtype(const ftune_model *m, const char *name) {
    for (int i = 0; i < m->n_shards; i++) {
        const st_tensor *t = ft_st_find(&m->shards[i], name);
        if (t && st_storable(t->dtype)) return t->dtype;
    }
    return FT_F32;
}

/* A float as the shortest decimal that reads back as the same float. */
static cJSON *config_from_model(const ftune_model *m, ft_dtype dt) {
    const ft_config *c = &m->cfg;
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const char *arch = strcmp(c->arch, "qwen2") == 0 ? "Qwen2ForCausalLM"
                     : strcmp(c->arch, "mistral") == 0 ? "MistralForCausalLM" : "LlamaForCausalLM";
    const char *mt = strcmp(c->arch, "qwen2") == 0 ? "qwen2" : strcmp(c->arch, "mistral") == 0 ? "mistral" : "llama";
    cJSON *a = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
    cJSON_AddStringToObject(j, "model_type", mt);
    cJSON_AddNumberToObject(j, "hidden_size", c->C);
    cJSON_AddNumberToObject(j, "intermediate_size", c->F);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->L);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->NH);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->NKV);
    if (c->HS * c->NH != c->C) cJSON_AddNumberToObject(j, "head_dim", c->HS);
    cJSON_AddNumberToObject(j, "vocab_size", c->V);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_T);
    cJSON_AddNumberToObject(j, "rms_norm_eps", ft_float_shortest(c->norm_eps));
    cJSON_AddNumberToObject(j, "rope_theta", ft_float_shortest(c->rope_theta));
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (strcmp(mt, "qwen2") != 0) cJSON_AddBoolToObject(j, "attention_bias", c->qkv_bias);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0) cJSON_AddNumberToObject(j, "eos_token_id", c->eos_id);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype_name(dt));
    const ft_rope_scaling *rs = &c->rope_scaling;
    if (rs->type == 1) {
        cJSON *o = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(o, "rope_type", "linear");
        cJSON_AddNumberToObject(o, "factor", ft_float_shortest(rs->factor));
    } else if (rs->type == 2) {
        cJSON *o = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(o, "rope_type", "llama3");
        cJSON_AddNumberToObject(o, "factor", ft_float_shortest(rs->factor));
        cJSON_AddNumberToObject(o, "low_freq_factor", ft_float_shortest(rs->low_freq_factor));
        cJSON_AddNumberToObject(o, "high_freq_factor", ft_float_shortest(rs->high_freq_factor));
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", rs->original_max_pos);
    } else cJSON_AddNullToObject(j, "rope_scaling");
    return j;
}

static FTUNE_MUST_USE ftune_status copy_file(const char *from, const char *to) {
    char *buf;
    size_t n;
    ftune_status st = ft_read_file(from, &buf, &n);
    if (st) return st;
    st = ft_write_file_atomic(to, buf, n);
    free(buf);
    return st;
}

/* generation_config.json for a base without one: BOS, and every token that
 * ends generation (EOS first), as transformers' generate stops on them. */
static FTUNE_MUST_USE ftune_status write_generation_config(const ftune_model *m, const char *dir) {
    const ftune_tokenizer *t = m->tok;
    cJSON *j = cJSON_CreateObject(), *eos = cJSON_CreateArray();
    if (!j || !eos) { cJSON_Delete(j); cJSON_Delete(eos); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    int32_t e = ftune_tokenizer_eos(t);
    if (e >= 0) cJSON_AddItemToArray(eos, cJSON_CreateNumber(e));
    for (int i = 0; i < ftune_tokenizer_n_vocab(t); i++)
        if (i != e && ftune_tokenizer_is_eog(t, i)) cJSON_AddItemToArray(eos, cJSON_CreateNumber(i));
    if (ftune_tokenizer_bos(t) >= 0) cJSON_AddNumberToObject(j, "bos_token_id", ftune_tokenizer_bos(t));
    int n = cJSON_GetArraySize(eos);
    if (n == 1) { cJSON_AddNumberToObject(j, "eos_token_id", cJSON_GetArrayItem(eos, 0)->valuedouble); cJSON_Delete(eos); }
    else if (n > 1) cJSON_AddItemToObject(j, "eos_token_id", eos);
    else cJSON_Delete(eos);
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    ftune_status st = ft_write_json_atomic(path, j);
    cJSON_Delete(j);
    return st;
}

ftune_status ft_model_check_hf_output(const ftune_model *m) {
    if (strcmp(m->format, "hf") == 0 || !m->tok) return FTUNE_OK;
    return ft_tokenizer_hf_check(m->tok);
}

static FTUNE_MUST_USE ftune_status write_hf(const ftune_model *mc, const char *dir, const ft_model_write_opts *opts) {
    ftune_model *m = (ftune_model *)mc; /* only read: ft_model_linear takes a mutable model */
    const ft_config *c = &m->cfg;
    bool force = opts && opts->dtype;
    ft_dtype forced = FT_F32;
    ftune_status st = force ? parse_dtype(opts->dtype, &forced) : FTUNE_OK;
    if (st) return st;
    if (m->rope_freq_factors)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: the base's RoPE frequency factors (rope_freqs.weight) have no "
                      "config.json form here; write GGUF instead", dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    if (!ft_is_dir(dir)) return ft_err(FTUNE_ERR_IO, "%s: exists and is not a directory", dir);

    int n_max = 3 + c->L * (2 + FT_N_MODS + 3);
    st_out_tensor *ts = ft_calloc((size_t)n_max, sizeof *ts);
    row_src *src = ft_calloc((size_t)n_max, sizeof *src);
    char *names = ft_malloc((size_t)n_max * 96);
    int max_cols = c->C > c->F ? c->C : c->F;
    if (c->NH * c->HS > max_cols) max_cols = c->NH * c->HS;
    fill_state fs = { .src = src, .cached_index = -1, .cached_row = -1 };
    fs.row = ft_malloc((size_t)max_cols * sizeof(float));
    fs.bytes = ft_malloc((size_t)max_cols * sizeof(float));
    fs.back = ft_malloc((size_t)max_cols * sizeof(float));
    char *bdir = base_dir(m);
    cJSON *cfg = NULL;
    if (!ts || !src || !names || !fs.row || !fs.bytes || !fs.back) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    /* a base whose tokenizer has no Hugging Face files (GGUF, llama2.c): written as tokenizer.json
     * first, so that one tokenizer.json cannot express is refused before the weights are written */
    if (!bdir && m->tok && (st = ft_tokenizer_to_hf(m->tok, dir, c->max_T))) goto done;
    int n = 0;
    ft_dtype mat_dtype = FT_NTYPES; /* for torch_dtype: the dtype of the first matrix written */
    /* a matrix (from a weight, maybe with an adapter and a q/k permutation) */
#define ADD_MAT(NAME, TENSOR, LORA, HEADS) do { \
        st_out_tensor *t_ = &ts[n]; row_src *s_ = &src[n]; char *nm_ = names + (size_t)n * 96; \
        snprintf(nm_, 96, "%s", NAME); \
        const ft_tensor *w_ = (TENSOR); \
        ft_dtype dt_ = force ? forced : st_storable(w_->dtype) ? w_->dtype : FT_F32; \
        if (mat_dtype == FT_NTYPES) mat_dtype = dt_; \
        *s_ = (row_src){ .name = nm_, .t = w_, .ad = (LORA), .rows = (int)w_->shape[0], .cols = (int)w_->shape[1], .perm_heads = (HEADS) }; \
        *t_ = (st_out_tensor){ .name = nm_, .dtype = dt_, .ndim = 2, .shape = { w_->shape[0], w_->shape[1] } }; \
        if (!s_->ad && !s_->perm_heads && dt_ == w_->dtype) t_->data = w_->data; \
        else { t_->fill = fill_rows; t_->fill_ctx = &fs; t_->fill_index = n; } \
        n++; \
    } while (0)
#define ADD_VEC(NAME, VEC, LEN, HEADS) do { \
        st_out_tensor *t_ = &ts[n]; row_src *s_ = &src[n]; char *nm_ = names + (size_t)n * 96; \
        snprintf(nm_, 96, "%s", NAME); \
        ft_dtype dt_ = force ? forced : base_vec_dtype(m, nm_); \
        *s_ = (row_src){ .name = nm_, .vec = (VEC), .rows = 1, .cols = (LEN), .perm_heads = (HEADS) }; \
        *t_ = (st_out_tensor){ .name = nm_, .dtype = dt_, .ndim = 1, .shape = { (LEN) }, \
                               .fill = fill_rows, .fill_ctx = &fs, .fill_index = n }; \
        n++; \
    } while (0)
    char name[96];
    ADD_MAT("model.embed_tokens.weight", &m->tok_embd, NULL, 0);
    if (!c->tied) ADD_MAT("lm_head.weight", &m->lm_head.w, NULL, 0);
    ADD_VEC("model.norm.weight", m->out_norm, c->C, 0);
    for (int l = 0; l < c->L; l++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        ADD_VEC(name, m->layers[l].attn_norm, c->C, 0);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD_VEC(name, m->layers[l].ffn_norm, c->C, 0);
        for (int k = 0; k < FT_N_MODS; k++) {
            const ft_linear *lin = ft_model_linear(m, l, k);
            int heads = c->rope_interleaved ? ft_module_rope_heads(c, k) : 0;
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, ft_module_path(k));
            ADD_MAT(name, &lin->w, merged_adapter(m, opts, l, k), heads);
            if (lin->bias) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, ft_module_path(k));
                ADD_VEC(name, lin->bias, lin->out, heads);
            }
        }
    }
#undef ADD_MAT
#undef ADD_VEC
    /* bytes: each row buffer holds max_cols elements of up to 4 bytes */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    progress_init(&fs, opts);
    for (int i = 0; i < n; i++)
        if (ts[i].fill) fs.total += (uint64_t)src[i].rows * (uint64_t)src[i].cols;
    if ((st = ft_st_write(path, ts, n, NULL))) goto done;

    /* config.json: the base's own when it has one (torch_dtype updated), else built from the config */
    if (bdir) {
        snprintf(path, sizeof path, "%s/config.json", bdir);
        char *text;
        if ((st = ft_read_file(path, &text, NULL))) goto done;
        cfg = cJSON_Parse(text);
        free(text);
        if (!cJSON_IsObject(cfg)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: not a JSON object", path); goto done; }
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
        cJSON_AddStringToObject(cfg, "torch_dtype", torch_dtype_name(mat_dtype));
        /* transformers 5 spells it "dtype" and prefers it: a stale one would load the weights in the base's dtype */
        if (cJSON_GetObjectItemCaseSensitive(cfg, "dtype"))
            cJSON_ReplaceItemInObjectCaseSensitive(cfg, "dtype", cJSON_CreateString(torch_dtype_name(mat_dtype)));
        /* a quantized base (bitsandbytes) is written dequantized: its quantization_config would make
         * transformers quantize the merged weights again on load, a silent merge into 4-bit */
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    } else if (!(cfg = config_from_model(m, mat_dtype))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((st = ft_write_json_atomic(path, cfg))) goto done;
    if (!bdir && m->tok && (st = write_generation_config(m, dir))) goto done;
    if (bdir) {
        static const char *const files[] = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                             "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                                             "chat_template.jinja" /* transformers 5 keeps the template here */ };
        char from[4096];
        for (size_t i = 0; i < sizeof files / sizeof files[0] && !st; i++) {
            snprintf(from, sizeof from, "%s/%s", bdir, files[i]);
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            if (ft_file_exists(from) && strcmp(from, path) != 0) st = copy_file(from, path);
        }
    }
done:
    cJSON_Delete(cfg);
    free(bdir);
    free(fs.row);
    free(fs.bytes);
    free(fs.back);
    free(names);
    free(src);
    free(ts);
    return st;
}

/* ------------------------------------------------------------- GGUF */

/* The weight types of a GGUF output: a mix as llama.cpp's quantize names
 * them. A writable traits type's name (ft_dtype_gguf_writable: f32, f16,
 * bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) is llama.cpp's
 * file type of that name (its traits' llama_ftype; q4_K and q5_K are
 * Q4_K_M and Q5_K_M, as llama-quantize takes "Q4_K" and "Q5_K"); the named
 * K mixes below are the others; "same" (or none) keeps each tensor's type. */
typedef struct {
    ft_dtype base;           /* the mix's type for most matrices; FT_NTYPES: each tensor's own */
    uint32_t file_type;      /* general.file_type (llama.cpp's LLAMA_FTYPE) */
    bool same;               /* "same" was asked for (not merely no type) */
} gguf_mix;

static const struct { const char *name; ft_dtype base; uint8_t file_type; } k_mixes[] = {
    { "q4_k_s", FT_Q4_K, 14 }, { "q4_k_m", FT_Q4_K, 15 }, { "q5_k_s", FT_Q5_K, 16 }, { "q5_k_m", FT_Q5_K, 17 },
};
#define N_K_MIXES (int)(sizeof k_mixes / sizeof k_mixes[0])

/* The names a GGUF output takes, for messages. */
static void gguf_mix_names(char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "same");
    for (int t = 0; t < FT_NTYPES && k < cap; t++)
        if (ft_dtype_gguf_writable((ft_dtype)t)) k += (size_t)snprintf(buf + k, cap - k, ", %s", ft_types[t].name);
    for (int i = 0; i < N_K_MIXES && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, ", %s", k_mixes[i].name);
}

/* The mix a GGUF output of m is written in, from opts->dtype. */
static FTUNE_MUST_USE ftune_status parse_gguf_mix(const ftune_model *m, const char *path, const char *name, gguf_mix *out) {
    *out = (gguf_mix){ .base = FT_NTYPES };
    if (name && strcasecmp(name, "same") == 0) {
        if (!m->gguf)
            return ft_err(FTUNE_ERR_ARG, "%s: --dtype same keeps each tensor's type as the input GGUF stores it, but the "
                          "input is a %s model, not GGUF: name the type (f32, bf16, f16, q8_0, q4_k_m, ...)", path, m->format);
        out->same = true;
        name = NULL;
    }
    if (!name) return FTUNE_OK;
    for (int i = 0; i < N_K_MIXES; i++)
        if (strcasecmp(name, k_mixes[i].name) == 0) {
            out->base = k_mixes[i].base;
            out->file_type = k_mixes[i].file_type;
            return FTUNE_OK;
        }
    ft_dtype t = ft_dtype_by_name(name);
    if (ft_dtype_gguf_writable(t)) {
        out->base = t;
        out->file_type = ft_types[t].llama_ftype;
        return FTUNE_OK;
    }
    char names[512];
    gguf_mix_names(names, sizeof names);
    if (t < FT_NTYPES && !ft_types[t].in_gguf && ft_types[t].from_f32)
        return ft_err(FTUNE_ERR_ARG, "%s: dtype \"%s\" is a bitsandbytes type, written as a Hugging Face directory (an "
                      "output path without .gguf); a .gguf output takes %s", path, name, names);
    return ft_err(FTUNE_ERR_ARG, "%s: dtype \"%s\" is not one ftune writes to GGUF (%s)", path, name, names);
}

bool ft_model_gguf_type_known(const char *name) {
    if (!name) return false;
    if (strcasecmp(name, "same") == 0) return true;
    for (int i = 0; i < N_K_MIXES; i++)
        if (strcasecmp(name, k_mixes[i].name) == 0) return true;
    return ft_dtype_gguf_writable(ft_dtype_by_name(name));
}

/* What a matrix is to llama_tensor_get_type (llama-quant.cpp). */
typedef enum { CAT_OTHER, CAT_OUTPUT, CAT_ATTN_V, CAT_FFN_DOWN } tensor_cat;

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and
 * every third between. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The type a matrix of `cols` columns stored as `own` is written in:
 * with no mix its own (f32 if GGUF cannot hold it); with a float mix
 * (f32, f16, bf16) that type for every matrix; with a quantized one
 * llama_tensor_get_type's choice for llama/qwen2 models: the output matrix
 * (output.weight, or token_embd when tied to it) q6_K, or q8_0 where the
 * mix is q8_0 or its rows are not whole blocks of the mix's type; in
 * q4_K_M and q5_K_M the attn_v and ffn_down of more_bits' layers q6_K, in
 * q4_K_S those of the first 4 (attn_v) or first eighth (ffn_down) q5_K;
 * with an 80-layer model (llama.cpp's 70B type: qwen2, or llama with
 * grouped-query attention) attn_v q5_K where it would be q4_K. Then rows
 * that are not whole blocks of the choice fall back as llama.cpp's do
 * (q4_K to q5_0, q5_K to q5_1, q6_K to q8_0, then f16: *fell_back); where
 * llama.cpp has no fallback (its 32-element types) the matrix keeps its
 * own type (*kept). */
static ft_dtype gguf_out_dtype(ft_dtype own, const gguf_mix *mx, const ft_config *c, tensor_cat cat, int layer, int cols,
                               bool *kept, bool *fell_back) {
    ft_dtype keep = ft_gguf_ggml_type(own) >= 0 ? own : FT_F32;
    *kept = *fell_back = false;
    if (mx->base == FT_NTYPES) return keep;
    ft_dtype t = mx->base;
    if (ft_types[t].block == 1) return t;
    uint32_t ft = mx->file_type;
    if (cat == CAT_OUTPUT) {
        if (cols % ft_types[t].block != 0) t = FT_Q8_0;
        else if (t != FT_Q8_0) t = FT_Q6_K;
    } else if (cat == CAT_ATTN_V) {
        if ((ft == 15 || ft == 17) && more_bits(layer, c->L)) t = FT_Q6_K;
        else if (ft == 14 && layer < 4) t = FT_Q5_K;
        bool is_70b = c->L == 80 && (strcmp(c->arch, "qwen2") == 0 || c->NH != c->NKV);
        if (is_70b && t == FT_Q4_K) t = FT_Q5_K;
    } else if (cat == CAT_FFN_DOWN) {
        if ((ft == 15 || ft == 17) && more_bits(layer, c->L)) t = FT_Q6_K;
        else if (ft == 14 && layer < c->L / 8) t = FT_Q5_K;
    }
    if (cols % ft_types[t].block == 0) return t;
    ft_dtype fb = t == FT_Q4_K ? FT_Q5_0 : t == FT_Q5_K ? FT_Q5_1 : t == FT_Q6_K ? FT_Q8_0 : FT_NTYPES;
    if (fb == FT_NTYPES) { *kept = true; return keep; }
    *fell_back = true;
    return cols % ft_types[fb].block == 0 ? fb : FT_F16;
}

/* Copies one key/value of the base GGUF to the writer. */
static FTUNE_MUST_USE ftune_status copy_kv(gguf_writer *w, const gguf_file *g, const gguf_kv *kv) {
    char *key = ft_gguf_str_dup(kv->key);
    if (!key) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = FTUNE_OK;
    switch (kv->type) {
    case GGUF_T_STRING: {
        char *v = ft_gguf_str_dup(kv->str);
        st = v ? ft_gguf_writer_set_str(w, key, v) : ft_err(FTUNE_ERR_NOMEM, "out of memory");
        free(v);
        break;
    }
    case GGUF_T_U32: st = ft_gguf_writer_set_u32(w, key, (uint32_t)kv->v.u); break;
    case GGUF_T_I32: st = ft_gguf_writer_set_i32(w, key, (int32_t)kv->v.i); break;
    case GGUF_T_F32: st = ft_gguf_writer_set_f32(w, key, (float)kv->v.f); break;
    case GGUF_T_BOOL: st = ft_gguf_writer_set_bool(w, key, kv->v.u != 0); break;
    case GGUF_T_ARRAY:
        if (kv->arr_type == GGUF_T_STRING) {
            gguf_str_array arr = { 0 };
            char **v = NULL;
            if (!(st = ft_gguf_get_str_array(g, key, &arr))) {
                v = ft_calloc((size_t)(arr.n ? arr.n : 1), sizeof *v);
                if (!v) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
                for (uint64_t i = 0; i < arr.n && !st; i++)
                    if (!(v[i] = ft_gguf_str_dup(arr.items[i]))) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
                if (!st) st = ft_gguf_writer_set_str_array(w, key, (const char *const *)v, (size_t)arr.n);
            }
            for (uint64_t i = 0; v && i < arr.n; i++) free(v[i]);
            free(v);
            free(arr.items);
        } else if (kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_I32) {
            void *v = ft_malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * 4);
            if (!v) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); break; }
            memcpy(v, kv->arr_data, (size_t)kv->arr_n * 4); /* the parser checked the array lies in the file */
            st = kv->arr_type == GGUF_T_F32 ? ft_gguf_writer_set_f32_array(w, key, v, (size_t)kv->arr_n)
                                            : ft_gguf_writer_set_i32_array(w, key, v, (size_t)kv->arr_n);
            free(v);
        } else st = ft_err(FTUNE_ERR_UNSUPPORTED, "key \"%s\": arrays of GGUF type %d cannot be copied", key, kv->arr_type);
        break;
    default:
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "key \"%s\": GGUF type %d cannot be copied", key, kv->type);
    }
    free(key);
    return st;
}


/* The tensors of a GGUF being written: row sources for the fill callback,
 * names, and what was written of each type. */
typedef struct {
    gguf_writer *w;
    row_src *src;            /* (cap) */
    char (*names)[FT_NAME_MAX]; /* (cap) the tensors added */
    fill_state fs;
    int n, cap;
    gguf_mix mix;
    const ft_config *cfg;
    ft_model_write_report *rep;
} gguf_plan;

/* A matrix of the output: `cat` and `layer` (or -1) for the mix's choice. */
static FTUNE_MUST_USE ftune_status plan_mat(gguf_plan *p, const char *name, const ft_tensor *t, const ft_adapter_inst *ad, int heads,
                             tensor_cat cat, int layer) {
    if (p->n >= p->cap) return ft_err(FTUNE_ERR_ARG, "merge: too many tensors (%s)", name);
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    bool kept, fell_back;
    ft_dtype dt = gguf_out_dtype(t->dtype, &p->mix, p->cfg, cat, layer, cols, &kept, &fell_back);
    bool copied = !ad && !heads && dt == t->dtype;
    if (!copied && !ft_types[dt].from_f32) {
        char names[512];
        gguf_mix_names(names, sizeof names);
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\" is %s, a type ftune reads but does not write, and it "
                      "would be written anew (%s); give --dtype (%s)", t->name[0] ? t->name : name, name, ft_types[dt].name,
                      ad ? "an adapter is folded into it" : "its rows are permuted", names);
    }
    row_src *s = &p->src[p->n];
    snprintf(p->names[p->n], FT_NAME_MAX, "%s", name);
    *s = (row_src){ .name = p->names[p->n], .t = t, .ad = ad, .rows = rows, .cols = cols, .perm_heads = heads,
                    .to_interleaved = true };
    int64_t shape[2] = { rows, cols };
    ftune_status st = copied ? ft_gguf_writer_add_tensor(p->w, name, dt, 2, shape, t->data)
                             : ft_gguf_writer_add_tensor_fill(p->w, name, dt, 2, shape, fill_rows, &p->fs, p->n);
    if (st) return st;
    if (!copied) p->fs.total += (uint64_t)rows * (uint64_t)cols; /* made row by row */
    p->n++;
    p->rep->n_mat[dt]++;
    if (kept) p->rep->n_kept++;
    if (fell_back) p->rep->n_fallback++;
    if (cat == CAT_OUTPUT) p->rep->output_dtype = dt;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status plan_vec(gguf_plan *p, const char *name, const float *v, int len, int heads) {
    if (p->n >= p->cap) return ft_err(FTUNE_ERR_ARG, "merge: too many tensors (%s)", name);
    snprintf(p->names[p->n], FT_NAME_MAX, "%s", name);
    p->src[p->n] = (row_src){ .name = p->names[p->n], .vec = v, .rows = 1, .cols = len, .perm_heads = heads, .to_interleaved = true };
    int64_t shape[1] = { len };
    ftune_status st = !heads ? ft_gguf_writer_add_tensor(p->w, name, FT_F32, 1, shape, v)
                             : ft_gguf_writer_add_tensor_fill(p->w, name, FT_F32, 1, shape, fill_rows, &p->fs, p->n);
    if (st) return st;
    if (heads) p->fs.total += (uint64_t)len;
    p->n++;
    p->rep->n_vec++;
    return FTUNE_OK;
}

/* rope_freqs for Llama 3 scaling, as llama.cpp's converter computes them
 * (float32): the divisor of each of the HS/2 frequencies. */
static void llama3_rope_factors(const ft_config *c, float *out) {
    const ft_rope_scaling *rs = &c->rope_scaling;
    float old_ctx = (float)rs->original_max_pos;
    float low_wavelen = old_ctx / rs->low_freq_factor, high_wavelen = old_ctx / rs->high_freq_factor;
    for (int i = 0; i < c->HS / 2; i++) {
        float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->HS);
        float wavelen = 2.0f * (float)M_PI / freq;
        if (wavelen < high_wavelen) out[i] = 1.0f;
        else if (wavelen > low_wavelen) out[i] = rs->factor;
        else {
            float smooth = (old_ctx / wavelen - rs->low_freq_factor) / (rs->high_freq_factor - rs->low_freq_factor);
            out[i] = 1.0f / ((1.0f - smooth) / rs->factor + smooth);
        }
    }
}

/* general.* and <arch>.* keys from the config, as llama.cpp's converter
 * writes them for the llama and qwen2 architectures. */
static FTUNE_MUST_USE ftune_status config_kv(gguf_writer *w, const ft_config *c, const char *arch, const char *name) {
    char k[96];
    ftune_status st;
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    if ((st = ft_gguf_writer_set_str(w, "general.architecture", arch)) ||
        (st = ft_gguf_writer_set_str(w, "general.name", name)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->V)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->max_T)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->C)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->L)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->F)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->HS)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->NH)) ||
        (st = ft_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->NKV)) ||
        (st = ft_gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_theta)) ||
        (st = ft_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps)))
        return st;
    if (c->HS * c->NH != c->C &&
        ((st = ft_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->HS)) ||
         (st = ft_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->HS))))
        return st;
    if (c->rope_scaling.type == 1 &&
        ((st = ft_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear")) ||
         (st = ft_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), c->rope_scaling.factor))))
        return st;
#undef KEY
    return FTUNE_OK;
}

/* A name for general.name: the base file or directory's name without extension. */
static void base_name(const ftune_model *m, char *out, size_t cap) {
    char *d = base_dir(m);
    const char *p = d ? d : m->bin.path ? m->bin.path : "model";
    const char *slash = strrchr(p, '/');
    snprintf(out, cap, "%s", slash && slash[1] ? slash + 1 : p);
    char *dot = strrchr(out, '.');
    if (dot && dot != out && !d) *dot = 0;
    free(d);
}

static FTUNE_MUST_USE ftune_status write_gguf(const ftune_model *mc, const char *path, const ft_model_write_opts *opts) {
    ftune_model *m = (ftune_model *)mc; /* only read: ft_model_linear takes a mutable model */
    gguf_mix mix;
    ftune_status st = parse_gguf_mix(m, path, opts ? opts->dtype : NULL, &mix);
    if (st) return st;
    const ft_config *c = &m->cfg;
    /* llama.cpp's llama architecture keeps q/k rows interleaved (Meta's
     * layout); qwen2 runs rotate-half RoPE on Hugging Face's rows */
    const char *arch = strcmp(c->arch, "qwen2") == 0 ? "qwen2" : "llama";
    bool permute = c->rope_interleaved != (strcmp(arch, "llama") == 0);
    if (permute && c->rope_interleaved)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: a %s model in the interleaved RoPE layout has no GGUF form here", path, arch);
    if (c->rope_scaling.type == 2 && !m->rope_freq_factors && strcmp(arch, "llama") != 0)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: Llama 3 RoPE scaling on a %s model has no GGUF form here", path, arch);
    ft_model_write_report local, *rep = opts && opts->report ? opts->report : &local;
    memset(rep, 0, sizeof *rep);
    rep->tied = c->tied;
    int max_cols = c->C > c->F ? c->C : c->F;
    if (c->NH * c->HS > max_cols) max_cols = c->NH * c->HS;
    gguf_plan p = { .mix = mix, .cfg = c, .rep = rep, .cap = 8 + c->L * (2 + 2 * FT_N_MODS) };
    p.fs = (fill_state){ .cached_index = -1, .cached_row = -1 };
    p.src = ft_calloc((size_t)p.cap, sizeof *p.src);
    p.names = ft_calloc((size_t)p.cap, sizeof *p.names);
    p.fs.src = p.src;
    p.fs.row = ft_malloc((size_t)max_cols * sizeof(float));
    p.fs.bytes = ft_malloc((size_t)max_cols * sizeof(float)); /* 4 bytes per element is the most of any type */
    p.fs.back = ft_malloc((size_t)max_cols * sizeof(float));
    float *rope_factors = NULL;
    char *bdir = base_dir(m);
    if (!p.src || !p.names || !p.fs.row || !p.fs.bytes || !p.fs.back) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = ft_gguf_writer_new(&p.w))) goto done;

    /* the file type: the mix's; keeping each tensor's type, the input GGUF's
     * own, else that of the Linear weights (llama.cpp's "mostly") */
    int64_t in_ft;
    if (mix.base != FT_NTYPES) rep->file_type = mix.file_type;
    else if (m->gguf && ft_gguf_get_i64(m->gguf, "general.file_type", &in_ft) && in_ft >= 0 && in_ft <= UINT32_MAX)
        rep->file_type = (uint32_t)in_ft;
    else {
        ft_dtype own = m->layers[0].wq.w.dtype;
        rep->file_type = ft_dtype_gguf_writable(own) ? ft_types[own].llama_ftype : 0;
    }
    if (m->gguf) {
        const gguf_file *g = m->gguf;
        for (uint64_t i = 0; i < g->n_kv && !st; i++) {
            const gguf_kv *kv = &g->kv[i];
            /* rewritten below, or by the writer (alignment 32) */
            if (ft_gguf_str_eq(kv->key, "general.file_type") || ft_gguf_str_eq(kv->key, "general.quantization_version") ||
                ft_gguf_str_eq(kv->key, "general.alignment"))
                continue;
            st = copy_kv(p.w, g, kv);
        }
        if (st) { st = ft_err_prefix(st, "%s", g->map.path); goto done; }
    } else {
        char name[256];
        base_name(m, name, sizeof name);
        if ((st = config_kv(p.w, c, arch, name))) goto done;
    }
    if ((st = ft_gguf_writer_set_u32(p.w, "general.file_type", rep->file_type)) ||
        (st = ft_gguf_writer_set_u32(p.w, "general.quantization_version", 2)))
        goto done;
    if (opts && opts->tokenizer && (m->gguf || m->tok)) {
        st = ft_err(FTUNE_ERR_ARG, "%s: the model has its own tokenizer; another one is not written", path);
        goto done;
    }
    if (!m->gguf && (st = opts && opts->tokenizer ? ft_tokenizer_to_gguf(p.w, opts->tokenizer, c->V, opts->tokenizer_dir)
                                                   : ft_tokenizer_to_gguf(p.w, m->tok, c->V, bdir)))
        goto done;

    char name[FT_NAME_MAX];
    if ((st = plan_mat(&p, "token_embd.weight", &m->tok_embd, NULL, 0, c->tied ? CAT_OUTPUT : CAT_OTHER, -1))) goto done;
    if ((st = plan_vec(&p, "output_norm.weight", m->out_norm, c->C, 0))) goto done;
    if (!c->tied && (st = plan_mat(&p, "output.weight", &m->lm_head.w, NULL, 0, CAT_OUTPUT, -1))) goto done;
    const float *rf = m->rope_freq_factors;
    if (!rf && c->rope_scaling.type == 2) {
        if (!(rope_factors = ft_malloc((size_t)(c->HS / 2) * sizeof(float)))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        llama3_rope_factors(c, rope_factors);
        rf = rope_factors;
    }
    if (rf && (st = plan_vec(&p, "rope_freqs.weight", rf, c->HS / 2, 0))) goto done;
    for (int l = 0; l < c->L && !st; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = plan_vec(&p, name, m->layers[l].attn_norm, c->C, 0))) break;
        for (int k = 0; k < FT_N_MODS && !st; k++) {
            const ft_linear *lin = ft_model_linear(m, l, k);
            int heads = permute ? ft_module_rope_heads(c, k) : 0;
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, ft_module_gguf_name(k));
            tensor_cat cat = k == FT_MOD_V ? CAT_ATTN_V : k == FT_MOD_DOWN ? CAT_FFN_DOWN : CAT_OTHER;
            st = plan_mat(&p, name, &lin->w, merged_adapter(m, opts, l, k), heads, cat, l);
            if (!st && lin->bias) {
                snprintf(name, sizeof name, "blk.%d.%s.bias", l, ft_module_gguf_name(k));
                st = plan_vec(&p, name, lin->bias, lin->out, heads);
            }
            if (!st && k == FT_MOD_O) {
                snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
                st = plan_vec(&p, name, m->layers[l].ffn_norm, c->C, 0);
            }
        }
    }
    if (st) goto done;
    /* a GGUF base's tensors the model does not hold are copied as they are, never dropped (the
     * loader refuses tensors the metadata does not use, so today this copies none) */
    for (uint64_t i = 0; m->gguf && i < m->gguf->n_tensors && !st; i++) {
        const gguf_tensor_info *ti = &m->gguf->tensors[i];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        int k = 0;
        while (k < p.n && strcmp(p.names[k], name) != 0) k++;
        if (k < p.n) continue;
        if (ti->dtype >= FT_NTYPES) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": ggml type %s cannot be copied", m->gguf->map.path,
                        name, ft_gguf_ggml_type_name(ti->ggml_type));
            break;
        }
        int64_t shape[4];
        for (uint32_t d = 0; d < ti->n_dims; d++) shape[d] = (int64_t)ti->ne[ti->n_dims - 1 - d];
        st = ft_gguf_writer_add_tensor(p.w, name, ti->dtype, (int)ti->n_dims, shape, ti->data);
    }
    progress_init(&p.fs, opts);
    if (!st) st = ft_gguf_writer_write(p.w, path);
done:
    ft_gguf_writer_free(p.w);
    free(p.names);
    free(rope_factors);
    free(bdir);
    free(p.fs.row);
    free(p.fs.bytes);
    free(p.fs.back);
    free(p.src);
    return st;
}

bool ft_model_is_source(const ftune_model *m, const char *path) {
    char *a = realpath(path, NULL), *b = NULL;
    if (!a) return false;
    if (m->gguf && m->gguf->map.path) b = ft_strdup(m->gguf->map.path);
    else if (m->n_shards > 0) b = base_dir(m);
    else if (m->bin.path) b = ft_strdup(m->bin.path);
    char *rb = b ? realpath(b, NULL) : NULL;
    bool same = rb && strcmp(a, rb) == 0;
    free(a);
    free(b);
    free(rb);
    return same;
}

ftune_status ft_model_write(const ftune_model *m, const char *out_path, const ft_model_write_opts *opts) {
    if (ft_model_is_source(m, out_path))
        return ft_err(FTUNE_ERR_ARG, "%s: is where the base model is read from; write the merged model elsewhere", out_path);
    size_t n = strlen(out_path);
    if (n >= 5 && strcmp(out_path + n - 5, ".gguf") == 0) return write_gguf(m, out_path, opts); /* one atomic file */
    /* a directory: staged beside, so that a failure (a refused value, a full disk) leaves no part of it */
    char staged[4200];
    ftune_status st = ft_dir_stage(out_path, staged, sizeof staged);
    if (st) return st;
    st = write_hf(m, staged, opts);
    if (!st) st = ft_dir_commit(staged, out_path);
    if (st) ft_dir_abort(staged);
    return st;
}
