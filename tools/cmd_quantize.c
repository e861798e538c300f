/* cmd_quantize.c — `ftune quantize`: writes a model quantized, as a Hugging
 * Face bitsandbytes checkpoint (nf4 with double quantization, or int8) or as a
 * GGUF file of the types and mixes `ftune merge` writes (q4_k_m, q6_K, q8_0,
 * ...), through the public API only: OUT's name says which, and the library
 * parses the type. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_quantize(int argc, char **argv) {
    const char *type = NULL, *tokenizer = NULL;
    cli_opt opts[] = {
        { NULL, "--type", OPT_STR, &type, "TYPE",
          "nf4: a Hugging Face *-bnb-4bit directory (bitsandbytes NF4 with double quantization, as transformers saves "
          "it); int8: a bitsandbytes 8-bit directory (LLM.int8 row-wise); for a .gguf OUT a llama.cpp file type, as "
          "ftune merge --dtype: q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_K, q8_0, q4_0, q4_1, q5_0, q5_1, f16, bf16, f32" },
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
                    "SCB: each row's absmax, weight_format). An OUT ending in .gguf is written as GGUF, each matrix\n"
                    "in the type llama.cpp's quantize chooses for the file type TYPE (see ftune merge --help).",
                    opts, pos, 2, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (cmd.n_pos != 2) {
        fprintf(stderr, "ftune quantize: expected MODEL and OUT\n(see ftune quantize --help)\n");
        return 2;
    }
    if (!type) {
        fprintf(stderr, "ftune quantize: --type is required (nf4, int8; for a .gguf OUT q4_k_m, q6_K, q8_0, ...)\n");
        return 2;
    }
    size_t len = strlen(pos[1]);
    bool to_gguf = len > 5 && strcmp(pos[1] + len - 5, ".gguf") == 0;
    ftune_model *m = cli_load_model("quantize", pos[0], tokenizer, 0, false);
    if (!m) return 1;
    ftune_status st;
    if (to_gguf) {
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
