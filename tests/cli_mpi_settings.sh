#!/usr/bin/env bash
# Ranks started with different settings that change the collective schedule
# (when a rank saves, validates or gathers, and on what sizes) fail before
# step 1, every rank naming the setting and both values, instead of
# deadlocking (--save-every, --consolidate) or failing a collective with
# MPI_ERR_TRUNCATE (--eval-every) at the first step where they part. A rank
# that stops (SIGSTOP) mid-run makes the others give up after --dist-timeout
# seconds, naming the collective, the step and the rank they waited for.
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

expect_error dist_timeout_negative '--dist-timeout -1: expected seconds' \
    "$FT" train "${common[@]}" --zero 0 --steps 1 --dist-timeout -1 -o "$tmp/neg"

# stalled N VICTIM NAME PATTERN: N ranks train (--dist-timeout 5); once step 1 is logged rank VICTIM is
# (wherever it is: inside a step, or at its end, where the per-rank step times are gathered)
# stopped: the job must end non-zero within 5 s + the 2 s the others wait for answers + a few, and
# the output hold PATTERN
stalled() {
    local np=$1 victim=$2 name=$3 pat=$4 job pids pid t0 dt rc
    rm -rf "$tmp/k"
    "${MPI[@]}" -np "$np" "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 3 --lora-dropout 0 --quiet \
        --val-split 0 --steps 1000000 --lr 1e-3 --batch-size "$np" --dist-timeout 5 -o "$tmp/k" > "$tmp/out.txt" 2>&1 &
    job=$!
    for _ in $(seq 200); do [ -s "$tmp/k/metrics.jsonl" ] && break; sleep 0.1; done
    # the ranks in rank order (mpirun starts them so; OMPI_COMM_WORLD_RANK says for sure)
    pid=""
    for p in $(pgrep -P $job -f 'ftune train'); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && pid=$p
    done
    if [ -z "$pid" ]; then fail "$name" "rank $victim not found under mpirun $job"; kill $job; wait $job; return; fi
    kill -STOP "$pid"
    t0=$(date +%s)
    for _ in $(seq 300); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    dt=$(($(date +%s) - t0))
    kill -CONT "$pid" 2> /dev/null
    if kill -0 $job 2> /dev/null; then
        fail "$name" "still running 30 s after rank $victim stopped"; kill -9 $job; wait $job; return
    fi
    wait $job; rc=$?
    echo "the job ended $dt s after rank $victim of $np stopped (exit $rc)"
    [ $rc -ne 0 ] && [ $dt -le 12 ] && grep -q "$pat" "$tmp/out.txt" && pass "$name" ||
        fail "$name" "exit $rc after $dt s: $(cat "$tmp/out.txt")"
}
stalled 2 1 stopped_rank_times_out \
    'rank 0 of 2\]: error: rank 0 timed out after 5 s in [a-z ()-]* (collective call [0-9]*, \(the end of \)\?step [0-9]*), waiting for rank 1, which did not answer'
# 3 ranks: rank 2 stopped; the others give up naming it (one may be a call ahead: its part of the
# stalled one done) and say where the other one waits
stalled 3 2 stopped_rank_of_3_times_out \
    'rank [01] of 3\]: error: rank [01] \(timed out after 5 s\|stopped waiting\).* rank 2, which did not answer.*; rank [01] \(is in\|waited in\)'
exit 0
