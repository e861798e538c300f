/* model.h — the Llama-family model: its config and weights (the types are
 * nn/layer.h's) as tensor views into the files, the loaders for each file
 * format, and the writer. Architectures differ by config only. */
#ifndef FT_MODEL_H
#define FT_MODEL_H

#include "core/core.h"
#include "core/mem.h"
#include "nn/layer.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

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
    const ft_adapter_inst *const *(*adapter_set)(const void *adapter); /* its adapter set (L · FT_N_MODS, as
                               * ft_block_env.adapters): what ft_model_write folds in by default */
};

/* The Linear of module mod (module.h) in block l. */
static inline ft_linear *ft_model_linear(ftune_model *m, int l, ft_module mod) { return ft_layer_linear(&m->layers[l], mod); }
/* Rows of Linear mod permuted between rotate-half and interleaved layout
 * for this model, or 0 if none (heads: NH for q, NKV for k). */
int ft_module_rope_heads(const ft_config *c, ft_module mod);

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

/* ---- writing a model (model_write.c) ---- */

/* row (cols) = row o of weight t in f32 with adapter ad's part folded in
 * (ad may be NULL): the one way every merge makes a row, so a model merged
 * in memory (ft_merge_lora) and one written to a file are bit-identical. */
void ft_merged_row(float *row, const ft_tensor *t, const ft_adapter_inst *ad, int o, int cols);

/* What a GGUF write did (ft_model_write fills it for a .gguf output). */
typedef struct {
    int n_mat[FT_NTYPES];    /* 2-D tensors written, by type */
    int n_kept;              /* of those, rows not a whole number of the chosen type's blocks: own type kept */
    int n_fallback;          /* of those, rows not whole blocks of the mix's K type: llama.cpp's fallback
                              * (q5_0, q5_1, q8_0, or f16) */
    int n_vec;               /* 1-D tensors (norms, biases, RoPE factors), always f32 */
    ft_dtype output_dtype;   /* the output matrix: output.weight, or token_embd when tied */
    bool tied;
    uint32_t file_type;      /* general.file_type (llama.cpp's LLAMA_FTYPE) */
} ft_model_write_report;

typedef struct {
    ft_model_write_report *report; /* filled for a GGUF output, or NULL */
    const ftune_tokenizer *tokenizer; /* written to a GGUF output for a model without one
                              * (ftune init's), or NULL */
    const char *tokenizer_dir; /* where its tokenizer.json / merges.txt / tokenizer_config.json
                              * are (a BPE vocabulary's merges), or NULL */
    const char *dtype;       /* "f32", "bf16", "f16" for every matrix (embedding and output
                              * included; also "float32", "bfloat16", "float16"); NULL keeps
                              * each weight's dtype (f32 where safetensors has none, e.g.
                              * q8_0). A GGUF output takes any type ftune writes there or a
                              * llama.cpp K mix, chosen per tensor as llama.cpp's quantize
                              * does (gguf_out_dtype), or "same": each tensor's own type, for
                              * a GGUF input only */
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* or NULL: called as the rows of
                              * tensors that are computed (folded, converted, permuted or
                              * quantized) are made, done/total counting their elements; tensors
                              * copied byte for byte are not counted. Last call done == total */
    void *progress_ctx;
    const ft_adapter_inst *const *adapters; /* folded in: adapters[l * FT_N_MODS + mod] for block l,
                              * Linear mod (any adapter kind, or NULL), as ft_block_env.adapters;
                              * NULL: the model's default adapter's (m->adapter_set), if any */
} ft_model_write_opts;

/* Whether a GGUF output takes `name` as its --dtype: a writable type, a
 * llama.cpp K mix, or "same". */
bool ft_model_gguf_type_known(const char *name);
/* True if path names the file or directory the model's weights are mapped from. */
bool ft_model_is_source(const ftune_model *m, const char *path);
/* Writes m with its adapter set (opts->adapters or the default) folded in (W + scale·B·A computed
 * in f32, one row at a time, so nothing is copied whole): a path ending in
 * ".gguf" gets a GGUF file with general.file_type set for its weight type:
 * from a GGUF base its metadata and tokenizer are copied; from a Hugging
 * Face or llama2.c base they are written as llama.cpp's converter does
 * (llama/qwen2 keys, the vocabulary by ft_tokenizer_to_gguf, q/k rows
 * permuted to the interleaved layout for llama, rope_freqs for Llama 3
 * scaling);
 * any other path a Hugging Face directory
 * (config.json, model.safetensors with Hugging Face names in rotate-half
 * layout, and the base directory's tokenizer files when it has them; from a
 * GGUF or llama2.c base its tokenizer as tokenizer.json, tokenizer_config.json
 * and generation_config.json, by ft_tokenizer_to_hf, which refuses one that
 * file cannot express),
 * staged beside it so that a failure leaves none of it. FTUNE_ERR_ARG when
 * out_path is where m is read from (ft_model_is_source). opts may be NULL. */
FTUNE_MUST_USE ftune_status ft_model_write(const ftune_model *m, const char *out_path, const ft_model_write_opts *opts);
/* What a Hugging Face output of m would refuse before writing anything: its
 * tokenizer, when it is not the base's own tokenizer.json (ft_tokenizer_hf_check).
 * For a run that writes one only at its end (train --full). */
FTUNE_MUST_USE ftune_status ft_model_check_hf_output(const ftune_model *m);

#endif
