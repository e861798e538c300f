/* cmd_merge.c — `ftune merge`: folds a PEFT LoRA adapter into the base
 * weights and writes the merged model (a Hugging Face directory, or GGUF
 * when the output ends in .gguf and the base is GGUF). Without an adapter
 * it converts: GGUF/llama2.c to a Hugging Face directory, or a GGUF to
 * another weight type (q8_0, q4_0, ...). */
#include <stdio.h>

#include "cli.h"

int cmd_merge(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *out = NULL, *dtype = NULL, *tokenizer = NULL;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "base model: Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--adapter", OPT_STR, &adapter, "DIR", "PEFT adapter directory (adapter_config.json + safetensors); none = convert only" },
        { "-o", "--output", OPT_STR, &out, "OUT", "a directory (Hugging Face safetensors) or a path ending in .gguf" },
        { NULL, "--dtype", OPT_STR, &dtype, "T", "f32, bf16 or f16 for every matrix; a .gguf output also q8_0, q4_0 (default: each weight's own)" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { 0 },
    };
    cli_cmd cmd = { "merge", "-m MODEL [--adapter DIR] -o OUT [--dtype T]",
                    "Writes the base model with the adapter folded in: W + scale * B * A, computed in f32.\n"
                    "A GGUF output needs a GGUF base and keeps each tensor's type unless --dtype says otherwise\n"
                    "(q8_0/q4_0 quantize the Linear weights whose rows are whole 32-element blocks).\n"
                    "Without --adapter the model is only converted.",
                    opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "ftune merge: -o OUT is required\n(see ftune merge --help)\n");
        return 2;
    }
    ftune_model *m = cli_load_model("merge", model, tokenizer, 0, false);
    if (!m) return 1;
    ftune_status st = adapter ? ftune_model_load_adapter(m, adapter) : FTUNE_OK;
    if (!st) st = ftune_model_save_merged(m, out, dtype);
    int rc = st ? cli_fail("merge", st) : 0;
    if (!st) fprintf(stderr, "wrote %s\n", out);
    ftune_model_free(m);
    return rc;
}
