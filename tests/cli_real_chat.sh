#!/usr/bin/env bash
# The two real models' chat templates (the Jinja each GGUF carries) as
# ftune renders them, against transformers' apply_chat_template on the
# tokenizer its GGUF loader builds (scripts/real_chat.py): text and ids of
# conversations with and without a system message (the templates' default
# system messages), and `ftune generate --chat` stopping at <|im_end|>. A
# missing model is a skip (a failure under FTUNE_REQUIRE=all).
cd "$(dirname "$0")/.."
source tests/lib.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
BUILD=${BUILD:-build}
HELPER=$BUILD/tests/helper_eco
VPY=.venv/bin/python
[ -x "$VPY" ] || { skip_or_fail real_chat tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
[ -x "$HELPER" ] || { fail real_chat "$HELPER missing (run make)"; exit 1; }
for pkg in transformers jinja2 gguf; do
    "$VPY" -c "import $pkg" 2>/dev/null || { skip_or_fail real_chat tool "python package $pkg is missing from .venv (scripts/setup.sh)"; exit $?; }
done
models=() rc=0
if need_model real_chat_smollm2 "$SMOL"; then models+=("$SMOL"); else rc=1; fi
if need_model real_chat_qwen2 "$QWEN"; then models+=("$QWEN"); else rc=1; fi
# a skip alone is status 0 unless FTUNE_REQUIRE=all made it a failure
[ "${FTUNE_REQUIRE:-}" = all ] || rc=0
[ ${#models[@]} -gt 0 ] || exit $rc
"$VPY" scripts/real_chat.py --helper "$HELPER" --ftune "$FT" --work "$tmp" "${models[@]}" 2>"$tmp/stderr.txt" || {
    rc=1; grep -v "Converting and de-quantizing" "$tmp/stderr.txt" | tail -20; }
exit $rc
