/* adapter_api.c — the public face of adapters: a PEFT or GGUF adapter
 * loaded for a model (used by the sessions given it), or as the model's
 * default adapter, and a model written with its adapter merged. */
#include "adapter/adapter.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_adapter(void *a) { ft_adapter_free(a); }
static const ft_adapter_inst *const *adapter_set(const void *a) { return ((const ft_adapter *)a)->set; }

ftune_status ftune_adapter_load(ftune_adapter **out, const ftune_model *m, const char *path) {
    if (!out) return ft_err(FTUNE_ERR_ARG, "ftune_adapter_load: no output");
    *out = NULL;
    if (!m || !path) return ft_err(FTUNE_ERR_ARG, "ftune_adapter_load: no model or path");
    /* a file is a llama.cpp GGUF adapter, a directory a PEFT one; the
     * loaders only read m (their ft_model_linear lookups take it mutable) */
    ftune_model *mm = (ftune_model *)m;
    return ft_file_exists(path) && !ft_is_dir(path) ? ft_adapter_load_gguf(out, mm, path, false)
                                                    : ft_adapter_load_peft(out, mm, path, false);
}

void ftune_adapter_free(ftune_adapter *a) { ft_adapter_free(a); }

ftune_status ftune_model_load_adapter(ftune_model *m, const char *dir) {
    if (!m || !dir) return ft_err(FTUNE_ERR_ARG, "ftune_model_load_adapter: no model or directory");
    if (m->adapter) return ft_err(FTUNE_ERR_ARG, "%s: the model already carries an adapter", dir);
    ft_adapter *a = NULL;
    ftune_status st = ftune_adapter_load(&a, m, dir);
    if (st) return st;
    m->adapter = a;
    m->free_adapter = free_adapter;
    m->adapter_set = adapter_set;
    return FTUNE_OK;
}

ftune_status ftune_model_save_merged(const ftune_model *m, const char *path, const char *dtype) {
    if (!m || !path) return ft_err(FTUNE_ERR_ARG, "ftune_model_save_merged: no model or path");
    ft_model_write_opts o = { .dtype = dtype };
    return ft_model_write(m, path, &o);
}

/* What a GGUF write did, on one line. */
static void format_report(char *buf, size_t cap, const char *out, const ft_model_write_report *r) {
    size_t n = 0;
#define PUT(...) do { int k_ = snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__); if (k_ > 0) n += (size_t)k_; } while (0)
    PUT("%s: general.file_type %u; matrices:", out, r->file_type);
    for (int t = 0; t < FT_NTYPES; t++)
        if (r->n_mat[t]) PUT(" %d %s", r->n_mat[t], ft_types[t].name);
    PUT(" (%s %s", r->tied ? "tied token_embd/output" : "output.weight", ft_types[r->output_dtype].name);
    if (r->n_kept) PUT("; %d kept their type: rows not whole blocks", r->n_kept);
    if (r->n_fallback) PUT("; %d fell back as llama.cpp's do: rows not whole 256-element blocks", r->n_fallback);
    PUT("); %d vectors f32", r->n_vec);
#undef PUT
}

ftune_status ftune_model_merge(const ftune_model *m, const char *path, const ftune_merge_opts *o, char *summary,
                               size_t summary_cap) {
    if (!m || !path) return ft_err(FTUNE_ERR_ARG, "ftune_model_merge: no model or path");
    if (summary && summary_cap) summary[0] = 0;
    size_t n = strlen(path);
    bool gguf = n >= 5 && strcmp(path + n - 5, ".gguf") == 0;
    ft_model_write_report rep;
    ft_model_write_opts mo = { .dtype = o ? o->dtype : NULL, .report = &rep, .progress = o ? o->progress : NULL,
                         .progress_ctx = o ? o->progress_ctx : NULL };
    ftune_tokenizer *tok = NULL;
    char *tok_dir = NULL;
    ftune_status st = FTUNE_OK;
    const char *tp = o ? o->tokenizer : NULL;
    if (tp) {
        /* a model without a tokenizer (ftune init's) gets one for its GGUF */
        if (m->tok || !gguf)
            return ft_err(FTUNE_ERR_ARG, "tokenizer %s: only for a .gguf output from a model without a tokenizer "
                          "(this model has %s)", tp, m->tok ? "its own" : "none, but the output is not .gguf");
        if ((st = ft_tokenizer_load_path(&tok, tp))) return st;
        tok_dir = ft_strdup(tp);
        if (!tok_dir) { ft_tokenizer_free(tok); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
        if (!ft_is_dir(tp)) {
            char *slash = strrchr(tok_dir, '/');
            if (slash) *slash = 0;
            else strcpy(tok_dir, ".");
        }
        mo.tokenizer = tok;
        mo.tokenizer_dir = tok_dir;
    }
    /* a bitsandbytes type (nf4, int8): the merge is written in f32 beside
     * the output, then quantized from it into the output, as ftune_model_save_bnb */
    ft_dtype bnb = gguf || !mo.dtype ? FT_NTYPES : ft_dtype_by_name(mo.dtype);
    if (bnb != FT_NF4 && bnb != FT_I8ROW) st = ft_model_write(m, path, &mo);
    else {
        char f32_dir[4200], staged[4300];
        snprintf(f32_dir, sizeof f32_dir, "%s.merged-f32", path); /* not path's own staging name, which save_bnb takes */
        if (!(st = ft_dir_stage(f32_dir, staged, sizeof staged))) {
            mo.dtype = "f32";
            ftune_model *merged = NULL;
            if (!(st = ft_model_write(m, staged, &mo)) && !(st = ftune_model_load(&merged, staged, NULL)))
                st = ftune_model_save_bnb(merged, path, ft_types[bnb].name);
            ftune_model_free(merged);
            ft_dir_abort(staged);
        }
    }
    if (!st && gguf && summary && summary_cap) format_report(summary, summary_cap, path, &rep);
    ft_tokenizer_free(tok);
    free(tok_dir);
    return st;
}
