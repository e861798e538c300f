/* core.h — private basics shared by every part of libftune: error reporting,
 * dtypes and their traits table, tensors, read-only file mappings.
 *
 * Dimension letters used across the code: B batch, T time (tokens), C model
 * width, NH query heads, NKV key/value heads, HS head size, F feed-forward
 * width, L layers, V vocabulary, R LoRA rank.
 */
#ifndef FT_CORE_H
#define FT_CORE_H

#include "ftune.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Records a formatted error message for ftune_last_error() and returns st,
 * so that `return ft_err(FTUNE_ERR_FORMAT, "%s: tensor %s: ...", ...)`.
 * These two alone are not FTUNE_MUST_USE: they hand back the status they
 * were given, so a call that only sets the message (before returning NULL,
 * or a status held elsewhere) drops nothing. */
ftune_status ft_err(ftune_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current error message with "prefix: ". Returns st. */
ftune_status ft_err_prefix(ftune_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ft_err_clear(void);
/* A status deliberately not acted on: a cleanup step on a path that already
 * has a failure (or a result) to report, which the caller keeps. Each call
 * says why; a cast to void does not quiet warn_unused_result in gcc. */
static inline void ft_ignore_status(ftune_status st) { (void)st; }

/* ------------------------------------------------------------- dtypes */

typedef enum {
    FT_F32 = 0,
    FT_F16,
    FT_BF16,
    FT_Q8_0,  /* ggml: blocks of 32: f16 scale + 32 x int8 */
    FT_Q4_0,  /* ggml: blocks of 32: f16 scale + 16 bytes of nibbles, x = (q-8)*d */
    FT_I32,
    FT_I64,
    FT_U8,
    FT_F64,
    FT_NF4,   /* bitsandbytes NF4: blocks of 64: f32 absmax + 32 bytes of nibbles, x = code[q]*absmax */
    FT_I8ROW, /* int8 with one f32 absmax per row (bitsandbytes' LLM.int8 row-wise): a row is the absmax, then int8 */
    FT_I8,    /* plain int8 storage (safetensors I8), not a weight type */
    /* the rest of ggml's types (their blocks below; ggml-common.h's layouts) */
    FT_Q4_1, FT_Q5_0, FT_Q5_1, FT_Q8_1,
    FT_Q2_K, FT_Q3_K, FT_Q4_K, FT_Q5_K, FT_Q6_K, FT_Q8_K,
    FT_IQ4_NL, FT_IQ4_XS,
    /* ggml types ftune describes (so files holding them are read and
     * checked, and errors name them) but does not compute with */
    FT_IQ2_XXS, FT_IQ2_XS, FT_IQ2_S, FT_IQ3_XXS, FT_IQ3_S, FT_IQ1_S, FT_IQ1_M,
    FT_TQ1_0, FT_TQ2_0, FT_MXFP4, FT_I16,
    /* activations of the integer dot products (dtype_dot.c), never in a file */
    FT_A16, FT_A16_K,
    FT_NTYPES
} ft_dtype;

typedef struct {
    const char *name;        /* "f32", "bf16", "q8_0", ... */
    const char *torch_name;  /* PyTorch's ("float32", ...: config.json's torch_dtype), or NULL */
    int block;               /* elements per block (1 for plain types) */
    size_t block_bytes;      /* bytes per block */
    bool is_float;           /* can be a weight (has to/from f32) */
    /* a row may end inside a block: its last block is zero-padded (nf4,
     * as bitsandbytes pads the last block), so a row of n elements takes
     * ceil(n/block) blocks and to_f32 takes any n */
    bool pad_rows;
    /* bytes before a row's elements (int8: its f32 absmax); to_f32 and
     * from_f32 then take one whole row, header included */
    int row_header;
    /* n elements (a multiple of block); NULL where not a weight type */
    void (*to_f32)(const void *src, float *dst, int64_t n);
    void (*from_f32)(const float *src, void *dst, int64_t n);
    /* its ggml type id when GGUF holds it (in_gguf) */
    bool in_gguf;
    uint8_t ggml_type;
    /* llama.cpp's LLAMA_FTYPE (llama.h) of a file written as this type:
     * its general.file_type, and the mix of llama_model_quantize's
     * per-tensor choice (model_write.c); meaningful for the types a GGUF
     * is written in (ft_dtype_gguf_writable), where ALL_F32 is 0 */
    uint8_t llama_ftype;
    /* byte offsets in a block of its n_scales f16 scales and mins (checked
     * finite when a file is loaded: ft_dtype_check_scales) */
    uint8_t n_scales, scale_at[2];
    /* the integer dot product (dtype_dot.c) of a row of this weight dtype
     * with activations quantized to 16-bit integers: vec_dot(w, act, n) =
     * Σ w·a over n elements with act n elements of the dtype `act` (a16,
     * a16_K); NULL where the type has none (the widened f32 product is its
     * only one). quantize_act: set on those activation rows. */
    float (*vec_dot)(const void *w, const void *act, int64_t n);
    ft_dtype act;
    void (*quantize_act)(const float *x, void *dst, int64_t n);
} ft_type_traits;

extern const ft_type_traits ft_types[FT_NTYPES];

/* ggml's quantized blocks, defined once for the reference conversions
 * (dtype.c), the kernels and the writers: a little-endian f16 scale d, then
 * q8_0: 32 int8, x = d·q; q4_0: 16 bytes, element j (j < 16) in the low
 * nibble of byte j and element j+16 in the high nibble, x = (q-8)·d. */
#define FT_QK 32
typedef struct { uint16_t d; int8_t qs[FT_QK]; } ft_block_q8_0;
typedef struct { uint16_t d; uint8_t qs[FT_QK / 2]; } ft_block_q4_0;
_Static_assert(sizeof(ft_block_q8_0) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(ft_block_q4_0) == 18, "q4_0 block is 18 bytes");

/* The rest of ggml's weight blocks (ggml-common.h), dequantized in
 * dtype_ggml.c value for value as gguf-py's gguf.quants.dequantize (and
 * ggml's dequantize_row_*) compute them. f16 fields are little-endian bits.
 * q4_1: x = d·q + m, nibbles as q4_0. q5_0/q5_1: a fifth bit per element in
 * qh (bit j of the little-endian u32 for element j); x = d·(q-16), or
 * d·q + m. The K-quants hold super-blocks of 256 in sub-blocks of 16 or 32,
 * each with its own scale (and min) quantized against the f16 d (dmin). */
#define FT_QK_K 256
typedef struct { uint16_t d, m; uint8_t qs[FT_QK / 2]; } ft_block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[FT_QK / 2]; } ft_block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[FT_QK / 2]; } ft_block_q5_1;
typedef struct { uint16_t d, s; int8_t qs[FT_QK]; } ft_block_q8_1; /* s = d·Σq */
/* q2_K: 16 sub-blocks of 16; scales[i]: low nibble the scale, high the min;
 * x = d·sc·q - dmin·m with q 2 bits */
