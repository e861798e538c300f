#!/usr/bin/env bash
# Ranks started with different settings that change the collective schedule
# (when a rank saves, validates or gathers, and on what sizes) fail before
# step 1, every rank naming the setting and both values, instead of
# deadlocking (--save-every, --consolidate) or failing a collective with
# MPI_ERR_TRUNCATE (--eval-every) at the first step where they part.
set -u
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mpi_lib.sh"

stories_jsonl "$tmp/d.jsonl"
# full fine-tuning at ZeRO 1 on 2 ranks: sharded checkpoints, where --consolidate changes the collectives
common=(-m "$HF" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 3 --lora-dropout 0 --quiet --full --zero 1 --steps 6 --lr 1e-3 --batch-size 4)

# differ NAME PATTERN "RANK0 ARGS" "RANK1 ARGS": both ranks fail, fast (30 s is a hang), each naming the setting
differ() {
    local name=$1 pat=$2 a=$3 b=$4 t0 rc dt
    rm -rf "$tmp/o"
    t0=$(date +%s)
    # shellcheck disable=SC2086 # the ranks' extra arguments are words
    timeout 30 "${MPI[@]}" -np 1 "$FT" train "${common[@]}" $a -o "$tmp/o" : -np 1 "$FT" train "${common[@]}" $b \
        -o "$tmp/o" > "$tmp/out.txt" 2>&1
    rc=$? dt=$(($(date +%s) - t0))
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
       [ "$(grep -c "rank [01] of 2\]: error: rank 1 was started differently from rank 0: $pat" "$tmp/out.txt")" = 2 ]; then
        pass "$name"
    else fail "$name" "exit $rc after $dt s: $(cat "$tmp/out.txt")"; fi
}
v="--val-split 0.2"
differ save_every_differs 'save_every is 3 on rank 0 and 2 on rank 1' "$v --save-every 3" "$v --save-every 2"
differ eval_every_differs 'eval_every is 3 on rank 0 and 2 on rank 1' "$v --eval-every 3" "$v --eval-every 2"
differ consolidate_differs 'consolidate is false on rank 0 and true on rank 1' "$v --save-every 3" \
    "$v --save-every 3 --consolidate"
# validation files of as many examples, one of them changed: the same batches, other tokens
sed 's/little cat/little dog/' "$tmp/d.jsonl" > "$tmp/v.jsonl"
differ validation_data_differs 'data\.val_fingerprint is "[0-9a-f]*" on rank 0 and "[0-9a-f]*" on rank 1' \
    "--val $tmp/d.jsonl" "--val $tmp/v.jsonl"
exit 0
