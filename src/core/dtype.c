/* dtype.c — the type-traits table: for every dtype, its name, block size,
 * bytes per block, ggml type id and reference conversions to and from f32
 * (ggml's block layouts are in core.h; the conversions of its blocks beyond
 * q8_0/q4_0 in dtype_ggml.c). Every other file learns a type from here. */
#include "core/core.h"
#include "core/dtype_ggml.h"
#include "core/dtype_dot.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

float ft_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal */
            float f = ldexpf((float)man, -24);
            union { float f; uint32_t u; } v = { .f = f };
            bits = sign | v.u;
        }
    } else if (exp == 31) bits = sign | 0x7F800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    union { uint32_t u; float f; } v = { .u = bits };
    return v.f;
}

uint16_t ft_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t x = v.u, sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) return (uint16_t)(sign | 0x7E00);          /* NaN */
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00);         /* overflow -> inf */
    if (ax < 0x38800000) {                                          /* subnormal or zero */
        float a = fabsf(f) * 16777216.0f;                          /* / 2^-24 */
        uint32_t m = (uint32_t)lrintf(a);                           /* round to nearest even */
        return (uint16_t)(sign | m);
    }
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7FFFFF;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

uint16_t ft_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t rounding = 0x7FFF + ((v.u >> 16) & 1);
    return (uint16_t)((v.u + rounding) >> 16);
}

static void f32_to_f32(const void *s, float *d, int64_t n) { memcpy(d, s, (size_t)n * 4); }
static void f32_from_f32(const float *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * 4); }
static void f16_to_f32(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = ft_f16_to_f32(h[i]);
}
static void f16_from_f32(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = ft_f32_to_f16(s[i]);
}
static void bf16_to_f32(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = ft_bf16_to_f32(h[i]);
}
static void bf16_from_f32(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = ft_f32_to_bf16(s[i]);
}
static void q8_0_to_f32(const void *s, float *d, int64_t n) {
    const ft_block_q8_0 *b = s;
    for (int64_t i = 0; i < n / 32; i++) {
        float sc = ft_f16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) d[i * 32 + j] = sc * (float)b[i].qs[j];
    }
}
/* As ggml's reference quantizer: d = amax/127, q = round(x/d). */
static void q8_0_from_f32(const float *s, void *dst, int64_t n) {
    ft_block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / 32; i++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(s[i * 32 + j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = ft_f32_to_f16(d);
        for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)ft_code_i8(roundf(s[i * 32 + j] * id));
    }
}
/* ggml layout: element j (j < 16) in the low nibble of qs[j], element j+16
 * in the high nibble; x = (q - 8) * d. */
static void q4_0_to_f32(const void *s, float *d, int64_t n) {
    const ft_block_q4_0 *b = s;
    for (int64_t i = 0; i < n / 32; i++) {
        float sc = ft_f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            d[i * 32 + j] = sc * (float)((b[i].qs[j] & 0x0F) - 8);
            d[i * 32 + j + 16] = sc * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}
/* As ggml's reference quantizer: d = max/-8 where max is the signed value of
 * largest magnitude. */
static void q4_0_from_f32(const float *s, void *dst, int64_t n) {
    ft_block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / 32; i++) {
        const float *x = s + i * 32;
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = ft_f32_to_f16(d);
        for (int j = 0; j < 16; j++) { /* ggml: MIN(15, (int8_t)(x·id + 8.5)) as a uint8_t */
            int q0 = ft_code_i8(x[j] * id + 8.5f), q1 = ft_code_i8(x[j + 16] * id + 8.5f);
            uint8_t u0 = (uint8_t)(q0 < 15 ? q0 : 15), u1 = (uint8_t)(q1 < 15 ? q1 : 15);
            b[i].qs[j] = (uint8_t)(u0 | u1 << 4);
        }
    }
}

/* bitsandbytes' NF4 code (functional.py create_normal_map, the CUDA
 * dDequantizeNF4 table), FORMATS.md §4.2 */
