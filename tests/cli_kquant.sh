#!/usr/bin/env bash
# GGUF outputs in every type and llama.cpp file type (mix) ftune writes
# (merge --dtype, quantize --type): each tensor's type is the one llama.cpp's
# llama_tensor_get_type chooses (scripts/gguf_mix_check.py states its rules
# again, from llama-quant.cpp) on a synthetic llama model whose rows are whole
# 256-element blocks (8 layers, grouped-query attention), and on stories260K
# (64 and 172 columns: llama.cpp's fallbacks); gguf-py reads every tensor
# ftune wrote and dequantizes it to ftune's own values, bit for bit; the
# 32-element types' bytes are gguf-py's quantize's (where gguf-py rounds
# q5_0 as a fused multiply-add, ggml's unfused rounding; gguf-py has no
# K-quant quantizer, so q4_K/q5_K/q6_K bytes are not compared here: the
# README says where they were); --dtype same keeps every tensor; the
# outputs evaluate within a bound of their source's perplexity and generate;
# on the real models, SmolLM2's and Qwen2.5's requantizations evaluate, and
# Qwen2.5's q4_k_m has the types of llama.cpp's own Q4_K_M file of it.
set -u
. "$(dirname "$0")/lib.sh"
VPY=.venv/bin/python
HELPER=${BUILD:-build}/tests/helper_dequant
S=$D/models/stories260K
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -x "$VPY" ] || { skip_or_fail kquant tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
head -c 6000 "$D/text/tinyshakespeare/input.txt" > "$tmp/t.txt"
loss() { "$FT" eval --text "$tmp/t.txt" --ctx 64 -t 1 "$@" 2> /dev/null | awk '$1 == "loss" { print $2 }'; }
# ratio_ok NAME LOSS_Q LOSS_REF MAX: exp(LOSS_Q - LOSS_REF) (the perplexity ratio) <= MAX
ratio_ok() {
    [ -n "$2" ] && [ -n "$3" ] && echo "  $1: perplexity ratio $(awk -v q="$2" -v r="$3" 'BEGIN { printf "%.4f", exp(q - r) }')"
    awk -v q="$2" -v r="$3" -v m="$4" 'BEGIN { exit !(q != "" && r != "" && exp(q - r) <= m) }' \
        && pass "$1" || fail "$1" "loss $2 against $3: perplexity ratio above $4"
}

# 1. a synthetic llama model (random weights) whose every row is whole K blocks
cat > "$tmp/syn.json" <<'JEOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false}
JEOF
"$FT" init --config "$tmp/syn.json" "$tmp/syn" > /dev/null 2>&1 \
    && "$FT" merge -m "$tmp/syn" -o "$tmp/syn.gguf" --tokenizer "$S/tok512.bin" 2> "$tmp/err.txt" \
    || { fail kquant_synthetic "$(cat "$tmp/err.txt")"; exit 1; }
for src in syn stories; do
    # stories260K: the mixes whose fallbacks differ
    case $src in syn) in=$tmp/syn.gguf mixes="q4_k_m q5_k_m q6_k q4_k_s q5_k_s q4_K q8_0 q4_0 q4_1 q5_0 q5_1 f16 bf16" ;;
                 stories) in=$S/stories260K.gguf mixes="q4_k_m q5_k_m q6_k q4_k_s q8_0 q4_0" ;; esac
    for mix in $mixes; do
        out=$tmp/$src-$mix.gguf
        if "$FT" merge -m "$in" -o "$out" --dtype "$mix" 2> "$tmp/err.txt" \
            && "$VPY" scripts/gguf_mix_check.py types "$in" "$out" "$mix" > "$tmp/check.txt" 2>&1 \
            && "$VPY" scripts/gguf_dequant.py check "$HELPER" "$out" >> "$tmp/check.txt" 2>&1 \
            && ! grep -q '^FAIL' "$tmp/check.txt"; then
            grep -v '^PASS' "$tmp/check.txt"; pass "${src}_$mix"
        else fail "${src}_$mix" "$(cat "$tmp/err.txt" "$tmp/check.txt")"; fi
    done
