#!/usr/bin/env bash
# `ftune train`, `ftune merge` and `--adapter` end to end on stories260K:
# LoRA training lowers the loss and its adapter loads in generate and eval;
# checkpoints resume bit for bit (dropout, gradient accumulation, Ctrl-C,
# SIGTERM, SIGHUP);
# full fine-tuning writes a loadable model; merging gives the same loss as
# base + adapter; bad data, adapters and checkpoints give clear errors; a
# disk that fills while saving leaves the previous checkpoint usable.
set -u
. "$(dirname "$0")/lib.sh"
GG=$D/models/stories260K/stories260K.gguf
# one thread: the runs are tiny, and bit-exact comparisons need the same
# reduction order in every run
export OMP_NUM_THREADS=1

stories_jsonl "$tmp/d.jsonl" 8
train() { "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet "$@"; }
losses() { $PY -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }

# 1. LoRA at a high learning rate: the loss falls over 30 steps; the outputs exist
train -o "$tmp/a" --steps 30 --lr 1e-2 --val-split 0 --seed 1 2> "$tmp/err.txt"
rc=$?
if [ $rc -ne 0 ]; then fail lora_trains "exit $rc: $(cat "$tmp/err.txt")"
else
    $PY - "$tmp/a/metrics.jsonl" <<'EOF' && pass lora_loss_decreases || fail lora_loss_decreases "$(cat "$tmp/a/metrics.jsonl")"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert [x["step"] for x in m] == list(range(1, 31)), "one line per step"
assert all(k in x for x in m for k in ("loss", "lr", "grad_norm", "tokens_per_s"))
first, last = sum(x["loss"] for x in m[:5]) / 5, sum(x["loss"] for x in m[-5:]) / 5
print("mean loss of steps 1-5 %.4f, of steps 26-30 %.4f" % (first, last))
# memorising 8 short stories at lr 1e-2 halves the loss easily (measured: 2.2 -> 0.6)
assert last < 0.6 * first
EOF
    [ -s "$tmp/a/adapter_config.json" ] && [ -s "$tmp/a/adapter_model.safetensors" ] && pass lora_outputs \
        || fail lora_outputs "$(ls "$tmp/a")"
fi

# 2. the adapter in generate and eval: on the training text, eval loss with it < without
"$FT" generate -m "$HF" --adapter "$tmp/a" -p "Once upon a time" -n 20 --temp 0 --quiet > "$tmp/gen.txt" 2> "$tmp/err.txt" \
    && [ -s "$tmp/gen.txt" ] && pass generate_adapter || fail generate_adapter "$(cat "$tmp/err.txt")"
base=$("$FT" eval -m "$HF" --jsonl "$tmp/d.jsonl" --json 2>/dev/null)
with=$("$FT" eval -m "$HF" --adapter "$tmp/a" --jsonl "$tmp/d.jsonl" --json 2> "$tmp/err.txt")
$PY -c "
import json,sys; b=json.loads('''$base'''); w=json.loads('''$with''')
print('eval loss on the training text: base %.4f, with adapter %.4f' % (b['loss'], w['loss']))
sys.exit(0 if w['loss'] < b['loss'] and w['tokens'] == b['tokens'] else 1)" && pass eval_adapter_lower_loss \
    || fail eval_adapter_lower_loss "base=$base with=$with $(cat "$tmp/err.txt")"
# the HF-trained adapter applies to the GGUF base (interleaved q/k rows) with the same result
wg=$("$FT" eval -m "$GG" --adapter "$tmp/a" --jsonl "$tmp/d.jsonl" --json 2>/dev/null)
$PY -c "
import json,sys; a=json.loads('''$with'''); b=json.loads('''$wg''')
# 1e-5 relative: the same f32 model computed with rows in another order (summation order differs)
sys.exit(0 if abs(a['loss']-b['loss']) <= 1e-5*a['loss'] else 1)" && pass adapter_on_gguf_base || fail adapter_on_gguf_base "$with vs $wg"

# 3. --export-gguf writes a llama.cpp LoRA adapter with every A/B pair
train -o "$tmp/g" --steps 2 --val-split 0 --export-gguf --lora-targets q,v 2> "$tmp/err.txt" || fail export_gguf "$(cat "$tmp/err.txt")"
$PY - "$tmp/g/adapter.gguf" <<'EOF' && pass export_gguf_parses || fail export_gguf_parses "bad adapter.gguf"
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:4] == b"GGUF"
ver, nt, nkv = struct.unpack_from("<IQQ", b, 4)
off = 24
def s(o):
    n, = struct.unpack_from("<Q", b, o); return b[o+8:o+8+n].decode(), o + 8 + n
kv = {}
sizes = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
for _ in range(nkv):
    k, off = s(off)
    t, = struct.unpack_from("<I", b, off); off += 4
    if t == 8: v, off = s(off)
    elif t == 9:
        at, n = struct.unpack_from("<IQ", b, off); off += 12
        for _ in range(n):
            if at == 8: _, off = s(off)
            else: off += sizes[at]
        v = None
    else: v = b[off:off+sizes[t]]; off += sizes[t]
    kv[k] = v
