/* module.h — the one vocabulary of a block's seven Linears (the modules an
 * adapter can target): the index every table uses (adapter sets, the
 * block's acts/grads, trainer parameters), its bit in a target mask, and
 * its names in each file format. Everything else refers to these. */
#ifndef FT_MODULE_H
#define FT_MODULE_H

/* In layer order, which is also PEFT's order of target_modules. */
typedef enum { FT_MOD_Q, FT_MOD_K, FT_MOD_V, FT_MOD_O, FT_MOD_GATE, FT_MOD_UP, FT_MOD_DOWN, FT_N_MODS } ft_module;
/* A set of modules (LoRA targets) as a bit mask. */
#define FT_MOD_BIT(m) (1u << (m))
#define FT_MOD_ALL ((1u << FT_N_MODS) - 1)

typedef struct {
    const char *name;   /* "q": the CLI's --lora-targets short name */
    const char *peft;   /* "q_proj": PEFT's target_modules entry */
    const char *path;   /* "self_attn.q_proj": Hugging Face path under model.layers.{i}. */
    const char *gguf;   /* "attn_q": GGUF tensor name under blk.{i}. */
} ft_module_info;
extern const ft_module_info ft_modules[FT_N_MODS];

/* ft_modules[mod].peft / .path / .gguf, or "?" out of range. */
const char *ft_module_name(ft_module mod);
const char *ft_module_path(ft_module mod);
const char *ft_module_gguf_name(ft_module mod);

#endif
