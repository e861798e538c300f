#!/usr/bin/env bash
# `ftune quantize`: --type nf4 writes a Hugging Face *-bnb-4bit directory
# (and --type int8 bitsandbytes' 8-bit one, checked the same way)
# whose every tensor is bit for bit what tests/bnb_write.py (bitsandbytes'
# algorithm and transformers' layout, independently in Python) writes for
# the same model, from the HF, the GGUF and the llama2.c stories260K alike
# (its 172-wide down_proj exercises the padded last block); it loads back
# and trains; transformers' BitsAndBytesConfig accepts its quantization_config
# (tests/bnb_config_check.py); its Linears take 4.127 bits per parameter at 1024 x 4096;
# a .gguf OUT is GGUF (tests/cli_kquant.sh checks its types); bad types and targets are clear errors.
set -u
. "$(dirname "$0")/lib.sh"
GG=$D/models/stories260K/stories260K.gguf
L2=$D/models/stories260K/stories260K.bin
TOK=$D/models/stories260K/tok512.bin
VPY=.venv/bin/python
export OMP_NUM_THREADS=1

# every tensor of A equal to B's (dtype, shape, bytes; quant-state JSON as
# parsed values); with "layers", only the decoder layers' tensors (a GGUF
# or llama2.c source has its own embedding and head layout)
same_tensors() {
    $VPY - "$@" <<'PYEOF'
import json, sys
from safetensors.torch import load_file
a, b = (load_file(d + "/model.safetensors") for d in sys.argv[1:3])
if len(sys.argv) > 3:
    a, b = ({k: v for k, v in t.items() if ".layers." in k} for t in (a, b))
if set(a) != set(b):
    sys.exit("names differ: %s" % sorted(set(a) ^ set(b))[:4])
for k in a:
    if k.endswith("quant_state.bitsandbytes__nf4"):
        ja, jb = (json.loads(bytes(t.tolist())) for t in (a[k], b[k]))
        if ja != jb:
            sys.exit("%s: %s vs %s" % (k, ja, jb))
    elif a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].numpy().tobytes() != b[k].numpy().tobytes():
        sys.exit("%s differs" % k)
print("  %d tensors equal" % len(a))
PYEOF
}

$VPY tests/bnb_write.py "$HF" "$tmp/ref" "$tmp/ref-f32" || { fail quantize_reference "bnb_write.py failed"; exit 1; }
if "$FT" quantize --type nf4 "$HF" "$tmp/hf" 2> "$tmp/log" && out=$(same_tensors "$tmp/hf" "$tmp/ref" 2>&1); then
    echo "$out"; pass quantize_nf4_hf_matches_bitsandbytes
else fail quantize_nf4_hf_matches_bitsandbytes "$(cat "$tmp/log") $out"; fi
# the GGUF's q/k rows are interleaved inside ftune; written back in HF layout
if "$FT" quantize --type nf4 "$GG" "$tmp/gg" 2> "$tmp/log" && out=$(same_tensors "$tmp/gg" "$tmp/ref" layers 2>&1); then
    pass quantize_nf4_gguf_matches_bitsandbytes
else fail quantize_nf4_gguf_matches_bitsandbytes "$(cat "$tmp/log") $out"; fi
if "$FT" quantize --type nf4 --tokenizer "$TOK" "$L2" "$tmp/l2" 2> "$tmp/log" && out=$(same_tensors "$tmp/l2" "$tmp/ref" layers 2>&1); then
    pass quantize_nf4_llama2c_matches_bitsandbytes
else fail quantize_nf4_llama2c_matches_bitsandbytes "$(cat "$tmp/log") $out"; fi

# config.json says what transformers needs to load it
if $VPY -c "import json,sys; q=json.load(open(sys.argv[1]))['quantization_config']; sys.exit(0 if q['quant_method']=='bitsandbytes' and q['load_in_4bit'] and q['bnb_4bit_quant_type']=='nf4' and q['bnb_4bit_use_double_quant'] else 1)" "$tmp/hf/config.json"; then
    pass quantize_config
else fail quantize_config "$(cat "$tmp/hf/config.json")"; fi
# and transformers accepts it: BitsAndBytesConfig built from it as from_pretrained builds it
if out=$($VPY tests/bnb_config_check.py nf4 "$tmp/hf" "$tmp/gg" "$tmp/l2" 2>&1); then echo "$out"; pass quantize_nf4_transformers_config
else fail quantize_nf4_transformers_config "$out"; fi

# it loads back (nf4 rows; the 172-wide down_proj dequantized to f32) and QLoRA trains on it
info=$("$FT" info -m "$tmp/hf" 2>&1)
if grep -q "dtypes: *f32,nf4" <<<"$info"; then pass quantize_loads; else fail quantize_loads "$info"; fi
printf '{"text": "Once upon a time there was a little cat. The cat liked to play in the sun."}\n%.0s' 1 2 3 4 5 6 7 8 > "$tmp/d.jsonl"
if "$FT" train -m "$tmp/hf" -o "$tmp/run" --data "$tmp/d.jsonl" --steps 2 --batch-size 2 --ctx 32 -t 1 --val-split 0 --quiet 2> "$tmp/log"; then
    pass quantize_trains
else fail quantize_trains "$(tail -3 "$tmp/log")"; fi

