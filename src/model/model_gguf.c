/* model_gguf.c — GGUF models (llama.cpp's format): hyperparameters from the
 * "<arch>.*" metadata, the embedded tokenizer, tensors in any supported
 * ggml type. Llama-arch GGUF files keep q/k rows in Meta's interleaved RoPE
 * layout, so the model runs interleaved RoPE rather than permuting weights. */
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A required integer key: missing and invalid are both errors (the caller's). */
static bool get_int(const gguf_file *g, const char *arch, const char *key, int *out) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v;
    if (!ft_gguf_get_i64(g, k, &v) || v < 0 || v > (1 << 30)) return false;
    *out = (int)v;
    return true;
}
/* Optional keys: absent keeps *out (llama.cpp's default, set by the caller);
 * present with another type, out of range or not finite is an error naming
 * the key, never a silent default. */
static FTUNE_MUST_USE ftune_status opt_int(const gguf_file *g, const char *arch, const char *key, int *out) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (!ft_gguf_find(g, k)) return FTUNE_OK;
    int64_t v;
    if (!ft_gguf_get_i64(g, k, &v) || v < 1 || v > (1 << 24))
        return ft_err(FTUNE_ERR_FORMAT, "%s: %s must be an integer in [1, %d]", g->map.path, k, 1 << 24);
    *out = (int)v;
    return FTUNE_OK;
}
static FTUNE_MUST_USE ftune_status opt_pos(const gguf_file *g, const char *arch, const char *key, float *out) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (!ft_gguf_find(g, k)) return FTUNE_OK;
    double v;
    if (!ft_gguf_get_f64(g, k, &v) || !isfinite((float)v) || !((float)v > 0))
        return ft_err(FTUNE_ERR_FORMAT, "%s: %s must be a finite positive number", g->map.path, k);
    *out = (float)v;
    return FTUNE_OK;
}

/* used[i]: tensor i was bound to a weight. */
static FTUNE_MUST_USE ftune_status tensor(const gguf_file *g, uint8_t *used, const char *name, ft_tensor *t, bool required, bool *found) {
    const gguf_tensor_info *ti = ft_gguf_find_tensor(g, name);
    if (found) *found = ti != NULL;
    if (ti) used[ti - g->tensors] = 1;
    if (!ti) {
        if (!required) return FTUNE_OK;
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is missing", g->map.path, name);
    }
    if (!ft_dtype_is_weight(ti->dtype)) {
        char names[256];
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": ggml type %s is not supported (%s)", g->map.path, name,
                      ft_types[ti->dtype].name, ft_dtype_gguf_weight_names(names, sizeof names));
    }
    /* a non-finite block scale makes every value of its block inf or NaN:
     * a damaged file, refused by name before anything computes with it */
    int64_t bad = ft_types[ti->dtype].n_scales
                      ? ft_dtype_check_scales(ti->dtype, ti->data, (int64_t)(ti->nbytes / ft_types[ti->dtype].block_bytes))
                      : -1;
    if (bad >= 0)
        return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" (%s): block %lld has a scale that is inf or NaN (a damaged file)",
                      g->map.path, name, ft_types[ti->dtype].name, (long long)bad);
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = ti->dtype;
    t->ndim = (int)ti->n_dims;
    for (uint32_t i = 0; i < ti->n_dims; i++) t->shape[i] = (int64_t)ti->ne[ti->n_dims - 1 - i];
    t->data = (void *)ti->data;
    t->nbytes = ti->nbytes;
    return FTUNE_OK;
}

/* Tensors the metadata did not ask for mean it and the weights disagree
 * (e.g. a block_count smaller than the blk.N the file holds): an error
 * naming them, as for Hugging Face directories (model_hf.c). */
static FTUNE_MUST_USE ftune_status check_unused(const gguf_file *g, const uint8_t *used, int L) {
    uint64_t n_unused = 0;
    char names[256] = "";
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (used[i]) continue;
        if (n_unused++ < 3)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s\"%.*s\"", n_unused > 1 ? ", " : "",
                     (int)g->tensors[i].name.len, g->tensors[i].name.ptr);
    }
    if (!n_unused) return FTUNE_OK;
    return ft_err(FTUNE_ERR_FORMAT, "%s: %llu tensor%s not used by the metadata (block_count %d): %s%s", g->map.path,
                  (unsigned long long)n_unused, n_unused > 1 ? "s are" : " is", L, names, n_unused > 3 ? ", ..." : "");
}

