/* merge.c — folds LoRA adapters into the base weights: W' = W + scale·B·A
 * in f32. In memory (the model then carries f32 merged weights), or written
 * as a new model: a Hugging Face directory streamed one row at a time
 * through the safetensors writer's fill callback, or a GGUF file with the
 * base's metadata and tokenizer. */
#include "adapter.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>

/* row (in) += scale · B[o, :] · A: the adapter's contribution to row o */
static void add_lora_row(float *row, const ft_lora *a, int o, int in) {
    cblas_sgemv(CblasRowMajor, CblasTrans, a->r, in, a->scale, a->A, in, a->B + (size_t)o * a->r, 1, 1.0f, row, 1);
}

ftune_status ft_merge_lora(ftune_model *m) {
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_linear *lin = ft_model_linear(m, l, (ft_module)k);
            const ft_lora *a = lin->lora;
            if (!a) continue;
            float *w = ft_aligned_alloc((size_t)lin->out * lin->in * sizeof(float));
            if (!w) return ft_err(FTUNE_ERR_NOMEM, "out of memory merging layer %d %s", l, ft_module_name((ft_module)k));
            /* row by row as the writers do, so a merged model in memory and one written to a file are bit-identical */
            for (int o = 0; o < lin->out; o++) {
                ft_tensor_row_f32(&lin->w, o, w + (size_t)o * lin->in);
                add_lora_row(w + (size_t)o * lin->in, a, o, lin->in);
            }
            ftune_status st = ft_model_own(m, w);
            if (st) return st;
            lin->w.dtype = FT_F32;
            lin->w.data = w;
            lin->w.nbytes = (size_t)lin->out * lin->in * sizeof(float);
            lin->lora = NULL;
        }
    return FTUNE_OK;
}

/* ------------------------------------------------------------- row sources */

/* Where the rows of one output tensor come from. */
typedef struct {
    const ft_tensor *t;       /* a 2-D weight in any dtype, or NULL */
    const ft_lora *lora;      /* added to t's rows, or NULL */
    const float *vec;         /* a 1-D f32 vector (norms, biases), or NULL */
    int rows, cols;           /* 1 row for a vector */
    int perm_heads;           /* > 0: output row R is interleaved row src_row(R) (to rotate-half) */
} row_src;

static int src_row(const row_src *s, int R) {
    if (s->perm_heads <= 0) return R;
    int HS = s->rows / s->perm_heads, half = HS / 2, h = R / HS, j = R % HS;
    return h * HS + 2 * (j % half) + j / half;
}

/* Row R of the output in f32. */
static void make_row(const row_src *s, int R, float *row) {
    if (s->vec) {
        if (s->perm_heads > 0) /* a q/k bias: one row of `rows` elements, permuted likewise */
            for (int i = 0; i < s->cols; i++) {
                row_src one = { .rows = s->cols, .perm_heads = s->perm_heads };
                row[i] = s->vec[src_row(&one, i)];
            }
        else memcpy(row, s->vec, (size_t)s->cols * sizeof(float));
        return;
    }
    int o = src_row(s, R);
    ft_tensor_row_f32(s->t, o, row);
    if (s->lora) add_lora_row(row, s->lora, o, s->cols);
}

typedef struct {
    row_src *src;
    float *row;               /* (max cols) f32 */
    uint8_t *bytes;           /* (max cols) in the output dtype */
    int cached_index, cached_row;
} fill_state;

/* st_write's generator: bytes [offset, offset+n) of tensor `index`, built
 * row by row (a row may straddle two calls; the last one is cached). */
static void fill_rows(void *ctx, int index, ft_dtype dtype, void *dst, uint64_t offset, size_t n) {
    fill_state *fs = ctx;
    const row_src *s = &fs->src[index];
    size_t es = ft_types[dtype].block_bytes, row_bytes = (size_t)s->cols * es;
    uint8_t *out = dst;
    while (n > 0) {
        int R = (int)(offset / row_bytes);
        size_t in_row = (size_t)(offset % row_bytes), k = row_bytes - in_row < n ? row_bytes - in_row : n;
        if (fs->cached_index != index || fs->cached_row != R) {
            make_row(s, R, fs->row);
            ft_types[dtype].from_f32(fs->row, fs->bytes, s->cols);
            fs->cached_index = index;
            fs->cached_row = R;
        }
        memcpy(out, fs->bytes + in_row, k);
        out += k;
        offset += k;
        n -= k;
    }
}

/* ------------------------------------------------------------- Hugging Face */

static bool st_storable(ft_dtype t) { return t == FT_F32 || t == FT_F16 || t == FT_BF16; }

