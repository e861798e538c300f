/* model_quant.c — quantizing a loaded model's frozen base weights on load
 * (`--quant nf4`): each layer Linear's weight, read row by row from the
 * file mapping, becomes owned NF4 rows (ft_block_nf4, a padded last block
 * when the row is not a multiple of 64), then the tensor's block absmax
 * values are double-quantized as bitsandbytes does and each block keeps the
 * value its dequantization gives. For (out, in) with in % 64 == 0 the
 * blocks are bitsandbytes' blocks of the flattened tensor, so the weights
 * are bit for bit bitsandbytes'; otherwise ft's blocks are per row (the
 * kernels need rows of whole blocks) where bitsandbytes' would cross rows. */
#include "model/model.h"
#include "formats/bnb.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

ftune_status ft_quant_from_name(const char *name, ft_dtype *q) {
    ft_dtype t = ft_dtype_by_name(name);
    if (t == FT_NF4 || t == FT_I8ROW) { *q = t; return FTUNE_OK; }
    return ft_err(FTUNE_ERR_ARG, "quantization \"%s\" is not supported (choices: nf4, int8)", name ? name : "");
}

/* Whether [p, p+n) lies in one of the model's read-only file mappings. */
static bool in_mapping(const ftune_model *m, const void *p, size_t n) {
    const uint8_t *a = p;
    const ft_mmap *maps[66];
    int k = 0;
    for (int i = 0; i < m->n_shards && k < 64; i++) maps[k++] = &m->shards[i].map;
    if (m->gguf) maps[k++] = &m->gguf->map;
    maps[k++] = &m->bin;
    for (int i = 0; i < k; i++)
        if (maps[i]->data && a >= maps[i]->data && a + n <= maps[i]->data + maps[i]->size) return true;
    return false;
}

/* Drops the whole pages of a mapped range from this process (they are
 * read back from the file if touched again). */
static void drop_pages(const void *p, size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg, b = ((uintptr_t)p + n) / pg * pg;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Lin's weight as rows of q (nf4: then its absmax double-quantized). */
static FTUNE_MUST_USE ftune_status quantize_linear(ftune_model *m, ft_linear *lin, ft_dtype qt) {
    const ft_tensor *src = &lin->w;
    int out = lin->out, in = lin->in;
    int64_t rb = ft_dtype_nbytes(qt, in), nbr = (in + FT_QK_NF4 - 1) / FT_QK_NF4, nb = nbr * out;
    uint8_t *q = ft_model_alloc(m, ft_held_bytes(qt, out, in));
    float *row = malloc((size_t)in * sizeof(float)), *absmax = NULL, *a2 = NULL;
    uint8_t *qa = NULL;
    ftune_status st = FTUNE_OK;
    if (!q || !row) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory quantizing \"%s\"", src->name); goto done; }
    for (int o = 0; o < out; o++) {
        ft_tensor_row_f32(src, o, row);
        for (int j = 0; j < in; j++)
            if (!isfinite(row[j])) {
                st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": element (%d, %d) is %g: cannot be quantized", src->name, o, j,
                            (double)row[j]);
                goto done;
            }
        ft_types[qt].from_f32(row, q + rb * o, in);
    }
    if (qt == FT_NF4) {
        ft_block_nf4 *b = (ft_block_nf4 *)q;
        absmax = malloc((size_t)nb * sizeof(float));
        qa = malloc((size_t)nb);
        a2 = malloc((size_t)((nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK) * sizeof(float));
        if (!absmax || !qa || !a2) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory quantizing \"%s\"", src->name); goto done; }
        for (int64_t i = 0; i < nb; i++) absmax[i] = b[i].d;
        float offset = ft_bnb_double_quant(qa, a2, absmax, nb), code2[256];
        ft_bnb_dynamic_map(code2);
        ft_bnb_double_dequant(absmax, qa, a2, code2, offset, nb);
        for (int64_t i = 0; i < nb; i++) b[i].d = absmax[i];
    }
    if (in_mapping(m, src->data, src->nbytes)) drop_pages(src->data, src->nbytes);
    m->weight_bytes += rb * out - (int64_t)src->nbytes;
    m->quant_bytes += rb * out;
    lin->w.dtype = qt;
    lin->w.data = q;
    lin->w.nbytes = (size_t)(rb * out);
done:
    free(row); free(absmax); free(qa); free(a2);
    return st;
}

