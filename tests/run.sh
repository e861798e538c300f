#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/cli_*.sh script, and
# ends with "N passed, N failed, N skipped" (CI reads that line). Counts the
# PASS, FAIL and SKIP lines each prints; one that exits non-zero without a
# FAIL line, or prints no PASS and no SKIP line at all, is a failure too: a
# test that says nothing has tested nothing. FTUNE_REQUIRE=all (set by
# .ci/run) makes a skip for a missing tool a failure (tests/lib.sh's
# skip_or_fail, tests/check.h's check_skip); a CPU without an instruction set
# stays a skip. Exits non-zero if anything failed. With arguments (test
# binaries or tests/cli_*.sh scripts, as paths or bare names) it runs only
# those, the same way.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export FTUNE_DATA=${FTUNE_DATA:-$(cd .. && pwd)/shared/data}
export FTUNE=$BUILD/ftune
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
case ${FTUNE_REQUIRE:-} in
"" | all) ;;
*) echo "FTUNE_REQUIRE=$FTUNE_REQUIRE: only 'all' is known (or leave it unset)"; echo "0 passed, 1 failed, 0 skipped"; exit 1 ;;
esac
pass=0; fail=0; skip=0; failed_names=(); skipped_names=()
log=$(mktemp)
run_one() {  # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$log" 2>&1; local rc=$?
    echo "[$name] took $((SECONDS - t0)) s"
    local p f s
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    grep -E '^(PASS|FAIL|SKIP) ' "$log" | sed "s|^|[$name] |"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL (exit $rc with no FAIL line)"; f=1
    fi
    if [ "$p" -eq 0 ] && [ "$s" -eq 0 ] && [ "$f" -eq 0 ]; then
        echo "[$name] FAIL (printed no PASS line and no SKIP line: it tested nothing it says)"; f=1
    fi
    if [ "$f" -gt 0 ]; then sed 's/^/    /' "$log" | grep -vE '^    (PASS) ' | tail -40; failed_names+=("$name"); fi
    [ "$s" -gt 0 ] && skipped_names+=("$name")
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
if [ $# -gt 0 ]; then
    for a in "$@"; do
        n=$(basename "$a")
        if [ -x "$BUILD/tests/$n" ]; then run_one "$n" "$BUILD/tests/$n"
        elif [ -f "tests/$n" ]; then run_one "$n" bash "tests/$n"
        else echo "[$n] FAIL (no such test: neither $BUILD/tests/$n nor tests/$n)"; fail=$((fail + 1)); failed_names+=("$n"); fi
    done
else
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        run_one "$(basename "$t")" "$t"
    done
    for s in tests/cli_*.sh; do
        [ -f "$s" ] || continue
        run_one "$(basename "$s")" bash "$s"
    done
fi
rm -f "$log"
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped in: ${skipped_names[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
