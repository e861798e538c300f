/* model_hf.c — Hugging Face directories: config.json, model.safetensors or
 * sharded model-*.safetensors with model.safetensors.index.json, and the
 * tokenizer files beside them. Weights stay in the mapped files. */
#include "model/model.h"
#include "formats/bnb.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opens model.safetensors, or every shard named in the index (whole
 * mappings, or with header_only their headers alone). On an error nothing
 * stays open. */
ftune_status ft_hf_open_shards(const char *dir, bool header_only, st_file **files_out, int *n_out) {
    *files_out = NULL;
    *n_out = 0;
    FTUNE_MUST_USE ftune_status (*open_one)(st_file *, const char *) = header_only ? ft_st_open_header : ft_st_open;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (ft_file_exists(path)) {
        st_file *f = calloc(1, sizeof *f);
        if (!f) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        ftune_status st = open_one(&f[0], path);
        if (st) { free(f); return st; }
        *files_out = f;
        *n_out = 1;
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
    int n = cJSON_GetArraySize(wm), nf = 0, nopen = 0;
    const char **names = calloc((size_t)n + 1, sizeof *names);
    st_file *f = calloc((size_t)n + 1, sizeof *f);
    if (!names || !f) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: weight_map entry \"%s\" is not a file name", path, e->string);
            goto done;
        }
        int k = 0;
        while (k < nf && strcmp(names[k], e->valuestring)) k++;
        if (k == nf) names[nf++] = e->valuestring;
    }
    for (; nopen < nf; nopen++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[nopen]);
        if ((st = open_one(&f[nopen], path))) goto done;
    }
done:
    if (st) {
        for (int k = 0; k < nopen; k++) ft_st_close(&f[k]);
        free(f);
    } else {
        *files_out = f;
        *n_out = nf;
    }
    free(names);
    cJSON_Delete(j);
    return st;
}

/* used[i][k]: shard i's tensor k was bound to a weight (or is a known copy). */
static FTUNE_MUST_USE ftune_status find(ftune_model *m, uint8_t **used, const char *name, ft_tensor *t, bool required, bool *found) {
    for (int i = 0; i < m->n_shards; i++) {
        const st_tensor *s = ft_st_find(&m->shards[i], name);
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

/* t becomes the owned quantized weight (out, in) of dtype dt at dst
 * (nbytes), counted as the model's quantized bytes; quant is what the
 * model records as its base quantization. */
static void bind_quantized(ftune_model *m, ft_tensor *t, const char *name, ft_dtype dt, ft_dtype quant, int out, int in,
                           void *dst, size_t nbytes) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = out;
    t->shape[1] = in;
    t->data = dst;
    t->nbytes = nbytes;
    m->quant_bytes += (int64_t)nbytes;
    m->quantized = true;
    m->quant = quant;
}

/* A bitsandbytes 4-bit weight (packed U8 "name" beside "name.absmax" and
 * the rest of bnb.h's ft_bnb_tensors) becomes owned rows in t (nf4, or
 * f32 where its blocks cross rows: ft_bnb_held_dtype); t is left as it is
 * for any other tensor. */
static FTUNE_MUST_USE ftune_status bnb_weight(ftune_model *m, uint8_t **used, const char *name, ft_tensor *t, int out, int in) {
    char k[FT_NAME_MAX + 48];
    ft_tensor parts[6];
    bool found[6] = { false };
    static const char *const sfx[6] = { ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                        ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4" };
    if (t->dtype != FT_U8) return FTUNE_OK;
    snprintf(k, sizeof k, "%s%s", name, sfx[0]);
    ftune_status st = find(m, used, k, &parts[0], false, &found[0]);
    if (st || !found[0]) return st;
    for (int i = 1; i < 6; i++) {
        snprintf(k, sizeof k, "%s%s", name, sfx[i]);
        if ((st = find(m, used, k, &parts[i], false, &found[i]))) return st;
    }
    if (found[5] && !found[4])
        return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": bitsandbytes quant type fp4 is not supported (only nf4)", name);
    ft_tensor w = *t;
    ft_bnb_tensors bt = { .weight = &w };
    const ft_tensor **slot[5] = { &bt.absmax, &bt.quant_map, &bt.nested_absmax, &bt.nested_quant_map, &bt.quant_state };
    for (int i = 0; i < 5; i++) *slot[i] = found[i] ? &parts[i] : NULL;
    ft_dtype dt = ft_bnb_held_dtype(in);
    size_t nbytes = ft_held_bytes(dt, out, in);
    void *dst = ft_model_alloc(m, nbytes);
    if (!dst) return ft_err(FTUNE_ERR_NOMEM, "out of memory for tensor \"%s\"", name);
    if ((st = ft_bnb_read_weight(dst, &bt, name, out, in))) return st;
    bind_quantized(m, t, name, dt, FT_NF4, out, in, dst, nbytes);
    return FTUNE_OK;
}

/* A bitsandbytes 8-bit weight: "P.weight" I8 (out, in) beside "P.SCB" F32
 * (out), its rows' absmax, and "P.weight_format" (0: row-major), as
 * Linear8bitLt saves them, becomes owned int8 rows (FT_I8ROW: the same
 * values, q·SCB/127) in t; t is left as it is for any other tensor. */
static FTUNE_MUST_USE ftune_status bnb8_weight(ftune_model *m, uint8_t **used, const char *name, ft_tensor *t, int out, int in) {
    char prefix[FT_NAME_MAX], k[FT_NAME_MAX + 16];
    size_t len = strlen(name);
    if (t->dtype != FT_I8 || len < 7) return FTUNE_OK;
    snprintf(prefix, sizeof prefix, "%.*s", (int)(len - 7), name); /* without ".weight" */
    ft_tensor scb, wf;
    bool has_scb, has_wf;
    snprintf(k, sizeof k, "%s.SCB", prefix);
    ftune_status st = find(m, used, k, &scb, false, &has_scb);
    if (st || !has_scb) return st;
    snprintf(k, sizeof k, "%s.weight_format", prefix);
    if ((st = find(m, used, k, &wf, false, &has_wf))) return st;
    if (has_wf && (wf.dtype != FT_U8 || ft_tensor_numel(&wf) != 1 || *(const uint8_t *)wf.data != 0))
        return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": bitsandbytes weight_format is not 0 (row-major), the only "
                      "layout supported", k);
    if (t->ndim != 2 || t->shape[0] != out || t->shape[1] != in)
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": shape does not match the config (expected [%d, %d])", name, out, in);
    if (scb.dtype != FT_F32 || ft_tensor_numel(&scb) != out)
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s.SCB\": %s with %lld elements, expected F32 with %d", prefix,
                      ft_types[scb.dtype].name, (long long)ft_tensor_numel(&scb), out);
    size_t rb = (size_t)ft_dtype_nbytes(FT_I8ROW, in), nbytes = ft_held_bytes(FT_I8ROW, out, in);
    uint8_t *dst = ft_model_alloc(m, nbytes);
    if (!dst) return ft_err(FTUNE_ERR_NOMEM, "out of memory for tensor \"%s\"", name);
    for (int o = 0; o < out; o++) {
        float a;
        memcpy(&a, (const uint8_t *)scb.data + 4 * (size_t)o, 4);
        if (!isfinite(a) || a < 0)
            return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s.SCB\": row %d's absmax %g is not a finite number >= 0", prefix, o,
                          (double)a);
        memcpy(dst + rb * o, &a, 4);
        memcpy(dst + rb * o + 4, (const uint8_t *)t->data + (size_t)o * in, (size_t)in);
    }
    bind_quantized(m, t, name, FT_I8ROW, FT_I8ROW, out, in, dst, nbytes);
    return FTUNE_OK;
}

