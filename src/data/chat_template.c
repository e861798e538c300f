/* chat_template.c — chat templates as C rendering functions (no Jinja
 * engine): ChatML, Llama 2, Llama 3, Mistral, Zephyr, Alpaca. Each renders
 * a conversation into segments so that the loss mask falls exactly on the
 * assistant turns; detection maps a Jinja template string to one of them
 * by its markers. */
#include "data/data.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const template_names[FT_CHAT_COUNT] = {
    [FT_CHAT_NONE] = "none",     [FT_CHAT_CHATML] = "chatml", [FT_CHAT_LLAMA2] = "llama2",
    [FT_CHAT_LLAMA3] = "llama3", [FT_CHAT_MISTRAL] = "mistral", [FT_CHAT_ZEPHYR] = "zephyr",
    [FT_CHAT_ALPACA] = "alpaca",
};

const char *ft_chat_template_name(ft_chat_template t) {
    return (t >= 0 && t < FT_CHAT_COUNT) ? template_names[t] : "?";
}

ftune_status ft_chat_template_from_name(ft_chat_template *out, const char *name) {
    char norm[32];
    size_t k = 0;
    for (const char *p = name ? name : ""; *p && k + 1 < sizeof norm; p++)
        if (*p != '-' && *p != '_' && *p != ' ') norm[k++] = (char)tolower((unsigned char)*p);
    norm[k] = 0;
    for (int t = FT_CHAT_CHATML; t < FT_CHAT_COUNT; t++)
        if (strcmp(norm, template_names[t]) == 0) { *out = (ft_chat_template)t; return FTUNE_OK; }
    *out = FT_CHAT_NONE;
    return ft_err(FTUNE_ERR_ARG, "unknown chat template \"%s\" (expected chatml, llama2, llama3, mistral, zephyr, alpaca)",
                  name ? name : "");
}

ft_chat_template ft_chat_template_detect(const char *jinja) {
    if (!jinja) return FT_CHAT_NONE;
    if (strstr(jinja, "<|im_start|>")) return FT_CHAT_CHATML;
    if (strstr(jinja, "<|start_header_id|>")) return FT_CHAT_LLAMA3;
    if (strstr(jinja, "[INST]")) return strstr(jinja, "<<SYS>>") ? FT_CHAT_LLAMA2 : FT_CHAT_MISTRAL;
    if (strstr(jinja, "<|user|>")) return FT_CHAT_ZEPHYR;
    if (strstr(jinja, "### Instruction")) return FT_CHAT_ALPACA;
    return FT_CHAT_NONE;
}

/* A Jinja string literal starting at q (a quote): its unescaped text,
 * malloc'd, and *end just past it; NULL if unterminated or (*oom) out of
 * memory.
 * Jinja unescapes literals as Python's unicode-escape; the escapes a
 * template's markup uses are these. */
static char *jinja_literal(const char *q, const char **end, bool *oom) {
    char quote = *q;
    const char *p = q + 1;
    size_t n = 0;
    *oom = false;
    while (p[n] && p[n] != quote) n += (p[n] == '\\' && p[n + 1]) ? 2 : 1;
    if (!p[n]) return NULL;
    *end = p + n + 1;
    char *out = malloc(n + 1), *o = out;
    if (!out) { *oom = true; return NULL; }
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\\' || i + 1 == n) { *o++ = p[i]; continue; }
        char c = p[++i];
        switch (c) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case '\\': case '\'': case '"': *o++ = c; break;
        default: *o++ = '\\'; *o++ = c; break;
        }
    }
    *o = 0;
    return out;
}

/* The string literals of the template's {{ }} and {% %} blocks are read
 * one by one; no Jinja is evaluated, so a template that builds the prompt
 * from pieces gives none, and ftune renders without one. */
