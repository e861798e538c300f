#!/usr/bin/env bash
# `mpirun -np N ftune train` on stories260K (and LoRA on the llama-110m preset), oversubscribed on loopback: with
# the same global batch, 2 and 4 ranks give the per-step losses (and
# validation losses) of one process, LoRA and full, ZeRO 0 and 1, with
# gradient accumulation; only rank 0 writes, and what it writes is the
# one-process result; a checkpoint resumes on another rank count and stage;
# bad launches (a batch that does not split, ranks started differently) fail
# every rank with a message naming the rank; SIGUSR1 to mpirun checkpoints
# and stops every rank; a rank killed with SIGKILL mid-run ends the whole
# job within seconds.
set -u
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mpi_lib.sh"

stories_jsonl "$tmp/d.jsonl"

# dropout 0 in most runs (the curves then test the reductions alone); a
# rank draws the one-process run's dropout masks for its rows of the global
# batch (seeded by the row's index in it), which lora_dropout_* checks
common=(-m "$HF" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 3 --lora-dropout 0 --val-split 0.2 --eval-every 2 --quiet)

# 1. LoRA, global batch 4, 2 micro-batches per step: 1 process, then 2 and 4 ranks at ZeRO 0 and 1
lora=("${common[@]}" --steps 6 --lr 1e-2 --batch-size 4 --grad-accum 2)
"$FT" train "${lora[@]}" -o "$tmp/l1" 2> "$tmp/err.txt" || fail lora_one_process "$(cat "$tmp/err.txt")"
for n in 2 4; do
    for z in 0 1; do
        if run_mpi $n "$FT" train "${lora[@]}" --zero $z -o "$tmp/l$n.$z" > "$tmp/out.txt" 2>&1; then
            same_curve "lora_np${n}_zero${z}_losses" "$tmp/l1/metrics.jsonl" "$tmp/l$n.$z/metrics.jsonl"
        else fail "lora_np${n}_zero${z}" "$(tail -20 "$tmp/out.txt")"; fi
    done
done
same_output lora_np4_zero1_adapter_is_whole "$tmp/l1" "$tmp/l4.1" -m "$HF" --adapter
# with dropout 0.1: the same masks on 2 and 3 ranks (3: uneven shares, and a
# rank with no rows in the epoch's short last batch) as in one process
drop=("${lora[@]}" --lora-dropout 0.1 --batch-size 6 --steps 4)
"$FT" train "${drop[@]}" -o "$tmp/d1" 2> "$tmp/err.txt" || fail lora_dropout_one_process "$(cat "$tmp/err.txt")"
for n in 2 3; do
    if run_mpi $n "$FT" train "${drop[@]}" --zero 1 -o "$tmp/d$n" > "$tmp/out.txt" 2>&1; then
        same_curve "lora_dropout_np${n}_losses" "$tmp/d1/metrics.jsonl" "$tmp/d$n/metrics.jsonl"
    else fail "lora_dropout_np${n}" "$(tail -20 "$tmp/out.txt")"; fi
done
# only rank 0 printed: one START summary, not four
[ "$(run_mpi 4 "$FT" train "${lora[@]}" --steps 1 --overwrite -o "$tmp/l4.q" 2>&1 >/dev/null | grep -c '^data:')" = 0 ] &&
    pass quiet_is_quiet_on_every_rank || fail quiet_is_quiet_on_every_rank "a rank printed"
loud=("${common[@]:0:${#common[@]}-1}") # without --quiet
run_mpi 4 "$FT" train "${loud[@]}" --batch-size 4 --steps 1 --overwrite -o "$tmp/l4.q" > "$tmp/out.txt" 2>&1
[ "$(grep -c '^data:' "$tmp/out.txt")" = 1 ] && pass only_rank0_prints || fail only_rank0_prints "$(cat "$tmp/out.txt")"

