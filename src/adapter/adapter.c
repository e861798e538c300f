/* adapter.c — adapter objects and files: attach fresh adapters, read and
 * write PEFT directories and llama.cpp GGUF adapters. Tensor names, shapes
 * and which rows RoPE permutes come from the kind's table
 * (nn/adapter_kind.h). Every tensor read from a file is checked against
 * the model before its data is used. */
#include "adapter/adapter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PEFT_PREFIX "base_model.model."
#define MOD_LIST "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"

ftune_status ft_permute_rope_rows(float *w, int rows, int cols, int n_heads, bool to_interleaved) {
    if (n_heads <= 0 || rows % n_heads || (rows / n_heads) % 2)
        return ft_err(FTUNE_ERR_ARG, "cannot permute %d rows in %d heads of even size", rows, n_heads);
    int HS = rows / n_heads, half = HS / 2;
    size_t head = (size_t)HS * cols;
    float *tmp = ft_malloc(head * sizeof(float));
    if (!tmp) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int h = 0; h < n_heads; h++) {
        float *W = w + (size_t)h * head;
        memcpy(tmp, W, head * sizeof(float));
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < half; i++) {
                size_t rh = (size_t)s * half + i, ri = (size_t)2 * i + s; /* rotate-half row, interleaved row */
                size_t dst = to_interleaved ? ri : rh, src = to_interleaved ? rh : ri;
                memcpy(W + dst * cols, tmp + src * cols, (size_t)cols * sizeof(float));
            }
    }
    free(tmp);
    return FTUNE_OK;
}

/* ------------------------------------------------------------- objects */

/* Where the base came from, for base_model_name_or_path. */
static void set_base_model(ft_adapter *a) {
    const ftune_model *m = a->m;
    if (m->n_shards > 0 && m->shards[0].map.path) {
        snprintf(a->base_model, sizeof a->base_model, "%s", m->shards[0].map.path);
        char *slash = strrchr(a->base_model, '/');
        if (slash) *slash = 0;
    } else if (m->gguf && m->gguf->map.path) snprintf(a->base_model, sizeof a->base_model, "%s", m->gguf->map.path);
    else if (m->bin.path) snprintf(a->base_model, sizeof a->base_model, "%s", m->bin.path);
}

/* Floats of parameter i of kind k on Linear lin with hyper-parameters hp. */
static size_t param_numel(const ft_adapter_kind *k, const ft_adapter_hparams *hp, int i, const ft_linear *lin) {
    int64_t sh[2];
    k->param_shape(sh, hp, i, lin->in, lin->out);
    return (size_t)sh[0] * (size_t)sh[1];
}

/* "lora_A/lora_B" (PEFT) or "lora_a/lora_b" (GGUF): the kind's tensor
 * names for messages, up to the first '.'. */
static void kind_names(char *buf, size_t cap, const ft_adapter_kind *k, bool gguf) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < k->n_params && n < cap; i++) {
        const char *nm = gguf ? k->defs[i].gguf : k->defs[i].peft;
        n += (size_t)snprintf(buf + n, cap - n, "%s%.*s", i ? "/" : "", (int)strcspn(nm, "."), nm);
    }
}

/* An empty adapter object for m with room for n entries (and, owned, n
 * instance structs) and its adapter set, all counted as FT_MEM_OTHER;
 * NULL when out of memory. */
static ft_adapter *adapter_new(ftune_model *m, int n, bool owned) {
    ft_adapter *a = ft_mem_calloc(FT_MEM_OTHER, sizeof *a);
    if (!a) return NULL;
    a->m = m;
    a->cap = n;
    a->e = ft_mem_calloc(FT_MEM_OTHER, (size_t)n * sizeof *a->e);
    a->set = ft_mem_calloc(FT_MEM_OTHER, (size_t)m->cfg.L * FT_N_MODS * sizeof *a->set);
    if (owned) a->loras = ft_mem_calloc(FT_MEM_OTHER, (size_t)n * sizeof *a->loras);
    if (!a->e || !a->set || (owned && !a->loras)) {
        ft_adapter_free(a);
        return NULL;
    }
    set_base_model(a);
    return a;
}

/* The instances ft_adapter allocates itself are LoRA's (ft_lora structs). */
#define OWNED_KIND (&ft_lora_kind)

/* PEFT's peft_type of kind k: its name in upper case ("LORA"). */
static void peft_type_of(const ft_adapter_kind *k, char *buf, size_t cap) {
    size_t i = 0;
    for (; k->name[i] && i + 1 < cap; i++) buf[i] = (char)toupper((unsigned char)k->name[i]);
    buf[i] = 0;
}

/* Allocates an adapter with owned instances for the (layer, module) pairs
 * where sel[l * FT_N_MODS + mod] is set, memory for their parameters (and
 * grads), without initialising the values. */
static FTUNE_MUST_USE ftune_status alloc_owned(ft_adapter **out, ftune_model *m, const ft_adapter_hparams *cfg, const bool *sel,
                                bool trainable) {
    *out = NULL;
    const ft_config *c = &m->cfg;
    const ft_adapter_kind *kind = OWNED_KIND;
    if (cfg->r <= 0 || cfg->r > 65536) return ft_err(FTUNE_ERR_ARG, "LoRA rank r = %d is not in 1..65536", cfg->r);
    if (!(cfg->dropout >= 0 && cfg->dropout < 1)) return ft_err(FTUNE_ERR_ARG, "LoRA dropout %g is not in [0, 1)", cfg->dropout);
    if (!isfinite(cfg->alpha)) return ft_err(FTUNE_ERR_ARG, "LoRA alpha is not finite");
    int n = 0;
    size_t floats = 0;
    for (int l = 0; l < c->L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            if (!sel[l * FT_N_MODS + k]) continue;
            n++;
            for (int i = 0; i < kind->n_params; i++)
                floats += param_numel(kind, cfg, i, ft_model_linear(m, l, k)) * (trainable ? 2 : 1);
        }
    ft_adapter *a = adapter_new(m, n, true);
    if (a) {
        a->trainable = trainable;
        a->n_values = trainable ? floats / 2 : floats;
        a->mem = ft_mem_calloc(trainable ? FT_MEM_TRAINABLE : FT_MEM_WEIGHTS, a->n_values * sizeof(float));
        if (trainable) a->grads = ft_mem_calloc(FT_MEM_GRADS, a->n_values * sizeof(float));
    }
    if (!a || !a->mem || (trainable && !a->grads)) {
        ft_adapter_free(a);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory for %d adapters (%.1f MiB)", n, floats * 4.0 / 1048576.0);
    }
    a->kind = kind;
    a->cfg = *cfg;
    float *p = a->mem, *g = a->grads;
    for (int l = 0; l < c->L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            if (!sel[l * FT_N_MODS + k]) continue;
            ft_adapter_entry *e = &a->e[a->n];
            ft_lora *lo = &a->loras[a->n];
            e->layer = l;
            e->mod = k;
            e->lin = ft_model_linear(m, l, k);
            e->lora = lo;
            a->set[l * FT_N_MODS + k] = &lo->base;
            ft_lora_bind(lo, &a->cfg);
            for (int i = 0; i < kind->n_params; i++) {
                size_t ni = param_numel(kind, &a->cfg, i, e->lin);
                kind->bind(&lo->base, i, p, g);
                p += ni;
                if (g) g += ni;
            }
            a->n++;
        }
    *out = a;
    return FTUNE_OK;
}

