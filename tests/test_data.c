/* test_data.c — the training data pipeline: every dataset format, loss-mask
 * boundaries, chat templates, bad input, validation split, padding,
 * packing, shuffle determinism and cursor resume. Most tests use a small
 * word tokenizer defined here (lossless, so masks can be checked by
 * decoding); the real tokenizers are checked where they are available. */
#include "check.h"
#include "data/data.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>

#include <ctype.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ a word tokenizer */

/* Tokens: special strings; otherwise a run of whitespace followed by a run
 * of non-whitespace (" world"), split before any special string. The
 * vocabulary grows as text is seen, so ids decode back to the exact text. */
static const char *const SPECIALS[] = {
    "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eot_id|>",
};
#define N_SPECIALS (int)(sizeof SPECIALS / sizeof SPECIALS[0])

typedef struct {
    char **piece;
    int n, cap;
} wordtok;

static int wt_id(wordtok *w, const char *s, size_t len) {
    for (int i = 0; i < w->n; i++)
        if (strlen(w->piece[i]) == len && memcmp(w->piece[i], s, len) == 0) return i;
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->piece = realloc(w->piece, (size_t)w->cap * sizeof *w->piece);
    }
    w->piece[w->n] = strndup(s, len);
    return w->n++;
}

static int special_at(const char *s, size_t left) {
    for (int k = 0; k < N_SPECIALS; k++) {
        size_t l = strlen(SPECIALS[k]);
        if (l <= left && memcmp(s, SPECIALS[k], l) == 0) return k;
    }
    return -1;
}

static int wt_calls = 0; /* how many times the pipeline called the tokenizer */

static ftune_status wt_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    wordtok *w = ctx;
    wt_calls++;
    int32_t *out = malloc((len + 1) * sizeof *out);
    size_t n = 0, i = 0;
    while (i < len) {
        int k = special_at(text + i, len - i);
        if (k >= 0) {
            out[n++] = wt_id(w, SPECIALS[k], strlen(SPECIALS[k]));
            i += strlen(SPECIALS[k]);
            continue;
        }
        size_t j = i;
        while (j < len && isspace((unsigned char)text[j]) && special_at(text + j, len - j) < 0) j++;
        while (j < len && !isspace((unsigned char)text[j]) && special_at(text + j, len - j) < 0) j++;
        out[n++] = wt_id(w, text + i, j - i);
        i = j;
    }
    *ids = out;
    *n_ids = n;
    return FTUNE_OK;
}

static wordtok WT;

static ft_data_tokenizer word_tokenizer(int add_bos) {
    if (WT.n == 0)
        for (int k = 0; k < N_SPECIALS; k++) wt_id(&WT, SPECIALS[k], strlen(SPECIALS[k]));
    return (ft_data_tokenizer){ .tokenize = wt_tokenize, .ctx = &WT, .bos_id = 1, .eos_id = 2, .add_bos = add_bos };
}

/* The text of the tokens of example i whose mask equals want (want < 0: all). */
static char *decode(const ft_dataset *ds, int i, int want) {
    size_t cap = 1;
    for (int64_t t = ds->off[i]; t < ds->off[i + 1]; t++) cap += strlen(WT.piece[ds->tokens[t]]);
    char *s = calloc(cap, 1);
    for (int64_t t = ds->off[i]; t < ds->off[i + 1]; t++)
        if (want < 0 || ds->mask[t] == want) strcat(s, WT.piece[ds->tokens[t]]);
    return s;
}

/* ------------------------------------------------------------ files */

static char tmpdir[256];

static const char *write_tmp(const char *name, const char *content) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    fputs(content, f);
    fclose(f);
    return path;
}

static ft_dataset_opts opts_ctx(int ctx) {
    ft_dataset_opts o;
    ft_dataset_opts_default(&o);
    o.ctx_len = ctx;
    return o;
}

#define CHECK_STR(a, b) CHECKF(strcmp((a), (b)) == 0, "\n    got      \"%s\"\n    expected \"%s\"", (a), (b))

/* ------------------------------------------------------------ formats */

static void test_format_text(void) {
    ft_data_tokenizer tk = word_tokenizer(1);
    const char *p = write_tmp("text.jsonl", "{\"text\": \"the cat sat\"}\n\n  \n{\"text\": \"a dog\"}\n");
    ft_dataset_opts o = opts_ctx(64);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_TEXT);
    CHECK(ds->n == 2);
    CHECK(ds->stats.n_records == 2);
    CHECK(ds->line[0] == 1 && ds->line[1] == 4); /* blank lines skipped but counted */
    char *all = decode(ds, 0, -1), *tr = decode(ds, 0, 1), *un = decode(ds, 0, 0);
    CHECK_STR(all, "<s>the cat sat</s>");
    CHECK_STR(tr, "the cat sat</s>"); /* loss on every token after BOS */
    CHECK_STR(un, "<s>");
    CHECK(ds->tokens[ds->off[0]] == 1 && ds->tokens[ds->off[1] - 1] == 2);
    CHECK(ds->stats.n_targets == (ds->off[1] - 1) + (ds->off[2] - ds->off[1] - 1));
    free(all), free(tr), free(un);
    ft_dataset_free(ds);
}

static void test_format_completion(void) {
    ft_data_tokenizer tk = word_tokenizer(0);
    const char *p = write_tmp("pc.jsonl", "{\"prompt\": \"Q: two plus two?\\nA:\", \"completion\": \" four\"}\n"
                                          "{\"prompt\": \"Say hi\", \"completion\": \"hi\"}\n");
    ft_dataset_opts o = opts_ctx(64);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_COMPLETION && ds->n == 2);
    char *tr = decode(ds, 0, 1), *un = decode(ds, 0, 0);
    CHECK_STR(un, "Q: two plus two?\nA:");
    CHECK_STR(tr, " four</s>");
    /* the mask boundary is exactly between the last prompt token and the first completion token */
    int64_t first_train = ds->off[0];
    while (!ds->mask[first_train]) first_train++;
    CHECK(strcmp(WT.piece[ds->tokens[first_train]], " four") == 0);
    for (int64_t t = first_train; t < ds->off[1]; t++) CHECK(ds->mask[t] == 1);
    free(tr), free(un);
    /* "hi" directly after "Say hi": tokenized as its own word, not merged into the prompt */
    tr = decode(ds, 1, 1);
    CHECK_STR(tr, "hi</s>");
    free(tr);
    ft_dataset_free(ds);

    o.train_on_prompt = true;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    tr = decode(ds, 0, 1);
    CHECK_STR(tr, "Q: two plus two?\nA: four</s>");
    free(tr);
    ft_dataset_free(ds);

    /* other field names for the two parts (gsm8k's question/answer) */
    const char *qa = "{\"question\": \"1+1?\", \"answer\": \" 2\"}\n";
    o.train_on_prompt = false;
    CHECK(ft_dataset_load_buffer(&ds, "qa.jsonl", qa, strlen(qa), &tk, &o) == FTUNE_ERR_FORMAT);
    o.prompt_key = "question";
    o.completion_key = "answer";
    CHECK_OK(ft_dataset_load_buffer(&ds, "qa.jsonl", qa, strlen(qa), &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_COMPLETION);
    tr = decode(ds, 0, 1);
    CHECK_STR(tr, " 2</s>");
    free(tr);
    ft_dataset_free(ds);
}

static void test_format_alpaca(void) {
    ft_data_tokenizer tk = word_tokenizer(1);
    const char *p = write_tmp("alpaca.jsonl",
                              "{\"instruction\": \"Add the numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
                              "{\"instruction\": \"Name a color.\", \"input\": \"\", \"output\": \"Blue.\"}\n"
                              "{\"instruction\": \"Name a fruit.\", \"output\": \"Apple.\"}\n");
    ft_dataset_opts o = opts_ctx(256);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_ALPACA && ds->n == 3);
    char *un = decode(ds, 0, 0), *tr = decode(ds, 0, 1);
    CHECK_STR(un, "<s>Below is an instruction that describes a task, paired with an input that provides further "
                  "context. Write a response that appropriately completes the request.\n\n"
                  "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n");
    CHECK_STR(tr, "5</s>");
    free(un), free(tr);
    for (int i = 1; i < 3; i++) {
        un = decode(ds, i, 0);
        tr = decode(ds, i, 1);
        char want[512];
        snprintf(want, sizeof want,
                 "<s>Below is an instruction that describes a task. Write a response that appropriately "
                 "completes the request.\n\n### Instruction:\n%s\n\n### Response:\n",
                 i == 1 ? "Name a color." : "Name a fruit.");
        CHECK_STR(un, want);
        CHECK_STR(tr, i == 1 ? "Blue.</s>" : "Apple.</s>");
        free(un), free(tr);
    }
    ft_dataset_free(ds);
}

