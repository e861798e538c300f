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
FT=${FTUNE:-build/ftune}
D=${FTUNE_DATA:-../shared/data}
HF=$D/models/stories260K-hf
PY=/usr/bin/python3
tmp=${KEEP_TMP:-$(mktemp -d)}; [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

if ! command -v mpirun > /dev/null; then echo "SKIP: no mpirun (scripts/setup.sh installs Open MPI)"; exit 0; fi
# Open MPI refuses root unless told; a test container runs as root
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# every rank on this machine, over shared memory and loopback TCP; quiet about the missing fast fabrics
MPI=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo)
# a hang is a failure, not a stuck test suite
run_mpi() { local n=$1; shift; timeout 120 "${MPI[@]}" -np "$n" "$@"; }

cat > "$tmp/d.jsonl" <<'EOF'
{"text": "Once upon a time, there was a little cat named Tom. Tom liked to play with his red ball."}
{"text": "The sun was hot. Lily went to the park with her mom. She saw a big dog and said hello."}
{"text": "Ben had a toy car. He drove it around the room. The car was fast and blue."}
{"text": "One day, a bird sat on a tree. The bird sang a happy song for all the kids."}
{"text": "Sara wanted a cake. Her dad made a big cake with red cherries. Sara was very happy."}
{"text": "The frog jumped into the pond. Splash! The water was cold, but the frog liked it."}
{"text": "Max found a shiny stone in the garden. He gave it to his sister, and she smiled."}
{"text": "It was raining. Tim and Sue stayed inside and built a tall tower with blocks."}
{"text": "A little fish swam in the sea. It met a crab who wanted to be its friend."}
{"text": "Anna lost her hat in the wind. Her brother ran fast and caught it for her."}
EOF

# a build without MPI (make MPI=0) is a one-rank program: nothing more to test here
if ! ldd "$FT" 2>/dev/null | grep -q libmpi; then echo "SKIP: $FT is built without MPI (make MPI=1)"; exit 0; fi

# dropout 0 in most runs (the curves then test the reductions alone); a
# rank draws the one-process run's dropout masks for its rows of the global
# batch (seeded by the row's index in it), which lora_dropout_* checks
common=(-m "$HF" --data "$tmp/d.jsonl" --ctx 48 -t 1 --seed 3 --lora-dropout 0 --val-split 0.2 --eval-every 2 --quiet)
# Per-step losses, validation losses and grad norms of run b against run a.
# 1e-5 relative: the only difference is the order of the gradient and loss
# sums over ranks (float32); measured up to 4e-6 (3 ranks, 4 steps at lr 1e-2).
same_curve() {  # name metrics_a metrics_b [from_step]
    $PY - "$2" "$3" "${4:-1}" <<'EOF' && pass "$1" || fail "$1" "$(cat "$2" "$3")"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
first = int(sys.argv[3])
a = [x for x in a if x["step"] >= first]
b = [x for x in b if x["step"] >= first]
assert [x["step"] for x in a] == [x["step"] for x in b] and a, "the same steps"
worst = 0
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_loss"):
        assert (k in x) == (k in y), k
        if k in x:
            worst = max(worst, abs(x[k] - y[k]) / max(abs(x[k]), 1e-30))
print("max relative difference over %d steps: %.2e" % (len(a), worst))
assert worst <= 1e-5, worst
EOF
}
# What rank 0 wrote is the whole adapter (or model): the same tensors as the
# one-process run's, and the same loss on the training text. Not the
# values elementwise: AdamW's first steps move an element by about lr
# whatever its gradient's size, so an element whose gradient is rounding
# noise differs by up to 2 lr between runs (measured 4e-4 relative after 6
# LoRA steps), while the loss agrees to 1e-6.
same_output() {  # name dir_a dir_b eval-args...
    local name=$1 a=$2 b=$3; shift 3
    local la lb
    la=$("$FT" eval "$@" "$a" --jsonl "$tmp/d.jsonl" --ctx 48 -t 1 --json 2> "$tmp/err.txt") &&
    lb=$("$FT" eval "$@" "$b" --jsonl "$tmp/d.jsonl" --ctx 48 -t 1 --json 2>> "$tmp/err.txt") || {
        fail "$name" "$(cat "$tmp/err.txt")"; return; }
    $PY - "$a" "$b" "$la" "$lb" <<'EOF' && pass "$name" || fail "$name" "$la / $lb"
import json, struct, sys, os
def header(d):
    p = [os.path.join(d, f) for f in ("adapter_model.safetensors", "model.safetensors") if os.path.exists(os.path.join(d, f))][0]
    b = open(p, "rb").read(8)
    h = json.loads(open(p, "rb").read(8 + struct.unpack("<Q", b)[0])[8:])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
assert header(sys.argv[1]) == header(sys.argv[2]), "the same tensors"
la, lb = json.loads(sys.argv[3])["loss"], json.loads(sys.argv[4])["loss"]
print("eval loss %.9g (one process), %.9g (ranks): relative difference %.2e" % (la, lb, abs(la - lb) / la))
# 1e-5 as for the training losses: the values differ only by the reduction order's rounding
assert abs(la - lb) <= 1e-5 * la
EOF
}

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
ck=("${common[@]}" --steps 6 --lr 1e-2 --batch-size 4 --save-every 3)
if run_mpi 2 "$FT" train "${ck[@]}" --zero 1 -o "$tmp/c2" > "$tmp/out.txt" 2>&1 && [ -d "$tmp/c2/checkpoint-3" ]; then
    "$FT" train "${ck[@]}" --resume "$tmp/c2/checkpoint-3" -o "$tmp/c2r1" 2> "$tmp/err.txt" &&
        same_curve resume_np2_zero1_on_one_process "$tmp/c2/metrics.jsonl" "$tmp/c2r1/metrics.jsonl" 4 ||
        fail resume_np2_zero1_on_one_process "$(cat "$tmp/err.txt")"
    run_mpi 4 "$FT" train "${ck[@]}" --zero 0 --resume "$tmp/c2/checkpoint-3" -o "$tmp/c2r4" > "$tmp/out.txt" 2>&1 &&
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
   run_mpi 3 "$FT" train "${odd[@]}" --zero 1 --bucket-mb 0.01 --resume "$tmp/o3/checkpoint-2" -o "$tmp/o3r" >> "$tmp/out.txt" 2>&1; then
    same_curve np3_zero1_small_buckets "$tmp/o1/metrics.jsonl" "$tmp/o3/metrics.jsonl"
    same_curve np3_zero1_small_buckets_resume "$tmp/o1/metrics.jsonl" "$tmp/o3r/metrics.jsonl" 3
else fail np3_zero1_small_buckets "$(cat "$tmp/err.txt"; tail -20 "$tmp/out.txt")"; fi

# 3b. with the loss scaler on (dynamic, f32: nothing overflows), across a resume from 2 ranks to 4
ls=("${ck[@]}" --loss-scale dynamic)
if "$FT" train "${ls[@]}" -o "$tmp/s1" 2> "$tmp/err.txt" &&
   run_mpi 2 "$FT" train "${ls[@]}" --zero 1 -o "$tmp/s2" > "$tmp/out.txt" 2>&1 &&
   run_mpi 4 "$FT" train "${ls[@]}" --resume "$tmp/s2/checkpoint-3" -o "$tmp/s4" >> "$tmp/out.txt" 2>&1; then
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
