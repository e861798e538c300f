/* bnb.c — bitsandbytes' 4-bit numerics (see bnb.h): every step as its
 * PyTorch reference computes it, in f32, so that codes and dequantized
 * values are bit for bit bitsandbytes'. */
#include "formats/bnb.h"

#include <math.h>
#include <string.h>

/* create_dynamic_map() as bitsandbytes builds it with torch (here 1.13 on
 * x86-64): torch's f32 linspace rounds differently with the vector width it
 * was built for, so the values are kept as torch gave them (tests/nf4_ref.py
 * rebuilds them; test_nf4 compares). A checkpoint carries its own map
 * (nested_quant_map), which is what reading one uses. */
static const float dynamic_map[256] = {
    -0x1.fc6666p-1f, -0x1.f53332p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f,
    -0x1.df9998p-1f, -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f,
    -0x1.c2ccccp-1f, -0x1.bb9998p-1f, -0x1.b46666p-1f, -0x1.ad3332p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.979998p-1f, -0x1.906666p-1f,
    -0x1.893334p-1f, -0x1.82p-1f, -0x1.7acccep-1f, -0x1.73999ap-1f,
    -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56cccep-1f,
    -0x1.4f999ap-1f, -0x1.486666p-1f, -0x1.413334p-1f, -0x1.3ap-1f,
    -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f, -0x1.1d3334p-1f,
    -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.07999ap-1f, -0x1.006666p-1f,
    -0x1.f26668p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f,
    -0x1.b8ccccp-2f, -0x1.aa6664p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f,
    -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626664p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f,
    -0x1.0cp-2f, -0x1.fb3334p-3f, -0x1.de6668p-3f, -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3332p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f,
    -0x1.93d70ap-4f, -0x1.8851eap-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f,
    -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb85p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f,
    -0x1.09999ap-4f, -0x1.fc28f4p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c28ep-5f,
    -0x1.fd70a4p-6f, -0x1.cf5c26p-6f, -0x1.a147aep-6f, -0x1.733334p-6f,
    -0x1.451eb8p-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f,
    -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f, -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f,
    0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f,
    0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f,
    0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f,
    0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f,
    0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f,
    0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451eb8p-6f, 0x1.733334p-6f,
    0x1.a147aep-6f, 0x1.cf5c26p-6f, 0x1.fd70a4p-6f, 0x1.15c28ep-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f,
    0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f,
    0x1.e51ebap-5f, 0x1.fc28f4p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f,
    0x1.4eb85p-4f, 0x1.5a3d7p-4f, 0x1.65c29p-4f, 0x1.7147aep-4f,
    0x1.7ccccep-4f, 0x1.8851eap-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f,
    0x1.6b3332p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f,
    0x1.de6668p-3f, 0x1.fb3334p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f,
    0x1.626664p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f, 0x1.8d9998p-2f,
    0x1.9cp-2f, 0x1.aa6664p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26668p-2f, 0x1.006666p-1f,
    0x1.07999ap-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f,
    0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486666p-1f, 0x1.4f999ap-1f, 0x1.56cccep-1f,
    0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f,
    0x1.7acccep-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.979998p-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3332p-1f,
    0x1.b46666p-1f, 0x1.bb9998p-1f, 0x1.c2ccccp-1f, 0x1.cap-1f,
    0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df9998p-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53332p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};

void ft_bnb_dynamic_map(float code[256]) { memcpy(code, dynamic_map, sizeof dynamic_map); }

/* the first index of the least |s - code[i]|: torch.argmin's rule */
static uint8_t nearest256(float s, const float code[256]) {
    int best = 0;
    float bd = fabsf(s - code[0]);
    for (int i = 1; i < 256; i++) {
        float d = fabsf(s - code[i]);
        if (d < bd) { bd = d; best = i; }
    }
    return (uint8_t)best;
}

void ft_bnb_quantize_blockwise(uint8_t *q, float *absmax, const float *x, int64_t n, const float code[256], int bs) {
    for (int64_t b0 = 0, b = 0; b0 < n; b0 += bs, b++) {
        int64_t m = n - b0 < bs ? n - b0 : bs;
        float amax = 0;
        for (int64_t j = 0; j < m; j++) amax = fmaxf(amax, fabsf(x[b0 + j]));
        float inv = 1.0f / amax;
        absmax[b] = amax;
        for (int64_t j = 0; j < m; j++) {
            float s = x[b0 + j] * inv; /* NaN for an all-zero block: argmin gives 0, as torch's */
            q[b0 + j] = isnan(s) ? 0 : nearest256(fminf(fmaxf(s, -1.0f), 1.0f), code);
        }
    }
}

void ft_bnb_dequantize_blockwise(float *x, const uint8_t *q, const float *absmax, int64_t n, const float code[256],
                                 int bs) {
    for (int64_t i = 0; i < n; i++) x[i] = code[q[i]] * absmax[i / bs];
}

void ft_bnb_quantize_nf4(uint8_t *packed, float *absmax, const float *x, int64_t n) {
    memset(packed, 0x77, (size_t)((n + 1) / 2));
    for (int64_t b0 = 0, b = 0; b0 < n; b0 += FT_BNB_BLOCK, b++) {
        int m = n - b0 < FT_BNB_BLOCK ? (int)(n - b0) : FT_BNB_BLOCK;
        ft_block_nf4 blk;
        ft_nf4_quantize_block(&blk, x + b0, m);
        absmax[b] = blk.d;
        /* b0 is even, so the block's bytes are whole bytes of packed; an odd
         * last block leaves its last byte's low nibble at code 7 (the
         * pad to an even length that bitsandbytes quantizes as 0.0) */
        memcpy(packed + b0 / 2, blk.qs, (size_t)(m + 1) / 2);
    }
}

void ft_bnb_dequantize_nf4(float *x, const uint8_t *packed, const float *absmax, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int q = i & 1 ? packed[i / 2] & 0x0F : packed[i / 2] >> 4;
        x[i] = ft_nf4_code[q] * absmax[i / FT_BNB_BLOCK];
    }
}

float ft_bnb_double_quant(uint8_t *q, float *absmax2, const float *absmax, int64_t nb) {
    double sum = 0;
    for (int64_t i = 0; i < nb; i++) sum += absmax[i];
    float offset = (float)(sum / (double)nb);
    float code[256], chunk[FT_BNB_NESTED_BLOCK];
    ft_bnb_dynamic_map(code);
    for (int64_t b0 = 0; b0 < nb; b0 += FT_BNB_NESTED_BLOCK) {
        int64_t m = nb - b0 < FT_BNB_NESTED_BLOCK ? nb - b0 : FT_BNB_NESTED_BLOCK;
        for (int64_t j = 0; j < m; j++) chunk[j] = absmax[b0 + j] - offset;
        ft_bnb_quantize_blockwise(q + b0, absmax2 + b0 / FT_BNB_NESTED_BLOCK, chunk, m, code, FT_BNB_NESTED_BLOCK);
    }
    return offset;
}

void ft_bnb_double_dequant(float *absmax, const uint8_t *q, const float *absmax2, const float code2[256],
                           float offset, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float v = code2[q[i]] * absmax2[i / FT_BNB_NESTED_BLOCK];
        absmax[i] = v + offset;
    }
}

double ft_bnb_nf4_bits_per_param(int64_t n) {
    int64_t nb = (n + FT_BNB_BLOCK - 1) / FT_BNB_BLOCK, nb2 = (nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK;
    int64_t bytes = (n + 1) / 2 + nb + 4 * nb2 + 4;
    return 8.0 * (double)bytes / (double)n;
}
