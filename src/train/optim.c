/* optim.c — AdamW, gradient clipping, learning-rate schedules and the
 * optimizer state's checkpoint file. The update follows torch.optim.AdamW's
 * single-tensor path operation by operation, with the scalars computed in
 * double and rounded to float where torch rounds them, so that results
 * agree with PyTorch to float rounding. */
#include "train/optim.h"
#include "core/parallel.h"
#include "formats/safetensors.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ft_adamw_defaults(ft_adamw_cfg *c) {
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.0;
    c->n_threads = 1;
}

ftune_status ft_adamw_init(ft_adamw *o, const ft_param *params, int n, const ft_adamw_cfg *cfg) {
    memset(o, 0, sizeof *o);
    if (n < 0 || (n > 0 && !params)) return ft_err(FTUNE_ERR_ARG, "adamw: bad parameter list");
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1) || !(cfg->eps >= 0) ||
        !(cfg->weight_decay >= 0))
        return ft_err(FTUNE_ERR_ARG, "adamw: betas must be in [0, 1), eps and weight_decay non-negative");
    if (cfg->n_threads < 0) return ft_err(FTUNE_ERR_ARG, "adamw: n_threads must be >= 0, not %d", cfg->n_threads);
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
    o->n = n;
    o->params = ft_malloc((size_t)(n ? n : 1) * sizeof *o->params);
    o->m = ft_calloc((size_t)(n ? n : 1), sizeof *o->m);
    o->v = ft_calloc((size_t)(n ? n : 1), sizeof *o->v);
    o->state_bytes = 2 * total * sizeof(float);
    o->state = ft_mem_alloc(FT_MEM_OPTIM, o->state_bytes);
    if (!o->params || !o->m || !o->v || !o->state) {
        ft_adamw_free(o);
        return ft_err(FTUNE_ERR_NOMEM, "adamw: out of memory for the state of %zu parameters (%.1f MiB)", total,
                      8.0 * total / 1048576.0);
    }
    memcpy(o->params, params, (size_t)n * sizeof *params);
    memset(o->state, 0, 2 * total * sizeof(float));
    float *s = o->state;
    for (int i = 0; i < n; i++) {
        o->m[i] = s; s += params[i].numel;
        o->v[i] = s; s += params[i].numel;
    }
    return FTUNE_OK;
}