done
# quantize --type writes the same file as merge --dtype
"$FT" quantize --type q5_k_m "$tmp/syn.gguf" "$tmp/syn-quantize.gguf" 2> "$tmp/err.txt" \
    && cmp -s "$tmp/syn-quantize.gguf" "$tmp/syn-q5_k_m.gguf" && pass quantize_equals_merge \
    || fail quantize_equals_merge "$(cat "$tmp/err.txt")"

# 2. bytes: the 32-element types against gguf-py's quantize of the same f32 values
for mix in q8_0 q4_0 q4_1 q5_0 q5_1 q4_k_m; do
    if out=$("$VPY" scripts/gguf_mix_check.py bytes "$tmp/syn.gguf" "$tmp/syn-$mix.gguf" 2>&1); then
        echo "$out"; pass "bytes_$mix"
    else fail "bytes_$mix" "$out"; fi
done

# 3. --dtype same: every tensor's type and bytes, and the file type, as the input has them
"$FT" merge -m "$tmp/syn-q4_k_m.gguf" -o "$tmp/same.gguf" --dtype same 2> "$tmp/err.txt" \
    && "$VPY" - "$tmp/syn-q4_k_m.gguf" "$tmp/same.gguf" <<'PY' 2>> "$tmp/err.txt" && pass dtype_same || fail dtype_same "$(cat "$tmp/err.txt")"
import sys, numpy as np, gguf
a, b = (gguf.GGUFReader(p) for p in sys.argv[1:3])
tb = {t.name: t for t in b.tensors}
assert int(a.fields["general.file_type"].parts[-1][0]) == int(b.fields["general.file_type"].parts[-1][0]) == 15
for t in a.tensors:
    u = tb[t.name]
    assert t.tensor_type == u.tensor_type and np.asarray(t.data).tobytes() == np.asarray(u.data).tobytes(), t.name
PY
expect_error dtype_same_needs_gguf "stories260K-hf.gguf: --dtype same keeps each tensor's type as the input GGUF stores it, but the input is a hf model, not GGUF" \
    "$FT" merge -m "$HF" -o "$tmp/stories260K-hf.gguf" --dtype same
[ ! -e "$tmp/stories260K-hf.gguf" ] && pass dtype_same_wrote_nothing || fail dtype_same_wrote_nothing "a file was left"
expect_error bad_mix "dtype \"q3_k_m\" is not one ftune writes to GGUF (same, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, q4_k_s, q4_k_m, q5_k_s, q5_k_m)" \
    "$FT" merge -m "$S/stories260K.gguf" -o "$tmp/bad.gguf" --dtype q3_k_m
# a value whose q4_K block scale f16 cannot hold (1e12 / 15 / 63 >> 65504) is refused by tensor, row and column
"$VPY" - "$tmp/syn/model.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
v = h["model.layers.1.mlp.up_proj.weight"]; f.seek(8 + n + v["data_offsets"][0] + 4 * 40); f.write(struct.pack("<f", 1e12))
PY
expect_error q4_K_overflow "blk.1.ffn_up.weight: row 0, column 40 is 1e+12, which q4_K cannot hold" \
    "$FT" merge -m "$tmp/syn" -o "$tmp/big.gguf" --dtype q4_k_m --tokenizer "$S/tok512.bin"
[ ! -e "$tmp/big.gguf" ] && pass q4_K_overflow_wrote_nothing || fail q4_K_overflow_wrote_nothing "a file was left"

# a merge whose sum is not finite (a finite adapter of 1e30s: B·A = 1e60 overflows f32) is refused
# by the writer, naming the tensor, row and column, before a K-quant block is written
"$FT" train -m "$HF" --data "$tmp/t.txt" --ctx 32 -t 1 --val-split 0 --steps 1 -o "$tmp/a" --quiet 2> "$tmp/err.txt" \
    || fail kquant_adapter "$(cat "$tmp/err.txt")"
