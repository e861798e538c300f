/* bnb.h — bitsandbytes' 4-bit numerics and checkpoint layout (FORMATS.md
 * §4.2): the signed 8-bit dynamic map, blockwise 8-bit quantization, NF4 on
 * a flattened tensor and double quantization of its absmax, each as
 * bitsandbytes' PyTorch reference (backends/default/ops.py, functional.py)
 * computes it, and the conversion of a double-quantized tensor to ft's
 * per-row ft_block_nf4 rows. */
#ifndef FT_BNB_H
#define FT_BNB_H

#include "core/core.h"

#define FT_BNB_BLOCK 64         /* quantize_4bit's blocksize (transformers never changes it) */
#define FT_BNB_NESTED_BLOCK 256 /* the double quantization's blocksize */

/* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256
 * ascending values in [-1, 1], computed in f32 as torch does. */
void ft_bnb_dynamic_map(float code[256]);

/* quantize_blockwise: q[i] = the first index of the least |s - code[q]| for
 * s = clamp(x[i]·(1/absmax_b), -1, 1), absmax_b = max|x| over block b of
 * `bs` elements (the last may be partial). absmax has ceil(n/bs) entries. */
void ft_bnb_quantize_blockwise(uint8_t *q, float *absmax, const float *x, int64_t n, const float code[256], int bs);
/* x[i] = code[q[i]]·absmax[i/bs] (f32) */
void ft_bnb_dequantize_blockwise(float *x, const uint8_t *q, const float *absmax, int64_t n, const float code[256],
                                 int bs);

/* quantize_4bit(quant_type="nf4", blocksize=64) of a flattened tensor of n
 * elements: packed (n+1)/2 bytes (element 2j in the high nibble of byte j;
 * an odd n pads with code 7), absmax ceil(n/64). */
void ft_bnb_quantize_nf4(uint8_t *packed, float *absmax, const float *x, int64_t n);
void ft_bnb_dequantize_nf4(float *x, const uint8_t *packed, const float *absmax, int64_t n);

/* Double quantization (compress_statistics=True) of nb block absmax
 * values: offset = their mean (summed in double, rounded once to f32: torch
 * reduces in f32 and may land an ulp away; a checkpoint stores the offset,
 * so reading one is exact either way), then quantize_blockwise(absmax -
 * offset, the dynamic map, 256): q (nb), absmax2 (ceil(nb/256)). */
float ft_bnb_double_quant(uint8_t *q, float *absmax2, const float *absmax, int64_t nb);
/* absmax[i] = code2[q[i]]·absmax2[i/256] + offset, in f32 as bitsandbytes
 * (a product, then a sum: two roundings) */
void ft_bnb_double_dequant(float *absmax, const uint8_t *q, const float *absmax2, const float code2[256],
                           float offset, int64_t nb);

/* Bits per parameter of a double-quantized NF4 tensor of n elements as
 * stored: 4 per weight, 8 per 64-block, 32 per 256 blocks, plus the offset. */
double ft_bnb_nf4_bits_per_param(int64_t n);

#endif

/* ------------------------------------------------ serialized checkpoints */

/* The tensors transformers saves for one 4-bit Linear weight "X.weight"
 * (QuantState.as_dict(packed=True)): "X.weight" packed U8 [(n+1)/2, 1];
 * "X.weight.absmax" (U8 [nb] when double-quantized, else F32 [nb]);
 * "X.weight.quant_map" F32 [16]; with double quantization
 * "X.weight.nested_absmax" F32 [nb2] and "X.weight.nested_quant_map" F32
 * [256]; "X.weight.quant_state.bitsandbytes__nf4" U8: JSON with quant_type,
 * blocksize, dtype, shape and the nested_* settings. NULL where absent. */
typedef struct {
    const ft_tensor *weight, *absmax, *quant_map, *nested_absmax, *nested_quant_map, *quant_state;
} ft_bnb_tensors;

/* The dtype a bnb-4bit (out, in) weight is held in: nf4 rows when in % 64
 * == 0 (bitsandbytes' flattened blocks are then ft's per-row blocks), else
 * f32 (its blocks cross rows; dequantized exactly, 8 times the memory). */
ft_dtype ft_bnb_held_dtype(int in);
/* Checks every part of a bnb-4bit weight named name against (out, in):
 * quant type nf4 and blocksize 64 (anything else is FTUNE_ERR_UNSUPPORTED
 * naming the tensor), nested blocksize 256, shapes, sizes, the NF4 map, a
 * finite absmax; then writes out rows of ft_bnb_held_dtype(in) to dst
 * (out · ft_dtype_nbytes(that, in) bytes), every value bit for bit what
 * bitsandbytes' dequantize_4bit gives in f32. */
FTUNE_MUST_USE ftune_status ft_bnb_read_weight(void *dst, const ft_bnb_tensors *bt, const char *name, int out, int in);
