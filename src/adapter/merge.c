/* merge.c — folds LoRA adapters into the base weights: W' = W + scale·B·A
 * in f32. In memory (the model then carries f32 merged weights), or written
 * as a new model: a Hugging Face directory streamed one row at a time
 * through the safetensors writer's fill callback, or a GGUF file streamed
 * the same way through the GGUF writer's, from any base: a GGUF base's
 * metadata is copied, a Hugging Face or llama2.c base's is written as
 * llama.cpp's converter writes it (architecture keys, vocabulary). */
#include "adapter/adapter.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

/* The adapter of Linear mod in block l that a write folds in: opts->adapter,
 * else the model's default adapter, else none. */
static const ft_adapter_inst *merged_adapter(const ftune_model *m, const ft_merge_opts *opts, int l, ft_module mod) {
    const ft_adapter *a = opts && opts->adapter ? opts->adapter : m->adapter;
    return a ? a->set[l * FT_N_MODS + mod] : NULL;
}

/* row (cols) = row o of weight t in f32 with adapter ad's part folded in
 * (ad may be NULL): the one way every merge makes a row, so a model merged
 * in memory and one written to a file are bit-identical. */
static void merged_row(float *row, const ft_tensor *t, const ft_adapter_inst *ad, int o, int cols) {
    ft_tensor_row_f32(t, o, row);
    if (ad) ad->kind->merge_row(row, ad, o, cols);
}

ftune_status ft_merge_lora(ftune_model *m, const ft_adapter *ad) {
    if (!ad) return FTUNE_OK;
    if (ad->m != m) return ft_err(FTUNE_ERR_ARG, "merge: the adapter was made for another model");
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_linear *lin = ft_model_linear(m, l, k);
            const ft_adapter_inst *a = ad->set[l * FT_N_MODS + k];
            if (!a) continue;
            /* an owned weight of the model (counted as FT_MEM_WEIGHTS), made row by row as the writers do */
            float *w = ft_model_alloc(m, (size_t)lin->out * lin->in * sizeof(float));
            if (!w) return ft_err(FTUNE_ERR_NOMEM, "out of memory merging layer %d %s", l, ft_module_name(k));
            for (int o = 0; o < lin->out; o++) merged_row(w + (size_t)o * lin->in, &lin->w, a, o, lin->in);
            lin->w.dtype = FT_F32;
            lin->w.data = w;
            lin->w.nbytes = (size_t)lin->out * lin->in * sizeof(float);
        }
    return FTUNE_OK;
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
    merged_row(row, s->t, s->ad, src_row(s, R), s->cols);
}

typedef struct {
    row_src *src;
    float *row;               /* (max cols) f32 */
    uint8_t *bytes;           /* (max cols) in the output dtype */
    float *back;              /* (max cols) f32: bytes read back, to check that the dtype held the row */
    int cached_index, cached_row;
    void (*progress)(void *, uint64_t, uint64_t); /* ft_merge_opts.progress, or NULL */
    void *progress_ctx;
    uint64_t done, total;     /* elements of computed rows: made so far, in all */
} fill_state;

static void progress_init(fill_state *fs, const ft_merge_opts *opts) {
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
    default: return NULL;
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
    if (strcmp(s, "f32") == 0 || strcmp(s, "float32") == 0) *out = FT_F32;
    else if (strcmp(s, "bf16") == 0 || strcmp(s, "bfloat16") == 0) *out = FT_BF16;
    else if (strcmp(s, "f16") == 0 || strcmp(s, "float16") == 0) *out = FT_F16;
    else return ft_err(FTUNE_ERR_ARG, "merge: dtype \"%s\" is not one of f32, bf16, f16", s);
    return FTUNE_OK;
}

static const char *torch_dtype_name(ft_dtype t) {
    return t == FT_BF16 ? "bfloat16" : t == FT_F16 ? "float16" : "float32";
}

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