void ft_adamw_free(ft_adamw *o) {
    if (!o) return;
    free(o->params);
    free(o->m);
    free(o->v);
    if (o->state) ft_mem_free(FT_MEM_OPTIM, o->state, o->state_bytes);
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
    if (!o->params || !o->m || !o->v) {
        ft_adamw_free(o);
        return ft_err(FTUNE_ERR_NOMEM, "out of memory");
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

ftune_status ft_adamw_save(const ft_adamw *o, const char *path, const char *const *extra_meta) {
    st_out_tensor *ts = ft_calloc((size_t)(2 * o->n + 1), sizeof *ts);
    char **names = ft_calloc((size_t)(2 * o->n + 1), sizeof *names);
    int n_extra = 0;
    while (extra_meta && extra_meta[2 * n_extra]) n_extra++;
    const char **meta = ft_calloc((size_t)(2 * n_extra + 16), sizeof *meta);
    ftune_status st = FTUNE_OK;
    if (!ts || !names || !meta) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
    for (int i = 0; i < o->n; i++) {
        const ft_param *p = &o->params[i];
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(p->name) + 8;
            char *nm = names[2 * i + k] = ft_malloc(len);
            if (!nm) { st = ft_err(FTUNE_ERR_NOMEM, "%s: out of memory", path); goto done; }
            snprintf(nm, len, "opt.%c.%s", k ? 'v' : 'm', p->name);
            st_out_tensor *t = &ts[2 * i + k];
            t->name = nm;
            t->dtype = FT_F32;
            t->ndim = p->ndim;
            memcpy(t->shape, p->shape, sizeof t->shape);
            t->data = k ? o->v[i] : o->m[i];
        }
    }
    char step[32], b1[32], b2[32], eps[32], wd[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    snprintf(b1, sizeof b1, "%.17g", o->cfg.beta1);
    snprintf(b2, sizeof b2, "%.17g", o->cfg.beta2);
    snprintf(eps, sizeof eps, "%.17g", o->cfg.eps);
    snprintf(wd, sizeof wd, "%.17g", o->cfg.weight_decay);
    int k = 0;
    const char *fixed[] = { "format", "pt", "opt.kind", "adamw", "opt.step", step, "opt.beta1", b1,
                            "opt.beta2", b2, "opt.eps", eps, "opt.weight_decay", wd };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) meta[k++] = fixed[i];
    for (int i = 0; i < 2 * n_extra; i++) meta[k++] = extra_meta[i];
    meta[k] = NULL;
    st = ft_st_write(path, ts, 2 * o->n, meta);
done:
    for (int i = 0; names && i < 2 * o->n; i++) free(names[i]);
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
    char *end = NULL;
    long long step = -1;
    if (step_s) {
        errno = 0;
        step = strtoll(step_s, &end, 10);
        if (errno || end == step_s || *end || step < 0) step = -1;
    }
    if (!kind || strcmp(kind, "adamw") != 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata \"opt.kind\" is %s%s%s, expected \"adamw\"", path, kind ? "\"" : "",
                    kind ? kind : "missing", kind ? "\"" : "");
        goto done;
    }
    if (step < 0) {
        st = ft_err(FTUNE_ERR_FORMAT, "%s: metadata \"opt.step\" is %s, expected a non-negative integer", path,
                    step_s ? step_s : "missing");
        goto done;
    }
    /* every optimizer tensor in the file must belong to one of our parameters */
    for (int i = 0; i < f.n; i++) {
        const char *nm = f.tensors[i].name;
        if (strncmp(nm, "opt.m.", 6) != 0 && strncmp(nm, "opt.v.", 6) != 0) continue;
        int j = 0;
        while (j < o->n && strcmp(o->params[j].name, nm + 6) != 0) j++;
        if (j == o->n) {
            st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is for a parameter \"%s\" that is not being trained "
                        "(different adapter targets or rank?)", path, nm, nm + 6);
            goto done;
        }
    }
    const st_tensor **found = ft_calloc((size_t)(2 * o->n + 1), sizeof *found);
    if (!found) { st = ft_err(FTUNE_ERR_NOMEM, "out of memory"); goto done; }
    char name[FT_NAME_MAX * 2 + 8];
    for (int i = 0; i < o->n && !st; i++) {
        const ft_param *p = &o->params[i];
        for (int k = 0; k < 2 && !st; k++) {
            snprintf(name, sizeof name, "opt.%c.%s", k ? 'v' : 'm', p->name);
            const st_tensor *t = ft_st_find(&f, name);
            char want[96], got[96];
            if (!t) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\" is missing", path, name);
                break;
            }
            bool same = t->ndim == p->ndim;
            for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
            if (!same) {
                shape_str(want, sizeof want, p->ndim, p->shape);
                shape_str(got, sizeof got, t->ndim, t->shape);
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": shape %s but the parameter has shape %s", path, name,
                            got, want);
                break;
            }
            if (t->dtype != FT_F32) {
                st = ft_err(FTUNE_ERR_FORMAT, "%s: tensor \"%s\": dtype %s, expected F32", path, name, t->dtype_name);
                break;
            }
            found[2 * i + k] = t;
        }
    }
    if (!st) {
        for (int i = 0; i < o->n; i++) {
            size_t nb = (size_t)o->params[i].numel * sizeof(float);
            if (nb) {
                memcpy(o->m[i], found[2 * i]->data, nb);
                memcpy(o->v[i], found[2 * i + 1]->data, nb);
            }
        }
        o->step = step;
    }
    free(found);
done:
    ft_st_close(&f);
    return st;
}
