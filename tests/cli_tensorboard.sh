#!/usr/bin/env bash
# `ftune train`'s TensorBoard event files, read back with TensorBoard's own
# EventAccumulator (the tensorboard package in .venv): every step and every
# scalar against metrics.jsonl, with validation, f16 loss scaling, a run
# resumed from a checkpoint (no step twice, none missing), --tensorboard DIR,
# --no-tensorboard, --overwrite, an unwritable DIR, and per-rank step times
# under MPI when the build has it.
set -u
. "$(dirname "$0")/lib.sh"
VPY=.venv/bin/python
export OMP_NUM_THREADS=1
if ! "$VPY" -c "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator" 2> /dev/null; then
    skip_or_fail tensorboard tool "$VPY cannot import tensorboard's EventAccumulator (scripts/setup.sh installs it)"; exit
fi

stories_jsonl "$tmp/d.jsonl" 8
train() { "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet "$@"; }

# same_as_metrics NAME EVENTS_DIR METRICS [FILES]: every scalar of every step
# in EVENTS_DIR is metrics.jsonl's, each step once, none missing; FILES: how
# many events files there must be. With TB_TRAINING_ONLY=1, the speed and
# memory (another run's) are not compared, their steps are
cat > "$tmp/check.py" <<'P'
import glob, json, math, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator, SCALARS
d, metrics = sys.argv[1], sys.argv[2]
files = glob.glob(os.path.join(d, "events.out.tfevents.*"))
if len(sys.argv) > 3:
    assert len(files) == int(sys.argv[3]), files
ea = EventAccumulator(d, size_guidance={SCALARS: 0})  # 0: keep every event
ea.Reload()
m = [json.loads(l) for l in open(metrics)]
steps = [x["step"] for x in m]
assert steps == list(range(1, len(m) + 1)), steps
# tag: (metrics key, index or None, absolute tolerance from metrics.jsonl's digits)
want = {}
for x in m:
    keys = {"train/loss": ("loss", None, 0), "train/learning_rate": ("lr", None, 0),
            "train/grad_norm": ("grad_norm", None, 0),
            "train/tokens_per_second": ("tokens_per_s", None, 0.05),  # %.1f in metrics.jsonl
            "memory/peak_rss": ("peak_rss_mib", None, 0.05)}          # %.1f
    if "val_loss" in x: keys["eval/loss"] = ("val_loss", None, 0)
    if "loss_scale" in x: keys["train/loss_scale"] = ("loss_scale", None, 0)
    for q in range(len(x.get("step_time_s", []))):
        keys["dist/step_time_s/rank_%d" % q] = ("step_time_s", q, 0)
    for tag, k in keys.items():
        want.setdefault(tag, []).append((x["step"], k))
key_of = {tag: rows[0][1][0] for tag, rows in want.items()}
assert sorted(ea.Tags()["scalars"]) == sorted(want), (ea.Tags()["scalars"], sorted(want))
n = 0
for tag, rows in want.items():
    got = ea.Scalars(tag)
    assert [e.step for e in got] == [s for s, _ in rows], (tag, [e.step for e in got])
    if os.environ.get("TB_TRAINING_ONLY") and key_of[tag] in ("tokens_per_s", "peak_rss_mib", "step_time_s"):
        continue
    for e, (s, (key, i, atol)) in zip(got, rows):
        v = m[s - 1][key] if i is None else m[s - 1][key][i]
        if v is None:  # metrics.jsonl's null: a value that is not finite
            assert not math.isfinite(e.value), (tag, s, e.value)
            continue
        # the event holds a float32 and metrics.jsonl 9 significant digits (step
        # times 6): float32's half ulp, 6e-8 relative, and the printed rounding
        tol = atol + abs(v) * (6e-8 + (5e-6 if key == "step_time_s" else 5e-9)) + 1e-30
        assert abs(e.value - v) <= tol, (tag, s, e.value, v)
        n += 1
print("%d scalars over %d steps in %d file(s) as metrics.jsonl" % (n, len(m), len(files)))
P
same_as_metrics() {  # name events_dir metrics [files]
    if "$VPY" "$tmp/check.py" "${@:2}" > "$tmp/py.txt" 2>&1; then pass "$1"; cat "$tmp/py.txt"
    else fail "$1" "$(tail -5 "$tmp/py.txt")"; fi
}

# 1. by default into -o, with validation every 2 steps and at the end
common=(--steps 6 --lr 1e-2 --val-split 0.25 --eval-every 2 --seed 3)
train -o "$tmp/a" "${common[@]}" 2> "$tmp/err.txt" || fail train_default "$(cat "$tmp/err.txt")"
same_as_metrics events_in_out_dir "$tmp/a" "$tmp/a/metrics.jsonl" 1
grep -q val_loss "$tmp/a/metrics.jsonl" && pass eval_loss_logged || fail eval_loss_logged "$(cat "$tmp/a/metrics.jsonl")"

# 2. resumed from checkpoint-3 of a run that went on to step 6: the file keeps
#    steps 1-3, the resumed 4-6 replace the first run's, nothing twice
train -o "$tmp/r" "${common[@]}" --save-every 3 2> "$tmp/err.txt" || fail resume_first "$(cat "$tmp/err.txt")"
train -o "$tmp/r" "${common[@]}" --save-every 3 --resume "$tmp/r/checkpoint-3" 2> "$tmp/err.txt" ||
    fail resume_run "$(cat "$tmp/err.txt")"
same_as_metrics resumed_no_step_twice "$tmp/r" "$tmp/r/metrics.jsonl" 1
#    (the check's control: the same file with its last record twice fails it)
mkdir -p "$tmp/dup" && cp "$tmp/r"/events.out.tfevents.* "$tmp/dup/"
"$VPY" -c "import glob, struct
f, = glob.glob('$tmp/dup/events.out.tfevents.*'); b = open(f, 'rb').read(); off = 0
while off < len(b): n, = struct.unpack_from('<Q', b, off); last = b[off:off + 16 + n]; off += 16 + n
open(f, 'ab').write(last)"
"$VPY" "$tmp/check.py" "$tmp/dup" "$tmp/r/metrics.jsonl" > /dev/null 2>&1 && fail check_sees_a_step_twice "passed" ||
    pass check_sees_a_step_twice
#    and its losses are the uninterrupted run's (bit-exact resume): the same events
TB_TRAINING_ONLY=1 same_as_metrics resumed_is_uninterrupted "$tmp/r" "$tmp/a/metrics.jsonl"
#    a first run stopped after its checkpoint (steps 1-3 only): resuming appends 4-6
train -o "$tmp/s" "${common[@]}" --steps 6 --save-every 3 2> /dev/null
"$VPY" - "$tmp/s" <<'P' 2> "$tmp/py.txt"
# the events a run killed after step 3 left: steps 4-6 cut by hand (TFRecord walk)
import glob, struct, sys
from tensorboard.compat.proto import event_pb2
f, = glob.glob(sys.argv[1] + "/events.out.tfevents.*")
b, out, off = open(f, "rb").read(), b"", 0
while off < len(b):
    n, = struct.unpack_from("<Q", b, off); rec = b[off:off + 16 + n]
    if event_pb2.Event.FromString(rec[12:12 + n]).step <= 3: out += rec
    off += 16 + n
open(f, "wb").write(out + b"\x40\0\0\0\0\0\0\0\1\2\3")  # and half a record
P
train -o "$tmp/s" "${common[@]}" --save-every 3 --resume "$tmp/s/checkpoint-3" 2> "$tmp/err.txt" ||
    fail resume_after_crash "$(cat "$tmp/err.txt")"
same_as_metrics resumed_after_torn_record "$tmp/s" "$tmp/s/metrics.jsonl" 1

# 3. --tensorboard DIR: there, not in -o; a second run into DIR is refused, --overwrite replaces it
train -o "$tmp/b" --steps 3 --val-split 0 --tensorboard "$tmp/tb/run1" 2> "$tmp/err.txt" ||
    fail tensorboard_dir "$(cat "$tmp/err.txt")"
same_as_metrics events_in_given_dir "$tmp/tb/run1" "$tmp/b/metrics.jsonl" 1
ls "$tmp/b" | grep -q tfevents && fail none_in_out_dir "$(ls "$tmp/b")" || pass none_in_out_dir
expect_error tensorboard_dir_of_another_run "holds events files" \
    train -o "$tmp/b2" --steps 3 --val-split 0 --tensorboard "$tmp/tb/run1"
train -o "$tmp/b" --steps 4 --val-split 0 --tensorboard "$tmp/tb/run1" --overwrite 2> "$tmp/err.txt" ||
    fail overwrite "$(cat "$tmp/err.txt")"
same_as_metrics overwrite_replaces_events "$tmp/tb/run1" "$tmp/b/metrics.jsonl" 1
train -o "$tmp/a" "${common[@]}" --overwrite --no-tensorboard 2> "$tmp/err.txt" || fail no_tensorboard "$(cat "$tmp/err.txt")"
ls "$tmp/a" | grep -q tfevents && fail no_tensorboard_overwrite "$(ls "$tmp/a")" || pass no_tensorboard_overwrite

# 4. a DIR that cannot be made or written: refused before step 1
: > "$tmp/file"
expect_error tensorboard_unwritable "tensorboard $tmp/file/x" train -o "$tmp/c" --steps 3 --tensorboard "$tmp/file/x"
[ -s "$tmp/c/metrics.jsonl" ] && fail unwritable_before_step_1 "$(cat "$tmp/c/metrics.jsonl")" || pass unwritable_before_step_1
expect_error tensorboard_and_no_tensorboard "not both" train -o "$tmp/c" --steps 3 --tensorboard "$tmp/tb/x" --no-tensorboard

# 5. f16 with dynamic loss scaling: train/loss_scale
train -o "$tmp/h" --steps 3 --val-split 0 --dtype f16 2> "$tmp/err.txt" || fail f16 "$(cat "$tmp/err.txt")"
grep -q loss_scale "$tmp/h/metrics.jsonl" && same_as_metrics f16_loss_scale "$tmp/h" "$tmp/h/metrics.jsonl" 1 ||
    fail f16_loss_scale "$(cat "$tmp/h/metrics.jsonl")"

# 6. under MPI: rank 0 writes, with each rank's step time
if ! command -v mpirun > /dev/null || ! ldd "$FT" 2> /dev/null | grep -q libmpi; then
    skip_or_fail mpi_step_times tool "mpirun or an MPI build of $FT missing (scripts/setup.sh, make MPI=1)"
else
    if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
    if timeout 120 mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo -np 2 \
        "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 64 -t 1 --quiet -o "$tmp/m" --steps 3 --batch-size 2 \
        --val-split 0 > "$tmp/out.txt" 2>&1 && grep -q '"step_time_s":\[[^],]*,[^],]*\]' "$tmp/m/metrics.jsonl"; then
        same_as_metrics mpi_step_times "$tmp/m" "$tmp/m/metrics.jsonl" 1
    else fail mpi_step_times "$(tail -5 "$tmp/out.txt"; cat "$tmp/m/metrics.jsonl" 2>&1)"; fi
fi
