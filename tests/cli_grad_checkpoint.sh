#!/usr/bin/env bash
# `ftune train --grad-checkpoint [K]` end to end on stories260K (5 blocks):
# the option and its help, the errors (0, negative, more than the layers),
# and short runs whose per-step losses, gradient norms and final adapter (or
# model) are bit-identical to the run without it: LoRA with dropout in f32
# (K omitted, 2, 3), bf16 and NF4 bases; full fine-tuning; a checkpoint
# saved with it resumed without it. The printed
# memory table plans fewer activation bytes with it.
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

stories_jsonl "$tmp/d.jsonl" 4
train() { "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 32 -t 1 --val-split 0 --steps 4 --grad-accum 2 \
          --batch-size 2 --lora-dropout 0.1 --lr 1e-3 --seed 3 "$@"; }
# same_run NAME DIR_A DIR_B FILE: the same FILE bytes and the same per-step metrics
same_run() {
    local name=$1 a=$2 b=$3 f=$4
    if ! cmp -s "$a/$f" "$b/$f"; then fail "$name" "$f differs"; return; fi
    $PY - "$a/metrics.jsonl" "$b/metrics.jsonl" <<'EOF' && pass "$name" || fail "$name" "metrics differ (see above)"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
EOF
}
# the planned activation MiB of a run's printed memory table
acts_planned() { awk '$1 == "activations" { print $2 }' "$1"; }

# 1. help and errors
"$FT" train --help 2>&1 | grep -A2 -- "--grad-checkpoint \[K\]" | tr -s ' \n' ' ' | grep -q "K omitted: 1" \
    && pass help_grad_checkpoint || fail help_grad_checkpoint "$("$FT" train --help 2>&1 | grep -A2 -- --grad-checkpoint)"
expect_error grad_checkpoint_zero "grad-checkpoint 0: K must be at least 1" train -o "$tmp/x" --grad-checkpoint 0
expect_error grad_checkpoint_negative "grad-checkpoint -2: K must be at least 1" train -o "$tmp/x" --grad-checkpoint -2
expect_error grad_checkpoint_too_large "grad-checkpoint 6): K must be in 1..5, the model's layer count" \
    train -o "$tmp/x" --grad-checkpoint 6

# 2. LoRA f32: off, K omitted (followed by another option), 2, 3 (=K form)
train -o "$tmp/off" 2> "$tmp/off.txt" || fail run_off "$(cat "$tmp/off.txt")"
train --grad-checkpoint -o "$tmp/k1" 2> "$tmp/k1.txt" || fail run_k1 "$(cat "$tmp/k1.txt")"
train -o "$tmp/k2" --grad-checkpoint 2 2> "$tmp/k2.txt" || fail run_k2 "$(cat "$tmp/k2.txt")"
train -o "$tmp/k3" --grad-checkpoint=3 2> "$tmp/k3.txt" || fail run_k3 "$(cat "$tmp/k3.txt")"
same_run lora_k1_bit_identical "$tmp/off" "$tmp/k1" adapter_model.safetensors
same_run lora_k2_bit_identical "$tmp/off" "$tmp/k2" adapter_model.safetensors
same_run lora_k3_bit_identical "$tmp/off" "$tmp/k3" adapter_model.safetensors
# a checkpoint written with it resumes without it (nothing about it is saved)
train -o "$tmp/rs" --grad-checkpoint 2 --save-every 2 2> "$tmp/err.txt" || fail run_save "$(cat "$tmp/err.txt")"
train -o "$tmp/rs" --resume "$tmp/rs/checkpoint-2" 2> "$tmp/err.txt" \
    && cmp -s "$tmp/rs/adapter_model.safetensors" "$tmp/off/adapter_model.safetensors" && pass resume_without_it \
    || fail resume_without_it "$(cat "$tmp/err.txt")"
a0=$(acts_planned "$tmp/off.txt"); a1=$(acts_planned "$tmp/k1.txt")
awk -v a="$a0" -v b="$a1" 'BEGIN { exit !(b + 0 < a + 0) }' && pass memory_table_fewer_activations \
    || fail memory_table_fewer_activations "planned activations $a1 MiB with K=1, $a0 MiB without"

# 3. bf16 compute and NF4 bases
train -o "$tmp/bf_off" --dtype bf16 2> "$tmp/err.txt" || fail run_bf16 "$(cat "$tmp/err.txt")"
train -o "$tmp/bf_k2" --dtype bf16 --grad-checkpoint 2 2> "$tmp/err.txt" || fail run_bf16_k2 "$(cat "$tmp/err.txt")"
same_run bf16_k2_bit_identical "$tmp/bf_off" "$tmp/bf_k2" adapter_model.safetensors
train -o "$tmp/nf_off" --quant nf4 2> "$tmp/err.txt" || fail run_nf4 "$(cat "$tmp/err.txt")"
train -o "$tmp/nf_k2" --quant nf4 --grad-checkpoint 2 2> "$tmp/err.txt" || fail run_nf4_k2 "$(cat "$tmp/err.txt")"
same_run nf4_k2_bit_identical "$tmp/nf_off" "$tmp/nf_k2" adapter_model.safetensors

# 4. full fine-tuning
train -o "$tmp/full_off" --full 2> "$tmp/err.txt" || fail run_full "$(cat "$tmp/err.txt")"
train -o "$tmp/full_k3" --full --grad-checkpoint 3 2> "$tmp/err.txt" || fail run_full_k3 "$(cat "$tmp/err.txt")"
same_run full_k3_bit_identical "$tmp/full_off" "$tmp/full_k3" model.safetensors
