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

/* ------------------------------------------------ serialized checkpoints */

#include <cjson/cJSON.h>
#include <stdlib.h>

ft_dtype ft_bnb_held_dtype(int in) { return in % FT_BNB_BLOCK == 0 ? FT_NF4 : FT_F32; }

static FTUNE_MUST_USE ftune_status part_check(const ft_tensor *t, const char *name, const char *suffix, ft_dtype dt, int64_t numel) {
    if (!t) return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s%s\": missing (a bitsandbytes 4-bit weight needs it)", name, suffix);
    if (t->dtype != dt || ft_tensor_numel(t) != numel)
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s%s\": %s with %lld elements, expected %s with %lld", name, suffix,
                      ft_types[t->dtype].name, (long long)ft_tensor_numel(t), ft_types[dt].name, (long long)numel);
    return FTUNE_OK;
}

static float f32_at(const ft_tensor *t, int64_t i) {
    float v;
    memcpy(&v, (const uint8_t *)t->data + 4 * i, 4);
    return v;
}

/* JSON as RFC 8259 has it, where cJSON is lenient: no number with a
 * leading zero ("064" would read as 64) outside strings. NULL if none,
 * else what is wrong. */
static bool json_sep(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ':' || c == ',' || c == '['; }

static const char *json_strict_problem(const char *p, size_t n) {
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') { in_str = true; continue; }
        /* a number starts after one of these; "-0" and "0" may not go on with a digit */
        bool starts = i == 0 || json_sep(p[i - 1]) || (p[i - 1] == '-' && (i == 1 || json_sep(p[i - 2])));
        if (c == '0' && starts && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '9') return "a number with a leading zero";
    }
    return NULL;
}

static FTUNE_MUST_USE ftune_status parse_state(const ft_bnb_tensors *bt, const char *name, int out, int in, bool *nested,
                                float *offset) {
    const ft_tensor *qs = bt->quant_state;
    if (!qs) {
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s.quant_state.bitsandbytes__nf4\": missing (a bitsandbytes 4-bit "
                      "weight needs it)", name);
    }
    if (qs->dtype != FT_U8) return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": dtype %s, expected U8 (JSON)", qs->name, ft_types[qs->dtype].name);
    const char *text = (const char *)qs->data, *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, qs->nbytes, &end, false);
    ftune_status st = FTUNE_OK;
    const char *bad = j ? json_strict_problem(text, qs->nbytes) : NULL;
    if (j && !bad)
        for (const char *q = end; q && q < text + qs->nbytes; q++)
            if (*q != ' ' && *q != '\t' && *q != '\r' && *q != '\n') { bad = "bytes after the JSON object"; break; }
    if (bad) {
        cJSON_Delete(j);
        return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": not strict JSON: %s", qs->name, bad);
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "quant_type"), *bs = cJSON_GetObjectItemCaseSensitive(j, "blocksize");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape"), *nbs = cJSON_GetObjectItemCaseSensitive(j, "nested_blocksize");
    const cJSON *nof = cJSON_GetObjectItemCaseSensitive(j, "nested_offset"), *ndt = cJSON_GetObjectItemCaseSensitive(j, "nested_dtype");
    if (!cJSON_IsObject(j)) st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": not a JSON object", qs->name);
    else if (!cJSON_IsString(ty)) st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": no \"quant_type\" string", qs->name);
    else if (strcmp(ty->valuestring, "nf4") != 0)
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": quant_type \"%s\" is not supported (only nf4)", name, ty->valuestring);
    else if (!cJSON_IsNumber(bs)) st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": no \"blocksize\" number", qs->name);
    else if (bs->valuedouble != FT_BNB_BLOCK)
        st = ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": blocksize %g is not supported (only %d)", name, bs->valuedouble, FT_BNB_BLOCK);
    else if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(sh, 0)) ||
             !cJSON_IsNumber(cJSON_GetArrayItem(sh, 1)) || cJSON_GetArrayItem(sh, 0)->valuedouble != out ||
             cJSON_GetArrayItem(sh, 1)->valuedouble != in)
        st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": \"shape\" is not [%d, %d] (the config's)", qs->name, out, in);
    else {
        *nested = nbs != NULL || nof != NULL;
        if (*nested) {
            if (!cJSON_IsNumber(nbs) || nbs->valuedouble != FT_BNB_NESTED_BLOCK)
                st = ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": nested_blocksize %s is not supported (only %d)", name,
                            cJSON_IsNumber(nbs) ? "other than 256" : "missing", FT_BNB_NESTED_BLOCK);
            else if (!cJSON_IsNumber(nof) || !isfinite(nof->valuedouble))
                st = ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": no finite \"nested_offset\"", qs->name);
            else if (ndt && (!cJSON_IsString(ndt) || strcmp(ndt->valuestring, "float32") != 0))
                st = ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s\": nested_dtype is not float32", name);
            else *offset = (float)nof->valuedouble; /* torch.tensor(float(...)): f32 */
        }
    }
    cJSON_Delete(j);
    return st;
}