static FTUNE_MUST_USE ftune_status write_hf(const ftune_model *mc, const char *dir, const ft_merge_opts *opts) {
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

/* llama.cpp's LLAMA_FTYPE (llama.h; gguf-py LlamaFileType) for a file
 * whose matrices are mostly of type t. */
static uint32_t llama_ftype(ft_dtype t) {
    switch (t) {
    case FT_F16: return 1;   /* MOSTLY_F16 */
    case FT_Q4_0: return 2;  /* MOSTLY_Q4_0 */
    case FT_Q8_0: return 7;  /* MOSTLY_Q8_0 */
    case FT_BF16: return 32; /* MOSTLY_BF16 */
    default: return 0;       /* ALL_F32 */
    }
}

/* The type a matrix of `cols` columns stored as `own` is written in. With
 * a chosen type every matrix gets it, embedding and output included, except
 * that q4_0 writes the output matrix (output.weight, or token_embd when it
 * is tied to the output) as q8_0: llama.cpp's quantize keeps it at q6_K,
 * which ftune cannot write, and q8_0 is the nearest type it can. A row that
 * is not a whole number of the type's blocks keeps its own type. */
static ft_dtype gguf_out_dtype(ft_dtype own, ft_dtype forced, int cols, bool is_output, bool *kept) {
    ft_dtype keep = ft_gguf_ggml_type(own) >= 0 ? own : FT_F32;
    *kept = false;
    if (forced == FT_NTYPES) return keep;
    ft_dtype t = forced == FT_Q4_0 && is_output ? FT_Q8_0 : forced;
    if (cols % ft_types[t].block != 0) { *kept = true; return keep; }
    return t;
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
    ft_dtype forced;         /* FT_NTYPES: each tensor's own type */
    ft_merge_report *rep;
} gguf_plan;

static FTUNE_MUST_USE ftune_status plan_mat(gguf_plan *p, const char *name, const ft_tensor *t, const ft_adapter_inst *ad, int heads,
                             bool is_output) {
    if (p->n >= p->cap) return ft_err(FTUNE_ERR_ARG, "merge: too many tensors (%s)", name);
    int rows = (int)t->shape[0], cols = (int)t->shape[1];
    bool kept;
    ft_dtype dt = gguf_out_dtype(t->dtype, p->forced, cols, is_output, &kept);
    row_src *s = &p->src[p->n];
    snprintf(p->names[p->n], FT_NAME_MAX, "%s", name);
    *s = (row_src){ .name = p->names[p->n], .t = t, .ad = ad, .rows = rows, .cols = cols, .perm_heads = heads,
                    .to_interleaved = true };
    int64_t shape[2] = { rows, cols };
    ftune_status st = !ad && !heads && dt == t->dtype
                          ? ft_gguf_writer_add_tensor(p->w, name, dt, 2, shape, t->data)
                          : ft_gguf_writer_add_tensor_fill(p->w, name, dt, 2, shape, fill_rows, &p->fs, p->n);
    if (st) return st;
    if (ad || heads || dt != t->dtype) p->fs.total += (uint64_t)rows * (uint64_t)cols; /* made row by row */
    p->n++;
    p->rep->n_mat[dt]++;
    if (kept) p->rep->n_kept++;
    if (is_output) p->rep->output_dtype = dt;
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

/* ------------------------------------------------------------- GGUF vocabulary */

/* Byte-level BPE (tokenizer.ggml.model "gpt2") needs what the model's
 * tokenizer does not keep as text: the merge list, and the pre-tokenizer
 * under the name llama.cpp gives it. Both come from the Hugging Face base's
 * tokenizer.json (or merges.txt beside vocab.json, GPT-2's layout), or are
 * made from a tiktoken tokenizer.model (Llama 3). */
typedef struct {
    char *buf;               /* the merges, NUL-separated */
    const char **merges;     /* (n) "a b" */
    int n;
    const char *pre;         /* tokenizer.ggml.pre */
    char *tokbuf;            /* tiktoken: token texts in GPT-2's alphabet, NUL-separated */
    const char **tok_text;   /* (n_tok_text) they replace the stored raw bytes, or NULL */
    int n_tok_text;
} bpe_extra;

#define HF_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define HF_RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define HF_RE_QWEN2 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The split regexes of a tokenizer.json pre_tokenizer, in order; false for
 * a kind this table does not know. */
static bool hf_split_regexes(const cJSON *pt, const char **re, int *n, int cap) {
    if (!pt || cJSON_IsNull(pt)) return true;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(ty)) return false;
    const char *t = ty->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"))
            if (!hf_split_regexes(it, re, n, cap)) return false;
        return true;
    }
    if (*n >= cap) return false;
    if (!strcmp(t, "ByteLevel")) {
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pt, "use_regex"))) return true;
        re[(*n)++] = HF_RE_GPT2;
        return true;
    }
    if (!strcmp(t, "Split")) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
        if (!cJSON_IsString(r)) return false;
        re[(*n)++] = r->valuestring;
        return true;
    }
    if (!strcmp(t, "Digits") && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pt, "individual_digits"))) {
        re[(*n)++] = "\\p{N}";
        return true;
    }
    return false;
}

