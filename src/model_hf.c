/* model_hf.c — Hugging Face directories: config.json, model.safetensors or
 * sharded model-*.safetensors with model.safetensors.index.json, and the
 * tokenizer files beside them. Weights stay in the mapped files. */
#include "model.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool json_int(const cJSON *o, const char *k, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0) return false;
    *out = (int)d;
    return true;
}
/* Optional keys: absent keeps *out (the transformers default the caller
 * set); present with the wrong type or out of range is an error naming the
 * key, never a silent default. null counts as absent only where
 * transformers reads None as "not set" (null_ok). */
static ftune_status opt_int(const cJSON *o, const char *k, int lo, int hi, bool null_ok, int *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || (null_ok && cJSON_IsNull(v))) return FTUNE_OK;
    int x;
    if (!json_int(o, k, &x) || x < lo || x > hi)
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", path, k, lo, hi);
    *out = x;
    return FTUNE_OK;
}
/* A number that is finite and > 0 as a float (1e-50 would round to 0, 1e300 to inf). */
static ftune_status opt_pos(const cJSON *o, const char *k, float *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return FTUNE_OK;
    float x = cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
    if (!cJSON_IsNumber(v) || !isfinite(x) || !(x > 0))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be a finite positive number", path, k);
    *out = x;
    return FTUNE_OK;
}
static ftune_status opt_bool(const cJSON *o, const char *k, bool *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return FTUNE_OK;
    if (!cJSON_IsBool(v)) return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be true or false", path, k);
    *out = cJSON_IsTrue(v);
    return FTUNE_OK;
}
static bool json_num(const cJSON *o, const char *k, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) return false;
    *out = (float)v->valuedouble;
    return isfinite(*out);
}
/* eos_token_id may be a number or a list: take the first */
static int json_token_id(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

static const char *known_arch(const char *model_type) {
    static const char *const llama_like[] = { "llama", "mistral", "qwen2", "smollm", "tinyllama", NULL };
    for (int i = 0; llama_like[i]; i++)
        if (strcmp(model_type, llama_like[i]) == 0) return llama_like[i];
    return NULL;
}

ftune_status ft_config_from_hf_json(ft_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    char *text;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return ft_err(FTUNE_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *arch = cJSON_IsString(mt) ? known_arch(mt->valuestring) : NULL;
    if (!arch) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: model_type %s%s%s is not supported (supported: llama, mistral, qwen2)",
                    path, cJSON_IsString(mt) ? "\"" : "", cJSON_IsString(mt) ? mt->valuestring : "(missing)",
                    cJSON_IsString(mt) ? "\"" : "");
        cJSON_Delete(j);
        return st;
    }
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    const char *missing = NULL;
    if (!json_int(j, "hidden_size", &c->C)) missing = "hidden_size";
    else if (!json_int(j, "intermediate_size", &c->F)) missing = "intermediate_size";
    else if (!json_int(j, "num_hidden_layers", &c->L)) missing = "num_hidden_layers";
    else if (!json_int(j, "num_attention_heads", &c->NH)) missing = "num_attention_heads";
    else if (!json_int(j, "vocab_size", &c->V)) missing = "vocab_size";
    if (missing) {
        cJSON_Delete(j);
        return ft_err(FTUNE_ERR_FORMAT, "%s: missing or invalid \"%s\"", path, missing);
    }
    /* transformers' LlamaConfig defaults for what a config may leave out */
    c->NKV = c->NH;
    c->HS = c->NH > 0 ? c->C / c->NH : 0;
    c->max_T = 2048;
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    bool tied = false, bias = false, sliding = true;
    int window = 0;
    const int big = 1 << 24;
    if ((st = opt_int(j, "num_key_value_heads", 1, big, false, &c->NKV, path)) ||
        (st = opt_int(j, "head_dim", 1, big, true, &c->HS, path)) ||
        (st = opt_int(j, "max_position_embeddings", 1, big, false, &c->max_T, path)) ||
        (st = opt_pos(j, "rms_norm_eps", &c->norm_eps, path)) ||
        (st = opt_pos(j, "rope_theta", &c->rope_theta, path)) ||
        (st = opt_bool(j, "tie_word_embeddings", &tied, path)) ||
        (st = opt_bool(j, "attention_bias", &bias, path)) ||
        (st = opt_bool(j, "use_sliding_window", &sliding, path)) ||
        (st = opt_int(j, "sliding_window", 1, INT32_MAX, true, &window, path))) {
        cJSON_Delete(j);
        return st;
    }
    /* Mistral's sliding-window attention is not implemented: within the
     * window it equals full attention, so the context is capped there */
    if (sliding && window > 0 && window < c->max_T) c->max_T = window;
    bool qwen2 = strcmp(arch, "qwen2") == 0;
    c->tied = tied;
    c->qkv_bias = qwen2 ? 1 : bias;
    c->bos_id = json_token_id(j, "bos_token_id");
    c->eos_id = json_token_id(j, "eos_token_id");
    c->rope_interleaved = false;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (cJSON_IsObject(rs)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!cJSON_IsString(ty)) ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        const char *tname = cJSON_IsString(ty) ? ty->valuestring : "";
        ft_rope_scaling *sc = &c->rope_scaling;
        if (strcmp(tname, "llama3") == 0) {
            sc->type = 2;
            if (!json_num(rs, "factor", &sc->factor) || !json_num(rs, "low_freq_factor", &sc->low_freq_factor) ||
                !json_num(rs, "high_freq_factor", &sc->high_freq_factor) ||
                !json_int(rs, "original_max_position_embeddings", &sc->original_max_pos)) {
                cJSON_Delete(j);
                return ft_err(FTUNE_ERR_FORMAT, "%s: rope_scaling llama3 needs factor, low_freq_factor, "
                              "high_freq_factor and original_max_position_embeddings", path);
            }
        } else if (strcmp(tname, "linear") == 0) {
            sc->type = 1;
            if (!json_num(rs, "factor", &sc->factor) || !(sc->factor > 0)) {
                cJSON_Delete(j);
                return ft_err(FTUNE_ERR_FORMAT, "%s: rope_scaling linear needs a positive factor", path);
            }
        } else if (strcmp(tname, "default") != 0) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (llama3, linear)",
                        path, tname);
            cJSON_Delete(j);
            return st;
        }
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", path, act->valuestring);
        cJSON_Delete(j);
        return st;
    }
    cJSON_Delete(j);
    return ft_config_validate(c, path);
}

