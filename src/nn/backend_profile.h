/* backend_profile.h — a backend that times the ops of another, by class,
 * for `ftune train --profile` / FTUNE_PROFILE=1: where a training step's
 * time goes. Only a trainer that asked for it is wrapped, so a run without
 * it pays nothing. */
#ifndef FT_BACKEND_PROFILE_H
#define FT_BACKEND_PROFILE_H

#include "nn/backend.h"

#include <stdio.h>

enum {
    FT_PROF_LINEAR_FWD, FT_PROF_LINEAR_DX, FT_PROF_LINEAR_DW, FT_PROF_LORA_FWD, FT_PROF_LORA_BWD,
    FT_PROF_HEAD_FWD, FT_PROF_HEAD_BWD, FT_PROF_LOSS, FT_PROF_ATTN_FWD, FT_PROF_ATTN_BWD, FT_PROF_NORM,
    FT_PROF_ROPE, FT_PROF_SWIGLU, FT_PROF_EMBED, FT_PROF_CONVERT, FT_PROF_ELEMWISE, FT_PROF_OPTIM, FT_PROF_N
};

typedef struct {
    ft_backend inner;         /* the backend whose ops are timed (a CPU backend) */
    const ft_linear *head;    /* the LM head: a Linear without adapter over its weights (or rows of them,
                               * lm_loss.c's vocabulary slices) is timed as the head */
    double sec[FT_PROF_N];    /* seconds spent in each class */
    long long calls[FT_PROF_N];
    double first, last;       /* monotonic seconds: start of the first op, end of the last */
    double wall;              /* > 0: the seconds the profiled work took, timed by the caller (a session's
                               * decode steps, which other work separates), used instead of last - first */
} ft_prof;

/* A backend computing exactly what p->inner computes (the same functions on
 * the same arguments, in the same order: bit-identical results), with each
 * op's wall time added to p. A Linear's base product, weight gradient and
 * adapter are timed apart by calling them one at a time, as linear.c does;
 * so inner must be a CPU backend. p must outlive the backend. */
ft_backend ft_backend_profiled(ft_prof *p);

/* The table of p: seconds per optimizer step (steps: how many, >= 1) and
 * share of each class, the ops' sum, and the time between ops. */
void ft_prof_print(const ft_prof *p, long long steps, FILE *f);
/* The same per unit of work named by unit ("decode token": a session's
 * one-token forwards, FTUNE_PROFILE=1 on an inference session). */
void ft_prof_print_per(const ft_prof *p, long long steps, const char *unit, FILE *f);

#endif
