/* test_memory.c — the memory table against the kernel's measured peak RSS.
 * Three configurations (LoRA training, full fine-tuning, inference with a
 * KV cache) each run in a fresh child process on a random model made with
 * ftune_init_model, so that the child's peak RSS (VmHWM, reset at its
 * start) is that configuration's. Each class's counted peak must equal the
 * plan's prediction exactly (the plan and the allocation share one size
 * table), and baseline + table must match the measured peak within 10%.
 *
 * Baseline: the child's resident set when it starts (code and data of the
 * test, libc, OpenMP, OpenBLAS, cJSON and PCRE2, and the parent's pages the
 * child shares), read from VmRSS after resetting the peak; it is added to
 * the table, not predicted. What the table does not see (the libraries'
 * lazily touched buffers, thread stacks, the test's own small arrays, page
 * rounding) is what the 10% covers.
 *
 * Also fault injection: the allocator hook fails the Nth allocation for
 * every N until a trainer, a session and an optimizer are built; each
 * failure must be FTUNE_ERR_NOMEM with every counter back at zero. */
#include "run/run.h"
#include "data/data.h"
#include "ftune.h"
#include "core/mem.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/train.h"
#include "check.h"
#include "check_child.h"

#include <stdint.h>

static char tmpdir[512], model_dir[600], small_dir[600];

/* 23 M parameters (92 MB of f32): large enough that the table's terms are
 * several times the process's baseline, small enough for a quick step. */
static const char *model_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 384,"
    " \"intermediate_size\": 1024, \"num_hidden_layers\": 6, \"num_attention_heads\": 6,"
    " \"num_key_value_heads\": 6, \"vocab_size\": 32000, \"max_position_embeddings\": 512,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000, \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
    " \"torch_dtype\": \"float32\"}\n";

static ftune_model *load(const char *dir) {
    ftune_model *m = NULL;
    ftune_status st = ftune_model_load(&m, dir, NULL);
    if (st) fprintf(stderr, "  load %s: %s\n", dir, ftune_last_error());
    return m;
}

/* What was held before the operation under test; zero by default. */
static size_t held_before[FT_MEM_N_CLASSES];

static bool counters_zero(void) {
    bool ok = true;
    for (int c = 0; c < FT_MEM_N_CLASSES; c++)
        if (ft_mem_current((ft_mem_class)c) != held_before[c]) {
            fprintf(stderr, "  %s: %zu bytes held, %zu before\n", ft_mem_class_name((ft_mem_class)c),
                    ft_mem_current((ft_mem_class)c), held_before[c]);
            ok = false;
        }
    return ok;
}

/* Every planned row's counted peak equals the plan, and baseline + table
 * is within 10% of the measured peak RSS. The mapped row is compared with
 * the bytes of weights as stored: the pages resident may be a little more
 * (file headers, the kernel's fault-around), never much more. */
static void check_table(const char *what, const ft_mem_table *t, size_t baseline) {
    char buf[4096];
    ft_mem_table_format(t, buf, sizeof buf);
    size_t rss_now, rss_peak;
    CHECK(ft_mem_rss(&rss_now, &rss_peak));
    size_t predicted = baseline + ft_mem_table_peak_total(t);
    double rel = ((double)predicted - (double)rss_peak) / (double)rss_peak;
    printf("  %s:\n%s  baseline %.1f MiB + table %.1f MiB = %.1f MiB; measured peak RSS %.1f MiB (%+.1f%%)\n", what,
           buf, baseline / 1048576.0, ft_mem_table_peak_total(t) / 1048576.0, predicted / 1048576.0,
           rss_peak / 1048576.0, 100 * rel);
    for (int r = 0; r < FT_MEM_N_CLASSES; r++)
        if (t->has_plan[r])
            CHECKF(t->peak[r] == t->planned[r], "%s: %s counted peak %zu != planned %zu", what, ft_mem_row_name(r),
                   t->peak[r], t->planned[r]);
    /* the task's bound: the table explains the peak within 10% */
    CHECKF(fabs(rel) <= 0.10, "%s: table + baseline %zu vs peak RSS %zu", what, predicted, rss_peak);
    /* weights are read whole by every configuration here; resident mapped
     * pages within 10% of the bytes stored (headers, fault-around) */
    double mrel = fabs((double)t->peak[FT_MEM_ROW_MAPPED] - (double)t->planned[FT_MEM_ROW_MAPPED]) /
                  (double)t->planned[FT_MEM_ROW_MAPPED];
    CHECKF(mrel <= 0.10, "%s: mapped resident %zu vs weights stored %zu", what, t->peak[FT_MEM_ROW_MAPPED],
           t->planned[FT_MEM_ROW_MAPPED]);
}

