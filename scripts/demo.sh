#!/usr/bin/env bash
# The main job, end to end on a real (tiny) model: fine-tune stories260K with
# LoRA on Shakespeare, report the validation loss before and after, and
# generate a sample with the adapter next to one from the base model.
set -euo pipefail
cd "$(dirname "$0")/.."
FT=${BUILD:-build}/ftune
DATA=${FTUNE_DATA:-../shared/data}
MODEL=$DATA/models/stories260K-hf
OUT=${OUT:-build/demo-shakespeare}
STEPS=${STEPS:-200}
rm -rf "$OUT"
echo "== fine-tuning stories260K with LoRA on tinyshakespeare ($STEPS steps)"
"$FT" train -m "$MODEL" --data "$DATA/text/tinyshakespeare/input.txt" -o "$OUT" \
    --ctx 128 --batch-size 8 --steps "$STEPS" --lr 3e-3 --warmup 10 --val-split 0.02 --seed 1
echo
echo "== base model, greedy:"
"$FT" generate -m "$MODEL" -p "ROMEO:" -n 80 --temp 0 --quiet
echo
echo "== with the adapter ($OUT), greedy:"
"$FT" generate -m "$MODEL" --adapter "$OUT" -p "ROMEO:" -n 80 --temp 0 --quiet
echo
echo "adapter: $OUT/adapter_config.json + adapter_model.safetensors (PEFT); metrics: $OUT/metrics.jsonl"
