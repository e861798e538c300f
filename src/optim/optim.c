/* optim.c — AdamW (f32 or 8-bit moments, in memory or paged), gradient
 * clipping, learning-rate schedules and the optimizer state's checkpoint
 * file. The update follows torch.optim.AdamW's single-tensor path operation
 * by operation, with the scalars computed in double and rounded to float
 * where torch rounds them, so that results agree with PyTorch to float
 * rounding; the 8-bit form runs the same arithmetic on dequantized moments
 * (optim8.c). */
#include "optim/optim.h"
#include "core/parallel.h"
#include "formats/safetensors.h"
#include "optim/optim8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ft_adamw_defaults(ft_adamw_cfg *c) {
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.0;
    c->n_threads = 1;
    c->kind = FT_OPTIM_ADAMW;
    c->block = FT_ADAM8_BLOCK;
    c->reference = false;
    c->paged = false;
    c->paged_dir = NULL;
}

ftune_status ft_optim_kind_parse(const char *s, ft_optim_kind *out) {
    if (strcmp(s, "adamw") == 0) *out = FT_OPTIM_ADAMW;
    else if (strcmp(s, "adamw8bit") == 0) *out = FT_OPTIM_ADAMW8BIT;
    else return ft_err(FTUNE_ERR_ARG, "unknown optimizer \"%s\" (adamw, adamw8bit)", s);
    return FTUNE_OK;
}

const char *ft_optim_kind_name(ft_optim_kind k) { return k == FT_OPTIM_ADAMW8BIT ? "adamw8bit" : "adamw"; }

static bool is_8bit(ft_optim_kind kind, int64_t numel) { return kind == FT_OPTIM_ADAMW8BIT && numel >= FT_ADAM8_MIN_SIZE; }
static int64_t n_blocks(int64_t numel, int block) { return (numel + block - 1) / block; }

static size_t page_round(size_t n) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t p = pg > 0 ? (size_t)pg : 4096;
    return (n + p - 1) / p * p;
}

/* Layout of the one state allocation: every f32 part (m, v of f32
 * parameters; absmax of 8-bit ones) in parameter order, then the codes. */
size_t ft_optim_state_bytes(const int64_t *numel, int n, ft_optim_kind kind, int block, bool paged) {
    size_t floats = 0, codes = 0;
    for (int i = 0; i < n; i++) {
        if (is_8bit(kind, numel[i])) {
            floats += 2 * (size_t)n_blocks(numel[i], block);
            codes += 2 * (size_t)numel[i];
        } else floats += 2 * (size_t)numel[i];
    }
    size_t b = floats * sizeof(float) + codes;
    return paged ? page_round(b ? b : 1) : b;
}

/* Points m/v (or qm/qv/am/av) of every parameter into o->state. */
static void carve_state(ft_adamw *o) {
    float *f = o->state;
    for (int i = 0; i < o->n; i++) {
        int64_t ne = o->params[i].numel;
        if (is_8bit(o->cfg.kind, ne)) {
            o->am[i] = f; f += n_blocks(ne, o->cfg.block);
            o->av[i] = f; f += n_blocks(ne, o->cfg.block);
        } else {
            o->m[i] = f; f += ne;
            o->v[i] = f; f += ne;
        }
    }
    uint8_t *c = (uint8_t *)f;
    for (int i = 0; i < o->n; i++) {
        int64_t ne = o->params[i].numel;
        if (!is_8bit(o->cfg.kind, ne)) continue;
        o->qm[i] = c; c += ne;
        o->qv[i] = c; c += ne;
    }
}

static FTUNE_MUST_USE ftune_status check_cfg(const ft_adamw_cfg *cfg) {
    if (cfg->kind != FT_OPTIM_ADAMW && cfg->kind != FT_OPTIM_ADAMW8BIT)
        return ft_err(FTUNE_ERR_ARG, "adamw: unknown optimizer kind %d", (int)cfg->kind);
    if (cfg->kind == FT_OPTIM_ADAMW8BIT &&
        (cfg->block < 64 || cfg->block > FT_ADAM8_MAX_BLOCK || (cfg->block & (cfg->block - 1))))
        return ft_err(FTUNE_ERR_ARG, "adamw8bit: block size %d: expected a power of two in 64..%d", cfg->block,
                      FT_ADAM8_MAX_BLOCK);
    return FTUNE_OK;
}