ftune_status ft_adapter_attach(ft_adapter **out, ftune_model *m, const ft_adapter_hparams *cfg, bool trainable) {
    *out = NULL;
    if (!cfg->targets || (cfg->targets & ~FT_MOD_ALL)) return ft_err(FTUNE_ERR_ARG, "LoRA target mask 0x%x is empty or invalid", cfg->targets);
    int L = m->cfg.L;
    bool *sel = ft_calloc((size_t)L * FT_N_MODS, sizeof *sel);
    if (!sel) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (int l = 0; l < L; l++)
        for (int k = 0; k < FT_N_MODS; k++) sel[l * FT_N_MODS + k] = (cfg->targets & FT_MOD_BIT(k)) != 0;
    ft_adapter *a;
    ftune_status st = alloc_owned(&a, m, cfg, sel, trainable);
    free(sel);
    if (st) return st;
    /* PEFT's init, entry after entry from one generator */
    ft_rng rng;
    ft_rng_seed(&rng, cfg->seed);
    for (int i = 0; i < a->n; i++) a->kind->init(&a->e[i].lora->base, a->e[i].lin->in, a->e[i].lin->out, &rng);
    *out = a;
    return FTUNE_OK;
}

static bool same_hparams(const ft_adapter_hparams *x, const ft_adapter_hparams *y) {
    return x->r == y->r && x->alpha == y->alpha && x->rslora == y->rslora && x->dropout == y->dropout;
}

ftune_status ft_adapter_wrap(ft_adapter **out, ftune_model *m, ft_lora *const *loras) {
    *out = NULL;
    const ft_config *c = &m->cfg;
    int n = 0;
    const ft_lora *first = NULL;
    for (int i = 0; i < c->L * FT_N_MODS; i++) {
        const ft_lora *lo = loras[i];
        if (!lo) continue;
        if (!first) first = lo;
        if (lo->base.kind != first->base.kind || !lo->base.hp || !same_hparams(lo->base.hp, first->base.hp))
            return ft_err(FTUNE_ERR_ARG, "layer %d %s: kind or r/alpha/rslora/dropout differ from the other adapters",
                          i / FT_N_MODS, ft_modules[i % FT_N_MODS].peft);
        if (!lo->A || !lo->B) return ft_err(FTUNE_ERR_ARG, "layer %d %s: adapter without A or B", i / FT_N_MODS,
                                            ft_modules[i % FT_N_MODS].peft);
        n++;
    }
    if (!n) return ft_err(FTUNE_ERR_ARG, "no adapters to wrap");
    ft_adapter *a = adapter_new(m, n, false);
    if (!a) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    a->kind = first->base.kind;
    a->cfg = *first->base.hp;
    a->cfg.targets = 0; /* the modules wrapped, below */
    for (int i = 0; i < c->L * FT_N_MODS; i++) {
        if (!loras[i]) continue;
        ft_adapter_entry *e = &a->e[a->n++];
        e->layer = i / FT_N_MODS;
        e->mod = (i % FT_N_MODS);
        e->lin = ft_model_linear(m, e->layer, e->mod);
        e->lora = loras[i];
        a->set[i] = &loras[i]->base;
        a->cfg.targets |= FT_MOD_BIT(e->mod);
    }
    *out = a;
    return FTUNE_OK;
}

void ft_adapter_free(ft_adapter *a) {
    if (!a) return;
    ft_mem_free(FT_MEM_OTHER, a->set, (size_t)a->m->cfg.L * FT_N_MODS * sizeof *a->set);
    ft_mem_free(FT_MEM_OTHER, a->e, (size_t)a->cap * sizeof *a->e);
    ft_mem_free(FT_MEM_OTHER, a->loras, (size_t)a->cap * sizeof *a->loras);
    ft_mem_free(a->trainable ? FT_MEM_TRAINABLE : FT_MEM_WEIGHTS, a->mem, a->n_values * sizeof(float));
    ft_mem_free(FT_MEM_GRADS, a->grads, a->n_values * sizeof(float));
    ft_mem_free(FT_MEM_OTHER, a, sizeof *a);
}

int ft_adapter_n_params(const ft_adapter *a) { return a->n * a->kind->n_params; }

/* The PEFT key of an entry's parameter: "base_model.model.model.layers.{l}.<path>.<the kind's name>". */
static void peft_key(char *buf, size_t cap, const ft_adapter_entry *e, const ft_adapter_param_def *d) {
    snprintf(buf, cap, PEFT_PREFIX "model.layers.%d.%s.%s", e->layer, ft_modules[e->mod].path, d->peft);
}

