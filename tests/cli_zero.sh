#!/usr/bin/env bash
# ZeRO 2 and 3 under `mpirun -np N ftune train` on stories260K, oversubscribed on loopback:
# with the same global batch, 2, 3 and 4 ranks give the per-step losses of one process
# for LoRA and full fine-tuning at --zero 2 (gradients sharded) and 3 (values too), with
# gradient accumulation, uneven shards, small buckets and a rank with no rows; what rank 0
# writes is whole; the memory table's gradients (and trainables) rows show the shards.
set -u
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/mpi_lib.sh"

stories_jsonl "$tmp/d.jsonl"

# dropout 0: the curves test the reductions alone (cli_mpi.sh checks dropout)
common=(-m "$HF" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 3 --lora-dropout 0 --val-split 0.2 --eval-every 2 --quiet)

# 1. LoRA and full, global batch 4 in 2 micro-batches per step: 1 process, then 2 and 4 ranks at ZeRO 2 and 3
lora=("${common[@]}" --steps 4 --lr 1e-2 --batch-size 4 --grad-accum 2)
full=("${common[@]}" --full --steps 3 --lr 1e-3 --batch-size 4 --grad-accum 2)
for mode in lora full; do
    eval "args=(\"\${$mode[@]}\")"
    "$FT" train "${args[@]}" -o "$tmp/$mode.1" 2> "$tmp/err.txt" || fail "${mode}_one_process" "$(cat "$tmp/err.txt")"
    for n in 2 4; do
        for z in 2 3; do
            if run_mpi $n "$FT" train "${args[@]}" --zero $z -o "$tmp/$mode.$n.$z" > "$tmp/out.txt" 2>&1; then
                same_curve "${mode}_np${n}_zero${z}_losses" "$tmp/$mode.1/metrics.jsonl" "$tmp/$mode.$n.$z/metrics.jsonl"
            else fail "${mode}_np${n}_zero${z}" "$(tail -20 "$tmp/out.txt")"; fi
        done
    done
done
same_output lora_np4_zero3_adapter_is_whole "$tmp/lora.1" "$tmp/lora.4.3" -m "$HF" --adapter
same_output full_np2_zero3_model_is_whole "$tmp/full.1" "$tmp/full.2.3" -m
same_output full_np4_zero2_model_is_whole "$tmp/full.1" "$tmp/full.4.2" -m

# 2. 3 ranks, 10 KiB buckets (every segment's collective in many rounds, shards that cut tensors),
#    batch 3 over 8 examples: the epoch's last batch has 2 rows, so one rank has none and runs its
#    collectives on an empty batch; 2 validation batches over 3 ranks, one idle there too
odd=("${common[@]}" --full --steps 4 --lr 1e-3 --batch-size 3 --eval-every 1)
"$FT" train "${odd[@]}" -o "$tmp/o1" 2> "$tmp/err.txt" || fail odd_one_process "$(cat "$tmp/err.txt")"
for z in 2 3; do
    if run_mpi 3 "$FT" train "${odd[@]}" --zero $z --bucket-mb 0.01 -o "$tmp/o3.$z" > "$tmp/out.txt" 2>&1; then
        same_curve "full_np3_zero${z}_small_buckets_idle_rank" "$tmp/o1/metrics.jsonl" "$tmp/o3.$z/metrics.jsonl"
    else fail "full_np3_zero${z}_small_buckets_idle_rank" "$(tail -20 "$tmp/out.txt")"; fi
done

# 2b. ZeRO 3 with gradient checkpointing: a segment's recomputed forward gathers its blocks' values again
gc=("${full[@]}" --grad-checkpoint 2)
if "$FT" train "${gc[@]}" -o "$tmp/gc1" 2> "$tmp/err.txt" &&
   run_mpi 2 "$FT" train "${gc[@]}" --zero 3 -o "$tmp/gc2" > "$tmp/out.txt" 2>&1; then
    same_curve full_np2_zero3_grad_checkpoint_losses "$tmp/gc1/metrics.jsonl" "$tmp/gc2/metrics.jsonl"
else fail full_np2_zero3_grad_checkpoint "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi

