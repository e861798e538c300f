/* fuzz_data.c — libFuzzer target: the dataset readers (JSONL, JSON array,
 * plain text; text, prompt-completion, Alpaca and chat records under every
 * chat template) with a byte tokenizer, then one epoch of batches. The first
 * input byte picks the options; the checks are the pipeline's invariants:
 * every example fits the context and has a target, batches stay in bounds. */
#include "data/data.h"

#include <stdlib.h>
#include <string.h>

/* One id per byte (ids 3..258); 1 and 2 are BOS and EOS. */
static ftune_status byte_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    (void)ctx;
    int32_t *out = malloc((len ? len : 1) * sizeof *out);
    if (!out) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) out[i] = 3 + (unsigned char)text[i];
    *ids = out;
    *n_ids = len;
    return FTUNE_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t k = data[0];
    ft_data_tokenizer tk = { .tokenize = byte_tokenize, .bos_id = 1, .eos_id = 2, .add_bos = k & 1 };
    ft_dataset_opts o;
    ft_dataset_opts_default(&o);
    o.format = (ft_data_format)((k >> 1) % (FT_FMT_PLAIN + 1));
    o.chat_template = (ft_chat_template)(1 + (k >> 4) % (FT_CHAT_COUNT - 1));
    o.ctx_len = 2 + (k >> 3) % 61;
    o.truncate = (k & 0x40) ? FT_TRUNC_PROMPT : FT_TRUNC_END;
    o.drop_long = (k & 0xC0) == 0xC0;
    o.train_on_prompt = (k & 0x22) == 0x22;
    if (k & 0x80) { o.prompt_key = "question"; o.completion_key = "answer"; }
    ft_dataset *ds = NULL;
    const char *name = (k & 6) == 6 ? "fuzz.txt" : "fuzz.jsonl";
    if (ft_dataset_load_buffer(&ds, name, (const char *)data + 1, size - 1, &tk, &o) != FTUNE_OK) return 0;
    if (ds->n < 1 || ds->off[0] != 0) __builtin_trap();
    for (int i = 0; i < ds->n; i++) {
        int n = ft_dataset_len(ds, i);
        if (n < 2 || n > o.ctx_len) __builtin_trap();
        int targets = 0;
        for (int t = 1; t < n; t++) targets += ds->mask[ds->off[i] + t];
        if (targets == 0) __builtin_trap();
        for (int t = 0; t < n; t++)
            if (ds->tokens[ds->off[i] + t] < 1 || ds->tokens[ds->off[i] + t] > 258) __builtin_trap();
    }
    ft_batch_opts bo = { .B = 1 + k % 3, .T = o.ctx_len, .pack = k & 8, .shuffle = k & 16, .seed = k, .pad_id = 0 };
    ft_batch_iter *it = NULL;
    ft_batch b = { 0 };
    int64_t nb = 0;
    if (ft_batch_iter_new(&it, ds, &bo) == FTUNE_OK && ft_batch_init(&b, bo.B, bo.T) == FTUNE_OK &&
        ft_batch_iter_epoch_batches(it, 0, &nb) == FTUNE_OK) {
        for (int64_t i = 0; i < nb; i++) {
            if (ft_batch_iter_next(it, &b) != FTUNE_OK) __builtin_trap();
            if (b.B < 1 || b.B > bo.B || b.T < 1 || b.T > bo.T) __builtin_trap();
        }
    }
    ft_batch_free(&b);
    ft_batch_iter_free(it);
    ft_dataset_free(ds);
    return 0;
}