ftune_status ft_model_quantize(ftune_model *m, ft_dtype q) {
    if (q != FT_NF4 && q != FT_I8ROW) return ft_err(FTUNE_ERR_ARG, "quantization to %s is not supported", ft_types[q].name);
    if (m->quantized) return ft_err(FTUNE_ERR_ARG, "the model's weights are already quantized (%s)", ft_types[m->quant].name);
    /* A block-quantized GGUF (q8_0, q4_0, the K-quants): quantizing would
     * dequantize and quantize again, two roundings where the file has one.
     * Checked on every Linear before any is converted. */
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_dtype t = ft_model_linear(m, l, (ft_module)k)->w.dtype;
            if (t != FT_F32 && t != FT_F16 && t != FT_BF16 && t != q)
                return ft_err(FTUNE_ERR_ARG, "the model's weights are already quantized (%s, as the file stores "
                              "blk.%d.%s.weight): --quant does not apply, it would dequantize them and quantize them "
                              "again; leave --quant out to use them as stored (LoRA trains over them as QLoRA does)",
                              ft_types[t].name, l, ft_module_gguf_name((ft_module)k));
        }
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_linear *lin = ft_model_linear(m, l, (ft_module)k);
            if (lin->w.dtype == q) continue;
            ftune_status st = quantize_linear(m, lin, q);
            if (st) return st;
        }
    /* the dtypes present now: the quantized Linears', and the embedding's and head's as they were */
    m->dtype_mask = 1ull << q | 1ull << m->tok_embd.dtype | 1ull << m->lm_head.w.dtype;
    m->quantized = true;
    m->quant = q;
    return FTUNE_OK;
}

/* ------------------------------------------------ writing bnb-4bit */

/* torch's name of a weight dtype, for the quant state's "dtype" */
static const char *torch_dtype(ft_dtype t) {
    return t == FT_BF16 ? "bfloat16" : t == FT_F16 ? "float16" : "float32";
}

/* One Linear's serialized parts, owned until the file is written. */
typedef struct {
    uint8_t *packed, *qa;     /* nf4; int8: packed holds the (out, in) int8 */
    float *a2;                /* nf4: the nested absmax; int8: SCB, the rows' absmax */
    char *json;
    char names[6][FT_NAME_MAX + 48];
} bnb_parts;

/* bitsandbytes' 8-bit layout of one (out, in) weight: int8 codes and the
 * rows' absmax (SCB), from the f32 rows of the traits' int8 quantizer */
static FTUNE_MUST_USE ftune_status quantize_parts8(bnb_parts *p, const st_tensor *t) {
    int64_t out = t->shape[0], in = t->shape[1];
    size_t rb = (size_t)ft_dtype_nbytes(FT_I8ROW, in);
    float *x = malloc((size_t)in * sizeof(float));
    uint8_t *row = malloc(rb);
    p->packed = malloc((size_t)(out * in));
    p->a2 = malloc((size_t)out * sizeof(float));
    ftune_status st = FTUNE_OK;
    if (!x || !row || !p->packed || !p->a2) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory quantizing \"%s\"", t->name); goto done; }
    size_t esz = ft_types[t->dtype].block_bytes;
    for (int64_t o = 0; o < out; o++) {
        ft_types[t->dtype].to_f32(t->data + (size_t)(o * in) * esz, x, in);
        for (int64_t j = 0; j < in; j++)
            if (!isfinite(x[j])) {
                st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": element (%lld, %lld) is %g: cannot be quantized", t->name,
                            (long long)o, (long long)j, (double)x[j]);
                goto done;
            }
        ft_types[FT_I8ROW].from_f32(x, row, in);
        memcpy(&p->a2[o], row, 4);
        memcpy(p->packed + o * in, row + 4, (size_t)in);
    }
done:
    free(x);
    free(row);
    return st;
}

static FTUNE_MUST_USE ftune_status quantize_parts(bnb_parts *p, const st_tensor *t, int64_t *nb_out) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    int64_t nb = (n + FT_BNB_BLOCK - 1) / FT_BNB_BLOCK, nb2 = (nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK;
    float *x = malloc((size_t)n * sizeof(float)), *absmax = malloc((size_t)nb * sizeof(float));
    p->packed = malloc((size_t)(n + 1) / 2);
    p->qa = malloc((size_t)nb);
    p->a2 = malloc((size_t)nb2 * sizeof(float));
    ftune_status st = FTUNE_OK;
    if (!x || !absmax || !p->packed || !p->qa || !p->a2) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory quantizing \"%s\"", t->name); goto done; }
    ft_types[t->dtype].to_f32(t->data, x, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": element %lld is %g: cannot be quantized", t->name, (long long)i,
                        (double)x[i]);
            goto done;
        }
    ft_bnb_quantize_nf4(p->packed, absmax, x, n);
    float offset = ft_bnb_double_quant(p->qa, p->a2, absmax, nb);
    char buf[512];
    snprintf(buf, sizeof buf, "{\"quant_type\": \"nf4\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%lld, %lld], "
             "\"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %.17g}", FT_BNB_BLOCK,
             torch_dtype(t->dtype), (long long)t->shape[0], (long long)t->shape[1], FT_BNB_NESTED_BLOCK, (double)offset);
    p->json = ft_strdup(buf);
    if (!p->json) st = ft_err(FTUNE_ERR_NOMEM, "out of memory");
    *nb_out = nb;
