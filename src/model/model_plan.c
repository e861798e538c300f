/* model_plan.c — what loading a model will hold, from its config and the
 * safetensors headers only (no tensor data read or mapped): each weight as
 * the loader binds it, then held as stored (mapped), or as an owned copy
 * sized by ft_held_bytes, the function the loader allocates with. test_plan
 * checks that the plan equals what a load then counts. */
#include "model/model.h"
#include "formats/bnb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tensor as a header names it: found, dtype, bytes, shape. */
typedef struct {
    bool found;
    ft_dtype dtype;
    size_t nbytes;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
} hdr_tensor;

typedef FTUNE_MUST_USE ftune_status (*lookup_fn)(void *ctx, const char *name, hdr_tensor *t);

typedef struct {
    ft_weight_desc *d;
    int n, cap;
} desc_list;

static FTUNE_MUST_USE ftune_status push(desc_list *l, ft_weight_desc d) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        ft_weight_desc *n = realloc(l->d, (size_t)cap * sizeof *n);
        if (!n) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
        l->d = n;
        l->cap = cap;
    }
    l->d[l->n++] = d;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status need(lookup_fn look, void *ctx, const char *name, hdr_tensor *t, int ndim, int64_t d0, int64_t d1) {
    ftune_status st = look(ctx, name, t);
    if (st) return st;
    if (!t->found) return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\" is missing from the safetensors files", name);
    if (t->dtype >= FT_NTYPES) return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": its dtype is not supported", name);
    bool ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    /* a bitsandbytes 4-bit weight is packed: its shape is checked on load */
    if (!ok && !(ndim == 2 && t->dtype == FT_U8))
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": shape does not match the config", name);
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status add_vec(desc_list *l, lookup_fn look, void *ctx, const char *name, int64_t n) {
    hdr_tensor t;
    ftune_status st = need(look, ctx, name, &t, 1, n, 0);
    if (st) return st;
    return push(l, (ft_weight_desc){ .kind = FT_WD_VEC, .stored = t.dtype, .stored_bytes = t.nbytes, .rows = 1, .cols = n });
}

/* A layer's Linear weight: as stored, or a bitsandbytes weight (4-bit: U8
 * beside "name.absmax"; 8-bit: I8 beside "P.SCB"), as model_hf.c reads them. */
static FTUNE_MUST_USE ftune_status add_linear(desc_list *l, lookup_fn look, void *ctx, const char *name, int out, int in) {
    hdr_tensor t, part;
    ftune_status st = need(look, ctx, name, &t, 2, out, in);
    if (st) return st;
    char k[FT_NAME_MAX + 48];
    if (t.dtype == FT_U8) {
        snprintf(k, sizeof k, "%s.absmax", name);
        if ((st = look(ctx, k, &part))) return st;
        if (part.found)
            return push(l, (ft_weight_desc){ .kind = FT_WD_LINEAR, .stored = ft_bnb_held_dtype(in), .bnb = true,
                                             .rows = out, .cols = in });
    }
    if (t.dtype == FT_I8 && strlen(name) > 7) {
        snprintf(k, sizeof k, "%.*s.SCB", (int)(strlen(name) - 7), name);
        if ((st = look(ctx, k, &part))) return st;
        if (part.found)
            return push(l, (ft_weight_desc){ .kind = FT_WD_LINEAR, .stored = FT_I8ROW, .bnb = true, .rows = out, .cols = in });
    }
    if (!ft_types[t.dtype].is_float) return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": its dtype cannot be a weight", name);
    if (t.shape[0] != out || t.shape[1] != in)
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": shape does not match the config", name);
    return push(l, (ft_weight_desc){ .kind = FT_WD_LINEAR, .stored = t.dtype, .stored_bytes = t.nbytes, .rows = out, .cols = in });
}

