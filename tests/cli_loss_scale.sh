#!/usr/bin/env bash
# `ftune train --loss-scale` end to end on stories260K: the option and its
# help, the progress line and metrics.jsonl fields (only with scaling on),
# f32 dynamic scaling equal bit for bit to none, a CLI resume that continues
# the scaler, and every new trainer_state.json field checked on resume; a
# non-finite value is null, not nan, in metrics.jsonl and eval --json, and a
# non-finite loss in training (an f16 forward that overflowed) is an error.
# (The overflow, skip and growth semantics are in test_grad_scaler.)
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

stories_jsonl "$tmp/d.jsonl" 4
train() { "$FT" train -m "$HF" --data "$tmp/d.jsonl" --ctx 32 -t 1 --val-split 0 --steps 6 --grad-accum 2 \
          --lora-dropout 0.1 --lr 1e-3 --seed 3 "$@"; }

# 1. --help documents the modes and that bf16 needs no scaler; a bad value is refused
"$FT" train --help 2>&1 | grep -A3 -- "--loss-scale" | tr -s ' \n' ' ' | grep -q "dynamic.*bf16.*need no scaler" \
    && pass help_loss_scale || fail help_loss_scale "$("$FT" train --help 2>&1 | grep -A3 -- --loss-scale)"
expect_error bad_loss_scale 'loss-scale "sometimes": expected dynamic, none' train -o "$tmp/x" --loss-scale sometimes
expect_error zero_loss_scale 'loss-scale "0"' train -o "$tmp/x" --loss-scale 0
expect_error unrepresentable_loss_scale 'loss-scale 0.1 is not exactly an f32.*nearest is 0.10000000149011612.*2^-3 = 0.125' \
    train -o "$tmp/x" --loss-scale 0.1
# 1e-30 is within f32's range but not one exactly; 1e-50 is outside it: each message says which
expect_error loss_scale_1e-30 'loss-scale 1e-30 is not exactly an f32.*nearest is 1.0000000031710769e-30.*2^-100 = 7.8886090522101181e-31' \
    train -o "$tmp/x" --loss-scale 1e-30
expect_error loss_scale_1e-50 'loss-scale 1e-50: outside the range of normal f32 numbers.*2^-126 = 1.1754943508222875e-38, 3.4028234663852886e+38' \
    train -o "$tmp/x" --loss-scale 1e-50

# 2. dynamic in f32: the same bits as none; the progress line and metrics show the
# scale only with scaling on
train -o "$tmp/none" 2> "$tmp/none.txt" || fail run_none "$(cat "$tmp/none.txt")"
train -o "$tmp/dyn" --loss-scale dynamic 2> "$tmp/dyn.txt" || fail run_dynamic "$(cat "$tmp/dyn.txt")"
cmp -s "$tmp/none/adapter_model.safetensors" "$tmp/dyn/adapter_model.safetensors" && pass f32_dynamic_same_adapter \
    || fail f32_dynamic_same_adapter "adapters differ"
grep -q "^loss scale: 65536 (0 step(s) skipped so far)" "$tmp/dyn.txt" \
    && grep -q "^step 6/6 .* scale 65536  skipped 0" "$tmp/dyn.txt" && ! grep -q "scale" "$tmp/none.txt" \
    && pass progress_line_scale || fail progress_line_scale "$(cat "$tmp/dyn.txt")"
$PY - "$tmp/none/metrics.jsonl" "$tmp/dyn/metrics.jsonl" <<'EOF' && pass metrics_fields || fail metrics_fields "see above"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 6
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] and x["lr"] == y["lr"], (x, y)
    assert not any(k in x for k in ("loss_scale", "skipped_steps", "skipped")), x
    assert y["loss_scale"] == 65536 and y["skipped_steps"] == 0 and y["skipped"] is False, y
EOF

