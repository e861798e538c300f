/* kernels.h — fast CPU kernels for Linear's forward, one file per
 * instruction set (kernels_avx512.c, kernels_avx2.c),
 * chosen at run time by linear.c from ft_cpu_level() (cpu.h). Each computes
 * in f32 with the weights widened or dequantized exactly as the dtype's
 * to_f32 does, so it differs from linear_forward_ref only in the order of
 * the f32 sums. The portable path stays in linear.c. */
#ifndef FT_KERNELS_H
#define FT_KERNELS_H

#include "core.h"

/* out (T, OC) = inp (T, IC) · Wᵀ for W (OC, IC) of dtype dt, rows
 * ft_dtype_nbytes(dt, IC) bytes apart, on n_threads OpenMP threads.
 * scratch holds scratch_floats floats (linear_scratch_floats(IC, n_threads)
 * is enough). One row (T = 1) is a fused dequantize-and-dot per output row;
 * several rows pack up to 128 rows of the input transposed in the scratch
 * and run a register-blocked GEMM on weight panels widened to f32 on the
 * fly (f32 weights too: faster here than OpenBLAS, whose run-time CPU
 * detection may fall back to SSE3 kernels on CPUs newer than it knows).
 * Returns false, having written nothing, when the kernel set has no kernel
 * for dt or the scratch is too small. */
bool ft_matmul_avx512(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC,
                      int n_threads, float *scratch, size_t scratch_floats);
bool ft_matmul_avx2(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC, int n_threads,
                    float *scratch, size_t scratch_floats);

#endif