ftune_status ft_adapter_params(const ft_adapter *a, ft_param *out) {
    int j = 0;
    for (int i = 0; i < a->n; i++) {
        const ft_adapter_entry *e = &a->e[i];
        const ft_adapter_inst *ad = &e->lora->base;
        for (int k = 0; k < ad->kind->n_params; k++) {
            ft_adapter_param ap;
            ad->kind->param(&ap, ad, k, e->lin->in, e->lin->out);
            if (!ap.grad)
                return ft_err(FTUNE_ERR_ARG, "layer %d %s: the adapter has no gradients (attach it as trainable)",
                              e->layer, ft_modules[e->mod].peft);
            ft_param *p = &out[j++];
            memset(p, 0, sizeof *p);
            peft_key(p->name, sizeof p->name, e, ap.def);
            p->data = ap.data;
            p->grad = ap.grad;
            p->ndim = 2;
            p->shape[0] = ap.shape[0];
            p->shape[1] = ap.shape[1];
            p->numel = p->shape[0] * p->shape[1];
            p->decay = true;
        }
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------- PEFT config */

/* A field that is absent, null, false, or an empty string/list/object. */
static bool json_unset(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return true;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return cJSON_GetArraySize(v) == 0;
    if (cJSON_IsString(v)) return v->valuestring[0] == 0;
    return false;
}

void ft_peft_config_free(ft_peft_config *c) {
    if (!c) return;
    for (int i = 0; i < c->n_targets; i++) free(c->targets[i]);
    free(c->targets);
    free(c->target_regex);
    free(c->layers_to_transform);
    memset(c, 0, sizeof *c);
}

ftune_status ft_peft_config_read(ft_peft_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    char *text;
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return ft_err(FTUNE_ERR_FORMAT, "%s: not a JSON object", path);
    }
#define FAIL(code, ...) do { st = ft_err(code, __VA_ARGS__); goto done; } while (0)
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
    if (!cJSON_IsString(v)) FAIL(FTUNE_ERR_FORMAT, "%s: \"peft_type\" is missing or not a string", path);
    snprintf(c->peft_type, sizeof c->peft_type, "%s", v->valuestring);
    char want[16];
    peft_type_of(OWNED_KIND, want, sizeof want);
    if (strcmp(v->valuestring, want) != 0)
        FAIL(FTUNE_ERR_UNSUPPORTED, "%s: peft_type \"%s\" is not supported (%s)", path, v->valuestring, want);
    c->hp.r = 8; /* PEFT's defaults */
    c->hp.alpha = 8;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "r"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 65536)
            FAIL(FTUNE_ERR_FORMAT, "%s: \"r\" must be an integer in 1..65536", path);
        c->hp.r = (int)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha"))) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) FAIL(FTUNE_ERR_FORMAT, "%s: \"lora_alpha\" must be a number", path);
        c->hp.alpha = (float)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1))
            FAIL(FTUNE_ERR_FORMAT, "%s: \"lora_dropout\" must be a number in [0, 1)", path);
        c->hp.dropout = (float)v->valuedouble;
    }
    c->hp.rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_rslora"));
    c->fan_in_fan_out = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "fan_in_fan_out"));
    static const char *const must_be_unset[] = {
        "use_dora", "lora_bias", "rank_pattern", "alpha_pattern", "modules_to_save", "exclude_modules",
        "layer_replication", "use_qalora", "trainable_token_indices", "target_parameters", "alora_invocation_tokens",
    };
    for (size_t i = 0; i < sizeof must_be_unset / sizeof must_be_unset[0]; i++)
        if (!json_unset(cJSON_GetObjectItemCaseSensitive(j, must_be_unset[i])))
            FAIL(FTUNE_ERR_UNSUPPORTED, "%s: \"%s\" is set; ftune does not support it", path, must_be_unset[i]);
    v = cJSON_GetObjectItemCaseSensitive(j, "bias");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0))
        FAIL(FTUNE_ERR_UNSUPPORTED, "%s: \"bias\" is %s; ftune supports only \"none\"", path,
             cJSON_IsString(v) ? v->valuestring : "not a string");
    v = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
    if (cJSON_IsString(v)) {
        if (!(c->target_regex = ft_strdup(v->valuestring))) FAIL(FTUNE_ERR_NOMEM, "out of memory");
    } else if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        if (n == 0) FAIL(FTUNE_ERR_FORMAT, "%s: \"target_modules\" is an empty list", path);
        if (!(c->targets = ft_calloc((size_t)n, sizeof *c->targets))) FAIL(FTUNE_ERR_NOMEM, "out of memory");
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            if (!cJSON_IsString(e)) FAIL(FTUNE_ERR_FORMAT, "%s: \"target_modules\" has an entry that is not a string", path);
            if (!(c->targets[c->n_targets++] = ft_strdup(e->valuestring))) FAIL(FTUNE_ERR_NOMEM, "out of memory");
        }
    } else if (!v || cJSON_IsNull(v)) {
        /* PEFT's default for Llama-family models */
        if (!(c->targets = ft_calloc(2, sizeof *c->targets))) FAIL(FTUNE_ERR_NOMEM, "out of memory");
        if (!(c->targets[c->n_targets++] = ft_strdup("q_proj")) || !(c->targets[c->n_targets++] = ft_strdup("v_proj")))
            FAIL(FTUNE_ERR_NOMEM, "out of memory");
    } else FAIL(FTUNE_ERR_FORMAT, "%s: \"target_modules\" must be a list of names or a string", path);
    v = cJSON_GetObjectItemCaseSensitive(j, "layers_to_transform");
    if (cJSON_IsNumber(v) || cJSON_IsArray(v)) {
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
        if (!(c->layers_to_transform = ft_calloc((size_t)(n ? n : 1), sizeof(int)))) FAIL(FTUNE_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) {
            const cJSON *e = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, i) : v;
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble > 1e6)
                FAIL(FTUNE_ERR_FORMAT, "%s: \"layers_to_transform\" must hold layer indices", path);
            c->layers_to_transform[c->n_layers_to_transform++] = (int)e->valuedouble;
        }
    } else if (v && !cJSON_IsNull(v)) FAIL(FTUNE_ERR_FORMAT, "%s: \"layers_to_transform\" must be an index or a list", path);
    v = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
    if (cJSON_IsString(v)) snprintf(c->base_model, sizeof c->base_model, "%s", v->valuestring);
#undef FAIL
done:
    cJSON_Delete(j);
    if (st) ft_peft_config_free(c);
    return st;
}

/* ------------------------------------------------------------- PEFT tensors */

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Which of kind k's parameters PEFT key nm is (its suffix "." + the
 * parameter's name), or -1; *stem gets the key's length without it. */
static int peft_param_of(const ft_adapter_kind *k, const char *nm, size_t *stem) {
    size_t len = strlen(nm);
    for (int i = 0; i < k->n_params; i++) {
        size_t sl = strlen(k->defs[i].peft);
        if (len > sl && nm[len - sl - 1] == '.' && strcmp(nm + len - sl, k->defs[i].peft) == 0) {
            *stem = len - sl - 1;
            return i;
        }
    }
    return -1;
}

