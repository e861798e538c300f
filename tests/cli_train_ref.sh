#!/usr/bin/env bash
# `ftune train` end to end against an independent PyTorch trainer
# (scripts/ref_train.py, float64): ftune dumps the exact micro-batches it
# trained on and the adapter it started from; the reference replays them
# (same LoRA math, torch.optim.AdamW, clip_grad_norm_, HF warmup schedule,
# accumulation normalised by the step's target tokens) and the per-step
# losses, learning rates and final weights must agree. Runs LoRA on the HF
# stories260K, full fine-tuning (tied embedding, packed rows), and LoRA on
# the GGUF stories260K (interleaved q/k rows inside, HF layout in the saved
# adapters) replayed on the HF model.
set -u
. "$(dirname "$0")/lib.sh"
GGUF=$D/models/stories260K/stories260K.gguf
REF=scripts/ref_train.py

if ! "$FT" train --help > /dev/null 2>&1; then
    fail train_available "$FT train --help failed"; exit 1
fi

# 40 prompt/completion records: a line of tinyshakespeare and the line after it
$PY - "$D/text/tinyshakespeare/input.txt" "$tmp/data.jsonl" <<'EOF'
import json, sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if l.strip()][:200]
with open(sys.argv[2], "w") as f:
    for i in range(0, 80, 2):
        f.write(json.dumps({"prompt": lines[i] + "\n", "completion": lines[i + 1]}) + "\n")
EOF

# Shared by ftune and the reference. lr 1e-3 so that in 20 steps the weights
# move well past rounding noise; warmup 3 + cosine and clipping at 1.0 so that
# the schedule and the clip are both exercised (the grad norm of the first
# steps is above 1 on this data).
OPT="--lr 1e-3 --beta1 0.9 --beta2 0.999 --adam-eps 1e-8 --max-grad-norm 1.0 --schedule cosine --warmup 3 --steps 20"
# one thread each: stories260K's matrices are tiny, and on a shared machine
# a second thread mostly waits (measured 10x slower under load). -t 1 alone
# still left OpenBLAS with OMP_NUM_THREADS threads, so set that too.
export OMP_NUM_THREADS=1
DATA="--data $tmp/data.jsonl --batch-size 4 --grad-accum 2 --ctx 64 --seed 7 -t 1 --quiet"

# Tolerances:
# losses (and lr, pre-clip grad norm) 1e-4 relative: ftune computes in
# float32 (float64 loss sums) against float64 torch; after 20 steps the
# weights differ by ~1e-6 of their size, which moves a loss of ~5 by far less
# than 1e-4 (measured: loss 1e-7, grad norm 8e-7). A wrong choice of decayed
# tensors or a missing clip gives 5e-4 and 1e-2.
LOSS_TOL=1e-4
# final tensors 1e-3 max relative error with a floor of 1% of each tensor's
# largest magnitude: Adam divides each element's gradient by its own running
# RMS, so an element whose gradient is near float32 rounding level still takes
# a step of up to lr whose size is a ratio of two noisy numbers; its error is
# a small fraction of lr, not of its value, and lora_B starts at exactly 0.
# Measured: float32 torch against float64 torch on this setup 3e-4; ftune
# against float64 torch 4e-4 (LoRA), 2e-5 (full); without the floor (LoRA) 3e-3.
TENSOR_TOL=1e-3
FLOOR=1e-2

run_case() {  # name, model for ftune, extra flags for both, extra ftune-only flags, extra ref-only flags
    local name=$1 model=$2 both=$3 ours_only=$4 ref_only=$5
    local o=$tmp/$name r=$tmp/${name}_ref
    # shellcheck disable=SC2086
    if ! "$FT" train -m "$model" $DATA $OPT $both $ours_only -o "$o" --dump-batches "$tmp/$name.jsonl" \
            > "$tmp/$name.log" 2>&1; then
        fail "$name" "ftune train failed: $(tail -5 "$tmp/$name.log")"; return
    fi
    # shellcheck disable=SC2086
    if ! $PY $REF train -m "$HF" --batches "$tmp/$name.jsonl" -o "$r" $OPT $both $ref_only \
            > "$tmp/${name}_ref.log" 2>&1; then
        fail "$name" "ref_train.py failed: $(tail -5 "$tmp/${name}_ref.log")"; return
    fi
    local init=$o/initial
    [ -d "$init" ] || init=$HF
    local res
    res=$($PY $REF compare --ours "$o" --ref "$r" --init "$init" --floor-frac $FLOOR \
            --loss-tol $LOSS_TOL --tensor-tol $TENSOR_TOL)
    local rc=$?
    echo "  $name: $res"
    # the run must be the full 20 steps and must have moved the weights
    # (by more than 1e-3 of the largest value, i.e. well past rounding)
    if [ $rc -eq 0 ] && $PY -c "
import json, sys; r = json.loads(sys.argv[1])
sys.exit(0 if r['steps'] == 20 and r['moved_max_rel'] > 1e-3 else 1)" "$res"; then
        pass "$name"
    else
        fail "$name" "$res"
    fi
}

# 1. LoRA on every target of the HF model, weight decay on A and B
run_case lora_hf "$HF" "--weight-decay 0.01" \
    "--lora-r 8 --lora-alpha 16 --lora-dropout 0 --save-initial-adapter" "--init-adapter $tmp/lora_hf/initial"
# 2. full fine-tuning, packed rows (document masks, position resets), decay on
# the matrices (a decay of 0.1 makes a wrong choice of decayed tensors visible)
run_case full_hf "$HF" "--full --weight-decay 0.1" "--pack" ""
# 3. LoRA on the GGUF model: q/k rows are interleaved inside ftune, the saved
# adapters are in HF layout, so the replay on the HF model must agree. rsLoRA
# on a subset of targets that includes q and k.
run_case lora_gguf "$GGUF" "--weight-decay 0.0" \
    "--lora-r 4 --lora-alpha 8 --rslora --lora-targets q,k,v,down --lora-dropout 0 --save-initial-adapter" \
    "--init-adapter $tmp/lora_gguf/initial"
