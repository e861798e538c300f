/* run.h — what the rest of ftune reaches of inference sessions (session.c)
 * beyond the public ftune_session_* calls: block hooks, a KV prefix, the
 * memory plan and table, and reading the KV cache back. */
#ifndef FT_RUN_H
#define FT_RUN_H

#include "nn/block.h"

/* The block hooks every block call of the session sees (NULL removes them). */
void ft_session_set_hooks(ftune_session *s, const ft_block_hooks *h);

/* KV prefix (prefix tuning, inference): keys and values (L, P, NKV*HS),
 * keys already rotated for positions 0..P-1, become the first P cache
 * positions of every window: the session is reset and then starts at
 * position P, and ftune_session_reset returns to P. P = 0 removes it.
 * FTUNE_ERR_RANGE if P does not leave room for a token. */
FTUNE_MUST_USE ftune_status ft_session_set_kv_prefix(ftune_session *s, const float *k, const float *v, int P);
/* Adds what a session of n_ctx positions (0: the model's context) on
 * n_threads allocates to the planned rows of t (KV cache, scratch, other);
 * the same size table ftune_session_new allocates from. */
void ft_session_plan(const ft_config *c, int n_ctx, int n_threads, ft_mem_table *t);
/* The session's memory table: planned rows from its model and its buffers
 * (the evaluation scratch once an eval has made it), measured rows from the
 * process's counters (ft_mem_table_measure). */
void ft_session_mem_table(const ftune_session *s, ft_mem_table *t);
/* Copies the cache rows [0, n) of layer l out (k, v each (n, NKV*HS)). */
FTUNE_MUST_USE ftune_status ft_session_get_kv(const ftune_session *s, int l, int n, float *k, float *v);

#endif