static void test_format_chat(void) {
    ft_data_tokenizer tk = word_tokenizer(0);
    const char *p = write_tmp("chat.jsonl",
                              "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                              " {\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello.\"},"
                              " {\"role\": \"user\", \"content\": \"Bye\"}, {\"role\": \"assistant\", \"content\": \"Bye now.\"}]}\n");
    ft_dataset_opts o = opts_ctx(256);
    ft_dataset *ds = NULL;
    CHECK(ft_dataset_load(&ds, p, &tk, &o) == FTUNE_ERR_ARG); /* chat data without a template */
    CHECKF(strstr(ftune_last_error(), "chat template") != NULL, "%s", ftune_last_error());
    o.chat_template = FT_CHAT_CHATML;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_CHAT && ds->n == 1);
    char *tr = decode(ds, 0, 1), *all = decode(ds, 0, -1);
    CHECK_STR(tr, "Hello.<|im_end|>Bye now.<|im_end|>");
    CHECK_STR(all, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                   "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nBye now.<|im_end|>\n");
    free(tr), free(all);
    ft_dataset_free(ds);

    /* llama3: BOS from the template; the end-of-turn token is trained on */
    o.chat_template = FT_CHAT_LLAMA3;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    tr = decode(ds, 0, 1);
    CHECK_STR(tr, "Hello.<|eot_id|>Bye now.<|eot_id|>");
    CHECK(ds->tokens[0] == tk.bos_id);
    free(tr);
    ft_dataset_free(ds);

    o.chat_template = FT_CHAT_LLAMA2;
    o.train_on_prompt = true;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    all = decode(ds, 0, -1);
    tr = decode(ds, 0, 1);
    CHECK_STR(all, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST] Bye now. </s>");
    /* train_on_prompt: everything but the BOS tokens */
    CHECK_STR(tr, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s>[INST] Bye [/INST] Bye now. </s>");
    free(tr), free(all);
    ft_dataset_free(ds);
}

/* One conversation through every template, text compared with what the
 * models' Jinja templates produce for it (worked out by hand from them). */
static void test_chat_templates_text(void) {
    ft_chat_msg m[] = {
        { FT_ROLE_SYSTEM, "You are helpful." }, { FT_ROLE_USER, "Hi there" },
        { FT_ROLE_ASSISTANT, "Hello! How can I help?" }, { FT_ROLE_USER, "Tell a joke." },
        { FT_ROLE_ASSISTANT, "No." },
    };
    struct { ft_chat_template t; const char *bos, *eos, *want; } cases[] = {
        { FT_CHAT_CHATML, "", "",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
          "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n<|im_start|>user\nTell a joke.<|im_end|>\n"
          "<|im_start|>assistant\nNo.<|im_end|>\n" },
        { FT_CHAT_LLAMA2, "<s>", "</s>",
          "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi there [/INST] Hello! How can I help? </s>"
          "<s>[INST] Tell a joke. [/INST] No. </s>" },
        { FT_CHAT_LLAMA3, "<|begin_of_text|>", "<|end_of_text|>",
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
          "<|start_header_id|>user<|end_header_id|>\n\nTell a joke.<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\nNo.<|eot_id|>" },
        { FT_CHAT_MISTRAL, "<s>", "</s>",
          "<s>[INST] You are helpful.\n\nHi there [/INST]Hello! How can I help?</s>[INST] Tell a joke. [/INST]No.</s>" },
        { FT_CHAT_ZEPHYR, "<s>", "</s>",
          "<|system|>\nYou are helpful.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello! How can I help?</s>\n"
          "<|user|>\nTell a joke.</s>\n<|assistant|>\nNo.</s>\n" },
        { FT_CHAT_ALPACA, "<s>", "</s>",
          "You are helpful.\n\n### Instruction:\nHi there\n\n### Response:\nHello! How can I help?</s>\n\n"
          "### Instruction:\nTell a joke.\n\n### Response:\nNo.</s>" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *txt = NULL;
        size_t len = 0;
        CHECK_OK(ft_chat_render_text(&txt, &len, cases[c].t, NULL, m, 5, false, cases[c].bos, cases[c].eos));
        if (!txt) continue;
        CHECKF(strcmp(txt, cases[c].want) == 0, "%s:\n    got      \"%s\"\n    expected \"%s\"",
               ft_chat_template_name(cases[c].t), txt, cases[c].want);
        CHECK(len == strlen(txt));
        free(txt);
    }
    /* generation prompts: the header of the next assistant turn */
    struct { ft_chat_template t; const char *tail; } gen[] = {
        { FT_CHAT_CHATML, "<|im_end|>\n<|im_start|>assistant\n" },
        { FT_CHAT_LLAMA3, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n" },
        { FT_CHAT_ZEPHYR, "</s>\n<|assistant|>\n" },
        { FT_CHAT_LLAMA2, "Tell a joke. [/INST]" },
        { FT_CHAT_MISTRAL, "Tell a joke. [/INST]" },
        { FT_CHAT_ALPACA, "Tell a joke.\n\n### Response:\n" },
    };
    for (size_t c = 0; c < sizeof gen / sizeof gen[0]; c++) {
        char *txt = NULL;
        size_t len = 0;
        CHECK_OK(ft_chat_render_text(&txt, &len, gen[c].t, NULL, m, 4, true, "<s>", "</s>"));
        if (!txt) continue;
        size_t lt = strlen(gen[c].tail);
        CHECKF(len >= lt && strcmp(txt + len - lt, gen[c].tail) == 0, "%s: \"%s\"", ft_chat_template_name(gen[c].t), txt);
        free(txt);
    }
    /* a system message in the middle: fine for chatml, an error for llama2 */
    ft_chat_msg mid[] = { { FT_ROLE_USER, "a" }, { FT_ROLE_SYSTEM, "b" }, { FT_ROLE_ASSISTANT, "c" } };
    char *txt = NULL;
    size_t len;
    CHECK_OK(ft_chat_render_text(&txt, &len, FT_CHAT_CHATML, NULL, mid, 3, false, "", ""));
    free(txt);
    txt = NULL;
    CHECK(ft_chat_render_text(&txt, &len, FT_CHAT_LLAMA2, NULL, mid, 3, false, "<s>", "</s>") == FTUNE_ERR_FORMAT);
    CHECK(txt == NULL);
    /* llama2 needs alternating turns */
    ft_chat_msg twice[] = { { FT_ROLE_USER, "a" }, { FT_ROLE_USER, "b" } };
    CHECK(ft_chat_render_text(&txt, &len, FT_CHAT_MISTRAL, NULL, twice, 2, false, "<s>", "</s>") == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "\"messages\"[1].role") != NULL, "%s", ftune_last_error());
}

static void test_template_names_and_detect(void) {
    ft_chat_template t;
    for (int k = FT_CHAT_CHATML; k < FT_CHAT_COUNT; k++) {
        CHECK_OK(ft_chat_template_from_name(&t, ft_chat_template_name((ft_chat_template)k)));
        CHECK(t == (ft_chat_template)k);
    }
    CHECK_OK(ft_chat_template_from_name(&t, "Llama-3"));
    CHECK(t == FT_CHAT_LLAMA3);
    CHECK(ft_chat_template_from_name(&t, "vicuna") == FTUNE_ERR_ARG);
    CHECK(strstr(ftune_last_error(), "vicuna") != NULL);
    struct { const char *jinja; ft_chat_template want; } d[] = {
        { "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}", FT_CHAT_CHATML },
        { "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}", FT_CHAT_LLAMA3 },
        { "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] %}{% endif %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}", FT_CHAT_LLAMA2 },
        { "{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}", FT_CHAT_MISTRAL },
        { "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token }}{% endif %}{% endfor %}", FT_CHAT_ZEPHYR },
        { "{{ '### Instruction:\\n' + message['content'] }}", FT_CHAT_ALPACA },
        { "{{ messages }}", FT_CHAT_NONE },
    };
    for (size_t k = 0; k < sizeof d / sizeof d[0]; k++) CHECKF(ft_chat_template_detect(d[k].jinja) == d[k].want, "case %zu", k);
    /* from a tokenizer_config.json, as a plain string and as a named list */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hfdir", tmpdir);
    mkdir(dir, 0755);
    write_tmp("hfdir/tokenizer_config.json", "{\"chat_template\": \"{{'<|im_start|>'}}\"}");
    CHECK_OK(ft_chat_template_from_hf_dir(&t, dir));
    CHECK(t == FT_CHAT_CHATML);
    write_tmp("hfdir/tokenizer_config.json",
              "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"<|im_start|>\"},"
              " {\"name\": \"default\", \"template\": \"<|start_header_id|>\"}]}");
    CHECK_OK(ft_chat_template_from_hf_dir(&t, dir));
    CHECK(t == FT_CHAT_LLAMA3);
    write_tmp("hfdir/tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    CHECK_OK(ft_chat_template_from_hf_dir(&t, dir));
    CHECK(t == FT_CHAT_NONE);
    write_tmp("hfdir/tokenizer_config.json", "{\"chat_template\": ");
    CHECK(ft_chat_template_from_hf_dir(&t, dir) == FTUNE_ERR_FORMAT);
}

/* A JSON array of records; line numbers point at each element. */
/* The default system message read from ChatML templates' string literals,
 * and a conversation without a system message rendered with it first. */
static void test_chat_default_system(void) {
    static const struct { const char *jinja, *want; } cases[] = {
        /* Qwen2.5's shape: escaped newlines, the default in an else branch;
         * a quote in the template's plain text outside the blocks */
        { "Don't {%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
          "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}"
          "{%- endif %}{{ '<|im_start|>' + m.role }}",
          "You are Qwen, created by Alibaba Cloud." },
        /* SmolLM2's shape: raw newlines inside the literal, double quotes, escapes */
        { "{% if loop.first %}{{ \"<|im_start|>system\nSay \\\"hi\\\"\\tdon\\'t<|im_end|>\n\" }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}",
          "Say \"hi\"\tdon't" },
        /* ChatML without a default */
        { "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}",
          NULL },
        /* two different defaults: which one applies depends on Jinja logic ftune does not run */
        { "{{ '<|im_start|>system\\nA<|im_end|>\\n' }}{{ '<|im_start|>system\\nB<|im_end|>\\n' }}<|im_start|>", NULL },
        /* the literal outside {{ }} is template text, not a string */
        { "'<|im_start|>system\\nA<|im_end|>\\n'", NULL },
        /* not ChatML */
        { "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nX<|eot_id|>' }}", NULL },
        { NULL, NULL },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *got = (char *)1;
        CHECK_OK(ft_chat_default_system(cases[c].jinja, &got));
        CHECKF(cases[c].want ? (got && strcmp(got, cases[c].want) == 0) : !got, "case %zu: got \"%s\", expected \"%s\"", c,
               got ? got : "(none)", cases[c].want ? cases[c].want : "(none)");
        free(got);
    }
    ft_chat_msg user[] = { { FT_ROLE_USER, "Hi" } }, with_sys[] = { { FT_ROLE_SYSTEM, "Mine." }, { FT_ROLE_USER, "Hi" } };
    char *txt = NULL;
    size_t len = 0;
    CHECK_OK(ft_chat_render_text(&txt, &len, FT_CHAT_CHATML, "Default.", user, 1, true, "", ""));
    CHECK(txt && strcmp(txt, "<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") == 0);
    free(txt);
    txt = NULL;
    CHECK_OK(ft_chat_render_text(&txt, &len, FT_CHAT_CHATML, "Default.", with_sys, 2, false, "", ""));
    CHECK(txt && strcmp(txt, "<|im_start|>system\nMine.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n") == 0);
    free(txt);
}

static void test_json_array(void) {
    ft_data_tokenizer tk = word_tokenizer(1);
    const char *p = write_tmp("arr.json", "[\n  {\"prompt\": \"a [b] {c}\", \"completion\": \"d\"},\n"
                                          "  {\"prompt\": \"e\\\"]\",\n   \"completion\": \"f\"},\n"
                                          "  {\"prompt\": \"g\", \"completion\": 7}\n]\n");
    ft_dataset_opts o = opts_ctx(64);
    ft_dataset *ds = NULL;
    CHECK(ft_dataset_load(&ds, p, &tk, &o) == FTUNE_ERR_FORMAT);
    char want[600];
    snprintf(want, sizeof want, "%s:5: field \"completion\": expected a string, got a number", p);
    CHECK_STR(ftune_last_error(), want);
    p = write_tmp("arr2.json", "[{\"text\": \"x y\"}, {\"text\": \"z\"}]");
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->n == 2 && ds->format == FT_FMT_TEXT);
    ft_dataset_free(ds);
}

static void test_alpaca_200(void) {
    ft_data_tokenizer tk = word_tokenizer(1);
    char path[1024];
    check_data_path(path, sizeof path, "text/alpaca/alpaca_200.json");
    ft_dataset_opts o = opts_ctx(1024);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, path, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_ALPACA);
    CHECKF(ds->n == 200, "%d examples", ds->n);
    CHECK(ds->stats.n_records == 200 && ds->stats.n_truncated == 0);
    /* every example: BOS, a prompt ending in "### Response:\n", then the trained output and EOS */
    for (int i = 0; i < ds->n; i++) {
        char *un = decode(ds, i, 0), *tr = decode(ds, i, 1);
        size_t lu = strlen(un), lt = strlen(tr);
        CHECK(lu > 20 && strcmp(un + lu - 14, "### Response:\n") == 0);
        CHECK(lt >= 4 && strcmp(tr + lt - 4, "</s>") == 0);
        free(un), free(tr);
    }
    CHECK(ds->line[0] == 2); /* the first object's "{" is on line 2 */
    ft_dataset_free(ds);
}

/* Plain text: chunks of ctx_len tokens, each token after the first a target once. */
static void test_plain_text(void) {
    ft_data_tokenizer tk = word_tokenizer(0);
    char text[4096] = "";
    for (int i = 0; i < 100; i++) {
        char w[32];
        snprintf(w, sizeof w, "w%d%s", i, i % 10 == 9 ? "\n" : " ");
        strcat(text, w);
    }
    const char *p = write_tmp("corpus.txt", text);
    ft_dataset_opts o = opts_ctx(16);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->format == FT_FMT_PLAIN);
    int32_t *all = NULL;
    size_t n_all = 0;
    wt_tokenize(&WT, text, strlen(text), &all, &n_all);
    CHECKF(ds->stats.n_targets == (int64_t)n_all - 1, "%lld targets, %zu tokens", (long long)ds->stats.n_targets, n_all);
    CHECK(ds->stats.max_len == 16);
    /* consecutive chunks overlap by one token; together they are the stream */
    int64_t k = 0;
    for (int i = 0; i < ds->n; i++) {
        const int32_t *t = ds->tokens + ds->off[i];
        int len = ft_dataset_len(ds, i);
        if (i > 0) k--;
        for (int j = 0; j < len; j++, k++) CHECK(k < (int64_t)n_all && t[j] == all[k]);
    }
    CHECK(k == (int64_t)n_all);
    ft_dataset_free(ds);

    /* with BOS: every chunk starts with it and every token is a target */
    tk = word_tokenizer(1);
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) { free(all); return; }
    CHECK(ds->stats.n_targets == (int64_t)n_all);
    for (int i = 0; i < ds->n; i++) CHECK(ds->tokens[ds->off[i]] == 1 && ft_dataset_len(ds, i) <= 16);
    ft_dataset_free(ds);
    free(all);
}