# 2a. full fine-tuning in bf16 at ZeRO 3 (no compute copies: the f32 masters read rounded, the same
#     numbers). The f32 sums' order is still the only difference, but a master that moves by one f32
#     ulp can round to the neighbouring bf16 (2^-8 relative) in the next forward: measured 4e-5 after
#     3 steps (ZeRO 0 on 2 ranks alike), so 1e-3
bf=("${full[@]}" --dtype bf16)
if "$FT" train "${bf[@]}" -o "$tmp/bf1" 2> "$tmp/err.txt" &&
   run_mpi 2 "$FT" train "${bf[@]}" --zero 3 -o "$tmp/bf2" > "$tmp/out.txt" 2>&1; then
    same_curve full_bf16_np2_zero3_losses "$tmp/bf1/metrics.jsonl" "$tmp/bf2/metrics.jsonl" 1 1e-3
else fail full_bf16_np2_zero3 "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi

# 2c. --overlap (non-blocking reduce-scatters, finished oldest first: the blocking path's sums in the
#     same order): on 2 ranks the same numbers as blocking, bit for bit; on 4 the one-process curve
for z in 2 3; do
    if run_mpi 2 "$FT" train "${full[@]}" --zero $z --overlap -o "$tmp/ov.$z" > "$tmp/out.txt" 2>&1; then
        $PY - "$tmp/full.2.$z/metrics.jsonl" "$tmp/ov.$z/metrics.jsonl" <<'EOF' && pass "full_np2_zero${z}_overlap_is_blocking" || fail "full_np2_zero${z}_overlap_is_blocking" "$(cat "$tmp/ov.$z/metrics.jsonl")"
import json, sys
f = lambda p: [{k: v for k, v in json.loads(l).items() if k not in ("tokens_per_s", "peak_rss_mib", "step_time_s")} for l in open(p)]
assert f(sys.argv[1]) == f(sys.argv[2])
EOF
    else fail "full_np2_zero${z}_overlap" "$(tail -20 "$tmp/out.txt")"; fi
done
if run_mpi 4 "$FT" train "${lora[@]}" --zero 2 --overlap -o "$tmp/ov4" > "$tmp/out.txt" 2>&1; then
    same_curve lora_np4_zero2_overlap_losses "$tmp/lora.1/metrics.jsonl" "$tmp/ov4/metrics.jsonl"
else fail lora_np4_zero2_overlap "$(tail -20 "$tmp/out.txt")"; fi
"$FT" train "${lora[@]}" --overlap -o "$tmp/ovbad" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q -- '--overlap .*give --zero 2 or 3' "$tmp/out.txt" && pass overlap_needs_zero2 ||
    fail overlap_needs_zero2 "exit $rc: $(cat "$tmp/out.txt")"

# 3. the memory table: ZeRO 2's gradients row is one segment's window plus this rank's shard, less
#    than ZeRO 0's whole gradients; ZeRO 3's trainables row likewise; planned equals measured
for z in 0 2 3; do
    run_mpi 2 "$FT" train "${common[@]:0:${#common[@]}-1}" --full --steps 1 --batch-size 4 --zero $z -o "$tmp/mem.$z" \
        > "$tmp/mem.$z.txt" 2>&1 || fail "memory_table_zero$z" "$(tail -20 "$tmp/mem.$z.txt")"
done
$PY - "$tmp/mem.0.txt" "$tmp/mem.2.txt" "$tmp/mem.3.txt" <<'EOF' && pass memory_table_shows_the_shards || fail memory_table_shows_the_shards "$(cat "$tmp"/mem.*.txt)"
import sys
def rows(p):
    out = {}
    for line in open(p):
        for name in ("trainables", "gradients"):
            if line.startswith(name):
                planned, now = line.split()[1:3]
                out[name] = (float(planned), float(now))
    return out
z0, z2, z3 = (rows(p) for p in sys.argv[1:])
print("gradients MiB planned/measured: zero0 %s zero2 %s zero3 %s; trainables zero3 %s" % (z0["gradients"], z2["gradients"], z3["gradients"], z3["trainables"]))
for r in (z0, z2, z3):
    for k in r:
        assert abs(r[k][0] - r[k][1]) <= 0.1, (k, r[k])  # the table's 0.1 MiB resolution
