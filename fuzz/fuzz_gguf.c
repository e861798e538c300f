/* fuzz_gguf.c — libFuzzer target: gguf_parse on arbitrary bytes, then every
 * accessor on what it accepted, touching the first and last byte of each
 * tensor so that an out-of-range pointer shows up under AddressSanitizer. */
#include "formats/gguf.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file g;
    if (ft_gguf_parse(&g, "fuzz.gguf", data, size) != FTUNE_OK) return 0;
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const gguf_kv *kv = &g.kv[i];
        char *k = ft_gguf_str_dup(kv->key);
        if (!k) break;
        int64_t iv;
        double dv;
        bool bv;
        gguf_str s;
        (void)ft_gguf_get_i64(&g, k, &iv);
        (void)ft_gguf_get_f64(&g, k, &dv);
        (void)ft_gguf_get_bool(&g, k, &bv);
        if (ft_gguf_get_str(&g, k, &s) && s.len) sink ^= (uint8_t)s.ptr[s.len - 1];
        gguf_str_array a;
        if (ft_gguf_get_str_array(&g, k, &a) == FTUNE_OK) {
            for (uint64_t j = 0; j < a.n; j++)
                if (a.items[j].len) sink ^= (uint8_t)a.items[j].ptr[a.items[j].len - 1];
            free(a.items);
        }
        free(k);
    }
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const gguf_tensor_info *t = &g.tensors[i];
        if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
        char *n = ft_gguf_str_dup(t->name);
        if (n && ft_gguf_find_tensor(&g, n) != t) __builtin_trap(); /* names are unique */
        free(n);
    }
    (void)sink;
    ft_gguf_close(&g);
    return 0;
}