static void test_truncate_and_drop(void) {
    ft_data_tokenizer tk = word_tokenizer(0);
    const char *p = write_tmp("long.jsonl", "{\"prompt\": \"p\", \"completion\": \" a b c d e f g h\"}\n"
                                            "{\"prompt\": \"p\", \"completion\": \" a\"}\n"
                                            "{\"prompt\": \"p q r s t u v w x y\", \"completion\": \" a\"}\n");
    ft_dataset_opts o = opts_ctx(6);
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    /* the third loses all of its completion to truncation: dropped, and
     * counted apart from examples that never had a target */
    CHECK(ds->n == 2);
    CHECK(ds->stats.n_truncated == 2);
    CHECK(ds->stats.n_truncated_empty == 1 && ds->stats.n_dropped_empty == 0);
    CHECK(ft_dataset_len(ds, 0) == 6 && ft_dataset_len(ds, 1) == 3);
    CHECK(ds->stats.max_len == 6);
    ft_dataset_free(ds);
    /* --truncate prompt: prompt tokens go first, from the left; the first
     * example has a 1-token prompt and keeps cutting its end */
    o.truncate = FT_TRUNC_PROMPT;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->n == 3 && ds->stats.n_truncated == 2 && ds->stats.n_truncated_empty == 0);
    char *a = decode(ds, 0, -1), *c = decode(ds, 2, -1), *ct = decode(ds, 2, 1);
    CHECK_STR(a, " a b c d e f");
    CHECK_STR(c, " v w x y a</s>");
    CHECK_STR(ct, " a</s>");
    free(a), free(c), free(ct);
    ft_dataset_free(ds);
    /* with BOS it stays first */
    ft_data_tokenizer tkb = word_tokenizer(1);
    CHECK_OK(ft_dataset_load(&ds, p, &tkb, &o));
    if (!ds) return;
    c = decode(ds, 2, -1);
    CHECK_STR(c, "<s> w x y a</s>");
    free(c);
    ft_dataset_free(ds);
    o.truncate = FT_TRUNC_END;
    o.drop_long = true;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (!ds) return;
    CHECK(ds->n == 1 && ds->stats.n_dropped_long == 2 && ds->stats.n_truncated == 0);
    CHECK(ds->line[0] == 2);
    ft_dataset_free(ds);
    /* nothing left: an error that says why */
    o.ctx_len = 2;
    CHECK(ft_dataset_load(&ds, p, &tk, &o) == FTUNE_ERR_FORMAT);
    CHECKF(strstr(ftune_last_error(), "no examples") != NULL, "%s", ftune_last_error());
}

