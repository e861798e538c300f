#!/usr/bin/env bash
# The file parsers and loaders under AddressSanitizer + UBSan: builds
# `make debug` (build-debug/) and runs the format, tokenizer, data, adapter
# and forward tests there, then the loader bad-input cases through the
# sanitized ftune command. Any sanitizer report fails the test.
set -u
D=${FTUNE_DATA:-../shared/data}
S=$D/models/stories260K
export ASAN_OPTIONS=abort_on_error=0:halt_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! make -s debug > "$tmp/build.log" 2>&1; then
    echo "FAIL sanitizer_build"; tail -20 "$tmp/build.log"; exit 1
fi
echo "PASS sanitizer_build"
for t in test_formats test_tokenizer test_data test_adapter test_forward test_memory test_plan; do
    build-debug/tests/$t > "$tmp/$t.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && ! grep -qE "runtime error|AddressSanitizer|LeakSanitizer" "$tmp/$t.log"; then echo "PASS asan_$t"
    else echo "FAIL asan_$t (exit $rc)"; grep -E "FAIL|runtime error|Sanitizer|#[0-9] " "$tmp/$t.log" | head -20; fi
done
# corrupt model files through the command: a clean error, no sanitizer report
FT=build-debug/ftune
mk() { head -c "$2" "$1" > "$3"; }
mk "$S/stories260K.gguf" 3000 "$tmp/a.gguf"
mk "$S/stories260K.gguf" 700000 "$tmp/b.gguf"
mk "$D/models/stories260K-hf/model.safetensors" 5000 "$tmp/c.safetensors"
mkdir -p "$tmp/hf"; cp "$D/models/stories260K-hf/"*.json "$tmp/hf/"; cp "$tmp/c.safetensors" "$tmp/hf/model.safetensors"
mk "$S/stories260K.bin" 500000 "$tmp/d.bin"; cp "$S/tok512.bin" "$tmp/"
mk "$S/tok512.bin" 3000 "$tmp/tok_trunc.bin"
i=0
for m in "$tmp/a.gguf" "$tmp/b.gguf" "$tmp/hf" "$tmp/d.bin" "$S/stories260K.bin --tokenizer $tmp/tok_trunc.bin"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    $FT generate -m $m -n 2 > "$tmp/o" 2> "$tmp/e"
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q "error" "$tmp/e" && ! grep -qE "runtime error|Sanitizer" "$tmp/e"; then
        echo "PASS asan_bad_model_$i"
    else echo "FAIL asan_bad_model_$i (exit $rc): $(head -c 600 "$tmp/e")"; fi
done