names = []
for _ in range(nt):
    n, off = s(off)
    nd, = struct.unpack_from("<I", b, off); off += 4 + 8 * nd + 4 + 8
    names.append(n)
assert kv.get("general.type") == "adapter" and kv.get("adapter.type") == "lora", kv
# 5 layers x (q, v) x (lora_a, lora_b)
assert nt == 20 and all(n.endswith((".lora_a", ".lora_b")) for n in names), names
print("adapter.gguf: version", ver, "tensors", nt)
EOF

# 4. resume is bit-exact: dropout on, 2 micro-batches of 2 rows per step, shuffled
rt=(--steps 10 --lora-dropout 0.1 --grad-accum 2 --batch-size 2 --lr 1e-3 --seed 7)
train -o "$tmp/full10" "${rt[@]}" 2> "$tmp/err.txt" || fail resume_reference "$(cat "$tmp/err.txt")"
train -o "$tmp/r" "${rt[@]}" --save-every 5 2> "$tmp/err.txt" || fail resume_save "$(cat "$tmp/err.txt")"
[ -f "$tmp/r/checkpoint-5/trainer_state.json" ] && [ -f "$tmp/r/checkpoint-5/adapter_model.safetensors" ] \
    && [ ! -e "$tmp/r/checkpoint-5.tmp" ] && pass checkpoint_written || fail checkpoint_written "$(ls "$tmp/r")"
train -o "$tmp/r" "${rt[@]}" --resume "$tmp/r/checkpoint-5" 2> "$tmp/err.txt" || fail resume_run "$(cat "$tmp/err.txt")"
a=$(losses "$tmp/full10/metrics.jsonl"); b=$(losses "$tmp/r/metrics.jsonl")
[ -n "$a" ] && [ "$a" = "$b" ] && pass resume_bit_exact || fail resume_bit_exact "uninterrupted: $a; resumed: $b"
cmp -s "$tmp/full10/adapter_model.safetensors" "$tmp/r/adapter_model.safetensors" && pass resume_same_adapter \
    || fail resume_same_adapter "final adapters differ"

# 5. Ctrl-C: the current step finishes, a checkpoint is saved, exit non-zero; resuming completes the same run
st=(--steps 100 --lora-dropout 0.1 --lr 1e-3 --seed 3 --val-split 0)
train -o "$tmp/s100" "${st[@]}" 2> "$tmp/err.txt" || fail sigint_reference "$(cat "$tmp/err.txt")"
"$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/c" "${st[@]}" 2> "$tmp/err.txt" &
pid=$!  # ftune itself (a background job of a script starts with SIGINT ignored; ftune installs its handler)
for _ in $(seq 1 500); do [ -s "$tmp/c/metrics.jsonl" ] && break; sleep 0.01; done
kill -INT $pid; wait $pid; rc=$?
ck=$(ls -d "$tmp"/c/checkpoint-* 2>/dev/null | head -1)
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "interrupted after step" "$tmp/err.txt" && [ -n "$ck" ]; then
    train -o "$tmp/c" "${st[@]}" --resume "$ck" 2> "$tmp/err.txt"
    s1=$(losses "$tmp/s100/metrics.jsonl"); s2=$(losses "$tmp/c/metrics.jsonl")
    [ -n "$s1" ] && [ "$s1" = "$s2" ] && pass sigint_checkpoint_resume || fail sigint_checkpoint_resume "$s1 vs $s2"
else fail sigint_checkpoint_resume "exit $rc, checkpoint '$ck': $(cat "$tmp/err.txt")"; fi
# what schedulers (Slurm, Kubernetes, systemd, timeout) and a closed terminal send: the same as
# Ctrl-C, and the message names the signal
for sig in TERM HUP; do
    rm -rf "$tmp/c"
    "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/c" "${st[@]}" 2> "$tmp/err.txt" &
    pid=$!
    for _ in $(seq 1 500); do [ -s "$tmp/c/metrics.jsonl" ] && break; sleep 0.01; done
    kill -$sig $pid; wait $pid; rc=$?
    ck=$(ls -d "$tmp"/c/checkpoint-* 2>/dev/null | head -1)
    if [ $rc -eq 1 ] && grep -q "error: interrupted after step .*; the signal was SIG$sig$" "$tmp/err.txt" && [ -n "$ck" ] \
        && [ -f "$ck/adapter_model.safetensors" ]; then
        train -o "$tmp/c" "${st[@]}" --resume "$ck" 2> "$tmp/err.txt"
        s1=$(losses "$tmp/s100/metrics.jsonl"); s2=$(losses "$tmp/c/metrics.jsonl")
        [ -n "$s1" ] && [ "$s1" = "$s2" ] && pass "sig${sig,,}_checkpoint_resume" || fail "sig${sig,,}_checkpoint_resume" "$s1 vs $s2"
    else fail "sig${sig,,}_checkpoint_resume" "exit $rc, checkpoint '$ck': $(cat "$tmp/err.txt")"; fi
