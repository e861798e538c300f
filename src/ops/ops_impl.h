/* ops_impl.h — the body of every op in ops.c, written once for a type
 * `real` and a name macro FN(name). ops.c includes it twice: real = float
 * gives the library functions, real = double gives their _f64 twins, which
 * the tests compare against finite differences. Not a public header.
 *
 * Maths goes through <tgmath.h> (included by ops.c), so exp/sqrt/cos act in
 * the precision of their argument. Long reductions (dot products, sums of
 * squares, softmax denominators) accumulate in double in both variants.
 */

/* ------------------------------------------------------------- rmsnorm */

void FN(rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *w, int T, int C, real eps)
{
    for (int t = 0; t < T; t++) {
        const real *x = inp + (size_t)t * C;
        real *o = out + (size_t)t * C;
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
        /* the mean is rounded to `real` first, as PyTorch does in float32 */
        real r = 1 / sqrt((real)(ss / C) + eps);
        for (int i = 0; i < C; i++) o[i] = w[i] * (x[i] * r);
        if (rstd) rstd[t] = r;
    }
}

void FN(rmsnorm_backward)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                          const real *rstd, int T, int C)
{
    for (int t = 0; t < T; t++) {
        const real *x = inp + (size_t)t * C, *dy = dout + (size_t)t * C;
        real *dx = dinp + (size_t)t * C;
        real r = rstd[t];
        /* y = w * xhat, xhat = x * r; dxhat = dy * w;
         * dx = r * (dxhat - xhat * mean(dxhat * xhat)) */
        double dot = 0;
        for (int i = 0; i < C; i++) dot += (double)dy[i] * w[i] * (x[i] * r);
        real m = (real)(dot / C);
        for (int i = 0; i < C; i++) {
            real xhat = x[i] * r;
            if (dw) dw[i] += dy[i] * xhat;
            dx[i] += r * (dy[i] * w[i] - xhat * m);
        }
    }
}

/* ------------------------------------------------------------- rope */

void FN(rope_freqs)(real *inv_freq, int HS, real theta, const ft_rope_scaling *sc)
{
    /* In double, in the order of Hugging Face's _compute_default_rope_parameters
     * and _compute_llama3_parameters, rounded once at the end. */
    for (int i = 0; i < HS / 2; i++) {
        double f = 1.0 / pow((double)theta, (double)(2 * i) / HS);
        if (sc && sc->type == 1) {
            f = f / sc->factor;
        } else if (sc && sc->type == 2) {
            double factor = sc->factor, lo = sc->low_freq_factor, hi = sc->high_freq_factor;
            double old_len = sc->original_max_pos;
            double wavelen = 2 * 3.14159265358979323846 / f;
            if (wavelen < old_len / hi) {
                /* high frequency: kept */
            } else if (wavelen > old_len / lo) {
                f = f / factor;
            } else {
                double smooth = (old_len / wavelen - lo) / (hi - lo);
                f = (1 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = (real)f;
    }
}

/* Rotates each pair by angle sign * pos * inv_freq[i]. The angle and its
 * cos/sin are computed in double in both variants (Hugging Face forms the
 * angle in float32, whose rounding grows with the position: 2.4e-4 rad at
 * position 4096; in double only the rounding of inv_freq remains). */
static void FN(rope_rotate)(real *x, const int *pos, const real *inv_freq, int T, int nh, int HS,
                            bool interleaved, int sign)
{
    int half = HS / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = (double)pos[t] * (double)inv_freq[i];
            real c = (real)cos(angle), s = (real)(sign * sin(angle));
            for (int h = 0; h < nh; h++) {
                real *xh = x + ((size_t)t * nh + h) * HS;
                real *a = interleaved ? &xh[2 * i] : &xh[i];
                real *b = interleaved ? &xh[2 * i + 1] : &xh[i + half];
                real x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x1 * c + x0 * s;
            }
        }
    }
}

void FN(rope_forward)(real *x, const int *pos, const real *inv_freq, int T, int nh, int HS, bool interleaved)
{
    FN(rope_rotate)(x, pos, inv_freq, T, nh, HS, interleaved, 1);
}

void FN(rope_backward)(real *dx, const int *pos, const real *inv_freq, int T, int nh, int HS, bool interleaved)
{
    FN(rope_rotate)(dx, pos, inv_freq, T, nh, HS, interleaved, -1);
}

/* ------------------------------------------------------------- swiglu */

void FN(swiglu_forward)(real *out, const real *gate, const real *up, int T, int F)
{
    size_t n = (size_t)T * F;
    for (size_t i = 0; i < n; i++) {
        real g = gate[i];
        out[i] = g / (1 + exp(-g)) * up[i];
    }
}

void FN(swiglu_backward)(real *dgate, real *dup, const real *dout, const real *gate, const real *up, int T, int F)
{
    size_t n = (size_t)T * F;
    for (size_t i = 0; i < n; i++) {
        real g = gate[i];
        real sig = 1 / (1 + exp(-g));
        real silu = g * sig;
        /* silu'(g) = sig * (1 + g * (1 - sig)) */
        dgate[i] = dout[i] * up[i] * sig * (1 + g * (1 - sig));
        dup[i] = dout[i] * silu;
    }
}

/* ------------------------------------------------------------- embedding */

FTUNE_MUST_USE ftune_status FN(embedding_forward)(real *out, const int *tokens, const real *wte, int T, int C, int V)
{
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= V)
            return ft_err(FTUNE_ERR_RANGE, "embedding: token %d at position %d is outside the vocabulary (%d)",
                          tokens[t], t, V);
        memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, (size_t)C * sizeof(real));
    }
    return FTUNE_OK;
}