assert z2["gradients"][0] < z0["gradients"][0] and z3["gradients"][0] < z0["gradients"][0]
assert z2["trainables"][0] == z0["trainables"][0] and z3["trainables"][0] < z0["trainables"][0]
EOF
# 4. sharded checkpoints (full fine-tuning at ZeRO >= 1 on several ranks): a shard per rank and a
#    manifest; resuming on the same rank count continues bit for bit (the metrics lines from the
#    checkpoint on, and the final model's bytes, equal the uninterrupted run's)
ck=("${common[@]}" --full --steps 4 --lr 1e-3 --batch-size 4 --save-every 2)
same_lines() {  # name metrics_a metrics_b from_step: every logged number but the speed and memory, exactly
    $PY - "$2" "$3" "$4" <<'EOF' && pass "$1" || fail "$1" "$(cat "$2" "$3")"
import json, sys
f = lambda p: [{k: v for k, v in json.loads(l).items() if k not in ("tokens_per_s", "peak_rss_mib", "step_time_s")} for l in open(p)]
a = [x for x in f(sys.argv[1]) if x["step"] >= int(sys.argv[3])]
b = [x for x in f(sys.argv[2]) if x["step"] >= int(sys.argv[3])]
assert a and a == b, (a, b)
EOF
}
for z in 1 3; do
    if run_mpi 2 "$FT" train "${ck[@]}" --zero $z -o "$tmp/ck.$z" > "$tmp/out.txt" 2>&1 &&
       [ -s "$tmp/ck.$z/checkpoint-2/shard-0-of-2.safetensors" ] && [ -s "$tmp/ck.$z/checkpoint-2/shard-1-of-2.safetensors" ] &&
       [ ! -e "$tmp/ck.$z/checkpoint-2/optimizer.safetensors" ] && grep -q '"shards"' "$tmp/ck.$z/checkpoint-2/trainer_state.json"; then
        pass "sharded_checkpoint_zero$z"
        # a checkpoint resumes only into its own run's directory: a copy, without the final model
        cp -r "$tmp/ck.$z" "$tmp/ckr.$z"; rm "$tmp/ckr.$z/model.safetensors"
        if run_mpi 2 "$FT" train "${ck[@]}" --zero $z --resume "$tmp/ckr.$z/checkpoint-2" -o "$tmp/ckr.$z" > "$tmp/out.txt" 2>&1; then
            same_lines "sharded_resume_np2_zero${z}_bit_for_bit" "$tmp/ck.$z/metrics.jsonl" "$tmp/ckr.$z/metrics.jsonl" 3
            cmp -s "$tmp/ck.$z/model.safetensors" "$tmp/ckr.$z/model.safetensors" && pass "sharded_resume_np2_zero${z}_same_model" ||
                fail "sharded_resume_np2_zero${z}_same_model" "the final models differ"
        else fail "sharded_resume_np2_zero$z" "$(tail -20 "$tmp/out.txt")"; fi
    else fail "sharded_checkpoint_zero$z" "$(tail -20 "$tmp/out.txt"; ls "$tmp/ck.$z"/checkpoint-2)"; fi
done
# the stage may change between resumes (the shards are the same flat ranges at every stage >= 1);
# the same curve to 1e-5, not bit for bit: ZeRO 2 sums the tied embedding's two gradient parts (the
# head's, the embedding's) over the ranks one at a time, ZeRO 1 their sum
cp -r "$tmp/ck.1" "$tmp/ckr.12"
run_mpi 2 "$FT" train "${ck[@]}" --zero 2 --resume "$tmp/ckr.12/checkpoint-2" -o "$tmp/ckr.12" > "$tmp/out.txt" 2>&1 &&
    same_curve sharded_resume_zero1_as_zero2 "$tmp/ck.1/metrics.jsonl" "$tmp/ckr.12/metrics.jsonl" 3 ||
    fail sharded_resume_zero1_as_zero2 "$(tail -20 "$tmp/out.txt")"