const float ft_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
    1.0f,
};

/* n elements (any n: the last block may be partial) from ceil(n/64) blocks */
static void nf4_to_f32(const void *s, float *d, int64_t n) {
    const ft_block_nf4 *b = s;
    for (int64_t i = 0; i < n; i += FT_QK_NF4, b++) {
        int m = n - i < FT_QK_NF4 ? (int)(n - i) : FT_QK_NF4;
        for (int j = 0; j < m; j++) {
            int q = j & 1 ? b->qs[j / 2] & 0x0F : b->qs[j / 2] >> 4;
            d[i + j] = ft_nf4_code[q] * b->d;
        }
    }
}

/* bitsandbytes' quantize_4bit on one block (its PyTorch reference,
 * backends/default/ops.py): absmax = max|x|, s = clamp(x·(1/absmax), -1, 1)
 * in f32, q = the first index of the least |s - code[q]|. An all-zero
 * block gives absmax 0 and s = NaN there, whose argmin is index 0: kept, so
 * the codes match bitsandbytes' (both dequantize to zero). */
uint8_t ft_nf4_nearest(float s) {
    /* the code is ascending and its entries >= 0.07 apart, so the f32
     * distances |s - code[i]| fall strictly to the last entry <= s and rise
     * strictly after the next: the first least one is one of those two (the
     * lower on a tie), the same index as the argmin over all 16 */
    int lo = 0;
    for (int i = 1; i < 16; i++) lo += s >= ft_nf4_code[i];
    if (lo == 15 || fabsf(s - ft_nf4_code[lo]) <= fabsf(s - ft_nf4_code[lo + 1])) return (uint8_t)lo;
    return (uint8_t)(lo + 1);
}

void ft_nf4_quantize_block(ft_block_nf4 *b, const float *x, int m) {
    float amax = 0;
    for (int j = 0; j < m; j++) amax = fmaxf(amax, fabsf(x[j]));
    float inv = 1.0f / amax;
    memset(b->qs, 0x77, sizeof b->qs); /* padding past m: code 7, an exact zero */
    for (int j = 0; j < m; j++) {
        float sc = fminf(fmaxf(x[j] * inv, -1.0f), 1.0f);
        uint8_t q = isnan(x[j] * inv) ? 0 : ft_nf4_nearest(sc);
        b->qs[j / 2] = j & 1 ? (uint8_t)((b->qs[j / 2] & 0xF0) | q) : (uint8_t)((b->qs[j / 2] & 0x0F) | (q << 4));
    }
    b->d = amax;
}

/* Per-block absmax in f32 (no double quantization: that is a per-tensor
 * step, ft_nf4_double_quant in formats/bnb.h); the row's last block padded. */
static void nf4_from_f32(const float *s, void *dst, int64_t n) {
    ft_block_nf4 *b = dst;
    for (int64_t i = 0; i < n; i += FT_QK_NF4, b++)
        ft_nf4_quantize_block(b, s + i, n - i < FT_QK_NF4 ? (int)(n - i) : FT_QK_NF4);
}

/* a whole row: the f32 absmax, then n int8 */
static void i8row_to_f32(const void *s, float *d, int64_t n) {
    float a;
    memcpy(&a, s, 4);
    const int8_t *q = (const int8_t *)s + 4;
    for (int64_t i = 0; i < n; i++) d[i] = (float)q[i] * a * FT_I8ROW_INV127;
}
static void i8row_from_f32(const float *s, void *dst, int64_t n) {
    float a = 0;
    for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(s[i]));
    /* bitsandbytes' 127.0 / row_stats is torch's scalar / tensor, which
     * is reciprocal(tensor) · scalar: two roundings, not one division */
    float sc = (1.0f / a) * 127.0f;
    memcpy(dst, &a, 4);
    int8_t *q = (int8_t *)dst + 4;
    for (int64_t i = 0; i < n; i++) q[i] = a > 0 ? (int8_t)nearbyintf(s[i] * sc) : 0; /* |x·sc| <= 127 */
}