ftune_status ft_peft_scan(const st_file *f, const ft_adapter_kind *k, ft_peft_module **mods, int *n) {
    *mods = NULL;
    *n = 0;
    const char *path = f->map.path ? f->map.path : "adapter_model.safetensors";
    ft_peft_module *p = ft_calloc((size_t)(f->n ? f->n : 1), sizeof *p);
    if (!p) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = FTUNE_OK;
    char partner[sizeof p->module + 64], names[128];
    kind_names(names, sizeof names, k, false);
    for (int i = 0; i < f->n && !st; i++) {
        const st_tensor *t = &f->tensors[i];
        const char *nm = t->name;
        if (strstr(nm, "lora_magnitude_vector")) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\" is a DoRA magnitude; DoRA adapters are not supported", path, nm);
            break;
        }
        if (strstr(nm, "lora_embedding_")) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\" adapts an embedding; not supported", path, nm);
            break;
        }
        size_t len;
        int pi = peft_param_of(k, nm, &len);
        if (pi < 0) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\" is not a %s weight (a full tensor from "
                        "modules_to_save or a resized embedding?); not supported", path, nm, names);
            break;
        }
        size_t plen = strlen(PEFT_PREFIX);
        if (strncmp(nm, PEFT_PREFIX, plen) != 0 || len <= plen) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" does not start with \"" PEFT_PREFIX "\"", path, nm);
            break;
        }
        if (t->dtype != FT_F32 && t->dtype != FT_F16 && t->dtype != FT_BF16) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype %s (F32, F16, BF16)", path, nm, t->dtype_name);
            break;
        }
        if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0) {
            char s[96];
            shape_str(s, sizeof s, t->ndim, t->shape);
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape %s is not a non-empty matrix", path, nm, s);
            break;
        }
        const st_tensor *ts[FT_ADAPTER_MAX_PARAMS] = { 0 };
        ts[pi] = t;
        for (int j = 0; j < k->n_params && !st; j++) {
            if (j == pi) continue;
            snprintf(partner, sizeof partner, "%.*s.%s", (int)len, nm, k->defs[j].peft);
            if (!(ts[j] = ft_st_find(f, partner)))
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" has no partner \"%s\"", path, nm, partner);
        }
        if (st) break;
        if (pi != 0) continue; /* each module is listed once, from its first parameter */
        ft_peft_module *q = &p[*n];
        snprintf(q->module, sizeof q->module, "%.*s", (int)(len - plen), nm + plen);
        memcpy(q->t, ts, sizeof ts);
        /* every parameter's rank dimension agrees with the first one's */
        int r0 = -1;
        for (int j = 0; j < k->n_params && !st; j++) {
            int d = k->defs[j].r_dim;
            if (d < 0 || ts[j]->ndim != 2) continue;
            if (r0 < 0) { r0 = j; continue; }
            if (ts[j]->shape[d] != ts[r0]->shape[k->defs[r0].r_dim]) {
                char sa[96], sb[96], na[64], nb[64];
                shape_str(sa, sizeof sa, ts[r0]->ndim, ts[r0]->shape);
                shape_str(sb, sizeof sb, ts[j]->ndim, ts[j]->shape);
                snprintf(na, sizeof na, "%.*s", (int)strcspn(k->defs[r0].peft, "."), k->defs[r0].peft);
                snprintf(nb, sizeof nb, "%.*s", (int)strcspn(k->defs[j].peft, "."), k->defs[j].peft);
                st = ft_err(FTUNE_ERR_FORMAT, "%s: %s: %s shape %s and %s shape %s disagree on r", path, q->module,
                            na, sa, nb, sb);
            }
        }
        if (st) break;
        (*n)++;
    }
    if (st) {
        free(p);
        *n = 0;
        return st;
    }
    *mods = p;
    return FTUNE_OK;
}

/* ------------------------------------------------------------- PEFT load */

/* "model.layers.{l}.<path>" -> (l, mod); false if it is not a module of ours. */
static bool parse_module(const char *s, int L, int *l, ft_module *mod) {
    const char *pre = "model.layers.";
    if (strncmp(s, pre, strlen(pre)) != 0) return false;
    s += strlen(pre);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '.' || v < 0 || v >= L || (s[0] == '0' && end - s > 1)) return false;
    for (int k = 0; k < FT_N_MODS; k++)
        if (strcmp(end + 1, ft_modules[k].path) == 0) {
            *l = (int)v;
            *mod = k;
            return true;
        }
    return false;
}

/* Which (layer, module) the config targets, as PEFT matches them: a list
 * entry matches a module whose full name equals it or ends in "." + it; a
 * string is a regular expression that must match the whole name. */
static FTUNE_MUST_USE ftune_status select_targets(const ft_peft_config *c, const ftune_model *m, const char *cfg_path, bool *sel) {
    int L = m->cfg.L;
    char key[128];
    if (c->target_regex && strcmp(c->target_regex, "all-linear") == 0) {
        for (int i = 0; i < L * FT_N_MODS; i++) sel[i] = true;
    } else if (c->target_regex) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)c->target_regex, PCRE2_ZERO_TERMINATED,
                                       PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_UTF, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: target_modules regex \"%s\": %s at offset %zu", cfg_path,
                          c->target_regex, (const char *)msg, (size_t)off);
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
        bool any = false;
        for (int l = 0; l < L && md; l++)
            for (int k = 0; k < FT_N_MODS; k++) {
                snprintf(key, sizeof key, "model.layers.%d.%s", l, ft_modules[k].path);
                if (pcre2_match(re, (PCRE2_SPTR)key, strlen(key), 0, 0, md, NULL) >= 0) any = sel[l * FT_N_MODS + k] = true;
            }
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        if (!any)
            return ft_err(FTUNE_ERR_FORMAT, "%s: target_modules regex \"%s\" matches no Linear of this %s model (names "
                          "like model.layers.0.self_attn.q_proj)", cfg_path, c->target_regex, m->cfg.arch);
    } else {
        for (int t = 0; t < c->n_targets; t++) {
            const char *name = c->targets[t];
            size_t nl = strlen(name);
            bool any = false;
            for (int l = 0; l < L; l++)
                for (int k = 0; k < FT_N_MODS; k++) {
                    snprintf(key, sizeof key, "model.layers.%d.%s", l, ft_modules[k].path);
                    size_t kl = strlen(key);
                    if (strcmp(key, name) == 0 || (kl > nl && key[kl - nl - 1] == '.' && strcmp(key + kl - nl, name) == 0))
                        any = sel[l * FT_N_MODS + k] = true;
                }
            if (!any)
                return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: target module \"%s\" does not exist in a %s model "
                              "(its Linears: " MOD_LIST ")", cfg_path, name, m->cfg.arch);
        }
    }
    if (c->layers_to_transform) {
        for (int i = 0; i < c->n_layers_to_transform; i++)
            if (c->layers_to_transform[i] >= L)
                return ft_err(FTUNE_ERR_FORMAT, "%s: layers_to_transform names layer %d but the model has %d layers",
                              cfg_path, c->layers_to_transform[i], L);
        for (int l = 0; l < L; l++) {
            bool keep = false;
            for (int i = 0; i < c->n_layers_to_transform; i++) keep |= c->layers_to_transform[i] == l;
            if (!keep)
                for (int k = 0; k < FT_N_MODS; k++) sel[l * FT_N_MODS + k] = false;
        }
    }
    return FTUNE_OK;
}

