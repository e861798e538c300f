#!/usr/bin/env bash
# `ftune plan`: train's arguments (the same parser and the same errors), the
# memory table printed without loading the model; `ftune train` prints the
# plan at start and the peak beside it at the end, and refuses a run over
# --memory-limit before anything is loaded or written.
set -u
FT=${FTUNE:-build/ftune}
D=${FTUNE_DATA:-../shared/data}
HF=$D/models/stories260K-hf
GG=$D/models/stories260K/stories260K.gguf
export OMP_NUM_THREADS=1
tmp=${KEEP_TMP:-$(mktemp -d)}; [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
head -c 4000 "$D/text/tinyshakespeare/input.txt" > "$tmp/data.txt"

# the table, every term and the switches, on stdout
if "$FT" plan -m "$HF" --data "$tmp/data.txt" --batch-size 2 > "$tmp/plan.out" 2> "$tmp/plan.err" &&
    grep -q "weights (mapped, f32)" "$tmp/plan.out" && grep -q "optimizer state" "$tmp/plan.out" &&
    grep -q "activations" "$tmp/plan.out" && grep -q "^  total" "$tmp/plan.out" &&
    grep -q "^  --grad-checkpoint 1 " "$tmp/plan.out" && grep -q "^  --quant nf4 " "$tmp/plan.out" &&
    grep -q "^  --dtype bf16 " "$tmp/plan.out"; then pass plan_table
else fail plan_table "$(cat "$tmp/plan.out" "$tmp/plan.err")"; fi
# a preset: no files at all
if "$FT" plan --preset llama-2-7b --preset-dtype bf16 --dtype bf16 > "$tmp/7b.out" 2>&1 &&
    grep -q "weights (mapped, bf16) *12852.5" "$tmp/7b.out"; then pass plan_preset
else fail plan_preset "$(cat "$tmp/7b.out")"; fi

# the same errors as train: a bad flag, a bad value, a missing model
for args in "--bogus" "-m $HF --lora-targets nope" "-m $tmp/none --data $tmp/data.txt -o $tmp/o" "-m $HF --ctx 100000"; do
    # shellcheck disable=SC2086
    "$FT" plan $args > /dev/null 2> "$tmp/p.err"; rp=$?
    # shellcheck disable=SC2086
    "$FT" train $args --data "$tmp/data.txt" -o "$tmp/err-out" > /dev/null 2> "$tmp/t.err"; rt=$?
    if [ $rp -ne 0 ] && [ $rp -eq $rt ] && diff <(sed 's/ftune plan/ftune X/g' "$tmp/p.err") \
        <(sed 's/ftune train/ftune X/g' "$tmp/t.err") > /dev/null; then pass "same_error ($args)"
    else fail "same_error ($args)" "plan $rp: $(cat "$tmp/p.err") / train $rt: $(cat "$tmp/t.err")"; fi
done
rm -rf "$tmp/err-out"
# a data or validation file that is not there: the plan fails as the run would, naming it
for opt in --data --val; do
    extra=(); [ $opt = --val ] && extra=(--data "$tmp/data.txt")
    "$FT" plan -m "$HF" "${extra[@]}" $opt "$tmp/missing.jsonl" > /dev/null 2> "$tmp/p.err"; rp=$?
    "$FT" train -m "$HF" "${extra[@]}" $opt "$tmp/missing.jsonl" -o "$tmp/err-out" --quiet > /dev/null 2> "$tmp/t.err"; rt=$?
    if [ $rp -eq 1 ] && [ $rt -eq 1 ] && grep -q "error: $tmp/missing.jsonl: cannot open: No such file" "$tmp/p.err" \
        && [ "$(sed 's/ftune plan/ftune X/' "$tmp/p.err")" = "$(sed 's/ftune train/ftune X/' "$tmp/t.err")" ]; then
        pass "plan_missing_file ($opt)"
    else fail "plan_missing_file ($opt)" "plan $rp: $(cat "$tmp/p.err") / train $rt: $(cat "$tmp/t.err")"; fi
done
rm -rf "$tmp/err-out"
# GGUF and llama2.c: planned from a load as stored (the file mapped, nothing of the weights read)
if "$FT" plan -m "$GG" --quant nf4 > "$tmp/gg.out" 2>&1 && grep -q "weights (owned, nf4)" "$tmp/gg.out" &&
    "$FT" plan -m "$D/models/stories260K/stories260K.bin" > "$tmp/bin.out" 2>&1 && grep -q "weights (mapped, f32)" "$tmp/bin.out"; then
    pass plan_gguf_llama2c
else fail plan_gguf_llama2c "$(cat "$tmp/gg.out" "$tmp/bin.out")"; fi
if "$FT" plan --preset llama-9z > /dev/null 2> "$tmp/pr.err"; then fail plan_bad_preset "accepted"
elif grep -q 'unknown preset "llama-9z"' "$tmp/pr.err"; then pass plan_bad_preset
else fail plan_bad_preset "$(cat "$tmp/pr.err")"; fi
if "$FT" train -m "$HF" --preset llama-2-7b --data "$tmp/data.txt" -o "$tmp/o" > /dev/null 2> "$tmp/tp.err"; then
    fail train_preset "accepted"
elif grep -q "are for ftune plan" "$tmp/tp.err" && [ ! -e "$tmp/o" ]; then pass train_preset
else fail train_preset "$(cat "$tmp/tp.err")"; fi

# train: the plan at start, the peak beside it at the end
if "$FT" train -m "$HF" --data "$tmp/data.txt" -o "$tmp/run" --steps 2 -t 1 > "$tmp/run.log" 2>&1 &&
    grep -q "^memory plan: .* MiB at the peak (largest term: " "$tmp/run.log" &&
    grep -q "^peak RSS .* MiB (planned .* MiB: " "$tmp/run.log"; then pass train_prints_plan
else fail train_prints_plan "$(tail -5 "$tmp/run.log")"; fi
if "$FT" train -m "$GG" --data "$tmp/data.txt" -o "$tmp/run-gg" --steps 1 -t 1 > "$tmp/gg.log" 2>&1 &&
    grep -q "^memory plan: .* MiB at the peak" "$tmp/gg.log"; then pass train_gguf_plan
else fail train_gguf_plan "$(tail -5 "$tmp/gg.log")"; fi

# over the limit: refused before loading, the largest term and the best switch named, nothing written
"$FT" train -m "$HF" --data "$tmp/data.txt" -o "$tmp/big" --memory-limit 10 > "$tmp/big.log" 2>&1; rc=$?
if [ $rc -eq 1 ] && [ ! -e "$tmp/big" ] && grep -q "nothing was loaded or written. The largest term is activations" "$tmp/big.log" &&
    grep -q -- "--grad-checkpoint 1 would save the most" "$tmp/big.log"; then pass refuse_over_limit
else fail refuse_over_limit "rc $rc: $(cat "$tmp/big.log"); $(ls "$tmp/big" 2>&1)"; fi
# the largest term of a 7B plan is its weights, and NF4 the switch
"$FT" plan --preset llama-2-7b --preset-dtype bf16 --dtype bf16 --memory-limit 8000 > "$tmp/7bl.out" 2>&1
if grep -q "^does not fit: 16[0-9.]* MiB planned, 8000.0 MiB --memory-limit" "$tmp/7bl.out"; then pass plan_limit
else fail plan_limit "$(tail -2 "$tmp/7bl.out")"; fi
if "$FT" train -m "$HF" --data "$tmp/data.txt" -o "$tmp/o" --memory-limit -3 > /dev/null 2> "$tmp/ml.err"; then
    fail bad_memory_limit "accepted"
elif grep -q -- "--memory-limit -3" "$tmp/ml.err" && [ ! -e "$tmp/o" ]; then pass bad_memory_limit
else fail bad_memory_limit "$(cat "$tmp/ml.err")"; fi
# the ranks mpirun starts on one host share its memory (their mappings once): Open MPI's
# OMPI_COMM_WORLD_LOCAL_SIZE, set here by hand, multiplies the rest of the plan
one=$("$FT" plan -m "$HF" --data "$tmp/data.txt" | sed -n 's/^  total *\([0-9.]*\)$/\1/p')
OMPI_COMM_WORLD_LOCAL_SIZE=4 "$FT" train -m "$HF" --data "$tmp/data.txt" -o "$tmp/four" --memory-limit 1 > "$tmp/four.log" 2>&1
need=$(sed -n 's/.*would need about \([0-9.]*\) MiB at its peak (4 ranks on this host).*/\1/p' "$tmp/four.log")
if [ -n "$need" ] && [ ! -e "$tmp/four" ] && /usr/bin/python3 -c "import sys; o, n = map(float, sys.argv[1:]); sys.exit(0 if 3 * o < n < 4 * o else 1)" "$one" "$need"; then
    pass refuse_ranks_per_host
else fail refuse_ranks_per_host "one rank $one MiB; $(cat "$tmp/four.log")"; fi

# the 8-bit optimizer: full fine-tuning (stories260K's matrices are over bitsandbytes' 4096-element
# minimum, its norms under it), its state per tensor as bitsandbytes sizes it: 2 bytes per element
# and an f32 absmax per 256 from the safetensors header, 8 bytes per element of the small ones
want=$(/usr/bin/python3 - "$HF/model.safetensors" <<'PY'
import json, math, struct, sys
f = open(sys.argv[1], "rb"); h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0])); h.pop("__metadata__", None)
a = b = 0
for v in h.values():
    n = math.prod(v["shape"]); a += 8 * n; b += 2 * n + 8 * math.ceil(n / 256) if n >= 4096 else 8 * n
