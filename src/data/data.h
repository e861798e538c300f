/* data.h — the training data pipeline: dataset readers (JSONL, JSON arrays,
 * plain text), chat templates rendered by C functions, loss masks, a
 * validation split, and a resumable batch iterator with dynamic padding or
 * packing.
 *
 * Flow: file --ft_dataset_load--> examples (tokens + loss mask, one line
 * number each) --ft_batch_iter_next--> ft_batch (tokens, shifted targets,
 * position ids, document ids).
 *
 * Loss mask convention: mask[i] = 1 when token i is a label the model is
 * trained to predict (from tokens 0..i-1). A batch turns that into shifted
 * next-token targets: target[t] = token[t+1] if mask[t+1] and t+1 is in the
 * same example, else -1.
 */
#ifndef FT_DATA_H
#define FT_DATA_H

#include "core/core.h"

/* ------------------------------------------------------------ tokenizer hook */

/* How the data pipeline turns text into ids. The callback tokenizes UTF-8
 * text with special-token strings parsed ("<|im_end|>" becomes one id) and
 * without adding BOS/EOS; the pipeline inserts bos_id/eos_id itself. *ids is
 * malloc'd and freed by the caller. Any tokenizer can be plugged in;
 * ft_data_tokenizer_init wraps an ftune_tokenizer. */
typedef struct {
    FTUNE_MUST_USE ftune_status (*tokenize)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids);
    void *ctx;
    int32_t bos_id, eos_id; /* -1 if the tokenizer has none */
    int add_bos;            /* put BOS at the start of every example */
} ft_data_tokenizer;

/* Fills dt from a loaded tokenizer (its BOS/EOS ids and add_bos default). */
void ft_data_tokenizer_init(ft_data_tokenizer *dt, const ftune_tokenizer *t);


/* ------------------------------------------------------------ segments */

/* An example rendered as a sequence of pieces before tokenization: text,
 * or the tokenizer's BOS/EOS id. Each piece is trained on (its tokens are
 * labels) or not. Rendering into segments rather than one string keeps the
 * loss-mask boundary exact. */
typedef enum { FT_SEG_TEXT = 0, FT_SEG_BOS, FT_SEG_EOS } ft_seg_kind;

typedef struct {
    ft_seg_kind kind;
    bool train;
    size_t off, len; /* bytes of text[] (FT_SEG_TEXT only) */
} ft_seg;

typedef struct {
    char *text;      /* all text pieces, back to back */
    size_t len, cap;
    ft_seg *segs;
    int n, cap_segs;
} ft_segments;

void ft_segments_clear(ft_segments *s); /* keeps the buffers */
void ft_segments_free(ft_segments *s);
/* Appends text (len bytes); merges with the previous piece when that is
 * text with the same train flag. */
FTUNE_MUST_USE ftune_status ft_segments_text(ft_segments *s, bool train, const char *text, size_t len);
FTUNE_MUST_USE ftune_status ft_segments_str(ft_segments *s, bool train, const char *text);
FTUNE_MUST_USE ftune_status ft_segments_special(ft_segments *s, ft_seg_kind kind, bool train);

/* Tokenizes segments into ids and a loss mask (1 = label), both malloc'd,
 * *n entries. Each text run is tokenized with the text of the run before it
 * as left context, and the context's tokens are removed when they are a
 * prefix of the result, so the tokens match a tokenization of the whole
 * string wherever the boundary falls between tokens; otherwise the run is
 * tokenized alone. BOS/EOS pieces are skipped when the id is -1. */
FTUNE_MUST_USE ftune_status ft_segments_tokenize(const ft_segments *s, const ft_data_tokenizer *tk,
                                  int32_t **ids, uint8_t **mask, size_t *n);

/* ------------------------------------------------------------ chat templates */

typedef enum {
    FT_CHAT_NONE = 0,
    FT_CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (Qwen, SmolLM) */
    FT_CHAT_LLAMA2,  /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> */
    FT_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    FT_CHAT_MISTRAL, /* <s>[INST] ... [/INST]...</s> */
    FT_CHAT_ZEPHYR,  /* <|user|>\n...</s>\n<|assistant|>\n...</s>\n */
    FT_CHAT_ALPACA,  /* ### Instruction:\n...\n\n### Response:\n...</s> */
    FT_CHAT_COUNT
} ft_chat_template;

