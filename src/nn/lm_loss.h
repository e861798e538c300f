/* lm_loss.h — the one fused LM head + loss: hidden rows (after the final
 * norm) through lm_head and a loss, a chunk of rows at a time, so that only
 * (chunk rows, V) logits ever exist; for V above FT_LM_LOSS_VSLICE the
 * cross-entropy also goes a slice of the vocabulary at a time, so that only
 * (chunk rows, FT_LM_LOSS_VSLICE) do, whatever V is. Used by training (forward + backward),
 * the trainer's validation and `ftune eval` (forward only), so all three
 * compute the same loss the same way. */
#ifndef FT_LM_LOSS_H
#define FT_LM_LOSS_H

#include "nn/backend.h"

/* A loss over rows of logits. fn returns the summed loss of rows
 * [r0, r0+n) of the call (logits (n, V) for those rows, targets of them;
 * negative targets are ignored) and, when dlogits is non-NULL, overwrites
 * it with d(loss · dloss_scale)/d(logits) (zero rows where ignored). r0
 * lets a loss with per-row data of its own (a distillation teacher's
 * logits in ctx) find its rows. Its ops go through be (logits and dlogits
 * are backend buffers). Results must not depend on be->n_threads. */
typedef struct {
    double (*fn)(void *ctx, float *dlogits, const float *logits, const int *targets, int r0, int n, int V,
                 float dloss_scale, const ft_backend *be);
    void *ctx;
    const char *name;
    /* next-token cross-entropy, which lm_loss may compute itself a slice of
     * the vocabulary at a time (fn is then not called). A loss that needs
     * whole rows (a distillation teacher's distribution) leaves it false
     * and gets whole rows of logits, as many as the scratch holds (at
     * least one) */
    bool sliceable;
} ft_loss;

/* Next-token cross-entropy (be->crossentropy; targets >= V give NaN). */
extern const ft_loss ft_loss_crossentropy;

/* Rows per chunk for V (at most FT_LM_LOSS_CHUNK_FLOATS logits at a time:
 * 32 MiB, in cache-sized GEMM tiles), capped at max_rows. Above
 * FT_LM_LOSS_VSLICE classes the vocabulary is sliced, so a chunk has
 * FT_LM_LOSS_CHUNK_FLOATS / FT_LM_LOSS_VSLICE = 256 rows whatever V is:
 * the head's weights are streamed once per 256 rows rather than once per
 * 65 (llama-3's 128256) or 55 (qwen2's 151936). 32768 keeps every
 * vocabulary up to llama-2's 32000 in one slice (computed exactly as
 * before slicing existed) and a slice's GEMM wide. */
#define FT_LM_LOSS_CHUNK_FLOATS (8u << 20)
#define FT_LM_LOSS_VSLICE 32768
int ft_lm_loss_chunk_rows(int V, int max_rows);
/* Floats of scratch ft_lm_loss_forward (backward false: a chunk's logits)
 * or ft_lm_loss_backward (true: and their gradient) need for chunks of
 * chunk_rows and vocabulary V. The Linear's own scratch is separate:
 * linear_scratch_floats / ft_linear_train_scratch_floats(in, 0, chunk_rows). */
size_t ft_lm_loss_scratch_floats(int chunk_rows, int V, bool backward);

typedef struct {
    const ft_linear *head;        /* (V, C) lm_head, any dtype; no adapter */
    const ft_loss *loss;
    int chunk_rows;               /* from ft_lm_loss_chunk_rows */
    const ft_backend *be;         /* the head and the loss run through it */
    float *scratch;               /* ft_lm_loss_scratch_floats */
    float *lin_scratch;           /* the head's linear scratch */
} ft_lm_loss_env;

/* Summed loss over the rows of h (n, C) whose target is >= 0, and their
 * count in *n_targets (may be NULL). Nothing but the chunk's logits is
 * written. */
double ft_lm_loss_forward(const ft_lm_loss_env *e, int64_t *n_targets, const float *h, const int *targets, int n);

/* As forward, and the gradient of (summed loss · dloss_scale): dh (n, C) is
 * overwritten; dw (V, C) accumulates when non-NULL (a trainable f32 head).
 * Each chunk's logits are computed once here and used for both. */
double ft_lm_loss_backward(const ft_lm_loss_env *e, float *dh, float *dw, int64_t *n_targets, const float *h,
                           const int *targets, int n, float dloss_scale);

#endif