done
# a SIGHUP ignored when ftune starts (nohup) stays ignored: the run completes
rm -rf "$tmp/c"
( trap '' HUP; exec "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/c" "${st[@]}" ) 2> "$tmp/err.txt" &
pid=$!
for _ in $(seq 1 500); do [ -s "$tmp/c/metrics.jsonl" ] && break; sleep 0.01; done
kill -HUP $pid; wait $pid; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l < "$tmp/c/metrics.jsonl")" -eq 100 ] && pass sighup_nohup_ignored \
    || fail sighup_nohup_ignored "exit $rc, $(wc -l < "$tmp/c/metrics.jsonl") steps: $(cat "$tmp/err.txt")"

# a save killed part-way leaves checkpoint-STEP.tmp.PID (and .old.PID) behind: the next run in
# that -o removes those of processes that are gone, never one of a live process, and an .old
# one only when its checkpoint is in place (else it is the one complete copy)
train -o "$tmp/left" --steps 4 --save-every 2 --seed 2 2> "$tmp/err.txt" || fail stale_temporaries "$(cat "$tmp/err.txt")"
( : ) & dead=$!; wait $dead
if kill -0 $dead 2> /dev/null; then skip_or_fail stale_temporaries tool "pid $dead was reused at once"
else
    for n in checkpoint-3.tmp.$dead checkpoint-3.tmp.$$ checkpoint-2.old.$dead checkpoint-7.old.$dead checkpoint-2.tmp.$$; do
        mkdir "$tmp/left/$n" && echo x > "$tmp/left/$n/trainable.safetensors"
    done
    train -o "$tmp/left" --steps 4 --save-every 2 --seed 2 --resume "$tmp/left/checkpoint-2" 2> "$tmp/err.txt"; rc=$?
    left=$(cd "$tmp/left" && ls -d checkpoint-*.* | sort | tr '\n' ' ')
    want=$(printf '%s\n' checkpoint-2.tmp.$$ checkpoint-3.tmp.$$ checkpoint-7.old.$dead | sort | tr '\n' ' ')
    [ $rc -eq 0 ] && [ "$left" = "$want" ] && [ -f "$tmp/left/checkpoint-3.tmp.$$/trainable.safetensors" ] \
        && pass stale_temporaries_removed || fail stale_temporaries_removed "exit $rc; left: $left; want: $want $(cat "$tmp/err.txt")"
fi

# 6. a checkpoint from another configuration or model is refused, naming the difference
# (on a copy of the run: a checkpoint resumes only into its own run's directory)
cp -r "$tmp/r" "$tmp/rx"
expect_error resume_other_config "different configuration: lora_r" \
    train -o "$tmp/rx" "${rt[@]}" --lora-r 4 --resume "$tmp/rx/checkpoint-5"
"$FT" init --preset stories260K "$tmp/rand" > /dev/null 2>&1; cp "$HF/tokenizer.json" "$HF/tokenizer_config.json" "$tmp/rand/"
expect_error resume_other_model "different model" \
    "$FT" train -m "$tmp/rand" --data "$tmp/d.jsonl" --ctx 64 -t 1 -o "$tmp/rx" "${rt[@]}" --resume "$tmp/rx/checkpoint-5"

# 6b. --resume into another run's -o would replace that run's adapter, metrics and
# checkpoints: refused unless the checkpoint is one of -o's, before anything is written;
# so is an -o that is, or is inside, the checkpoint being resumed
sums() { (cd "$1" && find . -type f ! -name .ftune.lock | sort | xargs sha256sum); }
before=$(sums "$tmp/full10"); before_r=$(sums "$tmp/r")
expect_error resume_into_other_run "checkpoint is not one of -o .*full10's (it belongs to the run in .*/r)" \
    train -o "$tmp/full10" "${rt[@]}" --resume "$tmp/r/checkpoint-5"
[ "$(sums "$tmp/full10")" = "$before" ] && pass resume_into_other_run_untouched \
    || fail resume_into_other_run_untouched "$(ls -la "$tmp/full10")"
expect_error resume_into_new_dir "checkpoint is not one of -o" train -o "$tmp/fresh" "${rt[@]}" --resume "$tmp/r/checkpoint-5"
[ ! -e "$tmp/fresh" ] && pass resume_into_new_dir_not_made || fail resume_into_new_dir_not_made "$(ls -la "$tmp/fresh")"
expect_error resume_out_in_checkpoint "-o .*checkpoint-5/sub is inside the checkpoint being resumed" \
    train -o "$tmp/r/checkpoint-5/sub" "${rt[@]}" --resume "$tmp/r/checkpoint-5"
expect_error resume_out_is_checkpoint "is inside the checkpoint being resumed" \
    train -o "$tmp/r/checkpoint-5" "${rt[@]}" --resume "$tmp/r/checkpoint-5"