ftune_status ft_chat_default_system(const char *jinja, char **out) {
    static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>";
    *out = NULL;
    if (ft_chat_template_detect(jinja) != FT_CHAT_CHATML) return FTUNE_OK;
    char *found = NULL;
    bool code = false; /* inside {{ }} or {% %}, where quotes start string literals */
    for (const char *p = jinja; *p;) {
        if (!code) {
            if (p[0] == '{' && (p[1] == '{' || p[1] == '%')) { code = true; p += 2; }
            else p++;
            continue;
        }
        if ((p[0] == '}' || p[0] == '%') && p[1] == '}') { code = false; p += 2; continue; }
        if (*p != '\'' && *p != '"') { p++; continue; }
        const char *end;
        bool oom;
        char *lit = jinja_literal(p, &end, &oom);
        if (oom) { free(found); return ft_err(FTUNE_ERR_NOMEM, "chat template: out of memory"); }
        if (!lit) break; /* unterminated: no more literals */
        p = end;
        size_t n = strlen(lit), h = sizeof head - 1, t = sizeof tail - 1;
        if (n > 0 && lit[n - 1] == '\n') n--;
        bool is_default = strncmp(lit, head, h) == 0 && n > h + t && memcmp(lit + n - t, tail, t) == 0;
        if (is_default) {
            lit[n - t] = 0;
            memmove(lit, lit + h, n - t - h + 1);
            if (strstr(lit, "<|im_")) is_default = false;
        }
        if (!is_default) { free(lit); continue; }
        if (found && strcmp(found, lit) != 0) { free(found); free(lit); return FTUNE_OK; } /* two: which? none */
        free(found);
        found = lit;
    }
    *out = found;
    return FTUNE_OK;
}

ftune_status ft_chat_template_from_hf_dir(ft_chat_template *out, const char *dir) {
    *out = FT_CHAT_NONE;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!ft_file_exists(path)) return FTUNE_OK;
    char *buf;
    size_t len;
    ftune_status st = ft_read_file(path, &buf, &len);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!root) return ft_err(FTUNE_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    const char *jinja = NULL;
    if (cJSON_IsString(ct)) {
        jinja = ct->valuestring;
    } else if (cJSON_IsArray(ct)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(tp)) continue;
            if (!jinja) jinja = tp->valuestring;
            if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0) { jinja = tp->valuestring; break; }
        }
    }
    *out = ft_chat_template_detect(jinja);
    cJSON_Delete(root);
    return FTUNE_OK;
}

const char *ft_chat_role_name(ft_chat_role r) {
    switch (r) {
    case FT_ROLE_SYSTEM: return "system";
    case FT_ROLE_USER: return "user";
    case FT_ROLE_ASSISTANT: return "assistant";
    }
    return "?";
}

int ft_chat_role_parse(const char *s) {
    if (!s) return -1;
    if (strcmp(s, "system") == 0) return FT_ROLE_SYSTEM;
    if (strcmp(s, "user") == 0) return FT_ROLE_USER;
    if (strcmp(s, "assistant") == 0) return FT_ROLE_ASSISTANT;
    return -1;
}

bool ft_chat_template_has_bos(ft_chat_template t) {
    return t == FT_CHAT_LLAMA2 || t == FT_CHAT_LLAMA3 || t == FT_CHAT_MISTRAL;
}

/* ------------------------------------------------------------ helpers */

/* Text with leading and trailing whitespace removed (Jinja's trim/strip). */
static void strip(const char *s, const char **b, size_t *n) {
    size_t len = strlen(s), i = 0;
    while (i < len && isspace((unsigned char)s[i])) i++;
    while (len > i && isspace((unsigned char)s[len - 1])) len--;
    *b = s + i;
    *n = len - i;
}

#define TRY(x) do { ftune_status st_ = (x); if (st_) return st_; } while (0)

static FTUNE_MUST_USE ftune_status seg_stripped(ft_segments *s, bool train, const char *text) {
    const char *b;
    size_t n;
    strip(text, &b, &n);
    return ft_segments_text(s, train, b, n);
}

/* Templates that can only say user/assistant/user/... after an optional
 * leading system message. */
