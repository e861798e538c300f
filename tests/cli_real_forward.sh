#!/usr/bin/env bash
# The f32 forward pass of the two real models (SmolLM2-135M-Instruct Q4_1,
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M, dequantized inside the products)
# against transformers' logits from its own GGUF loader (float32, oneDNN)
# (scripts/real_forward.py): max relative error of every position's logits
# within 1e-4, 32 greedy tokens identical after each of four short prompts,
# and `ftune generate --temp 0` printing them. A missing model is a skip (a
# failure under FTUNE_REQUIRE=all).
cd "$(dirname "$0")/.."
source tests/lib.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1   # never download
BUILD=${BUILD:-build}
HELPER=$BUILD/tests/helper_eco
VPY=.venv/bin/python
[ -x "$VPY" ] || { skip_or_fail real_forward tool ".venv is missing (scripts/setup.sh makes it)"; exit $?; }
[ -x "$HELPER" ] || { fail real_forward "$HELPER missing (run make)"; exit 1; }
for pkg in torch transformers gguf; do
    "$VPY" -c "import $pkg" 2>/dev/null || { skip_or_fail real_forward tool "python package $pkg is missing from .venv (scripts/setup.sh)"; exit $?; }
done
models=() rc=0
if need_model real_forward_smollm2 "$SMOL"; then models+=("$SMOL"); else rc=1; fi
if need_model real_forward_qwen2 "$QWEN"; then models+=("$QWEN"); else rc=1; fi
# a skip alone is status 0 unless FTUNE_REQUIRE=all made it a failure
[ "${FTUNE_REQUIRE:-}" = all ] || rc=0
[ ${#models[@]} -gt 0 ] || exit $rc
"$VPY" scripts/real_forward.py --helper "$HELPER" --ftune "$FT" --work "$tmp" "${models[@]}" 2>"$tmp/stderr.txt" || {
    rc=1; grep -v "Converting and de-quantizing" "$tmp/stderr.txt" | tail -20; }
exit $rc