ftune_status ft_adamw_init(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg) {
    memset(o, 0, sizeof *o);
    if (n < 0 || (n > 0 && !params)) return ft_err(FTUNE_ERR_ARG, "adamw: bad parameter list");
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps >= 0) ||
        !(cfg->weight_decay >= 0))
        return ft_err(FTUNE_ERR_ARG, "adamw: betas must be in [0, 1), eps and weight_decay non-negative");
    if (cfg->n_threads < 0) return ft_err(FTUNE_ERR_ARG, "adamw: n_threads must be >= 0, not %d", cfg->n_threads);
    ftune_status st = check_cfg(cfg);
    if (st) return st;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const ft_param *p = &params[i];
        int64_t prod = 1;
        for (int d = 0; d < p->ndim; d++) prod *= p->shape[d];
        if (p->numel < 0 || p->ndim < 0 || p->ndim > FT_MAX_DIMS || prod != p->numel || (p->numel && (!p->data || !p->grad)))
            return ft_err(FTUNE_ERR_ARG, "adamw: parameter \"%s\": shape, size or pointers inconsistent", p->name);
        for (int j = 0; j < i; j++)
            if (strcmp(params[j].name, p->name) == 0)
                return ft_err(FTUNE_ERR_ARG, "adamw: parameter name \"%s\" given twice", p->name);
        total += (size_t)p->numel;
    }
    o->cfg = *cfg;
    o->cfg.paged_dir = NULL; /* the caller's string need not outlive init */
    o->n = n;
    size_t nn = (size_t)(n ? n : 1);
    o->params = ft_malloc(nn * sizeof *o->params);
    o->m = ft_calloc(nn, sizeof *o->m);
    o->v = ft_calloc(nn, sizeof *o->v);
    o->qm = ft_calloc(nn, sizeof *o->qm);
    o->qv = ft_calloc(nn, sizeof *o->qv);
    o->am = ft_calloc(nn, sizeof *o->am);
    o->av = ft_calloc(nn, sizeof *o->av);
    int64_t *ne = ft_malloc(nn * sizeof *ne);
    for (int i = 0; ne && i < n; i++) ne[i] = params[i].numel;
    o->state_bytes = ne ? ft_optim_state_bytes(ne, n, cfg->kind, cfg->block, cfg->paged) : 0;
    free(ne);
    if (!o->params || !o->m || !o->v || !o->qm || !o->qv || !o->am || !o->av || !ne) {
        ft_adamw_free(o);
        return ft_err(FTUNE_ERR_NOMEM, "adamw: out of memory");
    }
    if (cfg->paged) {
        if ((st = ft_mem_map_paged(&o->state, o->state_bytes, cfg->paged_dir))) {
            ft_adamw_free(o);
            return ft_err_prefix(st, "optimizer state");
        }
    } else {
        o->state = ft_mem_alloc(FT_MEM_OPTIM, o->state_bytes);
        if (!o->state) {
            ft_adamw_free(o);
            return ft_err(FTUNE_ERR_NOMEM, "adamw: out of memory for the state of %zu parameters (%.1f MiB)", total,
                          o->state_bytes / 1048576.0);
        }
        memset(o->state, 0, o->state_bytes);
    }
    memcpy(o->params, params, (size_t)n * sizeof *params);
    carve_state(o);
    if (cfg->kind == FT_OPTIM_ADAMW8BIT) ft_adam8_prepare();
    return FTUNE_OK;
}

void ft_adamw_free(ft_adamw *o) {
    if (!o) return;
    free(o->params);
    free(o->m);
    free(o->v);
    free(o->qm);
    free(o->qv);
    free(o->am);
    free(o->av);
    if (o->state && o->cfg.paged) ft_mem_unmap_paged(o->state, o->state_bytes);
    else if (o->state) ft_mem_free(FT_MEM_OPTIM, o->state, o->state_bytes);
    memset(o, 0, sizeof *o);
}

/* One parameter's update, split into chunks of ADAMW_CHUNK elements, one
 * chunk per task: elementwise, so any split gives the same bits. */
#define ADAMW_CHUNK 16384
typedef struct {
    float *w, *m, *v;
    const float *g;
    int64_t N;
    bool wd;
    float decay, b1, omb1, b2, omb2, neg_step, bc2_sqrt, eps;
} adamw_job;

