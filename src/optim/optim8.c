/* optim8.c — the pieces of 8-bit AdamW (bitsandbytes' blockwise AdamW8bit):
 * the dynamic quantization maps, nearest-entry quantization (a plain
 * reference and a table-driven fast path that gives the same index), and
 * the blockwise step: dequantize a block of m and v, update in f32 as
 * AdamW does, take the block's new absmax and requantize. */
#include "optim/optim8.h"
#include "formats/bnb.h"

#include <stdlib.h>

#include "cpu/cpu.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* ------------------------------------------------------------- the maps */

/* bitsandbytes' create_dynamic_map(signed=False) ("udynamic", the map of
 * state2): for each exponent i of 0..6 the midpoints of neighbours of
 * torch.linspace(0.1, 1, 2^(i+1) + 1) times 10^(i-6), then 0 and 1, sorted.
 * The signed map ("dynamic", of state1) is formats/bnb.c's, NF4's nested
 * map. As there, the values are kept as torch (1.13, x86-64) gave them:
 * its f32 linspace rounds with the vector width it was built for
 * (tests/adam8_ref.py rebuilds both; test_optim8 compares). */
static const float udynamic_map[256] = {
    0.0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f,
    0x1.2599ecp-18f, 0x1.bc98a2p-18f, 0x1.29cbaap-17f, 0x1.0624dcp-16f,
    0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
    0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f,
    0x1.82a994p-13f, 0x1.f8a09p-13f, 0x1.374bc8p-12f, 0x1.724744p-12f,
    0x1.ad42c4p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
    0x1.4c986p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f,
    0x1.c28f5ep-11f, 0x1.e00d1cp-11f, 0x1.fd8adcp-11f, 0x1.2b020cp-10f,
    0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041892p-9f, 0x1.28f5c2p-9f,
    0x1.4dd2fp-9f, 0x1.72b01ep-9f, 0x1.978d4ep-9f, 0x1.bc6a7cp-9f,
    0x1.e147aep-9f, 0x1.03126ep-8f, 0x1.158104p-8f, 0x1.27ef9ep-8f,
    0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f,
    0x1.841894p-8f, 0x1.968728p-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f,
    0x1.cdd2fp-8f, 0x1.e0418ap-8f, 0x1.f2b01ep-8f, 0x1.028f5cp-7f,
    0x1.0bc6a6p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
    0x1.30a3d6p-7f, 0x1.39db2p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f,
    0x1.8ccccep-7f, 0x1.bae146p-7f, 0x1.e8f5c4p-7f, 0x1.0b851ep-6f,
    0x1.228f5cp-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
    0x1.7eb854p-6f, 0x1.95c29p-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f,
    0x1.dae146p-6f, 0x1.f1eb86p-6f, 0x1.047aep-5f, 0x1.1p-5f,
    0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
    0x1.49999ap-5f, 0x1.551eb6p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f,
    0x1.77ae14p-5f, 0x1.833334p-5f, 0x1.8eb854p-5f, 0x1.9a3d7p-5f,
    0x1.a5c29p-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
    0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f,
    0x1.00f5c4p-4f, 0x1.06b852p-4f, 0x1.0c7ae2p-4f, 0x1.123d72p-4f,
    0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f,
    0x1.46147ap-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f, 0x1.575c28p-4f,
    0x1.5d1eb8p-4f, 0x1.62e146p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
    0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae14p-4f, 0x1.8570a4p-4f,
    0x1.8b3334p-4f, 0x1.90f5c2p-4f, 0x1.96b852p-4f, 0x1.a8p-4f,
    0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
    0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f,
    0x1.559998p-3f, 0x1.64p-3f, 0x1.726668p-3f, 0x1.80ccccp-3f,
    0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6668p-3f,
    0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e5999cp-3f, 0x1.f4p-3f,
    0x1.013334p-2f, 0x1.086666p-2f, 0x1.0f999ap-2f, 0x1.16cccep-2f,
    0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6668p-2f, 0x1.33999ap-2f,
    0x1.3acccep-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f,
    0x1.579998p-2f, 0x1.5eccccp-2f, 0x1.66p-2f, 0x1.6d3332p-2f,
    0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
    0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f,
    0x1.aep-2f, 0x1.b53332p-2f, 0x1.bc6666p-2f, 0x1.c3999ap-2f,
    0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93334p-2f, 0x1.e06666p-2f,
    0x1.e7999ap-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f,
    0x1.023334p-1f, 0x1.05ccccp-1f, 0x1.096664p-1f, 0x1.0dp-1f,
    0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f,
    0x1.2d6668p-1f, 0x1.31p-1f, 0x1.34999ap-1f, 0x1.383334p-1f,
    0x1.3bccccp-1f, 0x1.3f6666p-1f, 0x1.43p-1f, 0x1.469998p-1f,
    0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f,
    0x1.58999cp-1f, 0x1.5c3334p-1f, 0x1.5fccccp-1f, 0x1.636668p-1f,
    0x1.67p-1f, 0x1.6a999cp-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
    0x1.756668p-1f, 0x1.79p-1f, 0x1.7c9998p-1f, 0x1.803334p-1f,
    0x1.83ccccp-1f, 0x1.876668p-1f, 0x1.8bp-1f, 0x1.8e9998p-1f,
    0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996664p-1f, 0x1.9dp-1f,
    0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f,
    0x1.afp-1f, 0x1.b2999ap-1f, 0x1.b63334p-1f, 0x1.b9ccccp-1f,
    0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c4999ap-1f, 0x1.c83334p-1f,
    0x1.cbccccp-1f, 0x1.cf6666p-1f, 0x1.d3p-1f, 0x1.d69998p-1f,
    0x1.da3334p-1f, 0x1.ddccccp-1f, 0x1.e16668p-1f, 0x1.e5p-1f,
    0x1.e8999cp-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
    0x1.f7p-1f, 0x1.fa999cp-1f, 0x1.fe3334p-1f, 0x1p+0f,
};

