/* data_tokenizer.c — plugs an ftune_tokenizer into the data pipeline's
 * tokenize hook (kept apart from data.c so the pipeline links without a
 * tokenizer, e.g. in tests that bring their own). */
#include "data/data.h"

static FTUNE_MUST_USE ftune_status tokenize_cb(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    return ftune_tokenize((const ftune_tokenizer *)ctx, text, len, 0, 1, ids, n_ids);
}

void ft_data_tokenizer_init(ft_data_tokenizer *dt, const ftune_tokenizer *t) {
    dt->tokenize = tokenize_cb;
    dt->ctx = (void *)t;
    dt->bos_id = ftune_tokenizer_bos(t);
    dt->eos_id = ftune_tokenizer_eos(t);
    dt->add_bos = ftune_tokenizer_add_bos(t) && dt->bos_id >= 0;
}
