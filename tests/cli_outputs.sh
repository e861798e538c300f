#!/usr/bin/env bash
# What ftune writes, and what it refuses to write, on stories260K: merge
# refuses a weight its output dtype cannot hold (f16's range, q8_0's and
# q4_0's f16 block scales) instead of writing inf, naming the tensor and the
# value, and leaves no output behind; a failure part-way through merge,
# quantize or init leaves no partial output; init validates first and does
# not overwrite an existing model unless asked.
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
# left_nothing NAME OUT: nothing of OUT is there: no file, no directory, no temporary beside it
left_nothing() {
    if ls -d "$2"* > /dev/null 2>&1; then fail "$1" "left: $(ls -d "$2"*)"; else pass "$1"; fi
}

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
left_nothing merge_overflow_f16_no_dir "$tmp/big-f16"

# 2. a failure part-way (here a file-size limit, as a full disk) leaves no partial output:
# merge to a directory and to GGUF, quantize to bitsandbytes (its f32 stage included), init
fsize_fails() {  # name KB out command...: exits non-zero (not killed) and leaves nothing of out
    local name=$1 kb=$2 out=$3; shift 3
    ( ulimit -f "$kb"; exec "$@" ) > /dev/null 2> "$tmp/err.txt"; local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name" "exit $rc: $(cat "$tmp/err.txt")"
    elif ls -d "$out"* > /dev/null 2>&1; then fail "$name" "left: $(ls -d "$out"*)"
    else pass "$name"; fi
}
fsize_fails merge_dir_disk_full 300 "$tmp/full-merge" "$FT" merge -m "$HF" -o "$tmp/full-merge"
fsize_fails merge_gguf_disk_full 300 "$tmp/full-merge.gguf" "$FT" merge -m "$HF" -o "$tmp/full-merge.gguf"
fsize_fails quantize_nf4_disk_full 600 "$tmp/full-nf4" "$FT" quantize --type nf4 "$HF" "$tmp/full-nf4"
fsize_fails merge_requant_disk_full 600 "$tmp/full-rq" "$FT" merge -m "$HF" --dtype int8 -o "$tmp/full-rq"
fsize_fails init_disk_full 300 "$tmp/full-init" "$FT" init --preset stories260K "$tmp/full-init"
# the same commands without the limit write their outputs whole
"$FT" quantize --type nf4 "$HF" "$tmp/nf4" 2> "$tmp/err.txt" && [ -s "$tmp/nf4/model.safetensors" ] \
    && grep -q quantization_config "$tmp/nf4/config.json" && ! ls -d "$tmp"/nf4.* > /dev/null 2>&1 \
    && pass quantize_nf4_whole || fail quantize_nf4_whole "$(cat "$tmp/err.txt"; ls -d "$tmp"/nf4*)"

# 3. init: the config is validated before anything is written; an existing model is
# not overwritten unless --overwrite (which replaces its config.json and weights)
$PY -c "import json; c = json.load(open('$HF/config.json')); c['hidden_size'] = 0; json.dump(c, open('$tmp/bad.json', 'w'))"
expect_error init_bad_config "bad.json: hidden size = 0 is not a valid size" "$FT" init --config "$tmp/bad.json" "$tmp/bad-init"
left_nothing init_bad_config_wrote_nothing "$tmp/bad-init"
rm -rf "$tmp/model"; cp -r "$HF" "$tmp/model"; before=$(cd "$tmp/model" && sha256sum * | sort)
expect_error init_existing_refused "model is not empty.*--overwrite" "$FT" init --preset stories260K "$tmp/model"
[ "$(cd "$tmp/model" && sha256sum * | sort)" = "$before" ] && ! ls -d "$tmp"/model.* > /dev/null 2>&1 \
    && pass init_existing_untouched || fail init_existing_untouched "$(ls -la "$tmp/model")"
"$FT" init --preset stories260K --seed 5 "$tmp/model" --overwrite 2> "$tmp/err.txt" \
    && ! cmp -s "$tmp/model/model.safetensors" "$HF/model.safetensors" && [ -f "$tmp/model/tokenizer.json" ] \
    && "$FT" eval -m "$tmp/model" --text "$HF/config.json" > /dev/null 2>> "$tmp/err.txt" \
    && pass init_overwrite_replaces_weights || fail init_overwrite_replaces_weights "$(cat "$tmp/err.txt")"
mkdir "$tmp/empty"
"$FT" init --preset stories260K "$tmp/empty" 2> "$tmp/err.txt" && [ -s "$tmp/empty/model.safetensors" ] \
    && pass init_into_empty_dir || fail init_into_empty_dir "$(cat "$tmp/err.txt")"