[ "$(sums "$tmp/r")" = "$before_r" ] && pass resume_out_in_checkpoint_untouched \
    || fail resume_out_in_checkpoint_untouched "$(ls -laR "$tmp/r/checkpoint-5")"
# the run's own directory, spelled another way (relative, with ./ and a trailing slash), resumes
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ft_abs=$(abs "$FT"); hf_abs=$(abs "$HF")
(cd "$tmp" && "$ft_abs" train -m "$hf_abs" --data d.jsonl --ctx 64 -t 1 --quiet -o ./r/ "${rt[@]}" \
    --resume r/checkpoint-5/) 2> "$tmp/err.txt" && [ "$(losses "$tmp/r/metrics.jsonl")" = "$a" ] \
    && pass resume_own_dir_other_spelling || fail resume_own_dir_other_spelling "$(cat "$tmp/err.txt")"

# 7. the disk fills while a checkpoint is written: a clear error, no half checkpoint,
# and the previous one still resumes to the uninterrupted result
rm -rf "$tmp/r/checkpoint-10"
( ulimit -f 100; exec "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/r" "${rt[@]}" \
      --save-every 5 --resume "$tmp/r/checkpoint-5" ) 2> "$tmp/err.txt"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "saving checkpoint" "$tmp/err.txt" && [ ! -e "$tmp/r/checkpoint-10" ] \
    && [ ! -e "$tmp/r/checkpoint-10.tmp" ]; then
    train -o "$tmp/r" "${rt[@]}" --resume "$tmp/r/checkpoint-5" 2> "$tmp/err.txt"
    b=$(losses "$tmp/r/metrics.jsonl")
    [ "$a" = "$b" ] && pass disk_full_keeps_checkpoint || fail disk_full_keeps_checkpoint "$a vs $b"
else fail disk_full_keeps_checkpoint "exit $rc: $(cat "$tmp/err.txt"); $(ls "$tmp/r")"; fi

# 8. --init-adapter starts from an adapter (lr 0 keeps it); --save-initial-adapter is the start
train -o "$tmp/i" --steps 1 --lr 0 --val-split 0 --init-adapter "$tmp/a" --save-initial-adapter 2> "$tmp/err.txt" \
    || fail init_adapter "$(cat "$tmp/err.txt")"
e1=$("$FT" eval -m "$HF" --adapter "$tmp/i" --jsonl "$tmp/d.jsonl" --json 2>/dev/null)
e0=$("$FT" eval -m "$HF" --adapter "$tmp/i/initial" --jsonl "$tmp/d.jsonl" --json 2>/dev/null)
[ -n "$e1" ] && [ "$e1" = "$with" ] && [ "$e0" = "$with" ] && pass init_adapter || fail init_adapter "$e1 / $e0 vs $with"
expect_error init_adapter_conflict "lora-r" train -o "$tmp/x" --steps 1 --init-adapter "$tmp/a" --lora-r 4

# 9. full fine-tuning writes a Hugging Face model that ftune loads
train -o "$tmp/f" --full --steps 10 --lr 1e-3 --val-split 0 2> "$tmp/err.txt" || fail full_trains "$(cat "$tmp/err.txt")"
ff=$("$FT" eval -m "$tmp/f" --jsonl "$tmp/d.jsonl" --json 2> "$tmp/err.txt")
$PY -c "
import json,sys; b=json.loads('''$base'''); f=json.loads('''$ff''')
print('full fine-tune: eval loss %.4f (base %.4f)' % (f['loss'], b['loss'])); sys.exit(0 if f['loss'] < b['loss'] else 1)" \
    && pass full_model_loads || fail full_model_loads "$ff $(cat "$tmp/err.txt")"

# 10. merge: same loss as base + adapter, to HF and to GGUF
for out in "$tmp/merged" "$tmp/merged.gguf"; do
    src=$HF; [ "${out%.gguf}" != "$out" ] && src=$GG
    name=merge_$(basename "$out" | tr . _)
    "$FT" merge -m "$src" --adapter "$tmp/a" -o "$out" 2> "$tmp/err.txt" || { fail "$name" "$(cat "$tmp/err.txt")"; continue; }
    me=$("$FT" eval -m "$out" --jsonl "$tmp/d.jsonl" --json 2>/dev/null)
    $PY -c "
import json,sys; a=json.loads('''$with'''); m=json.loads('''$me''')
# 1e-5 relative: W + s*B*A folded in f32 vs applied on the fly, rounding differs by a few ulp per weight
sys.exit(0 if abs(a['loss']-m['loss']) <= 1e-5*a['loss'] else 1)" && pass "$name" || fail "$name" "$me vs $with"
done

