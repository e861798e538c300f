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
# run_real_models NAME TAG "PKGS" SCRIPT ARGS...: a check of the two real
# models in .venv's Python (the cli_real_*.sh scripts). skip_or_fail NAME
# (and exit) when .venv, helper_eco or a package of PKGS is missing;
# need_model for each model (TAG_smollm2, TAG_qwen2); then
# `.venv/bin/python SCRIPT --helper helper_eco ARGS... MODELS` (nothing
# downloaded), its stderr shown on failure. Exits with the status: 1 if it
# failed, or if a model was missing under FTUNE_REQUIRE=all.
run_real_models() {
    local name=$1 tag=$2 pkgs=$3 script=$4; shift 4
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
    local vpy=.venv/bin/python helper=${BUILD:-build}/tests/helper_eco pkg
    [ -x "$vpy" ] || { skip_or_fail "$name" tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
    [ -x "$helper" ] || { fail "$name" "$helper missing (run make)"; exit 1; }
    for pkg in $pkgs; do
        "$vpy" -c "import $pkg" 2>/dev/null || { skip_or_fail "$name" tool "python package $pkg is missing from .venv (scripts/setup.sh)"; exit $?; }
    done
    local models=() rc=0
    if need_model "${tag}_smollm2" "$SMOL"; then models+=("$SMOL"); else rc=1; fi
    if need_model "${tag}_qwen2" "$QWEN"; then models+=("$QWEN"); else rc=1; fi
    # a skip alone is status 0 unless FTUNE_REQUIRE=all made it a failure
    [ "${FTUNE_REQUIRE:-}" = all ] || rc=0
    [ ${#models[@]} -gt 0 ] || exit $rc
    "$vpy" "$script" --helper "$helper" "$@" "${models[@]}" 2>"$tmp/stderr.txt" || {
        rc=1; grep -v "Converting and de-quantizing" "$tmp/stderr.txt" | tail -20; }
    exit $rc
}

# stories_jsonl FILE [N]: the first N (default all ten) of ten short stories,
# one JSON text per line: the tiny training set the command tests share
stories_jsonl() {
    head -n "${2:-10}" > "$1" <<'EOF'
{"text": "Once upon a time, there was a little cat named Tom. Tom liked to play with his red ball."}
{"text": "The sun was hot. Lily went to the park with her mom. She saw a big dog and said hello."}
{"text": "Ben had a toy car. He drove it around the room. The car was fast and blue."}
{"text": "One day, a bird sat on a tree. The bird sang a happy song for all the kids."}
{"text": "Sara wanted a cake. Her dad made a big cake with red cherries. Sara was very happy."}
{"text": "The frog jumped into the pond. Splash! The water was cold, but the frog liked it."}
{"text": "Max found a shiny stone in the garden. He gave it to his sister, and she smiled."}
{"text": "It was raining. Tim and Sue stayed inside and built a tall tower with blocks."}
{"text": "A little fish swam in the sea. It met a crab who wanted to be its friend."}
{"text": "Anna lost her hat in the wind. Her brother ran fast and caught it for her."}
EOF
}
