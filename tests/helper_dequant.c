/* helper_dequant.c — the ftune side of tests/cli_gguf_dequant.sh: every
 * tensor of a GGUF file dequantized by the dtype traits' reference to_f32
 * (core/dtype.c, dtype_ggml.c), streamed to stdout as raw little-endian f32
 * in the file's tensor order, one row (ne[0] elements) at a time, for
 * scripts/gguf_dequant.py to compare with gguf-py's gguf.quants.dequantize.
 *
 *   helper_dequant FILE.gguf > OUT
 *       writes numel floats for each tensor whose type ftune computes with,
 *       nothing for the others (the script knows which from the type list
 *       this prints on stderr: "name type computed|skipped" per tensor).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "formats/gguf.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: helper_dequant FILE.gguf > OUT\n");
        return 2;
    }
    gguf_file g;
    ftune_status st = ft_gguf_open(&g, argv[1]);
    if (st) {
        fprintf(stderr, "helper_dequant: %s\n", ftune_last_error());
        return 1;
    }
    int rc = 0;
    float *row = NULL;
    for (uint64_t i = 0; i < g.n_tensors && !rc; i++) {
        const gguf_tensor_info *ti = &g.tensors[i];
        bool computed = ft_dtype_is_weight(ti->dtype);
        fprintf(stderr, "%.*s %s %s\n", (int)ti->name.len, ti->name.ptr, ft_types[ti->dtype].name,
                computed ? "computed" : "skipped");
        if (!computed) continue;
        int64_t cols = (int64_t)ti->ne[0], rows = (int64_t)(ti->nbytes / (uint64_t)ft_dtype_nbytes(ti->dtype, cols));
        float *r = realloc(row, (size_t)cols * sizeof(float));
        if (!r) { rc = 1; break; }
        row = r;
        size_t rb = (size_t)ft_dtype_nbytes(ti->dtype, cols);
        for (int64_t k = 0; k < rows; k++) {
            ft_types[ti->dtype].to_f32(ti->data + (size_t)k * rb, row, cols);
            if (fwrite(row, sizeof(float), (size_t)cols, stdout) != (size_t)cols) { rc = 1; break; }
        }
    }
    free(row);
    ft_gguf_close(&g);
    if (fflush(stdout)) rc = 1;
    return rc;
}