typedef struct { uint8_t scales[FT_QK_K / 16]; uint8_t qs[FT_QK_K / 4]; uint16_t d, dmin; } ft_block_q2_K;
/* q3_K: 16 sub-blocks of 16, 6-bit signed scales packed in 12 bytes; q is
 * 2 bits from qs and a third from hmask (set: +0, clear: -4) */
typedef struct { uint8_t hmask[FT_QK_K / 8]; uint8_t qs[FT_QK_K / 4]; uint8_t scales[12]; uint16_t d; } ft_block_q3_K;
/* q4_K/q5_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes;
 * x = d·sc·q - dmin·m */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[FT_QK_K / 2]; } ft_block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[FT_QK_K / 8]; uint8_t qs[FT_QK_K / 2]; } ft_block_q5_K;
/* q6_K: 16 sub-blocks of 16 with int8 scales; q 4 bits from ql, 2 from qh, -32 */
typedef struct { uint8_t ql[FT_QK_K / 2]; uint8_t qh[FT_QK_K / 4]; int8_t scales[FT_QK_K / 16]; uint16_t d; } ft_block_q6_K;
/* q8_K: the activation side of the K-quants' dot products: f32 d, 256 int8
 * and the sums of each 16 of them */
typedef struct { float d; int8_t qs[FT_QK_K]; int16_t bsums[FT_QK_K / 16]; } ft_block_q8_K;
/* a16, a16_K: ftune's activation side of the integer dot products: an f32
 * scale d, 16-bit integers x = d·q (|q| <= 32767), and exact integer sums
 * of q (the block's, or each 16's) for the types with a min or an offset */
