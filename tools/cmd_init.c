/* cmd_init.c — `ftune init`: write a random-weight model in HF layout. */
#include <stdio.h>

#include "cli.h"

int cmd_init(int argc, char **argv) {
    const char *preset = NULL, *config = NULL, *dtype = "f32";
    uint64_t seed = 0;
    bool overwrite = false;
    const char *pos[1];
    cli_opt opts[] = {
        { NULL, "--preset", OPT_STR, &preset, "NAME", "a model shape (see below)" },
        { NULL, "--config", OPT_STR, &config, "FILE", "a Hugging Face config.json to take the shape from" },
        { NULL, "--dtype", OPT_STR, &dtype, "TYPE", "weight dtype: f32, bf16 or f16" },
        { "-s", "--seed", OPT_U64, &seed, "S", "random seed" },
        { NULL, "--overwrite", OPT_FLAG, &overwrite, "", "replace the config.json and model.safetensors of a directory that is not empty (refused otherwise)" },
        { 0 },
    };
    cli_cmd cmd = { "init", "(--preset NAME | --config config.json) OUT_DIR [--dtype f32|bf16|f16] [--overwrite]",
                    "Writes config.json and model.safetensors with random weights (normal, std 0.02; norm\n"
                    "weights 1) for benchmarks and pretraining. No tokenizer is written. The config is checked\n"
                    "first; the files are written beside OUT_DIR and moved into it at the end, so a failure\n"
                    "leaves OUT_DIR as it was. An OUT_DIR that is not empty is refused unless --overwrite.\n"
                    "presets: stories260K, llama-110m, smollm2-360m, llama-3.2-1b, llama-2-7b, qwen2-0.5b",
                    opts, pos, 1, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    if (cmd.n_pos != 1) {
        fprintf(stderr, "ftune init: give the output directory (see ftune init --help)\n");
        return 2;
    }
    ftune_status st = ftune_init_model(pos[0], preset, config, dtype, seed, overwrite);
    if (st) return cli_fail("init", st);
    fprintf(stderr, "wrote %s/config.json and %s/model.safetensors\n", pos[0], pos[0]);
    return 0;
}
