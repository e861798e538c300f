/* model_llama2c.c — llama2.c checkpoints (the original "version 0" export):
 * seven int32 hyperparameters, then f32 weights in a fixed order, all
 * memory-mapped. The tokenizer is a separate llama2.c tokenizer .bin. */
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_view(ft_tensor *t, const char *name, const float *p, int64_t d0, int64_t d1) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = FT_F32;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = (void *)p;
    t->nbytes = (size_t)(d0 * (d1 ? d1 : 1)) * sizeof(float);
}

/* Looks for a tokenizer next to the checkpoint: tokenizer.bin, tok<V>.bin. */
static bool find_tokenizer(const char *path, int V, char *out, size_t cap) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    snprintf(out, cap, "%s/tok%d.bin", dir, V);
    if (ft_file_exists(out)) return true;
    snprintf(out, cap, "%s/tokenizer.bin", dir);
    return ft_file_exists(out);
}

ftune_status ft_load_llama2c(ftune_model *m, const char *path, const char *tokenizer_path) {
    snprintf(m->format, sizeof m->format, "llama2c");
    ftune_status st = ft_mmap_open(&m->bin, path);
    if (st) return st;
    const uint8_t *d = m->bin.data;
    size_t size = m->bin.size;
    if (size < 28) return ft_err(FTUNE_ERR_FORMAT, "%s: too small for a llama2.c checkpoint (%zu bytes)", path, size);
    int32_t h[7];
    memcpy(h, d, sizeof h);
    if ((uint32_t)h[0] == 0x616b3432u)
        return ft_err(FTUNE_ERR_UNSUPPORTED, "%s: llama2.c export version %d is not supported (only the legacy "
                      "version 0 format)", path, h[1]);
    ft_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "llama");
    c->C = h[0]; c->F = h[1]; c->L = h[2]; c->NH = h[3]; c->NKV = h[4];
    /* the sign of vocab_size says whether the classifier is shared; INT32_MIN
     * has no positive counterpart (negating it is undefined) and is invalid */
    c->tied = h[5] > 0;
    c->V = h[5] == INT32_MIN ? 0 : h[5] > 0 ? h[5] : -h[5];
    c->max_T = h[6];
    c->HS = c->NH > 0 ? c->C / c->NH : 0;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_interleaved = true;
    c->bos_id = 1;
    c->eos_id = 2;
    if ((st = ft_config_validate(c, path))) return st;
    if (c->NH * c->HS != c->C) return ft_err(FTUNE_ERR_FORMAT, "%s: dim %d is not a multiple of n_heads %d", path, c->C, c->NH);
    /* expected size, in floats, computed in 64 bits */
    int64_t C = c->C, F = c->F, L = c->L, V = c->V, KV = (int64_t)c->NKV * c->HS, T = c->max_T, HS = c->HS;
    int64_t n = V * C + L * C + L * C * C + 2 * L * C * KV + L * C * C + L * C + 3 * L * C * F + C + T * HS;
    if (!c->tied) n += V * C;
    if ((int64_t)size != 28 + n * 4)
        return ft_err(FTUNE_ERR_FORMAT, "%s: size %zu bytes does not match the header (dim %d, hidden %d, layers %d, "
                      "heads %d/%d, vocab %d, seq_len %d need %lld bytes)", path, size, c->C, c->F, c->L, c->NH,
                      c->NKV, c->V, c->max_T, (long long)(28 + n * 4));
    const float *p = (const float *)(d + 28);
    ft_tensor t;
    set_view(&m->tok_embd, "token_embedding_table", p, V, C);
    if ((st = ft_model_bind_linear(m, &m->lm_head, &m->tok_embd, c->V, c->C))) return ft_err_prefix(st, "%s", path);
    p += V * C;
    m->layers = calloc((size_t)c->L, sizeof *m->layers);
    if (!m->layers) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    char name[FT_NAME_MAX];
#define EACH_LAYER(label, d0, d1, bind)                        \
    for (int l = 0; l < c->L; l++) {                                   \
        snprintf(name, sizeof name, "%s[%d]", label, l);               \
        set_view(&t, name, p, d0, d1);                                 \
        if ((st = bind)) return ft_err_prefix(st, "%s", path);         \
        p += (d0) * ((d1) ? (d1) : 1);                                 \
    }
    EACH_LAYER("rms_att_weight", C, 0, ft_model_bind_vec(m, &m->layers[l].attn_norm, &t, C));
    EACH_LAYER("wq", C, C, ft_model_bind_linear(m, &m->layers[l].wq, &t, c->C, c->C));
    EACH_LAYER("wk", KV, C, ft_model_bind_linear(m, &m->layers[l].wk, &t, (int)KV, c->C));
    EACH_LAYER("wv", KV, C, ft_model_bind_linear(m, &m->layers[l].wv, &t, (int)KV, c->C));
    EACH_LAYER("wo", C, C, ft_model_bind_linear(m, &m->layers[l].wo, &t, c->C, c->C));
    EACH_LAYER("rms_ffn_weight", C, 0, ft_model_bind_vec(m, &m->layers[l].ffn_norm, &t, C));
    EACH_LAYER("w1", F, C, ft_model_bind_linear(m, &m->layers[l].w_gate, &t, c->F, c->C));
    EACH_LAYER("w2", C, F, ft_model_bind_linear(m, &m->layers[l].w_down, &t, c->C, c->F));
    EACH_LAYER("w3", F, C, ft_model_bind_linear(m, &m->layers[l].w_up, &t, c->F, c->C));
#undef EACH_LAYER
    set_view(&t, "rms_final_weight", p, C, 0);
    if ((st = ft_model_bind_vec(m, &m->out_norm, &t, C))) return ft_err_prefix(st, "%s", path);
    p += C;
    p += T * HS; /* legacy freq_cis_real / freq_cis_imag tables, unused */
    if (!c->tied) {
        set_view(&t, "wcls", p, V, C);
        if ((st = ft_model_bind_linear(m, &m->lm_head, &t, c->V, c->C))) return ft_err_prefix(st, "%s", path);
    }
    char tp[4096];
    if (tokenizer_path) snprintf(tp, sizeof tp, "%s", tokenizer_path);
    else if (!find_tokenizer(path, c->V, tp, sizeof tp))
        return ft_err(FTUNE_ERR_ARG, "%s: no tokenizer found (looked for tok%d.bin and tokenizer.bin beside it); "
                      "pass --tokenizer FILE", path, c->V);
    snprintf(m->tok_kind, sizeof m->tok_kind, "spm");
    if ((st = ft_tokenizer_from_llama2c(&m->tok, tp, c->V))) return st;
    return FTUNE_OK;
}
