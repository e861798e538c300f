#!/usr/bin/env bash
# `ftune plan --world N --zero S` against `mpirun -np N ftune train` with the same arguments on
# stories260K (LoRA and full, ZeRO 0-3, gradient accumulation, --grad-checkpoint, --overlap,
# uneven shards): the bytes each rank sends per step (the dist layer's ring model, counted as the
# collectives run) are exactly the plan's, and the plan's per-rank trainables, gradients and
# optimizer state rows are the memory table's allocated rows (rank 0's, in the 0.1 MiB both print).
set -u
. "$(dirname "$0")/lib.sh"
bad=0
fail() { echo "FAIL $1: $2"; bad=1; }

if ! command -v mpirun > /dev/null; then
    skip_or_fail plan_world tool "mpirun not found (scripts/setup.sh installs Open MPI)"; exit
fi
if ! ldd "$FT" 2>/dev/null | grep -q libmpi; then
    skip_or_fail plan_world tool "$FT is built without MPI (make MPI=1, with scripts/setup.sh's Open MPI)"; exit
fi
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo)

for i in 1 2 3 4 5 6 7 8; do
    echo "{\"text\": \"Once upon a time, there was a little cat number $i. It liked to play with a red ball in the sun.\"}"
done > "$tmp/d.jsonl"

# a row's value in the plan ("  gradients   0.7") and in train's memory table (its peak column)
plan_row() { grep -E "^  $2( \(|  )" "$1" | head -1 | awk '{print $NF}'; }
train_row() { grep -E "^$2 " "$1" | head -1 | awk '{print $NF}'; }

check() {  # name ranks args...
    local name=$1 n=$2; shift 2
    local args=(-m "$HF" --data "$tmp/d.jsonl" --ctx 32 -t 1 --seed 3 --lora-dropout 0 --val-split 0 "$@")
    if ! "$FT" plan "${args[@]}" --world "$n" > "$tmp/plan.txt" 2>&1; then fail "$name" "$(cat "$tmp/plan.txt")"; return; fi
    if ! timeout 120 "${MPI[@]}" -np "$n" "$FT" train "${args[@]}" --steps 2 -o "$tmp/out" --overwrite \
        > "$tmp/train.txt" 2>&1; then fail "$name" "$(tail -5 "$tmp/train.txt")"; return; fi
    local planned sent
    planned=$(grep -E '^  sent ' "$tmp/plan.txt" | sed -E 's/.*\(([0-9]+) bytes\).*/\1/')
    sent=$(grep -E '^communication per step and rank' "$tmp/train.txt" | sed -E 's/.*; ([0-9]+) bytes\).*/\1/')
    # one rank sends nothing (and train prints no line)
    [ "$n" -eq 1 ] && sent=${sent:-0}
    if [ -z "$planned" ] || [ "$planned" != "$sent" ]; then
        fail "$name" "planned $planned bytes per step and rank, train sent ${sent:-none}"; return
    fi
    local row p t
    for row in trainables gradients "optimizer state"; do
        p=$(plan_row "$tmp/plan.txt" "$row"); t=$(train_row "$tmp/train.txt" "$row")
        if [ -z "$p" ] || [ "$p" != "$t" ]; then fail "$name" "$row: planned ${p:-none} MiB, allocated ${t:-none} MiB"; return; fi
    done
    pass "$name ($sent bytes per step and rank; gradients $(plan_row "$tmp/plan.txt" gradients) MiB)"
}

check lora_np1_zero2 1 --zero 2 --batch-size 2
check full_np1_zero3 1 --full --zero 3 --batch-size 2
for z in 0 1 2 3; do
    check "lora_np2_zero$z" 2 --zero $z --batch-size 2
    check "full_np2_zero$z" 2 --full --zero $z --batch-size 2 --grad-accum 2
done
check full_np4_zero1 4 --full --zero 1 --batch-size 4
check full_np4_zero2_overlap 4 --full --zero 2 --batch-size 4 --grad-accum 2 --overlap
check full_np4_zero3_checkpoint 4 --full --zero 3 --batch-size 4 --grad-checkpoint 2
check lora_np4_zero3 4 --zero 3 --batch-size 4 --grad-accum 2

# the time model: at 8 Gbit/s with no latency a step takes its bytes / 1e9 seconds; a latency adds
# (N-1) per reduce-scatter / all-gather and 2(N-1) per all-reduce (3 decimals: what the plan prints)
if "$FT" plan -m "$HF" --full --zero 3 --world 4 --batch-size 4 --ctx 32 --net-gbps 8 > "$tmp/t0.txt" 2>&1 &&
   "$FT" plan -m "$HF" --full --zero 3 --world 4 --batch-size 4 --ctx 32 --net-gbps 8 --net-latency-us 1000 > "$tmp/t1.txt" 2>&1; then
    b=$(grep -E '^  sent ' "$tmp/t0.txt" | sed -E 's/.*\(([0-9]+) bytes\).*/\1/')
    t0=$(grep 'communication time per step' "$tmp/t0.txt" | awk '{print $5}')
    t1=$(grep 'communication time per step' "$tmp/t1.txt" | awk '{print $5}')
    calls=$(grep -E '^  (reduce-scatter|all-gather) \(' "$tmp/t1.txt" | sed -E 's/.*\(([0-9]+) calls\).*/\1/' |
            awk '{ n += $1 } END { print n }')
    want0=$(awk -v b="$b" 'BEGIN { printf "%.6f", b / 1e9 }')
    want1=$(awk -v b="$b" -v n="$calls" 'BEGIN { printf "%.6f", b / 1e9 + n * 3 * 0.001 }')
    if [ -n "$b" ] && awk -v a="$t0" -v w="$want0" -v c="$t1" -v x="$want1" \
        'BEGIN { exit !((a - w < 0.0011 && w - a < 0.0011) && (c - x < 0.0011 && x - c < 0.0011)) }'; then
        pass "time_model ($t0 s, with $calls collectives of 3 hops at 1 ms: $t1 s)"
    else fail time_model "$b bytes, $calls collectives: $t0 s (want $want0), $t1 s (want $want1)"; fi
else fail time_model "$(cat "$tmp/t0.txt" "$tmp/t1.txt")"; fi

# refusals: the run's, and the flags' own
refuse() {  # name pattern args...
    local name=$1 pat=$2; shift 2
    if "$FT" "$@" > "$tmp/r.txt" 2>&1; then fail "$name" "exit 0: $(cat "$tmp/r.txt")"
    elif grep -q -- "$pat" "$tmp/r.txt"; then pass "$name"; else fail "$name" "$(cat "$tmp/r.txt")"; fi
}
refuse overlap_needs_zero2 "give --zero 2 or 3" plan -m "$HF" --overlap --zero 1 --world 2 --batch-size 2
refuse latency_needs_rate "needs --net-gbps" plan -m "$HF" --net-latency-us 5
refuse bad_rate "expected a positive rate" plan -m "$HF" --net-gbps 0
refuse world_is_plans "are ftune plan's" train -m "$HF" --data "$tmp/d.jsonl" -o "$tmp/x" --world 2
exit $bad