done:
    free(x);
    free(absmax);
    return st;
}

/* Whether name is a layer Linear's weight of the model's config. */
static bool is_linear_weight(const ftune_model *m, const char *name) {
    char want[FT_NAME_MAX];
    int l;
    if (sscanf(name, "model.layers.%d.", &l) != 1 || l < 0 || l >= m->cfg.L) return false;
    for (int k = 0; k < FT_N_MODS; k++) {
        snprintf(want, sizeof want, "model.layers.%d.%s.weight", l, ft_module_path((ft_module)k));
        if (strcmp(name, want) == 0) return true;
    }
    return false;
}

static FTUNE_MUST_USE ftune_status add_quant_config(const char *dir, bool int8) {
    char path[4200], *text;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ftune_status st = ft_read_file(path, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return ft_err(FTUNE_ERR_FORMAT, "%s: not a JSON object", path); }
    cJSON_DeleteItemFromObjectCaseSensitive(j, "quantization_config");
    /* transformers' BitsAndBytesConfig.to_dict() for load_in_4bit, nf4,
     * double quantization; or load_in_8bit */
    cJSON *q = cJSON_AddObjectToObject(j, "quantization_config");
    cJSON_AddBoolToObject(q, "_load_in_4bit", !int8);
    cJSON_AddBoolToObject(q, "_load_in_8bit", int8);
    cJSON_AddStringToObject(q, "bnb_4bit_compute_dtype", "float32");
    cJSON_AddStringToObject(q, "bnb_4bit_quant_storage", "uint8");
    cJSON_AddStringToObject(q, "bnb_4bit_quant_type", "nf4");
    cJSON_AddBoolToObject(q, "bnb_4bit_use_double_quant", 1);
    cJSON_AddBoolToObject(q, "llm_int8_enable_fp32_cpu_offload", 0);
    cJSON_AddBoolToObject(q, "llm_int8_has_fp16_weight", 0);
    cJSON_AddNullToObject(q, "llm_int8_skip_modules");
    /* a float, as transformers writes it: cJSON prints 6.0 as 6, and
     * BitsAndBytesConfig raises TypeError on an int threshold */
    cJSON_AddRawToObject(q, "llm_int8_threshold", "6.0");
    cJSON_AddBoolToObject(q, "load_in_4bit", !int8);
    cJSON_AddBoolToObject(q, "load_in_8bit", int8);
    cJSON_AddStringToObject(q, "quant_method", "bitsandbytes");
    st = ft_write_json_atomic(path, j);
    cJSON_Delete(j);
    return st;
}