# 11. bad data: non-zero exit, a message with file:line
printf '{"text": "ok"}\n{"text": "broken\n' > "$tmp/bad1.jsonl"
expect_error data_not_json "bad1.jsonl:2" train -o "$tmp/x" --data "$tmp/bad1.jsonl" --steps 1
printf '{"text": "ok"}\n{"txt": "wrong field"}\n' > "$tmp/bad2.jsonl"
expect_error data_missing_field "bad2.jsonl:2" train -o "$tmp/x" --data "$tmp/bad2.jsonl" --steps 1
printf '{"text": "ok"}\n\n{}\n' > "$tmp/bad3.jsonl"
expect_error data_empty_object "bad3.jsonl:3" train -o "$tmp/x" --data "$tmp/bad3.jsonl" --steps 1
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n{"messages": [{"role": "wizard", "content": "hi"}]}\n' > "$tmp/bad4.jsonl"
expect_error data_chat_unknown_role "bad4.jsonl:2.*role" train -o "$tmp/x" --data "$tmp/bad4.jsonl" --chat-template chatml --steps 1

# 12. examples longer than the context: truncated and counted, or dropped with --drop-long
"$FT" train -m "$HF" --data "$tmp/d.jsonl" -o "$tmp/t" --ctx 16 --steps 1 -t 1 --val-split 0 2> "$tmp/err.txt" \
    && grep -q "warning: 8 example(s) longer than 16 tokens were truncated" "$tmp/err.txt" && pass long_truncated \
    || fail long_truncated "$(cat "$tmp/err.txt")"
printf '{"text": "Hi."}\n{"text": "Once upon a time, there was a little cat named Tom. Tom liked to play."}\n' > "$tmp/long.jsonl"
"$FT" train -m "$HF" --data "$tmp/long.jsonl" -o "$tmp/t2" --ctx 16 --steps 1 -t 1 --val-split 0 --drop-long 2> "$tmp/err.txt" \
    && grep -q "1 example(s) longer than 16 tokens were dropped" "$tmp/err.txt" && grep -q "data: 1 training examples" "$tmp/err.txt" \
    && pass long_dropped || fail long_dropped "$(cat "$tmp/err.txt")"

# 13. adapters that do not fit the model
cp -r "$tmp/a" "$tmp/badr"; sed -i -E 's/"r":\s*8/"r": 4/' "$tmp/badr/adapter_config.json"
expect_error adapter_wrong_shape "shape\|rank\|\br\b" "$FT" eval -m "$HF" --adapter "$tmp/badr" --jsonl "$tmp/d.jsonl"
cp -r "$tmp/g" "$tmp/badt"; sed -i 's/"q_proj"/"k_proj"/' "$tmp/badt/adapter_config.json"
expect_error adapter_wrong_targets "q_proj" "$FT" generate -m "$HF" --adapter "$tmp/badt" -n 2
expect_error merge_missing_adapter "adapter_config.json" "$FT" merge -m "$HF" --adapter "$tmp/nope" -o "$tmp/x2"

# 14. --help lists the options with their defaults
"$FT" train --help > "$tmp/h.txt"
grep -q -- "--lora-r R .*(default: 8)" "$tmp/h.txt" && grep -q -- "--lr LR .*(default: 2e-4)" "$tmp/h.txt" \
    && grep -q -- "--dump-batches FILE" "$tmp/h.txt" && "$FT" merge --help | grep -q -- "--adapter DIR" \
    && pass help_train_merge || fail help_train_merge "$(cat "$tmp/h.txt")"

# 15. normalisation across accumulation: 2 rows in one micro-batch or 1 row in
# each of 2 give the same step losses and gradient norms
acc=(--steps 3 --no-shuffle --lora-dropout 0 --val-split 0 --lr 1e-3)
train -o "$tmp/b2" "${acc[@]}" --batch-size 2 --grad-accum 1 2> /dev/null
train -o "$tmp/k2" "${acc[@]}" --batch-size 1 --grad-accum 2 --dump-batches "$tmp/k2.jsonl" 2> /dev/null
$PY - "$tmp/b2/metrics.jsonl" "$tmp/k2/metrics.jsonl" "$tmp/k2.jsonl" <<'EOF' && pass accumulation_normalised || fail accumulation_normalised "see above"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
d = [json.loads(l) for l in open(sys.argv[3])]
assert len(a) == len(b) == 3 and len(d) == 6
err = max(max(abs(x[k] - y[k]) / abs(y[k]) for k in ("loss", "grad_norm")) for x, y in zip(a, b))
print("max relative difference of loss / grad norm, B=2 vs 2 micro-batches of 1: %.2e" % err)
# 1e-5: the same float32 sums over a padded batch of 2 rows or 2 batches of 1 row, in another order
assert err < 1e-5
for s in (1, 2, 3):
    m = [x for x in d if x["step"] == s]
    assert [x["micro"] for x in m] == [0, 1]
    n = sum(t >= 0 for x in m for row in x["targets"] for t in row)
    assert all(x["n_targets_total"] == n for x in m), "n_targets_total counts both micro-batches"
EOF

# 16. --epochs: 8 examples in micro-batches of 3 is 3 per epoch; 2 epochs with 2 per step is 3 steps
train -o "$tmp/ep" --epochs 2 --batch-size 3 --grad-accum 2 --val-split 0 --dump-batches "$tmp/ep.jsonl" 2> "$tmp/err.txt"
[ "$(wc -l < "$tmp/ep/metrics.jsonl")" -eq 3 ] && [ "$(wc -l < "$tmp/ep.jsonl")" -eq 6 ] && pass epochs_steps \
    || fail epochs_steps "$(cat "$tmp/err.txt"; wc -l "$tmp/ep/metrics.jsonl" "$tmp/ep.jsonl")"

