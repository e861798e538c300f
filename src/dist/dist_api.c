/* dist_api.c — the public face of dist.h (ftune_dist_*). */
#include "dist/dist.h"

ftune_status ftune_dist_init(void) { return ft_dist_init(); }
void ftune_dist_finalize(void) { ft_dist_finalize(); }
int ftune_dist_rank(void) { return ft_dist_rank(); }
int ftune_dist_world(void) { return ft_dist_world(); }
_Noreturn void ftune_dist_abort(int code) { ft_dist_abort(code); }

static bool failed_together;
void ft_dist_set_failed_together(void) { failed_together = true; }
bool ft_dist_failed_together(void) { return failed_together; }
bool ftune_dist_failed_together(void) { return ft_dist_failed_together(); }