# 3. a CLI resume continues the scaler and is bit-exact
train -o "$tmp/r" --loss-scale dynamic --save-every 3 2> "$tmp/err.txt" || fail resume_save "$(cat "$tmp/err.txt")"
$PY - "$tmp/r/checkpoint-3/trainer_state.json" <<'EOF' && pass checkpoint_v3_fields || fail checkpoint_v3_fields "see above"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["version"] == 4 and s["skipped_steps"] == 0, s
assert s["loss_scaler"] == {"mode": "dynamic", "scale": 65536, "growth_tracker": 3, "growth_interval": 2000}, s["loss_scaler"]
EOF
train -o "$tmp/r" --loss-scale dynamic --resume "$tmp/r/checkpoint-3" 2> "$tmp/err.txt" \
    && cmp -s "$tmp/r/adapter_model.safetensors" "$tmp/dyn/adapter_model.safetensors" && pass resume_dynamic_bit_exact \
    || fail resume_dynamic_bit_exact "$(cat "$tmp/err.txt")"
expect_error resume_other_mode "checkpoint's run used --loss-scale dynamic, this run none" \
    train -o "$tmp/r" --resume "$tmp/r/checkpoint-3"
train -o "$tmp/f" --loss-scale 256 --save-every 3 2> "$tmp/err.txt" || fail fixed_run "$(cat "$tmp/err.txt")"
expect_error resume_other_fixed "used --loss-scale N (fixed), this run dynamic" \
    train -o "$tmp/f" --loss-scale dynamic --resume "$tmp/f/checkpoint-3"
expect_error resume_other_fixed_scale "used --loss-scale 256, this run 512" \
    train -o "$tmp/f" --loss-scale 512 --resume "$tmp/f/checkpoint-3"
cmp -s "$tmp/f/adapter_model.safetensors" "$tmp/dyn/adapter_model.safetensors" && pass f32_fixed_same_adapter \
    || fail f32_fixed_same_adapter "adapters differ"

# 4. every new field of trainer_state.json is checked for type and range
bad_state() {  # name, python statement editing the dict s (then signed again: tests/ckpt_state.py), expected message
    rm -rf "$tmp/bs"; cp -r "$tmp/r" "$tmp/bs"
    $PY tests/ckpt_state.py "$tmp/bs/checkpoint-3/trainer_state.json" "$2"
    expect_error "state_$1" "$3" train -o "$tmp/bs" --loss-scale dynamic --resume "$tmp/bs/checkpoint-3"
}
bad_state skipped_too_many 's["skipped_steps"] = 4' '"skipped_steps" must be an integer in \[0, step 3\]'
bad_state skipped_missing 'del s["skipped_steps"]' '"skipped_steps" must be'
bad_state skipped_vs_optimizer 's["skipped_steps"] = 1' 'optimizer step 3, but the checkpoint is at step 3 with 1 skipped'
bad_state scale_negative 's["loss_scaler"]["scale"] = -2' '"scale" must be a positive finite f32'
bad_state scale_not_f32 's["loss_scaler"]["scale"] = 0.1' '"scale" must be a positive finite f32'
bad_state tracker_too_large 's["loss_scaler"]["growth_tracker"] = 2000' '"growth_tracker" must be an integer in \[0, growth_interval 2000)'
bad_state interval_zero 's["loss_scaler"]["growth_interval"] = 0' '"growth_interval" must be an integer'
bad_state mode_unknown 's["loss_scaler"]["mode"] = "static"' '"mode" must be "dynamic" or "fixed"'
bad_state scaler_field 's["loss_scaler"]["hysteresis"] = 2' '"loss_scaler": unknown field "hysteresis"'
bad_state scaler_not_object 's["loss_scaler"] = 65536' '"loss_scaler" must be an object'
bad_state version_5 's["version"] = 5' 'reads versions 2 to 4'
bad_state v2_with_v3_field 's["version"] = 2' 'unknown field "skipped_steps" (in a version 2 checkpoint)'
bad_state v3_with_v4_field 's["version"] = 3; s["state_checksum"] = "0" * 16' 'unknown field "state_checksum" (in a version 3 checkpoint)'
# a version 3 checkpoint (no checksum of its own) with a dynamic scaler: nothing checks its state
bad_state v3_dynamic_scaler 's["version"] = 3' 'version 3 checkpoint has no checksum of its own, and its dynamic loss scaler'
# a version 2 checkpoint resumes, the scaler at its initial state
bad_v2() { rm -rf "$tmp/v2"; cp -r "$tmp/r" "$tmp/v2"
    $PY tests/ckpt_state.py "$tmp/v2/checkpoint-3/trainer_state.json" 's["version"] = 2; del s["skipped_steps"]; del s["loss_scaler"]'
}
bad_v2
train -o "$tmp/v2" --loss-scale dynamic --resume "$tmp/v2/checkpoint-3" 2> "$tmp/err.txt" \
    && grep -q "^loss scale: 65536 (0 step(s) skipped so far)" "$tmp/err.txt" \
    && cmp -s "$tmp/v2/adapter_model.safetensors" "$tmp/dyn/adapter_model.safetensors" && pass version_2_resumes \
    || fail version_2_resumes "$(cat "$tmp/err.txt")"