/* The FT_MOD_BIT mask of the modules sel[l * FT_N_MODS + mod] selects in some layer. */
static unsigned targets_of(const bool *sel, int L) {
    unsigned t = 0;
    for (int i = 0; i < L * FT_N_MODS; i++)
        if (sel[i]) t |= FT_MOD_BIT(i % FT_N_MODS);
    return t;
}

/* Entry i's parameter k from a file's tensor data src of type dt (F32,
 * F16 or BF16; its shape checked against the parameter's): converted to
 * f32, checked finite (an inf or NaN would reach every output of the
 * Linear, or train from it), and when heads > 0 and its rows are the
 * Linear's outputs, permuted head by head to the model's layout
 * (to_interleaved: from rotate-half). path and the tensor's name
 * (name_len bytes) are for the message. */
static FTUNE_MUST_USE ftune_status load_param(ft_adapter *a, int i, int k, ft_dtype dt, const void *src, int heads,
                               bool to_interleaved, const char *path, const char *name, int name_len) {
    const ft_adapter_entry *e = &a->e[i];
    ft_adapter_param ap;
    a->kind->param(&ap, &e->lora->base, k, e->lin->in, e->lin->out);
    int64_t n = ap.shape[0] * ap.shape[1];
    ft_types[dt].to_f32(src, ap.data, n);
    for (int64_t j = 0; j < n; j++)
        if (!isfinite(ap.data[j]))
            return ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%.*s\": element [%lld, %lld] is %s: an adapter's values must "
                          "be finite", path, name_len, name, (long long)(j / ap.shape[1]), (long long)(j % ap.shape[1]),
                          isnan(ap.data[j]) ? "NaN" : ap.data[j] > 0 ? "inf" : "-inf");
    if (!heads || !ap.def->out_rows) return FTUNE_OK;
    return ft_permute_rope_rows(ap.data, (int)ap.shape[0], (int)ap.shape[1], heads, to_interleaved);
}

ftune_status ft_adapter_load_peft(ft_adapter **out, ftune_model *m, const char *dir, bool trainable) {
    *out = NULL;
    char cfg_path[4096], st_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    if (!ft_file_exists(cfg_path)) return ft_err(FTUNE_ERR_IO, "%s: no adapter_config.json (not a PEFT adapter directory?)", dir);
    ft_peft_config pc;
    ftune_status st = ft_peft_config_read(&pc, cfg_path);
    if (st) return st;
    const ft_config *c = &m->cfg;
    int L = c->L;
    bool *sel = ft_calloc((size_t)L * FT_N_MODS, sizeof *sel);
    bool *have = ft_calloc((size_t)L * FT_N_MODS, sizeof *have);
    const ft_peft_module **byidx = ft_calloc((size_t)L * FT_N_MODS, sizeof *byidx);
    st_file f;
    memset(&f, 0, sizeof f);
    const ft_adapter_kind *kind = OWNED_KIND;
    ft_peft_module *mods = NULL;
    int n_mods = 0;
    ft_adapter *a = NULL;
    if (!sel || !have || !byidx) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = select_targets(&pc, m, cfg_path, sel))) goto done;
    if (pc.fan_in_fan_out) {
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: fan_in_fan_out is true (GPT-2 Conv1D layout); a %s model's Linears "
                    "are (out, in)", cfg_path, c->arch);
        goto done;
    }
    if (!ft_file_exists(st_path)) {
        snprintf(st_path, sizeof st_path, "%s/adapter_model.bin", dir);
        st = ft_file_exists(st_path) ? ft_err(FTUNE_ERR_UNSUPPORTED, "%s: pickled PyTorch adapters are not read; save "
                                              "the adapter with safe_serialization (adapter_model.safetensors)", st_path)
                                     : ft_err(FTUNE_ERR_IO, "%s: no adapter_model.safetensors", dir);
        goto done;
    }
    if ((st = ft_st_open(&f, st_path))) goto done;
    if ((st = ft_peft_scan(&f, kind, &mods, &n_mods))) goto done;
    for (int i = 0; i < n_mods; i++) {
        int l;
        ft_module mod;
        if (!parse_module(mods[i].module, L, &l, &mod)) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": module \"%s\" does not exist in this %s model of %d "
                        "layers (model.layers.{i}.self_attn.{q,k,v,o}_proj, model.layers.{i}.mlp.{gate,up,down}_proj)",
                        st_path, mods[i].t[0]->name, mods[i].module, c->arch, L);
            goto done;
        }
        if (!sel[l * FT_N_MODS + mod]) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" adapts %s, which target_modules in adapter_config.json "
                        "does not select", st_path, mods[i].t[0]->name, mods[i].module);
            goto done;
        }
        have[l * FT_N_MODS + mod] = true;
        byidx[l * FT_N_MODS + mod] = &mods[i];
    }
    for (int l = 0; l < L; l++)
        for (int k = 0; k < FT_N_MODS; k++)
            if (sel[l * FT_N_MODS + k] && !have[l * FT_N_MODS + k]) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"" PEFT_PREFIX "model.layers.%d.%s.%s\" is missing "
                            "(adapter_config.json targets %s)", st_path, l, ft_modules[k].path, kind->defs[0].peft,
                            ft_modules[k].peft);
                goto done;
            }
    /* shapes against the model, before anything is allocated or copied */
    for (int l = 0; l < L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            const ft_peft_module *p = byidx[l * FT_N_MODS + k];
            if (!p) continue;
            const ft_linear *lin = ft_model_linear(m, l, k);
            for (int i = 0; i < kind->n_params; i++) {
                const st_tensor *t = p->t[i];
                int64_t want[2];
                kind->param_shape(want, &pc.hp, i, lin->in, lin->out);
                if (t->shape[0] == want[0] && t->shape[1] == want[1]) continue;
                char s[96];
                bool rows = kind->defs[i].out_rows;
                shape_str(s, sizeof s, t->ndim, t->shape);
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape %s but the model's layer %d %s has %d %s "
                            "and r=%d (expected [%lld, %lld])", st_path, t->name, s, l, ft_modules[k].peft,
                            rows ? lin->out : lin->in, rows ? "outputs" : "inputs", pc.hp.r, (long long)want[0],
                            (long long)want[1]);
                goto done;
            }
        }
    ft_adapter_hparams lc = pc.hp;
    lc.targets = targets_of(sel, L);
    if ((st = alloc_owned(&a, m, &lc, sel, trainable))) goto done;
    if (pc.base_model[0]) snprintf(a->base_model, sizeof a->base_model, "%s", pc.base_model);
    for (int i = 0; i < a->n; i++) {
        ft_adapter_entry *e = &a->e[i];
        const ft_peft_module *p = byidx[e->layer * FT_N_MODS + e->mod];
        /* PEFT files are in rotate-half order */
        int heads = c->rope_interleaved ? ft_module_rope_heads(c, e->mod) : 0;
        for (int k = 0; k < kind->n_params; k++)
            if ((st = load_param(a, i, k, p->t[k]->dtype, p->t[k]->data, heads, true, st_path, p->t[k]->name,
                                 (int)strlen(p->t[k]->name))))
                goto done;
    }
    *out = a;
    a = NULL;