static ftune_status parse_dtype(const char *s, ft_dtype *out) {
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
        const st_tensor *t = st_find(&m->shards[i], name);
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

static ftune_status copy_file(const char *from, const char *to) {
    char *buf;
    size_t n;
    ftune_status st = ft_read_file(from, &buf, &n);
    if (st) return st;
    st = ft_write_file_atomic(to, buf, n);
    free(buf);
    return st;
}

static ftune_status write_hf(const ftune_model *mc, const char *dir, const ft_merge_opts *opts) {
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
    char *bdir = base_dir(m);
    cJSON *cfg = NULL;
    if (!ts || !src || !names || !fs.row || !fs.bytes) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    int n = 0;
    ft_dtype mat_dtype = FT_NTYPES; /* for torch_dtype: the dtype of the first matrix written */
    /* a matrix (from a weight, maybe with an adapter and a q/k permutation) */
#define ADD_MAT(NAME, TENSOR, LORA, HEADS) do { \
        st_out_tensor *t_ = &ts[n]; row_src *s_ = &src[n]; char *nm_ = names + (size_t)n * 96; \
        snprintf(nm_, 96, "%s", NAME); \
        const ft_tensor *w_ = (TENSOR); \
        ft_dtype dt_ = force ? forced : st_storable(w_->dtype) ? w_->dtype : FT_F32; \
        if (mat_dtype == FT_NTYPES) mat_dtype = dt_; \
        *s_ = (row_src){ .t = w_, .lora = (LORA), .rows = (int)w_->shape[0], .cols = (int)w_->shape[1], .perm_heads = (HEADS) }; \
        *t_ = (st_out_tensor){ .name = nm_, .dtype = dt_, .ndim = 2, .shape = { w_->shape[0], w_->shape[1] } }; \
        if (!s_->lora && !s_->perm_heads && dt_ == w_->dtype) t_->data = w_->data; \
        else { t_->fill = fill_rows; t_->fill_ctx = &fs; t_->fill_index = n; } \
        n++; \
    } while (0)
#define ADD_VEC(NAME, VEC, LEN, HEADS) do { \
        st_out_tensor *t_ = &ts[n]; row_src *s_ = &src[n]; char *nm_ = names + (size_t)n * 96; \
        snprintf(nm_, 96, "%s", NAME); \
        ft_dtype dt_ = force ? forced : base_vec_dtype(m, nm_); \
        *s_ = (row_src){ .vec = (VEC), .rows = 1, .cols = (LEN), .perm_heads = (HEADS) }; \
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
            const ft_linear *lin = ft_model_linear(m, l, (ft_module)k);
            int heads = c->rope_interleaved ? ft_module_rope_heads(c, (ft_module)k) : 0;
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, ft_module_path((ft_module)k));
            ADD_MAT(name, &lin->w, lin->lora, heads);
            if (lin->bias) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, ft_module_path((ft_module)k));
                ADD_VEC(name, lin->bias, lin->out, heads);
            }
        }
    }
#undef ADD_MAT
#undef ADD_VEC
    /* bytes: each row buffer holds max_cols elements of up to 4 bytes */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((st = st_write(path, ts, n, NULL))) goto done;

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
    } else if (!(cfg = config_from_model(m, mat_dtype))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((st = ft_write_json_atomic(path, cfg))) goto done;
    if (bdir) {
        static const char *const files[] = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                             "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt" };
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
    free(names);
    free(src);
    free(ts);
    return st;
}

/* ------------------------------------------------------------- GGUF */

/* Copies one key/value of the base GGUF to the writer. */
static ftune_status copy_kv(gguf_writer *w, const gguf_file *g, const gguf_kv *kv) {
    char *key = gguf_str_dup(kv->key);
    if (!key) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = FTUNE_OK;
    switch (kv->type) {
    case GGUF_T_STRING: {
        char *v = gguf_str_dup(kv->str);
        st = v ? gguf_writer_set_str(w, key, v) : ft_err(FTUNE_ERR_NOMEM, "out of memory");
        free(v);
        break;
    }
    case GGUF_T_U32: st = gguf_writer_set_u32(w, key, (uint32_t)kv->v.u); break;
    case GGUF_T_I32: st = gguf_writer_set_i32(w, key, (int32_t)kv->v.i); break;
    case GGUF_T_F32: st = gguf_writer_set_f32(w, key, (float)kv->v.f); break;
    case GGUF_T_BOOL: st = gguf_writer_set_bool(w, key, kv->v.u != 0); break;
    case GGUF_T_ARRAY:
        if (kv->arr_type == GGUF_T_STRING) {
            gguf_str_array arr = { 0 };
            char **v = NULL;
            if (!(st = gguf_get_str_array(g, key, &arr))) {
                v = ft_calloc((size_t)(arr.n ? arr.n : 1), sizeof *v);
                if (!v) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
                for (uint64_t i = 0; i < arr.n && !st; i++)
                    if (!(v[i] = gguf_str_dup(arr.items[i]))) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
                if (!st) st = gguf_writer_set_str_array(w, key, (const char *const *)v, (size_t)arr.n);
            }
            for (uint64_t i = 0; v && i < arr.n; i++) free(v[i]);
            free(v);
            free(arr.items);
        } else if (kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_I32) {
            void *v = ft_malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * 4);
            if (!v) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); break; }
            memcpy(v, kv->arr_data, (size_t)kv->arr_n * 4); /* the parser checked the array lies in the file */
            st = kv->arr_type == GGUF_T_F32 ? gguf_writer_set_f32_array(w, key, v, (size_t)kv->arr_n)
                                            : gguf_writer_set_i32_array(w, key, v, (size_t)kv->arr_n);
            free(v);
        } else st = ft_err(FTUNE_ERR_UNSUPPORTED, "key \"%s\": arrays of GGUF type %d cannot be copied", key, kv->arr_type);
        break;
    default:
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "key \"%s\": GGUF type %d cannot be copied", key, kv->type);
    }
    free(key);
    return st;
}

