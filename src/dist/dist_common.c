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

uint64_t ft_dist_ring_bytes(ft_dist_kind kind, uint64_t bytes, int world) {
    if (kind == FT_DIST_OTHER) return world > 1 ? bytes : 0;
    if (world <= 1) return 0;
    uint64_t w = (uint64_t)world;
    /* a ring: all-reduce is a reduce-scatter then an all-gather */
    uint64_t part = bytes / w * (w - 1) + bytes % w * (w - 1) / w;
    return kind == FT_DIST_ALLREDUCE ? 2 * part : part;
}

void ft_dist_count(ft_dist_kind kind, uint64_t bytes) {
    int w = ft_dist_world();
    g_counters.payload_bytes += bytes;
    if (w <= 1) return;
    uint64_t b = ft_dist_ring_bytes(kind, bytes, w);
    switch (kind) {
    case FT_DIST_ALLREDUCE: g_counters.allreduce_bytes += b; break;
    case FT_DIST_REDUCE_SCATTER: g_counters.reduce_scatter_bytes += b; break;
    case FT_DIST_ALLGATHER: g_counters.allgather_bytes += b; break;
    case FT_DIST_OTHER: g_counters.other_bytes += b; break;
    }
}

void ft_dist_count_call(void) { g_counters.calls++; }

void ft_dist_get_counters(ft_dist_counters *c) { *c = g_counters; }
void ft_dist_reset_counters(void) { memset(&g_counters, 0, sizeof g_counters); }