/* The maps, their 255 midpoints (torch: (code[:-1] + code[1:]) / 2 in
 * float32) and the fast path's tables, built once. */
#define QT_SHIFT 15              /* a table slot spans 2^15 floats: 1/256 of an octave */
#define QT_FLOOR 0x33800000u     /* 2^-24: every |x| below it has the index of 0 (both maps' first
                                  * midpoints away from 0 are above 1.6e-7; q_build checks it) */
#define QT_SLOTS (((0x3f800000u - QT_FLOOR) >> QT_SHIFT) + 1) /* |x| in [2^-24, 1]: 6 KiB a table */
static struct {
    float map[2][256];
    float mid[2][256];        /* the 255 midpoints, then +inf (no x is above it) */
    /* 3 bytes past each table for the AVX-512 path's 4-byte gathers */
    uint8_t pos[2][QT_SLOTS + 3]; /* x >= 0 in slot s: the index for the slot's smallest x */
    uint8_t neg[QT_SLOTS + 3];    /* signed, x < 0 with |x| in slot s: the index for the slot's largest |x| */
    bool fast;                /* the tables hold what the fast path assumes (checked when built) */
} Q;
static pthread_once_t q_once = PTHREAD_ONCE_INIT;

static uint8_t count_below(const float *mid, float x) {
    int i = 0;
    while (i < 255 && mid[i] < x) i++;
    return (uint8_t)i;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Slot k covers |x| with float bits [lo(k), hi(k)]. */
static uint32_t slot_lo(uint32_t k) { return QT_FLOOR + (k << QT_SHIFT); }
static uint32_t slot_hi(uint32_t k) {
    uint32_t h = QT_FLOOR + ((k + 1) << QT_SHIFT) - 1;
    return h > 0x3f800000u ? 0x3f800000u : h;
}

static void q_build(void) {
    for (int s = 0; s < 2; s++) {
        if (s) ft_bnb_dynamic_map(Q.map[s]);
        else memcpy(Q.map[s], udynamic_map, sizeof udynamic_map);
        for (int i = 0; i < 255; i++) Q.mid[s][i] = (Q.map[s][i] + Q.map[s][i + 1]) / 2.0f;
        Q.mid[s][255] = INFINITY;
        for (uint32_t k = 0; k < QT_SLOTS; k++) Q.pos[s][k] = count_below(Q.mid[s], bits_float(slot_lo(k)));
    }
    for (uint32_t k = 0; k < QT_SLOTS; k++) Q.neg[k] = count_below(Q.mid[1], -bits_float(slot_hi(k)));
    /* what quantize_fast relies on: the index is monotone in x, so a slot's
     * ends bound its indices, which must span at most two entries; below
     * the floor (looked up as slot 0) the index must be that of 0 */
    bool ok = true;
    for (uint32_t k = 0; k < QT_SLOTS; k++) {
        for (int s = 0; s < 2; s++) ok &= count_below(Q.mid[s], bits_float(slot_hi(k))) <= Q.pos[s][k] + 1;
        ok &= count_below(Q.mid[1], -bits_float(slot_lo(k))) <= Q.neg[k] + 1;
    }
    for (int s = 0; s < 2; s++) ok &= Q.pos[s][0] == count_below(Q.mid[s], 0.0f);
    ok &= count_below(Q.mid[1], -0.0f) <= Q.neg[0] + 1;
    Q.fast = ok;
}

bool ft_dynamic_quantize_fast_ok(void) {
    pthread_once(&q_once, q_build);
    return Q.fast;
}

const float *ft_dynamic_map(bool is_signed) {
    pthread_once(&q_once, q_build);
    return Q.map[is_signed];
}

static float clamp_unit(bool is_signed, float x) {
    float lo = is_signed ? -1.0f : 0.0f;
    /* torch.clamp(x, -1, 1) (unsigned inputs are never negative; 0 keeps them in the map) */
    return x < lo ? lo : x > 1.0f ? 1.0f : x;
}

/* torch.bucketize(x, mid) (right=False): the number of midpoints < x. */
uint8_t ft_dynamic_quantize_ref(bool is_signed, float x) {
    pthread_once(&q_once, q_build);
    return count_below(Q.mid[is_signed], clamp_unit(is_signed, x));
}

/* The index is non-decreasing in x and each table entry is the index at
 * one end of its slot that no x of the slot is below, so one step up over
 * the midpoint still below x finds the index counting them all would: a
 * slot is narrower than the map's gaps (0.4% of x against 0.7% at least).
 * If the tables did not check out, the plain count. */
static inline uint8_t quantize_fast(bool is_signed, float x) {
    x = clamp_unit(is_signed, x);
    const float *mid = Q.mid[is_signed];
    if (!Q.fast) return count_below(mid, x);
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t a = u & 0x7fffffffu;
    uint32_t k = a < QT_FLOOR ? 0 : (a - QT_FLOOR) >> QT_SHIFT;
    /* a sign bit on an unsigned map's input is -0 (negatives were clamped): index 0 */
    int i = (u >> 31) ? (is_signed ? Q.neg[k] : 0) : Q.pos[is_signed][k];
    return (uint8_t)(i + (i < 255 && mid[i] < x));
}

uint8_t ft_dynamic_quantize(bool is_signed, float x) {
    pthread_once(&q_once, q_build);
    return quantize_fast(is_signed, x);
}

void ft_adam8_prepare(void) { pthread_once(&q_once, q_build); }

/* ------------------------------------------------------------- the step */

/* adamw_task's update on dequantized moments for elements [k0, k1) of one
 * block (codes qm, qv with absmaxes am, av): the new weights in w, the new
 * moments in mt, vt and their max |.| folded into *nm, *nv. The reference
 * runs it on the whole block, the AVX-512 path on its tail. */
static inline void adam8_update(const ft_adam8_job *j, float *w, const float *g, const uint8_t *qm, const uint8_t *qv,
                                float am, float av, float *mt, float *vt, float *nm, float *nv, int k0, int k1) {
    const float *smap = Q.map[1], *umap = Q.map[0];
    float m_max = *nm, v_max = *nv;   /* locals: w may alias *nm for the compiler */
    for (int k = k0; k < k1; k++) {
        float x = j->wd ? w[k] * j->decay : w[k];
        float gk = g[k];
        float mk = smap[qm[k]] * am * j->b1 + gk * j->omb1;
        float vk = umap[qv[k]] * av * j->b2 + gk * gk * j->omb2;
        float denom = sqrtf(vk) / j->bc2_sqrt + j->eps;
        w[k] = x + j->neg_step * mk / denom;
        mt[k] = mk;
        vt[k] = vk;
        m_max = fmaxf(m_max, fabsf(mk));
        v_max = fmaxf(v_max, fabsf(vk));
    }
    *nm = m_max;
    *nv = v_max;
}

/* The codes of m * im and v * iv for elements [k0, k1), by the fast quantizer. */
static inline void adam8_codes_fast(uint8_t *qm, uint8_t *qv, const float *mt, const float *vt, float im, float iv,
                                    int k0, int k1) {
    for (int k = k0; k < k1; k++) {
        qm[k] = quantize_fast(true, mt[k] * im);
        qv[k] = quantize_fast(false, vt[k] * iv);
    }
}

/* 16 elements of adamw_task's update on dequantized moments, as the scalar
 * loop below computes each (the same IEEE operations in the same order;
 * no fused multiply-add), returning the new m and v. */
#define ISA_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

ISA_TARGET static inline __m512i quantize16(bool is_signed, __m512 x) {
    const float *mid = Q.mid[is_signed];
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(is_signed ? -1.0f : 0.0f)), _mm512_set1_ps(1.0f));
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __m512i k = _mm512_srli_epi32(_mm512_sub_epi32(_mm512_max_epu32(a, _mm512_set1_epi32((int)QT_FLOOR)),
                                                   _mm512_set1_epi32((int)QT_FLOOR)), QT_SHIFT);
    __m512i bytes = _mm512_set1_epi32(0xff);
    __m512i i = _mm512_and_si512(_mm512_i32gather_epi32(k, (const void *)Q.pos[is_signed], 1), bytes);
    if (is_signed) {
        /* the max above turned an unsigned -0 into +0 (index 0 either way); signed negatives use neg */
        __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
        __m512i in = _mm512_and_si512(_mm512_i32gather_epi32(k, (const void *)Q.neg, 1), bytes);
        i = _mm512_mask_mov_epi32(i, neg, in);
    }
    __m512 m = _mm512_i32gather_ps(i, mid, 4);
    __mmask16 up = _mm512_cmp_ps_mask(m, x, _CMP_LT_OQ);
    return _mm512_mask_add_epi32(i, up, i, _mm512_set1_epi32(1));
}