static void fill_batch(ft_batch *b, int B, int T, int V, uint64_t seed) {
    ft_rng r;
    ft_rng_seed(&r, seed);
    b->B = B; b->T = T;
    for (int i = 0; i < B * T; i++) {
        b->tokens[i] = (int32_t)(ft_rng_u32(&r) % (uint32_t)V);
        b->pos[i] = i % T;
        b->doc[i] = i / T;
    }
    for (int i = 0; i < B * T; i++) b->targets[i] = i % T == T - 1 ? -1 : b->tokens[i + 1];
    b->n_targets = (int64_t)B * (T - 1);
    b->n_examples = B;
}

/* One training configuration: trainer + AdamW, one step and one update. */
/* K: gradient checkpointing every K blocks, 0 off. */
static void run_train(ft_train_mode mode, int B, int T, int K) {
    size_t baseline = rss_baseline();
    ftune_model *m = load(model_dir);
    CHECK(m);
    if (!m) return;
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.mode = mode;
    o.lora.r = 16;
    o.max_B = B;
    o.max_T = T;
    o.n_threads = 2;
    o.grad_checkpoint = K;
    ft_train_plan plan;
    CHECK_OK(ft_trainer_plan(&m->cfg, &o, &plan));
    ft_trainer *tr = NULL;
    CHECK_OK(ft_trainer_new(&tr, m, &o));
    if (!tr) { ftune_model_free(m); return; }
    CHECK(memcmp(ft_trainer_get_plan(tr), &plan, sizeof plan) == 0);
    int np = ft_trainer_n_params(tr);
    ft_param *ps = calloc((size_t)np, sizeof *ps);
    for (int i = 0; i < np; i++) {
        ps[i] = ft_trainer_param(tr, i)->opt;
        ps[i].decay = ps[i].ndim == 2;
    }
    ft_adamw opt;
    ft_adamw_cfg ac;
    ft_adamw_defaults(&ac);
    CHECK_OK(ft_adamw_init(&opt, ps, np, &ac));
    ft_batch b;
    CHECK_OK(ft_batch_init(&b, B, T));
    fill_batch(&b, B, T, m->cfg.V, 7);
    double loss = 0;
    ft_trainer_zero_grad(tr);
    CHECK_OK(ft_trainer_step(tr, &b, b.n_targets, &loss));
    CHECK(isfinite(loss));
    ft_adamw_step(&opt, 1e-4);
    ft_mem_table t = { 0 };
    ft_trainer_mem_table(tr, &t);
    /* the data row is this test's one batch, not something the trainer plans */
    check_table(K ? "LoRA, --grad-checkpoint 2" : mode == FT_TRAIN_LORA ? "LoRA" : "full", &t, baseline);
    ft_batch_free(&b);
    ft_adamw_free(&opt);
    free(ps);
    ft_trainer_free(tr);
    ftune_model_free(m);
    CHECK(counters_zero());
}

