/* ops.c — the plain C reference for every transformer op: each a
 * forward/backward pair, in float (the library) and in double (the _f64
 * twins the tests check against finite differences). The code is written
 * once, in ops_impl.h, and compiled here for both types. Fast paths live in
 * other files and are tested against these functions.
 */
#include "ops/ops.h"
#include "core/parallel.h"

#include <string.h>
#include <tgmath.h>

/* The references run on the calling thread, except attention_forward, which
 * takes a thread count (through ft_parallel_for) for the inference path. */

#define real float
#define FN(name) ft_##name
#include "ops/ops_impl.h"
#undef real
#undef FN

#define real double
#define FN(name) ft_##name##_f64
#include "ops/ops_impl.h"
#undef real
#undef FN
