/* grad_scaler.h — loss scaling with the semantics of PyTorch's GradScaler
 * (torch/cuda/amp/grad_scaler.py and _amp_update_scale_, 1.13): the loss
 * (its gradient seed) is multiplied by the scale before backward, the
 * gradients are multiplied by 1/scale (in f32, the reciprocal taken in
 * double) and checked for inf/NaN before clipping, and the scale is halved
 * after a step with a non-finite gradient (whose optimizer update is
 * skipped) and doubled after growth_interval consecutive finite steps.
 *
 * One optimizer step, after backward of all its micro-batches (each with
 * ft_trainer_step_scaled(..., s->scale, ...): the same scale for all):
 *     bool found_inf = ft_grad_scaler_unscale(s, params, n);
 *     -- with several ranks: all-reduce found_inf (MAX) here, after the
 *        gradient all-reduce, so that every rank takes the same decision --
 *     if (ft_grad_scaler_update(s, found_inf)) skip the optimizer update;
 * A fixed scale (FT_LOSS_SCALE_FIXED) is not a GradScaler feature: the
 * seed is scaled and the gradients unscaled, but nothing is ever skipped or
 * changed (update returns false; the caller treats a non-finite gradient as
 * the error it is without scaling). */
#ifndef FT_GRAD_SCALER_H
#define FT_GRAD_SCALER_H

#include "optim/optim.h"

typedef enum { FT_LOSS_SCALE_NONE = 0, FT_LOSS_SCALE_DYNAMIC = 1, FT_LOSS_SCALE_FIXED = 2 } ft_loss_scale_mode;

/* PyTorch's GradScaler defaults */
#define FT_LOSS_SCALE_INIT 65536.0
#define FT_LOSS_SCALE_GROWTH_INTERVAL 2000

typedef struct {
    ft_loss_scale_mode mode;
    float scale;               /* the current scale (an f32 tensor in PyTorch); 1 with NONE */
    int32_t growth_tracker;    /* consecutive finite steps since the scale last changed (int32 in PyTorch) */
    int32_t growth_interval;   /* DYNAMIC: finite steps before the scale grows */
    double growth_factor;      /* 2 */
    double backoff_factor;     /* 0.5 */
} ft_grad_scaler;

/* init_scale: the scale of FIXED, the initial scale of DYNAMIC (0: 2^16);
 * growth_interval 0: 2000. FTUNE_ERR_ARG for a scale that is not a finite
 * positive f32 or a negative interval (messages name --loss-scale). */
FTUNE_MUST_USE ftune_status ft_grad_scaler_init(ft_grad_scaler *s, ft_loss_scale_mode mode, double init_scale, int growth_interval);
/* Whether the seed is scaled and the gradients unscaled (DYNAMIC or FIXED). */
static inline bool ft_grad_scaler_on(const ft_grad_scaler *s) { return s->mode != FT_LOSS_SCALE_NONE; }
/* Multiplies every gradient by (float)(1 / scale) (PyTorch's
 * _amp_foreach_non_finite_check_and_unscale_: each value is checked before
 * it is multiplied; a scale of 1 leaves the values as they are) and returns
 * whether any was inf or NaN. With NONE: no pass, false. */
bool ft_grad_scaler_unscale(const ft_grad_scaler *s, const ft_param *params, int n);
/* After the unscale (and the all-reduce of found_inf): _amp_update_scale_.
 * DYNAMIC: found_inf halves the scale and resets the tracker, and true is
 * returned (skip this step's optimizer update); else the tracker counts the
 * step and at growth_interval the scale doubles (unless that overflows f32)
 * and the tracker restarts. NONE and FIXED: nothing, false. */
bool ft_grad_scaler_update(ft_grad_scaler *s, bool found_inf);

/* "dynamic" / "fixed" / "none" */
const char *ft_loss_scale_mode_name(ft_loss_scale_mode m);

#endif
