/* cmd_generate.c — `ftune generate`: prefill the prompt in one batched pass,
 * then decode token by token with the KV cache, streaming text as it is
 * produced. Prints the prompt followed by the continuation, as llama.cpp and
 * llama2.c do (with --chat, the prompt is a user message rendered through
 * the chat template and only the reply is printed); speeds go to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* The seed without --seed: the clock in nanoseconds and the process id,
 * mixed (splitmix64's finalizer), so that two runs started in the same
 * second (a loop, parallel jobs) sample differently. */
static uint64_t clock_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *dtype = NULL, *quant = NULL, *prompt = "", *tokenizer = NULL, *adapter = NULL;
    const char *system = NULL, *chat_template = NULL;
    int n_predict = -1, threads = 0, ctx = 0;
    bool no_bos = false, quiet = false, chat = false;
    ftune_sampler_params sp;
    ftune_sampler_defaults(&sp);
    uint64_t seed = 0;
    cli_opt opts[] = {
        { "-m", "--model", OPT_STR, &model, "MODEL", "Hugging Face directory, .gguf, or llama2.c .bin" },
        { NULL, "--adapter", OPT_STR, &adapter, "DIR", "apply a LoRA adapter: PEFT directory or llama.cpp .gguf" },
        { "-p", "--prompt", OPT_STR, &prompt, "TEXT", "prompt to continue (UTF-8)" },
        { NULL, "--chat", OPT_FLAG, &chat, "", "-p is a user message: render it with the model's chat template (and the assistant's opening), print only the reply" },
        { NULL, "--system", OPT_STR, &system, "TEXT", "with --chat: a system message before the user's" },
        { NULL, "--chat-template", OPT_STR, &chat_template, "NAME", "with --chat: chatml, llama2, llama3, mistral, zephyr or alpaca (default: the model's own)" },
        { "-n", "--n-predict", OPT_INT, &n_predict, "N", "new tokens to generate; -1 = until end of text or context full" },
        { NULL, "--temp", OPT_FLOAT, &sp.temperature, "T", "temperature; 0 = greedy" },
        { NULL, "--top-k", OPT_INT, &sp.top_k, "K", "keep the K most likely tokens; 0 = off" },
        { NULL, "--top-p", OPT_FLOAT, &sp.top_p, "P", "nucleus sampling; 1 = off" },
        { NULL, "--min-p", OPT_FLOAT, &sp.min_p, "P", "drop tokens below P x the top probability; 0 = off" },
        { NULL, "--repeat-penalty", OPT_FLOAT, &sp.repeat_penalty, "R", "penalize recent tokens; 1 = off" },
        { NULL, "--repeat-last-n", OPT_INT, &sp.repeat_last_n, "N", "how many recent tokens the penalty looks at" },
        { "-s", "--seed", OPT_U64, &seed, "S", "random seed (default: from the clock, printed to stderr)" },
        { "-t", "--threads", OPT_INT, &threads, "N", "threads; 0 = all cores" },
        { NULL, "--dtype", OPT_STR, &dtype, "T", "compute dtype of the matrix products: f32 (reference), bf16 or f16 (bf16/f16 inputs, f32 sums)" },
        { NULL, "--quant", OPT_STR, &quant, "TYPE", "quantize the layers' Linear weights on load: nf4 (bitsandbytes NF4 + double quantization) or int8 (row-wise)" },
        { "-c", "--ctx-size", OPT_INT, &ctx, "N", "context length, at most the model's; 0 = the model's" },
        { NULL, "--ctx", OPT_INT, &ctx, "N", "the same as --ctx-size" },
        { NULL, "--tokenizer", OPT_STR, &tokenizer, "FILE", "llama2.c tokenizer .bin (for a llama2.c model)" },
        { NULL, "--no-bos", OPT_FLAG, &no_bos, "", "do not prepend the BOS token (prepended only where the model's "
          "tokenizer adds one: a GGUF's tokenizer.ggml.add_bos_token, tokenizer_config.json's add_bos_token)" },
        { NULL, "--quiet", OPT_FLAG, &quiet, "", "do not print speeds to stderr" },
        { 0 },
    };
    cli_cmd cmd = { "generate", "-m MODEL [-p PROMPT] [-n N] [options]",
                    "Generates text. Stops at an end-of-generation token (EOS, EOT, or a BOS that starts a new\n"
                    "document), after N new tokens, or when the context is full.",
                    opts, NULL, 0, 0 };
    int r = cli_parse(&cmd, argc, argv);
    if (r) return r > 0 ? 0 : 2;
    const char *bad = NULL;
    if (n_predict < -1) bad = "-n must be -1 (until the end of text or a full context) or at least 0";
    else if (ctx < 0) bad = "-c must be 0 (the model's context length) or a positive length";
    else if (sp.temperature < 0) bad = "--temp must be at least 0 (0 = greedy)";
    else if (sp.top_k < 0) bad = "--top-k must be at least 0 (0 = off)";
    else if (!(sp.top_p > 0 && sp.top_p <= 1)) bad = "--top-p must be in (0, 1] (1 = off)";
    else if (!(sp.min_p >= 0 && sp.min_p <= 1)) bad = "--min-p must be in [0, 1] (0 = off)";
    else if (!(sp.repeat_penalty > 0)) bad = "--repeat-penalty must be positive (1 = off)";
    else if (sp.repeat_last_n < 0) bad = "--repeat-last-n must be at least 0";
    else if (threads < 0) bad = "-t must be at least 0 (0 = all cores)";
    else if (cli_seen(&cmd, "--ctx") && cli_seen(&cmd, "--ctx-size")) bad = "give --ctx-size (-c) or --ctx, not both";
    else if (!chat && (system || chat_template)) bad = "--system and --chat-template go with --chat";
    else if (chat && no_bos) bad = "--no-bos does not go with --chat (the chat template decides about BOS)";
    if (bad) {
        fprintf(stderr, "ftune generate: %s\n(see ftune generate --help)\n", bad);
        return 2;
    }
    if (!cli_seen(&cmd, "--seed")) seed = clock_seed();
    sp.seed = seed;

    ftune_model *m = cli_load_model_with("generate", model, tokenizer, 0, true, dtype, quant);
    if (!m) return 1;
    if (cli_check_ctx("generate", m, ctx)) { ftune_model_free(m); return 1; }
    ftune_status st;
    if (adapter && (st = ftune_model_load_adapter(m, adapter))) {
        cli_fail("generate", st);
        ftune_model_free(m);
        return 1;
    }
    int rc = 1;
    const ftune_tokenizer *tok = ftune_model_tokenizer(m);
    ftune_model_info info;
    ftune_model_get_info(m, &info);
    ftune_session *s = NULL;
    ftune_sampler *smp = NULL;
    int32_t *ids = NULL, *hist = NULL;
    float *logits = NULL;
    size_t n_ids = 0;
    /* BOS as the model's tokenizer adds it (as train, --chat and `ftune
     * tokenize` do): SmolLM2's and Qwen2.5's files say not to, and a BOS there
     * changes every continuation. An empty prompt still starts from BOS. */
    int add_bos = !no_bos && !chat && (ftune_tokenizer_add_bos(tok) || (!*prompt && ftune_tokenizer_bos(tok) >= 0));
    if (chat) {
        ftune_chat_msg msgs[2] = { { FTUNE_ROLE_SYSTEM, system }, { FTUNE_ROLE_USER, prompt } };
        if ((st = ftune_chat_tokenize(m, chat_template, system ? msgs : msgs + 1, system ? 2 : 1, 1, &ids, &n_ids))) {
            cli_fail("generate", st);
            goto out;
        }
    } else if ((st = ftune_tokenize(tok, prompt, strlen(prompt), add_bos, 0, &ids, &n_ids))) {
        cli_fail("generate", st);
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, "ftune generate: error: empty prompt and the model has no BOS token to start from\n");
        goto out;
    }
    int n_ctx = ctx > 0 ? ctx : info.context_length;
    if ((int64_t)n_ids > n_ctx) {
        fprintf(stderr, "ftune generate: error: the prompt is %zu tokens, longer than the context length %d\n", n_ids,
                n_ctx);
        goto out;
    }
    if ((st = ftune_session_new(&s, m, n_ctx, threads))) { cli_fail("generate", st); goto out; }
    if ((st = ftune_sampler_new(&smp, &sp, info.vocab_size))) { cli_fail("generate", st); goto out; }
    int max_new = n_ctx - (int)n_ids;
    if (n_predict >= 0 && n_predict < max_new) max_new = n_predict;
    hist = malloc(((size_t)n_ids + (size_t)max_new + 1) * sizeof *hist);
    logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (!hist || !logits) { fprintf(stderr, "ftune generate: error: out of memory\n"); goto out; }
    memcpy(hist, ids, n_ids * sizeof *ids);
    int n_hist = (int)n_ids;

    char piece[256];
    for (size_t i = 0; i < n_ids && !chat; i++) {
        int k = ftune_token_to_piece(tok, i ? ids[i - 1] : -1, ids[i], piece, sizeof piece);
        if (k > 0 && !(i == 0 && add_bos)) cli_print_piece(stdout, piece, k);
    }
    fflush(stdout);

    double t0 = ft_cli_time();
    if ((st = ftune_session_forward(s, ids, (int)n_ids, logits, 0))) { cli_fail("generate", st); goto out; }
    double t1 = ft_cli_time();
    int n_gen = 0, n_fwd = 0;
    int32_t bos = ftune_tokenizer_bos(tok);
    while (n_gen < max_new) {
        int32_t next = ftune_sampler_sample(smp, logits, hist, n_hist);
        n_gen++;
        if (ftune_tokenizer_is_eog(tok, next) || next == bos) break;
        int k = ftune_token_to_piece(tok, hist[n_hist - 1], next, piece, sizeof piece);
        if (k > 0) cli_print_piece(stdout, piece, k);
        fflush(stdout);
        hist[n_hist++] = next;
        if (n_gen == max_new) break;
        if ((st = ftune_session_forward(s, &next, 1, logits, 0))) { cli_fail("generate", st); goto out; }
        n_fwd++;
    }
    double t2 = ft_cli_time();
    printf("\n");
    fflush(stdout);
    if (!quiet) {
        int n_decode = n_fwd; /* one-token forward passes after the prefill */
        fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", n_ids, t1 - t0, (double)n_ids / (t1 - t0));
        fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s)\n", n_decode, t2 - t1,
                n_decode > 0 ? n_decode / (t2 - t1) : 0.0);
        if (!cli_seen(&cmd, "--seed") && sp.temperature > 0) fprintf(stderr, "seed: %llu\n", (unsigned long long)seed);
    }
    rc = 0;
out:
    free(ids); free(hist); free(logits);
    ftune_sampler_free(smp);
    ftune_session_free(s);
    ftune_model_free(m);
    return rc;
}
