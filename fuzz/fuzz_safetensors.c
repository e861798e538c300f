/* fuzz_safetensors.c — libFuzzer target: st_parse on arbitrary bytes, then
 * the accessors, touching the first and last byte of each tensor so that an
 * out-of-range pointer shows up under AddressSanitizer. */
#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    if (ft_st_parse(&f, "fuzz.safetensors", data, size) != FTUNE_OK) return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < f.n; i++) {
        const st_tensor *t = &f.tensors[i];
        if (t->end > t->begin) sink ^= t->data[0] ^ t->data[t->end - t->begin - 1];
        if (ft_st_find(&f, t->name) != t) __builtin_trap(); /* names are unique */
        if (t->dtype < FT_NTYPES) {
            int64_t n = 1;
            for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
            if ((uint64_t)ft_dtype_nbytes(t->dtype, n) != t->end - t->begin) __builtin_trap();
        }
    }
    for (int i = 0; i < f.n_meta; i++)
        if (ft_st_meta(&f, f.meta_keys[i]) == NULL) __builtin_trap();
    (void)sink;
    ft_st_close(&f);
    return 0;
}