# another rank count: refused, naming both counts, on every rank, without a hang; the checkpoint is untouched
sums() { (cd "$1" && md5sum * | sort); }
before=$(sums "$tmp/ck.1/checkpoint-2")
cp -r "$tmp/ck.1" "$tmp/ckbad"
"$FT" train "${ck[@]}" --zero 1 --resume "$tmp/ckbad/checkpoint-2" -o "$tmp/ckbad" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q 'sharded over 2 ranks.*this run has 1' "$tmp/out.txt" && pass sharded_on_one_process_refused ||
    fail sharded_on_one_process_refused "exit $rc: $(cat "$tmp/out.txt")"
run_mpi 4 "$FT" train "${ck[@]}" --zero 3 --resume "$tmp/ckbad/checkpoint-2" -o "$tmp/ckbad" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'sharded over 2 ranks.*this run has 4' "$tmp/out.txt" && pass sharded_on_np4_refused ||
    fail sharded_on_np4_refused "exit $rc: $(cat "$tmp/out.txt")"
[ "$before" = "$(sums "$tmp/ckbad/checkpoint-2")" ] && pass refused_resume_leaves_the_checkpoint ||
    fail refused_resume_leaves_the_checkpoint "the checkpoint's files changed"

# 5. --consolidate: whole checkpoints from 2 ranks resume on 1 process, and one process's on 2
#    ranks at ZeRO 3, continuing the same curve (1e-5: the sums' order differs from there on)
if run_mpi 2 "$FT" train "${ck[@]}" --zero 2 --consolidate -o "$tmp/cc2" > "$tmp/out.txt" 2>&1 &&
   [ -s "$tmp/cc2/checkpoint-2/optimizer.safetensors" ] && [ ! -e "$tmp/cc2/checkpoint-2/shard-0-of-2.safetensors" ]; then
    cp -r "$tmp/cc2" "$tmp/cc2r1"
    "$FT" train "${ck[@]}" --resume "$tmp/cc2r1/checkpoint-2" -o "$tmp/cc2r1" 2> "$tmp/err.txt" &&
        same_curve consolidated_np2_resumes_on_one_process "$tmp/cc2/metrics.jsonl" "$tmp/cc2r1/metrics.jsonl" 3 ||
        fail consolidated_np2_resumes_on_one_process "$(cat "$tmp/err.txt")"
else fail consolidate_np2 "$(tail -20 "$tmp/out.txt")"; fi
if "$FT" train "${ck[@]}" -o "$tmp/cc1" 2> "$tmp/err.txt" &&
   cp -r "$tmp/cc1" "$tmp/cc1r2" && run_mpi 2 "$FT" train "${ck[@]}" --zero 3 --resume "$tmp/cc1r2/checkpoint-2" -o "$tmp/cc1r2" > "$tmp/out.txt" 2>&1; then
    same_curve one_process_resumes_on_np2_zero3 "$tmp/cc1/metrics.jsonl" "$tmp/cc1r2/metrics.jsonl" 3
    same_curve sharded_run_is_one_process "$tmp/cc1/metrics.jsonl" "$tmp/ck.3/metrics.jsonl"
else fail one_process_resumes_on_np2_zero3 "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi
# LoRA's checkpoints are always whole: 2 ranks at ZeRO 3 resume on one process
lck=("${common[@]}" --steps 4 --lr 1e-2 --batch-size 4 --save-every 2)
if run_mpi 2 "$FT" train "${lck[@]}" --zero 3 -o "$tmp/lc2" > "$tmp/out.txt" 2>&1 &&
   cp -r "$tmp/lc2" "$tmp/lc2r1" && "$FT" train "${lck[@]}" --resume "$tmp/lc2r1/checkpoint-2" -o "$tmp/lc2r1" 2> "$tmp/err.txt"; then
    same_curve lora_zero3_checkpoint_resumes_on_one_process "$tmp/lc2/metrics.jsonl" "$tmp/lc2r1/metrics.jsonl" 3
else fail lora_zero3_checkpoint "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi
exit 0
