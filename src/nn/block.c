/* block.c — one transformer block forward and backward (see block.h), and
 * the RoPE setup, shared by the inference sessions and the trainer. */
#include "nn/block.h"

void ft_rope_setup(float *inv_freq, const ft_config *c, const float *freq_factors) {
    ft_rope_freqs(inv_freq, c->HS, c->rope_theta, &c->rope_scaling);
    if (freq_factors)
        for (int i = 0; i < c->HS / 2; i++) inv_freq[i] /= freq_factors[i];
}

static void layer_hook(const ft_block_env *e, ft_block_event ev, int layer, const float *rows, int n) {
    if (e->hooks && e->hooks->layer) e->hooks->layer(e->hooks->ctx, ev, layer, rows, n, e->cfg->C);
}

/* The env's adapter for Linear k of block `layer`, or NULL: passed to the
 * Linear op, so the (shared, read-only) model is never written. */
static const ft_adapter_inst *adapter_of(const ft_block_env *e, int layer, int k) {
    return e->adapters ? e->adapters[layer * FT_N_MODS + k] : NULL;
}

static void lin_fwd(const ft_block_env *e, const ft_layer *ly, int layer, int k, const ft_block_acts *a,
                    const ft_block_io *io, float *out, const float *inp, int BT) {
    const ft_backend *be = e->be;
    const ft_linear *lin = ft_layer_linear((ft_layer *)ly, k);
    const ft_adapter_inst *ad = adapter_of(e, layer, k);
    if (e->hooks && e->hooks->linear_input) e->hooks->linear_input(e->hooks->ctx, layer, k, inp, BT, lin->in);
    if (io->train)
        be->linear_forward_train(be, out, a->u[k], inp, lin, ad, BT, io->mask_seed[k], e->lin_scratch);
    else
        be->linear_forward(be, out, inp, lin, ad, BT, e->lin_scratch);
}

static void lin_bwd(const ft_block_env *e, const ft_layer *ly, int layer, int k, const ft_block_grads *g,
                    const ft_block_acts *a, const ft_block_io *io, float *dinp, const float *dout, const float *inp,
                    int BT, bool accumulate) {
    const ft_backend *be = e->be;
    be->linear_backward(be, dinp, g->w[k], g->b[k], dout, inp, a->u[k], ft_layer_linear((ft_layer *)ly, k),
                        adapter_of(e, layer, k), BT, io->mask_seed[k], accumulate, e->lin_scratch);
}

/* keys (B, P+T) = [prefix; this row's own keys], for k and v. */
static void assemble_prefix(const ft_backend *be, const ft_block_io *io, const float *k, const float *v, size_t kvd) {
    size_t P = (size_t)io->P, T = (size_t)io->T;
    for (int b = 0; b < io->B; b++) {
        float *dk = io->kv_k + b * (P + T) * kvd, *dv = io->kv_v + b * (P + T) * kvd;
        be->copy(be, dk, io->prefix_k, P * kvd * sizeof(float));
        be->copy(be, dv, io->prefix_v, P * kvd * sizeof(float));
        be->copy(be, dk + P * kvd, k + b * T * kvd, T * kvd * sizeof(float));
        be->copy(be, dv + P * kvd, v + b * T * kvd, T * kvd * sizeof(float));
    }
}

void ft_block_forward(const ft_block_env *e, const ft_layer *ly, int layer, const ft_block_acts *a, float *out,
                      const float *x, const ft_block_io *io) {
    const ft_config *c = e->cfg;
    const ft_backend *be = e->be;
    int B = io->B, T = io->T, BT = B * T, C = c->C, NH = c->NH, NKV = c->NKV, HS = c->HS, F = c->F;
    layer_hook(e, FT_BLOCK_PRE_FORWARD, layer, x, BT);
    be->rmsnorm_forward(be, a->ln1, a->rstd1, x, ly->attn_norm, BT, C, c->norm_eps);
    lin_fwd(e, ly, layer, FT_MOD_Q, a, io, a->q, a->ln1, BT);
    lin_fwd(e, ly, layer, FT_MOD_K, a, io, a->k, a->ln1, BT);
    lin_fwd(e, ly, layer, FT_MOD_V, a, io, a->v, a->ln1, BT);
    if (a->ln1_c) be->to_compute(be, a->ln1_c, a->ln1, (size_t)BT * C);
    be->rope_forward(be, a->q, io->pos, e->inv_freq, BT, NH, HS, c->rope_interleaved);
    be->rope_forward(be, a->k, io->pos, e->inv_freq, BT, NKV, HS, c->rope_interleaved);
    if (io->P > 0) assemble_prefix(be, io, a->k, a->v, (size_t)NKV * HS);
    be->attention_forward(be, a->atty, a->lse, a->q, io->keys, io->values, io->q_pos, io->doc, B, T, io->Tk, NH,
                          NKV, HS, NKV * HS, e->att_scratch);
    lin_fwd(e, ly, layer, FT_MOD_O, a, io, a->mid, a->atty, BT);
    if (a->atty_c) be->to_compute(be, a->atty_c, a->atty, (size_t)BT * NH * HS);
    be->add(be, a->mid, x, (size_t)BT * C);
    be->rmsnorm_forward(be, a->ln2, a->rstd2, a->mid, ly->ffn_norm, BT, C, c->norm_eps);
    lin_fwd(e, ly, layer, FT_MOD_GATE, a, io, a->gate, a->ln2, BT);
    lin_fwd(e, ly, layer, FT_MOD_UP, a, io, a->up, a->ln2, BT);
    if (a->ln2_c) be->to_compute(be, a->ln2_c, a->ln2, (size_t)BT * C);
    be->swiglu_forward(be, a->h, a->gate, a->up, BT, F);
    lin_fwd(e, ly, layer, FT_MOD_DOWN, a, io, out, a->h, BT);
    be->add(be, out, a->mid, (size_t)BT * C);
    layer_hook(e, FT_BLOCK_POST_FORWARD, layer, out, BT);
}