/* Opens model.safetensors, or every shard named in the index. */
static ftune_status open_shards(ftune_model *m, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ft_file_exists(path)) {
        m->shards = calloc(1, sizeof(st_file));
        if (!m->shards) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        ftune_status st = st_open(&m->shards[0], path);
        if (st) return st;
        m->n_shards = 1;
        return FTUNE_OK;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!ft_file_exists(path))
        return ft_err(FTUNE_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    char *text;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        return ft_err(FTUNE_ERR_FORMAT, "%s: no \"weight_map\" object", path);
    }
    /* distinct file names, in order of first appearance */
    int n = cJSON_GetArraySize(wm);
    const char **files = calloc((size_t)n + 1, sizeof *files);
    int nf = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a file name", path, e->string);
            goto done;
        }
        int k = 0;
        while (k < nf && strcmp(files[k], e->valuestring)) k++;
        if (k == nf) files[nf++] = e->valuestring;
    }
    m->shards = calloc((size_t)nf + 1, sizeof(st_file));
    if (!m->shards) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (int k = 0; k < nf; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        if ((st = st_open(&m->shards[k], path))) goto done;
        m->n_shards = k + 1;
    }
done:
    free(files);
    cJSON_Delete(j);
    return st;
}

/* used[i][k]: shard i's tensor k was bound to a weight (or is a known copy). */
static ftune_status find(ftune_model *m, uint8_t **used, const char *name, ft_tensor *t, bool required, bool *found) {
    for (int i = 0; i < m->n_shards; i++) {
        const st_tensor *s = st_find(&m->shards[i], name);
        if (!s) continue;
        used[i][s - m->shards[i].tensors] = 1;
        if (s->dtype >= FT_NTYPES)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype %s is not supported", m->shards[i].map.path,
                          name, s->dtype_name);
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        memcpy(t->shape, s->shape, sizeof t->shape);
        t->data = (void *)s->data;
        t->nbytes = (size_t)(s->end - s->begin);
        if (found) *found = true;
        return FTUNE_OK;
    }
    if (found) *found = false;
    if (!required) return FTUNE_OK;
    return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\" is missing from the safetensors files", name);
}

/* Tensors the config did not ask for mean the config and the weights
 * disagree (e.g. fewer num_hidden_layers than the file holds, or biases the
 * config switches off): transformers only warns ("Some weights of the
 * checkpoint were not used"), which is how a wrong model runs unnoticed, so
 * this is an error naming them. Rotary inv_freq buffers, which older
 * transformers versions saved, are recomputed from the config and skipped. */
