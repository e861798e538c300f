#!/usr/bin/env bash
# The main job, end to end on a real instruct model: fine-tune
# SmolLM2-135M-Instruct (the Q4_1 GGUF file scripts/fetch_models.sh fetches,
# trained over its frozen quantized weights as stored) with LoRA on GSM8K's
# grade-school maths, as chat turns with the loss on the answers; report the
# held-out loss before and after, and one test question's greedy answer from
# the model alone and with the adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
FT=${BUILD:-build}/ftune
DATA=${FTUNE_DATA:-../shared/data}
MODELS=${FTUNE_MODELS:-$HOME/.cache/ftune/models}
MODEL=${MODEL:-$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-build/demo-gsm8k}
STEPS=${STEPS:-30}
HELD=${HELD:-32}       # held-out examples: the first HELD of GSM8K's test split
if [ ! -f "$MODEL" ]; then
    echo "== $MODEL is missing: fetching it (scripts/fetch_models.sh)"
    bash scripts/fetch_models.sh
fi
G=$DATA/text/gsm8k
mkdir -p "$(dirname "$OUT")"
heldout=$OUT-heldout.jsonl
head -n "$HELD" "$G/test.jsonl" > "$heldout"
# the test question asked before and after: the held-out split's first
question=$(head -n 1 "$G/test.jsonl" | python3 -c 'import json, sys; print(json.load(sys.stdin)["question"])')
answer=$(head -n 1 "$G/test.jsonl" | python3 -c 'import json, sys; print(json.load(sys.stdin)["answer"].split("#### ")[-1])')
ask() {  # greedy answer of the model, with the adapter named in $1 if any
    "$FT" generate -m "$MODEL" ${1:+--adapter "$1"} --chat -p "$question" --temp 0 -n 200 --quiet
}

echo "== test question (GSM8K test #1; the answer is $answer):"
echo "$question"
echo
echo "== SmolLM2-135M-Instruct, greedy, before fine-tuning:"
ask ""
echo
echo "== fine-tuning with LoRA on GSM8K ($STEPS steps; held-out loss on $HELD test examples)"
"$FT" train -m "$MODEL" --data "$G/train.jsonl" --val "$heldout" -o "$OUT" --overwrite \
    --format chat --prompt-key question --completion-key answer \
    -c 512 --pack --batch-size 2 --steps "$STEPS" --lr 1e-3 --warmup 3 --lora-r 16 --lora-alpha 32 --seed 1
echo
echo "== with the adapter ($OUT), greedy:"
ask "$OUT"
echo
echo "adapter: $OUT/adapter_config.json + adapter_model.safetensors (PEFT); metrics: $OUT/metrics.jsonl"