/* The weights ft_load_hf binds, in its order. */
static FTUNE_MUST_USE ftune_status describe(ft_config *c, lookup_fn look, void *ctx, desc_list *l) {
    hdr_tensor t;
    ftune_status st = need(look, ctx, "model.embed_tokens.weight", &t, 2, c->V, c->C);
    if (st) return st;
    if ((st = push(l, (ft_weight_desc){ .kind = FT_WD_MATRIX, .stored = t.dtype, .stored_bytes = t.nbytes, .rows = c->V,
                                         .cols = c->C })))
        return st;
    if ((st = look(ctx, "lm_head.weight", &t))) return st;
    if (t.found && !c->tied) {
        if ((st = need(look, ctx, "lm_head.weight", &t, 2, c->V, c->C))) return st;
        if ((st = push(l, (ft_weight_desc){ .kind = FT_WD_MATRIX, .stored = t.dtype, .stored_bytes = t.nbytes, .rows = c->V,
                                             .cols = c->C })))
            return st;
    } else c->tied = true;
    if ((st = add_vec(l, look, ctx, "model.norm.weight", c->C))) return st;
    static const char *const sfx[FT_N_MODS] = { "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                "mlp.down_proj" };
    int q_out = c->NH * c->HS, kv_out = c->NKV * c->HS;
    int outs[FT_N_MODS] = { q_out, kv_out, kv_out, c->C, c->F, c->F, c->C };
    int ins[FT_N_MODS] = { c->C, c->C, c->C, q_out, c->C, c->C, c->F };
    char name[FT_NAME_MAX];
    for (int ly = 0; ly < c->L; ly++) {
        for (int k = 0; k < FT_N_MODS; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", ly, sfx[k]);
            if ((st = add_linear(l, look, ctx, name, outs[k], ins[k]))) return st;
            if (c->qkv_bias && k < 3) {
                snprintf(name, sizeof name, "model.layers.%d.%s.bias", ly, sfx[k]);
                if ((st = add_vec(l, look, ctx, name, outs[k]))) return st;
            }
        }
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", ly);
        if ((st = add_vec(l, look, ctx, name, c->C))) return st;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", ly);
        if ((st = add_vec(l, look, ctx, name, c->C))) return st;
    }
    return FTUNE_OK;
}

/* ------------------------------------------------ Hugging Face headers */

typedef struct {
    st_file *f;
    int n;
} shard_set;

static FTUNE_MUST_USE ftune_status shard_lookup(void *ctx, const char *name, hdr_tensor *t) {
    shard_set *s = ctx;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < s->n; i++) {
        const st_tensor *x = ft_st_find(&s->f[i], name);
        if (!x) continue;
        *t = (hdr_tensor){ .found = true, .dtype = x->dtype, .nbytes = (size_t)(x->end - x->begin), .ndim = x->ndim };
        memcpy(t->shape, x->shape, sizeof t->shape);
        return FTUNE_OK;
    }
    return FTUNE_OK;
}

ftune_status ft_weights_describe_hf(const char *dir, ft_config *cfg, ft_weight_desc **descs, int *n) {
    *descs = NULL;
    *n = 0;
    ftune_status st = ft_hf_read_config(dir, cfg);
    if (st) return st;
    shard_set s = { 0 };
    desc_list l = { 0 };
    st = ft_hf_open_shards(dir, true, &s.f, &s.n);
    if (!st) st = describe(cfg, shard_lookup, &s, &l);
    for (int i = 0; i < s.n; i++) ft_st_close(&s.f[i]);
    free(s.f);
    if (st) {
        free(l.d);
        return ft_err_prefix(st, "%s", dir);
    }
    *descs = l.d;
    *n = l.n;
    return FTUNE_OK;
}

/* ------------------------------------------------ presets */

/* Every tensor ftune init writes, in one dtype. */
typedef struct {
    const ft_config *c;
    ft_dtype dt;
} preset_ctx;

