/* adapter.h — adapters as objects and as files: attaching fresh
 * adapters to a model's Linears, reading and writing Hugging Face PEFT
 * directories (adapter_config.json + adapter_model.safetensors), writing
 * llama.cpp GGUF LoRA adapters, and folding adapters into the base weights
 * (merge.c: in memory, or through the model writer, model/model_write.c,
 * into a new model file).
 *
 * Layout of q/k rows: a model with cfg.rope_interleaved (GGUF, llama2.c)
 * keeps q_proj/k_proj rows, and so lora_B rows, in Meta's interleaved RoPE
 * order; PEFT files use Hugging Face's rotate-half order and llama.cpp's
 * llama-arch files the interleaved one. Readers and writers permute lora_B
 * (never lora_A) where the two differ, per head: n_head for q, n_head_kv
 * for k. */
#ifndef FT_ADAPTER_H
#define FT_ADAPTER_H

#include "model/model.h"
#include "optim/optim.h"

/* Permutes the rows of a (rows, cols) f32 matrix in place, head by head
 * (n_heads heads of rows/n_heads rows): to_interleaved moves row
 * h·HS + s·HS/2 + i (rotate-half) to h·HS + 2i + s (interleaved); the other
 * direction is its inverse. */
FTUNE_MUST_USE ftune_status ft_permute_rope_rows(float *w, int rows, int cols, int n_heads, bool to_interleaved);

/* One adapted Linear. Its parameters are the kind's (adapter_kind.h):
 * every reader and writer here goes through the kind's table (names,
 * shapes, bind, init); only the instance struct is LoRA's. */
typedef struct {
    int layer;
    ft_module mod;
    ft_linear *lin;     /* in the model: its shape; never written */
    ft_lora *lora;      /* the instance: lora->base is what the kind's ops take */
} ft_adapter_entry;

/* A set of LoRA adapters for one model (the public ftune_adapter). When the
 * adapter owns its LoRA structs (attach, load), their values live in one
 * allocation (counted as FT_MEM_TRAINABLE when trainable, else as owned
 * FT_MEM_WEIGHTS) and their gradients in another (FT_MEM_GRADS); the
 * object's arrays are FT_MEM_OTHER. A wrapped adapter only points at
 * someone else's. Nothing is
 * ever written into the model: whoever runs the model with the adapter (a
 * session: ftune_session_set_adapter; the model's default adapter:
 * ftune_model_load_adapter) passes `set` to the block
 * (ft_block_env.adapters), which binds it per call, and a merge
 * (ft_merge_write's a) to the model writer (ft_model_write_opts.adapters).
 * So any number of sessions on one model may run different adapters at once. */
typedef struct ftune_adapter {
    ftune_model *m;
    const ft_adapter_kind *kind; /* every entry's */
    ft_adapter_hparams cfg;  /* the hyper-parameters the owned instances point at (a wrapper: a copy of
                              * the wrapped ones', targets those it has); seed: the one attach
                              * initialised from (0 when loaded) */
    int n;
    ft_adapter_entry *e;     /* (n), in (layer, module) order */
    ft_lora *loras;          /* (n) owned structs, or NULL when wrapping */
    float *mem;              /* (n_values) owned parameter values of every entry, entry after entry in
                              * the kind's order (LoRA A, B), or NULL when wrapping */
    float *grads;            /* (n_values) their gradients in the same layout when attached as
                              * trainable, else NULL */
    size_t n_values;
    bool trainable;          /* attached or loaded as trainable: grads, and mem counted as trainables */
    int cap;                 /* entries e (and loras) are allocated for */
    char base_model[256];    /* base_model_name_or_path for adapter_config.json */
    const ft_adapter_inst **set; /* (L · FT_N_MODS): set[l * FT_N_MODS + mod] = &the entry's lora->base, or NULL */
} ft_adapter;

/* Makes fresh adapters (A Kaiming-uniform from cfg->seed as PEFT, B zero) for
 * every Linear in cfg->targets of every layer of m (m is not written). With
 * trainable, dA and dB are allocated (zeroed) too. */
FTUNE_MUST_USE ftune_status ft_adapter_attach(ft_adapter **out, ftune_model *m, const ft_adapter_hparams *cfg, bool trainable);
/* An adapter object over LoRA structs owned elsewhere (e.g. a trainer's):
 * loras[l * FT_N_MODS + mod] for block l and module mod, NULL where none.
 * Nothing is attached to the model. r/alpha/rslora/dropout come from the
 * structs' hyper-parameters, which must agree. */
FTUNE_MUST_USE ftune_status ft_adapter_wrap(ft_adapter **out, ftune_model *m, ft_lora *const *loras);
/* Frees the adapter's own LoRA structs. Accepts NULL. */
void ft_adapter_free(ft_adapter *a);

/* Parameters of all entries: n · the kind's n_params. */
int ft_adapter_n_params(const ft_adapter *a);
/* The trainable tensors of an adapter attached with trainable: each
 * entry's, in the kind's order (LoRA: A then B), named as in the PEFT file
 * ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), with
 * weight decay. out holds ft_adapter_n_params(a) entries. FTUNE_ERR_ARG if
 * the adapter has no gradients. */
