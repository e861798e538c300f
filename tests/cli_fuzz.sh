#!/usr/bin/env bash
# cli_fuzz.sh — builds the libFuzzer targets (make fuzz) and runs each for a
# bounded time (FUZZ_SECONDS, default 10) on a copy of its seed corpus, so the
# repository is not modified. Prints "PASS fuzz_<name>" or "FAIL fuzz_<name>:
# why" and exits non-zero if a target crashed, leaked or hit undefined
# behaviour; crashing inputs are kept in build-fuzz/crashes/.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
SECS=${FUZZ_SECONDS:-10}
if ! command -v clang >/dev/null 2>&1; then
    skip_or_fail fuzz tool "clang not found (scripts/setup.sh installs it and libclang-rt-14-dev)"
    exit
fi
work=$tmp
if ! make -s fuzz >"$work/build.log" 2>&1; then
    sed 's/^/    /' "$work/build.log" | tail -20
    echo "FAIL fuzz_build: make fuzz failed"
    exit 1
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fail=0
# the tokenizer.json and config.json parsers (model and tokenizer loading), the dataset
# readers and trainer_state.json (training)
for name in gguf safetensors tokenizer_json config data trainer_state; do
    bin=build-fuzz/fuzz_$name
    corpus=$work/corpus_$name
    mkdir -p "$corpus" "$work/art_$name"
    cp fuzz/corpus/$name/* "$corpus"/
    log=$work/$name.log
    secs=$SECS
    case $name in data|trainer_state) secs=${FUZZ_SECONDS:-10} ;; esac
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
        -artifact_prefix="$work/art_$name/" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [ "$rc" -ne 0 ] || grep -q 'runtime error:' "$log"; then
        mkdir -p build-fuzz/crashes
        cp "$work/art_$name"/* build-fuzz/crashes/ 2>/dev/null
        grep -E 'ERROR|runtime error|SUMMARY|#[0-9]+ 0x' "$log" | head -30 | sed 's/^/    /'
        echo "FAIL fuzz_$name: exit $rc after ${runs:-?} runs; inputs in build-fuzz/crashes/"
        fail=1
    else
        echo "PASS fuzz_$name (${runs:-?} inputs in ${secs} s, corpus grew to $(ls "$corpus" | wc -l) files)"
    fi
done
exit $fail
