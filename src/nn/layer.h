/* layer.h — what the transformer block computes with: a Llama-family
 * model's shape (ft_config) and one layer's weights (ft_layer). The model
 * (model/model.h) fills them from its files; the block (block.h) runs them. */
#ifndef FT_LAYER_H
#define FT_LAYER_H

#include "core/core.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"

typedef struct {
    char arch[32];            /* llama, mistral, qwen2, ... */
    int C, F, L, NH, NKV, HS, V;
    int max_T;                /* context length */
    float norm_eps, rope_theta;
    ft_rope_scaling rope_scaling;
    bool rope_interleaved;    /* Meta/GGUF q/k layout: RoPE on pairs (2i, 2i+1) */
    bool tied;                /* lm_head shares tok_embd */
    bool qkv_bias;
    int32_t bos_id, eos_id;   /* from the model's files; -1 if none */
} ft_config;

typedef struct {
    float *attn_norm;         /* (C) */
    ft_linear wq;             /* (NH*HS, C) */
    ft_linear wk, wv;         /* (NKV*HS, C) */
    ft_linear wo;             /* (C, NH*HS) */
    float *ffn_norm;          /* (C) */
    ft_linear w_gate, w_up;   /* (F, C) */
    ft_linear w_down;         /* (C, F) */
} ft_layer;

/* The Linear of module mod in a layer. */
static inline ft_linear *ft_layer_linear(ft_layer *ly, ft_module mod) {
    ft_linear *l[FT_N_MODS] = { &ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down };
    return l[mod];
}

#endif