# 2. full fine-tuning: 2 ranks ZeRO 1 and 4 ranks ZeRO 0 against one process; the model written is whole
full=("${common[@]}" --full --steps 4 --lr 1e-3 --batch-size 4 --grad-accum 2)
"$FT" train "${full[@]}" -o "$tmp/f1" 2> "$tmp/err.txt" || fail full_one_process "$(cat "$tmp/err.txt")"
for nz in "2 1" "4 0"; do
    set -- $nz
    if run_mpi $1 "$FT" train "${full[@]}" --zero $2 -o "$tmp/f$1" > "$tmp/out.txt" 2>&1; then
        same_curve "full_np$1_zero$2_losses" "$tmp/f1/metrics.jsonl" "$tmp/f$1/metrics.jsonl"
    else fail "full_np$1_zero$2" "$(tail -20 "$tmp/out.txt")"; fi
done
same_output full_np2_zero1_model_is_whole "$tmp/f1" "$tmp/f2" -m

# 3. a checkpoint from 2 ranks at ZeRO 1 resumes on 1 process, and on 4 ranks at ZeRO 0, continuing the curve
# (each in a copy of the run: a checkpoint resumes only into its own run's directory)
ck=("${common[@]}" --steps 6 --lr 1e-2 --batch-size 4 --save-every 3)
if run_mpi 2 "$FT" train "${ck[@]}" --zero 1 -o "$tmp/c2" > "$tmp/out.txt" 2>&1 && [ -d "$tmp/c2/checkpoint-3" ]; then
    cp -r "$tmp/c2" "$tmp/c2r1"; cp -r "$tmp/c2" "$tmp/c2r4"
    "$FT" train "${ck[@]}" --resume "$tmp/c2r1/checkpoint-3" -o "$tmp/c2r1" 2> "$tmp/err.txt" &&
        same_curve resume_np2_zero1_on_one_process "$tmp/c2/metrics.jsonl" "$tmp/c2r1/metrics.jsonl" 4 ||
        fail resume_np2_zero1_on_one_process "$(cat "$tmp/err.txt")"
    run_mpi 4 "$FT" train "${ck[@]}" --zero 0 --resume "$tmp/c2r4/checkpoint-3" -o "$tmp/c2r4" > "$tmp/out.txt" 2>&1 &&
        same_curve resume_np2_zero1_on_np4_zero0 "$tmp/c2/metrics.jsonl" "$tmp/c2r4/metrics.jsonl" 4 ||
        fail resume_np2_zero1_on_np4_zero0 "$(tail -20 "$tmp/out.txt")"
    "$FT" train "${ck[@]}" -o "$tmp/c1" 2> "$tmp/err.txt" &&
        same_curve checkpointed_np2_zero1_is_one_process "$tmp/c1/metrics.jsonl" "$tmp/c2/metrics.jsonl" ||
        fail checkpointed_np2_zero1_is_one_process "$(cat "$tmp/err.txt")"
else fail checkpoint_np2_zero1 "$(tail -20 "$tmp/out.txt")"; fi

# 3a. 3 ranks (uneven shards: the trainables do not divide by 3) with 10 KiB buckets, so that every
#     collective and the checkpoint's gather and the resume's scatter run in many rounds
odd=("${common[@]}" --steps 4 --lr 1e-2 --batch-size 3 --save-every 2)
if "$FT" train "${odd[@]}" -o "$tmp/o1" 2> "$tmp/err.txt" &&
   run_mpi 3 "$FT" train "${odd[@]}" --zero 1 --bucket-mb 0.01 -o "$tmp/o3" > "$tmp/out.txt" 2>&1 &&
   cp -r "$tmp/o3" "$tmp/o3r" &&
   run_mpi 3 "$FT" train "${odd[@]}" --zero 1 --bucket-mb 0.01 --resume "$tmp/o3r/checkpoint-2" -o "$tmp/o3r" >> "$tmp/out.txt" 2>&1; then
    same_curve np3_zero1_small_buckets "$tmp/o1/metrics.jsonl" "$tmp/o3/metrics.jsonl"
    same_curve np3_zero1_small_buckets_resume "$tmp/o1/metrics.jsonl" "$tmp/o3r/metrics.jsonl" 3