/* llama.cpp's name for a pre-tokenizer (llama-vocab.cpp), or NULL. */
static const char *llama_pre_name(const char *const *re, int n) {
    static const struct { const char *name; int n; const char *re[2]; } known[] = {
        { "llama-bpe", 1, { HF_RE_LLAMA3 } }, { "qwen2", 1, { HF_RE_QWEN2 } },
        { "gpt-2", 1, { HF_RE_GPT2 } },       { "smollm", 2, { "\\p{N}", HF_RE_GPT2 } },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        bool same = known[i].n == n;
        for (int j = 0; same && j < n; j++) same = strcmp(known[i].re[j], re[j]) == 0;
        if (same) return known[i].name;
    }
    return NULL;
}

static void bpe_extra_free(bpe_extra *b) {
    free(b->buf);
    free(b->merges);
    free(b->tokbuf);
    free(b->tok_text);
}

/* GPT-2's byte -> unicode map, UTF-8 encoded: the bytes GGUF and
 * tokenizer.json token texts are written in (printable Latin-1 bytes stand
 * for themselves, the others for U+0100 onwards, in byte order). */
static void gpt2_byte_map(char map[256][3]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = keep ? b : 256 + n++;
        if (cp < 0x80) { map[b][0] = (char)cp; map[b][1] = 0; }
        else { map[b][0] = (char)(0xC0 | (cp >> 6)); map[b][1] = (char)(0x80 | (cp & 0x3F)); map[b][2] = 0; }
    }
}

