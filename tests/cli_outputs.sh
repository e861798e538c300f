#!/usr/bin/env bash
# What ftune writes, and what it refuses to write, on stories260K: merge
# refuses a weight its output dtype cannot hold (f16's range, q8_0's and
# q4_0's f16 block scales) instead of writing inf, naming the tensor and the
# value, and leaves no output behind.
set -u
. "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1

# a copy of the HF model with one weight edited: name, element, value
edit_weight() {  # dir tensor index value
    rm -rf "$1"; cp -r "$HF" "$1"
    $PY - "$1/model.safetensors" "$2" "$3" "$4" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
v = h[sys.argv[2]]; assert v["dtype"] == "F32", v
f.seek(8 + n + v["data_offsets"][0] + 4 * int(sys.argv[3])); f.write(struct.pack("<f", float(sys.argv[4])))
EOF
}
# nothing of OUT is there: no file, no directory, no temporary beside it
left_nothing() { ! ls -d "$1"* > /dev/null 2>&1; }

# 1. a weight beyond what the output dtype holds is refused, naming the tensor and value
W=model.layers.1.mlp.up_proj.weight  # 64 columns: whole q8_0/q4_0 blocks
edit_weight "$tmp/big" $W 40 1e7   # beyond f16 (65504), q8_0 (65504 * 127), q4_0 (65504 * 8)
for dt in f16 q8_0 q4_0; do
    case $dt in f16) out=$tmp/big-f16 name=$W range="f16 holds magnitudes up to 65504" ;;
                *) out=$tmp/big-$dt.gguf name=blk.1.ffn_up.weight range="$dt's f16 block scale" ;; esac
    expect_error "merge_overflow_$dt" "$name: row 0, column 40 is 1e+07, which $dt cannot hold ($range" \
        "$FT" merge -m "$tmp/big" -o "$out" --dtype $dt
    [ -e "$out/model.safetensors" ] || [ -f "$out" ] && fail "merge_overflow_${dt}_no_file" "$(ls -la "$out")" \
        || pass "merge_overflow_${dt}_no_file"
done
# q4_0 holds less than q8_0: 1e6 fits q8_0's scale (1e6 / 127 < 65504), not q4_0's (1e6 / 8)
edit_weight "$tmp/mid" $W 40 1e6
"$FT" merge -m "$tmp/mid" -o "$tmp/mid-q8.gguf" --dtype q8_0 2> "$tmp/err.txt" && pass merge_q8_0_holds_1e6 \
    || fail merge_q8_0_holds_1e6 "$(cat "$tmp/err.txt")"
expect_error merge_overflow_q4_0_1e6 "blk.1.ffn_up.weight: row 0, column 40 is 1e+06, which q4_0 cannot hold" \
    "$FT" merge -m "$tmp/mid" -o "$tmp/mid-q4.gguf" --dtype q4_0
# what does hold it is written: f32 and bf16
"$FT" merge -m "$tmp/big" -o "$tmp/big-f32" --dtype f32 2> "$tmp/err.txt" \
    && "$FT" merge -m "$tmp/big" -o "$tmp/big-bf16" --dtype bf16 2>> "$tmp/err.txt" \
    && pass merge_overflow_f32_bf16_written || fail merge_overflow_f32_bf16_written "$(cat "$tmp/err.txt")"