typedef enum { FT_ROLE_SYSTEM = 0, FT_ROLE_USER, FT_ROLE_ASSISTANT } ft_chat_role;

typedef struct {
    ft_chat_role role;
    const char *content; /* UTF-8, NUL-terminated */
} ft_chat_msg;

/* "chatml", "llama2", "llama3", "mistral", "zephyr", "alpaca". */
const char *ft_chat_template_name(ft_chat_template t);
/* By name (case-insensitive; "llama-3", "llama3" both work).
 * FTUNE_ERR_ARG listing the names if unknown. */
FTUNE_MUST_USE ftune_status ft_chat_template_from_name(ft_chat_template *out, const char *name);
/* Recognises a Jinja chat_template string (tokenizer_config.json) by its
 * markers; FT_CHAT_NONE if none match. */
ft_chat_template ft_chat_template_detect(const char *jinja);
/* The system message a ChatML Jinja template puts first when a
 * conversation has none: the text X of its one string literal
 * '<|im_start|>system\nX<|im_end|>\n' (Qwen2.5's "You are Qwen, created by
 * Alibaba Cloud. ...", SmolLM2's "You are a helpful AI assistant named
 * SmolLM, ..."), unescaped as Jinja does, in *out (malloc'd); *out NULL
 * when there is none, more than one, or the template is not ChatML. */
FTUNE_MUST_USE ftune_status ft_chat_default_system(const char *jinja, char **out);
/* The chat format the tokenizer's files carry: *kind from its Jinja
 * template (FT_CHAT_NONE if none or not recognised) and *default_system
 * (ft_chat_default_system: malloc'd, or NULL). FTUNE_ERR_NOMEM only. */
FTUNE_MUST_USE ftune_status ft_chat_format_of(const ftune_tokenizer *t, ft_chat_template *kind, char **default_system);
/* Reads dir/tokenizer_config.json and detects its chat_template (a string,
 * or a list of {name, template} where "default" or the first is used).
 * *out = FT_CHAT_NONE when the file has no template or it is not
 * recognised; errors only for an unreadable or malformed file. */
FTUNE_MUST_USE ftune_status ft_chat_template_from_hf_dir(ft_chat_template *out, const char *dir);
/* "system", "user", "assistant"; parses them back (-1 if unknown). */
const char *ft_chat_role_name(ft_chat_role r);
int ft_chat_role_parse(const char *s);

/* Renders a conversation into segments (appended to s). Assistant content
 * and the token that ends an assistant turn are trained on, unless
 * train_on_prompt trains on everything. add_generation_prompt appends the
 * header of an assistant turn (for inference). The templates that carry
 * bos_token in their Jinja (llama2, llama3, mistral) emit a BOS piece
 * themselves; for the others the caller adds one if the tokenizer does.
 * default_system (or NULL) is rendered as a system message first when the
 * conversation does not begin with one, as the model's own template does
 * (ft_chat_default_system). Errors (FTUNE_ERR_FORMAT) name the message:
 * `"messages"[2].role: ...`, counting the caller's messages. */
FTUNE_MUST_USE ftune_status ft_chat_render(ft_segments *s, ft_chat_template t, const char *default_system,
                                           const ft_chat_msg *msgs, int n, bool add_generation_prompt,
                                           bool train_on_prompt);
/* Whether the template's own text begins with BOS. */
bool ft_chat_template_has_bos(ft_chat_template t);
/* The rendered text as one malloc'd string, with BOS/EOS spelled as
 * bos/eos (e.g. "<s>", "</s>"). */
FTUNE_MUST_USE ftune_status ft_chat_render_text(char **out, size_t *len, ft_chat_template t, const char *default_system,
                                                const ft_chat_msg *msgs, int n, bool add_generation_prompt,
                                                const char *bos, const char *eos);
/* Renders and tokenizes a conversation (BOS added as for a dataset). */
FTUNE_MUST_USE ftune_status ft_chat_tokenize(const ft_data_tokenizer *tk, ft_chat_template t, const char *default_system,
                                             const ft_chat_msg *msgs, int n, bool add_generation_prompt, int32_t **ids,
                                             uint8_t **mask, size_t *n_ids);

/* The Alpaca prompt for an instruction and optional input (NULL or ""). */
FTUNE_MUST_USE ftune_status ft_alpaca_prompt(ft_segments *s, bool train, const char *instruction, const char *input);

/* ------------------------------------------------------------ datasets */

