#!/usr/bin/env bash
# --dtype bf16|f16 end to end on stories260K: 200 LoRA steps in f32, bf16
# and f16 end within 1% of each other's validation loss (the three curves
# are printed as a table every 20 steps), full fine-tuning in bf16 within
# 1% of f32 after 30 steps; bf16 and f16 checkpoints resume
# bit for bit; a checkpoint resumed in another dtype, an unknown dtype and
# a model beyond f16's range give clear errors; merging folds in f32 and
# rounds once (the f32 and bf16 merges of one adapter differ by a number
# printed here); eval and generate take --dtype.
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1
expect_error() { # name, text the message must hold, command...
    local name=$1 want=$2; shift 2
    if "$@" > "$tmp/out.txt" 2> "$tmp/err.txt"; then fail "$name" "exit 0"
    elif grep -qF -- "$want" "$tmp/err.txt"; then pass "$name"; echo "  $(head -c 300 "$tmp/err.txt")"
    else fail "$name" "message lacks '$want': $(cat "$tmp/err.txt")"; fi
}

# 60 kB of Shakespeare as plain text (rows of 64 tokens), 5% held out
head -c 60000 "$D/text/tinyshakespeare/input.txt" > "$tmp/d.txt"
train() { "$FT" train -m "$HF" --data "$tmp/d.txt" --ctx 64 -t 1 --quiet --seed 1 "$@"; }

# 1. 200 LoRA steps per dtype, validation every 20 steps. f16 trains here
# without loss scaling: at this scale (lr 2e-3, r 8, gradients ~1e-3 and
# up) nothing underflows f16's 6e-8; larger models need the GradScaler.
ok=1
for dt in f32 bf16 f16; do
    train -o "$tmp/r_$dt" --steps 200 --eval-every 20 --lr 2e-3 --dtype "$dt" 2> "$tmp/err_$dt.txt" \
        || { fail "train_200_$dt" "$(cat "$tmp/err_$dt.txt")"; ok=0; }
done
if [ $ok = 1 ]; then
    $PY - "$tmp" <<'EOF' && pass curves_within_1pct || fail curves_within_1pct "see the table"
import json, sys
runs = {}
for dt in ("f32", "bf16", "f16"):
    runs[dt] = {m["step"]: m for m in map(json.loads, open(f"{sys.argv[1]}/r_{dt}/metrics.jsonl"))}
print("  validation loss every 20 steps (train loss in brackets)")
print("  %5s  %-20s %-20s %-20s" % ("step", "f32", "bf16", "f16"))
for s in range(20, 201, 20):
    print("  %5d  " % s + " ".join("%-20s" % ("%.4f (%.4f)" % (runs[d][s]["val_loss"], runs[d][s]["loss"]))
                                for d in ("f32", "bf16", "f16")))
f = runs["f32"][200]["val_loss"]
for d in ("bf16", "f16"):
    r = abs(runs[d][200]["val_loss"] - f) / f
    print("  final validation loss %s %.5f vs f32 %.5f: %.3f%% apart" % (d, runs[d][200]["val_loss"], f, 100 * r))
    # the issue's criterion: within 1% of the f32 run
    assert r < 0.01, d
# and the runs did differ: the products were computed in bf16/f16
assert runs["bf16"][200]["loss"] != runs["f32"][200]["loss"]
EOF
fi

# 1b. full fine-tuning in bf16: f32 masters from the weights as stored,
# bf16 compute copies; 30 steps end within 1% of f32's validation loss
for dt in f32 bf16; do
    train -o "$tmp/f_$dt" --steps 30 --lr 1e-3 --full --dtype $dt 2> "$tmp/err.txt" || fail "full_$dt" "$(cat "$tmp/err.txt")"
done
$PY - "$tmp" <<'EOF' && pass full_bf16_within_1pct || fail full_bf16_within_1pct "see above"
import json, sys
v = {d: json.loads(open(f"{sys.argv[1]}/f_{d}/metrics.jsonl").readlines()[-1])["val_loss"] for d in ("f32", "bf16")}
r = abs(v["bf16"] - v["f32"]) / v["f32"]
print("  full fine-tuning, 30 steps: validation loss f32 %.5f, bf16 %.5f: %.3f%% apart" % (v["f32"], v["bf16"], 100 * r))
assert r < 0.01
EOF
"$FT" eval -m "$tmp/f_bf16" --text "$tmp/d.txt" --json > /dev/null 2> "$tmp/err.txt" && pass full_bf16_model_loads \
    || fail full_bf16_model_loads "$(cat "$tmp/err.txt")"