FTUNE_MUST_USE ftune_status FN(embedding_backward)(real *dwte, const real *dout, const int *tokens, int T, int C, int V)
{
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return ft_err(FTUNE_ERR_RANGE, "embedding: token %d at position %d is outside the vocabulary (%d)",
                          tokens[t], t, V);
    for (int t = 0; t < T; t++) {
        real *row = dwte + (size_t)tokens[t] * C;
        const real *dy = dout + (size_t)t * C;
        for (int i = 0; i < C; i++) row[i] += dy[i];
    }
    return FTUNE_OK;
}

/* ------------------------------------------------------------- softmax */

real FN(softmax_inplace)(real *x, int n)
{
    real mx = -INFINITY;
    for (int i = 0; i < n; i++) if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = exp(x[i] - mx);
        sum += x[i];
    }
    real inv = (real)(1 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
    return mx + (real)log(sum);
}

/* ------------------------------------------------------------- attention */

static double FN(dot)(const real *a, const real *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Query rows per task in the threaded attention_forward. */
#define FT_ATT_REF_ROWS 4

typedef struct {
    real *out, *att;
    const real *q, *k, *v;
    const int *q_pos, *doc;
    int T, Tk, NH, NKV, HS, kv_stride;
} FN(att_fwd_job);

/* Rows [task*FT_ATT_REF_ROWS, ...) of the (h, t) pairs, h major; each pair
 * writes only its own output row and probabilities. */
static void FN(att_fwd_task)(void *vctx, int task, int thread)
{
    const FN(att_fwd_job) *jb = vctx;
    real *out = jb->out, *att = jb->att;
    const real *q = jb->q, *k = jb->k, *v = jb->v;
    const int *q_pos = jb->q_pos, *doc = jb->doc;
    int T = jb->T, Tk = jb->Tk, NH = jb->NH, HS = jb->HS, kv_stride = jb->kv_stride;
    int group = NH / jb->NKV;
    double scale = 1.0 / sqrt((double)HS);
    int r1 = (task + 1) * FT_ATT_REF_ROWS < NH * T ? (task + 1) * FT_ATT_REF_ROWS : NH * T;
    for (int r = task * FT_ATT_REF_ROWS; r < r1; r++) {
        int h = r / T, t = r % T;
        const real *qt = q + (size_t)t * NH * HS + (size_t)h * HS;
        real *ot = out + (size_t)t * NH * HS + (size_t)h * HS;
        const real *kh = k + (size_t)(h / group) * HS, *vh = v + (size_t)(h / group) * HS;
        /* keys 0..last are causally visible; the query's own key is
         * `last`, so at least one key is visible whenever last >= 0 */
        int last = q_pos[t] < Tk ? q_pos[t] : Tk - 1;
        int qdoc = doc && last >= 0 ? doc[last] : 0;
        for (int d = 0; d < HS; d++) ot[d] = 0;
        if (att) {
            real *p = att + ((size_t)h * T + t) * Tk;
            for (int j = 0; j < Tk; j++) {
                if (j > last) p[j] = 0;
                else if (doc && doc[j] != qdoc) p[j] = -INFINITY;
                else p[j] = (real)(FN(dot)(qt, kh + (size_t)j * kv_stride, HS) * scale);
            }
            if (last < 0) continue;
            FN(softmax_inplace)(p, last + 1);
            for (int j = 0; j <= last; j++) {
                if (p[j] == 0) continue;
                const real *vj = vh + (size_t)j * kv_stride;
                for (int d = 0; d < HS; d++) ot[d] += p[j] * vj[d];
            }
        } else {
            /* No probabilities to keep: one pass with a running max and
             * denominator (online softmax), so no scratch is needed. */
            real m = -INFINITY, l = 0;
            for (int j = 0; j <= last; j++) {
                if (doc && doc[j] != qdoc) continue;
                real s = (real)(FN(dot)(qt, kh + (size_t)j * kv_stride, HS) * scale);
                if (s > m) {
                    real c = exp(m - s);
                    for (int d = 0; d < HS; d++) ot[d] *= c;
                    l *= c;
                    m = s;
                }
                real pj = exp(s - m);
                l += pj;
                const real *vj = vh + (size_t)j * kv_stride;
                for (int d = 0; d < HS; d++) ot[d] += pj * vj[d];
            }
            if (l > 0)
                for (int d = 0; d < HS; d++) ot[d] /= l;
        }
    }
}

void FN(attention_forward)(real *out, real *att, const real *q, const real *k, const real *v,
                           const int *q_pos, const int *doc, int T, int Tk, int NH, int NKV, int HS,
                           int kv_stride, int n_threads)
{
    FN(att_fwd_job) jb = { .out = out, .att = att, .q = q, .k = k, .v = v, .q_pos = q_pos, .doc = doc,
                           .T = T, .Tk = Tk, .NH = NH, .NKV = NKV, .HS = HS, .kv_stride = kv_stride };
    ft_parallel_for(n_threads, (NH * T + FT_ATT_REF_ROWS - 1) / FT_ATT_REF_ROWS, FN(att_fwd_task), &jb);
}

void FN(attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *att,
                            const real *q, const real *k, const real *v, int T, int Tk, int NH, int NKV, int HS)
{
    int group = NH / NKV;
    size_t qs = (size_t)NH * HS, ks = (size_t)NKV * HS;
    real scale = (real)(1.0 / sqrt((double)HS));
    memset(dk, 0, (size_t)Tk * ks * sizeof(real));
    memset(dv, 0, (size_t)Tk * ks * sizeof(real));
    /* One kv head at a time: the query heads that share it add into the
     * same dk/dv columns. */
    for (int kvh = 0; kvh < NKV; kvh++) {
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            for (int t = 0; t < T; t++) {
                const real *p = att + ((size_t)h * T + t) * Tk;
                const real *qt = q + t * qs + (size_t)h * HS, *dy = dout + t * qs + (size_t)h * HS;
                real *dqt = dq + t * qs + (size_t)h * HS;
                /* dp_j = dout . v_j;  ds_j = p_j (dp_j - sum_i p_i dp_i) */
                double pdp = 0;
                for (int j = 0; j < Tk; j++)
                    if (p[j] != 0) pdp += p[j] * FN(dot)(dy, v + j * ks + (size_t)kvh * HS, HS);
                for (int d = 0; d < HS; d++) dqt[d] = 0;
                for (int j = 0; j < Tk; j++) {
                    if (p[j] == 0) continue;
                    const real *kj = k + j * ks + (size_t)kvh * HS, *vj = v + j * ks + (size_t)kvh * HS;
                    real *dkj = dk + j * ks + (size_t)kvh * HS, *dvj = dv + j * ks + (size_t)kvh * HS;
                    real ds = p[j] * (real)(FN(dot)(dy, vj, HS) - pdp) * scale;
                    for (int d = 0; d < HS; d++) {
                        dqt[d] += ds * kj[d];
                        dkj[d] += ds * qt[d];
                        dvj[d] += p[j] * dy[d];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------- cross-entropy */

double FN(crossentropy_forward_backward)(real *dlogits, const real *logits, const int *targets,
                                         int T, int V, real dloss_scale)
{
    double loss = 0;
    for (int t = 0; t < T; t++) {
        const real *x = logits + (size_t)t * V;
        real *dx = dlogits ? dlogits + (size_t)t * V : NULL;
        int y = targets[t];
        if (y < 0 || y >= V) {
            /* negative: ignored (-1, or PyTorch's -100); >= V: not a valid
             * class, which makes the loss NaN rather than reading past x */
            if (y >= V) loss = NAN;
            if (dx) memset(dx, 0, (size_t)V * sizeof(real));
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++) if (x[i] > mx) mx = x[i];
        for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
        double lse = mx + log(sum);
        loss += lse - x[y];
        if (dx)
            for (int i = 0; i < V; i++)
                dx[i] = (real)(exp((double)x[i] - lse) - (i == y)) * dloss_scale;
    }
    return loss;
}

/* ------------------------------------------------------------- matmul */

void FN(matmul_forward_ref)(real *out, const real *inp, const real *w, const real *bias, int T, int IC, int OC)
{
    for (int t = 0; t < T; t++) {
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0;
            s += FN(dot)(inp + (size_t)t * IC, w + (size_t)o * IC, IC);
            out[(size_t)t * OC + o] = (real)s;
        }
    }
}

void FN(matmul_backward_ref)(real *dinp, real *dw, real *dbias, const real *dout, const real *inp,
                             const real *w, int T, int IC, int OC)
{
    if (dinp) {
        for (int t = 0; t < T; t++) {
            const real *dy = dout + (size_t)t * OC;
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int o = 0; o < OC; o++) s += (double)dy[o] * w[(size_t)o * IC + i];
                dinp[(size_t)t * IC + i] = (real)s;
            }
        }
    }
    if (dw) {
        for (int o = 0; o < OC; o++) {
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int t = 0; t < T; t++) s += (double)dout[(size_t)t * OC + o] * inp[(size_t)t * IC + i];
                dw[(size_t)o * IC + i] += (real)s;
            }
        }
    }
    if (dbias) {
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int t = 0; t < T; t++) s += dout[(size_t)t * OC + o];
            dbias[o] += (real)s;
        }
    }
}
