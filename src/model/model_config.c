/* model_config.c — model hyperparameters: a Hugging Face config.json read
 * into an ft_config, with every present key checked for type and range, and
 * the checks every format's config passes. Kept apart from the weight
 * loaders so that the parser can be fuzzed on its own (fuzz/fuzz_config.c). */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ftune_status ft_config_validate(const ft_config *c, const char *path) {
#define POS(f, name) if (c->f <= 0 || c->f > (1 << 24)) return ft_err(FTUNE_ERR_FORMAT, "%s: %s = %d is not a valid size", path, name, c->f)
    POS(C, "hidden size");
    POS(F, "intermediate size");
    POS(L, "number of layers");
    POS(NH, "number of attention heads");
    POS(NKV, "number of key/value heads");
    POS(HS, "head size");
    POS(V, "vocabulary size");
    POS(max_T, "context length");
#undef POS
    if (c->NH % c->NKV)
        return ft_err(FTUNE_ERR_FORMAT, "%s: %d attention heads is not a multiple of %d key/value heads", path, c->NH,
                      c->NKV);
    if (c->HS % 2) return ft_err(FTUNE_ERR_FORMAT, "%s: head size %d must be even for RoPE", path, c->HS);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return ft_err(FTUNE_ERR_FORMAT, "%s: norm epsilon %g must be finite and positive", path, c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return ft_err(FTUNE_ERR_FORMAT, "%s: rope theta %g must be finite and positive", path, c->rope_theta);
    return FTUNE_OK;
}

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
static FTUNE_MUST_USE ftune_status opt_int(const cJSON *o, const char *k, int lo, int hi, bool null_ok, int *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || (null_ok && cJSON_IsNull(v))) return FTUNE_OK;
    int x;
    if (!json_int(o, k, &x) || x < lo || x > hi)
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be an integer in [%d, %d]", path, k, lo, hi);
    *out = x;
    return FTUNE_OK;
}
/* A number that is finite and > 0 as a float (1e-50 would round to 0, 1e300 to inf). */
static FTUNE_MUST_USE ftune_status opt_pos(const cJSON *o, const char *k, float *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) return FTUNE_OK;
    float x = cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
    if (!cJSON_IsNumber(v) || !isfinite(x) || !(x > 0))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be a finite positive number", path, k);
    *out = x;
    return FTUNE_OK;
}
static FTUNE_MUST_USE ftune_status opt_bool(const cJSON *o, const char *k, bool *out, const char *path) {
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
/* bos_token_id / eos_token_id: absent or null is none (-1); else an id in
 * [0, V) or a non-empty list of them (the first is kept). */
static FTUNE_MUST_USE ftune_status token_id(const cJSON *o, const char *k, int V, int32_t *out, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k), *e;
    *out = -1;
    if (!v || cJSON_IsNull(v)) return FTUNE_OK;
    bool ok = cJSON_IsNumber(v) || (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0);
    const cJSON *first = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0) : v;
    if (cJSON_IsArray(v)) cJSON_ArrayForEach(e, v) ok = ok && cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < V &&
                                                       e->valuedouble == floor(e->valuedouble);
    else ok = ok && v->valuedouble >= 0 && v->valuedouble < V && v->valuedouble == floor(v->valuedouble);
    if (!ok) return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" must be a token id in [0, %d) or a list of them", path, k, V);
    *out = (int32_t)first->valuedouble;
    return FTUNE_OK;
}

/* Qwen2: whether any layer uses the sliding window. transformers' rule
 * (Qwen2Config.layer_types): use_sliding_window (already in *sliding) and
 * a layer at or above max_window_layers; an explicit "layer_types" list, as
 * transformers 5 writes it, names the sliding layers instead. */
static FTUNE_MUST_USE ftune_status qwen2_sliding(const cJSON *j, int L, int window_from, bool *sliding,
                                                 const char *path) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types"), *e;
    if (!lt || cJSON_IsNull(lt)) {
        *sliding = *sliding && window_from < L;
        return FTUNE_OK;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != L)
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"layer_types\" must be a list of %d strings (one per layer)", path, L);
    bool any = false;
    cJSON_ArrayForEach(e, lt) {
        if (cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0) any = true;
        else if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0)
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: \"layer_types\" entry %s%s%s is not supported "
                          "(full_attention, sliding_attention)", path, cJSON_IsString(e) ? "\"" : "",
                          cJSON_IsString(e) ? e->valuestring : "(not a string)", cJSON_IsString(e) ? "\"" : "");
    }
    /* sliding_window is None unless use_sliding_window, whatever layer_types says */
    *sliding = *sliding && any;
    return FTUNE_OK;
}

