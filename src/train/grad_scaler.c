/* grad_scaler.c — PyTorch GradScaler semantics for the training loop (see
 * grad_scaler.h): the unscale with its inf/NaN check, and the
 * scale's backoff and growth. */
#include "train/grad_scaler.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

ftune_status ft_grad_scaler_init(ft_grad_scaler *s, ft_loss_scale_mode mode, double init_scale, int growth_interval) {
    *s = (ft_grad_scaler){ .mode = mode, .scale = 1.0f, .growth_interval = FT_LOSS_SCALE_GROWTH_INTERVAL,
                           .growth_factor = 2.0, .backoff_factor = 0.5 };
    if (mode != FT_LOSS_SCALE_NONE && mode != FT_LOSS_SCALE_DYNAMIC && mode != FT_LOSS_SCALE_FIXED)
        return ft_err(FTUNE_ERR_ARG, "--loss-scale: unknown mode %d", (int)mode);
    if (growth_interval < 0) return ft_err(FTUNE_ERR_ARG, "loss scale growth interval %d: must not be negative", growth_interval);
    if (growth_interval > 0) s->growth_interval = growth_interval;
    if (mode == FT_LOSS_SCALE_NONE) return FTUNE_OK;
    double v = init_scale == 0 ? FT_LOSS_SCALE_INIT : init_scale;
    /* the scale lives in an f32, as PyTorch's: it must be a normal one, exactly */
    if (!(v >= FLT_MIN && v <= FLT_MAX))
        return ft_err(FTUNE_ERR_ARG, "--loss-scale %g: outside the range of normal f32 numbers, in which the "
                      "scale is held: [2^-126 = %.17g, %.17g]", v, (double)FLT_MIN, (double)FLT_MAX);
    if ((double)(float)v != v) {
        int e = (int)lround(log2(v));
        e = e < FLT_MIN_EXP - 1 ? FLT_MIN_EXP - 1 : e > FLT_MAX_EXP - 1 ? FLT_MAX_EXP - 1 : e;
        return ft_err(FTUNE_ERR_ARG, "--loss-scale %g is not exactly an f32, in which the scale is held (the nearest "
                      "is %.17g): give one that is, such as a power of two, which also keeps the scaling exact "
                      "(2^%d = %.17g)", v, (double)(float)v, e, ldexp(1.0, e));
    }
    s->scale = (float)v;
    return FTUNE_OK;
}

bool ft_grad_scaler_unscale(const ft_grad_scaler *s, const ft_param *params, int n) {
    if (s->mode == FT_LOSS_SCALE_NONE) return false;
    /* as PyTorch: the reciprocal in double, then rounded to f32 */
    float inv = (float)(1.0 / (double)s->scale);
    bool found = false;
    for (int i = 0; i < n; i++) {
        float *g = params[i].grad;
        int64_t k = params[i].numel;
        /* one pass: each value checked, then multiplied */
        int bad = 0;
        if (inv == 1.0f)
            for (int64_t j = 0; j < k; j++) bad |= !isfinite(g[j]);
        else
            for (int64_t j = 0; j < k; j++) {
                bad |= !isfinite(g[j]);
                g[j] *= inv;
            }
        found |= bad != 0;
    }
    return found;
}

bool ft_grad_scaler_update(ft_grad_scaler *s, bool found_inf) {
    if (s->mode != FT_LOSS_SCALE_DYNAMIC) return false;
    if (found_inf) {
        s->scale = (float)((double)s->scale * s->backoff_factor);
        s->growth_tracker = 0;
        return true;
    }
    int32_t successful = s->growth_tracker + 1;
    if (successful == s->growth_interval) {
        float grown = (float)((double)s->scale * s->growth_factor);
        if (isfinite(grown)) s->scale = grown; /* not past f32's range to inf */
        s->growth_tracker = 0;
    } else s->growth_tracker = successful;
    return false;
}

const char *ft_loss_scale_mode_name(ft_loss_scale_mode m) {
    return m == FT_LOSS_SCALE_DYNAMIC ? "dynamic" : m == FT_LOSS_SCALE_FIXED ? "fixed" : "none";
}

ftune_status ftune_loss_scale_parse(const char *s, ftune_loss_scale_mode *mode, double *scale) {
    *scale = 0;
    if (strcmp(s, "none") == 0) { *mode = FTUNE_LOSS_SCALE_NONE; return FTUNE_OK; }
    if (strcmp(s, "dynamic") == 0) { *mode = FTUNE_LOSS_SCALE_DYNAMIC; return FTUNE_OK; }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v > 0) || !isfinite(v))
        return ft_err(FTUNE_ERR_ARG, "--loss-scale \"%s\": expected dynamic, none, or a fixed scale N > 0 (such as 1024)", s);
    *mode = FTUNE_LOSS_SCALE_FIXED;
    *scale = v;
    return FTUNE_OK;
}