# 17. an output directory that holds a run is refused unless --resume or --overwrite;
# --overwrite removes the old run's checkpoints and metrics
mkdir -p "$tmp/ow"; cp -r "$tmp/r/." "$tmp/ow/"
expect_error nonempty_out_refused "not empty.*--overwrite" train -o "$tmp/ow" --steps 2 --val-split 0
train -o "$tmp/ow" --steps 2 --val-split 0 --overwrite 2> "$tmp/err.txt"
[ $? -eq 0 ] && [ ! -e "$tmp/ow/checkpoint-5" ] && [ "$(wc -l < "$tmp/ow/metrics.jsonl")" -eq 2 ] \
    && pass overwrite_replaces_run || fail overwrite_replaces_run "$(cat "$tmp/err.txt"; ls "$tmp/ow")"
expect_error resume_and_overwrite "not both" train -o "$tmp/ow" --steps 2 --overwrite --resume "$tmp/r/checkpoint-5"
# --overwrite removes exactly what a run writes: not another trainer's checkpoint-500 (its
# trainer_state.json is not ftune's), a checkpoint-best, a checkpoint-7 without state or
# notes; but the previous run's adapter.gguf and a full run's model files go, so none is
# left beside the new adapter
rm -rf "$tmp/ow2"; cp -r "$tmp/r" "$tmp/ow2"
mkdir "$tmp/ow2/checkpoint-500" "$tmp/ow2/checkpoint-best" "$tmp/ow2/checkpoint-7"
echo '{"global_step": 500, "log_history": [], "best_model_checkpoint": null}' > "$tmp/ow2/checkpoint-500/trainer_state.json"
cp "$tmp/r/checkpoint-5/trainer_state.json" "$tmp/ow2/checkpoint-best/"
echo "mine" > "$tmp/ow2/checkpoint-7/notes.txt"; echo "mine" > "$tmp/ow2/notes.txt"
cp "$tmp/g/adapter.gguf" "$tmp/ow2/"; cp "$HF/model.safetensors" "$HF/config.json" "$HF/tokenizer.json" "$tmp/ow2/"
train -o "$tmp/ow2" --steps 2 --val-split 0 --overwrite 2> "$tmp/err.txt"; rc=$?
# (the old run's TensorBoard events file goes too: the one there is the new run's)
kept=$(cd "$tmp/ow2" && ls | sed 's/^events\.out\.tfevents\..*/events.out.tfevents.*/' | sort | tr '\n' ' ')
want="adapter_config.json adapter_model.safetensors checkpoint-500 checkpoint-7 checkpoint-best events.out.tfevents.* metrics.jsonl notes.txt "
[ $rc -eq 0 ] && [ "$kept" = "$want" ] && [ -s "$tmp/ow2/checkpoint-500/trainer_state.json" ] \
    && [ -s "$tmp/ow2/checkpoint-best/trainer_state.json" ] && [ -s "$tmp/ow2/checkpoint-7/notes.txt" ] \
    && pass overwrite_removes_only_ftune_outputs || fail overwrite_removes_only_ftune_outputs "exit $rc; kept: $kept; want: $want $(cat "$tmp/err.txt")"

# 18. a second run on the same output directory while one is running is refused, naming the first
"$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/lk" --steps 100000 --val-split 0 2> "$tmp/lk.err" &
pid=$!
for _ in $(seq 1 500); do [ -s "$tmp/lk/metrics.jsonl" ] && break; sleep 0.01; done
expect_error lock_refuses_second_run "another training run (process $pid)" train -o "$tmp/lk" --steps 2 --overwrite
kill -INT $pid; wait $pid
[ -n "$(ls -d "$tmp"/lk/checkpoint-* 2>/dev/null)" ] && [ -z "$(ls -d "$tmp"/lk/*.tmp* 2>/dev/null)" ] \
    && pass lock_first_run_intact || fail lock_first_run_intact "$(cat "$tmp/lk.err"; ls "$tmp/lk")"

# 19. --full into the base model's own directory is refused before any step, writing nothing there
cp -r "$HF" "$tmp/hfcopy"; before=$(ls "$tmp/hfcopy" | sort | tr '\n' ' ')
expect_error full_into_model_dir "base model's directory" "$FT" train -m "$tmp/hfcopy" --data "$tmp/d.jsonl" --ctx 64 \
    -t 1 --full --steps 2 -o "$tmp/hfcopy" --overwrite
[ "$(ls "$tmp/hfcopy" | sort | tr '\n' ' ')" = "$before" ] && [ ! -e "$tmp/hfcopy/.ftune.lock" ] \
    && pass full_into_model_dir_writes_nothing || fail full_into_model_dir_writes_nothing "$(ls -a "$tmp/hfcopy")"

