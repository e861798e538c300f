/* model.h — the Llama-family model: config, weights as tensor views, and the
 * loaders for each file format. Architectures differ by config only. */
#ifndef FT_MODEL_H
#define FT_MODEL_H

#include "core/core.h"
#include "core/mem.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

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

/* A buffer the model frees: counted (from ft_model_alloc, FT_MEM_WEIGHTS,
 * n bytes) or a plain malloc'd one handed over by ft_model_own. */
typedef struct {
    void *p;
    size_t n;
    bool counted;
} ft_owned;

struct ftune_model {
    ft_config cfg;
    char format[16];          /* hf, gguf, llama2c */
    ft_tensor tok_embd;       /* (V, C), any dtype */
    ft_layer *layers;         /* (L) */
    float *out_norm;          /* (C) */
    ft_linear lm_head;        /* (V, C); shares tok_embd's data when tied */
    ftune_tokenizer *tok;
    char tok_kind[32];        /* tokenizer kind as the file names it ("llama"/spm, "gpt2"/bpe) */
    /* storage */
    st_file *shards;          /* HF: open safetensors files (weights point into them) */
    int n_shards;
    gguf_file *gguf;          /* GGUF: kept open, weights point into it */
    ft_mmap bin;              /* llama2.c: the mapped checkpoint */
    float *rope_freq_factors; /* (HS/2) GGUF rope_freqs.weight divisors, or NULL */
    ft_owned *owned;          /* (n_owned) buffers the model allocated (converted weights) */
    int n_owned, cap_owned;
    size_t owned_bytes;       /* of the counted ones (FT_MEM_WEIGHTS) */
    int64_t weight_bytes;
    int64_t converted_bytes;  /* of weight_bytes: matrices converted to the compute type (as stored),
                               * whose pages of the mapping were dropped */
    int64_t n_params;
    uint64_t dtype_mask;      /* bit per ft_dtype present (as stored) */
    ft_dtype compute;         /* the compute type it was loaded for (ftune_load_opts.dtype): FT_F32, or
                               * FT_BF16 / FT_F16, its f32/f16/bf16 matrices then held in it */
    bool quantized;           /* the layers' Linear bases were quantized on load, or read quantized (bnb-4bit) */
    ft_dtype quant;           /* to which dtype, when quantized (FT_NF4, FT_I8ROW) */
    int64_t quant_bytes;      /* of weight_bytes: the quantized copies (owned, not in a mapping) */
    void *adapter;            /* ftune_model_load_adapter's default adapter (an ft_adapter), or NULL; never bound into the Linears */
    void (*free_adapter)(void *); /* frees it */
};

/* Checks a config for sizes that are positive and consistent. */
FTUNE_MUST_USE ftune_status ft_config_validate(const ft_config *c, const char *path);
/* Fills cfg from a Hugging Face config.json (model_config.c); the _text
 * form parses len bytes already in memory, path naming them in messages. */
FTUNE_MUST_USE ftune_status ft_config_from_hf_json(ft_config *cfg, const char *path);
FTUNE_MUST_USE ftune_status ft_config_from_hf_text(ft_config *cfg, const char *text, size_t len, const char *path);
/* "none", "linear, factor 2", "llama3, factor 8, ...": for ftune info and messages. */
void ft_rope_scaling_text(const ft_rope_scaling *sc, char *out, size_t cap);

FTUNE_MUST_USE ftune_status ft_load_hf(ftune_model *m, const char *dir);
/* FTUNE_OK unless config.json at path asks for a quantization other than
 * bitsandbytes' nf4 or 8-bit (named in the error). */
FTUNE_MUST_USE ftune_status ft_hf_check_quant_config(const char *path);
/* A Hugging Face directory's config.json read into cfg, its quantization_config
 * checked (the loader and the planner alike). */
FTUNE_MUST_USE ftune_status ft_hf_read_config(const char *dir, ft_config *cfg);
/* dir's model.safetensors, or every shard its model.safetensors.index.json
 * names, opened in index order (header_only: the headers alone, for the
 * planner); *files is owned by the caller, each closed with ft_st_close.
 * On an error nothing stays open and *files is NULL. */
FTUNE_MUST_USE ftune_status ft_hf_open_shards(const char *dir, bool header_only, st_file **files, int *n);
/* The config of ftune init's preset name (its weights' dtype aside). */
FTUNE_MUST_USE ftune_status ft_preset_config(ft_config *cfg, const char *name);

/* ---- planning a load from the headers only (model_plan.c) ---- */

/* One weight the loader binds, as stored. */
/* LINEAR: a layer's, quantizable. HELD: what a load as stored already holds
 * apart from the matrices (the vectors: stored_bytes mapped, owned_bytes in
 * n_owned f32 copies), for a model described from a load (GGUF, llama2.c). */
typedef enum { FT_WD_VEC, FT_WD_MATRIX, FT_WD_LINEAR, FT_WD_HELD } ft_wd_kind;
typedef struct {
    ft_wd_kind kind;
    ft_dtype stored;          /* its dtype in the file; a bitsandbytes weight: the dtype it is read into */
    bool bnb;                 /* a bitsandbytes 4-bit or 8-bit weight, read into owned rows on load */
    size_t stored_bytes;      /* its bytes in the file (bnb: 0, the parts are not kept) */
    int64_t rows, cols;       /* a vector: (1, n) */
    size_t owned_bytes;       /* HELD only */
    int n_owned;              /* HELD only */
} ft_weight_desc;