# 2. resume bit for bit in bf16 and f16: dropout on, 2 micro-batches per step
rt=(--steps 10 --lr 2e-3 --lora-dropout 0.1 --grad-accum 2 --batch-size 2 --eval-every 5)
for dt in bf16 f16; do
    train -o "$tmp/u_$dt" "${rt[@]}" --dtype $dt 2> "$tmp/err.txt" || fail "resume_ref_$dt" "$(cat "$tmp/err.txt")"
    train -o "$tmp/s_$dt" "${rt[@]}" --dtype $dt --save-every 5 2> "$tmp/err.txt" || fail "resume_save_$dt" "$(cat "$tmp/err.txt")"
    rm -f "$tmp/s_$dt/adapter_model.safetensors"
    train -o "$tmp/s_$dt" "${rt[@]}" --dtype $dt --resume "$tmp/s_$dt/checkpoint-5" 2> "$tmp/err.txt" \
        || fail "resume_run_$dt" "$(cat "$tmp/err.txt")"
    a=$(tail -1 "$tmp/u_$dt/metrics.jsonl" | cut -d, -f1-2); b=$(tail -1 "$tmp/s_$dt/metrics.jsonl" | cut -d, -f1-2)
    if [ -n "$a" ] && [ "$a" = "$b" ] && cmp -s "$tmp/u_$dt/adapter_model.safetensors" "$tmp/s_$dt/adapter_model.safetensors"
    then pass "resume_bit_exact_$dt"; else fail "resume_bit_exact_$dt" "uninterrupted: $a; resumed: $b"; fi
done

# 3. a checkpoint resumes only in its own dtype
expect_error resume_other_dtype "trained with --dtype bf16, this run has --dtype f16" \
    train -o "$tmp/s_bf16" "${rt[@]}" --dtype f16 --resume "$tmp/s_bf16/checkpoint-5"
expect_error resume_bf16_in_f32 "trained with --dtype bf16, this run has --dtype f32" \
    train -o "$tmp/s_bf16" "${rt[@]}" --resume "$tmp/s_bf16/checkpoint-5"
expect_error dtype_unknown '"f8" is not one of f32, bf16, f16' \
    "$FT" eval -m "$HF" --text "$tmp/d.txt" --dtype f8

# 4. a model with a value beyond f16's range: f16 names the tensor and
# suggests bf16; bf16 loads it
"$FT" init --preset stories260K "$tmp/big" > /dev/null 2>&1 && cp "$HF/tokenizer.json" "$HF/tokenizer_config.json" "$tmp/big/"
$PY - "$tmp/big/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
t = h["model.layers.1.mlp.down_proj.weight"]
assert t["dtype"] == "F32"
o = 8 + n + t["data_offsets"][0] + 4 * 7
b[o:o + 4] = struct.pack("<f", 1.0e5)
open(p, "wb").write(b)
EOF
expect_error f16_overflow 'tensor "model.layers.1.mlp.down_proj.weight": value 100000 at [0, 7] is outside f16' \
    "$FT" eval -m "$tmp/big" --text "$tmp/d.txt" --dtype f16
grep -q "Use --dtype bf16" "$tmp/err.txt" && pass f16_overflow_suggests_bf16 || fail f16_overflow_suggests_bf16 "$(cat "$tmp/err.txt")"
"$FT" eval -m "$tmp/big" --text "$tmp/d.txt" --dtype bf16 --json > "$tmp/out.txt" 2> "$tmp/err.txt" \
    && pass bf16_takes_f32_range || fail bf16_takes_f32_range "$(cat "$tmp/err.txt")"

# 5. merge folds in f32 and rounds once: the bf16 merge of the bf16-trained
# adapter is exactly the f32 merge rounded to bf16 (RNE); their difference
# is printed. The loss of both merges equals that of base + adapter.
for mt in f32 bf16; do
    "$FT" merge -m "$HF" --adapter "$tmp/r_bf16" -o "$tmp/m_$mt" --dtype $mt 2> "$tmp/err.txt" \
        || fail "merge_$mt" "$(cat "$tmp/err.txt")"
done
$PY - "$tmp/m_f32/model.safetensors" "$tmp/m_bf16/model.safetensors" <<'EOF' && pass merge_f32_then_rounded || fail merge_f32_then_rounded "see above"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); out = {}
    for k, t in h.items():
        if k == "__metadata__": continue
        s, e = t["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        if t["dtype"] == "F32": out[k] = np.frombuffer(raw, np.float32).copy()
        elif t["dtype"] == "BF16": out[k] = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else: raise SystemExit("dtype " + t["dtype"])
    return out
def rne_bf16(x):
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)
a, b = load(sys.argv[1]), load(sys.argv[2])
worst, exact = 0.0, True
for k in a:
    if a[k].size < 2 or "norm" in k: continue
    d = np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)
    worst = max(worst, d)
    exact &= bool(np.array_equal(rne_bf16(a[k]), b[k]))