typedef enum {
    FT_FMT_AUTO = 0,    /* from the file: .txt -> plain; else the first record's fields */
    FT_FMT_TEXT,        /* {"text"}: loss on all tokens, EOS appended */
    FT_FMT_COMPLETION,  /* {"prompt", "completion"} */
    FT_FMT_ALPACA,      /* {"instruction", "input"?, "output"} */
    FT_FMT_CHAT,        /* {"messages": [{"role", "content"}, ...]} */
    FT_FMT_PLAIN,       /* plain text, cut into chunks of ctx_len tokens */
} ft_data_format;

const char *ft_data_format_name(ft_data_format f);
/* "auto", "text", "completion", "alpaca", "chat", "plain". */
FTUNE_MUST_USE ftune_status ft_data_format_from_name(ft_data_format *out, const char *name);

/* What truncation cuts from an example longer than ctx_len. */
typedef enum {
    FT_TRUNC_END = 0,   /* the end (whatever it is: often the response) */
    FT_TRUNC_PROMPT,    /* prompt tokens (not trained on) first, from the left after a
                         * leading BOS; then the end if the targets alone are too long */
} ft_truncate_side;

/* Called while a dataset is tokenized: done of total input bytes. */
typedef void (*ft_dataset_progress_fn)(void *ctx, size_t done, size_t total);

typedef struct {
    ft_data_format format;
    ft_chat_template chat_template; /* required for chat data */
    const char *chat_system;        /* the template's default system message (ft_chat_render), or NULL */
    ft_truncate_side truncate;
    int ctx_len;                    /* T: the most tokens an example may have (>= 2) */
    bool train_on_prompt;           /* loss on prompt tokens too */
    bool drop_long;                 /* drop examples over ctx_len instead of truncating */
    const char *prompt_key;         /* field names of the completion format, NULL for */
    const char *completion_key;     /* "prompt"/"completion" (e.g. "question"/"answer") */
    bool tokenize_all;              /* tokenize whole records even far past ctx_len (the result is
                                     * the same, only slower: see data.c on bounded tokenization) */
    ft_dataset_progress_fn progress;/* or NULL; called at most once per record */
    void *progress_ctx;
} ft_dataset_opts;

void ft_dataset_opts_default(ft_dataset_opts *o); /* auto format, ctx_len 512 */

typedef struct {
    int64_t n_records;       /* records read (blank lines not counted) */
    int64_t n_truncated;     /* examples cut to ctx_len (kept or not) */
    int64_t n_truncated_empty; /* of those, examples left without a target by the cut (dropped) */
    int64_t n_dropped_long;  /* examples dropped for length (drop_long) */
    int64_t n_dropped_empty; /* examples without a single target token even before truncation */
    int64_t n_tokens;        /* tokens kept */
    int64_t n_targets;       /* target tokens (labels that follow a token) */
    int max_len;             /* longest example, in tokens */
} ft_dataset_stats;

/* Examples stored back to back. Example i is tokens[off[i] .. off[i+1]). */
typedef struct {
    char *path;
    ft_data_format format;   /* the format used (auto resolved) */
    int n;                   /* examples */
    int32_t *tokens;         /* (off[n]) */
    uint8_t *mask;           /* (off[n]) 1 = label */
    int64_t *off;            /* (n+1) */
    int *line;               /* (n) 1-based source line (plain text: chunk number) */
    ft_dataset_stats stats;
    int64_t cap_tok;
    int cap_ex;
} ft_dataset;

/* Loads a dataset: a JSONL file (one object per line, blank lines skipped),
 * a JSON array of such objects, or plain text. Bad records are
 * FTUNE_ERR_FORMAT with "path:line: ..." in the message. */
FTUNE_MUST_USE ftune_status ft_dataset_load(ft_dataset **out, const char *path, const ft_data_tokenizer *tk,
                             const ft_dataset_opts *opts);
/* The same from a buffer already in memory; name is used in messages. */
FTUNE_MUST_USE ftune_status ft_dataset_load_buffer(ft_dataset **out, const char *name, const char *buf, size_t len,
                                    const ft_data_tokenizer *tk, const ft_dataset_opts *opts);
void ft_dataset_free(ft_dataset *ds);
/* The offset of the first NUL that the JSON text p[0..n) would put into a
 * string (a raw 0 byte, or a \u0000 escape inside a string), or -1: cJSON
 * strings are C strings, so such text would be cut short silently. */
int64_t ft_json_nul_at(const char *p, size_t n);

