/* optim8.h — between optim.c and optim8.c: one 8-bit parameter's blockwise
 * AdamW update (the scalars as optim.c's f32 update rounds them). */
#ifndef FT_OPTIM8_H
#define FT_OPTIM8_H

#include "optim/optim.h"

typedef struct {
    float *w;                   /* (N) */
    const float *g;             /* (N) */
    uint8_t *qm, *qv;           /* (N) codes of m (signed map) and v (unsigned map) */
    float *am, *av;             /* (ceil(N / block)) absmax per block */
    int64_t N;
    int block;
    bool wd, reference;
    float decay, b1, omb1, b2, omb2, neg_step, bc2_sqrt, eps;
} ft_adam8_job;

/* Builds the maps and tables (once; before threads use them). */
void ft_adam8_prepare(void);
/* Updates blocks [b0, b1) of j. */
void ft_adam8_blocks(const ft_adam8_job *j, int64_t b0, int64_t b1);

#endif