done:
    if (st) st = ft_err_prefix(st, "adapter %s", dir);
    ft_adapter_free(a);
    free(mods);
    ft_st_close(&f);
    free(sel);
    free(have);
    free(byidx);
    ft_peft_config_free(&pc);
    return st;
}

/* ------------------------------------------------------------- PEFT save */

static void free_rows(float **bs, int n) {
    if (!bs) return;
    for (int i = 0; i < n; i++) free(bs[i]);
    free(bs);
}

/* Copies, in the file layout (rotate-half when want_interleaved is false,
 * interleaved otherwise), of the parameters whose rows are q/k output rows
 * (LoRA's B) for a model whose layout differs: (*out)[i·n_params + k] for
 * entry i's parameter k, NULL where it can be written as it is (*out NULL:
 * all can). */
static FTUNE_MUST_USE ftune_status permuted_rows(const ft_adapter *a, bool want_interleaved, float ***out) {
    *out = NULL;
    const ft_config *c = &a->m->cfg;
    if (c->rope_interleaved == want_interleaved) return FTUNE_OK;
    int np = a->kind->n_params, n = ft_adapter_n_params(a);
    float **bs = ft_calloc((size_t)(n ? n : 1), sizeof *bs);
    if (!bs) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    ftune_status st = FTUNE_OK;
    for (int i = 0; i < a->n && !st; i++) {
        const ft_adapter_entry *e = &a->e[i];
        int heads = ft_module_rope_heads(c, e->mod);
        for (int k = 0; heads && k < np && !st; k++) {
            ft_adapter_param ap;
            a->kind->param(&ap, &e->lora->base, k, e->lin->in, e->lin->out);
            if (!ap.def->out_rows) continue;
            size_t nb = (size_t)ap.shape[0] * ap.shape[1];
            float *b = bs[i * np + k] = ft_malloc(nb * sizeof(float));
            if (!b) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
            else {
                memcpy(b, ap.data, nb * sizeof(float));
                st = ft_permute_rope_rows(b, (int)ap.shape[0], (int)ap.shape[1], heads, want_interleaved);
            }
        }
    }
    if (st) {
        free_rows(bs, n);
        return st;
    }
    *out = bs;
    return FTUNE_OK;
}

/* target_modules for adapter_config.json: a list of names (plus
 * layers_to_transform) when every targeted module covers the same layers,
 * else a regex naming each adapted Linear. */
static cJSON *targets_json(const ft_adapter *a, cJSON *cfg) {
    int L = a->m->cfg.L;
    unsigned mods = 0;
    bool uniform = true;
    for (int i = 0; i < a->n; i++) mods |= FT_MOD_BIT(a->e[i].mod);
    /* layers covered by each module */
    for (int l = 0; l < L && uniform; l++) {
        int cnt = 0, n_mods = 0;
        for (int k = 0; k < FT_N_MODS; k++) {
            if (!(mods & FT_MOD_BIT(k))) continue;
            n_mods++;
            for (int i = 0; i < a->n; i++) cnt += a->e[i].layer == l && (int)a->e[i].mod == k;
        }
        if (cnt != 0 && cnt != n_mods) uniform = false;
    }
    if (uniform) {
        cJSON *list = cJSON_AddArrayToObject(cfg, "target_modules");
        for (int k = 0; k < FT_N_MODS; k++)
            if (mods & FT_MOD_BIT(k)) cJSON_AddItemToArray(list, cJSON_CreateString(ft_modules[k].peft));
        int n_layers = 0;
        bool *in = ft_calloc((size_t)L, sizeof *in);
        if (!in) return NULL;
        for (int i = 0; i < a->n; i++) in[a->e[i].layer] = true;
        for (int l = 0; l < L; l++) n_layers += in[l];
        if (n_layers < L) {
            cJSON *ll = cJSON_AddArrayToObject(cfg, "layers_to_transform");
            for (int l = 0; l < L; l++)
                if (in[l]) cJSON_AddItemToArray(ll, cJSON_CreateNumber(l));
        }
        free(in);
        return list;
    }
    size_t cap = (size_t)a->n * 64 + 16, k = 0;
    char *re = ft_malloc(cap);
    if (!re) return NULL;
    re[k++] = '(';
    for (int i = 0; i < a->n; i++) {
        k += (size_t)snprintf(re + k, cap - k, "%smodel\\.layers\\.%d\\.", i ? "|" : "", a->e[i].layer);
        for (const char *c = ft_modules[a->e[i].mod].path; *c; c++) {
            if (*c == '.') re[k++] = '\\';
            re[k++] = *c;
        }
    }
    snprintf(re + k, cap - k, ")");
    cJSON *s = cJSON_AddStringToObject(cfg, "target_modules", re);
    free(re);
    return s;
}

