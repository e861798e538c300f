/* merge.c — folds adapters into the base weights: W' = W + scale·B·A in
 * f32. In memory (the model then carries f32 merged weights), or written as
 * a new model by the model writer (model/model_write.c) with the adapter's
 * set folded in row by row; both make each row with ft_merged_row. */
#include "adapter/adapter.h"

ftune_status ft_merge_lora(ftune_model *m, const ft_adapter *ad) {
    if (!ad) return FTUNE_OK;
    if (ad->m != m) return ft_err(FTUNE_ERR_ARG, "merge: the adapter was made for another model");
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_linear *lin = ft_model_linear(m, l, k);
            const ft_adapter_inst *a = ad->set[l * FT_N_MODS + k];
            if (!a) continue;
            /* an owned weight of the model (counted as FT_MEM_WEIGHTS), made row by row as the writers do */
            float *w = ft_model_alloc(m, (size_t)lin->out * lin->in * sizeof(float));
            if (!w) return ft_err(FTUNE_ERR_NOMEM, "out of memory merging layer %d %s", l, ft_module_name(k));
            for (int o = 0; o < lin->out; o++) ft_merged_row(w + (size_t)o * lin->in, &lin->w, a, o, lin->in);
            lin->w.dtype = FT_F32;
            lin->w.data = w;
            lin->w.nbytes = (size_t)lin->out * lin->in * sizeof(float);
        }
    return FTUNE_OK;
}

ftune_status ft_merge_write(const ftune_model *m, const char *out_path, const ft_adapter *a, const ft_model_write_opts *opts) {
    /* the writer's own first check, made here too so that it still comes before the adapter's */
    if (ft_model_is_source(m, out_path))
        return ft_err(FTUNE_ERR_ARG, "%s: is where the base model is read from; write the merged model elsewhere", out_path);
    if (a && a->m != m) return ft_err(FTUNE_ERR_ARG, "%s: the adapter to merge was made for another model", out_path);
    ft_model_write_opts o = opts ? *opts : (ft_model_write_opts){ 0 };
    if (a) o.adapters = a->set;
    return ft_model_write(m, out_path, &o);
}
