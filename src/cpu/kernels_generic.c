/* kernels_generic.c — the portable primitives of kernels.h: widening
 * through the dtype's reference to_f32 (dtype.c, WIDEN_REFERENCE_ONLY), and kernels_isa.h's
 * micro-kernel and row-dot at 4 lanes (SSE2 on x86-64, NEON on arm64, or
 * scalar code elsewhere), no FMA. The fallback on every CPU. */
#include "cpu/kernels.h"

#include <string.h>

#define ISA_TARGET
#define VL 4
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VSET1(x) ((vf){ (x), (x), (x), (x) })
/* 6 rows × 8 columns (12 of x86-64's 16 xmm registers) when N > 4, else 8 × 4 */
#define MR_W 6
#define NV_W 2
#define MR_N 8
#define NV_N 1
#define ISA_NAME "generic"
#define ISA_TABLE ft_kernels_generic

#define WIDEN_REFERENCE_ONLY

#include "cpu/kernels_isa.h"