static FTUNE_MUST_USE ftune_status check_alternating(ft_chat_template t, const ft_chat_msg *m, int n) {
    int first = (n > 0 && m[0].role == FT_ROLE_SYSTEM) ? 1 : 0;
    for (int i = first; i < n; i++) {
        ft_chat_role want = ((i - first) % 2 == 0) ? FT_ROLE_USER : FT_ROLE_ASSISTANT;
        if (m[i].role != want)
            return ft_err(FTUNE_ERR_FORMAT,
                          "field \"messages\"[%d].role: \"%s\" where the %s template needs \"%s\" "
                          "(user and assistant must alternate, user first, after an optional system message)",
                          i, ft_chat_role_name(m[i].role), ft_chat_template_name(t), ft_chat_role_name(want));
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------ templates */

static FTUNE_MUST_USE ftune_status render_chatml(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    for (int i = 0; i < n; i++) {
        bool a = m[i].role == FT_ROLE_ASSISTANT;
        TRY(ft_segments_str(s, all, "<|im_start|>"));
        TRY(ft_segments_str(s, all, ft_chat_role_name(m[i].role)));
        TRY(ft_segments_str(s, all, "\n"));
        TRY(ft_segments_str(s, all || a, m[i].content));
        TRY(ft_segments_str(s, all || a, "<|im_end|>"));
        TRY(ft_segments_str(s, all, "\n"));
    }
    if (gen) TRY(ft_segments_str(s, all, "<|im_start|>assistant\n"));
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status render_llama3(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    TRY(ft_segments_special(s, FT_SEG_BOS, false));
    for (int i = 0; i < n; i++) {
        bool a = m[i].role == FT_ROLE_ASSISTANT;
        TRY(ft_segments_str(s, all, "<|start_header_id|>"));
        TRY(ft_segments_str(s, all, ft_chat_role_name(m[i].role)));
        TRY(ft_segments_str(s, all, "<|end_header_id|>\n\n"));
        TRY(seg_stripped(s, all || a, m[i].content));
        TRY(ft_segments_str(s, all || a, "<|eot_id|>"));
    }
    if (gen) TRY(ft_segments_str(s, all, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return FTUNE_OK;
}

/* Llama 2 chat: the system prompt goes inside the first [INST] block;
 * content is stripped; every user turn opens with BOS, every assistant turn
 * closes with EOS. */
static FTUNE_MUST_USE ftune_status render_llama2(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    TRY(check_alternating(FT_CHAT_LLAMA2, m, n));
    int first = (n > 0 && m[0].role == FT_ROLE_SYSTEM) ? 1 : 0;
    for (int i = first; i < n; i++) {
        if (m[i].role == FT_ROLE_USER) {
            TRY(ft_segments_special(s, FT_SEG_BOS, false));
            TRY(ft_segments_str(s, all, "[INST] "));
            const char *b;
            size_t len;
            if (i == first && first) {
                /* the template strips "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user
                 * as one string: only the user text's end is stripped */
                TRY(ft_segments_str(s, all, "<<SYS>>\n"));
                TRY(ft_segments_str(s, all, m[0].content));
                TRY(ft_segments_str(s, all, "\n<</SYS>>\n\n"));
                b = m[i].content;
                len = strlen(b);
                while (len > 0 && isspace((unsigned char)b[len - 1])) len--;
            } else {
                strip(m[i].content, &b, &len);
            }
            TRY(ft_segments_text(s, all, b, len));
            TRY(ft_segments_str(s, all, " [/INST]"));
        } else {
            TRY(ft_segments_str(s, true, " "));
            TRY(seg_stripped(s, true, m[i].content));
            TRY(ft_segments_str(s, true, " "));
            TRY(ft_segments_special(s, FT_SEG_EOS, true));
        }
    }
    (void)gen; /* the prompt already ends with [/INST] */
    return FTUNE_OK;
}

/* Mistral Instruct: one BOS; a system message is put before the first user
 * message, separated by a blank line. */
static FTUNE_MUST_USE ftune_status render_mistral(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    TRY(check_alternating(FT_CHAT_MISTRAL, m, n));
    TRY(ft_segments_special(s, FT_SEG_BOS, false));
    int first = (n > 0 && m[0].role == FT_ROLE_SYSTEM) ? 1 : 0;
    for (int i = first; i < n; i++) {
        if (m[i].role == FT_ROLE_USER) {
            TRY(ft_segments_str(s, all, "[INST] "));
            if (i == first && first) {
                TRY(ft_segments_str(s, all, m[0].content));
                TRY(ft_segments_str(s, all, "\n\n"));
            }
            TRY(ft_segments_str(s, all, m[i].content));
            TRY(ft_segments_str(s, all, " [/INST]"));
        } else {
            TRY(ft_segments_str(s, true, m[i].content));
            TRY(ft_segments_special(s, FT_SEG_EOS, true));
        }
    }
    (void)gen;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status render_zephyr(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    for (int i = 0; i < n; i++) {
        bool a = m[i].role == FT_ROLE_ASSISTANT;
        TRY(ft_segments_str(s, all, "<|"));
        TRY(ft_segments_str(s, all, ft_chat_role_name(m[i].role)));
        TRY(ft_segments_str(s, all, "|>\n"));
        TRY(ft_segments_str(s, all || a, m[i].content));
        TRY(ft_segments_special(s, FT_SEG_EOS, all || a));
        TRY(ft_segments_str(s, all, "\n"));
    }
    if (gen) TRY(ft_segments_str(s, all, "<|assistant|>\n"));
    return FTUNE_OK;
}

#define ALPACA_PREAMBLE_NO_INPUT \
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
#define ALPACA_PREAMBLE_INPUT                                                                  \
    "Below is an instruction that describes a task, paired with an input that provides further " \
    "context. Write a response that appropriately completes the request.\n\n"

ftune_status ft_alpaca_prompt(ft_segments *s, bool train, const char *instruction, const char *input) {
    bool has_input = input && *input;
    TRY(ft_segments_str(s, train, has_input ? ALPACA_PREAMBLE_INPUT : ALPACA_PREAMBLE_NO_INPUT));
    TRY(ft_segments_str(s, train, "### Instruction:\n"));
    TRY(ft_segments_str(s, train, instruction));
    TRY(ft_segments_str(s, train, "\n\n"));
    if (has_input) {
        TRY(ft_segments_str(s, train, "### Input:\n"));
        TRY(ft_segments_str(s, train, input));
        TRY(ft_segments_str(s, train, "\n\n"));
    }
    return ft_segments_str(s, train, "### Response:\n");
}

/* Alpaca as a chat: the system message (or the standard preamble) first,
 * then Instruction/Response pairs separated by a blank line. */
static FTUNE_MUST_USE ftune_status render_alpaca(ft_segments *s, const ft_chat_msg *m, int n, bool gen, bool all) {
    TRY(check_alternating(FT_CHAT_ALPACA, m, n));
    int first = (n > 0 && m[0].role == FT_ROLE_SYSTEM) ? 1 : 0;
    if (first) {
        TRY(ft_segments_str(s, all, m[0].content));
        TRY(ft_segments_str(s, all, "\n\n"));
    } else {
        TRY(ft_segments_str(s, all, ALPACA_PREAMBLE_NO_INPUT));
    }
    for (int i = first; i < n; i++) {
        if (m[i].role == FT_ROLE_USER) {
            if (i > first) TRY(ft_segments_str(s, all, "\n\n"));
            TRY(ft_segments_str(s, all, "### Instruction:\n"));
            TRY(ft_segments_str(s, all, m[i].content));
            TRY(ft_segments_str(s, all, "\n\n### Response:\n"));
        } else {
            TRY(ft_segments_str(s, true, m[i].content));
            TRY(ft_segments_special(s, FT_SEG_EOS, true));
        }
    }
    (void)gen;
    return FTUNE_OK;
}

static FTUNE_MUST_USE ftune_status render(ft_segments *s, ft_chat_template t, const ft_chat_msg *msgs, int n,
                                          bool add_generation_prompt, bool train_on_prompt);

ftune_status ft_chat_render(ft_segments *s, ft_chat_template t, const char *default_system, const ft_chat_msg *msgs,
                            int n, bool add_generation_prompt, bool train_on_prompt) {
    if (n < 1) return ft_err(FTUNE_ERR_FORMAT, "field \"messages\": empty conversation");
    for (int i = 0; i < n; i++) {
        if (!msgs[i].content) return ft_err(FTUNE_ERR_ARG, "\"messages\"[%d]: no content", i);
        if (msgs[i].role < FT_ROLE_SYSTEM || msgs[i].role > FT_ROLE_ASSISTANT)
            return ft_err(FTUNE_ERR_ARG, "\"messages\"[%d]: bad role %d", i, (int)msgs[i].role);
        if (msgs[i].role == FT_ROLE_SYSTEM && i > 0 && t != FT_CHAT_CHATML && t != FT_CHAT_LLAMA3 &&
            t != FT_CHAT_ZEPHYR)
            return ft_err(FTUNE_ERR_FORMAT,
                          "field \"messages\"[%d].role: the %s template allows \"system\" only as the first message",
                          i, ft_chat_template_name(t));
    }
    if (!default_system || msgs[0].role == FT_ROLE_SYSTEM)
        return render(s, t, msgs, n, add_generation_prompt, train_on_prompt);
    ft_chat_msg *all = malloc((size_t)(n + 1) * sizeof *all);
    if (!all) return ft_err(FTUNE_ERR_NOMEM, "chat template: out of memory");
    all[0] = (ft_chat_msg){ FT_ROLE_SYSTEM, default_system };
    memcpy(all + 1, msgs, (size_t)n * sizeof *msgs);
    ftune_status st = render(s, t, all, n + 1, add_generation_prompt, train_on_prompt);
    free(all);
    return st;
}

static ftune_status render(ft_segments *s, ft_chat_template t, const ft_chat_msg *msgs, int n,
                           bool add_generation_prompt, bool train_on_prompt) {
    bool all = train_on_prompt;
    switch (t) {
    case FT_CHAT_CHATML: return render_chatml(s, msgs, n, add_generation_prompt, all);
    case FT_CHAT_LLAMA2: return render_llama2(s, msgs, n, add_generation_prompt, all);
    case FT_CHAT_LLAMA3: return render_llama3(s, msgs, n, add_generation_prompt, all);
    case FT_CHAT_MISTRAL: return render_mistral(s, msgs, n, add_generation_prompt, all);
    case FT_CHAT_ZEPHYR: return render_zephyr(s, msgs, n, add_generation_prompt, all);
    case FT_CHAT_ALPACA: return render_alpaca(s, msgs, n, add_generation_prompt, all);
    default: break;
    }
    return ft_err(FTUNE_ERR_ARG, "chat data needs a chat template (chatml, llama2, llama3, mistral, zephyr, alpaca)");
}

ftune_status ft_chat_render_text(char **out, size_t *len, ft_chat_template t, const char *default_system,
                                 const ft_chat_msg *msgs, int n, bool add_generation_prompt, const char *bos,
                                 const char *eos) {
    *out = NULL;
    *len = 0;
    ft_segments s = {0}, flat = {0};
    ftune_status st = ft_chat_render(&s, t, default_system, msgs, n, add_generation_prompt, false);
    for (int i = 0; !st && i < s.n; i++) {
        const ft_seg *g = &s.segs[i];
        if (g->kind == FT_SEG_TEXT) st = ft_segments_text(&flat, false, s.text + g->off, g->len);
        else st = ft_segments_str(&flat, false, g->kind == FT_SEG_BOS ? (bos ? bos : "") : (eos ? eos : ""));
    }
    if (!st) st = ft_segments_str(&flat, false, ""); /* ensures a buffer */
    ft_segments_free(&s);
    if (st) { ft_segments_free(&flat); return st; }
    *out = flat.text;
    *len = flat.len;
    free(flat.segs);
    return FTUNE_OK;
}

ftune_status ft_chat_tokenize(const ft_data_tokenizer *tk, ft_chat_template t, const char *default_system,
                              const ft_chat_msg *msgs, int n, bool add_generation_prompt, int32_t **ids,
                              uint8_t **mask, size_t *n_ids) {
    ft_segments s = {0};
    ftune_status st = FTUNE_OK;
    if (tk->add_bos && !ft_chat_template_has_bos(t)) st = ft_segments_special(&s, FT_SEG_BOS, false);
    if (!st) st = ft_chat_render(&s, t, default_system, msgs, n, add_generation_prompt, false);
    if (!st) st = ft_segments_tokenize(&s, tk, ids, mask, n_ids);
    ft_segments_free(&s);
    return st;
}
