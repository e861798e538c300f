/* dist_common.c — what both implementations of dist.h share: the shard
 * layout and the byte counters (the ring model of what each collective
 * sends per rank). */
#include "dist/dist.h"
#include "dist/dist_impl.h"

#include <string.h>

void ft_dist_shard(int64_t n, int world, int64_t *off) {
    int64_t q = n / world, rem = n % world;
    off[0] = 0;
    for (int r = 0; r < world; r++) off[r + 1] = off[r] + q + (r < rem ? 1 : 0);
}

static ft_dist_counters g_counters;

void ft_dist_count(ft_dist_kind kind, uint64_t bytes) {
    int w = ft_dist_world();
    g_counters.payload_bytes += bytes;
    if (w <= 1) return;
    /* a ring: all-reduce is a reduce-scatter then an all-gather */
    uint64_t part = bytes / (uint64_t)w * (uint64_t)(w - 1) + bytes % (uint64_t)w * (uint64_t)(w - 1) / (uint64_t)w;
    switch (kind) {
    case FT_DIST_ALLREDUCE: g_counters.allreduce_bytes += 2 * part; break;
    case FT_DIST_REDUCE_SCATTER: g_counters.reduce_scatter_bytes += part; break;
    case FT_DIST_ALLGATHER: g_counters.allgather_bytes += part; break;
    case FT_DIST_OTHER: g_counters.other_bytes += bytes; break;
    }
}

void ft_dist_count_call(void) { g_counters.calls++; }

void ft_dist_get_counters(ft_dist_counters *c) { *c = g_counters; }
void ft_dist_reset_counters(void) { memset(&g_counters, 0, sizeof g_counters); }