static FTUNE_MUST_USE ftune_status preset_lookup(void *ctx, const char *name, hdr_tensor *t) {
    const preset_ctx *p = ctx;
    const ft_config *c = p->c;
    memset(t, 0, sizeof *t);
    int ly, q_out = c->NH * c->HS, kv_out = c->NKV * c->HS;
    char rest[128]; /* %127s below */
    int64_t d0 = 0, d1 = 0;
    if (strcmp(name, "model.embed_tokens.weight") == 0 || (strcmp(name, "lm_head.weight") == 0 && !c->tied)) {
        d0 = c->V; d1 = c->C;
    } else if (strcmp(name, "model.norm.weight") == 0) {
        d0 = c->C;
    } else if (sscanf(name, "model.layers.%d.%127s", &ly, rest) == 2 && ly >= 0 && ly < c->L) {
        static const struct { const char *s; int which; } tab[] = {
            { "self_attn.q_proj.weight", 0 }, { "self_attn.k_proj.weight", 1 }, { "self_attn.v_proj.weight", 1 },
            { "self_attn.o_proj.weight", 2 }, { "mlp.gate_proj.weight", 3 },    { "mlp.up_proj.weight", 3 },
            { "mlp.down_proj.weight", 4 },    { "input_layernorm.weight", 5 },  { "post_attention_layernorm.weight", 5 },
            { "self_attn.q_proj.bias", 6 },   { "self_attn.k_proj.bias", 7 },   { "self_attn.v_proj.bias", 7 },
        };
        int w = -1;
        for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
            if (strcmp(rest, tab[i].s) == 0) w = tab[i].which;
        if (w >= 6 && !c->qkv_bias) w = -1;
        int64_t shapes[8][2] = { { q_out, c->C }, { kv_out, c->C }, { c->C, q_out }, { c->F, c->C },
                                 { c->C, c->F },  { c->C, 0 },      { q_out, 0 },    { kv_out, 0 } };
        if (w < 0) return FTUNE_OK;
        d0 = shapes[w][0];
        d1 = shapes[w][1];
    } else return FTUNE_OK;
    t->found = true;
    t->dtype = p->dt;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = (size_t)ft_dtype_nbytes(p->dt, d0 * (d1 ? d1 : 1));
    return FTUNE_OK;
}

ftune_status ft_weights_describe_preset(const char *preset, ft_dtype stored, ft_config *cfg, ft_weight_desc **descs,
                                        int *n) {
    *descs = NULL;
    *n = 0;
    ftune_status st = ft_preset_config(cfg, preset);
    if (st) return st;
    preset_ctx p = { cfg, stored };
    desc_list l = { 0 };
    if ((st = describe(cfg, preset_lookup, &p, &l))) { free(l.d); return st; }
    *descs = l.d;
    *n = l.n;
    return FTUNE_OK;
}

/* ------------------------------------------------ a load as stored */

ftune_status ft_weights_describe_model(const ftune_model *m, ft_weight_desc **descs, int *n) {
    *descs = NULL;
    *n = 0;
    if (m->quantized || m->compute != FT_F32)
        return ft_err(FTUNE_ERR_ARG, "a model is described for planning as stored (no --quant, f32)");
    const ft_config *c = &m->cfg;
    desc_list l = { 0 };
    ftune_status st;
    size_t mats = 0;
    ftune_model *mm = (ftune_model *)m; /* ft_layer_linear only reads here */
    const ft_tensor *e = &m->tok_embd, *h = &m->lm_head.w;
    if ((st = push(&l, (ft_weight_desc){ .kind = FT_WD_MATRIX, .stored = e->dtype, .stored_bytes = e->nbytes,
                                         .rows = c->V, .cols = c->C })))
        goto fail;
    mats += e->nbytes;
    if (!c->tied) {
        if ((st = push(&l, (ft_weight_desc){ .kind = FT_WD_MATRIX, .stored = h->dtype, .stored_bytes = h->nbytes,
                                             .rows = c->V, .cols = c->C })))
            goto fail;
        mats += h->nbytes;
    }
    for (int ly = 0; ly < c->L; ly++)
        for (int k = 0; k < FT_N_MODS; k++) {
            const ft_linear *lin = ft_layer_linear(&mm->layers[ly], (ft_module)k);
            if ((st = push(&l, (ft_weight_desc){ .kind = FT_WD_LINEAR, .stored = lin->w.dtype,
                                                 .stored_bytes = lin->w.nbytes, .rows = lin->out, .cols = lin->in })))
                goto fail;
            mats += lin->w.nbytes;
        }
    /* the rest of what the load counted is its vectors: mapped as stored, held as f32 copies */
    size_t vec = (size_t)m->weight_bytes - mats;
    if ((st = push(&l, (ft_weight_desc){ .kind = FT_WD_HELD, .stored = FT_F32, .stored_bytes = vec,
                                         .owned_bytes = m->owned_bytes, .n_owned = m->n_owned })))
        goto fail;
    *descs = l.d;
    *n = l.n;
    return FTUNE_OK;
fail:
    free(l.d);
    return st;
}

