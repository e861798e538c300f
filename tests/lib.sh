# lib.sh — what every tests/cli_*.sh shares; sourced, never run (tests/run.sh
# runs only cli_*.sh). Sets FT (the ftune command, $FTUNE or build/ftune), D
# (the test data, $FTUNE_DATA or ../shared/data), HF (the HF stories260K),
# PY (Debian's Python with torch) and tmp (a scratch directory removed at
# exit unless KEEP_TMP names one to keep), and defines pass, fail,
# skip_or_fail and expect_error. A script that wants other values sets them
# after sourcing.
FT=${FTUNE:-build/ftune}
D=${FTUNE_DATA:-../shared/data}
HF=$D/models/stories260K-hf
PY=/usr/bin/python3
# the real models scripts/fetch_models.sh keeps outside the repo
MODELS=${FTUNE_MODELS:-$HOME/.cache/ftune/models}
SMOL=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
QWEN=$MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
tmp=${KEEP_TMP:-$(mktemp -d)}; [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
# skip_or_fail NAME KIND WHY: NAME cannot run here, and WHY names what is
# missing. KIND tool: the environment lacks a program, package or privilege
# (scripts/setup.sh installs the programs and packages): "SKIP NAME: WHY",
# but under FTUNE_REQUIRE=all (CI) "FAIL NAME: ..." and status 1, so that
# nothing passes there by not running. KIND hardware: the CPU lacks an
# instruction set, which no setup provides: a skip under FTUNE_REQUIRE=all
# too, and the line says so. tests/check.h's check_skip is the C tests' own.
skip_or_fail() {
    local name=$1 kind=$2 why=$3
    case $kind in
    tool)
        if [ "${FTUNE_REQUIRE:-}" = all ]; then
            echo "FAIL $name: $why (FTUNE_REQUIRE=all: a missing tool is a failure)"; return 1
        fi
        echo "SKIP $name: $why" ;;
    hardware) echo "SKIP $name: $why (hardware, not a missing tool: a skip under FTUNE_REQUIRE=all too)" ;;
    *) echo "FAIL $name: skip_or_fail: unknown kind '$kind' (tool or hardware)"; return 1 ;;
    esac
}
# expect_error NAME PATTERN COMMAND...: COMMAND exits non-zero without a
# crash (exit < 128) and its stderr holds PATTERN (grep -i)
expect_error() {
    local name=$1 pat=$2; shift 2
    "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" < /dev/null
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ]; then fail "$name" "exit $rc"; return; fi
    if grep -qi -- "$pat" "$tmp/err.txt"; then pass "$name"; else fail "$name" "message lacks '$pat': $(cat "$tmp/err.txt")"; fi
}
# need_model NAME FILE: FILE (a real model) is there, else skip_or_fail NAME
# as a missing tool (scripts/setup.sh fetches it); status 1 when missing
need_model() {
    [ -f "$2" ] && return 0
    skip_or_fail "$1" tool "$2 is missing (scripts/setup.sh fetches it, scripts/fetch_models.sh alone too)"
    return 1
}
