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
# a q4_K embedding whose third block's d is NaN: refused by tensor and block
"$VPY" - "$tmp/nan.gguf" <<'PY'
import sys, numpy as np, gguf
w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_embedding_length(256); w.add_feed_forward_length(512); w.add_block_count(1)
w.add_head_count(4); w.add_head_count_kv(4); w.add_context_length(64); w.add_layer_norm_rms_eps(1e-5)
raw = np.zeros((8, 144), dtype=np.uint8)
raw[2, 0:2] = np.array([0x7E00], dtype=np.uint16).view(np.uint8)
w.add_tensor("token_embd.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
expect_error nan_scale_named 'tensor "token_embd.weight" (q4_K): block 2 has a scale that is inf or NaN' \
    "$FT" generate -m "$tmp/nan.gguf" -p hi -n 1
if [ -f "$SMOL" ]; then
    # a download cut short, and chunks put together in the wrong order
    head -c 50000000 "$SMOL" > "$tmp/cut.gguf"
    expect_error truncated_refused "past the end of the data section" "$FT" generate -m "$tmp/cut.gguf" -p hi -n 1
    { tail -c +50000001 "$SMOL"; head -c 50000000 "$SMOL"; } > "$tmp/swapped.gguf"
    expect_error chunks_misordered_refused "not a GGUF file" "$FT" generate -m "$tmp/swapped.gguf" -p hi -n 1
    rm -f "$tmp/cut.gguf" "$tmp/swapped.gguf"
fi
expect_error iq2_xxs_named "iq2_xxs is not supported (f32, f16, bf16, q8_0, q4_0, q4_1" "$FT" generate -m "$tmp/iq2.gguf" -p hi -n 1
exit $rc