ftune_status ft_bnb_read_weight(void *dst, const ft_bnb_tensors *bt, const char *name, int out, int in) {
    bool nested = false;
    float offset = 0;
    ftune_status st = parse_state(bt, name, out, in, &nested, &offset);
    if (st) return st;
    int64_t n = (int64_t)out * in, nb = (n + FT_BNB_BLOCK - 1) / FT_BNB_BLOCK;
    int64_t nb2 = (nb + FT_BNB_NESTED_BLOCK - 1) / FT_BNB_NESTED_BLOCK;
    if ((st = part_check(bt->weight, name, "", FT_U8, (n + 1) / 2))) return st;
    if ((st = part_check(bt->absmax, name, ".absmax", nested ? FT_U8 : FT_F32, nb))) return st;
    if ((st = part_check(bt->quant_map, name, ".quant_map", FT_F32, 16))) return st;
    for (int i = 0; i < 16; i++)
        if (f32_at(bt->quant_map, i) != ft_nf4_code[i])
            return ft_err(FTUNE_ERR_UNSUPPORTED, "tensor \"%s.quant_map\": entry %d is %.9g, not the NF4 code's %.9g", name,
                          i, (double)f32_at(bt->quant_map, i), (double)ft_nf4_code[i]);
    float *absmax = malloc((size_t)nb * sizeof(float)), code2[256];
    if (!absmax) return ft_err(FTUNE_ERR_NOMEM, "out of memory for \"%s\"", name);
    if (nested) {
        if (!(st = part_check(bt->nested_absmax, name, ".nested_absmax", FT_F32, nb2)))
            st = part_check(bt->nested_quant_map, name, ".nested_quant_map", FT_F32, 256);
        if (st) { free(absmax); return st; }
        float *a2 = malloc((size_t)nb2 * sizeof(float));
        if (!a2) { free(absmax); return ft_err(FTUNE_ERR_NOMEM, "out of memory for \"%s\"", name); }
        for (int i = 0; i < 256; i++) code2[i] = f32_at(bt->nested_quant_map, i);
        for (int64_t i = 0; i < nb2; i++) a2[i] = f32_at(bt->nested_absmax, i);
        ft_bnb_double_dequant(absmax, bt->absmax->data, a2, code2, offset, nb);
        free(a2);
    } else {
        for (int64_t i = 0; i < nb; i++) absmax[i] = f32_at(bt->absmax, i);
    }
    for (int64_t i = 0; i < nb; i++)
        if (!isfinite(absmax[i])) {
            free(absmax);
            return ft_err(FTUNE_ERR_FORMAT, "tensor \"%s\": block %lld's absmax is not finite", name, (long long)i);
        }
    const uint8_t *packed = bt->weight->data;
    if (ft_bnb_held_dtype(in) == FT_NF4) {
        ft_block_nf4 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            b[i].d = absmax[i];
            memcpy(b[i].qs, packed + i * (FT_BNB_BLOCK / 2), FT_BNB_BLOCK / 2);
        }
    } else {
        ft_bnb_dequantize_nf4(dst, packed, absmax, n);
    }
    free(absmax);
    return FTUNE_OK;
}
