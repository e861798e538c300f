/* main.c — the ftune command: dispatches to a subcommand. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define FTUNE_CLI_VERSION "0.1.0"


static const struct { const char *name; int (*fn)(int, char **); const char *about; } cmds[] = {
    { "generate", cmd_generate, "generate text from a model (KV cache, sampling, streaming)" },
    { "eval", cmd_eval, "loss and perplexity of a model on a text or JSONL file" },
    { "tokenize", cmd_tokenize, "print the token ids of text read from stdin" },
    { "info", cmd_info, "architecture, parameters, dtypes and tokenizer of a model" },
    { "train", cmd_train, "fine-tune a model (LoRA or full) on a dataset; checkpoints, resume" },
    { "plan", cmd_plan, "the memory a `ftune train` with the same arguments would hold, before running it" },
    { "merge", cmd_merge, "fold a LoRA adapter into the base weights and write the model" },
    { "quantize", cmd_quantize, "write a model quantized: bitsandbytes nf4 (Hugging Face *-bnb-4bit) or GGUF q8_0/q4_0" },
    { "init", cmd_init, "write a model with random weights from a preset or config" },
    { "report", cmd_report, "an HTML page of training runs' curves (loss, lr, grad norm, tokens/s, memory) and configurations" },
};

static void usage(FILE *f) {
    fprintf(f, "usage: ftune COMMAND [options]    (ftune COMMAND --help for its options; ftune --version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].about);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    ftune_report_kernel_faults(); /* a SIGILL in the kernels says which level and what avoids it */
    signal(SIGXFSZ, SIG_IGN); /* a file-size limit is a write error (its writers then leave no partial file), not a kill */
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "version") == 0) {
#ifdef __clang__
        const char *cc = "clang";
#else
        const char *cc = "gcc";
#endif
        printf("ftune %s (checkpoint format %d; built %s with %s %s)\n", FTUNE_CLI_VERSION, FTUNE_CHECKPOINT_VERSION, __DATE__,
               cc, __VERSION__);
        printf("kernels: %s; %s\n", ftune_kernel_level(), ftune_kernel_note());
        return 0;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "ftune: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 2;
}