ftune_status ft_adapter_save_peft(const ft_adapter *a, const char *dir) {
    if (!a->n) return ft_err(FTUNE_ERR_ARG, "%s: the adapter is empty", dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return ft_err(FTUNE_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    if (!ft_is_dir(dir)) return ft_err(FTUNE_ERR_IO, "%s: exists and is not a directory", dir);
    char path[4096];
    float **bs = NULL;
    ftune_status st = permuted_rows(a, false, &bs);
    if (st) return st;
    int np = a->kind->n_params, n = ft_adapter_n_params(a);
    st_out_tensor *ts = ft_calloc((size_t)n, sizeof *ts);
    char *names = ft_malloc((size_t)n * 128);
    cJSON *cfg = NULL;
    if (!ts || !names) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    for (int i = 0; i < a->n; i++) {
        const ft_adapter_entry *e = &a->e[i];
        /* the kind's parameter list, in its order; rows permuted_rows put in the file's layout */
        for (int k = 0; k < np; k++) {
            ft_adapter_param ap;
            a->kind->param(&ap, &e->lora->base, k, e->lin->in, e->lin->out);
            int j = i * np + k;
            char *nm = names + (size_t)j * 128;
            peft_key(nm, 128, e, ap.def);
            st_out_tensor *t = &ts[j];
            t->name = nm;
            t->dtype = FT_F32;
            t->ndim = 2;
            t->shape[0] = ap.shape[0];
            t->shape[1] = ap.shape[1];
            t->data = bs && bs[j] ? bs[j] : ap.data;
        }
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if ((st = ft_st_write(path, ts, n, NULL))) goto done;

    cfg = cJSON_CreateObject();
    if (!cfg) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    char peft_type[16];
    peft_type_of(a->kind, peft_type, sizeof peft_type);
    cJSON_AddStringToObject(cfg, "peft_type", peft_type);
    cJSON_AddStringToObject(cfg, "task_type", "CAUSAL_LM");
    if (a->base_model[0]) cJSON_AddStringToObject(cfg, "base_model_name_or_path", a->base_model);
    else cJSON_AddNullToObject(cfg, "base_model_name_or_path");
    cJSON_AddNumberToObject(cfg, "r", a->cfg.r);
    cJSON_AddNumberToObject(cfg, "lora_alpha", ft_float_shortest(a->cfg.alpha));
    cJSON_AddNumberToObject(cfg, "lora_dropout", ft_float_shortest(a->cfg.dropout));
    if (!targets_json(a, cfg)) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    cJSON_AddStringToObject(cfg, "bias", "none");
    cJSON_AddBoolToObject(cfg, "use_rslora", a->cfg.rslora);
    cJSON_AddBoolToObject(cfg, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(cfg, "inference_mode", 1);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    st = ft_write_json_atomic(path, cfg);
done:
    cJSON_Delete(cfg);
    free(ts);
    free(names);
    free_rows(bs, n);
    return st;
}

/* ------------------------------------------------------------- GGUF */

ftune_status ft_adapter_save_gguf(const ft_adapter *a, const char *path) {
    if (!a->n) return ft_err(FTUNE_ERR_ARG, "%s: the adapter is empty", path);
    const ft_config *c = &a->m->cfg;
    /* llama.cpp's arch names: Mistral and the other Llama variants are "llama" */
    const char *arch = strcmp(c->arch, "qwen2") == 0 ? "qwen2" : "llama";
    bool want_interleaved = strcmp(arch, "llama") == 0;
    float **bs = NULL;
    ftune_status st = want_interleaved || !c->rope_interleaved ? permuted_rows(a, want_interleaved, &bs)
                                                               : ft_err(FTUNE_ERR_UNSUPPORTED, "%s: a %s model with "
                                                                        "interleaved q/k rows", path, c->arch);
    if (st) return st;
    int np = a->kind->n_params;
    gguf_writer *w = NULL;
    if ((st = ft_gguf_writer_new(&w))) goto done;
    float alpha = a->cfg.rslora ? a->cfg.alpha * sqrtf((float)a->cfg.r) : a->cfg.alpha;
    if ((st = ft_gguf_writer_set_str(w, "general.architecture", arch)) ||
        (st = ft_gguf_writer_set_str(w, "general.type", "adapter")) ||
        (st = ft_gguf_writer_set_str(w, "adapter.type", a->kind->name)) ||
        (st = ft_gguf_writer_set_f32(w, "adapter.lora.alpha", alpha)))
        goto done;
    char name[FT_NAME_MAX];
    for (int i = 0; i < a->n && !st; i++) {
        const ft_adapter_entry *e = &a->e[i];
        for (int k = 0; k < np && !st; k++) {
            ft_adapter_param ap;
            a->kind->param(&ap, &e->lora->base, k, e->lin->in, e->lin->out);
            snprintf(name, sizeof name, "blk.%d.%s.weight.%s", e->layer, ft_modules[e->mod].gguf, ap.def->gguf);
            const float *data = bs && bs[i * np + k] ? bs[i * np + k] : ap.data;
            st = ft_gguf_writer_add_tensor(w, name, FT_F32, 2, ap.shape, data);
        }
    }
    if (!st) st = ft_gguf_writer_write(w, path);
done:
    ft_gguf_writer_free(w);
    free_rows(bs, ft_adapter_n_params(a));
    return st;
}

/* ------------------------------------------------------------- GGUF load */

/* The tensors of one adapted Linear found in a GGUF adapter: t[i] is the
 * kind's parameter i (LoRA: lora_a, lora_b). */
typedef struct { const gguf_tensor_info *t[FT_ADAPTER_MAX_PARAMS]; } gguf_pair;

static FTUNE_MUST_USE ftune_status gguf_adapter_str(const gguf_file *g, const char *key, const char *want, bool required_eq,
                                     const char *what) {
    gguf_str s;
    if (!ft_gguf_get_str(g, key, &s))
        return ft_err(FTUNE_ERR_FORMAT, "%s: no %s: not a llama.cpp LoRA adapter%s", g->map.path, key,
                      required_eq ? " (a model GGUF? pass it with -m)" : "");
    if (!ft_gguf_str_eq(s, want))
        return ft_err(required_eq ? FTUNE_ERR_FORMAT : FTUNE_ERR_UNSUPPORTED, "%s: %s is \"%.*s\"; %s", g->map.path,
                      key, (int)(s.len < 64 ? s.len : 64), s.ptr, what);
    return FTUNE_OK;
}

ftune_status ft_adapter_load_gguf(ft_adapter **out, ftune_model *m, const char *path, bool trainable) {
    *out = NULL;
    gguf_file g;
    memset(&g, 0, sizeof g);
    ftune_status st = ft_gguf_open(&g, path);
    if (st) return st;
    const ft_config *c = &m->cfg;
    const int L = c->L;
    const char *arch = strcmp(c->arch, "qwen2") == 0 ? "qwen2" : "llama"; /* as ft_adapter_save_gguf names them */
    gguf_pair *pairs = ft_calloc((size_t)L * FT_N_MODS, sizeof *pairs);
    bool *sel = ft_calloc((size_t)L * FT_N_MODS, sizeof *sel);
    ft_adapter *a = NULL;
    double alpha = 0;
    char what[128];
    if (!pairs || !sel) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = gguf_adapter_str(&g, "general.type", "adapter", true, "not a LoRA adapter (a model GGUF? pass it with -m)")) ||
        (st = gguf_adapter_str(&g, "adapter.type", OWNED_KIND->name, false, "only LoRA adapters are read")))
        goto done;
    snprintf(what, sizeof what, "the adapter is for another architecture than this %s model (%s)", c->arch, arch);
    if ((st = gguf_adapter_str(&g, "general.architecture", arch, true, what))) goto done;
    if (!ft_gguf_get_f64(&g, "adapter.lora.alpha", &alpha) || !isfinite(alpha)) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: no adapter.lora.alpha (a number): the LoRA scale alpha/r is unknown", path);
        goto done;
    }
    const ft_adapter_kind *kind = OWNED_KIND;
    char names[128];
    kind_names(names, sizeof names, kind, true);
    int r = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_info *ti = &g.tensors[i];
        char name[FT_NAME_MAX], mod[32];
        snprintf(name, sizeof name, "%.*s", (int)ti->name.len, ti->name.ptr);
        int l = -1, used = 0, k, pi = 0;
        if (sscanf(name, "blk.%d.%31[a-z_].weight.%n", &l, mod, &used) == 2 && used > 0)
            for (; pi < kind->n_params && strcmp(name + used, kind->defs[pi].gguf) != 0; pi++) {}
        if (used <= 0 || pi == kind->n_params) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\" is not a LoRA tensor of a block's Linear "
                        "(blk.{i}.<attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down>.weight.%s)",
                        path, name, names);
            goto done;
        }
        for (k = 0; k < FT_N_MODS && strcmp(mod, ft_modules[k].gguf) != 0; k++) {}
        if (k == FT_N_MODS || l < 0 || l >= L) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": this %s model has no %s in block %d (%d blocks)", path,
                        name, c->arch, mod, l, L);
            goto done;
        }
        if (ti->n_dims != 2 || (ti->dtype != FT_F32 && ti->dtype != FT_F16 && ti->dtype != FT_BF16)) {
            st = ft_err(FTUNE_ERR_UNSUPPORTED, "%s: tensor \"%s\": %u-D of ggml type %s (a 2-D f32, f16 or bf16 "
                        "matrix expected)", path, name, ti->n_dims, ft_gguf_ggml_type_name(ti->ggml_type));
            goto done;
        }
        /* PyTorch shapes (rows, cols) are ggml ne (cols, rows); the file states no r: the first tensor's
         * rank dimension gives it */
        const ft_adapter_param_def *d = &kind->defs[pi];
        const ft_linear *lin = ft_model_linear(m, l, k);
        int64_t shape[2] = { (int64_t)ti->ne[1], (int64_t)ti->ne[0] }, want[2];
        if (r == 0 && d->r_dim >= 0) r = (int)shape[d->r_dim];
        ft_adapter_hparams hr = { .r = r };
        kind->param_shape(want, &hr, pi, lin->in, lin->out);
        if (shape[0] != want[0] || shape[1] != want[1] || r <= 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": ggml shape [%llu, %llu] but the model's block %d %s has "
                        "%d %s and the adapter r=%d (expected [%llu, %llu])", path, name,
                        (unsigned long long)ti->ne[0], (unsigned long long)ti->ne[1], l, ft_modules[k].peft,
                        d->out_rows ? lin->out : lin->in, d->out_rows ? "outputs" : "inputs", r,
                        (unsigned long long)want[1], (unsigned long long)want[0]);
            goto done;
        }
        pairs[l * FT_N_MODS + k].t[pi] = ti;
    }
    int n = 0;
    for (int i = 0; i < L * FT_N_MODS; i++) {
        const gguf_pair *p = &pairs[i];
        int have = -1, miss = -1;
        for (int j = 0; j < kind->n_params; j++) {
            if (p->t[j] && have < 0) have = j;
            if (!p->t[j] && miss < 0) miss = j;
        }
        if (have < 0) continue;
        if (miss >= 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"blk.%d.%s.weight.%s\" is missing (its partner %s is there)",
                        path, i / FT_N_MODS, ft_modules[i % FT_N_MODS].gguf, kind->defs[miss].gguf,
                        kind->defs[have].gguf);
            goto done;
        }
        sel[i] = true;
        n++;
    }
    if (!n) { st = ft_err(FTUNE_ERR_FORMAT, "%s: no LoRA tensors", path); goto done; }
    ft_adapter_hparams lc = { .r = r, .alpha = (float)alpha, .targets = targets_of(sel, L) };
    if ((st = alloc_owned(&a, m, &lc, sel, trainable))) goto done;
    /* llama-arch adapters keep q/k output rows (lora_b) interleaved (as the model files do) */
    bool file_interleaved = strcmp(arch, "llama") == 0;
    for (int i = 0; i < a->n; i++) {
        ft_adapter_entry *e = &a->e[i];
        const gguf_pair *p = &pairs[e->layer * FT_N_MODS + e->mod];
        int heads = file_interleaved != c->rope_interleaved ? ft_module_rope_heads(c, e->mod) : 0;
        for (int k = 0; k < kind->n_params; k++)
            if ((st = load_param(a, i, k, p->t[k]->dtype, p->t[k]->data, heads, c->rope_interleaved, path,
                                 p->t[k]->name.ptr, (int)p->t[k]->name.len)))
                goto done;
    }
    *out = a;
    a = NULL;
done: /* every message names the file */
    ft_adapter_free(a);
    free(pairs);
    free(sel);
    ft_gguf_close(&g);
    return st;
}