# 4.127 bits per parameter, from the sizes of the tensors in the file, for
# 1024 x 4096 Linears (the figure is 4 + 8/64 + 32/(64*256) + the offset)
cat > "$tmp/big.json" <<'JEOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096,
 "num_hidden_layers": 1, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true}
JEOF
"$FT" init --config "$tmp/big.json" "$tmp/big" --dtype bf16 > /dev/null 2>&1
if "$FT" quantize --type nf4 "$tmp/big" "$tmp/bigq" 2> "$tmp/log" && out=$($VPY - "$tmp/bigq" <<'PYEOF' 2>&1
import sys
from safetensors import safe_open
f = safe_open(sys.argv[1] + "/model.safetensors", "pt")
for k in f.keys():
    if not k.endswith("mlp.up_proj.weight"):
        continue
    t = lambda s: f.get_tensor(k + s)
    numel = 2 * t("").numel()
    bits = 8 * (t("").numel() + t(".absmax").numel() + 4 * t(".nested_absmax").numel() + 4) / numel
    print("  %s: %d parameters, %.4f bits each" % (k, numel, bits))
    sys.exit(0 if abs(bits - 4.127) < 5e-4 else 1)
sys.exit(1)
PYEOF
); then echo "$out"; pass quantize_bits_per_param; else fail quantize_bits_per_param "$(cat "$tmp/log") $out"; fi

# int8: bitsandbytes' 8-bit layout (weight I8, SCB, weight_format), every
# Linear's codes and SCB bit for bit tests/nf4_ref.py's torch implementation
# of int8_vectorwise_quant; it loads as the same model as --quant int8
if "$FT" quantize --type int8 "$HF" "$tmp/i8" 2> "$tmp/log" && out=$($VPY - "$HF" "$tmp/i8" <<'PYEOF' 2>&1
import json, os, sys
sys.path.insert(0, "tests")
import nf4_ref
from safetensors.torch import load_file
src, q = (load_file(os.path.join(d, "model.safetensors")) for d in sys.argv[1:3])
n = 0
for k, w in src.items():
    if ".layers." not in k or "norm" in k:
        continue
    p = k[: -len(".weight")]
    stats, codes, _ = nf4_ref.int8_rows(w.float())
    if q[k].numpy().tobytes() != codes.numpy().tobytes() or q[p + ".SCB"].numpy().tobytes() != stats.numpy().tobytes():
        sys.exit("%s differs" % k)
    if q[p + ".weight_format"].item() != 0:
        sys.exit("%s.weight_format is not 0" % p)
    n += 1
cfg = json.load(open(os.path.join(sys.argv[2], "config.json")))["quantization_config"]
if not (cfg["load_in_8bit"] and not cfg["load_in_4bit"] and cfg["quant_method"] == "bitsandbytes"):
    sys.exit("quantization_config: %s" % cfg)
print("  %d int8 Linears equal" % n)
PYEOF
); then echo "$out"; pass quantize_int8_matches_bitsandbytes
else fail quantize_int8_matches_bitsandbytes "$(cat "$tmp/log") $out"; fi
if out=$($VPY tests/bnb_config_check.py int8 "$tmp/i8" 2>&1); then echo "$out"; pass quantize_int8_transformers_config
else fail quantize_int8_transformers_config "$out"; fi
run_val() { "$FT" train "$@" -o "$tmp/v$RANDOM" --data "$tmp/d.jsonl" --steps 1 --batch-size 2 --ctx 32 -t 1 --val-split 0.25 2>&1 | sed -n 's/^val loss: \([0-9.]*\) before.*/\1/p'; }
a=$(run_val -m "$tmp/i8"); b=$(run_val -m "$HF" --quant int8)
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass quantize_int8_loads; else fail quantize_int8_loads "int8 checkpoint val loss $a, --quant int8 $b"; fi

# GGUF types
if "$FT" quantize --type q8_0 "$HF" "$tmp/q8.gguf" 2> "$tmp/log" && "$FT" info -m "$tmp/q8.gguf" 2>&1 | grep -q "q8_0"; then
    pass quantize_gguf
else fail quantize_gguf "$(cat "$tmp/log")"; fi

# bad input
expect_err() { # name, expected message, command...
    local name=$1 msg=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc -ne 0 ] && grep -qF -- "$msg" <<<"$out"; then pass "$name"; else fail "$name" "rc $rc: $out"; fi
}
expect_err quantize_bad_type 'type "int4" is not supported (bitsandbytes: nf4, int8; GGUF: an output ending in .gguf)' \
    "$FT" quantize --type int4 "$HF" "$tmp/x"
expect_err quantize_bad_gguf_type 'dtype "q3_K" is not one ftune writes to GGUF (same, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K, q4_k_s, q4_k_m, q5_k_s, q5_k_m)' \
    "$FT" quantize --type q3_K "$HF" "$tmp/x.gguf"
expect_err quantize_nf4_to_gguf 'dtype "nf4" is a bitsandbytes type, written as a Hugging Face directory (an output path without .gguf)' \
    "$FT" quantize --type nf4 "$HF" "$tmp/x.gguf"
expect_err quantize_q8_to_dir '"q8_0" is a GGUF type: write the output as a .gguf file' "$FT" quantize --type q8_0 "$HF" "$tmp/x"
expect_err quantize_twice "the model is already quantized (nf4)" "$FT" quantize --type nf4 "$tmp/hf" "$tmp/x2"
expect_err quantize_no_out "expected MODEL and OUT" "$FT" quantize --type nf4 "$HF"