/* One RoPE scaling object: transformers 4's "rope_scaling" or transformers
 * 5's "rope_parameters" (key names which, in errors), its type in
 * "rope_type" (or the older "type"). Types ftune does not compute (yarn,
 * dynamic, longrope, ...) are refused, never run as plain RoPE. */
static FTUNE_MUST_USE ftune_status rope_object(const cJSON *o, const char *key, ft_rope_scaling *sc, const char *path) {
    memset(sc, 0, sizeof *sc);
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    if (!cJSON_IsString(ty))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" has no \"rope_type\" string", path, key);
    const char *tname = ty->valuestring;
    if (strcmp(tname, "llama3") == 0) {
        sc->type = 2;
        if (!json_num(o, "factor", &sc->factor) || !json_num(o, "low_freq_factor", &sc->low_freq_factor) ||
            !json_num(o, "high_freq_factor", &sc->high_freq_factor) ||
            !json_int(o, "original_max_position_embeddings", &sc->original_max_pos) || !(sc->factor > 0) ||
            !(sc->low_freq_factor > 0) || !(sc->high_freq_factor > sc->low_freq_factor) || sc->original_max_pos < 1)
            return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" llama3 needs factor > 0, 0 < low_freq_factor < "
                          "high_freq_factor and original_max_position_embeddings >= 1", path, key);
    } else if (strcmp(tname, "linear") == 0) {
        sc->type = 1;
        if (!json_num(o, "factor", &sc->factor) || !(sc->factor > 0))
            return ft_err(FTUNE_ERR_FORMAT, "%s: \"%s\" linear needs a positive factor", path, key);
    } else if (strcmp(tname, "default") != 0) {
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: \"%s\" type \"%s\" is not supported (default, linear, llama3)",
                      path, key, tname);
    }
    /* transformers 5 may carry a partial rotary factor here; ftune rotates the whole head */
    float prf = 1.0f;
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "partial_rotary_factor");
    if (pr && !cJSON_IsNull(pr) && (!json_num(o, "partial_rotary_factor", &prf) || prf != 1.0f))
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: \"%s\".\"partial_rotary_factor\" other than 1 is not supported "
                      "(RoPE over part of the head)", path, key);
    return FTUNE_OK;
}

static bool same_scaling(const ft_rope_scaling *a, const ft_rope_scaling *b) {
    if (a->type != b->type) return false;
    if (a->type == 1) return a->factor == b->factor;
    if (a->type == 2)
        return a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
               a->high_freq_factor == b->high_freq_factor && a->original_max_pos == b->original_max_pos;
    return true;
}

void ft_rope_scaling_text(const ft_rope_scaling *sc, char *out, size_t cap) {
    if (sc->type == 1) snprintf(out, cap, "linear, factor %g", sc->factor);
    else if (sc->type == 2)
        snprintf(out, cap, "llama3, factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d",
                 sc->factor, sc->low_freq_factor, sc->high_freq_factor, sc->original_max_pos);
    else snprintf(out, cap, "none");
}

/* RoPE's theta and scaling, in either spelling: transformers 4's top-level
 * "rope_theta" and "rope_scaling" (null: none), or transformers 5's
 * "rope_parameters" {"rope_type", "rope_theta", "factor", ...}. A value given
 * both ways must agree: which one a reader takes differs (transformers 5
 * prefers rope_parameters, 4 reads only the old keys), so a disagreement is
 * a model that runs differently in each, an error. */
static FTUNE_MUST_USE ftune_status rope_config(const cJSON *j, ft_config *c, const char *path) {
    ftune_status st;
    bool old_theta = cJSON_GetObjectItemCaseSensitive(j, "rope_theta") != NULL;
    if ((st = opt_pos(j, "rope_theta", &c->rope_theta, path))) return st;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    bool old_scaling = rs && !cJSON_IsNull(rs);
    if (old_scaling && !cJSON_IsObject(rs))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", path);
    if (old_scaling && (st = rope_object(rs, "rope_scaling", &c->rope_scaling, path))) return st;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) return FTUNE_OK;
    if (!cJSON_IsObject(rp))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"rope_parameters\" must be an object or null", path);
    /* per layer type ({"full_attention": {...}, "sliding_attention": {...}}, Gemma 3's) */
    if (!cJSON_GetObjectItemCaseSensitive(rp, "rope_type") && !cJSON_GetObjectItemCaseSensitive(rp, "type") &&
        rp->child && cJSON_IsObject(rp->child))
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: \"rope_parameters\" per layer type (\"%.64s\", ...) is not "
                      "supported: one RoPE for every layer", path, rp->child->string ? rp->child->string : "");
    ft_rope_scaling sc;
    if ((st = rope_object(rp, "rope_parameters", &sc, path))) return st;
    float theta = c->rope_theta;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
    if (t) {
        if (!json_num(rp, "rope_theta", &theta) || !(theta > 0))
            return ft_err(FTUNE_ERR_FORMAT, "%s: \"rope_parameters\".\"rope_theta\" must be a finite positive number",
                          path);
        if (old_theta && theta != c->rope_theta)
            return ft_err(FTUNE_ERR_FORMAT, "%s: \"rope_theta\" %g and \"rope_parameters\".\"rope_theta\" %g "
                          "disagree (transformers 4 reads the one, 5 the other): keep one", path, c->rope_theta, theta);
    }
    if (old_scaling && !same_scaling(&sc, &c->rope_scaling)) {
        char a[160], b[160];
        ft_rope_scaling_text(&c->rope_scaling, a, sizeof a);
        ft_rope_scaling_text(&sc, b, sizeof b);
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"rope_scaling\" (%s) and \"rope_parameters\" (%s) disagree "
                      "(transformers 4 reads the one, 5 the other): keep one", path, a, b);
    }
    c->rope_theta = theta;
    c->rope_scaling = sc;
    return FTUNE_OK;
}