void ft_block_backward(const ft_block_env *e, const ft_layer *ly, int layer, const ft_block_grads *g, float *dres,
                       const float *x, const ft_block_acts *a, const ft_block_io *io, const ft_block_scratch *s) {
    const ft_config *c = e->cfg;
    const ft_backend *be = e->be;
    int B = io->B, T = io->T, BT = B * T, C = c->C, NH = c->NH, NKV = c->NKV, HS = c->HS, F = c->F;
    layer_hook(e, FT_BLOCK_PRE_BACKWARD, layer, dres, BT);
    /* MLP: dres holds d(block output) = d(mid) through the residual */
    be->swiglu_forward(be, s->h, a->gate, a->up, BT, F);
    lin_bwd(e, ly, layer, FT_MOD_DOWN, g, a, io, s->dh, dres, s->h, BT, false);
    be->swiglu_backward(be, s->dgate, s->dup, s->dh, a->gate, a->up, BT, F);
    if (a->ln2_c) be->from_compute(be, a->ln2, a->ln2_c, (size_t)BT * C);
    lin_bwd(e, ly, layer, FT_MOD_GATE, g, a, io, s->dln, s->dgate, a->ln2, BT, false);
    lin_bwd(e, ly, layer, FT_MOD_UP, g, a, io, s->dln, s->dup, a->ln2, BT, true);
    be->rmsnorm_backward(be, dres, g->ffn_norm, s->dln, a->mid, ly->ffn_norm, a->rstd2, BT, C);
    /* attention: probabilities recomputed from the saved log-sum-exp */
    if (a->atty_c) be->from_compute(be, a->atty, a->atty_c, (size_t)BT * NH * HS);
    lin_bwd(e, ly, layer, FT_MOD_O, g, a, io, s->datty, dres, a->atty, BT, false);
    if (io->P > 0) {
        size_t kvd = (size_t)NKV * HS, P = (size_t)io->P;
        assemble_prefix(be, io, a->k, a->v, kvd);
        be->attention_backward(be, s->dq, io->dkv_k, io->dkv_v, s->datty, a->lse, a->q, io->kv_k, io->kv_v,
                               io->q_pos, io->doc, B, T, io->Tk, NH, NKV, HS, e->att_scratch);
        /* own rows to dk/dv; the prefix rows, seen by every batch row, sum */
        for (int b = 0; b < B; b++) {
            const float *gk = io->dkv_k + b * (P + T) * kvd, *gv = io->dkv_v + b * (P + T) * kvd;
            be->copy(be, s->dk + b * (size_t)T * kvd, gk + P * kvd, (size_t)T * kvd * sizeof(float));
            be->copy(be, s->dv + b * (size_t)T * kvd, gv + P * kvd, (size_t)T * kvd * sizeof(float));
            if (io->dprefix_k) be->add(be, io->dprefix_k, gk, P * kvd);
            if (io->dprefix_v) be->add(be, io->dprefix_v, gv, P * kvd);
        }
    } else {
        be->attention_backward(be, s->dq, s->dk, s->dv, s->datty, a->lse, a->q, a->k, a->v, io->q_pos, io->doc, B,
                               T, T, NH, NKV, HS, e->att_scratch);
    }
    be->rope_backward(be, s->dq, io->pos, e->inv_freq, BT, NH, HS, c->rope_interleaved);
    be->rope_backward(be, s->dk, io->pos, e->inv_freq, BT, NKV, HS, c->rope_interleaved);
    if (a->ln1_c) be->from_compute(be, a->ln1, a->ln1_c, (size_t)BT * C);
    lin_bwd(e, ly, layer, FT_MOD_Q, g, a, io, s->dln, s->dq, a->ln1, BT, false);
    lin_bwd(e, ly, layer, FT_MOD_K, g, a, io, s->dln, s->dk, a->ln1, BT, true);
    lin_bwd(e, ly, layer, FT_MOD_V, g, a, io, s->dln, s->dv, a->ln1, BT, true);
    be->rmsnorm_backward(be, dres, g->attn_norm, s->dln, x, ly->attn_norm, a->rstd1, BT, C);
    layer_hook(e, FT_BLOCK_POST_BACKWARD, layer, dres, BT);
}