static void adamw_task(void *vctx, int task, int thread) {
    const adamw_job *j = vctx;
    float *w = j->w, *m = j->m, *v = j->v;
    const float *g = j->g;
    int64_t k0 = (int64_t)task * ADAMW_CHUNK, k1 = k0 + ADAMW_CHUNK < j->N ? k0 + ADAMW_CHUNK : j->N;
    for (int64_t k = k0; k < k1; k++) {
        float x = j->wd ? w[k] * j->decay : w[k];
        float gk = g[k];
        float mk = m[k] * j->b1 + gk * j->omb1;
        float vk = v[k] * j->b2 + gk * gk * j->omb2;
        float denom = sqrtf(vk) / j->bc2_sqrt + j->eps;
        w[k] = x + j->neg_step * mk / denom;
        m[k] = mk;
        v[k] = vk;
    }
}

/* An 8-bit parameter's blocks, ADAM8_TASK_BLOCKS per task (blocks are
 * independent, so any split gives the same bits). */
typedef struct { const ft_adam8_job *j; int64_t n_blocks, per_task; } adam8_split;

static void adam8_task(void *vctx, int task, int thread) {
    (void)thread;
    const adam8_split *s = vctx;
    int64_t b0 = (int64_t)task * s->per_task, b1 = b0 + s->per_task < s->n_blocks ? b0 + s->per_task : s->n_blocks;
    ft_adam8_blocks(s->j, b0, b1);
}

void ft_adamw_step(ft_adamw *o, double lr) {
    o->step++;
    const ft_adamw_cfg *c = &o->cfg;
    double bc1 = 1.0 - pow(c->beta1, (double)o->step);
    double bc2 = 1.0 - pow(c->beta2, (double)o->step);
    int nt = ft_num_threads(c->n_threads);
    /* torch rounds each Python scalar to float when it meets a float tensor */
    adamw_job j = { .decay = (float)(1.0 - lr * c->weight_decay),
                    .b1 = (float)c->beta1, .omb1 = (float)(1.0 - c->beta1),
                    .b2 = (float)c->beta2, .omb2 = (float)(1.0 - c->beta2),
                    .neg_step = (float)(-(lr / bc1)), .bc2_sqrt = (float)sqrt(bc2), .eps = (float)c->eps };
    for (int i = 0; i < o->n; i++) {
        const ft_param *p = &o->params[i];
        j.w = p->data;
        j.m = o->m[i];
        j.v = o->v[i];
        j.g = p->grad;
        j.wd = p->decay && c->weight_decay != 0;
        j.N = p->numel;
        if (o->qm[i]) {
            ft_adam8_job q = { .w = p->data, .g = p->grad, .qm = o->qm[i], .qv = o->qv[i], .am = o->am[i],
                               .av = o->av[i], .N = p->numel, .block = c->block, .wd = j.wd,
                               .reference = c->reference, .decay = j.decay, .b1 = j.b1, .omb1 = j.omb1, .b2 = j.b2,
                               .omb2 = j.omb2, .neg_step = j.neg_step, .bc2_sqrt = j.bc2_sqrt, .eps = j.eps };
            adam8_split sp = { &q, n_blocks(p->numel, c->block), (ADAMW_CHUNK + c->block - 1) / c->block };
            int n_tasks = (int)((sp.n_blocks + sp.per_task - 1) / sp.per_task);
            ft_parallel_for(n_tasks > 4 ? nt : 1, n_tasks, adam8_task, &sp);
            continue;
        }
        int64_t n_tasks = (p->numel + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        /* up to 4 chunks (64K elements) are not worth waking a thread for */
        ft_parallel_for(n_tasks > 4 ? nt : 1, (int)n_tasks, adamw_task, &j);
    }
}

double ft_grad_sumsq(const ft_param *params, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) {
        const float *g = params[i].grad;
        double s = 0;
        for (int64_t k = 0; k < params[i].numel; k++) s += (double)g[k] * g[k];
        ss += s;
    }
    return ss;
}

void ft_clip_grad_by_norm(const ft_param *params, int n, double norm, double max_norm) {
    if (!isfinite(norm) || !(max_norm > 0)) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef >= 1.0) return;
    float cf = (float)coef;
    for (int i = 0; i < n; i++) {
        float *g = params[i].grad;
        for (int64_t k = 0; k < params[i].numel; k++) g[k] *= cf;
    }
}

double ft_clip_grad_norm(const ft_param *params, int n, double max_norm) {
    double norm = sqrt(ft_grad_sumsq(params, n));
    ft_clip_grad_by_norm(params, n, norm, max_norm);
    return norm;
}

