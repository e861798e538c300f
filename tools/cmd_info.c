/* cmd_info.c — `ftune info`: what a model file is, or for a file that holds
 * only a tokenizer (a vocabulary-only GGUF, a tokenizer-only directory or
 * file), what its vocabulary is. */
#include <stdio.h>

#include "cli.h"

static void print_token(const ftune_tokenizer *t, const char *label, int32_t id) {
    char piece[256];
    int n = id >= 0 ? ftune_token_to_piece(t, -1, id, piece, sizeof piece) : -1;
    if (n < 0) { printf("%s none\n", label); return; }
    printf("%s %d \"", label, id);
    cli_print_piece(stdout, piece, n);
    printf("\"\n");
}

/* A file's tokenizer alone: for a vocabulary-only file (why_not NULL), or for
 * a model ftune cannot load (why_not says why; it is still an error). */
static int vocab_info(const char *path, const char *why_not) {
    ftune_tokenizer *t = NULL;
    ftune_status st = ftune_tokenizer_load(&t, path);
    if (st) return cli_fail("info", st);
    printf("file:           %s\n", path);
    if (why_not) printf("model:          cannot be loaded (see the error); its tokenizer:\n");
    else printf("format:         vocabulary only (a tokenizer, no weights)\n");
    printf("tokenizer:      %s, %d tokens\n", ftune_tokenizer_kind(t), ftune_tokenizer_n_vocab(t));
    print_token(t, "bos token:     ", ftune_tokenizer_bos(t));
    print_token(t, "eos token:     ", ftune_tokenizer_eos(t));
    printf("adds bos:       %s\n", ftune_tokenizer_add_bos(t) ? "yes" : "no");
    ftune_tokenizer_free(t);
    if (why_not) {
        fprintf(stderr, "ftune info: error: %s\n", why_not);
        return 1;
    }
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *model = NULL, *tokenizer = NULL;
    const char *pos[1];
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { 0 },
    };
    cli_cmd cmd = { "info", "-m MODEL  (or: ftune info MODEL)",
                    "Prints the architecture, parameter count, dtypes, tokenizer, context length and bytes of\n"
                    "weights of a model.", opts, pos, 1, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (!model && cmd.n_pos) model = pos[0];
    if (model && ftune_path_is_vocab_only(model)) return vocab_info(model, NULL);
    ftune_load_opts o = { .tokenizer_path = tokenizer };
    ftune_model *m = NULL;
    ftune_status st = model ? ftune_model_load(&m, model, &o) : FTUNE_OK;
    if (st == FTUNE_ERR_UNSUPPORTED) { /* an architecture (or dtype, ...) ftune cannot run: an error, but describe its tokenizer */
        char why[512];
        snprintf(why, sizeof why, "%s", ftune_last_error());
        ftune_tokenizer *t = NULL;
        if (!tokenizer && ftune_tokenizer_load(&t, model) == FTUNE_OK) {
            ftune_tokenizer_free(t);
            return vocab_info(model, why);
        }
        fprintf(stderr, "ftune info: error: %s\n", why); /* not the tokenizer's error just made */
        return 1;
    }
    if (st) return cli_fail("info", st);
    if (!m && !(m = cli_load_model("info", model, tokenizer, 0, false))) return 1;
    ftune_model_info i;
    ftune_model_get_info(m, &i);
    printf("file:           %s\n", model);
    printf("format:         %s\n", i.format);
    printf("architecture:   %s\n", i.arch);
    printf("parameters:     %lld (%.2f M)\n", (long long)i.n_params, i.n_params / 1e6);
    printf("dtypes:         %s\n", i.dtypes);
    printf("kernels:        %s (this CPU; bf16 products %s)\n", ftune_kernel_level(),
           ftune_dtype_is_native("bf16") ? "native" : "widened to f32");
    printf("amx:            %s\n", ftune_kernel_note() + 5); /* past "AMX: " */
    printf("weight bytes:   %lld (%.2f MiB)\n", (long long)i.weight_bytes, i.weight_bytes / 1048576.0);
    printf("layers:         %d\n", i.n_layers);
    printf("hidden size:    %d\n", i.dim);
    printf("ffn size:       %d\n", i.hidden_dim);
    printf("heads:          %d (key/value heads %d, head size %d)\n", i.n_heads, i.n_kv_heads, i.head_dim);
    printf("vocabulary:     %d\n", i.vocab_size);
    printf("context length: %d\n", i.context_length);
    printf("rope theta:     %g\n", i.rope_theta);
    printf("rope scaling:   %s\n", i.rope_scaling);
    printf("norm eps:       %g\n", i.norm_eps);
    printf("embeddings:     %s\n", i.tied_embeddings ? "tied (lm_head = token embedding)" : "untied");
    printf("q/k/v bias:     %s\n", i.qkv_bias ? "yes" : "no");
    printf("tokenizer:      %s, %d tokens\n", i.tokenizer[0] ? i.tokenizer : "none", i.n_vocab_tokens);
    ftune_model_free(m);
    return 0;
}