static ftune_status write_gguf(const ftune_model *mc, const char *path, const ft_merge_opts *opts) {
    ftune_model *m = (ftune_model *)mc; /* only read */
    if (!m->gguf)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: writing a merged GGUF needs a GGUF base model (its metadata and "
                      "tokenizer are copied); write a Hugging Face directory instead", path);
    /* a chosen dtype applies to the Linear weights (and so quantizes a
     * model); rows that are not whole blocks of it keep their type */
    ft_dtype forced = FT_NTYPES;
    if (opts && opts->dtype) {
        const char *d = opts->dtype;
        forced = !strcmp(d, "f32") ? FT_F32 : !strcmp(d, "f16") ? FT_F16 : !strcmp(d, "bf16") ? FT_BF16
               : !strcmp(d, "q8_0") ? FT_Q8_0 : !strcmp(d, "q4_0") ? FT_Q4_0 : FT_NTYPES;
        if (forced == FT_NTYPES)
            return ft_err(FTUNE_ERR_ARG, "%s: dtype \"%s\" is not one of f32, f16, bf16, q8_0, q4_0", path, d);
    }
    const gguf_file *g = m->gguf;
    const ft_config *c = &m->cfg;
    int n_merged = 0;
    void **bufs = ft_calloc((size_t)c->L * FT_N_MODS, sizeof *bufs);
    float *row = ft_malloc((size_t)(c->C > c->F ? c->C : c->F) * 4 + (size_t)c->NH * c->HS * 4);
    gguf_writer *w = NULL;
    ftune_status st = FTUNE_OK;
    if (!bufs || !row) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = gguf_writer_new(&w))) goto done;
    for (uint64_t i = 0; i < g->n_kv && !st; i++) st = copy_kv(w, g, &g->kv[i]);
    if (st) { st = ft_err_prefix(st, "%s", g->map.path); goto done; }
    char name[FT_NAME_MAX];
    for (uint64_t i = 0; i < g->n_tensors && !st; i++) {
        const gguf_tensor_info *ti = &g->tensors[i];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        if (ti->dtype >= FT_NTYPES) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": ggml type %s cannot be copied", g->map.path, name,
                        gguf_ggml_type_name(ti->ggml_type));
            break;
        }
        int64_t shape[4];
        for (uint32_t d = 0; d < ti->n_dims; d++) shape[d] = (int64_t)ti->ne[ti->n_dims - 1 - d];
        const void *data = ti->data;
        /* a Linear with an adapter, or already merged in memory: its rows, in the tensor's own type */
        int l, k = FT_N_MODS, used = 0;
        char mod[32];
        if (sscanf(name, "blk.%d.%31[a-z_].weight%n", &l, mod, &used) == 2 && used == (int)strlen(name) && l >= 0 &&
            l < c->L)
            for (k = 0; k < FT_N_MODS && strcmp(mod, ft_module_gguf_name((ft_module)k)) != 0; k++) {}
        const ft_linear *lin = k < FT_N_MODS ? ft_model_linear(m, l, (ft_module)k) : NULL;
        ft_dtype out_dt = ti->dtype;
        if (lin && forced != FT_NTYPES && lin->in % ft_types[forced].block == 0) out_dt = forced;
        if (lin && (lin->lora || lin->w.data != ti->data || out_dt != ti->dtype)) {
            size_t rb = (size_t)ft_dtype_nbytes(out_dt, lin->in);
            uint8_t *b = ft_malloc(rb * lin->out);
            if (!b) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); break; }
            bufs[n_merged++] = b;
            for (int o = 0; o < lin->out; o++) {
                ft_tensor_row_f32(&lin->w, o, row);
                if (lin->lora) add_lora_row(row, lin->lora, o, lin->in);
                ft_types[out_dt].from_f32(row, b + (size_t)o * rb, lin->in);
            }
            data = b;
        }
        if (!st) st = gguf_writer_add_tensor(w, name, out_dt, (int)ti->n_dims, shape, data);
    }
    if (!st) st = gguf_writer_write(w, path);
done:
    gguf_writer_free(w);
    for (int i = 0; i < n_merged; i++) free(bufs[i]);
    free(bufs);
    free(row);
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
    size_t n = strlen(out_path);
    if (n >= 5 && strcmp(out_path + n - 5, ".gguf") == 0) return write_gguf(m, out_path, opts);
    return write_hf(m, out_path, opts);
}
