/* dtype_ggml.h — the reference conversions of ggml's blocks beyond
 * q8_0/q4_0 (dtype_ggml.c), and the quantizers of those ftune writes, for dtype.c's traits rows; everything else
 * reaches them through ft_types[]. */
#ifndef FT_DTYPE_GGML_H
#define FT_DTYPE_GGML_H

#include "core/core.h"

/* The low byte of (int32_t)v, as ggml's quantizers store a float code in
 * an int8_t or uint8_t where it is built for x86-64 (one truncating
 * conversion to 32 bits, then the low byte; a v beyond int32's range, NaN
 * included, converts to INT32_MIN): defined here for every v, where C leaves
 * such a conversion undefined. A code is beyond range only when a block's
 * f32 scale is so small that 1/d is inf (f32-subnormal input), and then the
 * block's f16 scale is 0 and every code reads back as 0 or the block's min. */
static inline uint8_t ft_code_byte(float v) {
    int32_t i = v > -2147483648.0f && v < 2147483648.0f ? (int32_t)v : INT32_MIN;
    return (uint8_t)((uint32_t)i & 0xFF);
}
/* the same byte read as int8_t (two's complement) */
static inline int ft_code_i8(float v) { int b = ft_code_byte(v); return b < 128 ? b : b - 256; }

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