FTUNE_MUST_USE ftune_status ft_adapter_params(const ft_adapter *a, ft_param *out);

/* ------------------------------------------------------------- PEFT */

/* adapter_config.json as far as ftune reads it. */
typedef struct {
    char peft_type[16];
    ft_adapter_hparams hp;   /* r, lora_alpha, lora_dropout, use_rslora; targets 0 and seed 0
                              * (target_modules are names: below) */
    bool fan_in_fan_out;
    int n_targets;
    char **targets;          /* target_modules as a list, or NULL */
    char *target_regex;      /* target_modules as a string (a regex or "all-linear"), or NULL */
    int n_layers_to_transform;
    int *layers_to_transform;/* NULL: every layer */
    char base_model[256];
} ft_peft_config;

/* Reads adapter_config.json. Fields whose non-default values ftune cannot
 * honour are FTUNE_ERR_UNSUPPORTED with the field named: peft_type other
 * than LORA, use_dora, bias other than "none", lora_bias, non-empty
 * rank_pattern / alpha_pattern, modules_to_save, exclude_modules,
 * layer_replication, use_qalora, trainable_token_indices,
 * target_parameters. fan_in_fan_out is read (GPT-2 adapters) and rejected
 * when attaching to a model. */
FTUNE_MUST_USE ftune_status ft_peft_config_read(ft_peft_config *c, const char *path);
void ft_peft_config_free(ft_peft_config *c);

/* The tensors of one adapted module found in adapter_model.safetensors. */
typedef struct {
    char module[FT_NAME_MAX * 2];   /* key without "base_model.model." and the kind's suffix */
    const st_tensor *t[FT_ADAPTER_MAX_PARAMS]; /* t[i]: the kind's parameter i (LoRA: A, B) */
} ft_peft_module;

/* Lists the modules of an opened adapter_model.safetensors for adapters of
 * kind k, checking that every key is one of the kind's tensors (LoRA:
 * lora_A/lora_B weights) under "base_model.model.", that each has all its
 * partners, that all are 2-D and agree on r (LoRA: A [r, in], B [out, r]),
 * and that the dtype is F32, F16 or BF16. DoRA magnitudes, embedding
 * adapters and full tensors (modules_to_save) are FTUNE_ERR_UNSUPPORTED.
 * *mods is malloc'd, in the order of f->tensors (of each module's first
 * parameter). */
FTUNE_MUST_USE ftune_status ft_peft_scan(const st_file *f, const ft_adapter_kind *k, ft_peft_module **mods, int *n);

/* Loads a PEFT adapter directory onto m (m is not written):
 * the config's targets must name modules the model has, every targeted
 * Linear must have both tensors, every tensor must belong to a targeted
 * Linear, and every shape must match the model. */
FTUNE_MUST_USE ftune_status ft_adapter_load_peft(ft_adapter **out, ftune_model *m, const char *dir, bool trainable);
/* Writes a PEFT directory (created if missing): adapter_config.json and
 * adapter_model.safetensors (F32), each atomically. */
FTUNE_MUST_USE ftune_status ft_adapter_save_peft(const ft_adapter *a, const char *dir);

/* ------------------------------------------------------------- GGUF */

/* Writes a llama.cpp LoRA adapter (general.type "adapter", adapter.type
 * "lora", adapter.lora.alpha; tensors blk.{i}.<attn_q|...>.weight.lora_a
 * [r, in] and .lora_b [out, r], F32). For rsLoRA alpha·sqrt(r) is written,
 * as llama.cpp scales by alpha / r. */
FTUNE_MUST_USE ftune_status ft_adapter_save_gguf(const ft_adapter *a, const char *path);
/* Loads such an adapter onto m (m is not written): general.type
 * "adapter", adapter.type "lora", general.architecture the model's (llama
 * for the Llama family, qwen2), adapter.lora.alpha present; every tensor a
 * lora_a/lora_b of a block Linear (f32, f16 or bf16) with its partner, one
 * rank r for all, shapes matching the model. Scale alpha / r; lora_b of
 * q/k is permuted from the file's layout (interleaved for llama) to the
 * model's. */
FTUNE_MUST_USE ftune_status ft_adapter_load_gguf(ft_adapter **out, ftune_model *m, const char *path, bool trainable);

/* ------------------------------------------------------------- merge (merge.c) */

/* Folds adapter a (made for m) into m's Linears: W' = W + scale·B·A in
 * f32, stored as a new f32 weight the model owns. The one operation that
 * writes a model's weights; no session may be running on m. */
FTUNE_MUST_USE ftune_status ft_merge_lora(ftune_model *m, const ft_adapter *a);

/* ft_model_write (model/model.h) with adapter a (made for m) folded in; a
 * NULL: opts->adapters, else the model's default adapter (as
 * ftune_model_load_adapter set it), if any. FTUNE_ERR_ARG for an adapter
 * made for another model. opts may be NULL. */
FTUNE_MUST_USE ftune_status ft_merge_write(const ftune_model *m, const char *out_path, const ft_adapter *a,
                                           const ft_model_write_opts *opts);

#endif
