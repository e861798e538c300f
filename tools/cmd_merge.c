/* cmd_merge.c — `ftune merge`: folds a LoRA adapter (PEFT directory or
 * llama.cpp GGUF) into the base weights and writes the merged model (a
 * Hugging Face directory, or GGUF when the output ends in .gguf, from any
 * base). Without an adapter it converts between formats and weight types
 * (q8_0, q4_0, ...). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* ftune_merge_opts.progress: elements of the computed tensors made so far */
static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    cli_progress_update(ctx, (double)done, (double)total);
}

/* Removes the files of a flat directory the merge wrote, then it. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

int cmd_merge(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL, *dtype = NULL, *tokenizer = NULL, *quant = NULL;
    bool progress = false;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "base model: Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--adapter", OPT_STR, &adapter, "DIR", "PEFT adapter directory or llama.cpp LoRA .gguf; none = convert only" },
        { "-o", "--output", OPT_STR, &out, "OUT", "a directory (Hugging Face safetensors) or a path ending in .gguf" },
        { NULL, "--dtype", OPT_STR, &dtype, "T", "f32, bf16 or f16 for every matrix, embedding and output included; a .gguf output also q8_0, q4_0; a directory also nf4 or int8 (re-quantized after the f32 merge, as ftune quantize; default: each weight's own, f32 for a quantized base)" },
        { NULL, "--quant", OPT_STR, &quant, "TYPE", "quantize the base on load as ftune train --quant did (nf4, int8), then merge into its dequantized f32 weights: the base a QLoRA adapter was trained on" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model); for a .gguf output from a model without a tokenizer (ftune init's): any tokenizer file or directory" },
        { NULL, "--progress", OPT_FLAG, &progress, "",
          "show progress and ETA on stderr even when it is not a terminal" },
        { 0 },
    };
    cli_cmd cmd = { "merge", "-m MODEL [--adapter DIR] -o OUT [--dtype T]",
                    "Writes the base model with the adapter folded in: W + scale * B * A, computed in f32.\n"
                    "A GGUF output (from a GGUF, Hugging Face or llama2.c base) keeps each tensor's type unless\n"
                    "--dtype says otherwise. q8_0 quantizes every matrix, token_embd and output included; q4_0\n"
                    "does the same but writes the output matrix (output.weight, or token_embd when tied to it)\n"
                    "as q8_0, where llama.cpp's quantize uses q6_K. Matrices whose rows are not whole 32-element\n"
                    "blocks keep their type; norms stay f32. general.file_type follows --dtype (llama.cpp's\n"
                    "LLAMA_FTYPE). Without --adapter the model is only converted.\n"
                    "A quantized base (--quant, or a bitsandbytes checkpoint) is dequantized and merged in f32,\n"
                    "and written in f32 (or --dtype): never merged into 4-bit; --dtype nf4|int8|q8_0|q4_0\n"
                    "quantizes the merged weights again, only when asked.",
                    opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "ftune merge: -o OUT is required\n(see ftune merge --help)\n");
        return 2;
    }
    bool requant = dtype && (strcmp(dtype, "nf4") == 0 || strcmp(dtype, "int8") == 0);
    size_t on = strlen(out);
    if (requant && on >= 5 && strcmp(out + on - 5, ".gguf") == 0) {
        fprintf(stderr, "ftune merge: --dtype %s writes a bitsandbytes directory, not a .gguf (for GGUF: --dtype q8_0 or "
                "q4_0)\n", dtype);
        return 2;
    }
    ftune_model *m = cli_load_model_quant("merge", model, tokenizer, 0, false, quant);
    if (!m) return 1;
    /* re-quantizing: the merge is written in f32 beside OUT, then quantized into OUT */
    char tmp_dir[4200];
    snprintf(tmp_dir, sizeof tmp_dir, "%s.merged-f32.tmp", out);
    const char *merge_out = requant ? tmp_dir : out;
    ftune_status st = adapter ? ftune_model_load_adapter(m, adapter) : FTUNE_OK;
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    /* a llama2.c model's --tokenizer was its own (cli_load_model); any other model's goes into the GGUF */
    ftune_merge_opts mo = { .dtype = requant ? "f32" : dtype, .tokenizer = strcmp(info.format, "llama2c") != 0 ? tokenizer : NULL };
    cli_progress pr = { 0 };
    char label[4200];
    snprintf(label, sizeof label, "%s %s", adapter ? "merging" : "writing", merge_out);
    cli_progress_begin(&pr, label, progress);
    mo.progress = on_progress;
    mo.progress_ctx = &pr;
    char summary[1024];
    if (!st) st = ftune_model_merge(m, merge_out, &mo, summary, sizeof summary);
    cli_progress_end(&pr);
    if (!st && requant) {
        ftune_model *merged = NULL;
        st = ftune_model_load(&merged, tmp_dir, NULL);
        if (!st) st = ftune_model_save_bnb(merged, out, dtype);
        ftune_model_free(merged);
    }
    if (requant) remove_dir(tmp_dir);
    int rc = st ? cli_fail("merge", st) : 0;
    if (!st && summary[0]) fprintf(stderr, "%s\n", summary);
    if (!st) fprintf(stderr, "wrote %s\n", out);
    ftune_model_free(m);
    return rc;
}
