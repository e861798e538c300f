/* init.c — `ftune init`: a model with random weights in Hugging Face layout
 * (config.json + model.safetensors), from a preset shape or a config.json.
 * Weights are generated tensor by tensor and streamed to the file, so even
 * a 7B model never needs its size in memory. */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    const char *model_type;
    int C, F, L, NH, NKV, V, max_T;
    float theta, eps;
    bool tied, bias;
    int llama3_scaling; /* rope_scaling llama3 with this factor (0: none) */
} preset;

static const preset presets[] = {
    { "stories260K", "llama", 64, 172, 5, 8, 4, 512, 512, 10000, 1e-5f, true, false, 0 },
    { "llama-110m", "llama", 768, 2048, 12, 12, 12, 32000, 1024, 10000, 1e-5f, true, false, 0 },
    { "smollm2-360m", "llama", 960, 2560, 32, 15, 5, 49152, 8192, 100000, 1e-5f, true, false, 0 },
    { "llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 128256, 131072, 500000, 1e-5f, true, false, 32 },
    { "llama-2-7b", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, 10000, 1e-5f, false, false, 0 },
    { "qwen2-0.5b", "qwen2", 896, 4864, 24, 14, 2, 151936, 32768, 1000000, 1e-6f, true, true, 0 },
};
#define N_PRESETS (int)(sizeof presets / sizeof presets[0])

const char *const *ftune_init_presets(void) {
    static const char *names[N_PRESETS + 1];
    for (int i = 0; i < N_PRESETS; i++) names[i] = presets[i].name;
    return names;
}

static cJSON *preset_config(const preset *p, ft_dtype dtype) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(strcmp(p->model_type, "qwen2") ? "LlamaForCausalLM" : "Qwen2ForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", p->model_type);
    cJSON_AddNumberToObject(j, "hidden_size", p->C);
    cJSON_AddNumberToObject(j, "intermediate_size", p->F);
    cJSON_AddNumberToObject(j, "num_hidden_layers", p->L);
    cJSON_AddNumberToObject(j, "num_attention_heads", p->NH);
    cJSON_AddNumberToObject(j, "num_key_value_heads", p->NKV);
    cJSON_AddNumberToObject(j, "vocab_size", p->V);
    cJSON_AddNumberToObject(j, "max_position_embeddings", p->max_T);
    cJSON_AddNumberToObject(j, "rms_norm_eps", p->eps);
    cJSON_AddNumberToObject(j, "rope_theta", p->theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", p->tied);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (strcmp(p->model_type, "qwen2")) cJSON_AddBoolToObject(j, "attention_bias", p->bias);
    cJSON_AddStringToObject(j, "torch_dtype", ft_types[dtype].torch_name);
    if (p->llama3_scaling) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", p->llama3_scaling);
        cJSON_AddNumberToObject(rs, "low_freq_factor", 1);
        cJSON_AddNumberToObject(rs, "high_freq_factor", 4);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    } else cJSON_AddNullToObject(j, "rope_scaling");
    return j;
}

/* FNV-1a of the name mixed with the seed: each tensor its own stream. */
static uint64_t tensor_seed(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return h;
}

typedef struct {
    char name[FT_NAME_MAX];
    int64_t rows, cols; /* cols == 0: a vector of `rows` */
    int kind;           /* 0 normal(0, 0.02), 1 ones (norm weights), 2 zeros (biases) */
} init_tensor;

static int build_list(init_tensor *ts, const ft_config *c) {
    int n = 0;
#define ADD(nm, r, cc, k) do { snprintf(ts[n].name, FT_NAME_MAX, "%s", nm); ts[n].rows = r; ts[n].cols = cc; ts[n].kind = k; n++; } while (0)
    char name[FT_NAME_MAX];
    ADD("model.embed_tokens.weight", c->V, c->C, 0);
    if (!c->tied) ADD("lm_head.weight", c->V, c->C, 0);
    ADD("model.norm.weight", c->C, 0, 1);
    int qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    for (int l = 0; l < c->L; l++) {
        struct { const char *s; int r, cc; } lin[] = {
            { "self_attn.q_proj", qd, c->C }, { "self_attn.k_proj", kvd, c->C }, { "self_attn.v_proj", kvd, c->C },
            { "self_attn.o_proj", c->C, qd }, { "mlp.gate_proj", c->F, c->C }, { "mlp.up_proj", c->F, c->C },
            { "mlp.down_proj", c->C, c->F },
        };
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, lin[k].s);
            ADD(name, lin[k].r, lin[k].cc, 0);
            if (c->qkv_bias && k < 3) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", l, lin[k].s);
                ADD(name, lin[k].r, 0, 2);
            }
        }
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        ADD(name, c->C, 0, 1);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(name, c->C, 0, 1);
    }
#undef ADD
    return n;
}

/* Generator state: each tensor has its own stream, seeded from its name, so
 * the weights do not depend on the order the writer asks for tensors in;
 * the chunks of one tensor are asked for in order. */
typedef struct {
    const init_tensor *ts;
    uint64_t seed;
    int cur;
    ft_rng rng;
    float buf[4096];
} gen_state;