/* ------------------------------------------------------------ bad input */

static void test_bad_input(void) {
    ft_data_tokenizer tk = word_tokenizer(1);
    struct { const char *content; int line; const char *msg; ft_dataset_opts o; } cases[] = {
        { "{\"text\": \"a\"}\n{\"text\": \"b\"\n", 2, "not valid JSON", { .ctx_len = 64 } },
        { "{\"text\": \"a\"}\n\n{\"text\": 3}\n", 3, "field \"text\": expected a string, got a number", { .ctx_len = 64 } },
        { "{\"text\": \"a\"}\n{\"txt\": \"b\"}\n", 2, "field \"text\" missing", { .ctx_len = 64 } },
        { "{\"foo\": 1}\n", 1, "record has none of the known fields", { .ctx_len = 64 } },
        { "[1, 2]\n", 1, "expected a JSON object, got a number", { .ctx_len = 64 } },
        { "{\"text\": \"a\"} {\"text\": \"b\"}\n", 1, "text after the JSON value", { .ctx_len = 64 } },
        { "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": null, \"completion\": \"b\"}\n", 2,
          "field \"prompt\": expected a string, got null", { .ctx_len = 64 } },
        { "{\"instruction\": \"a\", \"input\": 5, \"output\": \"b\"}\n", 1, "field \"input\": expected a string, got a number", { .ctx_len = 64 } },
        { "{\"messages\": \"hi\"}\n", 1, "field \"messages\": expected an array, got a string", { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": []}\n", 1, "field \"messages\": empty list", { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"bot\", \"content\": \"c\"}]}\n",
          1, "field \"messages\"[2].role: unknown role \"bot\" (expected system, user, assistant)", { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": [{\"role\": \"user\", \"content\": [1]}]}\n", 1, "field \"messages\"[0].content: expected a string, got an array",
          { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": [{\"content\": \"x\"}]}\n", 1, "field \"messages\"[0].role missing", { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": [\"x\"]}\n", 1, "field \"messages\"[0]: expected an object, got a string", { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
        { "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n", 1, "field \"messages\"[0].role: \"assistant\" where the llama2 template needs \"user\"",
          { .ctx_len = 64, .chat_template = FT_CHAT_LLAMA2 } },
        { "{\"text\": \"ok\"}\n{\"text\": \"bad \xff byte\"}\n", 2, "invalid UTF-8", { .ctx_len = 64 } },
        { "{\"text\": \"a\"}\n", 1, "field \"prompt\" missing", { .ctx_len = 64, .format = FT_FMT_COMPLETION } },
        /* a NUL would cut the C string short: refused, raw or escaped */
        { "{\"text\": \"a\"}\n{\"text\": \"a\\u0000b\"}\n", 2, "a NUL character in the record (column 12)", { .ctx_len = 64 } },
        { "[{\"text\": \"a\"},\n {\"text\": \"a\\u0000b\"}]\n", 2, "a NUL character", { .ctx_len = 64 } },
        { "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u0000\"}]}\n", 1, "a NUL character",
          { .ctx_len = 64, .chat_template = FT_CHAT_CHATML } },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *p = write_tmp("train.jsonl", cases[c].content);
        ft_dataset *ds = NULL;
        ftune_status st = ft_dataset_load(&ds, p, &tk, &cases[c].o);
        CHECKF(st == FTUNE_ERR_FORMAT, "case %zu: %s (%s)", c, ftune_status_name(st), ftune_last_error());
        CHECK(ds == NULL);
        char want[700];
        snprintf(want, sizeof want, "%s:%d: %s", p, cases[c].line, cases[c].msg);
        CHECKF(strncmp(ftune_last_error(), want, strlen(want)) == 0, "case %zu:\n    got      %s\n    expected %s...", c,
               ftune_last_error(), want);
        ft_dataset_free(ds);
    }
    /* the file named in the message is the one given, e.g. "train.jsonl:17: ..." */
    char cwd[1024];
    if (getcwd(cwd, sizeof cwd) && chdir(tmpdir) == 0) {
        write_tmp("train.jsonl", "{\"text\": \"a\"}\n{\"text\": \"a\"}\n{\"messages\": 1}\n");
        ft_dataset *ds = NULL;
        ft_dataset_opts o = opts_ctx(64);
        CHECK(ft_dataset_load(&ds, "train.jsonl", &tk, &o) == FTUNE_ERR_FORMAT);
        CHECK_STR(ftune_last_error(), "train.jsonl:3: field \"text\" missing");
        CHECK(chdir(cwd) == 0);
    }
    /* a raw NUL byte, and escapes that only look like \u0000 are fine */
    {
        const char raw[] = "{\"text\": \"a\"}\n{\"text\": \"a\0b\"}\n";
        ft_dataset *d = NULL;
        ft_dataset_opts o = opts_ctx(64);
        CHECK(ft_dataset_load_buffer(&d, "raw.jsonl", raw, sizeof raw - 1, &tk, &o) == FTUNE_ERR_FORMAT);
        CHECK_STR(ftune_last_error(), "raw.jsonl:2: a NUL character in the record (column 12); text may not contain NUL");
        const char ok[] = "{\"text\": \"a\\\\u0000 \\u0001\"}\n";
        CHECK_OK(ft_dataset_load_buffer(&d, "ok.jsonl", ok, sizeof ok - 1, &tk, &o));
        if (d) {
            char *t = decode(d, 0, 1);
            CHECK_STR(t, "a\\u0000 \x01</s>");
            free(t);
        }
        ft_dataset_free(d);
    }
    /* a missing file is an I/O error */
    ft_dataset *ds = NULL;
    ft_dataset_opts o = opts_ctx(64);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/nope.jsonl", tmpdir);
    CHECK(ft_dataset_load(&ds, missing, &tk, &o) == FTUNE_ERR_IO);
}

/* ------------------------------------------------------------ split and batches */

/* n text examples "e<i> x x ..." of varied lengths; example i's first word names it. */
static ft_dataset *numbered_dataset(int n, int ctx, uint32_t seed) {
    ft_data_tokenizer tk = word_tokenizer(1);
    size_t cap = (size_t)n * 200 + 1;
    char *buf = malloc(cap), *q = buf;
    ft_rng r;
    ft_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        q += sprintf(q, "{\"text\": \"e%d", i);
        int words = (int)(ft_rng_u32(&r) % 12);
        for (int w = 0; w < words; w++) q += sprintf(q, " x");
        q += sprintf(q, "\"}\n");
    }
    ft_dataset *ds = NULL;
    ft_dataset_opts o = opts_ctx(ctx);
    ftune_status st = ft_dataset_load_buffer(&ds, "numbered.jsonl", buf, (size_t)(q - buf), &tk, &o);
    free(buf);
    if (st) fprintf(stderr, "  %s\n", ftune_last_error());
    return ds;
}

/* The example a token sequence starts with ("e<i>" after BOS). */
static int example_id(const int32_t *tok) { return atoi(WT.piece[tok[1]] + 1); }

static void test_val_split(void) {
    ft_dataset *a = numbered_dataset(50, 64, 1), *b = numbered_dataset(50, 64, 1), *c = numbered_dataset(50, 64, 1);
    if (!a || !b || !c) { CHECK(0); return; }
    int64_t tokens = a->stats.n_tokens, targets = a->stats.n_targets;
    ft_dataset *va = NULL, *vb = NULL, *vc = NULL;
    CHECK_OK(ft_dataset_split(a, 0.1, 7, &va));
    CHECK_OK(ft_dataset_split(b, 0.1, 7, &vb));
    CHECK_OK(ft_dataset_split(c, 0.1, 8, &vc));
    if (!va || !vb || !vc) { CHECK(0); return; }
    CHECK(va->n == 5 && a->n == 45);
    CHECK(a->stats.n_tokens + va->stats.n_tokens == tokens);
    CHECK(a->stats.n_targets + va->stats.n_targets == targets);
    int seen[50] = {0};
    for (int i = 0; i < a->n; i++) seen[example_id(a->tokens + a->off[i])] += 1;
    for (int i = 0; i < va->n; i++) seen[example_id(va->tokens + va->off[i])] += 10;
    int in_train = 0, in_val = 0;
    for (int i = 0; i < 50; i++) { in_train += seen[i] == 1; in_val += seen[i] == 10; }
    CHECK(in_train == 45 && in_val == 5); /* disjoint, and together all of them */
    /* the same seed picks the same examples; another seed picks others */
    bool same = va->n == vb->n, differs = false;
    for (int i = 0; same && i < va->n; i++) same = example_id(va->tokens + va->off[i]) == example_id(vb->tokens + vb->off[i]);
    for (int i = 0; i < va->n && i < vc->n; i++) differs |= example_id(va->tokens + va->off[i]) != example_id(vc->tokens + vc->off[i]);
    CHECK(same);
    CHECK(differs);
    /* order is kept within each part, and line numbers travel with examples */
    for (int i = 1; i < a->n; i++) CHECK(a->line[i] > a->line[i - 1]);
    for (int i = 0; i < va->n; i++) CHECK(va->line[i] == example_id(va->tokens + va->off[i]) + 1);
    ft_dataset *none = NULL;
    CHECK_OK(ft_dataset_split(a, 0.0, 7, &none));
    CHECK(none == NULL && a->n == 45);
    CHECK(ft_dataset_split(a, 1.0, 7, &none) == FTUNE_ERR_ARG);
    ft_dataset_free(a), ft_dataset_free(b), ft_dataset_free(c);
    ft_dataset_free(va), ft_dataset_free(vb), ft_dataset_free(vc);
}

/* Checks a batch's invariants against the dataset: tokens copied, targets
 * are the next token of the same example where the mask says so, pos
 * restarts per example, doc ids distinct per example, padding inert.
 * Marks each example's appearance in count[]. */
static void check_batch(const ft_dataset *ds, const ft_batch *b, int *count) {
    int64_t n_targets = 0;
    for (int r = 0; r < b->B; r++) {
        const int32_t *tok = b->tokens + (size_t)r * b->T;
        const int *tgt = b->targets + (size_t)r * b->T, *pos = b->pos + (size_t)r * b->T, *doc = b->doc + (size_t)r * b->T;
        int t = 0;
        while (t < b->T && doc[t] >= 0) {
            CHECK(pos[t] == 0);
            int e = example_id(tok + t), len = ft_dataset_len(ds, e), d = doc[t];
            count[e]++;
            CHECK(t + len <= b->T);
            const int32_t *et = ds->tokens + ds->off[e];
            const uint8_t *em = ds->mask + ds->off[e];
            for (int j = 0; j < len; j++) {
                CHECK(tok[t + j] == et[j] && pos[t + j] == j && doc[t + j] == d);
                int want = (j + 1 < len && em[j + 1]) ? et[j + 1] : -1;
                CHECK(tgt[t + j] == want);
                n_targets += want >= 0;
            }
            t += len;
            CHECK(t == b->T || doc[t] != d);
        }
        for (; t < b->T; t++) CHECK(doc[t] == -1 && tgt[t] == -1 && tok[t] == 0);
    }
    /* doc ids distinct within the batch */
    int n_docs = 0;
    for (size_t i = 0; i < (size_t)b->B * b->T; i++)
        if (b->doc[i] >= 0 && (i == 0 || b->pos[i] == 0)) n_docs++;
    CHECK(n_docs == b->n_examples);
    for (size_t i = 0; i < (size_t)b->B * b->T; i++)
        for (size_t j = i + 1; j < (size_t)b->B * b->T; j++)
            if (b->pos[i] == 0 && b->pos[j] == 0 && b->doc[i] >= 0) CHECK(b->doc[i] != b->doc[j]);
    CHECK(b->n_targets == n_targets);
}

static void test_dynamic_padding(void) {
    ft_dataset *ds = numbered_dataset(10, 64, 3);
    if (!ds) { CHECK(0); return; }
    ft_batch_iter *it = NULL;
    ft_batch_opts bo = { .B = 4, .T = 64, .pack = false, .shuffle = false, .seed = 1, .pad_id = 0 };
    CHECK_OK(ft_batch_iter_new(&it, ds, &bo));
    ft_batch b;
    CHECK_OK(ft_batch_init(&b, 4, 64));
    if (!it) return;
    int count[10] = {0}, rows[3];
    for (int k = 0; k < 3; k++) {
        CHECK_OK(ft_batch_iter_next(it, &b));
        rows[k] = b.B;
        int longest = 0;
        for (int r = 0; r < b.B; r++) {
            int e = example_id(b.tokens + (size_t)r * b.T);
            CHECK(e == 4 * k + r); /* file order without shuffle */
            if (ft_dataset_len(ds, e) > longest) longest = ft_dataset_len(ds, e);
        }
        CHECK(b.T == longest); /* padded to the longest in the batch, not to 64 */
        CHECK(b.n_examples == b.B);
        check_batch(ds, &b, count);
    }
    CHECK(rows[0] == 4 && rows[1] == 4 && rows[2] == 2); /* the epoch's last batch is short */
    for (int i = 0; i < 10; i++) CHECK(count[i] == 1);
    ft_data_cursor c = ft_batch_iter_cursor(it);
    CHECK(c.epoch == 0 && c.index == 10);
    CHECK_OK(ft_batch_iter_next(it, &b));
    c = ft_batch_iter_cursor(it);
    CHECK(c.epoch == 1 && c.index == 4);
    int64_t nb;
    CHECK_OK(ft_batch_iter_epoch_batches(it, 0, &nb));
    CHECK(nb == 3);
    /* an iterator whose T is below the longest example is refused */
    ft_batch_iter *bad = NULL;
    bo.T = ds->stats.max_len - 1;
    CHECK(ft_batch_iter_new(&bad, ds, &bo) == FTUNE_ERR_ARG);
    ft_batch_free(&b);
    ft_batch_iter_free(it);
    ft_dataset_free(ds);
}

static void test_packing(void) {
    ft_dataset *ds = numbered_dataset(40, 16, 5);
    if (!ds) { CHECK(0); return; }
    ft_batch_iter *it = NULL;
    ft_batch_opts bo = { .B = 2, .T = 32, .pack = true, .shuffle = true, .seed = 9, .pad_id = 0 };
    CHECK_OK(ft_batch_iter_new(&it, ds, &bo));
    if (!it) return;
    ft_batch b;
    CHECK_OK(ft_batch_init(&b, 2, 32));
    int count[40] = {0}, batches = 0, max_in_row = 0;
    int64_t total_targets = 0;
    while (ft_batch_iter_cursor(it).epoch == 0 && ft_batch_iter_cursor(it).index < ds->n) {
        CHECK_OK(ft_batch_iter_next(it, &b));
        batches++;
        check_batch(ds, &b, count);
        total_targets += b.n_targets;
        for (int r = 0; r < b.B; r++) {
            int in_row = 0;
            for (int t = 0; t < b.T; t++) in_row += b.doc[(size_t)r * b.T + t] >= 0 && b.pos[(size_t)r * b.T + t] == 0;
            if (in_row > max_in_row) max_in_row = in_row;
        }
        if (batches > 100) break;
    }
    for (int i = 0; i < 40; i++) CHECKF(count[i] == 1, "example %d seen %d times", i, count[i]);
    CHECK(total_targets == ds->stats.n_targets); /* packing loses no target, adds none across examples */
    CHECKF(max_in_row >= 3, "at most %d examples in a row", max_in_row); /* examples are 2..13 tokens, rows 32 */
    int64_t nb;
    CHECK_OK(ft_batch_iter_epoch_batches(it, 0, &nb));
    CHECK(nb == batches);
    CHECKF(batches < 20, "%d batches for 40 examples", batches); /* unpacked it would be 20 */
    ft_batch_free(&b);
    ft_batch_iter_free(it);
    ft_dataset_free(ds);
}

/* Same seed: same batches; a new iterator seeked to a saved cursor replays
 * exactly what the first one produced after that point. */
static void test_shuffle_resume(void) {
    ft_dataset *ds = numbered_dataset(23, 16, 11);
    if (!ds) { CHECK(0); return; }
    for (int pack = 0; pack < 2; pack++) {
        ft_batch_opts bo = { .B = 3, .T = 32, .pack = pack, .shuffle = true, .seed = 42, .pad_id = 0 };
        ft_batch_iter *a = NULL, *c = NULL;
        CHECK_OK(ft_batch_iter_new(&a, ds, &bo));
        CHECK_OK(ft_batch_iter_new(&c, ds, &bo));
        if (!a || !c) return;
        ft_batch b1, b2;
        CHECK_OK(ft_batch_init(&b1, 3, 32));
        CHECK_OK(ft_batch_init(&b2, 3, 32));
        enum { STEPS = 30 };
        int first[STEPS][3];
        ft_data_cursor saved = { 0, 0 };
        int saved_at = 17, epoch_count[3][23] = {{0}};
        for (int s = 0; s < STEPS; s++) {
            if (s == saved_at) saved = ft_batch_iter_cursor(a);
            CHECK_OK(ft_batch_iter_next(a, &b1));
            int ep = (int)ft_batch_iter_cursor(a).epoch;
            for (int r = 0; r < 3; r++) first[s][r] = r < b1.B ? example_id(b1.tokens + (size_t)r * b1.T) : -1;
            int dummy[23] = {0};
            check_batch(ds, &b1, dummy);
            for (int e = 0; e < 23; e++) if (ep < 3) epoch_count[ep][e] += dummy[e];
        }
        /* each finished epoch is a permutation */
        for (int e = 0; e < 23; e++) CHECK(epoch_count[0][e] == 1);
        CHECK(saved.epoch >= 1); /* the saved cursor is past an epoch boundary */
        /* epochs are shuffled differently */
        int o0[23], o1[23];
        ft_batch_epoch_order(o0, 23, 42, 0, true);
        ft_batch_epoch_order(o1, 23, 42, 1, true);
        CHECK(memcmp(o0, o1, sizeof o0) != 0);
        CHECK_OK(ft_batch_iter_seek(c, saved));
        for (int s = saved_at; s < STEPS; s++) {
            CHECK_OK(ft_batch_iter_next(c, &b2));
            for (int r = 0; r < 3; r++) {
                int e = r < b2.B ? example_id(b2.tokens + (size_t)r * b2.T) : -1;
                CHECKF(e == first[s][r], "pack %d step %d row %d: %d vs %d", pack, s, r, e, first[s][r]);
            }
        }
        CHECK(ft_batch_iter_cursor(a).epoch == ft_batch_iter_cursor(c).epoch &&
              ft_batch_iter_cursor(a).index == ft_batch_iter_cursor(c).index);
        ft_data_cursor bad = { 0, 24 };
        CHECK(ft_batch_iter_seek(c, bad) == FTUNE_ERR_RANGE);
        ft_batch_free(&b1), ft_batch_free(&b2);
        ft_batch_iter_free(a), ft_batch_iter_free(c);
    }
    ft_dataset_free(ds);
}

/* ft_batch_iter_cursor_after(n), which resume checks a checkpoint's data
 * cursor against, is where n calls of ft_batch_iter_next leave the cursor:
 * with and without packing, shuffled or not, across epoch ends (an epoch's
 * end stays in that epoch), and it does not move the iterator. */
static void test_cursor_after(void) {
    ft_dataset *ds = numbered_dataset(23, 16, 11);
    if (!ds) { CHECK(0); return; }
    for (int pack = 0; pack < 2; pack++)
        for (int shuffle = 0; shuffle < 2; shuffle++) {
            ft_batch_opts bo = { .B = 3, .T = 32, .pack = pack, .shuffle = shuffle, .seed = 5, .pad_id = 0 };
            ft_batch_iter *it = NULL;
            CHECK_OK(ft_batch_iter_new(&it, ds, &bo));
            if (!it) continue;
            ft_batch b;
            CHECK_OK(ft_batch_init(&b, 3, 32));
            ft_data_cursor c;
            CHECK_OK(ft_batch_iter_cursor_after(it, 0, &c));
            CHECK(c.epoch == 0 && c.index == 0);
            for (int n = 1; n <= 40; n++) { /* 8 batches per epoch unpacked: 5 epochs */
                CHECK_OK(ft_batch_iter_next(it, &b));
                ft_data_cursor want = ft_batch_iter_cursor(it);
                CHECK_OK(ft_batch_iter_cursor_after(it, (uint64_t)n, &c));
                CHECKF(c.epoch == want.epoch && c.index == want.index, "pack %d shuffle %d after %d: (%lld, %lld) vs "
                       "(%lld, %lld)", pack, shuffle, n, (long long)c.epoch, (long long)c.index, (long long)want.epoch,
                       (long long)want.index);
                CHECK(ft_batch_iter_cursor(it).index == want.index);
            }
            ft_batch_free(&b);
            ft_batch_iter_free(it);
        }
    ft_dataset_free(ds);
}

/* Segments whose boundary falls inside a word are tokenized apart, so the
 * mask boundary is kept; at a word boundary the context gives the same
 * tokens as tokenizing the whole string. */
static void test_segment_boundaries(void) {
    ft_data_tokenizer tk = word_tokenizer(0);
    ft_segments s = {0};
    CHECK_OK(ft_segments_str(&s, false, "Hello wor"));
    CHECK_OK(ft_segments_str(&s, true, "ld again"));
    CHECK_OK(ft_segments_str(&s, true, "<|im_end|>"));
    CHECK(s.n == 2); /* same-flag text merges */
    int32_t *ids;
    uint8_t *mask;
    size_t n;
    CHECK_OK(ft_segments_tokenize(&s, &tk, &ids, &mask, &n));
    const char *want[] = { "Hello", " wor", "ld", " again", "<|im_end|>" };
    CHECK(n == 5);
    for (size_t i = 0; i < n && i < 5; i++) {
        CHECK_STR(WT.piece[ids[i]], want[i]);
        CHECK(mask[i] == (i >= 2));
    }
    free(ids), free(mask);
    ft_segments_free(&s);
    /* whole-string agreement where the boundary is between tokens */
    CHECK_OK(ft_segments_str(&s, false, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant:"));
    CHECK_OK(ft_segments_str(&s, true, " an answer<|im_end|>"));
    CHECK_OK(ft_segments_str(&s, false, "\n"));
    CHECK_OK(ft_segments_special(&s, FT_SEG_EOS, true));
    CHECK_OK(ft_segments_tokenize(&s, &tk, &ids, &mask, &n));
    int32_t *whole;
    size_t n_whole;
    wt_tokenize(&WT, s.text, s.len, &whole, &n_whole);
    CHECK(n == n_whole + 1 && memcmp(ids, whole, n_whole * sizeof *ids) == 0 && ids[n - 1] == tk.eos_id);
    free(ids), free(mask), free(whole);
    ft_segments_free(&s);
}


/* ------------------------------------------------------------ real tokenizers */

/* Concatenated pieces of ids[i] where mask[i] == want (want < 0: all). */
static char *decode_real(const ftune_tokenizer *t, const int32_t *ids, const uint8_t *mask, size_t n, int want) {
    size_t cap = 16 * n + 1, len = 0;
    char *s = calloc(cap, 1);
    for (size_t i = 0; i < n; i++) {
        char buf[256];
        int k = ftune_token_to_piece(t, i ? ids[i - 1] : -1, ids[i], buf, sizeof buf);
        if (k < 0 || (want >= 0 && mask[i] != want)) continue;
        if (len + (size_t)k + 1 > cap) s = realloc(s, cap = 2 * (len + (size_t)k + 1));
        memcpy(s + len, buf, (size_t)k);
        s[len += (size_t)k] = 0;
    }
    return s;
}

/* Meta's Llama 3 chat_dialog test vector: system + user + the assistant
 * header, tokenized with the Llama 3 tokenizer. */
static void test_llama3_chat_vector(void) {
    char path[1024];
    ftune_tokenizer *t = NULL;
    CHECK_OK(ft_tokenizer_from_tiktoken(&t, check_data_path(path, sizeof path, "tokenizers/llama3/tokenizer.model")));
    char *json = NULL;
    size_t len;
    CHECK_OK(ft_read_file(check_data_path(path, sizeof path, "tokenizers/llama3/test_vectors.json"), &json, &len));
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    CHECK(root != NULL);
    if (!t || !root) { ft_tokenizer_free(t); cJSON_Delete(root); return; }
    ft_data_tokenizer tk;
    ft_data_tokenizer_init(&tk, t);
    int found = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const cJSON *dialog = cJSON_GetObjectItem(c, "chat_dialog"), *want = cJSON_GetObjectItem(c, "ids");
        if (!dialog || !want) continue;
        found++;
        ft_chat_msg m[8];
        int n = 0;
        const cJSON *d;
        cJSON_ArrayForEach(d, dialog) {
            if (n == 8) break;
            m[n].role = (ft_chat_role)ft_chat_role_parse(cJSON_GetObjectItem(d, "role")->valuestring);
            m[n++].content = cJSON_GetObjectItem(d, "content")->valuestring;
        }
        int32_t *ids = NULL;
        uint8_t *mask = NULL;
        size_t n_ids = 0;
        CHECK_OK(ft_chat_tokenize(&tk, FT_CHAT_LLAMA3, NULL, m, n, true, &ids, &mask, &n_ids));
        CHECKF(n_ids == (size_t)cJSON_GetArraySize(want), "%zu ids, expected %d", n_ids, cJSON_GetArraySize(want));
        size_t i = 0;
        const cJSON *w;
        cJSON_ArrayForEach(w, want) {
            CHECKF(i < n_ids && ids[i] == w->valueint, "id %zu: %d, expected %d", i, i < n_ids ? ids[i] : -1, w->valueint);
            i++;
        }
        free(ids), free(mask);
    }
    CHECK(found == 1);
    cJSON_Delete(root);
    ft_tokenizer_free(t);
}

/* With a real tokenizer, rendering segment by segment gives the same ids
 * as tokenizing the whole rendered string, and the trained ids decode to
 * exactly the assistant/output text plus the end-of-turn token. */
static void check_whole_string(const ftune_tokenizer *t, const ft_dataset *ds, int i, const char *whole,
                               const char *trained) {
    const int32_t *ids = ds->tokens + ds->off[i];
    const uint8_t *mask = ds->mask + ds->off[i];
    size_t n = (size_t)ft_dataset_len(ds, i);
    int32_t *w = NULL;
    size_t nw = 0;
    CHECK_OK(ftune_tokenize(t, whole, strlen(whole), 0, 1, &w, &nw));
    CHECKF(nw == n && memcmp(w, ids, n * sizeof *ids) == 0, "example %d: %zu ids vs %zu for the whole string", i, n, nw);
    char *tr = decode_real(t, ids, mask, n, 1);
    CHECK_STR(tr, trained);
    free(tr);
    free(w);
}

static void test_llama3_chat_dataset(void) {
    char path[1024];
    ftune_tokenizer *t = NULL;
    CHECK_OK(ft_tokenizer_from_tiktoken(&t, check_data_path(path, sizeof path, "tokenizers/llama3/tokenizer.model")));
    if (!t) return;
    ft_data_tokenizer tk;
    ft_data_tokenizer_init(&tk, t);
    const char *p = write_tmp("l3.jsonl",
                              "{\"messages\": [{\"role\": \"system\", \"content\": \"  Be brief. \"},"
                              " {\"role\": \"user\", \"content\": \"What's 2+2?\"}, {\"role\": \"assistant\", \"content\": \"4, of course!\"},"
                              " {\"role\": \"user\", \"content\": \"And 3+3?\\n\"}, {\"role\": \"assistant\", \"content\": \"  6\\n\\nDone.\"}]}\n");
    ft_dataset_opts o = opts_ctx(256);
    o.chat_template = FT_CHAT_LLAMA3;
    ft_dataset *ds = NULL;
    CHECK_OK(ft_dataset_load(&ds, p, &tk, &o));
    if (ds) {
        CHECK(ds->n == 1 && ds->tokens[0] == 128000);
        check_whole_string(t, ds, 0,
                           "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nWhat's 2+2?<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n4, of course!<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n6\n\nDone.<|eot_id|>",
                           "4, of course!<|eot_id|>6\n\nDone.<|eot_id|>");
    }
    ft_dataset_free(ds);
    ft_tokenizer_free(t);
}

/* stories260K's SentencePiece tokenizer on the Alpaca file: 200 examples,
 * BOS first, EOS last, and the same ids as the whole string. */
static void test_stories260K_alpaca(void) {
    char path[1024];
    ftune_tokenizer *t = NULL;
    CHECK_OK(ft_tokenizer_from_hf_dir(&t, check_data_path(path, sizeof path, "models/stories260K-hf")));
    if (!t) return;
    ft_data_tokenizer tk;
    ft_data_tokenizer_init(&tk, t);
    CHECK(tk.add_bos && tk.bos_id == 1 && tk.eos_id == 2);
    ft_dataset_opts o = opts_ctx(4096);
    ft_dataset *ds = NULL;
    double t0 = ft_time_s();
    CHECK_OK(ft_dataset_load(&ds, check_data_path(path, sizeof path, "text/alpaca/alpaca_200.json"), &tk, &o));
    if (!ds) { ft_tokenizer_free(t); return; }
    printf("  alpaca_200 with stories260K: %d examples, %lld tokens, %lld targets, longest %d, %.2f s\n", ds->n,
           (long long)ds->stats.n_tokens, (long long)ds->stats.n_targets, ds->stats.max_len, ft_time_s() - t0);
    CHECK(ds->n == 200 && ds->stats.n_truncated == 0);
    char *json = NULL;
    size_t len;
    CHECK_OK(ft_read_file(path, &json, &len));
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    free(json);
    int i = 0, same = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, root) {
        if (i >= ds->n) break;
        const char *ins = cJSON_GetObjectItem(r, "instruction")->valuestring;
        const char *inp = cJSON_GetObjectItem(r, "input")->valuestring;
        const char *out = cJSON_GetObjectItem(r, "output")->valuestring;
        const int32_t *ids = ds->tokens + ds->off[i];
        size_t n = (size_t)ft_dataset_len(ds, i);
        CHECK(ids[0] == 1 && ids[n - 1] == 2 && ds->mask[ds->off[i]] == 0 && ds->mask[ds->off[i + 1] - 1] == 1);
        ft_segments s = {0};
        CHECK_OK(ft_alpaca_prompt(&s, false, ins, inp));
        CHECK_OK(ft_segments_str(&s, true, out));
        int32_t *w = NULL;
        size_t nw = 0;
        CHECK_OK(ftune_tokenize(t, s.text, s.len, 0, 1, &w, &nw));
        same += nw + 2 == n && memcmp(w, ids + 1, nw * sizeof *w) == 0;
        /* the trained ids decode to the output (then EOS) */
        char *tr = decode_real(t, ids, ds->mask + ds->off[i], n - 1, 1);
        CHECKF(strcmp(tr, out) == 0, "example %d: \"%s\" vs \"%s\"", i, tr, out);
        free(tr), free(w);
        ft_segments_free(&s);
        i++;
    }
    CHECKF(same == 200, "%d of 200 examples match the whole-string tokenization", same);
    cJSON_Delete(root);
    ft_dataset_free(ds);
    ft_tokenizer_free(t);
}

/* ------------------------------------------------------------ bounded tokenization */

/* Whether two datasets are identical: examples, tokens, masks, lines, counts. */
static bool same_dataset(const ft_dataset *a, const ft_dataset *b) {
    if (a->n != b->n || memcmp(a->off, b->off, (size_t)(a->n + 1) * sizeof *a->off) != 0) return false;
    if (memcmp(a->line, b->line, (size_t)a->n * sizeof *a->line) != 0) return false;
    size_t nt = (size_t)a->off[a->n];
    if (memcmp(a->tokens, b->tokens, nt * sizeof *a->tokens) != 0 || memcmp(a->mask, b->mask, nt) != 0) return false;
    const ft_dataset_stats *x = &a->stats, *y = &b->stats;
    return x->n_records == y->n_records && x->n_truncated == y->n_truncated && x->n_truncated_empty == y->n_truncated_empty &&
           x->n_dropped_long == y->n_dropped_long && x->n_dropped_empty == y->n_dropped_empty &&
           x->n_tokens == y->n_tokens && x->n_targets == y->n_targets && x->max_len == y->max_len;
}

static char *json_escaped(const char *s, size_t n) {
    cJSON *str = cJSON_CreateString("");
    char *tmp = strndup(s, n);
    cJSON_SetValuestring(str, tmp);
    char *out = cJSON_PrintUnformatted(str);
    free(tmp);
    cJSON_Delete(str);
    return out;
}

/* Tokenizing only a bounded prefix of each field (the default) gives the
 * same dataset as tokenizing whole records, on real data with real
 * tokenizers, at contexts where bounding cuts most records: Alpaca,
 * GSM8K with custom keys, chat rendered from Alpaca, and one 1.1 MB
 * record of Shakespeare; for end and prompt-first truncation and drop. */
static void test_bounded_tokenization(void) {
    char path[1024], p2[1024];
    ftune_tokenizer *toks[3] = { NULL, NULL, NULL };
    const char *tname[3] = { "stories260K (SentencePiece BPE)", "llama3 (tiktoken)", "gpt2 (byte-level BPE)" };
    CHECK_OK(ft_tokenizer_from_hf_dir(&toks[0], check_data_path(path, sizeof path, "models/stories260K-hf")));
    CHECK_OK(ft_tokenizer_from_tiktoken(&toks[1], check_data_path(path, sizeof path, "tokenizers/llama3/tokenizer.model")));
    CHECK_OK(ft_tokenizer_from_hf_dir(&toks[2], check_data_path(path, sizeof path, "tokenizers/gpt2")));
    /* the data: files as they are, and two made from them */
    char *shake = NULL, *alp = NULL;
    size_t shake_len = 0, alp_len = 0;
    CHECK_OK(ft_read_file(check_data_path(path, sizeof path, "text/tinyshakespeare/input.txt"), &shake, &shake_len));
    CHECK_OK(ft_read_file(check_data_path(p2, sizeof p2, "text/alpaca/alpaca_200.json"), &alp, &alp_len));
    if (!shake || !alp) goto out;
    char *esc = json_escaped(shake, shake_len);
    size_t big_len = strlen(esc) + 16;
    char *big = malloc(big_len);
    snprintf(big, big_len, "{\"text\": %s}\n", esc);
    free(esc);
    const char *big_path = write_tmp("shakespeare_one_record.jsonl", big);
    char big_copy[512];
    snprintf(big_copy, sizeof big_copy, "%s", big_path);
    free(big);
    cJSON *root = cJSON_Parse(alp);
    size_t cap = alp_len * 2 + 1024, used = 0;
    char *chat = malloc(cap);
    const cJSON *r;
    cJSON_ArrayForEach(r, root) {
        cJSON *rec = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(rec, "messages");
        cJSON *u = cJSON_CreateObject(), *a = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", cJSON_GetObjectItem(r, "instruction")->valuestring);
        cJSON_AddStringToObject(a, "role", "assistant");
        cJSON_AddStringToObject(a, "content", cJSON_GetObjectItem(r, "output")->valuestring);
        cJSON_AddItemToArray(msgs, u);
        cJSON_AddItemToArray(msgs, a);
        char *line = cJSON_PrintUnformatted(rec);
        used += (size_t)snprintf(chat + used, cap - used, "%s\n", line);
        free(line);
        cJSON_Delete(rec);
    }
    cJSON_Delete(root);
    const char *chat_path = write_tmp("alpaca_chat.jsonl", chat);
    char chat_copy[512];
    snprintf(chat_copy, sizeof chat_copy, "%s", chat_path);
    free(chat);
    char alpaca_path[1024], gsm_path[1024];
    check_data_path(alpaca_path, sizeof alpaca_path, "text/alpaca/alpaca_200.json");
    check_data_path(gsm_path, sizeof gsm_path, "text/gsm8k/test.jsonl");
    struct { const char *path; ft_chat_template tmpl; bool keys; } files[] = {
        { alpaca_path, FT_CHAT_NONE, false }, { gsm_path, FT_CHAT_NONE, true }, { chat_copy, FT_CHAT_CHATML, false },
        { big_copy, FT_CHAT_NONE, false },
    };
    int ctxs[] = { 16, 61, 128 };
    int compared = 0, differ = 0;
    double t_bounded = 0, t_all = 0;
    for (int k = 0; k < 3; k++) {
        if (!toks[k]) continue;
        ft_data_tokenizer tk;
        ft_data_tokenizer_init(&tk, toks[k]);
        for (size_t f = 0; f < sizeof files / sizeof files[0]; f++)
            for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++)
                for (int mode = 0; mode < 3; mode++) {
                    /* the 1.1 MB record once per tokenizer: it is the slow case */
                    if (f == 3 && (c != 2 || mode == 2)) continue;
                    ft_dataset_opts o = opts_ctx(ctxs[c]);
                    o.chat_template = files[f].tmpl;
                    if (files[f].keys) { o.prompt_key = "question"; o.completion_key = "answer"; }
                    o.truncate = mode == 1 ? FT_TRUNC_PROMPT : FT_TRUNC_END;
                    o.drop_long = mode == 2;
                    ft_dataset *a = NULL, *b = NULL;
                    double t0 = ft_time_s();
                    ftune_status sa = ft_dataset_load(&a, files[f].path, &tk, &o);
                    double t1 = ft_time_s();
                    o.tokenize_all = true;
                    ftune_status sb = ft_dataset_load(&b, files[f].path, &tk, &o);
                    double t2 = ft_time_s();
                    t_bounded += t1 - t0;
                    t_all += t2 - t1;
                    /* both fail alike (no examples left) or give the same dataset */
                    bool same = sa == sb && (sa != FTUNE_OK || same_dataset(a, b));
                    CHECKF(same, "%s, %s, ctx %d, mode %d: bounded and whole tokenization differ", tname[k], files[f].path,
                           ctxs[c], mode);
                    compared++;
                    differ += !same;
                    if (f == 3 && c == 2)
                        printf("  one 1.1 MB record, %s, ctx 128: bounded %.3f s, whole %.3f s\n", tname[k], t1 - t0, t2 - t1);
                    ft_dataset_free(a);
                    ft_dataset_free(b);
                }
    }
    printf("  bounded == whole tokenization in %d of %d configurations (%.2f s vs %.2f s in all)\n", compared - differ,
           compared, t_bounded, t_all);
out:
    free(shake);
    free(alp);
    for (int k = 0; k < 3; k++) ft_tokenizer_free(toks[k]);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune_test_data_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) { printf("FAIL mkdtemp\n"); return 1; }
    RUN(test_segment_boundaries);
    RUN(test_format_text);
    RUN(test_format_completion);
    RUN(test_format_alpaca);
    RUN(test_format_chat);
    RUN(test_chat_templates_text);
    RUN(test_template_names_and_detect);
    RUN(test_chat_default_system);
    RUN(test_json_array);
    RUN(test_alpaca_200);
    RUN(test_plain_text);
    RUN(test_truncate_and_drop);
    RUN(test_bad_input);
    RUN(test_val_split);
    RUN(test_dynamic_padding);
    RUN(test_packing);
    RUN(test_shuffle_resume);
    RUN(test_cursor_after);
    RUN(test_llama3_chat_vector);
    RUN(test_llama3_chat_dataset);
    RUN(test_stories260K_alpaca);
    RUN(test_bounded_tokenization);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
