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
#include "adapter/adapter.h"
#include "formats/bnb.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

ftune_status ft_quant_from_name(const char *name, ft_dtype *q) {
    if (name && strcmp(name, "nf4") == 0) { *q = FT_NF4; return FTUNE_OK; }
    return ft_err(FTUNE_ERR_ARG, "quantization \"%s\" is not supported (choices: nf4)", name ? name : "");
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

static ftune_status quantize_linear(ftune_model *m, ft_linear *lin) {
    const ft_tensor *src = &lin->w;
    int out = lin->out, in = lin->in;
    int64_t rb = ft_dtype_nbytes(FT_NF4, in), nbr = (in + FT_QK_NF4 - 1) / FT_QK_NF4, nb = nbr * out;
    ft_block_nf4 *q = ft_model_alloc(m, (size_t)(rb * out));
    float *row = malloc((size_t)in * sizeof(float)), *absmax = malloc((size_t)nb * sizeof(float));
    uint8_t *qa = malloc((size_t)nb);
    float *a2 = malloc((size_t)((nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK) * sizeof(float));
    ftune_status st = FTUNE_OK;
    if (!q || !row || !absmax || !qa || !a2) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory quantizing \"%s\"", src->name); goto done; }
    for (int o = 0; o < out; o++) {
        ft_tensor_row_f32(src, o, row);
        for (int j = 0; j < in; j++)
            if (!isfinite(row[j])) {
                st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": element (%d, %d) is %g: cannot be quantized", src->name, o, j,
                            (double)row[j]);
                goto done;
            }
        ft_types[FT_NF4].from_f32(row, q + (int64_t)o * nbr, in);
    }
    for (int64_t b = 0; b < nb; b++) absmax[b] = q[b].d;
    float offset = ft_bnb_double_quant(qa, a2, absmax, nb), code2[256];
    ft_bnb_dynamic_map(code2);
    ft_bnb_double_dequant(absmax, qa, a2, code2, offset, nb);
    for (int64_t b = 0; b < nb; b++) q[b].d = absmax[b];
    if (in_mapping(m, src->data, src->nbytes)) drop_pages(src->data, src->nbytes);
    m->weight_bytes += rb * out - (int64_t)src->nbytes;
    m->quant_bytes += rb * out;
    lin->w.dtype = FT_NF4;
    lin->w.data = q;
    lin->w.nbytes = (size_t)(rb * out);
done:
    free(row); free(absmax); free(qa); free(a2);
    return st;
}

ftune_status ft_model_quantize(ftune_model *m, ft_dtype q) {
    if (q != FT_NF4) return ft_err(FTUNE_ERR_ARG, "quantization to %s is not supported", ft_types[q].name);
    if (m->quantized) return ft_err(FTUNE_ERR_ARG, "the model's weights are already quantized (%s)", ft_types[m->quant].name);
    for (int l = 0; l < m->cfg.L; l++)
        for (int k = 0; k < FT_N_MODS; k++) {
            ft_linear *lin = ft_model_linear(m, l, (ft_module)k);
            if (lin->w.dtype == q) continue;
            ftune_status st = quantize_linear(m, lin);
            if (st) return st;
        }
    /* the dtypes present now: the quantized Linears', and the embedding's and head's as they were */
    m->dtype_mask = 1u << q | 1u << m->tok_embd.dtype | 1u << m->lm_head.w.dtype;
    m->quantized = true;
    m->quant = q;
    return FTUNE_OK;
}