else fail np3_zero1_small_buckets "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi

# 3b. with the loss scaler on (dynamic, f32: nothing overflows), across a resume from 2 ranks to 4
ls=("${ck[@]}" --loss-scale dynamic)
if "$FT" train "${ls[@]}" -o "$tmp/s1" 2> "$tmp/err.txt" &&
   run_mpi 2 "$FT" train "${ls[@]}" --zero 1 -o "$tmp/s2" > "$tmp/out.txt" 2>&1 &&
   cp -r "$tmp/s2" "$tmp/s4" && run_mpi 4 "$FT" train "${ls[@]}" --resume "$tmp/s4/checkpoint-3" -o "$tmp/s4" >> "$tmp/out.txt" 2>&1; then
    same_curve loss_scaler_np2_zero1_is_one_process "$tmp/s1/metrics.jsonl" "$tmp/s2/metrics.jsonl"
    same_curve loss_scaler_resume_np2_on_np4 "$tmp/s1/metrics.jsonl" "$tmp/s4/metrics.jsonl" 4
    grep -q '"loss_scale":65536,"skipped_steps":0' "$tmp/s4/metrics.jsonl" && pass loss_scaler_state_on_every_rank ||
        fail loss_scaler_state_on_every_rank "$(cat "$tmp/s4/metrics.jsonl")"
else fail loss_scaler_runs "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi

# 4. bad launches: every rank fails (non-zero, no hang) and says which rank it is
run_mpi 2 "$FT" train "${lora[@]}" --batch-size 3 -o "$tmp/b3" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank [01] of 2\].*--batch-size 3.*does not split evenly over 2 ranks' "$tmp/out.txt" &&
    pass batch_not_divisible || fail batch_not_divisible "exit $rc: $(cat "$tmp/out.txt")"
timeout 120 "${MPI[@]}" -np 1 "$FT" train "${lora[@]}" -o "$tmp/b4" : -np 1 "$FT" train "${lora[@]}" --lr 2e-2 -o "$tmp/b4" \
    > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank 1 was started differently from rank 0: lr is 0.01 on rank 0 and 0.02 on rank 1' "$tmp/out.txt" &&
    pass ranks_started_differently || fail ranks_started_differently "exit $rc: $(cat "$tmp/out.txt")"
echo "an extra example" | sed 's/.*/{"text": "&"}/' | cat "$tmp/d.jsonl" - > "$tmp/d2.jsonl"
timeout 120 "${MPI[@]}" -np 1 "$FT" train "${lora[@]}" -o "$tmp/b5" : -np 1 "$FT" train "${lora[@]}" --data "$tmp/d2.jsonl" \
    -o "$tmp/b5" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank 1 was started differently from rank 0: data\.' "$tmp/out.txt" &&
    pass ranks_given_different_data || fail ranks_given_different_data "exit $rc: $(cat "$tmp/out.txt")"
# one rank alone fails (its data file is missing): its error names the rank and the file, and the job ends
timeout 120 "${MPI[@]}" -np 1 "$FT" train "${lora[@]}" -o "$tmp/b7" : -np 1 "$FT" train "${lora[@]}" --data "$tmp/absent.jsonl" \
    -o "$tmp/b7" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'rank 1 of 2\]: error: .*absent.jsonl' "$tmp/out.txt" &&
    pass one_rank_fails_alone || fail one_rank_fails_alone "exit $rc: $(cat "$tmp/out.txt")"