typedef struct { float d; int32_t sum; int16_t qs[FT_QK]; } ft_block_a16;
typedef struct { float d; int32_t bsums[FT_QK_K / 16]; int16_t qs[FT_QK_K]; } ft_block_a16_K;
/* iq4_nl: q4_0's layout with a non-linear code, x = d·ft_iq4nl_code[q];
 * iq4_xs: 8 sub-blocks of 32, 6-bit scales (low 4 bits in scales_l, high 2
 * in scales_h), x = d·(ls-32)·ft_iq4nl_code[q] */
typedef struct { uint16_t d; uint8_t qs[FT_QK / 2]; } ft_block_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[FT_QK_K / 64]; uint8_t qs[FT_QK_K / 2]; } ft_block_iq4_xs;
_Static_assert(sizeof(ft_block_q4_1) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(ft_block_q5_0) == 22, "q5_0 block is 22 bytes");
_Static_assert(sizeof(ft_block_q5_1) == 24, "q5_1 block is 24 bytes");
_Static_assert(sizeof(ft_block_q8_1) == 36, "q8_1 block is 36 bytes");
_Static_assert(sizeof(ft_block_q2_K) == 84, "q2_K block is 84 bytes");
_Static_assert(sizeof(ft_block_q3_K) == 110, "q3_K block is 110 bytes");
_Static_assert(sizeof(ft_block_q4_K) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(ft_block_q5_K) == 176, "q5_K block is 176 bytes");
_Static_assert(sizeof(ft_block_q6_K) == 210, "q6_K block is 210 bytes");
_Static_assert(sizeof(ft_block_q8_K) == 292, "q8_K block is 292 bytes");
_Static_assert(sizeof(ft_block_iq4_nl) == 18, "iq4_nl block is 18 bytes");
_Static_assert(sizeof(ft_block_iq4_xs) == 136, "iq4_xs block is 136 bytes");
extern const int8_t ft_iq4nl_code[16];
/* The scale and min of sub-block j (0..7) of q4_K/q5_K's 12 packed bytes. */
static inline void ft_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* bitsandbytes' NF4 (FORMATS.md §4.2) in memory: one block is 64
 * elements, its absmax in f32 (for a double-quantized checkpoint, the value
 * bitsandbytes' dequantization computes from the nested level, so that
 * every dequantized weight is bit for bit bitsandbytes'), then 32 bytes:
 * byte j holds element 2j in the HIGH nibble and element 2j+1 in the low
 * one; x = ft_nf4_code[q]·absmax. 36 bytes per 64 weights: 4.5 bits per
 * parameter in memory (a double-quantized file holds 4.127). */
#define FT_QK_NF4 64
typedef struct { float d; uint8_t qs[FT_QK_NF4 / 2]; } ft_block_nf4;
_Static_assert(sizeof(ft_block_nf4) == 36, "nf4 block is 36 bytes");
extern const float ft_nf4_code[16];
/* The nearest code index of s in [-1, 1] (the first on a tie); one block
 * of m <= 64 elements quantized as bitsandbytes does, padded past m. */
uint8_t ft_nf4_nearest(float s);
void ft_nf4_quantize_block(ft_block_nf4 *b, const float *x, int m);

/* int8 rows (FT_I8ROW), as bitsandbytes' int8_vectorwise_quant /
 * int8_vectorwise_dequant compute them in f32: absmax = max|x| over the row,
 * q = round-half-even(x·((1/absmax)·127)), x = q·absmax·(1/127) (two products,
 * left to right; 1/127 as bitsandbytes' f32 constant). An all-zero row is
 * absmax 0 and q 0. */
#define FT_I8ROW_INV127 7.874015718698502e-3f

/* Elements [k0, k0+n) of a row of weight dtype t at `row` to f32 with the
 * traits' to_f32 (k0 whole blocks, and n too but at a pad_rows row's end): the reference every kernel's
 * widening is tested against, and their fallback for dtypes they do not
 * special-case. */
void ft_dtype_span_to_f32(ft_dtype t, const void *row, int64_t k0, float *dst, int64_t n);

/* Bytes for n elements of dtype t; -1 if n is not a whole number of blocks
 * (for a pad_rows dtype: the bytes of ceil(n/block) blocks). For a dtype
 * with a row header, n is one row's length and the header is counted. */
int64_t ft_dtype_nbytes(ft_dtype t, int64_t n);
/* The dtype whose traits name or torch_name is `name` (or, with ggml's
 * spelling, "Q4_K", case-insensitively); FT_NTYPES if none. The dtype of a ggml type id;
 * FT_NTYPES if ftune does not know it. */
ft_dtype ft_dtype_by_name(const char *name);
/* The index of the first of nb blocks of t whose f16 scale or min is inf or
 * NaN (a damaged file: every value of that block would be); -1 if none. */
int64_t ft_dtype_check_scales(ft_dtype t, const void *blocks, int64_t nb);
ft_dtype ft_dtype_of_ggml(uint32_t ggml_type);
/* A type ftune writes GGUF tensors in: GGUF holds it and it has a
 * from_f32 (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K). */
static inline bool ft_dtype_gguf_writable(ft_dtype t) {
    return t < FT_NTYPES && ft_types[t].in_gguf && ft_types[t].from_f32 != NULL && ft_types[t].to_f32 != NULL;
}
/* A weight dtype: one a Linear or embedding can hold (has to_f32). */
static inline bool ft_dtype_is_weight(ft_dtype t) { return t < FT_NTYPES && ft_types[t].to_f32 != NULL; }
/* The names of the weight dtypes GGUF holds, ", "-separated, into buf (for
 * messages: "supported: ..."). */
const char *ft_dtype_gguf_weight_names(char *buf, size_t n);

float ft_f16_to_f32(uint16_t h);
uint16_t ft_f32_to_f16(float f);
static inline float ft_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
uint16_t ft_f32_to_bf16(float f); /* round to nearest even, NaN kept */

/* ------------------------------------------------------------- tensors */

#define FT_MAX_DIMS 4
#define FT_NAME_MAX 96

/* A view of weights in any dtype. data may point into a file mapping
 * (read-only) or into memory the model owns. Shapes are in PyTorch order:
 * shape[0] is the slowest-varying dimension, so a Linear weight is (out, in). */
typedef struct {
    char name[FT_NAME_MAX];
    ft_dtype dtype;
    int ndim;
    int64_t shape[FT_MAX_DIMS];
    void *data;
    size_t nbytes;
} ft_tensor;

int64_t ft_tensor_numel(const ft_tensor *t);
/* Converts row r of a 2-D tensor (shape[1] elements) to f32. */
void ft_tensor_row_f32(const ft_tensor *t, int64_t r, float *dst);
/* A 2-D f32 tensor named name over data (rows, cols), not owned. */
ft_tensor ft_tensor_f32_view(const char *name, float *data, int64_t rows, int64_t cols);

/* ------------------------------------------------------------- files */

/* A whole file mapped read-only. */
typedef struct {
    char *path;
    const uint8_t *data;
    size_t size;
} ft_mmap;

FTUNE_MUST_USE ftune_status ft_mmap_open(ft_mmap *m, const char *path);
void ft_mmap_close(ft_mmap *m);
/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. */
FTUNE_MUST_USE ftune_status ft_read_file(const char *path, char **out, size_t *len);
/* Writes buf to path atomically: path.tmp, fsync, rename. */
FTUNE_MUST_USE ftune_status ft_write_file_atomic(const char *path, const void *buf, size_t len);
struct cJSON;
/* Writes a JSON document (indented, with a final newline) atomically. */
FTUNE_MUST_USE ftune_status ft_write_json_atomic(const char *path, const struct cJSON *j);
bool ft_file_exists(const char *path);
bool ft_is_dir(const char *path);
/* A directory written whole or not at all (merge's, quantize's and init's
 * Hugging Face outputs): its files are written into a staging sibling
 * (dir.tmp.PID, in *staged, made here), then commit moves them into dir,
 * renaming the staging directory over dir when dir is absent or empty, else
 * each file over its namesake (other files of dir stay). abort removes the
 * staging directory and what it holds (flat: files only). A failure before
 * commit leaves dir as it was. */
FTUNE_MUST_USE ftune_status ft_dir_stage(const char *dir, char *staged, size_t cap);
FTUNE_MUST_USE ftune_status ft_dir_commit(const char *staged, const char *dir);
void ft_dir_abort(const char *staged);
/* Entries of dir other than "." and "..", or -1 when it cannot be read. */
int ft_dir_entries(const char *dir);
/* A writer's generator (safetensors and GGUF writers): bytes [offset,
 * offset+n) of tensor `index` into dst, whole elements or blocks. A status
 * other than FTUNE_OK (a value the dtype cannot hold) stops the write,
 * which then leaves no file. */
typedef FTUNE_MUST_USE ftune_status (*ft_fill_fn)(void *ctx, int index, ft_dtype dtype, void *dst, uint64_t offset,
                                                  size_t n);

/* ------------------------------------------------------------- misc */

/* The plain heap, not counted by class (core/mem.h): for temporaries freed
 * before the call that made them returns (a merge's row buffers, a
 * reader's scratch), and the small index tables of files and tokenizers,
 * which are freed with free() by code all over and have no lifetime class
 * of their own. Anything long-lived that grows with the model or the run
 * (weights, trainables, the trainer's parameter list, adapter objects,
 * caches, data) goes through ft_mem_alloc instead, so the memory table
 * sees it. What stays
 * here is in the table's baseline: with stories260K and the test_memory
 * configurations, baseline + table is within 1% of the peak RSS. */
void *ft_malloc(size_t n);               /* NULL on failure; callers report NOMEM */
void *ft_calloc(size_t n, size_t size);
void *ft_aligned_alloc(size_t n);        /* 64-byte aligned, free with free() */
char *ft_strdup(const char *s);
int ft_num_threads(int requested);       /* 0 -> the CPUs this process may use (affinity) */
double ft_time_s(void);                  /* monotonic seconds */
/* The double with the fewest decimal digits that rounds to f, so JSON
 * shows 0.05 rather than 0.05000000074505806. */
double ft_float_shortest(float f);
/* Checks that s[0..n) is valid UTF-8; returns the byte offset of the first
 * invalid sequence or -1 if valid. */
int64_t ft_utf8_invalid_at(const char *s, size_t n);

/* xorshift-style RNG with a 64-bit state; same stream on every machine. */
typedef struct { uint64_t s; } ft_rng;
void ft_rng_seed(ft_rng *r, uint64_t seed);
uint32_t ft_rng_u32(ft_rng *r);
float ft_rng_uniform(ft_rng *r);         /* [0, 1) */
float ft_rng_normal(ft_rng *r);          /* N(0, 1) */

#endif
