/* dtype_dot.h — the reference integer dot products of ggml's weight blocks
 * with 8-bit activations and the activations' quantizers (dtype_dot.c), for
 * dtype.c's traits rows (vec_dot, act, quantize_act); everything else reaches
 * them through ft_types[]. */
#ifndef FT_DTYPE_DOT_H
#define FT_DTYPE_DOT_H

#include "core/core.h"

void ft_quantize_act_q8_0(const float *x, void *dst, int64_t n);
void ft_quantize_act_q8_1(const float *x, void *dst, int64_t n);
void ft_quantize_act_q8_K(const float *x, void *dst, int64_t n);

float ft_vec_dot_q8_0(const void *w, const void *act, int64_t n);
float ft_vec_dot_q4_0(const void *w, const void *act, int64_t n);
float ft_vec_dot_q4_1(const void *w, const void *act, int64_t n);
float ft_vec_dot_q5_0(const void *w, const void *act, int64_t n);
float ft_vec_dot_q5_1(const void *w, const void *act, int64_t n);
float ft_vec_dot_iq4_nl(const void *w, const void *act, int64_t n);
float ft_vec_dot_q4_K(const void *w, const void *act, int64_t n);
float ft_vec_dot_q5_K(const void *w, const void *act, int64_t n);
float ft_vec_dot_q6_K(const void *w, const void *act, int64_t n);
float ft_vec_dot_iq4_xs(const void *w, const void *act, int64_t n);

#endif