ftune_status ftune_model_save_bnb(const ftune_model *m, const char *dir, const char *type) {
    if (!m || !dir) return ft_err(FTUNE_ERR_ARG, "ftune_model_save_bnb: no model or directory");
    ft_dtype bt = ft_dtype_by_name(type);
    if (bt != FT_NF4 && bt != FT_I8ROW) {
        if (ft_model_gguf_type_known(type))
            return ft_err(FTUNE_ERR_ARG, "%s: \"%s\" is a GGUF type: write the output as a .gguf file", dir, type);
        return ft_err(FTUNE_ERR_ARG, "%s: type \"%s\" is not supported (bitsandbytes: %s, %s; GGUF: an output ending in "
                      ".gguf)", dir, type ? type : "", ft_types[FT_NF4].name, ft_types[FT_I8ROW].name);
    }
    bool int8 = bt == FT_I8ROW;
    if (m->quantized)
        return ft_err(FTUNE_ERR_ARG, "%s: the model is already quantized (%s): write it dequantized with `ftune merge` "
                      "first", dir, ft_types[m->quant].name);
    /* the model in Hugging Face layout (names, q/k rows, config, tokenizer),
     * each weight in its own dtype (f32 where it has no safetensors form),
     * written into a staging directory that becomes dir only once quantized */
    char staged[4200];
    ftune_status st = ft_dir_stage(dir, staged, sizeof staged);
    if (st) return st;
    if ((st = ft_model_write(m, staged, NULL))) {
        ft_dir_abort(staged);
        return st;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", staged);
    st_file f;
    if ((st = ft_st_open(&f, path))) {
        ft_dir_abort(staged);
        return ft_err_prefix(st, "%s", dir);
    }
    int n_out = 0, n_lin = 0;
    for (int i = 0; i < f.n; i++) n_lin += is_linear_weight(m, f.tensors[i].name);
    st_out_tensor *ts = ft_calloc((size_t)(f.n + 5 * n_lin), sizeof *ts);
    bnb_parts *parts = ft_calloc((size_t)n_lin + 1, sizeof *parts);
    float code2[256];
    ft_bnb_dynamic_map(code2);
    if (!ts || !parts) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    /* one tensor at a time from the mapping: only the quantized parts stay */
    for (int i = 0, p = 0; i < f.n; i++) {
        const st_tensor *t = &f.tensors[i];
        if (!is_linear_weight(m, t->name)) {
            ts[n_out++] = (st_out_tensor){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data };
            memcpy(ts[n_out - 1].shape, t->shape, sizeof t->shape);
            continue;
        }
        bnb_parts *bp = &parts[p++];
        int64_t nb = 0, n = t->shape[0] * t->shape[1];
        if (int8) {
            if ((st = quantize_parts8(bp, t))) goto done;
            size_t len = strlen(t->name) - 7; /* without ".weight" */
            snprintf(bp->names[0], sizeof bp->names[0], "%s", t->name);
            snprintf(bp->names[1], sizeof bp->names[1], "%.*s.SCB", (int)len, t->name);
            snprintf(bp->names[2], sizeof bp->names[2], "%.*s.weight_format", (int)len, t->name);
            static const uint8_t row_major = 0;
            ts[n_out++] = (st_out_tensor){ .name = bp->names[0], .dtype = FT_I8, .ndim = 2, .shape = { t->shape[0], t->shape[1] },
                                           .data = bp->packed };
            ts[n_out++] = (st_out_tensor){ .name = bp->names[1], .dtype = FT_F32, .ndim = 1, .shape = { t->shape[0] }, .data = bp->a2 };
            ts[n_out++] = (st_out_tensor){ .name = bp->names[2], .dtype = FT_U8, .ndim = 0, .data = &row_major };
            drop_pages(t->data, (size_t)(t->end - t->begin));
            continue;
        }
        if ((st = quantize_parts(bp, t, &nb))) goto done;
        static const char *const sfx[6] = { "", ".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                            ".quant_state.bitsandbytes__nf4" };
        for (int s = 0; s < 6; s++) snprintf(bp->names[s], sizeof bp->names[s], "%s%s", t->name, sfx[s]);
        ts[n_out++] = (st_out_tensor){ .name = bp->names[0], .dtype = FT_U8, .ndim = 2, .shape = { (n + 1) / 2, 1 }, .data = bp->packed };
        ts[n_out++] = (st_out_tensor){ .name = bp->names[1], .dtype = FT_U8, .ndim = 1, .shape = { nb }, .data = bp->qa };
        ts[n_out++] = (st_out_tensor){ .name = bp->names[2], .dtype = FT_F32, .ndim = 1, .shape = { 16 }, .data = ft_nf4_code };
        ts[n_out++] = (st_out_tensor){ .name = bp->names[3], .dtype = FT_F32, .ndim = 1,
                                       .shape = { (nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK }, .data = bp->a2 };
        ts[n_out++] = (st_out_tensor){ .name = bp->names[4], .dtype = FT_F32, .ndim = 1, .shape = { 256 }, .data = code2 };
        ts[n_out++] = (st_out_tensor){ .name = bp->names[5], .dtype = FT_U8, .ndim = 1,
                                       .shape = { (int64_t)strlen(bp->json) }, .data = bp->json };
        drop_pages(t->data, (size_t)(t->end - t->begin));
    }
    /* written beside, then renamed over the unquantized file (whose mapping stays valid until closed) */
    if ((st = ft_st_write(path, ts, n_out, NULL))) goto done;
    if ((st = add_quant_config(staged, int8))) goto done;
    ft_st_close(&f); /* its mapping of the replaced file, before the directory moves */
    st = ft_dir_commit(staged, dir);
done:
    for (int p = 0; parts && p < n_lin; p++) {
        free(parts[p].packed); free(parts[p].qa); free(parts[p].a2); free(parts[p].json);
    }
    free(parts);
    free(ts);
    ft_st_close(&f);
    if (st) ft_dir_abort(staged);
    return st ? ft_err_prefix(st, "%s", dir) : st;
}
