/* fuzz_tokenizer_json.c — libFuzzer target: the tokenizer.json loader on
 * arbitrary bytes, then, for what it accepted, encoding and decoding a few
 * texts (the input's own tail among them), so that a tokenizer built from a
 * hostile file is exercised, not just constructed. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ftune_tokenizer *t = NULL;
    if (ft_tokenizer_from_hf_json(&t, (const char *)data, size, "fuzz/tokenizer.json") != FTUNE_OK) {
        if (t) __builtin_trap(); /* a failed load leaves nothing behind */
        return 0;
    }
    const char *texts[] = { "Hello world! 123 <s></s> \xe2\x96\x81x\n\n  \xe4\xbd\xa0\xe5\xa5\xbd",
                            size > 64 ? (const char *)data + size - 64 : "" };
    size_t lens[] = { strlen(texts[0]), size > 64 ? 64 : 0 };
    char piece[1024];
    for (int k = 0; k < 2; k++)
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n = 0;
            /* invalid UTF-8 in the tail is an error, which is fine */
            if (ftune_tokenize(t, texts[k], lens[k], 1, special, &ids, &n) == FTUNE_OK)
                for (size_t i = 0; i < n; i++) {
                    if (ids[i] < 0 || ids[i] >= ftune_tokenizer_n_vocab(t)) __builtin_trap();
                    int m = ftune_token_to_piece(t, i ? ids[i - 1] : -1, ids[i], piece, sizeof piece);
                    if (m > (int)sizeof piece) __builtin_trap();
                }
            free(ids);
        }
    for (int32_t id = 0; id < ftune_tokenizer_n_vocab(t) && id < 512; id++)
        (void)ftune_token_to_piece(t, -1, id, piece, sizeof piece);
    ft_tokenizer_free(t);
    return 0;
}