static inline int ft_dataset_len(const ft_dataset *ds, int i) { return (int)(ds->off[i + 1] - ds->off[i]); }

/* Moves a fraction of the examples, chosen by a shuffle seeded with seed,
 * into a new dataset *val (round(frac*n) examples, at least 1 when frac > 0,
 * and at least 1 left in ds). Examples keep their order within each part. */
FTUNE_MUST_USE ftune_status ft_dataset_split(ft_dataset *ds, double frac, uint64_t seed, ft_dataset **val);

/* ------------------------------------------------------------ batches */

/* One micro-batch. Rows are T long (T <= T_max); each array is (B, T)
 * row-major. For packed rows, pos restarts at 0 for each example: use pos
 * for RoPE, the row index t as the causal position (q_pos of
 * attention_forward) and doc so that no example attends to another. */
typedef struct {
    int B, T;            /* rows filled and their length in this batch */
    int B_max, T_max;    /* capacity */
    int32_t *tokens;     /* (B, T) padding: pad id */
    int *targets;        /* (B, T) next token, or -1 (masked, last of an example, padding) */
    int *pos;            /* (B, T) position within its example */
    int *doc;            /* (B, T) example id, distinct within the batch; -1 on padding */
    int64_t n_targets;   /* targets != -1, for normalising the loss over micro-batches */
    int n_examples;      /* examples in this batch */
    int row0;            /* a view of ft_batch_shard: its first row in the whole batch; else 0 */
} ft_batch;

FTUNE_MUST_USE ftune_status ft_batch_init(ft_batch *b, int B_max, int T_max);
/* The bytes ft_batch_init allocates (FT_MEM_DATA): tokens, targets, pos, doc. */
size_t ft_batch_bytes(int B_max, int T_max);
void ft_batch_free(ft_batch *b);
/* Data parallelism: *view is rank `rank` of `world`'s rows of b, rows
 * [b->B*rank/world, b->B*(rank+1)/world) (contiguous, in order, so the
 * ranks' views together are b; a view may have no rows when b is the short
 * last batch of an epoch). It points into b (never free it) and counts its
 * own n_targets and n_examples. */
void ft_batch_shard(ft_batch *view, const ft_batch *b, int rank, int world);

/* Where an iterator stands: the next example is order(epoch)[index]. Saved
 * in checkpoints; seeking to it replays the same batches. */
typedef struct { int64_t epoch, index; } ft_data_cursor;

typedef struct {
    int B;            /* rows per micro-batch */
    int T;            /* row length (>= the dataset's longest example) */
    bool pack;        /* several examples per row */
    bool shuffle;     /* a fresh seeded order each epoch (else file order) */
    uint64_t seed;
    int32_t pad_id;   /* token on padding positions (never a target) */
} ft_batch_opts;

typedef struct ft_batch_iter ft_batch_iter;

/* The iterator reads ds, which must outlive it. */
FTUNE_MUST_USE ftune_status ft_batch_iter_new(ft_batch_iter **out, const ft_dataset *ds, const ft_batch_opts *o);
void ft_batch_iter_free(ft_batch_iter *it);
/* Fills b (initialised with at least B rows of T) with the next batch and
 * advances. A batch never spans two epochs: the last one of an epoch may
 * have fewer rows; the one after it starts the next epoch. */
FTUNE_MUST_USE ftune_status ft_batch_iter_next(ft_batch_iter *it, ft_batch *b);
ft_data_cursor ft_batch_iter_cursor(const ft_batch_iter *it);
FTUNE_MUST_USE ftune_status ft_batch_iter_seek(ft_batch_iter *it, ft_data_cursor c);
/* *out = where the cursor stands after n batches from the start (epoch 0,
 * index 0), as n calls of ft_batch_iter_next leave it (the end of an epoch
 * stays in that epoch until the next batch). it is not moved. */
FTUNE_MUST_USE ftune_status ft_batch_iter_cursor_after(const ft_batch_iter *it, uint64_t n, ft_data_cursor *out);
/* *n = batches in the given epoch (with packing it depends on the order). */
FTUNE_MUST_USE ftune_status ft_batch_iter_epoch_batches(const ft_batch_iter *it, int64_t epoch, int64_t *n);
/* The example order of an epoch (n entries), as the iterator uses it. */
void ft_batch_epoch_order(int *order, int n, uint64_t seed, int64_t epoch, bool shuffle);

#endif