ISA_TARGET static void adam8_blocks_avx512(const ft_adam8_job *j, int64_t b0, int64_t b1) {
    const float *smap = Q.map[1], *umap = Q.map[0];
    float mt[FT_ADAM8_MAX_BLOCK], vt[FT_ADAM8_MAX_BLOCK];
    const __m512 decay = _mm512_set1_ps(j->decay), b1v = _mm512_set1_ps(j->b1), omb1 = _mm512_set1_ps(j->omb1),
                 b2v = _mm512_set1_ps(j->b2), omb2 = _mm512_set1_ps(j->omb2), ns = _mm512_set1_ps(j->neg_step),
                 bc2 = _mm512_set1_ps(j->bc2_sqrt), eps = _mm512_set1_ps(j->eps);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = b0; b < b1; b++) {
        int64_t k0 = b * j->block, k1 = k0 + j->block < j->N ? k0 + j->block : j->N;
        float *w = j->w + k0;
        const float *g = j->g + k0;
        uint8_t *qm = j->qm + k0, *qv = j->qv + k0;
        float am = j->am[b], av = j->av[b], nm = 0, nv = 0;
        int n = (int)(k1 - k0), k = 0;
        __m512 amv = _mm512_set1_ps(am), avv = _mm512_set1_ps(av), nmv = _mm512_setzero_ps(), nvv = _mm512_setzero_ps();
        for (; k + 16 <= n; k += 16) {
            __m512 wk = _mm512_loadu_ps(w + k), gk = _mm512_loadu_ps(g + k);
            __m512 x = j->wd ? _mm512_mul_ps(wk, decay) : wk;
            __m512 dm = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(qm + k))), smap, 4);
            __m512 dv = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(qv + k))), umap, 4);
            __m512 mk = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dm, amv), b1v), _mm512_mul_ps(gk, omb1));
            __m512 vk = _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dv, avv), b2v),
                                      _mm512_mul_ps(_mm512_mul_ps(gk, gk), omb2));
            __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vk), bc2), eps);
            _mm512_storeu_ps(w + k, _mm512_add_ps(x, _mm512_div_ps(_mm512_mul_ps(ns, mk), denom)));
            _mm512_storeu_ps(mt + k, mk);
            _mm512_storeu_ps(vt + k, vk);
            nmv = _mm512_max_ps(nmv, _mm512_and_ps(mk, absmask));
            nvv = _mm512_max_ps(nvv, _mm512_and_ps(vk, absmask));
        }
        adam8_update(j, w, g, qm, qv, am, av, mt, vt, &nm, &nv, k, n);
        nm = fmaxf(nm, _mm512_reduce_max_ps(nmv));
        nv = fmaxf(nv, _mm512_reduce_max_ps(nvv));
        j->am[b] = nm;
        j->av[b] = nv;
        float im = 1.0f / fmaxf(nm, 1e-38f), iv = 1.0f / fmaxf(nv, 1e-38f);
        __m512 imv = _mm512_set1_ps(im), ivv = _mm512_set1_ps(iv);
        for (k = 0; k + 16 <= n; k += 16) {
            _mm_storeu_si128((void *)(qm + k), _mm512_cvtepi32_epi8(quantize16(true, _mm512_mul_ps(_mm512_loadu_ps(mt + k), imv))));
            _mm_storeu_si128((void *)(qv + k), _mm512_cvtepi32_epi8(quantize16(false, _mm512_mul_ps(_mm512_loadu_ps(vt + k), ivv))));
        }
        adam8_codes_fast(qm, qv, mt, vt, im, iv, k, n);
    }
}