static ftune_status check_unused(const ftune_model *m, uint8_t **used) {
    int n_unused = 0;
    char names[512] = "";
    for (int i = 0; i < m->n_shards; i++)
        for (int k = 0; k < m->shards[i].n; k++) {
            const char *name = m->shards[i].tensors[k].name;
            size_t len = strlen(name), suf = strlen(".rotary_emb.inv_freq");
            if (used[i][k] || (len > suf && strcmp(name + len - suf, ".rotary_emb.inv_freq") == 0)) continue;
            if (n_unused++ < 3)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s\"%s\" (%s)", n_unused > 1 ? ", " : "",
                         name, m->shards[i].map.path);
        }
    if (!n_unused) return FTUNE_OK;
    return ft_err(FTUNE_ERR_FORMAT, "%d tensor%s not used by the config (num_hidden_layers %d): %s%s", n_unused,
                  n_unused > 1 ? "s are" : " is", m->cfg.L, names, n_unused > 3 ? ", ..." : "");
}

ftune_status ft_load_hf(ftune_model *m, const char *dir) {
    char path[4096];
    snprintf(m->format, sizeof m->format, "hf");
    snprintf(path, sizeof path, "%s/config.json", dir);
    ftune_status st = ft_config_from_hf_json(&m->cfg, path);
    if (st) return st;
    if ((st = open_shards(m, dir))) return st;
    ft_config *c = &m->cfg;
    m->layers = calloc((size_t)c->L, sizeof *m->layers);
    uint8_t **used = calloc((size_t)m->n_shards, sizeof *used);
    if (!m->layers || !used) { free(used); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < m->n_shards; i++)
        if (!(used[i] = calloc((size_t)m->shards[i].n + 1, 1))) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto fail; }
    ft_tensor t;
    char name[FT_NAME_MAX];
#define NEED(n) do { if ((st = find(m, used, n, &t, true, NULL))) goto fail; } while (0)
    NEED("model.embed_tokens.weight");
    if ((st = ft_model_bind_linear(m, &m->lm_head, &t, c->V, c->C))) goto fail;
    m->tok_embd = t;
    bool has_head;
    if ((st = find(m, used, "lm_head.weight", &t, false, &has_head))) goto fail;
    if (has_head && !c->tied) {
        if ((st = ft_model_bind_linear(m, &m->lm_head, &t, c->V, c->C))) goto fail;
    } else c->tied = true;
    NEED("model.norm.weight");
    if ((st = ft_model_bind_vec(m, &m->out_norm, &t, c->C))) goto fail;
    int q_out = c->NH * c->HS, kv_out = c->NKV * c->HS;
    for (int l = 0; l < c->L; l++) {
        ft_layer *ly = &m->layers[l];
        struct { const char *suffix; ft_linear *lin; int out, in; } lins[] = {
            { "self_attn.q_proj", &ly->wq, q_out, c->C },   { "self_attn.k_proj", &ly->wk, kv_out, c->C },
            { "self_attn.v_proj", &ly->wv, kv_out, c->C },  { "self_attn.o_proj", &ly->wo, c->C, q_out },
            { "mlp.gate_proj", &ly->w_gate, c->F, c->C },   { "mlp.up_proj", &ly->w_up, c->F, c->C },
            { "mlp.down_proj", &ly->w_down, c->C, c->F },
        };
        for (size_t k = 0; k < sizeof lins / sizeof lins[0]; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, lins[k].suffix);
            NEED(name);
            if ((st = ft_model_bind_linear(m, lins[k].lin, &t, lins[k].out, lins[k].in))) goto fail;
            if (c->qkv_bias && k < 3) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, lins[k].suffix);
                NEED(name);
                if ((st = ft_model_bind_vec(m, &lins[k].lin->bias, &t, lins[k].out))) goto fail;
            }
        }
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        NEED(name);
        if ((st = ft_model_bind_vec(m, &ly->attn_norm, &t, c->C))) goto fail;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        NEED(name);
        if ((st = ft_model_bind_vec(m, &ly->ffn_norm, &t, c->C))) goto fail;
    }
#undef NEED
    if ((st = check_unused(m, used))) goto fail;
    for (int i = 0; i < m->n_shards; i++) free(used[i]);
    free(used);
    used = NULL;
    /* a directory without tokenizer.json still loads (e.g. from `ftune init`);
     * commands that need text report the missing tokenizer */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!ft_file_exists(path)) return FTUNE_OK;
    if ((st = ft_tokenizer_from_hf_dir(&m->tok, dir))) return st;
    if (m->tok) snprintf(m->tok_kind, sizeof m->tok_kind, "%s", ft_tokenizer_kind(m->tok) == FT_TOK_SPM ? "spm" : "bpe");
    return FTUNE_OK;
fail:
    for (int i = 0; used && i < m->n_shards; i++) free(used[i]);
    free(used);
    return ft_err_prefix(st, "%s", dir);
}
