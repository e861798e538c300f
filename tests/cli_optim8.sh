#!/usr/bin/env bash
# `ftune train --optim adamw8bit` and `--paged-optim` end to end on
# stories260K: the 200-step LoRA curve and a 50-step full fine-tuning curve
# of 8-bit AdamW beside f32 AdamW's (printed), their final validation losses
# within a stated tolerance; LoRA tensors all under 4096 elements are on f32
# state, so r=8 is bit-identical to adamw; paged state gives the same bits;
# checkpoints of 8-bit state resume bit for bit; bad options and a
# checkpoint of the other optimizer give clear errors.
set -u
. "$(dirname "$0")/lib.sh"
# one thread: bit-exact comparisons need the same reduction order in every run
export OMP_NUM_THREADS=1

# Shakespeare is not what stories260K was trained on: the loss has far to fall
head -c 200000 "$D/text/tinyshakespeare/input.txt" > "$tmp/train.txt"
tail -c 20000 "$D/text/tinyshakespeare/input.txt" > "$tmp/val.txt"
train() { "$FT" train -m "$HF" --data "$tmp/train.txt" --val "$tmp/val.txt" --ctx 64 --batch-size 4 -t 1 --quiet "$@"; }
lora=(--lora-r 64 --lora-alpha 64 --lora-dropout 0 --lr 2e-3)
losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }

