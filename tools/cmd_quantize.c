/* cmd_quantize.c — `ftune quantize`: writes a model quantized, as a Hugging
 * Face bitsandbytes checkpoint (nf4 with double quantization, or int8) or as a
 * GGUF file of the types `ftune merge` writes (q8_0, q4_0), through the
 * public API only. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_quantize(int argc, char **argv) {
    const char *type = NULL, *tokenizer = NULL;
    cli_opt opts[] = {
        { NULL, "--type", OPT_STR, &type, "TYPE",
          "nf4: a Hugging Face *-bnb-4bit directory (bitsandbytes NF4 with double quantization, as transformers saves "
          "it); int8: a bitsandbytes 8-bit directory (LLM.int8 row-wise); q8_0, q4_0: a .gguf file (as ftune merge "
          "--dtype)" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { 0 },
    };
    const char *pos[2] = { NULL, NULL };
    cli_cmd cmd = { "quantize", "--type TYPE MODEL OUT",
                    "Quantizes MODEL (a Hugging Face directory, .gguf or llama2.c .bin) into OUT. With nf4, every\n"
                    "layer Linear is quantized exactly as bitsandbytes' quantize_4bit (blocks of 64 of the\n"
                    "flattened weight, the last one padded; absmax double-quantized in blocks of 256); the\n"
                    "embedding, LM head and norms are kept as stored, as transformers does. OUT is a directory\n"
                    "that transformers, vLLM and ftune load. int8 writes bitsandbytes' 8-bit layout (weight int8,\n"
                    "SCB: each row's absmax, weight_format). q8_0 and q4_0 write OUT as GGUF (OUT must end in .gguf).",
                    opts, pos, 2, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (cmd.n_pos != 2) {
        fprintf(stderr, "ftune quantize: expected MODEL and OUT\n(see ftune quantize --help)\n");
        return 2;
    }
    if (!type) {
        fprintf(stderr, "ftune quantize: --type is required (nf4, int8, q8_0, q4_0)\n");
        return 2;
    }
    bool gguf_type = strcmp(type, "q8_0") == 0 || strcmp(type, "q4_0") == 0;
    if (strcmp(type, "nf4") != 0 && strcmp(type, "int8") != 0 && !gguf_type) {
        fprintf(stderr, "ftune quantize: --type %s is not supported (nf4, int8, q8_0, q4_0)\n", type);
        return 2;
    }
    size_t len = strlen(pos[1]);
    bool to_gguf = len > 5 && strcmp(pos[1] + len - 5, ".gguf") == 0;
    if (gguf_type != to_gguf) {
        fprintf(stderr, "ftune quantize: --type %s writes %s; OUT %s\n", type,
                gguf_type ? "a .gguf file" : "a Hugging Face directory", gguf_type ? "must end in .gguf" : "must not end in .gguf");
        return 2;
    }
    ftune_model *m = cli_load_model("quantize", pos[0], tokenizer, 0, false);
    if (!m) return 1;
    ftune_status st;
    if (gguf_type) {
        ftune_merge_opts mo = { .dtype = type };
        char summary[1024] = "";
        st = ftune_model_merge(m, pos[1], &mo, summary, sizeof summary);
        if (!st && summary[0]) fprintf(stderr, "%s\n", summary);
    } else {
        st = ftune_model_save_bnb(m, pos[1], type);
    }
    int rc = st ? cli_fail("quantize", st) : 0;
    if (!st) fprintf(stderr, "wrote %s\n", pos[1]);
    ftune_model_free(m);
    return rc;
}