static void run_infer(int n_ctx) {
    size_t baseline = rss_baseline();
    ftune_model *m = load(model_dir);
    CHECK(m);
    if (!m) return;
    ftune_session *s = NULL;
    CHECK_OK(ftune_session_new(&s, m, n_ctx, 2));
    if (!s) { ftune_model_free(m); return; }
    ft_mem_table plan = { 0 };
    ft_model_mem_plan(m, &plan);
    ft_session_plan(&m->cfg, n_ctx, 2, &plan);
    int32_t *toks = malloc((size_t)n_ctx * sizeof *toks);
    float *logits = malloc((size_t)m->cfg.V * sizeof *logits);
    ft_rng r;
    ft_rng_seed(&r, 3);
    for (int i = 0; i < n_ctx; i++) toks[i] = (int32_t)(ft_rng_u32(&r) % (uint32_t)m->cfg.V);
    /* fill the whole cache, so that every KV page is touched */
    CHECK_OK(ftune_session_forward(s, toks, n_ctx, logits, 0));
    CHECK(isfinite(logits[0]));
    ft_mem_table t = { 0 };
    ft_session_mem_table(s, &t);
    for (int i = 0; i < FT_MEM_N_ROWS; i++) CHECK(plan.planned[i] == t.planned[i]);
    check_table("inference", &t, baseline);
    free(toks);
    free(logits);
    ftune_session_free(s);
    ftune_model_free(m);
    CHECK(counters_zero());
}

static void lora_child(void *a) { (void)a; run_train(FT_TRAIN_LORA, 1, 256, 0); }
static void lora_ckpt_child(void *a) { (void)a; run_train(FT_TRAIN_LORA, 1, 256, 2); }
static void full_child(void *a) { (void)a; run_train(FT_TRAIN_FULL, 1, 64, 0); }
static void infer_child(void *a) { (void)a; run_infer(256); }
static void test_table_lora(void) { in_child(lora_child, NULL); }
/* checkpointing: the plan's smaller activation arena is what is measured */
static void test_table_lora_grad_checkpoint(void) { in_child(lora_ckpt_child, NULL); }
static void test_table_full(void) { in_child(full_child, NULL); }
static void test_table_inference(void) { in_child(infer_child, NULL); }

/* ------------------------------------------------------------ the hook */

typedef struct { long calls, fail_at, granted; } fail_state;

static void *failing_hook(void *ud, ft_mem_class c, void *p, size_t old_n, size_t new_n) {
    fail_state *f = ud;
    if (new_n != 0) {
        if (f->calls++ == f->fail_at) return NULL;
        f->granted++;
    }
    return ft_mem_default_hook(NULL, c, p, old_n, new_n);
}

static void test_counters(void) {
    CHECK(counters_zero());
    void *a = ft_mem_alloc(FT_MEM_SCRATCH, 1000), *z = ft_mem_alloc(FT_MEM_DATA, 0);
    CHECK(a && z && ((uintptr_t)a & 63) == 0);
    CHECK(ft_mem_current(FT_MEM_SCRATCH) == 1000 && ft_mem_current(FT_MEM_DATA) == 0);
    memset(a, 5, 1000);
    unsigned char *b = ft_mem_realloc(FT_MEM_SCRATCH, a, 1000, 5000);
    CHECK(b && b[999] == 5 && ft_mem_current(FT_MEM_SCRATCH) == 5000);
    /* both buffers exist while the hook copies: the peak says so */
    CHECK(ft_mem_peak(FT_MEM_SCRATCH) >= 6000);
    ft_mem_free(FT_MEM_SCRATCH, b, 5000);
    ft_mem_free(FT_MEM_DATA, z, 0);
    CHECK(counters_zero());
    ft_mem_reset_peaks();
    CHECK(ft_mem_peak(FT_MEM_SCRATCH) == 0);
    /* a failed allocation counts nothing and a failed realloc keeps p */
    fail_state f = { .fail_at = 1 };
    ft_mem_set_hook(failing_hook, &f);
    void *p = ft_mem_alloc(FT_MEM_KV, 64);
    CHECK(p && !ft_mem_realloc(FT_MEM_KV, p, 64, 128) && ft_mem_current(FT_MEM_KV) == 64);
    ft_mem_free(FT_MEM_KV, p, 64);
    ft_mem_set_hook(NULL, NULL);
    CHECK(counters_zero());
    char buf[2048];
    ft_mem_table t = { 0 };
    ft_mem_table_measure(&t);
    int n = ft_mem_table_format(&t, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n < sizeof buf && strstr(buf, "optimizer state") && strstr(buf, "total"));
    CHECK(ft_mem_table_format(&t, NULL, 0) == n);
}

