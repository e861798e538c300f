/* adapter_api.c — the public face of adapters: a PEFT or GGUF adapter
 * loaded for a model (used by the sessions given it), or as the model's
 * default adapter, and a model written with its adapter merged. */
#include "adapter.h"

static void free_adapter(void *a) { ft_adapter_free(a); }

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
    return FTUNE_OK;
}

ftune_status ftune_model_save_merged(const ftune_model *m, const char *path, const char *dtype) {
    if (!m || !path) return ft_err(FTUNE_ERR_ARG, "ftune_model_save_merged: no model or path");
    ft_merge_opts o = { .dtype = dtype };
    return ft_merge_write(m, path, &o);
}