static int b64_val(int c) {
    return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
         : c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* A tiktoken tokenizer.model (Llama 3's: "base64 rank" per line, ranks
 * 0, 1, 2, ...) has no merge list; it is made as llama.cpp's converter gets
 * it (transformers' TikTokenConverter): for each token in rank order, every
 * split into two tokens, ordered by (left rank, right rank). Merging by
 * these ranks is then tiktoken's lowest-rank-first BPE. */
static FTUNE_MUST_USE ftune_status read_tiktoken_extra(const char *path, bpe_extra *b) {
    char *text = NULL;
    size_t size = 0;
    ftune_status st = ft_read_file(path, &text, &size);
    if (st) return st;
    int n = 0;
    for (size_t i = 0; i < size; i++) n += text[i] == '\n';
    uint8_t *bytes = ft_malloc(size + 1);                  /* every token's bytes, back to back */
    uint32_t *off = ft_calloc((size_t)n + 2, sizeof *off);  /* token i is bytes[off[i] .. off[i+1]) */
    uint32_t hcap = 1;
    while (hcap < 2u * (uint32_t)n + 2) hcap <<= 1;
    int32_t *hash = ft_malloc((size_t)hcap * sizeof *hash);
    int32_t *parts = ft_malloc(256 * 3 * sizeof *parts); /* (left rank, right rank, cut) of each split */
    char map[256][3];
    gpt2_byte_map(map);
    if (!bytes || !off || !hash || !parts) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (uint32_t i = 0; i < hcap; i++) hash[i] = -1;
    int k = 0;
    uint32_t o = 0;
    for (char *line = text, *next; line < text + size && *line; line = next) {
        next = memchr(line, '\n', (size_t)(text + size - line));
        next = next ? next + 1 : text + size;
        char *sp = memchr(line, ' ', (size_t)(next - line));
        long rank = sp ? strtol(sp + 1, NULL, 10) : -1;
        if (!sp || rank != k) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: expected \"base64 %d\"", path, k + 1, k); goto done; }
        off[k] = o;
        uint32_t acc = 0;
        int nbits = 0;
        for (char *c = line; c < sp && *c != '='; c++) {
            int v = b64_val((unsigned char)*c);
            if (v < 0) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: not base64", path, k + 1); goto done; }
            acc = (acc << 6) | (uint32_t)v;
            if ((nbits += 6) >= 8) { nbits -= 8; bytes[o++] = (uint8_t)(acc >> nbits); }
        }
        if (o == off[k] || o - off[k] > 256) { st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: token of %u bytes", path, k + 1, o - off[k]); goto done; }
        uint64_t h = 0xcbf29ce484222325ull;
        for (uint32_t j = off[k]; j < o; j++) { h ^= bytes[j]; h *= 0x100000001b3ull; }
        uint32_t slot = (uint32_t)h & (hcap - 1);
        while (hash[slot] >= 0) slot = (slot + 1) & (hcap - 1);
        hash[slot] = k;
        k++;
    }
    off[k] = o;
    n = k;
#define RANK_OF(P, L, OUT) do { \
        uint64_t h_ = 0xcbf29ce484222325ull; \
        for (uint32_t j_ = 0; j_ < (L); j_++) { h_ ^= (P)[j_]; h_ *= 0x100000001b3ull; } \
        uint32_t s_ = (uint32_t)h_ & (hcap - 1); (OUT) = -1; \
        for (; hash[s_] >= 0; s_ = (s_ + 1) & (hcap - 1)) \
            if (off[hash[s_] + 1] - off[hash[s_]] == (L) && !memcmp(bytes + off[hash[s_]], (P), (L))) { (OUT) = hash[s_]; break; } \
    } while (0)
    /* token texts (n of them, each byte up to 2 UTF-8 bytes); the merges are counted in a first pass and
     * written in a second */
    size_t tb = 3 * (size_t)o + (size_t)n, mb = 0, mcount = 0;
    b->tokbuf = ft_malloc(tb);
    b->tok_text = ft_calloc((size_t)n, sizeof *b->tok_text);
    if (!b->tokbuf || !b->tok_text) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    size_t to = 0, mo = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            b->buf = ft_malloc(mb ? mb : 1);
            b->merges = ft_calloc(mcount ? mcount : 1, sizeof *b->merges);
            if (!b->buf || !b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        }
        for (int i = 0; i < n; i++) {
            const uint8_t *p = bytes + off[i];
            uint32_t len = off[i + 1] - off[i];
            if (pass == 0) {
                b->tok_text[i] = b->tokbuf + to;
                for (uint32_t j = 0; j < len; j++) to += (size_t)sprintf(b->tokbuf + to, "%s", map[p[j]]);
                b->tokbuf[to++] = 0;
            }
            if (len < 2) continue;
            /* every split into two tokens, by (left rank, right rank) */
            int np = 0;
            for (uint32_t cut = 1; cut < len; cut++) {
                int rl, rr;
                RANK_OF(p, cut, rl);
                RANK_OF(p + cut, len - cut, rr);
                if (rl < 0 || rr < 0) continue;
                int at = np++;
                while (at > 0 && (parts[3 * (at - 1)] > rl || (parts[3 * (at - 1)] == rl && parts[3 * (at - 1) + 1] > rr))) {
                    memcpy(parts + 3 * at, parts + 3 * (at - 1), 3 * sizeof *parts);
                    at--;
                }
                parts[3 * at] = rl;
                parts[3 * at + 1] = rr;
                parts[3 * at + 2] = (int32_t)cut;
            }
            if (np == 0) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s:%d: token of rank %d is not two tokens joined", path, i + 1, i);
                goto done;
            }
            if (pass == 0) {
                mcount += (size_t)np;
                for (uint32_t j = 0; j < len; j++) mb += (size_t)np * strlen(map[p[j]]);
                mb += 2 * (size_t)np;
                continue;
            }
            for (int q = 0; q < np; q++) {
                uint32_t cut = (uint32_t)parts[3 * q + 2];
                b->merges[b->n++] = b->buf + mo;
                for (uint32_t j = 0; j < cut; j++) mo += (size_t)sprintf(b->buf + mo, "%s", map[p[j]]);
                b->buf[mo++] = ' ';
                for (uint32_t j = cut; j < len; j++) mo += (size_t)sprintf(b->buf + mo, "%s", map[p[j]]);
                b->buf[mo++] = 0;
            }
        }
    }
#undef RANK_OF
    b->n_tok_text = n;
    b->pre = "llama-bpe"; /* Llama 3's pattern, the only tiktoken file ftune reads */
done:
    free(text);
    free(bytes);
    free(off);
    free(hash);
    free(parts);
    return st;
}