/* Fails allocation 0, 1, 2, ... of build() until it succeeds; every
 * failure must be NOMEM and leave nothing counted. Returns the number of
 * allocations a successful build made. */
static long fault_sweep(const char *what, ftune_status (*build)(void *ctx, void **obj), void (*destroy)(void *),
                        void *ctx) {
    for (long n = 0; n < 10000; n++) {
        fail_state f = { .fail_at = n };
        void *obj = NULL;
        ft_mem_set_hook(failing_hook, &f);
        ftune_status st = build(ctx, &obj);
        ft_mem_set_hook(NULL, NULL);
        if (st == FTUNE_OK) {
            CHECKF(f.calls == n, "%s: succeeded after %ld allocations with allocation %ld failing", what, f.calls, n);
            destroy(obj);
            CHECK(counters_zero());
            return n;
        }
        CHECKF(st == FTUNE_ERR_NOMEM, "%s: allocation %ld failing gave %s: %s", what, n, ftune_status_name(st),
               ftune_last_error());
        CHECKF(counters_zero(), "%s: allocation %ld failing leaked", what, n);
        if (check_failed_) return -1;
    }
    CHECK(0);
    return -1;
}

static ftune_status build_model(void *ctx, void **obj) {
    return ftune_model_load((ftune_model **)obj, ctx, NULL);
}
static void destroy_model(void *obj) { ftune_model_free(obj); }
static ftune_status build_trainer(void *ctx, void **obj) {
    ft_train_opts o;
    ft_train_opts_default(&o);
    o.max_T = 32;
    o.n_threads = 1;
    ftune_status st = ft_trainer_new((ft_trainer **)obj, ctx, &o);
    if (st) return st;
    /* a KV prefix allocates too */
    const ftune_model *m = ctx;
    static float kv[5 * 3 * 64 * 2];
    CHECK((size_t)m->cfg.L * 3 * m->cfg.NKV * m->cfg.HS <= sizeof kv / sizeof *kv);
    st = ft_trainer_set_kv_prefix(*obj, kv, kv, 3, NULL, NULL);
    if (st) { ft_trainer_free(*obj); *obj = NULL; }
    return st;
}
static void destroy_trainer(void *obj) { ft_trainer_free(obj); }
static ftune_status build_session(void *ctx, void **obj) {
    return ftune_session_new((ftune_session **)obj, ctx, 64, 1);
}
static void destroy_session(void *obj) { ftune_session_free(obj); }

/* One id per byte: enough text to grow the dataset's token arrays. */
static ftune_status byte_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    (void)ctx;
    int32_t *out = malloc((len ? len : 1) * sizeof *out);
    if (!out) return FTUNE_ERR_NOMEM;
    for (size_t i = 0; i < len; i++) out[i] = 3 + (unsigned char)text[i];
    *ids = out;
    *n_ids = len;
    return FTUNE_OK;
}
static char text_buf[20000];
static ftune_status build_dataset(void *ctx, void **obj) {
    ft_data_tokenizer tk = { .tokenize = byte_tokenize, .bos_id = 1, .eos_id = 2, .add_bos = 1 };
    ft_dataset_opts o;
    ft_dataset_opts_default(&o);
    o.format = FT_FMT_PLAIN;
    return ft_dataset_load_buffer((ft_dataset **)obj, "memory.txt", text_buf, sizeof text_buf, &tk, &o);
}
static void destroy_dataset(void *obj) { ft_dataset_free(obj); }

