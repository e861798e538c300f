/* dist_impl.h — shared by dist_common.c and the two implementations. */
#ifndef FT_DIST_IMPL_H
#define FT_DIST_IMPL_H

#include <stdint.h>

typedef enum { FT_DIST_ALLREDUCE, FT_DIST_REDUCE_SCATTER, FT_DIST_ALLGATHER, FT_DIST_OTHER } ft_dist_kind;
/* bytes: the whole buffer the collective works on (all ranks' ranges for
 * reduce-scatter and all-gather). */
void ft_dist_count(ft_dist_kind kind, uint64_t bytes);
/* What one collective on bytes sends per rank in a ring of world ranks
 * (the counters' model; `ftune plan` predicts with it). */
uint64_t ft_dist_ring_bytes(ft_dist_kind kind, uint64_t bytes, int world);
void ft_dist_count_call(void);

#define FT_DIST_DEFAULT_CHUNK ((int64_t)1 << 22)

#endif