print("  f32 merge vs bf16 merge of the same adapter: max |diff| / max |w| = %.3e (bf16's unit roundoff 3.9e-3)" % worst)
assert exact, "the bf16 merge is not the f32 merge rounded once"
assert 0 < worst <= 2 ** -8
EOF
lb=$("$FT" eval -m "$HF" --adapter "$tmp/r_bf16" --text "$tmp/d.txt" --json 2>/dev/null)
lm=$("$FT" eval -m "$tmp/m_f32" --text "$tmp/d.txt" --json 2>/dev/null)
$PY -c "
import json; a=json.loads('''$lb'''); b=json.loads('''$lm''')
print('  eval loss base + bf16-trained adapter %.6f, f32 merge %.6f' % (a['loss'], b['loss']))
# the same maths in another order of f32 sums: 1e-5 of the loss
assert abs(a['loss'] - b['loss']) < 1e-5 * a['loss']
" && pass merge_same_loss || fail merge_same_loss "$lb vs $lm"

# 6. eval and generate in bf16/f16 agree with f32 closely; --help documents --dtype
e32=$("$FT" eval -m "$HF" --text "$tmp/d.txt" --json 2>/dev/null)
for dt in bf16 f16; do
    e=$("$FT" eval -m "$HF" --text "$tmp/d.txt" --json --dtype $dt 2>/dev/null)
    $PY -c "
import json; a=json.loads('''$e32'''); b=json.loads('''$e''')
r = abs(a['loss'] - b['loss']) / a['loss']
print('  eval loss f32 %.6f, $dt %.6f: %.2e apart' % (a['loss'], b['loss'], r))
# operand rounding of ~u = 4e-3 (bf16) per product averages out over the
# ~10^4 predicted tokens: measured 2e-4 (bf16), 3e-5 (f16); 2e-3 is 10x
assert 0 < r < 2e-3
" && pass "eval_$dt" || fail "eval_$dt" "$e32 vs $e"
    "$FT" generate -m "$HF" -p "Once upon a time" -n 16 --temp 0 --quiet --dtype $dt > "$tmp/g.txt" 2> "$tmp/err.txt" \
        && [ -s "$tmp/g.txt" ] && pass "generate_$dt" || fail "generate_$dt" "$(cat "$tmp/err.txt")"
done
for c in train eval generate; do
    "$FT" $c --help 2>&1 | grep -q -- "--dtype T" || fail "help_$c" "no --dtype in ftune $c --help"
done
"$FT" train --help 2>&1 | grep -q "bf16 needs no loss scaling" && pass help_dtype || fail help_dtype "train --help"
# 7. bf16 on a CPU without BF16 instructions (forced with FTUNE_CPU=avx2):
# it runs, says so once, and computes what the native level computes
eb=$("$FT" eval -m "$HF" --text "$tmp/d.txt" --json --dtype bf16 2>/dev/null)
ew=$(FTUNE_CPU=avx2 "$FT" eval -m "$HF" --text "$tmp/d.txt" --json --dtype bf16 2> "$tmp/err.txt")
n=$(grep -c "runs on the widening path" "$tmp/err.txt")
$PY -c "
import json; a=json.loads('''$eb'''); b=json.loads('''$ew''')
print('  bf16 eval loss, native level %.7f, widening (avx2) %.7f' % (a['loss'], b['loss']))
# the same rounded operands, but VDPBF16PS sums in another f32 order (pairs,
# subnormals flushed): ~1e-7 per product, and where that moves an
# activation across a bf16 rounding boundary the next layer's operand moves
# by a whole bf16 ulp (2^-8) -- so the loss moves by more than the sums do:
# measured 1.1e-5 relative; 5e-5 is 5x that, and well under the 1.4e-4 that
# separates bf16 from f32 (a kernel that did not round would fail it)
assert abs(a['loss'] - b['loss']) <= 5e-5 * a['loss']
" && [ "$n" = 1 ] && pass bf16_widening_path || fail bf16_widening_path "note printed $n times; $eb vs $ew"
# 8. ftune info names the kernel level, which FTUNE_CPU caps, and whether bf16 is native there
ig=$(FTUNE_CPU=generic "$FT" info -m "$HF" 2>&1 | grep '^kernels:')
ia=$("$FT" info -m "$HF" 2>&1 | grep '^kernels:')
[ "$ig" = "kernels:        generic (this CPU; bf16 products widened to f32)" ] && [ -n "$ia" ] &&
    pass info_kernels || fail info_kernels "generic: '$ig', default: '$ia'"
if grep -qw avx512_bf16 /proc/cpuinfo && grep -qw avx512f /proc/cpuinfo; then
    # amx where the tile probe passes (cli_amx.sh)
    case "$ia" in
    "kernels:        avx512bf16 (this CPU; bf16 products native)" | \
        "kernels:        amx (this CPU; bf16 products native)") pass info_kernels_bf16 ;;
    *) fail info_kernels_bf16 "$ia" ;;
    esac
else
    skip_or_fail info_kernels_bf16 hardware "/proc/cpuinfo lists no avx512_bf16 (with avx512f): bf16 products are widened here"
fi