/* A dataset's tokens and masks are counted as data: 5 bytes a slot. */
static void test_dataset(void) {
    for (size_t i = 0; i < sizeof text_buf; i++) text_buf[i] = "the cat sat on a mat\n"[i % 21];
    void *obj = NULL;
    CHECK_OK(build_dataset(NULL, &obj));
    ft_dataset *ds = obj;
    if (!ds) return;
    CHECK(ds->stats.n_tokens > (int64_t)sizeof text_buf && ds->cap_tok >= ds->stats.n_tokens);
    CHECKF(ft_mem_current(FT_MEM_DATA) == (size_t)ds->cap_tok * 5, "data %zu, capacity %lld",
           ft_mem_current(FT_MEM_DATA), (long long)ds->cap_tok);
    ft_dataset_free(ds);
    CHECK(counters_zero());
    long n = fault_sweep("dataset", build_dataset, destroy_dataset, NULL);
    printf("  dataset: %ld counted allocations\n", n);
}

static float opt_w[3][40], opt_g[3][40];
static ftune_status build_adamw(void *ctx, void **obj) {
    (void)ctx;
    ft_param ps[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        snprintf(ps[i].name, sizeof ps[i].name, "p%d", i);
        ps[i].data = opt_w[i]; ps[i].grad = opt_g[i]; ps[i].numel = 40; ps[i].ndim = 1; ps[i].shape[0] = 40;
    }
    ft_adamw_cfg c;
    ft_adamw_defaults(&c);
    ft_adamw *o = calloc(1, sizeof *o);
    if (!o) return FTUNE_ERR_NOMEM;
    ftune_status st = ft_adamw_init(o, ps, 3, &c);
    if (st) { free(o); return st; }
    CHECK(ft_mem_current(FT_MEM_OPTIM) == 2 * 3 * 40 * sizeof(float));
    *obj = o;
    return FTUNE_OK;
}
static void destroy_adamw(void *obj) { ft_adamw_free(obj); free(obj); }

static void test_fault_injection(void) {
    long n = fault_sweep("model load", build_model, destroy_model, small_dir);
    printf("  model load: %ld counted allocations, each made to fail in turn\n", n);
    ftune_model *m = load(small_dir);
    CHECK(m);
    if (!m) return;
    for (int c = 0; c < FT_MEM_N_CLASSES; c++) held_before[c] = ft_mem_current((ft_mem_class)c);
    n = fault_sweep("trainer", build_trainer, destroy_trainer, m);
    printf("  trainer with a KV prefix: %ld\n", n);
    n = fault_sweep("session", build_session, destroy_session, m);
    printf("  session: %ld\n", n);
    n = fault_sweep("optimizer", build_adamw, destroy_adamw, NULL);
    printf("  optimizer: %ld\n", n);
    memset(held_before, 0, sizeof held_before);
    ftune_model_free(m);
    CHECK(counters_zero());
}

int main(void) {
    const char *td = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ftune_memory_XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", tmpdir);
    snprintf(model_dir, sizeof model_dir, "%s/model", tmpdir);
    snprintf(small_dir, sizeof small_dir, "%s/small", tmpdir);
    FILE *f = fopen(cfg, "w");
    if (!f || fputs(model_json, f) < 0 || fclose(f) != 0) { perror(cfg); return 1; }
    double t0 = ft_time_s();
    if (ftune_init_model(model_dir, NULL, cfg, "f32", 1, 0) || ftune_init_model(small_dir, "stories260K", NULL, "f32", 2, 0)) {
        fprintf(stderr, "init: %s\n", ftune_last_error());
        return 1;
    }
    printf("  models made in %.1f s\n", ft_time_s() - t0);
    RUN(test_counters);
    RUN(test_fault_injection);
    RUN(test_dataset);
    if (!UNDER_ASAN) {
        t0 = ft_time_s();
        RUN(test_table_lora);
        printf("  %.1f s\n", ft_time_s() - t0);
        RUN(test_table_lora_grad_checkpoint);
        printf("  %.1f s\n", ft_time_s() - t0);
        RUN(test_table_full);
        printf("  %.1f s\n", ft_time_s() - t0);
        RUN(test_table_inference);
        printf("  three configurations in %.1f s\n", ft_time_s() - t0);
    } else {
        printf("  (ASan build: the RSS tables are not compared)\n");
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    CHECK_EXIT();
}