print(a / 2**20, b / 2**20)
PY
)
"$FT" plan -m "$HF" --full --data "$tmp/data.txt" > "$tmp/f32.out" 2>&1
"$FT" plan -m "$HF" --full --data "$tmp/data.txt" --optim adamw8bit > "$tmp/a8.out" 2>&1
"$FT" plan -m "$HF" --full --data "$tmp/data.txt" --dtype bf16 --optim adamw8bit --paged-optim > "$tmp/pg.out" 2>&1
row() { sed -n "s/^  $2 *\([0-9.-]*\).*/\1/p" "$1" | head -1; }
if [ -n "$want" ] && grep -q "^  --optim adamw8bit  *-[0-9.]*  (total " "$tmp/f32.out" &&
    grep -q "^  --paged-optim  *[0-9.-]*  (total [0-9.]*; [0-9.]* MiB file-backed" "$tmp/f32.out" &&
    /usr/bin/python3 -c "
import sys
wa, w8, oa, o8, sw, ta, t8, pa, p8 = map(float, sys.argv[1:])
# the rows print MiB to 0.1: each is within 0.05 of its value (the saving is one rounded number)
ok = abs(oa - wa) <= 0.05 and abs(o8 - w8) <= 0.05 and abs(-sw - (wa - w8)) <= 0.05
# the two plans' totals differ by the optimizer's saving and by their measured process rows:
# four rounded numbers, 0.2 at most
ok = ok and abs((ta - pa) - (t8 - p8) - (wa - w8)) <= 0.2
sys.exit(0 if ok else 1)" $want "$(row "$tmp/f32.out" "optimizer state (AdamW m, v)")" \
        "$(row "$tmp/a8.out" "optimizer state (AdamW m, v: 8-bit blocks)")" "$(row "$tmp/f32.out" "--optim adamw8bit")" \
        "$(row "$tmp/f32.out" total)" "$(row "$tmp/a8.out" total)" "$(row "$tmp/f32.out" "process (code, libraries: measured)")" \
        "$(row "$tmp/a8.out" "process (code, libraries: measured)")"; then pass plan_adamw8bit
else fail plan_adamw8bit "want $want: $(cat "$tmp/f32.out" "$tmp/a8.out")"; fi
# --paged-optim: the state and (bf16 with compute copies) the f32 masters in the paged row, counted as resident
if grep -q "^  paged (file-backed): AdamW m, v; f32 masters " "$tmp/pg.out" && ! grep -q "^  trainables" "$tmp/pg.out" &&
    ! grep -q "^  optimizer state" "$tmp/pg.out" && grep -q "^the paged bytes count as resident" "$tmp/pg.out"; then
    pass plan_paged_optim
else fail plan_paged_optim "$(cat "$tmp/pg.out")"; fi
