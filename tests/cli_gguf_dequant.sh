#!/usr/bin/env bash
# Every GGUF weight type ftune reads, dequantized by the dtype traits, equal
# value for value to gguf-py's gguf.quants.dequantize: synthetic blocks of
# each type (random bytes, so every code value; zero blocks; extreme,
# subnormal and non-finite f16 scales and mins), and every tensor of the two
# real models (SmolLM2-135M-Instruct Q4_1: q4_1, q8_0, f32; Qwen2.5-Coder-0.5B
# Q4_K_M: q4_K, q6_K, q5_0, q8_0, f32).
cd "$(dirname "$0")/.."
source tests/lib.sh
BUILD=${BUILD:-build}
HELPER=$BUILD/tests/helper_dequant
VPY=.venv/bin/python
[ -x "$VPY" ] || { skip_or_fail gguf_dequant tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
"$VPY" scripts/gguf_dequant.py synth "$tmp/synth.gguf" || { fail synth "gguf-py could not write the synthetic blocks"; exit 1; }
"$VPY" scripts/gguf_dequant.py check "$HELPER" "$tmp/synth.gguf" \
    --types Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,F16,BF16,F32
rc=$?
if need_model smollm2 "$SMOL"; then
    "$VPY" scripts/gguf_dequant.py check "$HELPER" "$SMOL" --types Q4_1,Q8_0,F32 || rc=1
else rc=$((rc | $?)); fi
if need_model qwen2.5 "$QWEN"; then
    "$VPY" scripts/gguf_dequant.py check "$HELPER" "$QWEN" --types Q4_K,Q6_K,Q5_0,Q8_0,F32 || rc=1
else rc=$((rc | $?)); fi
# a type ftune does not compute with is named, with what is supported
"$VPY" - "$tmp/iq2.gguf" <<'PY'
import sys, numpy as np, gguf
# the shape of a one-layer model, its embedding in iq2_xxs (256 wide: one block a row)
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_embedding_length(256); w.add_feed_forward_length(512); w.add_block_count(1)
w.add_head_count(4); w.add_head_count_kv(4); w.add_context_length(64); w.add_layer_norm_rms_eps(1e-5)
w.add_tensor("token_embd.weight", np.zeros((8, 66), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
expect_error iq2_xxs_named "iq2_xxs is not supported (f32, f16, bf16, q8_0, q4_0, q4_1" "$FT" generate -m "$tmp/iq2.gguf" -p hi -n 1
exit $rc
