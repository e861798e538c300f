/* dtype_ggml.h — the reference conversions of ggml's blocks beyond
 * q8_0/q4_0 (dtype_ggml.c), and the quantizers of those ftune writes, for dtype.c's traits rows; everything else
 * reaches them through ft_types[]. */
#ifndef FT_DTYPE_GGML_H
#define FT_DTYPE_GGML_H

#include "core/core.h"

void ft_q4_1_to_f32(const void *s, float *y, int64_t n);
void ft_q5_0_to_f32(const void *s, float *y, int64_t n);
void ft_q5_1_to_f32(const void *s, float *y, int64_t n);
void ft_q8_1_to_f32(const void *s, float *y, int64_t n);
void ft_q2_K_to_f32(const void *s, float *y, int64_t n);
void ft_q3_K_to_f32(const void *s, float *y, int64_t n);
void ft_q4_K_to_f32(const void *s, float *y, int64_t n);
void ft_q5_K_to_f32(const void *s, float *y, int64_t n);
void ft_q6_K_to_f32(const void *s, float *y, int64_t n);
void ft_q8_K_to_f32(const void *s, float *y, int64_t n);
void ft_iq4_nl_to_f32(const void *s, float *y, int64_t n);
void ft_iq4_xs_to_f32(const void *s, float *y, int64_t n);
void ft_q4_1_from_f32(const float *x, void *dst, int64_t n);
void ft_q5_0_from_f32(const float *x, void *dst, int64_t n);
void ft_q5_1_from_f32(const float *x, void *dst, int64_t n);
void ft_q4_K_from_f32(const float *x, void *dst, int64_t n);
void ft_q5_K_from_f32(const float *x, void *dst, int64_t n);
void ft_q6_K_from_f32(const float *x, void *dst, int64_t n);

#endif