# 20. a damaged checkpoint file is named on resume (nothing loaded); the earlier checkpoint still resumes
train -o "$tmp/ck" "${rt[@]}" --save-every 3 2> "$tmp/err.txt" || fail ckpt_reference "$(cat "$tmp/err.txt")"
for f in optimizer trainable; do
    cp -r "$tmp/ck" "$tmp/ck_$f"
    $PY - "$tmp/ck_$f/checkpoint-6/$f.safetensors" <<'EOF'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
b[len(b) - 5] ^= 0x10  # one bit of the last tensor's data
open(p, "wb").write(b)
EOF
    expect_error "ckpt_damaged_$f" "$f.safetensors is damaged.*checkpoint-3" \
        train -o "$tmp/ck_$f" "${rt[@]}" --resume "$tmp/ck_$f/checkpoint-6"
done
train -o "$tmp/ck_trainable" "${rt[@]}" --resume "$tmp/ck_trainable/checkpoint-3" 2> "$tmp/err.txt" \
    && [ "$(losses "$tmp/ck_trainable/metrics.jsonl")" = "$a" ] && pass ckpt_damaged_earlier_resumes \
    || fail ckpt_damaged_earlier_resumes "$(cat "$tmp/err.txt")"

# 21. every field of trainer_state.json is checked for type and range
# (the edited state signed again, tests/ckpt_state.py, so that each field's own check is what refuses it)
bad_state() {  # name, python statement editing the dict s, expected message
    rm -rf "$tmp/bs"; cp -r "$tmp/ck" "$tmp/bs"
    $PY tests/ckpt_state.py "$tmp/bs/checkpoint-3/trainer_state.json" "$2"
    expect_error "state_$1" "$3" train -o "$tmp/bs" "${rt[@]}" --resume "$tmp/bs/checkpoint-3"
}
bad_state micro_step_negative 's["micro_step"] = "-1"' 'micro_step.*not a non-negative integer'
bad_state micro_step_overflow 's["micro_step"] = "18446744073709551616"' 'micro_step.*out of range'
bad_state micro_step_too_large 's["micro_step"] = "100"' 'micro_step 100 does not fit step 3'
bad_state micro_step_number 's["micro_step"] = 6' 'micro_step.*string'
bad_state step_fraction 's["step"] = 2.5' '"step" must be an integer'
bad_state step_string 's["step"] = "3"' '"step" must be an integer'
bad_state epoch_negative 's["data_epoch"] = -1' 'data_epoch'
bad_state index_huge 's["data_index"] = 1e300' 'data_index'
bad_state unknown_field 's["stepp"] = 3' 'unknown field "stepp"'
bad_state no_checksums 'del s["checksums"]' 'checksums'
bad_state checksum_path 's["checksums"]["../x"] = "0"*16' 'not a checkpoint file'
bad_state version_1 's["version"] = 1' 'version 1'
# the data cursor and the micro-step are cross-checked: step x --grad-accum micro-batches, and
# the cursor where they end (a checkpoint that says otherwise would resume on other batches)
bad_state micro_step_short 's["micro_step"] = "5"' 'micro_step 5 does not fit step 3 with 2 micro-batch(es) per step (it must be 6)'
bad_state cursor_index 's["data_index"] += 1' 'data cursor epoch [0-9]*, index [0-9]*, but step 3.s 6 micro-batches end at'
bad_state cursor_epoch 's["data_epoch"] += 1' 'data cursor epoch [0-9]*, index [0-9]*, but step 3.s 6 micro-batches end at'
# the state's own checksum: one digit changed in the file (not signed again) is damage, named
flip_state() {  # name, python statement on the file's text t (u: the text to write), expected message
    rm -rf "$tmp/bs"; cp -r "$tmp/ck" "$tmp/bs"
    $PY - "$tmp/bs/checkpoint-3/trainer_state.json" "$2" <<'EOF'
import re, sys
p = sys.argv[1]; t = open(p).read(); u = t; exec(sys.argv[2]); assert u != t
open(p, "w").write(u)
EOF
    expect_error "state_flip_$1" "${3:-checkpoint-3/trainer_state.json: the file is damaged}" \
        train -o "$tmp/bs" "${rt[@]}" --resume "$tmp/bs/checkpoint-3"
}
flip_state data_index 'u = re.sub(r"(\"data_index\":\s*\d*)(\d)", lambda m: m[1] + str((int(m[2]) + 1) % 10), t)'
flip_state micro_step 'u = t.replace("\"micro_step\":\t\"6\"", "\"micro_step\":\t\"5\"")'
flip_state lr 'u = re.sub(r"(\"lr\":\s*)0\.001", r"\g<1>0.004", t)'
flip_state checksum_digit 'i = t.rindex("\"state_checksum\"") + 19; u = t[:i] + ("1" if t[i] != "1" else "2") + t[i + 1:]'
flip_state checksum_not_last 'm = re.search(r",\s*(\"state_checksum\":\s*\"[0-9a-f]{16}\")", t); u = t[:m.start()] + t[m.end():]; u = u.replace("{", "{" + m[1] + ",", 1)' \
    'trainer_state.json: "state_checksum" must be the file.s last field'