# 5. the llama-110m preset (random bf16 weights, Llama 2's tokenizer), LoRA: 2 ranks at ZeRO 1 and 3, 4 at ZeRO 0 and 2
#    equal one process (full fine-tuning of it, ~2 GB a rank, is measured in BENCHMARKS.md, not here)
if "$FT" init --preset llama-110m --dtype bf16 "$tmp/m110" > /dev/null 2> "$tmp/err.txt" &&
   "$FT" merge -m "$tmp/m110" -o "$tmp/m110.gguf" --tokenizer "$D/tokenizers/llama2/tokenizer.model" > /dev/null 2>> "$tmp/err.txt"; then
    rm -rf "$tmp/m110"
    big=(-m "$tmp/m110.gguf" --data "$tmp/d.jsonl" --ctx 16 -t 1 --quiet --seed 2 --lora-dropout 0 --val-split 0
         --steps 2 --lr 1e-3 --batch-size 4)
    "$FT" train "${big[@]}" -o "$tmp/b1" 2> "$tmp/err.txt" || fail llama110m_one_process "$(cat "$tmp/err.txt")"
    for nz in "2 1" "4 0" "2 3" "4 2"; do
        set -- $nz
        if run_mpi $1 "$FT" train "${big[@]}" --zero $2 -o "$tmp/b$1.$2" > "$tmp/out.txt" 2>&1; then
            same_curve "llama110m_lora_np$1_zero$2_losses" "$tmp/b1/metrics.jsonl" "$tmp/b$1.$2/metrics.jsonl"
        else fail "llama110m_lora_np$1_zero$2" "$(tail -20 "$tmp/out.txt")"; fi
    done
    rm -f "$tmp/m110.gguf"
else fail llama110m_model "$(cat "$tmp/err.txt")"; fi

# 6. the job's Ctrl-C: SIGUSR1 to mpirun (forwarded to every rank) stops all ranks after the same step;
#    rank 0 saves a whole checkpoint that the others wait for, and the job ends without MPI_Abort
"${MPI[@]}" -np 2 "$FT" train "${common[@]}" --steps 100000 --lr 1e-3 --batch-size 4 --zero 1 -o "$tmp/u" > "$tmp/out.txt" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$tmp/u/metrics.jsonl" ] && break; sleep 0.1; done
kill -USR1 $job
for _ in $(seq 300); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
if kill -0 $job 2> /dev/null; then fail sigusr1_checkpoints "still running 30 s after SIGUSR1"; kill -9 $job; wait $job
else
    wait $job; rc=$?
    ck=$(ls -d "$tmp/u"/checkpoint-* 2> /dev/null | head -1)
    [ $rc -ne 0 ] && [ -n "$ck" ] && [ -s "$ck/trainer_state.json" ] && [ -s "$ck/optimizer.safetensors" ] &&
        grep -q 'rank 0 of 2\]: error: interrupted after step' "$tmp/out.txt" && ! grep -q MPI_ABORT "$tmp/out.txt" &&
        pass sigusr1_checkpoints_and_stops || fail sigusr1_checkpoints_and_stops "exit $rc, $ck: $(cat "$tmp/out.txt")"
fi

# 7. kill -9 one rank mid-run: the job ends within seconds, non-zero, and says what happened
long=("${common[@]}" --steps 100000 --lr 1e-3 --batch-size 4 --val-split 0)
"${MPI[@]}" -np 2 "$FT" train "${long[@]}" -o "$tmp/k" > "$tmp/out.txt" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$tmp/k/metrics.jsonl" ] && break; sleep 0.1; done
victim=$(pgrep -P $job -f 'ftune train' | tail -1)
if [ -z "$victim" ]; then fail kill9_one_rank "no rank process found under mpirun $job"; kill $job; wait $job
else
    kill -9 "$victim"
    t0=$(date +%s.%N)
    for _ in $(seq 300); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
    if kill -0 $job 2> /dev/null; then fail kill9_one_rank "mpirun still running 30 s after a rank was killed"; kill -9 $job
    else
        wait $job; rc=$?
        dt=$($PY -c "import time; print('%.1f' % (time.time() - $t0))")
        echo "the job ended ${dt} s after kill -9 of one rank (exit $rc)"
        [ $rc -ne 0 ] && grep -qi 'signal 9\|killed' "$tmp/out.txt" && pass kill9_one_rank_ends_the_job ||
            fail kill9_one_rank_ends_the_job "exit $rc: $(cat "$tmp/out.txt")"
    fi
fi
exit 0
