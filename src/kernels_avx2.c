/* kernels_avx2.c — AVX2 kernels for Linear's forward (kernels.h), for CPUs
 * without AVX-512. Not written yet: the portable path in linear.c runs. */
#include "kernels.h"

bool ft_matmul_avx2(float *out, const float *inp, const void *w, ft_dtype dt, int T, int IC, int OC, int n_threads,
                    float *scratch, size_t scratch_floats) {
    return false;
}
