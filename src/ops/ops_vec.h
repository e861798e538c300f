/* ops_vec.h — the 16-float vectors (GCC vector extensions) the fast ops
 * are written with, and their vector exp: included by ops_fast.c and
 * ops_elem.c, each of which instantiates its always-inline bodies for
 * AVX-512, AVX2+FMA and portable (T512, T256, none). Not a header for
 * anything outside src/ops/. */
#ifndef FT_OPS_VEC_H
#define FT_OPS_VEC_H

#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#define VL 16

#define INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__)
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define T256 __attribute__((target("avx2,fma")))
#else
#define T512
#define T256
/* ft_f32_to_bf16 on 16 lanes (in the low halves): add 0x7FFF plus the
 * kept lsb and keep the top half; a NaN keeps its top half, made quiet. */
INLINE vu bf16_bits(vf x) {
    vu u = (vu)x;
    vu nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    vu r = (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
    return (nan & ((u >> 16) | 0x40u)) | (~nan & r);
}

#endif

typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));

INLINE vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
/* (macros, not functions: passing 64-byte vectors by value draws ABI notes
 * from GCC in the portable instantiation) */
#define vstore(p, v) do { vf vs_ = (v); memcpy((p), &vs_, sizeof vs_); } while (0)
INLINE vf vset1(float x) { return (vf){ 0 } + x; }
#define vsel(m, a, b) ((vf)(((m) & (vi)(a)) | (~(m) & (vi)(b)))) /* m ? a : b */
/* The largest lane; NaN if any lane is NaN (as torch.max), so that a NaN
 * score is never taken for a masked one. */
INLINE float vhmax(const vf *v) {
    float m = (*v)[0];
    for (int i = 1; i < VL; i++) m = ((*v)[i] > m || (*v)[i] != (*v)[i]) ? (*v)[i] : m;
    return m;
}
INLINE double vhsum_d(const vf *v) {
    double s = 0;
    for (int i = 0; i < VL; i++) s += (*v)[i];
    return s;
}

/* exp(x) for x <= 88.7 (inf above), to ~1 ulp: x = n·ln2 + r with
 * |r| <= ln2/2 (Cody-Waite, ln2 split so n·LN2_HI is exact), a degree-7
 * Taylor polynomial in r (truncation 5e-9 relative), times 2^n formed as
 * 2^a·2^(n-a) so that gradual underflow down to 2^-149 works. Exactly 0
 * below -103.9 (and for -inf); NaN stays NaN. */
INLINE vf vexp(const vf *px) {
    vf x = *px;
    const float LOG2E = 1.44269504088896341f, MAGIC = 12582912.0f; /* 1.5·2^23: round to nearest */
    const float LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
    vi under = x < -103.9f;
    vi over = x > 88.8f;
    x = vsel(under, vset1(-103.9f), x);
    x = vsel(over, vset1(88.8f), x);
    vf t = x * LOG2E + MAGIC;
    vf n = t - MAGIC;
    vi ni = (vi)t - (vi)vset1(MAGIC);
    vf r = x - n * LN2_HI;
    r = r - n * LN2_LO;
    vf p = vset1(1.0f / 5040);
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi a = ni >> 1, b = ni - a;
    vf pa = (vf)((a + 127) << 23), pb = (vf)((b + 127) << 23);
    vf res = p * pa * pb;
    return (vf)((vi)res & ~under);
}

/* ft_f32_to_bf16 on 16 lanes (in the low halves): add 0x7FFF plus the
 * kept lsb and keep the top half; a NaN keeps its top half, made quiet. */
INLINE vu bf16_bits(vf x) {
    vu u = (vu)x;
    vu nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    vu r = (u + (0x7FFFu + ((u >> 16) & 1u))) >> 16;
    return (nan & ((u >> 16) | 0x40u)) | (~nan & r);
}

#endif