static ftune_status init_fill(void *ctx, int i, ft_dtype dt, void *dst, uint64_t off, size_t nbytes) {
    gen_state *g = ctx;
    const init_tensor *t = &g->ts[i];
    if (i != g->cur || off == 0) {
        ft_rng_seed(&g->rng, tensor_seed(g->seed, t->name));
        g->cur = i;
    }
    size_t esz = ft_types[dt].block_bytes, n = nbytes / esz;
    uint8_t *out = dst;
    for (size_t k = 0; k < n; k += 4096) {
        size_t m = n - k < 4096 ? n - k : 4096;
        for (size_t j = 0; j < m; j++)
            g->buf[j] = t->kind == 0 ? 0.02f * ft_rng_normal(&g->rng) : t->kind == 1 ? 1.0f : 0.0f;
        ft_types[dt].from_f32(g->buf, out + k * esz, (int64_t)m);
    }
    return FTUNE_OK;
}

static const preset *find_preset(const char *name) {
    for (int i = 0; i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    char names[256] = "";
    for (int i = 0; i < N_PRESETS; i++) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", presets[i].name);
    ft_err(FTUNE_ERR_ARG, "unknown preset \"%s\" (presets: %s)", name, names);
    return NULL;
}

ftune_status ft_preset_config(ft_config *cfg, const char *name) {
    const preset *p = find_preset(name);
    if (!p) return FTUNE_ERR_ARG;
    cJSON *j = preset_config(p, FT_F32);
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    char what[96];
    snprintf(what, sizeof what, "preset %s", name);
    ftune_status st = ft_config_from_hf_text(cfg, text, strlen(text), what);
    free(text);
    return st;
}

ftune_status ftune_init_model(const char *out_dir, const char *preset_name, const char *config_json,
                              const char *dtype_name, uint64_t seed, int overwrite) {
    ft_dtype dt;
    ftune_status st0 = ft_compute_parse(dtype_name, "dtype", &dt);
    if (st0) return st0;
    if (!preset_name == !config_json) return ft_err(FTUNE_ERR_ARG, "give exactly one of a preset or a config.json");
    cJSON *cfg_json = NULL;
    ftune_status st;
    char path[4096];
    if (preset_name) {
        const preset *p = find_preset(preset_name);
        if (!p) return FTUNE_ERR_ARG;
        cfg_json = preset_config(p, dt); /* f32, bf16 or f16: ft_compute_parse took no other */
    } else {
        char *text;
        if ((st = ft_read_file(config_json, &text, NULL))) return st;
        cfg_json = cJSON_Parse(text);
        free(text);
        if (!cJSON_IsObject(cfg_json)) { cJSON_Delete(cfg_json); return ft_err(FTUNE_ERR_FORMAT, "%s: not a JSON object", config_json); }
    }
    /* everything is checked before anything is written: the config (a
     * user's too), then the output directory */
    ft_config c;
    char *text = cJSON_Print(cfg_json);
    if (!text) { cJSON_Delete(cfg_json); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    st = ft_config_from_hf_text(&c, text, strlen(text), config_json ? config_json : preset_name);
    free(text);
    if (st) { cJSON_Delete(cfg_json); return st; }
    if (ft_file_exists(out_dir) && !ft_is_dir(out_dir)) {
        cJSON_Delete(cfg_json);
        return ft_err(FTUNE_ERR_IO, "%s: exists and is not a directory", out_dir);
    }
    int n_there = ft_is_dir(out_dir) ? ft_dir_entries(out_dir) : 0;
    if (n_there < 0) { cJSON_Delete(cfg_json); return ft_err(FTUNE_ERR_IO, "%s: cannot read: %s", out_dir, strerror(errno)); }
    if (n_there > 0 && !overwrite) {
        cJSON_Delete(cfg_json);
        return ft_err(FTUNE_ERR_ARG, "%s is not empty (%d entries: a model?): init would replace its config.json and "
                      "model.safetensors; give --overwrite to replace them, or another directory", out_dir, n_there);
    }
    /* written into a staging sibling that becomes out_dir whole, or not at all */
    char staged[4200];
    if ((st = ft_dir_stage(out_dir, staged, sizeof staged))) { cJSON_Delete(cfg_json); return st; }
    snprintf(path, sizeof path, "%s/config.json", staged);
    st = ft_write_json_atomic(path, cfg_json);
    cJSON_Delete(cfg_json);
    if (st) { ft_dir_abort(staged); return st; }

    int max_n = 3 + c.L * 12;
    init_tensor *ts = calloc((size_t)max_n, sizeof *ts);
    st_out_tensor *outs = calloc((size_t)max_n, sizeof *outs);
    if (!ts || !outs) { free(ts); free(outs); ft_dir_abort(staged); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    int n = build_list(ts, &c);
    for (int i = 0; i < n; i++) {
        outs[i].name = ts[i].name;
        outs[i].dtype = dt;
        outs[i].ndim = ts[i].cols ? 2 : 1;
        outs[i].shape[0] = ts[i].rows;
        outs[i].shape[1] = ts[i].cols;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", staged);
    gen_state *g = calloc(1, sizeof *g);
    if (!g) { free(ts); free(outs); ft_dir_abort(staged); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    g->ts = ts;
    g->seed = seed;
    g->cur = -1;
    for (int i = 0; i < n; i++) { outs[i].fill = init_fill; outs[i].fill_ctx = g; outs[i].fill_index = i; }
    st = ft_st_write(path, outs, n, NULL);
    free(g);
    free(ts);
    free(outs);
    if (!st) st = ft_dir_commit(staged, out_dir);
    if (st) ft_dir_abort(staged);
    return st;
}