/* The weights' dtype as the config records it: "torch_dtype"
 * (transformers 4) or "dtype" (5). ftune takes each tensor's dtype from the
 * safetensors header, so the value is not used, but the two must not
 * disagree: transformers 5 loads a model in "dtype" when both are there. */
static FTUNE_MUST_USE ftune_status torch_dtype(const cJSON *j, const char *path) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "torch_dtype"), *b = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (a && !cJSON_IsNull(a) && !cJSON_IsString(a))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"torch_dtype\" must be a string", path);
    if (b && !cJSON_IsNull(b) && !cJSON_IsString(b))
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"dtype\" must be a string", path);
    if (cJSON_IsString(a) && cJSON_IsString(b) && strcmp(a->valuestring, b->valuestring) != 0)
        return ft_err(FTUNE_ERR_FORMAT, "%s: \"torch_dtype\" \"%.32s\" and \"dtype\" \"%.32s\" disagree "
                      "(transformers 4 reads the one, 5 the other): keep one", path, a->valuestring, b->valuestring);
    return FTUNE_OK;
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
    size_t n;
    ftune_status st = ft_read_file(path, &text, &n);
    if (st) return st;
    st = ft_config_from_hf_text(c, text, n, path);
    free(text);
    return st;
}

ftune_status ft_config_from_hf_text(ft_config *c, const char *text, size_t len, const char *path) {
    memset(c, 0, sizeof *c);
    ftune_status st;
    cJSON *j = cJSON_ParseWithLength(text, len);
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
    bool qwen2 = strcmp(arch, "qwen2") == 0;
    /* Qwen2Config: use_sliding_window defaults to false, sliding_window to
     * 4096 (null: none) and max_window_layers to 28; Mistral applies its
     * sliding_window whenever it is set */
    bool tied = false, bias = false, sliding = !qwen2;
    int window = qwen2 && !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "sliding_window")) ? 4096 : 0;
    int window_from = 28;
    const int big = 1 << 24;
    if ((st = opt_int(j, "num_key_value_heads", 1, big, false, &c->NKV, path)) ||
        (st = opt_int(j, "head_dim", 1, big, true, &c->HS, path)) ||
        (st = opt_int(j, "max_position_embeddings", 1, big, false, &c->max_T, path)) ||
        (st = opt_pos(j, "rms_norm_eps", &c->norm_eps, path)) ||
        (st = opt_bool(j, "tie_word_embeddings", &tied, path)) ||
        (st = opt_bool(j, "attention_bias", &bias, path)) ||
        (st = opt_bool(j, "use_sliding_window", &sliding, path)) ||
        (st = opt_int(j, "sliding_window", 1, INT32_MAX, true, &window, path)) ||
        (qwen2 && (st = opt_int(j, "max_window_layers", 0, big, false, &window_from, path))) ||
        (qwen2 && (st = qwen2_sliding(j, c->L, window_from, &sliding, path)))) {
        cJSON_Delete(j);
        return st;
    }
    /* Sliding-window attention is not implemented: within the window it
     * equals full attention, so the context is capped there when any layer
     * slides (per layer windows are not modelled) */
    if (sliding && window > 0 && window < c->max_T) c->max_T = window;
    c->tied = tied;
    c->qkv_bias = qwen2 ? 1 : bias;
    if ((st = token_id(j, "bos_token_id", c->V > 0 ? c->V : 0, &c->bos_id, path)) ||
        (st = token_id(j, "eos_token_id", c->V > 0 ? c->V : 0, &c->eos_id, path))) {
        cJSON_Delete(j);
        return st;
    }
    c->rope_interleaved = false;
    if ((st = rope_config(j, c, path)) || (st = torch_dtype(j, path))) {
        cJSON_Delete(j);
        return st;
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