# 5. JSON has no NaN or inf: a non-finite value is null in metrics.jsonl and in eval --json.
# Every input-RMSNorm weight 30000 (within f16's range, so the model loads with --dtype
# f16) makes the normalized activations, rounded to f16 as the Linears' operands, overflow:
# the f16 forward's loss is NaN
rm -rf "$tmp/ovf"; cp -r "$HF" "$tmp/ovf"
$PY - "$tmp/ovf/model.safetensors" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
for k, v in h.items():
    if k.endswith("input_layernorm.weight"):
        assert v["dtype"] == "F32", v
        a, b = v["data_offsets"]; f.seek(8 + n + a); f.write(struct.pack("<%df" % ((b - a) // 4), *[30000.0] * ((b - a) // 4)))
EOF
# strict: json.loads takes NaN and Infinity unless told not to
strict_json='import json, sys
def bad(c): raise ValueError("not JSON: " + c)
rows = [json.loads(l, parse_constant=bad) for l in open(sys.argv[1])]
assert rows and all(r[sys.argv[2]] is None for r in rows), rows
print("  %d line(s), %s null in each" % (len(rows), sys.argv[2]))'
"$FT" eval -m "$tmp/ovf" --dtype f16 --text "$tmp/d.jsonl" --json > "$tmp/ovf.json" 2> "$tmp/err.txt"
$PY -c "$strict_json" "$tmp/ovf.json" loss && $PY -c "$strict_json" "$tmp/ovf.json" ppl \
    && pass eval_json_null_not_nan || fail eval_json_null_not_nan "$(cat "$tmp/ovf.json" "$tmp/err.txt")"
# 6. a non-finite loss before scaling is an f16 forward that overflowed, which no scale
# cures: an error that says so and suggests bf16 (dynamic scaling used to skip every
# step and exit 0 with the adapter untrained, silently under --quiet)
expect_error f16_forward_overflow 'loss is nan before any loss scaling: the f16 forward overflowed.*--dtype bf16' \
    "$FT" train -m "$tmp/ovf" --data "$tmp/d.jsonl" --ctx 32 -t 1 --val-split 0 --steps 2 --dtype f16 \
    --loss-scale dynamic -o "$tmp/ovf-run" --quiet
[ ! -e "$tmp/ovf-run/adapter_model.safetensors" ] && pass f16_forward_overflow_no_adapter \
    || fail f16_forward_overflow_no_adapter "an adapter was written"
# A backward that overflows is what the scaler is for: the final norm's weight 100 keeps
# the forward finite (the loss is large) but the gradients at scale 65536 exceed f16's
# range, so the first steps skip, and a skipped step's grad norm (inf) is null
rm -rf "$tmp/bwd"; cp -r "$HF" "$tmp/bwd"
$PY - "$tmp/bwd/model.safetensors" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
v = h["model.norm.weight"]; assert v["dtype"] == "F32", v
a, b = v["data_offsets"]; f.seek(8 + n + a); f.write(struct.pack("<%df" % ((b - a) // 4), *[100.0] * ((b - a) // 4)))
EOF
all_skipped='import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert all(r["skipped"] and math.isfinite(r["loss"]) for r in rows), rows'
"$FT" train -m "$tmp/bwd" --data "$tmp/d.jsonl" --ctx 32 -t 1 --val-split 0 --steps 3 --dtype f16 \
    --loss-scale dynamic -o "$tmp/bwd-run" --quiet 2> "$tmp/err.txt" \
    && $PY -c "$strict_json" "$tmp/bwd-run/metrics.jsonl" grad_norm && $PY -c "$all_skipped" "$tmp/bwd-run/metrics.jsonl" \
    && pass metrics_null_not_nan || fail metrics_null_not_nan "$(cat "$tmp/bwd-run/metrics.jsonl" "$tmp/err.txt")"