/* Blocks [b0, b1) of one 8-bit parameter: as adamw_task element by element
 * on the dequantized moments, then each block's absmax and codes anew.
 * bitsandbytes' CPU path: dequantize code[q] * absmax; absmax = max |.| of
 * the updated block; scaled = x * (1 / max(absmax, 1e-38)) clamped to
 * [-1, 1]; the nearest entry. */
void ft_adam8_blocks(const ft_adam8_job *j, int64_t b0, int64_t b1) {
    if (!j->reference && Q.fast && ft_cpu_level() >= FT_CPU_AVX512) {
        adam8_blocks_avx512(j, b0, b1);
        return;
    }
    float mt[FT_ADAM8_MAX_BLOCK], vt[FT_ADAM8_MAX_BLOCK];
    for (int64_t b = b0; b < b1; b++) {
        int64_t k0 = b * j->block, k1 = k0 + j->block < j->N ? k0 + j->block : j->N;
        float *w = j->w + k0;
        const float *g = j->g + k0;
        uint8_t *qm = j->qm + k0, *qv = j->qv + k0;
        float am = j->am[b], av = j->av[b], nm = 0, nv = 0;
        int n = (int)(k1 - k0);
        adam8_update(j, w, g, qm, qv, am, av, mt, vt, &nm, &nv, 0, n);
        j->am[b] = nm;
        j->av[b] = nv;
        float im = 1.0f / fmaxf(nm, 1e-38f), iv = 1.0f / fmaxf(nv, 1e-38f);
        if (j->reference)
            for (int k = 0; k < n; k++) {
                qm[k] = ft_dynamic_quantize_ref(true, mt[k] * im);
                qv[k] = ft_dynamic_quantize_ref(false, vt[k] * iv);
            }
        else
            adam8_codes_fast(qm, qv, mt, vt, im, iv, 0, n);
    }
}
