#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/cli_*.sh script, and
# ends with "N passed, N failed". Exits non-zero if anything failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export FTUNE_DATA=${FTUNE_DATA:-$(cd .. && pwd)/shared/data}
export FTUNE=$BUILD/ftune
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
pass=0; fail=0; failed_names=()
log=$(mktemp)
run_one() {  # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$log" 2>&1; local rc=$?
    echo "[$name] took $((SECONDS - t0)) s"
    local p f
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
    grep -E '^(PASS|FAIL) ' "$log" | sed "s|^|[$name] |"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL (exit $rc with no FAIL line)"; f=1
    fi
    if [ "$f" -gt 0 ]; then sed 's/^/    /' "$log" | grep -vE '^    (PASS) ' | tail -40; failed_names+=("$name"); fi
    pass=$((pass + p)); fail=$((fail + f))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in tests/cli_*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s")" bash "$s"
done
rm -f "$log"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
