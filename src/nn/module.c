/* module.c — the table of module.h. */
#include "nn/module.h"

#include <stdbool.h>

const ft_module_info ft_modules[FT_N_MODS] = {
    [FT_MOD_Q] = { "q", "q_proj", "self_attn.q_proj", "attn_q" },
    [FT_MOD_K] = { "k", "k_proj", "self_attn.k_proj", "attn_k" },
    [FT_MOD_V] = { "v", "v_proj", "self_attn.v_proj", "attn_v" },
    [FT_MOD_O] = { "o", "o_proj", "self_attn.o_proj", "attn_output" },
    [FT_MOD_GATE] = { "gate", "gate_proj", "mlp.gate_proj", "ffn_gate" },
    [FT_MOD_UP] = { "up", "up_proj", "mlp.up_proj", "ffn_up" },
    [FT_MOD_DOWN] = { "down", "down_proj", "mlp.down_proj", "ffn_down" },
};

static bool in_range(ft_module mod) { return (unsigned)mod < FT_N_MODS; }
const char *ft_module_name(ft_module mod) { return in_range(mod) ? ft_modules[mod].peft : "?"; }
const char *ft_module_path(ft_module mod) { return in_range(mod) ? ft_modules[mod].path : "?"; }
const char *ft_module_gguf_name(ft_module mod) { return in_range(mod) ? ft_modules[mod].gguf : "?"; }