/* Tensors the config did not ask for mean the config and the weights
 * disagree (e.g. fewer num_hidden_layers than the file holds, or biases the
 * config switches off): transformers only warns ("Some weights of the
 * checkpoint were not used"), which is how a wrong model runs unnoticed, so
 * this is an error naming them. Rotary inv_freq buffers, which older
 * transformers versions saved, are recomputed from the config and skipped. */
static FTUNE_MUST_USE ftune_status check_unused(const ftune_model *m, uint8_t **used) {
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

/* config.json's quantization_config, if any: only bitsandbytes' 4-bit nf4
 * and 8-bit are read (their tensors, by bnb_weight and bnb8_weight);
 * anything else is refused here, by name, rather than by a missing tensor
 * later. */
ftune_status ft_hf_check_quant_config(const char *path) {
    char *text;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        const cJSON *meth = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
        const cJSON *l8 = cJSON_GetObjectItemCaseSensitive(q, "load_in_8bit");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(q, "bnb_4bit_quant_type");
        if (!cJSON_IsString(meth) || strcmp(meth->valuestring, "bitsandbytes") != 0)
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: quantization_config.quant_method %s is not supported (only "
                        "bitsandbytes 4-bit nf4 and 8-bit)", path, cJSON_IsString(meth) ? meth->valuestring : "(none)");
        else if (!cJSON_IsTrue(l8) && cJSON_IsString(ty) && strcmp(ty->valuestring, "nf4") != 0)
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: quantization_config.bnb_4bit_quant_type \"%s\" is not supported "
                        "(only nf4)", path, ty->valuestring);
    }
    cJSON_Delete(j);
    return st;
}

ftune_status ft_hf_read_config(const char *dir, ft_config *cfg) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ftune_status st = ft_config_from_hf_json(cfg, path);
    if (!st) st = ft_hf_check_quant_config(path);
    return st;
}

ftune_status ft_load_hf(ftune_model *m, const char *dir) {
    char path[4096];
    snprintf(m->format, sizeof m->format, "hf");
    ftune_status st = ft_hf_read_config(dir, &m->cfg);
    if (st) return st;
    if ((st = ft_hf_open_shards(dir, false, &m->shards, &m->n_shards))) return st;
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
            if ((st = bnb_weight(m, used, name, &t, lins[k].out, lins[k].in))) goto fail;
            if ((st = bnb8_weight(m, used, name, &t, lins[k].out, lins[k].in))) goto fail;
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
