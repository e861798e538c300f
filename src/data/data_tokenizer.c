/* data_tokenizer.c — plugs an ftune_tokenizer into the data pipeline's
 * tokenize hook (kept apart from data.c so the pipeline links without a
 * tokenizer, e.g. in tests that bring their own), and tokenizes a
 * conversation for a model through its chat template (ftune_chat_tokenize). */
#include "data/data.h"
#include "tokenizer/tokenizer.h"

#include <stdlib.h>

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

ftune_status ft_chat_format_of(const ftune_tokenizer *t, ft_chat_template *kind, char **default_system) {
    const char *jinja = ft_tokenizer_chat_template(t);
    *kind = ft_chat_template_detect(jinja);
    return ft_chat_default_system(jinja, default_system);
}

ftune_status ftune_chat_tokenize(const ftune_model *m, const char *template_name, const ftune_chat_msg *msgs, int n,
                                 int add_generation_prompt, int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return ft_err(FTUNE_ERR_ARG, "ftune_chat_tokenize: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (!m || (!msgs && n > 0)) return ft_err(FTUNE_ERR_ARG, "ftune_chat_tokenize: NULL argument");
    const ftune_tokenizer *tok = ftune_model_tokenizer(m);
    ft_chat_template t = FT_CHAT_NONE;
    char *sys = NULL; /* the default system message of the model's own template */
    if (template_name) {
        ftune_status st = ft_chat_template_from_name(&t, template_name);
        if (st) return st;
    } else {
        ftune_status st = ft_chat_format_of(tok, &t, &sys);
        if (st) return st;
        if (t == FT_CHAT_NONE)
            return ft_err(FTUNE_ERR_ARG,
                          ft_tokenizer_chat_template(tok)
                              ? "the model's chat template is none that ftune renders: name one (chatml, llama2, llama3, mistral, zephyr, alpaca)"
                              : "the model's files carry no chat template: name one (chatml, llama2, llama3, mistral, zephyr, alpaca)");
    }
    ft_chat_msg *mm = malloc((size_t)(n > 0 ? n : 1) * sizeof *mm);
    if (!mm) { free(sys); return ft_err(FTUNE_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < n; i++) {
        if (msgs[i].role < FTUNE_ROLE_SYSTEM || msgs[i].role > FTUNE_ROLE_ASSISTANT) {
            free(mm);
            free(sys);
            return ft_err(FTUNE_ERR_ARG, "message %d: bad role %d", i, (int)msgs[i].role);
        }
        mm[i].role = msgs[i].role == FTUNE_ROLE_SYSTEM ? FT_ROLE_SYSTEM
                     : msgs[i].role == FTUNE_ROLE_USER ? FT_ROLE_USER : FT_ROLE_ASSISTANT;
        mm[i].content = msgs[i].content;
    }
    ft_data_tokenizer dt;
    ft_data_tokenizer_init(&dt, tok);
    uint8_t *mask = NULL;
    ftune_status st = ft_chat_tokenize(&dt, t, sys, mm, n, add_generation_prompt != 0, ids, &mask, n_ids);
    free(mask);
    free(mm);
    free(sys);
    return st;
}
