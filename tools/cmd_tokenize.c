/* cmd_tokenize.c — `ftune tokenize`: token ids of stdin, space-separated.
 * Only the tokenizer is loaded (so vocabulary-only GGUFs, tokenizer-only
 * directories and architectures ftune cannot run all work), except for a
 * llama2.c checkpoint, whose tokenizer is found beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL;
    bool no_bos = false, special = false, pieces = false;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "Hugging Face or tokenizer-only directory, .gguf (a vocabulary-only "
          "one too), tokenizer.json, tokenizer.model, or llama2.c .bin" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model), or any "
          "tokenizer file when -m is not given" },
        { NULL, "--no-bos", OPT_FLAG, &no_bos, "", "do not prepend the BOS token" },
        { NULL, "--parse-special", OPT_FLAG, &special, "", "turn special-token text (e.g. <|eot_id|>) into special tokens" },
        { NULL, "--pieces", OPT_FLAG, &pieces, "", "print id:piece pairs, one per line" },
        { 0 },
    };
    cli_cmd cmd = { "tokenize", "-m MODEL|--tokenizer FILE [--no-bos] < FILE",
                    "Reads UTF-8 text on stdin and prints its token ids on one line.", opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap);
    for (size_t k; text && (k = fread(text + n, 1, cap - n, stdin)) > 0;) {
        n += k;
        if (n == cap) {
            char *t2 = realloc(text, cap *= 2);
            if (!t2) { free(text); text = NULL; }
            text = t2;
        }
    }
    if (!text) { fprintf(stderr, "ftune tokenize: error: out of memory\n"); return 1; }
    /* a llama2.c checkpoint (any other file than these) needs the model loader */
    size_t ml = model ? strlen(model) : 0;
    bool llama2c = model && ml >= 4 && strcmp(model + ml - 4, ".bin") == 0 && !ftune_path_is_vocab_only(model);
    ftune_model *m = NULL;
    ftune_tokenizer *own = NULL;
    const ftune_tokenizer *tok;
    if (llama2c || (!model && !tokenizer)) {
        if (!(m = cli_load_model("tokenize", model, tokenizer, 0, true))) { free(text); return 1; }
        tok = ftune_model_tokenizer(m);
    } else {
        ftune_status st = ftune_tokenizer_load(&own, model ? model : tokenizer);
        if (st) { free(text); return cli_fail("tokenize", st); }
        tok = own;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = 0;
    ftune_status st = ftune_tokenize(tok, text, n, !no_bos && ftune_tokenizer_add_bos(tok), special, &ids, &n_ids);
    if (st) rc = cli_fail("tokenize", st);
    else if (pieces) {
        char piece[256];
        for (size_t i = 0; i < n_ids; i++) {
            int k = ftune_token_to_piece(tok, i ? ids[i - 1] : -1, ids[i], piece, sizeof piece);
            printf("%d:%.*s\n", ids[i], k > 0 ? k : 0, piece);
        }
    } else {
        for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    }
    free(ids);
    free(text);
    ftune_model_free(m);
    ftune_tokenizer_free(own);
    return rc;
}