ftune_status ft_params_shard(const ft_param *params, int n, const float *base, int64_t lo, int64_t hi, ft_param **out,
                             int *n_out) {
    ft_param *ps = ft_calloc((size_t)(n ? n : 1), sizeof *ps);
    if (!ps) return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < n; i++) {
        const ft_param *p = &params[i];
        int64_t a = p->data - base, b = a + p->numel;
        int64_t s = a > lo ? a : lo, e = b < hi ? b : hi;
        if (s >= e) continue;
        ft_param *q = &ps[k++];
        *q = *p;
        q->data = p->data + (s - a);
        q->grad = p->grad + (s - a);
        q->numel = e - s;
        q->ndim = 1;
        memset(q->shape, 0, sizeof q->shape);
        q->shape[0] = e - s;
    }
    *out = ps;
    *n_out = k;
    return FTUNE_OK;
}

ftune_status ft_adamw_view(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg, const float *base,
                           float *m_flat, float *v_flat) {
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->n = n;
    o->params = ft_malloc((size_t)(n ? n : 1) * sizeof *o->params);
    o->m = ft_calloc((size_t)(n ? n : 1), sizeof *o->m);
    o->v = ft_calloc((size_t)(n ? n : 1), sizeof *o->v);
    o->qm = ft_calloc((size_t)(n ? n : 1), sizeof *o->qm);
    o->qv = ft_calloc((size_t)(n ? n : 1), sizeof *o->qv);
    o->am = ft_calloc((size_t)(n ? n : 1), sizeof *o->am);
    o->av = ft_calloc((size_t)(n ? n : 1), sizeof *o->av);
    if (!o->params || !o->m || !o->v || !o->qm || !o->qv || !o->am || !o->av) {
        ft_adamw_free(o);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory");
    }
    if (cfg->kind != FT_OPTIM_ADAMW) {
        ft_adamw_free(o);
        return ft_err(FTUNE_ERR_UNSUPPORTED, "adamw: a view of flat moments holds f32 AdamW state only");
    }
    memcpy(o->params, params, (size_t)n * sizeof *params);
    for (int i = 0; i < n; i++) {
        o->m[i] = m_flat + (params[i].data - base);
        o->v[i] = v_flat + (params[i].data - base);
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------- schedules */

ftune_status ft_sched_kind_parse(const char *s, ft_sched_kind *out) {
    if (strcmp(s, "constant") == 0) *out = FT_SCHED_CONSTANT;
    else if (strcmp(s, "linear") == 0) *out = FT_SCHED_LINEAR;
    else if (strcmp(s, "cosine") == 0) *out = FT_SCHED_COSINE;
    else return ft_err(FTUNE_ERR_ARG, "unknown learning-rate schedule \"%s\" (constant, linear, cosine)", s);
    return FTUNE_OK;
}

/* The factors are transformers' lr_lambda functions (optimization.py); a
 * min_lr lifts the decaying factor f to f·(1 - min_lr/lr) + min_lr/lr as
 * get_cosine_with_min_lr_schedule_with_warmup does. */
double ft_sched_lr(const ft_sched *s, int64_t step) {
    double w = (double)s->warmup_steps;
    if (step < s->warmup_steps) return s->lr * ((double)step / (w > 1 ? w : 1));
    if (s->kind == FT_SCHED_CONSTANT) return s->lr;
    double span = (double)(s->total_steps - s->warmup_steps);
    double progress = (double)(step - s->warmup_steps) / (span > 1 ? span : 1);
    double f = s->kind == FT_SCHED_LINEAR ? fmax(0.0, (double)(s->total_steps - step) / (span > 1 ? span : 1))
                                          : 0.5 * (1.0 + cos(M_PI * progress));
    double floor_rate = s->lr > 0 ? s->min_lr / s->lr : 0;
    if (step >= s->total_steps) f = 0; /* past the end: stay at the floor */
    f = f * (1 - floor_rate) + floor_rate;
    return s->lr * fmax(0.0, f);
}

/* ------------------------------------------------------------- checkpoint */

/* The file's tensors for parameter i: 2 (f32 m, v) or 4 (codes and absmax
 * of m, v), as (prefix, dtype, data, numel or 0 for the parameter's shape). */
typedef struct { const char *prefix; ft_dtype dtype; void *data; int64_t flat; } opt_part;

static int opt_parts(const ft_adamw *o, int i, opt_part out[4]) {
    if (!o->qm[i]) {
        out[0] = (opt_part){ "opt.m.", FT_F32, o->m[i], 0 };
        out[1] = (opt_part){ "opt.v.", FT_F32, o->v[i], 0 };
        return 2;
    }
    int64_t nb = n_blocks(o->params[i].numel, o->cfg.block);
    out[0] = (opt_part){ "opt.m8.", FT_U8, o->qm[i], 0 };
    out[1] = (opt_part){ "opt.v8.", FT_U8, o->qv[i], 0 };
    out[2] = (opt_part){ "opt.m8.absmax.", FT_F32, o->am[i], nb };
    out[3] = (opt_part){ "opt.v8.absmax.", FT_F32, o->av[i], nb };
    return 4;
}

/* The parameter name an optimizer tensor's name is for, or NULL. */
static const char *opt_param_name(const char *nm) {
    static const char *const pre[] = { "opt.m8.absmax.", "opt.v8.absmax.", "opt.m8.", "opt.v8.", "opt.m.", "opt.v." };
    for (size_t k = 0; k < sizeof pre / sizeof pre[0]; k++)
        if (strncmp(nm, pre[k], strlen(pre[k])) == 0) return nm + strlen(pre[k]);
    return NULL;
}

ftune_status ft_adamw_save(const ft_adamw *o, const char *path, const char *const *extra_meta) {
    st_out_tensor *ts = ft_calloc((size_t)(4 * o->n + 1), sizeof *ts);
    char **names = ft_calloc((size_t)(4 * o->n + 1), sizeof *names);
    int n_extra = 0, nt = 0;
    while (extra_meta && extra_meta[2 * n_extra]) n_extra++;
    const char **meta = ft_calloc((size_t)(2 * n_extra + 20), sizeof *meta);
    ftune_status st = FTUNE_OK;
    if (!ts || !names || !meta) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    for (int i = 0; i < o->n; i++) {
        const ft_param *p = &o->params[i];
        opt_part parts[4];
        int np = opt_parts(o, i, parts);
        for (int k = 0; k < np; k++) {
            size_t len = strlen(p->name) + strlen(parts[k].prefix) + 1;
            char *nm = names[nt] = ft_malloc(len);
            if (!nm) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
            snprintf(nm, len, "%s%s", parts[k].prefix, p->name);
            st_out_tensor *t = &ts[nt++];
            t->name = nm;
            t->dtype = parts[k].dtype;
            if (parts[k].flat) {
                t->ndim = 1;
                t->shape[0] = parts[k].flat;
            } else {
                t->ndim = p->ndim;
                memcpy(t->shape, p->shape, sizeof t->shape);
            }
            t->data = parts[k].data;
        }
    }
    char step[32], b1[32], b2[32], eps[32], wd[32], blk[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    snprintf(b1, sizeof b1, "%.17g", o->cfg.beta1);
    snprintf(b2, sizeof b2, "%.17g", o->cfg.beta2);
    snprintf(eps, sizeof eps, "%.17g", o->cfg.eps);
    snprintf(wd, sizeof wd, "%.17g", o->cfg.weight_decay);
    snprintf(blk, sizeof blk, "%d", o->cfg.block);
    int k = 0;
    const char *fixed[] = { "format", "pt", "opt.kind", ft_optim_kind_name(o->cfg.kind), "opt.step", step,
                            "opt.beta1", b1, "opt.beta2", b2, "opt.eps", eps, "opt.weight_decay", wd };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) meta[k++] = fixed[i];
    if (o->cfg.kind == FT_OPTIM_ADAMW8BIT) { meta[k++] = "opt.block"; meta[k++] = blk; }
    for (int i = 0; i < 2 * n_extra; i++) meta[k++] = extra_meta[i];
    meta[k] = NULL;
    st = ft_st_write(path, ts, nt, meta);
done:
    for (int i = 0; names && i < nt; i++) free(names[i]);
    free(names);
    free(ts);
    free(meta);
    return st;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

ftune_status ft_adamw_load(ft_adamw *o, const char *path) {
    st_file f;
    ftune_status st = ft_st_open(&f, path);
    if (st) return st;
    const char *kind = ft_st_meta(&f, "opt.kind");
    const char *step_s = ft_st_meta(&f, "opt.step");
    const char *want_kind = ft_optim_kind_name(o->cfg.kind);
    char *end = NULL;
    long long step = -1;
    if (step_s) {
        errno = 0;
        step = strtoll(step_s, &end, 10);
        if (errno || end == step_s || *end || step < 0) step = -1;
    }
    ft_optim_kind there = FT_OPTIM_ADAMW;
    if (!kind || ft_optim_kind_parse(kind, &there) != FTUNE_OK) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata \"opt.kind\" is %s%s%s, expected \"adamw\" or \"adamw8bit\"", path,
                    kind ? "\"" : "", kind ? kind : "missing", kind ? "\"" : "");
        goto done;
    }
    if (there != o->cfg.kind) {
        st = ft_err(FTUNE_ERR_ARG, "%s: the optimizer state was saved by --optim %s, this run uses --optim %s: resume "
                    "with --optim %s", path, kind, want_kind, kind);
        goto done;
    }
    if (o->cfg.kind == FT_OPTIM_ADAMW8BIT) {
        const char *blk = ft_st_meta(&f, "opt.block");
        char want[32];
        snprintf(want, sizeof want, "%d", o->cfg.block);
        if (!blk || strcmp(blk, want) != 0) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata \"opt.block\" is %s%s%s, this optimizer's block is %d", path,
                        blk ? "\"" : "", blk ? blk : "missing", blk ? "\"" : "", o->cfg.block);
            goto done;
        }
    }
    if (step < 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata \"opt.step\" is %s, expected a non-negative integer", path,
                    step_s ? step_s : "missing");
        goto done;
    }
    /* every optimizer tensor in the file must belong to one of our parameters */
    for (int i = 0; i < f.n; i++) {
        const char *nm = f.tensors[i].name, *pn = opt_param_name(nm);
        if (!pn) continue;
        int j = 0;
        while (j < o->n && strcmp(o->params[j].name, pn) != 0) j++;
        if (j == o->n) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is for a parameter \"%s\" that is not being trained "
                        "(different adapter targets or rank?)", path, nm, pn);
            goto done;
        }
    }
    const st_tensor **found = ft_calloc((size_t)(4 * o->n + 1), sizeof *found);
    if (!found) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    char name[FT_NAME_MAX * 2 + 16];
    for (int i = 0; i < o->n && !st; i++) {
        const ft_param *p = &o->params[i];
        opt_part parts[4];
        int np = opt_parts(o, i, parts);
        for (int k = 0; k < np && !st; k++) {
            snprintf(name, sizeof name, "%s%s", parts[k].prefix, p->name);
            const st_tensor *t = ft_st_find(&f, name);
            char want[96], got[96];
            if (!t) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is missing", path, name);
                break;
            }
            int64_t flat[1] = { parts[k].flat };
            int wnd = parts[k].flat ? 1 : p->ndim;
            const int64_t *wsh = parts[k].flat ? flat : p->shape;
            bool same = t->ndim == wnd;
            for (int d = 0; same && d < wnd; d++) same = t->shape[d] == wsh[d];
            if (!same) {
                shape_str(want, sizeof want, wnd, wsh);
                shape_str(got, sizeof got, t->ndim, t->shape);
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape %s but the parameter's state has shape %s", path,
                            name, got, want);
                break;
            }
            if (t->dtype != parts[k].dtype) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": dtype %s, expected %s", path, name, t->dtype_name,
                            parts[k].dtype == FT_U8 ? "U8" : "F32");
                break;
            }
            /* an absmax is a block's largest |moment|: finite and >= 0 */
            if (parts[k].flat) {
                const float *a = (const float *)t->data;
                for (int64_t b = 0; b < parts[k].flat; b++) {
                    float x;
                    memcpy(&x, a + b, sizeof x);
                    if (!(x >= 0) || !isfinite(x)) {
                        st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": element %lld is %g, not a finite absmax >= 0",
                                    path, name, (long long)b, (double)x);
                        break;
                    }
                }
            }
            found[4 * i + k] = t;
        }
    }
    if (!st) {
        for (int i = 0; i < o->n; i++) {
            opt_part parts[4];
            int np = opt_parts(o, i, parts);
            for (int k = 0; k < np; k++) {
                size_t nb = (size_t)(parts[k].flat ? parts[k].flat : o->params[i].numel) *
                            (parts[k].dtype == FT_U8 ? 1 : sizeof(float));
                if (nb) memcpy(parts[k].data, found[4 * i + k]->data, nb);
            }
        }
        o->step = step;
    }
    free(found);
done:
    ft_st_close(&f);
    return st;
}