# 1. the curves. Tolerance on the final validation loss: 0.5% of it. A
# different data seed moves this run's final loss by about 1.2% (3.297 with
# seed 0 or 1, 3.259 with seed 2), so 0.5% is well inside the run-to-run
# noise of training itself; 8-bit AdamW measured 0.02% on both. At r=64
# every LoRA tensor but k and v's B (32 x 64) has 4096 elements or more, so
# nearly all of the state is 8-bit.
curve() {  # name, steps, args...
    local name=$1 n=$2; shift 2
    local ok=1
    for opt in adamw adamw8bit; do
        train -o "$tmp/$name-$opt" --steps "$n" --eval-every "$((n / 4))" --optim "$opt" "$@" 2> "$tmp/err.txt" \
            || { fail "${name}_curve" "--optim $opt: $(cat "$tmp/err.txt")"; ok=0; }
    done
    [ $ok = 1 ] || return
    $PY - "$tmp/$name-adamw/metrics.jsonl" "$tmp/$name-adamw8bit/metrics.jsonl" "$name" <<'EOF' \
        && pass "${name}_curve_within_tolerance" || fail "${name}_curve_within_tolerance" "see the curves above"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
print(f"{sys.argv[3]}: step  adamw loss  adamw8bit loss  (val)")
every = max(1, len(a) // 20)
for x, y in zip(a, b):
    if x["step"] % every == 0 or "val_loss" in x:
        v = f"   val {x['val_loss']:.4f} {y['val_loss']:.4f}" if "val_loss" in x else ""
        print(f"  {x['step']:4d}  {x['loss']:.4f}  {y['loss']:.4f}{v}")
va, vb = a[-1]["val_loss"], b[-1]["val_loss"]
rel = abs(vb - va) / va
print(f"{sys.argv[3]}: final val loss adamw {va:.5f}, adamw8bit {vb:.5f}: {100 * rel:.3f}% apart (tolerance 0.5%)")
sys.exit(0 if len(a) == len(b) and rel <= 0.005 and vb < a[0]["loss"] else 1)
EOF
}
curve lora 200 "${lora[@]}"
curve full 50 --full --lr 1e-3

# 2. the optimizer row: 8-bit state is about a quarter of f32's (1 byte per
# element and 4 per 256-block for m and v each, instead of 4 + 4)
row() { "$FT" train -m "$HF" --data "$tmp/train.txt" --val-split 0 --ctx 64 -t 1 --steps 1 --full --optim "$1" \
        -o "$tmp/row-$1" 2>&1 | grep '^optimizer state  '; }
r32=$(row adamw) r8=$(row adamw8bit)
$PY - "$r32" "$r8" <<'EOF' && pass optimizer_row_8bit || fail optimizer_row_8bit "adamw: $r32; adamw8bit: $r8"
import sys
p32, p8 = float(sys.argv[1].split()[2]), float(sys.argv[2].split()[2])
print(f"optimizer state, full fine-tuning: adamw {p32} MiB, adamw8bit {p8} MiB")
sys.exit(0 if 0.2 < p8 / p32 < 0.35 else 1)
EOF

# 3. r=8: every LoRA tensor has fewer than 4096 elements (bitsandbytes'
# min_8bit_size), so 8-bit AdamW keeps f32 state for all and is adamw's bits
train -o "$tmp/r8a" --steps 20 --optim adamw --lr 2e-3 2> "$tmp/err.txt" \
    && train -o "$tmp/r8b" --steps 20 --optim adamw8bit --lr 2e-3 2>> "$tmp/err.txt" \
    && [ "$(losses "$tmp/r8a/metrics.jsonl")" = "$(losses "$tmp/r8b/metrics.jsonl")" ] \
    && cmp -s "$tmp/r8a/adapter_model.safetensors" "$tmp/r8b/adapter_model.safetensors" \
    && pass small_tensors_f32_state || fail small_tensors_f32_state "$(cat "$tmp/err.txt")"

# 4. paged state: the same bits as in memory, its own row in the memory table
train -o "$tmp/pg" --steps 20 --optim adamw8bit "${lora[@]}" 2> "$tmp/err.txt" \
    && "$FT" train -m "$HF" --data "$tmp/train.txt" --val "$tmp/val.txt" --ctx 64 --batch-size 4 -t 1 --steps 20 \
        --optim adamw8bit "${lora[@]}" --paged-optim -o "$tmp/pg2" > "$tmp/out.txt" 2>&1 \
    && [ "$(losses "$tmp/pg/metrics.jsonl")" = "$(losses "$tmp/pg2/metrics.jsonl")" ] \
    && cmp -s "$tmp/pg/adapter_model.safetensors" "$tmp/pg2/adapter_model.safetensors" \
    && grep -q '^paged (file-backed) ' "$tmp/out.txt" \
    && pass paged_same_bits || fail paged_same_bits "$(cat "$tmp/err.txt" "$tmp/out.txt" | tail -20)"
ls -A "$tmp/pg2" | grep -q ftune-paged && fail paged_file_unlinked "a state file was left in the output" \
    || pass paged_file_unlinked

# 4b. full fine-tuning in bf16: the f32 masters, which only the optimizer
# and the bf16 copies' refresh read, are paged too (in f32 the forward reads
# the masters themselves, so they stay in memory); the same bits
full_bf16() { "$FT" train -m "$HF" --data "$tmp/train.txt" --val-split 0 --ctx 64 --batch-size 4 -t 1 --steps 10 \
              --full --dtype bf16 --lr 1e-3 --optim adamw8bit "$@"; }
full_bf16 -o "$tmp/fb" > "$tmp/fb.txt" 2>&1 && full_bf16 --paged-optim -o "$tmp/fb2" > "$tmp/fb2.txt" 2>&1 \
    && cmp -s "$tmp/fb/model.safetensors" "$tmp/fb2/model.safetensors" \
    && $PY - "$tmp/fb.txt" "$tmp/fb2.txt" <<'EOF' && pass paged_masters_bf16 || fail paged_masters_bf16 "$(tail -16 "$tmp/fb2.txt")"
import sys
def rows(path):  # the memory table's planned column, by row name
    out = {}
    for l in open(path):
        name, rest = l[:28].strip(), l[28:].split()
        if name and len(rest) == 3:
            try: out[name] = float(rest[0])
            except ValueError: pass
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print(f"full bf16, planned MiB: in memory: trainables {a['trainables']}, optimizer {a['optimizer state']}; "
      f"paged: trainables {b['trainables']}, optimizer {b['optimizer state']}, paged {b['paged (file-backed)']}")
sys.exit(0 if b['trainables'] == 0 and b['optimizer state'] == 0 and
         abs(b['paged (file-backed)'] - a['trainables'] - a['optimizer state']) <= 0.1 else 1)
EOF

# 5. resume is bit-exact with 8-bit state (LoRA and full): 10 steps against
# 5, a checkpoint, and 5 more
for mode in lora full; do
    if [ $mode = lora ]; then args=("${lora[@]}" --lora-dropout 0.1); else args=(--full --lr 1e-3); fi
    train -o "$tmp/u-$mode" --steps 10 --optim adamw8bit "${args[@]}" 2> "$tmp/err.txt" \
        && train -o "$tmp/h-$mode" --steps 10 --optim adamw8bit "${args[@]}" --save-every 5 2>> "$tmp/err.txt" \
        && train -o "$tmp/h-$mode" --steps 10 --optim adamw8bit "${args[@]}" \
            --resume "$tmp/h-$mode/checkpoint-5" --paged-optim 2>> "$tmp/err.txt"
    rc=$?
    a=$(losses "$tmp/u-$mode/metrics.jsonl" 2>/dev/null) b=$(losses "$tmp/h-$mode/metrics.jsonl" 2>/dev/null)
    out=adapter_model.safetensors; [ $mode = full ] && out=model.safetensors
    [ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$tmp/u-$mode/$out" "$tmp/h-$mode/$out" \
        && pass "resume_8bit_bit_exact_$mode" || fail "resume_8bit_bit_exact_$mode" "rc $rc; $a vs $b; $(cat "$tmp/err.txt")"
done
$PY -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
ok = h['__metadata__']['opt.kind'] == 'adamw8bit' and any(k.startswith('opt.m8.absmax.') for k in h) \
     and all(h[k]['dtype'] == 'U8' for k in h if k.startswith('opt.m8.') and '.absmax.' not in k)
sys.exit(0 if ok else 1)" "$tmp/h-lora/checkpoint-5/optimizer.safetensors" \
    && pass checkpoint_holds_codes_and_absmax || fail checkpoint_holds_codes_and_absmax "optimizer.safetensors"

# 6. a checkpoint resumed with the other optimizer: a clear error
train -o "$tmp/h-lora" --steps 10 --optim adamw "${lora[@]}" --lora-dropout 0.1 --resume "$tmp/h-lora/checkpoint-5" \
    2> "$tmp/err.txt"
rc=$?
[ $rc -ne 0 ] && grep -q 'saved by --optim adamw8bit, this run uses --optim adamw' "$tmp/err.txt" \
    && pass resume_other_optim_refused || fail resume_other_optim_refused "rc $rc: $(cat "$tmp/err.txt")"

# 7. bad options
train -o "$tmp/e1" --steps 1 --optim adam 2> "$tmp/err.txt"
rc=$?
[ $rc -ne 0 ] && grep -q 'unknown optimizer "adam" (adamw, adamw8bit)' "$tmp/err.txt" \
    && pass unknown_optim || fail unknown_optim "rc $rc: $(cat "$tmp/err.txt")"
train -o "$tmp/e2" --steps 1 --paged-optim --paged-dir "$tmp/no-such-dir" 2> "$tmp/err.txt"
rc=$?
[ $rc -ne 0 ] && grep -q "cannot create a file in $tmp/no-such-dir" "$tmp/err.txt" \
    && pass paged_dir_missing || fail paged_dir_missing "rc $rc: $(cat "$tmp/err.txt")"
train -o "$tmp/e3" --steps 1 --paged-dir "$tmp" 2> "$tmp/err.txt"
rc=$?
[ $rc -ne 0 ] && grep -q 'give --paged-optim too' "$tmp/err.txt" \
    && pass paged_dir_without_paged || fail paged_dir_without_paged "rc $rc: $(cat "$tmp/err.txt")"
train -o "$tmp/e4" --steps 1 --optim adamw8bit --zero 1 2> "$tmp/err.txt"
rc=$?
[ $rc -ne 0 ] && grep -q 'adamw8bit with --zero 1 is not implemented' "$tmp/err.txt" \
    && pass zero1_8bit_refused || fail zero1_8bit_refused "rc $rc: $(cat "$tmp/err.txt")"
exit 0
