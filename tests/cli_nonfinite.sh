#!/usr/bin/env bash
# A model or adapter holding an inf or NaN is refused at load, naming the
# file and the tensor, instead of giving NaN (or, through attention's masked
# rows, finite but wrong) outputs far from the cause: PEFT safetensors and
# GGUF LoRA adapters, and f32/f16/bf16 weights of HF, GGUF and llama2.c
# models, on stories260K.
set -u
. "$(dirname "$0")/lib.sh"
VPY=.venv/bin/python
S=$D/models/stories260K
export OMP_NUM_THREADS=1
head -c 3000 "$D/text/tinyshakespeare/input.txt" > "$tmp/t.txt"

# st_set FILE TENSOR INDEX VALUE: one element of a safetensors file's f32/f16/bf16 tensor
st_set() {
    $PY - "$@" <<'EOF'
import json, struct, sys
path, name, idx, val = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
f = open(path, "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); v = h[name]
size, fmt = {"F32": (4, "<f"), "F16": (2, "<e"), "BF16": (4, "<f")}[v["dtype"]]
if v["dtype"] == "BF16":
    f.seek(8 + n + v["data_offsets"][0] + 2 * idx); f.write(struct.pack("<f", val)[2:])
else:
    f.seek(8 + n + v["data_offsets"][0] + size * idx); f.write(struct.pack(fmt, val))
EOF
}
# gguf_set FILE TENSOR INDEX VALUE: the same in a GGUF's f32/f16 tensor
gguf_set() {
    $VPY - "$@" <<'EOF'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1], "r+")
t = next(t for t in r.tensors if t.name == sys.argv[2])
t.data.reshape(-1)[int(sys.argv[3])] = float(sys.argv[4])
r.data.flush()
EOF
}

# 1. adapters: a NaN in a PEFT adapter's lora_A, an inf in a GGUF adapter's lora_b
"$FT" train -m "$HF" --data "$tmp/t.txt" --ctx 32 -t 1 --val-split 0 --steps 1 --export-gguf -o "$tmp/a" --quiet \
    2> "$tmp/err.txt" || fail adapter_train "$(cat "$tmp/err.txt")"
cp -r "$tmp/a" "$tmp/nan-peft"
A=base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight
st_set "$tmp/nan-peft/adapter_model.safetensors" $A 5 nan
for cmd in eval merge; do
    case $cmd in eval) args=(eval -m "$HF" --adapter "$tmp/nan-peft" --text "$tmp/t.txt") ;;
                 merge) args=(merge -m "$HF" --adapter "$tmp/nan-peft" -o "$tmp/nan-merged") ;; esac
    expect_error "nan_peft_adapter_$cmd" "nan-peft/adapter_model.safetensors: tensor \"$A\": element \[0, 5\] is NaN" \
        "$FT" "${args[@]}"
done
expect_error nan_peft_init_adapter "tensor \"$A\": element \[0, 5\] is NaN" \
    "$FT" train -m "$HF" --data "$tmp/t.txt" --ctx 32 -t 1 --steps 1 --init-adapter "$tmp/nan-peft" -o "$tmp/b"
cp "$tmp/a/adapter.gguf" "$tmp/inf.gguf"
gguf_set "$tmp/inf.gguf" blk.0.ffn_down.weight.lora_b 3 -inf
expect_error inf_gguf_adapter "inf.gguf: tensor \"blk.0.ffn_down.weight.lora_b\": element \[0, 3\] is -inf" \
    "$FT" eval -m "$HF" --adapter "$tmp/inf.gguf" --text "$tmp/t.txt"
# the same adapters unedited load
"$FT" eval -m "$HF" --adapter "$tmp/a" --text "$tmp/t.txt" > /dev/null 2> "$tmp/err.txt" \
    && "$FT" eval -m "$HF" --adapter "$tmp/a/adapter.gguf" --text "$tmp/t.txt" > /dev/null 2>> "$tmp/err.txt" \
    && pass finite_adapters_load || fail finite_adapters_load "$(cat "$tmp/err.txt")"

# 2. models: f32 HF (a matrix and a norm), bf16 HF, f16 and f32 GGUF, llama2.c
rm -rf "$tmp/m1"; cp -r "$HF" "$tmp/m1"
st_set "$tmp/m1/model.safetensors" model.layers.2.self_attn.k_proj.weight 70 nan
expect_error nan_hf_matrix "m1: tensor \"model.layers.2.self_attn.k_proj.weight\": element \[1, 6\] is NaN" \
    "$FT" eval -m "$tmp/m1" --text "$tmp/t.txt"
rm -rf "$tmp/m2"; cp -r "$HF" "$tmp/m2"
st_set "$tmp/m2/model.safetensors" model.layers.0.post_attention_layernorm.weight 9 inf
expect_error inf_hf_norm "m2: tensor \"model.layers.0.post_attention_layernorm.weight\": element \[9\] is inf" \
    "$FT" generate -m "$tmp/m2" -p "Once" -n 2
"$FT" init --preset stories260K --dtype bf16 "$tmp/m3" 2> "$tmp/err.txt" || fail init_bf16 "$(cat "$tmp/err.txt")"
st_set "$tmp/m3/model.safetensors" model.embed_tokens.weight 64 nan
expect_error nan_hf_bf16_embedding "m3: tensor \"model.embed_tokens.weight\": element \[1, 0\] is NaN" \
    "$FT" info "$tmp/m3"
"$FT" merge -m "$HF" -o "$tmp/f16.gguf" --dtype f16 2> "$tmp/err.txt" || fail merge_f16 "$(cat "$tmp/err.txt")"
gguf_set "$tmp/f16.gguf" blk.4.ffn_gate.weight 0 inf
expect_error inf_gguf_f16 "f16.gguf: tensor \"blk.4.ffn_gate.weight\": element \[0, 0\] is inf" \
    "$FT" train -m "$tmp/f16.gguf" --data "$tmp/t.txt" --ctx 32 -t 1 --steps 1 -o "$tmp/c"
cp "$S/stories260K.gguf" "$tmp/f32.gguf"
gguf_set "$tmp/f32.gguf" output_norm.weight 63 nan
expect_error nan_gguf_f32_norm "f32.gguf: tensor \"output_norm.weight\": element \[63\] is NaN" \
    "$FT" eval -m "$tmp/f32.gguf" --text "$tmp/t.txt"
cp "$S/stories260K.bin" "$tmp/l2c.bin"
# the header (7 int32), then token_embedding_table (512 x 64 f32): element [3, 1]
$PY - "$tmp/l2c.bin" <<'EOF'
import struct, sys
f = open(sys.argv[1], "r+b"); f.seek(28 + 4 * (3 * 64 + 1)); f.write(struct.pack("<f", float("nan")))
EOF
expect_error nan_llama2c "l2c.bin: tensor \"token_embedding_table\": element \[3, 1\] is NaN" \
    "$FT" eval -m "$tmp/l2c.bin" --tokenizer "$S/tok512.bin" --text "$tmp/t.txt"
