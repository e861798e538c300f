/* adapter_api.c — the public face of adapters: a PEFT or GGUF adapter
 * loaded onto a model and owned by it, and a model written with its adapter
 * merged. */
#include "adapter.h"

static void free_adapter(void *a) { ft_adapter_free(a); }

ftune_status ftune_model_load_adapter(ftune_model *m, const char *dir) {
    if (!m || !dir) return ft_err(FTUNE_ERR_ARG, "ftune_model_load_adapter: no model or directory");
    if (m->adapter) return ft_err(FTUNE_ERR_ARG, "%s: the model already carries an adapter", dir);
    ft_adapter *a = NULL;
    /* a file is a llama.cpp GGUF adapter, a directory a PEFT one */
    ftune_status st = ft_file_exists(dir) && !ft_is_dir(dir) ? ft_adapter_load_gguf(&a, m, dir, false)
                                                             : ft_adapter_load_peft(&a, m, dir, false);
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
