/* transpose16.h — the 16 × 16 transpose of 32-bit words held in sixteen
 * AVX-512 registers, in place: v[i] lane j <-> v[j] lane i (pairs of
 * words, then of qwords, then 128-bit lanes). The packing of the GEMM
 * driver's bf16 pairs (kernels_avx512.c) and attention's key and value
 * copies (ops/ops_fast.c) move blocks through it. x86-64 only; include
 * after <immintrin.h>. */
#ifndef FT_TRANSPOSE16_H
#define FT_TRANSPOSE16_H

static inline __attribute__((always_inline, target("avx512f"))) void ft_transpose16(__m512i v[16]) {
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* lane q of v[4g + c] now holds column 4q + c's words of rows 4g..4g+3;
     * column 4q + c is lane q of v[c], v[c + 4], v[c + 8], v[c + 12] */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i a = v[i], b = v[i + 4], c = v[i + 8], d = v[i + 12];
        __m512i ab0 = _mm512_shuffle_i32x4(a, b, 0x44), ab1 = _mm512_shuffle_i32x4(a, b, 0xEE);
        __m512i cd0 = _mm512_shuffle_i32x4(c, d, 0x44), cd1 = _mm512_shuffle_i32x4(c, d, 0xEE);
        t[i] = _mm512_shuffle_i32x4(ab0, cd0, 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(ab0, cd0, 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(ab1, cd1, 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(ab1, cd1, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = t[i]; /* t[j]: column j */
}

#endif