static FTUNE_MUST_USE ftune_status read_bpe_extra(const char *bdir, bpe_extra *b) {
    memset(b, 0, sizeof *b);
    if (!bdir)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "merge: a byte-level BPE tokenizer is written to GGUF only from a Hugging "
                      "Face directory's tokenizer.json or merges.txt");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", bdir);
    bool json = ft_file_exists(path);
    if (!json) snprintf(path, sizeof path, "%s/merges.txt", bdir);
    if (!json && !ft_file_exists(path)) {
        snprintf(path, sizeof path, "%s/tokenizer.model", bdir);
        if (ft_file_exists(path)) return read_tiktoken_extra(path, b);
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: no tokenizer.json, merges.txt or tiktoken tokenizer.model: the BPE "
                      "merges cannot be written to GGUF", bdir);
    }
    char *text = NULL;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *root = NULL;
    size_t total = 0;
    int cap = 0;
    if (json) {
        root = cJSON_Parse(text);
        const cJSON *mer = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "merges");
        if (!cJSON_IsArray(mer)) { st = ft_err(FTUNE_ERR_FORMAT, "%s: no model.merges list", path); goto done; }
        const char *re[8];
        int nre = 0;
        if (!hf_split_regexes(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), re, &nre, 8) ||
            !(b->pre = llama_pre_name(re, nre))) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: the pre_tokenizer is not one llama.cpp names here (Llama 3, "
                        "Qwen2, GPT-2 or SmolLM regexes); tokenizer.ggml.pre would be wrong", path);
            goto done;
        }
        cap = cJSON_GetArraySize(mer);
        const cJSON *it;
        cJSON_ArrayForEach(it, mer) {
            if (cJSON_IsString(it)) total += strlen(it->valuestring) + 1;
            else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                     cJSON_IsString(cJSON_GetArrayItem(it, 1)))
                total += strlen(cJSON_GetArrayItem(it, 0)->valuestring) + strlen(cJSON_GetArrayItem(it, 1)->valuestring) + 2;
            else { st = ft_err(FTUNE_ERR_FORMAT, "%s: model.merges[%d] is not \"a b\" or [a, b]", path, b->n); goto done; }
            b->n++;
        }
        b->buf = ft_malloc(total + 1);
        b->merges = ft_calloc((size_t)(cap ? cap : 1), sizeof *b->merges);
        if (!b->buf || !b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        size_t o = 0;
        int i = 0;
        cJSON_ArrayForEach(it, mer) {
            b->merges[i++] = b->buf + o;
            if (cJSON_IsString(it)) o += (size_t)sprintf(b->buf + o, "%s", it->valuestring) + 1;
            else o += (size_t)sprintf(b->buf + o, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring,
                                      cJSON_GetArrayItem(it, 1)->valuestring) + 1;
        }
    } else { /* merges.txt: "#version" line, then "a b" per line; vocab.json files use GPT-2's regex */
        b->pre = "gpt-2";
        for (char *p = text; *p; p++) cap += *p == '\n';
        b->merges = ft_calloc((size_t)cap + 1, sizeof *b->merges);
        if (!b->merges) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
        for (char *line = text, *next; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            size_t l = strlen(line);
            if (l && line[l - 1] == '\r') line[--l] = 0;
            if (!l || !strncmp(line, "#version", 8)) continue;
            b->merges[b->n++] = line;
        }
        b->buf = text; /* the merges point into it */
        text = NULL;
    }
done:
    cJSON_Delete(root);
    free(text);
    if (st) bpe_extra_free(b);
    return st;
}

/* tokenizer.ggml.* from the model's tokenizer, as llama.cpp reads them:
 * SentencePiece-style ("llama": tokens, scores, types) or byte-level BPE
 * ("gpt2": tokens, types, merges, pre). SPM scores: the file's own (GGUF, llama2.c .bin, tokenizer.model); a
 * tokenizer.json has none, and its vocabulary (converted from
 * SentencePiece) is in score order, so normal token k-th in id order gets
 * -k, as SentencePiece's BPE trainer scores pieces. bdir: the Hugging Face
 * base directory (for the BPE merges as the files spell them), or NULL. */