static FTUNE_MUST_USE ftune_status load_gguf(ftune_model *m, const char *path, uint8_t **used);

ftune_status ft_load_gguf(ftune_model *m, const char *path) {
    uint8_t *used = NULL;
    ftune_status st = load_gguf(m, path, &used);
    free(used);
    return st;
}

static FTUNE_MUST_USE ftune_status load_gguf(ftune_model *m, const char *path, uint8_t **used_out) {
    snprintf(m->format, sizeof m->format, "gguf");
    m->gguf = calloc(1, sizeof *m->gguf);
    if (!m->gguf) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = ft_gguf_open(m->gguf, path);
    if (st) { free(m->gguf); m->gguf = NULL; return st; }
    const gguf_file *g = m->gguf;
    if (g->n_tensors == 0)
        return ft_err(FTUNE_ERR_FORMAT, "%s: a vocabulary-only GGUF (no tensors): it holds a tokenizer "
                      "(for ftune tokenize and ftune info), not a model that can run", path);
    uint8_t *used = *used_out = calloc(g->n_tensors + 1, 1);
    if (!used) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    gguf_str s;
    if (!ft_gguf_get_str(g, "general.architecture", &s))
        return ft_err(FTUNE_ERR_FORMAT, "%s: no general.architecture", path);
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 31 ? s.len : 31), s.ptr);
    gguf_str gtype;
    if (ft_gguf_get_str(g, "general.type", &gtype) && ft_gguf_str_eq(gtype, "adapter"))
        return ft_err(FTUNE_ERR_ARG, "%s: this GGUF is a LoRA adapter, not a model (pass it with --adapter)", path);
    bool is_llama = strcmp(arch, "llama") == 0, is_qwen2 = strcmp(arch, "qwen2") == 0;
    if (!is_llama && !is_qwen2)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported (llama, qwen2)", path, arch);
    ft_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    const char *missing = NULL;
    if (!get_int(g, arch, "embedding_length", &c->C)) missing = "embedding_length";
    else if (!get_int(g, arch, "feed_forward_length", &c->F)) missing = "feed_forward_length";
    else if (!get_int(g, arch, "block_count", &c->L)) missing = "block_count";
    else if (!get_int(g, arch, "attention.head_count", &c->NH)) missing = "attention.head_count";
    if (missing) return ft_err(FTUNE_ERR_FORMAT, "%s: missing or invalid %s.%s", path, arch, missing);
    c->NKV = c->NH;
    c->HS = c->NH ? c->C / c->NH : 0;
    c->max_T = 2048;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    if ((st = opt_int(g, arch, "attention.head_count_kv", &c->NKV)) ||
        (st = opt_int(g, arch, "attention.key_length", &c->HS)) ||
        (st = opt_int(g, arch, "context_length", &c->max_T)) ||
        (st = opt_pos(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps)) ||
        (st = opt_pos(g, arch, "rope.freq_base", &c->rope_theta)))
        return st;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str stype;
    bool has_type = ft_gguf_get_str(g, key, &stype);
    if (ft_gguf_find(g, key) && !has_type) return ft_err(FTUNE_ERR_FORMAT, "%s: %s is not a string", path, key);
    if (has_type && ft_gguf_str_eq(stype, "linear")) {
        float factor = 0;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if (!ft_gguf_find(g, key)) return ft_err(FTUNE_ERR_FORMAT, "%s: linear RoPE scaling without %s", path, key);
        if ((st = opt_pos(g, arch, "rope.scaling.factor", &factor))) return st;
        c->rope_scaling.type = 1;
        c->rope_scaling.factor = factor;
    } else if (has_type && !ft_gguf_str_eq(stype, "none"))
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: %s \"%.*s\" is not supported (none, linear)", path, key,
                      (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
    c->rope_interleaved = is_llama;
    c->qkv_bias = ft_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    int64_t id;
    c->bos_id = ft_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &id) ? (int32_t)id : -1;
    c->eos_id = ft_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &id) ? (int32_t)id : -1;

    ft_tensor t;
    if ((st = tensor(g, used, "token_embd.weight", &t, true, NULL))) return st;
    if (t.ndim != 2) return ft_err(FTUNE_ERR_FORMAT, "%s: token_embd.weight is not 2-D", path);
    c->V = (int)t.shape[0];
    if ((st = ft_config_validate(c, path))) return st;
    if ((st = ft_model_bind_linear(m, &m->lm_head, &t, c->V, c->C))) return ft_err_prefix(st, "%s", path);
    m->tok_embd = t;
    bool has_out;
    if ((st = tensor(g, used, "output.weight", &t, false, &has_out))) return st;
    c->tied = !has_out;
    if (has_out && (st = ft_model_bind_linear(m, &m->lm_head, &t, c->V, c->C))) return ft_err_prefix(st, "%s", path);
    if ((st = tensor(g, used, "output_norm.weight", &t, true, NULL))) return st;
    if ((st = ft_model_bind_vec(m, &m->out_norm, &t, c->C))) return ft_err_prefix(st, "%s", path);
    bool has_rf;
    if ((st = tensor(g, used, "rope_freqs.weight", &t, false, &has_rf))) return st;
    if (has_rf && (st = ft_model_bind_vec(m, &m->rope_freq_factors, &t, c->HS / 2))) return ft_err_prefix(st, "%s", path);

    m->layers = calloc((size_t)c->L, sizeof *m->layers);
    if (!m->layers) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    int q_out = c->NH * c->HS, kv_out = c->NKV * c->HS;
    char name[FT_NAME_MAX];
    for (int l = 0; l < c->L; l++) {
        ft_layer *ly = &m->layers[l];
        struct { const char *n; ft_linear *lin; int out, in; } lins[] = {
            { "attn_q", &ly->wq, q_out, c->C },  { "attn_k", &ly->wk, kv_out, c->C },
            { "attn_v", &ly->wv, kv_out, c->C }, { "attn_output", &ly->wo, c->C, q_out },
            { "ffn_gate", &ly->w_gate, c->F, c->C }, { "ffn_up", &ly->w_up, c->F, c->C },
            { "ffn_down", &ly->w_down, c->C, c->F },
        };
        for (size_t k = 0; k < sizeof lins / sizeof lins[0]; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, lins[k].n);
            if ((st = tensor(g, used, name, &t, true, NULL))) return st;
            if ((st = ft_model_bind_linear(m, lins[k].lin, &t, lins[k].out, lins[k].in))) return ft_err_prefix(st, "%s", path);
            if (c->qkv_bias && k < 3) {
                snprintf(name, sizeof name, "blk.%d.%s.bias", l, lins[k].n);
                if ((st = tensor(g, used, name, &t, true, NULL))) return st;
                if ((st = ft_model_bind_vec(m, &lins[k].lin->bias, &t, lins[k].out))) return ft_err_prefix(st, "%s", path);
            }
        }
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        if ((st = tensor(g, used, name, &t, true, NULL))) return st;
        if ((st = ft_model_bind_vec(m, &ly->attn_norm, &t, c->C))) return ft_err_prefix(st, "%s", path);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        if ((st = tensor(g, used, name, &t, true, NULL))) return st;
        if ((st = ft_model_bind_vec(m, &ly->ffn_norm, &t, c->C))) return ft_err_prefix(st, "%s", path);
    }
    if ((st = check_unused(g, used, c->L))) return st;
    gguf_str tm;
    if (ft_gguf_get_str(g, "tokenizer.ggml.model", &tm))
        snprintf(m->tok_kind, sizeof m->tok_kind, "%s", ft_gguf_str_eq(tm, "gpt2") ? "bpe" : "spm");
    if ((st = ft_tokenizer_from_gguf(&m->tok, g))) return ft_err_prefix(st, "%s", path);
    return FTUNE_OK;
}