/* ------------------------------------------------ the plan */

static bool plain_float(ft_dtype dt) { return ft_types[dt].is_float && ft_types[dt].block == 1; }

static void hold(ft_weights_plan *p, bool owned, ft_dtype dt, size_t n) {
    if (owned) { p->owned[dt] += n; p->owned_total += n; p->n_owned++; }
    else { p->mapped[dt] += n; p->mapped_total += n; }
}

ftune_status ft_weights_plan_of(const ft_weight_desc *d, int n, ft_dtype quant, ft_dtype compute, ft_weights_plan *p) {
    memset(p, 0, sizeof *p);
    bool quantized = false;
    for (int i = 0; i < n; i++) quantized |= d[i].bnb;
    if (quant != FT_NTYPES && quantized)
        return ft_err(FTUNE_ERR_ARG, "the model's weights are already quantized (bitsandbytes): --quant does not apply");
    /* as ft_model_quantize refuses a block-quantized GGUF's Linears */
    for (int i = 0; i < n && quant != FT_NTYPES; i++)
        if (d[i].kind == FT_WD_LINEAR && !plain_float(d[i].stored) && d[i].stored != quant)
            return ft_err(FTUNE_ERR_ARG, "the model's weights are already quantized (%s, as the file stores them): "
                          "--quant does not apply, it would dequantize them and quantize them again; leave --quant "
                          "out to use them as stored", ft_types[d[i].stored].name);
    for (int i = 0; i < n; i++) {
        const ft_weight_desc *w = &d[i];
        if (w->kind == FT_WD_HELD) {
            hold(p, false, w->stored, w->stored_bytes);
            p->owned[FT_F32] += w->owned_bytes;
            p->owned_total += w->owned_bytes;
            p->n_owned += w->n_owned;
        } else if (w->kind == FT_WD_VEC) {
            /* ft_model_bind_vec: an f32 copy; the mapping keeps the bytes as stored */
            hold(p, false, w->stored, w->stored_bytes);
            hold(p, true, FT_F32, ft_held_bytes(FT_F32, w->rows, w->cols));
        } else if (w->bnb) {
            hold(p, true, w->stored, ft_held_bytes(w->stored, w->rows, w->cols));
            /* held in f32 (blocks across rows): ft_model_set_compute converts that owned copy too */
            if (compute != FT_F32 && w->stored != compute && plain_float(w->stored))
                hold(p, true, compute, ft_held_bytes(compute, w->rows, w->cols));
        } else if (w->kind == FT_WD_LINEAR && quant != FT_NTYPES && w->stored != quant) {
            hold(p, true, quant, ft_held_bytes(quant, w->rows, w->cols)); /* ft_model_quantize */
        } else if (compute != FT_F32 && w->stored != compute && plain_float(w->stored) &&
                   !(w->kind == FT_WD_LINEAR && quant != FT_NTYPES)) {
            hold(p, true, compute, ft_held_bytes(compute, w->rows, w->cols)); /* ft_model_set_compute */
        } else {
            hold(p, false, w->stored, w->stored_bytes);
        }
    }
    p->other = ft_model_owned_list_bytes(p->n_owned);
    return FTUNE_OK;
}