#define GG(id) .in_gguf = true, .ggml_type = (id)
const ft_type_traits ft_types[FT_NTYPES] = {
    [FT_F32]  = { .name = "f32",  .torch_name = "float32", .block = 1,  .block_bytes = 4,  .is_float = true, .to_f32 = f32_to_f32,  .from_f32 = f32_from_f32, GG(0), .llama_ftype = 0 },
    [FT_F16]  = { .name = "f16",  .torch_name = "float16", .block = 1,  .block_bytes = 2,  .is_float = true, .to_f32 = f16_to_f32,  .from_f32 = f16_from_f32, GG(1), .llama_ftype = 1 },
    [FT_BF16] = { .name = "bf16", .torch_name = "bfloat16", .block = 1,  .block_bytes = 2,  .is_float = true, .to_f32 = bf16_to_f32, .from_f32 = bf16_from_f32, GG(30), .llama_ftype = 32 },
    [FT_Q8_0] = { .name = "q8_0", .block = FT_QK, .block_bytes = sizeof(ft_block_q8_0), .is_float = true, .to_f32 = q8_0_to_f32, .from_f32 = q8_0_from_f32, GG(8), .llama_ftype = 7, .n_scales = 1, .scale_at = { 0 }, .vec_dot = ft_vec_dot_q8_0, .act = FT_A16 },
    [FT_Q4_0] = { .name = "q4_0", .block = FT_QK, .block_bytes = sizeof(ft_block_q4_0), .is_float = true, .to_f32 = q4_0_to_f32, .from_f32 = q4_0_from_f32, GG(2), .llama_ftype = 2, .n_scales = 1, .scale_at = { 0 }, .vec_dot = ft_vec_dot_q4_0, .act = FT_A16 },
    [FT_I32]  = { .name = "i32",  .block = 1,  .block_bytes = 4, GG(26) },
    [FT_I64]  = { .name = "i64",  .block = 1,  .block_bytes = 8, GG(27) },
    [FT_U8]   = { .name = "u8",   .block = 1,  .block_bytes = 1 },
    [FT_F64]  = { .name = "f64",  .block = 1,  .block_bytes = 8, GG(28) },
    [FT_NF4]  = { .name = "nf4",  .block = FT_QK_NF4, .block_bytes = sizeof(ft_block_nf4), .is_float = true,
                  .pad_rows = true, .to_f32 = nf4_to_f32, .from_f32 = nf4_from_f32 },
    [FT_I8ROW] = { .name = "int8", .block = 1, .block_bytes = 1, .is_float = true, .row_header = 4,
                   .to_f32 = i8row_to_f32, .from_f32 = i8row_from_f32 },
    [FT_I8]   = { .name = "i8",   .block = 1,  .block_bytes = 1, GG(24) },
    [FT_I16]  = { .name = "i16",  .block = 1,  .block_bytes = 2, GG(25) },
    [FT_Q4_1] = { .name = "q4_1", .block = FT_QK, .block_bytes = sizeof(ft_block_q4_1), .is_float = true, .to_f32 = ft_q4_1_to_f32, .from_f32 = ft_q4_1_from_f32, GG(3), .llama_ftype = 3, .n_scales = 2, .scale_at = { 0, 2 }, .vec_dot = ft_vec_dot_q4_1, .act = FT_A16 },
    [FT_Q5_0] = { .name = "q5_0", .block = FT_QK, .block_bytes = sizeof(ft_block_q5_0), .is_float = true, .to_f32 = ft_q5_0_to_f32, .from_f32 = ft_q5_0_from_f32, GG(6), .llama_ftype = 8, .n_scales = 1, .scale_at = { 0 }, .vec_dot = ft_vec_dot_q5_0, .act = FT_A16 },
    [FT_Q5_1] = { .name = "q5_1", .block = FT_QK, .block_bytes = sizeof(ft_block_q5_1), .is_float = true, .to_f32 = ft_q5_1_to_f32, .from_f32 = ft_q5_1_from_f32, GG(7), .llama_ftype = 9, .n_scales = 2, .scale_at = { 0, 2 }, .vec_dot = ft_vec_dot_q5_1, .act = FT_A16 },
    [FT_Q8_1] = { .name = "q8_1", .block = FT_QK, .block_bytes = sizeof(ft_block_q8_1), .is_float = true, .to_f32 = ft_q8_1_to_f32, GG(9), .n_scales = 2, .scale_at = { 0, 2 } },
    [FT_Q2_K] = { .name = "q2_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q2_K), .is_float = true, .to_f32 = ft_q2_K_to_f32, GG(10), .n_scales = 2, .scale_at = { 80, 82 } },
    [FT_Q3_K] = { .name = "q3_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q3_K), .is_float = true, .to_f32 = ft_q3_K_to_f32, GG(11), .n_scales = 1, .scale_at = { 108 } },
    [FT_Q4_K] = { .name = "q4_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q4_K), .is_float = true, .to_f32 = ft_q4_K_to_f32, .from_f32 = ft_q4_K_from_f32, GG(12), .llama_ftype = 15, .n_scales = 2, .scale_at = { 0, 2 }, .vec_dot = ft_vec_dot_q4_K, .act = FT_A16_K },
    [FT_Q5_K] = { .name = "q5_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q5_K), .is_float = true, .to_f32 = ft_q5_K_to_f32, .from_f32 = ft_q5_K_from_f32, GG(13), .llama_ftype = 17, .n_scales = 2, .scale_at = { 0, 2 }, .vec_dot = ft_vec_dot_q5_K, .act = FT_A16_K },
    [FT_Q6_K] = { .name = "q6_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q6_K), .is_float = true, .to_f32 = ft_q6_K_to_f32, .from_f32 = ft_q6_K_from_f32, GG(14), .llama_ftype = 18, .n_scales = 1, .scale_at = { 208 }, .vec_dot = ft_vec_dot_q6_K, .act = FT_A16_K },
    [FT_Q8_K] = { .name = "q8_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_q8_K), .is_float = true, .to_f32 = ft_q8_K_to_f32, GG(15) },
    [FT_IQ4_NL] = { .name = "iq4_nl", .block = FT_QK, .block_bytes = sizeof(ft_block_iq4_nl), .is_float = true, .to_f32 = ft_iq4_nl_to_f32, GG(20), .n_scales = 1, .scale_at = { 0 }, .vec_dot = ft_vec_dot_iq4_nl, .act = FT_A16 },
    [FT_IQ4_XS] = { .name = "iq4_xs", .block = FT_QK_K, .block_bytes = sizeof(ft_block_iq4_xs), .is_float = true, .to_f32 = ft_iq4_xs_to_f32, GG(23), .n_scales = 1, .scale_at = { 0 }, .vec_dot = ft_vec_dot_iq4_xs, .act = FT_A16_K },
    /* described, not computed with: their sizes are ggml's, so a file that
     * holds them is still checked whole */
    [FT_IQ2_XXS] = { .name = "iq2_xxs", .block = FT_QK_K, .block_bytes = 66, GG(16) },
    [FT_IQ2_XS]  = { .name = "iq2_xs",  .block = FT_QK_K, .block_bytes = 74, GG(17) },
    [FT_IQ3_XXS] = { .name = "iq3_xxs", .block = FT_QK_K, .block_bytes = 98, GG(18) },
    [FT_IQ1_S]   = { .name = "iq1_s",   .block = FT_QK_K, .block_bytes = 50, GG(19) },
    [FT_IQ3_S]   = { .name = "iq3_s",   .block = FT_QK_K, .block_bytes = 110, GG(21) },
    [FT_IQ2_S]   = { .name = "iq2_s",   .block = FT_QK_K, .block_bytes = 82, GG(22) },
    [FT_IQ1_M]   = { .name = "iq1_m",   .block = FT_QK_K, .block_bytes = 56, GG(29) },
    [FT_TQ1_0]   = { .name = "tq1_0",   .block = FT_QK_K, .block_bytes = 54, GG(34) },
    [FT_TQ2_0]   = { .name = "tq2_0",   .block = FT_QK_K, .block_bytes = 66, GG(35) },
    [FT_MXFP4]   = { .name = "mxfp4",   .block = FT_QK, .block_bytes = 17, GG(39) },
    /* the integer dot products' activations (not weights: no to_f32 here) */
    [FT_A16]   = { .name = "a16",   .block = FT_QK,   .block_bytes = sizeof(ft_block_a16),   .quantize_act = ft_quantize_act_a16 },
    [FT_A16_K] = { .name = "a16_K", .block = FT_QK_K, .block_bytes = sizeof(ft_block_a16_K), .quantize_act = ft_quantize_act_a16_K },
};
#undef GG

ft_dtype ft_dtype_by_name(const char *name) {
    if (!name) return FT_NTYPES;
    for (int t = 0; t < FT_NTYPES; t++)
        if (strcasecmp(ft_types[t].name, name) == 0 || (ft_types[t].torch_name && strcasecmp(ft_types[t].torch_name, name) == 0))
            return (ft_dtype)t;
    return FT_NTYPES;
}

int64_t ft_dtype_check_scales(ft_dtype t, const void *blocks, int64_t nb) {
    const ft_type_traits *tr = &ft_types[t];
    const uint8_t *p = blocks;
    for (int64_t b = 0; b < nb; b++, p += tr->block_bytes)
        for (int k = 0; k < tr->n_scales; k++) {
            uint16_t h;
            memcpy(&h, p + tr->scale_at[k], 2);
            if ((h & 0x7C00) == 0x7C00) return b; /* exponent all ones: inf or NaN */
        }
    return -1;
}

ft_dtype ft_dtype_of_ggml(uint32_t ggml_type) {
    for (int t = 0; t < FT_NTYPES; t++)
        if (ft_types[t].in_gguf && ft_types[t].ggml_type == ggml_type) return (ft_dtype)t;
    return FT_NTYPES;
}

const char *ft_dtype_gguf_weight_names(char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int t = 0; t < FT_NTYPES; t++)
        if (ft_types[t].in_gguf && ft_dtype_is_weight((ft_dtype)t) && k < n)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", ft_types[t].name);
    return buf;
}

int64_t ft_dtype_nbytes(ft_dtype t, int64_t n) {
    if (t >= FT_NTYPES || n < 0) return -1;
    const ft_type_traits *tr = &ft_types[t];
    if (tr->pad_rows) return (n + tr->block - 1) / tr->block * (int64_t)tr->block_bytes;
    if (n % tr->block) return -1;
    return tr->row_header + n / tr->block * (int64_t)tr->block_bytes;
}

int64_t ft_tensor_numel(const ft_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void ft_dtype_span_to_f32(ft_dtype t, const void *row, int64_t k0, float *dst, int64_t n) {
    const ft_type_traits *tr = &ft_types[t];
    if (t == FT_I8ROW) {
        float a;
        memcpy(&a, row, 4);
        const int8_t *q = (const int8_t *)row + 4 + k0;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)q[i] * a * FT_I8ROW_INV127;
        return;
    }
    tr->to_f32((const uint8_t *)row + k0 / tr->block * (int64_t)tr->block_bytes, dst, n);
}

void ft_tensor_row_f32(const ft_tensor *t, int64_t r, float *dst) {
    int64_t cols = t->shape[t->ndim - 1];
    int64_t row_bytes = ft_dtype_nbytes(t->dtype, cols);
    ft_types[t->dtype].to_f32((const uint8_t *)t->data + r * row_bytes, dst, cols);
}
