/* cmd_merge.c — `ftune merge`: folds a LoRA adapter (PEFT directory or
 * llama.cpp GGUF) into the base weights and writes the merged model (a
 * Hugging Face directory, or GGUF when the output ends in .gguf, from any
 * base). Without an adapter it converts between formats and weight types
 * (llama.cpp's mixes q4_k_m, q6_K, q8_0, ..., or bitsandbytes' nf4, int8):
 * the library parses the type names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ftune_merge_opts.progress: elements of the computed tensors made so far */
static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    cli_progress_update(ctx, (double)done, (double)total);
}

int cmd_merge(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL, *dtype = NULL, *tokenizer = NULL, *quant = NULL;
    bool progress = false;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "base model: Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--adapter", OPT_STR, &adapter, "DIR", "PEFT adapter directory or llama.cpp LoRA .gguf; none = convert only" },
        { "-o", "--output", OPT_STR, &out, "OUT", "a directory (Hugging Face safetensors) or a path ending in .gguf" },
        { NULL, "--dtype", OPT_STR, &dtype, "T", "a directory: f32, bf16 or f16 for every matrix, embedding and output included, or nf4, int8 (re-quantized after the f32 merge, as ftune quantize); a .gguf: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K (= q4_k_m), q5_K (= q5_k_m), q6_K, q4_k_s, q4_k_m, q5_k_s, q5_k_m, each tensor's type chosen as llama.cpp's quantize does, or same (each tensor's type as the GGUF input has it); default: each weight's own, f32 for a quantized base" },
        { NULL, "--quant", OPT_STR, &quant, "TYPE", "quantize the base on load as ftune train --quant did (nf4, int8), then merge into its dequantized f32 weights: the base a QLoRA adapter was trained on" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model); for a .gguf output from a model without a tokenizer (ftune init's): any tokenizer file or directory" },
        { NULL, "--progress", OPT_FLAG, &progress, "",
          "show progress and ETA on stderr even when it is not a terminal" },
        { 0 },
    };
    cli_cmd cmd = { "merge", "-m MODEL [--adapter DIR] -o OUT [--dtype T]",
                    "Writes the base model with the adapter folded in: W + scale * B * A, computed in f32.\n"
                    "A GGUF output (from a GGUF, Hugging Face or llama2.c base) keeps each tensor's type unless\n"
                    "--dtype names llama.cpp's file type (mix): each matrix gets the type llama.cpp's quantize\n"
                    "chooses for it (the output matrix q6_K; in q4_k_m/q5_k_m some layers' attn_v and ffn_down\n"
                    "q6_K; rows that are not whole 256-element blocks fall back to q5_0, q5_1, q8_0 or f16 as\n"
                    "llama.cpp's do). Norms stay f32. general.file_type is the mix's (llama.cpp's LLAMA_FTYPE).\n"
                    "Without --adapter the model is only converted.\n"
                    "A quantized base (--quant, or a bitsandbytes checkpoint) is dequantized and merged in f32,\n"
                    "and written in f32 (or --dtype): never merged into 4-bit; a quantized --dtype quantizes the\n"
                    "merged weights again, only when asked.",
                    opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "ftune merge: -o OUT is required\n(see ftune merge --help)\n");
        return 2;
    }
    ftune_model *m = cli_load_model_quant("merge", model, tokenizer, 0, false, quant);
    if (!m) return 1;
    ftune_status st = adapter ? ftune_model_load_adapter(m, adapter) : FTUNE_OK;
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    /* a llama2.c model's --tokenizer was its own (cli_load_model); any other model's goes into the GGUF */
    ftune_merge_opts mo = { .dtype = dtype, .tokenizer = strcmp(info.format, "llama2c") != 0 ? tokenizer : NULL };
    cli_progress pr = { 0 };
    char label[4200];
    snprintf(label, sizeof label, "%s %s", adapter ? "merging" : "writing", out);
    cli_progress_begin(&pr, label, progress);
    mo.progress = on_progress;
    mo.progress_ctx = &pr;
    char summary[1024];
    if (!st) st = ftune_model_merge(m, out, &mo, summary, sizeof summary);
    cli_progress_end(&pr);
    int rc = st ? cli_fail("merge", st) : 0;
    if (!st && summary[0]) fprintf(stderr, "%s\n", summary);
    if (!st) fprintf(stderr, "wrote %s\n", out);
    ftune_model_free(m);
    return rc;
}
