#!/usr/bin/env bash
# cli_resume_formats.sh — a checkpoint resumed on the same model in another
# format: stories260K as a Hugging Face directory (q/k rows in rotate-half
# order) and as GGUF (interleaved, as llama.cpp stores llama). The checkpoint
# holds lora_B of q/k (and their AdamW moments) in its model's order; resume
# permutes them into the run's, so the run continues as the uninterrupted one
# (to float rounding: attention sums in another order across layouts), where
# before the rows were read in the wrong order. 8-bit moments (blocks across
# rows) are refused, naming both layouts.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
GG=$D/models/stories260K/stories260K.gguf
BIN=$D/models/stories260K/stories260K.bin
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python3_ok() { $PY -c "import numpy" 2> /dev/null; }
python3_ok || { skip_or_fail resume_formats tool "numpy is missing from $PY (scripts/setup.sh)"; exit $?; }
for i in $(seq 0 23); do printf '{"text": "Once upon a time there was a little dog number %d who liked to run."}\n' "$i"; done > "$tmp/d.jsonl"
rt=(--data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet --steps 6 --lr 3e-3 --seed 3 --batch-size 4 --lora-targets q,k,v --val-split 0)
train() { local m=$1; shift; "$FT" train -m "$m" "${rt[@]}" "$@"; }
losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
# close A B TOL: adapters A and B (PEFT safetensors) agree within TOL of the largest value, and the
# q/k lora_B are not zero (the test would then not see an order); prints the relative difference
close() {
    $PY - "$1" "$2" "$3" <<'EOF'
import json, struct, sys
import numpy as np
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); o = 8 + n
    return {k: np.frombuffer(b[o + v["data_offsets"][0]:o + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys(), (a.keys(), b.keys())
d = max(float(np.max(np.abs(a[k] - b[k]))) / max(float(np.max(np.abs(a[k]))), 1e-30) for k in a)
qb = [k for k in a if k.endswith(("q_proj.lora_B.weight", "k_proj.lora_B.weight", "q_proj.weight", "k_proj.weight"))]
assert qb and all(np.max(np.abs(a[k])) > 0 for k in qb), qb
print("max relative difference %.3g" % d)
sys.exit(0 if d <= float(sys.argv[3]) else 1)
EOF
}
# reference: each format uninterrupted, and each saving at step 3
for f in hf gg; do
    m=$HF; [ $f = gg ] && m=$GG
    train "$m" -o "$tmp/full_$f" 2> "$tmp/err.txt" || fail "reference_$f" "$(cat "$tmp/err.txt")"
    train "$m" -o "$tmp/ck_$f" --save-every 3 2> "$tmp/err.txt" || fail "save_$f" "$(cat "$tmp/err.txt")"
done
# 1e-4: the two layouts' runs agree to ~1e-6 (the same sums in another order); a q/k lora_B row
# order gone wrong after 3 steps of lr 3e-3 moves the adapter by tens of percent
for pair in "hf gg" "gg hf"; do
    set -- $pair; from=$1 to=$2
    m=$HF; [ $to = gg ] && m=$GG
    cp -r "$tmp/ck_$from" "$tmp/x_$from$to"
    if train "$m" -o "$tmp/x_$from$to" --resume "$tmp/x_$from$to/checkpoint-3" 2> "$tmp/err.txt"; then
        r=$(close "$tmp/full_$from/adapter_model.safetensors" "$tmp/x_$from$to/adapter_model.safetensors" 1e-4) \
            && { echo "resume_${from}_on_${to}: $r"; pass "resume_${from}_on_${to}"; } || fail "resume_${from}_on_${to}" "against the uninterrupted run: $r"
        # the losses after the resume: each step's within 1e-5 of the uninterrupted run's
        $PY - "$tmp/full_$from/metrics.jsonl" "$tmp/x_$from$to/metrics.jsonl" <<'EOF' > "$tmp/py.txt" 2>&1 \
            && pass "resume_${from}_on_${to}_losses" || fail "resume_${from}_on_${to}_losses" "$(cat "$tmp/py.txt")"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 6, (a, b)
for s in range(3, 6):
    assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), (s + 1, a[s], b[s])
EOF
    else
        fail "resume_${from}_on_${to}" "$(cat "$tmp/err.txt")"
    fi
done
# a checkpoint from before its config recorded the layout: the one of the model its model_path names
cp -r "$tmp/ck_hf" "$tmp/old_hfgg"
$PY tests/ckpt_state.py "$tmp/old_hfgg/checkpoint-3/trainer_state.json" 'del s["config"]["model"]["rope_layout"]'
train "$GG" -o "$tmp/old_hfgg" --resume "$tmp/old_hfgg/checkpoint-3" 2> "$tmp/err.txt" \
    && r=$(close "$tmp/full_hf/adapter_model.safetensors" "$tmp/old_hfgg/adapter_model.safetensors" 1e-4) \
    && { echo "resume_unrecorded_layout: $r"; pass resume_unrecorded_layout; } \
    || fail resume_unrecorded_layout "$(cat "$tmp/err.txt") $r"
# ZeRO 1 and 3 (one rank) read the state whole into other buffers (the moments flat, the values
# gathered), and full fine-tuning permutes the q/k weights themselves
cp -r "$tmp/ck_hf" "$tmp/z_hfgg"
for z in 1 3; do
    train "$GG" -o "$tmp/z_hfgg" --zero $z --resume "$tmp/z_hfgg/checkpoint-3" 2> "$tmp/err.txt" \
        && r=$(close "$tmp/full_hf/adapter_model.safetensors" "$tmp/z_hfgg/adapter_model.safetensors" 1e-4) \
        && { echo "resume_hf_on_gg_zero$z: $r"; pass "resume_hf_on_gg_zero$z"; } \
        || fail "resume_hf_on_gg_zero$z" "$(cat "$tmp/err.txt") $r"
done
train "$HF" -o "$tmp/full_full" --full --lr 1e-3 2> "$tmp/err.txt" || fail full_reference "$(cat "$tmp/err.txt")"
train "$HF" -o "$tmp/ck_full" --full --lr 1e-3 --save-every 3 2> "$tmp/err.txt" || fail full_save "$(cat "$tmp/err.txt")"
# (on the llama2.c file: interleaved too, and tied like the Hugging Face one, where the GGUF has its own output matrix)
train "$BIN" -o "$tmp/ck_full" --full --lr 1e-3 --resume "$tmp/ck_full/checkpoint-3" 2> "$tmp/err.txt" \
    && r=$(close "$tmp/full_full/model.safetensors" "$tmp/ck_full/model.safetensors" 1e-4) \
    && { echo "resume_full_hf_on_llama2c: $r"; pass resume_full_hf_on_llama2c; } \
    || fail resume_full_hf_on_llama2c "$(cat "$tmp/err.txt") $r"
# the same format resumes bit for bit, as before
cp -r "$tmp/ck_gg" "$tmp/x_gggg"
train "$GG" -o "$tmp/x_gggg" --resume "$tmp/x_gggg/checkpoint-3" 2> "$tmp/err.txt" \
    && cmp -s "$tmp/full_gg/adapter_model.safetensors" "$tmp/x_gggg/adapter_model.safetensors" \
    && [ "$(losses "$tmp/full_gg/metrics.jsonl")" = "$(losses "$tmp/x_gggg/metrics.jsonl")" ] \
    && pass resume_same_format_bit_exact || fail resume_same_format_bit_exact "$(cat "$tmp/err.txt")"
# 8-bit moments of lora_B (r 64: 4096 elements, quantized in blocks across rows): refused
train "$HF" -o "$tmp/ck8" --save-every 3 --optim adamw8bit --lora-r 64 2> "$tmp/err.txt" || fail save_8bit "$(cat "$tmp/err.txt")"
expect_error resume_other_layout_8bit "rotate-half (Hugging Face) layout, this run's model has the interleaved (GGUF, llama2.c) one" \
    train "$GG" -o "$tmp/ck8" --optim adamw8bit --lora-r 64 --resume "$tmp/ck8/checkpoint-3"