/* What a load will hold: bytes left in the file mappings and bytes of
 * owned copies, each per dtype held, and the owned list's bookkeeping. */
typedef struct {
    size_t mapped[FT_NTYPES], owned[FT_NTYPES];
    size_t mapped_total, owned_total, other;
    int n_owned;
} ft_weights_plan;

/* The weights of the Hugging Face directory dir (config.json and the
 * safetensors headers, no tensor data read or mapped), or of ftune init's
 * preset (preset != NULL; stored in preset_dtype). *descs is malloc'd. */
FTUNE_MUST_USE ftune_status ft_weights_describe_hf(const char *dir, ft_config *cfg, ft_weight_desc **descs, int *n);
/* The weights of m, loaded as stored (no --quant, compute f32): GGUF and
 * llama2.c files, whose loads map the file and read only the vectors. */
FTUNE_MUST_USE ftune_status ft_weights_describe_model(const ftune_model *m, ft_weight_desc **descs, int *n);
FTUNE_MUST_USE ftune_status ft_weights_describe_preset(const char *preset, ft_dtype stored, ft_config *cfg, ft_weight_desc **descs,
                                        int *n);
/* What loading those weights with quant (FT_NF4, FT_I8ROW; FT_NTYPES for
 * none) and then compute (ftune_model_load's order) holds: the sizes
 * ft_model_bind_vec, ft_model_quantize, the bnb readers and
 * ft_model_set_compute allocate (ft_held_bytes). FTUNE_ERR_ARG where the
 * load would refuse (quantizing an already quantized model). */
FTUNE_MUST_USE ftune_status ft_weights_plan_of(const ft_weight_desc *d, int n, ft_dtype quant, ft_dtype compute, ft_weights_plan *p);
FTUNE_MUST_USE ftune_status ft_load_gguf(ftune_model *m, const char *path);
FTUNE_MUST_USE ftune_status ft_load_llama2c(ftune_model *m, const char *path, const char *tokenizer_path);

/* Quantizes the base weight of every layer's Linears to q (FT_NF4, with
 * double quantization: bitsandbytes' QLoRA default, see formats/bnb.h; or
 * FT_I8ROW, bitsandbytes' row-wise int8)
 * one tensor at a time, row by row from its file mapping, whose pages are
 * then dropped: the unquantized model is never all in memory. The token
 * embedding and the LM head stay as they are (as transformers keeps
 * them). An error names a tensor with a non-finite weight (model_quant.c). */
FTUNE_MUST_USE ftune_status ft_model_quantize(ftune_model *m, ft_dtype q);
/* The dtype named by a --quant value ("nf4", "int8"); an error listing the choices otherwise. */
FTUNE_MUST_USE ftune_status ft_quant_from_name(const char *name, ft_dtype *q);

/* Takes ownership of a malloc'd buffer, freed with the model (not counted
 * in the memory table: prefer ft_model_alloc). On failure p is freed. */
FTUNE_MUST_USE ftune_status ft_model_own(ftune_model *m, void *p);
/* n bytes counted as FT_MEM_WEIGHTS, freed with the model; NULL (with the
 * error set) when out of memory. */
void *ft_model_alloc(ftune_model *m, size_t n);
/* Bytes of an owned (rows, cols) weight held in dt (rows of whole blocks):
 * what the loader allocates for every copy, conversion and quantization,
 * and what the planner (model_plan.c) predicts with. */
size_t ft_held_bytes(ft_dtype dt, int64_t rows, int64_t cols);
/* Bytes of the model's list of owned buffers once it holds n_owned. */
size_t ft_model_owned_list_bytes(int n_owned);
/* Bytes of weights the model reads from its file mappings (as stored), and
 * bytes of the copies it owns (and of its list of them): sets the mapped
 * row of t, adds to the owned-weights and other rows. */
void ft_model_mem_plan(const ftune_model *m, ft_mem_table *t);
/* Parses a compute dtype name: "f32" (also NULL), "bf16", "f16";
 * FTUNE_ERR_ARG naming `what` (the option) otherwise. */
FTUNE_MUST_USE ftune_status ft_compute_parse(const char *name, const char *what, ft_dtype *out);
/* FTUNE_ERR_RANGE naming the first tensor (and a value) of m's matrices
 * that compute type f16 cannot hold (|x| > 65504 would become inf),
 * suggesting bf16; FTUNE_OK for any other compute type. */
FTUNE_MUST_USE ftune_status ft_model_check_range(const ftune_model *m, ft_dtype compute);
/* Holds m's frozen matrices (the embedding, the seven Linears of every
 * layer, an untied head) in compute: those stored in another float dtype
 * (f32, f16, bf16) are converted once (RNE) into owned copies counted as
 * FT_MEM_WEIGHTS; those already in it stay mapped; quantized ones (q8_0,
 * q4_0) stay as they are; vectors (norms, biases) stay f32. Sets
 * m->compute. Checks the f16 range first (nothing is converted then). */
FTUNE_MUST_USE ftune_status ft_model_set_compute(ftune_model *m, ft_dtype compute);
/* Binds a tensor found in a file to a weight slot, checking shape and dtype:
 * 1-D weights (norms, biases) are converted to owned f32 copies. */
FTUNE_MUST_USE ftune_status ft_model_bind_vec(ftune_model *m, float **dst, const ft_tensor *src, int64_t n);
FTUNE_MUST_USE ftune_status ft_model_bind_linear(ftune_model *m, ft_linear *dst, const ft_tensor *src, int out, int in);

#endif