static FTUNE_MUST_USE ftune_status tokenizer_kv(gguf_writer *w, const ftune_model *m, const ftune_tokenizer *t, const char *bdir) {
    const int V = m->cfg.V;
    if (!t) return ft_err(FTUNE_ERR_ARG, "merge: the model has no tokenizer to write into the GGUF (give one: --tokenizer FILE)");
    bool spm = ft_tokenizer_kind(t) == FT_TOK_SPM;
    bpe_extra bpe = { 0 };
    ftune_status st = spm ? FTUNE_OK : read_bpe_extra(bdir, &bpe);
    if (st) return st;
    int n = ftune_tokenizer_n_vocab(t);
    const char **toks = ft_calloc((size_t)V, sizeof *toks);
    char *pads = ft_malloc((size_t)(V - n + 1) * 24);
    float *scores = ft_calloc((size_t)V, sizeof *scores);
    int32_t *types = ft_calloc((size_t)V, sizeof *types);
    if (n > V) { st = ft_err(FTUNE_ERR_FORMAT, "merge: the tokenizer has %d tokens, more than the model's %d embedding rows", n, V); goto done; }
    if (!toks || !pads || !scores || !types) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    ft_tokenizer_specials sp;
    ft_tokenizer_special(t, &sp);
    bool have_scores = false;
    for (int i = 0; i < n; i++) have_scores |= ft_tokenizer_score(t, i) != 0.0f;
    int k = 0;
    for (int i = 0; i < V; i++) {
        if (i < n) {
            toks[i] = i < bpe.n_tok_text ? bpe.tok_text[i] : ft_tokenizer_token(t, i);
            types[i] = ft_tokenizer_type(t, i) ? ft_tokenizer_type(t, i) : FT_TOKTYPE_NORMAL;
            if (i == sp.unk) types[i] = FT_TOKTYPE_UNKNOWN; /* tokenizer.json lists <unk> among the special tokens */
            /* llama2.c's .bin stores "\n<s>\n" and "\n</s>\n"; llama.cpp's llama2.c converter names them so */
            if (!strcmp(toks[i], "\n<s>\n") || !strcmp(toks[i], "\n</s>\n")) toks[i] = toks[i][2] == 's' ? "<s>" : "</s>";
            scores[i] = have_scores ? ft_tokenizer_score(t, i) : types[i] == FT_TOKTYPE_NORMAL ? -(float)k++ : 0.0f;
        } else { /* embedding rows past the vocabulary, named as llama.cpp's converter pads them */
            char *p = pads + (size_t)(i - n) * 24;
            snprintf(p, 24, "[PAD%d]", i);
            toks[i] = p;
            types[i] = FT_TOKTYPE_UNUSED;
        }
    }
    if ((st = ft_gguf_writer_set_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2")) ||
        (st = ft_gguf_writer_set_str(w, "tokenizer.ggml.pre", spm ? "default" : bpe.pre)) ||
        (st = ft_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, (size_t)V)) ||
        (st = ft_gguf_writer_set_i32_array(w, "tokenizer.ggml.token_type", types, (size_t)V)))
        goto done;
    if (spm ? (st = ft_gguf_writer_set_f32_array(w, "tokenizer.ggml.scores", scores, (size_t)V)) != FTUNE_OK
            : (st = ft_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", bpe.merges, (size_t)bpe.n)) != FTUNE_OK)
        goto done;
    struct { const char *key; int32_t id; } ids[] = {
        { "tokenizer.ggml.bos_token_id", sp.bos }, { "tokenizer.ggml.eos_token_id", sp.eos },
        { "tokenizer.ggml.unknown_token_id", sp.unk }, { "tokenizer.ggml.padding_token_id", sp.pad },
        { "tokenizer.ggml.eot_token_id", sp.eot },
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0] && !st; i++)
        if (ids[i].id >= 0) st = ft_gguf_writer_set_u32(w, ids[i].key, (uint32_t)ids[i].id);
    if (st || (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", sp.add_bos != 0)) ||
        (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", sp.add_eos != 0)) ||
        (spm && (st = ft_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", sp.add_space_prefix != 0))))
        goto done;
    /* the template the tokenizer was loaded with: tokenizer_config.json's (a
     * string or the "default" of a list) or transformers 5's chat_template.jinja */
    const char *ct = ft_tokenizer_chat_template(t);
    if (ct) st = ft_gguf_writer_set_str(w, "tokenizer.chat_template", ct);
done:
    bpe_extra_free(&bpe);
    free(toks);
    free(pads);
    free(scores);
    free(types);
    return st;
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

static FTUNE_MUST_USE ftune_status write_gguf(const ftune_model *mc, const char *path, const ft_merge_opts *opts) {
    ftune_model *m = (ftune_model *)mc; /* only read: ft_model_linear takes a mutable model */
    ft_dtype forced = FT_NTYPES;
    if (opts && opts->dtype) {
        const char *d = opts->dtype;
        forced = !strcmp(d, "f32") ? FT_F32 : !strcmp(d, "f16") ? FT_F16 : !strcmp(d, "bf16") ? FT_BF16
               : !strcmp(d, "q8_0") ? FT_Q8_0 : !strcmp(d, "q4_0") ? FT_Q4_0 : FT_NTYPES;
        if (forced == FT_NTYPES)
            return ft_err(FTUNE_ERR_ARG, "%s: dtype \"%s\" is not one of f32, f16, bf16, q8_0, q4_0", path, d);
    }
    const ft_config *c = &m->cfg;
    /* llama.cpp's llama architecture keeps q/k rows interleaved (Meta's
     * layout); qwen2 runs rotate-half RoPE on Hugging Face's rows */
    const char *arch = strcmp(c->arch, "qwen2") == 0 ? "qwen2" : "llama";
    bool permute = c->rope_interleaved != (strcmp(arch, "llama") == 0);
    if (permute && c->rope_interleaved)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: a %s model in the interleaved RoPE layout has no GGUF form here", path, arch);
    if (c->rope_scaling.type == 2 && !m->rope_freq_factors && strcmp(arch, "llama") != 0)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: Llama 3 RoPE scaling on a %s model has no GGUF form here", path, arch);
    ft_merge_report local, *rep = opts && opts->report ? opts->report : &local;
    memset(rep, 0, sizeof *rep);
    rep->tied = c->tied;
    int max_cols = c->C > c->F ? c->C : c->F;
    if (c->NH * c->HS > max_cols) max_cols = c->NH * c->HS;
    gguf_plan p = { .forced = forced, .rep = rep, .cap = 8 + c->L * (2 + 2 * FT_N_MODS) };
    p.fs = (fill_state){ .cached_index = -1, .cached_row = -1 };
    p.src = ft_calloc((size_t)p.cap, sizeof *p.src);
    p.names = ft_calloc((size_t)p.cap, sizeof *p.names);
    p.fs.src = p.src;
    p.fs.row = ft_malloc((size_t)max_cols * sizeof(float));
    p.fs.bytes = ft_malloc((size_t)max_cols * sizeof(float)); /* 4 bytes per element is the most of any type */
    p.fs.back = ft_malloc((size_t)max_cols * sizeof(float));
    float *rope_factors = NULL;
    char *bdir = base_dir(m);
    ftune_status st = FTUNE_OK;
    if (!p.src || !p.names || !p.fs.row || !p.fs.bytes || !p.fs.back) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = ft_gguf_writer_new(&p.w))) goto done;

    /* the file type is that of the Linear weights (llama.cpp's "mostly") */
    bool kept;
    ft_dtype main_dt = forced != FT_NTYPES ? forced : gguf_out_dtype(m->layers[0].wq.w.dtype, forced, c->C, false, &kept);
    rep->file_type = llama_ftype(main_dt);
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
    if (!m->gguf && (st = opts && opts->tokenizer ? tokenizer_kv(p.w, m, opts->tokenizer, opts->tokenizer_dir)
                                                   : tokenizer_kv(p.w, m, m->tok, bdir)))
        goto done;

    char name[FT_NAME_MAX];
    if ((st = plan_mat(&p, "token_embd.weight", &m->tok_embd, NULL, 0, c->tied))) goto done;
    if ((st = plan_vec(&p, "output_norm.weight", m->out_norm, c->C, 0))) goto done;
    if (!c->tied && (st = plan_mat(&p, "output.weight", &m->lm_head.w, NULL, 0, true))) goto done;
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
            st = plan_mat(&p, name, &lin->w, merged_adapter(m, opts, l, k), heads, false);
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

/* True if path names the file or directory the model's weights are mapped from. */
static bool is_source(const ftune_model *m, const char *path) {
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

ftune_status ft_merge_write(const ftune_model *m, const char *out_path, const ft_merge_opts *opts) {
    if (is_source(m, out_path))
        return ft_err(FTUNE_ERR_ARG, "%s: is where the base model is read from; write the merged model elsewhere", out_path);
    if (opts && opts->adapter && opts->adapter->m != m)
        return ft_err(FTUNE_ERR_ARG, "%s: the adapter to merge was made for another model", out_path);
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