# a checkpoint written before the state checksum (version 3) resumes, cross-checked
rm -rf "$tmp/v3"; cp -r "$tmp/ck" "$tmp/v3"
$PY tests/ckpt_state.py "$tmp/v3/checkpoint-3/trainer_state.json" 's["version"] = 3'
train -o "$tmp/v3" "${rt[@]}" --resume "$tmp/v3/checkpoint-3" 2> "$tmp/err.txt" \
    && [ "$(losses "$tmp/v3/metrics.jsonl")" = "$a" ] && pass version_3_resumes \
    || fail version_3_resumes "$(cat "$tmp/err.txt")"
bad_state version_3_cursor 's["version"] = 3; s["data_index"] += 1' 'data cursor epoch [0-9]*, index [0-9]*, but step 3.s 6'

# 22. data: other field names (gsm8k's question/answer), truncation that loses targets
# is reported and --truncate prompt keeps them, a NUL in a string is refused
head -50 "$D/text/gsm8k/test.jsonl" > "$tmp/gsm.jsonl"
expect_error gsm8k_needs_keys '"question"\|known fields' train -o "$tmp/gsm0" --data "$tmp/gsm.jsonl" --steps 1
"$FT" train -m "$HF" --data "$tmp/gsm.jsonl" -o "$tmp/gsm" -c 128 --truncate prompt -t 1 --steps 1 --val-split 0 \
    --prompt-key question --completion-key answer 2> "$tmp/err.txt" \
    && grep -q "data: 50 training examples .*format completion" "$tmp/err.txt" && pass gsm8k_prompt_completion_keys \
    || fail gsm8k_prompt_completion_keys "$(cat "$tmp/err.txt")"
AL=$D/text/alpaca/alpaca_200.json
"$FT" train -m "$HF" --data "$AL" -o "$tmp/al1" --ctx-size 128 -t 1 --steps 1 --val-split 0 2> "$tmp/err.txt" \
    && grep -q "data: 47 training examples" "$tmp/err.txt" \
    && grep -q "153 of them lost all their target tokens to truncation and were dropped (--truncate prompt" "$tmp/err.txt" \
    && pass truncation_lost_targets_reported || fail truncation_lost_targets_reported "$(cat "$tmp/err.txt")"
"$FT" train -m "$HF" --data "$AL" -o "$tmp/al2" --ctx 128 -t 1 --steps 1 --val-split 0 --truncate prompt 2> "$tmp/err.txt" \
    && grep -q "data: 200 training examples" "$tmp/err.txt" && ! grep -q "lost all their target" "$tmp/err.txt" \
    && pass truncate_prompt_keeps_targets || fail truncate_prompt_keeps_targets "$(cat "$tmp/err.txt")"
expect_error truncate_bad_side "expects end or prompt" train -o "$tmp/x3" --truncate middle --steps 1
expect_error ctx_twice "not both" train -o "$tmp/x3" --ctx 32 -c 64 --steps 1
printf '{"text": "ok"}\n{"text": "a\\u0000b"}\n' > "$tmp/nul.jsonl"
expect_error data_nul_escape "nul.jsonl:2: a NUL character" train -o "$tmp/x3" --data "$tmp/nul.jsonl" --steps 1
printf '{"text": "ok"}\n{"text": "a\0b"}\n' > "$tmp/nul2.jsonl"
expect_error data_nul_raw "nul2.jsonl:2: a NUL character" train -o "$tmp/x3" --data "$tmp/nul2.jsonl" --steps 1
"$FT" train -m "$HF" --data "$AL" -o "$tmp/al3" --ctx 128 -t 1 --steps 1 --val-split 0 --progress 2> "$tmp/err.txt" \
    && grep -q "tokenizing the data  100%" "$tmp/err.txt" && pass train_data_progress || fail train_data_progress "$(cat "$tmp/err.txt")"

# 23. two runs started together on one output directory: one trains, the other is refused
# (by the lock, or as a non-empty directory if the first already finished); no temporary left
for k in 1 2; do
    "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/two" --steps 3 --save-every 1 \
        --val-split 0 2> "$tmp/two$k.err" &
    eval "p$k=\$!"
done
wait $p1; r1=$?; wait $p2; r2=$?
if [ $(( (r1 == 0) + (r2 == 0) )) -eq 1 ] && cat "$tmp/two1.err" "$tmp/two2.err" | grep -q "another training run\|not empty" \
    && [ -z "$(ls -d "$tmp"/two/*.tmp* 2>/dev/null)" ] && [ "$(wc -l < "$tmp/two/metrics.jsonl")" -eq 3 ]; then
    pass concurrent_start_one_wins
else fail concurrent_start_one_wins "exits $r1 $r2: $(cat "$tmp/two1.err" "$tmp/two2.err"; ls "$tmp/two")"; fi