"$VPY" - "$tmp/a/adapter_model.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
def put(name, idx, val):
    v = h[name]; f.seek(8 + n + v["data_offsets"][0] + 4 * idx); f.write(struct.pack("<f", val))
p = "base_model.model.model.layers.1.self_attn.v_proj."
cols_a = h[p + "lora_A.weight"]["shape"][1]; r = h[p + "lora_B.weight"]["shape"][1]
put(p + "lora_A.weight", 0 * cols_a + 5, 1e30)   # A[0, 5]
put(p + "lora_B.weight", 0 * r + 0, 1e30)        # B[0, 0]
PY
expect_error merge_inf_refused "blk.1.attn_v.weight: row 0, column 5 is inf after the merge" \
    "$FT" merge -m "$HF" --adapter "$tmp/a" -o "$tmp/inf.gguf" --dtype q4_k_m
[ ! -e "$tmp/inf.gguf" ] && pass merge_inf_wrote_nothing || fail merge_inf_wrote_nothing "a file was left"

# 4. they run: perplexity on a small text within a bound of the f32 source's, and generation.
# stories260K's K mixes are mostly q5_0/q5_1/q8_0/f16 (its rows are not whole 256-element blocks):
# measured ratios 0.985-1.001 (on Shakespeare, far from its stories, 4-5 bit noise moves the loss
# either way), q4_0 1.046; bound 1.10, above what a model quantized as intended shows and far below
# what a wrong block layout or scale gives (x10 and more)
lf=$(loss -m "$S/stories260K.gguf")
for mix in q4_k_m q5_k_m q6_k q8_0 q4_0; do
    ratio_ok "ppl_stories_$mix" "$(loss -m "$tmp/stories-$mix.gguf")" "$lf" 1.10
done
g=$("$FT" generate -m "$tmp/stories-q4_k_m.gguf" -p "Once upon a time" -n 20 --temp 0 2> "$tmp/err.txt")
[ -n "$g" ] && pass generate_q4_k_m || fail generate_q4_k_m "$(cat "$tmp/err.txt")"

# 5. real models: SmolLM2-135M (Q4_1 from llama.cpp; 576 columns, so its K mixes fall back to
# 32-element types but for ffn_down) requantized from its own dequantized weights: each mix's
# perplexity within 1.15 of the Q4_1 source's (measured: q4_k_m 1.082 on these 1500 characters,
# 1.068 on 3000, a second 5-bit rounding, q5_0's, on top of Q4_1's own; q6_k 1.019 on 3000);
# Qwen2.5-Coder-0.5B's Q4_K_M requantized to q4_k_m has its types
if need_model kquant_smollm2 "$SMOL"; then
    head -c 1500 "$D/text/tinyshakespeare/input.txt" > "$tmp/t.txt"
    ls=$(loss -m "$SMOL")
    for mix in q4_k_m; do
        "$FT" quantize --type $mix "$SMOL" "$tmp/smol-$mix.gguf" 2> "$tmp/err.txt" \
            || { fail "smollm2_$mix" "$(cat "$tmp/err.txt")"; continue; }
        ratio_ok "ppl_smollm2_$mix" "$(loss -m "$tmp/smol-$mix.gguf")" "$ls" 1.15
    done
    g=$("$FT" generate -m "$tmp/smol-q4_k_m.gguf" -p "The capital of France is" -n 8 --temp 0 2> "$tmp/err.txt")
    [ -n "$g" ] && pass generate_smollm2_q4_k_m || fail generate_smollm2_q4_k_m "$(cat "$tmp/err.txt")"
fi
if need_model kquant_qwen2 "$QWEN"; then
    "$FT" quantize --type q4_k_m "$QWEN" "$tmp/qwen.gguf" 2> "$tmp/err.txt" \
        && out=$("$VPY" scripts/gguf_mix_check.py order "$QWEN" "$tmp/qwen.gguf" 2>&1) \
        && { echo "$out"; pass qwen2_q4_k_m_types_as_llama_cpp; } \
        || fail qwen2_q4_k_m_types_as_llama_cpp "$(cat "$tmp/err.txt") ${out:-}"
fi

